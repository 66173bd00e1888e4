//! Writers whose transactions span several requests (BEGIN, a row, another row,
//! COMMIT, each sent alone), for the fault tests: a transaction must be all or
//! nothing through the pooler, so each (writer, step) has both its rows in the table
//! or neither, and every acknowledged COMMIT's rows are there. A server handed to
//! another client inside a transaction would split one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::common::*;
use crate::support::probe::within;
use crate::support::Sluice;

pub(super) const WRITERS: i32 = 4;
const MAX_STEPS: i32 = 100_000;

/// The table the writers fill, in `db`.
pub(super) fn create(db: &str) {
    direct(
        db,
        "CREATE TABLE pairs (id int, step int, half int); GRANT ALL ON pairs TO sluice_md5;",
    );
}

/// One writer until `stop`: the steps whose COMMIT was acknowledged, and its errors.
async fn writer(
    s: Arc<Sluice>,
    db: String,
    id: i32,
    stop: Arc<AtomicBool>,
) -> (Vec<i32>, Vec<String>) {
    let (mut acked, mut errors) = (Vec::new(), Vec::new());
    let mut c = client(&s, &db).await;
    for step in 0..MAX_STEPS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let mut done = Ok(());
        for sql in [
            "BEGIN".to_owned(),
            format!("INSERT INTO pairs VALUES ({id}, {step}, 1)"),
            format!("INSERT INTO pairs VALUES ({id}, {step}, 2)"),
            "COMMIT".to_owned(),
        ] {
            done = within(STEP, &sql, c.batch_execute(&sql)).await;
            if done.is_err() {
                break;
            }
        }
        match done {
            Ok(()) => acked.push(step),
            Err(e) => {
                errors.push(err_text(&e));
                c = client(&s, &db).await;
            }
        }
    }
    (acked, errors)
}

/// [`WRITERS`] writers at work until [`Pairs::finish`].
pub(super) struct Pairs {
    stop: Arc<AtomicBool>,
    writers: Vec<tokio::task::JoinHandle<(Vec<i32>, Vec<String>)>>,
}

impl Pairs {
    pub(super) fn start(s: &Arc<Sluice>, db: &str) -> Pairs {
        let stop = Arc::new(AtomicBool::new(false));
        let writers = (0..WRITERS)
            .map(|id| tokio::spawn(writer(s.clone(), db.to_owned(), id, stop.clone())))
            .collect();
        Pairs { stop, writers }
    }

    /// Stops the writers and checks the table: every acknowledged step's two rows,
    /// and no step with one row only. Returns the writers' errors.
    pub(super) async fn finish(self, s: &Sluice, db: &str) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        let (mut acked, mut errors) = (Vec::new(), Vec::new());
        for (id, w) in self.writers.into_iter().enumerate() {
            let (steps, e) = within(STEP * 3, "a writer", w)
                .await
                .expect("a writer panicked");
            acked.extend(steps.into_iter().map(|st| (id as i32, st)));
            errors.extend(e);
        }
        eprintln!(
            "pairs: {} transactions committed, errors {errors:?}",
            acked.len()
        );
        assert!(!acked.is_empty(), "no transaction committed");
        let split = direct(
            db,
            "SELECT count(*) FROM (SELECT id, step FROM pairs GROUP BY id, step \
             HAVING count(*) <> 2) s",
        );
        assert_eq!(
            split.trim(),
            "0",
            "transactions split in two\n{}",
            s.diagnostics()
        );
        let have = direct(db, "SELECT count(DISTINCT (id, step)) FROM pairs");
        let have: usize = have.trim().parse().unwrap_or(0);
        // Every acknowledged COMMIT is in; at most one more per error (a COMMIT whose
        // answer was lost with its server).
        assert!(
            have >= acked.len() && have <= acked.len() + errors.len(),
            "{have} transactions in the table, {} acknowledged, {} errors",
            acked.len(),
            errors.len()
        );
        errors
    }
}

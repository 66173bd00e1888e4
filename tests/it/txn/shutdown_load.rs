//! SIGINT (PgBouncer's safe shutdown: PAUSE, then exit once every server is back)
//! while many clients write through a small pool in transaction mode. Every
//! transaction that began finishes and its client gets the answer; no result is lost:
//! the rows a client was told were written are exactly the rows in the table.

use std::collections::HashSet;
use std::time::Duration;

use super::common::*;
use crate::support::probe::within;

const WRITERS: i32 = 10;
/// A bound: the shutdown comes long before.
const MAX_STEPS: i32 = 1_000_000;

/// A client inserting (id, step) rows, by turns alone and two in a transaction, until
/// it fails; returns the steps it was told were written.
async fn writer(cfg: tokio_postgres::Config, id: i32) -> Vec<i32> {
    let c = crate::support::connect(&cfg).await;
    let mut acked = Vec::new();
    for step in (0..MAX_STEPS).step_by(2) {
        let sql = if step % 4 == 0 {
            format!("INSERT INTO w VALUES ({id}, {step})")
        } else {
            format!(
                "BEGIN; INSERT INTO w VALUES ({id}, {step}); \
                 INSERT INTO w VALUES ({id}, {}); COMMIT",
                step + 1
            )
        };
        match within(STEP, "a write", c.batch_execute(&sql)).await {
            Ok(()) => {
                acked.push(step);
                if step % 4 != 0 {
                    acked.push(step + 1);
                }
            }
            Err(_) => break,
        }
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigint_under_load_loses_no_result() {
    let db = fresh_db("txn_sigint_load");
    direct(
        &db,
        "CREATE TABLE w (id int, step int); GRANT ALL ON w TO sluice_md5;",
    );
    let mut s = txn_sluice(&db).setting("default_pool_size", "2").start();
    let cfg = s.config(crate::support::MD5_USER, crate::support::MD5_PASSWORD, &db);
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| tokio::spawn(writer(cfg.clone(), id)))
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.signal(libc::SIGINT);
    let mut acked = Vec::new();
    for (id, w) in writers.into_iter().enumerate() {
        let steps = within(Duration::from_secs(60), "a writer", w)
            .await
            .expect("a writer panicked");
        assert!(
            steps.len() < MAX_STEPS as usize,
            "writer {id} was never stopped by the shutdown"
        );
        acked.extend(steps.into_iter().map(|st| (id as i32, st)));
    }
    let status = s.wait_exit(Duration::from_secs(20));
    assert!(
        status.is_some_and(|st| st.success()),
        "{status:?}\n{}",
        s.diagnostics()
    );
    assert!(acked.len() >= 100, "only {} rows written", acked.len());

    let rows = direct(&db, "SELECT string_agg(id || ':' || step, ',') FROM w");
    let table: HashSet<&str> = rows.trim().split(',').filter(|r| !r.is_empty()).collect();
    let acked: HashSet<String> = acked.iter().map(|(i, st)| format!("{i}:{st}")).collect();
    let missing: Vec<_> = acked
        .iter()
        .filter(|a| !table.contains(a.as_str()))
        .collect();
    let unacked: Vec<_> = table.iter().filter(|r| !acked.contains(**r)).collect();
    assert!(
        missing.is_empty(),
        "acknowledged but not written: {missing:?}"
    );
    assert!(
        unacked.is_empty(),
        "written, but the client was never told (a lost result): {unacked:?}\n{}",
        s.diagnostics()
    );
}

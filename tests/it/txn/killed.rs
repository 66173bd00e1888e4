//! Servers killed (`pg_terminate_backend`) again and again while many clients share a
//! small pool in transaction mode: answers of every size, simple and extended, most
//! of them relayed for a waiting client by the server's delegate (pool/delegate.rs)
//! or handed over between clients. A client whose server died may get an error and
//! lose its connection, as with PgBouncer; it must never get another client's answer,
//! part of an answer, or hang. Once the kills stop, every client is served again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::common::*;
use crate::support::probe::{within, Observer};
use crate::support::Sluice;

pub(super) const CLIENTS: u64 = 12;
const POOL: u32 = 2;
const KILLS: u64 = 20;
/// Steps a client may take while the kills go on (a bound; the kills end first).
pub(super) const MAX_STEPS: u64 = 3_000;
/// Answer sizes: one read, a few reads, and more than the delegate gathers.
pub(super) const SIZES: [usize; 4] = [0, 3_000, 40_000, 200_000];

/// Asks for an answer tagged with the client and step, of `size` bytes, by the simple
/// or the extended protocol; checks that the answer is exactly that. `Err` is the
/// error's text; a wrong answer panics.
pub(super) async fn ask(c: &Client, id: u64, step: u64) -> Result<(), String> {
    let tag = format!("c{id}s{step}");
    let size = SIZES[(step % SIZES.len() as u64) as usize];
    let ctx = format!("client {id} step {step} ({size} bytes)");
    let (t, r) = if step % 3 == 0 {
        let sql = "SELECT $1::text, repeat('x', $2::int)";
        let n = size as i32;
        let rows = within(
            STEP,
            &ctx,
            c.query_typed(sql, &[(&tag, Type::TEXT), (&n, Type::INT4)]),
        )
        .await
        .map_err(|e| err_text(&e))?;
        assert_eq!(rows.len(), 1, "{ctx}: {} rows", rows.len());
        (rows[0].get::<_, String>(0), rows[0].get::<_, String>(1))
    } else {
        let sql = format!("SELECT '{tag}', repeat('x', {size})");
        let msgs = within(STEP, &ctx, c.simple_query(&sql))
            .await
            .map_err(|e| err_text(&e))?;
        let rows: Vec<_> = msgs
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(rows.len(), 1, "{ctx}: {msgs:?}");
        let get = |i| rows[0].get(i).unwrap_or("NULL").to_owned();
        (get(0), get(1))
    };
    assert_eq!(t, tag, "{ctx}: another client's answer");
    assert_eq!(r.len(), size, "{ctx}: an answer cut short or run together");
    assert!(r.bytes().all(|b| b == b'x'), "{ctx}: a mangled answer");
    Ok(())
}

/// A client asking until `stop`, connecting again after an error (a killed server's
/// FATAL error ends the client's connection, as with PgBouncer). Returns (answers,
/// errors) and the client it ended with.
pub(super) async fn run_client(
    s: Arc<Sluice>,
    db: String,
    id: u64,
    stop: Arc<AtomicBool>,
) -> (u64, Vec<String>, Client) {
    let mut c = client(&s, &db).await;
    let (mut ok, mut errors) = (0, Vec::new());
    for step in 0..MAX_STEPS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match ask(&c, id, step).await {
            Ok(()) => ok += 1,
            Err(e) => {
                errors.push(e);
                c = client(&s, &db).await;
            }
        }
    }
    (ok, errors, c)
}

/// [`CLIENTS`]-many [`run_client`]s at work until [`Load::finish`].
pub(super) struct Load {
    /// For its log, should a client fail.
    sluice: Arc<Sluice>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<(u64, Vec<String>, Client)>>,
    started: tokio::time::Instant,
}

impl Load {
    pub(super) fn start(s: &Arc<Sluice>, db: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..CLIENTS)
            .map(|id| tokio::spawn(run_client(s.clone(), db.to_owned(), id, stop.clone())))
            .collect();
        let started = tokio::time::Instant::now();
        Load {
            sluice: s.clone(),
            stop,
            clients,
            started,
        }
    }

    /// Stops the clients; each one's answers, errors and last connection, in order.
    pub(super) async fn finish(self) -> Vec<(u64, Vec<String>, Client)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut ended = Vec::new();
        for (id, c) in self.clients.into_iter().enumerate() {
            let r = within(Duration::from_secs(60), "a client at work", c).await;
            match r {
                Ok(r) => ended.push(r),
                Err(e) => panic!("client {id}: {e}\n{}", self.sluice.diagnostics()),
            }
        }
        ended
    }
}

impl Load {
    /// [`Load::finish`] for a load nothing should have disturbed (`by`, for the
    /// message): panics on any client's error; the answers, at least four a client.
    /// The load runs a second at least, so that a short test on a busy machine still
    /// sees its clients at work.
    pub(super) async fn finish_undisturbed(self, s: &Sluice, by: &str) -> u64 {
        tokio::time::sleep_until(self.started + Duration::from_secs(1)).await;
        let mut total = 0;
        for (id, (ok, errors, _)) in self.finish().await.into_iter().enumerate() {
            assert!(
                errors.is_empty(),
                "client {id} was disturbed by {by}: {errors:?}\n{}",
                s.diagnostics()
            );
            total += ok;
        }
        assert!(total >= CLIENTS * 4, "only {total} answers");
        total
    }
}

impl Load {
    /// [`Load::finish`] for a load that faults may harm: each client's errors must
    /// have a text. The connections the clients ended with, and their errors in all.
    pub(super) async fn finish_counting(self) -> (Vec<Client>, u64) {
        let (mut ended, mut failed) = (Vec::new(), 0);
        for (id, (ok, errors, c)) in self.finish().await.into_iter().enumerate() {
            eprintln!(
                "client {id}: {ok} answers, {} errors: {errors:?}",
                errors.len()
            );
            for e in &errors {
                assert!(!e.trim().is_empty(), "client {id}: an error without a text");
            }
            failed += errors.len() as u64;
            ended.push(c);
        }
        (ended, failed)
    }
}

/// Every client served again, `steps` answers each, on the connection it ended with
/// or a new one if that was closed: no server known dead is handed out, and no
/// client is left stuck in line.
pub(super) async fn served_again(s: &Arc<Sluice>, db: &str, ended: Vec<Client>, steps: u64) {
    let mut after = Vec::new();
    for (id, mut c) in ended.into_iter().enumerate() {
        let id = id as u64;
        if c.is_closed() {
            c = client(s, db).await;
        }
        after.push(tokio::spawn(async move {
            for step in 0..steps {
                ask(&c, id, MAX_STEPS + step)
                    .await
                    .map_err(|e| format!("client {id} step {step} afterwards: {e}"))?;
            }
            Ok::<_, String>(())
        }));
    }
    for a in after {
        within(STEP, "a client afterwards", a)
            .await
            .expect("a client panicked")
            .unwrap_or_else(|e| panic!("{e}\n{}", s.diagnostics()));
    }
}

/// Kills one of `db`'s backends every `every`, `KILLS` times; returns how many
/// were killed (one may have gone on its own first).
async fn killer(obs: &Observer, db: &str, every: Duration) -> u64 {
    let mut rng = Rng::new(7);
    let mut killed = 0;
    for _ in 0..KILLS {
        tokio::time::sleep(every).await;
        let pids = backend_pids(obs, db).await;
        if pids.is_empty() {
            continue;
        }
        let pid = pids[rng.below(pids.len() as u64) as usize];
        let done = obs.try_terminate(pid).await;
        killed += u64::from(done);
    }
    killed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_killed_under_load_never_mix_answers() {
    let db = fresh_db("txn_killed_load");
    let s = Arc::new(
        txn_sluice(&db)
            .setting("default_pool_size", &POOL.to_string())
            .setting("query_wait_timeout", "30")
            .start(),
    );
    let obs = Observer::new().await;
    // Its listeners: no client or server yet.
    let sockets = listening_sockets(&s);
    let load = Load::start(&s, &db);
    let killed = within(
        Duration::from_secs(60),
        "the kills",
        killer(&obs, &db, Duration::from_millis(50)),
    )
    .await;
    let (ended, failed) = load.finish_counting().await;
    eprintln!("{failed} client errors from {killed} servers killed");
    // A kill harms at most the client its server was serving: no other client is
    // disturbed.
    assert!(
        failed <= killed,
        "{failed} client errors from {killed} servers killed"
    );
    assert!(
        killed >= KILLS / 2,
        "only {killed} of {KILLS} backends killed: the clients never held servers?\n{}",
        s.diagnostics()
    );

    // The kills over, every client is served at once: no server known dead is handed
    // out, and no client is left stuck in line.
    tokio::time::sleep(Duration::from_millis(500)).await;
    served_again(&s, &db, ended, 2 * SIZES.len() as u64).await;
    // And the pool holds no more servers than it may.
    wait_backends(&obs, &db, STEP, |n| n <= i64::from(POOL)).await;
    // Nor is a killed server's socket left open.
    nothing_left_open(&s, sockets, crate::support::pg::pg().port());
}

//! Client timeouts while many clients share a small pool in transaction mode: a slow
//! query waits in line, is written by the client that gives a server back and may
//! have its answer relayed by the server's delegate (pool/delegate.rs), yet
//! `query_timeout` (or `transaction_timeout`) still ends it; a transaction left idle
//! still meets `idle_transaction_timeout`. Only the clients that ran over are ended; the others
//! lose nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::common::*;
use super::killed::Load;
use crate::support::probe::within;
use crate::support::Sluice;
use tokio::task::JoinHandle;

/// Slow clients: with the idle transaction they hold one server fewer than the
/// pool's, so the quick clients never wait a `query_timeout` in line (which counts
/// from the request, as PgBouncer's does).
const SLOW: usize = 2;
const POOL: &str = "4";
const ROUNDS: usize = 3;

/// Slow requests (`sql`, over 1 s) sent while the pool is busy: most wait in line
/// first, and are written by the client that gives a server back. Each of [`SLOW`]
/// clients sends [`ROUNDS`], one connection each (the timeout ends the connection).
fn start_slow(s: &Arc<Sluice>, db: &str, sql: &'static str) -> Vec<JoinHandle<Vec<Ended>>> {
    (0..SLOW)
        .map(|i| {
            let (s, db) = (s.clone(), db.to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150 * i as u64)).await;
                let mut ends = Vec::new();
                for _ in 0..ROUNDS {
                    let c = client(&s, &db).await;
                    let t = Instant::now();
                    let r = within(STEP, sql, c.simple_query(sql)).await;
                    ends.push((r.map(drop).map_err(|e| err_text(&e)), t.elapsed()));
                }
                ends
            })
        })
        .collect()
}

/// How a slow request ended, and after how long.
type Ended = (Result<(), String>, Duration);

/// Checks that every slow request was ended by the timeout `why`, about a second
/// after it was sent (the line is short: the quick clients' answers take
/// milliseconds), not at its end.
async fn ended_in_time(slow: Vec<JoinHandle<Vec<Ended>>>, why: &str) {
    for (i, h) in slow.into_iter().enumerate() {
        for (r, took) in h.await.expect("a slow client panicked") {
            let e = r.expect_err("a slow request outlived a timeout of 1 s under load");
            assert!(e.contains(why), "slow client {i}: {e}");
            assert!(
                took < Duration::from_secs(6),
                "slow client {i} took {took:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeouts_end_only_the_clients_that_ran_over_under_load() {
    let db = fresh_db("txn_timeouts_load");
    let s = Arc::new(
        txn_sluice(&db)
            .setting("default_pool_size", POOL)
            .setting("query_timeout", "1")
            .setting("idle_transaction_timeout", "1")
            .start(),
    );
    let sockets = listening_sockets(&s);
    let load = Load::start(&s, &db);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let slow = start_slow(&s, &db, "SELECT pg_sleep(8)");
    // A transaction left idle while others wait for its server.
    let mut idle = raw(&s, &db, &[]).await;
    let r = idle.simple("BEGIN; SELECT 1", STEP).await;
    assert_eq!(status(&r), b'T');
    let t = Instant::now();
    expect_fatal_close(
        &mut idle,
        "idle transaction timeout",
        Duration::from_secs(10),
    )
    .await;
    let idle_took = t.elapsed();

    ended_in_time(slow, "query_timeout").await;
    assert!(
        idle_took < Duration::from_secs(6),
        "idle transaction ended after {idle_took:?}"
    );

    load.finish_undisturbed(&s, "another's timeout").await;
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT 3").await, "3");
    drop(c);
    // The servers closed at the timeouts, and the clients ended, are closed here.
    nothing_left_open(&s, sockets, crate::support::pg::pg().port());
}

/// `transaction_timeout` for a transaction sent whole in one request that waited in
/// line: it too is ended on time, though its answer would come only at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_timeout_ends_a_transaction_written_in_line() {
    let db = fresh_db("txn_xtimeout_load");
    let s = Arc::new(
        txn_sluice(&db)
            .setting("default_pool_size", POOL)
            .setting("transaction_timeout", "1")
            .start(),
    );
    let sockets = listening_sockets(&s);
    let load = Load::start(&s, &db);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slow = start_slow(&s, &db, "BEGIN; SELECT pg_sleep(8); COMMIT");
    ended_in_time(slow, "transaction timeout").await;
    load.finish_undisturbed(&s, "another's timeout").await;
    nothing_left_open(&s, sockets, crate::support::pg::pg().port());
}

/// `client_idle_timeout` with many idle clients (most of them asleep, their state
/// parked) beside busy ones: every idle one is ended about on time, whether it ran a
/// query or only logged in; no busy one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_idle_timeout_ends_every_idle_client_and_no_busy_one() {
    const IDLE: usize = 150;
    let db = fresh_db("txn_cidle_load");
    let s = Arc::new(
        txn_sluice(&db)
            .setting("default_pool_size", "2")
            .setting("client_idle_timeout", "1")
            .setting("max_client_conn", "400")
            .start(),
    );
    let sockets = listening_sockets(&s);
    let load = Load::start(&s, &db);
    let mut idle = Vec::new();
    for i in 0..IDLE {
        let mut c = raw(&s, &db, &[]).await;
        if i % 2 == 0 {
            assert_eq!(col(&c.simple("SELECT 1", STEP).await), ["1"]);
        }
        let t = Instant::now();
        idle.push(tokio::spawn(async move {
            expect_fatal_close(&mut c, "client_idle_timeout", Duration::from_secs(15)).await;
            t.elapsed()
        }));
    }
    for (i, h) in idle.into_iter().enumerate() {
        let took = within(STEP, "an idle client's end", h)
            .await
            .unwrap_or_else(|e| panic!("idle client {i}: {e}\n{}", s.diagnostics()));
        assert!(
            took >= Duration::from_millis(800) && took < Duration::from_secs(5),
            "idle client {i} ended after {took:?}"
        );
    }
    load.finish_undisturbed(&s, "client_idle_timeout").await;
    // Those ended asleep too: their sockets are closed, not left in the keeper.
    nothing_left_open(&s, sockets, crate::support::pg::pg().port());
}

//! PostgreSQL restarting (fast, then immediate) while many clients share a small
//! pool in transaction mode, their answers mostly relayed by the servers' delegates:
//! clients get errors while it is down, never another client's answer and never a
//! hang, and all of them are served again once it is back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::common::*;
use super::killed::{ask, Load, MAX_STEPS};
use crate::support::pg::PrivatePg;
use crate::support::probe::within;
use crate::support::TEST_DB;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarts_under_load_mix_no_answers() {
    let private = Arc::new(tokio::task::spawn_blocking(PrivatePg::start).await.unwrap());
    let s = Arc::new(
        private_txn_sluice(&private)
            .setting("server_login_retry", "0.2")
            .setting("query_wait_timeout", "10")
            .start(),
    );
    let sockets = listening_sockets(&s);
    for mode in ["fast", "immediate"] {
        let load = Load::start(&s, TEST_DB);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p = private.clone();
        tokio::task::spawn_blocking(move || p.restart(mode))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Every answer that came was checked by `ask`; errors were allowed.
        let ended = load.finish().await;
        let mut failed = 0;
        for (_, errors, _) in &ended {
            failed += errors.len();
        }
        eprintln!("{mode} restart: {failed} client errors");
        // Once it is back, every client is served again (connecting anew if its
        // connection was closed), within bounds.
        let back = Instant::now();
        for (id, (_, _, mut c)) in ended.into_iter().enumerate() {
            let id = id as u64;
            let mut last = Err(String::new());
            for attempt in 0..100u64 {
                if c.is_closed() {
                    c = client(&s, TEST_DB).await;
                }
                last = ask(&c, id, MAX_STEPS + attempt).await;
                if last.is_ok() || back.elapsed() > Duration::from_secs(20) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                c = client(&s, TEST_DB).await;
            }
            assert!(
                last.is_ok(),
                "client {id} not served 20 s after the {mode} restart: {last:?}\n{}",
                s.diagnostics()
            );
        }
    }
    // The servers of before each restart, all closed by PostgreSQL, are closed here
    // too, and the clients that left with them.
    nothing_left_open(&s, sockets, private.port());
    drop(s);
    let private = Arc::try_unwrap(private).expect("sole owner");
    within(
        STEP,
        "stop the private server",
        tokio::task::spawn_blocking(move || drop(private)),
    )
    .await
    .unwrap();
}

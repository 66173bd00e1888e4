//! A server that stops answering while many clients share a small pool in
//! transaction mode (its backend frozen with SIGSTOP: a stalled host or a network
//! partition, as a pooler sees it). Only the client whose request is on it waits;
//! the others go on through the other server, a new client too, and the console
//! answers every SHOW meanwhile. With `query_timeout` that client is ended and the
//! server closed; without, it gets its answer once the server runs again.

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use super::console_load::{admin_run, console_sluice, SHOWS};
use super::killed::{ask, served_again, Load, CLIENTS, MAX_STEPS};
use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::{within, Frozen, Observer};
use crate::support::Sluice;

/// How long a server stays frozen.
const FROZEN_FOR: Duration = Duration::from_secs(3);

/// Freezes one of `db`'s backends under load for [`FROZEN_FOR`], meanwhile asking
/// through a new client and the console, each within a few seconds: nobody but the
/// frozen server's client may wait on it. Returns the frozen backend's pid.
async fn freeze_one(s: &Sluice, db: &str) -> i32 {
    let obs = Observer::new().await;
    let pids = logged_in_pids(&obs, db).await;
    assert_eq!(pids.len(), 2, "servers under load: {pids:?}");
    let frozen = Frozen::new(pids[0]);
    let until = tokio::time::Instant::now() + FROZEN_FOR;

    let newcomer = client(s, db).await;
    let admin = console(s, ADMIN, ADMIN_PW).await;
    let mut step = 0;
    while tokio::time::Instant::now() < until {
        let what = format!("step {step} of a new client beside a frozen server");
        within(Duration::from_secs(5), &what, ask(&newcomer, CLIENTS, step))
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", s.diagnostics()));
        let show = format!("SHOW {}", SHOWS[step as usize % SHOWS.len()]);
        within(Duration::from_secs(5), &show, admin_run(&admin, &show)).await;
        step += 1;
    }
    assert!(step >= 8, "only {step} steps beside the frozen server");
    drop(frozen);
    pids[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_server_holds_up_only_its_own_client() {
    let (db, s) = console_sluice("txn_frozen_load");
    let load = Load::start(&s, &db);
    tokio::time::sleep(Duration::from_millis(500)).await;
    freeze_one(&s, &db).await;
    // Its client waited, and got its answer: nobody saw an error.
    load.finish_undisturbed(&s, "a server frozen for a while")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn query_timeout_ends_the_client_of_a_frozen_server_and_closes_it() {
    let db = fresh_db("txn_frozen_qt");
    let s = Arc::new(
        txn_sluice(&db)
            .userlist(ADMIN, ADMIN_PW)
            .setting("default_pool_size", "2")
            .setting("query_timeout", "1")
            .start(),
    );
    let sockets = listening_sockets(&s);
    let load = Load::start(&s, &db);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = freeze_one(&s, &db).await;
    let (ended, failed) = load.finish_counting().await;
    // One client's request met the frozen server (the next request to it, had it
    // been idle); the server was closed then, so no other did.
    assert_eq!(failed, 1, "{}", s.diagnostics());
    let log = s.log();
    assert!(
        log.contains("closing because: query_timeout"),
        "{}",
        s.diagnostics()
    );
    // Closed by Sluice: the backend ends once it runs again.
    let obs = Observer::new().await;
    settles(&s, STEP, "the frozen backend", 0, || async {
        let pids = logged_in_pids(&obs, &db).await;
        i64::from(pids.contains(&pid))
    })
    .await;
    served_again(&s, &db, ended, MAX_STEPS.min(8)).await;
    nothing_left_open(&s, sockets, crate::support::pg::pg().port());
}

//! `autodb_idle_timeout`: a database made from the `*` entry is listed by SHOW
//! DATABASES while it has a pool, and forgotten once it has had no client and no
//! server connection for that long; a client keeps it, and a later client makes it
//! again.

use std::time::{Duration, Instant};

use super::{builder, pooled, psql_ok, select1};
use crate::support::{Sluice, TEST_DB};

fn listed(s: &Sluice) -> bool {
    psql_ok(s, "SHOW DATABASES")
        .column("name")
        .iter()
        .any(|n| n == TEST_DB)
}

/// Polls until `listed(s)` is `want`; false if it still is not after `limit`.
fn wait_listed(s: &Sluice, want: bool, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        if listed(s) == want {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_database_from_the_fallback_entry_is_forgotten() {
    let s = builder()
        .no_default_database()
        .database("*", "host=127.0.0.1 port=@PG_PORT@")
        .setting("autodb_idle_timeout", "1")
        .setting("server_idle_timeout", "1")
        .start();
    assert!(!listed(&s), "listed before any client asked for it");

    let c = pooled(&s, None).await;
    select1(&c).await;
    assert!(listed(&s));
    // A connected client keeps it, well past both timeouts.
    std::thread::sleep(Duration::from_secs(3));
    assert!(listed(&s), "forgotten while a client was connected");
    select1(&c).await;

    drop(c);
    // The server closes after server_idle_timeout, then the database goes after
    // autodb_idle_timeout: ~2 s and a janitor tick or two.
    assert!(
        wait_listed(&s, false, Duration::from_secs(15)),
        "still listed 15 s after its last client left\n{}",
        s.diagnostics()
    );
    let log = s.log();
    assert!(
        log.contains("(autodb_idle_timeout), its 1 pool(s) freed"),
        "{log}"
    );
    // And PgBouncer's warning for a database it drops.
    let dropped = format!("dropping database '{TEST_DB}' as it does not exist anymore");
    assert!(log.contains(&dropped), "{log}");

    // Asked for again, it is made again.
    let c = pooled(&s, None).await;
    select1(&c).await;
    assert!(listed(&s));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autodb_idle_timeout_zero_keeps_databases() {
    let s = builder()
        .no_default_database()
        .database("*", "host=127.0.0.1 port=@PG_PORT@")
        .setting("autodb_idle_timeout", "0")
        .setting("server_idle_timeout", "1")
        .start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    drop(c);
    std::thread::sleep(Duration::from_secs(4));
    assert!(listed(&s), "forgotten with autodb_idle_timeout = 0");
}

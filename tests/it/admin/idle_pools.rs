//! Two settings of PgBouncer's development branch: `pool_idle_timeout` frees a pool
//! (its SHOW POOLS row) once it has had no client and no server for that long, and
//! `login_notify_message` greets every client with a notice as it logs in.

use std::time::Duration;

use tokio_postgres::AsyncMessage;

use super::{builder, pooled, psql_ok, select1, ADMIN, ADMIN_PW, T};
use crate::support::probe::{connect_with_messages, within};
use crate::support::{run_bounded, wait_until, Sluice, MD5_PASSWORD, MD5_USER, TEST_DB};

/// Whether SHOW POOLS has the pooled user's row.
fn pool_listed(s: &Sluice) -> bool {
    let o = psql_ok(s, "SHOW POOLS");
    o.cell("user", MD5_USER, "database").as_deref() == Some(TEST_DB)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_pool_is_freed_after_pool_idle_timeout() {
    let s = builder()
        .setting("pool_idle_timeout", "1")
        .setting("server_idle_timeout", "1")
        .start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    assert!(pool_listed(&s));
    // A connected client keeps its pool, well past both timeouts.
    std::thread::sleep(Duration::from_secs(3));
    assert!(pool_listed(&s), "freed while a client was connected");
    select1(&c).await;

    drop(c);
    // Its server closes after server_idle_timeout, then the pool goes after
    // pool_idle_timeout: ~2 s and a janitor tick or two.
    assert!(
        wait_until(Duration::from_secs(15), || !pool_listed(&s)),
        "still listed 15 s after its last client left\n{}",
        s.diagnostics()
    );
    assert!(
        s.log()
            .contains("pool(s) unused for 1s freed (pool_idle_timeout)"),
        "{}",
        s.log()
    );
    // The database itself stays configured.
    let dbs = psql_ok(&s, "SHOW DATABASES").column("name");
    assert!(dbs.iter().any(|n| n == TEST_DB), "{dbs:?}");

    // Asked for again, the pool is made again and works.
    let c = pooled(&s, None).await;
    select1(&c).await;
    assert!(pool_listed(&s));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_stay_without_pool_idle_timeout() {
    let s = builder().setting("server_idle_timeout", "1").start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    drop(c);
    std::thread::sleep(Duration::from_secs(4));
    assert!(pool_listed(&s), "freed with pool_idle_timeout = 0");
}

const GREETING: &str = "you are talking to Sluice, not PostgreSQL";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_notify_message_greets_pooled_and_console_clients() {
    let s = builder().setting("login_notify_message", GREETING).start();

    // tokio-postgres: the notice arrives as the connection's first message, and the
    // session works after it.
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let (c, mut rx) = connect_with_messages(&cfg).await;
    select1(&c).await;
    let first = within(T, "the login notice", rx.recv()).await;
    match first {
        Some(AsyncMessage::Notice(n)) => {
            assert_eq!(n.message(), GREETING);
            assert_eq!(n.severity(), "NOTICE");
        }
        other => panic!("expected the login notice, got {other:?}"),
    }

    // psql (libpq) prints it, for a pooled login and a console one.
    for (user, pw, db, sql) in [
        (MD5_USER, MD5_PASSWORD, TEST_DB, "SELECT 1"),
        (ADMIN, ADMIN_PW, "pgbouncer", "SHOW VERSION"),
    ] {
        let mut cmd = s.psql(user, pw, db);
        cmd.args(["-c", sql]);
        let out = run_bounded(&mut cmd, None, T).expect("psql finished");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{db}: {stderr}");
        assert!(
            stderr.contains(&format!("NOTICE:  {GREETING}")),
            "{db}: no greeting in {stderr:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_login_notice_by_default() {
    let s = builder().start();
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let (c, mut rx) = connect_with_messages(&cfg).await;
    select1(&c).await;
    let pending = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
    assert!(
        !matches!(pending, Ok(Some(AsyncMessage::Notice(_)))),
        "{pending:?}"
    );
}

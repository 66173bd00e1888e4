//! PAUSE, RESUME and SUSPEND: what they wait for, what they hold and for how long,
//! which databases they find, and a console's cancel request that lifts them.

use std::time::{Duration, Instant};

use super::control::state;
use super::{
    builder, console, pooled, psql_err, psql_ok, select1, ADMIN, ADMIN_PW, STATS, STATS_PW,
};
use crate::support::probe::within;
use crate::support::{self, wait_until, MD5_PASSWORD, MD5_USER, TEST_DB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_waits_for_servers_and_blocks_queries_until_resume() {
    let s = builder().setting("pool_mode", "transaction").start();
    let a = pooled(&s, None).await;
    let b = pooled(&s, None).await;
    select1(&b).await;

    // PAUSE waits for the open transaction to finish.
    within(Duration::from_secs(10), "BEGIN", a.simple_query("BEGIN"))
        .await
        .expect("BEGIN");
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let pause = tokio::spawn(async move {
        admin.simple_query("PAUSE").await.expect("PAUSE");
        admin
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !pause.is_finished(),
        "PAUSE returned with a transaction open"
    );
    within(Duration::from_secs(10), "COMMIT", a.simple_query("COMMIT"))
        .await
        .expect("COMMIT");
    let admin = within(Duration::from_secs(10), "PAUSE completes", pause)
        .await
        .expect("join");
    assert_eq!(state(&s, "paused"), Some("yes".into()));
    // Paused: servers were closed, and new queries wait.
    let pools = psql_ok(&s, "SHOW POOLS");
    assert_eq!(pools.cell("database", TEST_DB, "sv_idle"), Some("0".into()));
    let q = tokio::spawn(async move {
        b.simple_query("SELECT 1")
            .await
            .expect("query after RESUME");
        b
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!q.is_finished(), "a query ran while paused");
    assert_eq!(
        psql_ok(&s, "SHOW POOLS").cell("database", TEST_DB, "cl_waiting"),
        Some("1".into())
    );
    // Already paused; then RESUME releases the waiting query.
    psql_err(&s, ADMIN, ADMIN_PW, "PAUSE", "already suspended/paused");
    admin.simple_query("RESUME").await.expect("RESUME");
    within(Duration::from_secs(10), "query after RESUME", q)
        .await
        .expect("join");
    assert_eq!(state(&s, "paused"), Some("no".into()));
    psql_err(
        &s,
        ADMIN,
        ADMIN_PW,
        "RESUME",
        "pooler is not paused/suspended",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_one_database() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .database("other", "host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test")
        .start();
    psql_err(
        &s,
        ADMIN,
        ADMIN_PW,
        "PAUSE nosuch",
        "no such database: nosuch",
    );
    psql_err(
        &s,
        ADMIN,
        ADMIN_PW,
        "PAUSE pgbouncer",
        "cannot pause admin db: pgbouncer",
    );
    psql_ok(&s, "PAUSE sluice_test");
    let dbs = psql_ok(&s, "SHOW DATABASES");
    assert_eq!(dbs.cell("name", TEST_DB, "paused"), Some("1".into()));
    assert_eq!(dbs.cell("name", "other", "paused"), Some("0".into()));
    // The other database still serves.
    let other = support::connect(&s.config(MD5_USER, MD5_PASSWORD, "other")).await;
    select1(&other).await;
    let c = pooled(&s, None).await;
    let q = tokio::spawn(async move { c.simple_query("SELECT 1").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!q.is_finished());
    psql_err(
        &s,
        ADMIN,
        ADMIN_PW,
        "RESUME other",
        "database other is not paused",
    );
    psql_ok(&s, "RESUME sluice_test");
    within(Duration::from_secs(10), "resumed query", q)
        .await
        .expect("join")
        .expect("query");
}

/// Server connections of `TEST_DB` listed by SHOW SERVERS.
fn servers_of_test_db(s: &crate::support::Sluice) -> usize {
    let servers = psql_ok(s, "SHOW SERVERS");
    servers
        .column("database")
        .iter()
        .filter(|d| *d == TEST_DB)
        .count()
}

/// A paused database gets no new server, `min_pool_size`'s included, until RESUME, as
/// PgBouncer keeps none during a pause: a failover's old primary is left alone while
/// the pooler is pointed at the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_keeps_min_pool_size_closed_until_resume() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("min_pool_size", "2")
        .start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    assert!(
        wait_until(Duration::from_secs(10), || servers_of_test_db(&s) == 2),
        "min_pool_size never reached\n{}",
        s.diagnostics()
    );
    psql_ok(&s, "PAUSE sluice_test");
    assert_eq!(servers_of_test_db(&s), 0);
    // The janitor runs twice a second: four times here.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(servers_of_test_db(&s), 0, "servers opened while paused");
    psql_ok(&s, "RESUME sluice_test");
    assert!(
        wait_until(Duration::from_secs(10), || servers_of_test_db(&s) == 2),
        "min_pool_size not restored after RESUME\n{}",
        s.diagnostics()
    );
    select1(&c).await;
}

/// A query held by a PAUSE waits at most `query_wait_timeout`, as in PgBouncer, whose
/// janitor counts paused clients among the waiting ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_held_by_a_pause_ends_at_query_wait_timeout() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("query_wait_timeout", "1")
        .start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    psql_ok(&s, "PAUSE sluice_test");
    let t = Instant::now();
    let e = within(
        Duration::from_secs(10),
        "held query",
        c.simple_query("SELECT 1"),
    )
    .await
    .expect_err("a query ran while paused");
    let took = t.elapsed();
    let text = e.as_db_error().map(|d| d.message().to_owned());
    assert_eq!(text.as_deref(), Some("query_wait_timeout"), "{e:?}");
    assert!(took >= Duration::from_millis(900), "after {took:?}");
    psql_ok(&s, "RESUME sluice_test");
    select1(&pooled(&s, None).await).await;
}

/// RESUME and ENABLE look a name up as PgBouncer's do: the console's own database is
/// there (and not paused), a name the `*` entry could serve but nothing has made yet
/// is not; PAUSE and DISABLE make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_and_enable_find_only_databases_that_exist() {
    let s = builder()
        .database("*", "host=127.0.0.1 port=@PG_PORT@")
        .start();
    let err = |sql: &str, want: &str| psql_err(&s, ADMIN, ADMIN_PW, sql, want);
    err("RESUME pgbouncer", "database pgbouncer is not paused");
    err("RESUME unseen", "no such database: unseen");
    err("ENABLE unseen", "no such database: unseen");
    psql_ok(&s, "PAUSE unseen");
    psql_ok(&s, "RESUME unseen");
    psql_ok(&s, "DISABLE unseen");
    psql_ok(&s, "ENABLE unseen");
}

/// A client that leaves while its query is held by a PAUSE is gone at once (from
/// SHOW CLIENTS and from `max_client_conn`'s count), as a client waiting in line is,
/// not at RESUME.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_during_a_pause_is_gone_at_once() {
    let s = builder().setting("pool_mode", "transaction").start();
    let app = [("application_name", "leaver")];
    let mut c =
        crate::support::wire::RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &app)
            .await
            .expect("login");
    psql_ok(&s, "PAUSE sluice_test");
    c.query("SELECT 1").await.expect("send");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = || {
        psql_ok(&s, "SHOW CLIENTS")
            .cell("application_name", "leaver", "state")
            .is_some()
    };
    assert!(listed(), "{}", s.diagnostics());
    // Its socket closes.
    drop(c);
    assert!(
        wait_until(Duration::from_secs(5), || !listed()),
        "a client gone during the pause is still listed\n{}",
        s.diagnostics()
    );
    psql_ok(&s, "RESUME sluice_test");
}

/// A SUSPEND whose console is gone (no console client left to RESUME it) is lifted
/// by the pooler itself, as PgBouncer does ("admin disappeared when suspended").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_is_lifted_when_no_console_is_left() {
    let s = builder().setting("pool_mode", "transaction").start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    within(
        Duration::from_secs(10),
        "SUSPEND",
        admin.simple_query("SUSPEND"),
    )
    .await
    .expect("SUSPEND");
    let held = tokio::spawn(async move { c.simple_query("SELECT 1").await.map(|_| c) });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!held.is_finished(), "a query ran while suspended");
    drop(admin);
    let c = within(Duration::from_secs(10), "the held query", held)
        .await
        .expect("join")
        .expect("query after the console left");
    select1(&c).await;
    assert!(
        s.log()
            .contains("admin disappeared when suspended, doing RESUME"),
        "{}",
        s.log()
    );
}

/// psql's ^C on a PAUSE that waits: the console's cancel request lifts the pause,
/// as PgBouncer's does; the PAUSE ends with 57014 and queries flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_the_console_lifts_a_waiting_pause() {
    let s = builder().setting("pool_mode", "transaction").start();
    let a = pooled(&s, None).await;
    within(Duration::from_secs(10), "BEGIN", a.simple_query("BEGIN"))
        .await
        .expect("BEGIN");
    let admin = std::sync::Arc::new(console(&s, ADMIN, ADMIN_PW).await);
    let pause = {
        let admin = admin.clone();
        tokio::spawn(async move { admin.simple_query("PAUSE").await })
    };
    assert!(
        wait_until(Duration::from_secs(10), || state(&s, "paused").as_deref()
            == Some("yes")),
        "{}",
        s.diagnostics()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pause.is_finished(), "PAUSE waits for the transaction");

    // A stats user's ^C lifts nothing.
    let stats = console(&s, STATS, STATS_PW).await;
    within(
        Duration::from_secs(10),
        "stats cancel",
        stats.cancel_token().cancel_query(tokio_postgres::NoTls),
    )
    .await
    .expect("send the stats user's cancel");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(state(&s, "paused").as_deref(), Some("yes"));
    assert!(
        !pause.is_finished(),
        "still waiting after the stats user's cancel"
    );

    within(
        Duration::from_secs(10),
        "cancel",
        admin.cancel_token().cancel_query(tokio_postgres::NoTls),
    )
    .await
    .expect("send the console's cancel");
    let err = within(Duration::from_secs(10), "PAUSE", pause)
        .await
        .expect("join")
        .expect_err("the PAUSE was canceled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    assert_eq!(state(&s, "paused").as_deref(), Some("no"));
    // The console and the pool work on.
    within(Duration::from_secs(10), "COMMIT", a.simple_query("COMMIT"))
        .await
        .expect("COMMIT");
    select1(&pooled(&s, None).await).await;
    within(
        Duration::from_secs(10),
        "SHOW",
        admin.simple_query("SHOW STATE"),
    )
    .await
    .expect("the console after its cancel");
    assert!(
        wait_until(Duration::from_secs(5), || s
            .log()
            .contains("closing because: cancel request for console client")),
        "{}",
        s.diagnostics()
    );
}

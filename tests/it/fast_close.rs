//! Session-level settings: `server_fast_close` (issue 3) — in session mode, a server
//! retired by a reload that changes its database entry (or RECONNECT) closes at once
//! if its session is between transactions, else at the end of the transaction, and
//! the client with it; without the setting the session keeps its server.

use std::time::Duration;

use crate::admin::{ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::{self, wait_until, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

const STEP: Duration = Duration::from_secs(20);

async fn one(c: &tokio_postgres::Client, sql: &str) -> Result<String, String> {
    let rows = within(STEP, sql, c.simple_query(sql))
        .await
        .map_err(|e| e.to_string())?;
    Ok(rows
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default())
}

/// A session-mode Sluice, a client of it with `SELECT 1` done, and its server's
/// backend pid.
async fn session(fast_close: bool) -> (Sluice, tokio_postgres::Client, String) {
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .userlist(ADMIN, ADMIN_PW)
        .setting("server_fast_close", if fast_close { "1" } else { "0" })
        .start();
    let c = within(
        STEP,
        "connect",
        support::connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
    )
    .await;
    let pid = one(&c, "SELECT pg_backend_pid()")
        .await
        .expect("a first query");
    (s, c, pid)
}

/// Retires the session's server with a reload that changes its database entry.
fn retire(s: &mut Sluice) {
    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    let changed = ini.replacen(
        &format!("dbname={TEST_DB}"),
        &format!("dbname={TEST_DB} application_name=fastclose"),
        1,
    );
    assert_ne!(ini, changed, "database entry not found in {ini}");
    s.rewrite_ini(&changed);
    s.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(10), || s
        .log()
        .contains("config reloaded")));
}

/// Waits for the client's `closing because: database configuration changed` line.
fn closed_for_the_change(s: &Sluice) {
    let line = "closing because: database configuration changed";
    assert!(
        wait_until(Duration::from_secs(10), || s.log().contains(line)),
        "{}",
        s.diagnostics()
    );
}

/// As PgBouncer's janitor does: a session between transactions whose server was
/// retired is ended at once (so that its next query goes to a new server, not the
/// old one), the client told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_an_idle_session_at_once() {
    let (mut s, c, _) = session(true).await;
    retire(&mut s);
    closed_for_the_change(&s);
    let next = one(&c, "SELECT 2").await;
    assert!(
        next.is_err(),
        "the session ran on its retired server: {next:?}"
    );
}

/// A session in a transaction finishes it on its server; then it is ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_a_session_after_its_transaction() {
    let (mut s, c, pid) = session(true).await;
    one(&c, "BEGIN").await.expect("BEGIN");
    retire(&mut s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(one(&c, "SELECT pg_backend_pid()").await, Ok(pid));
    assert_eq!(one(&c, "COMMIT").await, Ok(String::new()));
    closed_for_the_change(&s);
    let next = one(&c, "SELECT 3").await;
    assert!(next.is_err(), "session survived: {next:?}");
}

/// The console's RECONNECT retires servers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_an_idle_session_at_reconnect() {
    let (s, c, _) = session(true).await;
    let admin = crate::admin::console(&s, ADMIN, ADMIN_PW).await;
    within(STEP, "RECONNECT", admin.simple_query("RECONNECT"))
        .await
        .expect("RECONNECT");
    closed_for_the_change(&s);
    assert!(one(&c, "SELECT 2").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_server_fast_close_the_session_keeps_its_server() {
    let (mut s, c, pid) = session(false).await;
    retire(&mut s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(one(&c, "SELECT pg_backend_pid()").await, Ok(pid));
}

/// `application_name_add_host`: the server sees the client's address appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_name_add_host_appends_the_client_address() {
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("application_name_add_host", "1")
        .start();
    let mut cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    cfg.application_name("app");
    let c = within(STEP, "connect", support::connect(&cfg)).await;
    let name = one(
        &c,
        "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    )
    .await
    .unwrap();
    assert!(name.starts_with("app - 127.0.0.1:"), "{name}");
}

/// With `server_fast_close` a session stops at each transaction's end; requests sent
/// together (pipelined) still all get their answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_serves_pipelined_requests() {
    use crate::support::wire::{query_msg, RawClient};
    let (s, _c, _) = session(true).await;
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("login");
    let mut batch = Vec::new();
    for i in 0..5 {
        batch.extend(query_msg(&format!("SELECT {i}")));
    }
    raw.send(&batch).await.expect("send");
    for i in 0..5 {
        let msgs = raw.until_ready(STEP).await;
        let rows = crate::support::wire::first_column(&msgs);
        assert_eq!(rows, [Some(i.to_string())], "{msgs:?}");
    }
}

//! Session-level settings: `server_fast_close` (issue 3) — in session mode, a server retired by a reload that
//! changes its database entry closes at the end of the client's current transaction,
//! and the client with it; without the setting the session keeps its server.

use std::time::Duration;

use crate::support::probe::within;
use crate::support::{self, wait_until, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

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

/// Runs a session, retires its server with a reload, and returns the answers of the
/// next two queries.
async fn after_retirement(fast_close: bool) -> (Result<String, String>, Result<String, String>) {
    let mut s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("server_fast_close", if fast_close { "1" } else { "0" })
        .start();
    let c = within(
        STEP,
        "connect",
        support::connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
    )
    .await;
    assert_eq!(one(&c, "SELECT 1").await, Ok("1".into()));
    // A new startup parameter for the database: its servers must be replaced.
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
    let second = one(&c, "SELECT 2").await;
    let third = one(&c, "SELECT 3").await;
    (second, third)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_the_session_after_the_transaction() {
    let (second, third) = after_retirement(true).await;
    // The transaction in progress completes; then server and client are closed.
    assert_eq!(second, Ok("2".into()));
    assert!(third.is_err(), "session survived: {third:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_server_fast_close_the_session_keeps_its_server() {
    let (second, third) = after_retirement(false).await;
    assert_eq!(second, Ok("2".into()));
    assert_eq!(third, Ok("3".into()));
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

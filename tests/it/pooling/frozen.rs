//! A server that stops answering (its backend frozen with SIGSTOP: what a network
//! partition or a stalled host looks like to a pooler). Clients that meet it are
//! bounded by the timeouts a PgBouncer user sets, and nobody else is held up.

use std::time::{Duration, Instant};

use super::{backend_pid, client, T};
use crate::support::probe::{marked_sluice, unique_marker, within, Frozen};
use crate::support::{MD5_PASSWORD, MD5_USER, TEST_DB};

/// The named columns of `sql`'s rows on the console whose column `key` is `value`.
async fn console_rows(
    admin: &tokio_postgres::Client,
    sql: &str,
    key: &str,
    value: &str,
    cols: &[&str],
) -> Vec<Vec<String>> {
    within(T, sql, admin.simple_query(sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.try_get(key).ok()? == Some(value) => {
                let get = |c: &&str| r.try_get(*c).ok().flatten().unwrap_or("?").to_owned();
                Some(cols.iter().map(get).collect())
            }
            _ => None,
        })
        .collect()
}

/// A client whose server must first pass `server_check_query` waits in line the
/// while, as in PgBouncer (its client is `cl_waiting`, the server `sv_tested`), so
/// `query_wait_timeout` ends its wait even when the check never comes back; the
/// next client is served by a new server.
#[tokio::test]
async fn a_check_on_a_frozen_server_ends_at_query_wait_timeout() {
    let marker = unique_marker("pool_frozen_check");
    let s = marked_sluice(&marker)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .setting("server_check_delay", "0")
        .setting("query_wait_timeout", "2")
        // Longer than the wait may last: the check's own bound must not be what ends it.
        .setting("server_connect_timeout", "30")
        .setting("admin_users", MD5_USER)
        .start();
    let first = client(&s).await;
    let pid = backend_pid(&first).await;
    drop(first);
    // Let the server sit idle past server_check_delay.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let frozen = Frozen::new(pid);
    let waiter = client(&s).await;
    let started = Instant::now();
    let asked = tokio::spawn(async move { waiter.query_one("SELECT 1", &[]).await });

    // Meanwhile the console tells it as PgBouncer would: the client waiting, the
    // server tested.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let admin = crate::admin::console(&s, MD5_USER, MD5_PASSWORD).await;
    let cols = [
        "cl_active",
        "cl_waiting",
        "sv_active",
        "sv_idle",
        "sv_tested",
    ];
    let pools = console_rows(&admin, "SHOW POOLS", "database", TEST_DB, &cols).await;
    assert_eq!(pools, [["0", "1", "0", "0", "1"]], "{cols:?}");
    let servers = console_rows(
        &admin,
        "SHOW SERVERS",
        "database",
        TEST_DB,
        &["state", "remote_pid"],
    )
    .await;
    assert_eq!(servers, [["tested".to_owned(), pid.to_string()]]);

    let e = within(T, "a query behind a frozen check", asked)
        .await
        .expect("the waiter panicked")
        .expect_err("a frozen server answered its check");
    let waited = started.elapsed();
    let text = crate::txn::common::err_text(&e);
    assert!(text.contains("query_wait_timeout"), "error: {text}");
    assert!(
        waited < Duration::from_secs(10),
        "waited {waited:?} with query_wait_timeout = 2\n{}",
        s.diagnostics()
    );
    drop(frozen);

    // The frozen server was given up: the next client gets another one.
    let next = client(&s).await;
    let again = backend_pid(&next).await;
    assert_ne!(again, pid, "the frozen server was handed out again");
}

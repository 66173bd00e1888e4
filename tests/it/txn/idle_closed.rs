//! Servers that PostgreSQL closes while they sit idle in the pool
//! (`idle_session_timeout`, as a firewall or a server-side timeout would): the next
//! client must not get one of them.

use std::time::Duration;

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_postgres_closed_while_idle_are_not_handed_out() {
    let db = fresh_db("txn_idle_closed");
    direct(
        &db,
        &format!("ALTER DATABASE {db} SET idle_session_timeout = '200ms'"),
    );
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let c = client(&s, &db).await;
    let mut errors = Vec::new();
    for step in 0..12u64 {
        let sql = format!("SELECT 'step{step}'");
        match c.simple_query(&sql).await {
            Ok(_) => {}
            Err(e) => errors.push(format!("step {step}: {}", err_text(&e))),
        }
        // Long enough for PostgreSQL to close the idle server, at a different point
        // of the janitor's half-second each time.
        tokio::time::sleep(Duration::from_millis(400 + 37 * step)).await;
    }
    assert!(errors.is_empty(), "{errors:?}\n{}", s.diagnostics());
}

/// PostgreSQL's own `idle_in_transaction_session_timeout` ends a client's transaction
/// while the client sits idle in it, its server linked: the client gets PostgreSQL's
/// error as it comes (as from PgBouncer), not a bare close at its next request, and
/// the next client gets a sound server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ending_an_idle_transaction_is_told_to_its_client() {
    let db = fresh_db("txn_idle_tx_pg");
    direct(
        &db,
        &format!("ALTER DATABASE {db} SET idle_in_transaction_session_timeout = '300ms'"),
    );
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut c = raw(&s, &db, &[]).await;
    let r = c.simple("BEGIN; SELECT 1", STEP).await;
    assert_eq!(status(&r), b'T');
    // Nothing sent: PostgreSQL's FATAL error reaches the client unasked, then the close.
    let msgs = c.until_closed(Duration::from_secs(10)).await;
    let err = first_error(&msgs).unwrap_or_else(|| panic!("no error before close: {msgs:?}"));
    assert_eq!(err.field(b'C').as_deref(), Some("25P03"), "{msgs:?}");
    let next = client(&s, &db).await;
    assert_eq!(one(&next, "SELECT 5").await, "5");
}

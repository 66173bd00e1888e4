//! `server_reset_query` in transaction mode: not run by default (PgBouncer >= 1.7),
//! run after every transaction with `server_reset_query_always = 1`.

use super::common::*;

/// A creates a TEMP table outside a transaction; B, on the same (only) server, reads
/// it. Returns B's answer: the value, or the error message. (A temp table, not an SQL
/// PREPARE: Sluice keeps prepared statements per client, so those never leak.)
async fn leaked_prepare(always: bool) -> Result<Vec<String>, String> {
    let db = fresh_db("txn_reset");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("server_reset_query_always", if always { "1" } else { "0" })
        .start();
    let mut a = raw(&s, &db, &[]).await;
    let mut b = raw(&s, &db, &[]).await;
    let r = a
        .simple("CREATE TEMP TABLE p AS SELECT 'leaked' AS v", STEP)
        .await;
    assert!(first_error(&r).is_none(), "{r:?}");
    let pid_a = col(&a.simple("SELECT pg_backend_pid()", STEP).await);
    let r = b.simple("SELECT pg_backend_pid()", STEP).await;
    assert_eq!(col(&r), pid_a, "not the same server");
    let r = b.simple("SELECT v FROM p", STEP).await;
    assert_eq!(status(&r), b'I');
    match first_error(&r) {
        Some(e) => Err(e.field(b'M').unwrap_or_default()),
        None => Ok(col(&r)),
    }
}

#[tokio::test]
async fn no_reset_between_transactions_by_default() {
    let r = leaked_prepare(false).await;
    assert_eq!(r, Ok(vec!["leaked".to_owned()]));
}

#[tokio::test]
async fn reset_query_always_runs_after_each_transaction() {
    let r = leaked_prepare(true).await;
    let e = r.expect_err("a temp table survived DISCARD ALL");
    assert!(e.contains("does not exist"), "{e}");
}

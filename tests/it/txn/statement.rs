//! `pool_mode = statement`: the server goes back after every statement, and
//! transaction blocks are refused.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::common::*;
use crate::support::probe::{within, Observer};
use crate::support::SluiceBuilder;

fn stmt_sluice(db: &str) -> SluiceBuilder {
    txn_sluice(db)
        .setting("pool_mode", "statement")
        .setting("default_pool_size", "1")
}

#[tokio::test]
async fn single_statements_work_and_release() {
    let db = fresh_db("stmt_single");
    let s = stmt_sluice(&db).start();
    let a = client(&s, &db).await;
    let b = client(&s, &db).await;
    let pa = backend_pid(&a).await;
    let pb = within(
        Duration::from_secs(5),
        "second client (server not released after a statement?)",
        backend_pid(&b),
    )
    .await;
    assert_eq!(pa, pb);
    for i in 0..10 {
        let c = if i % 2 == 0 { &a } else { &b };
        assert_eq!(one(c, &format!("SELECT {i}")).await, i.to_string());
        // Extended protocol (one Sync) works too.
        let r = within(
            STEP,
            "query_typed",
            c.query_typed("SELECT $1::int4", &[(&i, Type::INT4)]),
        )
        .await
        .expect("extended query in statement mode");
        assert_eq!(r[0].get::<_, i32>(0), i);
    }
    // A multi-statement simple query is one implicit transaction: allowed.
    let r = rows(&a, "SELECT 1; SELECT 2").await;
    assert_eq!(r, ["1", "2"]);
    let obs = Observer::new().await;
    assert_eq!(backends(&obs, &db).await, 1);
}

#[tokio::test]
async fn begin_is_refused_and_the_server_not_reused() {
    let db = fresh_db("stmt_begin");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = stmt_sluice(&db).start();

    let mut r = raw(&s, &db, &[]).await;
    r.query("BEGIN; INSERT INTO t VALUES (1)").await.unwrap();
    let why = "transaction blocks not allowed in statement pooling mode";
    expect_fatal_close(&mut r, why, STEP).await;
    // Logged for the server and the client, as PgBouncer logs it.
    let line = format!("closing because: {why}");
    assert_eq!(s.log().matches(&line).count(), 2, "{}", s.diagnostics());

    // The server of the refused transaction is not reused with it open.
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT count(*) FROM t").await, "0");
    assert_eq!(
        one(&c, "SELECT txid_current_if_assigned() IS NULL").await,
        "t"
    );
    let r = rows(&c, "INSERT INTO t VALUES (2); SELECT count(*) FROM t").await;
    assert_eq!(r, ["1"]);
}

/// PgBouncer drops the server when it sees ReadyForQuery 'T' and answers the
/// statement with the error instead: the client's BEGIN fails. Sluice forwards
/// BEGIN's CommandComplete and ReadyForQuery 'T' first, so BEGIN looks successful
/// and the error only shows up afterwards.
#[tokio::test]
async fn begin_itself_fails_in_statement_mode() {
    let db = fresh_db("stmt_begin2");
    let s = stmt_sluice(&db).start();
    let c = client(&s, &db).await;
    let e = within(STEP, "BEGIN", c.batch_execute("BEGIN"))
        .await
        .expect_err("BEGIN succeeded in statement mode");
    let text = err_text(&e);
    assert!(
        text.contains("transaction blocks not allowed in statement pooling mode"),
        "{text}"
    );

    let mut r = raw(&s, &db, &[]).await;
    r.query("BEGIN").await.unwrap();
    let msgs = r.until_closed(STEP).await;
    assert!(
        !msgs.iter().any(|m| m.tag == b'Z'),
        "a ReadyForQuery reached the client before the error: {msgs:?}"
    );
    assert!(first_error(&msgs).is_some(), "{msgs:?}");
}

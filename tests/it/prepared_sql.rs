//! SQL-level PREPARE / EXECUTE / DEALLOCATE in transaction mode (issue 5, item 3):
//! each client's statements follow it from server to server.

use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;

use crate::support::probe::within;
use crate::txn::common::{client, fresh_db, txn_sluice, STEP};

/// First column of the rows of a simple query.
async fn col(c: &tokio_postgres::Client, sql: &str) -> Result<Vec<String>, String> {
    let msgs = within(STEP, sql, c.simple_query(sql)).await.map_err(|e| {
        e.as_db_error()
            .map(|d| d.message().to_owned())
            .unwrap_or(e.to_string())
    })?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_owned()),
            _ => None,
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_prepared_statements_follow_each_client_across_servers() {
    let db = fresh_db("prep_sql");
    let s = txn_sluice(&db).setting("default_pool_size", "2").start();
    let mut tasks = Vec::new();
    for w in 0..8i64 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            // Same name, different text per client: each must run its own.
            col(&c, &format!("PREPARE q (int) AS SELECT $1 * {}", w + 1)).await?;
            for i in 0..40i64 {
                let got = if i % 3 == 0 {
                    col(&c, "BEGIN").await?;
                    let r = col(&c, &format!("EXECUTE q({i})")).await?;
                    col(&c, "COMMIT").await?;
                    r
                } else {
                    col(&c, &format!("execute q ({i});")).await?
                };
                if got != vec![(i * (w + 1)).to_string()] {
                    return Err(format!("worker {w} step {i}: got {got:?}"));
                }
            }
            col(&c, "DEALLOCATE q").await?;
            match col(&c, "EXECUTE q(1)").await {
                Err(e) if e.contains("does not exist") => {}
                other => return Err(format!("after DEALLOCATE: {other:?}")),
            }
            // The name can be prepared again, and DEALLOCATE ALL drops it.
            col(&c, "PREPARE q AS SELECT 'again'").await?;
            if col(&c, "EXECUTE q").await? != vec!["again".to_owned()] {
                return Err("re-prepared statement".into());
            }
            col(&c, "DEALLOCATE ALL").await?;
            match col(&c, "EXECUTE q").await {
                Err(e) if e.contains("does not exist") => Ok(()),
                other => Err(format!("after DEALLOCATE ALL: {other:?}")),
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(60), "worker", t)
            .await
            .expect("join")
            .expect("worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sql_prepare_leaves_no_statement() {
    let db = fresh_db("prep_sql_err");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let c = client(&s, &db).await;
    let e = col(&c, "PREPARE bad AS SELECT * FROM no_such_table")
        .await
        .unwrap_err();
    assert!(e.contains("no_such_table"), "{e}");
    let e = col(&c, "EXECUTE bad").await.unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    // The connection and the pool are fine afterwards.
    col(&c, "PREPARE good AS SELECT 7").await.unwrap();
    assert_eq!(col(&c, "EXECUTE good").await.unwrap(), vec!["7".to_owned()]);
}

/// After DDL changes a prepared statement's result type, PostgreSQL fails its next
/// execution ("cached plan must not change result type"); a client that prepares the
/// text again must then get a working statement, as it would directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_preparing_after_a_result_type_change_works() {
    let db = fresh_db("prep_ddl");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let c = client(&s, &db).await;
    col(&c, "CREATE TABLE t (a int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let st = within(STEP, "prepare", c.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    let rows = within(STEP, "query", c.query(&st, &[])).await.unwrap();
    assert_eq!(rows[0].len(), 1);
    // DDL from elsewhere: the client's next message is its Bind, right after a Sync.
    // It prepared the statement before the DDL, so PostgreSQL fails it directly too,
    // and Sluice must not hide that (the client knows the old shape).
    crate::txn::common::direct(&db, "ALTER TABLE t ADD COLUMN b int");
    let e = within(STEP, "stale query", c.query(&st, &[]))
        .await
        .unwrap_err();
    let code = e.as_db_error().map(|d| d.code().code().to_owned());
    assert_eq!(code.as_deref(), Some("0A000"), "{e}");
    // The driver's usual reaction: prepare again.
    let st = within(STEP, "re-prepare", c.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    let rows = within(STEP, "fresh query", c.query(&st, &[]))
        .await
        .unwrap();
    assert_eq!(rows[0].len(), 2);
}

/// A client that prepares a statement after DDL changed its result type must get the
/// new shape, as it would directly, even when its server still holds an older copy
/// of the same text from another client (issue 5: no client-visible error where
/// PostgreSQL would not give one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_prepared_after_ddl_sees_the_new_shape() {
    let db = fresh_db("prep_ddl2");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let a = client(&s, &db).await;
    col(&a, "CREATE TABLE t (a int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let st = within(STEP, "prepare a", a.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    within(STEP, "query a", a.query(&st, &[])).await.unwrap();
    col(&a, "ALTER TABLE t ADD COLUMN b int").await.unwrap();
    // B arrives after the DDL; the only server still has A's copy of the text.
    let b = client(&s, &db).await;
    let st = within(STEP, "prepare b", b.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    assert_eq!(st.columns().len(), 2, "B was described the old shape");
    let rows = within(STEP, "query b", b.query(&st, &[])).await.unwrap();
    assert_eq!(rows[0].len(), 2);
}

//! Transaction pooling basics: where the mode comes from, many clients over few
//! servers, transactions staying on one server, errors inside transaction blocks
//! and implicit transactions.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use crate::support::probe::within;
use crate::support::wire::send_cancel_tcp;
use crate::support::{Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER};

/// Two clients connected at once over a pool of one server both get answers, from
/// the same backend: the server is shared between transactions.
async fn assert_shared_server(s: &Sluice, db: &str) {
    let a = client(s, db).await;
    let b = client(s, db).await;
    let pa = backend_pid(&a).await;
    let pb = within(
        Duration::from_secs(5),
        "second client's query (session pooling instead of transaction pooling?)",
        backend_pid(&b),
    )
    .await;
    assert_eq!(pa, pb, "a pool of one server gave two backends");
    assert_eq!(backend_pid(&a).await, pa);
}

#[tokio::test]
async fn pool_mode_transaction_global() {
    let db = fresh_db("txn_mode_g");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    assert_shared_server(&s, &db).await;
}

#[tokio::test]
async fn pool_mode_transaction_per_database() {
    let db = fresh_db("txn_mode_d");
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(&db, &connstr(&db, "pool_mode=transaction pool_size=1"))
        .setting("pool_mode", "session")
        .start();
    assert_shared_server(&s, &db).await;
}

#[tokio::test]
async fn pool_mode_transaction_per_user() {
    let db = fresh_db("txn_mode_u");
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(&db, &connstr(&db, "pool_mode=session"))
        .user(MD5_USER, "pool_mode=transaction")
        .setting("default_pool_size", "1")
        .start();
    assert_shared_server(&s, &db).await;
}

/// Control for the three tests above: in session mode the second client waits.
#[tokio::test]
async fn session_mode_control_second_client_waits() {
    let db = fresh_db("txn_mode_s");
    let s = txn_sluice(&db)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "1")
        .start();
    let a = client(&s, &db).await;
    let b = client(&s, &db).await;
    backend_pid(&a).await;
    let waited = tokio::time::timeout(Duration::from_millis(700), b.simple_query("SELECT 1")).await;
    assert!(
        waited.is_err(),
        "session mode lent a busy server: {waited:?}"
    );
    drop(a);
    within(STEP, "b after a left", b.simple_query("SELECT 1"))
        .await
        .expect("b served after a left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_clients_over_two_servers_keep_their_transactions() {
    let db = fresh_db("txn_twenty");
    direct(
        &db,
        "CREATE TABLE t (client int, v int); GRANT ALL ON t TO sluice_md5;",
    );
    let s = txn_sluice(&db).setting("default_pool_size", "2").start();
    let sampler = Sampler::start(&db, Duration::from_millis(20)).await;
    let mut tasks = Vec::new();
    for id in 0..20 {
        let mut c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            let mut mine: Vec<String> = Vec::new();
            let mut pids = HashSet::new();
            for round in 0..5 {
                let tx = c.transaction().await.expect("BEGIN");
                let (v1, v2) = (id * 1000 + round * 2, id * 1000 + round * 2 + 1);
                tx.batch_execute(&format!("INSERT INTO t VALUES ({id}, {v1}), ({id}, {v2})"))
                    .await
                    .expect("INSERT");
                let pid = tx.simple_query("SELECT pg_backend_pid()").await.unwrap();
                tx.batch_execute("SELECT pg_sleep(0.005)").await.unwrap();
                let seen = tx
                    .simple_query(&format!("SELECT v FROM t WHERE client = {id} ORDER BY v"))
                    .await
                    .expect("SELECT back");
                let pid2 = tx.simple_query("SELECT pg_backend_pid()").await.unwrap();
                let pid_of = |m: &[tokio_postgres::SimpleQueryMessage]| -> String {
                    match &m[1] {
                        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).unwrap().into(),
                        other => panic!("{other:?}"),
                    }
                };
                let (p1, p2) = (pid_of(&pid), pid_of(&pid2));
                assert_eq!(p1, p2, "client {id}: a transaction moved between servers");
                pids.insert(p1);
                mine.push(v1.to_string());
                mine.push(v2.to_string());
                let got: Vec<String> = seen
                    .iter()
                    .filter_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => {
                            Some(r.get(0).unwrap().to_owned())
                        }
                        _ => None,
                    })
                    .collect();
                let mut want = mine.clone();
                want.sort_by_key(|v| v.parse::<i64>().unwrap());
                assert_eq!(got, want, "client {id} round {round} read back");
                tx.commit().await.expect("COMMIT");
            }
            pids
        }));
    }
    let mut all_pids = HashSet::new();
    for t in tasks {
        let pids = within(Duration::from_secs(60), "client task", t)
            .await
            .expect("client task panicked");
        all_pids.extend(pids);
    }
    let (max, samples) = sampler.finish().await;
    assert!(samples > 0);
    assert!(max <= 2, "{max} backends for a pool of 2");
    assert!(all_pids.len() <= 2, "transactions ran on {all_pids:?}");
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT count(*) FROM t").await, "200");
    assert_eq!(
        one(&c, "SELECT count(DISTINCT (client, v)) FROM t").await,
        "200"
    );
}

/// An error inside a transaction block keeps the server with its client until
/// ROLLBACK; the other clients wait for it and are not affected.
#[tokio::test]
async fn error_in_transaction_block_keeps_server_until_rollback() {
    let db = fresh_db("txn_err");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let b = Arc::new(client(&s, &db).await);

    let r = a.simple("BEGIN; INSERT INTO t VALUES (1)", STEP).await;
    assert_eq!(status(&r), b'T');
    let r = a.simple("SELECT 1/0", STEP).await;
    assert_eq!(status(&r), b'E', "{r:?}");
    let r = a.simple("SELECT 1", STEP).await;
    assert_eq!(
        status(&r),
        b'E',
        "an aborted transaction must refuse: {r:?}"
    );
    assert!(first_error(&r).is_some());

    let b2 = b.clone();
    let waiting = tokio::spawn(async move { one(&b2, "SELECT count(*) FROM t").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "B was given the server of A's failed transaction"
    );
    let r = a.simple("ROLLBACK", STEP).await;
    assert_eq!(status(&r), b'I');
    let n = within(STEP, "B after A's ROLLBACK", waiting).await.unwrap();
    assert_eq!(n, "0", "the rolled back row is visible");
    // A is fine afterwards, and so is the server.
    let r = a.simple("SELECT 42", STEP).await;
    assert_eq!(col(&r), ["42"]);
    assert_eq!(status(&r), b'I');
    assert_eq!(one(&b, "SELECT 7").await, "7");
}

/// A multi-statement simple query is one implicit transaction: all or nothing, and
/// the server is released after it; `BEGIN; ...` in one string keeps it.
#[tokio::test]
async fn implicit_transactions_in_multi_statement_queries() {
    let db = fresh_db("txn_implicit");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let b = Arc::new(client(&s, &db).await);

    let r = a
        .simple(
            "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); SELECT 1/0",
            STEP,
        )
        .await;
    assert!(first_error(&r).is_some(), "{r:?}");
    assert_eq!(status(&r), b'I');
    assert_eq!(one(&b, "SELECT count(*) FROM t").await, "0");

    let r = a
        .simple(
            "INSERT INTO t VALUES (3); INSERT INTO t VALUES (4); SELECT count(*) FROM t",
            STEP,
        )
        .await;
    assert_eq!(col(&r), ["2"]);
    assert_eq!(status(&r), b'I');
    assert_eq!(one(&b, "SELECT count(*) FROM t").await, "2");

    // An explicit BEGIN inside the string leaves a transaction open.
    let r = a.simple("BEGIN; INSERT INTO t VALUES (5)", STEP).await;
    assert_eq!(status(&r), b'T');
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { one(&b2, "SELECT count(*) FROM t").await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !waiting.is_finished(),
        "B got the server of A's open transaction"
    );
    let r = a.simple("INSERT INTO t VALUES (6); COMMIT", STEP).await;
    assert_eq!(status(&r), b'I');
    let n = within(STEP, "B after A's COMMIT", waiting).await.unwrap();
    assert_eq!(n, "4");
}

/// A 3 MB request from a client waiting in line: the releasing side writes what the
/// client had sent when it took its place (`pool::Request`), and the client's relay
/// sends what came while it waited and after, in order. With prepared statements
/// off (the bytes go to the line as read) and on (only whole plain requests do).
#[tokio::test]
async fn a_large_request_left_in_line_arrives_whole() {
    for prepared in ["0", "200"] {
        let db = fresh_db("txn_large_wait");
        let s = txn_sluice(&db)
            .setting("default_pool_size", "1")
            .setting("max_prepared_statements", prepared)
            // The single loop, where the request waits with the place.
            .env("SLUICE_WORKERS", "0")
            .start();
        let mut holder = raw(&s, &db, &[]).await;
        let mut waiter = raw(&s, &db, &[]).await;
        let r = holder.simple("BEGIN; SELECT 1", STEP).await;
        assert_eq!(status(&r), b'T', "{r:?}");
        // 3 MB of query text: more than is read before the client takes its place,
        // and more than is buffered while it waits.
        let big = "x".repeat(3 << 20);
        let sql = format!("SELECT length('{big}'); SELECT 'after'");
        waiter.query(&sql).await.expect("send");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = holder.simple("COMMIT", STEP).await;
        assert_eq!(status(&r), b'I', "{r:?}");
        let r = waiter.until_ready(STEP).await;
        assert!(first_error(&r).is_none(), "prepared={prepared}: {r:?}");
        assert_eq!(col(&r), ["3145728", "after"], "prepared={prepared}");
        // The server is clean for the next client.
        let r = holder.simple("SELECT 'next'", STEP).await;
        assert_eq!(col(&r), ["next"], "prepared={prepared}");
    }
}

/// On the single event loop, a client waiting in line whose request was written to
/// the server handed over is left asleep until the server answers (pool/line.rs):
/// meanwhile its cancel key reaches that server, and the answer, an error here, wakes
/// it and reaches it; the server is then clean for the next client.
#[tokio::test]
async fn a_request_written_in_line_can_be_cancelled_before_its_answer() {
    let db = fresh_db("txn_wait_cancel");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .env("SLUICE_WORKERS", "0")
        .start();
    let mut holder = raw(&s, &db, &[]).await;
    let mut waiter = raw(&s, &db, &[]).await;
    for round in 0..2 {
        let r = holder.simple("BEGIN; SELECT 1", STEP).await;
        assert_eq!(status(&r), b'T', "round {round}: {r:?}");
        waiter.query("SELECT pg_sleep(60)").await.expect("send");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = holder.simple("COMMIT", STEP).await;
        assert_eq!(status(&r), b'I', "round {round}: {r:?}");
        // The sleep has started on the server by now; the waiter's task sleeps too.
        tokio::time::sleep(Duration::from_millis(300)).await;
        send_cancel_tcp(s.port(), waiter.pid, waiter.key).await;
        let r = waiter.until_ready(STEP).await;
        let e = first_error(&r).unwrap_or_else(|| panic!("round {round}: no error: {r:?}"));
        assert_eq!(
            e.field(b'C').as_deref(),
            Some("57014"),
            "round {round}: {r:?}"
        );
        assert_eq!(status(&r), b'I', "round {round}: {r:?}");
        let r = holder.simple("SELECT 'next'", STEP).await;
        assert_eq!(col(&r), ["next"], "round {round}");
    }
}

/// At the end of a transaction the server goes to the next client in line before
/// the last of its answer is written to the client that asked (session/run.rs,
/// `Session::pay_client`). Twelve clients over one server, answers of one row to
/// many reads' worth: each client gets its own answers, whole and in order.
#[tokio::test]
async fn answers_owed_at_the_hand_over_reach_their_own_clients_whole() {
    let db = fresh_db("txn_owed");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut tasks = Vec::new();
    for id in 0..12u32 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            for round in 0..20u32 {
                let len = [10, 5_000, 70_000, 300_000][((id + round) % 4) as usize];
                let fill = char::from(b'a' + (id % 26) as u8);
                let sql = format!("SELECT '{id}:{round}', repeat('{fill}', {len})");
                let msgs = c.simple_query(&sql).await.expect("query");
                let row = msgs
                    .iter()
                    .find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                        _ => None,
                    })
                    .unwrap_or_else(|| panic!("client {id} round {round}: no row"));
                assert_eq!(row.get(0), Some(format!("{id}:{round}").as_str()));
                let body = row.get(1).expect("second column");
                assert_eq!(body.len(), len, "client {id} round {round}: length");
                assert!(
                    body.chars().all(|ch| ch == fill),
                    "client {id}: foreign bytes"
                );
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(60), "client task", t)
            .await
            .expect("client task panicked");
    }
    // The server is clean for the next client.
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT 'after'").await, "after");
}

//! Transaction pooling with the extended protocol: pipelines with several Syncs,
//! Flush without Sync, COPY both ways (psql), and named prepared statements.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;

use super::common::*;
use crate::support::probe::within;
use crate::support::wire::{first_column, frame};
use crate::support::{run_bounded, MD5_PASSWORD, MD5_USER};

/// tokio-postgres pipelines concurrent queries of one client: several
/// Parse/Bind/Describe/Execute/Sync batches in flight at once, on four clients
/// sharing one server. Every answer goes to the query that asked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_extended_queries_with_several_syncs() {
    let db = fresh_db("txn_pipe");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut tasks = Vec::new();
    for id in 0..4i32 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            for round in 0..25i32 {
                let base = id * 100_000 + round * 10;
                let q = "SELECT $1::int4 + 0";
                let v: [i32; 4] = [base, base + 1, base + 2, base + 3];
                let p: Vec<[(&(dyn tokio_postgres::types::ToSql + Sync), Type); 1]> =
                    v.iter().map(|x| [(x as _, Type::INT4)]).collect();
                let (a, b, c3, d) = tokio::join!(
                    c.query_typed(q, &p[0]),
                    c.query_typed(q, &p[1]),
                    c.query_typed(q, &p[2]),
                    c.query_typed(q, &p[3]),
                );
                for (i, r) in [a, b, c3, d].into_iter().enumerate() {
                    let rows = r.unwrap_or_else(|e| panic!("client {id}: {e} {e:?}"));
                    assert_eq!(rows.len(), 1);
                    assert_eq!(rows[0].get::<_, i32>(0), base + i as i32, "client {id}");
                }
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(60), "pipelining client", t)
            .await
            .expect("pipelining client panicked");
    }
}

/// Raw pipeline in one write: three extended batches, each with its own Sync, then
/// a simple query. All four answers come back in order; then another client gets
/// the (single) server.
#[tokio::test]
async fn raw_pipeline_in_one_write() {
    let db = fresh_db("txn_rawpipe");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let mut bytes = Vec::new();
    for sql in [
        "BEGIN",
        "INSERT INTO t VALUES (1)",
        "SELECT count(*) FROM t",
    ] {
        bytes.extend(extended(sql));
        bytes.extend(sync_msg());
    }
    bytes.extend(crate::support::wire::query_msg("COMMIT; SELECT 'done'"));
    a.send(&bytes).await.expect("send pipeline");
    let mut statuses = Vec::new();
    let mut data = Vec::new();
    for _ in 0..4 {
        let msgs = a.until_ready(STEP).await;
        assert!(first_error(&msgs).is_none(), "{msgs:?}");
        data.extend(col(&msgs));
        statuses.push(status(&msgs));
    }
    assert_eq!(statuses, [b'T', b'T', b'T', b'I']);
    assert_eq!(data, ["1", "done"]);
    let b = client(&s, &db).await;
    assert_eq!(one(&b, "SELECT count(*) FROM t").await, "1");
}

/// Parse/Bind/Execute + Flush: the results arrive without a ReadyForQuery and the
/// server stays with the client (others wait) until it sends Sync.
#[tokio::test]
async fn flush_without_sync_keeps_the_server() {
    let db = fresh_db("txn_flush");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let b = Arc::new(client(&s, &db).await);
    let mut bytes = extended("SELECT 42");
    bytes.extend(flush_msg());
    a.send(&bytes).await.unwrap();
    // ParseComplete, BindComplete, RowDescription, DataRow, CommandComplete.
    let msgs = read_n(&mut a, 5, STEP).await;
    let tags: Vec<char> = msgs.iter().map(|m| m.tag as char).collect();
    assert_eq!(tags, ['1', '2', 'T', 'D', 'C'], "{msgs:?}");
    assert_eq!(col(&msgs), ["42"]);

    let b2 = b.clone();
    let waiting = tokio::spawn(async move { one(&b2, "SELECT 7").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the server was lent away between Flush and Sync"
    );
    // More extended messages on the same server, still unsynced, then Sync.
    let mut bytes = extended("SELECT 43");
    bytes.extend(sync_msg());
    a.send(&bytes).await.unwrap();
    let msgs = a.until_ready(STEP).await;
    assert_eq!(col(&msgs), ["43"]);
    assert_eq!(status(&msgs), b'I');
    assert_eq!(within(STEP, "B after Sync", waiting).await.unwrap(), "7");
}

fn psql_run(s: &crate::support::Sluice, db: &str, sql: &str, stdin: Option<&str>) -> String {
    let mut cmd = s.psql(MD5_USER, MD5_PASSWORD, db);
    cmd.args(["-c", sql]);
    let out = run_bounded(&mut cmd, stdin, Duration::from_secs(60)).expect("psql hung");
    assert!(
        out.status.success(),
        "psql {sql:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// COPY FROM STDIN and COPY TO STDOUT with psql, several at once over one server,
/// and a failing COPY that leaves the server usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_in_and_out_with_psql() {
    let db = fresh_db("txn_copy");
    direct(
        &db,
        "CREATE TABLE t (k int, v text); GRANT ALL ON t TO sluice_md5;",
    );
    let s = Arc::new(txn_sluice(&db).setting("default_pool_size", "1").start());
    let mut threads = Vec::new();
    for k in 0..4 {
        let (s, db) = (s.clone(), db.clone());
        threads.push(std::thread::spawn(move || {
            let data: String = (0..2000).map(|i| format!("{k}\trow {k}-{i}\n")).collect();
            psql_run(&s, &db, "COPY t FROM STDIN", Some(&data));
        }));
    }
    for t in threads {
        t.join().expect("COPY thread");
    }
    let out = psql_run(
        &s,
        &db,
        "COPY (SELECT k, count(*) FROM t GROUP BY k ORDER BY k) TO STDOUT",
        None,
    );
    assert_eq!(out, "0\t2000\n1\t2000\n2\t2000\n3\t2000\n");
    let out = psql_run(&s, &db, "COPY t TO STDOUT", None);
    assert_eq!(out.lines().count(), 8000);
    assert!(out.contains("3\trow 3-1999\n"));

    // A COPY the server rejects half-way (bad data) ends in an error, not a hang.
    let mut cmd = s.psql(MD5_USER, MD5_PASSWORD, &db);
    cmd.args(["-c", "COPY t FROM STDIN"]);
    let out = run_bounded(
        &mut cmd,
        Some("9\tok\nnot-a-number\tx\n"),
        Duration::from_secs(60),
    )
    .expect("psql hung");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid input syntax"));

    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT count(*) FROM t").await, "8000");
    assert_eq!(one(&c, "SELECT 1").await, "1");
}

/// Named prepared statements outside transactions (tokio-postgres `prepare`, as
/// with pgbench -M prepared or most drivers). PgBouncer (max_prepared_statements,
/// default 200) makes them follow the client from server to server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn named_prepared_statements_follow_the_client() {
    let db = fresh_db("txn_prep");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "2")
        .setting("max_prepared_statements", "200")
        .start();
    let mut tasks = Vec::new();
    for id in 0..6i32 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            // Every client names its statements s0, s1, ... (tokio-postgres), with
            // texts of its own: the same name means different things per client.
            let mul = c
                .prepare(&format!("SELECT $1::int4 * {}", id + 2))
                .await
                .expect("prepare");
            let add = c
                .prepare(&format!("SELECT $1::int4 + {}", id * 1000))
                .await
                .expect("prepare");
            for i in 0..20i32 {
                let row = c
                    .query_one(&mul, &[&i])
                    .await
                    .unwrap_or_else(|e| panic!("client {id} execute {i}: {}", err_text(&e)));
                assert_eq!(row.get::<_, i32>(0), i * (id + 2), "client {id}");
                let row = c
                    .query_one(&add, &[&i])
                    .await
                    .unwrap_or_else(|e| panic!("client {id} execute {i}: {}", err_text(&e)));
                assert_eq!(row.get::<_, i32>(0), i + id * 1000, "client {id}");
                // One-shot statements (prepared, used once, closed) in between.
                let row = c
                    .query_one("SELECT $1::int4 - 1", &[&i])
                    .await
                    .unwrap_or_else(|e| panic!("client {id} one-shot {i}: {}", err_text(&e)));
                assert_eq!(row.get::<_, i32>(0), i - 1);
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(60), "prepared statement client", t)
            .await
            .expect("prepared statement client failed");
    }
}

/// COPY FROM STDIN ended by the client's CopyFail: the server answers with an
/// error and ReadyForQuery, and is then clean for the next client.
#[tokio::test]
async fn copy_fail_from_the_client() {
    let db = fresh_db("txn_copyfail");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    a.query("COPY t FROM STDIN").await.unwrap();
    let m = a.recv(STEP).await.expect("CopyInResponse");
    assert_eq!(m.tag, b'G', "{m:?}");
    let mut bytes = crate::support::wire::frame(b'd', b"1\n2\n");
    bytes.extend(crate::support::wire::frame(b'f', b"client gave up\0"));
    a.send(&bytes).await.unwrap();
    let r = a.until_ready(STEP).await;
    let e = first_error(&r).expect("an error for CopyFail");
    assert!(e.field(b'M').unwrap_or_default().contains("client gave up"));
    assert_eq!(status(&r), b'I');
    let b = client(&s, &db).await;
    assert_eq!(one(&b, "SELECT count(*) FROM t").await, "0");
    // And a COPY that completes, on the same server.
    a.query("COPY t FROM STDIN").await.unwrap();
    assert_eq!(a.recv(STEP).await.expect("CopyInResponse").tag, b'G');
    let mut bytes = crate::support::wire::frame(b'd', b"1\n2\n");
    bytes.extend(crate::support::wire::frame(b'c', b""));
    a.send(&bytes).await.unwrap();
    let r = a.until_ready(STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    assert_eq!(one(&b, "SELECT count(*) FROM t").await, "2");
}

/// An error in one pipelined batch: the server skips to its Sync, the next batch
/// runs normally, and the server is released clean after both.
#[tokio::test]
async fn error_inside_a_pipeline() {
    let db = fresh_db("txn_pipe_err");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let mut bytes = extended("SELECT 1/0");
    bytes.extend(extended("SELECT 'skipped'"));
    bytes.extend(sync_msg());
    bytes.extend(extended("SELECT 'second'"));
    bytes.extend(sync_msg());
    a.send(&bytes).await.unwrap();
    let first = a.until_ready(STEP).await;
    assert!(first_error(&first).is_some(), "{first:?}");
    assert!(col(&first).is_empty(), "{first:?}");
    assert_eq!(status(&first), b'I');
    let second = a.until_ready(STEP).await;
    assert!(first_error(&second).is_none(), "{second:?}");
    assert_eq!(col(&second), ["second"]);
    let b = client(&s, &db).await;
    assert_eq!(one(&b, "SELECT 1").await, "1");
    assert_eq!(col(&a.simple("SELECT 3", STEP).await), ["3"]);
}

/// A client that sends its first request in the same write as its password: the
/// request waits in the login buffer, and its named statement must still be renamed
/// for the server like any other (no client-named statement left on a shared server).
#[tokio::test]
async fn request_sent_with_the_login_goes_through_statement_renaming() {
    let db = fresh_db("txn_loginpipe");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut c = RawClient::connect(s.port()).await;
    c.send(&crate::support::wire::startup_msg(&[
        ("user", MD5_USER),
        ("database", &db),
    ]))
    .await
    .expect("startup");
    let m = c.recv(STEP).await.expect("auth request");
    assert_eq!(&m.body[..4], &5u32.to_be_bytes(), "md5 request: {m:?}");
    let salt = [m.body[4], m.body[5], m.body[6], m.body[7]];
    let hash = postgres_protocol::authentication::md5_hash(
        MD5_USER.as_bytes(),
        MD5_PASSWORD.as_bytes(),
        salt,
    );
    let mut out = frame(b'p', format!("{hash}\0").as_bytes());
    out.extend(frame(b'P', b"early\0SELECT 41 + 1\0\0\0"));
    out.extend(frame(b'B', b"\0early\0\0\0\0\0\0\0"));
    out.extend(frame(b'E', b"\0\0\0\0\0"));
    out.extend(sync_msg());
    c.send(&out).await.expect("password and request");
    let mut readies = 0;
    let mut seen = Vec::new();
    while readies < 2 {
        let m = c.recv(STEP).await.expect("closed during the first request");
        assert_ne!(m.tag, b'E', "{:?} after {seen:?}", m.field(b'M'));
        readies += usize::from(m.tag == b'Z');
        seen.push(m);
    }
    assert_eq!(col(&seen), ["42"], "{seen:?}");
    let names = col(&c
        .simple("SELECT name FROM pg_prepared_statements", STEP)
        .await);
    assert!(
        !names.iter().any(|n| n == "early"),
        "the client's own name reached the server: {names:?}"
    );
    // And the statement is the client's for later transactions.
    let mut bind = frame(b'B', b"\0early\0\0\0\0\0\0\0");
    bind.extend(frame(b'E', b"\0\0\0\0\0"));
    bind.extend(sync_msg());
    c.send(&bind).await.expect("bind again");
    let msgs = c.until_ready(STEP).await;
    assert!(first_error(&msgs).is_none(), "{msgs:?}");
    assert_eq!(col(&msgs), ["42"]);
}

/// A batch on the unnamed statement passes the prepared-statement tracker by (a plain
/// request); named statements sent behind it before its answers arrive (or in the
/// same write) make the request tracked from there on, and the answers still owed
/// must be handed to the tracker at the switch: else the ParseComplete Sluice makes
/// for the second Parse of the same text would land among the first batch's answers.
#[tokio::test]
async fn named_statements_behind_an_unnamed_batch() {
    let db = fresh_db("txn_plain_ext");
    for (case, apart) in [("two writes", true), ("one write", false)] {
        // A fresh client and a fresh server: neither holds a statement yet.
        let s = txn_sluice(&db).setting("default_pool_size", "1").start();
        let mut a = raw(&s, &db, &[]).await;
        let mut first = extended("SELECT pg_sleep(0.2)::text || 'slept'");
        first.extend(sync_msg());
        let mut named = frame(b'P', b"s1\0SELECT 'named'\0\0\0");
        named.extend(frame(b'P', b"s2\0SELECT 'named'\0\0\0"));
        named.extend(frame(b'B', b"\0s1\0\0\0\0\0\0\0"));
        named.extend(frame(b'D', b"P\0"));
        named.extend(frame(b'E', &[0, 0, 0, 0, 0]));
        named.extend(sync_msg());
        if apart {
            a.send(&first).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            a.send(&named).await.unwrap();
        } else {
            a.send(&[first, named].concat()).await.unwrap();
        }
        let tags = |msgs: &[crate::support::wire::RawMsg]| -> String {
            msgs.iter().map(|m| m.tag as char).collect()
        };
        let msgs = a.until_ready(STEP).await;
        assert_eq!(tags(&msgs), "12TDCZ", "{case}: {msgs:?}");
        assert_eq!(col(&msgs), ["slept"], "{case}");
        let msgs = a.until_ready(STEP).await;
        assert_eq!(tags(&msgs), "112TDCZ", "{case}: {msgs:?}");
        assert_eq!(col(&msgs), ["named"], "{case}");
        // Both statements are the client's: a later Bind finds them.
        let mut again = frame(b'B', b"\0s2\0\0\0\0\0\0\0");
        again.extend(frame(b'E', &[0, 0, 0, 0, 0]));
        again.extend(sync_msg());
        a.send(&again).await.unwrap();
        let msgs = a.until_ready(STEP).await;
        assert_eq!(tags(&msgs), "2DCZ", "{case}: {msgs:?}");
        assert_eq!(col(&msgs), ["named"], "{case}");
    }
}

/// A client that holds a named statement sends `DEALLOCATE ALL` on the unnamed
/// statement (as pgjdbc does), or behind another command in one simple query: both
/// are plain requests, relayed without rewriting, but their CommandComplete must
/// still clear what Sluice tracks, so that the client can Parse the same name again
/// (and its server is asked to prepare it again).
#[tokio::test]
async fn deallocate_all_in_a_plain_request_clears_the_statements() {
    let db = fresh_db("txn_plain_dealloc");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let tags = |msgs: &[crate::support::wire::RawMsg]| -> String {
        msgs.iter().map(|m| m.tag as char).collect()
    };
    let mut named = frame(b'P', b"s1\0SELECT 'named'\0\0\0");
    named.extend(frame(b'B', b"\0s1\0\0\0\0\0\0\0"));
    named.extend(frame(b'E', &[0, 0, 0, 0, 0]));
    named.extend(sync_msg());
    let mut unnamed = extended("DEALLOCATE ALL");
    unnamed.extend(sync_msg());
    let simple = frame(b'Q', b"SELECT 1; DEALLOCATE ALL\0");
    for (case, dealloc) in [("unnamed statement", unnamed), ("simple query", simple)] {
        a.send(&named).await.unwrap();
        let msgs = a.until_ready(STEP).await;
        assert_eq!(tags(&msgs), "12DCZ", "{case}: {msgs:?}");
        assert_eq!(col(&msgs), ["named"], "{case}");
        a.send(&dealloc).await.unwrap();
        let msgs = a.until_ready(STEP).await;
        assert!(
            msgs.iter().all(|m| m.tag != b'E'),
            "{case}: DEALLOCATE ALL failed: {msgs:?}"
        );
    }
    // The name is free again after the second one too.
    a.send(&named).await.unwrap();
    let msgs = a.until_ready(STEP).await;
    assert_eq!(tags(&msgs), "12DCZ", "{msgs:?}");
}

/// A COPY FROM STDIN the server fails while the client is still sending: the
/// client's late CopyData and CopyDone arrive after the server's ReadyForQuery, when
/// the server is back in the pool. PostgreSQL drops such messages without an answer,
/// so a pooler that forwarded them would hold a server waiting for one (PgBouncer's
/// pool exhaustion before its fix #1471). They must neither hold a server nor reach
/// another client's.
#[tokio::test]
async fn late_copy_messages_after_a_failed_copy_hold_no_server() {
    let db = fresh_db("txn_latecopy");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "10")
        .start();
    let mut a = raw(&s, &db, &[]).await;
    a.query("COPY t FROM STDIN").await.unwrap();
    assert_eq!(a.recv(STEP).await.expect("CopyInResponse").tag, b'G');
    // A bad row: the server answers with an error and ReadyForQuery at once.
    a.send(&frame(b'd', b"not-a-number\n")).await.unwrap();
    let r = a.until_ready(STEP).await;
    assert!(first_error(&r).is_some(), "{r:?}");
    assert_eq!(status(&r), b'I');
    // The rest of the client's stream, sent before it read the error.
    let mut late = Vec::new();
    for i in 0..50 {
        late.extend(frame(b'd', format!("{i}\n").as_bytes()));
    }
    late.extend(frame(b'c', b""));
    a.send(&late).await.unwrap();
    // Nothing answers them (and the connection stays open).
    let answer = a.try_recv(Duration::from_millis(500)).await;
    assert!(
        answer.is_err(),
        "an answer to late COPY messages: {answer:?}\n{}",
        s.log()
    );
    // The pool's one server is free for another client, and clean.
    let b = client(&s, &db).await;
    assert_eq!(
        within(
            Duration::from_secs(20),
            "b's query",
            one(&b, "SELECT count(*) FROM t")
        )
        .await,
        "0"
    );
    // The first client goes on with its next query and gets its own answer.
    let r = a.simple("SELECT 41 + 1", STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    assert_eq!(first_column(&r), [Some("42".to_string())]);
    assert_eq!(one(&b, "SELECT 2").await, "2");
}

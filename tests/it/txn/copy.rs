//! COPY FROM STDIN through the extended protocol, as tokio-postgres and libpq's
//! PQexecParams send it: Bind, Execute and a Sync, then the data, CopyDone (or
//! CopyFail) and a second Sync. PostgreSQL ignores a Sync that comes during COPY,
//! so the two Syncs get one ReadyForQuery; the server must still go back to the
//! pool after it, and the next client must get nothing of this one's.

use bytes::Bytes;
use futures_util::SinkExt;
use tokio_postgres::Client;

use super::common::*;
use crate::support::probe::within;
use crate::support::wire::frame;

/// Copies `rows` through tokio-postgres's `copy_in` (a named prepared statement, then
/// Bind/Execute/Sync, data, CopyDone/Sync). `Err` carries the error's text.
async fn copy_in(c: &Client, rows: &str) -> Result<u64, String> {
    let stmt = c
        .prepare("COPY t FROM STDIN")
        .await
        .map_err(|e| err_text(&e))?;
    let sink = c.copy_in(&stmt).await.map_err(|e| err_text(&e))?;
    let mut sink = std::pin::pin!(sink);
    sink.send(Bytes::from(rows.to_owned()))
        .await
        .map_err(|e| err_text(&e))?;
    sink.as_mut().finish().await.map_err(|e| err_text(&e))
}

/// Sluice with one server, so that a server held by a client after its COPY stops
/// the next client.
fn one_server(db: &str, max_prepared: &str) -> crate::support::Sluice {
    txn_sluice(db)
        .setting("default_pool_size", "1")
        .setting("max_prepared_statements", max_prepared)
        .setting("query_wait_timeout", "10")
        .start()
}

/// Copies, then a second client (which needs the one server) sees the rows; in
/// rounds, with prepared-statement tracking on and off (two different relay paths).
#[tokio::test]
async fn copy_in_with_tokio_postgres_gives_the_server_back() {
    for max_prepared in ["0", "200"] {
        let db = fresh_db("txn_copy_ext");
        direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
        let s = one_server(&db, max_prepared);
        let a = client(&s, &db).await;
        let b = client(&s, &db).await;
        for round in 1..=3u64 {
            let n = within(STEP, "copy_in", copy_in(&a, "1\n2\n3\n"))
                .await
                .unwrap_or_else(|e| panic!("max_prepared {max_prepared}: {e}"));
            assert_eq!(n, 3);
            // The other client gets the server only if the copier let it go.
            assert_eq!(
                one(&b, "SELECT count(*) FROM t").await,
                (3 * round).to_string(),
                "max_prepared {max_prepared}"
            );
            assert_eq!(one(&a, "SELECT 7").await, "7");
        }
    }
}

/// A COPY the server rejects (bad data), and one the client gives up (the sink is
/// dropped: CopyFail): each gets its error, the copier can go on, and the server
/// goes back to the pool and serves the next client cleanly.
#[tokio::test]
async fn a_failed_copy_in_gives_the_server_back() {
    for max_prepared in ["0", "200"] {
        let db = fresh_db("txn_copy_ext_err");
        direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
        let s = one_server(&db, max_prepared);
        let a = client(&s, &db).await;
        let b = client(&s, &db).await;
        for round in 0..3 {
            let e = within(STEP, "bad copy_in", copy_in(&a, "1\nnot a number\n"))
                .await
                .expect_err("bad data must fail");
            assert!(e.contains("invalid input syntax"), "round {round}: {e}");
            assert_eq!(one(&b, "SELECT count(*) FROM t").await, "0");
            // The client drops its sink half-way: tokio-postgres sends CopyFail.
            let stmt = a.prepare("COPY t FROM STDIN").await.expect("prepare");
            let sink = within(STEP, "copy_in", a.copy_in::<_, Bytes>(&stmt))
                .await
                .expect("copy_in");
            drop(sink);
            assert_eq!(one(&a, "SELECT 8").await, "8", "round {round}");
            assert_eq!(one(&b, "SELECT count(*) FROM t").await, "0");
        }
        // And a good COPY after them all.
        let n = within(STEP, "copy_in", copy_in(&a, "5\n"))
            .await
            .unwrap_or_else(|e| panic!("max_prepared {max_prepared}: {e}"));
        assert_eq!(n, 1);
        assert_eq!(one(&b, "SELECT sum(v) FROM t").await, "5");
    }
}

/// libpq's PQexecParams shape on the wire, unnamed statement: Parse, Bind, Describe,
/// Execute, Sync in one write, then the data with CopyDone and Sync. One
/// ReadyForQuery comes back, and the server serves the next client.
#[tokio::test]
async fn copy_in_as_libpq_sends_it() {
    let db = fresh_db("txn_copy_libpq");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = one_server(&db, "200");
    let mut a = raw(&s, &db, &[]).await;
    let b = client(&s, &db).await;
    for round in 1..=3 {
        let mut bytes = extended("COPY t FROM STDIN");
        bytes.extend(sync_msg());
        a.send(&bytes).await.unwrap();
        let head = read_n(&mut a, 4, STEP).await;
        let tags: Vec<u8> = head.iter().map(|m| m.tag).collect();
        assert_eq!(tags, b"12nG", "{head:?}");
        let mut bytes = frame(b'd', b"4\n");
        bytes.extend(frame(b'c', b""));
        bytes.extend(sync_msg());
        a.send(&bytes).await.unwrap();
        let r = a.until_ready(STEP).await;
        assert!(first_error(&r).is_none(), "{r:?}");
        assert_eq!(status(&r), b'I');
        assert_eq!(one(&b, "SELECT count(*) FROM t").await, round.to_string());
        assert_eq!(col(&a.simple("SELECT 9", STEP).await), ["9"]);
    }
    // Bad data: the error comes before the client's CopyDone and Sync (the server
    // then skips to that Sync), and the one ReadyForQuery after them.
    let mut bytes = extended("COPY t FROM STDIN");
    bytes.extend(sync_msg());
    a.send(&bytes).await.unwrap();
    assert_eq!(read_n(&mut a, 4, STEP).await[3].tag, b'G');
    a.send(&frame(b'd', b"x\n")).await.unwrap();
    let e = a.recv(STEP).await.expect("the COPY's error");
    assert_eq!(e.tag, b'E', "{e:?}");
    let mut bytes = frame(b'c', b"");
    bytes.extend(sync_msg());
    a.send(&bytes).await.unwrap();
    let r = a.until_ready(STEP).await;
    assert!(r.iter().all(|m| m.tag == b'Z'), "{r:?}");
    assert_eq!(one(&b, "SELECT count(*) FROM t").await, "3");
    assert_eq!(col(&a.simple("SELECT 10", STEP).await), ["10"]);
}

/// In session mode too the Sync PostgreSQL ignored is not counted as owed: with
/// `query_timeout` set, a client idle after its COPY is not taken for one whose query
/// runs too long.
#[tokio::test]
async fn an_idle_client_after_copy_in_is_not_in_a_query() {
    let db = fresh_db("sess_copy_ext");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db)
        .setting("pool_mode", "session")
        .setting("query_timeout", "1")
        .start();
    let a = client(&s, &db).await;
    let n = within(STEP, "copy_in", copy_in(&a, "1\n2\n"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 2);
    // Idle for longer than query_timeout (a bound wait, not a timing assertion).
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(one(&a, "SELECT count(*) FROM t").await, "2");
}

/// A query sent while the COPY finishes (tokio-postgres pipelines it right after
/// CopyDone and Sync, before the COPY's answer): both answered, and the server goes
/// back after them.
#[tokio::test]
async fn a_query_pipelined_behind_copydone() {
    let db = fresh_db("txn_copy_pipe");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = one_server(&db, "200");
    let a = client(&s, &db).await;
    let b = client(&s, &db).await;
    let stmt = a.prepare("COPY t FROM STDIN").await.expect("prepare");
    for round in 1..=3u64 {
        let sink = within(STEP, "copy_in", a.copy_in(&stmt))
            .await
            .expect("copy_in");
        let mut sink = std::pin::pin!(sink);
        sink.send(Bytes::from_static(b"1\n2\n"))
            .await
            .expect("send");
        let (n, count) = within(STEP, "finish and count", async {
            tokio::join!(
                sink.as_mut().finish(),
                a.query_one("SELECT count(*) FROM t", &[])
            )
        })
        .await;
        assert_eq!(n.expect("finish"), 2);
        let count: i64 = count.expect("count").get(0);
        // The count ran after the COPY (the server answers in order).
        assert_eq!(count as u64, 2 * round);
        assert_eq!(
            one(&b, "SELECT count(*) FROM t").await,
            (2 * round).to_string()
        );
    }
}

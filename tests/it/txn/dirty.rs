//! A client that leaves in the middle of something never hands a dirty server to
//! the next client: not mid-transaction, not with unread results, not after
//! garbage.

use std::time::Duration;

use super::common::*;
use crate::support::probe::{within, Observer};
use crate::support::Sluice;

/// The next client of a pool of one sees a clean server: no transaction open, no
/// leftover rows, the abandoned row not committed.
async fn assert_clean_next(s: &Sluice, db: &str) {
    let mut next = raw(s, db, &[]).await;
    let r = next
        .simple(
            "SELECT txid_current_if_assigned() IS NULL; \
             SELECT count(*) FROM t; \
             SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() \
               AND locktype = 'transactionid'",
            STEP,
        )
        .await;
    assert!(first_error(&r).is_none(), "{r:?}");
    assert_eq!(col(&r), ["t", "0", "0"], "{r:?}");
    assert_eq!(status(&r), b'I');
    // Exactly one answer per query afterwards: nothing left over in the stream.
    for i in 0..3 {
        let r = next.simple(&format!("SELECT {i}"), STEP).await;
        assert_eq!(col(&r), [i.to_string()]);
    }
    let c = client(s, db).await;
    assert_eq!(one(&c, "SELECT count(*) FROM t").await, "0");
}

fn table(db: &str) {
    direct(db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
}

#[tokio::test]
async fn socket_closed_mid_transaction() {
    let db = fresh_db("txn_dirty_sock");
    table(&db);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let r = a.simple("BEGIN; INSERT INTO t VALUES (1)", STEP).await;
    assert_eq!(status(&r), b'T');
    drop(a);
    assert_clean_next(&s, &db).await;
}

#[tokio::test]
async fn terminate_mid_transaction() {
    let db = fresh_db("txn_dirty_term");
    table(&db);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let c = client(&s, &db).await;
    within(
        STEP,
        "BEGIN",
        c.batch_execute("BEGIN; INSERT INTO t VALUES (1)"),
    )
    .await
    .unwrap();
    // tokio-postgres sends Terminate when the client is dropped.
    drop(c);
    assert_clean_next(&s, &db).await;
}

#[tokio::test]
async fn extended_batch_without_sync_then_gone() {
    let db = fresh_db("txn_dirty_ext");
    table(&db);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    let mut bytes = extended("INSERT INTO t VALUES (1)");
    bytes.extend(flush_msg());
    a.send(&bytes).await.unwrap();
    read_n(&mut a, 4, STEP).await; // 1, 2, n (NoData), C
    drop(a);
    assert_clean_next(&s, &db).await;
}

#[tokio::test]
async fn vanishes_with_unread_results() {
    let db = fresh_db("txn_dirty_rows");
    table(&db);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    for _ in 0..3 {
        let mut a = raw(&s, &db, &[]).await;
        a.query("SELECT g, repeat('x', 500) FROM generate_series(1, 300000) g")
            .await
            .unwrap();
        drop(a);
        assert_clean_next(&s, &db).await;
    }
    // Also after reading a little of the result first.
    let mut a = raw(&s, &db, &[]).await;
    a.query("SELECT g, repeat('x', 500) FROM generate_series(1, 300000) g")
        .await
        .unwrap();
    read_n(&mut a, 100, STEP).await;
    drop(a);
    assert_clean_next(&s, &db).await;
}

/// Garbage after BEGIN (a message with a bogus length): the client gets an error
/// or is closed, and the server it held is not reused with the transaction open.
#[tokio::test]
async fn garbage_mid_transaction() {
    let db = fresh_db("txn_dirty_garbage");
    table(&db);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let garbage: [&[u8]; 3] = [
        // A Query whose length is less than 4.
        &[b'Q', 0, 0, 0, 2, 0xde, 0xad, 0xbe, 0xef],
        // A huge length (beyond max_packet_size's usual sizes) then noise.
        &[b'Q', 0x7f, 0xff, 0xff, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8],
        // An unknown tag with random-looking bytes.
        &[0xf3, 0, 0, 0, 9, 0x13, 0x37, 0x42, 0x99, 0xaa, 0xbb],
    ];
    for g in garbage {
        let mut a = raw(&s, &db, &[]).await;
        let r = a.simple("BEGIN; INSERT INTO t VALUES (1)", STEP).await;
        assert_eq!(status(&r), b'T');
        a.send(g).await.unwrap();
        // Either an error and a close, or (huge length) the pooler or server may wait
        // for the rest: then the client gives up and leaves.
        match a.try_recv(Duration::from_secs(3)).await {
            Ok(Some(m)) => {
                assert!(m.tag == b'E', "answer to garbage: {m:?}");
                eprintln!("garbage {g:?}: error {:?}", m.field(b'M'));
            }
            Ok(None) => eprintln!("garbage {g:?}: closed without a word"),
            Err(()) => eprintln!("garbage {g:?}: no answer in 3 s"),
        }
        drop(a);
        assert_clean_next(&s, &db).await;
    }
    let obs = Observer::new().await;
    assert!(backends(&obs, &db).await <= 1);
}

/// A client that leaves while waiting in line for a server gives up its place:
/// the others are served in order and nothing leaks from the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_leaves_while_waiting() {
    let db = fresh_db("txn_dirty_wait");
    table(&db);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut holder = raw(&s, &db, &[]).await;
    let r = holder.simple("BEGIN; INSERT INTO t VALUES (1)", STEP).await;
    assert_eq!(status(&r), b'T');
    let mut waiters = Vec::new();
    for i in 0..4 {
        let mut w = raw(&s, &db, &[]).await;
        w.query(&format!("SELECT {i}")).await.unwrap();
        waiters.push(w);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Two of them give up (one by closing, one after Terminate).
    let quitter = waiters.remove(1);
    drop(quitter);
    let mut terminator = waiters.remove(1);
    terminator
        .send(&crate::support::wire::frame(b'X', &[]))
        .await
        .unwrap();
    drop(terminator);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = holder.simple("COMMIT", STEP).await;
    assert_eq!(status(&r), b'I');
    let mut got = Vec::new();
    for w in &mut waiters {
        let r = w.until_ready(STEP).await;
        got.extend(col(&r));
        assert_eq!(status(&r), b'I');
    }
    assert_eq!(got, ["0", "3"]);
    for _ in 0..3 {
        let c = client(&s, &db).await;
        assert_eq!(one(&c, "SELECT count(*) FROM t").await, "1");
    }
    let obs = Observer::new().await;
    assert_eq!(backends(&obs, &db).await, 1);
}

/// A client that stops reading a large result fills the socket buffers, so Sluice's
/// writes to it block (and it waits for the socket to become writable again, which
/// it registers for only then: net/stream.rs). When the client reads again, every
/// row arrives in order, and the server is clean for the next client.
#[tokio::test]
async fn a_client_that_pauses_reading_a_large_result_gets_all_of_it() {
    let db = fresh_db("txn_slow_reader");
    table(&db);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = raw(&s, &db, &[]).await;
    // About 60 MB: far more than the socket buffers on both sides hold.
    a.query("SELECT g, repeat(md5(g::text), 16) FROM generate_series(1, 100000) g")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut next = 1u32;
    loop {
        let m = within(Duration::from_secs(60), "result", a.recv(STEP)).await;
        let m = m.expect("closed mid-result");
        match m.tag {
            b'T' => {}
            b'D' => {
                let cols = m.columns();
                assert_eq!(cols[0].as_deref(), Some(next.to_string().as_str()));
                assert_eq!(cols[1].as_ref().map(String::len), Some(512));
                next += 1;
            }
            b'C' => {}
            b'Z' => break,
            other => panic!("unexpected message {}: {m:?}", other as char),
        }
    }
    assert_eq!(next, 100_001, "rows received");
    assert_clean_next(&s, &db).await;
}

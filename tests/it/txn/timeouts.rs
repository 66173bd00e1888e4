//! Client timeouts in transaction mode (1 s values), and server checks on reuse.

use std::time::{Duration, Instant};

use super::common::*;
use crate::support::probe::{within, Observer};

#[tokio::test]
async fn query_timeout_ends_a_long_query() {
    let db = fresh_db("txn_qtimeout");
    let s = txn_sluice(&db).setting("query_timeout", "1").start();
    let c = client(&s, &db).await;
    let t = Instant::now();
    let e = within(STEP, "pg_sleep(5)", c.simple_query("SELECT pg_sleep(5)"))
        .await
        .expect_err("pg_sleep(5) finished despite query_timeout = 1");
    let took = t.elapsed();
    assert!(err_text(&e).contains("query_timeout"), "{}", err_text(&e));
    // PgBouncer's code for every error it ends a client with.
    assert_eq!(e.code().map(|c| c.code()), Some("08P01"), "{e:?}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    // Short queries are fine, and the pool serves the next client.
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT pg_sleep(0.2)::text").await, "");
    assert_eq!(one(&c, "SELECT 1").await, "1");
}

/// With `query_timeout` set, a waiting client's answer may be relayed by a delegate
/// (pool/delegate.rs) while its task sleeps with a timer at the request's deadline. A
/// query written at the hand-over that runs too long is still cut: the timer wakes
/// the task, which takes the server back from the delegate and ends the query (the
/// delegate alone would relay `pg_sleep(5)`'s answer, with no error).
#[tokio::test]
async fn query_timeout_cuts_a_query_whose_answer_a_delegate_awaits() {
    let db = fresh_db("txn_qtimeout_delegate");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("query_timeout", "1")
        .start();
    let holder = client(&s, &db).await;
    within(STEP, "begin", holder.batch_execute("BEGIN; SELECT 1"))
        .await
        .expect("begin");
    // Waits in line; written to the server when the holder commits.
    let mut b = raw(&s, &db, &[]).await;
    b.send(&crate::support::wire::query_msg("SELECT pg_sleep(5)"))
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(100)).await;
    within(STEP, "commit", holder.batch_execute("COMMIT"))
        .await
        .expect("commit");
    let msgs = b.until_closed(Duration::from_secs(10)).await;
    let text = crate::support::wire::first_error(&msgs).and_then(|e| e.field(b'M'));
    assert!(
        text.as_deref().is_some_and(|t| t.contains("query_timeout")),
        "{msgs:?}"
    );
    // The pool serves the next client.
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT 1").await, "1");
}

#[tokio::test]
async fn query_wait_timeout_when_the_pool_is_full() {
    let db = fresh_db("txn_qwait");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "1")
        .start();
    let mut holder = raw(&s, &db, &[]).await;
    let r = holder.simple("BEGIN; SELECT 1", STEP).await;
    assert_eq!(status(&r), b'T');
    let c = client(&s, &db).await;
    let t = Instant::now();
    let e = within(STEP, "waiting query", c.simple_query("SELECT 1"))
        .await
        .expect_err("served while the only server was held");
    let took = t.elapsed();
    assert!(
        err_text(&e).contains("query_wait_timeout"),
        "{}",
        err_text(&e)
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "took {took:?}"
    );
    // The holder is unaffected.
    let r = holder.simple("SELECT 2; COMMIT", STEP).await;
    assert_eq!(col(&r), ["2"]);
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT 3").await, "3");
}

#[tokio::test]
async fn client_idle_timeout_disconnects_an_idle_client() {
    let db = fresh_db("txn_cidle");
    let s = txn_sluice(&db).setting("client_idle_timeout", "1").start();
    let mut c = raw(&s, &db, &[]).await;
    assert_eq!(col(&c.simple("SELECT 1", STEP).await), ["1"]);
    let t = Instant::now();
    expect_fatal_close(&mut c, "client_idle_timeout", Duration::from_secs(10)).await;
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "took {took:?}"
    );
    // A client that keeps talking stays.
    let mut busy = raw(&s, &db, &[]).await;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(col(&busy.simple("SELECT 1", STEP).await), ["1"]);
    }
}

#[tokio::test]
async fn idle_transaction_timeout_disconnects_and_rolls_back() {
    let db = fresh_db("txn_idletx");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("idle_transaction_timeout", "1")
        .start();
    let mut c = raw(&s, &db, &[]).await;
    let r = c.simple("BEGIN; INSERT INTO t VALUES (1)", STEP).await;
    assert_eq!(status(&r), b'T');
    let t = Instant::now();
    expect_fatal_close(&mut c, "idle transaction timeout", Duration::from_secs(10)).await;
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
    // Idle outside a transaction is fine.
    let mut idle = raw(&s, &db, &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = idle.simple("SELECT count(*) FROM t", STEP).await;
    assert_eq!(col(&r), ["0"], "the abandoned INSERT is visible");
    assert_eq!(status(&r), b'I');
}

#[tokio::test]
async fn transaction_timeout_ends_a_busy_transaction() {
    let db = fresh_db("txn_txtimeout");
    let s = txn_sluice(&db).setting("transaction_timeout", "1").start();
    let mut c = raw(&s, &db, &[]).await;
    let t = Instant::now();
    let r = c.simple("BEGIN", STEP).await;
    assert_eq!(status(&r), b'T');
    // Busy, never idle for long: only the transaction's age can end it.
    c.query("SELECT pg_sleep(0.4)").await.unwrap();
    let mut closed_msgs = Vec::new();
    for _ in 0..10 {
        match c.try_recv(Duration::from_secs(5)).await {
            Ok(Some(m)) if m.tag == b'Z' => {
                c.query("SELECT pg_sleep(0.4)").await.ok();
            }
            Ok(Some(m)) => closed_msgs.push(m),
            Ok(None) => break,
            Err(()) => panic!("no answer within 5 s"),
        }
    }
    let err = first_error(&closed_msgs).unwrap_or_else(|| panic!("{closed_msgs:?}"));
    let text = err.field(b'M').unwrap_or_default();
    assert!(text.contains("transaction timeout"), "{text}");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "took {took:?}"
    );
    // Short transactions pass.
    let mut c = raw(&s, &db, &[]).await;
    for _ in 0..3 {
        let r = c.simple("BEGIN; SELECT pg_sleep(0.3); COMMIT", STEP).await;
        assert!(first_error(&r).is_none(), "{r:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// With `server_check_delay = 0` every reuse runs the check query; a server killed
/// while idle in the pool is replaced without the client noticing.
#[tokio::test]
async fn server_check_replaces_a_server_killed_while_idle() {
    let db = fresh_db("txn_check");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("server_check_delay", "0")
        .setting("server_check_query", "select 1")
        .start();
    let obs = Observer::new().await;
    let c = client(&s, &db).await;
    let first = backend_pid(&c).await;
    for _ in 0..5 {
        assert_eq!(
            backend_pid(&c).await,
            first,
            "a healthy server was replaced"
        );
    }
    obs.terminate(first).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while obs.alive(first).await {
        assert!(Instant::now() < deadline, "backend {first} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = backend_pid(&c).await;
    assert_ne!(second, first);
    for i in 0..5 {
        assert_eq!(one(&c, &format!("SELECT {i}")).await, i.to_string());
    }
    let other = client(&s, &db).await;
    assert_eq!(backend_pid(&other).await, second);
    assert_eq!(backends(&obs, &db).await, 1);
}

/// With `server_check_delay = 0` the check runs before every reuse, as PgBouncer
/// documents it ("the check is always run"): a server a client releases while
/// another waits is checked before the waiting client's query reaches it.
#[tokio::test]
async fn server_check_delay_zero_checks_a_server_handed_to_a_waiter() {
    let db = fresh_db("txn_check_handed");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("server_check_delay", "0")
        .setting("server_check_query", "select nextval('checks')")
        .start();
    let mut holder = raw(&s, &db, &[]).await;
    // A new server: nothing to check yet.
    let r = holder.simple("CREATE SEQUENCE checks", STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    // Its first reuse (from the idle list) is checked.
    let r = holder
        .simple("BEGIN; SELECT last_value FROM checks", STEP)
        .await;
    assert_eq!(col(&r), ["1"]);
    assert_eq!(status(&r), b'T');
    let waiter = client(&s, &db).await;
    let waiting = tokio::spawn(async move {
        let q = waiter.simple_query("SELECT last_value FROM checks");
        within(STEP, "the waiting query", q).await.map(|m| {
            m.into_iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
                .unwrap_or_default()
        })
    });
    // The waiter is in line before the holder lets the server go.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = holder.simple("COMMIT", STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    let seen = waiting.await.expect("task").expect("the waiting query");
    assert_eq!(seen, "2", "the server went to the waiter unchecked");
}

/// The timers on the multi-threaded runtime (Sluice's default above 2 cores, which
/// the CI machines do not have): each worker thread keeps its own, and a client's
/// task may be woken on another worker than the one its timer was set on.
#[tokio::test]
async fn timeouts_fire_on_the_multi_threaded_runtime() {
    let db = fresh_db("txn_mt_timeouts");
    let s = txn_sluice(&db)
        .env("SLUICE_WORKERS", "3")
        .setting("query_timeout", "1")
        .setting("client_idle_timeout", "2")
        .start();
    let mut idle = raw(&s, &db, &[]).await;
    assert_eq!(col(&idle.simple("SELECT 1", STEP).await), ["1"]);
    let t = Instant::now();
    // Several at once, so that they land on different workers.
    let mut long = Vec::new();
    for _ in 0..4 {
        let c = client(&s, &db).await;
        long.push(tokio::spawn(async move {
            within(STEP, "pg_sleep(5)", c.simple_query("SELECT pg_sleep(5)"))
                .await
                .map(|_| ())
                .map_err(|e| err_text(&e))
        }));
    }
    for l in long {
        let e = l
            .await
            .expect("task")
            .expect_err("pg_sleep(5) outlived query_timeout = 1");
        assert!(e.contains("query_timeout"), "{e}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
    expect_fatal_close(&mut idle, "client_idle_timeout", Duration::from_secs(10)).await;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let c = client(&s, &db).await;
    assert_eq!(one(&c, "SELECT 2").await, "2");
}

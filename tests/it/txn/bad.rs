//! Servers failing under transaction pooling: a backend killed mid-transaction
//! while others wait, and a whole PostgreSQL restart (a private instance).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::common::*;
use crate::support::pg::PrivatePg;
use crate::support::probe::{within, Observer};
use crate::support::{self, MD5_PASSWORD, MD5_USER, TEST_DB};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_mid_transaction_while_others_wait() {
    let db = fresh_db("txn_killed");
    direct(&db, "CREATE TABLE t (v int); GRANT ALL ON t TO sluice_md5;");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let obs = Observer::new().await;
    let holder = client(&s, &db).await;
    within(
        STEP,
        "BEGIN",
        holder.batch_execute("BEGIN; INSERT INTO t VALUES (1)"),
    )
    .await
    .unwrap();
    let victim = backend_pid(&holder).await;

    let mut waiters = Vec::new();
    for i in 0..3 {
        let c = client(&s, &db).await;
        waiters.push(tokio::spawn(async move {
            let r = c
                .simple_query(&format!("SELECT {i}, count(*) FROM t"))
                .await
                .map_err(|e| err_text(&e))?;
            match &r[1] {
                tokio_postgres::SimpleQueryMessage::Row(row) => Ok((
                    row.get(0).unwrap().to_owned(),
                    row.get(1).unwrap().to_owned(),
                )),
                other => Err(format!("{other:?}")),
            }
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter got the held server"
    );

    obs.terminate(victim).await;
    // The holder learns that its server is gone.
    let e = within(STEP, "holder after kill", holder.simple_query("SELECT 1"))
        .await
        .expect_err("the holder's transaction survived its server");
    eprintln!("holder got: {}", err_text(&e));
    // The waiters are served, by a new server, and the killed INSERT is gone.
    for (i, w) in waiters.into_iter().enumerate() {
        let (n, count) = within(STEP, "waiter", w)
            .await
            .unwrap()
            .expect("waiter failed");
        assert_eq!((n, count), (i.to_string(), "0".to_owned()));
    }
    let c = client(&s, &db).await;
    let pid = backend_pid(&c).await;
    assert_ne!(pid, victim);
    let r = rows(
        &c,
        "BEGIN; INSERT INTO t VALUES (2); COMMIT; SELECT count(*) FROM t",
    )
    .await;
    assert_eq!(r, ["1"]);
}

/// One query through a fresh client connection, bounded; the error text if any.
async fn probe_once(s: &support::Sluice) -> Result<String, String> {
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let fut = async {
        let c = support::try_connect(&cfg).await.map_err(|e| err_text(&e))?;
        let r = c
            .simple_query("SELECT 'ok'")
            .await
            .map_err(|e| err_text(&e))?;
        match &r[1] {
            tokio_postgres::SimpleQueryMessage::Row(row) => Ok(row.get(0).unwrap().to_owned()),
            other => Err(format!("{other:?}")),
        }
    };
    match tokio::time::timeout(Duration::from_secs(15), fut).await {
        Ok(r) => r,
        Err(_) => panic!("a client hung for 15 s"),
    }
}

/// PostgreSQL restarts under Sluice: clients get errors (never hang) while it is
/// down, and new clients succeed soon after it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart() {
    let private = tokio::task::spawn_blocking(PrivatePg::start).await.unwrap();
    let private = Arc::new(private);
    let s = private_txn_sluice(&private)
        .setting("server_login_retry", "0.5")
        .setting("server_connect_timeout", "3")
        .setting("query_wait_timeout", "5")
        .start();

    // Warm: two idle servers and a connected client that stays across the restart.
    let kept = within(
        STEP,
        "connect",
        support::connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
    )
    .await;
    for _ in 0..3 {
        assert_eq!(probe_once(&s).await.as_deref(), Ok("ok"));
    }
    assert_eq!(one(&kept, "SELECT 1").await, "1");

    let p = private.clone();
    tokio::task::spawn_blocking(move || p.stop("fast"))
        .await
        .unwrap();
    // While it is down: errors, bounded.
    for _ in 0..3 {
        let r = probe_once(&s).await;
        assert!(r.is_err(), "a query succeeded with PostgreSQL down: {r:?}");
    }
    let r = within(
        STEP,
        "kept client while down",
        kept.simple_query("SELECT 1"),
    )
    .await;
    assert!(r.is_err(), "kept client: {r:?}");

    let p = private.clone();
    tokio::task::spawn_blocking(move || p.start_again())
        .await
        .unwrap();
    let back = Instant::now();
    let mut last = Err(String::new());
    while back.elapsed() < Duration::from_secs(20) {
        last = probe_once(&s).await;
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        last.as_deref(),
        Ok("ok"),
        "not serving 20 s after the restart"
    );
    eprintln!(
        "serving again {:?} after PostgreSQL came back",
        back.elapsed()
    );
    // From now on every new client succeeds (no stale server handed out).
    for i in 0..6 {
        assert_eq!(probe_once(&s).await.as_deref(), Ok("ok"), "client {i}");
    }
    // The client connected across the restart works again, or was closed cleanly.
    match tokio::time::timeout(STEP, kept.simple_query("SELECT 1")).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => assert!(kept.is_closed(), "kept client: {}", err_text(&e)),
        Err(_) => panic!("the kept client hung"),
    }

    // An immediate stop (crash) as well.
    let p = private.clone();
    tokio::task::spawn_blocking(move || p.restart("immediate"))
        .await
        .unwrap();
    let back = Instant::now();
    let mut last = Err(String::new());
    while back.elapsed() < Duration::from_secs(20) {
        last = probe_once(&s).await;
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        last.as_deref(),
        Ok("ok"),
        "not serving 20 s after a crash restart"
    );
    for i in 0..6 {
        assert_eq!(
            probe_once(&s).await.as_deref(),
            Ok("ok"),
            "client {i} after crash"
        );
    }
    drop(s);
    drop(kept);
    let private = Arc::try_unwrap(private).expect("sole owner");
    tokio::task::spawn_blocking(move || drop(private))
        .await
        .unwrap();
}

//! Pool size limits under concurrency: never more servers than `default_pool_size`
//! (sampled from `pg_stat_activity`), waiting clients served first come first
//! served, `query_wait_timeout` for those who wait too long.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{backend_pid, client, T};
use crate::support::probe::{marked_sluice, unique_marker, within, Observer};
use crate::support::wire::{first_column, RawClient, TAG_NOTICE};
use crate::support::{self, pg, MD5_PASSWORD, MD5_USER, TEST_DB};

/// Samples the backend count of `marker` every few ms until `stop`; returns the
/// maximum seen (and the number of samples).
fn spawn_sampler(marker: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(i64, u32)> {
    tokio::spawn(async move {
        let obs = Observer::new().await;
        let (mut max, mut samples) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            max = max.max(obs.count(&marker).await);
            samples += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (max, samples)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_clients_are_served_in_order_within_pool_size() {
    let marker = unique_marker("pool_fifo");
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "2")
        .start();
    let obs = Observer::new().await;
    // Warm up: the pool learns the server's parameters, so logins need no server.
    let warm = client(&s).await;
    backend_pid(&warm).await;
    drop(warm);
    obs.wait_pooled(&marker, 1).await;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(marker.clone(), stop.clone());
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let t0 = Instant::now();
    let hold = Duration::from_millis(800);
    let mut tasks = Vec::new();
    for i in 0..5u64 {
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            // Staggered arrivals: client i asks for a server at about i * 150 ms.
            tokio::time::sleep(Duration::from_millis(150 * i)).await;
            let c = support::connect(&cfg).await;
            let asked = t0.elapsed();
            let pid: i32 = c
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .expect("query")
                .get(0);
            let served = t0.elapsed();
            tokio::time::sleep(hold).await;
            drop(c);
            (i, asked, served, pid)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(within(T, "client task", t).await.expect("client task"));
    }
    stop.store(true, Ordering::Relaxed);
    let (max, samples) = within(T, "sampler", sampler).await.unwrap();
    assert!(max <= 2, "{max} servers seen with default_pool_size = 2");
    assert!(samples > 10, "only {samples} samples");

    let pids: std::collections::HashSet<i32> = results.iter().map(|r| r.3).collect();
    assert!(
        pids.len() <= 2,
        "{} distinct servers: {results:?}",
        pids.len()
    );
    // Clients 0 and 1 are served at once; 2, 3, 4 wait for a server and are
    // served in arrival order, each after somebody left.
    for r in &results[..2] {
        assert!(r.2 - r.1 < Duration::from_millis(500), "{results:?}");
    }
    for r in &results[2..] {
        assert!(
            r.2 - r.1 > Duration::from_millis(150),
            "no wait: {results:?}"
        );
    }
    for w in results[2..].windows(2) {
        assert!(w[0].2 <= w[1].2, "served out of arrival order: {results:?}");
    }
}

/// A client queued past `query_wait_notify` is told so, once a wait, with PgBouncer's
/// notice, and is served when a server frees up.
#[tokio::test]
async fn query_wait_notify_tells_a_queued_client() {
    for mode in ["session", "transaction"] {
        queued_client_is_told(mode).await;
    }
}

async fn queued_client_is_told(mode: &str) {
    let marker = unique_marker("pool_qwn");
    let s = marked_sluice(&marker)
        .setting("pool_mode", mode)
        .setting("default_pool_size", "1")
        .setting("query_wait_notify", "1")
        .start();
    let holder = client(&s).await;
    // Holds the one server: for the session, or in an open transaction.
    holder.batch_execute("BEGIN").await.expect("begin");
    backend_pid(&holder).await;

    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("login");
    raw.query("SELECT 7").await.expect("send");
    let queued = Instant::now();
    let notice = raw.recv(T).await.expect("a message while queued");
    let after = queued.elapsed();
    assert_eq!(notice.tag, TAG_NOTICE, "{mode}: {notice:?}");
    assert_eq!(
        notice.field(b'M').as_deref(),
        Some("No server connection available in postgres backend, client being queued")
    );
    assert_eq!(notice.field(b'S').as_deref(), Some("NOTICE"));
    assert_eq!(notice.field(b'C').as_deref(), Some("00000"));
    assert!(
        after >= Duration::from_millis(900),
        "{mode}: told after {after:?}"
    );
    // Once a wait: nothing more while it still waits.
    assert!(
        raw.try_recv(Duration::from_secs(2)).await.is_err(),
        "a second message while queued"
    );
    drop(holder);
    let msgs = raw.until_ready(T).await;
    assert_eq!(first_column(&msgs), vec![Some("7".to_string())], "{msgs:?}");
    assert!(msgs.iter().all(|m| m.tag != TAG_NOTICE), "{msgs:?}");
}

/// `query_wait_timeout` in a `[databases]` entry (PgBouncer's next release) wins over
/// the global one for that database's pools.
#[tokio::test]
async fn a_database_query_wait_timeout_overrides_the_global_one() {
    let s = support::SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("default_pool_size", "1")
        .database(
            TEST_DB,
            &format!("host=127.0.0.1 port=@PG_PORT@ dbname={TEST_DB} query_wait_timeout=1"),
        )
        .start();
    let holder = client(&s).await;
    backend_pid(&holder).await;
    let waited = wait_times_out(&s).await;
    assert!(waited < Duration::from_secs(10), "failed after {waited:?}");
}

/// `query_wait_timeout` in a `[users]` entry (PgBouncer's next release) wins over the
/// database's and the global one.
#[tokio::test]
async fn a_user_query_wait_timeout_overrides_the_database_one() {
    let s = support::SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("default_pool_size", "1")
        .database(
            TEST_DB,
            &format!("host=127.0.0.1 port=@PG_PORT@ dbname={TEST_DB} query_wait_timeout=100"),
        )
        .user(MD5_USER, "query_wait_timeout=1")
        .start();
    let holder = client(&s).await;
    backend_pid(&holder).await;
    let waited = wait_times_out(&s).await;
    assert!(waited < Duration::from_secs(10), "failed after {waited:?}");
}

/// A client that waits for the one server (held elsewhere) until its wait fails with
/// `query_wait_timeout`; how long it waited.
async fn wait_times_out(s: &support::Sluice) -> Duration {
    let waiter = client(s).await;
    let started = Instant::now();
    let e = within(T, "waiting query", waiter.query_one("SELECT 1", &[]))
        .await
        .expect_err("got a server although the pool was full");
    let waited = started.elapsed();
    let text = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_else(|| e.to_string());
    assert!(text.contains("query_wait_timeout"), "error: {text} ({e:?})");
    assert_eq!(e.code().map(|c| c.code()), Some("08P01"), "{e:?}");
    waited
}

#[tokio::test]
async fn query_wait_timeout_fails_a_waiting_client() {
    let marker = unique_marker("pool_qwt");
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "1")
        .start();
    let holder = client(&s).await;
    backend_pid(&holder).await;

    let waited = wait_times_out(&s).await;
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "failed after {waited:?}"
    );
    // The holder is unaffected, and once it leaves others get the server.
    backend_pid(&holder).await;
    drop(holder);
    let next = client(&s).await;
    within(T, "after holder left", next.batch_execute("SELECT 1"))
        .await
        .expect("query after the holder left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_clients_share_three_servers() {
    let marker = unique_marker("pool_fifty");
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "3")
        .setting("max_client_conn", "200")
        .start();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(marker.clone(), stop.clone());
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let done = Arc::new(AtomicI64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..50i32 {
        let cfg = cfg.clone();
        let done = done.clone();
        set.spawn(async move {
            let c = support::connect(&cfg).await;
            let mut pids = Vec::new();
            for j in 0..10i32 {
                let row = c
                    .query_one(
                        "SELECT $1::int4 * 100 + $2::int4, pg_backend_pid()",
                        &[&i, &j],
                    )
                    .await
                    .unwrap_or_else(|e| panic!("client {i} query {j}: {e}"));
                assert_eq!(row.get::<_, i32>(0), i * 100 + j);
                pids.push(row.get::<_, i32>(1));
            }
            done.fetch_add(1, Ordering::Relaxed);
            pids
        });
    }
    let mut all_pids = std::collections::HashSet::new();
    let limit = Duration::from_secs(90);
    while let Some(r) = within(limit, "50 clients", set.join_next()).await {
        let pids = r.expect("client task");
        assert!(
            pids.windows(2).all(|w| w[0] == w[1]),
            "a session changed servers: {pids:?}"
        );
        all_pids.extend(pids);
    }
    stop.store(true, Ordering::Relaxed);
    let (max, samples) = within(T, "sampler", sampler).await.unwrap();
    assert_eq!(done.load(Ordering::Relaxed), 50);
    assert!(max <= 3, "{max} servers seen with default_pool_size = 3");
    assert!(samples > 5, "only {samples} samples");
    assert!(
        all_pids.len() <= 3,
        "{} distinct backends served 50 clean sessions",
        all_pids.len()
    );
}

#[tokio::test]
async fn a_client_that_leaves_the_queue_never_runs_its_query() {
    let marker = unique_marker("pool_leave_queue");
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "30")
        .start();
    let table = unique_marker("pool_leave_queue_t");
    let holder = client(&s).await;
    within(
        T,
        "setup",
        holder.batch_execute(&format!("CREATE TABLE {table}(v int)")),
    )
    .await
    .unwrap();

    // A client queues for the busy server with an INSERT, then gives up.
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    raw.query(&format!("INSERT INTO {table} VALUES (1)"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(raw);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A live client queues behind it.
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let waiter = tokio::spawn(async move {
        let c = support::connect(&cfg).await;
        let started = Instant::now();
        c.batch_execute("SELECT 1").await.map(|_| started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(holder);
    within(T, "live waiter", waiter)
        .await
        .unwrap()
        .expect("live waiter's query");

    // The abandoned INSERT must not have run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let direct = support::connect(&pg().socket_config("postgres", TEST_DB)).await;
    let n: i64 = within(
        T,
        "count",
        direct.query_one(&format!("SELECT count(*) FROM {table}"), &[]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        n, 0,
        "the query of a client that had left the queue was executed"
    );
}

#[tokio::test]
async fn a_waiter_gets_a_new_server_when_the_busy_one_dies() {
    let marker = unique_marker("pool_waiter_kill");
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "20")
        .start();
    let obs = Observer::new().await;
    let holder = client(&s).await;
    let pid = backend_pid(&holder).await;

    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let waiter = tokio::spawn(async move {
        let c = support::connect(&cfg).await;
        let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
        Ok::<_, tokio_postgres::Error>((pid, Instant::now()))
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiter.is_finished(),
        "waiter was served while the pool was full"
    );
    obs.terminate(pid).await;
    let killed = Instant::now();
    let (new_pid, served) = within(T, "waiter", waiter)
        .await
        .unwrap()
        .expect("waiter's query after the busy server died");
    assert_ne!(new_pid, pid);
    assert!(
        served.duration_since(killed) < Duration::from_secs(3),
        "waiter served {:?} after the busy server died",
        served.duration_since(killed)
    );
    within(T, "holder", holder.query_one("SELECT 1", &[]))
        .await
        .expect_err("query on a terminated server succeeded");
}

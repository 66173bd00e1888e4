//! Session pooling end to end: server reuse (LIFO) with a reset between clients,
//! server lifetime and idle timeout, recovery from a killed server, pgbench. Pool
//! limits under load live in `pooling/limits.rs`.
//!
//! Each Sluice's server connections carry a unique `application_name` (see
//! [`marked_sluice`]) so that a test counts only its own backends; the clients here
//! therefore never set `application_name` themselves.

mod frozen;
mod hosts;
mod leaks;
mod limits;

use std::time::{Duration, Instant};

use crate::support::probe::{marked_sluice, unique_marker, within, Observer};
use crate::support::{self, pg, Sluice, MD5_PASSWORD, MD5_USER, TEST_DB};

const T: Duration = Duration::from_secs(30);

async fn client(s: &Sluice) -> tokio_postgres::Client {
    within(
        T,
        "connect",
        support::connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
    )
    .await
}

async fn backend_pid(c: &tokio_postgres::Client) -> i32 {
    within(
        T,
        "pg_backend_pid",
        c.query_one("SELECT pg_backend_pid()", &[]),
    )
    .await
    .expect("SELECT pg_backend_pid()")
    .get(0)
}

#[tokio::test]
async fn sequential_sessions_reuse_the_server_after_a_reset() {
    let marker = unique_marker("pool_reuse");
    let s = marked_sluice(&marker).start();
    let obs = Observer::new().await;

    let first = client(&s).await;
    let pid = backend_pid(&first).await;
    within(
        T,
        "dirty the session",
        first.batch_execute(
            "CREATE TEMP TABLE pool_tmp(v int); SET work_mem = '77MB'; \
             PREPARE pool_stmt AS SELECT 1; LISTEN pool_chan; \
             SELECT set_config('pool.custom', 'dirty', false)",
        ),
    )
    .await
    .unwrap();
    drop(first);
    obs.wait_pooled(&marker, 1).await;

    let second = client(&s).await;
    assert_eq!(backend_pid(&second).await, pid, "server not reused");
    let e = within(
        T,
        "temp table",
        second.simple_query("SELECT * FROM pool_tmp"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42P01"), "{e}");
    let row = within(
        T,
        "settings",
        second.query_one(
            "SELECT current_setting('work_mem'), \
                    coalesce(current_setting('pool.custom', true), ''), \
                    (SELECT count(*) FROM pg_prepared_statements WHERE from_sql), \
                    (SELECT count(*) FROM pg_listening_channels())",
            &[],
        ),
    )
    .await
    .unwrap();
    assert_ne!(row.get::<_, String>(0), "77MB", "SET survived the reset");
    assert_eq!(row.get::<_, String>(1), "", "set_config survived the reset");
    assert_eq!(row.get::<_, i64>(2), 0, "prepared statement survived");
    assert_eq!(row.get::<_, i64>(3), 0, "LISTEN survived");
    let e = within(T, "execute", second.simple_query("EXECUTE pool_stmt"))
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("26000"), "{e}");
}

#[tokio::test]
async fn idle_servers_are_reused_last_in_first_out() {
    let marker = unique_marker("pool_lifo");
    let s = marked_sluice(&marker).start();
    let obs = Observer::new().await;

    let a = client(&s).await;
    let b = client(&s).await;
    let (pa, pb) = (backend_pid(&a).await, backend_pid(&b).await);
    assert_ne!(pa, pb);
    drop(a);
    obs.wait_pooled(&marker, 1).await;
    drop(b);
    obs.wait_pooled(&marker, 2).await;
    // b's server went back last, so it is lent first.
    for _ in 0..3 {
        let c = client(&s).await;
        assert_eq!(backend_pid(&c).await, pb, "not LIFO (a={pa}, b={pb})");
        drop(c);
        obs.wait_pooled(&marker, 2).await;
    }
    assert_eq!(obs.count(&marker).await, 2);
}

#[tokio::test]
async fn server_lifetime_retires_old_servers() {
    let marker = unique_marker("pool_lifetime");
    let s = marked_sluice(&marker)
        .setting("server_lifetime", "1")
        .start();
    let obs = Observer::new().await;
    let c = client(&s).await;
    let first = backend_pid(&c).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c = client(&s).await;
    let second = backend_pid(&c).await;
    assert_ne!(
        first, second,
        "a server older than server_lifetime was reused"
    );
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while obs.alive(first).await {
        assert!(
            Instant::now() < deadline,
            "expired server {first} still open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Servers opened together do not all close together when their lifetime ends: as
/// in PgBouncer, one goes per `server_lifetime / pool_size`, so that they are not all
/// opened again at once.
#[tokio::test]
async fn server_lifetimes_end_one_at_a_time() {
    let marker = unique_marker("pool_lifetime_gap");
    let s = marked_sluice(&marker)
        .setting("server_lifetime", "2")
        .setting("default_pool_size", "2")
        .start();
    let obs = Observer::new().await;
    let (a, b) = (client(&s).await, client(&s).await);
    backend_pid(&a).await;
    backend_pid(&b).await;
    drop((a, b));
    let n = obs
        .wait_count(&marker, Duration::from_secs(10), |n| n == 0)
        .await;
    assert_eq!(n, 0);
    // Milliseconds of the day of each close, from the log's timestamps.
    let at: Vec<u64> = s
        .log()
        .lines()
        .filter(|l| l.contains("closing because: server lifetime over"))
        .filter_map(|l| {
            let t = l.split(' ').nth(1)?;
            let mut p = t.split([':', '.']).map(|x| x.parse::<u64>().ok());
            let (h, m, s, ms) = (p.next()??, p.next()??, p.next()??, p.next()??);
            Some(((h * 60 + m) * 60 + s) * 1000 + ms)
        })
        .collect();
    assert_eq!(at.len(), 2, "{}", s.diagnostics());
    assert!(at[1] >= at[0] + 900, "closed {} ms apart", at[1] - at[0]);
}

#[tokio::test]
async fn server_idle_timeout_closes_idle_servers() {
    let marker = unique_marker("pool_idle");
    let s = marked_sluice(&marker)
        .setting("server_idle_timeout", "1")
        .start();
    let obs = Observer::new().await;
    let a = client(&s).await;
    let b = client(&s).await;
    backend_pid(&a).await;
    backend_pid(&b).await;
    assert_eq!(obs.count(&marker).await, 2);
    drop(a);
    drop(b);
    // Idle for 1 s, then closed by the janitor: gone within a few seconds.
    let n = obs
        .wait_count(&marker, Duration::from_secs(6), |n| n == 0)
        .await;
    assert_eq!(n, 0);
    // A new client still gets a server.
    let c = client(&s).await;
    backend_pid(&c).await;
}

#[tokio::test]
async fn killed_server_fails_its_client_and_the_pool_recovers() {
    let marker = unique_marker("pool_killed");
    // One server and a short wait: a leaked slot would make the next client fail.
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "5")
        .start();
    let obs = Observer::new().await;
    let victim = client(&s).await;
    let pid = backend_pid(&victim).await;
    obs.terminate(pid).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while obs.alive(pid).await {
        assert!(
            Instant::now() < deadline,
            "backend {pid} survived termination"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = within(
        T,
        "query on killed server",
        victim.query_one("SELECT 1", &[]),
    )
    .await
    .expect_err("a query on a terminated server succeeded");
    eprintln!("victim's error: {e}");
    drop(victim);

    let started = Instant::now();
    let c = client(&s).await;
    let new_pid = backend_pid(&c).await;
    assert_ne!(new_pid, pid);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "recovery took {:?}",
        started.elapsed()
    );
    drop(c);
    obs.wait_pooled(&marker, 1).await;

    // Killed while pooled (idle in Sluice): the next client must not get it.
    obs.terminate(new_pid).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = client(&s).await;
    let row = within(
        T,
        "query after pooled server died",
        c.query_one("SELECT pg_backend_pid()", &[]),
    )
    .await
    .expect("a client got a pooled server that had been terminated");
    assert_ne!(row.get::<_, i32>(0), new_pid);
}

/// A database of our own with pgbench tables, so that parallel tests that
/// initialise pgbench elsewhere cannot interfere.
fn pgbench_database() -> String {
    let db = unique_marker("sluice_pgbench");
    pg().psql(&format!("CREATE DATABASE {db} OWNER {MD5_USER}"));
    let init = support::pgbench(
        "127.0.0.1",
        pg().port(),
        MD5_USER,
        &db,
        Some(MD5_PASSWORD),
        &["-i", "-s", "1", "-q"],
        Duration::from_secs(120),
    );
    assert!(
        init.success(),
        "pgbench -i:\n{}\n{}",
        init.stdout,
        init.stderr
    );
    db
}

fn assert_no_failures(run: &support::PgbenchRun, s: &Sluice) {
    assert!(
        run.success(),
        "pgbench failed:\n{}\n{}\n{}",
        run.stdout,
        run.stderr,
        s.diagnostics()
    );
    let failed = run
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("number of failed transactions: "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(matches!(failed, None | Some(0)), "{}", run.stdout);
    assert!(run.tps.is_some_and(|t| t > 0.0), "{}", run.stdout);
    let processed = run
        .stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("number of transactions actually processed: ")
        })
        .and_then(|v| v.split('/').next())
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(processed.is_some_and(|n| n > 0), "{}", run.stdout);
}

#[test]
fn pgbench_through_sluice() {
    let db = pgbench_database();
    let s = crate::support::SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(&db, &format!("host=127.0.0.1 port=@PG_PORT@ dbname={db}"))
        .setting("default_pool_size", "4")
        .start();
    let bench = |args: &[&str]| {
        support::pgbench(
            "127.0.0.1",
            s.port(),
            MD5_USER,
            &db,
            Some(MD5_PASSWORD),
            args,
            Duration::from_secs(60),
        )
    };
    // Select-only, 4 clients, one connection each for the whole run.
    let run = bench(&["-n", "-S", "-c", "4", "-j", "2", "-T", "3"]);
    assert_no_failures(&run, &s);
    // The built-in read-write script: transactions, updates.
    let run = bench(&["-n", "-c", "4", "-j", "2", "-T", "3"]);
    assert_no_failures(&run, &s);
    // A new connection per transaction.
    let run = bench(&["-n", "-S", "-C", "-c", "4", "-j", "2", "-T", "3"]);
    assert_no_failures(&run, &s);
    // More clients than servers, connecting per transaction: they queue.
    let run = bench(&["-n", "-S", "-C", "-c", "10", "-j", "2", "-T", "3"]);
    assert_no_failures(&run, &s);
}

//! pgbench through Sluice in transaction mode: 600 clients over a pool of 4.
//!
//! The runs share one pgbench database (initialized once, directly on PostgreSQL)
//! and take turns, so that the server count of each run is its own.

use std::sync::OnceLock;
use std::time::Duration;

use super::common::*;
use crate::support::probe::within;
use crate::support::{pg, pgbench, MD5_PASSWORD, MD5_USER};

const BENCH_DB: &str = "txn_bench";
const CLIENTS: &str = "600";
const POOL: i64 = 4;

/// Creates and initializes (`pgbench -i -s 1`) the bench database once.
fn bench_db() -> &'static str {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        pg().psql(&format!("CREATE DATABASE {BENCH_DB} OWNER {MD5_USER}"));
        let run = pgbench(
            "127.0.0.1",
            pg().port(),
            MD5_USER,
            BENCH_DB,
            Some(MD5_PASSWORD),
            &["-i", "-s", "1", "-q"],
            Duration::from_secs(120),
        );
        assert!(run.success(), "pgbench -i: {}\n{}", run.stdout, run.stderr);
    });
    BENCH_DB
}

/// One run at a time: they share the bench database, and each is heavy.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs pgbench with `args` (plus `-c 600 -j 4 -T 3`) through a fresh Sluice with
/// a pool of 4, sampling the server connections all along.
async fn bench(args: &[&str]) {
    bench_with(CLIENTS, "4", args).await
}

/// [`bench`] with `-c clients -j threads`.
async fn bench_with(clients: &str, threads: &str, args: &[&str]) {
    let _turn = within(Duration::from_secs(300), "pgbench turn", TURN.lock()).await;
    let db = tokio::task::spawn_blocking(bench_db).await.unwrap();
    let s = txn_sluice(db)
        .setting("default_pool_size", &POOL.to_string())
        .setting("max_client_conn", "1000")
        .setting("query_wait_timeout", "60")
        .start();
    let backends_sampler = Sampler::start(db, Duration::from_millis(25)).await;
    let port = s.port();
    let mut all: Vec<String> = ["-n", "-c", clients, "-j", threads, "-T", "3"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    all.extend(args.iter().map(|a| a.to_string()));
    let run = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        pgbench(
            "127.0.0.1",
            port,
            MD5_USER,
            BENCH_DB,
            Some(MD5_PASSWORD),
            &refs,
            Duration::from_secs(180),
        )
    })
    .await
    .unwrap();
    let (max_backends, samples) = backends_sampler.finish().await;
    let report = format!("{args:?}\n{}\n{}", run.stdout, run.stderr);
    assert!(
        run.success(),
        "pgbench failed: {report}\n{}",
        s.diagnostics()
    );
    assert!(
        run.stdout
            .contains(&format!("number of clients: {clients}")),
        "{report}"
    );
    if let Some(line) = run
        .stdout
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
    {
        assert!(line.contains(": 0 "), "{line}\n{report}");
    }
    let processed = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|v| {
            v.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    assert!(processed > 0, "{report}");
    assert!(run.tps.is_some_and(|t| t > 0.0), "{report}");
    assert!(samples >= 10, "only {samples} samples");
    assert!(
        (1..=POOL).contains(&max_backends),
        "{max_backends} backends for a pool of {POOL}"
    );
    eprintln!(
        "pgbench {args:?}: {processed} transactions, tps {:?}, at most {max_backends} backends",
        run.tps
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbench_select_only_simple() {
    bench(&["-S", "-M", "simple"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbench_select_only_extended() {
    bench(&["-S", "-M", "extended"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbench_tpcb_simple() {
    bench(&["-M", "simple"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbench_tpcb_extended() {
    bench(&["-M", "extended"]).await;
}

/// `-M prepared` with a thread per client: pgbench prepares a client's statements
/// with the blocking PQprepare, so a thread serving several clients deadlocks
/// under any transaction pooler once one of its clients holds a server in a
/// transaction and another waits in PQprepare for one (PgBouncer too).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbench_tpcb_prepared() {
    bench_with("64", "64", &["-M", "prepared"]).await;
}

//! Memory given back: after a burst of busy clients, the pooler returns the free
//! pages of its heap to the system (lifecycle/trim.rs), so its resident size does
//! not stay at the burst's peak.

use std::sync::Arc;
use std::time::Duration;

use crate::admin::{builder, pooled, psql_ok, select1};
use crate::support::probe::within;
use crate::support::{wait_until, Sluice, TEST_DB};

const T: Duration = Duration::from_secs(30);
const MB: u64 = 1 << 20;
/// Clients that wait in line at once.
const WAITING: usize = 300;
/// Their request's size: read 16 KB at a time into a buffer that grows to 32 KB.
const REQUEST: usize = 20_000;
/// What the trim must give back, at least: the burst holds ~9 MB (300 buffers of
/// 32 KB), of which the threads' buffer pools keep at most 2 MB each.
const GIVEN_BACK: u64 = 3 * MB;

/// The worker threads for the burst's pooler: as this pass asks (`SLUICE_WORKERS`)
/// or as Sluice picks by cores, but at most 2. Each thread keeps up to ~2 MB of
/// buffers for its next requests, and the burst (~9 MB) is sized for two: with 4
/// threads (Sluice's default on 4 cores or more) the trim gave back 2.8 MB, under
/// [`GIVEN_BACK`], though it did its work.
fn burst_workers() -> String {
    let asked = std::env::var("SLUICE_WORKERS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = asked.unwrap_or(if cores <= 2 { 0 } else { cores });
    n.min(2).to_string()
}

/// The pooler's resident size in bytes, from /proc.
fn resident(s: &Sluice) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{}/statm", s.pid())).expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).expect("a page size")
}

fn waiting(s: &Sluice) -> usize {
    psql_ok(s, "SHOW POOLS")
        .cell("database", TEST_DB, "cl_waiting")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The trims the log reports, as (resident before, after) in kB.
fn trims(s: &Sluice) -> Vec<(u64, u64)> {
    s.log()
        .lines()
        .filter_map(|l| l.split_once("free heap memory given back: resident "))
        .filter_map(|(_, rest)| {
            let (before, after) = rest.split_once(" kB -> ")?;
            Some((
                before.parse().ok()?,
                after.strip_suffix(" kB")?.parse().ok()?,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heap_shrinks_after_a_burst_of_busy_clients() {
    let s = builder()
        .arg("-v")
        .env("SLUICE_WORKERS", &burst_workers())
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .setting("max_client_conn", "1000")
        .start();
    // One client holds the pool's only server in a transaction...
    let holder = pooled(&s, Some("holder")).await;
    within(T, "BEGIN", holder.simple_query("BEGIN"))
        .await
        .expect("BEGIN");
    let mut clients = Vec::with_capacity(WAITING);
    for _ in 0..WAITING {
        clients.push(pooled(&s, None).await);
    }
    // ...while the others each send a request and wait in line with it.
    let sql: Arc<str> = format!("SELECT 1 /* {} */", "x".repeat(REQUEST)).into();
    let queries: Vec<_> = clients
        .into_iter()
        .map(|c| {
            let sql = sql.clone();
            tokio::spawn(async move {
                within(T, "a long SELECT 1", c.simple_query(&sql))
                    .await
                    .expect("a long SELECT 1");
                c
            })
        })
        .collect();
    assert!(
        wait_until(T, || waiting(&s) == WAITING),
        "the clients did not all wait in line\n{}",
        s.diagnostics()
    );
    let peak = resident(&s);
    let trims_before = trims(&s).len();
    within(T, "COMMIT", holder.simple_query("COMMIT"))
        .await
        .expect("COMMIT");
    for q in queries {
        drop(
            within(T, "a waiting client's answer", q)
                .await
                .expect("task"),
        );
    }
    // The janitor looks every 5 s: the burst's free memory goes back.
    assert!(
        wait_until(Duration::from_secs(20), || trims(&s).len() > trims_before),
        "no trim after the burst (peak {peak} bytes, now {})\n{}",
        resident(&s),
        s.diagnostics()
    );
    let (before, after) = trims(&s)[trims_before];
    assert!(
        (after + (GIVEN_BACK >> 10)) <= before,
        "the trim gave back too little: {before} kB -> {after} kB"
    );
    let now = resident(&s);
    assert!(
        now + GIVEN_BACK <= peak,
        "resident size {now} bytes, {peak} at the burst's peak"
    );
    select1(&holder).await;
}

/// Each SHOW MEM cache's live count (`used`), by name.
fn mem_used(s: &Sluice) -> Vec<(String, u64)> {
    let out = psql_ok(s, "SHOW MEM");
    out.column("name")
        .into_iter()
        .zip(out.column("used"))
        .map(|(n, u)| (n, u.parse().unwrap_or(u64::MAX)))
        .collect()
}

/// Churn: thousands of connections come and go (pgbench `-C`: each connects, runs
/// one transaction and leaves), twice. Nothing is left behind: after each pass the
/// open files and SHOW MEM's live counts are back where they were, and the second
/// pass (10,000 connections) leaves the resident size within a megabyte of where the
/// first left it: a leak of 100 bytes per connection would show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_come_and_go_leave_nothing_behind() {
    let s = Arc::new(
        builder()
            .setting("pool_mode", "transaction")
            .setting("default_pool_size", "2")
            .start(),
    );
    // One pass first: the pool's servers, the threads' buffers and caches settle.
    let pass = |s: Arc<Sluice>| async move {
        let args = ["-n", "-C", "-c", "4", "-j", "2", "-t", "2500"];
        let run = crate::support::pgbench_script(s.port(), TEST_DB, "SELECT 1;\n", &args).await;
        assert!(run.success(), "{}\n{}", run.stdout, run.stderr);
        // The last sessions' ends are logged after their sockets close.
        assert!(wait_until(Duration::from_secs(5), || psql_ok(
            &s,
            "SHOW CLIENTS"
        )
        .column("database")
        .iter()
        .all(|d| d != TEST_DB)));
    };
    within(T * 4, "a first pass", pass(s.clone())).await;
    let (files, used) = (s.open_files(), mem_used(&s));
    let after_first = resident(&s);
    within(T * 4, "a second pass", pass(s.clone())).await;
    assert_eq!(s.open_files(), files, "open files after a second pass");
    assert_eq!(
        mem_used(&s),
        used,
        "SHOW MEM's live counts after a second pass"
    );
    let grown = resident(&s).saturating_sub(after_first);
    assert!(
        grown < MB,
        "10,000 connections more grew the resident size by {} kB",
        grown / 1024
    );
}

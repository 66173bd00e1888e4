//! `pgbench -M prepared` (libpq named statements, prepared once per connection
//! and re-used in every transaction) through Sluice with a pool of 2.
//!
//! pgbench prepares synchronously (a blocking PQprepare) the first time a client
//! runs a command, while the other clients of the same thread wait: with explicit
//! multi-statement transactions and fewer threads than clients it can deadlock
//! against any transaction pooler (the blocked thread's other client holds the
//! server). Hence `-S` (one statement per transaction), or `-j` equal to `-c`.

use std::time::Duration;

use super::{driver_db, driver_sluice};
use crate::support::{pg, pgbench, Sluice, MD5_PASSWORD, MD5_USER};

/// Runs pgbench with `args` against `s` and checks that every transaction ran.
fn run(s: &Sluice, db: &str, args: &[&str], transactions: u64) {
    let run = pgbench(
        "127.0.0.1",
        s.port(),
        MD5_USER,
        db,
        Some(MD5_PASSWORD),
        args,
        Duration::from_secs(240),
    );
    let report = format!(
        "pgbench {args:?}\n{}\n{}\n{}",
        run.stdout,
        run.stderr,
        s.diagnostics()
    );
    assert!(run.success(), "pgbench failed: {report}");
    let processed = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .unwrap_or_else(|| panic!("no transaction count: {report}"));
    assert!(
        processed.starts_with(&format!("{transactions}/{transactions}")),
        "{processed}: {report}"
    );
    if let Some(line) = run
        .stdout
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
    {
        assert!(line.contains(": 0 "), "{line}\n{report}");
    }
    eprintln!(
        "pgbench {args:?}: {processed} transactions, tps {:?}",
        run.tps
    );
}

#[test]
fn pgbench_prepared() {
    let db = driver_db("drv_pgbench");
    let init = pgbench(
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
        "pgbench -i: {}\n{}",
        init.stdout,
        init.stderr
    );
    let s = driver_sluice(&db).start();
    // Select-only: 16 clients on 4 threads.
    run(
        &s,
        &db,
        &[
            "-n", "-M", "prepared", "-S", "-c", "16", "-j", "4", "-t", "100",
        ],
        1600,
    );
    // TPC-B-like (BEGIN; 3 UPDATEs, SELECT, INSERT; END): a thread per client.
    run(
        &s,
        &db,
        &["-n", "-M", "prepared", "-c", "8", "-j", "8", "-t", "50"],
        400,
    );
}

//! The driver matrix: real client drivers, each with its default statement caching
//! on, against Sluice in transaction pooling with more clients than server
//! connections (`default_pool_size = 2`, 12 clients), on the real PostgreSQL.
//!
//! The programs under `tests/drivers/<lang>/` (psycopg 3, asyncpg, pgx v5,
//! node-postgres, pgjdbc) and the tokio-postgres test here follow one scenario, in
//! a database of their own (tables `items` and `ddl_t`, see [`SCHEMA`]):
//!
//! 1. `DRIVER_WORKERS` workers, a connection each, run `DRIVER_ITERS` iterations:
//!    - `SELECT $1::int * 2, $2::text` with values unique to the worker and the
//!      iteration: one prepared statement re-used across transactions, and so across
//!      server connections;
//!    - an explicit transaction of several prepared statements (INSERT a row, read
//!      it back, count the worker's rows, UPDATE it; pipelined or batched on some
//!      workers where the driver can);
//!    - every 7th: `SELECT 100 / $1::int` with 0 (division_by_zero expected), then
//!      with 4; every 14th also inside a transaction, rolled back;
//!    - every 10th: the client runs `DEALLOCATE ALL` or `DISCARD ALL`, checks (where
//!      the driver allows) that a statement prepared before is gone, and goes on.
//! 2. DDL: 4 connections prepare `SELECT * FROM ddl_t WHERE id = $1` and
//!    `SELECT a FROM ddl_t WHERE id = $1`, one adds a column, then each runs both
//!    again (`SELECT *` up to 5 times). "cached plan must not change result type"
//!    (0A000) is counted and reported, not failed on: PgBouncer surfaces it the same
//!    way (its docs advise RECONNECT after such migrations). `SELECT a` must work.
//!
//! Each program checks every result, prints one JSON line and exits non-zero on a
//! wrong result or an unexpected error. Drivers are installed by
//! `tests/drivers/install.sh` (run by `make deps`, and so by `make test`). A missing
//! toolchain or driver fails its test when `CI=true` and skips it with a note
//! otherwise.

mod external;
mod pgbench;
mod plain;
mod tokio_postgres;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::probe::unique_marker;
use crate::support::{
    clear_pg_env, pg, run_bounded, tail, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER,
};

/// Clients per driver run (against a pool of 2).
pub const WORKERS: usize = 12;
/// Iterations per client.
pub const ITERS: usize = 40;
/// The programs' own time limit (`DRIVER_TIMEOUT_S`).
const PROGRAM_LIMIT_S: u64 = 180;
/// Ours, a little longer.
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(PROGRAM_LIMIT_S + 60);

/// The tables of the scenario, owned by `sluice_md5` (which must be able to ALTER).
pub const SCHEMA: &str = "SET ROLE sluice_md5;
CREATE TABLE items (worker int NOT NULL, seq int NOT NULL, val text NOT NULL,
                    PRIMARY KEY (worker, seq));
CREATE TABLE ddl_t (id int PRIMARY KEY, a int NOT NULL);
INSERT INTO ddl_t SELECT g, g * 10 FROM generate_series(1, 100) g;
";

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where `tests/drivers/install.sh` puts what it builds.
pub fn drivers_out() -> PathBuf {
    repo().join("target/drivers")
}

/// A fresh database owned by `sluice_md5` with [`SCHEMA`]; returns its name.
pub fn driver_db(prefix: &str) -> String {
    let name = unique_marker(prefix);
    pg().psql(&format!("CREATE DATABASE {name} OWNER {MD5_USER}"));
    pg().psql_db(&name, SCHEMA);
    name
}

/// Sluice serving `db` to `sluice_md5` in transaction pooling, 2 servers at most.
pub fn driver_sluice(db: &str) -> SluiceBuilder {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(db, &format!("host=127.0.0.1 port=@PG_PORT@ dbname={db}"))
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .setting("max_client_conn", "200")
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether `driver` can run (`missing` is `None`). If not, fails the test in CI,
/// and locally prints a note and returns false (the test then returns).
pub fn require(driver: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else { return true };
    let msg = format!(
        "driver matrix: {driver}: {why}; run tests/drivers/install.sh \
         (with CI=true it also installs missing toolchains with apt-get)"
    );
    if in_ci() {
        panic!("{msg}");
    }
    eprintln!("SKIPPED (not in CI): {msg}");
    false
}

/// `None` if `program` runs (`program --version` or similar `args`), else why not.
pub fn tool_missing(program: &str, args: &[&str]) -> Option<String> {
    let mut child = match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return Some(format!("`{program}` not found ({e})")),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return None,
            Ok(Some(status)) => return Some(format!("`{program}` does not work ({status})")),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Some(format!("`{program}` hangs"));
            }
            Err(e) => return Some(format!("`{program}`: {e}")),
        }
    }
}

/// `None` if `path` exists, else a note that the driver is not installed.
pub fn file_missing(path: &Path) -> Option<String> {
    (!path.exists()).then(|| format!("{} is missing (driver not installed)", path.display()))
}

/// Runs a driver program (`cmd`, connection in `PG*` variables) against `s`
/// serving `db`; panics with its output and Sluice's log unless it exits 0 with a
/// summary saying `"ok": true` and all iterations done. Returns the summary line.
pub fn run_driver(name: &str, cmd: Command, s: &Sluice, db: &str) -> String {
    run_driver_expecting(name, cmd, s, db, WORKERS * ITERS)
}

/// [`run_driver`] for a program that reports `iterations` in all.
pub fn run_driver_expecting(
    name: &str,
    mut cmd: Command,
    s: &Sluice,
    db: &str,
    iterations: usize,
) -> String {
    clear_pg_env(&mut cmd);
    cmd.env("PGHOST", "127.0.0.1")
        .env("PGPORT", s.port().to_string())
        .env("PGUSER", MD5_USER)
        .env("PGPASSWORD", MD5_PASSWORD)
        .env("PGDATABASE", db)
        .env("PGSSLMODE", "disable")
        .env("DRIVER_WORKERS", WORKERS.to_string())
        .env("DRIVER_ITERS", ITERS.to_string())
        .env("DRIVER_TIMEOUT_S", PROGRAM_LIMIT_S.to_string());
    let out = run_bounded(&mut cmd, None, PROGRAM_TIMEOUT).unwrap_or_else(|| {
        panic!(
            "{name} did not finish within {PROGRAM_TIMEOUT:?}\n{}",
            s.diagnostics()
        )
    });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let summary = stdout.lines().last().unwrap_or("").to_owned();
    eprintln!("{name}: {summary}");
    let report = || {
        format!(
            "{name} ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
            out.status,
            tail(&stdout, 30),
            tail(&stderr, 40),
            s.diagnostics()
        )
    };
    assert!(out.status.success(), "{}", report());
    let compact: String = summary.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(compact.contains("\"ok\":true"), "{}", report());
    assert_eq!(
        json_number(&compact, "iterations"),
        Some(iterations as u64),
        "{}",
        report()
    );
    summary
}

/// The number after `"key":` in a one-line JSON object without whitespace.
fn json_number(compact: &str, key: &str) -> Option<u64> {
    let at = compact.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = compact[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[test]
fn json_number_reads_compact_summaries() {
    let line = r#"{"driver":"x","ok":true,"iterations":480,"ddl":{"of":4}}"#;
    assert_eq!(json_number(line, "iterations"), Some(480));
    assert_eq!(json_number(line, "of"), Some(4));
    assert_eq!(json_number(line, "missing"), None);
}

//! The driver programs of `tests/drivers/`, one test each (see `drivers.rs`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{
    driver_db, driver_sluice, drivers_out, file_missing, repo, require, run_driver,
    run_driver_expecting, tool_missing, ITERS,
};
use crate::support::{run_bounded, TempDir};

/// The Python of `target/driver-venv`, if the Python drivers are installed.
fn venv_python(driver: &str) -> Option<PathBuf> {
    let python = repo().join("target/driver-venv/bin/python");
    let stamp = repo().join("target/driver-venv/.sluice-stamp");
    require(driver, file_missing(&stamp)).then_some(python)
}

fn python_driver(name: &str, script: &str) {
    let Some(python) = venv_python(name) else {
        return;
    };
    let db = driver_db(&format!("drv_{name}"));
    let s = driver_sluice(&db).start();
    let mut cmd = Command::new(python);
    cmd.arg(repo().join("tests/drivers/python").join(script))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    run_driver(name, cmd, &s, &db);
}

/// psycopg 3: `prepare=True` and the default `prepare_threshold` (5); pipeline
/// mode on odd workers.
#[test]
fn psycopg() {
    python_driver("psycopg", "psycopg_driver.py");
}

/// psycopg in pipeline mode with implicit transactions: after a ROLLBACK psycopg
/// drops its statements with its own `DEALLOCATE ALL`, which in pipeline mode goes
/// with the extended protocol. A pooler that recognizes it only in a simple Query
/// (as Sluice did until 4db8d31) keeps believing the server has its `SLUICE_<n>`
/// statements, and the next execution fails with "prepared statement SLUICE_n does
/// not exist" (at the first iteration). Sluice reads the command's CommandComplete
/// tag instead, whatever the protocol. The same case as `pgjdbc_deallocate_all`.
#[test]
fn psycopg_pipeline_rollback() {
    let Some(python) = venv_python("psycopg") else {
        return;
    };
    let db = driver_db("drv_psycopg_pipe");
    let s = driver_sluice(&db).start();
    let mut cmd = Command::new(python);
    cmd.arg(repo().join("tests/drivers/python/psycopg_pipeline_rollback.py"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    run_driver_expecting("psycopg (pipeline, rollback)", cmd, &s, &db, ITERS);
}

/// asyncpg: its default statement cache, `conn.prepare()`, `executemany`.
#[test]
fn asyncpg() {
    python_driver("asyncpg", "asyncpg_driver.py");
}

/// Builds `tests/drivers/go` as it is now (install.sh filled the module and build
/// caches; offline here) into `dir`.
fn pgx_binary(dir: &TempDir) -> Option<PathBuf> {
    if !require("pgx", tool_missing("go", &["version"]))
        || !require("pgx", file_missing(&drivers_out().join("pgx.stamp")))
    {
        return None;
    }
    let bin = dir.join("pgx-driver");
    let mut build = Command::new("go");
    build
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(repo().join("tests/drivers/go"))
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("GOPROXY", "off");
    let out = run_bounded(&mut build, None, Duration::from_secs(300))
        .expect("go build did not finish within 300 s");
    assert!(
        out.status.success(),
        "go build of tests/drivers/go failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(bin)
}

/// pgx v5: the default QueryExecModeCacheStatement; batches on odd workers.
#[test]
fn pgx() {
    let dir = TempDir::new("pgx-driver");
    let Some(bin) = pgx_binary(&dir) else {
        return;
    };
    let db = driver_db("drv_pgx");
    let s = driver_sluice(&db).start();
    run_driver("pgx", Command::new(&bin), &s, &db);
}

/// pgx with `max_prepared_statements = 3`, below the 8 statements each client
/// uses: servers keep evicting (an injected Close) and re-preparing (an injected
/// Parse), also in the middle of pipelined batches.
#[test]
fn pgx_small_statement_cache() {
    let dir = TempDir::new("pgx-driver");
    let Some(bin) = pgx_binary(&dir) else {
        return;
    };
    let db = driver_db("drv_pgx_lru");
    let s = driver_sluice(&db)
        .setting("max_prepared_statements", "3")
        .start();
    run_driver(
        "pgx (max_prepared_statements = 3)",
        Command::new(&bin),
        &s,
        &db,
    );
}

/// node-postgres: named queries (`{name, text, values}`).
#[test]
fn node_pg() {
    let modules = drivers_out().join("node/node_modules");
    if !require("node-pg", tool_missing("node", &["--version"]))
        || !require("node-pg", file_missing(&modules.join("pg/package.json")))
    {
        return;
    }
    let db = driver_db("drv_node");
    let s = driver_sluice(&db).start();
    let mut cmd = Command::new("node");
    cmd.arg(repo().join("tests/drivers/node/main.js"))
        .env("NODE_PATH", &modules);
    run_driver("node-pg", cmd, &s, &db);
}

/// `java -cp <pgjdbc> Main.java` (source-file mode: always the current source).
fn pgjdbc_cmd() -> Option<Command> {
    let lib = drivers_out().join("java/lib");
    let jar = std::fs::read_dir(&lib).ok().and_then(|entries| {
        entries
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains("postgresql-"))
    });
    let jar_missing = jar.is_none().then(|| {
        format!(
            "no postgresql-*.jar in {} (driver not installed)",
            lib.display()
        )
    });
    if !require("pgjdbc", tool_missing("java", &["-version"])) || !require("pgjdbc", jar_missing) {
        return None;
    }
    let mut cmd = Command::new("java");
    cmd.arg("-cp")
        .arg(lib.join("*"))
        .arg(repo().join("tests/drivers/java/src/main/java/Main.java"));
    Some(cmd)
}

/// pgjdbc: `prepareThreshold=1` on even workers, the default (5) on odd ones; JDBC
/// batches. Without the DEALLOCATE ALL / DISCARD ALL step (see the next test).
#[test]
fn pgjdbc() {
    let Some(mut cmd) = pgjdbc_cmd() else {
        return;
    };
    cmd.env("DRIVER_SKIP_RESET", "1");
    let db = driver_db("drv_pgjdbc");
    let s = driver_sluice(&db).start();
    run_driver("pgjdbc", cmd, &s, &db);
}

/// pgjdbc with its DEALLOCATE ALL / DISCARD ALL step. pgjdbc sends them with the
/// extended protocol (Parse/Bind/Execute of the unnamed statement). A pooler that
/// recognizes them only in a simple Query (Sluice until 4db8d31) keeps believing
/// that server has its `SLUICE_<n>` statements, and later Binds there fail with
/// "prepared statement SLUICE_<n> does not exist" (for every client, until the
/// server connection closes). Smallest case: `tokio_postgres::extended_deallocate_all_*`.
#[test]
fn pgjdbc_deallocate_all() {
    let Some(cmd) = pgjdbc_cmd() else {
        return;
    };
    let db = driver_db("drv_pgjdbc_reset");
    let s = driver_sluice(&db).start();
    run_driver("pgjdbc", cmd, &s, &db);
}

//! The admin console (`pgbouncer` database) and the metrics endpoint, against the real
//! binary: every SHOW command's columns (compared with PgBouncer 1.25's lists) and the
//! values that must follow the pooler's state, the control commands, the access rules,
//! `/metrics`, and Debian's packaged exporter reading the console.
//!
//! Users: `postgres` is an admin (the harness default `admin_users`), `stats` is in
//! `stats_users`, `sluice_md5` is a pooled user that may not use the console.

mod access;
mod autodb;
mod control;
mod idle_pools;
mod many_pools;
mod metrics;
mod opening;
mod pause;
mod show;
mod values;

use std::process::Command;
use std::time::Duration;

use crate::support::probe::within;
use crate::support::{self, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

pub const ADMIN: &str = "postgres";
pub const ADMIN_PW: &str = "adminpw";
pub const STATS: &str = "stats";
pub const STATS_PW: &str = "statspw";
pub const T: Duration = Duration::from_secs(30);

/// A Sluice with the console users above and the pooled md5 user.
pub fn builder() -> SluiceBuilder {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .userlist(ADMIN, ADMIN_PW)
        .userlist(STATS, STATS_PW)
        .setting("stats_users", STATS)
}

/// What psql printed for one console command.
#[derive(Debug)]
pub struct PsqlOut {
    pub ok: bool,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub stderr: String,
}

impl PsqlOut {
    /// The value in `col` of the first row whose `key_col` is `key`.
    pub fn cell(&self, key_col: &str, key: &str, col: &str) -> Option<String> {
        let k = self.header.iter().position(|h| h == key_col)?;
        let c = self.header.iter().position(|h| h == col)?;
        self.rows
            .iter()
            .find(|r| r.get(k).map(String::as_str) == Some(key))
            .and_then(|r| r.get(c).cloned())
    }

    /// Every value of column `col`.
    pub fn column(&self, col: &str) -> Vec<String> {
        let Some(c) = self.header.iter().position(|h| h == col) else {
            return Vec::new();
        };
        self.rows.iter().filter_map(|r| r.get(c).cloned()).collect()
    }
}

const SEP: &str = "\u{1f}";

/// Runs `sql` on the console with the real psql (unaligned, header on, no footer).
pub fn psql_as(s: &Sluice, user: &str, password: &str, sql: &str) -> PsqlOut {
    let bin = support::pg_bindir().join("psql");
    let bin = if bin.exists() { bin } else { "psql".into() };
    let mut cmd = Command::new(bin);
    support::clear_pg_env(&mut cmd);
    cmd.env("PGCONNECT_TIMEOUT", "10")
        .env("PGPASSWORD", password)
        .args(["-X", "-A", "-F", SEP, "-P", "footer=off", "-h", "127.0.0.1"])
        .arg("-p")
        .arg(s.port().to_string())
        .args(["-U", user, "-d", "pgbouncer", "-c", sql]);
    psql_run(cmd)
}

/// [`psql_as`] as the admin user.
pub fn psql(s: &Sluice, sql: &str) -> PsqlOut {
    psql_as(s, ADMIN, ADMIN_PW, sql)
}

/// Runs a prepared psql command and splits its unaligned output.
pub fn psql_run(mut cmd: Command) -> PsqlOut {
    let out = support::run_bounded(&mut cmd, None, T).expect("psql did not finish in time");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = stdout.lines().filter(|l| !l.is_empty());
    let header = lines
        .next()
        .map(|l| l.split(SEP).map(str::to_owned).collect())
        .unwrap_or_default();
    let rows = lines
        .map(|l| l.split(SEP).map(str::to_owned).collect())
        .collect();
    PsqlOut {
        ok: out.status.success(),
        header,
        rows,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `sql`, panicking unless psql succeeded.
pub fn psql_ok(s: &Sluice, sql: &str) -> PsqlOut {
    let o = psql(s, sql);
    assert!(o.ok, "{sql}: {}\n{}", o.stderr, s.diagnostics());
    o
}

/// Runs `sql`, expecting an error containing `want`.
pub fn psql_err(s: &Sluice, user: &str, password: &str, sql: &str, want: &str) {
    let o = psql_as(s, user, password, sql);
    assert!(
        !o.ok && o.stderr.contains(want),
        "{sql}: expected an error with {want:?}, got ok={} stderr={}",
        o.ok,
        o.stderr
    );
}

/// A pooled client (md5 user, test database), optionally with an application_name.
pub async fn pooled(s: &Sluice, app_name: Option<&str>) -> tokio_postgres::Client {
    let mut cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    if let Some(a) = app_name {
        cfg.application_name(a);
    }
    within(T, "pooled connect", support::connect(&cfg)).await
}

/// Runs `SELECT 1` through a pooled client.
pub async fn select1(c: &tokio_postgres::Client) {
    within(T, "SELECT 1", c.simple_query("SELECT 1"))
        .await
        .expect("SELECT 1");
}

/// A console connection through tokio-postgres (simple queries only).
pub async fn console(s: &Sluice, user: &str, password: &str) -> tokio_postgres::Client {
    within(
        T,
        "console connect",
        support::connect(&s.config(user, password, "pgbouncer")),
    )
    .await
}

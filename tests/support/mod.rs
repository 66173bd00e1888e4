//! Integration-test harness: real PostgreSQL, the real `sluice` binary, the real
//! `psql`/`pgbench` clients. No mocks.
//!
//! * [`pg()`] — one shared PostgreSQL server per test-binary run (started lazily,
//!   stopped by an `atexit` handler).
//! * [`SluiceBuilder`] / [`Sluice`] — a `sluice` child process per test, each with
//!   its own port and temp dir, so tests run in parallel safely.
//! * Small helpers: [`TempDir`], [`free_port`], [`psql_cmd`], [`pgbench`],
//!   [`run_bounded`], [`connect`].
//!
//! Set `SLUICE_KEEP_TMP=1` to keep every temp dir (PostgreSQL data dir, Sluice ini
//! and logs) for post-mortem debugging; set `SLUICE_PG_BINDIR` to force a
//! PostgreSQL binary directory.
#![allow(dead_code, unused_imports)]

pub mod activation;
mod fds;
pub mod pg;
pub mod probe;
pub mod raw;
pub mod sluice;
pub mod wire;

pub use pg::{pg, pg_bindir, PgServer};
pub use sluice::{Sluice, SluiceBuilder};

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Passwords of the roles created by [`pg()`] (`sluice_trust` has none).
pub const MD5_USER: &str = "sluice_md5";
pub const MD5_PASSWORD: &str = "md5pass";
pub const SCRAM_USER: &str = "sluice_scram";
pub const SCRAM_PASSWORD: &str = "scrampass";
pub const PLAIN_USER: &str = "sluice_plain";
pub const PLAIN_PASSWORD: &str = "plainpass";
pub const TRUST_USER: &str = "sluice_trust";
/// A role with the REPLICATION attribute (md5), for replication connections.
pub const REPL_USER: &str = "sluice_repl";
pub const REPL_PASSWORD: &str = "replpass";
/// Database created by [`pg()`], usable by all four roles.
pub const TEST_DB: &str = "sluice_test";

/// The password of one of the well-known test roles, if it has one.
pub fn password_for(user: &str) -> Option<&'static str> {
    match user {
        MD5_USER => Some(MD5_PASSWORD),
        SCRAM_USER => Some(SCRAM_PASSWORD),
        PLAIN_USER => Some(PLAIN_PASSWORD),
        REPL_USER => Some(REPL_PASSWORD),
        _ => None,
    }
}

fn keep_tmp() -> bool {
    std::env::var_os("SLUICE_KEEP_TMP").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A directory removed (recursively) on drop. Created under
/// `std::env::temp_dir()` with a name unique to this process.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    /// Creates `<temp_dir>/<prefix>-<pid>-<n>`.
    pub fn new(prefix: &str) -> TempDir {
        TempDir::new_in(&std::env::temp_dir(), prefix)
    }

    /// Creates `<base>/<prefix>-<pid>-<n>` (mode 0700).
    pub fn new_in(base: &Path, prefix: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        use std::os::unix::fs::DirBuilderExt;
        for _ in 0..1000 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{prefix}-{}-{n}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    return TempDir {
                        path,
                        keep: keep_tmp(),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create temp dir {}: {e}", path.display()),
            }
        }
        panic!("cannot find a free temp dir name under {}", base.display());
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `self.path().join(rel)`.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    /// Writes `contents` to `<dir>/<name>` and returns the full path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.path.join(name);
        std::fs::write(&p, contents).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        p
    }

    /// Do not delete the directory on drop (debugging aid).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("keeping temp dir {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago. Never hands out the same
/// port twice within one process, which keeps parallel tests from racing each
/// other; a race with another process is still possible, so starters retry.
/// Connects to the UNIX socket for `dir` and `port` as libpq would: a `dir` starting
/// with `@` names it in Linux's abstract namespace (`\0dir/.s.PGSQL.<port>`).
pub fn unix_connect(dir: &Path, port: u16) -> std::io::Result<std::os::unix::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!(".s.PGSQL.{port}");
    match dir.to_str().and_then(|d| d.strip_prefix('@')) {
        Some(abs) => {
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(format!("{abs}/{name}"))?;
            std::os::unix::net::UnixStream::connect_addr(&addr)
        }
        None => std::os::unix::net::UnixStream::connect(dir.join(name)),
    }
}

pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..200 {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0 to find a free port");
        let port = listener
            .local_addr()
            .expect("local_addr of a bound listener")
            .port();
        drop(listener);
        let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
    panic!("could not find a free TCP port");
}

/// Removes every inherited `PG*` variable (PGHOST, PGPASSWORD, PGSSLMODE, ...)
/// so the ambient environment cannot change what a client connects to.
pub fn clear_pg_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PG") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A `psql` command (`-X -A -t -v ON_ERROR_STOP=1 -h host -p port -U user -d db`)
/// with a clean `PG*` environment and `PGCONNECT_TIMEOUT=10`. `host` may be an IP
/// or a unix-socket directory. For a password, add `.env("PGPASSWORD", pw)` or use
/// [`psql_cmd_pw`]. Add `-c <sql>` (or feed stdin) and run it, e.g. with
/// [`run_bounded`].
pub fn psql_cmd(port: u16, host: &str, user: &str, db: &str) -> Command {
    let mut cmd = Command::new(pg_bindir_bin("psql"));
    clear_pg_env(&mut cmd);
    cmd.env("PGCONNECT_TIMEOUT", "10")
        .env("PGAPPNAME", "sluice-tests")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .arg("-h")
        .arg(host)
        .arg("-p")
        .arg(port.to_string())
        .arg("-U")
        .arg(user)
        .arg("-d")
        .arg(db)
        .stdin(Stdio::null());
    cmd
}

/// [`psql_cmd`] with `PGPASSWORD` set.
pub fn psql_cmd_pw(port: u16, host: &str, user: &str, db: &str, password: &str) -> Command {
    let mut cmd = psql_cmd(port, host, user, db);
    cmd.env("PGPASSWORD", password);
    cmd
}

/// `<pg bindir>/<name>` if it exists there, else `name` (looked up on PATH).
fn pg_bindir_bin(name: &str) -> PathBuf {
    let p = pg_bindir().join(name);
    if p.exists() {
        p
    } else {
        PathBuf::from(name)
    }
}

/// Whether a command succeeded, and what it said: its standard output (trimmed)
/// if so, its standard error if not.
pub fn outcome(out: &std::process::Output) -> (bool, String) {
    let text = if out.status.success() {
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    } else {
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    (out.status.success(), text)
}

/// Runs `cmd` to completion with piped stdout/stderr, optionally feeding `stdin`.
/// Returns `None` (after killing the child) if it runs longer than `timeout`.
/// Panics only if the program cannot be spawned.
pub fn run_bounded(cmd: &mut Command, stdin: Option<&str>, timeout: Duration) -> Option<Output> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {:?}: {e}", cmd.get_program()));
    let feeder = match (stdin, child.stdin.take()) {
        (Some(input), Some(mut pipe)) => {
            let input = input.to_owned();
            Some(std::thread::spawn(move || {
                let _ = pipe.write_all(input.as_bytes());
            }))
        }
        _ => None,
    };
    let mut out_pipe = child.stdout.take().expect("stdout piped");
    let mut err_pipe = child.stderr.take().expect("stderr piped");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("waiting for {:?}: {e}", cmd.get_program()),
        }
    };
    if let Some(f) = feeder {
        let _ = f.join();
    }
    // If the child was killed, grandchildren could still hold the pipes open;
    // only join the readers when the child exited by itself.
    let status = status?;
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Some(Output {
        status,
        stdout,
        stderr,
    })
}

/// Result of one [`pgbench`] run.
#[derive(Debug)]
pub struct PgbenchRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// First `tps = ...` figure of the report, if any.
    pub tps: Option<f64>,
}

impl PgbenchRun {
    pub fn success(&self) -> bool {
        self.status.success()
    }
}

/// Parses the first `tps = <number>` line of a pgbench report.
pub fn parse_tps(report: &str) -> Option<f64> {
    report.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("tps = ")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Runs the real `pgbench -h host -p port -U user <args...> db` with a clean `PG*`
/// environment (plus `PGPASSWORD` if given). Panics if it does not finish within
/// `timeout`. Pass e.g. `&["-n", "-C", "-c", "8", "-T", "5", "-f", script]`.
pub fn pgbench(
    host: &str,
    port: u16,
    user: &str,
    db: &str,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> PgbenchRun {
    let mut cmd = Command::new(pg_bindir_bin("pgbench"));
    clear_pg_env(&mut cmd);
    cmd.env("PGCONNECT_TIMEOUT", "10")
        .arg("-h")
        .arg(host)
        .arg("-p")
        .arg(port.to_string())
        .arg("-U")
        .arg(user)
        .args(args)
        .arg(db)
        .stdin(Stdio::null());
    if let Some(pw) = password {
        cmd.env("PGPASSWORD", pw);
    }
    let out = run_bounded(&mut cmd, None, timeout)
        .unwrap_or_else(|| panic!("pgbench {args:?} did not finish within {timeout:?}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    PgbenchRun {
        status: out.status,
        tps: parse_tps(&stdout),
        stdout,
        stderr,
    }
}

/// [`pgbench`] as `sluice_md5` on 127.0.0.1:`port`, off the async workers, running
/// `script` (SQL, written to a file of its own) with `args` before its `-f`.
pub async fn pgbench_script(port: u16, db: &str, script: &str, args: &[&str]) -> PgbenchRun {
    let dir = TempDir::new("sluice-pgbench");
    let file = dir
        .write("script.sql", script)
        .to_string_lossy()
        .into_owned();
    let (db, mut all) = (
        db.to_owned(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    all.extend(["-f".to_owned(), file]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        let run = pgbench(
            "127.0.0.1",
            port,
            MD5_USER,
            &db,
            Some(MD5_PASSWORD),
            &args,
            Duration::from_secs(120),
        );
        drop(dir);
        run
    })
    .await
    .expect("pgbench")
}

/// Connects with tokio-postgres (no TLS) and spawns the connection task on the
/// current runtime. Returns the error instead of panicking.
pub async fn try_connect(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// [`try_connect`], panicking with the error on failure.
pub async fn connect(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    match try_connect(config).await {
        Ok(c) => c,
        Err(e) => panic!("connect {config:?} failed: {e} ({e:?})"),
    }
}

/// Last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Reads a file to a string, empty if missing/unreadable.
pub fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Polls `cond` every 20 ms until it returns true or `timeout` elapses.
/// Returns whether it became true.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

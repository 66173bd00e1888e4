//! One real PostgreSQL server per test-binary run, shared by all tests.
//!
//! Started lazily by the first call to [`pg()`]; stopped (`pg_ctl stop -m
//! immediate`) and its temp dir removed by a `libc::atexit` handler, which runs
//! when the Rust test harness calls `exit`. When the tests run as root, the
//! server runs as `nobody` (PostgreSQL refuses to run as root).

use super::{clear_pg_env, free_port, keep_tmp, password_for, read_lossy, run_bounded, tail};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

mod private;
pub use private::PrivatePg;

/// A running PostgreSQL server. Obtain it with [`pg()`].
#[derive(Debug)]
pub struct PgServer {
    bindir: PathBuf,
    dir: PathBuf,
    data_dir: PathBuf,
    sock_dir: PathBuf,
    log_path: PathBuf,
    port: u16,
    /// (uid, gid) the server runs as, when the tests run as root.
    run_as: Option<(u32, u32)>,
}

static PG: OnceLock<Result<PgServer, String>> = OnceLock::new();

/// The shared PostgreSQL server, started on first use. Panics (with the server
/// log tail) if it cannot be started; every later call panics with the same
/// message rather than retrying.
pub fn pg() -> &'static PgServer {
    let res = PG.get_or_init(|| {
        let started = std::panic::catch_unwind(start).unwrap_or_else(|p| {
            Err(p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic while starting PostgreSQL".into()))
        });
        if started.is_ok() {
            // SAFETY: registering a plain extern "C" fn with no captured state.
            unsafe {
                libc::atexit(stop_at_exit);
            }
        }
        started
    });
    match res {
        Ok(server) => server,
        Err(msg) => panic!("test PostgreSQL is unavailable: {msg}"),
    }
}

extern "C" fn stop_at_exit() {
    // Never unwind across the FFI boundary.
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(server)) = PG.get() {
            server.shutdown();
        }
    });
}

/// The PostgreSQL binary directory: `$SLUICE_PG_BINDIR`, else `pg_config
/// --bindir`, else the newest `/usr/lib/postgresql/*/bin`, else the directory of
/// `initdb` on PATH. Must contain `initdb`, `pg_ctl` and `postgres`.
pub fn pg_bindir() -> &'static Path {
    static BINDIR: OnceLock<PathBuf> = OnceLock::new();
    BINDIR.get_or_init(|| {
        find_bindir().unwrap_or_else(|| {
            panic!(
                "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: \
                 set SLUICE_PG_BINDIR or run `make deps` \
                 (apt-get install postgresql postgresql-client postgresql-contrib)"
            )
        })
    })
}

fn is_server_bindir(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|b| dir.join(b).is_file())
}

fn find_bindir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SLUICE_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return is_server_bindir(&dir).then_some(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if is_server_bindir(&dir) {
                return Some(dir);
            }
        }
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let version: Vec<u32> = name
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<_>>()?;
            let bin = entry.path().join("bin");
            is_server_bindir(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/local/pgsql/bin")])
        .find(|dir| is_server_bindir(dir))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// uid/gid of `nobody`.
fn nobody() -> Result<(u32, u32), String> {
    let name = c"nobody";
    // SAFETY: getpwnam with a valid NUL-terminated string; we copy the fields out
    // immediately (tests start PostgreSQL once, under a OnceLock).
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err("running as root but user `nobody` does not exist".into());
    }
    // SAFETY: pw is non-null and points to a valid passwd struct.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok((uid, gid))
}

/// True if every ancestor directory of `dir` (and `dir`) is traversable by others.
fn traversable_by_others(dir: &Path) -> bool {
    dir.ancestors().all(|a| {
        std::fs::metadata(a)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

fn start() -> Result<PgServer, String> {
    let bindir = pg_bindir().to_path_buf();
    let run_as = if is_root() { Some(nobody()?) } else { None };

    let mut base = std::env::temp_dir();
    if run_as.is_some() && !traversable_by_others(&base) {
        base = PathBuf::from("/tmp");
        if !traversable_by_others(&base) {
            return Err(format!(
                "running as root: neither {} nor /tmp is traversable by `nobody`",
                std::env::temp_dir().display()
            ));
        }
    }
    // Created directly (not as a super::TempDir): it outlives this function and
    // is removed by the atexit handler.
    let dir = {
        let t = super::TempDir::new_in(&base, "sluice-pg");
        let p = t.path().to_path_buf();
        std::mem::forget(t);
        p
    };
    let mut server = PgServer {
        bindir,
        data_dir: dir.join("data"),
        sock_dir: dir.join("sock"),
        log_path: dir.join("postgres.log"),
        dir,
        port: 0,
        run_as,
    };
    match server.init_and_start() {
        Ok(()) => Ok(server),
        Err(e) => {
            let log = tail(&read_lossy(&server.log_path), 40);
            server.shutdown();
            Err(format!("{e}\n--- postgres log tail ---\n{log}"))
        }
    }
}

impl PgServer {
    /// A command for a server-side binary, run as the server's OS user.
    fn server_cmd(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(name));
        clear_pg_env(&mut cmd);
        cmd.env("LC_ALL", "C").current_dir(&self.dir);
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid).env("HOME", &self.dir);
        }
        cmd
    }

    fn run_server_cmd(
        &self,
        mut cmd: Command,
        what: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        match run_bounded(&mut cmd, None, timeout) {
            None => Err(format!("{what} did not finish within {timeout:?}")),
            Some(out) if out.status.success() => Ok(()),
            Some(out) => Err(format!(
                "{what} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }

    fn init_and_start(&mut self) -> Result<(), String> {
        std::fs::create_dir(&self.sock_dir)
            .map_err(|e| format!("create {}: {e}", self.sock_dir.display()))?;
        std::fs::set_permissions(&self.sock_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", self.sock_dir.display()))?;
        if let Some((uid, gid)) = self.run_as {
            for p in [&self.dir, &self.sock_dir] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid))
                    .map_err(|e| format!("chown {} to nobody: {e}", p.display()))?;
            }
        }

        let mut initdb = self.server_cmd("initdb");
        initdb
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .args(["-E", "UTF8", "--locale=C"]);
        self.run_server_cmd(initdb, "initdb", Duration::from_secs(120))?;

        let conf = format!(
            "\n# --- sluice test harness ---\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}, @{}'\n\
             max_connections = 300\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n\
             shared_buffers = 32MB\n\
             password_encryption = 'scram-sha-256'\n\
             wal_level = logical\n\
             log_line_prefix = '%m [%p] %q%u@%d '\n",
            self.sock_dir.display(),
            self.sock_dir.display()
        );
        append(&self.data_dir.join("postgresql.conf"), &conf)?;
        let hba = "# sluice test harness\n\
                   local all all trust\n\
                   host all sluice_md5 127.0.0.1/32 md5\n\
                   host all sluice_scram 127.0.0.1/32 scram-sha-256\n\
                   host all sluice_plain 127.0.0.1/32 password\n\
                   host all sluice_slow_scram 127.0.0.1/32 scram-sha-256\n\
                   host all sluice_trust 127.0.0.1/32 trust\n\
                   host replication sluice_repl 127.0.0.1/32 md5\n\
                   host all sluice_repl 127.0.0.1/32 md5\n\
                   host all all 127.0.0.1/32 trust\n";
        std::fs::write(self.data_dir.join("pg_hba.conf"), hba)
            .map_err(|e| format!("write pg_hba.conf: {e}"))?;

        let mut last_err = String::new();
        for attempt in 1..=4 {
            self.port = free_port();
            let mut pg_ctl = self.server_cmd("pg_ctl");
            pg_ctl
                .arg("-D")
                .arg(&self.data_dir)
                .arg("-l")
                .arg(&self.log_path)
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-p {}", self.port))
                .arg("start");
            match self.run_server_cmd(pg_ctl, "pg_ctl start", Duration::from_secs(90)) {
                Ok(()) => {
                    last_err.clear();
                    break;
                }
                Err(e) => {
                    last_err = format!(
                        "attempt {attempt} (port {}): {e}\n--- log tail ---\n{}",
                        self.port,
                        tail(&read_lossy(&self.log_path), 20)
                    );
                    self.stop_server();
                }
            }
        }
        if !last_err.is_empty() {
            return Err(format!("could not start PostgreSQL: {last_err}"));
        }

        self.try_psql(
            "postgres",
            "SET password_encryption = 'md5';\n\
             CREATE ROLE sluice_md5 LOGIN PASSWORD 'md5pass';\n\
             CREATE ROLE sluice_repl LOGIN REPLICATION PASSWORD 'replpass';\n\
             SET password_encryption = 'scram-sha-256';\n\
             CREATE ROLE sluice_scram LOGIN PASSWORD 'scrampass';\n\
             CREATE ROLE sluice_plain LOGIN PASSWORD 'plainpass';\n\
             CREATE ROLE sluice_trust LOGIN;\n\
             CREATE ROLE sluice_slow_scram LOGIN;\n\
             CREATE DATABASE sluice_test OWNER postgres;\n\
             GRANT ALL ON DATABASE sluice_test \
               TO sluice_md5, sluice_scram, sluice_plain, sluice_trust, sluice_slow_scram, \
               sluice_repl;\n",
        )?;
        self.try_psql(
            "sluice_test",
            "GRANT ALL ON SCHEMA public \
               TO sluice_md5, sluice_scram, sluice_plain, sluice_trust, sluice_slow_scram;\n",
        )?;
        Ok(())
    }

    /// pg_ctl stop -m immediate; SIGKILL the postmaster if that fails.
    fn stop_server(&self) {
        if !self.data_dir.join("postmaster.pid").exists() {
            return;
        }
        let mut cmd = self.server_cmd("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"]);
        let stopped = matches!(
            run_bounded(&mut cmd, None, Duration::from_secs(40)),
            Some(out) if out.status.success()
        );
        if !stopped {
            let pidfile = read_lossy(&self.data_dir.join("postmaster.pid"));
            if let Some(pid) = pidfile.lines().next().and_then(|l| l.trim().parse().ok()) {
                // SAFETY: plain kill(2) on the postmaster pid we started.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }

    fn shutdown(&self) {
        self.stop_server();
        if keep_tmp() {
            eprintln!("keeping PostgreSQL temp dir {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Unix-socket directory (`host=<this>` for libpq / Sluice).
    pub fn socket_dir(&self) -> &Path {
        &self.sock_dir
    }

    /// The same socket in the abstract namespace (`host=@...`): `@` and the
    /// directory's path, which makes the name unique.
    pub fn abstract_socket_dir(&self) -> String {
        format!("@{}", self.sock_dir.display())
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `<bindir>/<name>`, e.g. `bin("psql")`, `bin("pgbench")`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log_path)
    }

    /// Runs `sql` as `postgres` in database `db` via psql over the unix socket
    /// (statements are sent one by one, so `CREATE DATABASE` works). Returns
    /// stdout (`-A -t` format) or a message with stderr.
    pub fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = super::psql_cmd(self.port, &self.sock_dir.to_string_lossy(), "postgres", db);
        cmd.args(["-q", "-f", "-"]);
        match run_bounded(&mut cmd, Some(sql), Duration::from_secs(60)) {
            None => Err(format!("psql timed out running:\n{sql}")),
            Some(out) if out.status.success() => {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            }
            Some(out) => Err(format!(
                "psql failed ({}) running:\n{sql}\n--- stderr ---\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }

    /// [`try_psql`](Self::try_psql) in database `postgres`, panicking on failure.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_db("postgres", sql)
    }

    /// [`try_psql`](Self::try_psql), panicking on failure.
    pub fn psql_db(&self, db: &str, sql: &str) -> String {
        self.try_psql(db, sql).unwrap_or_else(|e| panic!("{e}"))
    }

    /// tokio-postgres config for a direct TCP connection to 127.0.0.1:port. The
    /// password of the well-known `sluice_*` roles is filled in.
    pub fn tcp_config(&self, user: &str, db: &str) -> tokio_postgres::Config {
        let mut cfg = tokio_postgres::Config::new();
        cfg.host("127.0.0.1")
            .port(self.port)
            .user(user)
            .dbname(db)
            .application_name("sluice-tests")
            .connect_timeout(Duration::from_secs(10));
        if let Some(pw) = password_for(user) {
            cfg.password(pw);
        }
        cfg
    }

    /// tokio-postgres config for a direct unix-socket connection (trust).
    pub fn socket_config(&self, user: &str, db: &str) -> tokio_postgres::Config {
        let mut cfg = tokio_postgres::Config::new();
        cfg.host_path(&self.sock_dir)
            .port(self.port)
            .user(user)
            .dbname(db)
            .application_name("sluice-tests")
            .connect_timeout(Duration::from_secs(10));
        cfg
    }
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("append to {}: {e}", path.display()))
}

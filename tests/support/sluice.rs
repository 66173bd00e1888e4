//! The real `sluice` binary as a child process, one per test, each with its own
//! temp dir (ini, userlist, logs, unix socket) and TCP port.

use super::{free_port, pg, read_lossy, tail, TempDir};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the ini for, and starts, a [`Sluice`].
///
/// Defaults (`[pgbouncer]`): `listen_addr = 127.0.0.1`, a free `listen_port`,
/// `unix_socket_dir = <tmp>`, `auth_type = md5`, `auth_file = <tmp>/userlist.txt`,
/// `logfile = <tmp>/sluice.log`, `admin_users = postgres`; `[databases]`:
/// `sluice_test = host=127.0.0.1 port=<pg port> dbname=sluice_test` (this starts
/// the shared PostgreSQL; opt out with [`no_default_database`](Self::no_default_database)).
///
/// The ini is laid out as `[databases]`, `[users]` (only if any), `[pgbouncer]`,
/// then the [`raw_ini`](Self::raw_ini) text verbatim.
///
/// Placeholders replaced in every value, raw text and `full_ini`: `@DIR@` (the
/// Sluice temp dir), `@PORT@` (its listen port), `@PG_PORT@`, `@PG_SOCKET_DIR@`
/// (the shared PostgreSQL's; using them starts it).
#[derive(Debug, Clone, Default)]
pub struct SluiceBuilder {
    settings: Vec<(String, String)>,
    unset: Vec<String>,
    databases: Vec<(String, String)>,
    users: Vec<(String, String)>,
    userlist: Vec<(String, String)>,
    raw: String,
    full_ini: Option<String>,
    no_default_db: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Listening sockets handed over as systemd does (descriptors 3 on).
    passed: Vec<std::os::fd::RawFd>,
}

impl SluiceBuilder {
    pub fn new() -> SluiceBuilder {
        SluiceBuilder::default()
    }

    /// A `[pgbouncer]` line `key = value`; replaces a default or an earlier
    /// setting of the same key.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        self.unset.retain(|k| !k.eq_ignore_ascii_case(key));
        match self
            .settings
            .iter_mut()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
        {
            Some(slot) => slot.1 = value.to_string(),
            None => self.settings.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// Omits a default `[pgbouncer]` setting (e.g. `auth_file`) from the ini.
    pub fn unset(mut self, key: &str) -> Self {
        self.settings.retain(|(k, _)| !k.eq_ignore_ascii_case(key));
        self.unset.push(key.to_string());
        self
    }

    /// A `[databases]` line `name = connstr`; replaces the default `sluice_test`
    /// entry if `name` is `sluice_test`.
    pub fn database(mut self, name: &str, connstr: &str) -> Self {
        self.databases.retain(|(n, _)| n != name);
        self.databases.push((name.to_string(), connstr.to_string()));
        self
    }

    /// Do not add the default `sluice_test` database (and do not start PostgreSQL
    /// for it).
    pub fn no_default_database(mut self) -> Self {
        self.no_default_db = true;
        self
    }

    /// A `[users]` line `name = line`.
    pub fn user(mut self, name: &str, line: &str) -> Self {
        self.users.push((name.to_string(), line.to_string()));
        self
    }

    /// An auth_file entry `"user" "secret"` (quotes are escaped by doubling).
    pub fn userlist(mut self, user: &str, secret: &str) -> Self {
        self.userlist.push((user.to_string(), secret.to_string()));
        self
    }

    /// Text appended verbatim at the end of the ini (after `[pgbouncer]`); start
    /// it with a section header if it is not meant for `[pgbouncer]`.
    pub fn raw_ini(mut self, text: &str) -> Self {
        self.raw.push_str(text);
        if !text.ends_with('\n') {
            self.raw.push('\n');
        }
        self
    }

    /// Replaces the whole generated ini with `text` (placeholders still apply;
    /// the userlist file is still written). Readiness is still judged by the
    /// default `listen_port`, so use `listen_port = @PORT@`.
    pub fn full_ini(mut self, text: &str) -> Self {
        self.full_ini = Some(text.to_string());
        self
    }

    /// An extra command-line argument, placed before the ini path.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// Hands these listening sockets (held open by the test) to Sluice as systemd's
    /// socket activation does: as descriptors 3, 4 ..., with `LISTEN_FDS` and
    /// `LISTEN_PID` (set by a `sh` that then execs Sluice, keeping its pid).
    pub fn passed_sockets(mut self, fds: &[std::os::fd::RawFd]) -> Self {
        assert!(fds.len() <= 8, "at most 8 passed sockets");
        self.passed = fds.to_vec();
        self
    }

    /// An environment variable for the child (e.g. `RUST_LOG`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    fn effective_settings(&self, dir: &Path, port: u16) -> Vec<(String, String)> {
        let defaults = [
            ("listen_addr", "127.0.0.1".to_string()),
            ("listen_port", port.to_string()),
            ("unix_socket_dir", dir.display().to_string()),
            ("auth_type", "md5".to_string()),
            ("auth_file", dir.join("userlist.txt").display().to_string()),
            ("logfile", dir.join("sluice.log").display().to_string()),
            ("admin_users", "postgres".to_string()),
        ];
        let mut out: Vec<(String, String)> = defaults
            .into_iter()
            .filter(|(k, _)| !self.unset.iter().any(|u| u.eq_ignore_ascii_case(k)))
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        for (k, v) in &self.settings {
            match out.iter_mut().find(|(ok, _)| ok.eq_ignore_ascii_case(k)) {
                Some(slot) => slot.1 = v.clone(),
                None => out.push((k.clone(), v.clone())),
            }
        }
        out
    }

    fn render(&self, dir: &Path, port: u16) -> (String, Vec<(String, String)>) {
        let settings = self.effective_settings(dir, port);
        let ini = match &self.full_ini {
            Some(text) => text.clone(),
            None => {
                let mut ini = String::from("[databases]\n");
                if !self.no_default_db && !self.databases.iter().any(|(n, _)| n == "sluice_test") {
                    ini.push_str(&format!(
                        "sluice_test = host=127.0.0.1 port={} dbname=sluice_test\n",
                        pg().port()
                    ));
                }
                for (n, c) in &self.databases {
                    ini.push_str(&format!("{n} = {c}\n"));
                }
                if !self.users.is_empty() {
                    ini.push_str("\n[users]\n");
                    for (n, l) in &self.users {
                        ini.push_str(&format!("{n} = {l}\n"));
                    }
                }
                ini.push_str("\n[pgbouncer]\n");
                for (k, v) in &settings {
                    ini.push_str(&format!("{k} = {v}\n"));
                }
                if !self.raw.is_empty() {
                    ini.push('\n');
                    ini.push_str(&self.raw);
                }
                ini
            }
        };
        (substitute(&ini, dir, port), settings)
    }

    fn userlist_text(&self, dir: &Path, port: u16) -> String {
        let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let text: String = self
            .userlist
            .iter()
            .map(|(u, s)| format!("{} {}\n", q(u), q(s)))
            .collect();
        substitute(&text, dir, port)
    }

    /// Writes the ini into a fresh temp dir and spawns `sluice [args] <ini>`.
    fn spawn(&self) -> Sluice {
        let dir = TempDir::new("sluice");
        let default_port = free_port();
        let (ini, settings) = self.render(dir.path(), default_port);
        let get = |key: &str| {
            settings
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| substitute(v, dir.path(), default_port))
        };
        let port = get("listen_port")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(default_port);
        let listen_addr = get("listen_addr").unwrap_or_default();
        let socket_dir = get("unix_socket_dir").map(PathBuf::from);
        let log_path = get("logfile").filter(|l| !l.is_empty()).map(PathBuf::from);

        let ini_path = dir.write("sluice.ini", &ini);
        dir.write(
            "userlist.txt",
            &self.userlist_text(dir.path(), default_port),
        );
        let stdout_path = dir.join("stdout.log");
        let stderr_path = dir.join("stderr.log");
        let open =
            |p: &Path| File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));

        let mut cmd = super::activation::command(env!("CARGO_BIN_EXE_sluice"), &self.passed);
        cmd.args(&self.args)
            .arg(&ini_path)
            .current_dir(dir.path())
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(open(&stdout_path))
            .stderr(open(&stderr_path));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {}: {e}", env!("CARGO_BIN_EXE_sluice")));
        Sluice {
            child,
            exited: None,
            port,
            listen_addr,
            socket_dir,
            ini_path,
            log_path,
            stdout_path,
            stderr_path,
            dir,
        }
    }

    /// Starts Sluice and waits (up to 10 s) until it listens on its TCP port (or,
    /// with an empty `listen_addr`, until its unix socket exists). Panics with
    /// the log tail and stderr if it exits or does not get ready in time. Retries
    /// with a new port if the port turns out to be taken.
    pub fn start(self) -> Sluice {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut s = self.spawn();
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                if let Some(status) = s.poll_exit() {
                    let out = s.diagnostics();
                    let port_taken = out.contains("in use") || out.contains("AddrInUse");
                    if port_taken && attempt < 4 && self.full_ini.is_none() {
                        break;
                    }
                    panic!("sluice exited during startup with {status}\n{out}");
                }
                if s.is_ready() {
                    return s;
                }
                if Instant::now() >= deadline {
                    panic!(
                        "sluice did not start listening on port {} within {START_TIMEOUT:?}\n{}",
                        s.port,
                        s.diagnostics()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Starts Sluice expecting it to exit by itself (e.g. a config error) within
    /// 10 s. Returns its exit status and stderr + stdout + logfile. Panics if it
    /// is still running after 10 s.
    pub fn start_expect_failure(self) -> (ExitStatus, String) {
        let mut s = self.spawn();
        match s.wait_exit(START_TIMEOUT) {
            Some(status) => {
                let text = format!(
                    "{}{}{}",
                    read_lossy(&s.stderr_path),
                    read_lossy(&s.stdout_path),
                    s.log()
                );
                (status, text)
            }
            None => panic!(
                "expected sluice to exit, but it is still running after {START_TIMEOUT:?}\n{}",
                s.diagnostics()
            ),
        }
    }
}

fn substitute(text: &str, dir: &Path, port: u16) -> String {
    let mut out = text
        .replace("@DIR@", &dir.display().to_string())
        .replace("@PORT@", &port.to_string());
    if out.contains("@PG_PORT@") {
        out = out.replace("@PG_PORT@", &pg().port().to_string());
    }
    if out.contains("@PG_SOCKET_DIR@") {
        out = out.replace("@PG_SOCKET_DIR@", &pg().socket_dir().display().to_string());
    }
    out
}

/// Ends a readiness probe's connection so that it no longer counts against
/// `max_client_conn` once this returns: a connection counts from its accept until
/// Sluice's task for it ends, and a test with room for one client, connecting right
/// after the probe, was refused while the probe's task (on another worker thread) had
/// not yet seen it close. A CancelRequest with a key no client has is answered by
/// closing the connection, and the count is given back before the socket closes, so
/// end-of-file here means it is given back.
fn leave_uncounted(mut probe: std::os::unix::net::UnixStream) {
    use std::io::{Read, Write};
    let cancel = super::raw::cancel_request(0, 0);
    let _ = probe.set_read_timeout(Some(Duration::from_secs(2)));
    if probe.write_all(&cancel).is_ok() {
        let _ = probe.read(&mut [0u8; 1]);
    }
}

/// Whether something listens on TCP `port` (any local address), judged from
/// /proc/net/tcp{,6} so that no client connection is made; falls back to a
/// connect attempt where /proc is unavailable.
fn tcp_listening(port: u16) -> bool {
    let needle = format!(":{port:04X}");
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        for line in text.lines().skip(1) {
            let mut fields = line.split_whitespace();
            let (Some(_sl), Some(local), Some(_remote), Some(state)) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if state == "0A" && local.ends_with(&needle) {
                return true;
            }
        }
    }
    if readable {
        return false;
    }
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// A running `sluice` child process. Killed (SIGKILL) and reaped on drop; its
/// temp dir is removed then (unless `SLUICE_KEEP_TMP=1`).
#[derive(Debug)]
pub struct Sluice {
    child: Child,
    exited: Option<ExitStatus>,
    port: u16,
    listen_addr: String,
    socket_dir: Option<PathBuf>,
    ini_path: PathBuf,
    log_path: Option<PathBuf>,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    dir: TempDir,
}

impl Sluice {
    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exited = Some(status);
            }
        }
        self.exited
    }

    fn is_ready(&self) -> bool {
        // A connect, not the file's existence: the file appears at bind(), a moment
        // before listen(), and a client in between is refused. Both listeners when
        // there are both: the UNIX socket is bound after the TCP ones, and a test
        // connecting through it as soon as TCP answered was once refused.
        let unix_dir = self
            .socket_dir
            .as_ref()
            .filter(|d| !d.as_os_str().is_empty());
        let unix_ready = || {
            unix_dir.is_some_and(|d| {
                super::unix_connect(d, self.port)
                    .map(leave_uncounted)
                    .is_ok()
            })
        };
        if self.listen_addr.trim().is_empty() {
            unix_ready()
        } else {
            tcp_listening(self.port) && (unix_dir.is_none() || unix_ready())
        }
    }

    /// Log tail + stderr + stdout, for panic messages.
    pub fn diagnostics(&self) -> String {
        format!(
            "--- ini ({}) ---\n{}\n--- logfile tail ---\n{}\n--- stderr tail ---\n{}\n--- stdout tail ---\n{}",
            self.ini_path.display(),
            read_lossy(&self.ini_path),
            tail(&self.log(), 40),
            tail(&self.stderr(), 40),
            tail(&read_lossy(&self.stdout_path), 20),
        )
    }

    /// TCP listen port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `unix_socket_dir` in effect (the temp dir by default).
    pub fn socket_dir(&self) -> &Path {
        self.socket_dir.as_deref().unwrap_or(self.dir.path())
    }

    /// Sluice's own temp dir (ini, userlist.txt, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn ini_path(&self) -> &Path {
        &self.ini_path
    }

    /// Path of the auth_file written by the builder (`<dir>/userlist.txt`).
    pub fn userlist_path(&self) -> PathBuf {
        self.dir.join("userlist.txt")
    }

    /// Contents of the logfile so far (empty if none configured / not written).
    pub fn log(&self) -> String {
        self.log_path.as_deref().map(read_lossy).unwrap_or_default()
    }

    /// Contents of the child's stderr so far.
    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr_path)
    }

    /// Contents of the child's stdout so far.
    pub fn stdout(&self) -> String {
        read_lossy(&self.stdout_path)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (e.g. `libc::SIGHUP`, `libc::SIGINT`, `libc::SIGTERM`) unless
    /// the process has already been reaped.
    pub fn signal(&mut self, sig: i32) {
        if self.poll_exit().is_some() {
            return;
        }
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own, not yet reaped, child.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}) failed: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Rewrites the ini (e.g. before SIGHUP / `RELOAD`).
    pub fn rewrite_ini(&self, text: &str) {
        std::fs::write(&self.ini_path, text)
            .unwrap_or_else(|e| panic!("write {}: {e}", self.ini_path.display()));
    }

    /// Replaces `from` with `to` in the ini (`from` must be there), sends SIGHUP and
    /// waits for the reload to be logged. Panics with the diagnostics if it is not.
    pub fn reload_replacing(&mut self, from: &str, to: &str) {
        let ini = read_lossy(&self.ini_path);
        assert!(ini.contains(from), "{from:?} not in the ini:\n{ini}");
        self.rewrite_ini(&ini.replace(from, to));
        let before = self.log().matches("config reloaded").count();
        self.signal(libc::SIGHUP);
        let reloaded = crate::support::wait_until(Duration::from_secs(5), || {
            self.log().matches("config reloaded").count() > before
        });
        assert!(reloaded, "no reload logged\n{}", self.diagnostics());
    }

    /// Waits up to `timeout` for the process to exit; `None` if still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.poll_exit() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.poll_exit().is_none()
    }

    /// tokio-postgres config for a TCP connection to Sluice. An empty `password`
    /// means none is set.
    pub fn config(&self, user: &str, password: &str, db: &str) -> tokio_postgres::Config {
        let mut cfg = self.login_config(user, password, db);
        cfg.host("127.0.0.1");
        cfg
    }

    /// Port, user, database and password, but no host yet.
    pub fn login_config(&self, user: &str, password: &str, db: &str) -> tokio_postgres::Config {
        let mut cfg = tokio_postgres::Config::new();
        cfg.port(self.port)
            .user(user)
            .dbname(db)
            .connect_timeout(Duration::from_secs(10));
        if !password.is_empty() {
            cfg.password(password);
        }
        cfg
    }

    /// tokio-postgres config for a unix-socket connection to Sluice.
    pub fn socket_config(&self, user: &str, password: &str, db: &str) -> tokio_postgres::Config {
        // Not `config` plus a path: tokio-postgres tries its hosts in order, so the
        // TCP one would always be used.
        let mut cfg = self.login_config(user, password, db);
        cfg.host_path(self.socket_dir());
        cfg
    }

    /// A [`psql_cmd`](super::psql_cmd) against Sluice over TCP; `PGPASSWORD` set
    /// if `password` is non-empty.
    pub fn psql(&self, user: &str, password: &str, db: &str) -> Command {
        let mut cmd = super::psql_cmd(self.port, "127.0.0.1", user, db);
        if !password.is_empty() {
            cmd.env("PGPASSWORD", password);
        }
        cmd
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "sluice (pid {}) diagnostics at failure:\n{}",
                self.child.id(),
                self.diagnostics()
            );
        }
    }
}

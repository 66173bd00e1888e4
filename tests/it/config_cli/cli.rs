//! The command line, against the real `sluice` binary: `-V`, `-h`, a missing config,
//! daemon mode (`-d`: pidfile, logfile, signals to the daemon), `-q`, `-v`, `-u`.

use super::{base_ini, run_sluice, text};
use crate::support::{self, pg, wait_until, SluiceBuilder, TempDir};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[test]
fn version_flags_print_the_version() {
    let want = format!("Sluice {}", env!("CARGO_PKG_VERSION"));
    for flag in ["-V", "--version"] {
        let out = run_sluice(&[flag]);
        assert!(out.status.success(), "{flag}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), want, "{flag}");
    }
}

#[test]
fn help_prints_usage() {
    for flag in ["-h", "--help"] {
        let out = run_sluice(&[flag]);
        assert!(out.status.success(), "{flag}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.contains("Usage"), "{flag}: {stdout}");
        for opt in ["-d", "-q", "-R", "-v", "-u", "-V"] {
            assert!(stdout.contains(opt), "{flag} lacks {opt}: {stdout}");
        }
    }
}

/// `-R` (PgBouncer's deprecated online restart) is taken, so scripts that pass it
/// still start Sluice, which says it starts normally.
#[test]
fn reboot_flag_starts_normally_with_a_warning() {
    for flag in ["-R", "--reboot"] {
        let s = SluiceBuilder::new().arg(flag).start();
        assert!(
            s.log().contains("online restart (-R) is not supported"),
            "{}",
            s.log()
        );
    }
}

#[test]
fn no_config_is_an_error() {
    let out = run_sluice(&[]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.to_lowercase().contains("config"), "{stderr}");
}

#[test]
fn daemon_without_pidfile_or_logfile_is_refused() {
    let dir = TempDir::new("sluice-cli");
    let base = base_ini(&dir);
    for (extra, what) in [
        (String::new(), "pidfile"),
        (
            format!("logfile = {}\n", dir.join("l.log").display()),
            "pidfile",
        ),
        (
            format!("pidfile = {}\n", dir.join("p.pid").display()),
            "logfile",
        ),
    ] {
        let path = dir.write("sluice.ini", &(base.clone() + &extra));
        let out = run_sluice(&["-d", path.to_str().expect("utf-8 path")]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{extra:?}: daemonized anyway");
        assert!(
            stderr.contains(what),
            "{extra:?}: no mention of {what}: {stderr}"
        );
        assert!(!dir.join("p.pid").exists(), "a pidfile was written");
    }
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    // A daemon reparented to a PID 1 that does not reap leaves a zombie behind.
    let stat = support::read_lossy(Path::new(&format!("/proc/{pid}/stat")));
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    state != Some("Z")
}

/// SIGKILLs a daemon left behind by a failing test.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0 > 0 && alive(self.0) {
            // SAFETY: plain kill(2) of the daemon this test started.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

/// Starts `sluice -d` on a fresh ini in `dir`; returns (port, pidfile, daemon guard).
fn start_daemon(dir: &TempDir) -> (u16, PathBuf, KillOnDrop) {
    let port = support::free_port();
    let pidfile = dir.join("sluice.pid");
    let users = dir.write(
        "userlist.txt",
        &format!("\"{}\" \"{}\"\n", support::MD5_USER, support::MD5_PASSWORD),
    );
    let ini = format!(
        "[databases]\n{} = host=127.0.0.1 port={} dbname={}\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir = {}\n\
         auth_file = {}\npidfile = {}\nlogfile = {}\n",
        support::TEST_DB,
        pg().port(),
        support::TEST_DB,
        dir.path().display(),
        users.display(),
        pidfile.display(),
        dir.join("sluice.log").display()
    );
    let ini = dir.write("sluice.ini", &ini);
    let started = Instant::now();
    let out = run_sluice(&["-d", ini.to_str().expect("utf-8 path")]);
    assert!(
        out.status.success(),
        "sluice -d failed: {}",
        text(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "sluice -d took {:?} to return",
        started.elapsed()
    );
    let mut pid = 0;
    let found = wait_until(Duration::from_secs(10), || {
        pid = support::read_lossy(&pidfile).trim().parse().unwrap_or(0);
        pid > 0 && alive(pid)
    });
    let log = support::read_lossy(&dir.join("sluice.log"));
    assert!(found, "no live pid in {}\nlog:\n{log}", pidfile.display());
    (port, pidfile, KillOnDrop(pid))
}

async fn daemon_serves_then_stops_on(sig: i32) {
    let dir = TempDir::new("sluice-daemon");
    let (port, pidfile, guard) = start_daemon(&dir);
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1")
        .port(port)
        .user(support::MD5_USER)
        .password(support::MD5_PASSWORD)
        .dbname(support::TEST_DB)
        .connect_timeout(Duration::from_secs(10));
    let c = support::connect(&cfg).await;
    let v: i32 = c.query_one("SELECT 11", &[]).await.expect("query").get(0);
    assert_eq!(v, 11);
    drop(c);
    let log = support::read_lossy(&dir.join("sluice.log"));
    assert!(log.contains("login attempt"), "logfile not written:\n{log}");
    // Lines logged by the daemon carry its own pid, not the exited parent's.
    let tag = format!(" UTC [{}] LOG ", guard.0);
    let login = log.lines().find(|l| l.contains("login attempt"));
    assert!(
        login.is_some_and(|l| l.contains(&tag)),
        "{tag:?} missing:\n{log}"
    );
    // SAFETY: plain kill(2) of the daemon this test started.
    assert_eq!(unsafe { libc::kill(guard.0, sig) }, 0);
    let gone = wait_until(Duration::from_secs(10), || !alive(guard.0));
    let log = support::read_lossy(&dir.join("sluice.log"));
    assert!(gone, "daemon still running after signal {sig}\n{log}");
    assert!(
        wait_until(Duration::from_secs(2), || !pidfile.exists()),
        "pidfile not removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_mode_serves_and_stops_on_sigterm() {
    daemon_serves_then_stops_on(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_mode_serves_and_stops_on_sigquit() {
    daemon_serves_then_stops_on(libc::SIGQUIT).await;
}

/// Log lines start `YYYY-MM-DD HH:MM:SS.mmm UTC [pid] LEVEL`.
fn is_log_line(line: &str) -> bool {
    line.contains(" UTC [") && (line.contains("] LOG ") || line.contains("] WARNING "))
}

#[test]
fn quiet_keeps_stderr_free_but_logfile_gets_lines() {
    let mut s = SluiceBuilder::new().no_default_database().arg("-q").start();
    assert!(
        wait_until(Duration::from_secs(5), || s.log().lines().any(is_log_line)),
        "logfile empty\n{}",
        s.diagnostics()
    );
    s.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(5), || s.log().contains("SIGHUP")),
        "{}",
        s.diagnostics()
    );
    let stderr = s.stderr();
    assert!(
        !stderr.lines().any(is_log_line),
        "log lines on stderr with -q:\n{stderr}"
    );
}

#[test]
fn verbose_enables_debug_lines() {
    let plain = SluiceBuilder::new().no_default_database().start();
    let verbose = SluiceBuilder::new().no_default_database().arg("-v").start();
    let debug_line = |t: &str| {
        t.lines()
            .any(|l| l.contains(" UTC [") && l.contains("] DEBUG "))
    };
    // A client that connects and leaves without a word is logged at DEBUG only.
    for s in [&plain, &verbose] {
        drop(std::net::TcpStream::connect(("127.0.0.1", s.port())).expect("tcp connect"));
    }
    assert!(
        wait_until(Duration::from_secs(5), || debug_line(&verbose.log())
            && debug_line(&verbose.stderr())),
        "no DEBUG line with -v\n{}",
        verbose.diagnostics()
    );
    assert!(
        !debug_line(&plain.log()) && !debug_line(&plain.stderr()),
        "DEBUG line without -v\n{}",
        plain.diagnostics()
    );
}

#[test]
fn verbose_setting_in_the_ini_enables_debug_lines() {
    let s = SluiceBuilder::new()
        .no_default_database()
        .setting("verbose", "1")
        .start();
    let ok = wait_until(Duration::from_secs(5), || {
        s.log().lines().any(|l| l.contains("] DEBUG "))
    });
    assert!(ok, "no DEBUG line with verbose = 1\n{}", s.diagnostics());
}

#[test]
fn pidfile_is_written_and_removed_in_the_foreground() {
    let mut s = SluiceBuilder::new()
        .no_default_database()
        .setting("pidfile", "@DIR@/fg.pid")
        .start();
    let pidfile = s.dir().join("fg.pid");
    let pid = s.pid().to_string();
    assert!(
        wait_until(Duration::from_secs(5), || support::read_lossy(&pidfile)
            .trim()
            == pid),
        "pidfile does not hold {pid}\n{}",
        s.diagnostics()
    );
    s.signal(libc::SIGTERM);
    assert!(
        s.wait_exit(Duration::from_secs(10)).is_some(),
        "still running"
    );
    assert!(!pidfile.exists(), "pidfile left behind");
}

#[test]
fn pidfile_of_a_live_process_refuses_start() {
    let dir = TempDir::new("sluice-cli");
    // The test process itself is the live owner of this pidfile.
    let pidfile = dir.write("busy.pid", &format!("{}\n", std::process::id()));
    let ini = base_ini(&dir) + &format!("pidfile = {}\n", pidfile.display());
    let path = dir.write("sluice.ini", &ini);
    let out = run_sluice(&[path.to_str().expect("utf-8 path")]);
    assert!(
        !out.status.success(),
        "started despite a live pidfile owner"
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("pidfile"), "{stderr}");
    // The other process's pidfile must survive.
    assert_eq!(
        support::read_lossy(&pidfile).trim(),
        std::process::id().to_string()
    );
}

#[test]
fn unknown_os_user_is_refused() {
    let dir = TempDir::new("sluice-cli");
    let path = dir.write("sluice.ini", &base_ini(&dir));
    let out = run_sluice(&[
        "-u",
        "no_such_user_sluice",
        path.to_str().expect("utf-8 path"),
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no_such_user_sluice"), "{stderr}");
}

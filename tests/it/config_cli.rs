//! Configuration files against the real `sluice` binary: config errors name
//! `file:line` and stop startup, unimplemented settings only warn, `%include` and
//! comments work. The command line is tested in [`cli`].

mod cli;

use crate::support::{self, pg, run_bounded, wait_until, SluiceBuilder, TempDir};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Runs `sluice <args>` to completion (it must exit by itself within 10 s).
fn run_sluice(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_bounded(&mut cmd, None, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("sluice {args:?} did not exit within 10 s"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A `[pgbouncer]` section that would start fine on its own (its own free port,
/// socket dir and an empty auth file), so an error comes only from the extra lines.
fn base_ini(dir: &TempDir) -> String {
    let users = dir.write("userlist.txt", "");
    format!(
        "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {}\nunix_socket_dir = {}\n\
         auth_type = md5\nauth_file = {}\n",
        support::free_port(),
        dir.path().display(),
        users.display()
    )
}

/// Writes `ini` (whose 1-based line `line` is the bad one), runs Sluice on it and
/// checks it refuses to start with `<ini>:<line>: <message...>` on stderr.
fn expect_config_error(dir: &TempDir, ini: &str, at: (&Path, usize), message: &str) {
    let path = dir.write("sluice.ini", ini);
    let out = run_sluice(&[path.to_str().expect("utf-8 path")]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "started anyway: {stderr}");
    let want = format!("{}:{}: {message}", at.0.display(), at.1);
    assert!(
        stderr.contains(&want),
        "stderr lacks {want:?}:\n{stderr}\n(ini:\n{ini})"
    );
}

/// Line number (1-based) of the first line of `ini` equal to `needle`.
fn line_of(ini: &str, needle: &str) -> usize {
    ini.lines()
        .position(|l| l == needle)
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("{needle:?} not in ini"))
}

#[test]
fn unknown_setting_is_refused() {
    let dir = TempDir::new("sluice-cfg");
    let ini = base_ini(&dir) + "lsten_port = 6432\n";
    let at = (dir.join("sluice.ini"), line_of(&ini, "lsten_port = 6432"));
    expect_config_error(&dir, &ini, (&at.0, at.1), "unknown setting \"lsten_port\"");
}

#[test]
fn malformed_line_is_refused() {
    let dir = TempDir::new("sluice-cfg");
    let ini = base_ini(&dir) + "max_client_conn 10\n";
    let at = (dir.join("sluice.ini"), line_of(&ini, "max_client_conn 10"));
    expect_config_error(&dir, &ini, (&at.0, at.1), "syntax error");
}

#[test]
fn bad_value_is_refused() {
    let dir = TempDir::new("sluice-cfg");
    // A later listen_port overrides the good one, so this is the value in effect.
    let ini = base_ini(&dir) + "listen_port = abc\n";
    let at = (dir.join("sluice.ini"), line_of(&ini, "listen_port = abc"));
    expect_config_error(
        &dir,
        &ini,
        (&at.0, at.1),
        "invalid value \"abc\" for listen_port",
    );
}

#[test]
fn unknown_database_parameter_is_refused() {
    let dir = TempDir::new("sluice-cfg");
    let ini = base_ini(&dir) + "[databases]\nappdb = host=127.0.0.1 hots=x\n";
    let at = (
        dir.join("sluice.ini"),
        line_of(&ini, "appdb = host=127.0.0.1 hots=x"),
    );
    expect_config_error(
        &dir,
        &ini,
        (&at.0, at.1),
        "unrecognized connection parameter \"hots\" in database \"appdb\"",
    );
}

#[test]
fn broken_userlist_line_is_refused() {
    let dir = TempDir::new("sluice-cfg");
    let ini = base_ini(&dir);
    // Replaces the empty userlist base_ini wrote; line 2 lacks the quotes.
    dir.write("userlist.txt", "\"alice\" \"secret\"\nbob secret\n");
    let path = dir.write("sluice.ini", &ini);
    let out = run_sluice(&[path.to_str().expect("utf-8 path")]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "started anyway: {stderr}");
    let want = format!(
        "{}:2: broken auth file line",
        dir.join("userlist.txt").display()
    );
    assert!(stderr.contains(&want), "stderr lacks {want:?}:\n{stderr}");
}

#[test]
fn missing_include_is_refused_naming_the_include_line() {
    let dir = TempDir::new("sluice-cfg");
    let ini = base_ini(&dir) + "%include no-such-file.ini\n";
    let at = (
        dir.join("sluice.ini"),
        line_of(&ini, "%include no-such-file.ini"),
    );
    // Relative includes resolve against the including file's directory.
    let want = format!(
        "%include {}: cannot read",
        dir.join("no-such-file.ini").display()
    );
    expect_config_error(&dir, &ini, (&at.0, at.1), &want);
}

#[test]
fn error_in_included_file_names_that_file() {
    let dir = TempDir::new("sluice-cfg");
    let inc = dir.write("extra.ini", "; settings\nmax_client_conn = lots\n");
    let ini = base_ini(&dir) + "%include extra.ini\n";
    expect_config_error(
        &dir,
        &ini,
        (&inc, 2),
        "invalid value \"lots\" for max_client_conn",
    );
}

#[test]
fn missing_config_file_is_refused() {
    let dir = TempDir::new("sluice-cfg");
    let path = dir.join("nope.ini");
    let out = run_sluice(&[path.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{}: cannot read", path.display())),
        "{stderr}"
    );
}

/// Polls the logfile (and stderr) until `needle` shows up in both.
fn wait_log_and_stderr(s: &support::Sluice, needle: &str) {
    let ok = wait_until(Duration::from_secs(5), || {
        s.log().contains(needle) && s.stderr().contains(needle)
    });
    assert!(ok, "{needle:?} not logged\n{}", s.diagnostics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_settings_start_with_a_warning() {
    let s = SluiceBuilder::new()
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .setting("sbuf_loopcnt", "7")
        .setting("client_tls_dheparams", "legacy")
        .start();
    wait_log_and_stderr(&s, "WARNING");
    wait_log_and_stderr(&s, "setting \"sbuf_loopcnt\" is not implemented");
    wait_log_and_stderr(&s, "setting \"client_tls_dheparams\" is not implemented");
    assert!(s.log().contains("sluice.ini:"), "{}", s.log());
    // It really serves despite the warnings.
    let c = support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB))
        .await;
    let v: i32 = c.query_one("SELECT 5", &[]).await.expect("query").get(0);
    assert_eq!(v, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_brings_in_databases() {
    let extra = TempDir::new("sluice-incl");
    extra.write(
        "dbs.ini",
        &format!(
            "; databases live in their own file\n[databases]\nincluded_db = host=127.0.0.1 \
             port={} dbname={}\n",
            pg().port(),
            support::TEST_DB
        ),
    );
    let s = SluiceBuilder::new()
        .no_default_database()
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .raw_ini(&format!("%include {}\n", extra.join("dbs.ini").display()))
        .start();
    let c =
        support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, "included_db")).await;
    let db: String = c
        .query_one("SELECT current_database()::text", &[])
        .await
        .expect("query")
        .get(0);
    assert_eq!(db, support::TEST_DB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semicolon_and_hash_comments_are_ignored() {
    // Each commented line would be an error if it were read as a setting.
    let s = SluiceBuilder::new()
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .raw_ini(
            "; listen_port = abc\n# bogus_setting = 1\n   ; indented comment\n\
             \t# tab-indented comment\n[databases] ; comment after a header\n\
             ;broken = hots=x\n",
        )
        .start();
    let c = support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB))
        .await;
    let v: i32 = c.query_one("SELECT 7", &[]).await.expect("query").get(0);
    assert_eq!(v, 7);
    assert!(!s.log().contains("WARNING"), "{}", s.log());
}

/// `syslog = 1`: log lines also reach the syslog daemon's socket (here the test's own,
/// named by `SLUICE_SYSLOG_SOCKET`) as `<PRI>ident[pid]: LEVEL message`, while the
/// log file keeps them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syslog_gets_the_log_lines() {
    let dir = TempDir::new("sluice-syslog");
    let path = dir.join("log.sock");
    let daemon = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the socket");
    daemon
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let s = SluiceBuilder::new()
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .setting("syslog", "1")
        .setting("syslog_ident", "sluicetest")
        .setting("syslog_facility", "local3")
        .env("SLUICE_SYSLOG_SOCKET", path.to_str().expect("utf-8 path"))
        .start();
    let c = support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB))
        .await;
    c.simple_query("SELECT 1").await.expect("query");

    // local3 (19) * 8 + info (6).
    let want = format!("<158>sluicetest[{}]: LOG C-", s.pid());
    let mut seen = Vec::new();
    let found = wait_until(Duration::from_secs(10), || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = daemon.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        seen.iter()
            .any(|l| l.starts_with(&want) && l.contains("login attempt"))
    });
    assert!(found, "no syslog line like {want:?}: {seen:#?}");
    assert!(s.log().contains("login attempt"), "{}", s.log());
}

//! TLS towards clients (`client_tls_*`), with libpq's own TLS (psql, pgbench) as the
//! client: the modes, certificate checks both ways, the console's `tls` column, the
//! log line, reloads, config errors, and a handshake that fails.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

use crate::admin::{psql_run, PsqlOut, ADMIN, ADMIN_PW};
use crate::support::raw::{self, RawConn};
use crate::support::{self, wait_until, Sluice, SluiceBuilder, TempDir};

const T: Duration = Duration::from_secs(30);

/// A CA, a server certificate for `localhost`/127.0.0.1 and a client certificate
/// for [`support::MD5_USER`], all signed by the CA; a second CA, and a client
/// certificate it signed.
pub(crate) struct Certs {
    dir: TempDir,
}

impl Certs {
    pub(crate) fn new() -> Certs {
        let dir = TempDir::new("sluice-tls");
        let ca = |name: &str| {
            let key = KeyPair::generate().expect("key");
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            let cert = p.self_signed(&key).expect("CA certificate");
            (cert, key)
        };
        let (ca_cert, ca_key) = ca("Sluice test CA");
        let (other_ca, other_key) = ca("Another CA");
        let leaf = |names: Vec<String>, cn: &str, issuer: (&rcgen::Certificate, &KeyPair)| {
            let key = KeyPair::generate().expect("key");
            let mut p = CertificateParams::new(names).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            let cert = p.signed_by(&key, issuer.0, issuer.1).expect("certificate");
            (cert.pem(), key.serialize_pem())
        };
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let ours = (&ca_cert, &ca_key);
        for (name, (cert, key)) in [
            ("server", leaf(names, "localhost", ours)),
            ("client", leaf(Vec::new(), support::MD5_USER, ours)),
            (
                "stranger",
                leaf(Vec::new(), support::MD5_USER, (&other_ca, &other_key)),
            ),
            // For PostgreSQL (tls_server.rs): named for localhost only, and a client
            // certificate for `cert` authentication as sluice_plain.
            (
                "localhost",
                leaf(vec!["localhost".into()], "localhost", ours),
            ),
            ("plain", leaf(Vec::new(), support::PLAIN_USER, ours)),
        ] {
            dir.write(&format!("{name}.pem"), &cert);
            write_key(&dir, &format!("{name}.key"), &key);
        }
        dir.write("ca.pem", &ca_cert.pem());
        dir.write("other-ca.pem", &other_ca.pem());
        Certs { dir }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// A file's contents.
    pub(crate) fn pem(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).expect("certificate file")
    }

    /// A Sluice with `client_tls_sslmode = mode` that trusts [`support::TRUST_USER`].
    pub(crate) fn trusting(&self, mode: &str) -> SluiceBuilder {
        self.sluice(mode)
            .setting("auth_type", "trust")
            .userlist(support::TRUST_USER, "")
    }

    /// A Sluice with md5 users and `client_tls_sslmode = mode`.
    pub(crate) fn sluice(&self, mode: &str) -> SluiceBuilder {
        SluiceBuilder::new()
            .setting("client_tls_sslmode", mode)
            .setting("client_tls_key_file", &self.path("server.key"))
            .setting("client_tls_cert_file", &self.path("server.pem"))
            .userlist(support::MD5_USER, support::MD5_PASSWORD)
            .userlist(ADMIN, ADMIN_PW)
    }
}

/// libpq refuses a key file others can read.
fn write_key(dir: &TempDir, name: &str, pem: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.write(name, pem);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

/// psql over TCP to `db` as the md5 user, with libpq's TLS settings in `env`
/// (`PGSSLMODE`, ...). Host `localhost` (for verify-full) dialled at 127.0.0.1.
pub(crate) fn psql_tls(s: &Sluice, db: &str, env: &[(&str, &str)], sql: &str) -> (bool, String) {
    let (user, pw) = match db {
        "pgbouncer" => (ADMIN, ADMIN_PW),
        _ => (support::MD5_USER, support::MD5_PASSWORD),
    };
    let mut cmd = support::psql_cmd_pw(s.port(), "localhost", user, db, pw);
    cmd.env("PGHOSTADDR", "127.0.0.1")
        // No client certificate unless a test names one (not ~/.postgresql's).
        .env("PGSSLCERT", "/nonexistent/sluice-test.crt")
        .env("PGSSLKEY", "/nonexistent/sluice-test.key");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["-c", sql]);
    let out = support::run_bounded(&mut cmd, None, T).expect("psql hung");
    support::outcome(&out)
}

/// psql as the md5 user over TCP with `sslmode=require` and no client certificate,
/// for tests that drive it themselves.
pub(crate) fn psql_require(s: &Sluice) -> std::process::Command {
    let mut cmd = support::psql_cmd_pw(
        s.port(),
        "127.0.0.1",
        support::MD5_USER,
        support::TEST_DB,
        support::MD5_PASSWORD,
    );
    cmd.env("PGSSLMODE", "require")
        .env("PGSSLCERT", "/nonexistent/sluice-test.crt")
        .env("PGSSLKEY", "/nonexistent/sluice-test.key");
    cmd
}

/// What psql says when `SELECT 1` with `env` is refused (it fails if it gets in).
pub(crate) fn refused(s: &Sluice, env: &[(&str, &str)]) -> String {
    let (ok, text) = psql_tls(s, support::TEST_DB, env, "SELECT 1");
    assert!(!ok, "got in with {env:?}");
    text
}

/// psql's `\conninfo`, which says whether and how the connection is encrypted.
fn conninfo(s: &Sluice, env: &[(&str, &str)]) -> String {
    let (ok, text) = psql_tls(s, support::TEST_DB, env, "\\conninfo");
    assert!(ok, "{text}\n{}", s.diagnostics());
    text
}

#[test]
fn require_takes_tls_clients_and_refuses_plaintext_ones_on_tcp_only() {
    let certs = Certs::new();
    let s = certs.sluice("require").start();
    let info = conninfo(&s, &[("PGSSLMODE", "require")]);
    assert!(info.contains("SSL connection (protocol: TLSv1.3"), "{info}");
    let (ok, text) = psql_tls(
        &s,
        support::TEST_DB,
        &[("PGSSLMODE", "require")],
        "SELECT current_user || ' ' || 6 * 7",
    );
    assert!(ok, "{text}");
    assert_eq!(text, format!("{} 42", support::MD5_USER));
    // The client checks the server's certificate against the CA, and its name.
    let ca = certs.path("ca.pem");
    let verify = [("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", ca.as_str())];
    assert!(conninfo(&s, &verify).contains("SSL connection"));
    let other = certs.path("other-ca.pem");
    let text = refused(
        &s,
        &[
            ("PGSSLMODE", "verify-ca"),
            ("PGSSLROOTCERT", other.as_str()),
        ],
    );
    assert!(text.contains("certificate verify failed"), "{text}");

    // Plaintext over TCP is refused with PgBouncer's words.
    let text = refused(&s, &[("PGSSLMODE", "disable")]);
    assert!(text.contains("SSL required"), "{text}");
    // The UNIX socket needs no TLS, as in PgBouncer.
    let sock = s.socket_dir().display().to_string();
    let mut cmd = support::psql_cmd_pw(
        s.port(),
        &sock,
        support::MD5_USER,
        support::TEST_DB,
        support::MD5_PASSWORD,
    );
    cmd.args(["-c", "SELECT 7"]);
    let out = support::run_bounded(&mut cmd, None, T).expect("psql hung");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "7");

    let log = s.log();
    assert!(
        log.contains(&format!(
            "login attempt: db={} user={} tls=TLSv1.3/TLS_",
            support::TEST_DB,
            support::MD5_USER
        )),
        "{log}"
    );
    assert!(log.contains("tls=no"), "{log}");
}

#[test]
fn prefer_lets_both_in_and_the_console_shows_tls() {
    let certs = Certs::new();
    let s = certs.sluice("prefer").start();
    assert!(conninfo(&s, &[("PGSSLMODE", "prefer")]).contains("SSL connection"));
    assert!(!conninfo(&s, &[("PGSSLMODE", "disable")]).contains("SSL"));
    // TLS 1.2 only, when the client asks for no more.
    let info = conninfo(
        &s,
        &[
            ("PGSSLMODE", "require"),
            ("PGSSLMAXPROTOCOLVERSION", "TLSv1.2"),
        ],
    );
    assert!(info.contains("protocol: TLSv1.2"), "{info}");

    // SHOW CLIENTS over TLS: the console client's own row has the tls column.
    let (ok, text) = psql_tls(&s, "pgbouncer", &[("PGSSLMODE", "require")], "SHOW CLIENTS");
    assert!(ok, "{text}\n{}", s.diagnostics());
    let tls_cells: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split('|').find(|c| c.starts_with("TLSv1.3/TLS_")))
        .collect();
    assert_eq!(tls_cells.len(), 1, "{text}");
    assert!(tls_cells[0].contains("/ECDH="), "{text}");
    // A plaintext console client's row has it empty.
    let plain = psql_console_plain(&s, "SHOW CLIENTS");
    assert!(plain.ok, "{}", plain.stderr);
    let col = plain
        .header
        .iter()
        .position(|h| h == "tls")
        .expect("tls column");
    assert_eq!(plain.rows.len(), 1, "{:?}", plain.rows);
    assert_eq!(plain.rows[0][col], "");
}

/// The console over plaintext TCP, in the form [`psql_run`] splits (header line,
/// unaligned rows split by U+001F).
fn psql_console_plain(s: &Sluice, sql: &str) -> PsqlOut {
    let mut cmd = Command::new("psql");
    support::clear_pg_env(&mut cmd);
    cmd.env("PGCONNECT_TIMEOUT", "10")
        .env("PGPASSWORD", ADMIN_PW)
        .env("PGSSLMODE", "disable")
        .args([
            "-X",
            "-A",
            "-F",
            "\u{1f}",
            "-P",
            "footer=off",
            "-h",
            "127.0.0.1",
        ])
        .args([
            "-p",
            &s.port().to_string(),
            "-U",
            ADMIN,
            "-d",
            "pgbouncer",
            "-c",
            sql,
        ]);
    psql_run(cmd)
}

/// The console lets in user `pgbouncer` without a password when it is Sluice's own
/// OS user on the UNIX socket. A TLS client's stream is a socket pair whose peer
/// is Sluice itself: that must not count.
#[test]
fn a_tls_client_is_not_taken_for_the_os_user() {
    let certs = Certs::new();
    let s = certs.sluice("require").start();
    let mut cmd = support::psql_cmd(s.port(), "127.0.0.1", "pgbouncer", "pgbouncer");
    cmd.env("PGSSLMODE", "require").args(["-c", "SHOW VERSION"]);
    let out = support::run_bounded(&mut cmd, None, T).expect("psql hung");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "logged in without a password");
    assert!(err.contains("no password supplied"), "{err}");
    // The same user over the UNIX socket is let in.
    let sock = s.socket_dir().display().to_string();
    let mut cmd = support::psql_cmd(s.port(), &sock, "pgbouncer", "pgbouncer");
    cmd.args(["-c", "SHOW VERSION"]);
    let out = support::run_bounded(&mut cmd, None, T).expect("psql hung");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Client certificates checked against `client_tls_ca_file`: required from
/// `verify-ca` on; optional below it, but one that is offered must verify.
#[test]
fn client_certificates_are_checked_against_the_ca() {
    let certs = Certs::new();
    let (ours, ours_key) = (certs.path("client.pem"), certs.path("client.key"));
    let (other, other_key) = (certs.path("stranger.pem"), certs.path("stranger.key"));
    let ours = [
        ("PGSSLMODE", "require"),
        ("PGSSLCERT", ours.as_str()),
        ("PGSSLKEY", ours_key.as_str()),
    ];
    let stranger = [
        ("PGSSLMODE", "require"),
        ("PGSSLCERT", other.as_str()),
        ("PGSSLKEY", other_key.as_str()),
    ];
    for mode in ["verify-ca", "prefer"] {
        let s = certs
            .sluice(mode)
            .setting("client_tls_ca_file", &certs.path("ca.pem"))
            .start();
        assert!(conninfo(&s, &ours).contains("SSL connection"), "{mode}");
        let none = [("PGSSLMODE", "require")];
        if mode == "verify-ca" {
            let text = refused(&s, &none);
            assert!(text.contains("certificate required"), "{text}");
            assert!(
                wait_until(Duration::from_secs(5), || s
                    .log()
                    .contains("TLS handshake failed")),
                "{}",
                s.diagnostics()
            );
        } else {
            assert!(conninfo(&s, &none).contains("SSL connection"), "{mode}");
        }
        // A certificate from a CA Sluice does not know, in either mode.
        let text = refused(&s, &stranger);
        assert!(text.contains("unknown ca"), "{mode}: {text}");
    }
}

/// libpq sends its CancelRequest on a new connection without TLS; `require` must
/// still take it (as PgBouncer does), so psql's Ctrl-C cancels a query over TLS.
#[test]
fn a_tls_client_s_query_is_cancelled_under_require() {
    let certs = Certs::new();
    let s = certs.sluice("require").start();
    let mut cmd = psql_require(&s);
    cmd.args(["-c", "SELECT pg_sleep(60)"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("psql");
    let pid = child.id() as libc::pid_t;
    // Cancel once the query runs in PostgreSQL.
    let running = wait_until(Duration::from_secs(20), || {
        support::pg()
            .psql("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'")
            .trim()
            == "1"
    });
    assert!(running, "the query never ran\n{}", s.diagnostics());
    // SAFETY: kill has no memory preconditions; pid is our own child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let out = match waited.recv_timeout(T) {
        Ok(out) => out.expect("psql"),
        Err(_) => {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("psql was not cancelled\n{}", s.diagnostics());
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("canceling statement due to user request"),
        "{err}\n{}",
        s.diagnostics()
    );
}

#[test]
fn tls_settings_errors_name_the_problem() {
    let certs = Certs::new();
    let (_, text) = SluiceBuilder::new()
        .setting("client_tls_sslmode", "require")
        .start_expect_failure();
    assert!(
        text.contains("sluice.ini:") && text.contains("needs client_tls_key_file"),
        "{text}"
    );
    let (_, text) = certs
        .sluice("require")
        .setting("client_tls_cert_file", "/nonexistent/server.pem")
        .start_expect_failure();
    assert!(
        text.contains("/nonexistent/server.pem: cannot read"),
        "{text}"
    );
    // A key that is not the certificate's.
    let (_, text) = certs
        .sluice("require")
        .setting("client_tls_cert_file", &certs.path("client.pem"))
        .start_expect_failure();
    assert!(text.contains("server.key"), "{text}");
    let (_, text) = certs
        .sluice("require")
        .setting("client_tls_protocols", "tlsv1.0")
        .start_expect_failure();
    assert!(text.contains("no TLS version"), "{text}");
}

#[test]
fn a_reload_turns_tls_on() {
    let certs = Certs::new();
    let mut s = certs.sluice("disable").start();
    assert!(!conninfo(&s, &[("PGSSLMODE", "prefer")]).contains("SSL"));
    s.reload_replacing(
        "client_tls_sslmode = disable",
        "client_tls_sslmode = require",
    );
    assert!(conninfo(&s, &[("PGSSLMODE", "prefer")]).contains("SSL connection"));
    let text = refused(&s, &[("PGSSLMODE", "disable")]);
    assert!(text.contains("SSL required"), "{text}");
}

#[test]
fn a_failed_handshake_harms_no_one_else() {
    let certs = Certs::new();
    let s = certs.sluice("require").start();
    // Plaintext after the 'S': the handshake fails, the connection closes.
    let mut c = RawConn::tcp(s.port());
    c.send(&raw::ssl_request()).expect("send");
    assert_eq!(c.read_byte(T).expect("answer"), b'S');
    c.send(&raw::startup_packet(196608, &[("user", "x")]))
        .expect("send");
    // A TLS alert (record type 21), then the end of the connection.
    assert_eq!(c.read_byte(T).ok(), Some(21));
    let mut left = 1024;
    let closed = loop {
        match c.read_byte(T) {
            Err(raw::RawError::Closed) => break true,
            Ok(_) if left > 0 => left -= 1,
            _ => break false,
        }
    };
    assert!(closed, "still open after a failed handshake");
    // Bytes sent with the SSLRequest are refused before any handshake.
    let mut c = RawConn::tcp(s.port());
    let mut both = raw::ssl_request();
    both.extend(raw::startup_packet(196608, &[("user", "x")]));
    c.send(&both).expect("send");
    let msgs = c.expect_closed(T).expect("closed");
    let err = msgs.iter().find_map(|m| m.error());
    assert_eq!(
        err.map(|e| e.1),
        Some("received unencrypted data after SSL request".to_owned())
    );
    assert!(conninfo(&s, &[("PGSSLMODE", "require")]).contains("SSL connection"));
    assert!(s.log().contains("TLS handshake failed"), "{}", s.log());
}

/// Megabytes each way: a COPY out, and a pipeline that writes many requests while
/// their answers come back (the tunnel's two directions must move independently).
#[test]
fn large_transfers_both_ways() {
    let certs = Certs::new();
    let s = certs.sluice("require").start();
    let sql = "COPY (SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g) TO STDOUT";
    let (ok, text) = psql_tls(&s, support::TEST_DB, &[("PGSSLMODE", "require")], sql);
    assert!(ok, "{}", support::tail(&text, 5));
    assert_eq!(text.lines().count(), 20000);
    assert!(text.lines().all(|l| l.len() > 500), "a line was cut");

    let mut script = String::from("\\startpipeline\n");
    for i in 0..400 {
        script.push_str(&format!(
            "SELECT {i}, repeat('y', 3000) FROM generate_series(1, 20) WHERE length('{}') > 0;\n",
            "z".repeat(2000)
        ));
    }
    script.push_str("\\endpipeline\n");
    let out = pgbench(&s, &["-c", "2", "-t", "5", "-M", "extended"], &script);
    assert!(
        out.contains("actually processed: 10/10"),
        "{out}\n{}",
        s.diagnostics()
    );
}

/// pgbench over TLS with `args`, running `script`; its report.
fn pgbench(s: &Sluice, args: &[&str], script: &str) -> String {
    let mut cmd = Command::new("pgbench");
    support::clear_pg_env(&mut cmd);
    cmd.env("PGPASSWORD", support::MD5_PASSWORD)
        .env("PGSSLMODE", "require")
        .env("PGSSLCERT", "/nonexistent/sluice-test.crt")
        .args(["-n", "-f", "-"])
        .args(args)
        .args(["-h", "127.0.0.1", "-p", &s.port().to_string()])
        .args(["-U", support::MD5_USER, support::TEST_DB]);
    let out = support::run_bounded(&mut cmd, Some(script), Duration::from_secs(120))
        .expect("pgbench hung");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn pgbench_through_tls_in_transaction_pooling() {
    let certs = Certs::new();
    let s = certs
        .sluice("require")
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start();
    let args = ["-c", "6", "-t", "200", "-M", "extended"];
    let out = pgbench(&s, &args, "SELECT generate_series(1, 100);\n");
    assert!(
        out.contains("number of transactions actually processed: 1200/1200"),
        "{out}\n{}",
        s.diagnostics()
    );
}

/// `client_tls_ciphers` (TLS 1.2) and `client_tls13_ciphers` pick the suite; the
/// client (OpenSSL, in psql) reports it.
#[test]
fn cipher_settings_pick_the_suites_offered() {
    let certs = Certs::new();
    let s = certs
        .sluice("require")
        .setting("client_tls_protocols", "tlsv1.2")
        .setting("client_tls_ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256")
        .start();
    let info = conninfo(&s, &[("PGSSLMODE", "require")]);
    assert!(
        info.contains("cipher: ECDHE-ECDSA-AES128-GCM-SHA256"),
        "{info}"
    );
    drop(s);
    let s = certs
        .sluice("require")
        .setting("client_tls13_ciphers", "TLS_CHACHA20_POLY1305_SHA256")
        .start();
    let info = conninfo(&s, &[("PGSSLMODE", "require")]);
    assert!(
        info.contains("cipher: TLS_CHACHA20_POLY1305_SHA256"),
        "{info}"
    );
}

/// `client_tls_ecdhcurve` picks the key exchange group, for TLS 1.3 and 1.2 alike;
/// the login's log line names it.
#[test]
fn ecdhcurve_picks_the_group() {
    let certs = Certs::new();
    let s = certs
        .sluice("require")
        .setting("client_tls_ecdhcurve", "secp384r1")
        .start();
    conninfo(&s, &[("PGSSLMODE", "require")]);
    conninfo(
        &s,
        &[
            ("PGSSLMODE", "require"),
            ("PGSSLMAXPROTOCOLVERSION", "TLSv1.2"),
        ],
    );
    let log = s.log();
    let groups: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("login attempt") && l.contains("tls=TLSv1."))
        .filter_map(|l| l.split("/ECDH=").nth(1))
        .collect();
    assert_eq!(groups.len(), 2, "{log}");
    for g in groups {
        assert!(g.starts_with("secp384r1"), "{log}");
    }
}

//! `auth_type = hba`: `auth_hba_file`'s first matching rule picks each login's method
//! (PgBouncer's subset of pg_hba.conf), by connection type, database, user and address.

use std::time::Duration;

use crate::auth::{login_error, try_login};
use crate::support::{self, SluiceBuilder, TempDir, MD5_PASSWORD, MD5_USER, TEST_DB};
use crate::tls::{psql_tls, refused, Certs};

/// SQLSTATEs: invalid_authorization_specification, invalid_password.
const REJECTED: &str = "28000";
const PASSWORD: &str = "28P01";

const RULES: &str = "\
# UNIX socket: no password, but the user must be listed (as trust)
local   all  all                        trust
host    all  sluice_plain  127.0.0.1/32 reject
hostssl all  sluice_scram  all          scram-sha-256
host    \"sluice_test\"  sluice_md5,sluice_scram  127.0.0.0 255.0.0.0  md5
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_matching_rule_picks_the_method() {
    let dir = TempDir::new("sluice-hba");
    let rules = dir.write("hba.conf", RULES);
    let s = SluiceBuilder::new()
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        .userlist(MD5_USER, MD5_PASSWORD)
        .userlist(support::SCRAM_USER, support::SCRAM_PASSWORD)
        .userlist(support::PLAIN_USER, support::PLAIN_PASSWORD)
        .start();
    let login = |user: &str, password: &str| {
        let cfg = s.config(user, password, TEST_DB);
        async move { try_login(&cfg).await }
    };

    // md5 over TCP, right and wrong password.
    assert!(
        login(MD5_USER, MD5_PASSWORD).await.is_ok(),
        "{}",
        s.diagnostics()
    );
    let e = login_error(&s.config(MD5_USER, "wrong", TEST_DB)).await;
    assert_eq!(
        e,
        (PASSWORD.into(), "password authentication failed".into())
    );
    // sluice_scram has no TLS here, so the hostssl rule passes it over to md5, which
    // its stored plaintext password answers.
    assert!(login(support::SCRAM_USER, support::SCRAM_PASSWORD)
        .await
        .is_ok());
    // A reject rule, and a user no rule names, in PgBouncer's words for each.
    for (user, told) in [
        (support::PLAIN_USER, "login rejected"),
        ("nobody_listed", "no authentication method is found"),
    ] {
        let e = login_error(&s.config(user, support::PLAIN_PASSWORD, TEST_DB)).await;
        assert_eq!(e, (REJECTED.into(), told.into()), "{user}");
    }
    // The UNIX socket's `local` rule: no password asked.
    let cfg = s.socket_config(MD5_USER, "", TEST_DB);
    let c = tokio::time::timeout(Duration::from_secs(20), try_login(&cfg)).await;
    assert!(matches!(c, Ok(Ok(_))), "{}", s.diagnostics());
    assert!(s.log().contains("login rejected"), "{}", s.log());
}

#[test]
fn hba_file_errors_name_file_and_line() {
    let dir = TempDir::new("sluice-hba-bad");
    let rules = dir.write(
        "hba.conf",
        "local all all trust\nhost all all 10.0.0.0/8 ident\n",
    );
    let (status, out) = SluiceBuilder::new()
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        .start_expect_failure();
    assert!(!status.success());
    let want = format!(
        "{}:2: unsupported authentication method \"ident\"",
        rules.display()
    );
    assert!(out.contains(&want), "{out}");
    let (_, out) = SluiceBuilder::new()
        .setting("auth_type", "hba")
        .start_expect_failure();
    assert!(out.contains("auth_type hba needs auth_hba_file"), "{out}");
}

/// This process's OS user name (the peer the UNIX-socket clients here log in as).
fn os_user() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("id");
    let me = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!me.is_empty(), "no OS user name");
    me
}

/// `peer`: the OS user at the other end of the UNIX socket must be the user name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_takes_the_os_user_of_a_unix_socket_client() {
    let dir = TempDir::new("sluice-hba-peer");
    let rules = dir.write("hba.conf", "local all all peer\n");
    let s = SluiceBuilder::new()
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        // Whoever the client is, the server sees sluice_trust.
        .database(TEST_DB, crate::auth::DB_AS_TRUST_USER)
        .userlist(&os_user(), "")
        .userlist("someone_else", "")
        .start();
    let me = os_user();

    let c = try_login(&s.socket_config(&me, "", TEST_DB)).await;
    assert!(
        c.is_ok(),
        "{:?}\n{}",
        c.err().map(|e| e.to_string()),
        s.diagnostics()
    );
    let e = login_error(&s.socket_config("someone_else", "", TEST_DB)).await;
    assert_eq!(e, (REJECTED.into(), PEER_REJECTED.into()));
    // Over TCP no rule matches.
    let e = login_error(&s.config(&me, "", TEST_DB)).await;
    assert_eq!(
        e,
        (REJECTED.into(), "no authentication method is found".into())
    );
}

/// PgBouncer's words for a refused `peer` login.
const PEER_REJECTED: &str = "unix socket login rejected";

/// `peer` for a user `auth_file` does not list: refused though the OS user is the
/// user named, as PgBouncer refuses a user it does not know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_refuses_a_user_the_auth_file_does_not_list() {
    let dir = TempDir::new("sluice-hba-peer-unlisted");
    let rules = dir.write("hba.conf", "local all all peer\n");
    let s = SluiceBuilder::new()
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        .database(TEST_DB, crate::auth::DB_AS_TRUST_USER)
        .start();
    let e = login_error(&s.socket_config(&os_user(), "", TEST_DB)).await;
    assert_eq!(e, (REJECTED.into(), PEER_REJECTED.into()));
}

/// `hostssl` with `cert`: TLS clients log in by certificate; the same client in
/// plaintext falls through to `reject`.
#[test]
fn hostssl_cert_rules_take_tls_clients_by_certificate() {
    let certs = Certs::new();
    let dir = TempDir::new("sluice-hba-cert");
    let rules = dir.write(
        "hba.conf",
        "hostssl all all 127.0.0.1/32 cert\nhost all all 127.0.0.1/32 reject\n",
    );
    let s = certs
        .sluice("prefer")
        .setting("client_tls_ca_file", &certs.path("ca.pem"))
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        .start();
    let (cert, key) = (certs.path("client.pem"), certs.path("client.key"));
    let env = [
        ("PGSSLMODE", "require"),
        ("PGSSLCERT", cert.as_str()),
        ("PGSSLKEY", key.as_str()),
    ];
    let (ok, text) = psql_tls(&s, TEST_DB, &env, "SELECT current_user");
    assert!(ok, "{text}\n{}", s.diagnostics());
    assert_eq!(text, MD5_USER);
    let text = refused(&s, &[("PGSSLMODE", "disable")]);
    assert!(text.contains("login rejected"), "{text}");
}

/// `map=` on `cert` and `peer` rules: `auth_ident_file` says which outside names may
/// log in as which users, and with a map the same name alone no longer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_options_check_names_by_auth_ident_file() {
    let me = os_user();
    let certs = tokio::task::spawn_blocking(Certs::new)
        .await
        .expect("certs");
    let dir = TempDir::new("sluice-hba-map");
    let rules = dir.write(
        "hba.conf",
        "local all all peer map=locals\nhostssl all all 127.0.0.1/32 cert map=certs\n",
    );
    let ident = dir.write(
        "ident.conf",
        &format!("# map  system user  database user\nlocals  {me}  mapped_user\ncerts  {MD5_USER}  mapped_user\n"),
    );
    let s = certs
        .sluice("prefer")
        .setting("client_tls_ca_file", &certs.path("ca.pem"))
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        .setting("auth_ident_file", &ident.display().to_string())
        .userlist("mapped_user", "unused")
        // Whoever the client is, the server sees sluice_trust.
        .database(TEST_DB, crate::auth::DB_AS_TRUST_USER)
        .start();

    // peer: the OS user may be mapped_user, and no longer itself.
    let c = try_login(&s.socket_config("mapped_user", "", TEST_DB)).await;
    assert!(
        c.is_ok(),
        "{:?}\n{}",
        c.err().map(|e| e.to_string()),
        s.diagnostics()
    );
    let e = login_error(&s.socket_config(&me, "", TEST_DB)).await;
    assert_eq!(e, (REJECTED.into(), PEER_REJECTED.into()));

    // cert: the certificate (its name is sluice_md5) may be mapped_user, not itself.
    let (cert, key) = (certs.path("client.pem"), certs.path("client.key"));
    let psql = |user: &str| {
        let mut cmd = support::psql_cmd_pw(s.port(), "localhost", user, TEST_DB, "unused");
        cmd.env("PGHOSTADDR", "127.0.0.1")
            .env("PGSSLMODE", "require")
            .env("PGSSLCERT", &cert)
            .env("PGSSLKEY", &key)
            .args(["-c", "SELECT 1"]);
        let out = support::run_bounded(&mut cmd, None, Duration::from_secs(30)).expect("psql hung");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = tokio::task::block_in_place(|| psql("mapped_user"));
    assert!(ok, "{err}\n{}", s.diagnostics());
    let (ok, err) = tokio::task::block_in_place(|| psql(MD5_USER));
    assert!(
        !ok && err.contains("certificate authentication failed"),
        "{err}"
    );
    assert!(
        s.log().contains("TLS certificate name mismatch"),
        "{}",
        s.log()
    );
}

/// A `map=` without `auth_ident_file`, and an ident file's unsupported lines, are
/// load errors naming file and line.
#[test]
fn map_errors_name_file_and_line() {
    let dir = TempDir::new("sluice-hba-map-errors");
    let rules = dir.write(
        "hba.conf",
        "local all all trust\nlocal all all peer map=m\n",
    );
    let start = |ident: Option<&std::path::Path>| {
        let mut b = SluiceBuilder::new()
            .setting("auth_type", "hba")
            .setting("auth_hba_file", &rules.display().to_string());
        if let Some(i) = ident {
            b = b.setting("auth_ident_file", &i.display().to_string());
        }
        b.start_expect_failure()
    };
    let (_, out) = start(None);
    let want = format!("{}:2: map=m needs auth_ident_file", rules.display());
    assert!(out.contains(&want), "{out}");
    let ident = dir.write("ident.conf", "m root alice\nm /^(.*)$ \\1\n");
    let (_, out) = start(Some(&ident));
    let want = format!(
        "{}:2: regular expressions (\"/^(.*)$\") are not supported",
        ident.display()
    );
    assert!(out.contains(&want), "{out}");
}

//! Client authentication by `auth_type`, end to end: tokio-postgres, psql and raw
//! sockets against the real `sluice` binary.
//!
//! Most tests here log in to PostgreSQL as `sluice_trust` (a forced `user=` in the
//! database entry), so that only the client side of the login is under test; the
//! server side is covered by `auth_server.rs`.

use std::time::Duration;

use crate::support::raw::{self, RawConn};
use crate::support::{self, Sluice, SluiceBuilder};

/// Upper bound for one login (a hang fails the test instead of blocking it).
pub(crate) const LOGIN_LIMIT: Duration = Duration::from_secs(20);
/// Upper bound for a psql run.
const PSQL_LIMIT: Duration = Duration::from_secs(30);

/// Database entry that logs in to PostgreSQL as `sluice_trust` whoever the client is.
pub(crate) const DB_AS_TRUST_USER: &str =
    "host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test user=sluice_trust";

/// Connects with a time bound; the login's own error is returned.
pub(crate) async fn try_login(
    cfg: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    match tokio::time::timeout(LOGIN_LIMIT, support::try_connect(cfg)).await {
        Ok(r) => r,
        Err(_) => panic!("login {cfg:?} did not finish within {LOGIN_LIMIT:?}"),
    }
}

/// Logs in and returns `current_user` as PostgreSQL sees it.
pub(crate) async fn whoami(cfg: &tokio_postgres::Config) -> String {
    let client = match try_login(cfg).await {
        Ok(c) => c,
        Err(e) => panic!("login {cfg:?} failed: {e} ({:?})", e.as_db_error()),
    };
    let row = tokio::time::timeout(
        LOGIN_LIMIT,
        client.query_one("SELECT current_user::text", &[]),
    )
    .await
    .expect("SELECT current_user hung")
    .expect("SELECT current_user");
    row.get(0)
}

/// Logs in expecting a failure; returns the server error's `(SQLSTATE, message)`.
pub(crate) async fn login_error(cfg: &tokio_postgres::Config) -> (String, String) {
    match try_login(cfg).await {
        Ok(_) => panic!("login {cfg:?} succeeded but should have failed"),
        Err(e) => match e.as_db_error() {
            Some(db) => (db.code().code().to_owned(), db.message().to_owned()),
            None => panic!("login {cfg:?} failed without a server error: {e} ({e:?})"),
        },
    }
}

/// Asserts that a login fails with exactly `code` and `message`.
async fn assert_refused(sluice: &Sluice, user: &str, password: &str, code: &str, message: &str) {
    let (c, m) = login_error(&sluice.config(user, password, support::TEST_DB)).await;
    assert_eq!(
        (c.as_str(), m.as_str()),
        (code, message),
        "user {user:?} password {password:?}"
    );
}

/// A Sluice with `auth_type` whose clients all reach PostgreSQL as `sluice_trust`.
fn sluice_as_trust_user(auth_type: &str, userlist: &[(&str, &str)]) -> Sluice {
    let mut b = SluiceBuilder::new()
        .setting("auth_type", auth_type)
        .database("sluice_test", DB_AS_TRUST_USER);
    for (u, s) in userlist {
        b = b.userlist(u, s);
    }
    b.start()
}

fn md5_secret(user: &str, password: &str) -> String {
    postgres_protocol::password::md5(password.as_bytes(), user)
}

fn scram_secret(password: &str) -> String {
    postgres_protocol::password::scram_sha_256(password.as_bytes())
}

/// Client users with each kind of stored secret.
fn mixed_userlist() -> Vec<(&'static str, String)> {
    vec![
        ("alice", "alicepw".to_owned()),
        ("bob", md5_secret("bob", "bobpw")),
        ("carol", scram_secret("carolpw")),
    ]
}

fn as_refs<'a>(list: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    list.iter().map(|(u, s)| (*u, s.as_str())).collect()
}

const PW_FAILED: &str = "password authentication failed";
const SASL_FAILED: &str = "SASL authentication failed";

#[tokio::test]
async fn auth_any_ignores_the_client_user_and_uses_the_forced_user() {
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "any")
        .database(
            "sluice_test",
            "host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test user=sluice_md5 password=md5pass",
        )
        .start();
    for user in ["whoever", "someone_else", support::MD5_USER] {
        let who = whoami(&sluice.config(user, "", support::TEST_DB)).await;
        assert_eq!(who, support::MD5_USER, "client user {user}");
    }
    // A password the client sends anyway is not asked for, so it does not matter.
    let who = whoami(&sluice.config("x", "not-checked", support::TEST_DB)).await;
    assert_eq!(who, support::MD5_USER);
}

#[tokio::test]
async fn auth_trust_needs_the_user_in_the_userlist() {
    let sluice = sluice_as_trust_user("trust", &[("alice", ""), ("bob", "whatever")]);
    for user in ["alice", "bob"] {
        let who = whoami(&sluice.config(user, "", support::TEST_DB)).await;
        assert_eq!(who, support::TRUST_USER);
    }
    let (code, msg) = login_error(&sluice.config("mallory", "", support::TEST_DB)).await;
    assert_eq!(
        (code.as_str(), msg.as_str()),
        ("08P01", "\"trust\" authentication failed")
    );
}

#[tokio::test]
async fn auth_plain_checks_plaintext_md5_and_scram_secrets() {
    let list = mixed_userlist();
    let sluice = sluice_as_trust_user("plain", &as_refs(&list));
    for (user, pw) in [("alice", "alicepw"), ("bob", "bobpw"), ("carol", "carolpw")] {
        let who = whoami(&sluice.config(user, pw, support::TEST_DB)).await;
        assert_eq!(who, support::TRUST_USER, "{user}");
        assert_refused(&sluice, user, "wrong", "28P01", PW_FAILED).await;
    }
    assert_refused(&sluice, "nobody", "alicepw", "28P01", PW_FAILED).await;
}

#[tokio::test]
async fn auth_md5_checks_plaintext_and_md5_secrets() {
    let list = mixed_userlist();
    let sluice = sluice_as_trust_user("md5", &as_refs(&list));
    for (user, pw) in [("alice", "alicepw"), ("bob", "bobpw")] {
        let who = whoami(&sluice.config(user, pw, support::TEST_DB)).await;
        assert_eq!(who, support::TRUST_USER, "{user}");
        assert_refused(&sluice, user, "wrong", "28P01", PW_FAILED).await;
    }
    assert_refused(&sluice, "nobody", "alicepw", "28P01", PW_FAILED).await;
    // The md5 hash itself is not a password.
    let hash = md5_secret("bob", "bobpw");
    assert_refused(&sluice, "bob", &hash, "28P01", PW_FAILED).await;
}

#[tokio::test]
async fn auth_md5_with_a_scram_secret_switches_to_scram() {
    let list = mixed_userlist();
    let sluice = sluice_as_trust_user("md5", &as_refs(&list));
    let who = whoami(&sluice.config("carol", "carolpw", support::TEST_DB)).await;
    assert_eq!(who, support::TRUST_USER);
    assert_refused(&sluice, "carol", "wrong", "28P01", SASL_FAILED).await;

    // The request really is AuthenticationSASL (10), not MD5 (5).
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", "carol"), ("database", support::TEST_DB)],
    ))
    .unwrap();
    let m = c.read_msg(LOGIN_LIMIT).expect("auth request");
    assert_eq!(m.auth_code(), Some(10), "{m:?}");
    assert!(m.body.windows(14).any(|w| w == b"SCRAM-SHA-256\0"), "{m:?}");
    // A mechanism it did not offer is refused in PgBouncer's words.
    let mut first = b"SCRAM-SHA-1\0".to_vec();
    first.extend_from_slice(&0u32.to_be_bytes());
    c.send(&raw::tagged(b'p', &first)).unwrap();
    let msgs = c.expect_closed(LOGIN_LIMIT).expect("closed");
    let told = msgs.iter().find_map(raw::Msg::error).map(|e| e.1);
    assert_eq!(
        told.as_deref(),
        Some("client selected an invalid SASL authentication mechanism")
    );
    // And a plaintext user still gets MD5.
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", "alice"), ("database", support::TEST_DB)],
    ))
    .unwrap();
    let m = c.read_msg(LOGIN_LIMIT).expect("auth request");
    assert_eq!(m.auth_code(), Some(5), "{m:?}");
    assert_eq!(m.body.len(), 8, "md5 request carries a 4-byte salt: {m:?}");
}

#[tokio::test]
async fn auth_scram_checks_plaintext_and_scram_secrets() {
    let list = mixed_userlist();
    let sluice = sluice_as_trust_user("scram-sha-256", &as_refs(&list));
    for (user, pw) in [("alice", "alicepw"), ("carol", "carolpw")] {
        let who = whoami(&sluice.config(user, pw, support::TEST_DB)).await;
        assert_eq!(who, support::TRUST_USER, "{user}");
        assert_refused(&sluice, user, "wrong", "28P01", SASL_FAILED).await;
    }
    assert_refused(&sluice, "nobody", "alicepw", "28P01", SASL_FAILED).await;
    // An md5 hash cannot serve SCRAM: even the right password fails, the same way.
    assert_refused(&sluice, "bob", "bobpw", "28P01", SASL_FAILED).await;
}

#[test]
fn auth_empty_stored_password_never_matches() {
    // PgBouncer refuses empty passwords for password-based methods.
    let sluice = sluice_as_trust_user("plain", &[("dave", "")]);
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", "dave"), ("database", support::TEST_DB)],
    ))
    .unwrap();
    let m = c.read_msg(LOGIN_LIMIT).expect("auth request");
    assert_eq!(m.auth_code(), Some(3), "{m:?}");
    c.send(&raw::password_message("")).unwrap();
    let msgs = c.expect_closed(LOGIN_LIMIT).unwrap();
    let err = msgs.iter().find_map(|m| m.error());
    assert_eq!(
        err,
        Some(("28P01".to_owned(), PW_FAILED.to_owned())),
        "{msgs:?}"
    );
}

fn psql(sluice: &Sluice, host: &str, user: &str, password: &str, sql: &str) -> (bool, String) {
    let mut cmd = support::psql_cmd(sluice.port(), host, user, support::TEST_DB);
    if !password.is_empty() {
        cmd.env("PGPASSWORD", password);
    }
    cmd.args(["-c", sql]);
    let out = support::run_bounded(&mut cmd, None, PSQL_LIMIT).expect("psql hung");
    support::outcome(&out)
}

#[test]
fn auth_psql_md5_and_scram_over_tcp_and_unix_socket() {
    let list = mixed_userlist();
    for auth_type in ["md5", "scram-sha-256"] {
        let sluice = sluice_as_trust_user(auth_type, &as_refs(&list));
        let sock = sluice.socket_dir().to_string_lossy().into_owned();
        for host in ["127.0.0.1", sock.as_str()] {
            for (user, pw) in [("alice", "alicepw"), ("carol", "carolpw")] {
                let (ok, text) = psql(&sluice, host, user, pw, "SELECT current_user");
                assert!(ok, "{auth_type} {host} {user}: {text}");
                assert_eq!(text, support::TRUST_USER);
                let (ok, text) = psql(&sluice, host, user, "wrong", "SELECT 1");
                assert!(
                    !ok,
                    "{auth_type} {host} {user} logged in with a wrong password"
                );
                let expected = if auth_type == "md5" && user == "alice" {
                    PW_FAILED
                } else {
                    SASL_FAILED
                };
                assert!(text.contains(expected), "{auth_type} {host} {user}: {text}");
            }
        }
    }
}

#[test]
fn auth_psql_over_unix_socket_trust_runs_queries() {
    let sluice = sluice_as_trust_user("trust", &[("alice", "")]);
    let sock = sluice.socket_dir().to_string_lossy().into_owned();
    let (ok, text) = psql(
        &sluice,
        &sock,
        "alice",
        "",
        "CREATE TEMP TABLE t(x int); INSERT INTO t VALUES (41); SELECT x + 1 FROM t",
    );
    assert!(ok, "{text}");
    assert_eq!(text, "42");
    let (ok, text) = psql(&sluice, &sock, "nobody", "", "SELECT 1");
    assert!(!ok);
    assert!(text.contains("\"trust\" authentication failed"), "{text}");
}

#[tokio::test]
async fn auth_tokio_postgres_over_unix_socket() {
    let list = mixed_userlist();
    let sluice = sluice_as_trust_user("scram-sha-256", &as_refs(&list));
    let who = whoami(&sluice.socket_config("carol", "carolpw", support::TEST_DB)).await;
    assert_eq!(who, support::TRUST_USER);
    let (code, msg) = login_error(&sluice.socket_config("carol", "nope", support::TEST_DB)).await;
    assert_eq!((code.as_str(), msg.as_str()), ("28P01", SASL_FAILED));
}

/// A refused password is logged with the database and user the client named, as
/// PgBouncer logs it, so that an operator can tell whose login failed.
#[tokio::test]
async fn a_refused_login_is_logged_with_its_database_and_user() {
    let sluice = sluice_as_trust_user("md5", &[("alice", "alicepw")]);
    let (_, msg) = login_error(&sluice.config("alice", "wrong", support::TEST_DB)).await;
    assert_eq!(msg, PW_FAILED);
    let (_, msg) = login_error(&sluice.config("alice", "wrong", "pgbouncer")).await;
    assert_eq!(msg, PW_FAILED);
    for who in ["sluice_test/alice@127.0.0.1:", "pgbouncer/alice@127.0.0.1:"] {
        assert!(
            support::wait_until(Duration::from_secs(5), || sluice
                .log()
                .lines()
                .any(|l| l.contains(who)
                    && l.contains("closing because: password authentication failed"))),
            "no line for {who}\n{}",
            sluice.diagnostics()
        );
    }
}

/// A client that leaves during the password exchange is logged with the database
/// and user its startup packet named, not as `(nodb)/(nouser)`.
#[test]
fn a_client_leaving_mid_login_is_logged_with_its_names() {
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "md5")
        .database("sluice_test", DB_AS_TRUST_USER)
        .userlist("alice", "alicepw")
        .arg("-v")
        .start();
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", "alice"), ("database", support::TEST_DB)],
    ))
    .unwrap();
    let m = c.read_msg(LOGIN_LIMIT).expect("auth request");
    assert_eq!(m.auth_code(), Some(5), "{m:?}");
    drop(c);
    assert!(
        support::wait_until(Duration::from_secs(5), || sluice
            .log()
            .lines()
            .any(|l| l.contains("sluice_test/alice@127.0.0.1:")
                && l.contains("closing because: client unexpected eof"))),
        "{}",
        sluice.diagnostics()
    );
}

#[tokio::test]
async fn a_password_message_with_a_bad_header_is_named() {
    // A PasswordMessage announcing more than any password takes: PgBouncer's words,
    // with the header in hex, and other clients still log in.
    let sluice = SluiceBuilder::new()
        .userlist("alice", "alicepw")
        .database("sluice_test", DB_AS_TRUST_USER)
        .start();
    let mut c = RawConn::tcp(sluice.port());
    let params = [("user", "alice"), ("database", support::TEST_DB)];
    c.send(&raw::startup_packet(raw::PROTOCOL_3_0, &params))
        .unwrap();
    assert_eq!(c.read_msg(LOGIN_LIMIT).unwrap().auth_code(), Some(5));
    c.send(&[b'p', 0x7f, 0xff, 0xff, 0xff]).unwrap();
    let msgs = c.expect_closed(LOGIN_LIMIT).unwrap();
    let error = msgs.iter().find_map(|m| m.error());
    let why = "bad packet header: '707fffffff'";
    assert_eq!(
        error,
        Some(("08P01".to_owned(), why.to_owned())),
        "{msgs:?}"
    );
    let cfg = sluice.config("alice", "alicepw", support::TEST_DB);
    assert_eq!(whoami(&cfg).await, support::TRUST_USER);
}

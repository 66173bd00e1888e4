//! Sluice logging in to PostgreSQL: trust, cleartext, md5 and SCRAM, with the
//! password from the database entry or from the userlist, SCRAM pass-through with
//! keys recovered from the client's login, and server login errors reaching the
//! client with PostgreSQL's SQLSTATE and message.

use std::time::Duration;

use super::auth::{login_error, try_login, whoami, LOGIN_LIMIT};
use crate::support::{self, pg, Sluice, SluiceBuilder};

fn pg_db(extra: &str) -> String {
    format!("host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test {extra}")
}

/// Whether Sluice logged a server login's failure cause as PgBouncer does: an
/// `ERROR S-<n>: <at>...` line ending in `cause`.
fn logged_login_cause(sluice: &Sluice, at: &str, cause: &str) -> bool {
    sluice
        .log()
        .lines()
        .any(|l| l.contains("ERROR S-") && l.contains(at) && l.ends_with(cause))
}

/// PostgreSQL's stored SCRAM verifier for `sluice_scram`.
fn pg_scram_secret() -> String {
    let s = pg().psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'sluice_scram'");
    let s = s.trim().to_owned();
    assert!(s.starts_with("SCRAM-SHA-256$"), "{s}");
    s
}

#[tokio::test]
async fn auth_server_password_from_userlist_for_each_method() {
    // Client auth is trust; the userlist password is used toward the server.
    let md5_hash = postgres_protocol::password::md5(b"md5pass", support::MD5_USER);
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "trust")
        .userlist(support::TRUST_USER, "")
        .userlist(support::PLAIN_USER, support::PLAIN_PASSWORD)
        .userlist(support::MD5_USER, &md5_hash)
        .userlist(support::SCRAM_USER, support::SCRAM_PASSWORD)
        .start();
    for user in [
        support::TRUST_USER,
        support::PLAIN_USER,
        support::MD5_USER,
        support::SCRAM_USER,
    ] {
        let who = whoami(&sluice.config(user, "", support::TEST_DB)).await;
        assert_eq!(who, user);
    }
}

#[tokio::test]
async fn auth_server_md5_with_plaintext_userlist_and_md5_client_auth() {
    let sluice = SluiceBuilder::new()
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .userlist(support::PLAIN_USER, support::PLAIN_PASSWORD)
        .userlist(support::SCRAM_USER, support::SCRAM_PASSWORD)
        .start();
    for user in [support::MD5_USER, support::PLAIN_USER, support::SCRAM_USER] {
        let pw = support::password_for(user).unwrap();
        let who = whoami(&sluice.config(user, pw, support::TEST_DB)).await;
        assert_eq!(who, user);
    }
}

#[tokio::test]
async fn auth_server_password_from_the_database_entry() {
    let mut b = SluiceBuilder::new().setting("auth_type", "any");
    let users = [
        support::TRUST_USER,
        support::PLAIN_USER,
        support::MD5_USER,
        support::SCRAM_USER,
    ];
    for user in users {
        let extra = match support::password_for(user) {
            Some(pw) => format!("user={user} password={pw}"),
            None => format!("user={user}"),
        };
        b = b.database(&format!("db_{user}"), &pg_db(&extra));
    }
    let sluice = b.start();
    for user in users {
        let who = whoami(&sluice.config("anyone", "", &format!("db_{user}"))).await;
        assert_eq!(who, user);
    }
}

#[tokio::test]
async fn auth_server_forced_user_password_from_userlist() {
    // `user=` without `password=`: the forced user's userlist entry is used.
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "any")
        .database("via_md5", &pg_db("user=sluice_md5"))
        .database("via_scram", &pg_db("user=sluice_scram"))
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .userlist(support::SCRAM_USER, support::SCRAM_PASSWORD)
        .start();
    assert_eq!(
        whoami(&sluice.config("x", "", "via_md5")).await,
        support::MD5_USER
    );
    assert_eq!(
        whoami(&sluice.config("y", "", "via_scram")).await,
        support::SCRAM_USER
    );
}

#[tokio::test]
async fn auth_server_scram_pass_through_with_pg_secret() {
    let secret = pg_scram_secret();
    for auth_type in ["scram-sha-256", "md5"] {
        let sluice = SluiceBuilder::new()
            .setting("auth_type", auth_type)
            .userlist(support::SCRAM_USER, &secret)
            .start();
        let cfg = sluice.config(
            support::SCRAM_USER,
            support::SCRAM_PASSWORD,
            support::TEST_DB,
        );
        // The first login opens the server connection with the recovered keys; the
        // second must work too (a new server connection in a fresh pool state or a
        // reused one).
        for _ in 0..2 {
            assert_eq!(whoami(&cfg).await, support::SCRAM_USER, "{auth_type}");
        }
        let (code, msg) =
            login_error(&sluice.config(support::SCRAM_USER, "wrong", support::TEST_DB)).await;
        assert_eq!(
            (code.as_str(), msg.as_str()),
            ("28P01", "SASL authentication failed")
        );
    }
}

#[test]
fn auth_server_scram_pass_through_with_psql() {
    let secret = pg_scram_secret();
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "scram-sha-256")
        .setting("pool_mode", "transaction")
        .userlist(support::SCRAM_USER, &secret)
        .start();
    let sock = sluice.socket_dir().to_string_lossy().into_owned();
    for host in ["127.0.0.1", sock.as_str()] {
        let mut cmd = support::psql_cmd_pw(
            sluice.port(),
            host,
            support::SCRAM_USER,
            support::TEST_DB,
            support::SCRAM_PASSWORD,
        );
        cmd.args(["-c", "SELECT current_user"]);
        let out = support::run_bounded(&mut cmd, None, Duration::from_secs(30)).expect("psql hung");
        assert!(
            out.status.success(),
            "{host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            support::SCRAM_USER
        );
    }
}

#[tokio::test]
async fn auth_server_scram_secret_without_keys_is_reported() {
    // Plain client auth proves the password but yields no SCRAM keys, so Sluice cannot
    // answer PostgreSQL's SCRAM challenge with a stored verifier.
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "plain")
        .setting("server_login_retry", "0")
        .userlist(support::SCRAM_USER, &pg_scram_secret())
        .start();
    let (code, msg) = login_error(&sluice.config(
        support::SCRAM_USER,
        support::SCRAM_PASSWORD,
        support::TEST_DB,
    ))
    .await;
    // PgBouncer's words: the cause in the log, "wrong password type" to the client.
    assert_eq!(
        (code.as_str(), msg.as_str()),
        ("08P01", "server login failed: wrong password type")
    );
    let cause = "cannot do SCRAM authentication: password is SCRAM secret but client \
                 authentication did not provide SCRAM keys";
    assert!(
        logged_login_cause(&sluice, ": sluice_test/sluice_scram@127.0.0.1:", cause),
        "{}",
        sluice.diagnostics()
    );
}

#[tokio::test]
async fn auth_server_password_of_the_wrong_type_is_named() {
    // Client auth is trust, so the userlist's entry is only for the server: a hash
    // that cannot answer the method PostgreSQL asks (pg_hba: sluice_scram scram,
    // sluice_md5 md5, sluice_plain password).
    let md5_hash = postgres_protocol::password::md5(b"x", support::SCRAM_USER);
    let scram = postgres_protocol::password::scram_sha_256(support::MD5_PASSWORD.as_bytes());
    let plain_md5 = postgres_protocol::password::md5(b"x", support::PLAIN_USER);
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "trust")
        .setting("server_login_retry", "0")
        .userlist(support::SCRAM_USER, &md5_hash)
        .userlist(support::MD5_USER, &scram)
        .userlist(support::PLAIN_USER, &plain_md5)
        .start();
    let cases = [
        (support::SCRAM_USER, "SCRAM"),
        (support::MD5_USER, "MD5"),
        (support::PLAIN_USER, "plain-text"),
    ];
    for (user, method) in cases {
        let (code, msg) = login_error(&sluice.config(user, "", support::TEST_DB)).await;
        assert_eq!(
            (code.as_str(), msg.as_str()),
            ("08P01", "server login failed: wrong password type"),
            "{user}"
        );
        let at = format!(": sluice_test/{user}@127.0.0.1:");
        let cause = format!("cannot do {method} authentication: wrong password type");
        assert!(
            logged_login_cause(&sluice, &at, &cause),
            "{user}: {}",
            sluice.diagnostics()
        );
    }
}

#[tokio::test]
async fn auth_server_user_without_a_password_is_named() {
    // A forced user the database entry gives no password and no userlist names:
    // PostgreSQL asks for one Sluice does not have.
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "any")
        .setting("server_login_retry", "0")
        .database("nopw", &pg_db("user=sluice_md5"))
        .start();
    let (code, msg) = login_error(&sluice.config("anyone", "", "nopw")).await;
    assert_eq!(
        (code.as_str(), msg.as_str()),
        ("08P01", "server login failed: no password configured")
    );
    let cause = "cannot do MD5 authentication: no password configured for the user";
    assert!(
        logged_login_cause(&sluice, ": nopw/sluice_md5@", cause),
        "{}",
        sluice.diagnostics()
    );
}

#[tokio::test]
async fn auth_server_wrong_userlist_password_reaches_the_client() {
    for auth_type in ["trust"] {
        let sluice = SluiceBuilder::new()
            .setting("auth_type", auth_type)
            .userlist(support::MD5_USER, "not-the-password")
            .userlist(support::SCRAM_USER, "not-the-password")
            .userlist(support::PLAIN_USER, "not-the-password")
            .start();
        for user in [support::MD5_USER, support::SCRAM_USER, support::PLAIN_USER] {
            let (code, msg) = login_error(&sluice.config(user, "", support::TEST_DB)).await;
            assert_eq!(code, "28P01", "{auth_type} {user}: {msg}");
            assert_eq!(
                msg,
                format!("password authentication failed for user \"{user}\""),
                "{auth_type}"
            );
        }
    }
}

#[tokio::test]
async fn auth_server_wrong_scram_keys_are_refused_by_postgres() {
    // The userlist verifier is for another password: the client proves it, but the
    // recovered keys do not match PostgreSQL's.
    let other = postgres_protocol::password::scram_sha_256(b"otherpass");
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "scram-sha-256")
        .userlist(support::SCRAM_USER, &other)
        .start();
    let (code, msg) =
        login_error(&sluice.config(support::SCRAM_USER, "otherpass", support::TEST_DB)).await;
    assert_eq!(code, "28P01", "{msg}");
    assert_eq!(
        msg,
        "password authentication failed for user \"sluice_scram\""
    );
    // Logged in PgBouncer's words.
    let line =
        "server login failed: FATAL password authentication failed for user \"sluice_scram\"";
    assert!(sluice.log().contains(line), "{}", sluice.diagnostics());
}

#[tokio::test]
async fn auth_server_missing_server_database_reaches_the_client() {
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "trust")
        .database(
            "gone",
            "host=127.0.0.1 port=@PG_PORT@ dbname=no_such_db_on_pg",
        )
        .userlist(support::TRUST_USER, "")
        .start();
    let cfg = sluice.config(support::TRUST_USER, "", "gone");
    let (code, msg) = login_error(&cfg).await;
    assert_eq!(code, "3D000");
    assert_eq!(msg, "database \"no_such_db_on_pg\" does not exist");
    // While the failure is remembered (server_login_retry), PgBouncer's words, which
    // applications match on to retry later.
    let (code, msg) = login_error(&cfg).await;
    assert_eq!(code, "08P01");
    assert_eq!(
        msg,
        "server login has been failing, cached error: \
         database \"no_such_db_on_pg\" does not exist (server_login_retry)"
    );
    // Other databases are not affected.
    assert_eq!(
        whoami(&sluice.config(support::TRUST_USER, "", support::TEST_DB)).await,
        support::TRUST_USER
    );
}

#[tokio::test]
async fn auth_server_forced_user_pool_is_shared_by_all_client_users() {
    // PgBouncer keys the pool by the forced user: with pool_size=1 and session
    // pooling, a second client user gets the same backend after the first leaves.
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "trust")
        .setting("pool_mode", "session")
        .database("sluice_test", &pg_db("user=sluice_trust pool_size=1"))
        .userlist("a", "")
        .userlist("b", "")
        .start();
    let pid_of = |user: &'static str| {
        let cfg = sluice.config(user, "", support::TEST_DB);
        async move {
            let c = try_login(&cfg).await.expect("login");
            let row =
                tokio::time::timeout(LOGIN_LIMIT, c.query_one("SELECT pg_backend_pid()", &[]))
                    .await
                    .expect("query hung")
                    .expect("query");
            row.get::<_, i32>(0)
        }
    };
    let a = pid_of("a").await;
    let b = pid_of("b").await;
    assert_eq!(
        a, b,
        "client users a and b should share the forced user's pool"
    );
}

/// A pool's second SCRAM login with a plaintext password takes the keys its first one
/// derived (PostgreSQL asks for the same salt): no PBKDF2, and the login still works.
#[tokio::test]
async fn auth_server_scram_keys_are_derived_once_per_pool() {
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "trust")
        .userlist(support::SCRAM_USER, support::SCRAM_PASSWORD)
        .arg("-v")
        .start();
    let cfg = sluice.config(support::SCRAM_USER, "", support::TEST_DB);
    let first = try_login(&cfg).await.expect("first client");
    // The first client holds its server in a transaction, so the second needs another.
    first.batch_execute("BEGIN").await.expect("begin");
    assert_eq!(whoami(&cfg).await, support::SCRAM_USER);
    let reused = "SCRAM keys from an earlier login of this pool";
    assert!(
        support::wait_until(Duration::from_secs(5), || sluice.log().contains(reused)),
        "{}",
        sluice.diagnostics()
    );
    assert_eq!(sluice.log().matches(reused).count(), 1, "{}", sluice.log());
    first.batch_execute("COMMIT").await.expect("commit");
}

/// `auth_type = any` checks nothing, so a database without a forced `user=` would let
/// any client log in to the server as any role the auth file can log in as: refused,
/// as PgBouncer refuses it.
#[tokio::test]
async fn auth_any_without_a_forced_user_is_refused() {
    let sluice = SluiceBuilder::new()
        .setting("auth_type", "any")
        .userlist(support::MD5_USER, support::MD5_PASSWORD)
        .start();
    let (code, msg) = login_error(&sluice.config(support::MD5_USER, "", support::TEST_DB)).await;
    assert_eq!(
        (code.as_str(), msg.as_str()),
        ("08P01", "bouncer config error")
    );
    assert!(
        sluice.log().contains("auth_type=any requires forced user"),
        "{}",
        sluice.diagnostics()
    );
}

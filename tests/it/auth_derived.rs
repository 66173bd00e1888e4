//! SCRAM logins against plaintext passwords in the auth file: the SCRAM secret is
//! derived once per user and configuration (src/auth/derived.rs), so the salt a client
//! is offered stays the same from login to login, and a reload with a new password
//! derives a new one.

use std::time::Duration;

use crate::auth::{login_error, whoami, DB_AS_TRUST_USER, LOGIN_LIMIT};
use crate::support::raw::{self, RawConn};
use crate::support::{self, wait_until, Sluice, SluiceBuilder};

fn plaintext_sluice(password: &str) -> Sluice {
    SluiceBuilder::new()
        .setting("auth_type", "scram-sha-256")
        .database("sluice_test", DB_AS_TRUST_USER)
        .userlist("alice", password)
        .start()
}

/// Starts a SCRAM exchange as `user` over raw bytes and returns the salt (`s=`) of the
/// server-first-message, leaving the exchange unfinished.
fn offered_salt(sluice: &Sluice, user: &str) -> String {
    let mut c = RawConn::tcp(sluice.port());
    c.send(&raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", user), ("database", support::TEST_DB)],
    ))
    .expect("send startup");
    let m = c.read_msg(LOGIN_LIMIT).expect("auth request");
    assert_eq!(m.auth_code(), Some(10), "not AuthenticationSASL: {m:?}");
    let first = b"n,,n=,r=0123456789abcdefghijklmn";
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
    body.extend_from_slice(first);
    c.send(&raw::tagged(b'p', &body))
        .expect("send client-first");
    let m = c.read_msg(LOGIN_LIMIT).expect("server-first");
    assert_eq!(
        m.auth_code(),
        Some(11),
        "not AuthenticationSASLContinue: {m:?}"
    );
    let text = String::from_utf8_lossy(&m.body[4..]).into_owned();
    text.split(',')
        .find_map(|a| a.strip_prefix("s="))
        .unwrap_or_else(|| panic!("no salt in {text:?}"))
        .to_owned()
}

fn wait_for_log(s: &Sluice, text: &str, before: usize) {
    assert!(
        wait_until(Duration::from_secs(5), || s.log().matches(text).count()
            > before),
        "no {text:?}\n{}",
        s.diagnostics()
    );
}

#[tokio::test]
async fn a_plaintext_password_is_offered_with_one_salt_login_after_login() {
    let sluice = plaintext_sluice("alicepw");
    let who = whoami(&sluice.config("alice", "alicepw", support::TEST_DB)).await;
    assert_eq!(who, support::TRUST_USER);
    let salt = offered_salt(&sluice, "alice");
    for _ in 0..3 {
        assert_eq!(offered_salt(&sluice, "alice"), salt);
    }
    // The kept secret still checks the password.
    let (code, msg) = login_error(&sluice.config("alice", "wrong", support::TEST_DB)).await;
    assert_eq!(
        (code.as_str(), msg.as_str()),
        ("28P01", "SASL authentication failed")
    );
    assert_eq!(
        whoami(&sluice.config("alice", "alicepw", support::TEST_DB)).await,
        support::TRUST_USER
    );
}

#[tokio::test]
async fn a_reload_with_a_new_plaintext_password_derives_a_new_secret() {
    let mut sluice = plaintext_sluice("oldpw");
    whoami(&sluice.config("alice", "oldpw", support::TEST_DB)).await;
    let old_salt = offered_salt(&sluice, "alice");

    std::fs::write(sluice.userlist_path(), "\"alice\" \"newpw\"\n").expect("write userlist");
    let before = sluice.log().matches("config reloaded").count();
    sluice.signal(libc::SIGHUP);
    wait_for_log(&sluice, "config reloaded", before);

    assert_eq!(
        whoami(&sluice.config("alice", "newpw", support::TEST_DB)).await,
        support::TRUST_USER
    );
    let (code, _) = login_error(&sluice.config("alice", "oldpw", support::TEST_DB)).await;
    assert_eq!(code, "28P01");
    assert_ne!(offered_salt(&sluice, "alice"), old_salt);
}

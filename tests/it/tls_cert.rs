//! `auth_type = cert`: a client proves who it is with a TLS certificate that verifies
//! against `client_tls_ca_file` and whose common name is the user name (libpq's
//! `sslcert`/`sslkey`, through psql).

use crate::support::{self, MD5_USER};
use crate::tls::{psql_tls, refused, Certs};

fn with<'a>(cert: &'a str, key: &'a str) -> [(&'a str, &'a str); 4] {
    [
        ("PGSSLMODE", "require"),
        ("PGSSLCERT", cert),
        ("PGSSLKEY", key),
        ("PGPASSWORD", "not the password"),
    ]
}

#[test]
fn cert_auth_takes_the_user_from_the_certificate() {
    let certs = Certs::new();
    let (ours, ours_key) = (certs.path("client.pem"), certs.path("client.key"));
    let (plain, plain_key) = (certs.path("plain.pem"), certs.path("plain.key"));
    // A certificate is asked for but optional (prefer with a CA file), so the auth
    // step itself must refuse a client that brings none, or no TLS at all.
    let s = certs
        .sluice("prefer")
        .setting("client_tls_ca_file", &certs.path("ca.pem"))
        .setting("auth_type", "cert")
        .start();
    // The password is never asked for: the certificate is the proof.
    let (ok, text) = psql_tls(
        &s,
        support::TEST_DB,
        &with(&ours, &ours_key),
        "SELECT current_user",
    );
    assert!(ok, "{text}\n{}", s.diagnostics());
    assert_eq!(text, MD5_USER);

    // sluice_plain's certificate for user sluice_md5, no certificate, no TLS: the
    // client is told PgBouncer's words alone, the log says why.
    for (env, why) in [
        (
            &with(&plain, &plain_key)[..],
            "TLS certificate name mismatch",
        ),
        (
            &[("PGSSLMODE", "require")],
            "TLS client certificate required",
        ),
        (&[("PGSSLMODE", "disable")], "TLS connection required"),
    ] {
        let text = refused(&s, env);
        assert!(text.contains(FAILED), "{text}");
        assert!(!text.contains(why), "{text}");
        assert!(s.log().contains(why), "{}", s.log());
    }
}

const FAILED: &str = "certificate authentication failed";

/// A user `auth_file` does not list is refused whatever its certificate proves, as
/// PgBouncer refuses it (the user it does not know gets its mock login).
#[test]
fn cert_auth_refuses_a_user_the_auth_file_does_not_list() {
    let certs = Certs::new();
    let (ours, ours_key) = (certs.path("client.pem"), certs.path("client.key"));
    let users = support::TempDir::new("sluice-users");
    let only_plain = format!("\"{}\" \"x\"\n", support::PLAIN_USER);
    let file = users.write("userlist.txt", &only_plain);
    let s = certs
        .sluice("prefer")
        .setting("client_tls_ca_file", &certs.path("ca.pem"))
        .setting("auth_type", "cert")
        .setting("auth_file", &file.display().to_string())
        .start();
    // sluice_md5's own certificate, valid and matching, but sluice_md5 is not listed.
    let text = refused(&s, &with(&ours, &ours_key));
    assert!(text.contains(FAILED), "{text}");
    assert!(s.log().contains("no such user"), "{}", s.log());
}

/// Without a CA file no certificate is asked for, so no client can pass.
#[test]
fn cert_auth_without_a_ca_file_lets_no_one_in() {
    let certs = Certs::new();
    let s = certs.sluice("require").setting("auth_type", "cert").start();
    let (cert, key) = (certs.path("client.pem"), certs.path("client.key"));
    let text = refused(&s, &with(&cert, &key));
    assert!(text.contains(FAILED), "{text}");
    assert!(
        s.log().contains("TLS client certificate required"),
        "{}",
        s.log()
    );
}

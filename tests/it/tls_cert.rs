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

    // sluice_plain's certificate for user sluice_md5.
    let text = refused(&s, &with(&plain, &plain_key));
    assert!(text.contains("TLS certificate name mismatch"), "{text}");
    let text = refused(&s, &[("PGSSLMODE", "require")]);
    assert!(text.contains("TLS client certificate required"), "{text}");
    let text = refused(&s, &[("PGSSLMODE", "disable")]);
    assert!(text.contains("TLS connection required"), "{text}");
    assert!(
        s.log().contains("TLS certificate name mismatch"),
        "{}",
        s.log()
    );
}

/// Without a CA file no certificate is asked for, so no client can pass.
#[test]
fn cert_auth_without_a_ca_file_lets_no_one_in() {
    let certs = Certs::new();
    let s = certs.sluice("require").setting("auth_type", "cert").start();
    let (cert, key) = (certs.path("client.pem"), certs.path("client.key"));
    let text = refused(&s, &with(&cert, &key));
    assert!(text.contains("TLS client certificate required"), "{text}");
}

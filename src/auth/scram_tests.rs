//! Full SCRAM exchanges between [`ScramClient`] and [`ScramServer`], and against
//! `postgres-protocol`'s client.

use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

use super::*;

/// Runs a whole exchange; `Err` from whichever side fails first.
fn login(client: &mut ScramClient, server: &mut ScramServer) -> Result<(), AuthError> {
    let server_first = server.handle_client_first(&client.client_first())?;
    let client_final = client.handle_server_first(&server_first)?;
    let server_final = server.handle_client_final(&client_final)?;
    client.verify_server_final(&server_final)
}

fn password(pw: &str) -> ScramClient {
    ScramClient::new(ScramCredential::Password(pw.into()))
}

fn scram_secret(pw: &str) -> Secret {
    Secret::parse(&scram_secret_from_password(pw, b"0123456789abcdef", 64))
}

#[test]
fn round_trip_plain_secret() {
    let mut server = ScramServer::new(&Secret::Plain("s3cret".into()), 64).unwrap();
    assert_eq!(login(&mut password("s3cret"), &mut server), Ok(()));
    assert!(server.client_key().is_some());
}

#[test]
fn round_trip_scram_secret() {
    let secret = scram_secret("s3cret");
    assert!(matches!(secret, Secret::Scram(_)));
    let mut server = ScramServer::new(&secret, 4096).unwrap();
    assert_eq!(login(&mut password("s3cret"), &mut server), Ok(()));
}

#[test]
fn wrong_password_fails() {
    for secret in [Secret::Plain("s3cret".into()), scram_secret("s3cret")] {
        let mut server = ScramServer::new(&secret, 64).unwrap();
        assert_eq!(
            login(&mut password("s3cret!"), &mut server),
            Err(AuthError::WrongPassword)
        );
        assert!(server.client_key().is_none());
    }
}

#[test]
fn client_detects_impostor_server() {
    // The impostor knows StoredKey (so it accepts the proof) but not ServerKey.
    let Secret::Scram(mut secret) = scram_secret("s3cret") else {
        panic!("expected SCRAM secret");
    };
    secret.server_key[0] ^= 1;
    let mut server = ScramServer::new(&Secret::Scram(secret), 64).unwrap();
    assert_eq!(
        login(&mut password("s3cret"), &mut server),
        Err(AuthError::ServerSignatureMismatch)
    );
}

#[test]
fn pass_through_keys_log_in() {
    let secret = scram_secret("s3cret");
    let mut front = ScramServer::new(&secret, 64).unwrap();
    login(&mut password("s3cret"), &mut front).unwrap();
    let cred = ScramCredential::Keys {
        client_key: front.client_key().unwrap(),
        server_key: front.server_key(),
    };
    let mut backend = ScramServer::new(&secret, 64).unwrap();
    assert_eq!(
        login(&mut ScramClient::new(cred.clone()), &mut backend),
        Ok(())
    );

    // The keys only fit verifiers with the same salt and iterations.
    let other = Secret::parse(&scram_secret_from_password("s3cret", b"other salt", 64));
    let mut backend = ScramServer::new(&other, 64).unwrap();
    assert_eq!(
        login(&mut ScramClient::new(cred), &mut backend),
        Err(AuthError::WrongPassword)
    );
}

#[test]
fn mock_always_fails() {
    for pw in ["", "s3cret", "anything"] {
        let mut server = ScramServer::mock("nobody", 64);
        assert_eq!(
            login(&mut password(pw), &mut server),
            Err(AuthError::WrongPassword)
        );
        assert!(server.client_key().is_none());
    }
}

#[test]
fn secret_helper_round_trips() {
    let text = scram_secret_from_password("pencil", b"salty", 128);
    assert!(text.starts_with("SCRAM-SHA-256$128:"), "{text}");
    let Secret::Scram(parsed) = Secret::parse(&text) else {
        panic!("helper output must parse as SCRAM");
    };
    assert_eq!(parsed.iterations, 128);
    assert_eq!(parsed.salt, b"salty");
    assert_eq!(parsed.to_secret_string(), text);
    let mut server = ScramServer::new(&Secret::Scram(parsed), 4096).unwrap();
    assert_eq!(login(&mut password("pencil"), &mut server), Ok(()));
}

#[test]
fn postgres_protocol_client_logs_in() {
    for secret in [Secret::Plain("s3cret".into()), scram_secret("s3cret")] {
        for (pw, ok) in [("s3cret", true), ("wrong", false)] {
            let mut server = ScramServer::new(&secret, 64).unwrap();
            let mut client = ScramSha256::new(pw.as_bytes(), ChannelBinding::unrequested());
            let first = server.handle_client_first(client.message()).unwrap();
            client.update(&first).unwrap();
            match server.handle_client_final(client.message()) {
                Ok(fin) => {
                    assert!(ok, "{pw}");
                    client.finish(&fin).unwrap();
                }
                Err(e) => {
                    assert!(!ok, "{pw}");
                    assert_eq!(e, AuthError::WrongPassword);
                }
            }
        }
    }
}

#[test]
fn saslprep_passwords_match_postgres() {
    // NFKC turns the ligature into "fi" and the decomposed accent into U+00E9; the
    // no-break space maps to a plain space. U+00E9 itself is left alone.
    for pw in ["\u{fb01}sh", "cafe\u{301}", "a\u{a0}b", "caf\u{e9}"] {
        // The verifier as libpq/PostgreSQL would compute it.
        let pg = Secret::parse(&postgres_protocol::password::scram_sha_256(pw.as_bytes()));
        assert!(matches!(pg, Secret::Scram(_)));
        let mut server = ScramServer::new(&pg, 64).unwrap();
        assert_eq!(login(&mut password(pw), &mut server), Ok(()), "{pw:?}");
        let mut server = ScramServer::new(&pg, 64).unwrap();
        assert_eq!(
            login(&mut password("wrong"), &mut server),
            Err(AuthError::WrongPassword)
        );
        // A plaintext userlist entry hashes the same way.
        let mut server = ScramServer::new(&Secret::Plain(pw.into()), 64).unwrap();
        let mut client = ScramSha256::new(pw.as_bytes(), ChannelBinding::unsupported());
        let first = server.handle_client_first(client.message()).unwrap();
        client.update(&first).unwrap();
        let fin = server.handle_client_final(client.message()).unwrap();
        client.finish(&fin).unwrap();
    }
    // The helper's verifier for a normalizing password also matches its prepared form.
    let secret = Secret::parse(&scram_secret_from_password("\u{fb01}sh", b"s", 64));
    let mut server = ScramServer::new(&secret, 64).unwrap();
    assert_eq!(login(&mut password("fish"), &mut server), Ok(()));
}

#[test]
fn delegated_client_rejects_bad_server_final() {
    let mut client = password("\u{fb01}sh");
    let mut server = ScramServer::new(&Secret::Plain("\u{fb01}sh".into()), 64).unwrap();
    let first = server.handle_client_first(&client.client_first()).unwrap();
    let fin = client.handle_server_first(&first).unwrap();
    server.handle_client_final(&fin).unwrap();
    assert_eq!(
        client.verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
        Err(AuthError::ServerSignatureMismatch)
    );
}

#[test]
fn exchanges_can_move_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ScramServer>();
    assert_send_sync::<ScramClient>();
    assert_send_sync::<Secret>();
    assert_send_sync::<AuthError>();
}

/// Runs an exchange, offering `cached` keys to the client; whether it took them.
fn login_cached(
    client: &mut ScramClient,
    server: &mut ScramServer,
    cached: &DerivedKeys,
) -> (bool, Result<(), AuthError>) {
    let server_first = match server.handle_client_first(&client.client_first()) {
        Ok(f) => f,
        Err(e) => return (false, Err(e)),
    };
    let adopted = client.adopt(&server_first, cached);
    assert_eq!(client.derives_keys(), !adopted);
    let result = client
        .handle_server_first(&server_first)
        .and_then(|fin| server.handle_client_final(&fin))
        .and_then(|fin| client.verify_server_final(&fin));
    (adopted, result)
}

#[test]
fn derived_keys_serve_the_next_login_with_the_same_salt() {
    let secret = scram_secret("s3cret");
    let mut first = password("s3cret");
    login(&mut first, &mut ScramServer::new(&secret, 4096).unwrap()).unwrap();
    let keys = first
        .take_derived()
        .expect("keys derived from the password");
    assert!(first.take_derived().is_none());

    // Same password, salt and rounds: taken, and the login succeeds.
    let mut next = password("s3cret");
    let mut server = ScramServer::new(&secret, 4096).unwrap();
    assert_eq!(login_cached(&mut next, &mut server, &keys), (true, Ok(())));
    assert!(next.take_derived().is_none(), "nothing new was derived");

    // A changed password, or another salt, derives anew.
    let mut changed = password("other");
    let mut server = ScramServer::new(&scram_secret("other"), 4096).unwrap();
    assert_eq!(
        login_cached(&mut changed, &mut server, &keys),
        (false, Ok(()))
    );
    let other_salt = Secret::parse(&scram_secret_from_password("s3cret", b"other salt", 64));
    let mut server = ScramServer::new(&other_salt, 64).unwrap();
    let mut salted = password("s3cret");
    assert_eq!(
        login_cached(&mut salted, &mut server, &keys),
        (false, Ok(()))
    );
    // Pass-through keys are never replaced.
    let mut through = ScramClient::new(ScramCredential::Keys {
        client_key: [1; 32],
        server_key: [2; 32],
    });
    let mut server = ScramServer::new(&secret, 4096).unwrap();
    let first = server.handle_client_first(&through.client_first()).unwrap();
    assert!(!through.adopt(&first, &keys));
}

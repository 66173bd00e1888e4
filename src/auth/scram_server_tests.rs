//! Unit tests of [`ScramServer`](super::ScramServer): RFC 7677 vectors and malformed input.

use super::*;
use crate::auth::scram_common::{client_proof, hi, keys_from_salted};

const RFC_SECRET: &str = "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$\
    WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";
const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const NONCE: &str = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const SERVER_FIRST: &str = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
    s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
    p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_secret() -> ScramSecret {
    ScramSecret::parse(RFC_SECRET).unwrap()
}

fn rfc_server() -> ScramServer {
    ScramServer::with_nonce(rfc_secret(), SERVER_NONCE.to_owned(), false)
}

/// A server that has already answered the RFC client-first-message.
fn rfc_server_after_first() -> ScramServer {
    let mut server = rfc_server();
    server.handle_client_first(CLIENT_FIRST.as_bytes()).unwrap();
    server
}

fn final_err(msg: &[u8]) -> AuthError {
    rfc_server_after_first()
        .handle_client_final(msg)
        .unwrap_err()
}

#[test]
fn rfc7677_vector() {
    let mut server = rfc_server();
    assert!(server.client_key().is_none());
    let first = server.handle_client_first(CLIENT_FIRST.as_bytes()).unwrap();
    assert_eq!(std::str::from_utf8(&first).unwrap(), SERVER_FIRST);
    let fin = server.handle_client_final(CLIENT_FINAL.as_bytes()).unwrap();
    assert_eq!(std::str::from_utf8(&fin).unwrap(), SERVER_FINAL);

    let salted = hi(b"pencil", &rfc_secret().salt, 4096);
    let (client_key, server_key) = keys_from_salted(&salted);
    assert_eq!(server.client_key(), Some(client_key));
    assert_eq!(server.server_key(), server_key);
    // The exchange is over: no further steps.
    assert!(matches!(
        server.handle_client_final(CLIENT_FINAL.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
}

#[test]
fn y_flag_and_extensions_accepted() {
    let mut server = rfc_server();
    let first = server
        .handle_client_first(b"y,,n=ignored,r=rOprNGfwEbeRWgbNEkqO,x=ext")
        .unwrap();
    let without_proof = format!("c={},r={NONCE},z=ext", b64(b"y,,"));
    let auth = format!(
        "n=ignored,r=rOprNGfwEbeRWgbNEkqO,x=ext,{},{without_proof}",
        std::str::from_utf8(&first).unwrap()
    );
    let (client_key, _) = keys_from_salted(&hi(b"pencil", &rfc_secret().salt, 4096));
    let proof = client_proof(&client_key, auth.as_bytes());
    let fin = format!("{without_proof},p={}", b64(&proof));
    assert!(server.handle_client_final(fin.as_bytes()).is_ok());
    assert_eq!(server.client_key(), Some(client_key));
}

#[test]
fn channel_binding_must_match_gs2_header() {
    let mut server = rfc_server();
    server
        .handle_client_first(b"y,,n=user,r=rOprNGfwEbeRWgbNEkqO")
        .unwrap();
    // CLIENT_FINAL says c=biws ("n,,"), but the header was "y,,".
    assert_eq!(
        server.handle_client_final(CLIENT_FINAL.as_bytes()),
        Err(AuthError::Malformed(
            "channel binding does not match gs2 header"
        ))
    );
}

#[test]
fn unsupported_client_first() {
    for (msg, want) in [
        (
            &b"p=tls-server-end-point,,n=,r=abc"[..],
            AuthError::Unsupported("channel binding"),
        ),
        (
            b"n,a=admin,n=,r=abc",
            AuthError::Unsupported("authorization identity"),
        ),
        (
            b"n,,m=ext,n=,r=abc",
            AuthError::Unsupported("mandatory extension"),
        ),
    ] {
        assert_eq!(rfc_server().handle_client_first(msg), Err(want));
    }
}

#[test]
fn malformed_client_first() {
    for (msg, want) in [
        (&b""[..], "empty client-first-message"),
        (b"x,,n=,r=abc", "invalid channel binding flag"),
        (b"n", "invalid gs2 header"),
        (b"n,", "invalid gs2 header"),
        (b"nn,n=,r=abc", "invalid gs2 header"),
        (b"n,,", "missing username"),
        (b"n,,r=abc", "missing username"),
        (b"n,,n=user", "missing nonce"),
        (b"n,,n=user,s=abc", "missing nonce"),
        (b"n,,n=user,r=", "invalid nonce"),
        (b"n,,n=user,r=a\x01b", "invalid nonce"),
        (b"n,,n=user,r=\xff", "invalid nonce"),
        (b"n,,n=user,r=abc,", "invalid attribute"),
        (b"n,,n=user,r=abc,7=x", "invalid attribute"),
    ] {
        assert_eq!(
            rfc_server().handle_client_first(msg),
            Err(AuthError::Malformed(want)),
            "{:?}",
            String::from_utf8_lossy(msg)
        );
    }
}

#[test]
fn malformed_client_final() {
    let bad_proof_len = format!("c=biws,r={NONCE},p={}", b64(&[0u8; 31]));
    for (msg, want) in [
        ("", "empty client-final-message"),
        ("r=abc,p=abc", "missing channel binding"),
        ("c=biws", "missing nonce"),
        ("c=biws,p=abc", "missing nonce"),
        ("c=biws,r=abc", "missing proof"),
        ("c=biws,r=abc,x=1", "missing proof"),
        ("c=biws,r=abc,p=!!!", "invalid proof"),
        (bad_proof_len.as_str(), "invalid proof"),
        ("c=biws,r=abc,1,p=AAAA", "invalid attribute"),
        (
            "c=!!,r=abc,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "invalid channel binding",
        ),
        (
            "c=eSws,r=abc,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "channel binding does not match gs2 header",
        ),
        (
            "c=biws,r=rOprNGfwEbeRWgbNEkqO,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "nonce mismatch",
        ),
    ] {
        assert_eq!(
            final_err(msg.as_bytes()),
            AuthError::Malformed(want),
            "{msg:?}"
        );
    }
}

#[test]
fn wrong_proof_fails_and_ends_exchange() {
    let mut fin = CLIENT_FINAL.to_owned();
    fin.replace_range(fin.len() - 3..fin.len() - 2, "B");
    let mut server = rfc_server_after_first();
    assert_eq!(
        server.handle_client_final(fin.as_bytes()),
        Err(AuthError::WrongPassword)
    );
    assert!(server.client_key().is_none());
    assert!(matches!(
        server.handle_client_final(CLIENT_FINAL.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
}

#[test]
fn steps_out_of_order() {
    let mut server = rfc_server();
    assert!(matches!(
        server.handle_client_final(CLIENT_FINAL.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
    let mut server = rfc_server_after_first();
    assert!(matches!(
        server.handle_client_first(CLIENT_FIRST.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
}

#[test]
fn every_truncation_fails_without_panic() {
    let prefix_len = "n,,n=user,r=".len();
    for cut in 0..CLIENT_FIRST.len() {
        let res = rfc_server().handle_client_first(&CLIENT_FIRST.as_bytes()[..cut]);
        // Cutting inside the nonce still leaves a (shorter) valid nonce.
        assert_eq!(res.is_err(), cut <= prefix_len, "cut at {cut}");
    }
    for cut in 0..CLIENT_FINAL.len() {
        let res = rfc_server_after_first().handle_client_final(&CLIENT_FINAL.as_bytes()[..cut]);
        assert!(res.is_err(), "cut at {cut}");
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let alphabet = b"nyprcsiv=,+/aAz09\x00\xff";
    for len in 0..200 {
        let msg: Vec<u8> = (0..len % 40)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                alphabet[(state % alphabet.len() as u64) as usize]
            })
            .collect();
        let _ = rfc_server().handle_client_first(&msg);
        let _ = rfc_server_after_first().handle_client_final(&msg);
    }
}

#[test]
fn new_from_each_secret_kind() {
    assert!(ScramServer::new(&Secret::parse("md53175bce1d3201d16594cebf9d7eb3f9d"), 64).is_none());
    let scram = ScramServer::new(&Secret::parse(RFC_SECRET), 64).unwrap();
    assert_eq!(scram.secret, rfc_secret());
    assert_eq!(scram.server_nonce.len(), 24);
    let a = ScramServer::new(&Secret::Plain("pw".into()), 64).unwrap();
    let b = ScramServer::new(&Secret::Plain("pw".into()), 64).unwrap();
    assert_eq!(a.secret.iterations, 64);
    assert_eq!(a.secret.salt.len(), SALT_LEN);
    assert_ne!(a.secret.salt, b.secret.salt, "fresh salt per exchange");
    assert_ne!(a.server_nonce, b.server_nonce, "fresh nonce per exchange");
    assert!(!a.is_mock());
}

#[test]
fn mock_looks_stable_per_user() {
    let a = ScramServer::mock("ghost", 4096);
    let b = ScramServer::mock("ghost", 4096);
    let c = ScramServer::mock("other", 4096);
    let d = ScramServer::mock_keyed("ghost", 4096, b"process secret");
    assert!(a.is_mock());
    assert_eq!(a.secret.salt, b.secret.salt);
    assert_eq!(a.secret.salt.len(), SALT_LEN);
    assert_ne!(a.secret.salt, c.secret.salt);
    assert_ne!(a.secret.salt, d.secret.salt);
    assert_eq!(a.secret.iterations, 4096);
}

#[test]
fn mock_fails_even_with_matching_proof() {
    // Give the mock the real RFC keys: it must still refuse.
    let mut server = ScramServer::with_nonce(rfc_secret(), SERVER_NONCE.to_owned(), true);
    server.handle_client_first(CLIENT_FIRST.as_bytes()).unwrap();
    assert_eq!(
        server.handle_client_final(CLIENT_FINAL.as_bytes()),
        Err(AuthError::WrongPassword)
    );
    assert!(server.client_key().is_none());
}

//! Unit tests of [`ScramClient`](super::ScramClient): RFC 7677 vectors and malformed input.

use super::*;

const CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const SERVER_FIRST: &str = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
    s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
    p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_client(cred: ScramCredential) -> ScramClient {
    ScramClient::with_user_and_nonce(cred, "user", CLIENT_NONCE)
}

fn pencil() -> ScramCredential {
    ScramCredential::Password("pencil".into())
}

fn first_err(msg: &str) -> AuthError {
    rfc_client(pencil())
        .handle_server_first(msg.as_bytes())
        .unwrap_err()
}

/// The RFC keys, derived once (PBKDF2 is slow in debug builds).
fn rfc_keys() -> ScramCredential {
    static KEYS: std::sync::OnceLock<([u8; 32], [u8; 32])> = std::sync::OnceLock::new();
    let (client_key, server_key) = *KEYS.get_or_init(|| {
        let salt = unb64(b"W22ZaJ0SNY7soEsUEjb6gQ==", "salt").unwrap();
        keys_from_salted(&hi(b"pencil", &salt, 4096))
    });
    ScramCredential::Keys {
        client_key,
        server_key,
    }
}

/// A client that has answered the RFC server-first-message.
fn rfc_client_after_first() -> ScramClient {
    let mut client = rfc_client(rfc_keys());
    client.handle_server_first(SERVER_FIRST.as_bytes()).unwrap();
    client
}

#[test]
fn rfc7677_vector_with_password() {
    let mut client = rfc_client(pencil());
    assert_eq!(client.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
    let fin = client.handle_server_first(SERVER_FIRST.as_bytes()).unwrap();
    assert_eq!(std::str::from_utf8(&fin).unwrap(), CLIENT_FINAL);
    assert_eq!(client.verify_server_final(SERVER_FINAL.as_bytes()), Ok(()));
}

#[test]
fn rfc7677_vector_with_keys() {
    let mut client = rfc_client(rfc_keys());
    let fin = client.handle_server_first(SERVER_FIRST.as_bytes()).unwrap();
    assert_eq!(std::str::from_utf8(&fin).unwrap(), CLIENT_FINAL);
    assert_eq!(client.verify_server_final(SERVER_FINAL.as_bytes()), Ok(()));
}

#[test]
fn client_first_is_anonymous_with_fresh_nonce() {
    let a = ScramClient::new(pencil()).client_first();
    let b = ScramClient::new(pencil()).client_first();
    let a = std::str::from_utf8(&a).unwrap();
    let nonce = a.strip_prefix("n,,n=,r=").unwrap();
    assert_eq!(nonce.len(), 24);
    assert!(check_nonce(nonce.as_bytes()).is_ok());
    assert_ne!(a.as_bytes(), &b[..]);
}

#[test]
fn server_extensions_are_ignored() {
    let mut client = rfc_client(pencil());
    let first = format!("{SERVER_FIRST},x=ext");
    assert!(client.handle_server_first(first.as_bytes()).is_ok());
}

#[test]
fn bad_server_first() {
    let r = "r=rOprNGfwEbeRWgbNEkqOsrv";
    for (msg, want) in [
        ("", AuthError::Malformed("empty server-first-message")),
        ("m=x,r=abc", AuthError::Unsupported("mandatory extension")),
        ("s=abc,i=1", AuthError::Malformed("missing nonce")),
        (
            "r=otherNonce123,s=AAAA,i=1",
            AuthError::Malformed("server nonce does not extend client nonce"),
        ),
        (
            "r=rOprNGfwEbeRWgbNEkqO,s=AAAA,i=1",
            AuthError::Malformed("server nonce does not extend client nonce"),
        ),
        (
            "r=rOprNGfwEbeRWgbNEk,s=AAAA,i=1",
            AuthError::Malformed("server nonce does not extend client nonce"),
        ),
        (
            "r=rOprNGfwEbeRWgbNEkqO\u{7f},s=AAAA,i=1",
            AuthError::Malformed("invalid nonce"),
        ),
        (r, AuthError::Malformed("missing salt")),
        (&format!("{r},i=1"), AuthError::Malformed("missing salt")),
        (
            &format!("{r},s=!!!,i=1"),
            AuthError::Malformed("invalid salt"),
        ),
        (&format!("{r},s=,i=1"), AuthError::Malformed("empty salt")),
        (
            &format!("{r},s=AAAA"),
            AuthError::Malformed("missing iteration count"),
        ),
        (
            &format!("{r},s=AAAA,x=1"),
            AuthError::Malformed("missing iteration count"),
        ),
        (
            &format!("{r},s=AAAA,i="),
            AuthError::Malformed("invalid iteration count"),
        ),
        (
            &format!("{r},s=AAAA,i=0"),
            AuthError::Malformed("invalid iteration count"),
        ),
        (
            &format!("{r},s=AAAA,i=-1"),
            AuthError::Malformed("invalid iteration count"),
        ),
        (
            &format!("{r},s=AAAA,i=4k"),
            AuthError::Malformed("invalid iteration count"),
        ),
        (
            &format!("{r},s=AAAA,i=1000001"),
            AuthError::Unsupported("iteration count too high"),
        ),
        (
            &format!("{r},s=AAAA,i=4294967296"),
            AuthError::Unsupported("iteration count too high"),
        ),
        (
            &format!("{r},s=AAAA,i=99999999999999999999999"),
            AuthError::Unsupported("iteration count too high"),
        ),
        (
            &format!("{r},s=AAAA,i=1,"),
            AuthError::Malformed("invalid attribute"),
        ),
    ] {
        assert_eq!(first_err(msg), want, "{msg:?}");
    }
}

#[test]
fn bad_server_final() {
    for (msg, want) in [
        ("", AuthError::Malformed("empty server-final-message")),
        (
            "e=invalid-proof",
            AuthError::ServerError("invalid-proof".into()),
        ),
        ("x=abc", AuthError::Malformed("missing verifier")),
        ("v=!!!", AuthError::Malformed("invalid verifier")),
        ("v=AAAA", AuthError::Malformed("invalid verifier")),
        (
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=,",
            AuthError::Malformed("invalid attribute"),
        ),
        (
            "v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
            AuthError::ServerSignatureMismatch,
        ),
    ] {
        assert_eq!(
            rfc_client_after_first().verify_server_final(msg.as_bytes()),
            Err(want),
            "{msg:?}"
        );
    }
}

#[test]
fn steps_out_of_order() {
    let client = rfc_client(pencil());
    assert!(matches!(
        client.verify_server_final(SERVER_FINAL.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
    let mut client = rfc_client_after_first();
    assert!(matches!(
        client.handle_server_first(SERVER_FIRST.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
    assert!(matches!(
        client.verify_server_final(SERVER_FINAL.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
    let mut client = rfc_client(pencil());
    assert!(client.handle_server_first(b"r=x").is_err());
    assert!(matches!(
        client.verify_server_final(SERVER_FINAL.as_bytes()),
        Err(AuthError::OutOfOrder(_))
    ));
}

#[test]
fn every_truncation_fails_without_panic() {
    let digits_start = SERVER_FIRST.len() - "4096".len();
    for cut in 0..SERVER_FIRST.len() {
        let res = rfc_client(rfc_keys()).handle_server_first(&SERVER_FIRST.as_bytes()[..cut]);
        // "i=4", "i=40", "i=409" are still valid iteration counts.
        assert_eq!(res.is_err(), cut <= digits_start, "cut at {cut}");
    }
    for cut in 0..SERVER_FINAL.len() {
        let res = rfc_client_after_first().verify_server_final(&SERVER_FINAL.as_bytes()[..cut]);
        assert!(res.is_err(), "cut at {cut}");
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let alphabet = b"rOpsiev=,+/AZ09\x00\xff";
    for len in 0..200 {
        let mut msg: Vec<u8> = (0..len % 40)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                alphabet[(state % alphabet.len() as u64) as usize]
            })
            .collect();
        let _ = rfc_client_after_first().verify_server_final(&msg);
        msg.splice(0..0, b"r=rOprNGfwEbeRWgbNEkqO".iter().copied());
        let _ = rfc_client(rfc_keys()).handle_server_first(&msg);
    }
}

#[test]
fn credential_debug_is_redacted() {
    let text = format!("{:?}", ScramCredential::Password("hunter2".into()));
    assert!(!text.contains("hunter2"), "{text}");
}

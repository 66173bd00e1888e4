//! MD5 password authentication (`AuthenticationMD5Password`).
//!
//! The stored hash is `"md5" + hex(md5(password + user))`; for a 4-byte salt the client
//! answers `"md5" + hex(md5(hex(md5(password + user)) + salt))`.

use ::md5::{Digest, Md5};

use super::secret::Secret;
use super::{ct_eq, hex_lower};

/// The stored MD5 secret for `user`/`password`: `"md5" + hex(md5(password + user))`.
pub fn md5_secret(user: &str, password: &str) -> String {
    let mut hash = Md5::new();
    hash.update(password.as_bytes());
    hash.update(user.as_bytes());
    format!("md5{}", hex_lower(&hash.finalize()))
}

/// What a client knowing the password answers to an MD5 challenge with `salt`.
///
/// Works for plaintext and MD5 secrets; `None` for SCRAM secrets (they cannot produce
/// the MD5 hash).
pub fn md5_response(user: &str, secret: &Secret, salt: [u8; 4]) -> Option<String> {
    let inner = match secret {
        Secret::Plain(password) => md5_secret(user, password),
        Secret::Md5(hash) => hash.to_ascii_lowercase(),
        Secret::Scram(_) => return None,
    };
    let inner_hex = inner.strip_prefix("md5")?;
    let mut hash = Md5::new();
    hash.update(inner_hex.as_bytes());
    hash.update(salt);
    Some(format!("md5{}", hex_lower(&hash.finalize())))
}

/// Checks a client's `PasswordMessage` answer to an MD5 challenge, in constant time.
///
/// Always `false` for SCRAM secrets.
pub fn verify_md5(user: &str, secret: &Secret, salt: [u8; 4], client_response: &str) -> bool {
    match md5_response(user, secret, salt) {
        Some(expected) => ct_eq(expected.as_bytes(), client_response.as_bytes()),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram_secret_from_password;

    const SALT: [u8; 4] = [0x01, 0x02, 0x03, 0x04];

    #[test]
    fn md5_secret_vector() {
        assert_eq!(
            md5_secret("postgres", "postgres"),
            "md53175bce1d3201d16594cebf9d7eb3f9d"
        );
        assert_eq!(
            md5_secret("postgres", "postgres"),
            postgres_protocol::password::md5(b"postgres", "postgres")
        );
    }

    #[test]
    fn response_matches_libpq_algorithm() {
        let expected = postgres_protocol::authentication::md5_hash(b"alice", b"secret", SALT);
        let plain = Secret::Plain("secret".into());
        let hashed = Secret::parse(&md5_secret("alice", "secret"));
        assert!(matches!(hashed, Secret::Md5(_)));
        assert_eq!(
            md5_response("alice", &plain, SALT).as_deref(),
            Some(&*expected)
        );
        assert_eq!(
            md5_response("alice", &hashed, SALT).as_deref(),
            Some(&*expected)
        );
    }

    #[test]
    fn verify_plain_and_md5_secrets() {
        let answer = postgres_protocol::authentication::md5_hash(b"bob", b"pw", SALT);
        let wrong = postgres_protocol::authentication::md5_hash(b"bob", b"pw2", SALT);
        let other_salt = postgres_protocol::authentication::md5_hash(b"bob", b"pw", [9, 9, 9, 9]);
        for secret in [
            Secret::Plain("pw".into()),
            Secret::parse(&md5_secret("bob", "pw")),
        ] {
            assert!(verify_md5("bob", &secret, SALT, &answer));
            assert!(!verify_md5("bob", &secret, SALT, &wrong));
            assert!(!verify_md5("bob", &secret, SALT, &other_salt));
            assert!(!verify_md5("bob", &secret, SALT, ""));
            assert!(!verify_md5(
                "bob",
                &secret,
                SALT,
                &answer[..answer.len() - 1]
            ));
        }
    }

    #[test]
    fn plain_secret_is_salted_with_the_user() {
        let answer = postgres_protocol::authentication::md5_hash(b"bob", b"pw", SALT);
        assert!(!verify_md5(
            "eve",
            &Secret::Plain("pw".into()),
            SALT,
            &answer
        ));
    }

    #[test]
    fn scram_secret_cannot_do_md5() {
        let secret = Secret::parse(&scram_secret_from_password("pw", b"salt", 16));
        assert!(matches!(secret, Secret::Scram(_)));
        assert_eq!(md5_response("bob", &secret, SALT), None);
        assert!(!verify_md5("bob", &secret, SALT, "md5"));
    }
}

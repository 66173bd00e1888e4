//! Authentication primitives: stored secrets, MD5 password checks and SCRAM-SHA-256
//! (server side for clients logging in to Sluice, client side for Sluice logging in to
//! PostgreSQL).
//!
//! Everything here but `pam` and `ldap` (which call system libraries) is pure
//! computation: no I/O, no async, no global state. Callers feed
//! the bytes of the relevant protocol messages in and send the returned bytes out.
//! Deriving keys from a plaintext password (PBKDF2) is CPU-heavy, so callers should run
//! [`ScramServer::derive_plain`] (and [`ScramServer::new`] for [`Secret::Plain`] secrets)
//! on a blocking thread; [`DerivedSecrets`] keeps what was derived.

mod derived;
mod dl;
pub mod hba;
#[cfg(test)]
mod hostile_tests;
pub mod ident;
pub mod ldap;
mod ldap_options;
mod md5;
pub mod pam;
mod scram_client;
mod scram_common;
mod scram_server;
#[cfg(test)]
mod scram_tests;
mod secret;

pub use self::derived::DerivedSecrets;
pub use self::ldap_options::{LdapOptions, Scope as LdapScope};
pub use self::md5::{md5_response, md5_secret, verify_md5};
pub use self::scram_client::{DerivedKeys, ScramClient, ScramCredential};
pub use self::scram_common::{scram_secret_from_password, MAX_SERVER_ITERATIONS, SCRAM_SHA_256};
pub use self::scram_server::ScramServer;
pub use self::secret::{ScramSecret, Secret};

/// Errors of an authentication exchange.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The peer sent a message that does not parse; the text names the problem.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The peer asked for a feature Sluice does not implement (channel binding,
    /// authorization identity, mandatory extensions, excessive iteration counts).
    #[error("unsupported SCRAM feature: {0}")]
    Unsupported(&'static str),
    /// The client's proof did not match the stored secret.
    #[error("password authentication failed")]
    WrongPassword,
    /// The server's signature did not match: it does not know the password.
    #[error("SCRAM server signature mismatch")]
    ServerSignatureMismatch,
    /// The server ended the exchange with an `e=` error attribute.
    #[error("SCRAM server error: {0}")]
    ServerError(String),
    /// A step was called out of order (or after the exchange already failed).
    #[error("SCRAM exchange step out of order: {0}")]
    OutOfOrder(&'static str),
}

/// Compares two byte strings in time independent of where they differ.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Lowercase hexadecimal encoding.
pub(crate) fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_eq_compares_contents_and_length() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }

    #[test]
    fn hex_lower_encodes() {
        assert_eq!(hex_lower(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex_lower(&[]), "");
    }
}

//! Shared SCRAM-SHA-256 pieces: key derivation, attribute parsing, nonces and SASLprep.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use rand::Rng;
use sha2::{Digest, Sha256};

use super::secret::{ScramSecret, Secret};
use super::AuthError;

/// The SASL mechanism name Sluice offers and uses.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// The highest iteration count [`crate::auth::ScramClient`] accepts from a server, so a
/// hostile server cannot make Sluice burn CPU on PBKDF2.
pub const MAX_SERVER_ITERATIONS: u32 = 1_000_000;

/// Raw bytes of the random part of a nonce (base64-encoded to 24 characters), as
/// PostgreSQL does.
const NONCE_RAW_LEN: usize = 18;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA-256 keyed with `key`.
pub(crate) fn hmac(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length (long ones are hashed); this never fails.
    <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

/// `HMAC-SHA-256(key, data)`.
pub(crate) fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = hmac(key);
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// `SHA-256(data)`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// `a XOR b`.
pub(crate) fn xor(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// `Hi()` of RFC 5802: PBKDF2-HMAC-SHA-256 with a single output block.
pub(crate) fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let keyed = hmac(password);
    let mut mac = keyed.clone();
    mac.update(salt);
    mac.update(&[0, 0, 0, 1]);
    let mut prev: [u8; 32] = mac.finalize().into_bytes().into();
    let mut out = prev;
    for _ in 1..iterations {
        let mut mac = keyed.clone();
        mac.update(&prev);
        prev = mac.finalize().into_bytes().into();
        for (o, p) in out.iter_mut().zip(prev) {
            *o ^= p;
        }
    }
    out
}

/// `(ClientKey, ServerKey)` from a salted password.
pub(crate) fn keys_from_salted(salted: &[u8; 32]) -> ([u8; 32], [u8; 32]) {
    (
        hmac_sha256(salted, b"Client Key"),
        hmac_sha256(salted, b"Server Key"),
    )
}

/// `ClientKey XOR HMAC(SHA-256(ClientKey), AuthMessage)`.
pub(crate) fn client_proof(client_key: &[u8; 32], auth_message: &[u8]) -> [u8; 32] {
    xor(client_key, &hmac_sha256(&sha256(client_key), auth_message))
}

/// A fresh nonce: 18 random bytes, base64 (printable, never contains `,`).
pub(crate) fn random_nonce() -> String {
    let mut raw = [0u8; NONCE_RAW_LEN];
    rand::rng().fill_bytes(&mut raw);
    b64(&raw)
}

/// Standard base64 with padding.
pub(crate) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Decodes standard base64, naming `what` on failure.
pub(crate) fn unb64(text: &[u8], what: &'static str) -> Result<Vec<u8>, AuthError> {
    STANDARD
        .decode(text)
        .map_err(|_| AuthError::Malformed(what))
}

/// Decodes a base64 attribute that must hold exactly 32 bytes.
pub(crate) fn unb64_32(text: &[u8], what: &'static str) -> Result<[u8; 32], AuthError> {
    unb64(text, what)?
        .try_into()
        .map_err(|_| AuthError::Malformed(what))
}

/// The value of attribute `name` (`<name>=<value>`), or `Malformed(what)`.
pub(crate) fn attr<'a>(
    part: &'a [u8],
    name: u8,
    what: &'static str,
) -> Result<&'a [u8], AuthError> {
    match part {
        [n, b'=', value @ ..] if *n == name => Ok(value),
        _ => Err(AuthError::Malformed(what)),
    }
}

/// Checks that `part` looks like an (ignored) extension attribute: `<letter>=<value>`.
pub(crate) fn check_extension(part: &[u8]) -> Result<(), AuthError> {
    match part {
        [n, b'=', ..] if n.is_ascii_alphabetic() => Ok(()),
        _ => Err(AuthError::Malformed("invalid attribute")),
    }
}

/// Checks a nonce value: non-empty, printable ASCII except `,`.
pub(crate) fn check_nonce(nonce: &[u8]) -> Result<&str, AuthError> {
    if nonce.is_empty()
        || !nonce
            .iter()
            .all(|&b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(AuthError::Malformed("invalid nonce"));
    }
    std::str::from_utf8(nonce).map_err(|_| AuthError::Malformed("invalid nonce"))
}

/// Whether SASLprep (as PostgreSQL applies it) leaves `password` as its raw bytes, so
/// this crate can hash it itself.
///
/// PostgreSQL hashes the SASLprep'd password if the password is valid SASLprep input,
/// else the raw bytes. ASCII passwords are never changed by SASLprep (or are rejected by
/// it, and then used raw). Other passwords are checked against `postgres-protocol`'s
/// SASLprep with a cheap one-iteration probe exchange; when that normalizes the password
/// (Unicode NFKC, mapped spaces, ...), callers must delegate to `postgres-protocol`.
pub(crate) fn saslprep_is_identity(password: &str) -> bool {
    password.is_ascii() || probe_uses_raw(password).unwrap_or(true)
}

/// Whether `postgres-protocol`'s SCRAM client hashes `password` as its raw bytes;
/// `None` if the probe exchange itself failed.
fn probe_uses_raw(password: &str) -> Option<bool> {
    const SALT: &[u8] = b"sluice saslprep probe";
    let mut scram = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
    let first = std::str::from_utf8(scram.message()).ok()?.to_owned();
    let nonce = first.strip_prefix("n,,n=,r=")?;
    let server_first = format!("r={nonce}probe,s={},i=1", b64(SALT));
    scram.update(server_first.as_bytes()).ok()?;
    let client_final = std::str::from_utf8(scram.message()).ok()?;
    let (without_proof, proof) = client_final.rsplit_once(",p=")?;
    let proof = STANDARD.decode(proof).ok()?;
    let auth_message = format!("n=,r={nonce},{server_first},{without_proof}");
    let (client_key, _) = keys_from_salted(&hi(password.as_bytes(), SALT, 1));
    Some(client_proof(&client_key, auth_message.as_bytes())[..] == proof[..])
}

/// The SCRAM verifier for `password` with this salt and iteration count.
///
/// For the rare non-ASCII password that SASLprep normalizes differently, the verifier
/// comes from `postgres_protocol::password::scram_sha_256`, which picks its own random
/// salt and 4096 iterations.
pub(crate) fn derive_secret(password: &str, salt: &[u8], iterations: u32) -> ScramSecret {
    if !saslprep_is_identity(password) {
        let text = postgres_protocol::password::scram_sha_256(password.as_bytes());
        if let Secret::Scram(secret) = Secret::parse(&text) {
            return secret;
        }
        // postgres-protocol always emits a well-formed verifier; should it ever not,
        // hash the raw bytes as PostgreSQL does when SASLprep fails.
    }
    let iterations = iterations.max(1);
    let (client_key, server_key) = keys_from_salted(&hi(password.as_bytes(), salt, iterations));
    ScramSecret {
        iterations,
        salt: salt.to_vec(),
        stored_key: sha256(&client_key),
        server_key,
    }
}

/// The `SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>` text for `password`, as
/// PostgreSQL would store it (SASLprep applied). Meant for building userlists in tests.
///
/// Non-ASCII passwords whose SASLprep form differs from their bytes get a random salt
/// and 4096 iterations instead (see `postgres_protocol::password::scram_sha_256`).
pub fn scram_secret_from_password(password: &str, salt: &[u8], iterations: u32) -> String {
    derive_secret(password, salt, iterations).to_secret_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc7677_secret() {
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let text = scram_secret_from_password("pencil", &salt, 4096);
        assert_eq!(
            text,
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$\
             WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
             wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
        );
        let Secret::Scram(parsed) = Secret::parse(&text) else {
            panic!("secret must parse as SCRAM");
        };
        assert_eq!(parsed, derive_secret("pencil", &salt, 4096));
    }

    #[test]
    fn hi_matches_pbkdf2_rfc7914_vector() {
        // RFC 7914 section 11: PBKDF2-HMAC-SHA256("passwd", "salt", 1), first 32 bytes.
        assert_eq!(
            crate::auth::hex_lower(&hi(b"passwd", b"salt", 1)),
            "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
        );
    }

    #[test]
    fn saslprep_ascii_and_identity_use_raw_bytes() {
        for pw in [
            "pencil",
            "",
            "tab\tand\x01ctl",
            "caf\u{e9}",
            "\u{4e2d}\u{6587}",
        ] {
            assert!(saslprep_is_identity(pw), "{pw:?}");
        }
    }

    #[test]
    fn saslprep_normalizing_passwords_delegate() {
        // NFKC changes the ligature and the decomposed accent; the no-break space maps to
        // a space and the soft hyphen to nothing.
        for pw in ["\u{fb01}sh", "cafe\u{301}", "a\u{a0}b", "soft\u{ad}hyphen"] {
            assert!(!saslprep_is_identity(pw), "{pw:?}");
        }
    }

    #[test]
    fn nonces_are_printable_and_fresh() {
        let a = random_nonce();
        let b = random_nonce();
        assert_eq!(a.len(), 24);
        assert!(check_nonce(a.as_bytes()).is_ok());
        assert_ne!(a, b);
    }

    #[test]
    fn attribute_helpers() {
        assert_eq!(attr(b"r=abc", b'r', "x"), Ok(&b"abc"[..]));
        assert_eq!(attr(b"r=", b'r', "x"), Ok(&b""[..]));
        assert_eq!(attr(b"s=abc", b'r', "x"), Err(AuthError::Malformed("x")));
        assert_eq!(attr(b"r", b'r', "x"), Err(AuthError::Malformed("x")));
        assert!(check_extension(b"x=1").is_ok());
        assert!(check_extension(b"1=1").is_err());
        assert!(check_extension(b"").is_err());
        assert!(check_nonce(b"").is_err());
        assert!(check_nonce(b"a b").is_err());
        assert!(check_nonce(&[0xff]).is_err());
    }
}

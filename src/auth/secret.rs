//! Stored password secrets as they appear in `auth_file` / `pg_authid.rolpassword`:
//! plaintext, `md5` hashes and `SCRAM-SHA-256$...` verifiers.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// A stored password secret for one user.
///
/// `Debug` is redacted so secrets do not leak into logs.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// A plaintext password.
    Plain(String),
    /// An MD5 hash: `"md5"` followed by 32 lowercase hex digits of `md5(password + user)`.
    Md5(String),
    /// A SCRAM-SHA-256 verifier.
    Scram(ScramSecret),
}

/// A parsed SCRAM-SHA-256 verifier
/// (`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramSecret {
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// The salt (decoded).
    pub salt: Vec<u8>,
    /// `SHA-256(ClientKey)`.
    pub stored_key: [u8; 32],
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: [u8; 32],
}

impl Secret {
    /// Classifies a stored password the way PostgreSQL and PgBouncer do: a well-formed
    /// SCRAM verifier, else `md5` followed by exactly 32 hex digits (stored lowercased),
    /// else a plaintext password.
    pub fn parse(s: &str) -> Secret {
        if let Some(scram) = ScramSecret::parse(s) {
            return Secret::Scram(scram);
        }
        if let Some(hex) = s.strip_prefix("md5") {
            if hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Secret::Md5(format!("md5{}", hex.to_ascii_lowercase()));
            }
        }
        Secret::Plain(s.to_owned())
    }

    /// Whether the secret can serve a SCRAM exchange (everything but MD5 hashes).
    pub fn supports_scram(&self) -> bool {
        !matches!(self, Secret::Md5(_))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Plain(_) => f.write_str("Plain(<redacted>)"),
            Secret::Md5(_) => f.write_str("Md5(<redacted>)"),
            Secret::Scram(s) => f.debug_tuple("Scram").field(s).finish(),
        }
    }
}

impl ScramSecret {
    /// Parses `SCRAM-SHA-256$<iterations>:<salt b64>$<StoredKey b64>:<ServerKey b64>`;
    /// `None` if anything is off (iterations must be at least 1, keys exactly 32 bytes).
    pub fn parse(s: &str) -> Option<ScramSecret> {
        let rest = s.strip_prefix("SCRAM-SHA-256$")?;
        let (iter_salt, keys) = rest.split_once('$')?;
        let (iterations, salt) = iter_salt.split_once(':')?;
        let (stored_key, server_key) = keys.split_once(':')?;
        if iterations.is_empty() || !iterations.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let iterations: u32 = iterations.parse().ok()?;
        if iterations == 0 {
            return None;
        }
        let salt = STANDARD.decode(salt).ok()?;
        Some(ScramSecret {
            iterations,
            salt,
            stored_key: decode_key(stored_key)?,
            server_key: decode_key(server_key)?,
        })
    }

    /// The textual form accepted by [`ScramSecret::parse`] (and by PostgreSQL).
    pub fn to_secret_string(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            STANDARD.encode(&self.salt),
            STANDARD.encode(self.stored_key),
            STANDARD.encode(self.server_key)
        )
    }
}

impl fmt::Debug for ScramSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramSecret")
            .field("iterations", &self.iterations)
            .field("salt", &STANDARD.encode(&self.salt))
            .field("stored_key", &"<redacted>")
            .field("server_key", &"<redacted>")
            .finish()
    }
}

fn decode_key(b64: &str) -> Option<[u8; 32]> {
    STANDARD.decode(b64).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RFC_SECRET: &str = "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$\
        WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";

    #[test]
    fn parses_scram() {
        let Secret::Scram(s) = Secret::parse(RFC_SECRET) else {
            panic!("expected SCRAM secret");
        };
        assert_eq!(s.iterations, 4096);
        assert_eq!(STANDARD.encode(&s.salt), "W22ZaJ0SNY7soEsUEjb6gQ==");
        assert_eq!(
            STANDARD.encode(s.stored_key),
            "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY="
        );
        assert_eq!(s.to_secret_string(), RFC_SECRET);
    }

    #[test]
    fn parses_md5() {
        let lower = "md53175bce1d3201d16594cebf9d7eb3f9d";
        assert_eq!(Secret::parse(lower), Secret::Md5(lower.to_owned()));
        assert_eq!(
            Secret::parse("md53175BCE1D3201D16594CEBF9D7EB3F9D"),
            Secret::Md5(lower.to_owned())
        );
    }

    #[test]
    fn everything_else_is_plaintext() {
        const SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
        const KEYS: &str = "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                            wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";
        for s in [
            "".to_owned(),
            "postgres".to_owned(),
            "md5".to_owned(),
            "md53175bce1d3201d16594cebf9d7eb3f9".to_owned(), // 31 digits
            "md53175bce1d3201d16594cebf9d7eb3f9d0".to_owned(), // 33 digits
            "md53175bce1d3201d16594cebf9d7eb3f9g".to_owned(), // not hex
            format!("SCRAM-SHA-256$4096:{SALT}$WG5d:wfPL"),  // short keys
            format!("SCRAM-SHA-256$0:{SALT}${KEYS}"),
            format!("SCRAM-SHA-256$x:{SALT}${KEYS}"),
            format!("SCRAM-SHA-256$-1:{SALT}${KEYS}"),
            format!("SCRAM-SHA-256$4294967296:{SALT}${KEYS}"),
            format!("SCRAM-SHA-256$4096:!!${KEYS}"),
            format!("SCRAM-SHA-256$4096:{SALT}"),
            format!("SCRAM-SHA-256$4096:{SALT}${KEYS}$"),
            format!("SCRAM-SHA-1$4096:{SALT}${KEYS}"),
        ] {
            assert_eq!(Secret::parse(&s), Secret::Plain(s.clone()), "{s:?}");
        }
        assert!(matches!(
            Secret::parse(&format!("SCRAM-SHA-256$4096:{SALT}${KEYS}")),
            Secret::Scram(_)
        ));
    }

    #[test]
    fn debug_is_redacted() {
        let text = format!(
            "{:?} {:?}",
            Secret::parse("hunter2"),
            Secret::parse(RFC_SECRET)
        );
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("WG5d8oPm"), "{text}");
    }

    #[test]
    fn supports_scram() {
        assert!(Secret::parse("pw").supports_scram());
        assert!(Secret::parse(RFC_SECRET).supports_scram());
        assert!(!Secret::parse("md53175bce1d3201d16594cebf9d7eb3f9d").supports_scram());
    }
}

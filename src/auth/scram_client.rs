//! The SCRAM-SHA-256 client side (RFC 5802 / RFC 7677): Sluice logging in to PostgreSQL.
//!
//! Works either with the password or, for SCRAM pass-through, with a ClientKey and
//! ServerKey recovered from the client's own exchange with Sluice (see
//! [`crate::auth::ScramServer::client_key`]). No channel binding: the gs2 header is `n,,`.

use std::fmt;
use std::sync::Mutex;

use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

use super::scram_common::{
    attr, b64, check_extension, check_nonce, client_proof, hi, hmac_sha256, keys_from_salted,
    random_nonce, saslprep_is_identity, sha256, unb64, unb64_32, MAX_SERVER_ITERATIONS,
};
use super::{ct_eq, AuthError};

/// The iteration cap of `postgres-protocol`, which handles passwords that SASLprep
/// normalizes.
const DELEGATE_MAX_ITERATIONS: u32 = 100_000;

/// What Sluice proves its identity with.
#[derive(Clone, PartialEq, Eq)]
pub enum ScramCredential {
    /// The plaintext password (SASLprep'd as PostgreSQL does).
    Password(String),
    /// Pass-through keys: no password needed, only the verifier's keys.
    Keys {
        /// `HMAC(SaltedPassword, "Client Key")`.
        client_key: [u8; 32],
        /// `HMAC(SaltedPassword, "Server Key")`.
        server_key: [u8; 32],
    },
}

impl fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScramCredential::Password(_) => f.write_str("Password(<redacted>)"),
            ScramCredential::Keys { .. } => f.write_str("Keys(<redacted>)"),
        }
    }
}

/// The keys a password gave for one salt and iteration count (PBKDF2, ~0.5 ms at
/// PostgreSQL's 4096 rounds, up to a million rounds), kept by a pool so that its next
/// server login skips the derivation: PostgreSQL stores one salt per role, so every
/// login as the pool's user is asked for the same salt. The password is kept only as
/// its SHA-256, to tell a changed one (a reload, `auth_query`) from the one derived.
#[derive(Clone)]
pub struct DerivedKeys {
    password: [u8; 32],
    salt: Vec<u8>,
    iterations: u32,
    client_key: [u8; 32],
    server_key: [u8; 32],
}

impl fmt::Debug for DerivedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DerivedKeys(<redacted>, {} rounds)", self.iterations)
    }
}

/// One client-side SCRAM-SHA-256 exchange.
pub struct ScramClient {
    cred: ScramCredential,
    /// The keys this exchange derived from its password, for [`ScramClient::take_derived`].
    derived: Option<DerivedKeys>,
    /// Our nonce.
    nonce: String,
    /// `n=<user>,r=<nonce>` (the user is always empty outside tests, as in libpq).
    client_first_bare: String,
    /// `postgres-protocol`'s client, for passwords only it can SASLprep.
    delegate: Option<Mutex<ScramSha256>>,
    state: State,
}

enum State {
    AwaitingServerFirst,
    AwaitingServerFinal {
        auth_message: Vec<u8>,
        server_key: [u8; 32],
    },
    DelegateAwaitingServerFinal,
    Failed,
}

impl ScramClient {
    /// Starts an exchange with a fresh random nonce.
    pub fn new(cred: ScramCredential) -> ScramClient {
        if let ScramCredential::Password(password) = &cred {
            if !saslprep_is_identity(password) {
                let delegate = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
                let nonce = std::str::from_utf8(delegate.message())
                    .ok()
                    .and_then(|first| first.strip_prefix("n,,n=,r="))
                    .map(str::to_owned);
                if let Some(nonce) = nonce {
                    let mut client = ScramClient::with_user_and_nonce(cred, "", &nonce);
                    client.delegate = Some(Mutex::new(delegate));
                    return client;
                }
            }
        }
        ScramClient::with_user_and_nonce(cred, "", &random_nonce())
    }

    /// Builds an exchange with a chosen user name and nonce (pinned in tests).
    fn with_user_and_nonce(cred: ScramCredential, user: &str, nonce: &str) -> ScramClient {
        ScramClient {
            cred,
            nonce: nonce.to_owned(),
            client_first_bare: format!("n={user},r={nonce}"),
            derived: None,
            delegate: None,
            state: State::AwaitingServerFirst,
        }
    }

    /// Whether [`ScramClient::handle_server_first`] derives keys from a password
    /// (PBKDF2 over the server's iteration count, up to a million rounds): then it
    /// belongs on a blocking thread, not on an event loop other clients share.
    pub fn derives_keys(&self) -> bool {
        matches!(self.cred, ScramCredential::Password(_))
    }

    /// Takes the keys `cached` holds in place of the password, when they were derived
    /// from this password with the salt and iteration count that `server_first` asks
    /// for: then [`ScramClient::derives_keys`] is false. Returns whether it did.
    pub fn adopt(&mut self, server_first: &[u8], cached: &DerivedKeys) -> bool {
        let ScramCredential::Password(password) = &self.cred else {
            return false;
        };
        if self.delegate.is_some() {
            return false;
        }
        let Ok(first) = parse_server_first(server_first, &self.nonce) else {
            return false;
        };
        if first.salt != cached.salt
            || first.iterations != cached.iterations
            || !ct_eq(&sha256(password.as_bytes()), &cached.password)
        {
            return false;
        }
        self.cred = ScramCredential::Keys {
            client_key: cached.client_key,
            server_key: cached.server_key,
        };
        true
    }

    /// The keys this exchange derived from its password. Take them only once the
    /// server proved it knows them ([`ScramClient::verify_server_final`]): then they
    /// are worth keeping for the next login.
    pub fn take_derived(&mut self) -> Option<DerivedKeys> {
        self.derived.take()
    }

    /// The client-first-message (data of `SASLInitialResponse`): `n,,n=,r=<nonce>`.
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// Takes the server-first-message (`AuthenticationSASLContinue` data) and returns the
    /// client-final-message (for `SASLResponse`).
    pub fn handle_server_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::AwaitingServerFirst) {
            self.state = State::Failed;
            return Err(AuthError::OutOfOrder(
                "server-first-message already handled",
            ));
        }
        self.state = State::Failed;
        let first = parse_server_first(msg, &self.nonce)?;

        if let Some(delegate) = &self.delegate {
            if first.iterations > DELEGATE_MAX_ITERATIONS {
                return Err(AuthError::Unsupported("iteration count too high"));
            }
            let mut delegate = delegate.lock().unwrap_or_else(|e| e.into_inner());
            delegate
                .update(msg)
                .map_err(|_| AuthError::Malformed("server-first-message rejected"))?;
            let out = delegate.message().to_vec();
            self.state = State::DelegateAwaitingServerFinal;
            return Ok(out);
        }

        let (client_key, server_key) = match &self.cred {
            ScramCredential::Password(password) => {
                let keys =
                    keys_from_salted(&hi(password.as_bytes(), &first.salt, first.iterations));
                self.derived = Some(DerivedKeys {
                    password: sha256(password.as_bytes()),
                    salt: first.salt.clone(),
                    iterations: first.iterations,
                    client_key: keys.0,
                    server_key: keys.1,
                });
                keys
            }
            ScramCredential::Keys {
                client_key,
                server_key,
            } => (*client_key, *server_key),
        };
        let without_proof = format!("c={},r={}", b64(b"n,,"), first.nonce);
        let mut auth_message = self.client_first_bare.clone().into_bytes();
        auth_message.push(b',');
        auth_message.extend_from_slice(msg);
        auth_message.push(b',');
        auth_message.extend_from_slice(without_proof.as_bytes());
        let proof = client_proof(&client_key, &auth_message);
        self.state = State::AwaitingServerFinal {
            auth_message,
            server_key,
        };
        Ok(format!("{without_proof},p={}", b64(&proof)).into_bytes())
    }

    /// Checks the server-final-message (`AuthenticationSASLFinal` data): `Ok` only if the
    /// server proved it knows the secret.
    pub fn verify_server_final(&self, msg: &[u8]) -> Result<(), AuthError> {
        let verifier = parse_server_final(msg)?;
        match &self.state {
            State::AwaitingServerFinal {
                auth_message,
                server_key,
            } => {
                if ct_eq(&hmac_sha256(server_key, auth_message), &verifier) {
                    Ok(())
                } else {
                    Err(AuthError::ServerSignatureMismatch)
                }
            }
            State::DelegateAwaitingServerFinal => {
                let delegate = self
                    .delegate
                    .as_ref()
                    .ok_or(AuthError::OutOfOrder("no exchange in progress"))?;
                let mut delegate = delegate.lock().unwrap_or_else(|e| e.into_inner());
                delegate
                    .finish(msg)
                    .map_err(|_| AuthError::ServerSignatureMismatch)
            }
            State::AwaitingServerFirst => Err(AuthError::OutOfOrder(
                "server-final-message before server-first-message",
            )),
            State::Failed => Err(AuthError::OutOfOrder("exchange already failed")),
        }
    }
}

struct ServerFirst<'a> {
    nonce: &'a str,
    salt: Vec<u8>,
    iterations: u32,
}

fn parse_server_first<'a>(msg: &'a [u8], client_nonce: &str) -> Result<ServerFirst<'a>, AuthError> {
    if msg.is_empty() {
        return Err(AuthError::Malformed("empty server-first-message"));
    }
    let mut parts = msg.split(|&b| b == b',');
    let first = parts.next().unwrap_or_default();
    if first.starts_with(b"m=") {
        return Err(AuthError::Unsupported("mandatory extension"));
    }
    let nonce = check_nonce(attr(first, b'r', "missing nonce")?)?;
    if nonce.len() <= client_nonce.len() || !nonce.starts_with(client_nonce) {
        return Err(AuthError::Malformed(
            "server nonce does not extend client nonce",
        ));
    }
    let salt = attr(
        parts.next().ok_or(AuthError::Malformed("missing salt"))?,
        b's',
        "missing salt",
    )?;
    let salt = unb64(salt, "invalid salt")?;
    if salt.is_empty() {
        return Err(AuthError::Malformed("empty salt"));
    }
    let iterations = attr(
        parts
            .next()
            .ok_or(AuthError::Malformed("missing iteration count"))?,
        b'i',
        "missing iteration count",
    )?;
    let iterations = parse_iterations(iterations)?;
    parts.try_for_each(check_extension)?;
    Ok(ServerFirst {
        nonce,
        salt,
        iterations,
    })
}

fn parse_iterations(text: &[u8]) -> Result<u32, AuthError> {
    const INVALID: AuthError = AuthError::Malformed("invalid iteration count");
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return Err(INVALID);
    }
    if text.len() > 10 {
        return Err(AuthError::Unsupported("iteration count too high"));
    }
    let n = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or(INVALID)?;
    match n {
        0 => Err(INVALID),
        n if n > u64::from(MAX_SERVER_ITERATIONS) => {
            Err(AuthError::Unsupported("iteration count too high"))
        }
        // In range: at most MAX_SERVER_ITERATIONS.
        n => u32::try_from(n).map_err(|_| INVALID),
    }
}

/// The decoded `v=` verifier, or the server's `e=` error.
fn parse_server_final(msg: &[u8]) -> Result<[u8; 32], AuthError> {
    if msg.is_empty() {
        return Err(AuthError::Malformed("empty server-final-message"));
    }
    let mut parts = msg.split(|&b| b == b',');
    let first = parts.next().unwrap_or_default();
    if let Ok(error) = attr(first, b'e', "") {
        return Err(AuthError::ServerError(
            String::from_utf8_lossy(error).into_owned(),
        ));
    }
    let verifier = unb64_32(attr(first, b'v', "missing verifier")?, "invalid verifier")?;
    parts.try_for_each(check_extension)?;
    Ok(verifier)
}

#[cfg(test)]
#[path = "scram_client_tests.rs"]
mod tests;

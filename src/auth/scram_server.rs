//! The SCRAM-SHA-256 server side (RFC 5802 / RFC 7677): Sluice authenticating a client.
//!
//! Only the `SCRAM-SHA-256` mechanism without channel binding is offered: the client's
//! gs2 header must be `n,,` or `y,,`. As in PostgreSQL, the username inside the SCRAM
//! messages is ignored; the startup packet's user is the one being authenticated.

use rand::Rng;

use super::scram_common::{
    attr, b64, check_extension, check_nonce, derive_secret, hmac_sha256, random_nonce, sha256,
    unb64, unb64_32, xor,
};
use super::secret::{ScramSecret, Secret};
use super::{ct_eq, AuthError};

/// Length of the random salt generated for plaintext secrets.
const SALT_LEN: usize = 16;

/// Key for [`ScramServer::mock`] salts when the caller has no secret of its own.
const DEFAULT_MOCK_KEY: &[u8] = b"sluice mock SCRAM salt";

/// One server-side SCRAM-SHA-256 exchange.
pub struct ScramServer {
    secret: ScramSecret,
    /// The server's part of the nonce.
    server_nonce: String,
    /// A fake exchange for an unknown user: always fails at the end.
    mock: bool,
    state: State,
}

enum State {
    AwaitingClientFirst,
    AwaitingClientFinal {
        gs2_header: Vec<u8>,
        client_first_bare: Vec<u8>,
        server_first: String,
        nonce: String,
    },
    Succeeded {
        client_key: [u8; 32],
    },
    Failed,
}

impl ScramServer {
    /// Starts an exchange for a stored secret.
    ///
    /// A SCRAM secret is used as is; a plaintext password is hashed with a fresh random
    /// 16-byte salt and `iterations` (PBKDF2: run this on a blocking thread); an MD5
    /// secret cannot do SCRAM, so `None`.
    ///
    /// A non-ASCII plaintext password that SASLprep normalizes is hashed by
    /// `postgres-protocol` instead, with its own random salt and 4096 iterations.
    pub fn new(secret: &Secret, iterations: u32) -> Option<ScramServer> {
        let secret = match secret {
            Secret::Scram(scram) => scram.clone(),
            Secret::Plain(password) => ScramServer::derive_plain(password, iterations),
            Secret::Md5(_) => return None,
        };
        Some(ScramServer::for_secret(secret))
    }

    /// The SCRAM secret for a plaintext password, with a fresh random 16-byte salt and
    /// `iterations` (PBKDF2: run this on a blocking thread).
    pub fn derive_plain(password: &str, iterations: u32) -> ScramSecret {
        let mut salt = [0u8; SALT_LEN];
        rand::rng().fill_bytes(&mut salt);
        derive_secret(password, &salt, iterations)
    }

    /// Starts an exchange for a SCRAM secret at hand (one derived earlier from a
    /// plaintext password: [`super::DerivedSecrets`]).
    pub fn for_secret(secret: ScramSecret) -> ScramServer {
        ScramServer::with_nonce(secret, random_nonce(), false)
    }

    /// A fake exchange for an unknown user that looks like a real one (stable per-user
    /// salt, the given iteration count) and always fails with
    /// [`AuthError::WrongPassword`] at the end, so clients cannot probe which users exist.
    ///
    /// The salt is derived from the user name with a fixed key; see
    /// [`ScramServer::mock_keyed`] to make it unpredictable.
    pub fn mock(user: &str, iterations: u32) -> ScramServer {
        ScramServer::mock_keyed(user, iterations, DEFAULT_MOCK_KEY)
    }

    /// Like [`ScramServer::mock`], with salts derived from `key` (for example a random
    /// value the caller picks once per process), so outsiders cannot predict them.
    pub fn mock_keyed(user: &str, iterations: u32, key: &[u8]) -> ScramServer {
        let digest = hmac_sha256(key, user.as_bytes());
        let mut keys = [0u8; 64];
        rand::rng().fill_bytes(&mut keys);
        let secret = ScramSecret {
            iterations: iterations.max(1),
            salt: digest[..SALT_LEN].to_vec(),
            stored_key: std::array::from_fn(|i| keys[i]),
            server_key: std::array::from_fn(|i| keys[32 + i]),
        };
        ScramServer::with_nonce(secret, random_nonce(), true)
    }

    /// Builds an exchange with a chosen server nonce (pinned in tests).
    fn with_nonce(secret: ScramSecret, server_nonce: String, mock: bool) -> ScramServer {
        ScramServer {
            secret,
            server_nonce,
            mock,
            state: State::AwaitingClientFirst,
        }
    }

    /// Takes the client-first-message (the data of `SASLInitialResponse`) and returns the
    /// server-first-message (for `AuthenticationSASLContinue`).
    pub fn handle_client_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::AwaitingClientFirst) {
            self.state = State::Failed;
            return Err(AuthError::OutOfOrder(
                "client-first-message already handled",
            ));
        }
        self.state = State::Failed;
        let (gs2_header, client_first_bare, client_nonce) = parse_client_first(msg)?;
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            b64(&self.secret.salt),
            self.secret.iterations
        );
        let out = server_first.clone().into_bytes();
        self.state = State::AwaitingClientFinal {
            gs2_header: gs2_header.to_vec(),
            client_first_bare: client_first_bare.to_vec(),
            server_first,
            nonce,
        };
        Ok(out)
    }

    /// Takes the client-final-message (the data of `SASLResponse`) and returns the
    /// server-final-message `v=<ServerSignature>` (for `AuthenticationSASLFinal`), or
    /// [`AuthError::WrongPassword`] if the proof does not match.
    pub fn handle_client_final(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        let State::AwaitingClientFinal {
            gs2_header,
            client_first_bare,
            server_first,
            nonce,
        } = std::mem::replace(&mut self.state, State::Failed)
        else {
            return Err(AuthError::OutOfOrder("client-final-message not expected"));
        };
        let parsed = parse_client_final(msg)?;
        if unb64(parsed.channel_binding, "invalid channel binding")? != gs2_header {
            return Err(AuthError::Malformed(
                "channel binding does not match gs2 header",
            ));
        }
        if parsed.nonce != nonce.as_bytes() {
            return Err(AuthError::Malformed("nonce mismatch"));
        }
        let mut auth_message = client_first_bare;
        auth_message.push(b',');
        auth_message.extend_from_slice(server_first.as_bytes());
        auth_message.push(b',');
        auth_message.extend_from_slice(parsed.without_proof);

        let client_signature = hmac_sha256(&self.secret.stored_key, &auth_message);
        let client_key = xor(&parsed.proof, &client_signature);
        let matches = ct_eq(&sha256(&client_key), &self.secret.stored_key);
        if !matches || self.mock {
            return Err(AuthError::WrongPassword);
        }
        self.state = State::Succeeded { client_key };
        let server_signature = hmac_sha256(&self.secret.server_key, &auth_message);
        Ok(format!("v={}", b64(&server_signature)).into_bytes())
    }

    /// After a successful exchange, the client's ClientKey (ClientProof XOR
    /// ClientSignature), for SCRAM pass-through to PostgreSQL; `None` before that.
    pub fn client_key(&self) -> Option<[u8; 32]> {
        match self.state {
            State::Succeeded { client_key } => Some(client_key),
            _ => None,
        }
    }

    /// The ServerKey of the secret in use, for SCRAM pass-through to PostgreSQL.
    pub fn server_key(&self) -> [u8; 32] {
        self.secret.server_key
    }

    /// Whether this is a [`ScramServer::mock`] exchange.
    pub fn is_mock(&self) -> bool {
        self.mock
    }
}

/// `(gs2 header, client-first-message-bare, client nonce)`.
fn parse_client_first(msg: &[u8]) -> Result<(&[u8], &[u8], &str), AuthError> {
    match msg.first() {
        None => return Err(AuthError::Malformed("empty client-first-message")),
        Some(b'n' | b'y') => {}
        Some(b'p') => return Err(AuthError::Unsupported("channel binding")),
        Some(_) => return Err(AuthError::Malformed("invalid channel binding flag")),
    }
    if msg.get(1) != Some(&b',') {
        return Err(AuthError::Malformed("invalid gs2 header"));
    }
    match msg.get(2) {
        Some(b',') => {}
        Some(b'a') => return Err(AuthError::Unsupported("authorization identity")),
        _ => return Err(AuthError::Malformed("invalid gs2 header")),
    }
    let (gs2_header, bare) = msg.split_at(3);
    let mut parts = bare.split(|&b| b == b',');
    let user = parts.next().unwrap_or_default();
    if user.starts_with(b"m=") {
        return Err(AuthError::Unsupported("mandatory extension"));
    }
    attr(user, b'n', "missing username")?;
    let nonce = attr(
        parts.next().ok_or(AuthError::Malformed("missing nonce"))?,
        b'r',
        "missing nonce",
    )?;
    let nonce = check_nonce(nonce)?;
    parts.try_for_each(check_extension)?;
    Ok((gs2_header, bare, nonce))
}

struct ClientFinal<'a> {
    channel_binding: &'a [u8],
    nonce: &'a [u8],
    proof: [u8; 32],
    without_proof: &'a [u8],
}

fn parse_client_final(msg: &[u8]) -> Result<ClientFinal<'_>, AuthError> {
    if msg.is_empty() {
        return Err(AuthError::Malformed("empty client-final-message"));
    }
    let parts: Vec<&[u8]> = msg.split(|&b| b == b',').collect();
    let first = parts.first().copied().unwrap_or_default();
    let channel_binding = attr(first, b'c', "missing channel binding")?;
    let nonce = attr(
        parts.get(1).ok_or(AuthError::Malformed("missing nonce"))?,
        b'r',
        "missing nonce",
    )?;
    let (proof_part, extensions) = match parts.get(2..) {
        Some([extensions @ .., last]) => (*last, extensions),
        _ => return Err(AuthError::Malformed("missing proof")),
    };
    extensions.iter().try_for_each(|e| check_extension(e))?;
    let proof = unb64_32(attr(proof_part, b'p', "missing proof")?, "invalid proof")?;
    let without_proof = &msg[..msg.len() - proof_part.len() - 1];
    Ok(ClientFinal {
        channel_binding,
        nonce,
        proof,
        without_proof,
    })
}

#[cfg(test)]
#[path = "scram_server_tests.rs"]
mod tests;

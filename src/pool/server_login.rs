//! A new server connection's login: answering PostgreSQL's authentication requests
//! (cleartext, MD5, SCRAM-SHA-256 with a password or pass-through keys) and reading
//! its parameters and key up to ReadyForQuery. A request the configured secret cannot
//! answer fails before anything is sent, in PgBouncer's words (error.rs).

use bytes::{Buf, BytesMut};

use super::error::PoolError;
use super::server::{read_err, KeyCache, ScramKeys, AUTH_SASL_CONTINUE, LOGIN_MAX_LEN};
use super::target::{PoolConfig, ServerAddr};
use crate::auth::{md5_response, ScramClient, ScramCredential, Secret};
use crate::net::framed::read_message;
use crate::net::Stream;
use crate::protocol::backend::{parse_error_fields, parse_parameter_status, ErrorFields};
use crate::protocol::{frontend, header};

pub(super) struct LoginState<'a> {
    pub(super) cfg: &'a PoolConfig,
    pub(super) addr: &'a ServerAddr,
    pub(super) scram_keys: Option<ScramKeys>,
    pub(super) key_cache: &'a KeyCache,
    pub(super) scram: Option<ScramClient>,
    /// Set once the server proved it knows the password (valid SASLFinal).
    pub(super) scram_verified: bool,
}

impl LoginState<'_> {
    pub(super) async fn run(
        mut self,
        stream: &Stream,
    ) -> Result<(u32, u32, Vec<(String, String)>), PoolError> {
        let mut buf = BytesMut::with_capacity(1024);
        let mut out = BytesMut::with_capacity(256);
        let (mut pid, mut key) = (0, 0);
        let mut params = Vec::new();
        loop {
            let (tag, mut body) = read_message(stream, &mut buf, LOGIN_MAX_LEN)
                .await
                .map_err(read_err)?;
            match tag {
                header::TAG_AUTHENTICATION => {
                    if body.len() < 4 {
                        return Err(PoolError::Protocol("short authentication message"));
                    }
                    let code = body.get_u32();
                    out.clear();
                    if code == AUTH_SASL_CONTINUE {
                        self.take_server_first(body, &mut out).await?;
                    } else {
                        self.answer_auth(code, &body, &mut out)?;
                    }
                    if !out.is_empty() {
                        stream.write_all(&out).await.map_err(PoolError::io)?;
                    }
                }
                header::TAG_ERROR_RESPONSE => {
                    let e = parse_error_fields(&body).unwrap_or_else(|_| ErrorFields {
                        severity: "FATAL".into(),
                        code: "08P01".into(),
                        message: "malformed error from server".into(),
                    });
                    return Err(PoolError::Server(e));
                }
                header::TAG_PARAMETER_STATUS => {
                    let (k, v) = parse_parameter_status(&body)
                        .map_err(|_| PoolError::Protocol("malformed ParameterStatus"))?;
                    params.push((k.to_owned(), v.to_owned()));
                }
                header::TAG_BACKEND_KEY_DATA => {
                    if body.len() < 8 {
                        return Err(PoolError::Protocol("short BackendKeyData"));
                    }
                    pid = body.get_u32();
                    key = body.get_u32();
                }
                header::TAG_READY_FOR_QUERY => {
                    if !buf.is_empty() {
                        return Err(PoolError::DiedAfterLogin);
                    }
                    return Ok((pid, key, params));
                }
                header::TAG_NOTICE_RESPONSE | header::TAG_NEGOTIATE_PROTOCOL_VERSION => {}
                _ => {
                    return Err(PoolError::Protocol(
                        "unexpected message during server login",
                    ))
                }
            }
        }
    }

    /// Answers AuthenticationSASLContinue (the server-first-message) into `out`. With a
    /// password the keys are derived there, PBKDF2 over as many rounds as the server
    /// asks (4096 by default, ~0.5 ms; up to a million, over 100 ms): on the event loop
    /// that would stall every client it serves, so it runs on a blocking thread; unless
    /// the keys the pool's last login derived are for this salt and iteration count.
    async fn take_server_first(
        &mut self,
        body: BytesMut,
        out: &mut BytesMut,
    ) -> Result<(), PoolError> {
        let mut scram = self
            .scram
            .take()
            .ok_or(PoolError::Protocol("SASLContinue without SASL"))?;
        if scram.derives_keys() {
            let cache = self.key_cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.as_ref().is_some_and(|c| scram.adopt(&body, c)) {
                tracing::debug!(
                    "{}: SCRAM keys from an earlier login of this pool, no PBKDF2",
                    self.addr
                );
            }
        }
        let (scram, msg) = if scram.derives_keys() {
            tokio::task::spawn_blocking(move || {
                let msg = scram.handle_server_first(&body);
                (scram, msg)
            })
            .await
            .map_err(|_| scram_failed())?
        } else {
            let msg = scram.handle_server_first(&body);
            (scram, msg)
        };
        self.scram = Some(scram);
        let msg = msg.map_err(|_| scram_failed())?;
        frontend::sasl_response(out, &msg);
        Ok(())
    }

    /// Answers one authentication request into `out` (left empty for AuthenticationOk).
    fn answer_auth(&mut self, code: u32, body: &[u8], out: &mut BytesMut) -> Result<(), PoolError> {
        let cfg = self.cfg;
        match code {
            // A server that started SCRAM must finish it: AuthenticationOk without a
            // verified SASLFinal would let an impostor skip mutual authentication.
            0 if self.scram.is_some() && !self.scram_verified => Err(PoolError::auth(
                "server ended SCRAM authentication without proving the password",
                "server did not complete SCRAM authentication",
            )),
            0 => Ok(()),
            3 => match &cfg.secret {
                Some(Secret::Plain(p)) => {
                    frontend::password_message(out, p);
                    Ok(())
                }
                // PgBouncer sends a hash as the password here, for the server to
                // refuse; naming the mismatch at once tells the operator more.
                Some(_) => Err(PoolError::wrong_type("plain-text")),
                None => Err(PoolError::no_password("plain-text")),
            },
            5 => {
                if body.len() < 4 {
                    return Err(PoolError::Protocol("short md5 salt"));
                }
                let salt = [body[0], body[1], body[2], body[3]];
                let secret = cfg
                    .secret
                    .as_ref()
                    .ok_or_else(|| PoolError::no_password("MD5"))?;
                let resp = md5_response(&cfg.user, secret, salt)
                    .ok_or_else(|| PoolError::wrong_type("MD5"))?;
                frontend::password_message(out, &resp);
                Ok(())
            }
            10 => {
                let offers_scram = body.split(|&b| b == 0).any(|m| m == b"SCRAM-SHA-256");
                if !offers_scram {
                    const WHY: &str =
                        "none of the server's SASL authentication mechanisms are supported";
                    return Err(PoolError::auth(WHY, WHY));
                }
                let cred = match (&cfg.secret, self.scram_keys) {
                    (Some(Secret::Plain(p)), _) => ScramCredential::Password(p.clone()),
                    (_, Some(k)) => ScramCredential::Keys { client_key: k.client_key, server_key: k.server_key },
                    (Some(Secret::Scram(_)), None) => {
                        return Err(PoolError::auth(
                            "cannot do SCRAM authentication: password is SCRAM secret but client authentication did not provide SCRAM keys",
                            super::error::WRONG_TYPE,
                        ))
                    }
                    (Some(_), None) => return Err(PoolError::wrong_type("SCRAM")),
                    (None, None) => return Err(PoolError::no_password("SCRAM")),
                };
                let client = ScramClient::new(cred);
                frontend::sasl_initial_response(out, "SCRAM-SHA-256", &client.client_first());
                self.scram = Some(client);
                Ok(())
            }
            12 => {
                let scram = self
                    .scram
                    .as_mut()
                    .ok_or(PoolError::Protocol("SASLFinal without SASL"))?;
                scram.verify_server_final(body).map_err(|_| {
                    PoolError::auth("invalid server signature", "invalid server signature")
                })?;
                self.scram_verified = true;
                if let Some(keys) = scram.take_derived() {
                    *self.key_cache.lock().unwrap_or_else(|p| p.into_inner()) = Some(keys);
                }
                Ok(())
            }
            other => Err(PoolError::auth(
                format!("unknown/unsupported auth method: {other}"),
                "unsupported authentication method",
            )),
        }
    }
}

fn scram_failed() -> PoolError {
    const WHY: &str = "SCRAM exchange with the server failed";
    PoolError::auth(WHY, WHY)
}

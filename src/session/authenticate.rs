//! A client's authentication by `auth_type` (or the rule `auth_hba_file` picks): the
//! password, MD5 and SCRAM exchanges, PAM and LDAP checks, certificates and peers.

use bytes::{Buf, BytesMut};

use super::identity::{self, Came};
use super::ClientError;
use crate::auth::{verify_md5, ScramServer, Secret};
use crate::config::{AuthType, Config, DatabaseEntry};
use crate::net::framed::{read_message, ReadError};
use crate::net::Stream;
use crate::pool::ScramKeys;
use crate::protocol::backend::{
    self, authentication, AUTH_CLEARTEXT, AUTH_MD5, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL,
};
use crate::protocol::header::TAG_PASSWORD;
use crate::protocol::sqlstate::*;

/// Largest password or SASL message accepted from a client before it is logged in.
const AUTH_MAX_LEN: u32 = 65_536;

/// What a client's login proved that its server connections may log in with.
pub(crate) enum Proof {
    Nothing,
    /// The client proved itself with SCRAM against a stored SCRAM secret.
    ScramKeys(ScramKeys),
    /// PAM or LDAP accepted this cleartext password.
    Password(String),
}

/// Runs the `auth_type` exchange against `listed`, the user's stored password (from
/// `auth_file`, or from `auth_query` when `queried`; `None`: no such user).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn authenticate(
    cfg: &Config,
    db: &DatabaseEntry,
    stream: &Stream,
    buf: &mut BytesMut,
    out: &mut BytesMut,
    user: &str,
    listed: Option<&str>,
    queried: bool,
    came: Came<'_>,
) -> Result<Proof, ClientError> {
    let s = &cfg.settings;
    let tls = came.tls;
    let (auth_type, names, rule_ldap) = match s.auth_type {
        AuthType::Hba => identity::hba_method(cfg, db, user, came)?,
        other => (other, identity::NameCheck::SAME, None),
    };
    // An empty stored password never matches (as in PgBouncer); it still lists the
    // user for `trust`.
    let secret = listed.filter(|p| !p.is_empty()).map(Secret::parse);
    let failed = || ClientError::fatal(INVALID_PASSWORD, "password authentication failed".into());
    match auth_type {
        // Nothing is checked, so the server user must be the database entry's, not
        // one the client names: without `user=` the login is refused, as in PgBouncer.
        AuthType::Any if db.user.is_none() => {
            tracing::error!("auth_type=any requires forced user (database {})", db.name);
            Err(ClientError::fatal(
                PROTOCOL_VIOLATION,
                "bouncer config error".into(),
            ))
        }
        AuthType::Any => Ok(Proof::Nothing),
        AuthType::Trust => match listed {
            Some(_) => Ok(Proof::Nothing),
            None => Err(ClientError::fatal(
                PROTOCOL_VIOLATION,
                "\"trust\" authentication failed".into(),
            )),
        },
        // The exchanges are boxed: they are large, and `trust` (no exchange) should
        // not carry their room in every login's future (docs/performance.md,
        // twenty-seventh round).
        AuthType::Plain => {
            Box::pin(async {
                authentication(out, AUTH_CLEARTEXT, &[]);
                let password = read_password(stream, buf, out).await?;
                let Some(secret) = secret else {
                    return Err(failed());
                };
                if check_plain(user, &secret, &password).await {
                    Ok(Proof::Nothing)
                } else {
                    Err(failed())
                }
            })
            .await
        }
        AuthType::Md5 if !matches!(secret, Some(Secret::Scram(_))) => {
            Box::pin(async {
                let salt: [u8; 4] = rand::random();
                authentication(out, AUTH_MD5, &salt);
                let response = read_password(stream, buf, out).await?;
                match secret {
                    Some(secret) if verify_md5(user, &secret, salt, &response) => {
                        Ok(Proof::Nothing)
                    }
                    _ => Err(failed()),
                }
            })
            .await
        }
        AuthType::Md5 | AuthType::ScramSha256 => {
            let keys = Box::pin(scram(cfg, stream, buf, out, user, secret, queried)).await?;
            Ok(keys.map_or(Proof::Nothing, Proof::ScramKeys))
        }
        AuthType::Pam | AuthType::Ldap => {
            Box::pin(async {
                authentication(out, AUTH_CLEARTEXT, &[]);
                let password = read_password(stream, buf, out).await?;
                let checked = if auth_type == AuthType::Pam {
                    let rhost = came.addr.map(|a| a.to_string());
                    crate::auth::pam::check(user, &password, rhost).await
                } else {
                    // The load made sure one of the two is there.
                    match rule_ldap.or(s.auth_ldap_options.as_deref()) {
                        Some(o) => crate::auth::ldap::check(o, user, &password).await,
                        None => Err("no LDAP options".into()),
                    }
                };
                match checked {
                    Ok(()) => Ok(Proof::Password(password)),
                    Err(why) => {
                        let by = if auth_type == AuthType::Pam {
                            "PAM"
                        } else {
                            "LDAP"
                        };
                        tracing::warn!("{by} refused user {user}: {why}");
                        // PgBouncer's words, which name the method.
                        let message = format!("{by} authentication failed");
                        Err(ClientError::fatal(INVALID_PASSWORD, message))
                    }
                }
            })
            .await
        }
        AuthType::Cert => {
            identity::cert(tls, user, listed.is_some(), names, came).map(|()| Proof::Nothing)
        }
        AuthType::Peer => {
            identity::peer(stream, came, user, listed.is_some(), names).map(|()| Proof::Nothing)
        }
        // Resolved above; a rule file's method is never `hba` again.
        AuthType::Hba => Err(ClientError::fatal(
            INVALID_AUTHORIZATION,
            "login rejected".into(),
        )),
    }
}

/// Compares a cleartext password with any kind of stored secret.
async fn check_plain(user: &str, secret: &Secret, password: &str) -> bool {
    match secret {
        Secret::Plain(p) => crate::auth::ct_eq(p.as_bytes(), password.as_bytes()),
        Secret::Md5(m) => crate::auth::md5_secret(user, password) == *m,
        Secret::Scram(sc) => {
            let (sc, password) = (sc.clone(), password.to_owned());
            // PBKDF2 is slow on purpose: keep it off the async workers.
            tokio::task::spawn_blocking(move || {
                let derived =
                    crate::auth::scram_secret_from_password(&password, &sc.salt, sc.iterations);
                matches!(Secret::parse(&derived), Secret::Scram(d) if d == sc)
            })
            .await
            .unwrap_or(false)
        }
    }
}

/// Sends `out` and reads one PasswordMessage, returning its NUL-terminated string.
async fn read_password(
    stream: &Stream,
    buf: &mut BytesMut,
    out: &mut BytesMut,
) -> Result<String, ClientError> {
    let body = exchange(stream, buf, out).await?;
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    String::from_utf8(body[..end].to_vec())
        .map_err(|_| ClientError::fatal(PROTOCOL_VIOLATION, "invalid password packet".into()))
}

/// Flushes `out`, then reads the client's next PasswordMessage body.
async fn exchange(
    stream: &Stream,
    buf: &mut BytesMut,
    out: &mut BytesMut,
) -> Result<BytesMut, ClientError> {
    stream.write_all(out).await.map_err(ClientError::Io)?;
    out.clear();
    match read_message(stream, buf, AUTH_MAX_LEN).await {
        Ok((TAG_PASSWORD, body)) => Ok(body),
        Ok(_) => Err(ClientError::fatal(
            PROTOCOL_VIOLATION,
            "expected password response".into(),
        )),
        Err(ReadError::Eof) => Err(ClientError::Gone),
        Err(ReadError::Io(e)) => Err(ClientError::Io(e)),
        // PgBouncer's words for a length no message can have.
        Err(ReadError::Protocol(e @ crate::protocol::ProtocolError::BadHeader(_))) => {
            Err(ClientError::fatal(PROTOCOL_VIOLATION, e.to_string()))
        }
        Err(ReadError::Protocol(e)) => Err(ClientError::fatal(
            PROTOCOL_VIOLATION,
            format!("bad password packet: {e}"),
        )),
    }
}

/// The SCRAM-SHA-256 exchange. Unknown users and md5 secrets get a mock exchange that
/// fails at the end, so a client cannot tell them from a wrong password.
async fn scram(
    cfg: &Config,
    stream: &Stream,
    buf: &mut BytesMut,
    out: &mut BytesMut,
    user: &str,
    secret: Option<Secret>,
    queried: bool,
) -> Result<Option<ScramKeys>, ClientError> {
    let failed = || ClientError::fatal(INVALID_PASSWORD, "SASL authentication failed".into());
    let iterations = cfg.settings.scram_iterations;
    // Only a stored SCRAM secret yields keys PostgreSQL accepts (same salt and iterations).
    let stored_scram = matches!(secret, Some(Secret::Scram(_)));
    let server = match secret {
        // A plaintext password's SCRAM secret is derived once per configuration
        // (auth/derived.rs), on a blocking thread: PBKDF2 is slow on purpose. One
        // auth_query returned may change at any login, so it is never kept.
        Some(Secret::Plain(password)) => {
            let derived = match cfg.derived_secrets.get(user).filter(|_| !queried) {
                Some(derived) => Some(derived),
                None => tokio::task::spawn_blocking(move || {
                    ScramServer::derive_plain(&password, iterations)
                })
                .await
                .ok()
                .map(|d| match queried {
                    true => d,
                    false => cfg.derived_secrets.insert(user, d),
                }),
            };
            derived.map(ScramServer::for_secret)
        }
        Some(secret) => ScramServer::new(&secret, iterations),
        None => None,
    };
    let mut server =
        server.unwrap_or_else(|| ScramServer::mock_keyed(user, iterations, mock_key()));

    backend::auth_sasl_scram(out);
    let mut body = exchange(stream, buf, out).await?;
    let mechanism = take_cstr(&mut body).ok_or_else(failed)?;
    if mechanism != "SCRAM-SHA-256" {
        return Err(ClientError::fatal(
            PROTOCOL_VIOLATION,
            "client selected an invalid SASL authentication mechanism".into(),
        ));
    }
    if body.len() < 4 {
        return Err(failed());
    }
    let n = body.get_i32();
    if n < 0 || n as usize != body.len() {
        return Err(ClientError::fatal(
            PROTOCOL_VIOLATION,
            "bad SASLInitialResponse length".into(),
        ));
    }
    let first = server.handle_client_first(&body).map_err(|_| failed())?;
    authentication(out, AUTH_SASL_CONTINUE, &first);
    let body = exchange(stream, buf, out).await?;
    let last = server.handle_client_final(&body).map_err(|_| failed())?;
    authentication(out, AUTH_SASL_FINAL, &last);
    let keys = match (stored_scram, server.client_key()) {
        (true, Some(client_key)) => Some(ScramKeys {
            client_key,
            server_key: server.server_key(),
        }),
        _ => None,
    };
    Ok(keys)
}

/// A per-process random key for mock SCRAM salts: with a fixed, public key anyone could
/// compute an unknown user's mock salt and tell it from a real one.
fn mock_key() -> &'static [u8] {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    KEY.get_or_init(rand::random)
}

fn take_cstr(body: &mut BytesMut) -> Option<String> {
    let end = body.iter().position(|&b| b == 0)?;
    let s = String::from_utf8(body[..end].to_vec()).ok()?;
    body.advance(end + 1);
    Some(s)
}

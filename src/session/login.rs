//! Client login: the startup packet (with TLS, the GSS refusal and CancelRequest), startup
//! parameters, database lookup, and authentication by `auth_type`.

use std::sync::Arc;

use bytes::{Buf, BytesMut};

use super::identity::{self, Came};
use super::params::{self, ClientParams, StartupTracked};
use super::ClientError;
use crate::app::App;
use crate::auth::{verify_md5, ScramServer, Secret};
use crate::config::{AuthType, Config, DatabaseEntry, SslMode};
use crate::net::framed::{read_message, ReadError};
use crate::net::Stream;
use crate::pool::{Pool, PoolConfig, ScramKeys};
use crate::protocol::backend::{
    self, authentication, AUTH_CLEARTEXT, AUTH_MD5, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL,
};
use crate::protocol::header::TAG_PASSWORD;
use crate::protocol::sqlstate::*;
use crate::protocol::startup::{self, Replication, StartupPacket, StartupParams};
use crate::tls::TlsPeer;

/// Largest password or SASL message accepted from a client before it is logged in.
const AUTH_MAX_LEN: u32 = 65_536;

/// A logged-in client's identity.
#[derive(Debug)]
pub struct LoggedIn {
    pub user: String,
    pub database: String,
    pub pool: Arc<Pool>,
    pub params: ClientParams,
    /// Bytes owed to the client before the welcome (any NegotiateProtocolVersion, or
    /// the last SASL message), sent with AuthenticationOk and the welcome in one
    /// write: a system call per login saved. Empty and unallocated for most logins.
    pub greeting: BytesMut,
    /// A replication client's kind (the `replication` startup parameter).
    pub replication: Option<Replication>,
}

/// What the startup phase produced.
pub enum Startup {
    /// A client that wants a session.
    Login { minor: u16, params: StartupParams },
    /// A cancel request, already handled; close the socket.
    Cancel,
}

/// Reads startup-family packets until a StartupMessage or CancelRequest arrives.
/// An SSLRequest from a TCP client is taken up when `client_tls_sslmode` allows TLS:
/// `stream` then carries the client's TLS session, and `tls` tells what was
/// negotiated. GSS encryption is always refused.
pub async fn read_startup(
    app: &App,
    stream: &mut Stream,
    buf: &mut BytesMut,
    (read_at_once, tcp): (bool, bool),
    tls: &mut TlsPeer,
) -> Result<Startup, ClientError> {
    let mut at_once = read_at_once;
    loop {
        let parsed = if buf.is_empty() {
            // A packet is read into the stack first: a startup packet nearly always
            // fits, so it takes one read and no heap buffer (whose freed space would
            // stay as a hole between the session's lasting allocations).
            let mut first = [0u8; FIRST_READ];
            let n = if std::mem::take(&mut at_once) {
                stream.read_first(&mut first).await
            } else {
                stream.read(&mut first).await
            }
            .map_err(ClientError::Io)?;
            if n == 0 {
                return Err(ClientError::Gone);
            }
            // A TLS handshake record where a packet length should be (whose first
            // byte is 0 for any valid length): a direct TLS connection.
            if first[0] == TLS_HANDSHAKE && tcp && !tls.info.is_tls() {
                *tls = Box::pin(direct_tls(app, stream, &first[..n])).await?;
                continue;
            }
            match startup::packet_len(&first[..n]).map_err(bad_startup)? {
                Some(len) if n >= len => {
                    // What came after it, if anything, is kept for the next read.
                    buf.extend_from_slice(&first[len..n]);
                    startup::parse(&first[..len])
                }
                _ => {
                    buf.extend_from_slice(&first[..n]);
                    continue;
                }
            }
        } else {
            let len = loop {
                match startup::packet_len(buf).map_err(bad_startup)? {
                    Some(len) if buf.len() >= len => break len,
                    Some(len) => buf.reserve(len - buf.len()),
                    None => buf.reserve(64),
                }
                if stream.read_buf(buf).await.map_err(ClientError::Io)? == 0 {
                    return Err(ClientError::Gone);
                }
            };
            // Parsed in place, then consumed: splitting the packet off would allocate.
            let parsed = startup::parse(&buf[..len]);
            buf.advance(len);
            parsed
        };
        match parsed.map_err(bad_startup)? {
            p @ (StartupPacket::Ssl | StartupPacket::GssEnc) => {
                if !buf.is_empty() {
                    // Bytes after an encryption request were not encrypted, and may
                    // have been put there by someone in between.
                    return Err(ClientError::fatal(
                        PROTOCOL_VIOLATION,
                        "unexpected data after encryption request".into(),
                    ));
                }
                if p == StartupPacket::Ssl && tls.info.is_tls() {
                    return Err(ClientError::Dropped("SSL req inside SSL".into()));
                }
                let config = match p {
                    StartupPacket::Ssl if tcp => app.config().client_tls.clone(),
                    _ => None,
                };
                let Some(config) = config else {
                    stream.write_all(b"N").await.map_err(ClientError::Io)?;
                    continue;
                };
                stream.write_all(b"S").await.map_err(ClientError::Io)?;
                *tls = crate::tls::handshake::accept(config, stream, &[])
                    .await
                    .map_err(|e| ClientError::Dropped(e.to_string()))?;
            }
            StartupPacket::Cancel { pid, key } => {
                let cfg = app.config();
                // Boxed: a cancel's future is large and rare.
                Box::pin(app.cancels.cancel(pid, key, &cfg)).await;
                return Ok(Startup::Cancel);
            }
            StartupPacket::Startup { minor, params } => {
                // As PgBouncer: UNIX-socket clients are never asked for TLS.
                if tcp
                    && !tls.info.is_tls()
                    && app.config().settings.client_tls_sslmode >= SslMode::Require
                {
                    return Err(ClientError::fatal(
                        PROTOCOL_VIOLATION,
                        "SSL required".into(),
                    ));
                }
                return Ok(Startup::Login { minor, params });
            }
        }
    }
}

/// Bytes read per startup packet before a heap buffer is needed (libpq's startup
/// packet is ~100 bytes; one with many options may take more reads).
const FIRST_READ: usize = 512;

fn bad_startup(e: crate::protocol::ProtocolError) -> ClientError {
    ClientError::fatal(PROTOCOL_VIOLATION, format!("bad startup packet: {e}"))
}

/// Checks the startup parameters, finds the database, authenticates the client and
/// returns its pool. What the client is owed before AuthenticationOk is left in
/// `LoggedIn::greeting`, to go out with it and the welcome in one write.
pub async fn login(
    app: &App,
    stream: &Stream,
    buf: &mut BytesMut,
    minor: u16,
    startup_params: StartupParams,
    came: Came<'_>,
) -> Result<LoggedIn, ClientError> {
    let cfg = app.config();
    let s = &cfg.settings;
    // Allocated only if something goes out before the welcome (a password exchange,
    // NegotiateProtocolVersion): the welcome sizes it for itself and AuthenticationOk.
    let mut out = BytesMut::new();

    let mut user = None;
    let mut database = None;
    let extra = &s.track_extra_parameters;
    // Settings from `options`, owned here: `tracked` borrows them.
    let mut from_options = Vec::new();
    let ignored = |k: &str| {
        s.ignore_startup_parameters
            .iter()
            .any(|i| i.eq_ignore_ascii_case(k))
    };
    let mut tracked = StartupTracked::default();
    let mut protocol_options = Vec::new();
    let mut replication = None;
    let mut raw_options = None;
    for (k, v) in startup_params.iter() {
        match k {
            "user" => user = Some(v.to_owned()),
            "database" => database = Some(v.to_owned()),
            "replication" => {
                replication =
                    Replication::parse(v).map_err(|m| ClientError::fatal(PROTOCOL_VIOLATION, m))?;
            }
            k if k.starts_with("_pq_.") => protocol_options.push(k.to_owned()),
            // Read even when ignore_startup_parameters names it (then only what
            // cannot be taken is ignored, malformed text included), as PgBouncer.
            "options" => raw_options = Some(v),
            k => match params::canonical(extra, k) {
                Some(name) => tracked.set(name, v),
                None if ignored(k) => {}
                None => {
                    return Err(ClientError::fatal(
                        PROTOCOL_VIOLATION,
                        format!("unsupported startup parameter: {k}"),
                    ));
                }
            },
        }
    }
    // A replication client's `options` go to its own server as they are (see
    // below); anyone else's are read for tracked settings, as PgBouncer does.
    if let (None, Some(v)) = (replication, raw_options) {
        match super::options::parse(v) {
            Ok(settings) => from_options = settings,
            Err(_) if ignored("options") => {}
            Err(m) => return Err(ClientError::fatal(PROTOCOL_VIOLATION, m)),
        }
    }
    // What `options` sets, unless set on its own too (which PostgreSQL applies
    // after the options).
    for (k, v) in &from_options {
        match params::canonical(extra, k) {
            Some(name) if !tracked.has(name) => tracked.set(name, v),
            Some(_) => {}
            None if ignored(k) || ignored("options") => {}
            None => {
                return Err(ClientError::fatal(
                    PROTOCOL_VIOLATION,
                    format!("unsupported startup parameter in options: {k}"),
                ));
            }
        }
    }
    if minor > 0 || !protocol_options.is_empty() {
        let opts: Vec<&str> = protocol_options.iter().map(String::as_str).collect();
        backend::negotiate_protocol_version(&mut out, 0, &opts);
    }
    let user = match user {
        Some(u) if !u.is_empty() => u,
        _ => {
            return Err(ClientError::fatal(
                PROTOCOL_VIOLATION,
                "no username supplied".into(),
            ))
        }
    };
    let database = database
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| user.clone());
    if database == "pgbouncer" {
        return Err(ClientError::fatal(
            FEATURE_NOT_SUPPORTED,
            "the admin console is not available in this version of Sluice".into(),
        ));
    }
    let db = cfg
        .databases
        .get(&database)
        .or(cfg.fallback_database.as_ref())
        .ok_or_else(|| {
            ClientError::fatal(
                INVALID_CATALOG_NAME,
                format!("no such database: {database}"),
            )
        })?;
    // DISABLE db (admin console): new logins are refused, connected clients stay.
    if app.gate().disabled(&database) {
        return Err(ClientError::fatal(
            PROTOCOL_VIOLATION,
            format!("database \"{database}\" is disabled"),
        ));
    }

    // A user missing from auth_file is looked up with auth_query, when an auth_user
    // applies (boxed: a rare path, kept out of every login's future). Not for `any`
    // (nothing is checked), `pam` or `ldap` (they check; PgBouncer does not combine
    // them with a lookup).
    let listed = cfg.userlist.get(&user).map(String::as_str);
    let queried = match listed {
        None if !matches!(s.auth_type, AuthType::Any | AuthType::Pam | AuthType::Ldap) => {
            Box::pin(super::authq::look_up(app, &cfg, db, &database, &user))
                .await
                .map_err(|e| e.naming(&database, &user))?
        }
        _ => None,
    };
    let stored = listed.or(queried.as_deref());
    let came = Came {
        physical_replication: replication == Some(Replication::Physical),
        ..came
    };
    let proof = authenticate(
        &cfg,
        db,
        stream,
        buf,
        &mut out,
        &user,
        stored,
        queried.is_some(),
        came,
    )
    .await
    .map_err(|e| e.naming(&database, &user))?;

    // As in PgBouncer, a forced user owns the pool: every client of the database
    // shares the forced user's server connections, whoever logged in.
    let pool_user = db.user.as_deref().unwrap_or(&user);
    let pool = app.pools.get_or_create(&database, pool_user, || {
        PoolConfig::new(&cfg, db, &database, pool_user)
    });
    if pool_user == user {
        // The server login uses what auth_query found: an md5 hash as it is, a SCRAM
        // verifier through the keys below.
        if let Some(p) = queried.as_deref().filter(|p| !p.is_empty()) {
            pool.set_queried_secret(Secret::parse(p));
        }
        match proof {
            // SCRAM keys prove the client's own password: they can only log in as
            // that user.
            Proof::ScramKeys(k) => pool.set_scram_keys(k),
            // PAM's and LDAP's users are in no file: the password accepted logs in
            // to the server (as in PgBouncer), unless the files give one.
            Proof::Password(p) if listed.is_none() && queried.is_none() => {
                pool.set_queried_secret(Secret::Plain(p))
            }
            _ => {}
        }
    }
    // With application_name_add_host each client's value is its own: never reused.
    let reused = (!s.application_name_add_host)
        .then(|| pool.shared_params.reuse(extra, &tracked))
        .flatten();
    let mut params = match reused {
        Some(p) => p,
        None => {
            let mut params = ClientParams::build(extra, &tracked);
            if s.application_name_add_host {
                // As PgBouncer: at connection start only; a later SET is left alone.
                let app = params.get("application_name").unwrap_or("").to_owned();
                params.set(
                    "application_name",
                    &format!("{app} - {}", stream.peer_addr()),
                );
            }
            params
        }
    };
    if let (Some(_), Some(o)) = (replication, raw_options.filter(|o| !o.trim().is_empty())) {
        params.set_startup_options(o);
    }
    Ok(LoggedIn {
        user,
        database,
        pool,
        params,
        greeting: out,
        replication,
    })
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// A ClientHello in place of a startup packet: PostgreSQL 17's direct TLS
/// (`sslnegotiation=direct`), as PgBouncer 1.25 takes it. Only with client TLS on,
/// and only from a client that negotiated ALPN `postgresql`, as PostgreSQL requires
/// (so that a TLS client of another protocol is not taken for one).
async fn direct_tls(app: &App, stream: &mut Stream, read: &[u8]) -> Result<TlsPeer, ClientError> {
    let Some(config) = app.config().client_tls.clone() else {
        return Err(ClientError::Dropped(
            "direct TLS connection refused: client TLS is disabled".into(),
        ));
    };
    let peer = crate::tls::handshake::accept(config, stream, read)
        .await
        .map_err(|e| ClientError::Dropped(e.to_string()))?;
    let alpn = stream.with_tls(|c| c.alpn_protocol() == Some(crate::tls::ALPN_POSTGRESQL));
    if alpn != Some(true) {
        return Err(ClientError::fatal(
            PROTOCOL_VIOLATION,
            "received direct SSL connection request without ALPN protocol negotiation extension"
                .into(),
        ));
    }
    Ok(peer)
}

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
        AuthType::Any => {
            if db.user.is_none() {
                tracing::warn!("auth_type=any needs a forced user= on database {}", db.name);
            }
            Ok(Proof::Nothing)
        }
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
                        Err(failed())
                    }
                }
            })
            .await
        }
        AuthType::Cert => identity::cert(tls, user, names).map(|()| Proof::Nothing),
        AuthType::Peer => identity::peer(stream, came, user, names).map(|()| Proof::Nothing),
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
            format!("unsupported SASL mechanism: {mechanism}"),
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

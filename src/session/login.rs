//! Client login: the startup packet (with TLS, the GSS refusal and CancelRequest), startup
//! parameters and database lookup; the `auth_type` exchanges are `authenticate.rs`.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, BytesMut};

use super::authenticate::{authenticate, Proof};
use super::cancel::{CameOn, CancelEnd};
use super::identity::Came;
use super::params::{self, ClientParams, StartupTracked};
use super::ClientError;
use crate::app::App;
use crate::auth::Secret;
use crate::config::{AuthType, DatabaseEntry, SslMode};
use crate::net::{PeerAddr, Stream};
use crate::pool::{Pool, PoolConfig};
use crate::protocol::backend;
use crate::protocol::sqlstate::*;
use crate::protocol::startup::{self, Replication, StartupPacket, StartupParams};
use crate::tls::TlsPeer;

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
/// negotiated. GSS encryption is always refused. `from` is the connection's id and
/// ends, for a cancel request's listing.
pub async fn read_startup(
    app: &App,
    stream: &mut Stream,
    buf: &mut BytesMut,
    (read_at_once, tcp): (bool, bool),
    tls: &mut TlsPeer,
    from: (u64, &PeerAddr, Option<SocketAddr>),
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
            match startup::packet_len(&first[..n]).map_err(|_| bad_header(&first[..n]))? {
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
                match startup::packet_len(buf).map_err(|_| bad_header(buf))? {
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
                    let what = match p {
                        StartupPacket::Ssl => "SSL request",
                        _ => "GSSAPI encryption request",
                    };
                    return Err(ClientError::fatal(
                        PROTOCOL_VIOLATION,
                        format!("received unencrypted data after {what}"),
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
                let came = CameOn {
                    id: from.0,
                    peer: from.1,
                    local: from.2,
                    tls: tls.info,
                };
                let server_id = app.pools.next_server_id();
                let started = crate::clock::Tick::now();
                // Boxed: a cancel's future is large and rare.
                let end = Box::pin(app.cancels.cancel((pid, key), &cfg, came, server_id)).await;
                if end == CancelEnd::Console {
                    crate::admin::resume_on_cancel(app);
                }
                if cfg.settings.log_disconnections {
                    let (id, peer, age) = (from.0, from.1, started.elapsed().as_secs());
                    let end = end.reason();
                    tracing::info!(
                        "C-{id}: (nodb)/(nouser)@{peer} closing because: {end} (age={age}s)"
                    );
                }
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

/// A startup packet whose length no packet can have (under 8 bytes or over 10,000:
/// an HTTP request, a port scanner, TLS to a plaintext port) in PgBouncer's words,
/// with its first bytes in hex, which operators' log checks count.
fn bad_header(bytes: &[u8]) -> ClientError {
    let hex = crate::protocol::hex(&bytes[..bytes.len().min(8)]);
    ClientError::fatal(PROTOCOL_VIOLATION, format!("bad packet header: '{hex}'"))
}

fn bad_startup(e: crate::protocol::ProtocolError) -> ClientError {
    use crate::protocol::ProtocolError::UnsupportedVersion;
    let message = match e {
        // PgBouncer's words for it.
        UnsupportedVersion(2, _) => "old V2 protocol not supported".into(),
        e => format!("bad startup packet: {e}"),
    };
    ClientError::fatal(PROTOCOL_VIOLATION, message)
}

/// Checks the startup parameters, finds the database, authenticates the client and
/// returns its pool. What the client is owed before AuthenticationOk is left in
/// `LoggedIn::greeting`, to go out with it and the welcome in one write.
pub async fn login(
    app: &App,
    stream: &Stream,
    buf: &mut BytesMut,
    minor: u16,
    startup_params: &StartupParams,
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
    // An unknown database is told only to a client that authenticates (as PgBouncer's
    // "fake" database does), so that nobody learns which databases exist without a
    // password: its login runs against an entry of that name with no settings.
    // (Boxed: the entry lives across the login's awaits, and a whole one in the
    // login's future would be moved along with it for every client.)
    let fake: Box<DatabaseEntry>;
    let (db, unknown) = match cfg
        .databases
        .get(&database)
        .or(cfg.fallback_database.as_ref())
    {
        Some(db) => (db, false),
        None => {
            fake = Box::new(DatabaseEntry {
                name: database.clone(),
                ..DatabaseEntry::default()
            });
            (&*fake, true)
        }
    };

    // Over a client limit of its database or user: refused before a password is
    // asked for, as PgBouncer does (the count itself is made once it has logged in,
    // which is all a login that asks for none needs).
    if !unknown && !matches!(s.auth_type, AuthType::Trust | AuthType::Any) {
        let limits = super::client_limits(&cfg, &database, &user);
        if let Err(setting) = app.check_client_limits(&database, &user, limits) {
            let message = format!("client connections exceeded ({setting})");
            let e = ClientError::fatal(PROTOCOL_VIOLATION, message);
            return Err(e.naming(&database, &user));
        }
    }

    // A user missing from auth_file is looked up with auth_query, when an auth_user
    // applies (boxed: a rare path, kept out of every login's future). Not for `any`
    // (nothing is checked), `pam` or `ldap` (they check; PgBouncer does not combine
    // them with a lookup), nor for an unknown database (PgBouncer's neither).
    let listed = cfg.userlist.get(&user).map(String::as_str);
    let queried = match listed {
        None if unknown => None,
        None if !matches!(s.auth_type, AuthType::Any | AuthType::Pam | AuthType::Ldap) => {
            Box::pin(super::authq::look_up(app, &cfg, db, &database, &user))
                .await
                .map_err(|e| e.naming(&database, &user))?
        }
        _ => None,
    };
    let stored = listed.or(queried.as_deref());
    if stored.is_none() && !matches!(s.auth_type, AuthType::Any | AuthType::Pam | AuthType::Ldap) {
        // PgBouncer's line; the client gets the mock exchange and the usual error.
        let (id, peer) = (came.id, came.peer);
        tracing::info!("C-{id}: {database}/{user}@{peer} no such user: {user}");
    }
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
    if unknown {
        if s.log_connections {
            let (id, peer) = (came.id, came.peer);
            tracing::info!(
                "C-{id}: {database}/{user}@{peer} login failed: db={database} user={user}"
            );
        }
        let e = ClientError::fatal(
            INVALID_CATALOG_NAME,
            format!("no such database: {database}"),
        );
        return Err(e.naming(&database, &user));
    }
    // DISABLE db (admin console): new logins are refused, connected clients stay;
    // told after the password, as PgBouncer tells it.
    if app.gate_disables(&database) {
        let e = ClientError::fatal(
            PROTOCOL_VIOLATION,
            format!("database \"{database}\" is disabled"),
        );
        return Err(e.naming(&database, &user));
    }

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

//! One server connection: connect, log in to PostgreSQL (the exchange itself is
//! server_login.rs), and the state the pool and the relay keep about it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use super::error::PoolError;
use super::limits::LimitToken;
use super::slot::SlotToken;
use super::target::{PoolConfig, ServerAddr};
use crate::auth::DerivedKeys;
use crate::clock::Tick;
use crate::net::framed::{read_message, ReadError};
use crate::net::Stream;
use crate::protocol::backend::{parse_error_fields, parse_parameter_status, ErrorFields};
use crate::protocol::{frontend, header};

/// Largest message accepted from a server during login.
pub(super) const LOGIN_MAX_LEN: u32 = 1 << 20;

/// AuthenticationSASLContinue's request code.
pub(super) const AUTH_SASL_CONTINUE: u32 = 11;

/// Credentials recovered from a client's SCRAM login, for pass-through to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScramKeys {
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
}

/// A logged-in server connection, owned by the pool while idle and by one client
/// session while linked. Dropping it closes the socket and frees its pool slot.
///
/// Boxed, and moved as a pointer: a client session without a server keeps an
/// 8-byte `None` instead of the whole connection's room (~250 bytes per idle client).
#[derive(Debug)]
pub struct ServerConn(Box<ServerState>);

impl std::ops::Deref for ServerConn {
    type Target = ServerState;
    fn deref(&self) -> &ServerState {
        &self.0
    }
}

impl std::ops::DerefMut for ServerConn {
    fn deref_mut(&mut self) -> &mut ServerState {
        &mut self.0
    }
}

/// What a [`ServerConn`] holds.
#[derive(Debug)]
pub struct ServerState {
    pub stream: Stream,
    /// What stays the same for its whole life; the client holding it shares it.
    pub ident: Arc<ServerIdent>,
    /// Every ParameterStatus the server reported, kept current by the relay.
    pub params: ServerParams,
    /// When it last went idle.
    pub last_used: Tick,
    /// Why the connection must not be reused, when it must not (protocol desync,
    /// a replication client's own, bytes after its ReadyForQuery): the reason its
    /// close is logged with.
    pub close_needed: Option<&'static str>,
    /// Counts the connection in the pool's `active` while a client holds it.
    pub(crate) lent: super::LentMark,
    pub(crate) _slot: SlotToken,
    /// The prepared statements this server has, for transaction pooling.
    pub prepared: crate::prepared::ServerStatements,
    /// Units of the database and user limits, returned when the connection closes.
    pub(crate) limit_tokens: Option<(LimitToken, LimitToken)>,
    /// The place in line whose request was written behind the one the server works
    /// on (pipeline.rs), and what of its answer a relay read with the one before.
    pub(crate) behind: Option<u64>,
    /// A third request's place, written behind `behind`'s.
    pub(crate) behind_next: Option<u64>,
    pub(crate) ahead: bytes::BytesMut,
}

impl Drop for ServerState {
    fn drop(&mut self) {
        // Closed with a request behind the one it worked on: that request goes back
        // to the head of the line, or, if some of an answer came that may be its,
        // its client gets the error of a server lost mid-query (pipeline.rs). (Lent
        // connections are never dropped under their pool's lock: see `LentMark`.)
        if let Some(id) = self.behind.take() {
            if let Some(pool) = self.lent.pool() {
                let answered = !self.ahead.is_empty() || self.stream.has_unread();
                // The third first, so that the second ends up at the head of the line;
                // whether any of its answer came is not known once some came (a bound
                // kept: it may have run).
                if let Some(next) = self.behind_next.take() {
                    pool.lose_behind(next, answered);
                }
                pool.lose_behind(id, answered);
            }
        }
    }
}

/// A server connection's fixed facts, made once at login and shared (one pointer)
/// with the client that holds it: the console shows them as the client's server, and
/// a CancelRequest for that client goes to `addr` with the backend's key.
#[derive(Debug)]
pub struct ServerIdent {
    /// Monotonic id for logs and the console.
    pub id: u64,
    /// The backend's cancel key.
    pub backend_pid: u32,
    pub backend_key: u32,
    pub addr: ServerAddr,
    pub created: Tick,
    /// The pool generation it was made in; older ones are closed on release (reload,
    /// RECONNECT).
    pub generation: u64,
    /// Cancel requests on their way to the backend (`canceled.rs`); read at each
    /// release, next to `generation`.
    pub(crate) cancels: AtomicU32,
    /// The local end of the socket (SHOW SERVERS `local_addr`/`local_port`).
    pub local_addr: Option<std::net::SocketAddr>,
    /// The address a TCP connection reached: its cancel goes there, not to whatever
    /// `addr`'s name resolves to by then (a name with several addresses).
    pub peer_addr: Option<std::net::SocketAddr>,
    /// What TLS negotiated (SHOW SERVERS `tls`); all zero for plaintext.
    pub tls: crate::tls::TlsInfo,
    /// Prepared statements it held when last linked (SHOW SERVERS); written only by
    /// the client that links it.
    prepared: AtomicU32,
    /// The connection, while held off the pool for those cancels.
    pub(crate) held: std::sync::Mutex<Option<ServerConn>>,
    /// Cancel requests ever aimed at it: a request written behind another learns
    /// from it whether one was aimed while it waited there (pipeline.rs).
    pub(crate) aimed: AtomicU32,
}

impl ServerIdent {
    pub fn new(id: u64, backend: (u32, u32), addr: ServerAddr, generation: u64) -> ServerIdent {
        ServerIdent {
            id,
            backend_pid: backend.0,
            backend_key: backend.1,
            addr,
            created: Tick::now(),
            generation,
            cancels: AtomicU32::new(0),
            aimed: AtomicU32::new(0),
            local_addr: None,
            peer_addr: None,
            tls: Default::default(),
            prepared: AtomicU32::new(0),
            held: std::sync::Mutex::new(None),
        }
    }

    /// Records how many prepared statements it has as a client links it.
    pub fn set_prepared(&self, n: u32) {
        self.prepared.store(n, Ordering::Relaxed);
    }

    pub fn prepared(&self) -> u32 {
        self.prepared.load(Ordering::Relaxed)
    }
}

impl ServerState {
    /// The current value of a reported parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name)
    }

    /// Which of the pool's limits its age or idle time passed, as PgBouncer logs it.
    /// `connected`: the pool's connections, this one among them; as in PgBouncer,
    /// `server_idle_timeout` leaves `min_pool_size` of them open (their lifetime
    /// still ends them).
    pub(crate) fn expiry(
        &self,
        st: &super::PoolState,
        now: Tick,
        connected: u32,
    ) -> Option<&'static str> {
        let r = &st.reuse;
        if super::closing::lifetime_due(self.ident.created, st, now) {
            Some(super::closing::LIFETIME_OVER)
        } else if !r.idle_timeout.is_zero()
            && now.reached(self.last_used, r.idle_timeout)
            && connected > r.min_pool_size
        {
            Some("server idle timeout")
        } else {
            None
        }
    }

    /// Runs a simple query whose output is not wanted (reset query, SETs), keeping
    /// ParameterStatus current. Fails on an ErrorResponse or a broken connection.
    pub async fn run_internal(&mut self, sql: &str, timeout: Duration) -> Result<(), PoolError> {
        let fut = async {
            let mut out = BytesMut::with_capacity(sql.len() + 6);
            frontend::query(&mut out, sql);
            let answer = self.exchange(&out, LOGIN_MAX_LEN, |_| {}).await?;
            if answer.trailing {
                return Err(PoolError::Protocol("unexpected bytes after ReadyForQuery"));
            }
            match answer.error {
                Some(e) => Err(PoolError::Server(e)),
                None => Ok(()),
            }
        };
        match crate::timer::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(PoolError::Timeout("internal query timed out")),
        }
    }

    /// Sends `out` (requests ending in a Query or Sync) and reads the answer up to
    /// ReadyForQuery, keeping ParameterStatus current and giving each DataRow's body
    /// to `on_row`: the loop of the few queries Sluice runs itself.
    pub(super) async fn exchange(
        &mut self,
        out: &[u8],
        max_len: u32,
        mut on_row: impl FnMut(&[u8]),
    ) -> Result<Answer, PoolError> {
        self.stream.write_all(out).await.map_err(PoolError::io)?;
        let mut buf = BytesMut::with_capacity(512);
        let mut error = None;
        loop {
            let (tag, body) = read_message(&self.stream, &mut buf, max_len)
                .await
                .map_err(read_err)?;
            match tag {
                header::TAG_READY_FOR_QUERY => {
                    return Ok(Answer {
                        error,
                        status: body.first().copied(),
                        trailing: !buf.is_empty(),
                    })
                }
                header::TAG_ERROR_RESPONSE => {
                    // One that does not parse still failed the query.
                    error = Some(parse_error_fields(&body).unwrap_or_else(|_| ErrorFields {
                        message: "malformed ErrorResponse".into(),
                        ..ErrorFields::default()
                    }))
                }
                header::TAG_DATA_ROW => on_row(&body),
                header::TAG_PARAMETER_STATUS => {
                    if let Ok((k, v)) = parse_parameter_status(&body) {
                        let (k, v) = (k.to_owned(), v.to_owned());
                        self.params.set(&k, &v);
                    }
                }
                _ => {}
            }
        }
    }
}

/// What a server answered up to ReadyForQuery ([`ServerState::exchange`]).
pub(super) struct Answer {
    /// The last ErrorResponse, if any.
    pub error: Option<ErrorFields>,
    /// ReadyForQuery's transaction status (`I`, `T`, `E`).
    pub status: Option<u8>,
    /// Whether bytes came after ReadyForQuery.
    pub trailing: bool,
}

/// The parameters a server reported, and the client parameter set they were last
/// found to match (so the next client with that set needs no comparison).
#[derive(Debug, Default)]
pub struct ServerParams {
    pub values: Vec<(String, String)>,
    /// Forgotten at any change of `values`.
    pub matched: Option<Arc<crate::session::params::ParamSet>>,
}

impl ServerParams {
    /// The current value of a reported parameter (case-insensitive name).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Records a ParameterStatus.
    pub fn set(&mut self, name: &str, value: &str) {
        self.matched = None;
        match self
            .values
            .iter_mut()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
        {
            Some((_, v)) => {
                if v != value {
                    v.clear();
                    v.push_str(value);
                }
            }
            None => self.values.push((name.to_owned(), value.to_owned())),
        }
    }
}

pub(super) fn read_err(e: ReadError) -> PoolError {
    match e {
        ReadError::Io(e) => PoolError::io(e),
        ReadError::Eof => PoolError::Closed,
        ReadError::Protocol(_) => PoolError::Protocol("malformed message from server"),
    }
}

/// The keys the pool's last SCRAM login derived from its password (`DerivedKeys`).
pub(crate) type KeyCache = std::sync::Mutex<Option<DerivedKeys>>;

/// What a new server connection needs of its pool besides the settings.
pub(crate) struct Dial<'a> {
    /// The host of the pool's list to connect to.
    pub addr: &'a ServerAddr,
    pub scram_keys: Option<ScramKeys>,
    pub key_cache: &'a KeyCache,
    /// Startup parameters besides the pool's, in place of any of the same name.
    pub extra: &'a [(String, String)],
}

/// Connects and logs in a new server connection. `slot` is taken only when it is
/// made: a failed attempt leaves it for the next host.
pub(crate) async fn connect(
    cfg: &PoolConfig,
    dial: Dial<'_>,
    id: u64,
    generation: u64,
    slot: &mut Option<SlotToken>,
) -> Result<ServerConn, PoolError> {
    let Dial {
        addr,
        scram_keys,
        key_cache,
        extra,
    } = dial;
    let mut stream = super::socket::open(addr, cfg).await?;
    // Asked once, for the console and cancels (TLS does not change them).
    let (local_addr, peer_addr) = (stream.local_addr(), stream.peer_addr());
    let peer_addr = match peer_addr {
        crate::net::stream::PeerAddr::Tcp(sa) => Some(sa),
        crate::net::stream::PeerAddr::Unix => None,
    };
    let limit = if cfg.server_connect_timeout.is_zero() {
        Duration::from_secs(3600)
    } else {
        cfg.server_connect_timeout
    };
    let tls = match (&cfg.tls, addr) {
        (Some(tls), ServerAddr::Tcp(..)) => {
            let negotiate = super::server_tls::negotiate(&mut stream, addr, tls);
            match crate::timer::timeout(limit, negotiate).await {
                Ok(r) => r?,
                Err(_) => return Err(PoolError::Connect(format!("{addr}: TLS timed out"))),
            }
        }
        _ => Default::default(),
    };
    let mut out = BytesMut::with_capacity(256);
    let mut params: Vec<(&str, &str)> = vec![("user", &cfg.user), ("database", &cfg.dbname)];
    for (k, v) in &cfg.startup {
        if !extra.iter().any(|(e, _)| e.eq_ignore_ascii_case(k)) {
            params.push((k, v));
        }
    }
    params.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    frontend::startup_message(&mut out, &params);
    stream.write_all(&out).await.map_err(PoolError::io)?;

    let login = super::server_login::LoginState {
        cfg,
        addr,
        scram_keys,
        key_cache,
        scram: None,
        scram_verified: false,
    };
    let (pid, key, server_params) = match crate::timer::timeout(limit, login.run(&stream)).await {
        Ok(r) => r?,
        Err(_) => return Err(PoolError::Connect(format!("{addr}: login timed out"))),
    };
    let ident = ServerIdent {
        local_addr,
        peer_addr,
        tls,
        ..ServerIdent::new(id, (pid, key), addr.clone(), generation)
    };
    let now = ident.created;
    let slot = slot
        .take()
        .ok_or(PoolError::Protocol("server connection without a pool slot"))?;
    let mut conn = ServerConn(Box::new(ServerState {
        stream,
        ident: Arc::new(ident),
        params: ServerParams {
            values: server_params,
            matched: None,
        },
        last_used: now,
        close_needed: None,
        lent: super::LentMark::default(),
        _slot: slot,
        limit_tokens: None,
        prepared: Default::default(),
        behind: None,
        behind_next: None,
        ahead: Default::default(),
    }));
    if let Some(q) = &cfg.connect_query {
        conn.run_internal(q, limit).await?;
    }
    Ok(conn)
}

/// A connection over `stream` that never logged in to anything, for unit tests of
/// what the pool does with connections.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn conn_for_tests(stream: Stream, slot: SlotToken, generation: u64) -> ServerConn {
    let addr = ServerAddr::for_host("127.0.0.1", 1);
    ServerConn(Box::new(ServerState {
        stream,
        ident: Arc::new(ServerIdent::new(1, (1, 1), addr, generation)),
        params: ServerParams {
            values: Vec::new(),
            matched: None,
        },
        last_used: Tick::now(),
        close_needed: None,
        lent: super::LentMark::default(),
        _slot: slot,
        limit_tokens: None,
        prepared: Default::default(),
        behind: None,
        behind_next: None,
        ahead: Default::default(),
    }))
}

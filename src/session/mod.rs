//! A client's life: login, then the relay through server connections lent by its pool,
//! until the client leaves; then the server goes back (reset) or is closed.

mod assign;
pub mod authenticate;
mod authq;
pub mod cancel;
pub mod framer;
pub mod identity;
pub mod keeper;
pub mod login;
mod options;
pub mod params;
pub mod relay;
mod run;

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;

use bytes::BytesMut;

use crate::app::App;
use crate::net::{Origin, PeerAddr, Stream};
use crate::pool::PoolError;
use crate::protocol::backend;
use crate::protocol::sqlstate::*;
use crate::protocol::startup::Replication;
use crate::stats::conns::{ClientInfo, ClientKind, ClientMeta};
use crate::stats::logins::{LoginNames, LoginWatch};
use crate::tls::{TlsInfo, TlsPeer};
use login::{LoggedIn, Startup};
use relay::{Relay, Timeouts};
pub(crate) use run::Session;
use run::{Ended, Registrations, Welcome};

/// A client's log prefix (`C-<id>: db/user@addr`, made from its console entry when
/// logged, not kept as text) and whether its pooler errors are logged
/// (`log_pooler_errors`). A view made where needed, not kept.
#[derive(Debug, Clone, Copy)]
pub struct ClientTag<'a> {
    info: &'a ClientInfo,
    log_pooler_errors: bool,
}

impl<'a> ClientTag<'a> {
    fn new(info: &'a ClientInfo, log_pooler_errors: bool) -> ClientTag<'a> {
        ClientTag {
            info,
            log_pooler_errors,
        }
    }
}

impl std::fmt::Display for ClientTag<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.info.meta;
        write!(f, "C-{}: {}/{}@{}", m.id, m.database, m.user, m.peer)
    }
}

/// Why a client is being turned away or disconnected.
#[derive(Debug)]
pub enum ClientError {
    /// Send this FATAL error to the client, then close. `who` is the client's
    /// `db/user` for the log, once its startup packet named them.
    Fatal {
        code: &'static str,
        message: String,
        who: Option<Box<str>>,
    },
    /// The socket failed; nothing can be sent.
    Io(io::Error),
    /// The client closed its socket.
    Gone,
    /// Close without a word to the client (it could not read one: a failed TLS
    /// handshake), logging why.
    Dropped(String),
    /// One of the above but `Fatal`, after the startup packet named the client's
    /// `db/user` for the log.
    Named {
        who: Box<str>,
        error: Box<ClientError>,
    },
}

impl ClientError {
    pub fn fatal(code: &'static str, message: String) -> ClientError {
        ClientError::Fatal {
            code,
            message,
            who: None,
        }
    }

    /// Names the client's database and user in the log line of the error, as
    /// PgBouncer's does once the startup packet is read.
    pub fn naming(self, database: &str, user: &str) -> ClientError {
        let who: Box<str> = format!("{database}/{user}").into();
        match self {
            ClientError::Fatal { code, message, .. } => ClientError::Fatal {
                code,
                message,
                who: Some(who),
            },
            named @ ClientError::Named { .. } => named,
            other => ClientError::Named {
                who,
                error: Box::new(other),
            },
        }
    }
}

/// What a login produced: a pooled session or an admin console one.
enum Who {
    Pooled(LoggedIn),
    Console(crate::admin::AdminLogin),
}

/// Counts a client out of `max_client_conn` when dropped: when its task ends, or its
/// session if it has one (which may outlive the task: keeper.rs).
pub(crate) struct ClientSlot(Arc<App>);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.remove_client();
    }
}

/// Serves an accepted client connection in a task of its own. The future is boxed
/// first: tokio moves a spawned future into place several times and writes its whole
/// slot again when the task ends, ~900 instructions per connection for this one's
/// ~570 bytes, against one copy into the box.
pub fn spawn_client(app: Arc<App>, stream: Stream, origin: Origin) {
    tokio::spawn(Box::pin(serve_client(app, stream, origin)));
}

/// Serves one accepted client connection to the end.
async fn serve_client(app: Arc<App>, mut stream: Stream, origin: Origin) {
    let id = app
        .client_ids
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let cfg = app.config();
    let Origin {
        peer,
        local,
        read_at_once,
    } = origin;
    // Counted from its accept, as PgBouncer counts every client socket; held to
    // `max_client_conn` once its startup packet names its database (below).
    app.add_client();
    let slot = ClientSlot(app.clone());
    let mut buf = BytesMut::new();
    let mut tls = TlsPeer::default();
    let tcp = matches!(peer, PeerAddr::Tcp(_));

    // Listed in SHOW SOCKETS (`cl_login`) once it waits; out when it ends.
    let watch = LoginWatch::new(&app.logins, id, &peer, local);
    // Boxed: the login state is big and short-lived; an idle client keeps only the
    // session's (small) state inline in its task.
    let login = Box::pin(async {
        let stream = &mut stream;
        let how = (read_at_once, tcp);
        let from = (id, &peer, local);
        match login::read_startup(&app, stream, &mut buf, how, &mut tls, from).await? {
            Startup::Cancel => Ok(None),
            Startup::Login { minor, params } => {
                // As PgBouncer: a cancel request and the console are never turned
                // away, so that an operator can get in when clients fill the pooler.
                let max = cfg.settings.max_client_conn;
                if max != 0 && app.client_count() > max && !crate::admin::is_console(&params) {
                    let user = params.get("user").unwrap_or("");
                    let db = params.get("database").filter(|d| !d.is_empty());
                    let msg = "no more connections allowed (max_client_conn)";
                    let e = ClientError::fatal(PROTOCOL_VIOLATION, msg.into());
                    return Err(e.naming(db.unwrap_or(user), user));
                }
                if cfg.settings.log_connections {
                    let user = params.get("user").unwrap_or("");
                    let db = params.get("database").unwrap_or(user);
                    let t: &dyn std::fmt::Display =
                        if tls.info.is_tls() { &tls.info } else { &"no" };
                    // PgBouncer's words for it (1.23 on); a bad value is refused later.
                    let r = match params.get("replication").map(Replication::parse) {
                        Some(Ok(Some(Replication::Physical))) => "yes",
                        Some(Ok(Some(Replication::Logical))) => "database",
                        _ => "no",
                    };
                    tracing::info!(
                        "C-{id}: {db}/{user}@{peer} login attempt: db={db} user={user} tls={t} replication={r}"
                    );
                }
                // Its names for SHOW SOCKETS, made only if the login waits.
                let names = || {
                    let user = params.get("user").unwrap_or("");
                    let db = params.get("database").filter(|d| !d.is_empty());
                    Some(LoginNames {
                        database: db.unwrap_or(user).into(),
                        user: user.into(),
                        tls: tls.info,
                    })
                };
                let stream = &*stream;
                let addr = match &peer {
                    PeerAddr::Tcp(a) => Some(a.ip()),
                    PeerAddr::Unix => None,
                };
                let came = identity::Came {
                    addr,
                    tls: &tls,
                    physical_replication: false,
                    id,
                    peer: &peer,
                };
                if crate::admin::is_console(&params) {
                    // Boxed: rare, and its future is as large as a pooled login's.
                    let unix = !tcp;
                    let login =
                        crate::admin::login(&app, stream, (unix, came), &mut buf, minor, &params);
                    let mut login = Box::pin(login);
                    return watched(login.as_mut(), &watch, names)
                        .await
                        .map(|a| Some(Who::Console(a)));
                }
                let login =
                    std::pin::pin!(login::login(&app, stream, &mut buf, minor, &params, came));
                watched(login, &watch, names)
                    .await
                    .map(|w| Some(Who::Pooled(w)))
            }
        }
    });
    let limit = cfg.settings.client_login_timeout;
    // When the login began to wait, for a failure's `age`: one that ends in its first
    // poll is 0 s old, and reading a clock for it would cost every new connection.
    let mut waited_since = None;
    // Most logins (trust, the startup packet already read) end in their first poll:
    // the timeout is armed only for one that waits.
    let result = {
        let mut login = login;
        match poll_fn(|cx| Poll::Ready(login.as_mut().poll(cx))).await {
            Poll::Ready(r) => r,
            Poll::Pending => {
                let now = crate::clock::Tick::now();
                watch.waits(now);
                waited_since = Some(now);
                if limit.is_zero() {
                    login.await
                } else {
                    match Box::pin(crate::timer::timeout_at(now + limit, login)).await {
                        Ok(r) => r,
                        Err(_) => Err(ClientError::fatal(
                            PROTOCOL_VIOLATION,
                            "client_login_timeout".into(),
                        )),
                    }
                }
            }
        }
    };
    drop(watch);
    // The braces move the login result into a temporary that is gone after this
    // statement; matching the variable in place would keep its (large) slot in this
    // frame across the session's await, and so in every client's task.
    #[allow(clippy::blocks_in_conditions)]
    let start = match { result } {
        Ok(Some(Who::Pooled(who))) => {
            // The login buffer is only worth keeping if the client sent more than
            // its login.
            let buf = if buf.is_empty() { BytesMut::new() } else { buf };
            Box::new((who, buf))
        }
        other => {
            let at = (peer, local, tls.info);
            let age = waited_since.map_or(0, |t| t.elapsed().as_secs());
            Box::pin(other_login(other, &app, &stream, buf, (id, age), at)).await;
            drop(slot);
            return;
        }
    };
    let Some((session, welcome)) = open_session(
        app,
        &stream,
        start,
        id,
        (&peer, local, tls.info),
        slot,
        &cfg,
    )
    .await
    else {
        return;
    };
    drop(cfg);
    // Boxed: the session's state is allocated once, apart from the (small) task.
    Box::pin(drive(stream, session, Some(welcome))).await;
}

/// Awaits a login (pinned in place: no move of its large future), registering it
/// for SHOW SOCKETS with the names its startup packet gave when it waits.
fn watched<'a, F: Future>(
    mut login: std::pin::Pin<&'a mut F>,
    watch: &'a LoginWatch<'_>,
    names: impl Fn() -> Option<LoginNames> + 'a,
) -> impl Future<Output = F::Output> + 'a {
    poll_fn(move |cx| {
        let r = login.as_mut().poll(cx);
        if r.is_pending() {
            watch.waits_named(&names);
        }
        r
    })
}

/// A login that did not make a pooled client: the console, a cancel request, or a
/// failure to report.
async fn other_login(
    result: Result<Option<Who>, ClientError>,
    app: &Arc<App>,
    stream: &Stream,
    buf: BytesMut,
    (id, age): (u64, u64),
    at: (PeerAddr, Option<SocketAddr>, TlsInfo),
) {
    match result {
        Ok(Some(Who::Console(a))) => crate::admin::serve(app, stream, buf, a, id, at).await,
        Ok(Some(Who::Pooled(_))) | Ok(None) => {}
        Err(e) => {
            let eof_logged = app.config().settings.log_disconnections;
            report_login_failure((id, age), &at.0, stream, e, eof_logged).await
        }
    }
}

/// `max_db_client_connections` and `max_user_client_connections` for a client of
/// `database` and `user` (the entry's or the user's own, else the setting's).
pub(crate) fn client_limits(cfg: &crate::config::Config, database: &str, user: &str) -> (u32, u32) {
    let s = &cfg.settings;
    let db_max = cfg
        .databases
        .get(database)
        .or(cfg.fallback_database.as_ref())
        .and_then(|d| d.max_db_client_connections)
        .unwrap_or(s.max_db_client_connections);
    let user_max = cfg
        .users
        .get(user)
        .and_then(|u| u.max_user_client_connections)
        .unwrap_or(s.max_user_client_connections);
    (db_max, user_max)
}

/// A logged-in client of a pool: checks the client limits, registers it for the
/// console and makes its session. None if a limit turned it away.
#[allow(clippy::too_many_arguments)]
async fn open_session(
    app: Arc<App>,
    stream: &Stream,
    start: Box<(LoggedIn, BytesMut)>,
    id: u64,
    (peer, local, tls): (&PeerAddr, Option<SocketAddr>, TlsInfo),
    slot: ClientSlot,
    cfg: &crate::config::Config,
) -> Option<(Box<Session>, Welcome)> {
    let (who, leftover) = *start;
    // Its console entry (SHOW CLIENTS, KILL_CLIENT), registered once the client limits
    // let it in, until the session drops. The names are the pool's unless the
    // client's differ (a forced user).
    let shared = |own: &str, pool: &Arc<str>| match **pool == *own {
        true => pool.clone(),
        false => Arc::from(own),
    };
    let info = Arc::new(ClientInfo::new(ClientMeta {
        id,
        user: shared(&who.user, &who.pool.user_name),
        database: shared(&who.database, &who.pool.db_name),
        pool_user: who.pool.user_name.clone(),
        peer: peer.clone(),
        local_addr: local.map(Into::into),
        application_name: who.params.get("application_name").unwrap_or("").into(),
        kind: who
            .replication
            .map_or(ClientKind::Pooled, ClientKind::Replication),
        tls,
    }));
    let log_pooler_errors = cfg.settings.log_pooler_errors;
    let s = &cfg.settings;
    match app.count_client(&info, client_limits(cfg, &who.database, &who.user)) {
        Ok(()) => {}
        Err(setting) => {
            // PgBouncer's words for these two limits (max_client_conn's differ).
            let message = format!("client connections exceeded ({setting})");
            let tag = ClientTag::new(&info, log_pooler_errors);
            // PgBouncer's two lines: the close (LOG), then the error sent (WARNING).
            let age = info.age().as_secs();
            tracing::info!("{tag} closing because: {message} (age={age}s)");
            if log_pooler_errors {
                tracing::warn!("{tag} pooler error: {message}");
            }
            Box::pin(send_fatal(stream, PROTOCOL_VIOLATION, &message)).await;
            return None;
        }
    };
    app.client_reg.add(&info);
    let r = Registrations {
        info,
        slot,
        log_pooler_errors,
    };
    let (session, greeting) = Session::new(r, who);
    let notice = s.login_notify_message.clone();
    Some((
        session,
        Welcome {
            greeting,
            leftover,
            notice,
        },
    ))
}

/// Runs a session in the current task until it ends (then logs why) or sleeps (then
/// hands it to the keeper). With `welcome`, the session is new; without, it wakes up.
///
/// Not an `async fn`: that would copy its arguments into the future a second time
/// (the stream alone is 72 bytes), in every awake client's task; an `async move`
/// block uses them in place (docs/performance.md, twenty-second round).
#[allow(clippy::manual_async_fn)] // on purpose, as above
fn drive(
    stream: Stream,
    mut s: Box<Session>,
    welcome: Option<Welcome>,
) -> impl Future<Output = ()> {
    async move {
        let info = s.info.clone();
        keeper::came_back(&s.app().keeper, &info, info.set_awake());
        let ended = tokio::select! {
            biased;
            r = run::serve(&mut s, &stream, welcome) => r,
            // KILL / KILL_CLIENT: any server the session holds is closed.
            why = info.killed() => {
                s.drop_server(why);
                Box::pin(send_fatal(&stream, PROTOCOL_VIOLATION, why)).await;
                Ended::Closed(why.into())
            }
        };
        let reason = match ended {
            Ended::Closed(reason) => reason,
            Ended::Asleep => {
                info.set_asleep();
                let app = s.app().clone();
                return app.keeper.put(stream.into_std(), s);
            }
        };
        if s.log_disconnections {
            tracing::info!(
                "{} closing because: {reason} (age={}s)",
                s.tag(),
                s.info.age().as_secs()
            );
        }
    }
}

/// Logs a failed login's `closing because:` line as PgBouncer writes it (with the
/// connection's age in seconds, which log parsers match on), and tells the client.
/// A client gone without a word (a port probe, a load balancer's check) is logged
/// only with `log_disconnections` (`eof_logged`), as PgBouncer logs it.
async fn report_login_failure(
    (id, age): (u64, u64),
    peer: &PeerAddr,
    stream: &Stream,
    e: ClientError,
    eof_logged: bool,
) {
    const UNNAMED: &str = "(nodb)/(nouser)";
    let (named, e) = match e {
        ClientError::Named { who, error } => (Some(who), *error),
        e => (None, e),
    };
    let who = named.as_deref().unwrap_or(UNNAMED);
    match e {
        ClientError::Fatal { code, message, who } => {
            let who = who.as_deref().unwrap_or(UNNAMED);
            // PgBouncer's two lines: the close (LOG), then the error sent (WARNING).
            tracing::info!("C-{id}: {who}@{peer} closing because: {message} (age={age}s)");
            tracing::warn!("C-{id}: {who}@{peer} pooler error: {message}");
            send_fatal(stream, code, &message).await;
        }
        ClientError::Io(e) => {
            tracing::info!(
                "C-{id}: {who}@{peer} closing because: client I/O error: {e} (age={age}s)"
            )
        }
        ClientError::Gone if eof_logged => {
            tracing::info!(
                "C-{id}: {who}@{peer} closing because: client unexpected eof (age={age}s)"
            )
        }
        ClientError::Gone => {}
        ClientError::Dropped(why) => {
            tracing::info!("C-{id}: {who}@{peer} closing because: {why} (age={age}s)")
        }
        // `naming` never nests them.
        ClientError::Named { .. } => {}
    }
}

/// Best-effort FATAL error to a client that is about to be closed.
async fn send_fatal(stream: &Stream, code: &str, message: &str) {
    let mut out = BytesMut::with_capacity(64 + message.len());
    backend::error_response(&mut out, "FATAL", code, message);
    let _ = crate::timer::timeout(std::time::Duration::from_secs(1), stream.write_all(&out)).await;
}

/// Tells the client why it cannot get a server, and closes it.
async fn fail_client(stream: &Stream, tag: ClientTag<'_>, e: &PoolError) -> String {
    let (code, message) = e.client_error();
    if tag.log_pooler_errors {
        tracing::warn!("{tag} pooler error: {message}");
    }
    let mut out = BytesMut::with_capacity(64 + message.len());
    backend::error_response(&mut out, "FATAL", &code, &message);
    let _ = crate::timer::timeout(std::time::Duration::from_secs(1), stream.write_all(&out)).await;
    message
}

async fn protocol_failure(
    stream: &Stream,
    relay: &mut Relay,
    tag: ClientTag<'_>,
    e: &crate::protocol::ProtocolError,
) -> String {
    use crate::protocol::ProtocolError;
    let message = match e {
        // A refusal's reason and a bad header are PgBouncer's texts as they are.
        ProtocolError::Refused(why) => (*why).to_owned(),
        ProtocolError::BadHeader(_) => e.to_string(),
        ProtocolError::UnknownMessage(t) => {
            tracing::error!("{tag} unknown pkt from client: {t}/0x{t:x}");
            e.to_string()
        }
        e => format!("client protocol error: {e}"),
    };
    fail_with(stream, relay, tag, PROTOCOL_VIOLATION, &message).await
}

/// Sends a FATAL error after whatever the client is still owed, and ends the session.
async fn fail_with(
    stream: &Stream,
    relay: &mut Relay,
    tag: ClientTag<'_>,
    code: &str,
    message: &str,
) -> String {
    if tag.log_pooler_errors {
        tracing::warn!("{tag} pooler error: {message}");
    }
    let mut out = BytesMut::with_capacity(64 + message.len());
    backend::error_response(&mut out, "FATAL", code, message);
    let send = relay.send_to_client(stream, &out);
    let _ = crate::timer::timeout(std::time::Duration::from_secs(1), send).await;
    message.to_owned()
}

/// The client timeouts for `user`: `[users]` overrides, else the global settings.
fn timeouts(cfg: &crate::config::Config, user: &str) -> Timeouts {
    let s = &cfg.settings;
    let u = cfg.users.get(user);
    Timeouts::new(
        u.and_then(|u| u.query_timeout).unwrap_or(s.query_timeout),
        u.and_then(|u| u.idle_transaction_timeout)
            .unwrap_or(s.idle_transaction_timeout),
        u.and_then(|u| u.transaction_timeout)
            .unwrap_or(s.transaction_timeout),
        u.and_then(|u| u.client_idle_timeout)
            .unwrap_or(s.client_idle_timeout),
    )
}

//! A client's life: login, then the relay through server connections lent by its pool,
//! until the client leaves; then the server goes back (reset) or is closed.

mod assign;
pub mod cancel;
pub mod framer;
pub mod login;
pub mod params;
pub mod relay;

use std::io;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use crate::app::App;
use crate::config::PoolMode;
use crate::net::{PeerAddr, Stream};
use crate::pool::{PoolError, ServerConn};
use crate::protocol::backend;
use crate::protocol::sqlstate::*;
use crate::stats::conns::{ClientInfo, ClientMeta};
use assign::{acquire_linked, finish_server, link_server};
use login::{LoggedIn, Startup};
use relay::{Outcome, Relay, ReleaseAt, Timeouts};

/// A client's log prefix (`C-<id>: db/user@addr`) and whether its pooler errors are
/// logged (`log_pooler_errors`).
#[derive(Debug)]
pub struct ClientTag {
    text: String,
    log_pooler_errors: bool,
}

impl std::fmt::Display for ClientTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why a client is being turned away or disconnected.
#[derive(Debug)]
pub enum ClientError {
    /// Send this FATAL error to the client, then close.
    Fatal { code: &'static str, message: String },
    /// The socket failed; nothing can be sent.
    Io(io::Error),
    /// The client closed its socket.
    Gone,
}

impl ClientError {
    pub fn fatal(code: &'static str, message: String) -> ClientError {
        ClientError::Fatal { code, message }
    }
}

/// What a login produced: a pooled session or an admin console one.
enum Who {
    Pooled(LoggedIn),
    Console(crate::admin::AdminLogin),
}

/// Counts a client out of `max_client_conn` when its task ends, however it ends.
struct ClientSlot<'a>(&'a App);

impl Drop for ClientSlot<'_> {
    fn drop(&mut self) {
        self.0.remove_client();
    }
}

/// Serves one accepted client connection to the end.
pub async fn serve_client(app: Arc<App>, stream: Stream) {
    let id = app
        .client_ids
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let cfg = app.config();
    let peer = stream.peer_addr();
    if !app.try_add_client(cfg.settings.max_client_conn) {
        tracing::warn!("C-{id}: (nodb)/(nouser)@{peer} closing because: no more connections allowed (max_client_conn)");
        let msg = "no more connections allowed (max_client_conn)";
        Box::pin(send_fatal(&stream, TOO_MANY_CONNECTIONS, msg)).await;
        return;
    }
    let _slot = ClientSlot(&app);
    let started = Instant::now();
    let mut buf = BytesMut::new();

    // Boxed: the login state is big and short-lived; an idle client keeps only the
    // session's (small) state inline in its task.
    let login = Box::pin(async {
        match login::read_startup(&app, &stream, &mut buf).await? {
            Startup::Cancel => Ok(None),
            Startup::Login { minor, params } => {
                if cfg.settings.log_connections {
                    let user = param(&params, "user");
                    let db = params
                        .iter()
                        .find(|(k, _)| k == "database")
                        .map(|(_, v)| v.as_str())
                        .unwrap_or(user);
                    tracing::info!(
                        "C-{id}: {db}/{user}@{peer} login attempt: db={db} user={user} tls=no"
                    );
                }
                if crate::admin::is_console(&params) {
                    return crate::admin::login(&app, &stream, &mut buf, minor, params)
                        .await
                        .map(|a| Some(Who::Console(a)));
                }
                login::login(&app, &stream, &mut buf, minor, params)
                    .await
                    .map(|w| Some(Who::Pooled(w)))
            }
        }
    });
    let limit = cfg.settings.client_login_timeout;
    let result = if limit.is_zero() {
        login.await
    } else {
        match Box::pin(tokio::time::timeout(limit, login)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::fatal(
                PROTOCOL_VIOLATION,
                "client_login_timeout".into(),
            )),
        }
    };
    let who = match result {
        Ok(Some(Who::Pooled(who))) => who,
        Ok(Some(Who::Console(a))) => {
            Box::pin(crate::admin::serve(&app, &stream, buf, a, id, peer)).await;
            return;
        }
        Ok(None) => return,
        Err(e) => {
            Box::pin(report_login_failure(id, &peer, &stream, e)).await;
            return;
        }
    };
    // The login buffer is only worth keeping if the client sent more than its login.
    let buf = if buf.is_empty() { BytesMut::new() } else { buf };
    // Boxed: the session's state is allocated once, apart from the (small) task.
    Box::pin(pooled_session(
        &app, &stream, who, buf, id, &peer, started, &cfg,
    ))
    .await;
}

/// A logged-in client of a pool, from the client limits to the disconnect log line.
#[allow(clippy::too_many_arguments)]
async fn pooled_session(
    app: &App,
    stream: &Stream,
    who: LoggedIn,
    buf: BytesMut,
    id: u64,
    peer: &PeerAddr,
    started: Instant,
    cfg: &crate::config::Config,
) {
    let tag = ClientTag {
        text: format!("C-{id}: {}/{}@{peer}", who.database, who.user),
        log_pooler_errors: cfg.settings.log_pooler_errors,
    };
    let s = &cfg.settings;
    let db_max = cfg
        .databases
        .get(&who.database)
        .or(cfg.fallback_database.as_ref())
        .and_then(|d| d.max_db_client_connections)
        .unwrap_or(s.max_db_client_connections);
    let user_max = cfg
        .users
        .get(&who.user)
        .and_then(|u| u.max_user_client_connections)
        .unwrap_or(s.max_user_client_connections);
    let _counted = match app.count_client(&who.database, db_max, &who.user, user_max) {
        Ok(c) => c,
        Err(setting) => {
            let message = format!("no more connections allowed ({setting})");
            tracing::warn!("{tag} closing because: {message}");
            Box::pin(send_fatal(stream, TOO_MANY_CONNECTIONS, &message)).await;
            return;
        }
    };
    // Registered for the console (SHOW CLIENTS, KILL_CLIENT) while the session runs.
    let info = app.client_reg.register(ClientMeta {
        id,
        user: who.user.clone(),
        database: who.database.clone(),
        pool_user: who.pool.key.user.clone(),
        peer: peer.clone(),
        local_addr: stream.local_addr(),
        application_name: who.params.get("application_name").unwrap_or("").to_owned(),
        admin: false,
    });
    let reason = tokio::select! {
        r = run_session(app, stream, who, buf, &tag, &info) => r,
        // KILL / KILL_CLIENT: the session (and any server it holds) is dropped.
        why = info.killed() => {
            Box::pin(send_fatal(stream, PROTOCOL_VIOLATION, why)).await;
            why.to_owned()
        }
    };
    if cfg.settings.log_disconnections {
        tracing::info!(
            "{tag} closing because: {reason} (age={}s)",
            started.elapsed().as_secs()
        );
    }
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> &'a str {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

async fn report_login_failure(id: u64, peer: &PeerAddr, stream: &Stream, e: ClientError) {
    match e {
        ClientError::Fatal { code, message } => {
            tracing::warn!("C-{id}: (nodb)/(nouser)@{peer} closing because: {message}");
            tracing::warn!("C-{id}: (nodb)/(nouser)@{peer} pooler error: {message}");
            send_fatal(stream, code, &message).await;
        }
        ClientError::Io(e) => {
            tracing::info!("C-{id}: (nodb)/(nouser)@{peer} closing because: client I/O error: {e}")
        }
        ClientError::Gone => {
            tracing::debug!("C-{id}: (nodb)/(nouser)@{peer} closing because: client unexpected eof")
        }
    }
}

/// Best-effort FATAL error to a client that is about to be closed.
async fn send_fatal(stream: &Stream, code: &str, message: &str) {
    let mut out = BytesMut::with_capacity(64 + message.len());
    backend::error_response(&mut out, "FATAL", code, message);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.write_all(&out)).await;
}

/// After login: welcome, then relay until the client leaves. Returns the reason the
/// session ended, for the log.
async fn run_session(
    app: &App,
    stream: &Stream,
    who: LoggedIn,
    leftover: BytesMut,
    tag: &ClientTag,
    info: &ClientInfo,
) -> String {
    let LoggedIn {
        pool,
        mut params,
        user,
        ..
    } = who;
    let cfg = app.config();
    let cancel_key = app.cancels.register();

    // The welcome needs the server's parameters; the first client of a pool waits for
    // a server login to learn them.
    let welcome = match pool.welcome().or_else(|| app.pools.sibling_welcome(&pool)) {
        Some(w) => w,
        None => match Box::pin(pool.acquire()).await {
            Ok(server) => {
                pool.release(server, true);
                match pool.welcome() {
                    Some(w) => w,
                    None => Arc::new(Vec::new()),
                }
            }
            Err(e) => return Box::pin(fail_client(stream, tag, &e)).await,
        },
    };
    params.fill_unset(&welcome);
    let mut out = BytesMut::with_capacity(512);
    for (k, v) in params.overlay(&welcome) {
        backend::parameter_status(&mut out, &k, &v);
    }
    backend::backend_key_data(&mut out, cancel_key.pid, cancel_key.key);
    backend::ready_for_query(&mut out, b'I');
    if let Err(e) = Box::pin(stream.write_all(&out)).await {
        return format!("client I/O error: {e}");
    }
    drop(out);

    let mode = pool.config().pool_mode;
    // server_fast_close: a session-mode server retired by RECONNECT or a reload closes
    // at the end of the current transaction, and the client with it (PgBouncer).
    let fast_close = mode == PoolMode::Session && cfg.settings.server_fast_close;
    let release_at = match mode {
        PoolMode::Session if fast_close => ReleaseAt::SessionCheckpoints,
        PoolMode::Session => ReleaseAt::SessionEnd,
        PoolMode::Transaction => ReleaseAt::TransactionEnd,
        PoolMode::Statement => ReleaseAt::StatementEnd,
    };
    // Boxed so that the task of an idle client stays small.
    let mut relay = Box::new(Relay::new(cfg.settings.max_packet_size));
    relay.set_timeouts(timeouts(&cfg, &user));
    let max_prepared = cfg.settings.max_prepared_statements as usize;
    if mode != PoolMode::Session && max_prepared > 0 {
        relay.enable_prepared(app.statements.clone(), max_prepared);
    }
    relay.stats.counts.logins += 1;
    if !leftover.is_empty() {
        if let Err(e) = relay.preload(&leftover) {
            return Box::pin(protocol_failure(stream, &mut relay, tag, &e.to_string())).await;
        }
    }
    let reset_always = pool.config().server_reset_query_always;
    let mut server: Option<ServerConn> = None;
    let mut gate = app.gate_watch();
    let reason = loop {
        let Some(srv) = server.as_mut() else {
            if relay.c2s.is_empty() {
                match relay.read_client_unlinked(stream, &pool.stats).await {
                    Ok(true) => {}
                    Ok(false) => break "client close request".to_owned(),
                    Err(Outcome::ClientProtocol(e)) => {
                        return Box::pin(protocol_failure(stream, &mut relay, tag, &e.to_string()))
                            .await
                    }
                    Err(Outcome::Timeout(why)) => {
                        return Box::pin(fail_with(
                            stream,
                            &mut relay,
                            tag,
                            PROTOCOL_VIOLATION,
                            why,
                        ))
                        .await
                    }
                    Err(_) => break "client unexpected eof".to_owned(),
                }
            }
            // A paused or stopping pooler lends no more servers; the client waits.
            let request_at = relay.last_read();
            info.set_waiting(request_at);
            while gate.borrow().blocks(&pool.key.database) {
                if gate.changed().await.is_err() {
                    break;
                }
            }
            // The common case needs neither a future nor a clock: an idle server whose
            // parameters already match.
            let fast = pool.try_acquire_idle(request_at);
            if let Some(s) = fast.as_ref().filter(|s| !params.differs(s)) {
                relay.stats.wait_hist.record(0);
                link_server(&cancel_key, info, s, &mut relay);
                server = fast;
                continue;
            }
            let asked = Instant::now();
            let acquired = {
                // Watch the client while it waits: one that leaves gives up its place
                // at once and its buffered query never runs.
                let mut acquire = Box::pin(acquire_linked(&pool, &mut params, fast));
                loop {
                    tokio::select! {
                        biased;
                        r = &mut acquire => break Some(r),
                        r = stream.readable(), if relay.can_buffer_more() => {
                            match r.and_then(|_| relay.read_while_waiting(stream)) {
                                Ok(true) => {}
                                Ok(false) => break None,
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                Err(_) => break None,
                            }
                        }
                    }
                }
            };
            let Some(acquired) = acquired else {
                break "client unexpected eof".to_owned();
            };
            match acquired {
                Ok(s) => {
                    let waited = asked.elapsed().as_micros() as u64;
                    relay.stats.counts.wait_time_us += waited;
                    relay.stats.wait_hist.record(waited);
                    link_server(&cancel_key, info, &s, &mut relay);
                    server = Some(s);
                }
                Err(e) => return Box::pin(fail_client(stream, tag, &e)).await,
            }
            continue;
        };
        // Boxed per transaction: the relay's state lives only while a server is linked.
        match Box::pin(relay.run(stream, srv, &mut params, release_at, &pool.stats)).await {
            Outcome::ReleasePoint if mode == PoolMode::Session => {
                // Only with server_fast_close: keep the server unless it was retired.
                let retired = server
                    .as_ref()
                    .is_some_and(|s| s.generation != pool.generation());
                if retired {
                    cancel_key.target.set(None);
                    info.unlink();
                    drop(server.take());
                    return Box::pin(fail_with(
                        stream,
                        &mut relay,
                        tag,
                        ADMIN_SHUTDOWN,
                        "server_fast_close",
                    ))
                    .await;
                }
            }
            Outcome::ReleasePoint => {
                info.set_prepared(relay.prepared_count());
                if reset_always {
                    if let Some(s) = server.take() {
                        // Resets and returns it (or closes it if the reset fails).
                        Box::pin(finish_server(&pool, s, true, PoolMode::Session)).await;
                    }
                }
                cancel_key.target.set(None);
                info.unlink();
                if let Some(s) = server.take() {
                    pool.release_at(s, true, relay.last_activity());
                }
                // The client may now stay idle for long: its counts go in now.
                pool.stats.flush(&mut relay.stats);
                relay.shrink_idle();
            }
            Outcome::ClientClosed => {
                break if relay.terminated() {
                    "client close request"
                } else {
                    "client unexpected eof"
                }
                .to_owned()
            }
            Outcome::ClientFailed(e) => break format!("client I/O error: {e}"),
            Outcome::ClientProtocol(e) => {
                cancel_key.target.set(None);
                drop(server.take());
                return Box::pin(protocol_failure(stream, &mut relay, tag, &e.to_string())).await;
            }
            Outcome::Timeout(why) => {
                cancel_key.target.set(None);
                drop(server.take());
                let code = if why == "query_timeout" {
                    QUERY_CANCELED
                } else {
                    PROTOCOL_VIOLATION
                };
                return Box::pin(fail_with(stream, &mut relay, tag, code, why)).await;
            }
            Outcome::LongTransaction => {
                cancel_key.target.set(None);
                drop(server.take());
                return Box::pin(fail_with(
                    stream,
                    &mut relay,
                    tag,
                    PROTOCOL_VIOLATION,
                    "Long transactions not allowed",
                ))
                .await;
            }
            Outcome::ServerClosed(_) | Outcome::ServerProtocol(_) => {
                cancel_key.target.set(None);
                drop(server.take());
                let msg = "server conn crashed?";
                let mut out = BytesMut::new();
                backend::error_response(&mut out, "FATAL", CONNECTION_FAILURE, msg);
                let _ = Box::pin(relay.send_to_client(stream, &out)).await;
                break msg.to_owned();
            }
        }
    };
    cancel_key.target.set(None);
    pool.stats.flush(&mut relay.stats);
    if let Some(s) = server.take() {
        Box::pin(finish_server(&pool, s, relay.server_clean(), mode)).await;
    }
    reason
}

/// Tells the client why it cannot get a server, and closes it.
async fn fail_client(stream: &Stream, tag: &ClientTag, e: &PoolError) -> String {
    let (code, message) = e.client_error();
    if tag.log_pooler_errors {
        tracing::warn!("{tag} pooler error: {message}");
    }
    let mut out = BytesMut::with_capacity(64 + message.len());
    backend::error_response(&mut out, "FATAL", &code, &message);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.write_all(&out)).await;
    message
}

async fn protocol_failure(
    stream: &Stream,
    relay: &mut Relay,
    tag: &ClientTag,
    what: &str,
) -> String {
    let message = format!("client protocol error: {what}");
    fail_with(stream, relay, tag, PROTOCOL_VIOLATION, &message).await
}

/// Sends a FATAL error after whatever the client is still owed, and ends the session.
async fn fail_with(
    stream: &Stream,
    relay: &mut Relay,
    tag: &ClientTag,
    code: &str,
    message: &str,
) -> String {
    if tag.log_pooler_errors {
        tracing::warn!("{tag} pooler error: {message}");
    }
    let mut out = BytesMut::with_capacity(64 + message.len());
    backend::error_response(&mut out, "FATAL", code, message);
    let send = relay.send_to_client(stream, &out);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), send).await;
    message.to_owned()
}

/// The client timeouts for `user`: `[users]` overrides, else the global settings.
fn timeouts(cfg: &crate::config::Config, user: &str) -> Timeouts {
    let s = &cfg.settings;
    let u = cfg.users.get(user);
    Timeouts {
        query: u.and_then(|u| u.query_timeout).unwrap_or(s.query_timeout),
        idle_transaction: u
            .and_then(|u| u.idle_transaction_timeout)
            .unwrap_or(s.idle_transaction_timeout),
        transaction: u
            .and_then(|u| u.transaction_timeout)
            .unwrap_or(s.transaction_timeout),
        client_idle: u
            .and_then(|u| u.client_idle_timeout)
            .unwrap_or(s.client_idle_timeout),
    }
}

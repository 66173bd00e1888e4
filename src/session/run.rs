//! The logged-in part of a client's life: the welcome, then one step per request
//! (get a server, relay until the release point) until the client leaves.
//!
//! An idle client waits in `run_session`'s loop, whose state is small; everything a
//! request needs (the acquire, the relay, the outcome handling) lives in the future
//! of `Session::step`, boxed once per request. So the task of an idle client holds
//! a few hundred bytes rather than every await point's state.

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use tokio::sync::watch;

use super::assign::{acquire_linked, finish_server, link_server};
use super::cancel::CancelKeyGuard;
use super::login::LoggedIn;
use super::params::ClientParams;
use super::relay::{Outcome, Parked, RelaySlot, ReleaseAt};
use super::{fail_client, fail_with, protocol_failure, timeouts, ClientTag};
use crate::app::{App, Gate};
use crate::config::PoolMode;
use crate::net::Stream;
use crate::pool::{Pool, ServerConn};
use crate::protocol::backend;
use crate::protocol::sqlstate::*;
use crate::stats::conns::ClientInfo;

/// What a step leaves the session to do.
enum Step {
    /// Serve the next request.
    Next,
    /// The session is over: stats flushed, server (if any) reset or closed.
    End(String),
    /// The session is over and already cleaned up (a fatal error was sent).
    Done(String),
}

/// The state that outlives one request.
struct Session<'a> {
    stream: &'a Stream,
    tag: &'a ClientTag,
    info: &'a ClientInfo,
    pool: Arc<Pool>,
    params: ClientParams,
    cancel_key: CancelKeyGuard<'a>,
    relay: RelaySlot,
    server: Option<ServerConn>,
    gate: watch::Receiver<Gate>,
    mode: PoolMode,
    release_at: ReleaseAt,
    reset_always: bool,
}

/// After login: welcome, then relay until the client leaves. Returns the reason the
/// session ended, for the log.
pub(super) async fn run_session(
    app: &App,
    stream: &Stream,
    login: Box<(LoggedIn, BytesMut)>,
    tag: &ClientTag,
    info: &ClientInfo,
) -> String {
    // The start's state is gone once it returns: only the session loop stays.
    match Box::pin(start(app, stream, login, tag, info)).await {
        Ok(s) => serve(s).await,
        Err(reason) => reason,
    }
}

/// The welcome (parameters, cancel key, ReadyForQuery) and the session's state.
async fn start<'a>(
    app: &'a App,
    stream: &'a Stream,
    login: Box<(LoggedIn, BytesMut)>,
    tag: &'a ClientTag,
    info: &'a ClientInfo,
) -> Result<Box<Session<'a>>, String> {
    let (who, leftover) = *login;
    let LoggedIn {
        pool,
        mut params,
        user,
        greeting,
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
            Err(e) => return Err(Box::pin(fail_client(stream, tag, &e)).await),
        },
    };
    params.fill_unset(&welcome);
    pool.shared_params.share(&mut params);
    // AuthenticationOk and the welcome go out in one write.
    let mut out = greeting;
    out.reserve(512);
    for (k, v) in params.overlay(&welcome) {
        backend::parameter_status(&mut out, &k, &v);
    }
    drop(welcome);
    backend::backend_key_data(&mut out, cancel_key.pid, cancel_key.key);
    backend::ready_for_query(&mut out, b'I');
    if let Err(e) = Box::pin(stream.write_all(&out)).await {
        return Err(format!("client I/O error: {e}"));
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
    // An idle client keeps only the parked part of its relay.
    let mut kept = Parked::new(cfg.settings.max_packet_size, timeouts(&cfg, &user));
    let max_prepared = cfg.settings.max_prepared_statements as usize;
    if mode != PoolMode::Session && max_prepared > 0 {
        kept.enable_prepared(app.statements.clone(), max_prepared);
    }
    let mut relay = RelaySlot::new(kept);
    let first = relay.get();
    first.stats.counts.logins += 1;
    if !leftover.is_empty() {
        if let Err(e) = first.preload(&leftover) {
            let why = e.to_string();
            return Err(Box::pin(protocol_failure(stream, first, tag, &why)).await);
        }
    }
    drop(leftover);
    pool.stats.flush(&mut first.stats);
    // Parked unless the client already sent a request with its login.
    relay.park();
    let reset_always = pool.config().server_reset_query_always;
    drop(cfg);
    Ok(Box::new(Session {
        stream,
        tag,
        info,
        pool,
        params,
        cancel_key,
        relay,
        server: None,
        gate: app.gate_watch(),
        mode,
        release_at,
        reset_always,
    }))
}

/// Serves requests until the client leaves.
async fn serve(mut s: Box<Session<'_>>) -> String {
    let (stream, tag, mode) = (s.stream, s.tag, s.mode);
    let reason = loop {
        if let Some(kept) = s.relay.parked() {
            // Idle: the only await an idle client's task holds.
            if let Err(why) = kept.wait_idle(stream).await {
                let relay = s.relay.get();
                return Box::pin(fail_with(stream, relay, tag, PROTOCOL_VIOLATION, why)).await;
            }
        }
        if s.server.is_none() && !s.relay.get().has_request() {
            // Bytes are usually there by now: read them without a future; the wait
            // for more is boxed so that it adds nothing to an idle client's task.
            let relay = s.relay.get();
            let read = match relay.try_read_unlinked(stream) {
                Some(r) => r,
                None => Box::pin(relay.read_client_unlinked(stream, &s.pool.stats)).await,
            };
            match read {
                Ok(true) => {}
                Ok(false) => break "client close request".to_owned(),
                Err(Outcome::ClientProtocol(e)) => {
                    let why = e.to_string();
                    return Box::pin(protocol_failure(stream, s.relay.get(), tag, &why)).await;
                }
                Err(Outcome::Timeout(why)) => {
                    let relay = s.relay.get();
                    return Box::pin(fail_with(stream, relay, tag, PROTOCOL_VIOLATION, why)).await;
                }
                Err(_) => break "client unexpected eof".to_owned(),
            }
        }
        match Box::pin(s.step()).await {
            Step::Next => {}
            Step::End(reason) => break reason,
            Step::Done(reason) => return reason,
        }
    };
    s.cancel_key.target.set(None);
    let clean = match s.relay.active() {
        Some(relay) => {
            s.pool.stats.flush(&mut relay.stats);
            relay.server_clean()
        }
        None => true,
    };
    if let Some(srv) = s.server.take() {
        Box::pin(finish_server(&s.pool, srv, clean, mode)).await;
    }
    reason
}

impl Session<'_> {
    /// Serves one request: links a server if none is, then relays until the release
    /// point (or, in session mode, until the client leaves).
    async fn step(&mut self) -> Step {
        if self.server.is_none() {
            // The common case is synchronous; the wait (and the acquire's state, which
            // is large) is boxed so this future stays small: it is boxed per request.
            if let Err(fast) = self.try_link_idle() {
                if let Some(end) = Box::pin(self.link(fast)).await {
                    return end;
                }
            }
        }
        let Some(srv) = self.server.as_mut() else {
            return Step::Next;
        };
        let outcome = self
            .relay
            .get()
            .run(
                self.stream,
                srv,
                &mut self.params,
                self.release_at,
                &self.pool.stats,
            )
            .await;
        self.after(outcome).await
    }

    /// The common case of getting a server, needing neither a future nor a clock: the
    /// pooler lends, and an idle server's parameters already match. Otherwise the
    /// idle server it took (parameters to sync), if any, for [`Session::link`].
    fn try_link_idle(&mut self) -> Result<(), Option<ServerConn>> {
        let (pool, relay) = (&self.pool, self.relay.get());
        let request_at = relay.last_read();
        self.info.set_waiting(request_at);
        if self.gate.borrow().blocks(&pool.key.database) {
            return Err(None);
        }
        let mut fast = pool.try_acquire_idle(request_at);
        if let Some(s) = fast.take_if(|s| !self.params.differs(s)) {
            pool.stats.wait_hist.record(0);
            link_server(&self.cancel_key, self.info, &s, relay);
            self.server = Some(s);
            return Ok(());
        }
        Err(fast)
    }

    /// Gets a server for the pending request when [`Session::try_link_idle`] could
    /// not (`fast`: the idle server it took). Returns how the session ends if it
    /// cannot.
    async fn link(&mut self, mut fast: Option<ServerConn>) -> Option<Step> {
        // A paused or stopping pooler lends no more servers; the client waits, then
        // tries the common case again.
        let mut waited = false;
        while self.gate.borrow().blocks(&self.pool.key.database) {
            waited = true;
            if self.gate.changed().await.is_err() {
                break;
            }
        }
        if waited {
            match self.try_link_idle() {
                Ok(()) => return None,
                Err(f) => fast = f,
            }
        }
        let (pool, relay) = (&self.pool, self.relay.get());
        let asked = Instant::now();
        let acquired = {
            // Watch the client while it waits: one that leaves gives up its place at
            // once and its buffered query never runs.
            let mut acquire = std::pin::pin!(acquire_linked(pool, &mut self.params, fast));
            loop {
                tokio::select! {
                    biased;
                    r = &mut acquire => break Some(r),
                    r = self.stream.readable(), if relay.can_buffer_more() => {
                        match r.and_then(|_| relay.read_while_waiting(self.stream)) {
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
            return Some(Step::End("client unexpected eof".to_owned()));
        };
        match acquired {
            Ok(s) => {
                let waited = asked.elapsed().as_micros() as u64;
                relay.stats.counts.wait_time_us += waited;
                pool.stats.wait_hist.record(waited);
                link_server(&self.cancel_key, self.info, &s, relay);
                self.server = Some(s);
                None
            }
            Err(e) => Some(Step::Done(
                Box::pin(fail_client(self.stream, self.tag, &e)).await,
            )),
        }
    }

    /// Acts on how the relay stopped.
    async fn after(&mut self, outcome: Outcome) -> Step {
        match outcome {
            Outcome::ReleasePoint if self.mode == PoolMode::Session => {
                // Only with server_fast_close: keep the server unless it was retired.
                let generation = self.pool.generation();
                let retired = self
                    .server
                    .as_ref()
                    .is_some_and(|s| s.generation != generation);
                if retired {
                    self.info.unlink();
                    return self.fail(ADMIN_SHUTDOWN, "server_fast_close").await;
                }
                Step::Next
            }
            Outcome::ReleasePoint => {
                let relay = self.relay.get();
                self.info.set_prepared(relay.prepared_count());
                let last_activity = relay.last_activity();
                if self.reset_always {
                    if let Some(s) = self.server.take() {
                        // Resets and returns it (or closes it if the reset fails).
                        Box::pin(finish_server(&self.pool, s, true, PoolMode::Session)).await;
                    }
                }
                self.cancel_key.target.set(None);
                self.info.unlink();
                if let Some(s) = self.server.take() {
                    self.pool.release_at(s, true, last_activity);
                }
                // The client may now stay idle for long: its counts go in now.
                self.pool.stats.flush(&mut self.relay.get().stats);
                self.relay.park();
                Step::Next
            }
            Outcome::ClientClosed => Step::End(
                if self.relay.get().terminated() {
                    "client close request"
                } else {
                    "client unexpected eof"
                }
                .to_owned(),
            ),
            Outcome::ClientFailed(e) => Step::End(format!("client I/O error: {e}")),
            Outcome::ClientProtocol(e) => {
                self.drop_server();
                let why = e.to_string();
                Step::Done(
                    Box::pin(protocol_failure(
                        self.stream,
                        self.relay.get(),
                        self.tag,
                        &why,
                    ))
                    .await,
                )
            }
            Outcome::Timeout(why) => {
                let code = if why == "query_timeout" {
                    QUERY_CANCELED
                } else {
                    PROTOCOL_VIOLATION
                };
                self.fail(code, why).await
            }
            Outcome::LongTransaction => {
                self.fail(PROTOCOL_VIOLATION, "Long transactions not allowed")
                    .await
            }
            Outcome::ServerClosed(_) | Outcome::ServerProtocol(_) => {
                self.drop_server();
                let msg = "server conn crashed?";
                let mut out = BytesMut::new();
                backend::error_response(&mut out, "FATAL", CONNECTION_FAILURE, msg);
                let _ = Box::pin(self.relay.get().send_to_client(self.stream, &out)).await;
                Step::End(msg.to_owned())
            }
        }
    }

    /// Closes the linked server (its state is unknown) and forgets it for cancels.
    fn drop_server(&mut self) {
        self.cancel_key.target.set(None);
        drop(self.server.take());
    }

    /// Closes the server, sends the client a FATAL error and ends the session.
    async fn fail(&mut self, code: &str, message: &str) -> Step {
        self.drop_server();
        let why = Box::pin(fail_with(
            self.stream,
            self.relay.get(),
            self.tag,
            code,
            message,
        ))
        .await;
        Step::Done(why)
    }
}

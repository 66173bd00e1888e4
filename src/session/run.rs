//! The logged-in part of a client's life: the welcome (welcome.rs), then one step per request
//! (get a server, relay until the release point) until the client leaves or sleeps.
//!
//! An idle client waits in `serve`'s loop; everything a request needs (the acquire,
//! the relay, the outcome handling) lives in the future of `Session::step`, awaited
//! in that loop (so it adds its ~340 bytes, the wait in line included, to an awake
//! client's task, not an allocation to every request), with the rare large parts
//! boxed. A client idle for
//! 2 s leaves even that: `serve` returns [`Ended::Asleep`] and the keeper holds its
//! socket and [`Session`] without a task (keeper.rs).

use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

use super::assign::{acquire_linked, finish_server, link_server};
use super::cancel::CancelKey;
use super::params::ClientParams;
use super::relay::{Idle, Outcome, RelaySlot, ReleaseAt};
use super::{fail_client, fail_with, protocol_failure, ClientSlot, ClientTag};
use crate::app::App;
use crate::clock::Tick;
use crate::config::PoolMode;
use crate::net::Stream;
use crate::pool::{Checkout, Pool, PoolError, ServerConn, Ticket};
use crate::protocol::sqlstate::*;
use crate::stats::conns::ClientInfo;

mod after;
mod begin;
mod delegated;
mod fast_close;
mod gate;
mod turn;
mod watch;
mod welcome;
use turn::behind_ready_tasks;
use watch::watch_client;
pub(super) use welcome::{Registrations, Welcome};

/// Why [`Session::try_link_idle`] linked no server.
enum Pending {
    /// A place in the pool's line.
    Queued(Ticket),
    /// Anything else, with the idle server it took, if any.
    Other(Option<ServerConn>),
}

/// What a step leaves the session to do.
enum Step {
    /// Serve the next request.
    Next,
    /// The session is over: stats flushed, server (if any) reset or closed.
    End(Reason),
    /// The session is over and already cleaned up (a fatal error was sent).
    Done(Reason),
}

/// Why a session ended, for the log line: most reasons are fixed texts, which need
/// no allocation (one per connection saved).
pub(super) type Reason = std::borrow::Cow<'static, str>;

/// How [`serve`] stopped.
pub(super) enum Ended {
    /// The session is over, for this reason (for the log).
    Closed(Reason),
    /// The client is idle, holds no server and was asked to sleep: its socket can go to
    /// the keeper (keeper.rs) and its task end.
    Asleep,
}

/// A pooled client: its registrations (each undone when dropped) and the state that
/// outlives one request. It owns everything it needs, borrowing nothing from a task,
/// so that an idle client can sleep without one and wake up in a new one.
///
/// Every idle client keeps one, so it is kept small: what can be reached through the
/// app (the gate, the registries) is not copied here.
// What every request touches first (`repr(C)`), in the box's first cache line or
// two: see `relay::Relay`. Fields drop in this order too.
#[repr(C)]
pub(crate) struct Session {
    /// Its console entry, registered until the session drops.
    pub(super) info: Arc<ClientInfo>,
    pool: Arc<Pool>,
    server: Option<ServerConn>,
    params: ClientParams,
    mode: PoolMode,
    /// A replication client: a server connection of its own, for the whole session.
    replication: Option<crate::protocol::startup::Replication>,
    release_at: ReleaseAt,
    reset_always: bool,
    pub(super) log_disconnections: bool,
    log_pooler_errors: bool,
    /// Just logged in, no request yet (see [`super::relay::Parked::wait_idle`]).
    fresh: bool,
    /// The client's `BEGIN` was answered by the pooler: one with these modes goes to
    /// the server ahead of its next request (relay/begin.rs).
    begun: Option<crate::pool::Modes>,
    cancel_key: CancelKey,
    // The client counts out of max_client_conn once all else is gone but the relay's
    // memory (its server went back with `server`, above).
    slot: ClientSlot,
    /// Last: its parked part (64 bytes) is not read by a busy client's request.
    relay: RelaySlot,
}

impl Drop for Session {
    fn drop(&mut self) {
        let app = self.app();
        app.cancels.remove(self.cancel_key.pid, self.cancel_key.key);
        app.uncount_client(&self.info);
        app.client_reg.remove(self.info.meta.id);
    }
}

impl Session {
    /// Its log prefix.
    pub(super) fn tag(&self) -> ClientTag<'_> {
        ClientTag::new(&self.info, self.log_pooler_errors)
    }

    pub(super) fn app(&self) -> &Arc<App> {
        &self.slot.0
    }

    /// When this sleeping client's client_idle_timeout runs out, if one is set.
    pub(super) fn idle_deadline(&self) -> Option<Tick> {
        self.relay.parked().and_then(|p| p.idle_deadline())
    }

    /// Closes the linked server, if any (a killed client's server is in an unknown
    /// state), with PgBouncer's `closing because:` line for `reason`.
    pub(super) fn drop_server(&mut self, reason: &str) {
        self.info.unlink();
        if let Some(server) = self.server.take() {
            self.pool.log_server_close(&server, reason);
        }
    }
}

/// Serves requests until the client leaves or goes to sleep; with `welcome`, the
/// session is new and welcomes its client first.
///
/// A plain `fn` around an `async move` block, as are `step` and `wait_in_line`, so
/// that the arguments are not copied into the future twice (see `session::drive`).
#[allow(clippy::manual_async_fn)] // on purpose: see `session::drive`
pub(super) fn serve<'a>(
    s: &'a mut Session,
    stream: &'a Stream,
    welcome: Option<Welcome>,
) -> impl Future<Output = Ended> + 'a {
    async move {
        // Woken by the keeper: its socket turned readable (see the first read below).
        let mut woken = welcome.is_none();
        if let Some(w) = welcome {
            if let Err(reason) = Box::pin(s.welcome(stream, w)).await {
                return Ended::Closed(reason.into());
            }
        }
        let mode = s.mode;
        let reason = loop {
            // A client the keeper woke for its socket has bytes (or left): the first
            // read goes straight to the socket, not through a wait that would learn
            // it is readable only a loop turn later. Not for a killed one.
            let at_once = std::mem::take(&mut woken) && s.info.kill_reason().is_none();
            if s.relay.between_requests() && !at_once {
                // Idle: the only await an idle client's task holds.
                // A session-mode client that holds its server stays awake.
                let can_sleep = s.server.is_none() && s.app().keeper.running();
                let fresh = s.fresh.then(|| s.app().keeper.fresh_sleep());
                match s.relay.wait_idle(stream, &s.info, fresh, can_sleep).await {
                    // `fresh` stays until bytes come (below): a wake may find none.
                    Ok(Idle::Request) => {}
                    Ok(Idle::Sleep) => {
                        s.fresh = false;
                        // A sleeping client keeps only the parked part of its relay. A
                        // resting relay always parks; were it not to, the client stays
                        // awake, waiting for its next request.
                        s.relay.park();
                        if s.relay.parked().is_some() {
                            return Ended::Asleep;
                        }
                    }
                    Err(why) => {
                        return Ended::Closed(s.fail(stream, PROTOCOL_VIOLATION, why).await.into())
                    }
                }
            }
            if s.server.is_none() && !s.relay.get().has_request() {
                // Bytes are usually there by now: read them without a future; the wait
                // for more is boxed so that it adds nothing to an idle client's task.
                let relay = s.relay.get();
                let read = match relay.try_read_unlinked(stream, at_once) {
                    Some(r) => r,
                    None if (s.fresh || at_once) && !relay.has_request() => {
                        // Readable, yet nothing to read (readiness can be spurious, or
                        // the keeper woke it for a timeout): a quiet client goes back
                        // to its idle wait (a fresh one to sleep when that runs out).
                        s.relay.rest();
                        if s.relay.between_requests() {
                            continue;
                        }
                        Box::pin(s.relay.get().read_client_unlinked(stream, &s.pool.stats)).await
                    }
                    None => Box::pin(relay.read_client_unlinked(stream, &s.pool.stats)).await,
                };
                // From now on only the janitor's sweep puts it to sleep: no timer per
                // request.
                s.fresh = false;
                match read {
                    Ok(true) => {}
                    // PgBouncer's words: Terminate is a close request, a bare EOF not.
                    Ok(false) if s.relay.get().terminated() => break "client close request".into(),
                    Ok(false) => break "client unexpected eof".into(),
                    Err(Outcome::ClientProtocol(e)) => {
                        let relay = s.relay.get();
                        let why = protocol_failure(
                            stream,
                            relay,
                            ClientTag::new(&s.info, s.log_pooler_errors),
                            &e,
                        );
                        return Ended::Closed(Box::pin(why).await.into());
                    }
                    Err(Outcome::Timeout(why)) => {
                        return Ended::Closed(s.fail(stream, PROTOCOL_VIOLATION, why).await.into());
                    }
                    Err(_) => break "client unexpected eof".into(),
                }
            }
            if s.took_begin() {
                // (Boxed: rare, and it would add to every client's task.)
                if let Err(reason) = Box::pin(s.answer_begin(stream)).await {
                    break reason;
                }
                continue;
            }
            s.carry_begin();
            match s.step(stream).await {
                Step::Next => {}
                Step::End(reason) => break reason,
                Step::Done(reason) => return Ended::Closed(reason),
            }
        };
        // No cancel reaches the server now (its reset, if any, is ours).
        s.info.unlink();
        let mut clean = match s.relay.active() {
            Some(relay) => {
                s.pool.stats.flush(&mut relay.stats);
                relay.server_clean()
            }
            None => true,
        };
        // Another client's request was written behind this one's (pool/pipeline.rs):
        // the rest of this answer is read and dropped, not the server closed under it.
        if let (false, Some(srv), Some(relay)) = (
            clean,
            s.server.as_mut().filter(|v| v.behind.is_some()),
            s.relay.active(),
        ) {
            clean = Box::pin(relay.drain_for_behind(srv, &mut s.params)).await;
        }
        if let Some(srv) = s.server.take() {
            Box::pin(finish_server(&s.pool, srv, clean, mode)).await;
        }
        Ended::Closed(reason)
    }
}

impl Session {
    /// Serves one request: links a server if none is, then relays until the release
    /// point (or, in session mode, until the client leaves).
    #[allow(clippy::manual_async_fn)] // on purpose: see `session::drive`
    fn step<'a>(&'a mut self, stream: &'a Stream) -> impl Future<Output = Step> + 'a {
        async move {
            if self.server.is_none() {
                // A place in line keeps this task's waker (borrowed here, cloned only then).
                match poll_fn(|cx| Poll::Ready(self.try_link_idle(cx.waker()))).await {
                    Ok(()) => {}
                    // Every server busy: the common wait with many clients, a small
                    // future awaited in place.
                    Err(Pending::Queued(ticket)) => {
                        if let Some(end) = self.wait_in_line(stream, ticket).await {
                            return end;
                        }
                    }
                    // The rest (a paused pooler, a new connection, an idle check, a
                    // parameter sync, a reserve pool) is boxed, as is its large state, so
                    // that this future stays small: it is part of every awake client's task.
                    Err(Pending::Other(fast)) => {
                        if let Some(end) = Box::pin(self.link(stream, fast)).await {
                            return end;
                        }
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
                    stream,
                    srv,
                    &mut self.params,
                    self.release_at,
                    &self.pool.stats,
                )
                .await;
            self.after(stream, outcome).await
        }
    }

    /// The common cases of getting a server, needing no clock: the pooler lends, and
    /// an idle server's parameters already match (linked at once), or every server is
    /// busy (a place in line). Otherwise the idle server it took (parameters to
    /// sync), if any, for [`Session::link`].
    fn try_link_idle(&mut self, waker: &Waker) -> Result<(), Pending> {
        let (pool, relay) = (&self.pool, self.relay.get());
        let request_at = relay.last_read();
        self.info.set_waiting(request_at);
        // A replication client never takes a pooled server (`Session::link`).
        if self.slot.0.gate_blocks(&pool.key.database) || self.replication.is_some() {
            return Err(Pending::Other(None));
        }
        match pool.checkout(request_at, waker) {
            Checkout::Idle(mut s) => {
                if self.params.differs(&mut s) {
                    return Err(Pending::Other(Some(s)));
                }
                pool.stats.wait_hist.record(0);
                link_server(&self.info, &s, relay);
                self.server = Some(s);
                Ok(())
            }
            Checkout::Queued(ticket) => Err(Pending::Queued(ticket)),
            Checkout::Slow => Err(Pending::Other(None)),
        }
    }

    /// Waits in the pool's line for a server (see [`Session::link`] for the rest).
    /// On a single loop the request waits with its place, and whoever releases a
    /// server to this client writes it at once (`pool::Request`); what was not
    /// written comes back, and the relay sends it as usual.
    #[allow(clippy::manual_async_fn)] // on purpose: see `session::drive`
    fn wait_in_line<'a>(
        &'a mut self,
        stream: &'a Stream,
        mut ticket: Ticket,
    ) -> impl Future<Output = Option<Step>> + 'a {
        async move {
            let asked = Tick::now();
            let mut left = false;
            let mut wake_at = None;
            if self.slot.0.hand_over_requests {
                match self.relay.get().take_request() {
                    Ok(Some(bytes)) => {
                        let relay = self.relay.get();
                        let mut request =
                            relay.line_request(bytes, self.params.wanted(), &self.info);
                        // (The answer to a BEGIN written ahead is not the client's.)
                        let may = self.mode == PoolMode::Transaction
                            && !self.reset_always
                            && relay.delegable()
                            && !relay.begin_ahead();
                        delegated::offer(&mut request, may, &self.pool, stream);
                        if request.timed && request.delegate_ok {
                            wake_at = request.deadline;
                        }
                        match ticket.leave_request(request) {
                            Ok(()) => left = true,
                            Err(r) => {
                                wake_at = None;
                                relay.restore_line_request(r);
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        drop(ticket);
                        return Some(Box::pin(self.after(stream, e)).await);
                    }
                }
            }
            let (pool, relay, params) = (&self.pool, self.relay.get(), &mut self.params);
            // Bytes read after the request was left must wake this task at the
            // hand-over (`Pool::more_input`); telling the line once is enough.
            let id = ticket.id();
            let more = move || {
                if std::mem::take(&mut left) {
                    pool.more_input(id);
                }
            };
            let place = &mut ticket;
            let notice = AtomicBool::new(false);
            let note = || notice.store(true, Ordering::Relaxed);
            let acquired = watch_client(
                stream,
                relay,
                more,
                &notice,
                wake_at,
                std::pin::pin!(async move {
                    let mut s = pool.redeem(place, note).await?;
                    if params.differs(&mut s) {
                        return Box::pin(acquire_linked(pool, params, Some(s), note, None)).await;
                    }
                    Ok(s)
                }),
            )
            .await;
            let (granted, after) = delegated::After::take_back(&mut ticket, self.relay.get());
            if let Some(Err(PoolError::Served(at, n))) = acquired {
                return Some(self.served(stream, asked, granted, (at, n), after).await);
            }
            after.preload(self.relay.get());
            match self.linked(asked, granted, acquired) {
                Ok(()) => None,
                Err(e) => Some(Box::pin(self.not_linked(stream, e)).await),
            }
        }
    }

    /// Gets a server for the pending request when [`Session::try_link_idle`] could
    /// not (`fast`: the idle server it took). Returns how the session ends if it
    /// cannot.
    async fn link(&mut self, stream: &Stream, mut fast: Option<ServerConn>) -> Option<Step> {
        let waited = match self.pass_gate(stream).await {
            Ok(waited) => waited,
            Err(e) => {
                if let Some(f) = fast.take() {
                    self.pool.release(f, true);
                }
                return Some(Box::pin(self.not_linked(stream, e)).await);
            }
        };
        if waited {
            match poll_fn(|cx| Poll::Ready(self.try_link_idle(cx.waker()))).await {
                Ok(()) => return None,
                Err(Pending::Queued(ticket)) => return self.wait_in_line(stream, ticket).await,
                Err(Pending::Other(f)) => fast = f,
            }
        }
        let asked = Tick::now();
        let (pool, relay, own) = (&self.pool, self.relay.get(), self.replication);
        let notice = AtomicBool::new(false);
        let note = || notice.store(true, Ordering::Relaxed);
        let acquired = watch_client(
            stream,
            relay,
            || {},
            &notice,
            None,
            std::pin::pin!(acquire_linked(pool, &mut self.params, fast, note, own)),
        )
        .await;
        match self.linked(asked, None, acquired) {
            Ok(()) => None,
            Err(e) => Some(Box::pin(self.not_linked(stream, e)).await),
        }
    }

    /// Links the server a wait that began at `asked` got (at `granted`, if that was
    /// before the task ran); or, if it got none, how the session ends (`None`: the
    /// client left), for [`Session::not_linked`]. Not async, and the failure boxed,
    /// so that a waiting client's task stays small.
    fn linked(
        &mut self,
        asked: Tick,
        granted: Option<Tick>,
        acquired: Option<Result<ServerConn, PoolError>>,
    ) -> Result<(), Option<PoolError>> {
        let s = acquired.ok_or(None)?.map_err(Some)?;
        let waited = granted.unwrap_or_else(Tick::now).micros_since(asked);
        let relay = self.relay.get();
        relay.stats.counts.wait_time_us += waited;
        self.pool.stats.wait_hist.record(waited);
        link_server(&self.info, &s, relay);
        self.server = Some(s);
        Ok(())
    }

    /// Ends the session of a client that got no server: `None`, it left.
    async fn not_linked(&mut self, stream: &Stream, e: Option<PoolError>) -> Step {
        match e {
            None => Step::End("client unexpected eof".into()),
            Some(e) => Step::Done(fail_client(stream, self.tag(), &e).await.into()),
        }
    }

    /// Sends the client the end of its answer, left owed at a release point. With
    /// `handed_on` (its server went straight to a waiting client), first lets the
    /// loop's other ready work run: the answers of one loop turn then go out
    /// together at its end, after the next requests went to PostgreSQL, and a
    /// client process serving many connections (an application server, pgbench)
    /// wakes once for several. On 2 cores that was 3-7% more tps at 600 clients
    /// (docs/performance.md, twenty-fourth round).
    async fn pay_client(&mut self, stream: &Stream, handed_on: bool) -> std::io::Result<()> {
        if handed_on {
            behind_ready_tasks().await;
        }
        let relay = self.relay.get();
        if relay.try_pay_client(stream)? {
            return Ok(());
        }
        // The client's socket is full: wait for it (rare; boxed, as it is large).
        Box::pin(relay.send_to_client(stream, &[])).await
    }

    /// Closes the server (if any), sends the client a FATAL error and ends the
    /// session; returns the reason for the log.
    async fn fail(&mut self, stream: &Stream, code: &str, message: &str) -> String {
        self.drop_server(message);
        let why = Box::pin(fail_with(
            stream,
            self.relay.get(),
            ClientTag::new(&self.info, self.log_pooler_errors),
            code,
            message,
        ))
        .await;
        why
    }
}

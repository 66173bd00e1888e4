//! Lending: how a client gets a server connection from its pool.
//!
//! Order of preference: a recently used idle connection (checked if it sat idle past
//! `server_check_delay`), a new connection within `pool_size` and the shared limits, or
//! a place in line (FIFO), from which a reserve slot may be taken after
//! `reserve_pool_timeout`. Every wait is bounded by `query_wait_timeout`, which the
//! janitor enforces (twice a second) rather than a timer per waiter.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use super::check::needs_check;
use super::idle::{pop_idle, Doomed};
use super::limits::{ConnLimit, LimitToken};
pub use super::line::Ticket;
use super::line::{self, Answer};
use super::slot::SlotToken;
use super::{server, Grant, Pool, PoolConfig, PoolError, ServerConn};
use crate::clock::Tick;
use crate::config::LoadBalance;

/// What [`Pool::checkout`] found.
// Short-lived, on the stack, as `Step`.
#[allow(clippy::large_enum_variant)]
pub enum Checkout {
    /// An idle connection, lent to the caller.
    Idle(ServerConn),
    /// A place in line: every connection is in use.
    Queued(Ticket),
    /// Anything else: [`Pool::acquire`] decides.
    Slow,
}

/// Where an acquire stands after looking at the pool under its lock.
// Short-lived, on the stack; boxing the connection would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Step {
    Idle(ServerConn),
    Connect,
    Wait(Ticket),
}

impl Pool {
    /// Gets a server connection for a client.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing: a slot or connection granted to a dropped
    /// waiter goes on to the next waiter or back to the pool.
    pub async fn acquire(self: &Arc<Self>) -> Result<ServerConn, PoolError> {
        self.acquire_noting(|| {}).await
    }

    /// [`Pool::acquire`] for a client, whose wait in line calls `on_notice` when it
    /// reaches `query_wait_notify`.
    pub async fn acquire_noting(
        self: &Arc<Self>,
        mut on_notice: impl FnMut(),
    ) -> Result<ServerConn, PoolError> {
        // Held across the wait, so an owned reference, not a guard: a few hundred
        // waiters each holding one would use up arc-swap's per-thread fast slots and
        // send every other read of the settings down its slow path.
        let cfg = self.config();
        let now = Tick::now();
        let qwt = cfg.query_wait_timeout;
        let deadline = (!qwt.is_zero()).then(|| now + qwt);
        self.acquire_until(&cfg, now, deadline, &mut on_notice)
            .await
    }

    /// [`Pool::acquire_noting`] for a request that came at `now`, bounded by
    /// `deadline`.
    pub(super) async fn acquire_until(
        self: &Arc<Self>,
        cfg: &PoolConfig,
        now: Tick,
        deadline: Option<Tick>,
        on_notice: &mut impl FnMut(),
    ) -> Result<ServerConn, PoolError> {
        // A place in line keeps the waker of the task that waits in it (this one).
        let waker = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        loop {
            let mut doomed = Vec::new();
            let step = self.next_step(cfg, false, now, &waker, &mut doomed);
            self.bury(doomed);
            let step = step?;
            let slot = match step {
                // The rare paths (a check query, a new connection) are boxed, so that
                // waiting for a server, the common one, is a small future.
                Step::Idle(conn) => match Box::pin(self.check_idle(conn, cfg, deadline)).await? {
                    Some(conn) => return Ok(conn),
                    None => continue,
                },
                Step::Connect => SlotToken::counted(self.clone()),
                Step::Wait(ticket) => {
                    match self.wait_in_line(ticket, cfg, deadline, on_notice).await? {
                        Grant::Server(conn) => return Ok(self.handed_over(conn)),
                        Grant::Slot(slot) => slot,
                        Grant::Check(conn) => {
                            let conn = self.handed_over(conn);
                            match Box::pin(self.check_idle(conn, cfg, deadline)).await? {
                                Some(conn) => return Ok(conn),
                                None => continue,
                            }
                        }
                    }
                }
            };
            match Box::pin(self.connect_new(cfg, slot, deadline, &[])).await {
                // The login failed, but servers are up: wait for one (login_hold.rs).
                Err(_) if self.lock_state().logins_held_off() => continue,
                got => return got,
            }
        }
    }

    /// What an acquire does next, decided under the pool's lock: take an idle
    /// connection (lent), open a new one in a free place, or wait in line. An idle
    /// connection comes first, unless `fresh_first` (a replication client's own
    /// connection, for which an idle one is only closed to make room). Stale idle
    /// connections go to `doomed`, for the caller to drop after the lock.
    fn next_step(
        self: &Arc<Self>,
        cfg: &PoolConfig,
        fresh_first: bool,
        now: Tick,
        waker: &Waker,
        doomed: &mut Doomed,
    ) -> Result<Step, PoolError> {
        let mut st = self.lock_state();
        if st.closed {
            return Err(PoolError::PoolClosed);
        }
        if st.stopping {
            return Err(PoolError::ShuttingDown);
        }
        // (No new login while one failed lately and servers are up: login_hold.rs.)
        let room = (cfg.pool_size == 0 || st.total < cfg.pool_size) && !st.logins_held_off();
        if !(fresh_first && room) {
            if let Some(mut conn) = pop_idle(&mut st, now, doomed) {
                st.active += 1;
                conn.lent = super::LentMark::lent_by(self.clone());
                return Ok(Step::Idle(conn));
            }
        }
        if room {
            st.total += 1;
            return Ok(Step::Connect);
        }
        Ok(Step::Wait(line::join(self, &mut st, now, waker)))
    }

    /// A new connection of its own for a replication client, opened with `extra`
    /// startup parameters (`replication` and the client's values), as PgBouncer
    /// does: never an idle one, and closed when released. It takes a place of the
    /// pool's: when the pool is full, an idle connection is closed to make room, or
    /// the client waits in line and closes the connection it is handed.
    pub async fn acquire_dedicated(
        self: &Arc<Self>,
        extra: &[(String, String)],
    ) -> Result<ServerConn, PoolError> {
        let cfg = self.config();
        let qwt = cfg.query_wait_timeout;
        let deadline = (!qwt.is_zero()).then(|| Tick::now() + qwt);
        let waker = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        loop {
            let mut doomed = Vec::new();
            let step = self.next_step(&cfg, true, Tick::now(), &waker, &mut doomed);
            self.bury(doomed);
            let step = step?;
            let slot = match step {
                Step::Connect => SlotToken::counted(self.clone()),
                // Closed, so that its place is free for the next turn (PgBouncer's
                // eviction for a replication connection).
                Step::Idle(conn) => {
                    self.close_lent(conn, "evicted");
                    continue;
                }
                Step::Wait(ticket) => {
                    match self
                        .wait_in_line(ticket, &cfg, deadline, &mut || {})
                        .await?
                    {
                        Grant::Server(conn) | Grant::Check(conn) => {
                            let conn = self.handed_over(conn);
                            self.close_lent(conn, "evicted");
                            continue;
                        }
                        Grant::Slot(slot) => slot,
                    }
                }
            };
            let mut conn = Box::pin(self.connect_new(&cfg, slot, deadline, extra)).await?;
            // Never pooled: closed when the client lets it go.
            conn.close_needed = Some("close needed");
            return Ok(conn);
        }
    }

    /// Whether a client asking for a server now would wait for one: others wait
    /// already, or every connection the pool may open is in use.
    pub fn would_wait(&self) -> bool {
        let st = self.lock_state();
        !st.waiters.is_empty()
            || (st.idle.is_empty() && st.reuse.pool_size != 0 && st.total >= st.reuse.pool_size)
    }

    /// The common cases of [`Pool::acquire`], without a future. `now` is when the
    /// client's request arrived. An idle connection that needs no check, taken at
    /// once when nobody is waiting ahead (FIFO); or, when every connection is in use
    /// and no reserve pool could serve the wait, a place in line to wait in
    /// ([`Pool::redeem`], in the task of `waker`); otherwise the slow path.
    pub fn checkout(self: &Arc<Self>, now: Tick, waker: &Waker) -> Checkout {
        let mut doomed = Vec::new();
        let got = {
            let mut st = self.lock_state();
            if st.closed || st.stopping {
                return Checkout::Slow;
            }
            let idle = if st.waiters.is_empty() {
                pop_idle(&mut st, now, &mut doomed)
            } else {
                None
            };
            match idle {
                Some(conn) if needs_check(&conn, &st.reuse, now) => {
                    st.idle.push(conn);
                    Checkout::Slow
                }
                Some(mut conn) => {
                    st.active += 1;
                    conn.lent = super::LentMark::lent_by(self.clone());
                    Checkout::Idle(conn)
                }
                // Waits here are bounded by the janitor alone: a reserve pool needs
                // a timer (the slow path), and a pool with room connects.
                None if st.reuse.reserve_pool_size == 0
                    && st.reuse.pool_size != 0
                    && st.total >= st.reuse.pool_size
                    && st.idle.is_empty() =>
                {
                    Checkout::Queued(line::join(self, &mut st, now, waker))
                }
                None => Checkout::Slow,
            }
        };
        self.bury(doomed);
        got
    }

    /// Waits for the server (or the slot, then connects) a place in line taken by
    /// [`Pool::checkout`] is granted.
    ///
    /// # Cancel safety
    /// As [`Pool::acquire`]'s: a connection granted to a dropped ticket goes back to
    /// the pool (the next in line), a slot to the next in line.
    pub async fn redeem(
        self: &Arc<Self>,
        ticket: &mut Ticket,
        on_notice: impl FnMut(),
    ) -> Result<ServerConn, PoolError> {
        // (`on_notice` goes by value: a `&mut` of it makes another future of
        // `answer`, which was not inlined into the session's wait, ~100 instructions
        // more per transaction at 600 clients.)
        match ticket.answer(on_notice).await {
            Answer::Granted(Grant::Server(conn)) => Ok(self.handed_over(conn)),
            Answer::Granted(Grant::Check(conn)) => {
                let conn = self.handed_over(conn);
                let cfg = self.config();
                let qwt = cfg.query_wait_timeout;
                let deadline = (!qwt.is_zero()).then(|| ticket.since + qwt);
                Box::pin(self.check_handed(conn, &cfg, deadline, ticket.since)).await
            }
            Answer::Granted(Grant::Slot(slot)) => {
                let cfg = self.config();
                let qwt = cfg.query_wait_timeout;
                let deadline = (!qwt.is_zero()).then(|| ticket.since + qwt);
                Box::pin(self.connect_granted(&cfg, slot, deadline, ticket.since)).await
            }
            Answer::Refused => Err(refusal(self)),
            Answer::Served(at, n) => Err(PoolError::Served(at, n)),
            // (`Behind` is never taken as an answer: `poll_answer` skips it.)
            Answer::Lost | Answer::Behind => Err(PoolError::Closed),
        }
    }

    /// A connection handed over in line, counted as lent by this pool: by the client
    /// that released it already, unless no client held it (a connection
    /// `min_pool_size` opened, say).
    fn handed_over(self: &Arc<Self>, mut conn: ServerConn) -> ServerConn {
        if !conn.lent.is_by(self) {
            self.lock_state().active += 1;
            conn.lent = super::LentMark::lent_by(self.clone());
        }
        conn
    }

    /// Waits for a grant; after `reserve_pool_timeout` a waiter may leave the line
    /// and take a reserve slot if the pool has one.
    async fn wait_in_line(
        self: &Arc<Self>,
        mut ticket: Ticket,
        cfg: &PoolConfig,
        deadline: Option<Tick>,
        on_notice: &mut impl FnMut(),
    ) -> Result<Grant, PoolError> {
        if cfg.reserve_pool_size > 0 {
            let reserve_at = Tick::now() + cfg.reserve_pool_timeout;
            let first = deadline.map_or(reserve_at, |d| d.min(reserve_at));
            match crate::timer::timeout_at(first, ticket.answer(&mut *on_notice)).await {
                Ok(Answer::Granted(g)) => return Ok(g),
                // The janitor's query_wait_timeout can come first.
                Ok(Answer::Refused | Answer::Served(..) | Answer::Behind | Answer::Lost) => {
                    return Err(refusal(self))
                }
                Err(_) => {
                    let mut st = self.lock_state();
                    let limit = cfg.pool_size + cfg.reserve_pool_size;
                    if st.total < limit && !st.logins_held_off() && ticket.leave(&mut st) {
                        st.total += 1;
                        // A warning, as PgBouncer's (the pool is under strain).
                        tracing::warn!(
                            "{}/{}: taking connection from reserve_pool",
                            self.key.database,
                            self.key.user
                        );
                        return Ok(Grant::Slot(SlotToken::counted(self.clone())));
                    }
                }
            }
        }
        // No timer per waiter: the janitor drops the places in line older than
        // query_wait_timeout (`Pool::expire_waiters`), as PgBouncer's does.
        match ticket.answer(on_notice).await {
            Answer::Granted(g) => Ok(g),
            Answer::Refused | Answer::Served(..) | Answer::Behind | Answer::Lost => {
                Err(refusal(self))
            }
        }
    }

    /// Opens a new connection in `slot`, within the database and user limits, with
    /// `extra` startup parameters (a replication client's; none for the pool's own).
    pub(crate) async fn connect_new(
        self: &Arc<Self>,
        cfg: &PoolConfig,
        slot: SlotToken,
        deadline: Option<Tick>,
        extra: &[(String, String)],
    ) -> Result<ServerConn, PoolError> {
        let (generation, keys) = {
            let st = self.lock_state();
            if let Some((at, err)) = &st.last_login_error {
                if at.elapsed() < cfg.server_login_retry {
                    return Err(PoolError::LoginFailing(Box::new(err.clone())));
                }
            }
            (st.generation, st.scram_keys)
        };
        let db_token = self
            .take_limit(&self.limits.db, cfg.max_db_connections, deadline)
            .await?;
        let user_token = self
            .take_limit(&self.limits.user, cfg.max_user_connections, deadline)
            .await?;
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut slot = Some(slot);
        match self.dial(cfg, keys, id, generation, &mut slot, extra).await {
            Ok(mut conn) => {
                conn.limit_tokens = Some((db_token, user_token));
                let mut st = self.lock_state();
                st.last_login_error = None;
                // The welcome is a plain connection's, not one with a client's values.
                if st.welcome.is_none() && extra.is_empty() {
                    st.welcome = Some(Arc::new(conn.params.values.clone()));
                }
                st.active += 1;
                conn.lent = super::LentMark::lent_by(self.clone());
                drop(st);
                Ok(conn)
            }
            Err(e) => {
                // A server that died just after logging in did not refuse the login.
                if !matches!(e, PoolError::DiedAfterLogin) {
                    self.lock_state().last_login_error = Some((Instant::now(), e.clone()));
                }
                Err(e)
            }
        }
    }

    /// Connects to a host of the pool's list: with `load_balance_hosts = round-robin`
    /// the one after the last tried, with `disable` the one the last connection went
    /// to. A host that fails is passed over for the next, each host tried once, so a
    /// host that is down does not fail a client while another is up (PgBouncer fails
    /// that attempt and moves on at the next one); and for `server_login_retry` it is
    /// tried after the others, so that a host that is unreachable (each try costing
    /// `server_connect_timeout`) does not hold up every other new connection. Each
    /// failure is logged.
    async fn dial(
        &self,
        cfg: &PoolConfig,
        keys: Option<server::ScramKeys>,
        id: u64,
        generation: u64,
        slot: &mut Option<SlotToken>,
        extra: &[(String, String)],
    ) -> Result<ServerConn, PoolError> {
        let n = cfg.hosts.len().max(1);
        let first = match cfg.load_balance {
            LoadBalance::RoundRobin => self.next_host.fetch_add(1, Ordering::Relaxed),
            LoadBalance::Disable => self.next_host.load(Ordering::Relaxed),
        };
        let mut order: Vec<usize> = (0..n).map(|i| first.wrapping_add(i) % n).collect();
        if n > 1 {
            let now = Tick::now();
            let failed = self.lock_host_failures();
            // Stable: the list's order stays within each group.
            order.sort_by_key(|&at| {
                failed
                    .get(at)
                    .copied()
                    .flatten()
                    .is_some_and(|t| !now.reached(t, cfg.server_login_retry))
            });
        }
        let mut last = PoolError::Connect("no host to connect to".into());
        for at in order {
            let Some(addr) = cfg.hosts.get(at) else {
                break;
            };
            let dial = server::Dial {
                addr,
                scram_keys: keys,
                key_cache: &self.server_keys,
                extra,
            };
            let _listed = self.opening(id, addr);
            match server::connect(cfg, dial, id, generation, slot).await {
                Ok(conn) => {
                    self.log_server_login(&conn);
                    if n > 1 {
                        self.note_host(at, n, None);
                        if cfg.load_balance == LoadBalance::Disable {
                            self.next_host.store(at, Ordering::Relaxed);
                        }
                    }
                    return Ok(conn);
                }
                Err(e) => {
                    let (db, user) = (&self.key.database, &self.key.user);
                    match &e {
                        // PgBouncer's words for a login the server refused.
                        PoolError::Server(f) => tracing::warn!(
                            "S-{id}: {db}/{user}@{addr} server login failed: {} {}",
                            f.severity,
                            f.message
                        ),
                        // PgBouncer's error line names the cause; the clients
                        // get "server login failed: ..." (and a warning each).
                        PoolError::Auth { log, .. } => {
                            tracing::error!("S-{id}: {db}/{user}@{addr} {log}")
                        }
                        e => tracing::warn!("S-{id}: {db}/{user}@{addr} {e}"),
                    }
                    if n > 1 {
                        self.note_host(at, n, Some(Tick::now()));
                    }
                    last = e;
                    // Past the login the slot went with the connection: no retry.
                    if slot.is_none() {
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    /// Records when host `at` of `n` last failed (None: it has just worked).
    fn note_host(&self, at: usize, n: usize, failed: Option<Tick>) {
        let mut f = self.lock_host_failures();
        if f.len() != n {
            *f = vec![None; n];
        }
        if let Some(slot) = f.get_mut(at) {
            *slot = failed;
        }
    }

    fn lock_host_failures(&self) -> std::sync::MutexGuard<'_, Vec<Option<Tick>>> {
        // Plain values: a poisoned lock still holds a sound list.
        self.host_failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a unit of a shared limit: at once if free, else by closing an idle
    /// connection of another pool under the same limit, else by waiting.
    async fn take_limit(
        &self,
        limit: &Arc<ConnLimit>,
        max: u32,
        deadline: Option<Tick>,
    ) -> Result<LimitToken, PoolError> {
        let _waiting = limit.wait_guard();
        loop {
            let freed = limit.freed();
            if let Some(t) = limit.try_take(max) {
                return Ok(t);
            }
            if let Some(victim) = limit.evict_idle() {
                drop(victim);
                continue;
            }
            match deadline {
                None => freed.await,
                Some(d) => {
                    if crate::timer::timeout_at(d, freed).await.is_err() {
                        return Err(PoolError::Timeout("query_wait_timeout"));
                    }
                }
            }
        }
    }

    /// Keeps `min_pool_size` connections open once the pool has been used.
    pub fn fill_min(self: &Arc<Self>) {
        let cfg = self.config();
        if cfg.min_pool_size == 0 {
            return;
        }
        let slot = {
            let mut st = self.lock_state();
            let room = cfg.pool_size == 0 || st.total < cfg.pool_size;
            if st.closed
                || st.stopping
                || st.welcome.is_none()
                || st.login_failed_lately()
                || !room
                || st.total >= cfg.min_pool_size
            {
                return;
            }
            st.total += 1;
            SlotToken::counted(self.clone())
        };
        let pool = self.clone();
        tokio::spawn(async move {
            let deadline = Some(Tick::now() + Duration::from_secs(1));
            if let Ok(conn) = pool.connect_new(&cfg, slot, deadline, &[]).await {
                pool.release(conn, true);
            }
        });
    }
}

/// Why a place in line ended without a grant: the pool closed, or the janitor took
/// it out of line at `query_wait_timeout`.
pub(super) fn refusal(pool: &Pool) -> PoolError {
    let st = pool.lock_state();
    if st.closed {
        PoolError::PoolClosed
    } else if st.stopping {
        PoolError::ShuttingDown
    } else {
        PoolError::Timeout("query_wait_timeout")
    }
}

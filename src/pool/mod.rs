//! Server connection pools, one per (database, user).
//!
//! A pool holds idle server connections (reused LIFO) and a FIFO of waiting clients.
//! A released connection goes straight to the oldest waiter. The count of connections,
//! idle, lent out or connecting, is exact across threads: see `slot.rs`.

mod acquire;
mod autodb;
mod canceled;
mod check;
mod closing;
mod delegate;
pub mod error;
mod idle;
mod idle_pools;
pub mod limits;
mod line;
mod login_hold;
pub mod lookup;
pub mod opening;
mod pipeline;
pub mod registry;
mod resetting;
pub mod server;
mod server_login;
mod server_tls;
mod slot;
mod socket;
pub mod target;
#[cfg(any(test, feature = "fuzzing"))]
mod testing;
mod txn_text;

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use arc_swap::ArcSwap;
use std::time::{Duration, Instant};

pub use acquire::{Checkout, Ticket};
pub use canceled::CancelAim;
pub use delegate::Delegate;
pub use error::PoolError;
pub use line::Request;
pub use pipeline::ends_transaction;
pub use registry::{PoolKey, Pools};
pub use server::{ScramKeys, ServerConn, ServerIdent};
pub use server_tls::negotiate as negotiate_tls;
pub(crate) use socket::{connect_ip, connect_to};
use target::Reuse;
pub use target::{PoolConfig, ServerAddr};
pub use txn_text::{begin_of, end_tag, set_transaction_of, Modes};

use crate::auth::Secret;
use crate::clock::Tick;
use crate::protocol::backend::ErrorFields;
use crate::stats::PoolStats;
use limits::PoolLimits;
use slot::SlotToken;

/// What a waiting client is given.
// A connection is moved through here once per hand-over; boxing it would cost an
// allocation for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Grant {
    /// An idle connection, ready to use.
    Server(ServerConn),
    /// A free slot: the waiter opens a new connection itself.
    Slot(SlotToken),
    /// A connection to check before use (`server_check_delay = 0`: pool/check.rs),
    /// handed over without the waiter's request, which the waiter sends after.
    Check(ServerConn),
}

/// The mutable part of a pool, behind one short-held mutex.
#[derive(Debug, Default)]
pub(crate) struct PoolState {
    /// Idle connections; the last one pushed is reused first.
    idle: Vec<ServerConn>,
    /// Clients waiting for a connection, oldest first, with ids so that a waiter can
    /// leave the line (to take a reserve slot).
    waiters: VecDeque<line::Waiter>,
    /// Answers not yet taken by their waiters, by place id (a few at most: a woken
    /// waiter takes its own at once, one left asleep until its server answers
    /// (`line::Waiter::wake_on_answer`) when that answer comes).
    answers: Vec<(u64, line::Answer, Option<Box<line::Request>>)>,
    /// Places whose client is owed the `query_wait_notify` notice, set by the janitor
    /// (empty but for a moment every few seconds under a long wait).
    notices: Vec<u64>,
    next_waiter: u64,
    /// Connections counted against `pool_size`: idle + lent out + connecting.
    total: u32,
    /// Connections currently lent to clients (those held for cancels included).
    active: u32,
    /// Connections given back while cancel requests were on their way to them, held
    /// off the pool until those are done (`canceled.rs`).
    being_canceled: Vec<Arc<ServerIdent>>,
    /// Lent connections whose reset query runs, and since when (`resetting.rs`).
    resetting: Vec<(Arc<ServerIdent>, Tick)>,
    /// The last login failure: until `server_login_retry` passes, no new login is
    /// tried, and a client gets this error unless servers are up (`login_hold.rs`).
    last_login_error: Option<(Instant, PoolError)>,
    /// Bumped to retire existing connections (reload with a new target, RECONNECT).
    generation: u64,
    /// ParameterStatus values from the first login, shown to clients at their login.
    welcome: Option<Arc<Vec<(String, String)>>>,
    /// Keys from a client's SCRAM login, for pass-through to the server.
    scram_keys: Option<ScramKeys>,
    /// When a connection last closed for its lifetime (spacing those closes).
    last_lifetime_close: Option<Tick>,
    /// A shutdown that waits for the servers began: nothing more is lent.
    stopping: bool,
    closed: bool,
    /// The settings' part that checkout and release read (see [`Reuse`]).
    reuse: Reuse,
}

/// Counts a lent connection in its pool's `active` until the pool takes it back, or
/// until it is dropped wherever it is (a session that fails, or is killed, drops its
/// server without `release`), so `active` cannot stay too high.
#[derive(Debug, Default)]
pub(crate) struct LentMark(Option<Arc<Pool>>);

impl LentMark {
    /// Marks a connection lent by `pool`; the caller has counted it in `active`.
    pub(crate) fn lent_by(pool: Arc<Pool>) -> LentMark {
        LentMark(Some(pool))
    }

    /// Stops the mark from counting down on drop; returns whether it was armed.
    fn disarm(&mut self) -> bool {
        self.0.take().is_some()
    }

    /// The pool that lent the connection, if it is lent.
    pub(crate) fn pool(&self) -> Option<Arc<Pool>> {
        self.0.clone()
    }

    /// Whether the connection is counted as lent by `pool`.
    fn is_by(&self, pool: &Pool) -> bool {
        self.0
            .as_ref()
            .is_some_and(|p| std::ptr::eq(Arc::as_ptr(p), pool))
    }
}

impl Drop for LentMark {
    fn drop(&mut self) {
        // Never dropped while the pool lock is held: lent connections are only dropped
        // by their session (or a waiter that left with one handed to it), and
        // `release` disarms the mark, which takes no lock, before it keeps or closes one.
        if let Some(pool) = self.0.take() {
            let mut st = pool.lock_state();
            st.active = st.active.saturating_sub(1);
        }
    }
}

/// An idle server connection as the console shows it.
#[derive(Debug, Clone)]
pub struct IdleServer {
    pub ident: Arc<ServerIdent>,
    pub last_used: Tick,
    /// Prepared statements it holds for transaction pooling.
    pub prepared: u32,
}

/// A snapshot of a pool's counters, for the console and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounts {
    pub total: u32,
    pub idle: u32,
    pub active: u32,
    pub waiting: u32,
    /// Lent connections held for cancels (counted in `active` too).
    pub being_canceled: u32,
    /// Lent connections whose reset query runs (counted in `active` too).
    pub resetting: u32,
    /// Idle connections past `server_check_delay` (counted in `idle` too): PgBouncer's
    /// `sv_used`, when a check query is set.
    pub used: u32,
}

/// One pool of server connections for a (database, user) pair.
#[derive(Debug)]
pub struct Pool {
    pub key: PoolKey,
    /// The key's names, shared with its clients' console entries (no copy per client).
    pub db_name: Arc<str>,
    pub user_name: Arc<str>,
    /// Read on every checkout and release: `ArcSwap` reads touch no shared cache line.
    cfg: ArcSwap<PoolConfig>,
    state: Mutex<PoolState>,
    ids: Arc<AtomicU64>,
    /// The database- and user-wide connection limits this pool counts against.
    limits: PoolLimits,
    /// Traffic and timing counters (SHOW STATS, metrics).
    pub stats: PoolStats,
    /// The tracked parameters its clients want, shared between clients that agree.
    pub shared_params: crate::session::params::SharedParams,
    /// What its last SCRAM login to a server derived from the password, so that the
    /// next one skips PBKDF2 (`auth::DerivedKeys`).
    server_keys: server::KeyCache,
    /// The host of `hosts` the next connection tries first (modulo their count).
    next_host: std::sync::atomic::AtomicUsize,
    /// When each host of a list last failed, if it has not worked since.
    host_failures: Mutex<Vec<Option<Tick>>>,
    /// Connections being opened (SHOW SERVERS `new`).
    openings: opening::Openings,
}

impl Pool {
    pub(crate) fn new(
        key: PoolKey,
        cfg: PoolConfig,
        ids: Arc<AtomicU64>,
        limits: PoolLimits,
    ) -> Pool {
        let reuse = cfg.reuse();
        Pool {
            db_name: Arc::from(key.database.as_str()),
            user_name: Arc::from(key.user.as_str()),
            key,
            cfg: ArcSwap::from_pointee(cfg),
            state: Mutex::new(PoolState {
                reuse,
                ..PoolState::default()
            }),
            ids,
            limits,
            stats: PoolStats::default(),
            shared_params: Default::default(),
            server_keys: Default::default(),
            next_host: Default::default(),
            host_failures: Default::default(),
            openings: Default::default(),
        }
    }

    /// The shared limits this pool counts against.
    pub fn limits(&self) -> &PoolLimits {
        &self.limits
    }

    /// The pool's current settings.
    pub fn config(&self) -> Arc<PoolConfig> {
        self.cfg.load_full()
    }

    pub(crate) fn lock_state(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding this lock cannot leave the counters half-updated in a
        // way worse than stopping, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the settings; retires existing connections if the server side changed.
    pub fn reconfigure(&self, mut new: PoolConfig) {
        let old = self.config();
        if new.secret.is_none() && old.secret_queried {
            new.secret = old.secret.clone();
            new.secret_queried = true;
        }
        let retire = old.needs_reconnect(&new);
        let reuse = new.reuse();
        self.cfg.store(Arc::new(new));
        let doomed = {
            let mut st = self.lock_state();
            st.reuse = reuse;
            st.last_login_error = None;
            if retire {
                st.generation += 1;
                st.welcome = None;
                std::mem::take(&mut st.idle)
            } else {
                Vec::new()
            }
        };
        drop(doomed);
    }

    /// Counters for tests and the console (`used` is 0).
    pub fn counts(&self) -> PoolCounts {
        self.counts_at(None, Tick::now())
    }

    /// Counters for SHOW POOLS, all from one look at the pool, so that they add up
    /// though other threads lend and take back meanwhile; `used` counts the idle
    /// connections past `check_delay` at `now`.
    pub fn counts_at(&self, check_delay: Option<std::time::Duration>, now: Tick) -> PoolCounts {
        let st = self.lock_state();
        let used = check_delay.map_or(0, |d| {
            st.idle
                .iter()
                .filter(|c| now.reached(c.last_used, d))
                .count() as u32
        });
        PoolCounts {
            total: st.total,
            idle: st.idle.len() as u32,
            active: st.active,
            waiting: st.waiters.len() as u32,
            being_canceled: st.being_canceled.len() as u32,
            resetting: st.resetting.len() as u32,
            used,
        }
    }

    /// The current generation; a connection made in an older one closes at release.
    pub fn generation(&self) -> u64 {
        self.lock_state().generation
    }

    /// The idle connections, for SHOW SERVERS.
    pub fn idle_servers(&self) -> Vec<IdleServer> {
        let st = self.lock_state();
        st.idle
            .iter()
            .map(|c| IdleServer {
                ident: c.ident.clone(),
                last_used: c.last_used,
                prepared: c.prepared.len() as u32,
            })
            .collect()
    }

    /// The parameters a client sees at login, if a server has logged in yet.
    pub fn welcome(&self) -> Option<Arc<Vec<(String, String)>>> {
        self.lock_state().welcome.clone()
    }

    /// Takes the secret `auth_query` just returned for the pool's user, to log in to
    /// the server with (md5 with the hash, or SCRAM pass-through with a verifier).
    /// Open connections stay: a changed password does not end a server session.
    pub fn set_queried_secret(&self, secret: Secret) {
        if self.cfg.load().secret.as_ref() == Some(&secret) {
            return;
        }
        self.cfg.rcu(|c| {
            let mut c = PoolConfig::clone(c);
            c.secret = Some(secret.clone());
            c.secret_queried = true;
            c
        });
    }

    /// Remembers a client's SCRAM keys for logging in to the server without a password.
    pub fn set_scram_keys(&self, keys: ScramKeys) {
        self.lock_state().scram_keys = Some(keys);
    }

    /// Returns a lent connection. A clean one goes to the oldest waiter or the idle
    /// list; anything else is closed (its slot then goes to a waiter).
    pub fn release(&self, conn: ServerConn, clean: bool) {
        self.release_at(conn, clean, Tick::now());
    }

    /// [`Pool::release`] with the time of the server's last message, which the
    /// caller already has (one clock read fewer per transaction). True when the
    /// connection went straight to a waiting client.
    pub fn release_at(&self, mut conn: ServerConn, clean: bool, now: Tick) -> bool {
        conn.last_used = now;
        if clean && conn.ident.cancels_pending() {
            match self.hold(conn) {
                Ok(()) => return false,
                Err(c) => conn = c,
            }
        }
        let mut st = self.lock_state();
        // A request was written behind the one just answered: the server is its, even
        // if it must close after (too old, from before a reload).
        if clean && conn.behind.is_some() && conn.close_needed.is_none() {
            return match self.advance(&mut st, conn, now) {
                Ok(wake) => {
                    drop(st);
                    if let Some(w) = wake {
                        w.wake();
                    }
                    true
                }
                Err(conn) => {
                    drop(st);
                    self.release_at(conn, false, now)
                }
            };
        }
        // Not reusable (unclean, too old, from before a reload...): closed, and why.
        if let Some(reason) = closing::release_close_reason(&conn, clean, &st, now) {
            let reason = closing::noted(&mut st, reason, now);
            if conn.lent.disarm() {
                st.active = st.active.saturating_sub(1);
            }
            drop(st);
            self.log_server_close(&conn, reason);
            drop(conn);
            return false;
        }
        // Lent on to the oldest waiter as it is, still counted in `active` by its
        // mark: the console never sees it neither idle nor lent, and the waiter need
        // not take the lock again to count it.
        match st.waiters.pop_front() {
            // `server_check_delay = 0`: checked before every reuse, as in PgBouncer,
            // so the waiter checks it first and sends its request itself.
            Some(w) if st.reuse.check && st.reuse.check_delay.is_zero() => {
                let waker = w.answer(&mut st, line::Answer::Granted(Grant::Check(conn)));
                drop(st);
                waker.wake();
                true
            }
            Some(mut w) => {
                let mut conn = conn;
                if let Some(r) = w.request.as_mut() {
                    r.send_on(&mut conn);
                }
                let asleep = w.wake_on_answer(&conn, now);
                if asleep && w.request.as_deref().is_some_and(pipeline::may_lead) {
                    while pipeline::send_behind(&mut st, &mut conn, now) {
                        self.stats.count_pipelined();
                    }
                }
                let waker = w.answer(&mut st, line::Answer::Granted(Grant::Server(conn)));
                drop(st);
                if !asleep {
                    waker.wake();
                }
                true
            }
            None => {
                let mut conn = conn;
                if conn.lent.disarm() {
                    st.active = st.active.saturating_sub(1);
                }
                st.idle.push(conn);
                drop(st);
                self.limits.db.idle_available();
                self.limits.user.idle_available();
                false
            }
        }
    }

    /// Closes idle connections past their lifetime or idle timeout, those the server
    /// closed (or that sent bytes nobody asked for) while idle, and the oldest of
    /// those beyond a pool size lowered since they opened.
    pub fn close_expired_idle(&self) {
        let now = Tick::now();
        let doomed: Vec<(ServerConn, &'static str)> = {
            let mut st = self.lock_state();
            let mut doomed = Vec::new();
            let idle = std::mem::take(&mut st.idle);
            for c in idle {
                let connected = st.total.saturating_sub(doomed.len() as u32);
                match closing::idle_close_reason(&c, &st, now, connected) {
                    Some(reason) => doomed.push((c, closing::noted(&mut st, reason, now))),
                    None => st.idle.push(c),
                }
            }
            // (Each of `doomed` leaves the count when dropped, after the lock.)
            let over = (closing::surplus(&st) as usize).saturating_sub(doomed.len());
            let n = over.min(st.idle.len());
            for c in st.idle.drain(..n) {
                doomed.push((c, "too many servers in the pool"));
            }
            doomed
        };
        for (c, reason) in doomed {
            self.log_server_close(&c, reason);
        }
    }

    /// Retires every connection: idle ones close now, lent ones at release.
    pub fn reconnect_all(&self) {
        let doomed = {
            let mut st = self.lock_state();
            st.generation += 1;
            std::mem::take(&mut st.idle)
        };
        for c in doomed {
            self.log_server_close(&c, "db conf changed");
        }
    }

    /// Lends no more (a shutdown that waits for the servers): the clients waiting in
    /// line get `server shutting down`, as PgBouncer's janitor tells them, and so
    /// does any later one; servers still lent come back and stay idle.
    pub fn stop_lending(&self) {
        let refused = {
            let mut st = self.lock_state();
            st.stopping = true;
            let waiters = std::mem::take(&mut st.waiters);
            line::refuse(&mut st, waiters)
        };
        refused.into_iter().for_each(Waker::wake);
    }

    /// Closes the pool: idle connections now, waiters get an error, no new lending.
    pub fn close(&self) {
        let (idle, refused) = {
            let mut st = self.lock_state();
            st.closed = true;
            let waiters = std::mem::take(&mut st.waiters);
            (std::mem::take(&mut st.idle), line::refuse(&mut st, waiters))
        };
        for c in idle {
            self.log_server_close(&c, "database removed");
        }
        refused.into_iter().for_each(Waker::wake);
    }

    /// Drops the places in line of clients that waited `query_wait_timeout` or more:
    /// their acquire fails with that reason. Then tells those that waited
    /// `query_wait_notify` that they are queued, once a wait. Called by the janitor.
    pub fn expire_waiters(&self, now: Tick) {
        let cfg = self.config();
        self.notify_waiters(now, cfg.query_wait_notify);
        let limit = cfg.query_wait_timeout;
        if limit.is_zero() {
            return;
        }
        let refused = {
            let mut st = self.lock_state();
            // Oldest first: the line is untouched unless its head has expired.
            let old = |w: &line::Waiter| now.reached(w.since, limit);
            if !st.waiters.front().is_some_and(old) {
                return;
            }
            let (old, keep): (VecDeque<line::Waiter>, _) =
                std::mem::take(&mut st.waiters).into_iter().partition(old);
            st.waiters = keep;
            line::refuse(&mut st, old)
        };
        // Woken unlocked: each finds its refusal.
        refused.into_iter().for_each(Waker::wake);
    }

    /// Marks the places of clients that waited `after` or more, and were not told yet,
    /// as owed the notice, and wakes their tasks to send it (`Ticket::poll_answer`).
    fn notify_waiters(&self, now: Tick, after: Duration) {
        if after.is_zero() {
            return;
        }
        let wakers: Vec<Waker> = {
            let mut st = self.lock_state();
            let PoolState {
                waiters, notices, ..
            } = &mut *st;
            // Oldest first: only the front of the line can be due.
            waiters
                .iter_mut()
                .take_while(|w| now.reached(w.since, after))
                .filter_map(|w| w.owe_notice().then(|| (w.id, w.waker())))
                .map(|(id, waker)| {
                    notices.push(id);
                    waker
                })
                .collect()
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    /// How long the oldest waiting client has waited (SHOW POOLS `maxwait`).
    pub fn max_wait(&self) -> Duration {
        let st = self.lock_state();
        st.waiters
            .front()
            .map(|w| w.since.elapsed())
            .unwrap_or_default()
    }

    /// Takes the least recently used idle connection, for closing it to make room
    /// under a shared limit.
    /// Logged `closing because: evicted`, PgBouncer's words.
    pub(crate) fn evict_idle(&self) -> Option<ServerConn> {
        let conn = {
            let mut st = self.lock_state();
            if st.idle.is_empty() {
                return None;
            }
            st.idle.remove(0)
        };
        self.log_server_close(&conn, "evicted");
        Some(conn)
    }

    /// Records a failed login to be reported to clients until the retry delay passes.
    pub fn last_login_error(&self) -> Option<ErrorFields> {
        match &self.lock_state().last_login_error {
            Some((_, PoolError::Server(f))) => Some(f.clone()),
            _ => None,
        }
    }
}

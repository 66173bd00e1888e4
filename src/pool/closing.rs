//! PgBouncer's log lines for server connections: `new connection to server` with
//! `log_connections`, `closing because: <reason> (age=<n>s)` with
//! `log_disconnections`, for the closes the pool decides (idle timeout, lifetime,
//! reload or RECONNECT, a connection not fit to lend again).

use super::server::ServerState;
use super::{Pool, PoolState};
use crate::clock::Tick;

impl Pool {
    /// Logs a server connection just made.
    pub(crate) fn log_server_login(&self, conn: &ServerState) {
        if !self.cfg.load().log_connections {
            return;
        }
        // PgBouncer names the local end for TCP only.
        let from = conn
            .ident
            .local_addr
            .map(|a| format!(" (from {a})"))
            .unwrap_or_default();
        tracing::info!(
            "S-{}: {}/{}@{} new connection to server{from}",
            conn.ident.id,
            self.key.database,
            self.key.user,
            conn.ident.addr,
        );
    }

    /// Logs a server connection the pool closes, and why.
    /// Closes a connection lent out (its place goes to the next in line) with the
    /// `closing because:` line for `reason`.
    pub fn close_lent(&self, conn: super::ServerConn, reason: &str) {
        self.log_server_close(&conn, reason);
    }

    pub(crate) fn log_server_close(&self, conn: &ServerState, reason: &str) {
        if !self.cfg.load().log_disconnections {
            return;
        }
        tracing::info!(
            "S-{}: {}/{}@{} closing because: {reason} (age={}s)",
            conn.ident.id,
            self.key.database,
            self.key.user,
            conn.ident.addr,
            conn.ident.created.elapsed().as_secs(),
        );
    }
}

/// The reason a connection past `server_lifetime` is closed with.
pub(super) const LIFETIME_OVER: &str = "server lifetime over";

/// Whether a connection made at `created` is to close for its lifetime now: past
/// it, and, as in PgBouncer, the pool's last such close at least `server_lifetime /
/// pool_size` ago, so that connections opened together are not all opened again
/// together (the caller notes the close in `last_lifetime_close`).
pub(super) fn lifetime_due(created: Tick, st: &PoolState, now: Tick) -> bool {
    let r = &st.reuse;
    if r.lifetime.is_zero() || !now.reached(created, r.lifetime) {
        return false;
    }
    let gap = match r.pool_size {
        0 => std::time::Duration::ZERO,
        n => r.lifetime / n,
    };
    st.last_lifetime_close.is_none_or(|t| now.reached(t, gap))
}

/// Passes on the reason a connection is closed for, noting a close for its lifetime
/// (the next one waits the gap of [`lifetime_due`]).
pub(super) fn noted(st: &mut PoolState, reason: &'static str, now: Tick) -> &'static str {
    if reason == LIFETIME_OVER {
        st.last_lifetime_close = Some(now);
    }
    reason
}

/// Why an idle connection is closed at the janitor's sweep, if it is.
pub(super) fn idle_close_reason(
    conn: &ServerState,
    st: &PoolState,
    now: Tick,
    connected: u32,
) -> Option<&'static str> {
    if conn.ident.generation != st.generation {
        Some("db conf changed")
    } else if let Some(why) = conn.expiry(st, now, connected) {
        Some(why)
    } else if conn.stream.is_dead_or_chatty() {
        Some("server conn crashed?")
    } else {
        None
    }
}

/// How many connections the pool holds beyond `pool_size` and `reserve_pool_size`
/// (0 when unlimited): more than it may after either was lowered (SET, RELOAD). Those
/// close as they come back or sit idle ("too many servers in the pool"), and the
/// slots they free go to no waiter, as PgBouncer's janitor trims a pool.
#[inline]
pub(super) fn surplus(st: &PoolState) -> u32 {
    let r = &st.reuse;
    if r.pool_size == 0 {
        0
    } else {
        st.total.saturating_sub(r.pool_size + r.reserve_pool_size)
    }
}

/// Why a connection given back is closed rather than pooled, if it is (None: it is
/// pooled; on every release, so the common case falls through cheap tests).
#[inline]
pub(super) fn release_close_reason(
    conn: &ServerState,
    clean: bool,
    st: &PoolState,
    now: Tick,
) -> Option<&'static str> {
    let lifetime = st.reuse.lifetime;
    if !clean {
        Some("unclean server")
    } else if conn.close_needed.is_some() {
        conn.close_needed
    } else if st.closed {
        Some("database removed")
    } else if conn.ident.generation != st.generation {
        Some("db conf changed")
    } else if !lifetime.is_zero() && lifetime_due(conn.ident.created, st, now) {
        Some(LIFETIME_OVER)
    } else if surplus(st) > 0 {
        Some("too many servers in the pool")
    } else {
        None
    }
}

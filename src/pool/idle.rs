//! Taking an idle connection to lend: the one most recently used (or the oldest,
//! with `server_round_robin`) that is still fit, and closing, with PgBouncer's log
//! line, those found unfit on the way.

use super::server::ServerConn;
use super::{Pool, PoolState};
use crate::clock::Tick;

/// Idle connections found unfit to lend under the pool's lock, each with why, to
/// close after it (a connection's slot takes the lock when dropped).
pub(super) type Doomed = Vec<(ServerConn, &'static str)>;

/// How long a connection must have been idle before it is probed when lent: one that
/// PostgreSQL closed meanwhile (`idle_session_timeout`, a restart, a firewall) is not
/// lent, as PgBouncer's loop drops such a server when its close arrives. The probe
/// reads only if the socket was reported readable (tokio's readiness); the janitor
/// probes every idle connection twice a second as well.
const PROBE_IDLE: std::time::Duration = std::time::Duration::from_millis(10);

/// Takes the most recently used idle connection that is still good (or the oldest,
/// with `server_round_robin`). Stale ones go to `doomed`.
pub(super) fn pop_idle(st: &mut PoolState, now: Tick, doomed: &mut Doomed) -> Option<ServerConn> {
    let reuse = st.reuse;
    loop {
        let conn = if reuse.round_robin && !st.idle.is_empty() {
            st.idle.remove(0)
        } else {
            st.idle.pop()?
        };
        // Not probed when it went idle moments ago, as under load (no read per
        // transaction): the janitor's probe covers that.
        let why = if conn.ident.generation != st.generation {
            Some("db conf changed")
        } else if let Some(why) = conn.expiry(st, now, st.total.saturating_sub(doomed.len() as u32))
        {
            Some(why)
        } else if now.reached(conn.last_used, PROBE_IDLE) && conn.stream.is_dead_or_chatty() {
            Some("server conn crashed?")
        } else {
            None
        };
        match why {
            None => return Some(conn),
            Some(why) => doomed.push((conn, super::closing::noted(st, why, now))),
        }
    }
}

impl Pool {
    /// Closes, after the lock, the idle connections found unfit to lend, and logs why.
    #[inline]
    pub(super) fn bury(&self, doomed: Doomed) {
        if !doomed.is_empty() {
            self.bury_all(doomed);
        }
    }

    #[cold]
    fn bury_all(&self, doomed: Doomed) {
        for (conn, why) in doomed {
            self.log_server_close(&conn, why);
        }
    }
}

//! Servers with cancel requests on their way (PgBouncer's `sv_being_canceled`).
//!
//! A cancel request finds the server its client holds, then takes its own connection
//! to PostgreSQL to deliver it. Meanwhile the client's query may end and the server
//! go back to the pool; lent to another client, it would run that client's query when
//! the cancel lands. So a server with cancels on their way is held off the pool when
//! its client gives it back, and goes back once the last of them is done (delivered,
//! failed or timed out).
//!
//! The count goes up under the client's link lock ([`ClientInfo::aim_cancel`]), which
//! the client takes again to unlink before it gives the server back: that release sees
//! every cancel that found the server linked. After the unlink the count only goes
//! down, so a release that reads zero needs no lock; one that reads more takes the
//! hold slot's lock, as the last cancel does to take the server out of it.
//!
//! [`ClientInfo::aim_cancel`]: crate::stats::conns::ClientInfo::aim_cancel

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use super::server::{ServerConn, ServerIdent};
use super::Pool;
use crate::clock::Tick;

/// A cancel request on its way to a server's backend; the server is given back to its
/// pool when the last one is dropped, if it was held for them.
#[derive(Debug)]
pub struct CancelAim(Arc<ServerIdent>);

impl CancelAim {
    /// Counts a cancel for `server`. Called under its client's link lock.
    pub fn new(server: Arc<ServerIdent>) -> CancelAim {
        server.cancels.fetch_add(1, Ordering::SeqCst);
        server.aimed.fetch_add(1, Ordering::SeqCst);
        CancelAim(server)
    }
}

impl std::ops::Deref for CancelAim {
    type Target = ServerIdent;
    fn deref(&self) -> &ServerIdent {
        &self.0
    }
}

impl Drop for CancelAim {
    fn drop(&mut self) {
        let conn = {
            let mut held = lock(&self.0.held);
            let last = self.0.cancels.fetch_sub(1, Ordering::SeqCst) == 1;
            if last {
                held.take()
            } else {
                None
            }
        };
        if let Some(conn) = conn {
            if let Some(pool) = conn.lent.pool() {
                pool.unhold(conn);
            }
        }
    }
}

fn lock(m: &Mutex<Option<ServerConn>>) -> MutexGuard<'_, Option<ServerConn>> {
    // Only an Option is moved in and out under it: nothing to leave half-done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ServerIdent {
    /// Whether cancels may be on their way (a hint; [`Pool::hold`] decides).
    #[inline]
    pub(crate) fn cancels_pending(&self) -> bool {
        self.cancels.load(Ordering::Relaxed) != 0
    }
}

impl Pool {
    /// Keeps `conn`, given back clean, off the pool while cancels are on their way to
    /// it; returns it if none is (the last one finished meanwhile).
    pub(super) fn hold(&self, conn: ServerConn) -> Result<(), ServerConn> {
        if !conn.lent.is_by(self) {
            return Err(conn);
        }
        let ident = conn.ident.clone();
        // Counted first: the last cancel may give it back as soon as it is in the slot.
        self.lock_state().being_canceled.push(ident.clone());
        let mut held = lock(&ident.held);
        if ident.cancels.load(Ordering::SeqCst) == 0 {
            drop(held);
            self.forget_held(&ident);
            return Err(conn);
        }
        tracing::debug!(
            "S-{}: held off the pool until the cancel requests sent to it are done",
            ident.id
        );
        *held = Some(conn);
        Ok(())
    }

    /// Gives back a connection held for cancels, now that the last is done.
    fn unhold(&self, conn: ServerConn) {
        self.forget_held(&conn.ident);
        self.release_at(conn, true, Tick::now());
    }

    fn forget_held(&self, ident: &Arc<ServerIdent>) {
        let mut st = self.lock_state();
        if let Some(i) = st.being_canceled.iter().position(|s| Arc::ptr_eq(s, ident)) {
            st.being_canceled.swap_remove(i);
        }
    }

    /// The servers held for cancels, each with when its client gave it back, for
    /// SHOW SERVERS.
    pub fn being_canceled(&self) -> Vec<(Arc<ServerIdent>, Tick)> {
        let held = self.lock_state().being_canceled.clone();
        held.into_iter()
            .map(|ident| {
                let since = lock(&ident.held).as_ref().map(|c| c.last_used);
                (ident, since.unwrap_or_else(Tick::now))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::pool::testing::lent;

    fn pool() -> Arc<Pool> {
        Pool::one_slot_for_tests()
    }

    fn counts(p: &Pool) -> (u32, u32, u32) {
        let n = p.counts();
        (n.idle, n.active, n.being_canceled)
    }

    #[tokio::test]
    async fn a_server_with_cancels_on_their_way_waits_for_the_last_of_them() {
        let p = pool();
        let (conn, _peer) = lent(&p);
        let (first, second) = (
            CancelAim::new(conn.ident.clone()),
            CancelAim::new(conn.ident.clone()),
        );
        // Its client gives it back: held, still counted as lent, not idle.
        assert!(!p.release_at(conn, true, Tick::now()));
        assert_eq!(counts(&p), (0, 1, 1));
        assert_eq!(p.being_canceled().len(), 1);
        drop(first);
        assert_eq!(counts(&p), (0, 1, 1), "one cancel is still on its way");
        drop(second);
        assert_eq!(counts(&p), (1, 0, 0), "back in the pool after the last");
    }

    #[tokio::test]
    async fn a_cancel_done_before_the_release_holds_nothing() {
        let p = pool();
        let (conn, _peer) = lent(&p);
        drop(CancelAim::new(conn.ident.clone()));
        assert!(!conn.ident.cancels_pending());
        assert!(!p.release_at(conn, true, Tick::now()));
        assert_eq!(counts(&p), (1, 0, 0));
    }

    #[tokio::test]
    async fn a_server_closed_at_release_is_not_held() {
        let p = pool();
        let (conn, _peer) = lent(&p);
        let aim = CancelAim::new(conn.ident.clone());
        // Not clean (a client that left mid-transaction): closed at once.
        assert!(!p.release_at(conn, false, Tick::now()));
        assert_eq!(counts(&p), (0, 0, 0));
        drop(aim);
        assert_eq!(counts(&p), (0, 0, 0));
    }
}

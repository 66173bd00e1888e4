//! What a pool does while new server logins fail (PostgreSQL at `max_connections`, a
//! database's CONNECTION LIMIT, a server restarting).
//!
//! As PgBouncer's: after a failed login, no new one is tried for
//! `server_login_retry`. Meanwhile, if servers of the pool are up, a client that
//! needs one waits in line for them, not getting the failed login's error; only with
//! no server up does it get that error at once (PgBouncer's fast fail). Once the
//! retry time is over, the janitor gives the room in the pool to clients waiting in
//! line, which log in anew, so the pool grows back even when no new client comes.

use std::sync::Arc;
use std::task::Waker;

use super::line::Answer;
use super::server::ServerConn;
use super::slot::SlotToken;
use super::{Grant, Pool, PoolConfig, PoolError, PoolState};
use crate::clock::Tick;

impl PoolState {
    /// Whether the last login failed less than `server_login_retry` ago.
    pub(super) fn login_failed_lately(&self) -> bool {
        self.last_login_error
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < self.reuse.login_retry)
    }

    /// Whether new logins wait: the last one failed lately, and servers are up to
    /// serve the clients waiting meanwhile.
    pub(super) fn logins_held_off(&self) -> bool {
        self.login_failed_lately() && self.active as usize + self.idle.len() > 0
    }
}

impl Pool {
    /// The janitor's part: the room in the pool goes to the clients waiting in line
    /// (oldest first), each to log in a new server, unless a login failed lately.
    pub(super) fn grant_room_to_waiters(self: &Arc<Self>) {
        let wakers: Vec<Waker> = {
            let mut st = self.lock_state();
            if st.waiters.is_empty() || st.closed || st.login_failed_lately() {
                return;
            }
            let size = st.reuse.pool_size;
            let mut wakers = Vec::new();
            while size == 0 || st.total < size {
                let Some(w) = st.waiters.pop_front() else {
                    break;
                };
                st.total += 1;
                let slot = Grant::Slot(SlotToken::counted(self.clone()));
                wakers.push(w.answer(&mut st, Answer::Granted(slot)));
            }
            wakers
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl Pool {
    /// Logs in a new server in the slot granted to a client waiting in line since
    /// `since`. If that fails while servers are up, the client waits for one of
    /// them instead (login_hold.rs; a `query_wait_notify` notice is not sent again in
    /// this wait).
    pub(super) async fn connect_granted(
        self: &Arc<Self>,
        cfg: &PoolConfig,
        slot: SlotToken,
        deadline: Option<Tick>,
        since: Tick,
    ) -> Result<ServerConn, PoolError> {
        match self.connect_new(cfg, slot, deadline, &[]).await {
            Err(_) if self.lock_state().logins_held_off() => {
                // (Behind a `dyn`: inlined, this rare wait tripled the code of the
                // session's wait for a server, which then was not inlined itself,
                // ~50 instructions more per transaction at 600 clients.)
                let mut quiet = || {};
                let wait: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>> =
                    Box::pin(self.acquire_until(cfg, since, deadline, &mut quiet));
                wait.await
            }
            got => got,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::clock::Tick;
    use crate::pool::error::PoolError;
    use crate::pool::line;

    fn failed_login(p: &Pool, ago: Duration) {
        let at = Instant::now() - ago;
        p.lock_state().last_login_error = Some((at, PoolError::Closed));
    }

    #[test]
    fn new_logins_wait_after_a_failure_only_while_servers_are_up() {
        let p = Pool::one_slot_for_tests();
        assert!(!p.lock_state().logins_held_off());
        failed_login(&p, Duration::ZERO);
        // No server up: nobody to wait for (the client gets the error).
        assert!(!p.lock_state().logins_held_off());
        p.lock_state().active = 1;
        assert!(p.lock_state().logins_held_off());
        // Once server_login_retry (15 s by default) has passed, logins go on.
        failed_login(&p, Duration::from_secs(16));
        assert!(!p.lock_state().logins_held_off());
    }

    #[test]
    fn a_freed_slot_goes_to_no_waiter_while_logins_wait() {
        let p = Pool::one_slot_for_tests();
        let mut cfg = (*p.config()).clone();
        cfg.pool_size = 2;
        p.reconfigure(cfg);
        // One server up and lent, one login under way, a client in line.
        p.lock_state().total = 2;
        p.lock_state().active = 1;
        let mut t = line::join(&p, &mut p.lock_state(), Tick::now(), Waker::noop());
        failed_login(&p, Duration::ZERO);
        // The failed login's slot is freed: the count goes down, the waiter waits on.
        drop(SlotToken::counted(p.clone()));
        assert_eq!(p.counts().total, 1);
        assert!(t.poll_answer(&mut || {}).is_pending());
        // Nor does the janitor give it the room before server_login_retry.
        p.grant_room_to_waiters();
        assert!(t.poll_answer(&mut || {}).is_pending());
        // After it, the room goes to the waiter, to log in anew.
        failed_login(&p, Duration::from_secs(16));
        p.grant_room_to_waiters();
        let Poll::Ready(Answer::Granted(Grant::Slot(slot))) = t.poll_answer(&mut || {}) else {
            panic!("the waiter got no slot");
        };
        assert_eq!(p.counts().total, 2);
        drop(slot);
    }

    #[tokio::test]
    async fn a_waiter_left_in_line_beside_an_idle_server_gets_it() {
        let p = Pool::one_slot_for_tests();
        let mut cfg = (*p.config()).clone();
        cfg.pool_size = 2;
        p.reconfigure(cfg);
        // One server idle...
        let (mut idle, _theirs) = crate::pool::testing::lent(&p);
        assert!(idle.lent.disarm());
        let mut st = p.lock_state();
        st.idle.push(idle);
        // ...one closing (its mark already counted down), logins held off, and a
        // client in line: as a request written behind another's on the closing
        // server goes back to the head of the line (pipeline.rs).
        (st.total, st.active) = (2, 0);
        drop(st);
        failed_login(&p, Duration::ZERO);
        assert!(p.lock_state().logins_held_off());
        let mut t = line::join(&p, &mut p.lock_state(), Tick::now(), Waker::noop());
        drop(SlotToken::counted(p.clone()));
        // The freed slot is not the waiter's, but the idle server is.
        let Poll::Ready(Answer::Granted(Grant::Check(conn))) = t.poll_answer(&mut || {}) else {
            panic!("the waiter was left in line beside an idle server");
        };
        let c = p.counts();
        assert_eq!((c.total, c.active, c.idle), (1, 1, 0));
        drop(conn);
        assert_eq!(p.counts().total, 0);
    }
}

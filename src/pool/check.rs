//! The check a server gets before it is lent again (`server_check_query`), as
//! PgBouncer's: when it sat idle past `server_check_delay`, and before every reuse
//! when that is 0 (PgBouncer's documented "the check is always run"), a server
//! handed from one client straight to a waiting one included.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::acquire::refusal;
use super::target::Reuse;
use super::{Pool, PoolConfig, PoolError, ServerConn};
use crate::clock::Tick;

impl Pool {
    /// Runs `server_check_query` on a connection that sat idle past
    /// `server_check_delay`. Returns it if healthy; a failed one is closed. The
    /// client waits in line the while, as in PgBouncer (`cl_waiting`), so its
    /// `deadline` (query_wait_timeout) bounds the check too: a server that never
    /// answers it is closed, and the client told `query_wait_timeout`.
    pub(super) async fn check_idle(
        &self,
        mut conn: ServerConn,
        cfg: &PoolConfig,
        deadline: Option<Tick>,
    ) -> Result<Option<ServerConn>, PoolError> {
        let Some(query) = &cfg.server_check_query else {
            return Ok(Some(conn));
        };
        let now = Tick::now();
        if !needs_check(&conn, &cfg.reuse(), now) {
            return Ok(Some(conn));
        }
        let own = cfg.internal_timeout();
        let left = deadline.map(|d| d.since(now));
        let waits_out = left.is_some_and(|l| l < own);
        let checked = {
            // Listed as `tested` meanwhile, as PgBouncer lists a server its check runs on.
            let _listed = self.resetting(&conn.ident);
            let limit = left.map_or(own, |l| l.min(own));
            conn.run_internal(query, limit).await
        };
        match checked {
            Ok(()) => Ok(Some(conn)),
            Err(e) => {
                let waited_out = waits_out && matches!(e, PoolError::Timeout(_));
                let why = if waited_out {
                    "query_wait_timeout".to_string()
                } else {
                    e.to_string()
                };
                tracing::info!("S-{}: server check failed, closing: {why}", conn.ident.id);
                // Its lent mark takes it out of `active`.
                drop(conn);
                if waited_out {
                    return Err(refusal(self));
                }
                Ok(None)
            }
        }
    }

    /// A server a releasing client handed to this waiter with its check still owed
    /// (`server_check_delay = 0`): checked first, and if it fails, another is
    /// acquired as if the client had just asked, within the same `deadline`.
    pub(super) async fn check_handed(
        self: &Arc<Self>,
        conn: ServerConn,
        cfg: &PoolConfig,
        deadline: Option<Tick>,
        since: Tick,
    ) -> Result<ServerConn, PoolError> {
        if let Some(conn) = self.check_idle(conn, cfg, deadline).await? {
            return Ok(conn);
        }
        // (Behind a `dyn`, as login_hold.rs's wait: the recursion needs a box anyway.)
        let mut quiet = || {};
        let again: Pin<Box<dyn Future<Output = _> + Send + '_>> =
            Box::pin(self.acquire_until(cfg, since, deadline, &mut quiet));
        again.await
    }
}

/// Whether a connection sat idle long enough to be checked before reuse.
pub(super) fn needs_check(conn: &ServerConn, r: &Reuse, now: Tick) -> bool {
    r.check && now.reached(conn.last_used, r.check_delay)
}

#[cfg(test)]
mod tests {
    use std::task::{Poll, Waker};
    use std::time::Duration;

    use super::*;
    use crate::pool::line::{join, Answer, Request};
    use crate::pool::testing::lent;
    use crate::pool::Grant;

    /// A pool of one whose one connection is lent out, with `server_check_delay`
    /// `delay` and a check query; and a client waiting in line with a request.
    fn lent_with_waiter(
        delay: Duration,
    ) -> (
        Arc<Pool>,
        ServerConn,
        crate::pool::Ticket,
        std::os::unix::net::UnixStream,
    ) {
        let p = Pool::one_slot_for_tests();
        let (conn, theirs) = lent(&p);
        {
            let mut st = p.lock_state();
            st.reuse.check = true;
            st.reuse.check_delay = delay;
        }
        let mut ticket = join(&p, &mut p.lock_state(), Tick::now(), Waker::noop());
        let meta = crate::stats::conns::test_meta(1);
        let request = Request::new(
            bytes::BytesMut::from("Q"),
            Arc::default(),
            Arc::new(crate::stats::conns::ClientInfo::new(meta)),
        );
        assert!(ticket.leave_request(request).is_ok());
        (p, conn, ticket, theirs)
    }

    #[tokio::test]
    async fn a_server_handed_to_a_waiter_is_checked_first_when_the_delay_is_zero() {
        let (p, conn, mut ticket, _peer) = lent_with_waiter(Duration::ZERO);
        assert!(p.release_at(conn, true, Tick::now()));
        let Poll::Ready(Answer::Granted(Grant::Check(_conn))) = ticket.poll_answer(&mut || {})
        else {
            panic!("the waiter did not get the server to check");
        };
        // Its request was not written: the waiter sends it after the check.
        let r = ticket.take_request().expect("the request comes back");
        assert!(!r.sent);
    }

    #[tokio::test]
    async fn with_a_delay_the_server_goes_to_the_waiter_as_it_is() {
        let (p, conn, mut ticket, _peer) = lent_with_waiter(Duration::from_secs(30));
        assert!(p.release_at(conn, true, Tick::now()));
        assert!(matches!(
            ticket.poll_answer(&mut || {}),
            Poll::Ready(Answer::Granted(Grant::Server(_)))
        ));
    }

    #[tokio::test]
    async fn a_server_to_check_whose_waiter_left_goes_back_to_the_pool() {
        let (p, conn, ticket, _peer) = lent_with_waiter(Duration::ZERO);
        assert!(p.release_at(conn, true, Tick::now()));
        drop(ticket);
        let n = p.counts();
        assert_eq!((n.idle, n.active, n.total), (1, 0, 1));
    }
}

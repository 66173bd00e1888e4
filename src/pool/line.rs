//! A pool's line of waiting clients, and how a place in it is answered.
//!
//! A place in line keeps the waiting task's waker; its answer (a connection, a slot,
//! or a refusal) is left for it in the pool's state, under the lock the releasing side
//! holds anyway, and the task is woken. This replaced a `oneshot` channel per wait,
//! whose allocation, reference counts and state changes cost more than the lock
//! (docs/performance.md, fourteenth round). A place that is given up (its [`Ticket`]
//! dropped) leaves the line at once, so every place in line is live and an answer is
//! never sent to a waiter that has gone.

use std::sync::Arc;
use std::task::{Poll, Waker};

use super::{Grant, Pool, PoolState};
use crate::clock::Tick;

/// A client waiting in line.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) since: Tick,
    waker: Waker,
}

/// How a place in line ends.
#[derive(Debug)]
pub(super) enum Answer {
    Granted(Grant),
    /// Taken out of line: the pool closed, or the wait reached query_wait_timeout.
    Refused,
}

/// A place in a pool's line; dropping it leaves the line (and passes on an answer
/// that came too late).
#[derive(Debug)]
pub struct Ticket {
    pool: Arc<Pool>,
    id: u64,
    pub(super) since: Tick,
    /// Its answer was taken.
    answered: bool,
}

/// Takes a place at the end of the line for the task of `waker`.
pub(super) fn join(pool: &Arc<Pool>, st: &mut PoolState, now: Tick, waker: &Waker) -> Ticket {
    let id = st.next_waiter;
    st.next_waiter += 1;
    st.waiters.push_back(Waiter {
        id,
        since: now,
        waker: waker.clone(),
    });
    Ticket {
        pool: pool.clone(),
        id,
        since: now,
        answered: false,
    }
}

impl Waiter {
    /// Leaves `answer` for this waiter (taken out of line) in the pool's state: the
    /// waker to wake once the lock is released.
    pub(super) fn answer(self, st: &mut PoolState, answer: Answer) -> Waker {
        st.answers.push((self.id, answer));
        self.waker
    }
}

/// Refuses the places of `waiters` (taken out of line): the wakers to wake once the
/// lock is released.
pub(super) fn refuse(st: &mut PoolState, waiters: impl IntoIterator<Item = Waiter>) -> Vec<Waker> {
    waiters
        .into_iter()
        .map(|w| w.answer(st, Answer::Refused))
        .collect()
}

impl Ticket {
    /// The answer, once there is one.
    pub(super) fn poll_answer(&mut self) -> Poll<Answer> {
        // The waker was kept when the place was taken: a wait never moves to
        // another task (it is awaited where it was taken).
        let mut st = self.pool.lock_state();
        match st.answers.iter().position(|(id, _)| *id == self.id) {
            Some(i) => {
                let (_, answer) = st.answers.swap_remove(i);
                self.answered = true;
                Poll::Ready(answer)
            }
            None => Poll::Pending,
        }
    }

    /// Waits for the answer.
    pub(super) async fn answer(&mut self) -> Answer {
        std::future::poll_fn(|_| self.poll_answer()).await
    }

    /// Leaves the line if still in it, under the pool's lock held as `st`; true if it
    /// was (false: answered meanwhile, or taken out).
    pub(super) fn leave(&mut self, st: &mut PoolState) -> bool {
        let left = leave(st, self.id);
        self.answered |= left;
        left
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let answer = {
            let mut st = self.pool.lock_state();
            if leave(&mut st, self.id) {
                return;
            }
            match st.answers.iter().position(|(id, _)| *id == self.id) {
                Some(i) => st.answers.swap_remove(i).1,
                None => return,
            }
        };
        // Answered, but the waiter is gone (its client left, say): a connection goes
        // back as it came (clean, never used by this client), a slot to the next
        // waiter as its token drops.
        if let Answer::Granted(Grant::Server(conn)) = answer {
            self.pool.release(conn, true);
        }
    }
}

/// Takes place `id` out of line if it is still there.
fn leave(st: &mut PoolState, id: u64) -> bool {
    match st.waiters.iter().position(|w| w.id == id) {
        Some(pos) => {
            st.waiters.remove(pos);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::task::{Poll, Waker};

    use super::*;
    use crate::config::Config;
    use crate::pool::limits::PoolLimits;
    use crate::pool::slot::SlotToken;
    use crate::pool::{Checkout, PoolConfig, PoolKey};

    fn pool() -> Arc<Pool> {
        let ini = "[databases]\ndb = host=127.0.0.1 port=1\n[pgbouncer]\ndefault_pool_size = 1\n";
        let cfg = Config::from_ini_str(ini, Path::new("test.ini")).expect("config");
        let entry = cfg.database_entry("db").expect("db entry");
        let pc = PoolConfig::new(&cfg, &entry, "db", "u");
        let key = PoolKey {
            database: "db".into(),
            user: "u".into(),
        };
        let limits = PoolLimits {
            db: Default::default(),
            user: Default::default(),
        };
        Arc::new(Pool::new(key, pc, Arc::new(AtomicU64::new(1)), limits))
    }

    fn queue(p: &Arc<Pool>) -> Ticket {
        join(p, &mut p.lock_state(), Tick::now(), Waker::noop())
    }

    #[test]
    fn a_slot_given_up_before_it_is_taken_goes_to_the_next_in_line() {
        let p = pool();
        p.lock_state().total = 1;
        let (first, mut second) = (queue(&p), queue(&p));
        assert_eq!(p.counts().waiting, 2);
        assert!(second.poll_answer().is_pending());
        // The one connection's slot frees: the oldest waiter is answered...
        drop(SlotToken::counted(p.clone()));
        assert_eq!(p.counts().waiting, 1);
        // ... but has gone before taking it: the slot passes on, not lost.
        drop(first);
        let Poll::Ready(Answer::Granted(Grant::Slot(slot))) = second.poll_answer() else {
            panic!("the next waiter got no slot");
        };
        assert_eq!(p.counts().total, 1);
        drop(second);
        // With nobody waiting, a freed slot lowers the count.
        drop(slot);
        assert_eq!(p.counts().total, 0);
        assert!(p.lock_state().answers.is_empty());
    }

    #[test]
    fn checkout_follows_a_reload_of_the_pool_size() {
        let p = pool();
        // Its one connection is lent out: the next client waits in line.
        p.lock_state().total = 1;
        let now = Tick::now();
        assert!(matches!(
            p.checkout(now, Waker::noop()),
            Checkout::Queued(_)
        ));
        // A reload raises the pool size; checkout reads its copy under the lock, which
        // must follow: there is room to connect now.
        let mut cfg = (*p.config()).clone();
        cfg.pool_size = 2;
        p.reconfigure(cfg);
        assert!(matches!(p.checkout(now, Waker::noop()), Checkout::Slow));
    }

    #[test]
    fn a_place_given_up_leaves_the_line_and_a_closed_pool_refuses_the_rest() {
        let p = pool();
        p.lock_state().total = 1;
        let (gone, mut left) = (queue(&p), queue(&p));
        drop(gone);
        assert_eq!(p.counts().waiting, 1, "a dropped ticket leaves the line");
        p.close();
        assert!(matches!(left.poll_answer(), Poll::Ready(Answer::Refused)));
        assert_eq!(p.counts().waiting, 0);
        drop(left);
        assert!(p.lock_state().answers.is_empty());
    }
}

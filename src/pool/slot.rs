//! A pool slot: the right to hold one server connection.
//!
//! Every server connection, and every connection attempt in progress, owns exactly one
//! [`SlotToken`]. Dropping the token frees the slot, and a freed slot goes straight to
//! the oldest waiter, so the pool's count can never leak, whatever path drops a
//! connection (error, client vanishing mid-connect, shutdown).

use std::sync::{Arc, MutexGuard};

use super::idle::pop_idle;
use super::line::Answer;
use super::{Grant, LentMark, Pool, PoolState};
use crate::clock::Tick;

/// Ownership of one counted slot in a pool.
#[derive(Debug)]
pub(crate) struct SlotToken {
    pool: Option<Arc<Pool>>,
}

impl SlotToken {
    /// A token for a slot already counted in `pool`'s total.
    pub(crate) fn counted(pool: Arc<Pool>) -> SlotToken {
        SlotToken { pool: Some(pool) }
    }

    /// Takes the slot out without freeing it (it is being handed over).
    fn take(&mut self) -> Option<Arc<Pool>> {
        self.pool.take()
    }
}

impl Drop for SlotToken {
    fn drop(&mut self) {
        if let Some(pool) = self.take() {
            free(pool);
        }
    }
}

/// Frees a slot of `pool`. Out of line: it is in the drop code of whatever may drop a
/// server connection, the session's hot futures among them, and runs only when a
/// connection closes.
#[inline(never)]
fn free(pool: Arc<Pool>) {
    // Hand the slot to the oldest waiter (every place in line is live); only when
    // nobody waits does the count go down.
    let mut st = pool.lock_state();
    // (A pool over its size, lowered since, gives the slot up instead; so does one
    // holding off new logins, whose waiters wait for the servers up: login_hold.rs.)
    let next = match super::closing::surplus(&st) {
        0 if !st.logins_held_off() => st.waiters.pop_front(),
        _ => None,
    };
    match next {
        Some(w) => {
            let slot = Grant::Slot(SlotToken::counted(pool.clone()));
            let waker = w.answer(&mut st, Answer::Granted(slot));
            drop(st);
            waker.wake();
        }
        None => {
            st.total = st.total.saturating_sub(1);
            if !st.waiters.is_empty() && !st.idle.is_empty() {
                lend_idle(&pool, st);
            }
        }
    }
}

/// A client can be left in line beside an idle server: one whose request, written
/// behind another's, went back to the head of the line as that server closed
/// (pipeline.rs), while the slot it freed could not be its (logins held off, a pool
/// over its size). Nobody else would lend it the idle server: acquires take idle
/// servers without looking at the line, and a released server goes idle only when
/// nobody waits. So the oldest waiter gets it now, checked as any idle server is.
#[cold]
fn lend_idle(pool: &Arc<Pool>, mut st: MutexGuard<'_, PoolState>) {
    let mut doomed = Vec::new();
    let waker = match (
        st.waiters.pop_front(),
        pop_idle(&mut st, Tick::now(), &mut doomed),
    ) {
        (Some(w), Some(mut conn)) => {
            st.active += 1;
            conn.lent = LentMark::lent_by(pool.clone());
            Some(w.answer(&mut st, Answer::Granted(Grant::Check(conn))))
        }
        (w, conn) => {
            if let Some(w) = w {
                st.waiters.push_front(w);
            }
            st.idle.extend(conn);
            None
        }
    };
    drop(st);
    // (Stale idle servers close after the lock: their slots come back here.)
    pool.bury(doomed);
    if let Some(w) = waker {
        w.wake();
    }
}

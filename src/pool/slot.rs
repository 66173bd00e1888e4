//! A pool slot: the right to hold one server connection.
//!
//! Every server connection, and every connection attempt in progress, owns exactly one
//! [`SlotToken`]. Dropping the token frees the slot, and a freed slot goes straight to
//! the oldest waiter, so the pool's count can never leak, whatever path drops a
//! connection (error, client vanishing mid-connect, shutdown).

use std::sync::Arc;

use super::{Grant, Pool};

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
            let waker = w.answer(&mut st, super::line::Answer::Granted(slot));
            drop(st);
            waker.wake();
        }
        None => st.total = st.total.saturating_sub(1),
    }
}

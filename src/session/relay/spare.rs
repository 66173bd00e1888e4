//! Relays of finished requests, kept per thread with their (empty) buffers for the
//! next request any client on the thread makes: a request then allocates nothing, and
//! an idle client still holds no relay.

use std::cell::{Cell, RefCell};

use super::Relay;
use crate::net::bufpool;

/// Spare relays per thread: 16 KB buffers each, so few; past this, a finished
/// relay's buffers go to the buffer pool and its box is freed.
const KEEP: usize = 16;

thread_local! {
    // Boxed: the box is what a request reuses (the session's slot holds one).
    #[allow(clippy::vec_box)]
    static SPARE: RefCell<Vec<Box<Relay>>> = const { RefCell::new(Vec::new()) };
}

/// The most resting relays per thread that keep their buffers (see [`hold`]).
pub(super) const HOLD: u32 = 32;

thread_local! {
    static HOLDING: Cell<u32> = const { Cell::new(0) };
}

/// Whether a relay coming to rest here may keep its buffers (and is counted): a
/// busy client's next request then reads into them at no cost, while however
/// many clients rest between requests, at most [`HOLD`] per thread hold buffers
/// (the rest give them to the pool). A relay taken up on another thread than it
/// came to rest on (multi-threaded runtime) may leave this count too high, never
/// too low: the sum over threads bounds the relays holding buffers.
pub(super) fn hold() -> bool {
    HOLDING
        .try_with(|h| {
            let n = h.get();
            (n < HOLD).then(|| h.set(n + 1)).is_some()
        })
        .unwrap_or(false)
}

/// A holding relay is taken up again (or put away).
pub(super) fn let_go() {
    let _ = HOLDING.try_with(|h| h.set(h.get().saturating_sub(1)));
}

pub(super) fn take() -> Option<Box<Relay>> {
    SPARE.try_with(|s| s.borrow_mut().pop()).ok().flatten()
}

/// Keeps a parked relay (its prepared-statement state gone, its buffers empty) if
/// there is room; a buffer that cannot be reused as it is goes.
pub(super) fn put(mut r: Box<Relay>) {
    // Its client's: the next one makes its own.
    r.line_request = None;
    for b in [&mut r.c2s, &mut r.s2c, &mut r.spare_input] {
        if !bufpool::reusable(b) {
            *b = Default::default();
        }
    }
    let mut r = Some(r);
    // `try_with`: at thread exit the list may be gone (then the relay is freed).
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < KEEP {
            s.extend(r.take());
        }
    });
    // Dropped outside the borrow: its drop gives the buffers to the pool.
    drop(r);
}

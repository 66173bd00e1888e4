//! A relay between requests. An idle client keeps only what outlives a request (its
//! timeouts, clocks and prepared statements, a hundred-odd bytes); the relay proper
//! (buffers, framers, protocol state, ~0.7 KB) is made for each request and dropped
//! at its release point, so ten thousand idle clients do not each keep one.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Sleep;

use super::prepared::PreparedState;
use super::{ClientPrepared, Relay, Timeouts};
use crate::clock::Tick;
use crate::net::{bufpool, Stream};
use crate::prepared::Registry;
use crate::session::framer::Framer;
use crate::stats::conns::ClientInfo;
use crate::stats::StatsDelta;

/// What of a relay outlives a request.
#[derive(Debug)]
pub struct Parked {
    pub(super) timeouts: Timeouts,
    pub(super) last_activity: Tick,
    pub(super) last_read: Tick,
    pub(super) last_flush: Tick,
    pub(super) max_packet: u32,
    /// The per-server cache size for [`Parked::prepared_later`].
    max_prepared: u32,
    /// Taken by the relay while a request runs.
    pub(super) prepared: Option<Box<ClientPrepared>>,
    /// Prepared statements are on but the client has sent no request yet: its state is
    /// made at the first (most idle clients of a crowd never send one).
    prepared_later: Option<Arc<Registry>>,
}

impl Parked {
    pub fn new(max_packet: u32, timeouts: Timeouts) -> Parked {
        let now = Tick::now();
        Parked {
            timeouts,
            last_activity: now,
            last_read: now,
            last_flush: now,
            max_packet,
            max_prepared: 0,
            prepared: None,
            prepared_later: None,
        }
    }

    /// When the client_idle_timeout of a client idle since its last activity runs
    /// out, if one is set.
    pub fn idle_deadline(&self) -> Option<Tick> {
        let t = self.timeouts.client_idle();
        (!t.is_zero()).then(|| self.last_activity + t)
    }

    /// Turns on prepared-statement rewriting with a per-server cache of `max`.
    pub fn enable_prepared(&mut self, registry: Arc<Registry>, max: u32) {
        self.prepared_later = Some(registry);
        self.max_prepared = max;
    }

    /// The prepared-statement state for a request, made now if this is the first.
    pub(super) fn take_prepared(&mut self) -> Option<Box<ClientPrepared>> {
        self.prepared.take().or_else(|| {
            let registry = self.prepared_later.take()?;
            let max = self.max_prepared as usize;
            Some(Box::new(ClientPrepared::new(registry, max)))
        })
    }

    /// Waits until the client sends something, or its client_idle_timeout runs out
    /// (the error is the reason to give), or, if it `can_sleep`, it should sleep: when
    /// asked to (the janitor's sweep, [`ClientInfo::ask_to_sleep`]) or, for a `fresh`
    /// client (just logged in), once it has sent nothing for [`FRESH_SLEEP`]. Reads
    /// nothing: the relay made next does.
    pub async fn wait_idle(
        &self,
        client: &Stream,
        info: &ClientInfo,
        fresh: bool,
        can_sleep: bool,
    ) -> Result<Idle, &'static str> {
        let t = self.timeouts.client_idle();
        // Boxed (and only when set): an idle client's task keeps a pointer, not a timer.
        let mut timer = (!t.is_zero()).then(|| {
            Box::pin(tokio::time::sleep_until(
                (self.last_activity + t).to_instant().into(),
            ))
        });
        let mut fresh_timer: Option<Pin<Box<Sleep>>> = None;
        poll_fn(|cx| {
            if let Some(timer) = timer.as_mut() {
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err("client_idle_timeout"));
                }
            }
            // An error is the read's to report.
            if client.poll_read_ready(cx).is_ready() {
                return Poll::Ready(Ok(Idle::Request));
            }
            if !can_sleep {
                return Poll::Pending;
            }
            if info.asked_to_sleep() {
                return Poll::Ready(Ok(Idle::Sleep));
            }
            if fresh {
                // Made only once the client is seen to be quiet: a client that sends
                // its first query right after the welcome (most do) never starts it.
                let t =
                    fresh_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(FRESH_SLEEP)));
                if t.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(Idle::Sleep));
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// How long a client that has just logged in may stay quiet before it sleeps, handing
/// its socket to the keeper and ending its task. Short, so that a crowd of clients
/// that log in and wait (an application's connection pool) never holds a task each;
/// long enough that one that queries at once never sleeps.
pub const FRESH_SLEEP: Duration = Duration::from_millis(50);

/// Why [`Parked::wait_idle`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// The client sent something (or closed, or failed: the read will tell).
    Request,
    /// The client should sleep.
    Sleep,
}

/// A client's relay: made when a request comes, parked when the server goes back.
#[derive(Debug)]
pub struct RelaySlot {
    active: Option<Box<Relay>>,
    parked: Parked,
}

impl RelaySlot {
    pub fn new(parked: Parked) -> RelaySlot {
        RelaySlot {
            active: None,
            parked,
        }
    }

    /// The relay, made now if the client was idle (in a spare one's box and buffers
    /// when this thread has one).
    pub fn get(&mut self) -> &mut Relay {
        let parked = &mut self.parked;
        self.active.get_or_insert_with(|| {
            let mut r = spare::take().unwrap_or_default();
            r.refill(parked);
            r
        })
    }

    /// The relay if a request is under way.
    pub fn active(&mut self) -> Option<&mut Relay> {
        self.active.as_deref_mut()
    }

    /// The lasting state, valid while no relay is active.
    pub fn parked(&self) -> Option<&Parked> {
        self.active.is_none().then_some(&self.parked)
    }

    /// Puts the relay away if nothing is left in it (its counts must be flushed
    /// first); otherwise it stays.
    pub fn park(&mut self) {
        let Some(mut r) = self.active.take_if(|r| r.parkable()) else {
            return;
        };
        let p = &mut self.parked;
        p.timeouts = r.timeouts;
        p.last_activity = r.last_activity;
        p.last_read = r.last_read;
        p.last_flush = r.last_flush;
        if let Some(state) = r.prepared.take() {
            let (kept, input) = state.into_kept();
            p.prepared = Some(kept);
            r.spare_input = input;
        }
        spare::put(r);
    }
}

/// Setting a relay up for a request.
impl Relay {
    /// Makes a blank or spare relay (clean, its buffers empty, no prepared-statement
    /// state: see `spare::put`) the relay for the next request of a client whose
    /// lasting state is `kept`. Field by field, in place: building a new one and moving
    /// it in copies ~0.7 KB and drops the old one, a tenth of a request's instructions.
    fn refill(&mut self, kept: &mut Parked) {
        // Every field named, so that a field added to the relay cannot be forgotten
        // here (and carried from one client's request to another's).
        let Relay {
            c2s: _,
            s2c: _,
            client_framer,
            server_framer,
            pending,
            unsynced,
            status,
            terminated,
            desync,
            max_packet,
            saw_ready,
            timeouts,
            request_started,
            transaction_started,
            last_activity,
            last_read,
            stats,
            readies,
            xacts_done,
            prepared: _,
            last_flush,
            spare_input: _,
        } = self;
        // The buffers are empty (`spare::put`); the prepared-statement state is taken
        // below.
        *client_framer = Framer::default();
        *server_framer = Framer::default();
        *pending = 0;
        *unsynced = false;
        *status = b'I';
        *terminated = false;
        *desync = false;
        *max_packet = kept.max_packet;
        *saw_ready = false;
        *timeouts = kept.timeouts;
        *request_started = None;
        *transaction_started = None;
        *last_activity = kept.last_activity;
        *last_read = kept.last_read;
        *stats = StatsDelta::default();
        *readies = 0;
        *xacts_done = 0;
        *last_flush = kept.last_flush;
        self.take_prepared(kept);
    }

    /// Takes the client's prepared-statement state for this request, reading into the
    /// spare input buffer; a relay without one gives that buffer back, so as not to
    /// hold it for a request that may last the whole session (session pooling).
    fn take_prepared(&mut self, kept: &mut Parked) {
        let input = std::mem::take(&mut self.spare_input);
        self.prepared = match kept.take_prepared() {
            Some(k) => Some(PreparedState::new(k, input)),
            None => {
                if input.capacity() != 0 {
                    bufpool::give(input);
                }
                None
            }
        };
    }
}

impl Drop for RelaySlot {
    /// A session that ends with its relay active (a Terminate is read by one) leaves
    /// it for the next request on this thread, as a finished request does, rather than
    /// freeing it: a client per transaction would otherwise allocate one each (and a
    /// 16 KB buffer). What is left in it is not wanted any more; the client's prepared
    /// statements go with the client.
    fn drop(&mut self) {
        if let Some(mut r) = self.active.take() {
            if let Some(state) = r.prepared.take() {
                let (statements, input) = state.into_kept();
                drop(statements);
                r.spare_input = input;
            }
            // Emptied, so that the buffers can be kept: with prepared statements on,
            // the client's Terminate itself is still in the input buffer.
            for b in [&mut r.c2s, &mut r.s2c, &mut r.spare_input] {
                b.clear();
            }
            spare::put(r);
        }
    }
}

/// Relays of finished requests, kept per thread with their (empty) buffers for the
/// next request any client on the thread makes: a request then allocates nothing, and
/// an idle client still holds no relay.
mod spare {
    use std::cell::RefCell;

    use super::{bufpool, Relay};

    /// Spare relays per thread: 16 KB buffers each, so few; past this, a finished
    /// relay's buffers go to the buffer pool and its box is freed.
    const KEEP: usize = 16;

    thread_local! {
        // Boxed: the box is what a request reuses (the session's slot holds one).
        #[allow(clippy::vec_box)]
        static SPARE: RefCell<Vec<Box<Relay>>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn take() -> Option<Box<Relay>> {
        SPARE.try_with(|s| s.borrow_mut().pop()).ok().flatten()
    }

    /// Keeps a parked relay (its prepared-statement state gone, its buffers empty) if
    /// there is room; a buffer that cannot be reused as it is goes.
    pub(super) fn put(mut r: Box<Relay>) {
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
}

impl Drop for Relay {
    /// Its buffers go back for the next request anyone makes, also when the session
    /// ends with the relay active (a Terminate is read by one): what is left in them
    /// is not wanted any more. Otherwise every short session would allocate and free
    /// a buffer.
    fn drop(&mut self) {
        // The prepared-statement state may hold a piece split off a buffer: gone
        // first, the buffer is whole again.
        if let Some(p) = self.prepared.take() {
            p.discard();
        }
        for b in [&mut self.c2s, &mut self.s2c, &mut self.spare_input] {
            // (A spent spare relay's are already taken.)
            if b.capacity() != 0 {
                b.clear();
                bufpool::give(std::mem::take(b));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_relay_is_reused_with_its_buffers_and_none_of_its_state() {
        let mut first = RelaySlot::new(Parked::new(1 << 20, Timeouts::default()));
        let r = first.get();
        // As a read takes it.
        r.c2s = bufpool::take();
        r.preload(b"Q\0\0\0\x0dSELECT 1\0").expect("a whole Query");
        assert!(r.has_request());
        // Served: the request went to a server and its answer came back.
        r.c2s.clear();
        r.pending = 0;
        let (relay_at, buf_at) = (r as *const Relay, r.c2s.as_ptr());
        first.park();
        assert!(first.active().is_none(), "a clean relay is put away");

        // Another client on the same thread gets the same box and buffer, blank.
        let mut second = RelaySlot::new(Parked::new(1 << 20, Timeouts::default()));
        let r = second.get();
        assert_eq!(r as *const Relay, relay_at);
        assert_eq!(r.c2s.as_ptr(), buf_at);
        assert!(r.c2s.capacity() >= bufpool::BUF_SIZE);
        assert!(!r.has_request());
        assert_eq!((r.pending, r.status, r.terminated), (0, b'I', false));
        assert!(r.stats.is_empty());

        // A relay with something left in it is not put away.
        r.preload(b"Q\0\0\0\x0dSELECT 1\0").expect("a whole Query");
        second.park();
        assert!(second.active().is_some());
    }
}

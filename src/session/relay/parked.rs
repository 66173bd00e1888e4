//! A relay between requests. An idle client keeps only what outlives a request (its
//! timeouts, clocks and prepared statements, a hundred-odd bytes); the relay proper
//! (buffers, framers, protocol state, ~0.7 KB) is made when a request comes and put
//! away when the client goes to sleep (or at the session's end), so ten thousand idle
//! clients do not each keep one. Between a busy client's requests the relay rests,
//! made ready for the next one in place (and holding its empty buffers, for a few
//! clients per thread): putting it away and making it again per transaction cost a
//! twentieth of a transaction's instructions.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;

use crate::timer::Sleep;

use super::prepared::PreparedState;
use super::spare;
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
    /// `max_packet_size`, and in its top bit (`NO_SIMPLE_QUERY`) `disable_pqexec`:
    /// every idle client keeps a copy, and a message is at most 2^31 - 1 bytes anyway
    /// (its length is a signed 32-bit integer), so the bit is free.
    pub(super) max_packet: u32,
    /// The per-server cache size for [`Parked::prepared_later`].
    max_prepared: u32,
    /// Taken by the relay while a request runs.
    pub(super) prepared: Option<Box<ClientPrepared>>,
    /// Prepared statements are on but the client has sent no request yet: its state is
    /// made at the first (most idle clients of a crowd never send one).
    prepared_later: Option<Arc<Registry>>,
}

/// `Parked::max_packet`'s flag bit: the client may not use the simple query protocol.
const NO_SIMPLE_QUERY: u32 = 1 << 31;

impl Parked {
    pub fn new(max_packet: u32, timeouts: Timeouts) -> Parked {
        let now = Tick::now();
        Parked {
            timeouts,
            last_activity: now,
            last_read: now,
            last_flush: now,
            max_packet: max_packet.min(!NO_SIMPLE_QUERY),
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

    /// Refuses the client's `Query` messages (`disable_pqexec`).
    pub fn refuse_simple_query(&mut self) {
        self.max_packet |= NO_SIMPLE_QUERY;
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
}

/// How long a client that has just logged in may stay quiet before it sleeps, handing
/// its socket to the keeper and ending its task. Short, so that a crowd of clients
/// that log in and wait (an application's connection pool) never holds a task each;
/// long enough that one that queries at once never sleeps. 10 ms, not 50: in a burst
/// of logins (the bench's 10,000 with a backlog of 4,096) the more clients are still
/// awake at its end, the more heap holes their tasks leave: RSS per idle client was
/// 0.88-0.94 KB at 50 ms, 0.67-0.74 KB at 10 ms. A client that pauses longer before
/// its first query costs one sleep and wake-up (a few system calls); when such clients
/// come back soon, the keeper lets the next ones wait longer (`keeper::FRESH_BACK`).
pub const FRESH_SLEEP: Duration = Duration::from_millis(10);

/// Why `Parked::wait_idle` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// The client sent something (or closed, or failed: the read will tell).
    Request,
    /// The client should sleep.
    Sleep,
}

/// A client's relay: made when a request comes, parked when the server goes back.
#[derive(Debug)]
// The parts a busy client's request reads first (`repr(C)`): see `Relay`.
#[repr(C)]
pub struct RelaySlot {
    active: Option<Box<Relay>>,
    /// Whether the active relay is resting between requests ([`RelaySlot::rest`]).
    resting: Rest,
    parked: Parked,
}

/// Whether an active relay is between requests, and whether it kept its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rest {
    No,
    /// Its buffers went back to the thread's pool.
    Bare,
    /// It kept its (empty) buffers, counted in `spare::hold`.
    Holding,
}

impl RelaySlot {
    pub fn new(parked: Parked) -> RelaySlot {
        RelaySlot {
            active: None,
            parked,
            resting: Rest::No,
        }
    }

    /// The relay, made now if the client was idle (in a spare one's box and buffers
    /// when this thread has one). Inline, with the making apart: a request calls this
    /// a dozen times, and as one function with the making in it each call cost ~17
    /// instructions (saving six registers and a stack frame) where a check of two
    /// fields will do.
    #[inline]
    pub fn get(&mut self) -> &mut Relay {
        if self.resting != Rest::No {
            self.end_rest();
        }
        match self.active {
            Some(ref mut r) => r,
            None => self.make_active(),
        }
    }

    #[cold]
    #[inline(never)]
    fn make_active(&mut self) -> &mut Relay {
        let mut r = spare::take().unwrap_or_default();
        r.refill(&mut self.parked);
        self.active.insert(r)
    }

    /// The relay if a request is under way.
    pub fn active(&mut self) -> Option<&mut Relay> {
        self.active.as_deref_mut()
    }

    /// The lasting state, valid while no relay is active.
    pub fn parked(&self) -> Option<&Parked> {
        self.active.is_none().then_some(&self.parked)
    }

    /// At a release point: keeps the relay for the client's next request if nothing
    /// is left in it (its counts must be flushed first), made ready for that request.
    /// A busy client (the next request follows its answer) then needs no relay put
    /// away and made again per transaction; an idle one's is put away when it goes to
    /// sleep ([`RelaySlot::park`]). A relay with something left in it stays active.
    pub fn rest(&mut self) {
        if let Some(r) = self.active.as_deref_mut() {
            if r.parkable() {
                r.restart();
                self.resting = if spare::hold() {
                    Rest::Holding
                } else {
                    r.give_buffers();
                    Rest::Bare
                };
            }
        }
    }

    fn end_rest(&mut self) {
        if self.resting == Rest::Holding {
            spare::let_go();
        }
        self.resting = Rest::No;
    }

    /// Waits until the client sends something, or its client_idle_timeout runs out
    /// (the error is the reason to give), or, if it `can_sleep`, it should sleep: when
    /// asked to (the janitor's sweep, [`ClientInfo::ask_to_sleep`]) or, for a client
    /// just logged in (`fresh`: how long it may stay quiet, [`FRESH_SLEEP`] or the
    /// keeper's longer wait), once it has sent nothing for that long. Reads nothing:
    /// the relay made next does.
    pub async fn wait_idle(
        &self,
        client: &Stream,
        info: &ClientInfo,
        fresh: Option<Duration>,
        can_sleep: bool,
    ) -> Result<Idle, &'static str> {
        let mut timer = self.idle_deadline().map(crate::timer::sleep_until);
        let mut fresh_timer: Option<Sleep> = None;
        poll_fn(|cx| {
            if let Some(timer) = timer.as_mut() {
                if Pin::new(timer).poll(cx).is_ready() {
                    return Poll::Ready(Err("client_idle_timeout"));
                }
            }
            // An error is the read's to report.
            if client.poll_read_ready(cx).is_ready() {
                return Poll::Ready(Ok(Idle::Request));
            }
            // Nor while its TLS session holds bytes (the keeper watches only the
            // socket): the read-readiness poll above sends them, and wakes this
            // task once the socket takes more.
            if !can_sleep || !client.is_quiet() {
                return Poll::Pending;
            }
            if info.asked_to_sleep() {
                return Poll::Ready(Ok(Idle::Sleep));
            }
            if let Some(fresh) = fresh {
                // Made only once the client is seen to be quiet: a client that sends
                // its first query right after the welcome (most do) never starts it.
                let t = fresh_timer.get_or_insert_with(|| crate::timer::sleep(fresh));
                if Pin::new(t).poll(cx).is_ready() {
                    return Poll::Ready(Ok(Idle::Sleep));
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Whether the client is between requests: no relay, or one resting.
    pub fn between_requests(&self) -> bool {
        self.active.is_none() || self.resting != Rest::No
    }

    /// When the client_idle_timeout of a client between requests runs out, if set.
    fn idle_deadline(&self) -> Option<Tick> {
        match self.active.as_deref() {
            None => self.parked.idle_deadline(),
            Some(r) => {
                let t = r.timeouts.client_idle();
                (!t.is_zero()).then(|| r.last_activity + t)
            }
        }
    }

    /// Puts the relay away if nothing is left in it (its counts must be flushed
    /// first); otherwise it stays.
    pub fn park(&mut self) {
        let Some(mut r) = self.active.take_if(|r| r.parkable()) else {
            return;
        };
        self.end_rest();
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
        // The per-request state as for any request (`restart` names every field, so
        // that one added to the relay cannot be forgotten and carried from one
        // client's request to another's), then the client's lasting state: every field
        // `restart` keeps is set here, but the buffers, which are empty
        // (`spare::put`), and the prepared-statement state, taken below.
        self.restart();
        self.max_packet = kept.max_packet & !NO_SIMPLE_QUERY;
        self.no_simple_query = kept.max_packet & NO_SIMPLE_QUERY != 0;
        self.timeouts = kept.timeouts;
        self.last_activity = kept.last_activity;
        self.last_read = kept.last_read;
        self.stats = StatsDelta::default();
        self.last_flush = kept.last_flush;
        self.take_prepared(kept);
    }

    /// Makes the relay of a finished request (parkable: nothing buffered, owed or
    /// counted) the relay for the same client's next one, in place: the per-request
    /// state reset, the lasting state (timeouts, clocks, prepared statements) kept.
    fn restart(&mut self) {
        // Every field named; those kept (`_`) are the lasting ones `refill` sets.
        let Relay {
            c2s: _,
            s2c: _,
            client_framer,
            server_framer,
            pending,
            unsynced,
            status,
            copy,
            mid,
            await_ready,
            terminated,
            desync,
            max_packet: _,
            no_simple_query: _,
            saw_ready,
            lead_ended,
            preloaded: _,
            timeouts: _,
            request_started,
            transaction_started,
            last_activity: _,
            last_read: _,
            stats: _,
            readies,
            xacts_done,
            prepared,
            last_flush: _,
            line_request: _,
            spare_input: _,
            server_preload: _,
            begin,
            begin_head,
        } = self;
        // Parkable: the buffers are empty, the stats flushed, nothing owed.
        *client_framer = Framer::default();
        *server_framer = Framer::default();
        *pending = 0;
        *unsynced = 0;
        *status = b'I';
        *copy = Default::default();
        *mid = Default::default();
        *await_ready = false;
        *terminated = false;
        *desync = false;
        *saw_ready = false;
        *lead_ended = false;
        *begin = Default::default();
        if begin_head.capacity() != 0 {
            *begin_head = BytesMut::new();
        }
        *request_started = None;
        *transaction_started = None;
        *readies = 0;
        *xacts_done = 0;
        if let Some(p) = prepared {
            p.restart();
        }
    }

    /// Gives the (empty) buffers of a resting relay back to the thread's pool, where
    /// the client's next read (or another client's) takes them.
    fn give_buffers(&mut self) {
        let input = self.prepared.as_mut().map(|p| &mut p.input);
        for b in [Some(&mut self.c2s), Some(&mut self.s2c), input]
            .into_iter()
            .flatten()
        {
            if b.capacity() != 0 {
                bufpool::give(std::mem::take(b));
            }
        }
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
        self.end_rest();
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

    #[test]
    fn a_resting_relay_serves_the_next_request_blank_and_parks_when_asked() {
        let mut slot = RelaySlot::new(Parked::new(1 << 20, Timeouts::default()));
        assert!(slot.between_requests(), "no relay before the first request");
        let r = slot.get();
        r.c2s = bufpool::take();
        r.preload(b"Q\0\0\0\x0dSELECT 1\0").expect("a whole Query");
        assert!(!slot.between_requests(), "a request is under way");
        // Served, but the server's answer left state a new request must not see.
        let r = slot.get();
        r.c2s.clear();
        r.pending = 0;
        r.readies = 2;
        r.xacts_done = 1;
        r.saw_ready = true;
        r.request_started = Some(Tick::now());
        let (relay_at, buf_at) = (r as *const Relay, r.c2s.as_ptr());
        slot.rest();
        assert!(slot.between_requests(), "a finished request rests");
        assert!(slot.parked().is_none(), "resting is not parked");
        // The next request gets the same relay and buffer, blank.
        let r = slot.get();
        assert_eq!(r as *const Relay, relay_at);
        assert_eq!(r.c2s.as_ptr(), buf_at);
        assert_eq!((r.readies, r.xacts_done, r.saw_ready), (0, 0, false));
        assert!(r.request_started.is_none());
        assert!(!slot.between_requests(), "taking the relay ends its rest");
        // Resting again, then put away (as when the client goes to sleep).
        slot.rest();
        slot.park();
        assert!(slot.parked().is_some() && slot.between_requests());
        // A relay with something left in it does not rest.
        let r = slot.get();
        r.preload(b"Q\0\0\0\x0dSELECT 1\0").expect("a whole Query");
        slot.rest();
        assert!(!slot.between_requests());
    }

    #[test]
    fn only_a_few_resting_relays_per_thread_keep_their_buffers() {
        let request = |slot: &mut RelaySlot| {
            let r = slot.get();
            r.c2s = bufpool::take();
            r.preload(b"Q\0\0\0\x0dSELECT 1\0").expect("a whole Query");
            r.c2s.clear();
            r.pending = 0;
        };
        let mut slots: Vec<RelaySlot> = (0..spare::HOLD + 2)
            .map(|_| RelaySlot::new(Parked::new(1 << 20, Timeouts::default())))
            .collect();
        for slot in &mut slots {
            request(slot);
            slot.rest();
            assert!(slot.between_requests());
        }
        let holds = |s: &RelaySlot| s.active.as_ref().is_some_and(|r| r.c2s.capacity() != 0);
        assert_eq!(
            slots.iter().filter(|s| holds(s)).count(),
            spare::HOLD as usize
        );
        // Relays taken up (and resting again) or gone make room for the next to hold.
        slots.truncate(1);
        request(&mut slots[0]);
        slots[0].rest();
        let mut more = RelaySlot::new(Parked::new(1 << 20, Timeouts::default()));
        request(&mut more);
        more.rest();
        assert!(
            holds(&more),
            "a resting relay keeps its buffer while few do"
        );
    }
}

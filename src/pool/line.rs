//! A pool's line of waiting clients, and how a place in it is answered.
//!
//! A place in line keeps the waiting task's waker; its answer (a connection, a slot,
//! or a refusal) is left for it in the pool's state, under the lock the releasing side
//! holds anyway, and the task is woken. This replaced a `oneshot` channel per wait,
//! whose allocation, reference counts and state changes cost more than the lock
//! (docs/performance.md, fourteenth round). A place that is given up (its [`Ticket`]
//! dropped) leaves the line at once, so every place in line is live and an answer is
//! never sent to a waiter that has gone.
//!
//! A waiter may leave its request with its place ([`Ticket::leave_request`]): the
//! releasing side then writes it to the connection it hands over before waking the
//! waiter, as PgBouncer does in the same callback, so the server is not idle while
//! the waiter's task waits its turn on the loop (docs/performance.md, seventeenth
//! round).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BytesMut};

use super::delegate::Delegate;
use super::{Grant, Pool, PoolState, ServerConn};
use crate::clock::Tick;
use crate::session::params::ParamSet;
use crate::stats::conns::ClientInfo;

/// A client waiting in line.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) since: Tick,
    waker: Waker,
    /// It was owed the `query_wait_notify` notice (once a wait).
    noticed: bool,
    /// Boxed (and the box kept by the client from one request to the next), so that
    /// a place in line, its ticket and the futures that hold one stay small: a
    /// ticket was 104 bytes, copied into three levels of a waiting client's task
    /// (docs/performance.md, twenty-second round).
    pub(super) request: Option<Box<Request>>,
}

/// A waiting client's request, ready for any server whose tracked parameters match
/// `params`: client bytes exactly as the relay would write them.
#[derive(Debug)]
pub struct Request {
    pub bytes: BytesMut,
    pub params: Arc<ParamSet>,
    /// The waiting client's console entry: linked to the server as soon as its
    /// request is there, so a cancel request finds the backend at once.
    pub client: Arc<ClientInfo>,
    /// Some of `bytes` went to the server: the connection is no longer clean.
    pub sent: bool,
    /// When the connection was handed over, if the waiter was left asleep until the
    /// server answers (`Waiter::wake_on_answer`): its wait ended then, not when
    /// its task runs.
    pub granted: Option<Tick>,
    /// The client sent more after leaving the request ([`Pool::more_input`]): its
    /// task has bytes of its own to send, so it must be woken at the hand-over.
    pub more: bool,
    /// The waiter's relay keeps a clock while the server works (`query_timeout`,
    /// `transaction_timeout`): its task must be woken at the hand-over to keep it,
    /// not left asleep until an answer that may be late.
    pub timed: bool,
    /// When the request reaches `query_timeout`: with a delegate relaying the answer,
    /// a timed task may sleep through the hand-over until then, its timer set for it
    /// (session/run/watch.rs).
    pub deadline: Option<Tick>,
    /// Relays the answer for the waiter (delegate.rs), kept for the client's next
    /// requests; used for this one when `delegate_ok`.
    pub delegate: Option<Arc<Delegate>>,
    pub delegate_ok: bool,
    /// The waiter's task, woken when the delegate cannot finish.
    pub task: Option<Waker>,
    /// Server bytes the delegate read but could not relay: the waiter's relay takes
    /// them as its first server read.
    pub answer: BytesMut,
    /// Answer bytes the client's socket did not take: owed by the waiter.
    pub owed: BytesMut,
    /// Wakes the delegate when the gathering window of a part-gathered answer ends,
    /// so that the part goes on though the rest is slow to come (delegate.rs).
    pub gather_end: Option<crate::timer::Sleep>,
    /// How this request and the client's last one stand for pipelining (pipeline.rs).
    pub(super) behind: super::pipeline::Behind,
    /// The prepared statements the request binds, rewritten to their server names
    /// before its server was known: it is written only to a server that has them.
    pub needs: Vec<Arc<crate::prepared::Statement>>,
}

impl Request {
    /// A request for the line, in a box the client keeps for its next ones.
    pub fn new(bytes: BytesMut, params: Arc<ParamSet>, client: Arc<ClientInfo>) -> Box<Request> {
        Box::new(Request {
            bytes,
            params,
            client,
            sent: false,
            granted: None,
            more: false,
            timed: false,
            deadline: None,
            delegate: None,
            delegate_ok: false,
            task: None,
            answer: BytesMut::new(),
            owed: BytesMut::new(),
            gather_end: None,
            behind: Default::default(),
            needs: Vec::new(),
        })
    }

    /// Whether the client's relay follows answers with its prepared-statement tracker,
    /// which may rewrite them: then no other request goes behind this one
    /// (pipeline.rs).
    pub fn set_tracked(&mut self, tracked: bool) {
        self.behind.tracked = tracked;
    }

    /// Writes the request, behind another's, to `conn` without linking its client
    /// (pipeline.rs); what is not written stays, as in [`Request::send_on`].
    pub(super) fn write_behind(&mut self, conn: &mut ServerConn) {
        while !self.bytes.is_empty() {
            match conn.stream.try_write(&self.bytes) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    self.sent = true;
                    self.bytes.advance(n);
                }
            }
        }
    }

    /// Writes as much of the request to `conn` as it takes without waiting, if the
    /// server's parameters match. What is not written stays, for the relay; a write
    /// error leaves the bytes too, for the relay to meet.
    pub(super) fn send_on(&mut self, conn: &mut ServerConn) {
        if !crate::session::params::matches(&self.params, conn) {
            return;
        }
        if !self.sent && !self.needs.iter().all(|s| conn.prepared.touch(s)) {
            // Left for the waiter's relay, which prepares what the server lacks.
            return;
        }
        if !self.sent {
            self.behind.select = self.delegate_ok
                && ((!self.behind.tracked && super::pipeline::one_select(&self.bytes))
                    || super::pipeline::prepared_select(self));
        }
        while !self.bytes.is_empty() {
            match conn.stream.try_write(&self.bytes) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if !self.sent {
                        self.sent = true;
                        self.client.link(&conn.ident, conn.prepared.len() as u32);
                    }
                    if n == self.bytes.len() {
                        self.bytes.clear();
                    } else {
                        self.bytes.advance(n);
                    }
                }
            }
        }
    }
}

/// How a place in line ends.
#[derive(Debug)]
pub(super) enum Answer {
    Granted(Grant),
    /// Taken out of line: the pool closed, or the wait reached query_wait_timeout.
    Refused,
    /// The server's answer was relayed for the waiter and the server given back
    /// (delegate.rs), at this time and of this many bytes: the waiter only folds in
    /// its counts.
    Served(Tick, u32),
    /// The request went to a server behind another client's (pipeline.rs): the place
    /// waits on, out of line, until the server gets to it.
    Behind,
    /// The server the request went to behind another's closed first.
    Lost,
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
    /// The request left with the place, back with the answer.
    request: Option<Box<Request>>,
}

/// Takes a place at the end of the line for the task of `waker`.
pub(super) fn join(pool: &Arc<Pool>, st: &mut PoolState, now: Tick, waker: &Waker) -> Ticket {
    let id = st.next_waiter;
    st.next_waiter += 1;
    st.waiters.push_back(Waiter {
        id,
        since: now,
        waker: waker.clone(),
        noticed: false,
        request: None,
    });
    Ticket {
        pool: pool.clone(),
        id,
        since: now,
        answered: false,
        request: None,
    }
}

impl Waiter {
    /// Marks the waiter as owed the `query_wait_notify` notice; false if it was
    /// already (once a wait).
    pub(super) fn owe_notice(&mut self) -> bool {
        !std::mem::replace(&mut self.noticed, true)
    }

    /// The waiting task's waker.
    pub(super) fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// After its whole request went to `conn`, the waiter has nothing to do until the
    /// server answers: its task is left asleep, and the server's answer wakes it
    /// (the socket's read waker becomes the waiter's), which saves the task one turn
    /// per transaction when every server is busy. False, and nothing changed, unless
    /// the request was all written and the server has not answered yet.
    pub(super) fn wake_on_answer(&mut self, conn: &ServerConn, now: Tick) -> bool {
        let Some(r) = self.request.as_mut() else {
            return false;
        };
        if !r.sent || !r.bytes.is_empty() || r.more {
            return false;
        }
        // A clock runs: the task keeps it, awake, unless a delegate relays the answer
        // and the task's timer wakes it at the deadline, not yet reached.
        if r.timed && !(r.delegate_ok && r.deadline.is_some_and(|d| now < d)) {
            return false;
        }
        let waker = match (&r.delegate, r.delegate_ok) {
            (Some(d), true) => {
                d.id.store(self.id, std::sync::atomic::Ordering::Relaxed);
                if !r.task.as_ref().is_some_and(|t| t.will_wake(&self.waker)) {
                    r.task = Some(self.waker.clone());
                }
                Waker::from(d.clone())
            }
            _ => self.waker.clone(),
        };
        let mut cx = Context::from_waker(&waker);
        if conn.stream.poll_read_ready(&mut cx).is_ready() {
            return false;
        }
        r.granted = Some(now);
        true
    }

    /// A place back at the head of the line, for a request written behind another's
    /// on a server that closed before any of its answer came (pipeline.rs).
    pub(super) fn again(id: u64, waker: Waker, request: Option<Box<Request>>) -> Waiter {
        Waiter {
            id,
            since: Tick::now(),
            waker,
            noticed: false,
            request,
        }
    }

    /// Its place number, waker and request, its notice (if owed) dropped: for a
    /// waiter taken out of line whose place lives on elsewhere (pipeline.rs).
    pub(super) fn into_parts(self, st: &mut PoolState) -> (u64, Waker, Option<Box<Request>>) {
        take_notice(st, self.id);
        (self.id, self.waker, self.request)
    }

    /// Leaves `answer` for this waiter (taken out of line) in the pool's state: the
    /// waker to wake once the lock is released.
    pub(super) fn answer(self, st: &mut PoolState, answer: Answer) -> Waker {
        // A notice not yet sent is moot once the wait is over.
        take_notice(st, self.id);
        st.answers.push((self.id, answer, self.request));
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

/// Takes place `id`'s notice if it is owed one.
fn take_notice(st: &mut PoolState, id: u64) -> bool {
    // Empty but for a moment every few seconds: the search costs a length check.
    let found = st.notices.iter().position(|n| *n == id);
    if let Some(i) = found {
        st.notices.swap_remove(i);
    }
    found.is_some()
}

impl Ticket {
    /// The answer, once there is one; meanwhile `on_notice` is called when the
    /// janitor finds the wait has reached `query_wait_notify`.
    pub(super) fn poll_answer(&mut self, on_notice: &mut impl FnMut()) -> Poll<Answer> {
        // The waker was kept when the place was taken: a wait never moves to
        // another task (it is awaited where it was taken).
        let mut st = self.pool.lock_state();
        let notice = take_notice(&mut st, self.id);
        let mine = |(id, a, _): &(u64, Answer, _)| *id == self.id && !matches!(a, Answer::Behind);
        match st.answers.iter().position(mine) {
            Some(i) => {
                let (_, answer, request) = st.answers.swap_remove(i);
                self.answered = true;
                self.request = request;
                Poll::Ready(answer)
            }
            None => {
                drop(st);
                if notice {
                    on_notice();
                }
                Poll::Pending
            }
        }
    }

    /// Leaves the client's request with its place, for the releasing side to write
    /// to the connection it hands over; given back if the place was answered
    /// meanwhile (another thread) or is gone.
    pub fn leave_request(&mut self, request: Box<Request>) -> Result<(), Box<Request>> {
        let mut st = self.pool.lock_state();
        // The newest place is at the back.
        match st.waiters.iter_mut().rev().find(|w| w.id == self.id) {
            Some(w) => {
                w.request = Some(request);
                Ok(())
            }
            None => Err(request),
        }
    }

    /// The request left with the place, once answered: what of it was not written.
    pub fn take_request(&mut self) -> Option<Box<Request>> {
        self.request.take()
    }

    /// The place's number in its pool's line, for [`Pool::more_input`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits for the answer; `on_notice` as in [`Ticket::poll_answer`].
    pub(super) async fn answer(&mut self, mut on_notice: impl FnMut()) -> Answer {
        std::future::poll_fn(|_| self.poll_answer(&mut on_notice)).await
    }

    /// Leaves the line if still in it, under the pool's lock held as `st`; true if it
    /// was (false: answered meanwhile, or taken out).
    pub(super) fn leave(&mut self, st: &mut PoolState) -> bool {
        let Some(w) = leave(st, self.id) else {
            return false;
        };
        self.answered = true;
        self.request = w.request;
        true
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let answer = {
            let mut st = self.pool.lock_state();
            if leave(&mut st, self.id).is_some() {
                return;
            }
            match st.answers.iter().position(|(id, ..)| *id == self.id) {
                Some(i) => {
                    // The server has another client's request behind this one's
                    // answer: its delegate reads that answer and drops it instead
                    // (pipeline.rs).
                    if super::pipeline::drain_for_behind(&mut st.answers[i]) {
                        return;
                    }
                    let (_, answer, request) = st.answers.swap_remove(i);
                    (answer, request)
                }
                None => return,
            }
        };
        // Answered, but the waiter is gone (its client left, say): a connection goes
        // back as it came (clean, never used by this client), a slot to the next
        // waiter as its token drops. A connection its request was written to is
        // closed: the answer to it is on the way, and nobody would read it.
        let (answer, request) = answer;
        if let Answer::Granted(Grant::Server(conn) | Grant::Check(conn)) = answer {
            let clean = !request.is_some_and(|r| r.sent);
            self.pool.release(conn, clean);
        }
    }
}

impl Pool {
    /// The client at place `id` read more bytes after leaving its request there:
    /// whoever answers the place must wake it, since the server cannot answer before
    /// those bytes are sent too (the rest of a long message, say). Nothing to do
    /// once the place was answered: the client's task runs then anyway.
    pub fn more_input(&self, id: u64) {
        let mut st = self.lock_state();
        let place = st.waiters.iter_mut().rev().find(|w| w.id == id);
        if let Some(r) = place.and_then(|w| w.request.as_mut()) {
            r.more = true;
            return;
        }
        // Written behind another client's request: woken when the server gets to it.
        let behind = st
            .answers
            .iter_mut()
            .find(|(i, a, _)| *i == id && matches!(a, Answer::Behind));
        if let Some(r) = behind.and_then(|(_, _, r)| r.as_mut()) {
            r.more = true;
        }
    }
}

/// Takes place `id` out of line if it is still there.
fn leave(st: &mut PoolState, id: u64) -> Option<Waiter> {
    let pos = st.waiters.iter().position(|w| w.id == id)?;
    take_notice(st, id);
    st.waiters.remove(pos)
}

#[cfg(test)]
#[path = "line_tests.rs"]
mod tests;

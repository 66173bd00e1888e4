//! Requests of two or three clients in flight on one server.
//!
//! A backend that has answered a request finds no next one: the pooler must first read
//! the answer and write the next waiter's request, so behind any pooler every backend
//! sleeps and is woken once per transaction. Finding the next request already there
//! spares PostgreSQL a quarter to a third of its work per query, and the pooler a read
//! (docs/performance/rounds-60-79.md, sixty-first round).
//!
//! So when the hand-over gives a server a request of one `SELECT` ([`one_select`]: a
//! simple Query, or an extended-protocol run that parses it as the unnamed statement),
//! which cannot open a transaction block (the server is idle after it, errors
//! included), the request of the next client in line is written right behind it if it
//! is such a request too or a plain `BEGIN`, and the one after that behind the second
//! if the second is a `SELECT` (at most two wait behind the one a server works on).
//! The same goes behind a client's own request that ends the transaction it holds the
//! server in ([`ends_transaction`], written by its relay: `Pool::send_behind_end`),
//! so that a line of transactions finds each `BEGIN` behind the last `COMMIT`. Its
//! place leaves the line and waits as [`Answer::Behind`]; the server's answers are split at the first one's
//! ReadyForQuery (by its delegate, or by its relay, which keeps the rest in
//! `ServerState::ahead`), and its release goes on to the second client
//! ([`Pool::advance`]) instead of the line. Only behind a client whose last answer
//! came within [`QUICK`] of its request, so that a slow query holds nobody up; not
//! while a cancel is on its way to the server; and only where a delegate relays both
//! answers (transaction pooling, one event loop, plaintext, no timeout that needs the
//! relay's clock), and from clients whose relays do not follow answers with the
//! prepared-statement tracker, but for one `SELECT` of a prepared statement the
//! server holds, rewritten while its client waited ([`prepared_select`]: its
//! statement's server name is its own whatever ran before it, and the relay cuts
//! its answer before the tracker sees the next one's). Prepared statements other
//! clients left on the server do not matter: no request that goes behind or leads
//! can drop them.
//!
//! What could reach the second client that is not its own:
//! - a cancel aimed at the first client's query that lands after it ended: a backend
//!   drops a cancel that comes between two queries, but with the next request already
//!   there is no such gap. The second client's answer is then checked, and if it was
//!   canceled its request is written again (a canceled `SELECT` committed nothing);
//! - the first client vanishing mid-answer: its answer is read to its end and dropped
//!   (`Session::drain_for_behind`), not the server closed;
//! - the server failing: the second client gets the error of a server lost mid-query
//!   ([`Answer::Lost`]).

use std::sync::atomic::Ordering;
use std::task::Waker;

use bytes::BytesMut;

use super::line::{Answer, Request, Waiter};
use super::txn_text::{begin_of, end_tag, Modes};
use super::{Grant, Pool, PoolState, ServerConn};
use crate::clock::Tick;
use crate::protocol::header::{
    TAG_BIND, TAG_DESCRIBE, TAG_ERROR_RESPONSE, TAG_EXECUTE, TAG_FLUSH, TAG_PARSE, TAG_QUERY,
    TAG_SYNC,
};

/// How quickly a client's last answer must have come (from its request written to the
/// answer read) for another client's request to be written behind its next one.
pub(super) const QUICK: std::time::Duration = std::time::Duration::from_millis(1);

/// The longest request written behind another (a copy is kept for writing it again).
const MAX_BEHIND: usize = 2048;

// Up to two requests wait behind the one a server works on (`ServerState::behind` and
// `behind_next`): at 256 clients a third in flight took tps up by a fifth over two
// (docs/performance/rounds-60-79.md, sixty-second round), as it did in floor.

/// A request's standing for pipelining, kept in its box from one request to the next.
#[derive(Debug, Default)]
pub struct Behind {
    /// The request is one simple Query of one `SELECT` (set when it is first written).
    pub(super) select: bool,
    /// The client's relay follows answers with its prepared-statement tracker.
    pub(super) tracked: bool,
    /// The client's last answer came within [`QUICK`].
    pub(super) quick: bool,
    /// Written behind another: a copy, to write again if a cancel aimed at the one
    /// before canceled it.
    resend: BytesMut,
    /// The server's count of cancels aimed at it when this one was written behind,
    /// and again when its turn came (from then on, any is its own client's).
    aimed: u32,
    /// A cancel was aimed at the server while this request waited behind: its answer
    /// is checked for a cancel that was not its own.
    pub(super) exposed: bool,
    /// Its client left while its delegate waited for its answer with another
    /// request behind it, or while it waited behind another: the answer is read and
    /// dropped, touching no client socket.
    pub(super) gone: bool,
}

/// Place `entry`'s client is leaving: if its answer is on its way from a server with
/// another request behind it, and its delegate waits for it, or if its request was
/// written behind another's, the place stays for the delegate to read that answer
/// and drop it (true); the server then goes on to the request behind, which closing
/// it would fail.
pub(super) fn drain_for_behind(entry: &mut (u64, Answer, Option<Box<Request>>)) -> bool {
    let (r, waits) = match entry {
        (_, Answer::Granted(Grant::Server(conn)), Some(r)) => {
            let waits = conn.behind.is_some() && r.task.is_some();
            (r, waits)
        }
        (_, Answer::Behind, Some(r)) => {
            let waits = r.task.is_some();
            (r, waits)
        }
        _ => return false,
    };
    if !waits || !r.delegate_ok || r.delegate.is_none() {
        return false;
    }
    r.behind.gone = true;
    r.task = None;
    true
}

/// Whether `req` is one whole request of one `SELECT` alone, which cannot leave a
/// transaction block open: a simple Query ([`simple_select`]), or an extended-protocol
/// batch that parses it as the unnamed statement and runs it ([`extended_select`]).
/// (A request is only ever left out, never taken wrongly.)
pub(super) fn one_select(req: &[u8]) -> bool {
    match req.first() {
        Some(&TAG_QUERY) => simple_select(req),
        Some(&TAG_PARSE) => extended_select(req),
        _ => false,
    }
}

/// Whether `text` (a query, without its NUL) holds one statement that starts with
/// `SELECT` and does not name `set_config`, which would change the session's
/// parameters under the request behind it (a function that does so is caught in
/// [`Pool::advance`]). A comment before it, or a `;` inside a literal, makes it not
/// one.
fn select_text(text: &[u8]) -> bool {
    let text = text.trim_ascii_start();
    let Some(word) = text.get(..7) else {
        return false;
    };
    if !word[..6].eq_ignore_ascii_case(b"select")
        || word[6].is_ascii_alphanumeric()
        || word[6] == b'_'
    {
        return false;
    }
    let alone = match memchr::memchr2(b';', 0, text) {
        None => true,
        Some(i) => text[i] == b';' && text[i + 1..].iter().all(u8::is_ascii_whitespace),
    };
    alone && !names_set_config(text)
}

/// Whether `text` holds `set_config`, in any case. (Looked for at its underscores:
/// a byte-by-byte look at every place was a tenth of the pooler's instructions per
/// `SELECT` transaction at 8 clients.)
fn names_set_config(text: &[u8]) -> bool {
    // (A text too short to hold it, as `SELECT 1`, is not handed to memchr at all.)
    text.len() >= 10
        && memchr::memchr_iter(b'_', text).any(|i| {
            i.checked_sub(3)
                .and_then(|at| text.get(at..at + 10))
                .is_some_and(|w| w.eq_ignore_ascii_case(b"set_config"))
        })
}

/// The text of `req` if it is one whole simple Query (without its NUL).
fn simple_text(req: &[u8]) -> Option<&[u8]> {
    let &[TAG_QUERY, a, b, c, d] = req.first_chunk::<5>()? else {
        return None;
    };
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if len < 5 || len + 1 != req.len() || req.last() != Some(&0) {
        return None;
    }
    Some(&req[5..req.len() - 1])
}

/// Whether `req` is one whole simple Query of one `SELECT` ([`select_text`]).
fn simple_select(req: &[u8]) -> bool {
    simple_text(req).is_some_and(select_text)
}

/// The text of `req` if it is one whole simple Query, bar spaces around it and one
/// `;` after it.
pub(super) fn alone_text(req: &[u8]) -> Option<&[u8]> {
    let text = simple_text(req)?.trim_ascii();
    Some(text.strip_suffix(b";").unwrap_or(text).trim_ascii_end())
}

/// Whether `req` is one simple Query of a plain `BEGIN`: it opens a transaction
/// whatever the request before it did, so it may go behind another.
fn simple_begin(req: &[u8]) -> bool {
    begin_of(req).is_some_and(|(_, modes)| modes == Modes::PLAIN)
}

/// Whether `req` is one simple Query that ends the transaction its client is in,
/// leaving the server idle whatever its outcome (a failed commit rolls back): a
/// request of another client may be written behind it (`Pool::send_behind_end`).
pub fn ends_transaction(req: &[u8]) -> bool {
    end_tag(req).is_some()
}

/// Whether `req` is whole messages making one extended-protocol run of one `SELECT`
/// ([`select_text`]): a Parse of the unnamed statement, a Bind of it to the unnamed
/// portal, an Execute of that portal, Describes and Flushes about them, and one Sync,
/// last. Its own Parse makes it run what its client asked for, whatever the request
/// before left as the unnamed statement; a request that binds a statement parsed
/// before (named, or unnamed in an earlier request) is left out.
fn extended_select(req: &[u8]) -> bool {
    let (mut parse, mut bind, mut execute) = (0, 0, 0);
    let mut at = 0;
    while let Some(&[tag, a, b, c, d]) = req.get(at..).and_then(|r| r.first_chunk::<5>()) {
        let end = at + 1 + u32::from_be_bytes([a, b, c, d]) as usize;
        let Some(body) = req.get(at + 5..end) else {
            return false;
        };
        let ok = match tag {
            // Statement name "", the query text, then its parameter types.
            TAG_PARSE => {
                parse += 1;
                let text = body.get(1..).unwrap_or_default();
                let nul = memchr::memchr(0, text);
                body.first() == Some(&0) && nul.is_some_and(|n| select_text(&text[..n]))
            }
            // Portal "", statement "".
            TAG_BIND => {
                bind += 1;
                body.starts_with(&[0, 0])
            }
            // Of the unnamed statement or portal.
            TAG_DESCRIBE => matches!(body, [b'S' | b'P', 0]),
            TAG_EXECUTE => {
                execute += 1;
                bind == 1 && body.first() == Some(&0)
            }
            TAG_FLUSH => true,
            TAG_SYNC => return end == req.len() && (parse, bind, execute) == (1, 1, 1),
            _ => false,
        };
        if !ok {
            return false;
        }
        at = end;
    }
    false
}

/// Whether another request may be written behind `r`, which the server was just
/// handed with: all of it written, to be answered by its delegate, a `SELECT`, from a
/// client whose last answer was quick.
pub(super) fn may_lead(r: &Request) -> bool {
    r.sent
        && r.bytes.is_empty()
        && r.delegate_ok
        && !r.more
        && !r.timed
        && r.behind.select
        && r.behind.quick
}

/// Writes the request of the first in line behind the one `conn` was just handed
/// with (see [`may_lead`]), if it is one that may go there; true if it was.
pub(super) fn send_behind(st: &mut PoolState, conn: &mut ServerConn, now: Tick) -> bool {
    if conn.behind_next.is_some() || conn.ident.cancels_pending() {
        return false;
    }
    // A third goes only behind a second whose client's last answer was quick too.
    if let Some(id) = conn.behind {
        let quick = st.answers.iter().any(|(i, a, r)| {
            *i == id
                && matches!(a, Answer::Behind)
                && r.as_ref()
                    .is_some_and(|r| r.behind.quick && r.behind.select && !r.behind.gone)
        });
        if !quick {
            return false;
        }
    }
    let fits = |r: &Request| {
        !r.sent
            && r.delegate_ok
            && r.delegate.is_some()
            && !r.more
            && !r.timed
            && r.bytes.len() <= MAX_BEHIND
            && crate::session::params::matches(&r.params, conn)
            && ((!r.behind.tracked && (one_select(&r.bytes) || simple_begin(&r.bytes)))
                || (prepared_select(r) && r.needs.iter().all(|s| conn.prepared.touch(s))))
    };
    if !st
        .waiters
        .front()
        .and_then(|w| w.request.as_deref())
        .is_some_and(fits)
    {
        return false;
    }
    let Some(w) = st.waiters.pop_front() else {
        return false;
    };
    let (id, waker, mut request) = w.into_parts(st);
    let Some(r) = request.as_mut() else {
        return false;
    };
    r.behind.resend.clear();
    r.behind.resend.extend_from_slice(&r.bytes);
    r.behind.aimed = conn.ident.aimed.load(Ordering::SeqCst);
    // (A `BEGIN` leaves the server in its transaction: nothing goes behind it.)
    r.behind.select = one_select(&r.bytes) || prepared_select(r);
    // Written without linking the client: it is linked when its turn comes, and a
    // cancel it sends meanwhile is dropped, as for a client waiting in line.
    r.write_behind(conn);
    if let Some(d) = &r.delegate {
        d.id.store(id, Ordering::Relaxed);
    }
    r.task = Some(waker);
    r.granted = Some(now);
    match conn.behind {
        None => conn.behind = Some(id),
        Some(_) => conn.behind_next = Some(id),
    }
    st.answers.push((id, Answer::Behind, request));
    true
}

/// Whether `answer` (whole messages) holds an ErrorResponse of SQLSTATE 57014, query
/// canceled.
pub(super) fn canceled(answer: &[u8]) -> bool {
    let mut at = 0;
    while let Some(&[tag, a, b, c, d]) = answer.get(at..).and_then(|r| r.first_chunk::<5>()) {
        let end = at + 1 + u32::from_be_bytes([a, b, c, d]) as usize;
        let Some(body) = answer.get(at + 5..end) else {
            return false;
        };
        // Fields: a type byte, then text to a NUL; the code is type `C`.
        if tag == TAG_ERROR_RESPONSE && body.split(|&b| b == 0).any(|field| field == b"C57014") {
            return true;
        }
        at = end;
    }
    false
}

impl Request {
    /// A request sent behind another whose answer was canceled by a cancel aimed at
    /// the one before: written again on `conn` (idle after that answer), once. False
    /// if it is not that case or the write did not all go.
    ///
    /// Not if its own client aimed a cancel at it since its turn came: that one may
    /// be what canceled it. (One cancel may cancel two requests in a row: PostgreSQL
    /// signals the backend's pid and then its process group. The server is held off
    /// until the cancel's connection closes, after both, so they land on requests
    /// written behind before the cancel came, each exposed, never on one written
    /// again.)
    pub(super) fn write_again(&mut self, conn: &mut ServerConn, answer: &[u8]) -> bool {
        if !std::mem::take(&mut self.behind.exposed) {
            return false;
        }
        let own = conn.ident.aimed.load(Ordering::SeqCst) != self.behind.aimed;
        if own || !canceled(answer) {
            return false;
        }
        let resend = std::mem::take(&mut self.behind.resend);
        let written = conn.stream.try_write(&resend).unwrap_or(0);
        if written > 0 && written < resend.len() {
            // Part of it is there: the server is not fit to lend again (and this
            // client gets the canceled answer it has).
            conn.close_needed = Some("idle server got dirty");
        }
        let all = written == resend.len();
        self.behind.resend = resend;
        all
    }
}

impl Pool {
    /// The client holding `conn` in a transaction has just written all of a request
    /// that ends it ([`ends_transaction`]): the request of the first in line is
    /// written behind it if it may go there, as behind a `SELECT` handed over.
    pub fn send_behind_end(&self, conn: &mut ServerConn) {
        // (Not where a reset follows each transaction: it would go behind too. Nor
        // after a reported parameter changed since the client was linked, which
        // forgets the match: a `SET LOCAL` the commit undoes would change it under
        // the request behind, which `advance` then fails.)
        if conn.behind.is_some()
            || conn.params.matched.is_none()
            || self.config().server_reset_query_always
        {
            return;
        }
        let mut st = self.lock_state();
        // (Nor where every reuse is checked first, `server_check_delay = 0`: the
        // next client's request would go before the check.)
        if st.reuse.check && st.reuse.check_delay.is_zero() {
            return;
        }
        let now = Tick::now();
        // (Nor onto a server that will close once idle: from before a reload, past
        // its lifetime.)
        if super::closing::release_close_reason(conn, true, &st, now).is_some() {
            return;
        }
        while send_behind(&mut st, conn, now) {
            self.stats.count_pipelined();
        }
    }

    /// `conn`'s answer to the request before is done, and the request written behind
    /// it is next: its place gets the server, with what came of its answer already
    /// (`ahead`). The waker to wake once the lock is released: its delegate's, or its
    /// task's if the client sent more meanwhile (its relay takes over, as at any
    /// hand-over). `Err`: its client left, and the server, with an answer on its way
    /// that is nobody's, is to be closed as a vanished client's is.
    pub(super) fn advance(
        &self,
        st: &mut PoolState,
        mut conn: ServerConn,
        now: Tick,
    ) -> Result<Option<Waker>, ServerConn> {
        let Some(id) = conn.behind.take() else {
            return Err(conn);
        };
        conn.behind = conn.behind_next.take();
        let Some(i) = st
            .answers
            .iter()
            .position(|(i, a, _)| *i == id && matches!(a, Answer::Behind))
        else {
            return Err(conn);
        };
        let (_, _, mut request) = st.answers.swap_remove(i);
        let aimed = conn.ident.aimed.load(Ordering::SeqCst);
        let ahead = std::mem::take(&mut conn.ahead);
        let mut wake = None;
        if let Some(r) = request.as_mut() {
            // The answer before changed a parameter this client's request was written
            // for (a function's `set_config`): what it ran with is not what it asked
            // for. It fails as on a lost server, and the server closes under it.
            if !crate::session::params::matches(&r.params, &mut conn) {
                let task = r.task.take();
                st.answers.push((id, Answer::Lost, request));
                if let Some(t) = task {
                    t.wake();
                }
                return Err(conn);
            }
            r.behind.exposed = aimed != r.behind.aimed;
            r.behind.aimed = aimed;
            r.granted = Some(now);
            // (A client gone meanwhile is not linked: its delegate drops the answer.)
            if !r.behind.gone {
                r.client.link(&conn.ident, conn.prepared.len() as u32);
            }
            if !ahead.is_empty() {
                super::delegate::start_gathering(r, &ahead);
            }
            // (What the socket did not take when it was written behind goes now.)
            r.write_behind(&mut conn);
            if r.behind.gone && !r.bytes.is_empty() {
                // Nobody to write the rest: the server, half a request in, closes.
                return Err(conn);
            }
            wake = match (r.more || !r.bytes.is_empty(), &r.delegate) {
                (false, Some(d)) => {
                    // (Not onto a server that would not be lent again: from before a
                    // reload, past its lifetime.)
                    let fit = super::closing::release_close_reason(&conn, true, st, now).is_none();
                    if fit && may_lead(r) {
                        while send_behind(st, &mut conn, now) {
                            self.stats.count_pipelined();
                        }
                    }
                    Some(Waker::from(d.clone()))
                }
                _ => r.task.take(),
            };
        }
        conn.ahead = ahead;
        conn.ahead.clear();
        st.answers
            .push((id, Answer::Granted(Grant::Server(conn)), request));
        Ok(wake)
    }

    /// The server that place `id`'s request was written to (behind another's)
    /// closed. If none of an answer came (`answered` false), the request ran to no
    /// effect the server kept, or did not run: it goes back to the head of the line,
    /// unsent, and the slot the server frees is its. Otherwise its client gets the
    /// error of a server lost mid-query ([`Answer::Lost`]).
    pub(super) fn lose_behind(&self, id: u64, answered: bool) {
        let mut st = self.lock_state();
        let Some(i) = st
            .answers
            .iter()
            .position(|(i, a, _)| *i == id && matches!(a, Answer::Behind))
        else {
            return;
        };
        // Its client left meanwhile: nobody to answer.
        if st.answers[i].2.as_ref().is_some_and(|r| r.behind.gone) {
            st.answers.swap_remove(i);
            return;
        }
        let again = !answered && st.answers[i].2.as_ref().is_some_and(|r| r.task.is_some());
        if again {
            let (_, _, mut request) = st.answers.swap_remove(i);
            if let Some(r) = request.as_mut() {
                r.bytes.clear();
                r.bytes.extend_from_slice(&r.behind.resend);
                (r.sent, r.granted, r.behind.exposed) = (false, None, false);
                if let Some(t) = r.task.take() {
                    st.waiters.push_front(Waiter::again(id, t, request));
                }
            }
            return;
        }
        let (_, a, r) = &mut st.answers[i];
        *a = Answer::Lost;
        let task = r.as_mut().and_then(|r| r.task.take());
        drop(st);
        if let Some(t) = task {
            t.wake();
        }
    }
}

mod prepared;
pub(super) use prepared::prepared_select;

#[cfg(test)]
mod tests;

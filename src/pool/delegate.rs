//! Relaying a waiting client's answer without running its task.
//!
//! With many clients and few servers, a client's request usually waits in line and
//! is written to a server by the client that releases it (line.rs). Its task then
//! slept until the answer came, ran to relay it and give the server back, and ran
//! again after a yield: two or three runs per transaction, each walking the client's
//! own state, which is out of the caches by its turn (docs/performance.md,
//! forty-eighth round). For a request that is one simple Query or one
//! extended-protocol batch ending in its only Sync, in transaction pooling on a
//! single event loop, a [`Delegate`] takes the task's place on the
//! server's read readiness: when the answer comes, it reads it (gathering an answer
//! that comes in several reads, up to `MAX_GATHERED` and for `GATHER_WINDOW_US`
//! after its first part, unless a notice came with that; a part gathered is handed
//! on when the window ends, though no more came), and if it is whole
//! messages ending in ReadyForQuery `I` with nothing the relay must see (no
//! ParameterStatus, no COPY, no DEALLOCATE ALL or DISCARD ALL), it marks the place
//! served, gives the server back (the next waiter's request goes out first) and
//! writes the answer to the client's socket. The waiter's task then runs once per
//! transaction, at its next request, and folds in the counts (`Answer::Served`).
//! Anything else goes to the waiter's task as before: the bytes read become its
//! relay's first server read, the rest of a short write to the client is owed by it,
//! and a server that failed is met by its relay.

use std::future::Future;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, Weak};
use std::task::{Context, Waker};

use super::line::Answer;
use super::{Grant, Pool, PoolState};
use crate::clock::Tick;
use crate::prepared::responses::clears_all;

/// The most a delegate reads at once: what the relay reads at once (one buffer per
/// thread), so that an answer PostgreSQL wrote in two pieces of its 8 KB send buffer
/// is read in one.
const READ_SIZE: usize = crate::net::bufpool::BUF_SIZE;

/// The most a delegate gathers of an answer that comes in several reads before it
/// hands it to the waiter's relay, which reads on from there.
const MAX_GATHERED: usize = 4 * READ_SIZE;

/// How long the first part of an answer that comes in several reads may wait for the
/// rest (microseconds). The parts of a quick query's answer come within it, even on a
/// loaded machine; what has come of a slow one then goes to the waiter's relay
/// (woken by the request's `gather_end` timer if nothing more came), which passes
/// on the rest as it comes.
const GATHER_WINDOW_US: u64 = 10_000;

/// Starts gathering the answer to `r` with `part`, its first read: the window opens.
pub(super) fn start_gathering(r: &mut super::Request, part: &[u8]) {
    r.answer.extend_from_slice(part);
    let end = Tick::now() + std::time::Duration::from_micros(GATHER_WINDOW_US);
    match r.gather_end.as_mut() {
        Some(t) => t.reset(end),
        None => r.gather_end = Some(crate::timer::sleep_until(end)),
    }
}

/// Whether the answer gathered for `r` may wait for more: its window is open.
fn may_gather(r: &super::Request) -> bool {
    r.gather_end.as_ref().is_some_and(|t| !t.passed())
}

/// Leaves the request's timer to wake the delegate (`cx`) when the gathering window
/// ends. False if it has ended already.
fn arm_gather_end(r: &mut super::Request, cx: &mut Context<'_>) -> bool {
    r.gather_end
        .as_mut()
        .is_some_and(|t| std::pin::Pin::new(t).poll(cx).is_pending())
}

/// The waker a waiting client leaves on the server its request was written to, in
/// place of its task's. One per client, kept in its request box between requests.
#[derive(Debug)]
pub struct Delegate {
    pub pool: Weak<Pool>,
    /// The place in line it answers for now.
    pub id: AtomicU64,
    /// The client's socket (plaintext only).
    pub fd: RawFd,
}

impl std::task::Wake for Delegate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(p) = self.pool.upgrade() {
            p.delegate_answer(self);
        }
    }
}

/// How far the bytes read of an answer go.
#[derive(Debug, PartialEq, Eq)]
enum Answered {
    /// Whole messages ending in ReadyForQuery `I`: the delegate relays them.
    Whole,
    /// Whole messages, none the relay must see, then perhaps part of one: more to
    /// read.
    Partial,
    /// Something the relay must see (a ParameterStatus, COPY, a DEALLOCATE ALL or
    /// DISCARD ALL, which the prepared-statement tracking must see on both sides, a
    /// transaction left open, bytes after the ReadyForQuery, a bad length, a stale
    /// plan or lost statement of a request that binds prepared statements), or an unfinished answer with a
    /// notice in it, which the relay passes on at once.
    Other,
}

#[cfg(test)]
fn answered(b: &[u8]) -> Answered {
    answered_at(b, false, false).0
}

/// Whether an ErrorResponse's `body` is one the prepared-statement tracker mends: a
/// stale plan (0A000) or a statement the server lost (26000). Any other error of a
/// request that binds prepared statements changes nothing the tracker keeps (and a
/// canceled one may be another client's cancel, which the delegate sees to).
fn mendable(body: &[u8]) -> bool {
    body.split(|&b| b == 0)
        .any(|field| field == b"C0A000" || field == b"C26000")
}

/// As [`answered`], with where the answer ends: with `behind` (another request was
/// written behind this one, pipeline.rs), bytes after the ReadyForQuery `I` are the
/// next answer's, and the answer is whole up to there. With `errors_to_relay` (a
/// request that binds prepared statements), an error the tracker mends is for the
/// relay too ([`mendable`]).
fn answered_at(b: &[u8], behind: bool, errors_to_relay: bool) -> (Answered, usize) {
    let mut at = 0;
    // A notice (or notification) in an answer not yet whole: PostgreSQL sent it at
    // once (a long function's progress, say), so it is not held back for the rest.
    let mut noticed = false;
    let partial = |noticed| {
        if noticed {
            (Answered::Other, 0)
        } else {
            (Answered::Partial, 0)
        }
    };
    // (A header as an array: one bounds check per message, not five.)
    while let Some(&[tag, l0, l1, l2, l3]) = b.get(at..).and_then(|r| r.first_chunk::<5>()) {
        let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
        if len < 4 || matches!(tag, b'S' | b'G' | b'H' | b'W') {
            return (Answered::Other, 0);
        }
        noticed |= matches!(tag, b'N' | b'A');
        let end = at + 1 + len;
        let Some(body) = b.get(at + 5..end) else {
            // Part of a message: its body is looked at when it is whole.
            return partial(noticed);
        };
        if errors_to_relay && tag == b'E' && mendable(body) {
            return (Answered::Other, 0);
        }
        // ("DISCARD ALL\0" and "DEALLOCATE ALL\0": the length tells most apart.)
        if tag == b'C' && matches!(len, 16 | 19) && clears_all(body) {
            return (Answered::Other, 0);
        }
        if tag == b'Z' {
            // One request, one ReadyForQuery: the last message (or the last of this
            // answer), of its one status byte, `I`.
            let idle = (end == b.len() || behind) && body == b"I";
            return if idle {
                (Answered::Whole, end)
            } else {
                (Answered::Other, 0)
            };
        }
        at = end;
    }
    partial(noticed)
}

/// Whether `b` is whole messages ending in ReadyForQuery `I`, with nothing the relay
/// must see.
#[cfg(test)]
fn whole_idle_answer(b: &[u8]) -> bool {
    answered(b) == Answered::Whole
}

impl Pool {
    /// Run by the server's read readiness (see the module's comment).
    fn delegate_answer(&self, d: &Arc<Delegate>) {
        thread_local! {
            static BUF: std::cell::RefCell<Box<[u8; READ_SIZE]>> =
                std::cell::RefCell::new(Box::new([0; READ_SIZE]));
        }
        thread_local! {
            /// Delegates woken while one runs (the next request's, pipeline.rs): run
            /// after it, with the buffer free.
            static LATER: std::cell::RefCell<Vec<Arc<Delegate>>> =
                const { std::cell::RefCell::new(Vec::new()) };
        }
        let ran = BUF.with(|b| {
            let Ok(mut buf) = b.try_borrow_mut() else {
                return false;
            };
            let st = self.lock_state();
            self.delegate_relay(d, st, d.id.load(Ordering::Relaxed), &mut buf);
            while let Some(next) = LATER.with_borrow_mut(Vec::pop) {
                if let Some(p) = next.pool.upgrade() {
                    let st = p.lock_state();
                    p.delegate_relay(&next, st, next.id.load(Ordering::Relaxed), &mut buf);
                }
            }
            true
        });
        if !ran {
            LATER.with_borrow_mut(|l| l.push(d.clone()));
        }
    }

    fn delegate_relay(
        &self,
        d: &Arc<Delegate>,
        mut st: MutexGuard<'_, PoolState>,
        id: u64,
        buf: &mut [u8; READ_SIZE],
    ) {
        // Gone (its client left, or its task took the server first): nothing to do.
        let Some(i) = st
            .answers
            .iter()
            .position(|(wid, a, _)| *wid == id && matches!(a, Answer::Granted(Grant::Server(_))))
        else {
            return;
        };
        let (wid, answer, mut request) = st.answers.swap_remove(i);
        let Answer::Granted(Grant::Server(mut conn)) = answer else {
            return;
        };
        let behind = conn.behind.is_some();
        // A request that binds prepared statements: an error may say the server
        // lacks one or its plan went stale, which the relay's tracker mends.
        let strict = request.as_deref().is_some_and(|r| !r.needs.is_empty());
        // What came of this answer with the one before it (pipeline.rs) may be whole,
        // or already something for the relay.
        let mut end = 0;
        match request
            .as_deref()
            .filter(|r| !r.answer.is_empty())
            .map(|r| answered_at(&r.answer, behind, strict))
        {
            Some((Answered::Whole, e)) => end = e,
            Some((Answered::Other, _)) => return hand_back(st, wid, conn, request),
            _ => {}
        }
        let n = if end > 0 {
            0
        } else {
            loop {
                match conn.stream.try_read(&mut buf[..]) {
                    Ok(n) if n > 0 => {
                        // Most answers come in one read, relayed from `buf`; one in several
                        // is gathered with the request (a delegate always has one).
                        let (state, e) = match request.as_mut().filter(|r| !r.answer.is_empty()) {
                            Some(r) => {
                                r.answer.extend_from_slice(&buf[..n]);
                                answered_at(&r.answer, behind, strict)
                            }
                            None => {
                                let (state, e) = answered_at(&buf[..n], behind, strict);
                                if state != Answered::Whole {
                                    if let Some(r) = request.as_mut() {
                                        start_gathering(r, &buf[..n]);
                                    }
                                }
                                (state, e)
                            }
                        };
                        match state {
                            Answered::Whole => {
                                end = e;
                                break n;
                            }
                            Answered::Partial
                                if request.as_deref().is_some_and(|r| {
                                    r.answer.len() < MAX_GATHERED && may_gather(r)
                                }) =>
                            {
                                continue
                            }
                            // Not for the delegate: the waiter's relay takes the bytes read.
                            _ => return hand_back(st, wid, conn, request),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Part of the answer gathered: it waits for the rest only until its
                        // window ends (woken then by `gather_end`), then goes on by the
                        // waiter's relay, which passes on the rest as it comes.
                        let gathered = request.as_deref().filter(|r| !r.answer.is_empty());
                        if gathered.is_some_and(|r| !may_gather(r)) {
                            return hand_back(st, wid, conn, request);
                        }
                        let gathering = gathered.is_some();
                        let w = Waker::from(d.clone());
                        let mut cx = Context::from_waker(&w);
                        if conn.stream.poll_read_ready(&mut cx).is_pending() {
                            let armed = match request.as_mut().filter(|_| gathering) {
                                Some(r) => arm_gather_end(r, &mut cx),
                                None => true,
                            };
                            if !armed {
                                // (Ended since the look above: the readiness may still wake
                                // the delegate, which finds the place gone or taken on.)
                                return hand_back(st, wid, conn, request);
                            }
                            st.answers
                                .push((wid, Answer::Granted(Grant::Server(conn)), request));
                            return;
                        }
                    }
                    // Closed or failed: the waiter's relay meets it on its own read (after
                    // what was gathered).
                    _ => return hand_back(st, wid, conn, request),
                }
            }
        };
        // The answer: gathered with the request, or the last read alone.
        let gathered = request
            .as_mut()
            .map(|r| {
                r.gather_end = None;
                std::mem::take(&mut r.answer)
            })
            .unwrap_or_default();
        let whole = if gathered.is_empty() {
            &buf[..n]
        } else {
            &gathered[..]
        };
        // The rest is the answer to the request written behind (pipeline.rs).
        let (answer, rest) = whole.split_at(end.min(whole.len()));
        let n = answer.len();
        let now = Tick::now();
        if request.as_ref().is_some_and(|r| r.behind.gone) {
            // Its client left (pipeline.rs): the answer is dropped, the server goes on.
            conn.ahead.extend_from_slice(rest);
            drop(st);
            self.release_at(conn, true, now);
            return;
        }
        if let Some(r) = request.as_mut() {
            // Canceled by a cancel aimed at the request before it: written again.
            if r.write_again(&mut conn, answer) {
                self.stats.count_resent();
                return self.await_again(d, st, wid, conn, request);
            }
            r.behind.quick = r
                .granted
                .is_some_and(|g| now.since(g) < super::pipeline::QUICK);
            r.client.unlink();
        }
        conn.ahead.extend_from_slice(rest);
        st.answers
            .push((wid, Answer::Served(now, n as u32), request));
        drop(st);
        // The server first: the next waiter's request goes out before this answer.
        self.release_at(conn, true, now);
        // SAFETY: `d.fd` is the waiting client's socket, owned by its session's
        // `Stream`. A delegate is left only on a single event loop, and runs there
        // (from the I/O driver), so the session cannot run meanwhile; and it acts
        // only while the place's answer is still in the pool's state, which the
        // session takes out (dropping its ticket) before it can drop its stream. So
        // the descriptor is open and still that client's. `send` reads `n` bytes of
        // `answer`, which holds that many.
        let w = unsafe {
            libc::send(
                d.fd,
                answer.as_ptr().cast(),
                n,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        let sent = usize::try_from(w).unwrap_or(0);
        if sent < n {
            // The client's socket is full (or failed): the waiter owes the rest.
            let mut st = self.lock_state();
            let task = st
                .answers
                .iter_mut()
                .find(|(i, ..)| *i == wid)
                .and_then(|(_, _, r)| {
                    let r = r.as_mut()?;
                    r.owed.extend_from_slice(&answer[sent..n]);
                    r.task.take()
                });
            drop(st);
            if let Some(t) = task {
                t.wake();
            }
        }
    }
}

impl Pool {
    /// The request was written again (pipeline.rs): the delegate waits for its answer.
    fn await_again(
        &self,
        d: &Arc<Delegate>,
        mut st: MutexGuard<'_, PoolState>,
        wid: u64,
        conn: super::ServerConn,
        request: Option<Box<super::Request>>,
    ) {
        let w = Waker::from(d.clone());
        let ready = conn
            .stream
            .poll_read_ready(&mut Context::from_waker(&w))
            .is_ready();
        st.answers
            .push((wid, Answer::Granted(Grant::Server(conn)), request));
        drop(st);
        if ready {
            w.wake();
        }
    }
}

/// Leaves the server with the waiter's place and wakes its task, which relays what
/// is left of the answer itself.
fn hand_back(
    mut st: MutexGuard<'_, PoolState>,
    wid: u64,
    conn: super::ServerConn,
    mut request: Option<Box<super::Request>>,
) {
    if request.as_ref().is_some_and(|r| r.behind.gone) {
        // Nobody to take it over: closed, and the request behind it fails
        // (pipeline.rs; an answer the delegate could not finish, its client gone).
        drop(st);
        drop(conn);
        return;
    }
    let task = request.as_mut().and_then(|r| {
        r.gather_end = None;
        // An answer the delegate did not finish is no quick one (pipeline.rs).
        r.behind.quick = false;
        r.task.take()
    });
    st.answers
        .push((wid, Answer::Granted(Grant::Server(conn)), request));
    drop(st);
    if let Some(t) = task {
        t.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::whole_idle_answer;

    #[test]
    fn only_whole_answers_ending_idle_are_relayed() {
        let ready = |s: u8| vec![b'Z', 0, 0, 0, 5, s];
        let complete = [b'C', 0, 0, 0, 13].iter().chain(b"SELECT 1\0").copied();
        let mut ok: Vec<u8> = complete.clone().collect();
        ok.extend(ready(b'I'));
        assert!(whole_idle_answer(&ok));
        assert!(whole_idle_answer(&ready(b'I')));
        // A transaction left open, a partial read, a ParameterStatus, an odd length.
        let mut open: Vec<u8> = complete.collect();
        open.extend(ready(b'T'));
        assert!(!whole_idle_answer(&open));
        assert!(!whole_idle_answer(&ok[..ok.len() - 1]));
        assert!(!whole_idle_answer(&ok[..5]));
        let mut param = vec![b'S', 0, 0, 0, 8, b'a', 0, b'b', 0];
        param.extend(ready(b'I'));
        assert!(!whole_idle_answer(&param));
        assert!(!whole_idle_answer(&[b'Z', 0, 0, 0, 6, b'I', b'I']));
        // Every prepared statement dropped: the relay must see it; a tag as long is
        // relayed.
        let done = |tag: &[u8]| {
            let mut m = vec![b'C'];
            m.extend((4 + tag.len() as u32 + 1).to_be_bytes());
            m.extend(tag);
            m.push(0);
            m.extend(ready(b'I'));
            whole_idle_answer(&m)
        };
        assert!(!done(b"DEALLOCATE ALL"));
        assert!(!done(b"DISCARD ALL"));
        assert!(done(b"DEALLOCATE"));
        assert!(done(b"SELECT 1234"), "as long as DISCARD ALL");
        assert!(done(b"UPDATE 1234567"), "as long as DEALLOCATE ALL");
        assert!(!whole_idle_answer(&[b'Z', 0, 0, 0, 3, b'I']));
        assert!(!whole_idle_answer(&[]));
    }

    #[test]
    fn an_answer_cut_anywhere_before_its_end_is_partial() {
        use super::{answered, Answered};
        let mut ok = vec![b'T', 0, 0, 0, 6, 0, 0];
        for _ in 0..3 {
            ok.extend([b'D', 0, 0, 0, 12, 0, 1, 0, 0, 0, 2, b'4', b'2']);
        }
        ok.extend([b'C', 0, 0, 0, 13].iter().chain(b"SELECT 3\0"));
        ok.extend([b'Z', 0, 0, 0, 5, b'I']);
        assert_eq!(answered(&ok), Answered::Whole);
        for cut in 0..ok.len() {
            assert_eq!(answered(&ok[..cut]), Answered::Partial, "cut at {cut}");
        }
        // What the relay must see is seen as soon as its header is whole, and a
        // command tag as soon as its body is.
        let mut param = vec![b'D', 0, 0, 0, 4, b'S', 0, 0, 0, 8];
        assert_eq!(answered(&param), Answered::Other);
        param[5] = b'G';
        assert_eq!(answered(&param), Answered::Other);
        let mut discard = vec![b'C', 0, 0, 0, 16];
        discard.extend(b"DISCARD AL");
        assert_eq!(answered(&discard), Answered::Partial);
        discard.extend(b"L\0");
        assert_eq!(answered(&discard), Answered::Other);
        // A notice is relayed whole with its answer, but not held for the rest.
        let notice = [b'N', 0, 0, 0, 9, b'M', b'h', b'i', 0, 0];
        let with_notice = [&notice[..], &ok[..]].concat();
        assert_eq!(answered(&with_notice), Answered::Whole);
        assert_eq!(answered(&with_notice[..20]), Answered::Other);
        assert_eq!(answered(&notice[..7]), Answered::Other);
        // An error: the delegate relays it, but not one of a request that binds
        // prepared statements that the relay's tracker mends.
        let error = |code: &[u8]| [&[b'E', 0, 0, 0, 11, b'C'][..], code, &[0]].concat();
        let failed = |code| [&error(code)[..], &ok[ok.len() - 6..]].concat();
        assert_eq!(answered(&failed(b"26000")), Answered::Whole);
        for (code, want) in [
            (b"26000", Answered::Other),
            (b"0A000", Answered::Other),
            (b"22012", Answered::Whole),
            (b"57014", Answered::Whole),
        ] {
            let got = super::answered_at(&failed(code), false, true).0;
            assert_eq!(got, want, "{}", String::from_utf8_lossy(code));
        }
        assert_eq!(super::answered_at(&ok, false, true).0, Answered::Whole);
        // Bytes after the ReadyForQuery, or a transaction left open.
        assert_eq!(answered(&[&ok[..], b"Z"].concat()), Answered::Other);
        let n = ok.len();
        ok[n - 1] = b'T';
        assert_eq!(answered(&ok), Answered::Other);
    }
}

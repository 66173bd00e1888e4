//! The relay: client ⇄ server, both directions at once, forwarding bytes in bulk while
//! following message headers to know when the server is idle and clean.
//!
//! Each direction reads only when its buffer is empty and writes what it read before
//! reading again, so a slow reader on one side never blocks the other direction (no
//! deadlock when a pipelining client and a busy server both write). Bodies are never
//! copied except ReadyForQuery's status byte and ParameterStatus.

use std::io;

use bytes::{Buf, BytesMut};

mod begin;
mod behind;
mod copy;
mod count;
mod delegated;
mod midbatch;
mod outcome;
mod owed;
mod parked;
mod prepared;
mod spare;
mod timing;
pub use timing::Timeouts;
mod unlinked;
mod wake;

pub use begin::{hold_begin_enabled, Taken};
pub use outcome::{Outcome, ReleaseAt};
pub use parked::{Idle, Parked, RelaySlot, FRESH_SLEEP};
pub use prepared::ClientPrepared;

use super::framer::{Body, Event, Framer};
use super::params::ClientParams;
use crate::clock::Tick;
use crate::net::{bufpool, Stream};
use crate::pool::{Request, ServerConn};
use crate::protocol::backend::parse_parameter_status;
use crate::protocol::header::*;
use crate::protocol::ProtocolError;
use crate::stats::{PoolStats, StatsDelta};
use copy::CopyWatch;
use count::{client_protocol, count_client_tag, Counted};
use midbatch::MidBatch;
use wake::{next_wake, Wake, Want};

/// The notice of a client queued past `query_wait_notify` (PgBouncer's text).
pub const QUEUED_NOTICE: &str =
    "No server connection available in postgres backend, client being queued";

/// Why a client that sent a Query with `disable_pqexec` on is closed (PgBouncer's).
pub(super) const PQEXEC_DISALLOWED: &str = "PQexec disallowed";

/// Bytes read per wake-up and direction.
const READ_CHUNK: usize = bufpool::BUF_SIZE;

/// Relay state for one request of a client (parked between requests, see `parked.rs`):
/// buffers (allocated on first use) and protocol tracking. `Default` is a blank one,
/// never used before `Relay::refill` (parked.rs) fills it for a request.
#[derive(Debug, Default)]
// In this order (`repr(C)`): what every request reads or writes comes first, in about
// six cache lines, and the rarely used parts of the prepared-statement state and the
// spare input buffer last. With many clients a waiting one's relay is out of the
// caches by its turn, and each line it touches is a miss (docs/performance.md).
#[repr(C)]
pub struct Relay {
    /// Client bytes not yet written to the server.
    c2s: BytesMut,
    /// Server bytes not yet written to the client.
    s2c: BytesMut,
    /// ReadyForQuery messages the server still owes (one per Query, Sync, FunctionCall).
    pending: u32,
    /// ReadyForQuery messages in the last server read, and how many ended a transaction.
    readies: u32,
    xacts_done: u32,
    max_packet: u32,
    /// The status byte of the last ReadyForQuery.
    status: u8,
    /// The client's Syncs around a COPY, which the server may ignore (copy.rs).
    copy: CopyWatch,
    /// A simple Query inside an extended batch, which the server may skip
    /// (midbatch.rs; the plain path only).
    mid: MidBatch,
    /// A COPY by Execute failed, or a Query inside a batch was skipped: the server
    /// skips to the client's next Sync, and is not idle before a ReadyForQuery
    /// whatever `pending` says.
    await_ready: bool,
    /// Extended-protocol messages sent since the last request end (Sync, Query,
    /// FunctionCall): those that end in an answer of their own, and
    /// [`count::FLUSHED`] if a Flush came; 0 outside a batch.
    unsynced: u64,
    /// The client sent Terminate; nothing more is read from it.
    terminated: bool,
    /// A message header straddled the Terminate cut, so the server saw part of it.
    desync: bool,
    /// A ReadyForQuery arrived in the last server read.
    saw_ready: bool,
    /// The answer before another client's request ended in the last server read
    /// (behind.rs): the server goes on to that request now.
    lead_ended: bool,
    /// `server_preload` holds bytes: a flag on the relay's first lines, so that the
    /// hot loop need not read the cold buffer's header.
    preloaded: bool,
    /// `disable_pqexec`: a Query message ends the session.
    no_simple_query: bool,
    /// A `BEGIN` the pooler answered goes ahead of this request (begin.rs).
    begin: begin::Begin,
    /// Timestamps for the timeouts, kept only when some timeout is set.
    timeouts: Timeouts,
    last_activity: Tick,
    /// When client bytes last arrived.
    last_read: Tick,
    /// When `stats` was last folded into the pool's.
    last_flush: Tick,
    request_started: Option<Tick>,
    transaction_started: Option<Tick>,
    /// The box a request left in a pool's line goes in, kept for the client's next
    /// wait (this client's: dropped when the relay is put away).
    line_request: Option<Box<Request>>,
    /// Counts since the last flush into the pool's stats.
    pub stats: StatsDelta,
    client_framer: Framer,
    server_framer: Framer,
    /// Prepared-statement rewriting (transaction and statement pooling only).
    prepared: Option<prepared::PreparedState>,
    /// The prepared-statement input buffer while the relay is spare (parked.rs).
    spare_input: BytesMut,
    /// Server bytes a delegate read for this client but left to it (pool/delegate.rs):
    /// the first server read of its next `run`.
    server_preload: BytesMut,
    /// The start of the server's answer to a `BEGIN` written ahead, while not whole
    /// (begin.rs; almost never used).
    begin_head: BytesMut,
}

impl Relay {
    /// Whether the client has asked to end the session.
    pub fn terminated(&self) -> bool {
        self.terminated
    }

    /// Whether the server can be reused by another client right now, and the client
    /// is owed nothing.
    pub fn server_clean(&self) -> bool {
        self.s2c.is_empty() && self.server_done()
    }

    /// Whether the server can be reused by another client right now, whatever the
    /// client is still owed.
    fn server_done(&self) -> bool {
        self.pending == 0
            && self.unsynced == 0
            && self.status == b'I'
            && !self.desync
            && !self.await_ready
            && !self.copy.in_copy()
            && self.c2s.is_empty()
            && self.client_framer.at_boundary()
            && self.server_framer.at_boundary()
            && self.prepared.as_ref().is_none_or(|p| p.is_idle())
            && self.begin == begin::Begin::No
    }

    /// Whether the relay may be put away until the client's next request: nothing
    /// buffered, owed or counted, and the client still there.
    fn parkable(&self) -> bool {
        self.server_clean() && !self.terminated && self.stats.is_empty()
    }

    /// Relays until the session ends, the server fails, or (by `release`) the server
    /// is idle and clean.
    pub async fn run(
        &mut self,
        client: &Stream,
        server: &mut ServerConn,
        params: &mut ClientParams,
        release: ReleaseAt,
        stats: &PoolStats,
    ) -> Outcome {
        // With another client's request behind the one this client's answer is
        // owed for, nothing more of this client's goes to the server (behind.rs).
        if server.behind.is_none() {
            if let Err(e) = self.rewrite_pending(server) {
                return e;
            }
            self.put_begin_ahead();
            // The request that made the client ask for a server goes out now, without
            // waiting a loop turn for writability.
            if let Err(e) = flush(&server.stream, &mut self.c2s) {
                return Outcome::ServerClosed(e);
            }
        }
        let mut transaction_ended = false;
        let mut timer = None;
        loop {
            if self.terminated && self.c2s.is_empty() && self.s2c.is_empty() {
                return Outcome::ClientClosed;
            }
            let at_release = match release {
                ReleaseAt::SessionEnd => false,
                ReleaseAt::SessionCheckpoints => transaction_ended,
                ReleaseAt::TransactionEnd | ReleaseAt::StatementEnd => true,
            };
            if at_release && self.server_clean() {
                return self.released();
            }
            // A session-mode client keeps its server while idle: flush on a timer then.
            let deadline =
                if release == ReleaseAt::SessionEnd || release == ReleaseAt::SessionCheckpoints {
                    self.deadline_or_flush(true)
                } else {
                    self.deadline(true)
                };
            let want = Want {
                server_read: self.s2c.is_empty(),
                client_write: !self.s2c.is_empty(),
                // (Bytes the client sent while another's request is behind its own
                // wait for its next server; no more is read until then.)
                client_read: self.c2s.is_empty()
                    && !self.terminated
                    && (server.behind.is_none() || !self.has_request()),
                server_write: !self.c2s.is_empty() && server.behind.is_none(),
                client_first: self.pending == 0,
            };
            let wake = if self.preloaded {
                Wake::ServerRead(Ok(()))
            } else {
                next_wake(client, Some(&server.stream), want, deadline, &mut timer).await
            };
            match wake {
                Wake::ServerRead(r) => {
                    if let Err(e) = r {
                        return Outcome::ServerClosed(e);
                    }
                    match self.read_server(server, params) {
                        Ok(()) => {}
                        Err(ServerRead::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(ServerRead::Io(e)) => return Outcome::ServerClosed(e),
                        Err(ServerRead::Protocol(e)) => return Outcome::ServerProtocol(e),
                    }
                    if std::mem::take(&mut self.lead_ended) {
                        self.note_server_activity(stats);
                        return self.released();
                    }
                    if let Err(e) = self.replay_if_needed(server) {
                        return e;
                    }
                    if self.saw_ready && release == ReleaseAt::StatementEnd && self.status != b'I' {
                        // The client must not see its BEGIN succeed: drop that
                        // ReadyForQuery (the last message) before the error goes out.
                        let n = self.s2c.len();
                        if n >= 6 && self.s2c[n - 6..n - 1] == *b"Z\0\0\0\x05" {
                            self.s2c.truncate(n - 6);
                        }
                        return Outcome::LongTransaction;
                    }
                    transaction_ended |= self.xacts_done > 0;
                    self.note_server_activity(stats);
                    // The answer is complete: the server goes back before the client
                    // is sent its end, so the next client's request reaches
                    // PostgreSQL first (session::run, `Session::after`).
                    let lends =
                        matches!(release, ReleaseAt::TransactionEnd | ReleaseAt::StatementEnd);
                    if lends && self.saw_ready && self.server_done() {
                        return self.released();
                    }
                    if let Err(e) = flush(client, &mut self.s2c) {
                        return Outcome::ClientFailed(e);
                    }
                }
                Wake::Timer => {
                    let now = Tick::now();
                    self.maybe_flush(stats, now);
                    if let Some((at, why)) = self.deadline(true) {
                        if at <= now {
                            return Outcome::Timeout(why);
                        }
                    }
                }
                Wake::ClientWrite(r) => {
                    if let Err(e) = r.and_then(|_| flush(client, &mut self.s2c)) {
                        return Outcome::ClientFailed(e);
                    }
                }
                Wake::ClientRead(r) => {
                    if let Err(e) = r {
                        return Outcome::ClientFailed(e);
                    }
                    let pending_before = self.pending;
                    match self.read_client(client, false) {
                        Ok(true) => self.note_client_activity(pending_before, Tick::now()),
                        Ok(false) => return Outcome::ClientClosed,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                            return client_protocol(e);
                        }
                        Err(e) => return Outcome::ClientFailed(e),
                    }
                    // With another client's request behind this one, the request goes
                    // to this client's next server, and is rewritten for that one's
                    // prepared statements then (behind.rs); a Terminate needs none.
                    if server.behind.is_some() {
                        let p = self.prepared.as_ref();
                        self.terminated |= p.is_some_and(|p| p.starts_with_terminate());
                        continue;
                    }
                    if let Err(e) = self.rewrite_pending(server) {
                        return e;
                    }
                    if let Err(e) = self.write_request(server, release) {
                        return Outcome::ServerClosed(e);
                    }
                }
                Wake::ServerWrite(r) => {
                    if let Err(e) = r.and_then(|_| flush(&server.stream, &mut self.c2s)) {
                        return Outcome::ServerClosed(e);
                    }
                }
            }
        }
    }

    /// The server may go back: what was followed of it ends (midbatch.rs; the next
    /// server starts at rest).
    fn released(&mut self) -> Outcome {
        self.mid = MidBatch::default();
        Outcome::ReleasePoint
    }

    /// Takes client bytes that arrived with the login packets.
    pub fn preload(&mut self, bytes: &[u8]) -> Result<(), ProtocolError> {
        // Where a read would have put them: with prepared statements, the rewriter's
        // input (so a named statement is renamed like any other).
        if let Some(p) = &mut self.prepared {
            p.input.extend_from_slice(bytes);
            return Ok(());
        }
        let start = self.c2s.len();
        self.c2s.extend_from_slice(bytes);
        self.scan_client(start)
    }

    /// Whether client bytes wait for a server (in `c2s` or the rewriter's input).
    pub fn has_request(&self) -> bool {
        !self.c2s.is_empty() || self.prepared.as_ref().is_some_and(|p| p.has_input())
    }

    /// Reads from the client into `c2s` and follows its messages. `Ok(false)`: EOF.
    /// A protocol violation is reported as `InvalidData`.
    fn read_client(&mut self, client: &Stream, at_once: bool) -> io::Result<bool> {
        // With prepared statements, client bytes wait in the rewriter's input until a
        // server is linked (the rewrite depends on what that server has prepared).
        let buf = match &mut self.prepared {
            Some(p) => &mut p.input,
            None => &mut self.c2s,
        };
        if buf.capacity() == 0 {
            *buf = bufpool::take();
        }
        buf.reserve(READ_CHUNK);
        let start = buf.len();
        let n = if at_once {
            client.try_read_buf_now(buf)?
        } else {
            client.try_read_buf(buf)?
        };
        if n == 0 {
            return Ok(false);
        }
        self.stats.counts.bytes_received += n as u64;
        if self.prepared.is_none() {
            self.scan_client(start)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
        Ok(true)
    }

    /// Reads from the server into `s2c` and follows its messages.
    fn read_server(
        &mut self,
        server: &mut ServerConn,
        params: &mut ClientParams,
    ) -> Result<(), ServerRead> {
        if self.s2c.capacity() == 0 {
            self.s2c = bufpool::take();
        }
        self.s2c.reserve(READ_CHUNK);
        let start = self.s2c.len();
        let n = if self.preloaded {
            self.take_preload()
        } else {
            server
                .stream
                .try_read_buf(&mut self.s2c)
                .map_err(ServerRead::Io)?
        };
        if n == 0 {
            return Err(ServerRead::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        self.stats.counts.bytes_sent += n as u64;
        if self.begin != begin::Begin::No {
            // Nothing else goes on until the answer to the pooler's BEGIN is cut out.
            match self.strip_begin(start) {
                Ok(true) if self.s2c.len() > start => {}
                Ok(_) => return Err(ServerRead::Io(io::ErrorKind::WouldBlock.into())),
                Err(e) => return Err(ServerRead::Protocol(e)),
            }
        }
        if server.behind.is_some() && self.prepared.as_ref().is_some_and(|p| p.watches(false)) {
            self.cut_before_tracker(server);
        }
        let (pending, status, saw_ready) =
            (&mut self.pending, &mut self.status, &mut self.saw_ready);
        let (readies, xacts_done) = (&mut self.readies, &mut self.xacts_done);
        // What the end of a COPY in this chunk would mean, for the response tracker
        // (which sees that end before `on_event` does).
        let copy_ignores = (self.copy.ignores(), self.copy.in_copy());
        let (copy, await_ready, mid) = (&mut self.copy, &mut self.await_ready, &mut self.mid);
        let unsynced = self.unsynced != 0;
        mid.server_read(unsynced);
        // Nothing to follow in this read otherwise (the common case: one test).
        let watch_mid = unsynced || mid.following();
        *saw_ready = false;
        *readies = 0;
        *xacts_done = 0;
        let mut bad_param = false;
        // A ReadyForQuery `I` answered everything sent (`ended`): a message after it
        // in the same read (bar a notification) is the server's own, most often a
        // dying backend's FATAL error, and the server is not handed out again, as
        // PgBouncer drops a server that sent something after its ReadyForQuery. A
        // read that ends with the ReadyForQuery costs one test.
        let mut ended = false;
        // With another client's request written behind this one (pool/pipeline.rs),
        // what follows the ReadyForQuery is that client's answer: it is cut off here
        // (`cut`, its offset in `s2c`) and left with the server.
        let behind = server.behind.is_some();
        let (mut lead_end, mut cut) = (false, None);
        // One deref of the boxed connection, so its fields borrow apart.
        let server = &mut **server;
        let (server_params, close_needed) = (&mut server.params, &mut server.close_needed);
        let on_event = |e: Event<'_>| match e {
            _ if cut.is_some() => Body::Skip,
            Event::Start { tag, at, .. } => {
                if lead_end {
                    cut = Some(start + at.unwrap_or(0));
                    return Body::Skip;
                }
                if ended && tag != TAG_NOTIFICATION_RESPONSE {
                    *close_needed = Some("idle server got dirty");
                }
                if watch_mid {
                    if let Some(skipped) = mid.server(tag, unsynced) {
                        // Queries inside a batch were skipped: no ReadyForQuery for
                        // them, and the server skips on to the client's Sync.
                        *pending = pending.saturating_sub(skipped);
                        *await_ready = true;
                    }
                }
                match tag {
                    TAG_READY_FOR_QUERY | TAG_PARAMETER_STATUS => Body::Capture,
                    TAG_COPY_IN_RESPONSE => {
                        copy.server_copy_in();
                        Body::Skip
                    }
                    TAG_COMMAND_COMPLETE | TAG_ERROR_RESPONSE if copy.in_copy() => {
                        let end = copy.server_copy_end(tag == TAG_COMMAND_COMPLETE);
                        *pending = pending.saturating_sub(end.ignored);
                        if end.failed_execute {
                            *await_ready = true;
                            // One ReadyForQuery more than counted may still come
                            // (copy.rs): the server is not handed to another client
                            // after this.
                            *close_needed = Some("close needed");
                        }
                        Body::Skip
                    }
                    _ => Body::Skip,
                }
            }
            Event::Complete {
                tag: TAG_READY_FOR_QUERY,
                body,
            } => {
                *pending = pending.saturating_sub(1);
                *await_ready = false;
                *status = body.first().copied().unwrap_or(b'I');
                *saw_ready = true;
                *readies += 1;
                if *status == b'I' {
                    *xacts_done += 1;
                }
                ended = *pending == 0 && *status == b'I' && !unsynced;
                // The one request before another's (its own requests sent after it
                // are held back, so this is its ReadyForQuery).
                lead_end = behind;
                if behind && *status != b'I' {
                    *close_needed = Some("idle server got dirty");
                }
                Body::Skip
            }
            Event::Complete {
                tag: TAG_PARAMETER_STATUS,
                body,
            } => {
                match parse_parameter_status(body) {
                    Ok((k, v)) => {
                        server_params.set(k, v);
                        params.set(k, v);
                    }
                    Err(_) => bad_param = true,
                }
                Body::Skip
            }
            Event::Complete { .. } => Body::Skip,
        };
        // The tracker watches a plain request's answer for a DEALLOCATE ALL or DISCARD
        // ALL. With a request behind, this one is a `SELECT` (pool/pipeline.rs), and
        // what follows its ReadyForQuery is another client's: not for this tracker.
        let server_holds = !server.prepared.is_empty() && !behind;
        let tracked = self.prepared.as_mut().filter(|p| p.watches(server_holds));
        match tracked {
            None => self
                .server_framer
                .feed(&self.s2c[start..], u32::MAX, on_event),
            Some(p) => {
                debug_assert_eq!(start, 0, "server reads happen only with s2c drained");
                let t = p.tracker_mut();
                (t.copy_ignores, t.in_copy) = copy_ignores;
                // A replay must not overtake client bytes already on their way.
                p.tracker_mut().can_retry = self.c2s.is_empty();
                p.process_server_chunk(
                    &mut self.server_framer,
                    &mut self.s2c,
                    &mut server.prepared,
                    on_event,
                )
            }
        }
        .map_err(ServerRead::Protocol)?;
        // (A header cut short after the lead's ReadyForQuery started no message: cut too.)
        let partial = self.server_framer.partial_header_len();
        if let Some(at) = cut.or((lead_end && partial > 0).then(|| self.s2c.len() - partial)) {
            self.cut_behind(server, at);
        }
        self.lead_ended = lead_end;
        if let Some(p) = self.prepared.as_mut() {
            self.pending = self.pending.saturating_sub(p.take_skipped_ready());
        }
        if bad_param {
            return Err(ServerRead::Protocol(ProtocolError::Malformed(
                "ParameterStatus",
            )));
        }
        Ok(())
    }
}

enum ServerRead {
    Io(io::Error),
    Protocol(ProtocolError),
}

/// Writes as much of `buf` as the socket takes now.
fn flush(to: &Stream, buf: &mut BytesMut) -> io::Result<()> {
    while !buf.is_empty() {
        match to.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) if n == buf.len() => buf.clear(),
            Ok(n) => buf.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

//! The response side of prepared-statement rewriting: a queue with one entry per
//! request the server (or Sluice) must answer, in order, so that answers to injected
//! Parses can be dropped and answers Sluice gives itself can be put in their place.

use std::cell::RefCell;
use std::collections::VecDeque;

use super::{ClientStatements, ServerStatements};

/// What a request is, by the message that completes its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Parse,
    Bind,
    Describe,
    Execute,
    Close,
    /// Simple Query and FunctionCall: answered up to ReadyForQuery.
    UntilReady,
    /// Sync: answered by ReadyForQuery, and the end of the skip after an error.
    Sync,
}

impl Kind {
    /// Whether a server message with `tag` completes a request of this kind.
    fn completed_by(self, tag: u8) -> bool {
        match self {
            Kind::Parse => tag == b'1',
            Kind::Bind => tag == b'2',
            Kind::Describe => tag == b'T' || tag == b'n',
            Kind::Execute => matches!(tag, b'C' | b'I' | b's'),
            Kind::Close => tag == b'3',
            Kind::UntilReady | Kind::Sync => tag == b'Z',
        }
    }
}

pub use super::undo::Undo;

/// One request awaiting its answer.
#[derive(Debug)]
pub enum Expect {
    /// The client's request: its answer passes through.
    Forward { kind: Kind, undo: Option<Undo> },
    /// Sluice's own request: its completion message is dropped.
    Swallow { kind: Kind, undo: Option<Undo> },
    /// Sluice answers in the server's stead: these bytes go out in this place
    /// (unless an error before them makes the server skip to the Sync, as it would
    /// have skipped the request: then the undo runs).
    Synthesize(&'static [u8], Option<Undo>),
    /// A request Sluice refuses as PostgreSQL would (a statement name in use): the
    /// server gets a request bound to fail, so that it aborts a transaction (and, in
    /// the extended protocol, `extended`, skips to the Sync) as PostgreSQL would, and
    /// its error is replaced by this one.
    Refuse { error: Box<[u8]>, extended: bool },
    /// A client's SQL-level PREPARE: undone if it fails.
    Query { failed: bool, undo: Option<Undo> },
    /// Sluice's own simple query (an injected PREPARE or DEALLOCATE): everything up
    /// to and including its ReadyForQuery is dropped, except an error.
    SwallowQuery { failed: bool, undo: Option<Undo> },
}

/// ParseComplete.
pub const PARSE_COMPLETE: &[u8] = b"1\0\0\0\x04";

/// An edit of one chunk of server bytes.
#[derive(Debug, PartialEq, Eq)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
}

/// The queue and the state that spans chunks.
#[derive(Debug, Default)]
pub struct ResponseTracker {
    pub(super) queue: VecDeque<Expect>,
    /// The server skips to the next Sync after an error, and no Sync was owed when
    /// the error came: requests rewritten until the client's Sync get no answer.
    pub(super) skipping: bool,
    /// Header bytes held back at the end of the last chunk (never forwarded, since
    /// the message might have to be dropped).
    held: Vec<u8>,
    /// Bytes of a dropped message still to come in the next chunks.
    drop_left: usize,
    /// The current message completes a request and spans chunks: synthesized answers
    /// go out after it ends.
    flush_after_current: bool,
    /// The statement whose Bind/Describe just failed, until the error's code is read.
    suspect: Option<std::sync::Arc<super::Statement>>,
    /// The client's last batch (Bind..Sync of one statement, nothing run before it),
    /// kept by the rewriter so that a stale-plan failure can be replayed.
    pub replay: Option<Replay>,
    /// An error held out of the stream until its code is known: (edit index, start).
    held_error: Option<(usize, usize)>,
    /// Set by the relay before each chunk: nothing newer is buffered toward the server,
    /// so a replay would keep the order of the client's requests.
    pub can_retry: bool,
    /// Client bytes to send again (the replayed batch), taken by the relay.
    retry: Option<bytes::BytesMut>,
    /// A Describe at the head of the queue already got its ParameterDescription
    /// through; after a replay the repeated one must be dropped.
    param_desc_sent: bool,
    /// Drop the next ParameterDescription (it repeats one the client has).
    skip_param_desc: bool,
    /// What `skip_param_desc` becomes if the failed batch is replayed.
    skip_param_desc_on_retry: bool,
    /// The server is in COPY FROM STDIN (copy.rs); set by the relay too.
    pub in_copy: bool,
    /// Simple Queries and FunctionCalls of the client's that the server skips after
    /// an error in an extended-protocol batch (sent before its Sync): taken by the
    /// relay, which counted a ReadyForQuery for each.
    pub skipped_ready: u32,
    /// Set by the relay before each chunk: the Syncs the server ignores if a COPY
    /// ends now, with CommandComplete and with an error (`relay::copy`; `None`: the
    /// COPY came by simple Query, whose error ends only that Query).
    pub copy_ignores: (u32, Option<u32>),
    /// Never take the shortcut of [`ResponseTracker::pass_through`] (the `prepared`
    /// fuzz target compares it with the long way).
    #[cfg(any(test, feature = "fuzzing"))]
    pub long_way: bool,
}

/// A recorded batch and the statement its Bind names.
#[derive(Debug)]
pub struct Replay {
    pub stmt_id: u64,
    pub bytes: bytes::BytesMut,
}

thread_local! {
    /// Empty queues of finished requests, so that a request does not allocate one.
    static SPARE_QUEUES: RefCell<Vec<VecDeque<Expect>>> = const { RefCell::new(Vec::new()) };
}

/// Spare queues kept per thread, and the largest capacity worth keeping.
const KEEP_QUEUES: usize = 64;
const MAX_KEPT_CAPACITY: usize = 64;

impl ResponseTracker {
    /// Ends a request's tracker: its queue, if empty and small, goes back for reuse.
    pub fn recycle(self) {
        let q = self.queue;
        if !q.is_empty() || q.capacity() == 0 || q.capacity() > MAX_KEPT_CAPACITY {
            return;
        }
        // `try_with`: at thread exit the list may be gone (then the queue is freed).
        let _ = SPARE_QUEUES.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEEP_QUEUES {
                s.push(q);
            }
        });
    }

    /// Whether nothing spans chunks and every answer owed is passed through whole up
    /// to its ReadyForQuery (simple queries, lone Syncs). Then only ReadyForQuery
    /// changes the tracker's state, and other messages need not be looked at.
    fn is_plain(&self) -> bool {
        !self.in_copy
            && self.held.is_empty()
            && self.drop_left == 0
            && !self.flush_after_current
            && self.suspect.is_none()
            && self.held_error.is_none()
            && !self.skip_param_desc
            && self.queue.iter().all(|e| {
                matches!(
                    e,
                    Expect::Forward {
                        kind: Kind::UntilReady | Kind::Sync,
                        undo: None
                    }
                )
            })
    }

    /// Whether the tracker holds part of a message back (a split header) or is
    /// dropping one: the next chunk must come through it too.
    pub fn mid_message(&self) -> bool {
        !self.held.is_empty() || self.drop_left > 0
    }

    /// Whether every request has been answered.
    pub fn is_idle(&self) -> bool {
        // Not while the server skips to a Sync the client has yet to send.
        self.queue.is_empty() && self.held.is_empty() && self.drop_left == 0 && !self.skipping
    }

    /// The batch to send again after a stale-plan error was hidden from the client.
    pub fn take_retry(&mut self) -> Option<bytes::BytesMut> {
        self.retry.take()
    }

    /// Queues an entry. A request's first takes a finished request's queue from this
    /// thread, so that a request of plain queries, which queues none, never touches
    /// the list.
    pub fn push(&mut self, e: Expect) {
        if self.queue.capacity() == 0 {
            if let Some(q) = SPARE_QUEUES
                .try_with(|s| s.borrow_mut().pop())
                .ok()
                .flatten()
            {
                self.queue = q;
            }
        }
        self.queue.push_back(e);
    }

    /// Takes the queue out, for entries to go ahead of it ([`Self::queue_after`]).
    pub fn take_queue(&mut self) -> VecDeque<Expect> {
        std::mem::take(&mut self.queue)
    }

    /// Every answer queued came whole and passed through as it was: a delegate relayed
    /// them (`pool::delegate`, which hands a stale plan or a lost statement to the
    /// relay; after any other error the skipped entries' undoing changes nothing,
    /// their entries being forwards of Binds, Describes, Executes and a Sync).
    pub fn answered_by_delegate(&mut self) {
        debug_assert!(self
            .queue
            .iter()
            .all(|e| matches!(e, Expect::Forward { .. })));
        self.queue.clear();
    }

    /// Puts `owed` (from [`Self::take_queue`]) back behind what was queued since.
    pub fn queue_after(&mut self, mut owed: VecDeque<Expect>) {
        if self.queue.is_empty() {
            self.queue = owed;
        } else {
            self.queue.append(&mut owed);
        }
    }

    /// Synthesized answers that can go out right now (nothing owed before them).
    /// `at_boundary`: the server stream is between messages.
    pub fn take_ready_synthesized(&mut self, at_boundary: bool, out: &mut Vec<u8>) {
        if !at_boundary || !self.held.is_empty() || self.flush_after_current {
            return;
        }
        self.drain_synthesized(out);
    }

    /// Prepares the replay of the failed batch if nothing the client sent after it is
    /// in flight: the failed batch's ReadyForQuery is then dropped (the replay brings
    /// its own). Returns whether the retry will happen.
    fn start_retry(&mut self) -> bool {
        let only_sync_left = self.queue.len() == 1
            && matches!(
                self.queue.front(),
                Some(Expect::Forward {
                    kind: Kind::Sync,
                    ..
                })
            );
        let Some(replay) = self.replay.take() else {
            return false;
        };
        if !(self.can_retry && only_sync_left) {
            return false;
        }
        self.queue.pop_front();
        self.queue.push_back(Expect::SwallowQuery {
            failed: false,
            undo: None,
        });
        self.retry = Some(replay.bytes);
        self.skip_param_desc = self.skip_param_desc_on_retry;
        true
    }

    /// Pops leading synthesized answers into `out`.
    #[inline]
    fn drain_synthesized(&mut self, out: &mut Vec<u8>) {
        // Checked here, inlined: after nearly every answer there is none.
        if matches!(self.queue.front(), Some(Expect::Synthesize(..))) {
            self.drain_synthesized_slow(out);
        }
    }

    #[cold]
    fn drain_synthesized_slow(&mut self, out: &mut Vec<u8>) {
        while let Some(Expect::Synthesize(b, _)) = self.queue.front() {
            out.extend_from_slice(b);
            self.queue.pop_front();
        }
    }

    /// After an error the server skips everything up to the next Sync: those
    /// requests get no answer (synthesized ones neither), and what Sluice noted for
    /// them is undone.
    pub(super) fn skip_to_sync(
        &mut self,
        client: &mut ClientStatements,
        server: &mut ServerStatements,
    ) {
        let sync = self.queue.iter().position(|e| {
            matches!(
                e,
                Expect::Forward {
                    kind: Kind::Sync,
                    ..
                }
            )
        });
        // The client's Sync still to come: what comes before it is skipped too.
        self.skipping = sync.is_none();
        // Undone last first: a Close then a Parse of one name leave it as it was.
        let skipped: Vec<Expect> = self
            .queue
            .drain(..sync.unwrap_or(self.queue.len()))
            .collect();
        for e in skipped.into_iter().rev() {
            self.undo_skipped(e, client, server);
        }
    }

    /// Whether nothing is held, dropped, suspected or followed: then a message that
    /// only passes through needs none of [`ResponseTracker::on_message`].
    fn calm(&self) -> bool {
        #[cfg(any(test, feature = "fuzzing"))]
        if self.long_way {
            return false;
        }
        self.held.is_empty()
            && self.drop_left == 0
            && !self.flush_after_current
            && self.suspect.is_none()
            && self.held_error.is_none()
            && !self.skip_param_desc
            && !self.in_copy
    }

    /// `on_message` for the common message of a `calm` tracker, whole in the chunk,
    /// inlined: one that passes through, or completes a client's request with no answer of Sluice's
    /// due after it (a BindComplete, a DataRow, a CommandComplete). False, with
    /// nothing done, for any other (an error, a ReadyForQuery, a COPY, ...).
    #[inline]
    fn pass_through(&mut self, tag: u8) -> bool {
        if matches!(tag, b'E' | b'Z' | b't' | b'G' | b'H' | b'W') {
            return false;
        }
        let Some(Expect::Forward { kind, .. }) = self.queue.front() else {
            return false;
        };
        if !kind.completed_by(tag) {
            return true;
        }
        if matches!(self.queue.get(1), Some(Expect::Synthesize(..))) {
            return false;
        }
        self.queue.pop_front();
        self.param_desc_sent = false;
        true
    }

    /// Handles one server message header. `at` is its offset in the chunk (None when
    /// the header began in the previous chunk), `len` its body length, `chunk_len`
    /// the chunk's length. Returns edits to apply to the chunk.
    fn on_message(
        &mut self,
        (tag, len, at): (u8, usize, Option<usize>),
        chunk_len: usize,
        client: &mut ClientStatements,
        server: &mut ServerStatements,
        edits: &mut Vec<Edit>,
    ) -> bool {
        // The previous message completed a request and ended at this boundary.
        let boundary = at.unwrap_or(0);
        // A ReadyForQuery: whatever it answers, the server skips no more.
        self.skipping &= tag != b'Z';
        if self.flush_after_current {
            self.flush_after_current = false;
            let mut synth = Vec::new();
            self.drain_synthesized(&mut synth);
            if !synth.is_empty() {
                edits.push(Edit::Insert(boundary, synth));
            }
        }
        let held = std::mem::take(&mut self.held);
        // Bytes of this header that are in this chunk.
        let header_here = if at.is_some() {
            5
        } else {
            5 - held.len().min(5)
        };
        let start = at.unwrap_or(0);
        let mut drop_it = false;
        let mut completes = false;
        if tag == b't' {
            if self.skip_param_desc {
                self.skip_param_desc = false;
                drop_it = true;
            } else if matches!(
                self.queue.front(),
                Some(Expect::Forward {
                    kind: Kind::Describe,
                    ..
                })
            ) {
                self.param_desc_sent = true;
            }
        }
        match self.queue.front_mut() {
            Some(Expect::Forward { kind, .. }) if kind.completed_by(tag) => {
                completes = true;
                self.queue.pop_front();
            }
            Some(Expect::Swallow { kind, .. }) if kind.completed_by(tag) => {
                completes = true;
                drop_it = true;
                self.queue.pop_front();
            }
            Some(Expect::Query { failed, .. }) if tag == b'E' => *failed = true,
            Some(Expect::SwallowQuery { failed, .. }) if tag == b'E' => *failed = true,
            Some(Expect::Query { .. }) if tag == b'Z' => {
                completes = true;
                if let Some(Expect::Query { failed, undo }) = self.queue.pop_front() {
                    if failed {
                        Self::undo(undo, client, server);
                    }
                }
            }
            Some(Expect::SwallowQuery { .. }) => {
                // Everything but an error belongs to Sluice's own query.
                drop_it = true;
                if tag == b'Z' {
                    completes = true;
                    if let Some(Expect::SwallowQuery { failed: true, undo }) =
                        self.queue.pop_front()
                    {
                        Self::undo(undo, client, server);
                    }
                }
            }
            Some(Expect::Forward {
                kind: Kind::UntilReady,
                undo: Some(Undo::Stale(stmt)),
            }) if tag == b'E' => {
                // An SQL-level EXECUTE failed: its error is read (see `process_chunk`),
                // and its Query still ends at its ReadyForQuery.
                self.suspect = Some(stmt.clone());
            }
            Some(Expect::Refuse { .. }) if tag == b'E' => {
                // The request sent in the client's stead failed as meant: its error
                // gives way to the client's own, and the server skips to the Sync
                // (a simple Query's error ends only that Query).
                completes = true;
                drop_it = true;
                if let Some(Expect::Refuse { error, extended }) = self.queue.pop_front() {
                    edits.push(Edit::Insert(start, error.into_vec()));
                    if extended {
                        self.skip_to_sync(client, server);
                    }
                }
            }
            Some(Expect::Forward { kind, .. } | Expect::Swallow { kind, .. })
                if tag == b'E' && !matches!(kind, Kind::UntilReady | Kind::Sync) =>
            {
                // The server skips everything up to the next Sync after an error:
                // those requests get no answer, and synthesized ones must not either.
                completes = true;
                if let Some(Expect::Forward {
                    kind: failed_kind,
                    undo: Some(Undo::Stale(stmt)),
                }) = self.queue.front()
                {
                    self.suspect = Some(stmt.clone());
                    // A failed Describe may already have sent its ParameterDescription.
                    self.skip_param_desc_on_retry =
                        *failed_kind == Kind::Describe && self.param_desc_sent;
                    // Hold the error back (if it is whole in this chunk) when its batch
                    // can be replayed: the retry may make it disappear.
                    let end = start + header_here + len;
                    let replayable = self.replay.as_ref().is_some_and(|r| r.stmt_id == stmt.id);
                    if replayable && at.is_some() && end <= chunk_len {
                        self.held_error = Some((edits.len(), start));
                        edits.push(Edit::Delete(start, end));
                    }
                }
                self.skip_to_sync(client, server);
            }
            Some(_) if tag == b'Z' => {
                // Out of step (should not happen): realign on the next Sync.
                while let Some(e) = self.queue.pop_front() {
                    if matches!(
                        e,
                        Expect::Forward {
                            kind: Kind::UntilReady | Kind::Sync,
                            ..
                        }
                    ) {
                        break;
                    }
                }
                completes = true;
            }
            _ => {}
        }
        if self.in_copy || tag == b'G' {
            self.follow_copy(tag, client, server);
        }
        if drop_it {
            let end = start + header_here + len;
            edits.push(Edit::Delete(start, end.min(chunk_len)));
            self.drop_left = end.saturating_sub(chunk_len);
        } else if !held.is_empty() {
            edits.push(Edit::Insert(0, held));
        }
        if completes {
            self.param_desc_sent = false;
            let end = start + header_here + len;
            if end <= chunk_len {
                let mut synth = Vec::new();
                self.drain_synthesized(&mut synth);
                if !synth.is_empty() {
                    edits.push(Edit::Insert(end, synth));
                }
            } else {
                self.flush_after_current = true;
            }
        }
        drop_it
    }
}

#[path = "responses_chunk.rs"]
mod chunk;
pub(crate) use chunk::clears_all;
pub use chunk::process_chunk;

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;

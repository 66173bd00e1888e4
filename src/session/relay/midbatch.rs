//! Simple Queries (and FunctionCalls) sent inside an extended-protocol batch, without
//! prepared-statement tracking (session mode, `max_prepared_statements = 0`).
//!
//! PostgreSQL runs a client's messages in order. After an error in an
//! extended-protocol message (Parse, Bind, Describe, Execute, Close) it skips every
//! message up to the next Sync, Queries and FunctionCalls included: those get no
//! ReadyForQuery, and the relay, which counted one for each, would think the server
//! busy for good (in transaction mode the client would keep it until it left). A
//! Query that runs ends the batch for the server as a Sync does (count.rs). With
//! tracking, the response tracker follows all this (`prepared::undo`); here the relay
//! does:
//!
//! - The client side counts the messages that end in an answer of their own (all the
//!   extended ones but Flush) since the last request end (Query, FunctionCall, Sync).
//!   A Query inside a batch (rare, so nothing more is noted before one) opens a
//!   *stretch*: the requests from its own up to the next Sync, each noted by how many
//!   such messages came before its Query.
//! - The server side lets the ReadyForQuery of the requests before the stretch pass,
//!   then counts the ends of answers (ParseComplete, BindComplete, CloseComplete,
//!   RowDescription or NoData, CommandComplete, EmptyQueryResponse, PortalSuspended)
//!   request by request: all of a request's before any error, and its Query runs (its
//!   ReadyForQuery ends it); an error first, and that Query and each later one of the
//!   stretch are skipped: their ReadyForQuery is not owed, and the server is not idle
//!   before the ReadyForQuery of the client's Sync (`await_ready`).
//! - Stretches queue behind each other when a client pipelines.
//! - A batch the server has partly answered when its Query comes (the client waited
//!   for those answers, with a Flush) starts from the answers the server sent since
//!   its last ReadyForQuery, counted while the client is inside a batch.
//!
//! When the server starts a COPY FROM STDIN while a stretch is followed (it ignores
//! the Syncs sent during one, copy.rs), a Query inside a batch comes during a COPY,
//! or an answer comes that the count did not foresee, following stops until the
//! server goes back: the count stays high, which keeps the server, never low, which
//! could hand an answer on to the next client.

use std::cmp::Ordering;
use std::collections::VecDeque;

use super::count::FLUSHED;
use crate::protocol::header::*;

/// The most Queries one stretch, and the most stretches, followed at once; past
/// either the count is left high.
const MAX_QUERIES: usize = 1024;
const MAX_STRETCHES: usize = 64;

/// What the relay follows of Queries inside batches (see the module docs).
#[derive(Debug, Default)]
pub struct MidBatch {
    /// Server: ends of answers since its last ReadyForQuery, and whether an error
    /// came, counted while the client is inside a batch.
    since: u32,
    since_error: bool,
    /// The stretches followed; none in the common case (no allocation).
    follow: Option<Box<Follow>>,
}

#[derive(Debug)]
struct Follow {
    /// Following stopped (see the module docs) until the server goes back.
    lost: bool,
    stretches: VecDeque<Stretch>,
    /// Requests ended (each owing a ReadyForQuery) since the last stretch's Sync.
    after_last: u32,
    /// The server side, in the front stretch: the request its answers are for, the
    /// ends of answers counted for it, and what comes next.
    at: usize,
    seen: u32,
    phase: Phase,
}

#[derive(Debug)]
struct Stretch {
    /// ReadyForQuery messages to let pass before it: the earlier requests'.
    readies: u32,
    /// For each of its requests ended by a Query or FunctionCall: the messages ending
    /// in an answer before it.
    queries: Vec<u32>,
    /// Its Sync came.
    closed: bool,
    /// The server skips the rest of it.
    skipping: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The answers to the messages before a Query.
    Answers,
    /// The Query runs: up to its ReadyForQuery.
    Query,
    /// An error: up to the ReadyForQuery of the stretch's Sync.
    Skipping,
}

/// Whether a server message ends the answer to one extended-protocol message.
#[inline]
fn ends_answer(tag: u8) -> bool {
    matches!(
        tag,
        TAG_PARSE_COMPLETE
            | TAG_BIND_COMPLETE
            | TAG_CLOSE_COMPLETE
            | TAG_COMMAND_COMPLETE
            | TAG_EMPTY_QUERY_RESPONSE
            | TAG_PORTAL_SUSPENDED
            | TAG_ROW_DESCRIPTION
            | TAG_NO_DATA
    )
}

impl Follow {
    fn new(readies: u32, before: u32) -> Box<Follow> {
        let mut stretches = VecDeque::with_capacity(1);
        stretches.push_back(Stretch::new(readies, before));
        Box::new(Follow {
            lost: false,
            stretches,
            after_last: 0,
            at: 0,
            seen: 0,
            phase: Phase::Answers,
        })
    }

    fn lose(&mut self) {
        self.lost = true;
        self.stretches.clear();
    }
}

impl Stretch {
    fn new(readies: u32, before: u32) -> Stretch {
        Stretch {
            readies,
            queries: vec![before],
            closed: false,
            skipping: false,
        }
    }
}

impl MidBatch {
    /// Whether Queries inside batches are followed now (or following stopped).
    #[inline]
    pub fn following(&self) -> bool {
        self.follow.is_some()
    }

    /// A request ended (Query, FunctionCall, or Sync if not `query`); called when
    /// [`following`](Self::following), or for a Query inside a batch. `unsynced`:
    /// the relay's count of the extended messages since the last request end (those
    /// ending in an answer of their own, and `FLUSHED`); `pending`: the
    /// ReadyForQuery messages owed before this one; `fresh`: a stretch may begin (no
    /// COPY under way, no skip awaited).
    /// True when it is a Query or FunctionCall the server will skip: its
    /// ReadyForQuery is not owed, and the server is not idle before the next one.
    #[cold]
    pub fn request_end(&mut self, query: bool, unsynced: u64, pending: u32, fresh: bool) -> bool {
        // (Past u32::MAX answers are never all seen: the count stays high.)
        let before = u32::try_from(unsynced & !FLUSHED).unwrap_or(u32::MAX);
        let unsynced = unsynced != 0;
        let Some(f) = &mut self.follow else {
            // A Query inside a batch, the first followed.
            let mut f = Follow::new(pending, before);
            if !fresh {
                f.lose();
            } else if pending == 0 {
                // The server owes nothing before this batch: what it answered since
                // its last ReadyForQuery is the batch's start.
                f.seen = self.since;
                if self.since_error {
                    f.phase = Phase::Skipping;
                    f.stretches[0].skipping = true;
                    self.follow = Some(f);
                    return true;
                }
            }
            self.follow = Some(f);
            self.settle();
            return false;
        };
        if f.lost {
            return false;
        }
        match f.stretches.back_mut() {
            Some(s) if !s.closed => {
                if !query {
                    s.closed = true;
                    false
                } else if s.skipping {
                    true
                } else if s.queries.len() >= MAX_QUERIES {
                    f.lose();
                    false
                } else {
                    s.queries.push(before);
                    false
                }
            }
            _ if unsynced && query => {
                if f.stretches.len() >= MAX_STRETCHES {
                    f.lose();
                } else {
                    let readies = std::mem::take(&mut f.after_last);
                    f.stretches.push_back(Stretch::new(readies, before));
                }
                false
            }
            _ => {
                f.after_last = f.after_last.saturating_add(1);
                false
            }
        }
    }

    /// Nothing answered since the server's last ReadyForQuery.
    fn rest(&mut self) {
        (self.since, self.since_error) = (0, false);
    }

    /// At each server read: while the client is outside a batch, nothing read is an
    /// answer to the start of one.
    #[inline]
    pub fn server_read(&mut self, unsynced: bool) {
        if !unsynced {
            self.rest();
        }
    }

    /// Follows one server message by its tag; `unsynced` as at the read's start.
    /// `Some(n)` when it shows the server skipping to the client's next Sync, `n` the
    /// Queries and FunctionCalls counted already that it skips.
    #[inline]
    pub fn server(&mut self, tag: u8, unsynced: bool) -> Option<u32> {
        if self.follow.is_some() {
            return self.walk(tag);
        }
        if unsynced {
            match tag {
                TAG_READY_FOR_QUERY => self.rest(),
                TAG_ERROR_RESPONSE => self.since_error = true,
                t if ends_answer(t) => self.since = self.since.saturating_add(1),
                _ => {}
            }
        }
        None
    }

    #[cold]
    fn walk(&mut self, tag: u8) -> Option<u32> {
        let f = self.follow.as_mut()?;
        if f.lost {
            return None;
        }
        if matches!(tag, TAG_COPY_IN_RESPONSE | TAG_COPY_BOTH_RESPONSE) {
            f.lose();
            return None;
        }
        let s = f.stretches.front_mut()?;
        if s.readies > 0 {
            s.readies -= u32::from(tag == TAG_READY_FOR_QUERY);
            return None;
        }
        match f.phase {
            Phase::Skipping => {
                if tag == TAG_READY_FOR_QUERY {
                    // The stretch's Sync: the server is at rest.
                    self.next_stretch(false);
                }
                None
            }
            Phase::Query => {
                if tag == TAG_READY_FOR_QUERY {
                    (f.at, f.seen, f.phase) = (f.at + 1, 0, Phase::Answers);
                    self.settle();
                }
                None
            }
            Phase::Answers => match tag {
                TAG_ERROR_RESPONSE => {
                    s.skipping = true;
                    f.phase = Phase::Skipping;
                    Some(s.queries.len().saturating_sub(f.at) as u32)
                }
                TAG_READY_FOR_QUERY => {
                    f.lose();
                    None
                }
                t if ends_answer(t) => {
                    f.seen += 1;
                    self.settle();
                    None
                }
                _ => None,
            },
        }
    }

    /// After the server's answers moved on: starts the front stretch's next Query
    /// when the answers before it are all in, or ends the stretch.
    fn settle(&mut self) {
        let Some(f) = self.follow.as_mut() else {
            return;
        };
        let Some(s) = f.stretches.front() else {
            return;
        };
        match s.queries.get(f.at) {
            Some(&before) => match f.seen.cmp(&before) {
                Ordering::Equal => f.phase = Phase::Query,
                Ordering::Greater => f.lose(),
                Ordering::Less => {}
            },
            // Only the Sync's request is left: its ReadyForQuery comes whatever it is.
            None if s.closed => self.next_stretch(true),
            // Caught up with the client, outside any skip: nothing followed is owed.
            None => {
                self.follow = None;
                self.rest();
            }
        }
    }

    /// The front stretch is done; `sync_owed`: its Sync's ReadyForQuery still comes.
    fn next_stretch(&mut self, sync_owed: bool) {
        let Some(f) = self.follow.as_mut() else {
            return;
        };
        f.stretches.pop_front();
        (f.at, f.seen, f.phase) = (0, 0, Phase::Answers);
        match f.stretches.front_mut() {
            Some(next) => {
                next.readies += u32::from(sync_owed);
                // Its first Query may have nothing before it.
                self.settle();
            }
            None => {
                // Every request left owes its one ReadyForQuery: the count is exact.
                self.follow = None;
                self.rest();
            }
        }
    }
}

#[cfg(test)]
#[path = "midbatch_tests.rs"]
mod tests;

//! A `BEGIN` from a client that holds no server and would wait for one (transaction
//! pooling), answered by the pooler and written to a server ahead of the client's
//! next request.
//!
//! Through a transaction pooler a `BEGIN` costs a round trip through the client
//! while a server is held: the server answers it, the answer goes to the client, and
//! the server waits idle until the client's first statement comes back. A `BEGIN` on
//! an idle server takes no snapshot and, plain or with modes no server refuses
//! (`pool/txn_text.rs`), always succeeds, so when every server is busy the pooler
//! answers it itself (CommandComplete, ReadyForQuery `T`: what PostgreSQL sends), and
//! writes a `BEGIN` of its own with the same modes in front of the client's next
//! request, once a server is linked or handed over; the server's answer to that
//! `BEGIN` is cut from the front of the server's bytes before anything else follows
//! them ([`Relay::strip_begin`]). The transaction then holds its server from its
//! first statement, and the client waits in line with that statement instead. With a
//! server free, the `BEGIN` goes to it as before: nothing is gained by holding it. A
//! `COMMIT` or `ROLLBACK` right after a held `BEGIN` is answered too: the transaction
//! ran nothing, and no server need see it. So is a `SET TRANSACTION` of such modes
//! (`START TRANSACTION`, then the isolation level, as some ORMs send them): the
//! `BEGIN` written ahead carries them.

use super::Relay;
use crate::net::bufpool;
use crate::pool::{begin_of, end_tag, set_transaction_of, Modes};
use crate::protocol::header::*;
use crate::protocol::ProtocolError;

/// A held `BEGIN`'s standing in the relay.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Begin {
    #[default]
    No,
    /// The client was answered; a `BEGIN` with these modes goes ahead of this
    /// request.
    Held(Modes),
    /// The `BEGIN` is in `c2s` (or written): its answer is cut from the server's bytes.
    Owed,
    /// Its CommandComplete was cut; its ReadyForQuery is next.
    Completed,
}

/// What [`Relay::take_begin`] took and answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    No,
    /// A `BEGIN` with these modes: one goes ahead of the client's next request.
    Begin(Modes),
    /// A `SET TRANSACTION` after a held `BEGIN`: one with these modes goes ahead.
    Set(Modes),
    /// The end of a held `BEGIN`'s transaction: nothing is owed any more.
    End,
}

/// The most bytes held while the answer to the `BEGIN` is not whole: messages the
/// server sends on its own ahead of it are small.
const MAX_HEAD: usize = 64 * 1024;

/// `SLUICE_HOLD_BEGIN=0` turns this off (read once), for comparing.
static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether held `BEGIN`s are on (`SLUICE_HOLD_BEGIN`).
pub fn hold_begin_enabled() -> bool {
    *ENABLED.get_or_init(|| std::env::var_os("SLUICE_HOLD_BEGIN").is_none_or(|v| v != "0"))
}

impl Relay {
    /// If the client's pending bytes are one simple Query of a `BEGIN` the pooler may
    /// answer ([`begin_of`]) and nothing else, and `must_wait` (the client would wait
    /// for a server), takes them and answers it in the server's stead: the answer
    /// waits in `s2c` for [`Relay::try_pay_client`], and the query is counted as the
    /// server's answer would have counted it. The caller then owes a `BEGIN` ahead of
    /// the client's next request ([`Relay::hold_begin`]). Not with a timeout set that
    /// watches a transaction or an idle client: those follow a server's state.
    ///
    /// With `held` (the modes of a `BEGIN` answered so, and nothing sent since),
    /// takes instead, at once, a `COMMIT` or `ROLLBACK` alone (a transaction that
    /// ran nothing ends the same either way, and no server need see it), or a `SET
    /// TRANSACTION` of modes no server refuses, which the `BEGIN` then carries.
    pub fn take_begin(&mut self, held: Option<Modes>, must_wait: impl FnOnce() -> bool) -> Taken {
        let request = self.prepared.as_ref().map_or(&self.c2s, |p| &p.input);
        let (tag, taken, status): (&[u8], _, _) = if let Some(modes) = held {
            if let Some(tag) = end_tag(request) {
                (tag, Taken::End, b'I')
            } else if let Some(modes) = set_transaction_of(request, modes) {
                (b"SET", Taken::Set(modes), b'T')
            } else {
                return Taken::No;
            }
        } else {
            let Some((tag, modes)) = begin_of(request) else {
                return Taken::No;
            };
            // `query_timeout` times requests, and the `BEGIN` is answered before any
            // could fire; the statement after it is timed from its arrival, its wait
            // in line included, as any other. These time a transaction or an idle
            // client, whose state a server would keep.
            let t = &self.timeouts;
            let timed = !(t.transaction().is_zero()
                && t.idle_transaction().is_zero()
                && t.client_idle().is_zero());
            if timed {
                return Taken::No;
            }
            (tag, Taken::Begin(modes), b'T')
        };
        let busy = self.begin != Begin::No || self.terminated || self.no_simple_query;
        if busy || !self.s2c.is_empty() {
            return Taken::No;
        }
        match self.prepared.as_mut() {
            // Not rewritten yet: the input is the client's bytes as they came.
            Some(p) => {
                // (What follows a held `BEGIN` is answered whether or not the client would
                // wait.)
                if !p.at_rest() || !(held.is_some() || must_wait()) {
                    return Taken::No;
                }
                p.input.clear();
            }
            // Scanned as it was read: one Query, owed one ReadyForQuery.
            None => {
                let at_rest = self.pending == 1
                    && self.unsynced == 0
                    && self.status == b'I'
                    && !self.await_ready
                    && !self.copy.in_copy()
                    && !self.desync
                    && self.client_framer.at_boundary();
                if !at_rest || !(held.is_some() || must_wait()) {
                    return Taken::No;
                }
                self.c2s.clear();
                self.pending = 0;
            }
        }
        self.request_started = None;
        if self.s2c.capacity() == 0 {
            self.s2c = bufpool::take();
        }
        let len = 4 + tag.len() as u32 + 1;
        self.s2c.extend_from_slice(&[TAG_COMMAND_COMPLETE]);
        self.s2c.extend_from_slice(&len.to_be_bytes());
        self.s2c.extend_from_slice(tag);
        self.s2c
            .extend_from_slice(&[0, TAG_READY_FOR_QUERY, 0, 0, 0, 5, status]);
        self.stats.counts.queries += 1;
        if taken == Taken::End {
            // The held transaction, begun and ended: counted as a server's would be.
            self.stats.counts.xacts += 1;
        }
        taken
    }

    /// A `BEGIN` with `modes`, answered by [`Relay::take_begin`], goes to the
    /// server ahead of this request.
    pub fn hold_begin(&mut self, modes: Modes) {
        self.begin = Begin::Held(modes);
    }

    /// Whether a held `BEGIN` goes with this request: its answer must not reach the
    /// client, so no delegate may relay it, and nothing may go behind it.
    pub fn begin_ahead(&self) -> bool {
        self.begin != Begin::No
    }

    /// Puts a held `BEGIN` in front of the request on its way to a server (`c2s`).
    pub(super) fn put_begin_ahead(&mut self) {
        let Begin::Held(modes) = self.begin else {
            return;
        };
        self.begin = Begin::Owed;
        let mut ahead = bufpool::take();
        modes.write_query(&mut ahead);
        ahead.extend_from_slice(&self.c2s);
        bufpool::give(std::mem::replace(&mut self.c2s, ahead));
    }

    /// Cuts the answer to the `BEGIN` written ahead of the request from the server's
    /// bytes read into `s2c[start..]`: its CommandComplete and ReadyForQuery, which
    /// may come after messages the server sends on its own (ParameterStatus, a notice
    /// or a notification, left where they are). `Ok(false)`: the answer is not
    /// whole yet, and the bytes wait in `begin_head` for the next read. Anything
    /// else in its place is an error: such a `BEGIN` on an idle server does not
    /// fail, and the client was told it succeeded.
    pub(super) fn strip_begin(&mut self, start: usize) -> Result<bool, ProtocolError> {
        const BAD: ProtocolError = ProtocolError::Malformed("answer to the pooler's BEGIN");
        if !self.begin_head.is_empty() {
            let mut head = std::mem::take(&mut self.begin_head);
            head.extend_from_slice(&self.s2c[start..]);
            self.s2c.truncate(start);
            self.s2c.extend_from_slice(&head);
        }
        let mut at = start;
        while let Some(&[tag, a, b, c, d]) = self.s2c.get(at..).and_then(|r| r.first_chunk()) {
            let len = u32::from_be_bytes([a, b, c, d]) as usize;
            if len < 4 {
                return Err(BAD);
            }
            let end = at + 1 + len;
            let Some(body) = self.s2c.get(at + 5..end) else {
                break;
            };
            match (tag, self.begin) {
                (TAG_COMMAND_COMPLETE, Begin::Owed) if body == b"BEGIN\0" => {}
                (TAG_READY_FOR_QUERY, Begin::Completed) if body == b"T" => {}
                (TAG_PARAMETER_STATUS | TAG_NOTICE_RESPONSE | TAG_NOTIFICATION_RESPONSE, _) => {
                    at = end;
                    continue;
                }
                _ => return Err(BAD),
            }
            // Cut out: what follows moves up.
            self.s2c.copy_within(end.., at);
            self.s2c.truncate(self.s2c.len() - (end - at));
            if tag == TAG_READY_FOR_QUERY {
                self.begin = Begin::No;
                return Ok(true);
            }
            self.begin = Begin::Completed;
        }
        // Not whole yet (rare: PostgreSQL sends it in one write): kept apart until it
        // is, and nothing of this read goes on before it.
        if self.s2c.len() - start > MAX_HEAD {
            return Err(BAD);
        }
        self.begin_head = self.s2c.split_off(start);
        Ok(false)
    }
}

#[cfg(test)]
#[path = "begin_tests.rs"]
mod tests;

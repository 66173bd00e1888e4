//! A simple Query (or FunctionCall) sent inside an extended-protocol batch, without
//! prepared-statement tracking (session mode, `max_prepared_statements = 0`).
//!
//! PostgreSQL skips every message after an extended-protocol error up to the next
//! Sync, such a Query included: it then gets no ReadyForQuery, and the relay, which
//! counted one for it, would think the server busy for good (in transaction mode the
//! client would keep it until it left). With tracking, the response tracker follows
//! this (`prepared::undo`); here the relay does, for one such Query at a time:
//!
//! - the client side, at such a Query (rare, so nothing is noted before it), reads
//!   back over the headers of the batch before it: how many of its messages end in
//!   an answer of their own (Parse, Bind, Describe, Execute, Close; not Flush), and
//!   how many ReadyForQuery the server owed for earlier requests when it began;
//! - the server side lets those ReadyForQuery pass, then counts the answers' ends:
//!   all of them before any error, and the Query runs; an error first, and it is
//!   skipped, so its ReadyForQuery is not owed, and the server is not idle before
//!   the ReadyForQuery of the client's Sync (`await_ready`).
//!
//! A Query that runs ends the batch for the server as a Sync would (count.rs): its
//! ReadyForQuery `I` lets the server go.
//!
//! Only a batch that began in the same client read as the Query is followed (the
//! server has answered none of it then), and none while a COPY is under way or in
//! the read (the Syncs it may swallow change the count). Otherwise, or with a
//! second such Query under way, the count stays high (the server is kept), as
//! before; a count already too high can only make a wrong guess that leaves it less
//! high, never too low.

use crate::protocol::header::*;

/// What the relay follows of one batch's simple Query (see the module docs).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MidBatch {
    /// The Query being followed: ReadyForQuery messages still to let pass, and
    /// answers still to come before it runs.
    watch: Option<(u32, u32)>,
}

impl MidBatch {
    /// Whether a Query may be followed now.
    #[inline]
    pub fn idle(&self) -> bool {
        self.watch.is_none()
    }

    /// A client read brought, at the end of `read` (whole messages from the read's
    /// start, where no batch was open), a Query or FunctionCall inside a batch;
    /// `pending` is the count of ReadyForQuery owed before the read.
    #[cold]
    pub fn query_in_batch(&mut self, mut read: &[u8], mut pending: u32) {
        if self.watch.is_some() {
            return;
        }
        let (mut answered, mut owed_before, mut in_batch) = (0u32, 0u32, false);
        while let Some((tag, len)) = parse(read) {
            let Some(rest) = read.get(len as usize + 1..) else {
                return;
            };
            read = rest;
            match tag {
                TAG_QUERY | TAG_FUNCTION_CALL | TAG_SYNC => {
                    pending = pending.saturating_add(1);
                    (answered, in_batch) = (0, false);
                }
                TAG_PARSE | TAG_BIND | TAG_DESCRIBE | TAG_EXECUTE | TAG_CLOSE | TAG_FLUSH => {
                    if !in_batch {
                        (in_batch, owed_before) = (true, pending);
                    }
                    answered += u32::from(tag != TAG_FLUSH);
                }
                // COPY messages, or anything else: not followed.
                _ => return,
            }
        }
        if in_batch && answered > 0 {
            self.watch = Some((owed_before, answered));
        }
    }

    /// Follows one server message by its tag; true when it shows that the Query
    /// followed was skipped (its ReadyForQuery will not come).
    #[inline]
    pub fn server(&mut self, tag: u8) -> bool {
        let Some((readies, answers)) = &mut self.watch else {
            return false;
        };
        if *readies > 0 {
            if tag == TAG_READY_FOR_QUERY {
                *readies -= 1;
            }
            return false;
        }
        match tag {
            TAG_ERROR_RESPONSE => {
                self.watch = None;
                true
            }
            TAG_PARSE_COMPLETE
            | TAG_BIND_COMPLETE
            | TAG_CLOSE_COMPLETE
            | TAG_COMMAND_COMPLETE
            | TAG_EMPTY_QUERY_RESPONSE
            | TAG_PORTAL_SUSPENDED
            | TAG_ROW_DESCRIPTION
            | TAG_NO_DATA => {
                *answers -= 1;
                if *answers == 0 {
                    // Every message before the Query was answered: it runs.
                    self.watch = None;
                }
                false
            }
            // Not an answer seen before: give up (the count stays as it is).
            TAG_READY_FOR_QUERY => {
                self.watch = None;
                false
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages of `tags` (empty bodies) as one client read, up to its first
    /// Query or FunctionCall after an extended message, as the relay hands them over.
    fn client(m: &mut MidBatch, tags: &[u8], pending: u32) {
        let mut read = Vec::new();
        let mut unsynced = false;
        for &t in tags {
            if unsynced && matches!(t, TAG_QUERY | TAG_FUNCTION_CALL) {
                m.query_in_batch(&read, pending);
                return;
            }
            unsynced = !matches!(t, TAG_SYNC | TAG_QUERY | TAG_FUNCTION_CALL);
            read.extend_from_slice(&[t, 0, 0, 0, 4]);
        }
    }

    fn skipped(m: &mut MidBatch, tags: &[u8]) -> u32 {
        tags.iter().map(|&t| u32::from(m.server(t))).sum()
    }

    #[test]
    fn an_error_before_the_query_means_it_is_skipped() {
        let mut m = MidBatch::default();
        client(&mut m, b"PBDEQS", 0);
        assert_eq!(skipped(&mut m, b"12EZ"), 1);
        // Without an error it runs, whatever its own answer.
        client(&mut m, b"PBEQS", 0);
        assert_eq!(skipped(&mut m, b"12DCTDCZZ"), 0);
        client(&mut m, b"PBEQS", 0);
        assert_eq!(skipped(&mut m, b"12CEZZ"), 0);
    }

    #[test]
    fn earlier_requests_answers_pass_first() {
        let mut m = MidBatch::default();
        // An earlier Query, failing: its error is not the batch's.
        client(&mut m, b"QPBEFS", 0);
        assert_eq!(skipped(&mut m, b"EZ12C"), 0);
        assert!(m.idle());
        // One from an earlier read too.
        client(&mut m, b"QPBEFS", 1);
        assert_eq!(skipped(&mut m, b"ZTDCZ1EZ"), 1);
    }

    #[test]
    fn copy_messages_are_not_followed() {
        let mut m = MidBatch::default();
        client(&mut m, b"PBEdcQS", 0);
        assert!(m.idle());
    }

    #[test]
    fn one_query_at_a_time_and_none_without_an_answered_message_before_it() {
        let mut m = MidBatch::default();
        client(&mut m, b"HQS", 0);
        assert!(m.idle());
        client(&mut m, b"PQS", 0);
        // A second while the first is followed: left counted.
        m.query_in_batch(&[b'B', 0, 0, 0, 4], 0);
        assert_eq!(skipped(&mut m, b"EZ"), 1);
    }
}

//! A simple Query (or FunctionCall) sent inside an extended-protocol batch, without
//! prepared-statement tracking (session mode, `max_prepared_statements = 0`).
//!
//! PostgreSQL skips every message after an extended-protocol error up to the next
//! Sync, such a Query included: it then gets no ReadyForQuery, and the relay, which
//! counted one for it, would think the server busy for good (in transaction mode the
//! client would keep it until it left). With tracking, the response tracker follows
//! this (`prepared::undo`); here the relay does, for one such Query at a time:
//!
//! - the client side notes how many extended messages before the Query end in an
//!   answer of their own (Parse, Bind, Describe, Execute, Close; not Flush), and how
//!   many ReadyForQuery the server owed for earlier requests when the batch began;
//! - the server side lets those ReadyForQuery pass, then counts the answers' ends:
//!   all of them before any error, and the Query runs; an error first, and it is
//!   skipped, so its ReadyForQuery is not owed.
//!
//! Only a batch that began in the same client read as the Query is followed: the
//! server has answered none of it then. Otherwise, or with a second such Query under
//! way, the count stays high (the server is kept), as before; a count already too
//! high can only make a wrong guess that leaves it less high, never too low.

use crate::protocol::header::*;

/// What the relay follows of one batch's simple Query (see the module docs).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MidBatch {
    /// Answered extended messages since the client's last Sync.
    answered: u32,
    /// ReadyForQuery messages owed for earlier requests when the batch began.
    owed_before: u32,
    /// Extended messages were sent since the last Sync.
    in_batch: bool,
    /// The batch began in the client read being scanned.
    began_here: bool,
    /// The Query being followed: ReadyForQuery messages still to let pass, and
    /// answers still to come before it runs.
    watch: Option<(u32, u32)>,
}

impl MidBatch {
    /// A new client read is about to be scanned.
    #[inline]
    pub fn new_read(&mut self) {
        self.began_here = false;
    }

    /// Follows one client message; `pending` is the count of ReadyForQuery owed
    /// before it. Returns nothing: the count changes only on the server's side.
    #[inline]
    pub fn client(&mut self, tag: u8, pending: u32) {
        match tag {
            TAG_SYNC => {
                self.answered = 0;
                self.in_batch = false;
            }
            TAG_PARSE | TAG_BIND | TAG_DESCRIBE | TAG_EXECUTE | TAG_CLOSE | TAG_FLUSH => {
                if !self.in_batch {
                    self.in_batch = true;
                    self.began_here = true;
                    self.owed_before = pending;
                }
                if tag != TAG_FLUSH {
                    self.answered = self.answered.saturating_add(1);
                }
            }
            TAG_QUERY | TAG_FUNCTION_CALL
                if self.in_batch
                    && self.began_here
                    && self.answered > 0
                    && self.watch.is_none() =>
            {
                self.watch = Some((self.owed_before, self.answered));
            }
            _ => {}
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

    fn client(m: &mut MidBatch, tags: &[u8], pending: &mut u32) {
        for &t in tags {
            m.client(t, *pending);
            if matches!(t, TAG_QUERY | TAG_SYNC | TAG_FUNCTION_CALL) {
                *pending += 1;
            }
        }
    }

    fn skipped(m: &mut MidBatch, tags: &[u8]) -> u32 {
        tags.iter().map(|&t| u32::from(m.server(t))).sum()
    }

    #[test]
    fn an_error_before_the_query_means_it_is_skipped() {
        let (mut m, mut pending) = (MidBatch::default(), 0);
        m.new_read();
        client(&mut m, b"PBDEQS", &mut pending);
        assert_eq!(pending, 2);
        assert_eq!(skipped(&mut m, b"12EZ"), 1);
        // Without an error it runs, whatever its own answer.
        m.new_read();
        client(&mut m, b"PBEQS", &mut pending);
        assert_eq!(skipped(&mut m, b"12DCTDCZZ"), 0);
        m.new_read();
        client(&mut m, b"PBEQS", &mut pending);
        assert_eq!(skipped(&mut m, b"12CEZZ"), 0);
    }

    #[test]
    fn earlier_requests_answers_pass_first() {
        let (mut m, mut pending) = (MidBatch::default(), 0);
        m.new_read();
        // An earlier Query, failing: its error is not the batch's.
        client(&mut m, b"QPBEFS", &mut pending);
        assert_eq!(skipped(&mut m, b"EZ12C"), 0);
        let (mut m, mut pending) = (MidBatch::default(), 0);
        m.new_read();
        client(&mut m, b"QPBEFS", &mut pending);
        assert_eq!(skipped(&mut m, b"TDCZ1EZ"), 1);
    }

    #[test]
    fn a_batch_begun_in_an_earlier_read_is_not_followed() {
        let (mut m, mut pending) = (MidBatch::default(), 0);
        m.new_read();
        client(&mut m, b"PB", &mut pending);
        m.new_read();
        client(&mut m, b"EQS", &mut pending);
        assert_eq!(skipped(&mut m, b"12EZ"), 0);
    }

    #[test]
    fn one_query_at_a_time_and_none_without_an_answered_message_before_it() {
        let (mut m, mut pending) = (MidBatch::default(), 0);
        m.new_read();
        client(&mut m, b"HQS", &mut pending);
        assert_eq!(skipped(&mut m, b"EZZ"), 0);
        let (mut m, mut pending) = (MidBatch::default(), 0);
        m.new_read();
        client(&mut m, b"PQEQS", &mut pending);
        // The first is followed; the second is left counted.
        assert_eq!(skipped(&mut m, b"EZ"), 1);
    }
}

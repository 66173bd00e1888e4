//! COPY FROM STDIN and the Syncs PostgreSQL ignores during it.
//!
//! The server ignores Sync (and Flush) while it reads COPY data. libpq's
//! `PQexecParams` and tokio-postgres's `copy_in` send Bind, Execute and a Sync for a
//! COPY, then the data, CopyDone and a second Sync, and get one ReadyForQuery for the
//! two Syncs. The relay counts one ReadyForQuery owed per Sync, so it must learn
//! which Syncs went unanswered, or it would keep the server for ever after a COPY.
//!
//! What the server says decides it:
//! - the COPY ends with CommandComplete: the server read the client's CopyDone, and
//!   every Sync the client sent between the COPY's Execute (or Query) and that
//!   CopyDone was read during the COPY and ignored;
//! - the COPY ends with an error: the server skips to the next Sync if the COPY came
//!   by Execute. The Syncs sent right after the Execute, before any copy message,
//!   were read (and ignored) before any data could fail. The one way they might not
//!   have been is a cancel or timeout in the instant between CopyInResponse and the
//!   first read; then one ReadyForQuery more comes than counted, so a server after a
//!   failed COPY by Execute is closed rather than reused (`CopyEnd::failed_execute`).
//!
//! The client side is followed as its messages go out (`count_client_tag`), the
//! server side as its messages come in; a client that does not wait for
//! CopyInResponse before its data is not followed (then the count errs high, which
//! keeps the server, never low, which could hand on an answer to the next client).

use crate::protocol::header::TAG_COPY_DATA;

/// The client's Syncs around a COPY, and whether the server is in one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyWatch {
    /// The server sent CopyInResponse and has not ended that COPY yet.
    in_copy: bool,
    /// The client's last Execute, Query or FunctionCall was an Execute.
    after_execute: bool,
    /// A copy message (CopyData, CopyDone, CopyFail) came after it.
    copying: bool,
    /// Syncs the client sent after it; of those, the ones before any copy message.
    syncs: u32,
    leading: u32,
    /// The counts at the client's first CopyDone or CopyFail during the server's COPY.
    at_end: Option<AtEnd>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AtEnd {
    syncs: u32,
    leading: u32,
    after_execute: bool,
}

/// What the end of a COPY means for the count of ReadyForQuery owed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyEnd {
    /// Syncs the server ignored: ReadyForQuery messages that will not come.
    pub ignored: u32,
    /// The COPY came by Execute and failed: the server now skips to the client's next
    /// Sync (the server is not idle until a ReadyForQuery), and is not to be reused.
    pub failed_execute: bool,
}

impl CopyWatch {
    /// The client sent a Sync.
    #[inline]
    pub fn sync(&mut self) {
        self.syncs = self.syncs.saturating_add(1);
        if !self.copying {
            self.leading = self.leading.saturating_add(1);
        }
    }

    /// The client sent a request that may start a COPY: an Execute (`execute`), a
    /// Query or a FunctionCall.
    #[inline]
    pub fn start(&mut self, execute: bool) {
        self.after_execute = execute;
        self.copying = false;
        self.syncs = 0;
        self.leading = 0;
    }

    /// The client sent CopyData, CopyDone or CopyFail.
    pub fn copy_message(&mut self, tag: u8) {
        self.copying = true;
        // The first CopyDone/CopyFail ends the server's COPY; later ones it ignores.
        if tag != TAG_COPY_DATA && self.in_copy && self.at_end.is_none() {
            self.at_end = Some(AtEnd {
                syncs: self.syncs,
                leading: self.leading,
                after_execute: self.after_execute,
            });
        }
    }

    /// Whether the server is reading COPY data.
    #[inline]
    pub fn in_copy(&self) -> bool {
        self.in_copy
    }

    /// The server sent CopyInResponse.
    pub fn server_copy_in(&mut self) {
        self.in_copy = true;
        self.at_end = None;
    }

    /// The server ended its COPY: with CommandComplete (`ok`) or an error.
    pub fn server_copy_end(&mut self, ok: bool) -> CopyEnd {
        if !self.in_copy {
            return CopyEnd::default();
        }
        let (if_ok, if_failed) = self.ignores();
        self.in_copy = false;
        self.at_end = None;
        if ok {
            CopyEnd {
                ignored: if_ok,
                failed_execute: false,
            }
        } else {
            CopyEnd {
                ignored: if_failed.unwrap_or(0),
                failed_execute: if_failed.is_some(),
            }
        }
    }

    /// The Syncs ignored if the server's COPY ended now, with CommandComplete and
    /// with an error (`None`: a COPY by simple Query, whose ReadyForQuery follows its
    /// error); as if it had begun, since its CopyInResponse may be in the same chunk
    /// as its end (for the response tracker, which sees that end before the relay
    /// does). Without the client's CopyDone seen during the COPY, a CommandComplete
    /// ignores nothing known; without its CopyFail or CopyDone, an error finds the
    /// COPY's own request still the client's last.
    pub fn ignores(&self) -> (u32, Option<u32>) {
        let ok = self.at_end.map_or(0, |e| e.syncs);
        let (leading, after_execute) =
            self.at_end.map_or((self.leading, self.after_execute), |e| {
                (e.leading, e.after_execute)
            });
        (ok, after_execute.then_some(leading))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(w: &mut CopyWatch, tags: &[u8]) {
        for &t in tags {
            match t {
                b'S' => w.sync(),
                b'E' => w.start(true),
                b'Q' | b'F' => w.start(false),
                b'd' | b'c' | b'f' => w.copy_message(t),
                _ => {}
            }
        }
    }

    #[test]
    fn copy_by_execute_ignores_the_syncs_before_copydone() {
        let mut w = CopyWatch::default();
        feed(&mut w, b"BES");
        w.server_copy_in();
        feed(&mut w, b"ddcS");
        assert_eq!(
            w.server_copy_end(true),
            CopyEnd {
                ignored: 1,
                failed_execute: false
            }
        );
        assert!(!w.in_copy());
        // Nothing more for a second end.
        assert_eq!(w.server_copy_end(true), CopyEnd::default());
    }

    #[test]
    fn a_failed_copy_by_execute_ignores_the_leading_syncs_only() {
        let mut w = CopyWatch::default();
        feed(&mut w, b"BES");
        w.server_copy_in();
        feed(&mut w, b"dSd");
        let end = w.server_copy_end(false);
        assert_eq!(end.ignored, 1);
        assert!(end.failed_execute);
        // The same when the error comes before any data, or after CopyFail and more.
        let mut w = CopyWatch::default();
        feed(&mut w, b"BESS");
        w.server_copy_in();
        assert_eq!(w.ignores().1, Some(2));
        feed(&mut w, b"fSBES");
        assert_eq!(w.server_copy_end(false).ignored, 2);
    }

    #[test]
    fn copy_by_query_is_answered_by_its_own_readyforquery() {
        let mut w = CopyWatch::default();
        feed(&mut w, b"Q");
        w.server_copy_in();
        feed(&mut w, b"dc");
        assert_eq!(w.server_copy_end(true), CopyEnd::default());
        feed(&mut w, b"Q");
        w.server_copy_in();
        feed(&mut w, b"d");
        assert_eq!(w.server_copy_end(false), CopyEnd::default());
    }

    #[test]
    fn copydone_before_copyinresponse_is_not_followed() {
        // A client that does not wait: the count is left high (the server is kept).
        let mut w = CopyWatch::default();
        feed(&mut w, b"BESdcS");
        w.server_copy_in();
        assert_eq!(w.server_copy_end(true), CopyEnd::default());
    }

    #[test]
    fn requests_pipelined_after_copydone_do_not_change_its_count() {
        let mut w = CopyWatch::default();
        feed(&mut w, b"BES");
        w.server_copy_in();
        feed(&mut w, b"dcSBESQ");
        assert_eq!(w.server_copy_end(true).ignored, 1);
    }
}

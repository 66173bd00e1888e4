//! What the server owes for each client message the relay passes on: one
//! ReadyForQuery per Query, FunctionCall and Sync (less the Syncs a COPY swallows,
//! copy.rs), and whether extended-protocol messages wait for a Sync; the scan of a
//! client read that does it, and notices a Query inside a batch (midbatch.rs).

use super::copy::CopyWatch;
use super::{Relay, PQEXEC_DISALLOWED};
use crate::protocol::header::*;
use crate::protocol::ProtocolError;
use crate::session::framer::{Body, Event};

/// In `Relay::unsynced`: a Flush came (it ends in no answer of its own).
pub(in crate::session::relay) const FLUSHED: u64 = 1 << 63;

/// What [`count_client_tag`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::session::relay) enum Counted {
    /// A Query, FunctionCall or Sync: the end of a request, and what `unsynced` was
    /// before it.
    End(u64),
    Terminate,
    Other,
    /// No frontend message type (nor one a logged-in client may send): the session
    /// ends on it, and it goes to no server (PgBouncer's `unknown pkt`).
    Unknown,
}

/// Counts one client message: what the server will owe for it, the extended messages
/// since the last request end (`unsynced`: those that end in an answer of their own,
/// and [`FLUSHED`]; midbatch.rs needs the count), and the parse/bind statistics.
#[inline]
pub(in crate::session::relay) fn count_client_tag(
    tag: u8,
    pending: &mut u32,
    unsynced: &mut u64,
    (parses, binds): (&mut u64, &mut u64),
    copy: &mut CopyWatch,
) -> Counted {
    // (`unsynced` counts one per message: a u64 never overflows.)
    match tag {
        TAG_QUERY | TAG_FUNCTION_CALL => {
            *pending += 1;
            // Ends a batch as a Sync does, for the server's state: if it runs, the
            // messages before it are done and its ReadyForQuery comes after them; if
            // an error skips it, the server is not idle before the client's Sync
            // (midbatch.rs, the tracker's `skipping`).
            copy.start(false);
            return Counted::End(std::mem::take(unsynced));
        }
        TAG_SYNC => {
            *pending += 1;
            copy.sync();
            return Counted::End(std::mem::take(unsynced));
        }
        TAG_PARSE => {
            *parses += 1;
            *unsynced += 1;
        }
        TAG_BIND => {
            *binds += 1;
            *unsynced += 1;
        }
        TAG_EXECUTE => {
            *unsynced += 1;
            copy.start(true);
        }
        TAG_DESCRIBE | TAG_CLOSE => *unsynced += 1,
        TAG_FLUSH => *unsynced |= FLUSHED,
        TAG_COPY_DATA | TAG_COPY_DONE | TAG_COPY_FAIL => copy.copy_message(tag),
        TAG_TERMINATE => return Counted::Terminate,
        _ => return Counted::Unknown,
    }
    Counted::Other
}

impl Relay {
    /// Follows the client messages in `c2s[start..]`: counts what the server owes and
    /// cuts Terminate off.
    pub(super) fn scan_client(&mut self, start: usize) -> Result<(), ProtocolError> {
        let mut cut = None;
        // A Query inside a batch may begin to be followed (midbatch.rs).
        let fresh = !self.copy.in_copy() && !self.await_ready;
        let (pending, unsynced, terminated, await_ready) = (
            &mut self.pending,
            &mut self.unsynced,
            &mut self.terminated,
            &mut self.await_ready,
        );
        let (parses, binds, copy) = (
            &mut self.stats.counts.client_parses,
            &mut self.stats.counts.binds,
            &mut self.copy,
        );
        let mid = &mut self.mid;
        let (mut desync, mut refused) = (false, false);
        let mut unknown = None;
        let no_simple_query = self.no_simple_query;
        let r = self
            .client_framer
            .feed(&self.c2s[start..], self.max_packet, |e| {
                if let Event::Start { tag, at, .. } = e {
                    if *terminated {
                        return Body::Skip;
                    }
                    refused |= no_simple_query && tag == TAG_QUERY;
                    match count_client_tag(tag, pending, unsynced, (parses, binds), copy) {
                        Counted::Other => {}
                        Counted::Unknown => {
                            unknown.get_or_insert(tag);
                        }
                        Counted::End(before) => {
                            let query = tag != TAG_SYNC;
                            if ((before != 0 && query) || mid.following())
                                && mid.request_end(query, before, *pending - 1, fresh)
                            {
                                // The server skips it: no ReadyForQuery for it, and
                                // none other before the client's Sync.
                                *pending -= 1;
                                *await_ready = true;
                            }
                        }
                        Counted::Terminate => {
                            *terminated = true;
                            match at {
                                Some(at) => cut = Some(start + at),
                                None => desync = true,
                            }
                        }
                    }
                }
                Body::Skip
            });
        self.desync |= desync;
        if let Some(tag) = unknown {
            // None of it goes to a server (it would end the server's session too).
            self.c2s.clear();
            return Err(ProtocolError::UnknownMessage(tag));
        }
        if refused {
            // None of it goes to a server: the session ends on this error.
            self.c2s.clear();
            return Err(ProtocolError::Refused(PQEXEC_DISALLOWED));
        }
        if let Some(cut) = cut {
            // Terminate is the pooler's business, not the server's.
            self.c2s.truncate(cut);
        }
        r
    }
}

/// The protocol error a client read failed with (`read_client` carries the scan's
/// error in an `InvalidData` I/O error).
pub(super) fn client_protocol(e: std::io::Error) -> super::Outcome {
    let scanned = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ProtocolError>())
        .cloned();
    super::Outcome::ClientProtocol(
        scanned.unwrap_or(ProtocolError::Malformed("invalid message length")),
    )
}

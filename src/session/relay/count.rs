//! What the server owes for each client message the relay passes on: one
//! ReadyForQuery per Query, FunctionCall and Sync (less the Syncs a COPY swallows,
//! copy.rs), and whether extended-protocol messages wait for a Sync; the scan of a
//! client read that does it, and notices a Query inside a batch (midbatch.rs).

use super::copy::CopyWatch;
use super::{Relay, PQEXEC_DISALLOWED};
use crate::protocol::header::*;
use crate::protocol::ProtocolError;
use crate::session::framer::{Body, Event};

/// Counts one client message: what the server will owe for it and the parse/bind
/// statistics. Returns true for Terminate.
pub(in crate::session::relay) fn count_client_tag(
    tag: u8,
    pending: &mut u32,
    unsynced: &mut bool,
    (parses, binds): (&mut u64, &mut u64),
    copy: &mut CopyWatch,
) -> bool {
    match tag {
        TAG_QUERY | TAG_FUNCTION_CALL => {
            *pending += 1;
            // Ends a batch as a Sync does, for the server's state: if it runs, the
            // messages before it are done and its ReadyForQuery comes after them; if
            // an error skips it, the server is not idle before the client's Sync
            // (midbatch.rs, the tracker's `skipping`).
            *unsynced = false;
            copy.start(false);
        }
        TAG_SYNC => {
            *pending += 1;
            *unsynced = false;
            copy.sync();
        }
        TAG_PARSE => {
            *parses += 1;
            *unsynced = true;
        }
        TAG_BIND => {
            *binds += 1;
            *unsynced = true;
        }
        TAG_EXECUTE => {
            *unsynced = true;
            copy.start(true);
        }
        TAG_DESCRIBE | TAG_CLOSE | TAG_FLUSH => *unsynced = true,
        TAG_COPY_DATA | TAG_COPY_DONE | TAG_COPY_FAIL => copy.copy_message(tag),
        TAG_TERMINATE => return true,
        _ => {}
    }
    false
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
        let (parses, binds, copy, mid) = (
            &mut self.stats.counts.client_parses,
            &mut self.stats.counts.binds,
            &mut self.copy,
            &mut self.mid,
        );
        let (mut desync, mut refused) = (false, false);
        let no_simple_query = self.no_simple_query;
        let r = self
            .client_framer
            .feed(&self.c2s[start..], self.max_packet, |e| {
                if let Event::Start { tag, at, .. } = e {
                    if *terminated {
                        return Body::Skip;
                    }
                    refused |= no_simple_query && tag == TAG_QUERY;
                    let skipped = mid.client(tag, *unsynced, *pending, fresh);
                    if count_client_tag(tag, pending, unsynced, (parses, binds), copy) {
                        *terminated = true;
                        match at {
                            Some(at) => cut = Some(start + at),
                            None => desync = true,
                        }
                    }
                    if skipped {
                        // The server skips it: no ReadyForQuery for it, and none other
                        // before the client's Sync.
                        *pending -= 1;
                        *await_ready = true;
                    }
                }
                Body::Skip
            });
        self.desync |= desync;
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

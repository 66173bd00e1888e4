//! COPY FROM STDIN by Execute in the response tracker: the server ignores the Syncs
//! the client sends during it (`session::relay::copy` explains which), so their
//! queued ReadyForQuery answers must go when the COPY ends, or the tracker would wait
//! for them for ever.

use super::responses::{Expect, Kind, ResponseTracker};
use super::{ClientStatements, ServerStatements};

impl ResponseTracker {
    /// Follows CopyInResponse and the end of the COPY it starts; called after the
    /// message's own handling (so an error has already skipped to the first Sync).
    /// The relay sets `in_copy` before each chunk too: the COPY may have begun while
    /// the request was not tracked.
    pub(super) fn follow_copy(
        &mut self,
        tag: u8,
        client: &mut ClientStatements,
        server: &mut ServerStatements,
    ) {
        match tag {
            // Whatever asked for it: a simple Query's COPY ignores no Sync a sane
            // client sends (`copy_ignores` is 0 then).
            b'G' => self.in_copy = true,
            b'C' | b'E' => {
                self.in_copy = false;
                let (ok, failed) = self.copy_ignores;
                let ignored = if tag == b'C' { ok } else { failed.unwrap_or(0) };
                for _ in 0..ignored {
                    match self.queue.front() {
                        // A Sync sent before the request was tracked is owed as
                        // "until ready" (`Relay::rewrite_pending`).
                        Some(Expect::Forward {
                            kind: Kind::Sync | Kind::UntilReady,
                            undo: None,
                        }) => {
                            self.queue.pop_front();
                        }
                        _ => break,
                    }
                }
                if tag == b'E' && failed.is_some() {
                    // Skipping now ends only at a Sync the client has yet to send.
                    let sync_owed = self.queue.iter().any(|e| {
                        matches!(
                            e,
                            Expect::Forward {
                                kind: Kind::Sync,
                                ..
                            }
                        )
                    });
                    if !sync_owed {
                        self.skip_to_sync(client, server);
                    }
                }
            }
            _ => {}
        }
    }
}

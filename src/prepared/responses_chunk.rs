//! A chunk of server bytes through the response tracker (responses.rs): the framer
//! walks its messages, the tracker says what to drop or add, and the edits are applied.

use super::{Edit, ResponseTracker};
use crate::prepared::{ClientStatements, Registry, ServerStatements};

/// Why a Bind or Describe of a statement Sluice believed the server had failed, when
/// Sluice can mend it.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// "cached plan must not change result type": the statement needs a new plan.
    Stale,
    /// The server no longer has the statement (dropped by a request Sluice did not
    /// follow, such as a DEALLOCATE inside a multi-statement query).
    Missing,
}

fn failure(body: &[u8], server_name: &str) -> Option<Failure> {
    let f = crate::protocol::backend::parse_error_fields(body).ok()?;
    if f.code == "0A000"
        && f.message
            .contains("cached plan must not change result type")
    {
        return Some(Failure::Stale);
    }
    let missing = format!("prepared statement \"{server_name}\" does not exist");
    (f.code == "26000" && f.message == missing).then_some(Failure::Missing)
}

/// Whether a CommandComplete tag says every prepared statement of the session is gone.
pub(crate) fn clears_all(tag: &[u8]) -> bool {
    let tag = tag.strip_suffix(b"\0").unwrap_or(tag);
    tag == b"DISCARD ALL" || tag == b"DEALLOCATE ALL"
}

/// Follows one chunk of server bytes through the framer, applying the tracker's edits.
/// `chunk` is replaced by the edited bytes when anything changed.
pub fn process_chunk(
    tracker: &mut ResponseTracker,
    framer: &mut crate::session::framer::Framer,
    chunk: &mut bytes::BytesMut,
    client: &mut ClientStatements,
    server: &mut ServerStatements,
    registry: &Registry,
    mut on_event: impl FnMut(crate::session::framer::Event<'_>) -> crate::session::framer::Body,
) -> Result<(), crate::protocol::ProtocolError> {
    use crate::session::framer::Event;
    let mut edits = Vec::new();
    let chunk_len = chunk.len();
    if tracker.drop_left > 0 {
        // The rest of a dropped message.
        let n = tracker.drop_left.min(chunk_len);
        edits.push(Edit::Delete(0, n));
        tracker.drop_left -= n;
    }
    let mut dropping = false;
    // Most chunks answer simple queries: then only ReadyForQuery matters to the tracker
    // (`on_message` changes nothing for any other message, and cannot make it unplain).
    let plain = tracker.is_plain();
    let mut calm = tracker.calm();
    // Server messages are trusted for length (PostgreSQL bounds them itself).
    framer.feed(chunk, u32::MAX, |e| {
        if let Event::Start { tag, len, at } = e {
            // (A message that ends in a later chunk takes the long way: answers of
            // Sluice's due after it must wait for its end.)
            let whole_here = at.is_some_and(|a| a + 5 + len <= chunk_len);
            if (!plain || tag == b'Z') && !(calm && whole_here && tracker.pass_through(tag)) {
                dropping =
                    tracker.on_message((tag, len, at), chunk_len, client, server, &mut edits);
                calm = tracker.calm();
            } else {
                dropping = false;
            }
        }
        if dropping {
            // The relay never sees what Sluice asked for itself (its ReadyForQuery
            // must not count against what the client is owed).
            return crate::session::framer::Body::Skip;
        }
        match e {
            // CommandComplete is read (it is small) to see DISCARD ALL / DEALLOCATE
            // ALL succeed, whichever protocol carried them.
            Event::Start { tag: b'C', len, .. } if len <= 64 => {
                on_event(e);
                crate::session::framer::Body::Capture
            }
            Event::Complete { tag: b'C', body } => {
                if clears_all(body) {
                    server.clear();
                    client.clear();
                }
                crate::session::framer::Body::Skip
            }
            // The error of a Bind whose statement may have gone stale: read it.
            Event::Start { tag: b'E', len, .. } if len <= 8192 && tracker.suspect.is_some() => {
                on_event(e);
                crate::session::framer::Body::Capture
            }
            Event::Complete { tag: b'E', body } => {
                let held = tracker.held_error.take();
                if let Some(stmt) = tracker.suspect.take() {
                    let failed = failure(body, &stmt.server_name);
                    match failed {
                        Some(Failure::Stale) => {
                            // PostgreSQL keeps failing this plan: give the text a new
                            // statement (a new server name), so the next Bind
                            // re-prepares. (The server keeps the old one until evicted:
                            // other clients still naming it get the same error, then
                            // move on too.)
                            let fresh = registry.replace(&stmt);
                            client.repoint(stmt.id, &fresh);
                        }
                        // Prepared again by the next Bind of it on this server.
                        Some(Failure::Missing) => server.forget(stmt.id),
                        None => {}
                    }
                    if failed.is_some() && held.is_some() && tracker.start_retry() {
                        // The client never sees this error: its batch runs again.
                        return crate::session::framer::Body::Skip;
                    }
                }
                if let Some((index, start)) = held {
                    // Not retried after all: the error goes out where it was.
                    edits[index] = Edit::Delete(start, start);
                }
                on_event(Event::Complete { tag: b'E', body })
            }
            e => on_event(e),
        }
    })?;
    if framer.at_boundary() && tracker.flush_after_current {
        tracker.flush_after_current = false;
        let mut synth = Vec::new();
        tracker.drain_synthesized(&mut synth);
        if !synth.is_empty() {
            edits.push(Edit::Insert(chunk_len, synth));
        }
    }
    let partial = framer.partial_header_len();
    if partial > 0 {
        // Hold a split header back: the message it starts may have to be dropped.
        let from = chunk_len - partial.min(chunk_len);
        tracker.held.extend_from_slice(&chunk[from..]);
        edits.push(Edit::Delete(from, chunk_len));
    }
    if edits.is_empty() {
        return Ok(());
    }
    // Stable by position: inserts at one offset keep their order.
    edits.sort_by_key(|e| match e {
        Edit::Delete(a, _) => (*a, 1),
        Edit::Insert(a, _) => (*a, 0),
    });
    let mut out = bytes::BytesMut::with_capacity(chunk_len + 16);
    let mut pos = 0;
    for e in edits {
        match e {
            Edit::Insert(at, bytes) => {
                let at = at.max(pos);
                out.extend_from_slice(&chunk[pos..at]);
                out.extend_from_slice(&bytes);
                pos = at;
            }
            Edit::Delete(a, b) => {
                let a = a.max(pos);
                out.extend_from_slice(&chunk[pos..a]);
                pos = b.max(a);
            }
        }
    }
    out.extend_from_slice(&chunk[pos.min(chunk_len)..]);
    *chunk = out;
    Ok(())
}

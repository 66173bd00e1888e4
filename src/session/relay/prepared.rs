//! The relay's prepared-statement mode: client bytes go through the rewriter once a
//! server is linked, server bytes through the response tracker.

use std::sync::Arc;

use bytes::BytesMut;

use super::{count_client_tag, Outcome, Relay};
use crate::pool::ServerConn;
use crate::prepared::responses::{process_chunk, Expect, Kind, ResponseTracker};
use crate::prepared::rewrite::{pass, plain_request, Ctx, RewriteError, Rewriter};
use crate::prepared::{ClientStatements, Registry, ServerStatements};
use crate::protocol::header::{TAG_READY_FOR_QUERY, TAG_TERMINATE};
use crate::protocol::ProtocolError;
use crate::session::framer::{Body, Event, Framer};

/// What of a client's prepared-statement state outlives a request: its statements.
#[derive(Debug)]
pub struct ClientPrepared {
    registry: Arc<Registry>,
    client: ClientStatements,
    /// `max_prepared_statements`.
    max: usize,
}

impl ClientPrepared {
    pub fn new(registry: Arc<Registry>, max: usize) -> ClientPrepared {
        ClientPrepared {
            registry,
            client: ClientStatements::default(),
            max,
        }
    }
}

/// One client's prepared-statement state during a request.
#[derive(Debug)]
pub(super) struct PreparedState {
    pub(super) kept: Box<ClientPrepared>,
    tracker: ResponseTracker,
    rewriter: Rewriter,
    /// Client bytes not yet rewritten.
    pub(super) input: BytesMut,
    pub(super) mode: Mode,
}

/// How a request's bytes go, decided at its first rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Nothing rewritten yet.
    Fresh,
    /// Only requests that need no rewriting (simple queries, the unnamed statement:
    /// see [`plain_request`]): relayed as without prepared-statement mode. Their
    /// answers need no tracking (nothing is synthesized, swallowed or undone for
    /// them); only a DISCARD ALL or DEALLOCATE ALL among them matters, which clears
    /// the statements: so while the client or the server holds some, the answers go
    /// through the tracker with nothing queued, which then looks at nothing but
    /// ReadyForQuery and short CommandCompletes ([`PreparedState::watches`]).
    Plain,
    /// Through the rewriter and the response tracker, until the request ends.
    Tracked,
}

impl PreparedState {
    /// Whether nothing is owed or half-processed, so the server may go back.
    pub(super) fn is_idle(&self) -> bool {
        self.tracker.is_idle() && self.rewriter.at_boundary() && self.input.is_empty()
    }

    pub(super) fn has_input(&self) -> bool {
        !self.input.is_empty()
    }

    /// Whether the next client message is Terminate (so no server is needed).
    pub(super) fn starts_with_terminate(&self) -> bool {
        self.rewriter.at_boundary() && self.input.first() == Some(&TAG_TERMINATE)
    }

    /// Whether the buffered input holds a Terminate message (walking its headers;
    /// only while the client waits for a server, so nothing is rewritten yet).
    pub(super) fn has_terminate(&self) -> bool {
        if !self.rewriter.at_boundary() {
            return false;
        }
        let mut rest = &self.input[..];
        while let Some((tag, len)) = crate::protocol::header::parse(rest) {
            if tag == TAG_TERMINATE {
                return true;
            }
            match rest.get(len as usize + 1..) {
                Some(next) if len >= 4 => rest = next,
                _ => break,
            }
        }
        false
    }

    /// A request's state around the client's statements, reading into `input` (an
    /// empty buffer, or one with no capacity yet).
    pub(super) fn new(kept: Box<ClientPrepared>, input: BytesMut) -> PreparedState {
        PreparedState {
            kept,
            tracker: ResponseTracker::default(),
            rewriter: Rewriter::default(),
            input,
            mode: Mode::Fresh,
        }
    }

    /// Ends the request: the statements stay with the client, the (empty) input
    /// buffer is returned for reuse.
    pub(super) fn into_kept(self) -> (Box<ClientPrepared>, BytesMut) {
        self.tracker.recycle();
        (self.kept, self.input)
    }

    /// Makes the state of a finished request (idle, its input empty) the state of the
    /// client's next one, in place: what [`PreparedState::into_kept`] and
    /// [`PreparedState::new`] would make of it, without moving it out and back.
    pub(super) fn restart(&mut self) {
        std::mem::take(&mut self.tracker).recycle();
        self.rewriter = Rewriter::default();
        self.mode = Mode::Fresh;
    }

    /// Drops the state of a request cut short (the session ends), keeping its buffers
    /// for reuse: what is left in them is not wanted any more.
    pub(super) fn discard(mut self) {
        self.input.clear();
        crate::net::bufpool::give(self.into_kept().1);
    }

    /// Whether server answers go through the response tracker: always in a tracked
    /// request; in a plain one only while there are statements a DISCARD ALL or
    /// DEALLOCATE ALL in it could clear (the client's, or the server's `server_holds`),
    /// and until the tracker is between messages again once it has looked (a
    /// DISCARD ALL may empty both sets while it holds a split header back).
    pub(super) fn watches(&self, server_holds: bool) -> bool {
        self.mode != Mode::Plain
            || server_holds
            || !self.kept.client.is_empty()
            || self.tracker.mid_message()
    }

    /// Runs one chunk of server bytes through the response tracker.
    pub(super) fn tracker_mut(&mut self) -> &mut ResponseTracker {
        &mut self.tracker
    }

    pub(super) fn process_server_chunk(
        &mut self,
        framer: &mut Framer,
        chunk: &mut BytesMut,
        server: &mut ServerStatements,
        on_event: impl FnMut(Event<'_>) -> Body,
    ) -> Result<(), ProtocolError> {
        let kept = &mut *self.kept;
        process_chunk(
            &mut self.tracker,
            framer,
            chunk,
            &mut kept.client,
            server,
            &kept.registry,
            on_event,
        )
    }
}

impl Relay {
    /// Prepared statements the client holds (0 without prepared-statement mode).
    pub fn prepared_count(&self) -> u32 {
        self.prepared
            .as_ref()
            .map_or(0, |p| p.kept.client.len() as u32)
    }

    /// Sends a batch again after its stale-plan error was hidden from the client: the
    /// rewriter prepares the statement's new version first. Replayed messages are not
    /// counted again (the failed batch's ReadyForQuery was dropped for them).
    pub(super) fn replay_if_needed(&mut self, server: &mut ServerConn) -> Result<(), Outcome> {
        let Some(p) = self.prepared.as_mut() else {
            return Ok(());
        };
        let Some(mut bytes) = p.tracker.take_retry() else {
            return Ok(());
        };
        let kept = &mut *p.kept;
        let mut ctx = Ctx {
            registry: &kept.registry,
            client: &mut kept.client,
            server: &mut server.prepared,
            tracker: &mut p.tracker,
            max_prepared: kept.max,
            server_parses: &mut self.stats.counts.server_parses,
        };
        Rewriter::for_replay()
            .process(&mut bytes, &mut self.c2s, self.max_packet, &mut ctx, |_| {})
            .map_err(|_| Outcome::ClientProtocol(ProtocolError::Malformed("replayed batch")))
    }

    /// Passes buffered client bytes into `c2s` as they are if they need no rewrite
    /// (no prepared statement in them, nor any before): true if it did.
    fn pass_plain(&mut self) -> Result<bool, Outcome> {
        let Some(p) = self.prepared.as_mut() else {
            return Ok(false);
        };
        let plain = matches!(p.mode, Mode::Fresh | Mode::Plain)
            && plain_request(&p.input, self.max_packet, !p.kept.client.is_empty());
        if !plain {
            return Ok(false);
        }
        if self.c2s.capacity() == 0 {
            self.c2s = crate::net::bufpool::take();
        }
        let pending_before = self.pending;
        p.mode = Mode::Plain;
        let start = self.c2s.len();
        let n = p.input.len();
        pass(&mut p.input, n, &mut self.c2s);
        self.scan_client(start).map_err(Outcome::ClientProtocol)?;
        self.note_client_activity(pending_before, self.last_read);
        Ok(true)
    }

    /// The pending request, for a pool's line to write to the server it hands this
    /// client (`pool::Request`), if it needs nothing of that server: no prepared
    /// statement to rewrite, no Terminate, nothing out of step. `c2s` is left empty
    /// for bytes that come while the client waits; [`Relay::restore_request`] puts
    /// back what was not written, in front of them.
    pub fn take_request(&mut self) -> Result<Option<BytesMut>, Outcome> {
        if self.prepared.as_ref().is_some_and(|p| !p.input.is_empty()) && !self.pass_plain()? {
            return Ok(None);
        }
        if self.c2s.is_empty() || self.terminated || self.desync {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut self.c2s)))
    }

    /// Puts back what a pool's line did not write of the request
    /// [`Relay::take_request`] took, ahead of any bytes read since.
    pub fn restore_request(&mut self, mut bytes: BytesMut) {
        if !self.c2s.is_empty() {
            bytes.extend_from_slice(&self.c2s);
        }
        crate::net::bufpool::give(std::mem::replace(&mut self.c2s, bytes));
    }

    /// Rewrites buffered client bytes for the linked server into `c2s`, and queues
    /// any answer Sluice gives itself that is due now.
    pub(super) fn rewrite_pending(&mut self, server: &mut ServerConn) -> Result<(), Outcome> {
        let Some(p) = self.prepared.as_mut() else {
            return Ok(());
        };
        if p.input.is_empty() {
            return Ok(());
        }
        if self.c2s.capacity() == 0 {
            // A pooled buffer rather than one grown (and freed) per request.
            self.c2s = crate::net::bufpool::take();
        }
        if self.pass_plain()? {
            return Ok(());
        }
        let Some(p) = self.prepared.as_mut() else {
            return Ok(());
        };
        let pending_before = self.pending;
        match p.mode {
            Mode::Tracked => {}
            Mode::Fresh => p.mode = Mode::Tracked,
            Mode::Plain => {
                // Something to rewrite after plain queries: the answers they are still
                // owed go through the tracker from now on, each ending at its
                // ReadyForQuery (one whose header the relay already saw is not owed).
                let seen = u32::from(self.server_framer.in_body_of(TAG_READY_FOR_QUERY));
                for _ in 0..self.pending.saturating_sub(seen) {
                    p.tracker.push(Expect::Forward {
                        kind: Kind::UntilReady,
                        undo: None,
                    });
                }
                p.mode = Mode::Tracked;
            }
        }
        let kept = &mut *p.kept;
        let mut ctx = Ctx {
            registry: &kept.registry,
            client: &mut kept.client,
            server: &mut server.prepared,
            tracker: &mut p.tracker,
            max_prepared: kept.max,
            server_parses: &mut self.stats.counts.server_parses,
        };
        let (pending, unsynced, terminated) =
            (&mut self.pending, &mut self.unsynced, &mut self.terminated);
        let (parses, binds) = (
            &mut self.stats.counts.client_parses,
            &mut self.stats.counts.binds,
        );
        let r = p.rewriter.process(
            &mut p.input,
            &mut self.c2s,
            self.max_packet,
            &mut ctx,
            |tag| {
                if !*terminated {
                    *terminated = count_client_tag(tag, pending, unsynced, parses, binds);
                }
            },
        );
        match r {
            Ok(()) => {}
            Err(RewriteError::Protocol(e)) => return Err(Outcome::ClientProtocol(e)),
            Err(RewriteError::DuplicateStatement) => {
                return Err(Outcome::ClientProtocol(ProtocolError::Malformed(
                    "prepared statement already exists",
                )))
            }
            Err(RewriteError::TooManyStatements(_)) => {
                return Err(Outcome::ClientProtocol(ProtocolError::Malformed(
                    "too many prepared statements for one client",
                )))
            }
        }
        let mut ready = Vec::new();
        p.tracker
            .take_ready_synthesized(self.server_framer.at_boundary(), &mut ready);
        self.s2c.extend_from_slice(&ready);
        self.note_client_activity(pending_before, self.last_read);
        Ok(())
    }
}

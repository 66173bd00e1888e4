//! The relay's prepared-statement mode: client bytes go through the rewriter once a
//! server is linked, server bytes through the response tracker.

use std::sync::Arc;

use bytes::BytesMut;

use super::{count_client_tag, Counted, Outcome, Relay};
use crate::pool::{Request, ServerConn};
use crate::prepared::deferred::{deferrable_request, prepare_deferred};
use crate::prepared::responses::{process_chunk, Expect, Kind, ResponseTracker};
use crate::prepared::rewrite::{pass, plain_request, Ctx, RewriteError, Rewriter};
use crate::prepared::{ClientStatements, Registry, ServerStatements, Statement};
use crate::protocol::header::{TAG_READY_FOR_QUERY, TAG_TERMINATE};
use crate::protocol::ProtocolError;
use crate::session::framer::{Body, Event, Framer};
use crate::session::params::ParamSet;
use crate::stats::conns::ClientInfo;

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
/// The fields a plain request reads come first (`repr(C)`; see [`super::Relay`]): a
/// request that needs no rewriting leaves the tracker and the rewriter alone.
#[derive(Debug)]
#[repr(C)]
pub(super) struct PreparedState {
    pub(super) mode: Mode,
    /// The tracker has seen server bytes since the request began; until it has, it
    /// is as [`PreparedState::restart`] left it, and need not be looked at or reset.
    watched: bool,
    /// Whether the client held statements when the request began (or later): read by
    /// every request, kept here so that a plain one does not look into `kept`. Only a
    /// request that uses the tracker can change the statements, so `restart` renews
    /// it after those; one that drops them all mid-request leaves it true, which only
    /// sends the rest of that request the careful way.
    has_statements: bool,
    pub(super) kept: Box<ClientPrepared>,
    /// Client bytes not yet rewritten.
    pub(super) input: BytesMut,
    /// The statements a request rewritten while its client waited in line binds
    /// ([`Relay::take_request`]), until the request goes to a server: a pool's line
    /// writes it only to a server that has them, and the relay prepares those its
    /// server lacks ahead of it ([`Relay::prepare_deferred`]).
    needs: Vec<Arc<Statement>>,
    tracker: ResponseTracker,
    rewriter: Rewriter,
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
        self.input.is_empty()
            && (!self.tracker_used() || self.tracker.is_idle())
            && self.rewriter_at_boundary()
    }

    /// Whether the tracker may have changed since [`PreparedState::restart`]: it saw
    /// server bytes, or the request is tracked (the rewriter queues its answers).
    fn tracker_used(&self) -> bool {
        self.watched || self.mode == Mode::Tracked
    }

    /// Whether no request has begun: nothing rewritten, tracked or gathered yet.
    pub(super) fn at_rest(&self) -> bool {
        self.mode == Mode::Fresh
            && self.needs.is_empty()
            && (!self.tracker_used() || self.tracker.is_idle())
    }

    /// The rewriter is used only by tracked requests.
    fn rewriter_at_boundary(&self) -> bool {
        self.mode != Mode::Tracked || self.rewriter.at_boundary()
    }

    pub(super) fn has_input(&self) -> bool {
        !self.input.is_empty()
    }

    /// Whether the next client message is Terminate (so no server is needed).
    pub(super) fn starts_with_terminate(&self) -> bool {
        self.rewriter_at_boundary() && self.input.first() == Some(&TAG_TERMINATE)
    }

    /// Whether the buffered input holds a Terminate message (walking its headers;
    /// only while the client waits for a server, so nothing is rewritten yet).
    pub(super) fn has_terminate(&self) -> bool {
        if !self.rewriter_at_boundary() {
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
            has_statements: !kept.client.is_empty(),
            kept,
            tracker: ResponseTracker::default(),
            rewriter: Rewriter::default(),
            input,
            mode: Mode::Fresh,
            watched: false,
            needs: Vec::new(),
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
        // A request the rewriter and the tracker never saw (plain queries, the common
        // case) left them as they were: nothing to reset, and their lines untouched.
        if self.tracker_used() {
            std::mem::take(&mut self.tracker).recycle();
            self.has_statements = !self.kept.client.is_empty();
        }
        if self.mode == Mode::Tracked {
            self.rewriter = Rewriter::default();
            self.needs.clear();
        }
        self.mode = Mode::Fresh;
        self.watched = false;
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
            || self.has_statements
            || (self.tracker_used() && self.tracker.mid_message())
    }

    /// A delegate relayed the request's whole answer, with no error in it that the
    /// tracker mends (any other changes nothing it keeps: `pool::delegate`).
    pub(super) fn answered_by_delegate(&mut self) {
        if self.tracker_used() {
            self.tracker.answered_by_delegate();
        }
    }

    /// ReadyForQuery messages the relay counted that will not come: the client's
    /// simple Queries the server skipped after an extended-protocol error.
    pub(super) fn take_skipped_ready(&mut self) -> u32 {
        if !self.tracker_used() {
            return 0;
        }
        std::mem::take(&mut self.tracker.skipped_ready)
    }

    /// The rewriter's view of the client's statements and `server`'s.
    fn ctx<'a>(
        &'a mut self,
        server: &'a mut ServerStatements,
        server_parses: &'a mut u64,
        aborted: bool,
    ) -> Ctx<'a> {
        server_ctx(
            &mut self.kept,
            &mut self.tracker,
            server,
            server_parses,
            aborted,
        )
    }

    /// Runs one chunk of server bytes through the response tracker.
    pub(super) fn tracker_mut(&mut self) -> &mut ResponseTracker {
        self.watched = true;
        &mut self.tracker
    }

    pub(super) fn process_server_chunk(
        &mut self,
        framer: &mut Framer,
        chunk: &mut BytesMut,
        server: &mut ServerStatements,
        on_event: impl FnMut(Event<'_>) -> Body,
    ) -> Result<(), ProtocolError> {
        self.watched = true;
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

/// The rewriter's view of a client's statements and `server`'s.
fn server_ctx<'a>(
    kept: &'a mut ClientPrepared,
    tracker: &'a mut ResponseTracker,
    server: &'a mut ServerStatements,
    server_parses: &'a mut u64,
    aborted: bool,
) -> Ctx<'a> {
    Ctx {
        registry: &kept.registry,
        client: &mut kept.client,
        server,
        tracker,
        max_prepared: kept.max,
        server_parses,
        aborted,
        deferred: None,
    }
}

impl Relay {
    /// Prepared statements the client holds, if this request may have changed their
    /// number (it used the tracker): otherwise the console's count stands, and a
    /// plain request does not look into the kept statements.
    pub fn changed_prepared_count(&self) -> Option<u32> {
        let p = self.prepared.as_ref()?;
        p.tracker_used().then(|| p.kept.client.len() as u32)
    }

    /// Sends a batch again after its stale-plan error was hidden from the client: the
    /// rewriter prepares the statement's new version first. Replayed messages are not
    /// counted again (the failed batch's ReadyForQuery was dropped for them).
    pub(super) fn replay_if_needed(&mut self, server: &mut ServerConn) -> Result<(), Outcome> {
        let Some(p) = self.prepared.as_mut() else {
            return Ok(());
        };
        // A batch to replay is set only by a tracker that saw server bytes.
        if !p.watched {
            return Ok(());
        }
        let Some(mut bytes) = p.tracker.take_retry() else {
            return Ok(());
        };
        let parses = &mut self.stats.counts.server_parses;
        let mut ctx = p.ctx(&mut server.prepared, parses, self.status == b'E');
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
            && plain_request(&p.input, self.max_packet, p.has_statements);
        if !plain {
            return Ok(false);
        }
        // No buffer taken for `c2s`: when it is empty, `pass` moves the input's buffer
        // there, so a client waiting in line holds the one buffer its request is in.
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
        if self.prepared.as_ref().is_some_and(|p| !p.input.is_empty())
            && !self.pass_plain()?
            && !self.rewrite_deferred()?
        {
            return Ok(None);
        }
        if self.c2s.is_empty() || self.terminated || self.desync {
            return Ok(None);
        }
        if self.begin_ahead() && self.prepared.as_ref().is_some_and(|p| !p.needs.is_empty()) {
            // Statements to prepare would go in front of the BEGIN written ahead:
            // such a request waits to be written by the relay, which orders them.
            return Ok(None);
        }
        self.put_begin_ahead();
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

    /// `bytes` (from [`Relay::take_request`]) as a request to leave in a pool's line,
    /// in the box the last one used if there is one (`client` names a new box: a
    /// relay is its client's until put away, so a kept box names that client).
    pub fn line_request(
        &mut self,
        bytes: BytesMut,
        params: &Arc<ParamSet>,
        client: &Arc<ClientInfo>,
    ) -> Box<Request> {
        let mut r = match self.line_request.take() {
            Some(mut r) => {
                r.bytes = bytes;
                if !Arc::ptr_eq(&r.params, params) {
                    r.params = params.clone();
                }
                (r.sent, r.granted, r.more) = (false, None, false);
                r
            }
            None => Request::new(bytes, params.clone(), client.clone()),
        };
        // A clock runs while the server answers: the task must stay awake for it, or
        // sleep with a timer if a delegate relays the answer (`deadline`).
        r.timed = !self.untimed();
        r.deadline = self.query_deadline();
        r.set_tracked(self.prepared.as_ref().is_some_and(|p| p.watches(false)));
        if let Some(p) = self.prepared.as_mut() {
            std::mem::swap(&mut r.needs, &mut p.needs);
        }
        r
    }

    /// Takes back a request that was left in line: puts back what was not written
    /// ([`Relay::restore_request`]) and keeps the box for the next one.
    pub fn restore_line_request(&mut self, mut r: Box<Request>) {
        // Sent: the line found its statements on the server (`Request::send_on`).
        match self.prepared.as_mut() {
            Some(p) if !r.sent => std::mem::swap(&mut r.needs, &mut p.needs),
            _ => {}
        }
        r.needs.clear();
        let bytes = std::mem::take(&mut r.bytes);
        self.line_request = Some(r);
        self.restore_request(bytes);
    }

    /// Rewrites buffered client bytes for the linked server into `c2s`, and queues
    /// any answer Sluice gives itself that is due now.
    pub(super) fn rewrite_pending(&mut self, server: &mut ServerConn) -> Result<(), Outcome> {
        let Some(p) = self.prepared.as_mut() else {
            return Ok(());
        };
        if !p.needs.is_empty() {
            self.prepare_deferred(server);
        }
        let Some(p) = self.prepared.as_mut() else {
            return Ok(());
        };
        if p.input.is_empty() {
            return Ok(());
        }
        if self.pass_plain()? {
            return Ok(());
        }
        self.rewrite_input(&mut server.prepared, false)
    }

    /// Rewrites a request while its client waits in line, if it needs nothing of a
    /// server but statements the client holds ([`deferrable_request`]): the line can
    /// then write it to a server that has them, as it writes a plain request.
    fn rewrite_deferred(&mut self) -> Result<bool, Outcome> {
        let Some(p) = self.prepared.as_mut() else {
            return Ok(false);
        };
        let deferrable = p.mode == Mode::Fresh
            && p.needs.is_empty()
            && !p.tracker_used()
            && deferrable_request(&p.input, self.max_packet, &mut p.kept.client);
        if !deferrable {
            return Ok(false);
        }
        // (Nothing looks at the server's statements while they are deferred.)
        self.rewrite_input(&mut ServerStatements::default(), true)?;
        Ok(true)
    }

    /// Prepares, ahead of a request rewritten in line, the statements it binds that
    /// `server` lacks (the line did not write it), their answers queued first.
    fn prepare_deferred(&mut self, server: &mut ServerConn) {
        let Some(p) = self.prepared.as_mut() else {
            return;
        };
        let needs = std::mem::take(&mut p.needs);
        let owed = p.tracker.take_queue();
        let mut ahead = BytesMut::new();
        let parses = &mut self.stats.counts.server_parses;
        let mut ctx = p.ctx(&mut server.prepared, parses, self.status == b'E');
        prepare_deferred(&needs, &mut ahead, &mut ctx);
        p.tracker.queue_after(owed);
        if !ahead.is_empty() {
            ahead.extend_from_slice(&self.c2s);
            crate::net::bufpool::give(std::mem::replace(&mut self.c2s, ahead));
        }
        p.needs = needs;
        p.needs.clear();
    }

    /// Rewrites the buffered client bytes into `c2s` for `server`'s statements, or
    /// (`deferred`) for a server not yet known, gathering the statements it needs.
    fn rewrite_input(
        &mut self,
        server: &mut ServerStatements,
        deferred: bool,
    ) -> Result<(), Outcome> {
        if self.c2s.capacity() == 0 {
            // A pooled buffer rather than one grown (and freed) per request.
            self.c2s = crate::net::bufpool::take();
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
        let (aborted, server_parses) = (self.status == b'E', &mut self.stats.counts.server_parses);
        let mut ctx = server_ctx(&mut p.kept, &mut p.tracker, server, server_parses, aborted);
        ctx.deferred = deferred.then_some(&mut p.needs);
        let (pending, unsynced, terminated) =
            (&mut self.pending, &mut self.unsynced, &mut self.terminated);
        let (parses, binds, copy) = (
            &mut self.stats.counts.client_parses,
            &mut self.stats.counts.binds,
            &mut self.copy,
        );
        let (no_simple_query, mut refused) = (self.no_simple_query, false);
        let mut unknown = None;
        let r = p.rewriter.process(
            &mut p.input,
            &mut self.c2s,
            self.max_packet,
            &mut ctx,
            |tag| {
                refused |= no_simple_query && tag == crate::protocol::header::TAG_QUERY;
                if !*terminated {
                    let counted =
                        count_client_tag(tag, pending, unsynced, (&mut *parses, &mut *binds), copy);
                    // (Queries inside batches: the tracker follows them, not midbatch.rs.)
                    *terminated = counted == Counted::Terminate;
                    if counted == Counted::Unknown {
                        unknown.get_or_insert(tag);
                    }
                }
            },
        );
        if let Some(tag) = unknown {
            self.c2s.clear();
            return Err(Outcome::ClientProtocol(ProtocolError::UnknownMessage(tag)));
        }
        if refused {
            self.c2s.clear();
            return Err(Outcome::ClientProtocol(ProtocolError::Refused(
                super::PQEXEC_DISALLOWED,
            )));
        }
        match r {
            Ok(()) => {}
            Err(RewriteError::Protocol(e)) => return Err(Outcome::ClientProtocol(e)),
            Err(RewriteError::TooManyStatements(_)) => {
                return Err(Outcome::ClientProtocol(ProtocolError::Malformed(
                    "too many prepared statements for one client",
                )))
            }
        }
        self.pending = self.pending.saturating_sub(p.take_skipped_ready());
        let mut ready = Vec::new();
        p.tracker
            .take_ready_synthesized(self.server_framer.at_boundary(), &mut ready);
        self.s2c.extend_from_slice(&ready);
        self.note_client_activity(pending_before, self.last_read);
        Ok(())
    }
}

#[cfg(test)]
#[path = "prepared_tests.rs"]
mod tests;

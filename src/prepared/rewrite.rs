//! The request side of prepared-statement rewriting: client messages move from the
//! input buffer to the server-bound buffer, with named statements renamed to their
//! Sluice-owned server names, Parses injected where the server lacks a statement, and
//! an entry queued for every request the server or Sluice must answer.
//!
//! Parse, Bind, Describe and Close are handled whole (they are small; a Bind with huge
//! parameters is buffered up to `max_packet_size`); everything else streams through.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::inject::{
    ensure_prepared, expect, fwd, make_room, probe, put_close, put_query, refuse_duplicate,
    refuse_unknown,
};
use super::names::{
    name_of, split_cstr, statement_name, statement_name_bytes, take_cstr, NOT_UTF8,
};
use super::responses::{Expect, Kind, ResponseTracker, Undo, PARSE_COMPLETE};
use super::{is_sluice_name, ClientStatements, Registry, ServerStatements, Statement};
use crate::protocol::header::*;
use crate::protocol::ProtocolError;

/// Everything the rewriter needs besides the bytes.
pub struct Ctx<'a> {
    pub registry: &'a Registry,
    pub client: &'a mut ClientStatements,
    pub server: &'a mut ServerStatements,
    pub tracker: &'a mut ResponseTracker,
    /// `max_prepared_statements`: the per-server cache size.
    pub max_prepared: usize,
    /// Parses sent to the server, for SHOW STATS.
    pub server_parses: &'a mut u64,
    /// The server's transaction had failed at its last ReadyForQuery.
    pub aborted: bool,
    /// Set while a request is rewritten before its server is known
    /// ([`super::deferred::deferrable_request`]): the statements it binds are gathered here for the
    /// pool to look for on the server it hands the request to, instead of prepared.
    pub deferred: Option<&'a mut Vec<Arc<Statement>>>,
}

/// Why rewriting stopped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RewriteError {
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    #[error("too many prepared statements (at most {0} per client)")]
    TooManyStatements(usize),
}

/// Streaming state between reads.
#[derive(Debug, Default)]
pub struct Rewriter {
    /// Body bytes of a streamed message still to copy.
    stream_left: usize,
    /// Terminate was seen: the rest of the input is dropped.
    terminated: bool,
    /// Nothing but Parse (or Flush) since the last Sync: a Bind now starts a batch
    /// that can be replayed if its statement's plan turns out stale.
    batch_has_run: bool,
    /// The batch being recorded for a replay: its statement and its messages as the
    /// client sent them.
    recording: Option<(u64, BytesMut)>,
    /// This rewriter processes a replay: nothing is recorded.
    replaying: bool,
    /// Statement names the client Parsed since the last Sync.
    parsed_in_batch: Vec<String>,
}

/// Longest simple Query read whole to see whether it is an SQL-level PREPARE, EXECUTE
/// or DEALLOCATE; longer ones stream through.
const MAX_INSPECTED_QUERY: usize = 256;

/// Largest batch kept for a replay.
const MAX_REPLAY: usize = 64 * 1024;

impl Rewriter {
    /// A rewriter for sending a recorded batch again.
    pub fn for_replay() -> Rewriter {
        Rewriter {
            replaying: true,
            ..Rewriter::default()
        }
    }

    /// Keeps a copy of the batch that starts with a Bind of a named statement when
    /// nothing ran before it in the batch, until its Sync.
    fn record(&mut self, tag: u8, msg: Option<&[u8]>, ctx: &mut Ctx<'_>) {
        if self.replaying {
            return;
        }
        if let Some((_, buf)) = &mut self.recording {
            match msg {
                Some(m) if buf.len() + m.len() <= MAX_REPLAY => buf.extend_from_slice(m),
                _ => self.recording = None,
            }
        } else if !self.batch_has_run
            && (tag == TAG_DESCRIBE || (tag == TAG_BIND && !self.parsed_in_batch.is_empty()))
        {
            // Replayable only where PostgreSQL itself would not have failed: the
            // client learns the shape from this very Describe, or it Parsed the
            // statement just before binding it (a fresh plan, directly).
            let name = msg.and_then(|m| statement_name(tag, m));
            let fresh = tag == TAG_DESCRIBE
                || name.is_some_and(|n| self.parsed_in_batch.iter().any(|p| p == n));
            let stmt = name
                .filter(|_| fresh)
                .and_then(|n| ctx.client.get(n))
                .map(|s| s.id);
            if let (Some(stmt), Some(m)) = (stmt, msg) {
                self.recording = Some((stmt, BytesMut::from(m)));
            }
        }
        if tag == TAG_PARSE {
            if let Some(n) = msg.and_then(|m| statement_name(tag, m)) {
                self.parsed_in_batch.push(n.to_owned());
            }
        }
        match tag {
            TAG_SYNC => {
                self.batch_has_run = false;
                self.parsed_in_batch.clear();
                ctx.tracker.replay = self
                    .recording
                    .take()
                    .map(|(stmt_id, bytes)| super::responses::Replay { stmt_id, bytes });
            }
            TAG_PARSE | TAG_FLUSH => {}
            _ => self.batch_has_run = true,
        }
    }

    /// Whether no message is half-way through.
    pub fn at_boundary(&self) -> bool {
        self.stream_left == 0
    }

    /// Moves what can be moved from `input` to `out`. `on_tag` sees every message's
    /// tag once, when its header is read.
    pub fn process(
        &mut self,
        input: &mut BytesMut,
        out: &mut BytesMut,
        max_len: u32,
        ctx: &mut Ctx<'_>,
        mut on_tag: impl FnMut(u8),
    ) -> Result<(), RewriteError> {
        loop {
            if self.terminated {
                input.clear();
                return Ok(());
            }
            if self.stream_left > 0 {
                let take = self.stream_left.min(input.len());
                if take == 0 {
                    return Ok(());
                }
                pass(input, take, out);
                self.stream_left -= take;
                continue;
            }
            let Some((tag, len)) = parse(input) else {
                return Ok(());
            };
            let len = check_len(tag, len, max_len)?;
            let whole = input.len() > len;
            let inspected = matches!(tag, TAG_PARSE | TAG_BIND | TAG_DESCRIBE | TAG_CLOSE)
                || (tag == TAG_QUERY && len <= MAX_INSPECTED_QUERY);
            if inspected && !whole {
                // Wait for the whole message; small ones are inspected.
                input.reserve(len + 1 - input.len());
                return Ok(());
            }
            on_tag(tag);
            self.record(tag, whole.then(|| &input[..len + 1]), ctx);
            if tag == TAG_TERMINATE {
                self.terminated = true;
                continue;
            }
            if whole && tag == TAG_PARSE {
                // Owned: a new statement keeps its text.
                let msg = input.split_to(len + 1).freeze();
                handle_parse(msg, out, ctx)?;
                continue;
            }
            if whole && matches!(tag, TAG_BIND | TAG_DESCRIBE | TAG_CLOSE) {
                // Read in place (a split would make the buffer shared, then drop it).
                handle_named(tag, &input[..=len], out, ctx)?;
                input.advance(len + 1);
                continue;
            }
            let entry = match tag {
                TAG_EXECUTE => Some(fwd(Kind::Execute)),
                TAG_SYNC => Some(fwd(Kind::Sync)),
                TAG_FUNCTION_CALL => Some(fwd(Kind::UntilReady)),
                TAG_QUERY if whole && !super::sql::may_match(&input[HEADER_LEN..=len]) => {
                    // Most queries: passed on as they are (`handle_query` would too).
                    Some(fwd(Kind::UntilReady))
                }
                TAG_QUERY if whole => {
                    let msg = input.split_to(len + 1).freeze();
                    handle_query(msg, out, ctx)?;
                    continue;
                }
                TAG_QUERY => Some(fwd(Kind::UntilReady)),
                _ => None,
            };
            if let Some(e) = entry {
                expect(ctx, e);
            }
            let take = (len + 1).min(input.len());
            pass(input, take, out);
            self.stream_left = len + 1 - take;
        }
    }
}

/// Whether `input` is a request that needs no rewriting: whole messages, ending at a
/// Sync or a simple Query (so nothing is owed outside the ReadyForQuery answers the
/// relay counts), of simple Queries the rewriter would pass on untouched (not PREPARE,
/// EXECUTE, DEALLOCATE or DISCARD by their first word) and extended-protocol messages
/// on the unnamed statement, within `max_len`. A Parse must name no statement; a
/// Bind, Describe or Close may name one only if the client holds none
/// (`client_holds` false: a name it does not hold passes unchanged anyway) and the
/// name is not in Sluice's namespace.
pub fn plain_request(input: &[u8], max_len: u32, client_holds: bool) -> bool {
    let mut rest = input;
    let mut last = 0;
    // Extended-protocol messages since the last Sync: a simple Query after them is
    // skipped if one of them fails, which only the response tracker follows.
    let mut unsynced = false;
    while !rest.is_empty() {
        let Some((tag, len, msg)) = whole_message(rest, max_len) else {
            return false;
        };
        unsynced = match tag {
            TAG_SYNC => false,
            TAG_QUERY => unsynced,
            _ => true,
        };
        let plain = match tag {
            TAG_QUERY if unsynced => false,
            TAG_QUERY => {
                len > MAX_INSPECTED_QUERY || !super::sql::names_statements(&msg[HEADER_LEN..])
            }
            TAG_PARSE => statement_name_bytes(tag, msg) == Some(b""),
            // A portal (never rewritten) or a message cut short (PostgreSQL says so)
            // names no statement; a name in Sluice's namespace is answered by Sluice.
            TAG_BIND | TAG_DESCRIBE | TAG_CLOSE => match statement_name_bytes(tag, msg) {
                None | Some(b"") => true,
                Some(name) => !client_holds && !is_sluice_name(name),
            },
            TAG_EXECUTE | TAG_SYNC | TAG_FLUSH => true,
            _ => false,
        };
        if !plain {
            return false;
        }
        last = tag;
        rest = &rest[len + 1..];
    }
    matches!(last, TAG_QUERY | TAG_SYNC)
}

/// The whole message at the front of `rest` within `max_len`: its tag, body length
/// and bytes; `None` if it is cut short or too long.
pub(super) fn whole_message(rest: &[u8], max_len: u32) -> Option<(u8, usize, &[u8])> {
    let (tag, len) = parse(rest)?;
    let len = check_len(tag, len, max_len).ok()?;
    Some((tag, len, rest.get(..=len)?))
}

/// Moves the first `n` bytes of `input` to the end of `out`. A request that is one
/// message moves by swapping the buffers, with no copy; otherwise the bytes are copied
/// and `input` advanced, which (unlike a split) never makes its buffer shared.
pub fn pass(input: &mut BytesMut, n: usize, out: &mut BytesMut) {
    if out.is_empty() && n == input.len() {
        std::mem::swap(input, out);
        return;
    }
    out.extend_from_slice(&input[..n]);
    input.advance(n);
}

/// Handles a whole simple Query: DISCARD ALL / DEALLOCATE ALL, SQL-level PREPARE,
/// EXECUTE and DEALLOCATE get their special treatment; anything else passes.
fn handle_query(msg: Bytes, out: &mut BytesMut, ctx: &mut Ctx<'_>) -> Result<(), RewriteError> {
    let body = &msg[HEADER_LEN..];
    let body = body.strip_suffix(b"\0").unwrap_or(body);
    let text = super::sql::may_match(body)
        .then(|| std::str::from_utf8(body).ok())
        .flatten();
    // DISCARD ALL / DEALLOCATE ALL need nothing here: their CommandComplete, in
    // either protocol, clears the statements (a failed one keeps them).
    let Some(cmd) = text.and_then(super::sql::parse) else {
        out.extend_from_slice(&msg);
        expect(ctx, fwd(Kind::UntilReady));
        return Ok(());
    };
    use super::sql::SqlCommand;
    match cmd {
        SqlCommand::Prepare { name, rest } => {
            if ctx.client.holds(&name) {
                refuse_duplicate(&name, None, out, ctx);
                return Ok(());
            }
            let stmt = ctx.registry.intern_sql(rest);
            if !ctx.client.insert(name.clone(), stmt.clone()) {
                return Err(RewriteError::TooManyStatements(
                    super::MAX_CLIENT_STATEMENTS,
                ));
            }
            let undo = if ctx.server.touch(&stmt) && ctx.aborted {
                // The failed transaction refuses this PREPARE (and would refuse a
                // DEALLOCATE too): another client's copy stays.
                Undo::ForgetClient(name)
            } else if ctx.server.touch(&stmt) {
                // Another client's copy is there: drop it so this PREPARE is answered
                // by the server itself, as PostgreSQL would answer it.
                put_query(out, &["DEALLOCATE ", &stmt.server_name]);
                expect(
                    ctx,
                    Expect::SwallowQuery {
                        failed: false,
                        undo: None,
                    },
                );
                Undo::ForgetClientAndServer(name, stmt.id)
            } else {
                make_room(out, ctx);
                ctx.server.insert(&stmt);
                Undo::ForgetClientAndServer(name, stmt.id)
            };
            stmt.parse_message(out);
            *ctx.server_parses += 1;
            expect(
                ctx,
                Expect::Query {
                    failed: false,
                    undo: Some(undo),
                },
            );
        }
        SqlCommand::Execute { name, .. } | SqlCommand::Deallocate { name }
            if is_sluice_name(name.as_bytes()) && !ctx.client.holds(&name) =>
        {
            refuse_unknown(&name, false, out, ctx);
        }
        SqlCommand::Execute { name, rest } => match ctx.client.get(&name).cloned() {
            None => {
                out.extend_from_slice(&msg);
                expect(ctx, fwd(Kind::UntilReady));
            }
            Some(stmt) => {
                if !ctx.aborted {
                    // (A failed transaction refuses the EXECUTE, and would refuse
                    // a PREPARE before it with a second error.)
                    ensure_prepared(&stmt, false, out, ctx);
                }
                // A Parsed statement's server name has capitals: quoted, or SQL
                // would fold it.
                let q = if stmt.sql { "" } else { "\"" };
                put_query(out, &["EXECUTE ", q, &stmt.server_name, q, " ", rest]);
                // (Stale: an error that says the server lost the statement, or that
                // its plan is stale, is mended as for a Bind.)
                expect(
                    ctx,
                    Expect::Forward {
                        kind: Kind::UntilReady,
                        undo: Some(Undo::Stale(stmt)),
                    },
                );
            }
        },
        SqlCommand::Deallocate { name } => match ctx.client.get(&name).cloned() {
            // A failed transaction refuses it (25P02) and the name stays.
            _ if ctx.aborted => {
                out.extend_from_slice(&msg);
                expect(ctx, fwd(Kind::UntilReady));
            }
            None => {
                out.extend_from_slice(&msg);
                expect(ctx, fwd(Kind::UntilReady));
            }
            Some(_) => {
                // The server keeps its copy for other clients; the client still gets
                // a real DEALLOCATE answer, from a throwaway statement.
                ctx.client.remove(&name);
                put_query(out, &["PREPARE sluice_deallocate AS SELECT 1"]);
                expect(
                    ctx,
                    Expect::SwallowQuery {
                        failed: false,
                        undo: None,
                    },
                );
                put_query(out, &["DEALLOCATE sluice_deallocate"]);
                expect(ctx, fwd(Kind::UntilReady));
            }
        },
    }
    Ok(())
}

/// Rewrites one whole Parse.
fn handle_parse(msg: Bytes, out: &mut BytesMut, ctx: &mut Ctx<'_>) -> Result<(), RewriteError> {
    let mut body = msg.slice(HEADER_LEN..);
    let name = take_cstr(&mut body)?;
    if name.is_empty() {
        out.extend_from_slice(&msg);
        expect(ctx, fwd(Kind::Parse));
        return Ok(());
    }
    let name = name_of(&name)?.to_owned();
    if ctx.client.holds(&name) {
        // PostgreSQL's answer (PgBouncer disconnects the client instead).
        refuse_duplicate(&name, Some(&body), out, ctx);
        return Ok(());
    }
    let stmt = ctx.registry.intern(body);
    if !ctx.client.insert(name.clone(), stmt.clone()) {
        return Err(RewriteError::TooManyStatements(
            super::MAX_CLIENT_STATEMENTS,
        ));
    }
    if ctx.server.touch(&stmt) {
        if ctx.aborted {
            // In a failed transaction PostgreSQL refuses a Parse, but of COMMIT or
            // ROLLBACK: the server answers one of the same text under a throwaway
            // name, closed again at once (skipped with the rest if it failed).
            probe(
                &stmt.body,
                Expect::Forward {
                    kind: Kind::Parse,
                    undo: Some(Undo::ForgetClient(name)),
                },
                out,
                ctx,
            );
            return Ok(());
        }
        // The server has it already: answer ParseComplete ourselves.
        expect(
            ctx,
            Expect::Synthesize(PARSE_COMPLETE, Some(Undo::ForgetClient(name))),
        );
        return Ok(());
    }
    make_room(out, ctx);
    ctx.server.insert(&stmt);
    stmt.parse_message(out);
    *ctx.server_parses += 1;
    expect(
        ctx,
        Expect::Forward {
            kind: Kind::Parse,
            undo: Some(Undo::ForgetClientAndServer(name, stmt.id)),
        },
    );
    Ok(())
}

/// Rewrites one whole Bind, Describe or Close (`msg`, header included).
fn handle_named(
    tag: u8,
    msg: &[u8],
    out: &mut BytesMut,
    ctx: &mut Ctx<'_>,
) -> Result<(), RewriteError> {
    let body = &msg[HEADER_LEN..];
    if tag == TAG_BIND {
        let (portal, rest) = split_cstr(body)?;
        let (name, rest) = split_cstr(rest)?;
        let stmt = match name {
            b"" => None,
            n => ctx.client.find(n).map_err(|_| NOT_UTF8)?,
        };
        let undo = stmt.clone().map(Undo::Stale);
        match stmt {
            None if is_sluice_name(name) => {
                refuse_unknown(name_of(name)?, true, out, ctx);
                return Ok(());
            }
            // Unnamed, or unknown: PostgreSQL gives the right answer (including
            // "prepared statement does not exist" with the client's own name).
            None => out.extend_from_slice(msg),
            Some(stmt) => {
                ensure_prepared(&stmt, true, out, ctx);
                out.put_u8(TAG_BIND);
                let len = 4 + portal.len() + 1 + stmt.server_name.len() + 1 + rest.len();
                out.put_u32(len as u32);
                out.extend_from_slice(portal);
                out.put_u8(0);
                out.extend_from_slice(stmt.server_name.as_bytes());
                out.put_u8(0);
                out.extend_from_slice(rest);
            }
        }
        expect(
            ctx,
            Expect::Forward {
                kind: Kind::Bind,
                undo,
            },
        );
        return Ok(());
    }
    let Some((&kind, rest)) = body.split_first() else {
        return Err(ProtocolError::Malformed("empty Describe/Close").into());
    };
    let (name, _) = split_cstr(rest)?;
    let entry = if tag == TAG_DESCRIBE {
        Kind::Describe
    } else {
        Kind::Close
    };
    let stmt = match kind {
        b'S' if !name.is_empty() => ctx.client.find(name).map_err(|_| NOT_UTF8)?,
        _ => None,
    };
    let name = name_of(name)?;
    let undo = match &stmt {
        Some(st) if tag == TAG_DESCRIBE => Some(Undo::Stale(st.clone())),
        _ => None,
    };
    match stmt {
        None if kind == b'S' && is_sluice_name(name.as_bytes()) => {
            if tag == TAG_DESCRIBE {
                refuse_unknown(name, true, out, ctx);
                return Ok(());
            }
            // Closing a name it does not have answers CloseComplete; the server's
            // statement of that name is another client's.
            put_close(out, b'S', b"sluice_closed");
        }
        None => out.extend_from_slice(msg),
        Some(stmt) if tag == TAG_DESCRIBE => {
            ensure_prepared(&stmt, true, out, ctx);
            out.put_u8(TAG_DESCRIBE);
            out.put_u32((4 + 1 + stmt.server_name.len() + 1) as u32);
            out.put_u8(b'S');
            out.extend_from_slice(stmt.server_name.as_bytes());
            out.put_u8(0);
        }
        Some(stmt) => {
            // The server keeps its copy for other clients; closing a name it
            // does not have still answers CloseComplete. Skipped after an error,
            // the Close leaves the client's name bound.
            ctx.client.remove(name);
            put_close(out, b'S', b"sluice_closed");
            expect(
                ctx,
                Expect::Forward {
                    kind: entry,
                    undo: Some(Undo::Restore(name.to_owned(), stmt)),
                },
            );
            return Ok(());
        }
    }
    expect(ctx, Expect::Forward { kind: entry, undo });
    Ok(())
}

#[cfg(test)]
#[path = "rewrite_tests.rs"]
mod tests;

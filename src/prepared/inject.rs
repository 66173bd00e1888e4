//! What the rewriter sends a server besides the client's own requests, and the
//! answers it queues for them: Parses a server lacks, Closes of statements evicted
//! from its cache, and the requests bound to fail that stand in for a refusal.

use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use super::responses::{Expect, Kind, Undo};
use super::rewrite::Ctx;
use crate::protocol::header::*;

/// The server name of a statement prepared only to see whether PostgreSQL takes it.
pub(super) const THROWAWAY: &str = "sluice_throwaway";

/// Queues the answer a request is owed. After an error the server skips to the
/// next Sync: a request rewritten before the client's Sync then gets no answer, so
/// nothing is queued for it and what was noted for it is undone.
pub(super) fn expect(ctx: &mut Ctx<'_>, e: Expect) {
    if ctx.tracker.skipping {
        if !matches!(
            e,
            Expect::Forward {
                kind: Kind::Sync,
                ..
            }
        ) {
            ctx.tracker.undo_skipped(e, ctx.client, ctx.server);
            return;
        }
        ctx.tracker.skipping = false;
    }
    ctx.tracker.push(e);
}

pub(super) fn fwd(kind: Kind) -> Expect {
    Expect::Forward { kind, undo: None }
}

/// A simple Query made of `parts`.
pub(super) fn put_query(out: &mut BytesMut, parts: &[&str]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.put_u8(TAG_QUERY);
    out.put_u32((4 + len + 1) as u32);
    for p in parts {
        out.extend_from_slice(p.as_bytes());
    }
    out.put_u8(0);
}

/// Makes room in the server's cache for one more statement: each statement evicted
/// is closed there (a Close, which a failed transaction allows, for either kind:
/// they share one namespace). A Close skipped after an error leaves its statement
/// in the cache.
pub(super) fn make_room(out: &mut BytesMut, ctx: &mut Ctx<'_>) {
    if ctx.tracker.skipping {
        // The server skips what follows, and an eviction would only be undone.
        return;
    }
    while let Some(evicted) = ctx.server.evict_for_one_more(ctx.max_prepared) {
        put_close(out, b'S', evicted.server_name.as_bytes());
        expect(
            ctx,
            Expect::Swallow {
                kind: Kind::Close,
                undo: Some(Undo::Reinstate(evicted)),
            },
        );
    }
}

/// Refuses a statement name the client holds as PostgreSQL does (42P05), where
/// PostgreSQL would. For a Parse, `text` (its body after the name), PostgreSQL first
/// parses the text and refuses it in a failed transaction: the server does that with
/// a throwaway name, closed again (the Parse's error, if any, is the client's answer,
/// and the rest is skipped).
pub(super) fn refuse_duplicate(
    name: &str,
    text: Option<&[u8]>,
    out: &mut BytesMut,
    ctx: &mut Ctx<'_>,
) {
    let message = format!("prepared statement \"{name}\" already exists");
    if let Some(text) = text {
        probe(
            text,
            Expect::Swallow {
                kind: Kind::Parse,
                undo: None,
            },
            out,
            ctx,
        );
    }
    // A simple query's duplicate is a syntax error, whatever the transaction's state.
    refuse("42P05", &message, text.is_some(), out, ctx);
}

/// Refuses a name in Sluice's namespace that the client does not hold
/// ([`super::is_sluice_name`]) as PostgreSQL refuses a name never prepared (26000),
/// for a Bind or Describe (`extended`) or an SQL-level EXECUTE or DEALLOCATE. In a
/// failed transaction PostgreSQL refuses those two SQL commands before looking the
/// name up, and so does this.
pub(super) fn refuse_unknown(name: &str, extended: bool, out: &mut BytesMut, ctx: &mut Ctx<'_>) {
    if !extended && ctx.aborted {
        let message =
            "current transaction is aborted, commands ignored until end of transaction block";
        refuse("25P02", message, false, out, ctx);
        return;
    }
    let message = format!("prepared statement \"{name}\" does not exist");
    refuse("26000", &message, extended, out, ctx);
}

/// Answers a request with an error of Sluice's: the server gets a request bound to
/// fail in its place, so that an error before it, a transaction it aborts and (in
/// the extended protocol, `extended`) the skip to the Sync after it all happen as
/// they would have (see [`Expect::Refuse`]).
fn refuse(code: &str, message: &str, extended: bool, out: &mut BytesMut, ctx: &mut Ctx<'_>) {
    let mut error = BytesMut::new();
    crate::protocol::backend::error_response(&mut error, "ERROR", code, message);
    expect(
        ctx,
        Expect::Refuse {
            error: error.to_vec().into_boxed_slice(),
            extended,
        },
    );
    if extended {
        // A Describe of no kind PostgreSQL knows: an error, whatever is prepared.
        out.put_u8(TAG_DESCRIBE);
        out.put_u32(4 + 2);
        out.extend_from_slice(b"X\0");
    } else {
        // A syntax error, whatever the transaction's state.
        put_query(out, &["SLUICE REFUSED"]);
        expect(ctx, fwd(Kind::UntilReady));
    }
}

/// Makes sure the server has `stmt`, injecting a Parse (and a Close for an evicted
/// statement) whose answers are swallowed. An SQL-level statement is prepared with
/// its `PREPARE`: as a simple Query before a simple Query (`in_batch` false), or, in
/// an extended-protocol batch, run as a throwaway statement and portal, since a
/// simple Query there would end the batch's implicit transaction and its portals.
pub(super) fn ensure_prepared(
    stmt: &Arc<super::Statement>,
    in_batch: bool,
    out: &mut BytesMut,
    ctx: &mut Ctx<'_>,
) {
    if let Some(needs) = ctx.deferred.as_deref_mut() {
        // No server yet: whoever hands the request one looks for the statement there.
        if !needs.iter().any(|s| s.id == stmt.id) {
            needs.push(stmt.clone());
        }
        return;
    }
    if ctx.server.touch(stmt) {
        return;
    }
    make_room(out, ctx);
    ctx.server.insert(stmt);
    *ctx.server_parses += 1;
    let undo = Some(Undo::ForgetOnServer(stmt.id));
    if !stmt.sql {
        stmt.parse_message(out);
        expect(
            ctx,
            Expect::Swallow {
                kind: Kind::Parse,
                undo,
            },
        );
        return;
    }
    if !in_batch {
        stmt.parse_message(out);
        expect(
            ctx,
            Expect::SwallowQuery {
                failed: false,
                undo,
            },
        );
        return;
    }
    let prepare = stmt.prepare_text();
    let name = THROWAWAY.as_bytes();
    // The query text, and no parameter types.
    put_parse(out, name, &[prepare.as_bytes(), b"\0\0\0"]);
    // Bind: the throwaway portal, no parameters, no result formats.
    out.put_u8(TAG_BIND);
    out.put_u32((4 + 2 * (name.len() + 1) + 6) as u32);
    for _ in 0..2 {
        out.extend_from_slice(name);
        out.put_u8(0);
    }
    out.put_u16(0);
    out.put_u16(0);
    out.put_u16(0);
    out.put_u8(TAG_EXECUTE);
    out.put_u32((4 + name.len() + 1 + 4) as u32);
    out.extend_from_slice(name);
    out.put_u8(0);
    out.put_u32(0);
    put_close(out, b'P', name);
    put_close(out, b'S', name);
    // Undone if any part fails or is skipped: the PREPARE is the Execute.
    for (kind, undo) in [
        (Kind::Parse, None),
        (Kind::Bind, None),
        (Kind::Execute, undo),
        (Kind::Close, None),
        (Kind::Close, None),
    ] {
        expect(ctx, Expect::Swallow { kind, undo });
    }
}

/// A Parse of statement `name` whose body after the name is `body`'s parts.
fn put_parse(out: &mut BytesMut, name: &[u8], body: &[&[u8]]) {
    let len: usize = body.iter().map(|b| b.len()).sum();
    out.put_u8(TAG_PARSE);
    out.put_u32((4 + name.len() + 1 + len) as u32);
    out.extend_from_slice(name);
    out.put_u8(0);
    for b in body {
        out.extend_from_slice(b);
    }
}

pub(super) fn put_close(out: &mut BytesMut, kind: u8, name: &[u8]) {
    out.put_u8(TAG_CLOSE);
    out.put_u32((4 + 1 + name.len() + 1) as u32);
    out.put_u8(kind);
    out.extend_from_slice(name);
    out.put_u8(0);
}

/// Has the server parse `text` (a Parse body after the name) as [`THROWAWAY`], its
/// answer queued as `answer`, and close it again at once (skipped with the rest if
/// the Parse failed).
pub(super) fn probe(text: &[u8], answer: Expect, out: &mut BytesMut, ctx: &mut Ctx<'_>) {
    put_parse(out, THROWAWAY.as_bytes(), &[text]);
    expect(ctx, answer);
    put_close(out, b'S', THROWAWAY.as_bytes());
    expect(
        ctx,
        Expect::Swallow {
            kind: Kind::Close,
            undo: None,
        },
    );
}

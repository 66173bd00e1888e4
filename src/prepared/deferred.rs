//! A request rewritten while its client waits in line, before the server it goes to is
//! known: what qualifies, and what its server must prepare ahead of it. The pool's
//! line writes such a request at the hand-over, as it writes a plain one, to a server
//! that holds its statements (`pool::Request::needs`); the relay prepares them on any
//! other before sending it.

use std::sync::Arc;

use bytes::BytesMut;

use super::inject::ensure_prepared;
use super::names::statement_name_bytes;
use super::rewrite::{whole_message, Ctx};
use super::{ClientStatements, Statement};
use crate::protocol::header::*;

/// Whether `input` is a request the rewriter may take before its server is known
/// ([`Ctx::deferred`]): whole messages within `max_len`, Binds, Describes, Executes
/// and Flushes ending at its one Sync, naming statements the client holds (at least
/// one; unnamed ones and portals too). Rewritten, it needs nothing of a server but
/// those statements: no Parse, Close or simple Query, no name Sluice refuses, nothing
/// Sluice answers itself.
pub fn deferrable_request(input: &[u8], max_len: u32, client: &mut ClientStatements) -> bool {
    let mut rest = input;
    let mut named = false;
    while !rest.is_empty() {
        let Some((tag, len, msg)) = whole_message(rest, max_len) else {
            return false;
        };
        rest = &rest[len + 1..];
        match tag {
            TAG_BIND | TAG_DESCRIBE => match statement_name_bytes(tag, msg) {
                None if tag == TAG_BIND => return false,
                None | Some(b"") => {}
                Some(name) => match client.find(name) {
                    Ok(Some(_)) => named = true,
                    _ => return false,
                },
            },
            TAG_EXECUTE | TAG_FLUSH => {}
            TAG_SYNC => return rest.is_empty() && named,
            _ => return false,
        }
    }
    false
}

/// Prepares on the server of `ctx` those of `needs` (gathered by a rewrite before the
/// server was known, [`Ctx::deferred`]) that it lacks, into `out`, which goes before
/// the request; their answers are queued, and must go ahead of the request's.
pub fn prepare_deferred(needs: &[Arc<Statement>], out: &mut BytesMut, ctx: &mut Ctx<'_>) {
    for stmt in needs {
        ensure_prepared(stmt, true, out, ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostile::msg;
    use crate::prepared::responses::{Expect, Kind};
    use crate::prepared::rewrite::Rewriter;
    use crate::prepared::TestState;

    /// What pgbench `-M prepared` and libpq's `PQexecPrepared` send.
    fn bind_run(name: &[u8]) -> Vec<u8> {
        let mut b = b"\0".to_vec();
        b.extend_from_slice(name);
        b.extend_from_slice(b"\0\0\0\0\0\0\0");
        let mut req = msg(b'B', &b);
        req.extend(msg(b'D', b"P\0"));
        req.extend(msg(b'E', b"\0\0\0\0\0"));
        req.extend(msg(b'S', b""));
        req
    }

    fn with_s1() -> TestState {
        let mut w = TestState::default();
        let mut input = BytesMut::from(&msg(b'P', b"S_1\0select 1\0\0\0")[..]);
        let mut out = BytesMut::new();
        let mut ctx = w.ctx();
        Rewriter::default()
            .process(&mut input, &mut out, 1 << 20, &mut ctx, |_| {})
            .expect("a Parse");
        w.tracker = Default::default();
        w
    }

    #[test]
    fn only_a_run_of_statements_the_client_holds_is_taken_before_its_server() {
        let mut w = with_s1();
        let c = &mut w.client;
        assert!(deferrable_request(&bind_run(b"S_1"), 1 << 20, c));
        let mut describe = msg(b'D', b"SS_1\0");
        describe.extend(msg(b'S', b""));
        assert!(deferrable_request(&describe, 1 << 20, c));
        // A name it does not hold (PostgreSQL's error, or Sluice's refusal), the
        // unnamed statement alone (a plain request), a Parse, a simple Query, no
        // Sync last, a second request after it, a message cut short.
        assert!(!deferrable_request(&bind_run(b"S_2"), 1 << 20, c));
        assert!(!deferrable_request(&bind_run(b"SLUICE_1"), 1 << 20, c));
        assert!(!deferrable_request(&bind_run(b""), 1 << 20, c));
        let mut parse = msg(b'P', b"S_3\0select 3\0\0\0");
        parse.extend(bind_run(b"S_1"));
        assert!(!deferrable_request(&parse, 1 << 20, c));
        let mut query = bind_run(b"S_1");
        query.extend(msg(b'Q', b"select 1\0"));
        assert!(!deferrable_request(&query, 1 << 20, c));
        let run = bind_run(b"S_1");
        assert!(!deferrable_request(&run[..run.len() - 5], 1 << 20, c));
        assert!(!deferrable_request(&run[..run.len() - 1], 1 << 20, c));
        let mut two = run.clone();
        two.extend(bind_run(b"S_1"));
        assert!(!deferrable_request(&two, 1 << 20, c));
        assert!(!deferrable_request(&run, 8, c), "over max_packet_size");
    }

    #[test]
    fn a_request_rewritten_before_its_server_gets_what_that_server_lacks_first() {
        let mut w = with_s1();
        let stmt = w.client.get("S_1").cloned().expect("S_1");
        w.server.clear();
        let mut needs = Vec::new();
        let mut input = BytesMut::from(&bind_run(b"S_1")[..]);
        let mut out = BytesMut::new();
        {
            let mut ctx = w.ctx();
            ctx.deferred = Some(&mut needs);
            Rewriter::default()
                .process(&mut input, &mut out, 1 << 20, &mut ctx, |_| {})
                .expect("a Bind run");
        }
        assert!(input.is_empty());
        assert_eq!(out[0], b'B', "renamed, with nothing injected");
        let name = format!("\0{}\0", stmt.server_name);
        assert!(out.windows(name.len()).any(|x| x == name.as_bytes()));
        assert_eq!(needs.iter().map(|s| s.id).collect::<Vec<_>>(), [stmt.id]);
        assert!(w.server.is_empty(), "no server looked at");
        assert_eq!(w.tracker.queue.len(), 4);
        // Its server lacks the statement: a Parse goes ahead, answered first.
        let owed = w.tracker.take_queue();
        let mut ahead = BytesMut::new();
        prepare_deferred(&needs, &mut ahead, &mut w.ctx());
        w.tracker.queue_after(owed);
        assert_eq!(ahead[0], b'P');
        assert!(w.server.touch(&stmt));
        let kinds: Vec<_> = w
            .tracker
            .queue
            .iter()
            .map(|e| match e {
                Expect::Swallow { kind, .. } => (false, *kind),
                Expect::Forward { kind, .. } => (true, *kind),
                e => panic!("unexpected {e:?}"),
            })
            .collect();
        use Kind::*;
        let want = [
            (false, Parse),
            (true, Bind),
            (true, Describe),
            (true, Execute),
            (true, Sync),
        ];
        assert_eq!(kinds, want);
        // A server that has it needs nothing ahead.
        let mut ahead = BytesMut::new();
        prepare_deferred(&needs, &mut ahead, &mut w.ctx());
        assert!(ahead.is_empty());
    }
}

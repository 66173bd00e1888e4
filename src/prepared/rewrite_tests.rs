//! Tests of the request rewriter: renaming, reuse, injection, streaming, refusals.

use super::*;

use crate::hostile::msg;

use crate::prepared::TestState as World;

impl World {
    fn new() -> World {
        World::default()
    }

    fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut input = BytesMut::from(bytes);
        let mut out = BytesMut::new();
        let mut ctx = self.ctx();
        Rewriter::default()
            .process(&mut input, &mut out, 1 << 20, &mut ctx, |_| {})
            .unwrap();
        assert!(input.is_empty());
        out.to_vec()
    }
}

#[test]
fn renames_and_reuses_statements() {
    let mut w = World::new();
    let mut req = msg(b'P', b"S_1\0select $1\0\0\x01\0\0\0\x17");
    req.extend(msg(b'B', b"\0S_1\0\0\0\0\x01\0\0\0\x011\0\0"));
    req.extend(msg(b'E', b"\0\0\0\0\0"));
    req.extend(msg(b'S', b""));
    let out = w.feed(&req);
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("SLUICE_1\0select $1"), "{text:?}");
    assert!(text.contains("\0SLUICE_1\0"), "{text:?}");
    assert!(!text.contains("S_1"));
    assert_eq!(w.parses, 1);
    // A second client Parse of the same text on the same server sends nothing.
    let out = w.feed(&msg(b'P', b"other\0select $1\0\0\x01\0\0\0\x17"));
    assert!(out.is_empty());
    assert_eq!(w.client.len(), 2);
}

#[test]
fn injects_parse_for_a_statement_the_server_lacks() {
    let mut w = World::new();
    w.feed(&msg(b'P', b"S_1\0select 1\0\0\0"));
    w.server.clear(); // as if the client moved to another server
    let out = w.feed(&msg(b'B', b"\0S_1\0\0\0\0\0\0\0"));
    assert_eq!(out[0], b'P');
    assert_eq!(w.parses, 2);
}

#[test]
fn unknown_names_pass_through_and_discard_all_waits_for_the_server() {
    let mut w = World::new();
    let b = msg(b'B', b"\0nope\0\0\0\0\0\0\0");
    assert_eq!(w.feed(&b), b);
    w.feed(&msg(b'P', b"S_1\0select 1\0\0\0"));
    w.feed(&msg(b'Q', b"discard all;\0"));
    // Names go only when the server confirms (a DISCARD ALL may fail).
    assert_eq!(w.client.len(), 1);
}

#[test]
fn a_second_parse_of_a_live_name_is_refused_as_postgres_refuses_it() {
    let mut w = World::new();
    w.feed(&msg(b'P', b"S_1\0select 1\0\0\0"));
    let out = w.feed(&msg(b'P', b"S_1\0select 2\0\0\0"));
    // The server parses the text under a throwaway name (a syntax error, or a
    // failed transaction, is PostgreSQL's first answer), closes it, then gets a
    // Describe bound to fail; the client's name is kept.
    let mut want = msg(b'P', b"sluice_throwaway\0select 2\0\0\0");
    want.extend(msg(b'C', b"Ssluice_throwaway\0"));
    want.extend(msg(b'D', b"X\0"));
    assert_eq!(out, want);
    assert_eq!(w.client.len(), 1);
    assert!(
        matches!(w.tracker.queue.back(), Some(Expect::Refuse { error: e, .. })
        if e.windows(5).any(|f| f == b"42P05"))
    );
    // After Close the name is free again.
    w.feed(&msg(b'C', b"SS_1\0"));
    w.feed(&msg(b'P', b"S_1\0select 2\0\0\0"));
    assert_eq!(w.client.len(), 1);
}

#[test]
fn sluices_own_names_are_answered_as_never_prepared() {
    let mut w = World::new();
    // Another client's statement is on the server as SLUICE_1 and sluice_2.
    w.feed(&msg(b'P', b"S_1\0select 1\0\0\0"));
    w.feed(&msg(b'Q', b"PREPARE q AS SELECT 2\0"));
    let mut other = World {
        registry: std::mem::take(&mut w.registry),
        server: std::mem::take(&mut w.server),
        ..World::new()
    };
    let refused = |w: &World, code: &[u8]| {
        matches!(w.tracker.queue.iter().rev().find(|e| matches!(e, Expect::Refuse { .. })),
            Some(Expect::Refuse { error: e, .. }) if e.windows(5).any(|f| f == code))
    };
    for bind in [
        &b"\0SLUICE_1\0\0\0\0\0\0\0"[..],
        b"\0sluice_2\0\0\0\0\0\0\0",
    ] {
        assert_eq!(other.feed(&msg(b'B', bind)), msg(b'D', b"X\0"));
        assert!(refused(&other, b"26000"));
    }
    assert_eq!(other.feed(&msg(b'D', b"SSLUICE_1\0")), msg(b'D', b"X\0"));
    let out = other.feed(&msg(b'C', b"SSLUICE_1\0"));
    assert_eq!(out, msg(b'C', b"Ssluice_closed\0"));
    for sql in [
        "DEALLOCATE \"SLUICE_1\"",
        "deallocate sluice_2",
        "EXECUTE Sluice_2",
    ] {
        let out = other.feed(&msg(b'Q', format!("{sql}\0").as_bytes()));
        assert_eq!(out, msg(b'Q', b"SLUICE REFUSED\0"), "{sql}");
        assert!(refused(&other, b"26000"), "{sql}");
    }
    // In a failed transaction PostgreSQL refuses the command before the name.
    other.aborted = true;
    other.feed(&msg(b'Q', b"EXECUTE sluice_2\0"));
    assert!(refused(&other, b"25P02"));
    assert_eq!(other.server.len(), 2, "the server keeps both");
    // Portals are not renamed, and names the client holds are its own.
    let b = msg(b'B', b"SLUICE_1\0\0\0\0\0\0\0\0");
    assert_eq!(other.feed(&b), b);
    other.feed(&msg(b'P', b"SLUICE_1\0select 1\0\0\0"));
    let out = other.feed(&msg(b'B', b"\0SLUICE_1\0\0\0\0\0\0\0"));
    assert_eq!(out, msg(b'B', b"\0SLUICE_1\0\0\0\0\0\0\0"));
    // Not plain for the delegate, whatever the client holds.
    let sync = msg(b'S', b"");
    let bind = [msg(b'B', b"\0SLUICE_1\0\0\0\0\0\0\0"), sync.clone()].concat();
    assert!(!plain_request(&bind, 1 << 20, false));
    let bind = [msg(b'B', b"\0other\0\0\0\0\0\0\0"), sync].concat();
    assert!(plain_request(&bind, 1 << 20, false));
}

#[test]
fn close_removes_the_client_name_only() {
    let mut w = World::new();
    w.feed(&msg(b'P', b"S_1\0select 1\0\0\0"));
    let out = w.feed(&msg(b'C', b"SS_1\0"));
    assert!(String::from_utf8_lossy(&out).contains("sluice_closed"));
    assert!(w.client.is_empty());
    assert_eq!(w.server.len(), 1);
}

#[test]
fn streams_big_messages_and_waits_for_whole_parses() {
    let mut w = World::new();
    let p = msg(b'P', b"S_1\0select 1\0\0\0");
    let mut input = BytesMut::from(&p[..7]);
    let mut out = BytesMut::new();
    let mut rw = Rewriter::default();
    let mut ctx = Ctx {
        registry: &w.registry,
        client: &mut w.client,
        server: &mut w.server,
        tracker: &mut w.tracker,
        max_prepared: 2,
        server_parses: &mut w.parses,
        aborted: false,
        deferred: None,
    };
    rw.process(&mut input, &mut out, 1 << 20, &mut ctx, |_| {})
        .unwrap();
    assert!(out.is_empty() && input.len() == 7);
    input.extend_from_slice(&p[7..]);
    let d = msg(b'd', &[7u8; 100]);
    input.extend_from_slice(&d[..50]);
    rw.process(&mut input, &mut out, 1 << 20, &mut ctx, |_| {})
        .unwrap();
    assert!(out.ends_with(&d[..50]));
    assert!(!rw.at_boundary());
}

#[test]
fn plain_requests_are_whole_simple_queries_needing_no_rewrite() {
    let q = |sql: &str| msg(b'Q', format!("{sql}\0").as_bytes());
    let two = [q("SELECT 1"), q("  select abalance from t")].concat();
    assert!(plain_request(&two, 1 << 20, false));
    assert!(plain_request(&q("/* x */ DISCARD ALL"), 1 << 20, false));
    // Other words with the same first letters are plain.
    for sql in [
        "END;",
        "delete from t",
        "EXPLAIN SELECT 1",
        "DROP TABLE t",
        "PREPARED",
        "EXECUTES",
        "",
    ] {
        assert!(plain_request(&q(sql), 1 << 20, false), "{sql}");
    }
    // Recognised by their first word: the rewriter's business.
    for sql in [
        "PREPARE p AS SELECT 1",
        " execute p",
        "DEALLOCATE p",
        "\n\tdeallocate prepare p",
        "discard all",
        "Prepare(x)",
    ] {
        assert!(!plain_request(&q(sql), 1 << 20, false), "{sql}");
    }
    // Too long to be read whole, so never inspected: plain whatever it starts with.
    let long = format!("PREPARE p AS SELECT '{}'", "x".repeat(300));
    assert!(plain_request(&q(&long), 1 << 20, false));
    assert!(
        !plain_request(&q(&long), 100, false),
        "past max_packet_size"
    );
    // Anything else, a partial message, or nothing at all.
    assert!(!plain_request(
        &[q("SELECT 1"), msg(b'd', b"x")].concat(),
        1 << 20,
        false
    ));
    assert!(!plain_request(&msg(b'X', b""), 1 << 20, false));
    let whole = q("SELECT 1");
    assert!(!plain_request(&whole[..whole.len() - 1], 1 << 20, false));
    assert!(!plain_request(&whole[..3], 1 << 20, false));
    assert!(!plain_request(b"", 1 << 20, false));
}

#[test]
fn plain_requests_include_the_unnamed_statement_up_to_a_sync() {
    let parse = |name: &str| msg(b'P', format!("{name}\0SELECT $1\0\0\0").as_bytes());
    let bind = msg(b'B', b"\0\0\0\0\0\0\0\0");
    let describe = msg(b'D', b"P\0");
    let execute = msg(b'E', b"\0\0\0\0\0");
    let sync = msg(b'S', b"");
    let batch = |p: &[u8]| [p, &bind, &describe, &execute, &sync].concat();
    // What libpq sends for PQexecParams (pgbench -M extended).
    assert!(plain_request(&batch(&parse("")), 1 << 20, false));
    // A simple query and an extended batch in one read.
    let q = msg(b'Q', b"SELECT 1\0");
    assert!(plain_request(
        &[&q[..], &batch(&parse(""))].concat(),
        1 << 20,
        false
    ));
    // A named statement is the rewriter's.
    assert!(!plain_request(&batch(&parse("s1")), 1 << 20, false));
    // Not ending at a Sync: the answers owed before one could not be told apart.
    let unsynced = [&parse("")[..], &bind, &execute, &msg(b'H', b"")].concat();
    assert!(!plain_request(&unsynced, 1 << 20, false));
    assert!(plain_request(
        &[&unsynced[..], &sync].concat(),
        1 << 20,
        false
    ));
    // A partial message, or one past max_packet_size.
    let whole = batch(&parse(""));
    assert!(!plain_request(&whole[..whole.len() - 3], 1 << 20, false));
    assert!(!plain_request(&whole, 10, false));
    // A client that holds statements: the same batch is plain, and so is a Describe
    // or Close of a portal; a Bind, Describe or Close naming a statement is not.
    assert!(plain_request(&whole, 1 << 20, true));
    let tail = [&execute[..], &sync].concat();
    for (m, plain) in [
        (msg(b'B', b"\0s1\0\0\0\0\0\0\0"), false),
        (msg(b'B', b"p1\0s1\0\0\0\0\0\0\0"), false),
        (msg(b'B', b"p1\0\0\0\0\0\0\0\0"), true),
        (msg(b'D', b"Ss1\0"), false),
        (msg(b'D', b"S\0"), true),
        (msg(b'D', b"Pp1\0"), true),
        (msg(b'C', b"Ss1\0"), false),
        (msg(b'C', b"Pp1\0"), true),
    ] {
        let req = [&m[..], &tail].concat();
        assert_eq!(plain_request(&req, 1 << 20, true), plain, "{m:?}");
        assert!(plain_request(&req, 1 << 20, false), "{m:?}");
    }
}

#[test]
fn a_single_message_moves_by_swapping_buffers() {
    let m = msg(b'Q', b"SELECT 1\0");
    let mut input = BytesMut::with_capacity(64);
    input.extend_from_slice(&m);
    let ptr = input.as_ptr();
    let mut out = BytesMut::new();
    pass(&mut input, m.len(), &mut out);
    assert_eq!(&out[..], &m[..]);
    assert_eq!(out.as_ptr(), ptr, "moved without a copy");
    assert!(input.is_empty());
    // Part of the input, or into a buffer that holds bytes: copied.
    input.extend_from_slice(&m);
    input.extend_from_slice(&m);
    pass(&mut input, m.len(), &mut out);
    assert_eq!(&out[..], &[m.clone(), m.clone()].concat()[..]);
    assert_eq!(&input[..], &m[..]);
}

//! Tests of the response tracker: split points, synthesized and swallowed answers,
//! errors, and DISCARD ALL seen in CommandComplete.

use super::*;
use crate::prepared::Registry;
use crate::session::framer::{Body, Framer};

use crate::hostile::msg;

/// Feeds `stream` split at `cuts` and returns what the client would receive.
fn run(queue: Vec<Expect>, stream: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut t = ResponseTracker::default();
    for e in queue {
        t.push(e);
    }
    let mut out = Vec::new();
    t.take_ready_synthesized(true, &mut out);
    let mut f = Framer::default();
    let (mut c, mut s) = (ClientStatements::default(), ServerStatements::default());
    let mut last = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        let mut chunk = bytes::BytesMut::from(&stream[last..cut]);
        process_chunk(
            &mut t,
            &mut f,
            &mut chunk,
            &mut c,
            &mut s,
            &Registry::default(),
            |_| Body::Skip,
        )
        .unwrap();
        out.extend_from_slice(&chunk);
        last = cut;
    }
    assert!(t.is_idle(), "queue left: {:?}", t.queue);
    out
}

fn fwd(kind: Kind) -> Expect {
    Expect::Forward { kind, undo: None }
}

#[test]
fn swallows_injected_parse_and_synthesizes_at_every_split() {
    // Client: Parse(S) [server has it] Bind Execute Sync, then Bind(T) needing an
    // injected Parse, Execute, Sync.
    let queue = || {
        vec![
            Expect::Synthesize(PARSE_COMPLETE, None),
            fwd(Kind::Bind),
            fwd(Kind::Execute),
            fwd(Kind::UntilReady),
            Expect::Swallow {
                kind: Kind::Parse,
                undo: None,
            },
            fwd(Kind::Bind),
            fwd(Kind::Execute),
            fwd(Kind::UntilReady),
        ]
    };
    let mut server = msg(b'2', b"");
    server.extend(msg(b'D', b"\0\x01\0\0\0\x011"));
    server.extend(msg(b'C', b"SELECT 1\0"));
    server.extend(msg(b'Z', b"I"));
    server.extend(msg(b'1', b""));
    server.extend(msg(b'2', b""));
    server.extend(msg(b'C', b"SELECT 0\0"));
    server.extend(msg(b'Z', b"I"));
    let mut want = msg(b'1', b"");
    want.extend(msg(b'2', b""));
    want.extend(msg(b'D', b"\0\x01\0\0\0\x011"));
    want.extend(msg(b'C', b"SELECT 1\0"));
    want.extend(msg(b'Z', b"I"));
    want.extend(msg(b'2', b""));
    want.extend(msg(b'C', b"SELECT 0\0"));
    want.extend(msg(b'Z', b"I"));
    assert_eq!(run(queue(), &server, &[]), want);
    for a in 0..server.len() {
        assert_eq!(run(queue(), &server, &[a]), want, "split at {a}");
    }
}

#[test]
fn synthesized_answer_waits_for_earlier_answers() {
    // Bind+Execute outstanding, then the client's Parse of a statement the server
    // already has: ParseComplete must follow CommandComplete.
    let queue = vec![
        fwd(Kind::Bind),
        fwd(Kind::Execute),
        Expect::Synthesize(PARSE_COMPLETE, None),
        fwd(Kind::UntilReady),
    ];
    let mut server = msg(b'2', b"");
    server.extend(msg(b'C', b"SELECT 1\0"));
    server.extend(msg(b'Z', b"I"));
    let mut want = msg(b'2', b"");
    want.extend(msg(b'C', b"SELECT 1\0"));
    want.extend(msg(b'1', b""));
    want.extend(msg(b'Z', b"I"));
    for a in 0..=server.len() {
        assert_eq!(
            run(queue_clone(&queue), &server, &[a]),
            want,
            "split at {a}"
        );
    }
}

fn queue_clone(q: &[Expect]) -> Vec<Expect> {
    q.iter()
        .map(|e| match e {
            Expect::Forward { kind, undo } => Expect::Forward {
                kind: *kind,
                undo: undo.clone(),
            },
            Expect::Swallow { kind, undo } => Expect::Swallow {
                kind: *kind,
                undo: undo.clone(),
            },
            Expect::Synthesize(b, u) => Expect::Synthesize(b, u.clone()),
            Expect::Refuse { error, extended } => Expect::Refuse {
                error: error.clone(),
                extended: *extended,
            },
            Expect::Query { .. } | Expect::SwallowQuery { .. } => unreachable!("not in tests"),
        })
        .collect()
}

#[test]
fn discard_all_confirmed_by_the_server_clears_both_caches() {
    let r = super::super::Registry::default();
    let stmt = r.intern(bytes::Bytes::from_static(b"select 1\0\0\0"));
    let (mut c, mut s) = (ClientStatements::default(), ServerStatements::default());
    c.insert("a".into(), stmt.clone());
    s.insert(&stmt);
    let mut t = ResponseTracker::default();
    t.push(fwd(Kind::Execute));
    t.push(fwd(Kind::UntilReady));
    let mut f = Framer::default();
    let mut chunk = bytes::BytesMut::from(&msg(b'C', b"SELECT 1\0")[..]);
    process_chunk(
        &mut t,
        &mut f,
        &mut chunk,
        &mut c,
        &mut s,
        &Registry::default(),
        |_| Body::Skip,
    )
    .unwrap();
    assert_eq!((c.len(), s.len()), (1, 1));
    let mut stream = msg(b'C', b"DISCARD ALL\0");
    stream.extend(msg(b'Z', b"I"));
    for cut in [0, 3, 9, stream.len()] {
        c.insert("a".into(), stmt.clone());
        s.insert(&stmt);
        let mut t = ResponseTracker::default();
        t.push(fwd(Kind::Execute));
        t.push(fwd(Kind::UntilReady));
        let mut f = Framer::default();
        for part in [&stream[..cut], &stream[cut..]] {
            let mut chunk = bytes::BytesMut::from(part);
            process_chunk(
                &mut t,
                &mut f,
                &mut chunk,
                &mut c,
                &mut s,
                &Registry::default(),
                |_| Body::Skip,
            )
            .unwrap();
        }
        assert_eq!((c.len(), s.len()), (0, 0), "cut at {cut}");
    }
}

#[test]
fn error_skips_to_sync_and_drops_synthesized() {
    let queue = vec![
        Expect::Swallow {
            kind: Kind::Parse,
            undo: Some(Undo::ForgetOnServer(7)),
        },
        fwd(Kind::Bind),
        Expect::Synthesize(PARSE_COMPLETE, None),
        fwd(Kind::Execute),
        fwd(Kind::UntilReady),
    ];
    let mut server = msg(b'E', b"SERROR\0C42P01\0Mno table\0\0");
    server.extend(msg(b'Z', b"I"));
    assert_eq!(run(queue, &server, &[]), server);
}

#[test]
fn simple_query_answers_then_a_synthesized_one_at_every_split() {
    // A simple query's answer (taken by the plain-chunk path), and a Parse the server
    // need not see queued while that answer is still arriving.
    let mut stream = msg(b'T', &[0, 0]);
    stream.extend(msg(b'D', &[0, 0]));
    stream.extend(msg(b'C', b"SELECT 1\0"));
    stream.extend(msg(b'Z', b"I"));
    for cut in 0..=stream.len() {
        let mut t = ResponseTracker::default();
        t.push(fwd(Kind::UntilReady));
        let mut f = Framer::default();
        let (mut c, mut s) = (ClientStatements::default(), ServerStatements::default());
        let mut out = Vec::new();
        for (i, part) in [&stream[..cut], &stream[cut..]].into_iter().enumerate() {
            let mut chunk = bytes::BytesMut::from(part);
            let reg = Registry::default();
            process_chunk(&mut t, &mut f, &mut chunk, &mut c, &mut s, &reg, |_| {
                Body::Skip
            })
            .unwrap();
            out.extend_from_slice(&chunk);
            if i == 0 {
                t.push(Expect::Synthesize(PARSE_COMPLETE, None));
                t.take_ready_synthesized(f.at_boundary(), &mut out);
            }
        }
        let mut want = stream.clone();
        want.extend_from_slice(PARSE_COMPLETE);
        assert_eq!(out, want, "split at {cut}");
        assert!(t.is_idle(), "split at {cut}: {:?}", t.queue);
        t.recycle();
    }
}

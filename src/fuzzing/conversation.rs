//! The relay between a client that sends well-formed messages of the fuzzer's
//! choosing, at the moments it chooses, and a server that answers them as PostgreSQL
//! would ([`Model`]). Where the `relay` targets check that nothing breaks on any
//! bytes, this one checks what the relay must get right on real ones: every answer
//! reaches the client, the server goes back once it is idle, and with
//! prepared-statement tracking the client sees what PostgreSQL would have told it.

use std::net::Shutdown;

use super::model::Model;
use super::relay::{drain, drive, pair, release_at, runtime, settle, write, Ended};

/// Statement texts a script picks from: the model errs on `ERR`, and follows the
/// transaction ones.
const TEXTS: [&str; 7] = [
    "SELECT 1", "BEGIN", "COMMIT", "ROLLBACK", "ERR", "", "SELECT 2",
];

/// The most operations a script runs: enough for several batches, and a run in
/// milliseconds.
const MAX_OPS: usize = 256;

/// What the client does next.
#[derive(Debug)]
enum Act {
    /// Writes these messages.
    Send(Vec<u8>),
    /// The server reads what has reached it and answers.
    Serve,
}

fn message(out: &mut Vec<u8>, tag: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.push(tag);
    out.extend_from_slice(&(len as u32 + 4).to_be_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// A statement name from 4 bits: the unnamed one, or `s1`..`s15`.
fn name(n: u8) -> Vec<u8> {
    match n & 15 {
        0 => b"\0".to_vec(),
        n => format!("s{n}\0").into_bytes(),
    }
}

fn text(n: u8) -> Vec<u8> {
    let mut t = TEXTS[usize::from(n) % TEXTS.len()].as_bytes().to_vec();
    t.push(0);
    t
}

/// The script of a fuzzer input: after the mode byte, pairs of an operation and its
/// argument. Messages gather until a Send; what is left is sent at the end.
fn script(mut ops: &[u8]) -> Vec<Act> {
    let (mut acts, mut out) = (Vec::new(), Vec::new());
    let mut count = 0;
    while let (Some((&op, rest)), true) = (ops.split_first(), count < MAX_OPS) {
        let arg = rest.first().copied().unwrap_or(0);
        ops = rest.get(1..).unwrap_or(&[]);
        count += 1;
        let (hi, lo) = (arg >> 4, arg & 15);
        match op % 14 {
            0 => message(&mut out, b'Q', &[&text(arg)]),
            1 => message(&mut out, b'P', &[&name(hi), &text(lo), &[0, 0]]),
            // Bind the unnamed portal to a statement: no parameters, text results.
            2 => message(&mut out, b'B', &[b"\0", &name(hi), &[0, 0, 0, 0, 0, 0]]),
            3 => message(&mut out, b'D', &[b"S", &name(hi)]),
            4 => message(&mut out, b'D', &[b"P\0"]),
            5 => message(&mut out, b'E', &[b"\0", &[0, 0, 0, 0]]),
            6 => message(&mut out, b'S', &[]),
            7 => message(&mut out, b'H', &[]),
            8 => message(&mut out, b'C', &[b"S", &name(hi)]),
            9 => message(&mut out, b'C', &[b"P\0"]),
            10 => message(&mut out, b'F', &[&[0, 0, 0, 42, 0, 0, 0, 0, 0, 0]]),
            11 => message(&mut out, [b'd', b'c', b'f'][usize::from(lo) % 3], &[]),
            12 if !out.is_empty() => acts.push(Act::Send(std::mem::take(&mut out))),
            13 => acts.push(Act::Serve),
            _ => {}
        }
    }
    if !out.is_empty() {
        acts.push(Act::Send(out));
    }
    acts
}

/// The messages of `bytes` (whole ones, as the script and the model write them):
/// each one's tag and body.
pub(crate) fn messages(mut bytes: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        let head = bytes.get(..5)?;
        let len = (u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize).max(4);
        let body = bytes.get(5..1 + len).unwrap_or(&[]);
        let tag = head[0];
        bytes = bytes.get(1 + len..).unwrap_or(&[]);
        Some((tag, body))
    })
}

/// Whether the script pipelines: sends a message after a request's end (a Sync,
/// Query or FunctionCall) before the server has answered that request. With
/// tracking, the relay rewrites a request from what it knows when the request comes
/// (the statements the client and the server hold, whether the transaction failed),
/// and undoes that when the server skips a request after an error. So a request
/// rewritten while an earlier one is in flight may be answered otherwise than
/// PostgreSQL would if the earlier one fails (docs/prepared-statements.md: a use of a
/// name closed or parsed in flight, a Parse of a text in flight or after a query
/// that fails the transaction). The comparison with PostgreSQL leaves these out.
fn pipelined(acts: &[Act]) -> bool {
    let mut ended = false;
    for act in acts {
        let bytes = match act {
            Act::Send(bytes) => &bytes[..],
            Act::Serve => {
                ended = false;
                continue;
            }
        };
        for (tag, _) in messages(bytes) {
            if ended {
                return true;
            }
            ended = matches!(tag, b'S' | b'Q' | b'F');
        }
    }
    false
}

/// What one run produced.
struct Run {
    /// Everything the client sent, what reached the server, what the server sent and
    /// what reached the client.
    sent: Vec<u8>,
    to_server: Vec<u8>,
    from_server: Vec<u8>,
    to_client: Vec<u8>,
    ended: Ended,
    /// The server was idle when the client left.
    idle: bool,
}

/// The first byte picks the pool mode and prepared-statement tracking as in
/// [`super::relay`]; the rest is a [`script`]. Runs it through the relay and checks:
///
/// - without tracking, the server gets the start of the client's bytes, and the
///   client gets the server's unchanged, all of them if it was the client that left;
/// - with tracking, the client gets the answers PostgreSQL would have sent it
///   (their kinds and ReadyForQuery statuses), the model run on its bytes directly
///   (unless [`pipelined`]);
/// - in transaction and statement modes, a server idle when the client leaves was
///   let go: the client left while holding none.
pub fn conversation(data: &[u8]) {
    let Some((&mode, ops)) = data.split_first() else {
        return;
    };
    let acts = script(ops);
    let run = converse(mode, &acts);
    let by_client = run.ended.by_client();
    if mode & 4 == 0 {
        assert!(
            run.sent.starts_with(&run.to_server),
            "the server got other bytes"
        );
        if by_client {
            assert_eq!(run.to_client, run.from_server, "the client missed answers");
        } else {
            assert!(run.from_server.starts_with(&run.to_client), "other answers");
        }
    } else if by_client && !pipelined(&acts) {
        let mut direct = Vec::new();
        Model::default().feed(&run.sent, &mut direct);
        assert_eq!(
            kinds(&run.to_client),
            kinds(&direct),
            "with tracking, other answers than PostgreSQL's to the client's bytes"
        );
    }
    // With tracking a request may be answered without reaching the server: the
    // server is idle, but the client is still in a batch.
    let ended_request = matches!(last_tag(&acts), Some(b'S' | b'Q' | b'F'));
    if mode & 1 == 0 && run.idle && by_client && ended_request {
        assert!(
            matches!(run.ended, Ended::Unlinked),
            "an idle server was kept: {:?}",
            run.ended
        );
    }
}

/// The tag of the last message the script sends.
fn last_tag(acts: &[Act]) -> Option<u8> {
    let sent = acts.iter().filter_map(|a| match a {
        Act::Send(bytes) => Some(&bytes[..]),
        Act::Serve => None,
    });
    sent.flat_map(messages).last().map(|(tag, _)| tag)
}

/// The answers' kinds, and ReadyForQuery's status byte.
fn kinds(bytes: &[u8]) -> Vec<(u8, u8)> {
    let status = |tag, body: &[u8]| match tag {
        b'Z' => body.first().copied().unwrap_or(0),
        _ => 0,
    };
    messages(bytes)
        .map(|(tag, body)| (tag, status(tag, body)))
        .collect()
}

fn converse(mode: u8, script: &[Act]) -> Run {
    let mut model = Model::default();
    let (mut sent, mut to_server, mut from_server, mut to_client) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let ended = runtime().block_on(async {
        let (client, client_end) = pair();
        let (server, server_end) = pair();
        // The server reads what reached it and answers.
        let mut serve = |to_server: &mut Vec<u8>, from_server: &mut Vec<u8>| {
            let at = to_server.len();
            drain(&server_end, to_server);
            let mut answer = Vec::new();
            model.feed(&to_server[at..], &mut answer);
            write(&server_end, &answer);
            from_server.extend_from_slice(&answer);
            if model.closed {
                let _ = server_end.shutdown(Shutdown::Write);
            }
        };
        let peers = async {
            for act in script {
                match act {
                    Act::Send(bytes) => {
                        write(&client_end, bytes);
                        sent.extend_from_slice(bytes);
                    }
                    Act::Serve => serve(&mut to_server, &mut from_server),
                }
                settle().await;
                drain(&client_end, &mut to_client);
            }
            // Then everything is answered (a request takes a settle to reach the
            // server, its answer another to reach the client) before the client goes.
            for _ in 0..4 {
                serve(&mut to_server, &mut from_server);
                settle().await;
                drain(&client_end, &mut to_client);
            }
            let _ = client_end.shutdown(Shutdown::Write);
        };
        let (ended, ()) = tokio::join!(
            drive(release_at(mode), mode & 4 != 0, client, server),
            peers
        );
        drain(&client_end, &mut to_client);
        drain(&server_end, &mut to_server);
        ended
    });
    let idle = model.idle();
    Run {
        sent,
        to_server,
        from_server,
        to_client,
        ended,
        idle,
    }
}

#[cfg(test)]
mod tests {
    use super::{converse, script, Act, Ended};

    /// The harness is a real conversation: a Query and an extended batch, answered
    /// after they reached the server, go through whole (the statement renamed with
    /// tracking), and in transaction mode the server is let go after them.
    #[test]
    fn a_conversation_goes_through() {
        // Query "SELECT 1"; send; serve; Parse s1 "SELECT 1", Bind s1, Execute,
        // Sync; send; serve.
        let ops = [
            0, 0, 12, 0, 13, 0, 1, 0x10, 2, 0x10, 5, 0, 6, 0, 12, 0, 13, 0,
        ];
        let acts = script(&ops);
        assert_eq!(acts.len(), 4, "{acts:?}");
        assert!(matches!(acts[1], Act::Serve));
        for mode in 0..8 {
            let run = converse(mode, &acts);
            if mode & 4 == 0 {
                assert_eq!(run.to_server, run.sent, "mode {mode}");
            }
            let tags: Vec<u8> = super::kinds(&run.to_client).iter().map(|k| k.0).collect();
            assert_eq!(tags, b"CZ12CZ", "mode {mode}");
            assert!(run.idle, "mode {mode}");
            if mode & 1 == 0 {
                assert!(
                    matches!(run.ended, Ended::Unlinked),
                    "mode {mode}: {:?}",
                    run.ended
                );
            }
            super::conversation(&[&[mode][..], &ops].concat());
        }
    }
}

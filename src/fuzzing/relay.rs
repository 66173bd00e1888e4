//! The relay between a client and a server, both of them sending what the fuzzer
//! chooses, over socket pairs in a runtime of its own. [`relay`] writes each side's
//! bytes before the relay starts; [`relay_steps`] writes them step by step and lets
//! the relay run to a standstill after each, so that a server's answer can come after
//! the request it answers, as a real server's does.

use std::io::{ErrorKind, Read};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use socket2::SockRef;

use super::{steps, Side};
use crate::net::{StdStream, Stream};
use crate::pool::Pool;
use crate::prepared::Registry;
use crate::session::params::ClientParams;
use crate::session::relay::{Outcome, Parked, RelaySlot, ReleaseAt, Timeouts};
use crate::stats::PoolStats;

/// The most bytes each side sends: both fit in a socket pair's buffers, so no write
/// waits on a reader.
const MAX_SIDE: usize = 48 * 1024;

/// How many times the runtime polls its sockets and the relay after a step: more
/// than a step's bytes need to reach the other side and their answer to come back.
const SETTLE_ROUNDS: usize = 8;

/// The first byte picks the pool mode (its low two bits: transaction, session,
/// statement, session with checkpoints) and prepared-statement tracking (bit 2); the
/// rest are [`steps`]: each side's bytes, in order, are what that side sends. Both
/// sides then close, and the relay runs, as the session would, request after request
/// until it stops for another reason than a release point. It must stop (libFuzzer's
/// timeout finds one that does not), not panic, and pass bytes as [`check`] says.
pub fn relay(data: &[u8]) {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    for (side, bytes) in capped(data) {
        match side {
            Side::Client => from_client.extend_from_slice(bytes),
            Side::Server => from_server.extend_from_slice(bytes),
        }
    }
    let (to_client, to_server) = exchange(mode, &from_client, &from_server);
    check(mode, &from_client, &from_server, &to_client, &to_server);
}

/// As [`relay`], but each step's bytes are sent only once the relay has done what it
/// could with the steps before: a request reaches the server before its answer is
/// written, and a client's next request may come while an answer is on its way.
pub fn relay_steps(data: &[u8]) {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let steps: Vec<(Side, &[u8])> = capped(data).collect();
    let (to_client, to_server) = converse(mode, &steps);
    let side = |want: Side| -> Vec<u8> {
        let of_side = steps.iter().filter(|(s, _)| *s == want);
        of_side.flat_map(|(_, b)| b.iter().copied()).collect()
    };
    check(
        mode,
        &side(Side::Client),
        &side(Side::Server),
        &to_client,
        &to_server,
    );
}

/// The steps, each side's bytes cut at [`MAX_SIDE`].
fn capped(data: &[u8]) -> impl Iterator<Item = (Side, &[u8])> {
    let mut sent = [0usize; 2];
    steps(data).map(move |(side, bytes)| {
        let sent = &mut sent[side as usize];
        let bytes = &bytes[..bytes.len().min(MAX_SIDE - *sent)];
        *sent += bytes.len();
        (side, bytes)
    })
}

/// Without prepared-statement tracking the relay changes no byte, drops none in the
/// middle and adds none (the session, not the relay, writes the pooler's own
/// errors): each peer gets the start of what the other sent, all of it unless the
/// relay stopped early.
fn check(mode: u8, from_client: &[u8], from_server: &[u8], to_client: &[u8], to_server: &[u8]) {
    if mode & 4 == 0 {
        assert!(
            from_server.starts_with(to_client),
            "the client got {to_client:?}, not the start of the server's {from_server:?}"
        );
        assert!(
            from_client.starts_with(to_server),
            "the server got {to_server:?}, not the start of the client's {from_client:?}"
        );
    }
}

pub(super) fn release_at(mode: u8) -> ReleaseAt {
    match mode & 3 {
        0 => ReleaseAt::TransactionEnd,
        1 => ReleaseAt::SessionEnd,
        2 => ReleaseAt::StatementEnd,
        _ => ReleaseAt::SessionCheckpoints,
    }
}

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime")
}

/// Runs the relay over what each side sends (`mode` as in [`relay`]), all of it
/// written first; returns what reached the client and what reached the server.
pub fn exchange(mode: u8, from_client: &[u8], from_server: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (client_end, server_end) = runtime().block_on(async {
        let (client, client_end) = pair();
        let (server, server_end) = pair();
        for (end, bytes) in [(&client_end, from_client), (&server_end, from_server)] {
            write(end, bytes);
            end.shutdown(Shutdown::Write).expect("shutdown");
        }
        drive(release_at(mode), mode & 4 != 0, client, server).await;
        (client_end, server_end)
    });
    let (mut to_client, mut to_server) = (Vec::new(), Vec::new());
    drain(&client_end, &mut to_client);
    drain(&server_end, &mut to_server);
    (to_client, to_server)
}

/// Runs the relay over `steps`, each written once the relay has settled after the
/// one before; returns what reached the client and what reached the server.
pub fn converse(mode: u8, steps: &[(Side, &[u8])]) -> (Vec<u8>, Vec<u8>) {
    let (mut to_client, mut to_server) = (Vec::new(), Vec::new());
    runtime().block_on(async {
        let (client, client_end) = pair();
        let (server, server_end) = pair();
        let peers = async {
            for &(side, bytes) in steps {
                write(
                    if side == Side::Client {
                        &client_end
                    } else {
                        &server_end
                    },
                    bytes,
                );
                settle().await;
                drain(&client_end, &mut to_client);
                drain(&server_end, &mut to_server);
            }
            for end in [&client_end, &server_end] {
                let _ = end.shutdown(Shutdown::Write);
            }
        };
        tokio::join!(
            drive(release_at(mode), mode & 4 != 0, client, server),
            peers
        );
        // The relay has stopped and closed its ends: the rest is there to read.
        drain(&client_end, &mut to_client);
        drain(&server_end, &mut to_server);
    });
    (to_client, to_server)
}

/// Lets the runtime poll the sockets and run the relay [`SETTLE_ROUNDS`] times.
pub(super) async fn settle() {
    for _ in 0..SETTLE_ROUNDS {
        tokio::task::yield_now().await;
    }
}

/// Writes all of `bytes` to a peer's end (they fit its buffer). A relay that has
/// closed its end makes the rest go nowhere, without a SIGPIPE.
pub(super) fn write(end: &UnixStream, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match SockRef::from(end).send_with_flags(bytes, libc::MSG_NOSIGNAL) {
            Ok(n) if n > 0 => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => panic!("a side's bytes fit the buffer"),
            _ => return,
        }
    }
}

/// Appends what has reached a peer's end so far (non-blocking), or, once the relay
/// has closed its end, all of it.
pub(super) fn drain(mut end: &UnixStream, got: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    loop {
        match end.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // WouldBlock: nothing more yet. A reset when the relay closed with bytes
            // unread is an end too.
            Err(_) => return,
        }
    }
}

/// One end of a socket pair for Sluice, and the other, non-blocking, for the peer.
pub(super) fn pair() -> (Stream, UnixStream) {
    let (ours, theirs) = UnixStream::pair().expect("a socket pair");
    for end in [&ours, &theirs] {
        end.set_nonblocking(true).expect("non-blocking");
    }
    let stream = Stream::from_std(StdStream::Unix(ours)).expect("a stream");
    (stream, theirs)
}

/// How [`drive`] stopped.
#[derive(Debug)]
pub(super) enum Ended {
    /// The client closed or terminated while it held no server.
    Unlinked,
    /// The relay stopped (for another reason than a release point) while linked.
    Linked(Outcome),
    /// The client failed while it held no server.
    UnlinkedFailed,
}

impl Ended {
    /// The client went away (all its bytes read), as opposed to the relay stopping
    /// for a reason of its own.
    pub(super) fn by_client(&self) -> bool {
        matches!(self, Ended::Unlinked | Ended::Linked(Outcome::ClientClosed))
    }
}

/// Relays until it stops, as the session does, then closes both of Sluice's ends.
pub(super) async fn drive(
    release: ReleaseAt,
    prepared: bool,
    client: Stream,
    server: Stream,
) -> Ended {
    let mut server = Pool::lent_for_tests(server);
    let mut parked = Parked::new(1 << 20, Timeouts::default());
    if prepared {
        parked.enable_prepared(Arc::new(Registry::default()), 2);
    }
    let mut slot = RelaySlot::new(parked);
    let mut params = ClientParams::new(&[]);
    let stats = PoolStats::default();
    loop {
        // As the session does: a client without a server reads its request first.
        let relay = slot.get();
        if !relay.has_request() {
            match relay.read_client_unlinked(&client, &stats).await {
                Ok(true) => {}
                Ok(false) => return Ended::Unlinked,
                Err(_) => return Ended::UnlinkedFailed,
            }
        }
        match relay
            .run(&client, &mut server, &mut params, release, &stats)
            .await
        {
            Outcome::ReleasePoint => {
                // As the session does: the server went back first, then the client
                // is paid, and the counts go in.
                if relay.owes_client() && relay.send_to_client(&client, &[]).await.is_err() {
                    return Ended::UnlinkedFailed;
                }
                stats.flush(&mut relay.stats);
                slot.rest();
            }
            other => return Ended::Linked(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{converse, exchange, Side};

    use crate::hostile::msg;

    fn answer(tag: &[u8]) -> Vec<u8> {
        [msg(b'C', tag), msg(b'Z', b"I")].concat()
    }

    /// The harness relays: in every mode, two queries reach the server and their
    /// answers the client, byte for byte.
    #[test]
    fn queries_and_answers_go_through() {
        let q = [msg(b'Q', b"SELECT 1\0"), msg(b'Q', b"SELECT 2\0")].concat();
        let answers = [answer(b"SELECT 1\0"), answer(b"SELECT 1\0")].concat();
        for mode in 0..8 {
            let (to_client, to_server) = exchange(mode, &q, &answers);
            assert_eq!(to_server, q, "mode {mode}");
            assert_eq!(to_client, answers, "mode {mode}");
        }
    }

    /// Step by step, each answer written after its query reached the server: all of
    /// it goes through, in every mode.
    #[test]
    fn steps_go_through_in_turn() {
        let (q1, q2) = (msg(b'Q', b"SELECT 1\0"), msg(b'Q', b"SELECT 2\0"));
        let (a1, a2) = (answer(b"SELECT 1\0"), answer(b"SELECT 2\0"));
        let steps = [
            (Side::Client, &q1[..]),
            (Side::Server, &a1[..]),
            (Side::Client, &q2[..]),
            (Side::Server, &a2[..]),
        ];
        for mode in 0..8 {
            let (to_client, to_server) = converse(mode, &steps);
            assert_eq!(to_server, [&q1[..], &q2].concat(), "mode {mode}");
            assert_eq!(to_client, [&a1[..], &a2].concat(), "mode {mode}");
        }
    }

    /// The step-by-step seeds are whole conversations (simple and extended queries, a
    /// transaction, a pipeline, an error in a batch, COPY): without prepared-statement
    /// tracking every byte of each goes through.
    #[test]
    fn the_step_seeds_go_through_whole() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/relay_steps");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("the seeds") {
            let path = entry.expect("an entry").path();
            let data = std::fs::read(&path).expect("a seed");
            let Some((&mode, data)) = data.split_first() else {
                panic!("{path:?} is empty");
            };
            let steps: Vec<_> = super::capped(data).collect();
            let side = |want| -> Vec<u8> {
                let of_side = steps.iter().filter(|(s, _)| *s == want);
                of_side.flat_map(|(_, b)| b.iter().copied()).collect()
            };
            let (to_client, to_server) = converse(mode, &steps);
            if mode & 4 == 0 {
                assert_eq!(to_server, side(Side::Client), "{path:?}");
                assert_eq!(to_client, side(Side::Server), "{path:?}");
            } else {
                assert!(!to_client.is_empty() && !to_server.is_empty(), "{path:?}");
            }
            seen += 1;
        }
        assert!(seen >= 6, "{seen} seeds");
    }

    /// The check catches a byte the relay would have changed, on either side.
    #[test]
    #[should_panic(expected = "not the start of the server's")]
    fn a_changed_byte_fails_the_check() {
        super::check(0, b"Q", b"ZI", b"ZT", b"Q");
    }

    #[test]
    #[should_panic(expected = "not the start of the client's")]
    fn a_byte_added_towards_the_server_fails_the_check() {
        super::check(1, b"Q", b"", b"", b"QQ");
    }

    /// A Terminate ends the relay: what follows it is not passed on, and a client that
    /// said goodbye is sent nothing more.
    #[test]
    fn nothing_after_a_terminate() {
        let q = msg(b'Q', b"SELECT 1\0");
        let sent = [q.clone(), msg(b'X', b""), q.clone()].concat();
        let (to_client, to_server) = exchange(0, &sent, &answer(b"SELECT 1\0"));
        assert_eq!(to_server, q);
        assert!(to_client.is_empty(), "{to_client:?}");
    }
}

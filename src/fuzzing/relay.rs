//! The relay between a client and a server, both of them sending what the fuzzer
//! chooses, over socket pairs in a runtime of its own.

use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::net::{StdStream, Stream};
use crate::pool::Pool;
use crate::prepared::Registry;
use crate::session::params::ClientParams;
use crate::session::relay::{Outcome, Parked, RelaySlot, ReleaseAt, Timeouts};
use crate::stats::PoolStats;

/// The most bytes each side sends: both fit in a socket pair's buffers, so the
/// bytes are all written before the relay starts and nothing waits on a reader.
const MAX_SIDE: usize = 48 * 1024;

/// The first byte picks the pool mode (its low two bits: transaction, session,
/// statement, session with checkpoints) and prepared-statement tracking (bit 2); the
/// rest are steps as in [`super::prepared`]: each side's bytes, in order, are what
/// that side sends. Both sides then close, and the relay runs, as the session would,
/// request after request until it stops for another reason than a release point.
/// It must stop (libFuzzer's timeout finds one that does not) and not panic.
pub fn relay(data: &[u8]) {
    let Some((&mode, mut data)) = data.split_first() else {
        return;
    };
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    while let Some((&step, rest)) = data.split_first() {
        let n = (usize::from(step >> 1) * 4).min(rest.len());
        let (bytes, rest) = rest.split_at(n);
        data = rest;
        let side = if step & 1 == 0 {
            &mut from_client
        } else {
            &mut from_server
        };
        side.extend_from_slice(&bytes[..bytes.len().min(MAX_SIDE - side.len())]);
    }
    exchange(mode, &from_client, &from_server);
}

/// Runs the relay over what each side sends (`mode` as in [`relay`]); returns what
/// reached the client and what reached the server.
pub fn exchange(mode: u8, from_client: &[u8], from_server: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let release = match mode & 3 {
        0 => ReleaseAt::TransactionEnd,
        1 => ReleaseAt::SessionEnd,
        2 => ReleaseAt::StatementEnd,
        _ => ReleaseAt::SessionCheckpoints,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    let (client_end, server_end) =
        runtime.block_on(run(release, mode & 4 != 0, from_client, from_server));
    (read_all(client_end), read_all(server_end))
}

/// What Sluice wrote to `end`, once Sluice's side is closed.
fn read_all(mut end: UnixStream) -> Vec<u8> {
    let mut got = Vec::new();
    // A reset when Sluice closed with bytes unread is an end too.
    let _ = std::io::Read::read_to_end(&mut end, &mut got);
    got
}

/// One end of a socket pair for Sluice, and the other with `bytes` written into it
/// and its sending side shut.
fn pair(bytes: &[u8]) -> (Stream, UnixStream) {
    let (ours, mut theirs) = UnixStream::pair().expect("a socket pair");
    theirs.write_all(bytes).expect("the bytes fit the buffer");
    theirs.shutdown(Shutdown::Write).expect("shutdown");
    ours.set_nonblocking(true).expect("non-blocking");
    let stream = Stream::from_std(StdStream::Unix(ours)).expect("a stream");
    (stream, theirs)
}

/// Relays until it stops; returns the peers' ends, Sluice's closed.
async fn run(
    release: ReleaseAt,
    prepared: bool,
    from_client: &[u8],
    from_server: &[u8],
) -> (UnixStream, UnixStream) {
    let (client, client_end) = pair(from_client);
    let (server_stream, server_end) = pair(from_server);
    let mut server = Pool::lent_for_tests(server_stream);
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
        if !relay.has_request()
            && !matches!(relay.read_client_unlinked(&client, &stats).await, Ok(true))
        {
            break;
        }
        match relay
            .run(&client, &mut server, &mut params, release, &stats)
            .await
        {
            Outcome::ReleasePoint => {
                // As the session does: the server went back first, then the client
                // is paid, and the counts go in.
                if relay.owes_client() && relay.send_to_client(&client, &[]).await.is_err() {
                    break;
                }
                stats.flush(&mut relay.stats);
                slot.rest();
            }
            _ => break,
        }
    }
    (client_end, server_end)
}

#[cfg(test)]
mod tests {
    use super::exchange;

    use crate::hostile::msg;

    /// The harness relays: in every mode, two queries reach the server and their
    /// answers the client, byte for byte.
    #[test]
    fn queries_and_answers_go_through() {
        let q = [msg(b'Q', b"SELECT 1\0"), msg(b'Q', b"SELECT 2\0")].concat();
        let answer = [msg(b'C', b"SELECT 1\0"), msg(b'Z', b"I")].concat();
        let answers = [answer.clone(), answer].concat();
        for mode in 0..8 {
            let (to_client, to_server) = exchange(mode, &q, &answers);
            assert_eq!(to_server, q, "mode {mode}");
            assert_eq!(to_client, answers, "mode {mode}");
        }
    }

    /// A Terminate ends the relay: what follows it is not passed on, and a client that
    /// said goodbye is sent nothing more.
    #[test]
    fn nothing_after_a_terminate() {
        let q = msg(b'Q', b"SELECT 1\0");
        let sent = [q.clone(), msg(b'X', b""), q.clone()].concat();
        let answer = [msg(b'C', b"SELECT 1\0"), msg(b'Z', b"I")].concat();
        let (to_client, to_server) = exchange(0, &sent, &answer);
        assert_eq!(to_server, q);
        assert!(to_client.is_empty(), "{to_client:?}");
    }
}

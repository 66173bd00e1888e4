//! A waiting client whose answer a delegate relays (pool/delegate.rs): what it
//! leaves with its request, and what its task does when it finds the place served.

use std::sync::Arc;

use bytes::BytesMut;

use super::{Session, Step};
use crate::clock::Tick;
use crate::net::Stream;
use crate::pool::{Delegate, Pool, Request, Ticket};
use crate::protocol::header::{
    TAG_BIND, TAG_DESCRIBE, TAG_EXECUTE, TAG_FLUSH, TAG_PARSE, TAG_QUERY, TAG_SYNC,
};
use crate::session::relay::Relay;

/// `SLUICE_DELEGATE=0` turns delegates off (read once), for comparing.
static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Lets a delegate relay the answer to `request` if it is [`one_request`] and the
/// session `may` (transaction pooling, no reset after each transaction, no timeout
/// that needs the relay's timer) on a plaintext socket.
pub(super) fn offer(request: &mut Request, may: bool, pool: &Arc<Pool>, stream: &Stream) {
    request.delegate_ok = may
        && one_request(&request.bytes)
        && *ENABLED.get_or_init(|| std::env::var_os("SLUICE_DELEGATE").is_none_or(|v| v != "0"));
    if request.delegate_ok && request.delegate.is_none() {
        match stream.plain_fd() {
            Some(fd) => {
                request.delegate = Some(Arc::new(Delegate {
                    pool: Arc::downgrade(pool),
                    id: 0.into(),
                    fd,
                }))
            }
            None => request.delegate_ok = false,
        }
    }
}

/// Whether `b` is whole messages making one request: a simple Query alone, or an
/// extended-protocol batch (Parse, Bind, Describe, Execute, Flush) ending in its only
/// Sync. One ReadyForQuery then ends the answer, as the delegate counts it.
fn one_request(b: &[u8]) -> bool {
    let mut at = 0;
    while let Some(h) = b.get(at..at + 5) {
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        let end = at + 1 + len;
        let last = end == b.len();
        match h[0] {
            _ if len < 4 || end > b.len() => return false,
            TAG_QUERY => return last && at == 0,
            TAG_SYNC => return last,
            TAG_PARSE | TAG_BIND | TAG_DESCRIBE | TAG_EXECUTE | TAG_FLUSH => at = end,
            _ => return false,
        }
    }
    false
}

/// What a delegate left with the request.
#[derive(Default)]
pub(super) struct After {
    owed: BytesMut,
    answer: BytesMut,
}

impl After {
    /// Takes the request left in line back into `relay` (when the place was
    /// answered): the time it was granted, and what a delegate left with it.
    pub(super) fn take_back(ticket: &mut Ticket, relay: &mut Relay) -> (Option<Tick>, After) {
        let Some(mut r) = ticket.take_request() else {
            return (None, After::default());
        };
        let after = After {
            owed: std::mem::take(&mut r.owed),
            answer: std::mem::take(&mut r.answer),
        };
        let granted = r.granted;
        relay.restore_line_request(r);
        (granted, after)
    }

    /// Server bytes the delegate read but left to the relay: its first server read.
    pub(super) fn preload(self, relay: &mut Relay) {
        if !self.answer.is_empty() {
            relay.preload_server(self.answer);
        }
    }
}

impl Session {
    /// The place was served: the answer went to the client and the server back to
    /// the pool. The counts go in as the relay would have counted them; what the
    /// client's socket did not take is paid now.
    pub(super) async fn served(
        &mut self,
        stream: &Stream,
        asked: Tick,
        granted: Option<Tick>,
        (at, n): (Tick, u32),
        after: After,
    ) -> Step {
        let relay = self.relay.get();
        let waited = granted.unwrap_or_else(Tick::now).micros_since(asked);
        relay.stats.counts.wait_time_us += waited;
        relay.stats.counts.server_assignments += 1;
        self.pool.stats.wait_hist.record(waited);
        relay.served_by_delegate(at, n, &self.pool.stats);
        if !after.owed.is_empty() {
            relay.owe_client(after.owed);
            if let Err(e) = self.pay_client(stream, false).await {
                return Step::End(format!("client I/O error: {e}").into());
            }
        }
        self.pool.stats.flush(&mut self.relay.get().stats);
        self.relay.rest();
        Step::Next
    }
}

#[cfg(test)]
mod tests {
    use super::one_request;
    use crate::hostile::msg;

    #[test]
    fn one_query_or_one_synced_batch_is_one_request() {
        let q = msg(b'Q', b"SELECT 1\0");
        let batch: Vec<u8> = [
            msg(b'P', b"\0SELECT 1\0\0\0"),
            msg(b'B', b"\0\0\0\0\0\0\0\0"),
            msg(b'D', b"P\0"),
            msg(b'E', b"\0\0\0\0\0"),
            msg(b'S', b""),
        ]
        .concat();
        assert!(one_request(&q));
        assert!(one_request(&batch));
        assert!(one_request(&msg(b'S', b"")));
        // Two answers' worth, a batch without its Sync, a Query inside a batch, a
        // Close, a cut message, a bad length.
        assert!(!one_request(&[q.clone(), q.clone()].concat()));
        assert!(!one_request(&[batch.clone(), batch.clone()].concat()));
        assert!(!one_request(&batch[..batch.len() - 5]));
        assert!(!one_request(
            &[msg(b'B', b"\0\0\0\0\0\0\0\0"), q.clone()].concat()
        ));
        assert!(!one_request(&[msg(b'C', b"Sx\0"), msg(b'S', b"")].concat()));
        assert!(!one_request(&q[..q.len() - 1]));
        assert!(!one_request(&[b'S', 0, 0, 0, 3]));
        assert!(!one_request(b""));
    }
}

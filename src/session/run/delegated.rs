//! A waiting client whose answer a delegate relays (pool/delegate.rs): what it
//! leaves with its request, and what its task does when it finds the place served.

use std::sync::Arc;

use bytes::BytesMut;

use super::{Session, Step};
use crate::clock::Tick;
use crate::net::Stream;
use crate::pool::{Delegate, Pool, Request, Ticket};
use crate::session::relay::Relay;

/// `SLUICE_DELEGATE=0` turns delegates off (read once), for comparing.
static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Lets a delegate relay the answer to `request` if it is one simple Query and the
/// session `may` (transaction pooling, no reset after each transaction, no timeout
/// that needs the relay's timer) on a plaintext socket.
pub(super) fn offer(request: &mut Request, may: bool, pool: &Arc<Pool>, stream: &Stream) {
    let b = &request.bytes;
    request.delegate_ok = may
        && b.len() >= 5
        && b[0] == b'Q'
        && 1 + u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize == b.len()
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

//! What the relay does for a request whose answer a delegate read (pool/delegate.rs).

use bytes::BytesMut;

use super::Relay;
use crate::clock::Tick;
use crate::stats::PoolStats;

impl Relay {
    /// The request's answer was relayed by a delegate (pool/delegate.rs), which read
    /// `n` bytes at `at`: counted as the relay counts an answer ending idle.
    pub fn served_by_delegate(&mut self, at: Tick, n: u32, stats: &PoolStats) {
        self.pending = 0;
        self.status = b'I';
        self.saw_ready = true;
        self.readies = 1;
        self.xacts_done = 1;
        if let Some(p) = self.prepared.as_mut() {
            p.answered_by_delegate();
        }
        self.stats.counts.bytes_sent += u64::from(n);
        self.note_server_activity_at(stats, at);
    }

    /// Whether a delegate may relay an answer: no timeout but `query_timeout` needs
    /// the relay's clock while the server answers, and that one the waiting task
    /// keeps with a timer at [`Relay::query_deadline`], taking the server back if it
    /// fires first (run/watch.rs).
    pub fn delegable(&self) -> bool {
        self.timeouts.transaction().is_zero()
    }

    /// Whether no timeout runs while the server answers: a request may then go
    /// behind another's (a place behind cannot be taken back before the server gets
    /// to it), and its task may sleep through the hand-over.
    pub fn untimed(&self) -> bool {
        self.timeouts.query().is_zero() && self.timeouts.transaction().is_zero()
    }

    /// When the pending request reaches `query_timeout`, if it is set.
    pub fn query_deadline(&self) -> Option<Tick> {
        let t = self.timeouts.query();
        (!t.is_zero())
            .then_some(self.request_started?)
            .map(|at| at + t)
    }

    /// Bytes the client is owed (what its socket did not take of a delegate's write).
    pub fn owe_client(&mut self, bytes: BytesMut) {
        self.s2c = bytes;
    }

    /// Server bytes read for this client by a delegate, for the next `run`.
    pub fn preload_server(&mut self, bytes: BytesMut) {
        self.preloaded = !bytes.is_empty();
        self.server_preload = bytes;
    }

    /// The bytes a delegate left, appended to `s2c` as a server read would: how many.
    pub(super) fn take_preload(&mut self) -> usize {
        self.preloaded = false;
        let pre = std::mem::take(&mut self.server_preload);
        self.s2c.extend_from_slice(&pre);
        pre.len()
    }
}

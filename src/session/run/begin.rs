//! A client's plain `BEGIN` answered by the pooler while every server is busy
//! (relay/begin.rs): the session's part.

use super::{Reason, Session};
use crate::config::PoolMode;
use crate::net::Stream;

impl Session {
    /// Whether the client's pending request is a plain `BEGIN` the pooler answers:
    /// if so, the relay took it and holds the answer ([`Session::answer_begin`]).
    pub(super) fn took_begin(&mut self) -> bool {
        if self.server.is_some() || !self.may_hold_begin() {
            return false;
        }
        let pool = &self.pool;
        self.relay.get().take_plain_begin(|| pool.would_wait())
    }

    /// A `BEGIN` answered before goes to the server ahead of this request.
    pub(super) fn carry_begin(&mut self) {
        if std::mem::take(&mut self.begun) {
            self.relay.get().hold_begin();
        }
    }

    /// Whether a plain `BEGIN` of this client's, holding no server, may be answered
    /// by the pooler (relay/begin.rs): in transaction pooling, one not answered yet.
    fn may_hold_begin(&self) -> bool {
        self.mode == PoolMode::Transaction
            && !self.begun
            && self.replication.is_none()
            && crate::session::relay::hold_begin_enabled()
    }

    /// Sends the answer to the `BEGIN` the relay took: the client is then between
    /// requests, its transaction begun as far as it knows.
    pub(super) async fn answer_begin(&mut self, stream: &Stream) -> Result<(), Reason> {
        self.begun = true;
        if let Err(e) = self.pay_client(stream, false).await {
            return Err(format!("client I/O error: {e}").into());
        }
        self.pool.stats.flush(&mut self.relay.get().stats);
        self.relay.rest();
        Ok(())
    }
}

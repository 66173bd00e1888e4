//! A client's `BEGIN` answered by the pooler while every server is busy
//! (relay/begin.rs): the session's part.

use super::{Reason, Session};
use crate::config::PoolMode;
use crate::net::Stream;
use crate::session::relay::Taken;

impl Session {
    /// Whether the client's pending request is a `BEGIN` the pooler answers, or the
    /// end of a transaction whose `BEGIN` it answered: if so, the relay took it and
    /// holds the answer ([`Session::answer_begin`]).
    pub(super) fn took_begin(&mut self) -> bool {
        let held = self.begun;
        if self.server.is_some() || !(held.is_some() || self.may_hold_begin()) {
            return false;
        }
        let pool = &self.pool;
        match self.relay.get().take_begin(held, || pool.would_wait()) {
            Taken::No => return false,
            Taken::Begin(modes) | Taken::Set(modes) => self.begun = Some(modes),
            Taken::End => self.begun = None,
        }
        true
    }

    /// A `BEGIN` answered before goes to the server ahead of this request.
    pub(super) fn carry_begin(&mut self) {
        if let Some(modes) = self.begun.take() {
            self.relay.get().hold_begin(modes);
        }
    }

    /// Whether a `BEGIN` of this client's, holding no server, may be answered by the
    /// pooler (relay/begin.rs): in transaction pooling, none answered yet.
    fn may_hold_begin(&self) -> bool {
        self.mode == PoolMode::Transaction
            && self.replication.is_none()
            && crate::session::relay::hold_begin_enabled()
    }

    /// Sends the answer the relay holds for what it took: the client is then
    /// between requests, its transaction begun (or ended) as far as it knows.
    pub(super) async fn answer_begin(&mut self, stream: &Stream) -> Result<(), Reason> {
        if let Err(e) = self.pay_client(stream, false).await {
            return Err(format!("client I/O error: {e}").into());
        }
        self.pool.stats.flush(&mut self.relay.get().stats);
        self.relay.rest();
        Ok(())
    }
}

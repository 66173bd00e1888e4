//! What the client is owed: server bytes kept past a release point, and messages the
//! pooler itself sends (a queue notice, an error).

use std::io;

use bytes::BytesMut;

use super::{flush, Relay, QUEUED_NOTICE};
use crate::net::Stream;

impl Relay {
    /// Whether server bytes wait in the relay for the client (after a release point).
    pub fn owes_client(&self) -> bool {
        !self.s2c.is_empty()
    }

    /// Writes as much of what the client is owed as its socket takes now; true when
    /// all of it went.
    pub fn try_pay_client(&mut self, client: &Stream) -> io::Result<bool> {
        flush(client, &mut self.s2c)?;
        Ok(self.s2c.is_empty())
    }

    /// Tells a client waiting in line past `query_wait_notify` that it is queued, with
    /// PgBouncer's notice. A waiting client is owed nothing (its session paid it before
    /// reading the request), so the notice goes straight to the socket; what the
    /// socket does not take now waits in `s2c`, which is written before anything the
    /// server sends.
    pub fn notice_queued(&mut self, client: &Stream) -> io::Result<()> {
        let mut msg = BytesMut::with_capacity(96);
        crate::protocol::backend::notice_response(&mut msg, "NOTICE", "00000", QUEUED_NOTICE);
        if self.s2c.is_empty() {
            flush(client, &mut msg)?;
        }
        self.s2c.extend_from_slice(&msg);
        Ok(())
    }

    /// Writes a message the pooler made (an error, say) to the client, after anything
    /// still pending for it.
    pub async fn send_to_client(&mut self, client: &Stream, msg: &[u8]) -> io::Result<()> {
        self.s2c.extend_from_slice(msg);
        let r = client.write_all(&self.s2c).await;
        self.s2c.clear();
        r
    }
}

//! Client bytes read while no server is linked: a request read before a server is
//! taken for it, and what comes while the client waits in line.

use std::io;

use super::wake::{next_wake, Wake, Want};
use super::{Outcome, Relay, READ_CHUNK};
use crate::clock::Tick;
use crate::net::Stream;
use crate::stats::PoolStats;

impl Relay {
    /// Waits for client bytes while no server is linked. Returns false when the client
    /// is gone or terminated (nothing to do), true when bytes for a server are pending.
    pub async fn read_client_unlinked(
        &mut self,
        client: &Stream,
        stats: &PoolStats,
    ) -> Result<bool, Outcome> {
        let mut timer = None;
        loop {
            // No flush timer here: transaction-pooled clients flush at each release.
            let deadline = self.deadline(false);
            let want = Want {
                client_read: true,
                ..Want::default()
            };
            match next_wake(client, None, want, deadline, &mut timer).await {
                Wake::ClientRead(r) => r.map_err(Outcome::ClientFailed)?,
                _ => {
                    let now = Tick::now();
                    self.maybe_flush(stats, now);
                    match self.deadline(false) {
                        Some((at, why)) if at <= now => return Err(Outcome::Timeout(why)),
                        _ => continue,
                    }
                }
            }
            if let Some(r) = self.try_read_unlinked(client, false) {
                return r;
            }
        }
    }

    /// One read of client bytes while no server is linked: `None` when nothing
    /// complete enough came (wait and try again), else as [`Relay::read_client_unlinked`].
    /// `at_once`: read without waiting for the loop to report the socket readable
    /// ([`Stream::try_read_buf_now`]).
    pub fn try_read_unlinked(
        &mut self,
        client: &Stream,
        at_once: bool,
    ) -> Option<Result<bool, Outcome>> {
        let pending_before = self.pending;
        match self.read_client(client, at_once) {
            Ok(true) => self.note_client_activity(pending_before, Tick::now()),
            Ok(false) => return Some(Ok(false)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Some(Err(super::count::client_protocol(e)));
            }
            Err(e) => return Some(Err(Outcome::ClientFailed(e))),
        }
        if let Some(p) = &self.prepared {
            if p.starts_with_terminate() {
                self.terminated = true;
                return Some(Ok(false));
            }
            return p.has_input().then_some(Ok(true));
        }
        if self.terminated && self.c2s.is_empty() {
            return Some(Ok(false));
        }
        (!self.c2s.is_empty()).then_some(Ok(true))
    }

    /// Whether more client bytes may be buffered while waiting for a server.
    pub fn can_buffer_more(&self) -> bool {
        let buffered = self.c2s.len() + self.prepared.as_ref().map_or(0, |p| p.input.len());
        buffered < 4 * READ_CHUNK && !self.terminated
    }

    /// Reads client bytes while waiting for a server. `Ok(false)`: the client left
    /// (end of stream or Terminate), so the wait should be abandoned.
    pub fn read_while_waiting(&mut self, client: &Stream) -> io::Result<bool> {
        let more = self.read_client(client, false)?;
        let prepared_terminate = self.prepared.as_ref().is_some_and(|p| p.has_terminate());
        Ok(more && !self.terminated && !prepared_terminate)
    }
}

//! A server with another client's request written behind this client's
//! (pool/pipeline.rs): the relay passes this client's answer to its first
//! ReadyForQuery and no further, keeps what follows with the server for that client,
//! and writes nothing more of this client's to the server meanwhile (it goes to the
//! next server this client gets, as a new request, and only then through the
//! prepared-statement rewriter, whose rewrite depends on the server's statements).

use super::{flush, Framer, Relay, ReleaseAt, ServerRead};
use crate::pool::ServerConn;
use crate::protocol::header::TAG_READY_FOR_QUERY;
use crate::session::params::ClientParams;

impl Relay {
    /// The other client's answer starts at `at` in `s2c`: it goes with the server.
    pub(super) fn cut_behind(&mut self, server: &mut crate::pool::server::ServerState, at: usize) {
        self.move_behind(server, at);
        self.server_framer = Framer::default();
    }

    fn move_behind(&mut self, server: &mut crate::pool::server::ServerState, at: usize) {
        server.ahead.extend_from_slice(&self.s2c[at..]);
        self.stats.counts.bytes_sent -= (self.s2c.len() - at) as u64;
        self.s2c.truncate(at);
    }

    /// Cuts a read that holds the other client's answer after this one's
    /// ReadyForQuery before the prepared-statement tracker sees it: the tracker would
    /// take it for this client's, and its edits would move where `read_server` cuts.
    pub(super) fn cut_before_tracker(&mut self, server: &mut crate::pool::server::ServerState) {
        let end = self
            .server_framer
            .end_of_first(&self.s2c, TAG_READY_FOR_QUERY);
        if let Some(end) = end.filter(|&e| e < self.s2c.len()) {
            self.move_behind(server, end);
        }
    }

    /// The client is gone before its answer ended: reads the answer to its end and
    /// drops it, so that the server goes on to the other client's request instead of
    /// closing under it. False if the server failed first.
    pub async fn drain_for_behind(
        &mut self,
        server: &mut ServerConn,
        params: &mut ClientParams,
    ) -> bool {
        loop {
            if !self.preloaded && server.stream.readable().await.is_err() {
                return false;
            }
            match self.read_server(server, params) {
                Ok(()) => self.s2c.clear(),
                Err(ServerRead::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return false,
            }
            if std::mem::take(&mut self.lead_ended) {
                return true;
            }
        }
    }

    /// Writes the client's bytes to the server. If they are one whole request that
    /// ends the transaction the client holds the server in, and nothing else is owed,
    /// the request of the first client in line may go behind it (pool/pipeline.rs):
    /// the server is idle after it, whatever its outcome.
    pub(super) fn write_request(
        &mut self,
        server: &mut ServerConn,
        release: ReleaseAt,
    ) -> std::io::Result<()> {
        let ends = release == ReleaseAt::TransactionEnd
            && self.status != b'I'
            && self.pending == 1
            && self.unsynced == 0
            && !self.await_ready
            && !self.desync
            && !self.terminated
            && !self.copy.in_copy()
            && self.untimed()
            // (The tracker must not follow the other client's answer: behind.rs.)
            && self.prepared.as_ref().is_none_or(|p| !p.watches(false))
            && crate::pool::ends_transaction(&self.c2s);
        flush(&server.stream, &mut self.c2s)?;
        if ends && self.c2s.is_empty() {
            if let Some(pool) = server.lent.pool() {
                pool.send_behind_end(server);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::net::{StdStream, Stream};
    use crate::session::params::ClientParams;

    /// A server with a request behind the one `relay`'s client is owed an answer
    /// for, and its other end.
    fn lead_with_one_behind() -> (ServerConn, std::os::unix::net::UnixStream, Relay) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let stream = Stream::from_std(StdStream::Unix(ours)).expect("stream");
        let mut server = crate::pool::Pool::lent_for_tests(stream);
        server.behind = Some(7);
        let mut relay = Relay::default();
        relay.pending = 1;
        (server, theirs, relay)
    }

    #[tokio::test]
    async fn a_header_cut_short_after_the_first_answer_goes_with_the_server() {
        let (mut server, mut theirs, mut relay) = lead_with_one_behind();
        // The first client's answer, and the first three bytes of the second's.
        let first = b"C\0\0\0\x0dSELECT 1\0Z\0\0\0\x05I";
        theirs.write_all(first).expect("write");
        theirs.write_all(b"T\0\0").expect("write");
        server.stream.readable().await.expect("readable");
        let mut params = ClientParams::new(&[]);
        assert!(relay.read_server(&mut server, &mut params).is_ok());
        assert!(relay.lead_ended);
        assert_eq!(&relay.s2c[..], &first[..], "only the first answer");
        assert_eq!(&server.ahead[..], b"T\0\0", "the rest goes with the server");
    }

    #[tokio::test]
    async fn a_tracked_answer_with_another_behind_is_cut_before_the_tracker_sees_the_rest() {
        use crate::prepared::responses::{Expect, Kind};
        let (mut server, mut theirs, mut relay) = lead_with_one_behind();
        // A request that binds a prepared statement, its answers queued.
        let registry = std::sync::Arc::new(crate::prepared::Registry::default());
        let kept = Box::new(super::super::ClientPrepared::new(registry, 10));
        let mut p = super::super::prepared::PreparedState::new(kept, bytes::BytesMut::new());
        p.mode = super::super::prepared::Mode::Tracked;
        for kind in [Kind::Bind, Kind::Execute, Kind::Sync] {
            p.tracker_mut().push(Expect::Forward { kind, undo: None });
        }
        relay.prepared = Some(p);
        let first = b"2\0\0\0\x04C\0\0\0\x0dSELECT 1\0Z\0\0\0\x05I";
        theirs.write_all(first).expect("write");
        // The other client's answer, its last header cut short (which the tracker
        // would hold back as this client's).
        theirs.write_all(b"2\0\0\0\x04C\0").expect("write");
        server.stream.readable().await.expect("readable");
        let mut params = ClientParams::new(&[]);
        assert!(relay.read_server(&mut server, &mut params).is_ok());
        assert!(relay.lead_ended);
        assert_eq!(&relay.s2c[..], &first[..], "only the first answer");
        assert_eq!(&server.ahead[..], b"2\0\0\0\x04C\0");
        assert!(relay.prepared.as_ref().is_some_and(|p| p.is_idle()));
    }
}

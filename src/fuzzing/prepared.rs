//! The `prepared` fuzz target: prepared-statement tracking in transaction mode.

use bytes::BytesMut;

use super::{steps, Side};
use crate::prepared::responses::process_chunk;
use crate::prepared::rewrite::{plain_request, Rewriter};
use crate::prepared::TestState;
use crate::session::framer::{Body, Framer};

/// One session's prepared-statement state, as the relay keeps it.
#[derive(Default)]
struct World {
    st: TestState,
    rewriter: Rewriter,
    framer: Framer,
    pending: BytesMut,
}

impl World {
    /// Client bytes through the rewriter, as one read: what goes to the server, or
    /// None where the session ends (a rewrite error, a Terminate).
    fn client(&mut self, bytes: &[u8]) -> Option<BytesMut> {
        let fresh = self.pending.is_empty() && self.rewriter.at_boundary();
        let plain = fresh && plain_request(bytes, 1 << 20, !self.st.client.is_empty());
        self.pending.extend_from_slice(bytes);
        let mut out = BytesMut::new();
        let mut terminated = false;
        let on_tag = |tag| terminated |= tag == b'X';
        let r = self.rewriter.process(
            &mut self.pending,
            &mut out,
            1 << 20,
            &mut self.st.ctx(),
            on_tag,
        );
        if r.is_err() || terminated {
            // The session ends here (a Terminate is not passed on).
            return None;
        }
        if plain && self.pending.is_empty() {
            assert_eq!(&out[..], bytes, "a plain request is passed on untouched");
        }
        Some(out)
    }

    /// Server bytes through the response tracker: what goes to the client, or None
    /// where the session ends.
    fn server(&mut self, bytes: &[u8]) -> Option<BytesMut> {
        let mut chunk = BytesMut::from(bytes);
        let st = &mut self.st;
        let r = process_chunk(
            &mut st.tracker,
            &mut self.framer,
            &mut chunk,
            &mut st.client,
            &mut st.server,
            &st.registry,
            |_| Body::Skip,
        );
        r.ok().map(|()| chunk)
    }

    /// The tracker's state, as its Debug shows it (the way it was told to take aside).
    fn tracker_state(&mut self) -> String {
        let long_way = std::mem::take(&mut self.st.tracker.long_way);
        let s = format!("{:?}", self.st.tracker);
        self.st.tracker.long_way = long_way;
        s
    }
}

/// Client and server bytes interleaved as the fuzzer chooses ([`steps`]), through
/// two sessions: one whose response tracker takes its shortcut for messages that
/// only pass through, one that takes the long way for every message. Both must send
/// the same bytes each way and end each step in the same state.
pub fn prepared(data: &[u8]) {
    let mut short = World::default();
    let mut long = World::default();
    long.st.tracker.long_way = true;
    for (i, (side, bytes)) in steps(data).enumerate() {
        let (a, b) = match side {
            Side::Client => (short.client(bytes), long.client(bytes)),
            Side::Server => (short.server(bytes), long.server(bytes)),
        };
        assert_eq!(a, b, "step {i} ({side:?}): the shortcut changed the bytes");
        assert_eq!(
            short.tracker_state(),
            long.tracker_state(),
            "step {i} ({side:?}): the shortcut changed the tracker"
        );
        if a.is_none() {
            return;
        }
    }
}

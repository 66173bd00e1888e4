//! Helpers for the pool's unit tests.

use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::server::conn_for_tests;
use super::slot::SlotToken;
use super::{LentMark, Pool, ServerConn};
use crate::net::{StdStream, Stream};

/// `p`'s one connection, over a socket pair, lent to a client (counted in `total`
/// and `active`); the other end of the pair, to keep it open.
pub(super) fn lent(p: &Arc<Pool>) -> (ServerConn, UnixStream) {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    ours.set_nonblocking(true).expect("nonblocking");
    let stream = Stream::from_std(StdStream::Unix(ours)).expect("stream");
    let mut st = p.lock_state();
    st.total = 1;
    st.active = 1;
    drop(st);
    let mut conn = conn_for_tests(stream, SlotToken::counted(p.clone()), p.generation());
    conn.lent = LentMark::lent_by(p.clone());
    (conn, theirs)
}

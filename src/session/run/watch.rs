//! Waiting for a server while watching the client.

use std::future::{poll_fn, Future};
use std::task::{ready, Poll};

use crate::net::Stream;
use crate::session::relay::Relay;

/// Waits for `acquire` while watching the client: one that leaves gives up its place
/// at once (`None`) and its buffered query never runs; `on_more` is told when client
/// bytes are read meanwhile. A plain readiness poll, not a `readable()` future, which
/// would queue a waker on the socket per turn.
pub(super) async fn watch_client<T>(
    stream: &Stream,
    relay: &mut Relay,
    mut on_more: impl FnMut(),
    mut acquire: std::pin::Pin<&mut impl Future<Output = T>>,
) -> Option<T> {
    poll_fn(|cx| loop {
        if let Poll::Ready(r) = acquire.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        if !relay.can_buffer_more() {
            return Poll::Pending;
        }
        match ready!(stream.poll_read_ready(cx)) {
            Err(_) => return Poll::Ready(None),
            Ok(()) => match relay.read_while_waiting(stream) {
                // More may come (or the read cleared readiness): look again.
                Ok(true) => on_more(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(false) | Err(_) => return Poll::Ready(None),
            },
        }
    })
    .await
}

//! Waiting for a server while watching the client.

use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{ready, Poll};

use crate::clock::Tick;
use crate::net::Stream;
use crate::session::relay::Relay;

/// Waits for `acquire` while watching the client: one that leaves gives up its place
/// at once (`None`) and its buffered query never runs; `on_more` is told when client
/// bytes are read meanwhile. A plain readiness poll, not a `readable()` future, which
/// would queue a waker on the socket per turn. `notice`, set by `acquire` when the
/// wait reaches `query_wait_notify`, has the client told it is queued. At `wake_at`
/// `acquire` is polled once more: a request whose answer a delegate relays reached
/// `query_timeout`, and its task takes the server back if it was granted (a server
/// granted after that wakes the task at once: `Waiter::wake_on_answer`).
pub(super) async fn watch_client<T>(
    stream: &Stream,
    relay: &mut Relay,
    mut on_more: impl FnMut(),
    notice: &AtomicBool,
    wake_at: Option<Tick>,
    mut acquire: std::pin::Pin<&mut impl Future<Output = T>>,
) -> Option<T> {
    let mut timer = wake_at.map(crate::timer::sleep_until);
    poll_fn(|cx| loop {
        if let Poll::Ready(r) = acquire.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        if let Some(t) = timer.as_mut() {
            if std::pin::Pin::new(t).poll(cx).is_ready() {
                // Once: the answer is looked for again, then the wait goes on.
                timer = None;
                continue;
            }
        }
        // A load first: a swap at every poll would be a locked instruction each.
        if notice.load(Ordering::Relaxed) {
            notice.store(false, Ordering::Relaxed);
            if let Err(e) = relay.notice_queued(stream) {
                tracing::warn!("sending the queue notice failed: {e}");
            }
            // Part of the notice waits in the relay: the answer must follow it, so
            // the hand-over wakes this task rather than relay for it.
            if relay.owes_client() {
                on_more();
            }
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

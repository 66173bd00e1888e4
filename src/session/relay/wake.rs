//! What woke the relay: one poll over both sockets and the timeout timer.
//!
//! This replaces a `tokio::select!` over `readable()`/`writable()` futures, which
//! built, registered and dropped a waiter per socket and direction on every loop turn
//! (twice per message batch). Polling readiness directly uses the socket's own waker
//! slot, and the timer is one `Sleep` kept across turns and reset only when the
//! deadline moves.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::Poll;

use crate::timer::Sleep;

use crate::clock::Tick;
use crate::net::Stream;

/// Which events the relay can act on now.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Want {
    pub server_read: bool,
    pub client_write: bool,
    pub client_read: bool,
    pub server_write: bool,
    /// Look at the client's reads first: the server owes nothing, so a wake-up is
    /// most likely the client's next statement (in a transaction, seven times per
    /// pgbench TPC-B transaction), and the server's readiness need not be asked.
    pub client_first: bool,
}

/// The event that woke the relay.
pub(super) enum Wake {
    ServerRead(io::Result<()>),
    Timer,
    ClientWrite(io::Result<()>),
    ClientRead(io::Result<()>),
    ServerWrite(io::Result<()>),
}

/// A timeout timer kept across loop turns (registered only once a timeout is set).
pub(super) type Timer = Option<Sleep>;

/// Waits for the first of the wanted events, in this order of preference: server
/// bytes (so responses are never starved), the timer, then the client's side; client
/// bytes first with `client_first` (no response is owed then).
/// Without a server (`server` None) only the client and the timer are watched.
pub(super) async fn next_wake(
    client: &Stream,
    server: Option<&Stream>,
    want: Want,
    deadline: Option<(Tick, &'static str)>,
    timer: &mut Timer,
) -> Wake {
    let armed = match deadline {
        Some((at, _)) => {
            match timer {
                Some(t) => t.reset(at),
                None => *timer = Some(crate::timer::sleep_until(at)),
            }
            true
        }
        None => false,
    };
    let client_read_late = want.client_read && !want.client_first;
    poll_fn(|cx| {
        if want.client_read && want.client_first {
            if let Poll::Ready(r) = client.poll_read_ready(cx) {
                return Poll::Ready(Wake::ClientRead(r));
            }
        }
        if let Some(server) = server {
            if want.server_read {
                if let Poll::Ready(r) = server.poll_read_ready(cx) {
                    return Poll::Ready(Wake::ServerRead(r));
                }
            }
        }
        if armed {
            if let Some(t) = timer.as_mut() {
                if Pin::new(t).poll(cx).is_ready() {
                    return Poll::Ready(Wake::Timer);
                }
            }
        }
        if want.client_write {
            if let Poll::Ready(r) = client.poll_write_ready(cx) {
                return Poll::Ready(Wake::ClientWrite(r));
            }
        }
        if client_read_late {
            if let Poll::Ready(r) = client.poll_read_ready(cx) {
                return Poll::Ready(Wake::ClientRead(r));
            }
        }
        if let Some(server) = server {
            if want.server_write {
                if let Poll::Ready(r) = server.poll_write_ready(cx) {
                    return Poll::Ready(Wake::ServerWrite(r));
                }
            }
        }
        Poll::Pending
    })
    .await
}

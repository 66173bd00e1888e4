//! The accept loops: one task per listener, spawning a session per client.
//!
//! A TCP listener's accept loop waits on its socket alone. What changes it from
//! outside (a shutdown closes it, a reload may turn `tcp_defer_accept` on or off) is
//! watched by a second task: were the loop to wait on those watches too, it would
//! poll both at each wake-up, and a watch's pending wait takes its lock at every
//! poll (~590 instructions per accepted connection, docs/performance.md,
//! twenty-eighth round).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::app::{App, Shutdown};
use crate::net::{
    listener::TcpListener, Accepting, Acceptor, Listeners, Origin, PeerAddr, StdStream, Stream,
    TcpTuning,
};

/// One accept task per listener; TCP listeners close when a shutdown begins, the UNIX
/// socket stays open until exit (PgBouncer keeps it for the admin console).
pub(super) async fn accept_loops(app: Arc<App>, mut listeners: Listeners) {
    let mut tasks = Vec::new();
    for l in std::mem::take(&mut listeners.tcp) {
        // Shared with the watcher, so that the descriptor it changes at a reload stays
        // this listener's until both are done with it.
        let l = Arc::new(l);
        let accepting = tokio::spawn(accept_tcp(app.clone(), l.clone()));
        tasks.push(tokio::spawn(watch_tcp(app.clone(), l, accepting)));
    }
    for l in std::mem::take(&mut listeners.unix) {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut acceptor = Acceptor::new(&l);
            loop {
                let accepted = acceptor.accept().await;
                match accepted.and_then(|(s, alone)| Ok((Stream::from_std(s)?, alone))) {
                    Ok((s, alone)) => {
                        let origin = Origin {
                            peer: PeerAddr::Unix,
                            local: None,
                            read_at_once: alone,
                        };
                        crate::session::spawn_client(app.clone(), s, origin);
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        crate::timer::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    // `listeners` (and the socket file) live as long as this task.
    for t in tasks {
        let _ = t.await;
    }
    drop(listeners);
}

/// Accepts clients on `l` until aborted by [`watch_tcp`].
async fn accept_tcp(app: Arc<App>, l: Arc<TcpListener>) {
    // Accepted sockets' local end, unless the listener's is a wildcard.
    let here = l
        .get_ref()
        .local_addr()
        .ok()
        .filter(|a| !a.ip().is_unspecified());
    let listener = socket2::SockRef::from(l.get_ref());
    let mut options = Accepting::new(&listener, &TcpTuning::from_settings(&app.config().settings));
    let mut acceptor = Acceptor::new(&l);
    loop {
        match acceptor.accept().await {
            Ok(((s, peer), alone)) => {
                // PgBouncer's TCP options cover client sockets too: a vanished client
                // must not hold its slot and server forever.
                let tuning = TcpTuning::from_settings(&app.config().settings);
                if let Err(e) = options.ready(&listener, socket2::SockRef::from(&s), &tuning, alone)
                {
                    tracing::warn!("cannot set TCP options on a client socket: {e}");
                }
                let origin = Origin {
                    peer: PeerAddr::Tcp(peer),
                    local: here.or_else(|| s.local_addr().ok()),
                    // In a burst, a client's login waits its turn: one that logged in
                    // at once, while others were still being accepted, would leave its
                    // temporaries as holes between lasting allocations (idle memory
                    // measured 0.87 KB per client against 0.66). So on the UNIX socket.
                    read_at_once: alone,
                };
                match Stream::from_std(StdStream::Tcp(s)) {
                    Ok(s) => crate::session::spawn_client(app.clone(), s, origin),
                    Err(e) => tracing::warn!("accept failed: {e}"),
                }
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                crate::timer::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Stops `accepting` when a shutdown begins (the listener closes once both tasks let
/// go of it), and follows reloads' `tcp_defer_accept` on `l`, as PgBouncer does.
async fn watch_tcp(app: Arc<App>, l: Arc<TcpListener>, accepting: JoinHandle<()>) {
    let mut shutdown = app.shutdown_watch();
    let mut reloads = app.reload_watch();
    let mut reloads_open = true;
    let mut deferring = app.config().settings.tcp_defer_accept;
    loop {
        tokio::select! {
            biased;
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() != Shutdown::No {
                    break;
                }
            }
            r = reloads.changed(), if reloads_open => {
                if r.is_err() {
                    reloads_open = false;
                    continue;
                }
                let on = app.config().settings.tcp_defer_accept;
                if on != deferring {
                    match crate::net::listener::set_defer_accept(l.get_ref(), on) {
                        Ok(()) => deferring = on,
                        Err(e) => tracing::warn!("cannot set tcp_defer_accept: {e}"),
                    }
                }
            }
        }
    }
    accepting.abort();
    // The accept loop has dropped its share of the listener once this returns.
    let _ = accepting.await;
}

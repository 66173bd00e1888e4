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
use crate::clock::Tick;
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
            let mut failures = AcceptFailures::new("");
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
                    Err(e) => failures.met(&e).await,
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
    let mut failures = AcceptFailures::new("");
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
                    Err(e) => tracing::warn!("cannot register a client socket: {e}"),
                }
            }
            Err(e) => failures.met(&e).await,
        }
    }
}

/// How often a lasting accept failure is logged.
const LOG_EVERY: Duration = Duration::from_secs(5);
/// How long an accept loop waits after a failure before it tries again.
const RETRY: Duration = Duration::from_millis(50);

/// An accept loop's failures. The usual one is the open-files limit, which lasts
/// until clients leave: the loop tries again every [`RETRY`], so that a descriptor
/// freed is used at once (PgBouncer stops accepting for 5 s), but logs PgBouncer's
/// `accept() failed: <reason>` at most every [`LOG_EVERY`], not twenty times a
/// second. A connection its client gave up before the accept is no failure of
/// Sluice's, and is passed over as PgBouncer passes it over.
pub(crate) struct AcceptFailures {
    /// What accepts, for the log line (`metrics ` for the metrics endpoint).
    what: &'static str,
    logged: Option<Tick>,
}

impl AcceptFailures {
    pub(crate) fn new(what: &'static str) -> AcceptFailures {
        AcceptFailures { what, logged: None }
    }

    /// Logs `e` unless logged lately, and waits before the next try.
    pub(crate) async fn met(&mut self, e: &std::io::Error) {
        use std::io::ErrorKind::{ConnectionAborted, Interrupted};
        if matches!(e.kind(), ConnectionAborted | Interrupted) {
            return;
        }
        let now = Tick::now();
        if self.logged.is_none_or(|t| now.reached(t, LOG_EVERY)) {
            self.logged = Some(now);
            tracing::error!("{}accept() failed: {}", self.what, reason(e));
        }
        crate::timer::sleep(RETRY).await;
    }
}

/// An error's text as C's `strerror` gives it (PgBouncer's log lines), without the
/// ` (os error N)` Rust adds.
fn reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match (e.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(at)) => text[..at].to_owned(),
        _ => text,
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

#[cfg(test)]
mod tests {
    use super::reason;

    #[test]
    fn a_reason_reads_as_strerror() {
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(reason(&e), "Too many open files");
        let e = std::io::Error::other("not an OS error (os error 1)");
        assert_eq!(reason(&e), "not an OS error (os error 1)");
    }
}

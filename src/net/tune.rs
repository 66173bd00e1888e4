//! TCP socket options from the `[pgbouncer]` settings, as PgBouncer sets them on
//! every TCP socket it opens or accepts, client and server alike: keepalive and its
//! timings, `TCP_USER_TIMEOUT` and the kernel buffer sizes. A 0 leaves the operating
//! system's value, so the defaults cost no system call beyond `SO_KEEPALIVE`.

use std::io;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};

use crate::config::Settings;

/// The options for one TCP socket (UNIX sockets take none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpTuning {
    /// `tcp_keepalive`: `SO_KEEPALIVE`.
    pub keepalive: bool,
    /// `tcp_keepidle`, seconds: `TCP_KEEPIDLE`.
    pub keepidle: u32,
    /// `tcp_keepintvl`, seconds: `TCP_KEEPINTVL`.
    pub keepintvl: u32,
    /// `tcp_keepcnt`: `TCP_KEEPCNT`.
    pub keepcnt: u32,
    /// `tcp_user_timeout`, milliseconds: `TCP_USER_TIMEOUT`.
    pub user_timeout: u32,
    /// `tcp_socket_buffer`, bytes: `SO_SNDBUF` and `SO_RCVBUF`.
    pub socket_buffer: u32,
}

impl TcpTuning {
    pub fn from_settings(s: &Settings) -> TcpTuning {
        TcpTuning {
            keepalive: s.tcp_keepalive,
            keepidle: s.tcp_keepidle,
            keepintvl: s.tcp_keepintvl,
            keepcnt: s.tcp_keepcnt,
            user_timeout: s.tcp_user_timeout,
            socket_buffer: s.tcp_socket_buffer,
        }
    }

    /// Sets the options on a new `sock`. As in PgBouncer, the keepalive timings apply
    /// only with `tcp_keepalive` on.
    pub fn apply(&self, sock: SockRef<'_>) -> io::Result<()> {
        // A new socket starts without keepalive.
        self.apply_over(sock, Some(false))
    }

    /// Sets the options on `sock`, whose `SO_KEEPALIVE` is `keepalive` if known
    /// (handed down by its listener); None sets it either way.
    fn apply_over(&self, sock: SockRef<'_>, keepalive: Option<bool>) -> io::Result<()> {
        if !self.keepalive {
            if keepalive != Some(false) {
                sock.set_keepalive(false)?;
            }
        } else {
            let mut ka = TcpKeepalive::new();
            let mut timed = false;
            if self.keepidle > 0 {
                ka = ka.with_time(Duration::from_secs(self.keepidle.into()));
                timed = true;
            }
            if self.keepintvl > 0 {
                ka = ka.with_interval(Duration::from_secs(self.keepintvl.into()));
                timed = true;
            }
            if self.keepcnt > 0 {
                ka = ka.with_retries(self.keepcnt);
                timed = true;
            }
            if timed {
                sock.set_tcp_keepalive(&ka)?;
            } else if keepalive != Some(true) {
                sock.set_keepalive(true)?;
            }
        }
        if self.user_timeout > 0 {
            sock.set_tcp_user_timeout(Some(Duration::from_millis(self.user_timeout.into())))?;
        }
        if self.socket_buffer > 0 {
            let n = self.socket_buffer as usize;
            sock.set_send_buffer_size(n)?;
            sock.set_recv_buffer_size(n)?;
        }
        Ok(())
    }
}

/// What a TCP listener hands down to the sockets it accepts. Linux copies a
/// listening socket's options to each socket it accepts, so `TCP_NODELAY` and
/// `SO_KEEPALIVE`, set once on the listener, cost a new connection no system call
/// (two of the ~17 a `pgbench -C` connection made; docs/performance.md,
/// thirty-ninth round). The keepalive timings, `TCP_USER_TIMEOUT` and the buffer
/// sizes are still set on each socket: a reload that sets one of them back to 0 (the
/// system's value) could not undo it on the listener.
#[derive(Debug, Default)]
pub struct Accepting {
    /// `TCP_NODELAY` is on on the listener.
    nodelay: bool,
    /// The listener's `SO_KEEPALIVE`; None if it is not handed down.
    keepalive: Option<bool>,
    /// The accept queue was seen empty since the listener's options last changed, so
    /// every socket accepted from now on was made with them. Until then a socket may
    /// have waited in the queue from before (connections made while Sluice started,
    /// or a socket activation's backlog; the one the acceptor looked ahead to at a
    /// reload), and gets its options on its own.
    settled: bool,
}

impl Accepting {
    /// Sets `TCP_NODELAY`, and `SO_KEEPALIVE` as `tuning` says, on `listener`.
    pub fn new(listener: &SockRef<'_>, tuning: &TcpTuning) -> Accepting {
        if !cfg!(target_os = "linux") {
            return Accepting::default();
        }
        Accepting {
            nodelay: listener.set_nodelay(true).is_ok(),
            keepalive: listener
                .set_keepalive(tuning.keepalive)
                .is_ok()
                .then_some(tuning.keepalive),
            settled: false,
        }
    }

    /// Sets on `sock`, just accepted from `listener`, what `tuning` asks and the
    /// listener did not hand down; `alone`: the accept queue was empty after it (see
    /// `Acceptor::accept`). A reload's change of `tcp_keepalive` goes to the listener
    /// too, for the sockets it accepts from then on.
    pub fn ready(
        &mut self,
        listener: &SockRef<'_>,
        sock: SockRef<'_>,
        tuning: &TcpTuning,
        alone: bool,
    ) -> io::Result<()> {
        if !(self.nodelay && self.settled) {
            // Ignored, as it always was: the client still works, with Nagle on.
            let _ = sock.set_nodelay(true);
        }
        let inherited = self.keepalive.filter(|_| self.settled);
        let changed = self.keepalive.is_some_and(|k| k != tuning.keepalive);
        if changed {
            self.keepalive = listener
                .set_keepalive(tuning.keepalive)
                .is_ok()
                .then_some(tuning.keepalive);
        }
        // With the queue empty now, the next socket is made after any change above.
        self.settled = (self.settled && !changed) || alone;
        tuning.apply_over(sock, inherited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        accept(&TcpListener::bind("127.0.0.1:0").unwrap())
    }

    #[test]
    fn sets_what_is_asked_and_nothing_else() {
        let (_c, s) = pair();
        let sock = SockRef::from(&s);
        let (idle, intvl, cnt) = (
            sock.keepalive_time().unwrap(),
            sock.keepalive_interval().unwrap(),
            sock.keepalive_retries().unwrap(),
        );
        TcpTuning::default().apply(sock).unwrap();
        let sock = SockRef::from(&s);
        assert!(!sock.keepalive().unwrap());
        assert_eq!(sock.tcp_user_timeout().unwrap(), None);

        // Keepalive on with the system's timings.
        let on = TcpTuning {
            keepalive: true,
            ..TcpTuning::default()
        };
        on.apply(SockRef::from(&s)).unwrap();
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), idle);
        assert_eq!(sock.keepalive_interval().unwrap(), intvl);
        assert_eq!(sock.keepalive_retries().unwrap(), cnt);

        let all = TcpTuning {
            keepalive: true,
            keepidle: 77,
            keepintvl: 11,
            keepcnt: 4,
            user_timeout: 2500,
            socket_buffer: 65536,
        };
        let (_c, s) = pair();
        all.apply(SockRef::from(&s)).unwrap();
        let sock = SockRef::from(&s);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), Duration::from_secs(77));
        assert_eq!(sock.keepalive_interval().unwrap(), Duration::from_secs(11));
        assert_eq!(sock.keepalive_retries().unwrap(), 4);
        assert_eq!(
            sock.tcp_user_timeout().unwrap(),
            Some(Duration::from_millis(2500))
        );
        // Linux doubles the value it is given, for its own bookkeeping.
        assert!(sock.recv_buffer_size().unwrap() >= 65536);
        assert!(sock.send_buffer_size().unwrap() >= 65536);
    }

    /// A listener with its options, and a way to accept from it.
    fn listener(tuning: &TcpTuning) -> (TcpListener, Accepting) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = Accepting::new(&SockRef::from(&l), tuning);
        (l, a)
    }

    fn accept(l: &TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn accepted_sockets_get_nodelay_and_keepalive_from_their_listener() {
        let on = TcpTuning {
            keepalive: true,
            ..TcpTuning::default()
        };
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // Made before the listener had its options, as while Sluice starts.
        let early = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut a = Accepting::new(&SockRef::from(&l), &on);
        let (s0, _) = l.accept().unwrap();
        a.ready(&SockRef::from(&l), SockRef::from(&s0), &on, true)
            .unwrap();
        let (_c, s1) = accept(&l);
        a.ready(&SockRef::from(&l), SockRef::from(&s1), &on, true)
            .unwrap();
        for s in [&s0, &s1] {
            assert!(SockRef::from(s).nodelay().unwrap());
            assert!(SockRef::from(s).keepalive().unwrap());
        }
        if cfg!(target_os = "linux") {
            assert!(a.settled && a.nodelay && a.keepalive == Some(true));
        }
        drop(early);
    }

    #[test]
    fn a_reload_of_tcp_keepalive_reaches_the_listener_and_the_socket_accepted_ahead() {
        let on = TcpTuning {
            keepalive: true,
            ..TcpTuning::default()
        };
        let off = TcpTuning::default();
        let (l, mut a) = listener(&on);
        let (_c0, s0) = accept(&l);
        a.ready(&SockRef::from(&l), SockRef::from(&s0), &on, true)
            .unwrap();
        for tuning in [off, on] {
            // Two sockets accepted before the reload (the second looked ahead to, so
            // the first was not alone), and one after it, inheriting the listener's
            // new state.
            let (_c1, s1) = accept(&l);
            let (_c2, s2) = accept(&l);
            a.ready(&SockRef::from(&l), SockRef::from(&s1), &tuning, false)
                .unwrap();
            a.ready(&SockRef::from(&l), SockRef::from(&s2), &tuning, true)
                .unwrap();
            let (_c3, s3) = accept(&l);
            a.ready(&SockRef::from(&l), SockRef::from(&s3), &tuning, true)
                .unwrap();
            for s in [&s1, &s2, &s3] {
                assert_eq!(SockRef::from(s).keepalive().unwrap(), tuning.keepalive);
                assert!(SockRef::from(s).nodelay().unwrap());
            }
            assert_eq!(SockRef::from(&l).keepalive().unwrap(), tuning.keepalive);
        }
    }

    #[test]
    fn keepalive_timings_need_keepalive() {
        let (_c, s) = pair();
        let sock = SockRef::from(&s);
        let idle = sock.keepalive_time().unwrap();
        TcpTuning {
            keepalive: false,
            keepidle: 5,
            ..TcpTuning::default()
        }
        .apply(SockRef::from(&s))
        .unwrap();
        assert!(!sock.keepalive().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), idle);
    }
}

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

    /// Sets the options on `sock`. As in PgBouncer, the keepalive timings apply only
    /// with `tcp_keepalive` on.
    pub fn apply(&self, sock: SockRef<'_>) -> io::Result<()> {
        if self.keepalive {
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
            } else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
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

//! systemd integration, as PgBouncer's systemd build has it: state notifications for
//! `Type=notify` units (Debian's `pgbouncer.service` is one: without `READY=1`,
//! systemd kills the service when its start times out) and listening sockets
//! passed by socket activation (`LISTEN_FDS`).
//!
//! Both are read from the environment systemd sets; without it nothing happens.
//! The protocol is small (a datagram per state, descriptors from 3 on), so it is
//! spoken directly rather than through libsystemd.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Where state notifications go (`NOTIFY_SOCKET`).
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    to: SocketAddr,
}

impl Notifier {
    /// The notification socket systemd named, if any (a path, or `@name` for an
    /// abstract socket).
    pub fn from_env() -> Option<Notifier> {
        let name = std::env::var_os("NOTIFY_SOCKET")?;
        let name = name.to_str()?;
        let to = match name.strip_prefix('@') {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(abstract_name.as_bytes()).ok()?
            }
            None => SocketAddr::from_pathname(name).ok()?,
        };
        let sock = UnixDatagram::unbound().ok()?;
        // A notification must never hold up the pooler.
        sock.set_nonblocking(true).ok()?;
        Some(Notifier { sock, to })
    }

    /// Sends one state; a failure is logged, never fatal (as `sd_notify`).
    pub fn send(&self, state: &str) {
        if let Err(e) = self.sock.send_to_addr(state.as_bytes(), &self.to) {
            tracing::debug!("systemd notification {state:?} not sent: {e}");
        }
    }

    /// Up and listening.
    pub fn ready(&self) {
        self.send("READY=1");
    }

    /// A reload begins, with the monotonic clock's time, which `Type=notify-reload`
    /// units need.
    pub fn reloading(&self) {
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
    }

    /// A shutdown began.
    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd compares with.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to the valid pointer it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1_000_000 + nanos / 1_000
}

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const FIRST_FD: RawFd = 3;

/// The listening sockets systemd passed to this process, in order: none unless
/// `LISTEN_PID` is this process and `LISTEN_FDS` counts them. Call once, at
/// start-up: the descriptors become the caller's.
pub fn take_listen_fds() -> Vec<OwnedFd> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.trim().parse::<RawFd>().ok())
        .filter(|n| *n > 0 && *n < 1024);
    let (true, Some(count)) = (ours, count) else {
        return Vec::new();
    };
    let mut fds = Vec::new();
    for fd in FIRST_FD..FIRST_FD + count {
        // SAFETY: F_GETFD only reads the descriptor's flags; -1 means it is not open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            tracing::warn!("descriptor {fd} passed by the service manager is not open");
            continue;
        }
        // Not for children (as sd_listen_fds does).
        // SAFETY: sets the close-on-exec flag of an open descriptor.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        // SAFETY: the descriptor is open (checked above) and was inherited from the
        // service manager for this process (LISTEN_PID): nothing in the process
        // created it, and this function, called once at start-up, is the only code
        // that takes descriptors from 3 on. It is owned from here on.
        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    fds
}

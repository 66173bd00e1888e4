//! `syslog = 1`: each log line also goes to the local syslog daemon, as a datagram on
//! its socket (`/dev/log`), in the form glibc's `syslog()` sends without a
//! timestamp: `<PRI>ident[pid]: LEVEL message`. rsyslog and journald stamp it on
//! receipt.
//!
//! The socket is non-blocking: a daemon that falls behind loses lines rather than
//! stalling the event loop, and with it every client (glibc's `syslog()`, which
//! PgBouncer calls, would block). A daemon that restarts is reconnected to at the
//! next line.

use std::io::{self, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use tracing::Level;

/// Where the syslog daemon listens. `SLUICE_SYSLOG_SOCKET` replaces it (tests, or a
/// container whose daemon listens elsewhere).
const DEFAULT_SOCKET: &str = "/dev/log";

/// Longest line sent; longer ones are cut (datagram sockets refuse what does not fit).
const MAX_LINE: usize = 8 * 1024;

/// The facilities `syslog_facility` may name, with their codes (RFC 5424).
const FACILITIES: [(&str, u8); 12] = [
    ("auth", 4),
    ("authpriv", 10),
    ("daemon", 3),
    ("user", 1),
    ("local0", 16),
    ("local1", 17),
    ("local2", 18),
    ("local3", 19),
    ("local4", 20),
    ("local5", 21),
    ("local6", 22),
    ("local7", 23),
];

/// A facility's code by its name (any case), as `syslog_facility` gives it.
pub fn facility(name: &str) -> Result<u8, String> {
    let lower = name.to_ascii_lowercase();
    FACILITIES
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(_, code)| *code)
        .ok_or_else(|| {
            let names: Vec<&str> = FACILITIES.iter().map(|(n, _)| *n).collect();
            format!("expected one of {}", names.join(", "))
        })
}

/// What `syslog`, `syslog_ident` and `syslog_facility` ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyslogConfig {
    pub ident: String,
    pub facility: u8,
}

impl SyslogConfig {
    /// What the settings ask for; None without `syslog`.
    pub fn of(s: &crate::config::Settings) -> Option<SyslogConfig> {
        s.syslog.then(|| SyslogConfig {
            ident: s.syslog_ident.clone(),
            facility: s.syslog_facility,
        })
    }
}

/// The connection to the syslog daemon.
#[derive(Debug)]
pub struct Syslog {
    config: SyslogConfig,
    path: PathBuf,
    pid: u32,
    /// None until connected, and again after a send failed.
    socket: Option<UnixDatagram>,
    /// The line being sent, kept to avoid an allocation per line.
    out: Vec<u8>,
}

impl Syslog {
    pub fn new(config: SyslogConfig) -> Syslog {
        let path = std::env::var_os("SLUICE_SYSLOG_SOCKET")
            .map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from);
        Syslog {
            config,
            path,
            pid: std::process::id(),
            socket: None,
            out: Vec::new(),
        }
    }

    pub fn config(&self) -> &SyslogConfig {
        &self.config
    }

    /// Sends one line: `text` is the message with PgBouncer's level word in front
    /// (`LOG ...`). Failures are dropped: there is nowhere left to report them.
    pub fn send(&mut self, level: Level, text: &str) {
        let pri = u16::from(self.config.facility) * 8 + u16::from(severity(level));
        self.out.clear();
        let _ = write!(self.out, "<{pri}>{}[{}]: ", self.config.ident, self.pid);
        let room = MAX_LINE.saturating_sub(self.out.len());
        let text = text.trim_end_matches('\n');
        self.out
            .extend_from_slice(&text.as_bytes()[..text.len().min(room)]);
        // One retry on a fresh socket: the daemon may have restarted since.
        for _ in 0..2 {
            let Some(sock) = self.socket.take().or_else(|| connect(&self.path).ok()) else {
                return;
            };
            match sock.send(&self.out) {
                Ok(_) => {
                    self.socket = Some(sock);
                    return;
                }
                // Full: this line is lost, the socket kept.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.socket = Some(sock);
                    return;
                }
                Err(_) => {}
            }
        }
    }
}

fn connect(path: &Path) -> io::Result<UnixDatagram> {
    let sock = UnixDatagram::unbound()?;
    sock.connect(path)?;
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// syslog's severity for a log level, as PgBouncer maps its levels.
fn severity(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facilities_by_name() {
        assert_eq!(facility("daemon"), Ok(3));
        assert_eq!(facility("LOCAL3"), Ok(19));
        assert!(facility("kernel").is_err_and(|e| e.contains("local7")));
    }

    #[test]
    fn lines_reach_the_socket_in_syslog_form() {
        let dir = std::env::temp_dir().join(format!("sluice-syslog-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("log.sock");
        let _ = std::fs::remove_file(&path);
        let daemon = UnixDatagram::bind(&path).expect("bind");
        let mut s = Syslog {
            config: SyslogConfig {
                ident: "sluice".into(),
                facility: 19,
            },
            path: path.clone(),
            pid: 42,
            socket: None,
            out: Vec::new(),
        };
        s.send(Level::WARN, "WARNING something odd\n");
        let mut buf = [0u8; 256];
        let n = daemon.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"<156>sluice[42]: WARNING something odd");
        // A daemon that restarts (a new socket at the same path) gets the next line.
        drop(daemon);
        let _ = std::fs::remove_file(&path);
        let daemon = UnixDatagram::bind(&path).expect("bind again");
        s.send(Level::INFO, "LOG again");
        let n = daemon.recv(&mut buf).expect("recv again");
        assert_eq!(&buf[..n], b"<158>sluice[42]: LOG again");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

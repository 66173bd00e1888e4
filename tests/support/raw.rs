//! A tiny raw wire-protocol client for tests that need to send exactly the bytes
//! they want (startup packets, SSLRequest, malformed input) and read replies with a
//! deadline. Blocking std sockets; every read is bounded by a timeout.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Protocol 3.0 as sent in a StartupMessage.
pub const PROTOCOL_3_0: u32 = 3 << 16;
/// Protocol 3.2 (PostgreSQL 18).
pub const PROTOCOL_3_2: u32 = (3 << 16) | 2;
pub const SSL_REQUEST_CODE: u32 = 80877103;
pub const GSSENC_REQUEST_CODE: u32 = 80877104;
pub const CANCEL_REQUEST_CODE: u32 = 80877102;

/// A length-prefixed packet without a tag: `len(4) || code(4) || body`.
pub fn untagged(code: u32, body: &[u8]) -> Vec<u8> {
    let mut p = ((body.len() + 8) as u32).to_be_bytes().to_vec();
    p.extend_from_slice(&code.to_be_bytes());
    p.extend_from_slice(body);
    p
}

/// A StartupMessage with `version` and name/value parameters.
pub fn startup_packet(version: u32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    untagged(version, &body)
}

pub fn ssl_request() -> Vec<u8> {
    untagged(SSL_REQUEST_CODE, &[])
}

pub fn gssenc_request() -> Vec<u8> {
    untagged(GSSENC_REQUEST_CODE, &[])
}

pub fn cancel_request(pid: u32, key: u32) -> Vec<u8> {
    let mut body = pid.to_be_bytes().to_vec();
    body.extend_from_slice(&key.to_be_bytes());
    untagged(CANCEL_REQUEST_CODE, &body)
}

/// A tagged frontend message.
pub fn tagged(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![tag];
    p.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    p.extend_from_slice(body);
    p
}

/// PasswordMessage with a NUL-terminated string.
pub fn password_message(password: &str) -> Vec<u8> {
    let mut body = password.as_bytes().to_vec();
    body.push(0);
    tagged(b'p', &body)
}

/// Simple Query.
pub fn query_message(sql: &str) -> Vec<u8> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    tagged(b'Q', &body)
}

pub fn terminate_message() -> Vec<u8> {
    tagged(b'X', &[])
}

/// One backend message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl Msg {
    /// The request code of an Authentication ('R') message.
    pub fn auth_code(&self) -> Option<u32> {
        (self.tag == b'R' && self.body.len() >= 4)
            .then(|| u32::from_be_bytes([self.body[0], self.body[1], self.body[2], self.body[3]]))
    }

    /// A field (`b'C'` SQLSTATE, `b'M'` message, `b'S'` severity) of an ErrorResponse
    /// or NoticeResponse.
    pub fn field(&self, code: u8) -> Option<String> {
        if self.tag != b'E' && self.tag != b'N' {
            return None;
        }
        let mut rest = &self.body[..];
        while let Some((&c, tail)) = rest.split_first() {
            if c == 0 {
                break;
            }
            let end = tail.iter().position(|&b| b == 0)?;
            if c == code {
                return Some(String::from_utf8_lossy(&tail[..end]).into_owned());
            }
            rest = &tail[end + 1..];
        }
        None
    }

    /// `(SQLSTATE, message)` of an ErrorResponse.
    pub fn error(&self) -> Option<(String, String)> {
        (self.tag == b'E').then(|| {
            (
                self.field(b'C').unwrap_or_default(),
                self.field(b'M').unwrap_or_default(),
            )
        })
    }
}

/// Why a read did not produce what was asked.
#[derive(Debug)]
pub enum RawError {
    /// Nothing (complete) arrived before the deadline.
    Timeout,
    /// The peer closed the connection (EOF or reset).
    Closed,
    Io(std::io::Error),
}

#[derive(Debug)]
enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A raw client connection.
#[derive(Debug)]
pub struct RawConn {
    sock: Sock,
    buf: Vec<u8>,
}

impl RawConn {
    /// Connects to 127.0.0.1:`port`.
    pub fn tcp(port: u16) -> RawConn {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("raw connect to {addr}: {e}"));
        s.set_nodelay(true).expect("set_nodelay");
        RawConn {
            sock: Sock::Tcp(s),
            buf: Vec::new(),
        }
    }

    /// Connects to the unix socket `<dir>/.s.PGSQL.<port>`.
    pub fn unix(dir: &Path, port: u16) -> RawConn {
        let path = dir.join(format!(".s.PGSQL.{port}"));
        let s = UnixStream::connect(&path)
            .unwrap_or_else(|e| panic!("raw connect to {}: {e}", path.display()));
        RawConn {
            sock: Sock::Unix(s),
            buf: Vec::new(),
        }
    }

    /// The client end's port, over TCP.
    pub fn local_port(&self) -> Option<u16> {
        match &self.sock {
            Sock::Tcp(s) => s.local_addr().ok().map(|a| a.port()),
            Sock::Unix(_) => None,
        }
    }

    /// Writes all of `bytes`. Errors are returned (the peer may already have closed).
    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.sock {
            Sock::Tcp(s) => s.write_all(bytes),
            Sock::Unix(s) => s.write_all(bytes),
        }
    }

    /// Half-closes nothing: drops the socket abruptly (a client vanishing).
    pub fn close(self) {
        drop(self);
    }

    /// Reads more bytes into the buffer before `deadline`.
    fn fill(&mut self, deadline: Instant) -> Result<(), RawError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RawError::Timeout);
        }
        let mut tmp = [0u8; 8192];
        let r = match &mut self.sock {
            Sock::Tcp(s) => s
                .set_read_timeout(Some(left))
                .and_then(|_| s.read(&mut tmp)),
            Sock::Unix(s) => s
                .set_read_timeout(Some(left))
                .and_then(|_| s.read(&mut tmp)),
        };
        match r {
            Ok(0) => Err(RawError::Closed),
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(RawError::Timeout)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::BrokenPipe
                        | ErrorKind::ConnectionAborted
                ) =>
            {
                Err(RawError::Closed)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(RawError::Io(e)),
        }
    }

    /// Reads one byte (the answer to SSLRequest / GSSENCRequest).
    pub fn read_byte(&mut self, timeout: Duration) -> Result<u8, RawError> {
        let deadline = Instant::now() + timeout;
        while self.buf.is_empty() {
            self.fill(deadline)?;
        }
        Ok(self.buf.remove(0))
    }

    /// Reads one tagged backend message.
    pub fn read_msg(&mut self, timeout: Duration) -> Result<Msg, RawError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                assert!(
                    (4..=1 << 24).contains(&len),
                    "raw: implausible message length {len} (tag {:?})",
                    self.buf[0] as char
                );
                if self.buf.len() > len {
                    let tag = self.buf[0];
                    let body = self.buf[5..1 + len].to_vec();
                    self.buf.drain(..1 + len);
                    return Ok(Msg { tag, body });
                }
            }
            self.fill(deadline)?;
        }
    }

    /// Reads messages up to and including the first with `tag`, failing on an
    /// ErrorResponse unless `tag` is `b'E'`.
    pub fn read_until(&mut self, tag: u8, timeout: Duration) -> Result<Vec<Msg>, String> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_msg(left) {
                Ok(m) => {
                    let done = m.tag == tag;
                    if m.tag == b'E' && tag != b'E' {
                        return Err(format!("unexpected error {:?} after {seen:?}", m.error()));
                    }
                    seen.push(m);
                    if done {
                        return Ok(seen);
                    }
                }
                Err(e) => {
                    return Err(format!(
                        "{e:?} waiting for {:?} after {seen:?}",
                        tag as char
                    ))
                }
            }
        }
    }

    /// Reads until the peer closes; returns what arrived. `Err` if it is still open
    /// at the deadline (or a read fails otherwise).
    pub fn expect_closed(&mut self, timeout: Duration) -> Result<Vec<Msg>, String> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_msg(left) {
                Ok(m) => seen.push(m),
                Err(RawError::Closed) => return Ok(seen),
                Err(e) => {
                    return Err(format!(
                        "{e:?}: connection not closed within {timeout:?}; got {seen:?}"
                    ))
                }
            }
        }
    }

    /// Sends a trust-style StartupMessage and reads up to ReadyForQuery.
    pub fn login_no_password(&mut self, params: &[(&str, &str)]) -> Result<Vec<Msg>, String> {
        self.send(&startup_packet(PROTOCOL_3_0, params))
            .map_err(|e| e.to_string())?;
        self.read_until(b'Z', Duration::from_secs(20))
    }

    /// Runs a simple query and returns the first column of each DataRow.
    pub fn simple_query(&mut self, sql: &str) -> Result<Vec<Option<String>>, String> {
        self.send(&query_message(sql)).map_err(|e| e.to_string())?;
        let msgs = self.read_until(b'Z', Duration::from_secs(20))?;
        Ok(msgs
            .iter()
            .filter(|m| m.tag == b'D')
            .map(|m| {
                let b = &m.body;
                let n = i32::from_be_bytes([b[2], b[3], b[4], b[5]]);
                (n >= 0).then(|| String::from_utf8_lossy(&b[6..6 + n as usize]).into_owned())
            })
            .collect())
    }
}

//! A raw PostgreSQL wire-protocol client, for tests that must see or send what
//! libpq-style clients hide: ParameterStatus and BackendKeyData messages, malformed
//! bytes, abrupt disconnects, hand-made CancelRequests.
//!
//! Every read is bounded; a read that times out panics with what was expected.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

/// Backend message tags used by the tests.
pub const TAG_AUTH: u8 = b'R';
pub const TAG_PARAM: u8 = b'S';
pub const TAG_KEY: u8 = b'K';
pub const TAG_READY: u8 = b'Z';
pub const TAG_ERROR: u8 = b'E';
pub const TAG_NOTICE: u8 = b'N';
pub const TAG_DATA_ROW: u8 = b'D';

/// One backend message.
#[derive(Debug, Clone)]
pub struct RawMsg {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl RawMsg {
    /// `(name, value)` of a ParameterStatus.
    pub fn param(&self) -> (String, String) {
        assert_eq!(self.tag, TAG_PARAM, "not a ParameterStatus: {self:?}");
        let mut parts = self.body.split(|&b| b == 0);
        let k = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let v = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        (k, v)
    }

    /// One field (`b'C'` code, `b'M'` message, `b'S'` severity) of an
    /// ErrorResponse/NoticeResponse.
    pub fn field(&self, code: u8) -> Option<String> {
        let mut rest = &self.body[..];
        while let Some((&c, tail)) = rest.split_first() {
            if c == 0 {
                break;
            }
            let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
            if c == code {
                return Some(String::from_utf8_lossy(&tail[..end]).into_owned());
            }
            rest = tail.get(end + 1..).unwrap_or_default();
        }
        None
    }

    /// The columns of a DataRow as text (NULL as None).
    pub fn columns(&self) -> Vec<Option<String>> {
        assert_eq!(self.tag, TAG_DATA_ROW, "not a DataRow: {self:?}");
        let b = &self.body;
        let n = u16::from_be_bytes([b[0], b[1]]) as usize;
        let mut pos = 2;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let len = i32::from_be_bytes([b[pos], b[pos + 1], b[pos + 2], b[pos + 3]]);
            pos += 4;
            if len < 0 {
                out.push(None);
            } else {
                let len = len as usize;
                out.push(Some(
                    String::from_utf8_lossy(&b[pos..pos + len]).into_owned(),
                ));
                pos += len;
            }
        }
        out
    }
}

/// A typed message `tag` + length + `body`.
pub fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(tag);
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A simple-protocol Query message.
pub fn query_msg(sql: &str) -> Vec<u8> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    frame(b'Q', &body)
}

/// A protocol 3.0 StartupMessage.
pub fn startup_msg(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = 196_608u32.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// A CancelRequest packet.
pub fn cancel_msg(pid: u32, key: u32) -> Vec<u8> {
    let mut out = 16u32.to_be_bytes().to_vec();
    out.extend_from_slice(&80_877_102u32.to_be_bytes());
    out.extend_from_slice(&pid.to_be_bytes());
    out.extend_from_slice(&key.to_be_bytes());
    out
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A raw client connection (TCP or unix socket).
pub struct RawClient {
    stream: Box<dyn Io>,
    buf: Vec<u8>,
    /// ParameterStatus values seen during login, in order.
    pub params: Vec<(String, String)>,
    /// BackendKeyData seen during login.
    pub pid: u32,
    pub key: u32,
    /// The local port of a TCP connection (0 over a unix socket).
    pub local_port: u16,
}

impl std::fmt::Debug for RawClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawClient")
            .field("pid", &self.pid)
            .field("params", &self.params)
            .finish()
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl RawClient {
    /// Opens a TCP connection to 127.0.0.1:`port` (no startup sent).
    pub async fn connect(port: u16) -> RawClient {
        let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(("127.0.0.1", port)))
            .await
            .expect("TCP connect timed out")
            .unwrap_or_else(|e| panic!("TCP connect to port {port}: {e}"));
        s.set_nodelay(true).ok();
        let local_port = s.local_addr().map_or(0, |a| a.port());
        RawClient {
            local_port,
            ..RawClient::wrap(Box::new(s))
        }
    }

    /// Opens a unix-socket connection to `<dir>/.s.PGSQL.<port>` (no startup sent).
    pub async fn connect_unix(dir: &Path, port: u16) -> RawClient {
        let path = dir.join(format!(".s.PGSQL.{port}"));
        let s = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&path))
            .await
            .expect("unix connect timed out")
            .unwrap_or_else(|e| panic!("unix connect to {}: {e}", path.display()));
        RawClient::wrap(Box::new(s))
    }

    fn wrap(stream: Box<dyn Io>) -> RawClient {
        RawClient {
            stream,
            buf: Vec::new(),
            params: Vec::new(),
            pid: 0,
            key: 0,
            local_port: 0,
        }
    }

    /// Connects over TCP and logs in (cleartext, md5 or trust), reading up to the
    /// first ReadyForQuery. `extra` are further startup parameters. `Err` carries
    /// the server's error message if the login is refused.
    pub async fn login(
        port: u16,
        user: &str,
        password: &str,
        db: &str,
        extra: &[(&str, &str)],
    ) -> Result<RawClient, String> {
        let mut c = RawClient::connect(port).await;
        let mut params = vec![("user", user), ("database", db)];
        params.extend_from_slice(extra);
        c.send(&startup_msg(&params))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let Some(m) = c.recv(CONNECT_TIMEOUT).await else {
                return Err("connection closed during login".into());
            };
            match m.tag {
                TAG_AUTH => {
                    let code = u32::from_be_bytes([m.body[0], m.body[1], m.body[2], m.body[3]]);
                    let reply = match code {
                        0 => continue,
                        3 => password.to_owned(),
                        5 => {
                            let salt = [m.body[4], m.body[5], m.body[6], m.body[7]];
                            postgres_protocol::authentication::md5_hash(
                                user.as_bytes(),
                                password.as_bytes(),
                                salt,
                            )
                        }
                        other => return Err(format!("unsupported auth request {other}")),
                    };
                    let mut body = reply.into_bytes();
                    body.push(0);
                    c.send(&frame(b'p', &body))
                        .await
                        .map_err(|e| e.to_string())?;
                }
                TAG_PARAM => {
                    let kv = m.param();
                    c.params.push(kv);
                }
                TAG_KEY => {
                    let b = &m.body;
                    c.pid = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                    c.key = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                }
                TAG_ERROR => return Err(m.field(b'M').unwrap_or_default()),
                TAG_READY => return Ok(c),
                _ => {}
            }
        }
    }

    /// A login parameter reported by ParameterStatus.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Writes raw bytes.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// Sends a simple Query.
    pub async fn query(&mut self, sql: &str) -> std::io::Result<()> {
        self.send(&query_msg(sql)).await
    }

    /// Next message; `None` when the peer closed (EOF or reset). Panics if
    /// nothing complete arrives within `timeout`.
    pub async fn recv(&mut self, timeout: Duration) -> Option<RawMsg> {
        match tokio::time::timeout(timeout, self.recv_inner()).await {
            Ok(m) => m,
            Err(_) => panic!("no complete message within {timeout:?}"),
        }
    }

    /// Like [`recv`](Self::recv), but `Err(())` on timeout instead of panicking.
    pub async fn try_recv(&mut self, timeout: Duration) -> Result<Option<RawMsg>, ()> {
        tokio::time::timeout(timeout, self.recv_inner())
            .await
            .map_err(|_| ())
    }

    async fn recv_inner(&mut self) -> Option<RawMsg> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                assert!(len >= 4, "bad length {len} from server");
                if self.buf.len() > len {
                    let body = self.buf[5..len + 1].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..len + 1);
                    return Some(RawMsg { tag, body });
                }
            }
            self.buf.reserve(64 * 1024);
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Reads messages up to and including the next ReadyForQuery. Panics if the
    /// connection closes first or it takes longer than `timeout`.
    pub async fn until_ready(&mut self, timeout: Duration) -> Vec<RawMsg> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.recv(left).await {
                Some(m) => {
                    let done = m.tag == TAG_READY;
                    out.push(m);
                    if done {
                        return out;
                    }
                }
                None => panic!("connection closed before ReadyForQuery; got {out:?}"),
            }
        }
    }

    /// Sends a simple Query and returns every message up to ReadyForQuery.
    pub async fn simple(&mut self, sql: &str, timeout: Duration) -> Vec<RawMsg> {
        self.query(sql)
            .await
            .unwrap_or_else(|e| panic!("send {sql:?}: {e}"));
        self.until_ready(timeout).await
    }

    /// Reads until the peer closes; returns what arrived. Panics if it stays open
    /// longer than `timeout`.
    pub async fn until_closed(&mut self, timeout: Duration) -> Vec<RawMsg> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.try_recv(left).await {
                Ok(Some(m)) => out.push(m),
                Ok(None) => return out,
                Err(()) => panic!("connection still open after {timeout:?}; got {out:?}"),
            }
        }
    }
}

/// First column of every DataRow in `msgs`.
pub fn first_column(msgs: &[RawMsg]) -> Vec<Option<String>> {
    msgs.iter()
        .filter(|m| m.tag == TAG_DATA_ROW)
        .map(|m| m.columns().into_iter().next().flatten())
        .collect()
}

/// The first ErrorResponse in `msgs`, if any.
pub fn first_error(msgs: &[RawMsg]) -> Option<&RawMsg> {
    msgs.iter().find(|m| m.tag == TAG_ERROR)
}

/// Sends a CancelRequest over TCP and waits (bounded) for the peer to close.
pub async fn send_cancel_tcp(port: u16, pid: u32, key: u32) {
    let mut c = RawClient::connect(port).await;
    c.send(&cancel_msg(pid, key)).await.expect("send cancel");
    let rest = c.until_closed(Duration::from_secs(10)).await;
    assert!(rest.is_empty(), "reply to a CancelRequest: {rest:?}");
}

/// Sends a CancelRequest over the unix socket and waits (bounded) for the close.
pub async fn send_cancel_unix(dir: &Path, port: u16, pid: u32, key: u32) {
    let mut c = RawClient::connect_unix(dir, port).await;
    c.send(&cancel_msg(pid, key)).await.expect("send cancel");
    let rest = c.until_closed(Duration::from_secs(10)).await;
    assert!(rest.is_empty(), "reply to a CancelRequest: {rest:?}");
}

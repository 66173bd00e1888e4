//! A TLS session carried by a [`Stream`] itself: the relay, the pools and the keeper
//! call the same `try_read_buf`/`try_write`/`poll_read_ready` on a TLS connection as
//! on a plaintext one, and each call moves bytes between rustls and the TCP socket
//! directly. (A tunnel task with a socket pair, as before, cost two more system calls
//! and a task wake-up per message each way.)
//!
//! Reads hand out the plaintext rustls holds first, then read the socket. Writes
//! encrypt what they accept and send it at once; what the socket does not take stays
//! in rustls and goes first at the next write, and a wait for reads on the stream
//! sends it too (waiting for write readiness meanwhile), so a request or answer is
//! never left in rustls while its side waits for the peer.

use std::io::{self, BufRead, IoSlice, Read, Write};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::BytesMut;
use rustls::Connection;
use socket2::SockRef;
use tokio::io::Interest;

use super::stream::{Socket, StdStream, Stream};

/// The TLS session of a connection, established ([`Stream::start_tls`] runs the
/// handshake). Locked only inside one call on the stream, never across an await, so it
/// is never contended: a Mutex rather than a RefCell only because streams are shared
/// between a session's futures and must be Sync.
#[derive(Debug)]
pub struct TlsSession {
    conn: Mutex<Connection>,
}

impl TlsSession {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        // Nothing panics while holding it; were it poisoned, the session is still whole.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends close_notify, as far as the socket takes it without waiting: for a
    /// connection being closed.
    pub(super) fn close(&self, s: &StdStream) {
        let mut conn = self.lock();
        conn.send_close_notify();
        let _ = flush(&mut conn, s);
    }
}

/// The socket as rustls reads it, noting how much room the read had: a read that
/// leaves room emptied the socket.
struct Rd<'a> {
    s: &'a StdStream,
    room: usize,
}

impl Read for Rd<'_> {
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.room = dst.len();
        self.s.read_into(dst)
    }
}

/// The socket as rustls writes it. `MSG_NOSIGNAL`, as for plaintext writes.
struct Wr<'a>(&'a StdStream);

impl Write for Wr<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        SockRef::from(self.0).send_with_flags(data, libc::MSG_NOSIGNAL)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        SockRef::from(self.0).send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sends what rustls holds until it holds nothing (`Ok`) or the socket is full
/// (`WouldBlock`).
fn flush(conn: &mut Connection, s: &StdStream) -> io::Result<()> {
    while conn.wants_write() {
        if conn.write_tls(&mut Wr(s))? == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// What the plaintext rustls holds says about reading: `Some(true)` bytes are there,
/// `Some(false)` the stream ended (close_notify, or the TCP connection closed), `None`
/// nothing yet.
fn held(conn: &mut Connection) -> io::Result<Option<bool>> {
    match conn.reader().fill_buf() {
        Ok(chunk) => Ok(Some(!chunk.is_empty())),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        // A peer that closed without close_notify (most clients): the end of the stream.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Some(false)),
        Err(e) => Err(e),
    }
}

impl Stream {
    /// Runs the TLS handshake of `conn` over this TCP stream (a server's side or a
    /// client's), after which the stream carries the session: every read and write
    /// goes through it. On an error the stream is unusable and should be dropped.
    pub async fn start_tls(&mut self, conn: impl Into<Connection>) -> io::Result<()> {
        self.start_tls_after(conn, &[]).await
    }

    /// [`Stream::start_tls`] for a handshake whose first bytes, `read`, were already
    /// read off the socket (a direct TLS connection, PostgreSQL 17's
    /// `sslnegotiation=direct`, whose ClientHello comes in place of a startup packet).
    pub async fn start_tls_after(
        &mut self,
        conn: impl Into<Connection>,
        mut read: &[u8],
    ) -> io::Result<()> {
        let mut conn = conn.into();
        while !read.is_empty() {
            if conn.read_tls(&mut read)? == 0 {
                break;
            }
            conn.process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
        let sock = self.io.get_mut();
        if !matches!(sock.raw, StdStream::Tcp(_)) || sock.tls.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "TLS is only for plaintext TCP connections",
            ));
        }
        sock.tls = Some(Box::new(TlsSession {
            conn: Mutex::new(conn),
        }));
        std::future::poll_fn(|cx| self.poll_handshake(cx)).await
    }

    fn poll_handshake(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let sock = self.io.get_ref();
        let Some(t) = sock.tls.as_deref() else {
            return Poll::Ready(Err(io::ErrorKind::InvalidInput.into()));
        };
        loop {
            let mut conn = t.lock();
            match flush(&mut conn, &sock.raw) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drop(conn);
                    std::task::ready!(self.poll_write_ready(cx))?;
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
            if !conn.is_handshaking() {
                return Poll::Ready(Ok(()));
            }
            match self.read_tls(&mut conn, false) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drop(conn);
                    // The guard's drop keeps the readiness for the read that follows.
                    let _ = std::task::ready!(self.io.poll_read_ready(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// One read of the socket into rustls, and the records it completed processed.
    /// `Ok(0)` is the end of the TCP stream. A read that leaves room drained the
    /// socket, and clears its readiness, as plaintext reads do. With `now`, the
    /// socket is read whatever the event loop knows of it (see
    /// [`Stream::try_read_buf_now`]).
    fn read_tls(&self, conn: &mut Connection, now: bool) -> io::Result<usize> {
        let mut drained = 0;
        let mut read = |sock: &Socket| {
            let mut rd = Rd {
                s: &sock.raw,
                room: 0,
            };
            let n = conn.read_tls(&mut rd)?;
            if n > 0 && n < rd.room {
                drained = n;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        };
        let r = if now {
            read(self.io.get_ref())
        } else {
            self.io.try_io(Interest::READABLE, read)
        };
        let n = match r {
            Err(_) if drained > 0 => drained,
            r => r?,
        };
        if let Err(e) = conn.process_new_packets() {
            // The alert rustls queued tells the peer why, if the socket takes it.
            let _ = flush(conn, &self.io.get_ref().raw);
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        // A reply rustls owes (a key update, close_notify): sent as the socket allows;
        // the rest goes with the next write or wait.
        match flush(conn, &self.io.get_ref().raw) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(n),
        }
    }

    /// Reads plaintext, giving each chunk rustls holds to `take` (which returns how
    /// much it took, 0 when it has no room). `Ok(0)` is the end of the stream;
    /// `WouldBlock` when there is nothing yet. `now`: the first socket read does
    /// not wait for the event loop's readiness.
    pub(super) fn tls_read(
        &self,
        t: &TlsSession,
        mut now: bool,
        mut take: impl FnMut(&[u8]) -> usize,
    ) -> io::Result<usize> {
        let mut conn = t.lock();
        loop {
            match held(&mut conn)? {
                Some(false) => return Ok(0),
                Some(true) => {
                    let mut total = 0;
                    loop {
                        let mut reader = conn.reader();
                        let chunk = match reader.fill_buf() {
                            Ok(c) if !c.is_empty() => c,
                            _ => break,
                        };
                        let n = take(chunk);
                        reader.consume(n);
                        total += n;
                        if n == 0 {
                            break;
                        }
                    }
                    return Ok(total);
                }
                None => {}
            }
            if self.read_tls(&mut conn, std::mem::take(&mut now))? == 0 {
                // rustls now reports the end (or the truncation) itself.
                if held(&mut conn)?.is_none() {
                    return Ok(0);
                }
            }
        }
    }

    /// [`Stream::try_read_buf`] (and with `now`, [`Stream::try_read_buf_now`])
    /// through the session.
    pub(super) fn tls_read_buf(
        &self,
        t: &TlsSession,
        buf: &mut BytesMut,
        now: bool,
    ) -> io::Result<usize> {
        if buf.len() == buf.capacity() {
            buf.reserve(64);
        }
        self.tls_read(t, now, |chunk| {
            let n = chunk.len().min(buf.capacity() - buf.len());
            buf.extend_from_slice(&chunk[..n]);
            n
        })
    }

    /// [`Stream::try_write`] through the session: sends what rustls still holds first
    /// (`WouldBlock` if the socket does not take it all), then encrypts as much of
    /// `data` as rustls takes and sends it as the socket allows.
    pub(super) fn tls_write(&self, t: &TlsSession, data: &[u8]) -> io::Result<usize> {
        let raw = &self.io.get_ref().raw;
        let mut conn = t.lock();
        flush(&mut conn, raw)?;
        let n = conn.writer().write(data)?;
        match flush(&mut conn, raw) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(n),
        }
    }

    /// [`Stream::poll_read_ready`] through the session: ready at once if rustls holds
    /// plaintext (or the end); first sends what rustls still holds, and while the
    /// socket does not take it, waits for write readiness too.
    pub(super) fn tls_poll_read_ready(
        &self,
        t: &TlsSession,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let raw = &self.io.get_ref().raw;
        loop {
            let mut conn = t.lock();
            let sent = flush(&mut conn, raw);
            let held = held(&mut conn);
            drop(conn);
            match held {
                Ok(Some(_)) | Err(_) => return Poll::Ready(Ok(())),
                Ok(None) => {}
            }
            match sent {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match self.poll_write_ready(cx) {
                        // Writable again: send more.
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => break,
                    }
                }
                // The read that follows reports the broken connection.
                Err(_) => return Poll::Ready(Ok(())),
            }
        }
        self.io.poll_read_ready(cx).map_ok(|_| ())
    }

    /// Waits until rustls holds nothing more to send (a write is complete only then).
    pub(super) async fn tls_flush(&self, t: &TlsSession) -> io::Result<()> {
        loop {
            let r = flush(&mut t.lock(), &self.io.get_ref().raw);
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                r => return r,
            }
        }
    }

    /// Whether the session holds nothing: no plaintext unread, nothing unsent. Only
    /// then may its client sleep with the keeper, which watches the socket alone.
    pub(super) fn tls_is_quiet(t: &TlsSession) -> bool {
        let mut conn = t.lock();
        !conn.wants_write() && matches!(held(&mut conn), Ok(None))
    }

    /// Calls `f` with the session's connection state, for what the handshake settled
    /// (the protocol, the cipher suite, the peer's certificate). None for plaintext.
    pub fn with_tls<R>(&self, f: impl FnOnce(&Connection) -> R) -> Option<R> {
        self.io.get_ref().tls.as_deref().map(|t| f(&t.lock()))
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // The descriptor is still open here: fields drop after this.
        if let Some(t) = self.tls.as_deref() {
            t.close(&self.raw);
        }
    }
}

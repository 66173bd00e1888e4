//! A connected socket, TCP or UNIX, used through readiness + non-blocking calls.
//!
//! The relay works on `&Stream` with `readable()`/`try_read_buf()` and
//! `writable()`/`try_write()`, so one task can wait on both of its sockets at once
//! without splitting them, and owns buffers only while bytes are in flight.

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use bytes::BytesMut;
use socket2::SockRef;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::tls::TlsSession;

/// Where a connection came from or goes to, for logs and the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAddr {
    Tcp(SocketAddr),
    Unix,
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerAddr::Tcp(a) => write!(f, "{}:{}", a.ip(), a.port()),
            PeerAddr::Unix => f.write_str("unix"),
        }
    }
}

/// Both ends of an accepted client connection, as accept learnt them: no system call
/// asks for them again (`getpeername`, and `getsockname` unless the listener is bound
/// to a wildcard address).
#[derive(Debug, Clone)]
pub struct Origin {
    pub peer: PeerAddr,
    /// The local end of a TCP connection; None for a UNIX socket.
    pub local: Option<SocketAddr>,
    /// Whether the client's first read is tried before waiting
    /// ([`Stream::read_first`]).
    pub read_at_once: bool,
}

/// A plain TCP or UNIX-domain socket, registered with the event loop for read
/// readiness only.
///
/// tokio's own socket types register for writes too, and with edge-triggered epoll a
/// socket then reports writable again each time its peer takes in what was sent
/// (`sk_write_space`): after every query passed to a server and every answer passed
/// to a client, an event that wakes the loop for nothing (measured: 1.2-1.4 more
/// `epoll_wait` returns and ~1 more context switch per `-C` connection than
/// PgBouncer, ~0.15 more per pooled transaction). Writes are tried directly instead;
/// only one that would block registers for write readiness, through a duplicate of
/// the descriptor (epoll keys its entries by descriptor), dropped once writable.
#[derive(Debug)]
pub struct Stream {
    pub(super) io: AsyncFd<Socket>,
    /// The write registration while a write waits (see above); rarely used.
    writer: Mutex<Option<AsyncFd<OwnedFd>>>,
}

impl Stream {
    /// Waits until the socket is readable (or closed, or in error).
    pub async fn readable(&self) -> io::Result<()> {
        if self.io.get_ref().tls.is_some() {
            return std::future::poll_fn(|cx| self.poll_read_ready(cx)).await;
        }
        // Dropping the guard keeps the readiness for the read that follows.
        self.io.readable().await.map(|_| ())
    }

    /// Waits until the socket is writable.
    pub async fn writable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_write_ready(cx)).await
    }

    /// Polls read readiness. Unlike [`Stream::readable`] it creates no future and no
    /// waiter entry (the socket keeps one waker slot per direction), which the relay's
    /// per-message loop uses; only one task may poll a given socket this way.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(t) = self.io.get_ref().tls.as_deref() {
            return self.tls_poll_read_ready(t, cx);
        }
        self.io.poll_read_ready(cx).map_ok(|_| ())
    }

    /// Polls write readiness; see [`Stream::poll_read_ready`]. Call it after a write
    /// returned `WouldBlock`: the first call registers a duplicate descriptor for
    /// write readiness, which is dropped again once the socket is writable.
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let fd = match &mut *w {
            Some(fd) => fd,
            slot => {
                let dup = match SockRef::from(&self.io.get_ref().raw).try_clone() {
                    Ok(d) => OwnedFd::from(d),
                    Err(e) => return Poll::Ready(Err(e)),
                };
                match register(dup, Interest::WRITABLE) {
                    Ok(fd) => slot.insert(fd),
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        };
        match fd.poll_write_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                let r = r.map(|_| ());
                *w = None;
                Poll::Ready(r)
            }
        }
    }

    /// Non-blocking read appending to `buf`; `Ok(0)` is end of stream.
    ///
    /// A read that leaves spare room drained the socket, so its readiness is cleared
    /// at once: otherwise the next wait would return immediately and cost a read
    /// that fails with `WouldBlock` (one wasted system call per message batch).
    /// tokio only clears readiness if no new event arrived since it was observed, so
    /// no wake-up is lost.
    pub fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        if let Some(t) = self.io.get_ref().tls.as_deref() {
            return self.tls_read_buf(t, buf, false);
        }
        if buf.len() == buf.capacity() {
            // As tokio's own read does: a full buffer still takes a read.
            buf.reserve(64);
        }
        let spare = buf.capacity() - buf.len();
        self.read_clearing(spare, |s| recv_into(s, buf))
    }

    /// The same read, tried without waiting for the event loop to report the socket
    /// readable: for a socket just registered that is known to have bytes (a client
    /// the keeper woke), whose readiness the loop would learn only a turn later. As
    /// with [`Stream::read_first`], a read that drains the socket leaves no readiness
    /// behind, as epoll checks a socket again before it reports it.
    pub fn try_read_buf_now(&self, buf: &mut BytesMut) -> io::Result<usize> {
        if let Some(t) = self.io.get_ref().tls.as_deref() {
            return self.tls_read_buf(t, buf, true);
        }
        if buf.len() == buf.capacity() {
            buf.reserve(64);
        }
        recv_into(&self.io.get_ref().raw, buf)
    }

    /// Non-blocking read into `dst`, clearing readiness as [`Stream::try_read_buf`].
    pub fn try_read(&self, dst: &mut [u8]) -> io::Result<usize> {
        if let Some(t) = self.io.get_ref().tls.as_deref() {
            let mut at = 0;
            return self.tls_read(t, false, |chunk| {
                let n = chunk.len().min(dst.len() - at);
                dst[at..at + n].copy_from_slice(&chunk[..n]);
                at += n;
                n
            });
        }
        let spare = dst.len();
        self.read_clearing(spare, |s| s.read_into(dst))
    }

    /// Runs `read` (of at most `spare` bytes), clearing readiness when it drained
    /// the socket.
    fn read_clearing(
        &self,
        spare: usize,
        mut read: impl FnMut(&StdStream) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let mut drained = None;
        let r = self.io.try_io(Interest::READABLE, |s| {
            let n = read(&s.raw)?;
            if n < spare {
                drained = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match (r, drained) {
            (_, Some(n)) => Ok(n),
            (r, None) => r,
        }
    }

    /// The descriptor of a plaintext socket (none with TLS), for pool/delegate.rs.
    pub fn plain_fd(&self) -> Option<std::os::fd::RawFd> {
        let s = self.io.get_ref();
        s.tls.is_none().then(|| s.as_raw_fd())
    }

    /// Non-blocking write. `MSG_NOSIGNAL`: a peer that closed is an error for this
    /// client alone, never a SIGPIPE for the process, whatever the signal's disposition.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        if let Some(t) = self.io.get_ref().tls.as_deref() {
            return self.tls_write(t, buf);
        }
        SockRef::from(&self.io.get_ref().raw).send_with_flags(buf, libc::MSG_NOSIGNAL)
    }

    /// Whether the peer has closed, failed, or sent bytes while nobody was reading:
    /// checked on idle server connections before reuse. Never blocks. A connection for
    /// which this returns true is discarded, so consuming a stray byte is harmless.
    pub fn is_dead_or_chatty(&self) -> bool {
        if let Some(t) = self.io.get_ref().tls.as_deref() {
            if !Stream::tls_is_quiet(t) {
                return true;
            }
        }
        let mut probe = [0u8; 1];
        let r = self
            .io
            .try_io(Interest::READABLE, |s| s.raw.read_into(&mut probe));
        !matches!(r, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Whether bytes wait unread, on the socket or in TLS's buffer (taking none).
    pub fn has_unread(&self) -> bool {
        if let Some(t) = self.io.get_ref().tls.as_deref() {
            if !Stream::tls_is_quiet(t) {
                return true;
            }
        }
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        matches!(SockRef::from(&self.io.get_ref().raw).peek(&mut probe), Ok(n) if n > 0)
    }

    /// Reads at least one byte more into `buf`, waiting as needed. `Ok(0)` is EOF.
    pub async fn read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            self.readable().await?;
            match self.try_read_buf(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads at least one byte into `dst`, waiting as needed. `Ok(0)` is EOF.
    /// Waits through [`Stream::poll_read_ready`], so the same rule holds: one task
    /// reads a socket this way (the client's own, at its login). That keeps the
    /// future a few words long, not tokio's ~200-byte readiness future, in every
    /// login's boxed state.
    pub async fn read(&self, dst: &mut [u8]) -> io::Result<usize> {
        std::future::poll_fn(|cx| loop {
            if let Err(e) = std::task::ready!(self.poll_read_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            match self.try_read(dst) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        })
        .await
    }

    /// The first read of a fresh connection, tried before waiting. A client sends its
    /// first packet right after connecting, so it is usually there by the time the
    /// connection is accepted; but a fresh registration knows no readiness yet, and
    /// waiting for it first costs a turn of the event loop (an `epoll_wait`) per
    /// connection. A drained socket leaves no readiness behind (epoll checks a socket
    /// again before it reports it), unless the loop learnt it before this read: then
    /// the next wait wakes once for nothing, which the session's idle wait allows for.
    pub async fn read_first(&self, dst: &mut [u8]) -> io::Result<usize> {
        if self.io.get_ref().tls.is_some() {
            return self.read(dst).await;
        }
        match self.io.get_ref().raw.read_into(dst) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                self.read(dst).await
            }
            r => r,
        }
    }

    /// Writes all of `data`, waiting as needed.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            match self.try_write(data) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
        match self.io.get_ref().tls.as_deref() {
            Some(t) => self.tls_flush(t).await,
            None => Ok(()),
        }
    }

    /// Whether nothing is held for this connection outside its socket (always true
    /// without TLS; see `Stream::tls_is_quiet`): only then may its client sleep
    /// with the keeper.
    pub fn is_quiet(&self) -> bool {
        self.io
            .get_ref()
            .tls
            .as_deref()
            .is_none_or(Stream::tls_is_quiet)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> PeerAddr {
        match &self.io.get_ref().raw {
            StdStream::Tcp(s) => s.peer_addr().map(PeerAddr::Tcp).unwrap_or(PeerAddr::Unix),
            StdStream::Unix(_) => PeerAddr::Unix,
        }
    }

    /// The local end of a TCP socket (None for UNIX sockets), for the console.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.io.get_ref().raw {
            StdStream::Tcp(s) => s.local_addr().ok(),
            StdStream::Unix(_) => None,
        }
    }

    /// The OS uid of a UNIX-socket peer (for the admin console's same-user rule).
    pub fn peer_uid(&self) -> Option<u32> {
        match &self.io.get_ref().raw {
            StdStream::Unix(s) => peer_uid(s),
            StdStream::Tcp(_) => None,
        }
    }

    /// The socket without its registration, for a client that sleeps in the keeper's
    /// epoll set (it stays non-blocking), with its TLS session if it has one.
    pub fn into_std(self) -> Socket {
        self.io.into_inner()
    }

    /// Registers a non-blocking socket (accepted, connected, or put away by
    /// [`Stream::into_std`]) with the current event loop, for reads; must run inside
    /// the runtime.
    pub fn from_std(s: impl Into<Socket>) -> io::Result<Stream> {
        Ok(Stream {
            io: register(s.into(), Interest::READABLE)?,
            writer: Mutex::new(None),
        })
    }
}

/// Registers a socket that owns its descriptor with the current event loop.
pub(crate) fn register<T: Owns>(inner: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `Owns` types own their descriptor: it stays open and the same, and
    // `as_raw_fd` returns it, until the AsyncFd is dropped or gives the value back.
    unsafe { AsyncFd::register_with_interest(inner, interest) }.map_err(Into::into)
}

/// Types that own the descriptor `as_raw_fd` returns (what [`register`] requires).
pub(crate) trait Owns: AsRawFd {}
impl Owns for StdStream {}
impl Owns for Socket {}
impl Owns for OwnedFd {}
impl Owns for mio::net::TcpListener {}
impl Owns for mio::net::UnixListener {}

/// SO_PEERCRED's uid of a UNIX socket's peer.
fn peer_uid(s: &std::os::unix::net::UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid, writable `ucred` and `len` holds its size, as
    // getsockopt(SO_PEERCRED) requires; the descriptor is borrowed from a live socket.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && len as usize == std::mem::size_of::<libc::ucred>()).then_some(cred.uid)
}

/// A connection's socket and the TLS session it carries, if any: what a [`Stream`]
/// registers, and what a sleeping client keeps. Dropping it sends a TLS session's
/// close_notify first.
#[derive(Debug)]
pub struct Socket {
    pub(super) raw: StdStream,
    pub(super) tls: Option<Box<TlsSession>>,
}

impl From<StdStream> for Socket {
    fn from(raw: StdStream) -> Socket {
        Socket { raw, tls: None }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.raw.as_raw_fd()
    }
}

/// A client socket while no tokio task owns it (non-blocking).
#[derive(Debug)]
pub enum StdStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl StdStream {
    /// A read into `dst` (`recv`), on either kind of socket.
    pub(super) fn read_into(&self, dst: &mut [u8]) -> io::Result<usize> {
        match self {
            StdStream::Tcp(s) => (&*s).read(dst),
            StdStream::Unix(s) => (&*s).read(dst),
        }
    }
}

impl AsRawFd for StdStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            StdStream::Tcp(s) => s.as_raw_fd(),
            StdStream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl AsFd for StdStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            StdStream::Tcp(s) => s.as_fd(),
            StdStream::Unix(s) => s.as_fd(),
        }
    }
}

/// One `recv` into `buf`'s spare room.
fn recv_into(s: &impl AsFd, buf: &mut BytesMut) -> io::Result<usize> {
    let n = SockRef::from(s).recv(buf.spare_capacity_mut())?;
    // SAFETY: recv wrote the first `n` bytes of the spare capacity, so they are
    // initialised, and `n` is at most the spare length.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

//! A connected socket, TCP or UNIX, used through readiness + non-blocking calls.
//!
//! The relay works on `&Stream` with `readable()`/`try_read_buf()` and
//! `writable()`/`try_write()`, so one task can wait on both of its sockets at once
//! without splitting them, and owns buffers only while bytes are in flight.

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

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

/// A plain TCP or UNIX-domain socket.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Waits until the socket is readable (or closed, or in error).
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            Stream::Unix(s) => s.readable().await,
        }
    }

    /// Waits until the socket is writable.
    pub async fn writable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.writable().await,
            Stream::Unix(s) => s.writable().await,
        }
    }

    /// Polls read readiness. Unlike [`Stream::readable`] it creates no future and no
    /// waiter entry (the socket keeps one waker slot per direction), which the relay's
    /// per-message loop uses; only one task may poll a given socket this way.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
        }
    }

    /// Polls write readiness; see [`Stream::poll_read_ready`].
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_write_ready(cx),
            Stream::Unix(s) => s.poll_write_ready(cx),
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
        let spare = buf.capacity() - buf.len();
        self.read_clearing(spare, || match self {
            Stream::Tcp(s) => s.try_read_buf(buf),
            Stream::Unix(s) => s.try_read_buf(buf),
        })
    }

    /// Non-blocking read into `dst`, clearing readiness as [`Stream::try_read_buf`].
    pub fn try_read(&self, dst: &mut [u8]) -> io::Result<usize> {
        let spare = dst.len();
        self.read_clearing(spare, || match self {
            Stream::Tcp(s) => s.try_read(dst),
            Stream::Unix(s) => s.try_read(dst),
        })
    }

    /// Runs `read` (of at most `spare` bytes), clearing readiness when it drained
    /// the socket.
    fn read_clearing(
        &self,
        spare: usize,
        mut read: impl FnMut() -> io::Result<usize>,
    ) -> io::Result<usize> {
        let mut drained = None;
        let mut read = || {
            let n = read()?;
            if n < spare {
                drained = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        };
        let r = match self {
            Stream::Tcp(s) => s.try_io(Interest::READABLE, &mut read),
            Stream::Unix(s) => s.try_io(Interest::READABLE, &mut read),
        };
        match (r, drained) {
            (_, Some(n)) => Ok(n),
            (r, None) => r,
        }
    }

    /// Non-blocking write.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
        }
    }

    /// Whether the peer has closed, failed, or sent bytes while nobody was reading:
    /// checked on idle server connections before reuse. Never blocks. A connection for
    /// which this returns true is discarded, so consuming a stray byte is harmless.
    pub fn is_dead_or_chatty(&self) -> bool {
        let mut probe = [0u8; 1];
        let r = match self {
            Stream::Tcp(s) => s.try_read(&mut probe),
            Stream::Unix(s) => s.try_read(&mut probe),
        };
        !matches!(r, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
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
    pub async fn read(&self, dst: &mut [u8]) -> io::Result<usize> {
        loop {
            self.readable().await?;
            match self.try_read(dst) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
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
        Ok(())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> PeerAddr {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(PeerAddr::Tcp).unwrap_or(PeerAddr::Unix),
            Stream::Unix(_) => PeerAddr::Unix,
        }
    }

    /// The local end of a TCP socket (None for UNIX sockets), for the console.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok(),
            Stream::Unix(_) => None,
        }
    }

    /// The OS uid of a UNIX-socket peer (for the admin console's same-user rule).
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Stream::Unix(s) => s.peer_cred().ok().map(|c| c.uid()),
            Stream::Tcp(_) => None,
        }
    }

    /// The socket without its tokio registration, for a client that sleeps in the
    /// keeper's epoll set (it stays non-blocking).
    pub fn into_std(self) -> io::Result<StdStream> {
        match self {
            Stream::Tcp(s) => s.into_std().map(StdStream::Tcp),
            Stream::Unix(s) => s.into_std().map(StdStream::Unix),
        }
    }

    /// Registers a socket put away by [`Stream::into_std`] again; must run inside the
    /// runtime.
    pub fn from_std(s: StdStream) -> io::Result<Stream> {
        match s {
            StdStream::Tcp(s) => TcpStream::from_std(s).map(Stream::Tcp),
            StdStream::Unix(s) => UnixStream::from_std(s).map(Stream::Unix),
        }
    }
}

/// A client socket while no tokio task owns it (non-blocking).
#[derive(Debug)]
pub enum StdStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl std::os::fd::AsRawFd for StdStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            StdStream::Tcp(s) => s.as_raw_fd(),
            StdStream::Unix(s) => s.as_raw_fd(),
        }
    }
}

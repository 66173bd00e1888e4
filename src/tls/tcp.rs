//! The sockets a TLS tunnel reads, read so that a drained socket costs no extra
//! system call: a read that leaves room in its buffer emptied the socket, so its
//! readiness is cleared at once, as [`crate::net::Stream`] does for every other
//! socket; tokio's own reads learn it only from a second read that fails with
//! `WouldBlock` (one per message each way through a tunnel).

use std::io::{self, IoSlice, Read};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// The TCP socket under a TLS session.
#[derive(Debug)]
pub struct Tcp(pub TcpStream);

impl AsyncRead for Tcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let tcp = &self.0;
        loop {
            ready!(tcp.poll_read_ready(cx))?;
            let dst = buf.initialize_unfilled();
            let room = dst.len();
            let mut drained = 0;
            let r = tcp.try_io(Interest::READABLE, || {
                let n = (&*SockRef::from(tcp)).read(dst)?;
                if n > 0 && n < room {
                    drained = n;
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            let n = match r {
                Ok(n) => n,
                Err(_) if drained > 0 => drained,
                // Nothing there after all: wait again (readiness is cleared).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            };
            buf.advance(n);
            return Poll::Ready(Ok(()));
        }
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// One read from the tunnel's end of the socket pair into `buf`'s spare room: the
/// bytes read, and whether that drained the socket (its readiness then cleared).
/// `Err(WouldBlock)` when there was nothing.
pub fn read_pair(s: &UnixStream, buf: &mut BytesMut) -> io::Result<(usize, bool)> {
    if buf.len() == buf.capacity() {
        buf.reserve(64);
    }
    let room = buf.capacity() - buf.len();
    let mut drained = 0;
    let r = s.try_io(Interest::READABLE, || {
        let n = crate::net::stream::recv_into(s, buf)?;
        if n > 0 && n < room {
            drained = n;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match r {
        Ok(n) => Ok((n, false)),
        Err(_) if drained > 0 => Ok((drained, true)),
        Err(e) => Err(e),
    }
}

//! A TLS connection, a client's or a server's: the handshake, then a task that passes
//! bytes between the TLS session and one end of a socket pair, whose other end
//! becomes the connection's [`Stream`]. The session, the relay, the pools and the
//! idle-client keeper see a plain socket as for any other connection, so none of
//! them changes and plaintext connections pay nothing for TLS; a TLS one pays a hop
//! through the pair each way.

use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::{Arc, Mutex};

use rustls::ServerConfig;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

use super::tcp::{read_pair, Tcp};
use super::{TlsInfo, TlsPeer};
use crate::net::{bufpool, StdStream, Stream};

/// Takes `stream` (a TCP client that was just told `S`) through the TLS handshake and
/// puts the plaintext end of a new socket pair in its place. On an error `stream` is
/// left as a closed pair end, and the TCP connection is closed.
pub async fn accept(config: Arc<ServerConfig>, stream: &mut Stream) -> io::Result<TlsPeer> {
    let (tcp, outer) = swap_in_pair(stream)?;
    let tls = TlsAcceptor::from(config)
        .accept(tcp)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake failed: {e}")))?;
    let peer = TlsPeer::of(tls.get_ref().1);
    start(tls.into(), outer)?;
    Ok(peer)
}

/// The same for a server connection that answered `S` to an SSLRequest: Sluice is
/// the TLS client, checking the server as `config` says, under the name `name`.
pub async fn connect(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    stream: &mut Stream,
) -> io::Result<TlsInfo> {
    let (tcp, outer) = swap_in_pair(stream)?;
    let tls = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake failed: {e}")))?;
    let info = TlsInfo::of(tls.get_ref().1);
    start(tls.into(), outer)?;
    Ok(info)
}

/// Puts one end of a new socket pair in `stream`'s place; returns the TCP socket it
/// held and the pair's other end.
fn swap_in_pair(stream: &mut Stream) -> io::Result<(Tcp, StdUnixStream)> {
    let (inner, outer) = StdUnixStream::pair()?;
    inner.set_nonblocking(true)?;
    outer.set_nonblocking(true)?;
    let inner = Stream::from_std(StdStream::Unix(inner))?;
    match std::mem::replace(stream, inner).into_std() {
        StdStream::Tcp(s) => Ok((Tcp(TcpStream::from_std(s)?), outer)),
        StdStream::Unix(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TLS is only for TCP connections",
        )),
    }
}

/// Spawns the task that carries bytes between `tls` and `outer`.
fn start(tls: TlsStream<Tcp>, outer: StdUnixStream) -> io::Result<()> {
    let outer = tokio::net::UnixStream::from_std(outer)?;
    tokio::spawn(Box::pin(carry(tls, outer)));
    Ok(())
}

/// The TLS session, shared by the tunnel's two directions. Both run in one task and
/// lock it only inside a single poll, never across an await, so the lock is never
/// contended (a Mutex rather than a RefCell only because the task must be Send).
type Shared = Mutex<TlsStream<Tcp>>;

fn lock(tls: &Shared) -> std::sync::MutexGuard<'_, TlsStream<Tcp>> {
    // Nothing panics while holding it; were it poisoned, the stream is still whole.
    tls.lock().unwrap_or_else(|e| e.into_inner())
}

/// Passes bytes both ways until either side ends. The session closing its end sends
/// the client close_notify; the client leaving closes the session's end for writing,
/// so the session sees its end of file. Either way both sockets close, so a client
/// that ignores the close_notify does not keep its TCP connection open.
///
/// The two directions move independently (one blocked on a full socket must not
/// stop the other, or a client that writes much while the session writes back much
/// would deadlock both). Each waits for its socket to be readable and only then takes
/// a buffer from the per-thread pool, giving it back once the socket has nothing
/// more: an idle TLS client holds no buffer.
async fn carry(tls: TlsStream<Tcp>, plain: tokio::net::UnixStream) {
    let tls = Mutex::new(tls);
    let (mut plain_r, mut plain_w) = plain.into_split();
    tokio::select! {
        _ = to_session(&tls, &mut plain_w) => {}
        _ = to_client(&mut plain_r, &tls) => {}
    }
}

/// Passes what the client sends to the session until the client leaves or a socket
/// fails; then closes the session's end for writing.
async fn to_session(tls: &Shared, plain: &mut OwnedWriteHalf) {
    loop {
        // Drained first: the handshake may have read the client's first bytes, which
        // rustls holds and the socket will not report again.
        let mut buf = bufpool::take();
        let more = loop {
            buf.clear();
            // One poll: Pending means rustls holds nothing and the socket is empty.
            let read = poll_fn(|cx| {
                let mut tls = lock(tls);
                let read = tls.read_buf(&mut buf);
                match std::pin::pin!(read).poll(cx) {
                    Poll::Ready(r) => Poll::Ready(Some(r)),
                    Poll::Pending => Poll::Ready(None),
                }
            });
            match read.await {
                None => break true,
                Some(Ok(0)) | Some(Err(_)) => break false,
                Some(Ok(_)) => {
                    if plain.write_all(&buf).await.is_err() {
                        break false;
                    }
                }
            }
        };
        buf.clear();
        bufpool::give(buf);
        let ready = more
            && poll_fn(|cx| lock(tls).get_ref().0 .0.poll_read_ready(cx))
                .await
                .is_ok();
        if !ready {
            let _ = plain.shutdown().await;
            return;
        }
    }
}

/// Passes what the session writes to the client until the session closes its end
/// or a socket fails; then sends close_notify.
async fn to_client(plain: &mut OwnedReadHalf, tls: &Shared) {
    while plain.readable().await.is_ok() {
        let mut buf = bufpool::take();
        let more = loop {
            buf.clear();
            match read_pair(plain.as_ref(), &mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
                Ok((0, _)) | Err(_) => break false,
                Ok((_, drained)) => {
                    if write_all(tls, &buf).await.is_err() {
                        break false;
                    }
                    if drained {
                        break true;
                    }
                }
            }
        };
        buf.clear();
        bufpool::give(buf);
        if !more {
            break;
        }
    }
    let _ = poll_fn(|cx| Pin::new(&mut *lock(tls)).poll_shutdown(cx)).await;
}

/// Encrypts and sends `data`, then flushes so that nothing stays in the record layer.
async fn write_all(tls: &Shared, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let n = poll_fn(|cx| Pin::new(&mut *lock(tls)).poll_write(cx, data)).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = &data[n..];
    }
    poll_fn(|cx| Pin::new(&mut *lock(tls)).poll_flush(cx)).await
}

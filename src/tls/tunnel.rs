//! A TLS client's connection: the handshake, then a task that passes bytes between
//! the TLS session and one end of a socket pair, whose other end becomes the
//! client's [`Stream`]. The session, the relay and the idle-client keeper see a
//! plain socket as for any other client, so none of them changes and plaintext
//! clients pay nothing for TLS; a TLS client pays a hop through the pair each way.

use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;

use rustls::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::TlsInfo;
use crate::net::{StdStream, Stream};

/// Bytes moved per read, each way (a TLS record carries at most 16 KB).
const CHUNK: usize = 16 * 1024;

/// Takes `stream` (a TCP client that was just told `S`) through the TLS handshake and
/// puts the plaintext end of a new socket pair in its place. On an error `stream` is
/// left as a closed pair end, and the TCP connection is closed.
pub async fn accept(config: Arc<ServerConfig>, stream: &mut Stream) -> io::Result<TlsInfo> {
    let (inner, outer) = StdUnixStream::pair()?;
    inner.set_nonblocking(true)?;
    outer.set_nonblocking(true)?;
    let inner = Stream::from_std(StdStream::Unix(inner))?;
    let tcp = match std::mem::replace(stream, inner).into_std() {
        StdStream::Tcp(s) => tokio::net::TcpStream::from_std(s)?,
        StdStream::Unix(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "TLS is only for TCP clients",
            ))
        }
    };
    let tls = TlsAcceptor::from(config)
        .accept(tcp)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake failed: {e}")))?;
    let info = TlsInfo::of(tls.get_ref().1);
    let outer = tokio::net::UnixStream::from_std(outer)?;
    tokio::spawn(Box::pin(carry(tls, outer)));
    Ok(info)
}

/// Passes bytes both ways until either side ends. The session closing its end sends
/// the client close_notify; the client leaving closes the session's end for writing,
/// so the session sees its end of file. Either way both sockets close, so a client
/// that ignores the close_notify does not keep its TCP connection open.
async fn carry(tls: TlsStream<tokio::net::TcpStream>, plain: tokio::net::UnixStream) {
    let (mut tls_r, mut tls_w) = tokio::io::split(tls);
    let (mut plain_r, mut plain_w) = plain.into_split();
    let up = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match tls_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if plain_w.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = plain_w.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match plain_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    // TlsStream's write encrypts and sends; flush makes sure
                    // nothing stays in the record layer.
                    if tls_w.write_all(&buf[..n]).await.is_err() || tls_w.flush().await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tls_w.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

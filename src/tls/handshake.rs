//! The TLS handshakes: a client's (Sluice as the server) and a server connection's
//! (Sluice as the client). Both run on the connection's own [`Stream`], which then
//! carries the session (`net/tls.rs`): the session, the relay, the pools and the
//! idle-client keeper use it as any other stream.

use std::io;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

use super::{TlsInfo, TlsPeer};
use crate::net::Stream;

/// Takes `stream` (a TCP client that was just told `S`, or whose first bytes,
/// `read`, were a ClientHello: direct TLS) through the TLS handshake. On an error
/// the stream is unusable and should be dropped.
pub async fn accept(
    config: Arc<ServerConfig>,
    stream: &mut Stream,
    read: &[u8],
) -> io::Result<TlsPeer> {
    let conn = ServerConnection::new(config).map_err(failed)?;
    stream
        .start_tls_after(conn, read)
        .await
        .map_err(failed_io)?;
    stream
        .with_tls(|c| match c {
            Connection::Server(c) => Some(TlsPeer::of(c)),
            Connection::Client(_) => None,
        })
        .flatten()
        .ok_or_else(|| io::Error::other("TLS handshake failed: no server session"))
}

/// The same for a server connection that answered `S` to an SSLRequest: Sluice is
/// the TLS client, checking the server as `config` says, under the name `name`.
pub async fn connect(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    stream: &mut Stream,
) -> io::Result<TlsInfo> {
    let conn = ClientConnection::new(config, name).map_err(failed)?;
    stream.start_tls(conn).await.map_err(failed_io)?;
    stream
        .with_tls(|c| TlsInfo::of(c))
        .ok_or_else(|| io::Error::other("TLS handshake failed: no session"))
}

fn failed(e: rustls::Error) -> io::Error {
    io::Error::other(format!("TLS handshake failed: {e}"))
}

fn failed_io(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("TLS handshake failed: {e}"))
}

//! Asking a server for TLS before its startup packet (`server_tls_sslmode`).

use super::error::PoolError;
use super::target::ServerAddr;
use crate::config::SslMode;
use crate::net::Stream;
use crate::tls::server::{server_name, ServerTls};
use crate::tls::{handshake, TlsInfo};

/// SSLRequest: length 8, then the request code 1234.5679.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Sends an SSLRequest to a TCP server and, if it answers `S`, runs the handshake,
/// after which `stream` carries the TLS session. A server that answers `N` is
/// used in plaintext unless the mode is `require` or stricter. UNIX sockets never use
/// TLS. What was negotiated is returned (all zero for plaintext).
pub async fn negotiate(
    stream: &mut Stream,
    addr: &ServerAddr,
    tls: &ServerTls,
) -> Result<TlsInfo, PoolError> {
    let ServerAddr::Tcp(host, _) = addr else {
        return Ok(TlsInfo::default());
    };
    stream
        .write_all(&SSL_REQUEST)
        .await
        .map_err(PoolError::io)?;
    // One byte only: anything after `S` belongs to the handshake, where rustls judges it.
    let mut answer = [0u8; 1];
    let n = stream.read(&mut answer).await.map_err(PoolError::io)?;
    match (n, answer[0]) {
        (0, _) => Err(PoolError::Closed),
        (_, b'S') => {
            let name = server_name(host).map_err(PoolError::Connect)?;
            let config = tls.config.clone();
            handshake::connect(config, name, stream)
                .await
                .map_err(|e| PoolError::Connect(format!("{addr}: {e}")))
        }
        (_, b'N') if tls.mode >= SslMode::Require => {
            Err(PoolError::Connect(format!("{addr}: server refused SSL")))
        }
        (_, b'N') => Ok(TlsInfo::default()),
        _ => Err(PoolError::Protocol("unexpected answer to SSLRequest")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ssl_request_is_the_protocols() {
        let code = u32::from_be_bytes(super::SSL_REQUEST[4..].try_into().unwrap_or_default());
        assert_eq!(code, 80877103);
        assert_eq!(super::SSL_REQUEST[..4], 8u32.to_be_bytes());
    }
}

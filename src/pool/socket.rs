//! Sockets to servers (and to peers, for cancels): a host name looked up through the
//! configuration's cache, or one address as it is; the settings' TCP options applied.

use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};

use super::error::PoolError;
use super::target::{PoolConfig, ServerAddr};
use crate::net::{StdStream, Stream, TcpTuning};

/// Opens a socket to `addr` (a server, or a peer for a cancel), without a time limit.
pub(crate) async fn connect_to(addr: &ServerAddr, tcp: &TcpTuning) -> std::io::Result<Stream> {
    match addr {
        ServerAddr::Tcp(host, port) => {
            if let Ok(ip) = host.parse::<std::net::IpAddr>() {
                // No lookup (tokio would make one on a blocking thread).
                return connect_ip(std::net::SocketAddr::new(ip, *port), tcp).await;
            }
            tcp_stream(TcpStream::connect((host.as_str(), *port)).await?, tcp)
        }
        ServerAddr::Unix(dir, port) => {
            if let Some(addr) = crate::net::listener::abstract_socket(dir, *port) {
                let s = crate::net::listener::connect_abstract(&addr?)?;
                return Stream::from_std(StdStream::Unix(s));
            }
            let path = crate::net::listener::unix_socket_path(dir, *port);
            let s = UnixStream::connect(path).await?;
            Stream::from_std(StdStream::Unix(s.into_std()?))
        }
    }
}

/// Connects to one TCP address.
pub(crate) async fn connect_ip(
    sa: std::net::SocketAddr,
    tcp: &TcpTuning,
) -> std::io::Result<Stream> {
    tcp_stream(TcpStream::connect(sa).await?, tcp)
}

/// A connected TCP socket as a `Stream`, with the settings' TCP options. tokio
/// connected it (with its write registration); the socket moves to a read-only
/// registration (net/stream.rs): two epoll_ctl calls per server connection, which
/// lives long.
fn tcp_stream(s: TcpStream, tcp: &TcpTuning) -> std::io::Result<Stream> {
    s.set_nodelay(true)?;
    tcp.apply(socket2::SockRef::from(&s))?;
    Stream::from_std(StdStream::Tcp(s.into_std()?))
}

/// Opens a socket to the server with `server_connect_timeout`, its host name looked
/// up through the configuration's cache (`dns_max_ttl`).
pub(super) async fn open(addr: &ServerAddr, cfg: &PoolConfig) -> Result<Stream, PoolError> {
    let (timeout, tcp) = (cfg.server_connect_timeout, &cfg.tcp);
    let fut = async {
        match addr {
            ServerAddr::Tcp(host, port) => {
                let addrs = cfg.dns.resolve(host, *port).await?;
                tcp_stream(TcpStream::connect(&addrs[..]).await?, tcp)
            }
            ServerAddr::Unix(..) => connect_to(addr, tcp).await,
        }
    };
    let limit = if timeout.is_zero() {
        Duration::from_secs(3600)
    } else {
        timeout
    };
    match crate::timer::timeout(limit, fut).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(PoolError::Connect(format!("{addr}: {e}"))),
        Err(_) => Err(PoolError::Connect(format!("{addr}: connect timed out"))),
    }
}

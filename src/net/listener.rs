//! Listening sockets: `listen_addr` × `listen_port` over TCP, and `.s.PGSQL.<port>` in
//! `unix_socket_dir`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UnixListener};

use crate::config::Settings;

/// The bound listeners. Dropping this removes the UNIX socket file.
#[derive(Debug)]
pub struct Listeners {
    pub tcp: Vec<TcpListener>,
    pub unix: Option<UnixListener>,
    unix_path: Option<PathBuf>,
}

impl Listeners {
    /// Stops listening on TCP (shutdown modes keep the UNIX socket, as PgBouncer does).
    pub fn close_tcp(&mut self) {
        self.tcp.clear();
    }

    /// The UNIX socket path, if any.
    pub fn unix_path(&self) -> Option<&PathBuf> {
        self.unix_path.as_ref()
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The path of the UNIX socket for a directory and port, as libpq names it.
pub fn unix_socket_path(dir: &str, port: u16) -> PathBuf {
    PathBuf::from(dir).join(format!(".s.PGSQL.{port}"))
}

/// Binds every configured listener; fails if any cannot be bound.
///
/// Must run inside the tokio runtime (the sockets are registered with it).
pub fn bind_listeners(s: &Settings) -> io::Result<Listeners> {
    let mut tcp = Vec::new();
    for addr in &s.listen_addr {
        for sa in resolve(addr, s.listen_port)? {
            tcp.push(bind_tcp(sa, s.listen_backlog)?);
        }
    }
    let mut unix = None;
    let mut unix_path = None;
    if !s.unix_socket_dir.is_empty() {
        let path = unix_socket_path(&s.unix_socket_dir, s.listen_port);
        if path.exists() {
            // A live socket means another pooler owns this port; a stale file is removed.
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "unix socket {} is in use by another process",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(&path)?;
        }
        let l = UnixListener::bind(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", path.display())))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(s.unix_socket_mode))?;
        unix = Some(l);
        unix_path = Some(path);
    }
    if tcp.is_empty() && unix.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "nowhere to listen: set listen_addr or unix_socket_dir",
        ));
    }
    Ok(Listeners {
        tcp,
        unix,
        unix_path,
    })
}

/// Expands `*` to all IPv4 and IPv6 addresses; resolves names and literals.
fn resolve(addr: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let addr = addr.trim();
    if addr == "*" {
        let mut v = vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)];
        // IPv6 may be disabled on the host; then `*` means IPv4 only.
        if std::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, 0)).is_ok() {
            v.push(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port));
        }
        return Ok(v);
    }
    let literal = addr.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let v: Vec<SocketAddr> = (addr, port).to_socket_addrs()?.collect();
    if v.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("cannot resolve listen_addr {addr}"),
        ));
    }
    Ok(v)
}

fn bind_tcp(sa: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    if sa.is_ipv6() {
        // `*` binds both families separately, so the v6 socket must not claim v4 too.
        sock.set_only_v6(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&sa.into())
        .map_err(|e| io::Error::new(e.kind(), format!("bind {sa}: {e}")))?;
    sock.listen(backlog.min(i32::MAX as u32) as i32)?;
    TcpListener::from_std(sock.into())
}

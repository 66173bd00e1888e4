//! Listening sockets: `listen_addr` × `listen_port` over TCP, and `.s.PGSQL.<port>` in
//! `unix_socket_dir`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::stream::{register, StdStream};
use crate::config::Settings;

/// A listening TCP socket registered with the event loop.
pub type TcpListener = AsyncFd<mio::net::TcpListener>;
/// A listening UNIX socket registered with the event loop.
pub type UnixListener = AsyncFd<mio::net::UnixListener>;

/// The bound listeners. Dropping this removes the UNIX socket file.
#[derive(Debug)]
pub struct Listeners {
    pub tcp: Vec<TcpListener>,
    /// The socket in `unix_socket_dir`, or those the service manager passed.
    pub unix: Vec<UnixListener>,
    /// The socket file Sluice made (and removes); none for passed sockets and for
    /// one in the abstract namespace.
    unix_path: Option<PathBuf>,
    /// The socket Sluice made, for the log: `unix:<path>`.
    unix_name: Option<String>,
}

/// A listening socket's accept, for [`Acceptor`].
pub trait Accept: std::os::fd::AsRawFd {
    /// A non-blocking socket not yet registered with any event loop
    /// (`Stream::from_std` registers it, for reads only), with what accept tells of
    /// its peer.
    type Conn;
    fn accept_one(&self) -> io::Result<Self::Conn>;
}

impl Accept for mio::net::TcpListener {
    type Conn = (std::net::TcpStream, SocketAddr);
    fn accept_one(&self) -> io::Result<Self::Conn> {
        self.accept().map(|(s, peer)| (s.into(), peer))
    }
}

impl Accept for mio::net::UnixListener {
    type Conn = StdStream;
    fn accept_one(&self) -> io::Result<Self::Conn> {
        self.accept().map(|(s, _)| StdStream::Unix(s.into()))
    }
}

/// Accepts the clients of one listener, looking one connection ahead: the accept that
/// finds the queue empty (which the listener's edge-triggered registration needs
/// anyway) is made right after each success, so each client is known to have come
/// alone (then `accept` says true) or in a burst.
#[derive(Debug)]
pub struct Acceptor<'a, L: Accept> {
    listener: &'a AsyncFd<L>,
    next: Option<L::Conn>,
}

impl<'a, L: Accept> Acceptor<'a, L> {
    pub fn new(listener: &'a AsyncFd<L>) -> Acceptor<'a, L> {
        Acceptor {
            listener,
            next: None,
        }
    }

    /// The next client, and whether it came alone.
    pub async fn accept(&mut self) -> io::Result<(L::Conn, bool)> {
        let conn = match self.next.take() {
            Some(c) => c,
            None => loop {
                let mut ready = self.listener.readable().await?;
                if let Ok(r) = ready.try_io(|l| l.get_ref().accept_one()) {
                    break r?;
                }
            },
        };
        // An error other than an empty queue stays for the next accept to meet: the
        // listener's readiness is cleared only by an empty queue.
        let alone = match self.listener.try_io(Interest::READABLE, L::accept_one) {
            Ok(c) => {
                self.next = Some(c);
                false
            }
            Err(_) => true,
        };
        Ok((conn, alone))
    }
}

impl Listeners {
    /// Stops listening on TCP (shutdown modes keep the UNIX socket, as PgBouncer does).
    pub fn close_tcp(&mut self) {
        self.tcp.clear();
    }

    /// The UNIX socket file, if Sluice made one.
    pub fn unix_path(&self) -> Option<&PathBuf> {
        self.unix_path.as_ref()
    }

    /// The UNIX socket Sluice made, as the log names it (`unix:<path>`, an abstract
    /// one's starting with `@`).
    pub fn unix_name(&self) -> Option<&str> {
        self.unix_name.as_deref()
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

/// The socket for a "directory" that starts with `@`: a name in Linux's abstract
/// namespace, no file, as PostgreSQL 14, libpq and PgBouncer 1.16 read such a value
/// (`@dir` is `\0dir/.s.PGSQL.<port>`). None for a real directory.
pub fn abstract_socket(dir: &str, port: u16) -> Option<io::Result<SockAddr>> {
    let name = dir.strip_prefix('@')?;
    let path = format!("\0{name}/.s.PGSQL.{port}");
    Some(SockAddr::unix(path))
}

/// Connects to the abstract-namespace socket `addr` without blocking: a UNIX
/// socket's connect is done or refused at once (a full backlog refuses it too).
pub fn connect_abstract(addr: &SockAddr) -> io::Result<std::os::unix::net::UnixStream> {
    let sock = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    sock.set_nonblocking(true)?;
    sock.connect(addr)?;
    Ok(OwnedFd::from(sock).into())
}

/// Binds and listens on the abstract-namespace socket `addr`. Nothing is left to
/// remove afterwards, nor any file to apply `unix_socket_mode` and
/// `unix_socket_group` to: anyone in the network namespace may connect.
fn bind_abstract(addr: &SockAddr, s: &Settings) -> io::Result<UnixListener> {
    let sock = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    sock.set_nonblocking(true)?;
    sock.bind(addr)?;
    sock.listen(s.listen_backlog.min(i32::MAX as u32) as i32)?;
    let l = std::os::unix::net::UnixListener::from(OwnedFd::from(sock));
    register(mio::net::UnixListener::from_std(l), Interest::READABLE)
}

/// Binds every configured listener; fails if any cannot be bound. With sockets
/// `passed` by the service manager (systemd socket activation), listens on those
/// instead, as PgBouncer does.
///
/// Must run inside the tokio runtime (the sockets are registered with it).
pub fn bind_listeners(s: &Settings, passed: Vec<OwnedFd>) -> io::Result<Listeners> {
    if !passed.is_empty() {
        return use_passed(s, passed);
    }
    let mut tcp = Vec::new();
    for addr in &s.listen_addr {
        for sa in resolve(addr, s.listen_port)? {
            tcp.push(bind_tcp(sa, s)?);
        }
    }
    let (mut unix, mut unix_path, mut unix_name) = (None, None, None);
    if let Some(addr) = abstract_socket(&s.unix_socket_dir, s.listen_port) {
        let name = format!("unix:{}/.s.PGSQL.{}", s.unix_socket_dir, s.listen_port);
        let l = addr
            .and_then(|a| bind_abstract(&a, s))
            .map_err(|e| io::Error::new(e.kind(), format!("bind {name}: {e}")))?;
        unix = Some(l);
        unix_name = Some(name);
    } else if !s.unix_socket_dir.is_empty() {
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
        let l = mio::net::UnixListener::bind(&path)
            .and_then(|l| register(l, Interest::READABLE))
            .map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", path.display())))?;
        if let Err(e) = set_socket_access(&path, s) {
            // The file is ours now; do not leave it behind when refusing to start.
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        unix = Some(l);
        unix_name = Some(format!("unix:{}", path.display()));
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
        unix: unix.into_iter().collect(),
        unix_path,
        unix_name,
    })
}

/// Listeners from the sockets systemd passed: TCP ones get `tcp_defer_accept`; the
/// configured addresses and socket directory are not used.
fn use_passed(s: &Settings, passed: Vec<OwnedFd>) -> io::Result<Listeners> {
    if !s.listen_addr.is_empty() {
        tracing::warn!("sockets passed from service manager, listen_addr ignored");
    }
    if !s.unix_socket_dir.is_empty() && s.unix_socket_dir != "/tmp" {
        tracing::warn!("sockets passed from service manager, unix_socket_dir ignored");
    }
    let (mut tcp, mut unix) = (Vec::new(), Vec::new());
    for fd in passed {
        let raw = fd.as_raw_fd();
        let sock = Socket::from(fd);
        let addr = sock.local_addr()?;
        sock.set_nonblocking(true)?;
        if addr.is_unix() {
            let l = std::os::unix::net::UnixListener::from(OwnedFd::from(sock));
            unix.push(register(
                mio::net::UnixListener::from_std(l),
                Interest::READABLE,
            )?);
        } else if addr.as_socket().is_some() {
            if s.tcp_defer_accept {
                set_defer_accept(&sock, true)?;
            }
            let l = mio::net::TcpListener::from_std(sock.into());
            tcp.push(register(l, Interest::READABLE)?);
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("socket passed from service manager (fd {raw}) is neither TCP nor UNIX"),
            ));
        }
        tracing::info!("socket passed from service manager (fd {raw})");
    }
    Ok(Listeners {
        tcp,
        unix,
        unix_path: None,
        unix_name: None,
    })
}

/// Applies `unix_socket_mode` and `unix_socket_group` to the socket file.
fn set_socket_access(path: &Path, s: &Settings) -> io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(s.unix_socket_mode)).map_err(
        |e| {
            io::Error::new(
                e.kind(),
                format!("unix_socket_mode on {}: {e}", path.display()),
            )
        },
    )?;
    if let Some(group) = &s.unix_socket_group {
        let gid = group_id(group)?;
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("unix_socket_group {group} on {}: {e}", path.display()),
            )
        })?;
    }
    Ok(())
}

/// The gid of group `name` (a number is taken as a gid, as chgrp does).
fn group_id(name: &str) -> io::Result<u32> {
    let unknown = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("unix_socket_group: unknown group {name}"),
        )
    };
    let cname = std::ffi::CString::new(name).map_err(|_| unknown())?;
    // SAFETY: `cname` is NUL-terminated; getgrnam returns NULL or a pointer to static
    // storage that is read at once, before any other getgr* call. Binding happens at
    // startup, before other threads look groups up.
    let gr = unsafe { libc::getgrnam(cname.as_ptr()) };
    if !gr.is_null() {
        // SAFETY: non-null, points to a valid group record (see above).
        return Ok(unsafe { (*gr).gr_gid });
    }
    name.parse::<u32>().map_err(|_| unknown())
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

fn bind_tcp(sa: SocketAddr, s: &Settings) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    if s.tcp_defer_accept {
        set_defer_accept(&sock, true)?;
    }
    if s.so_reuseport {
        // `so_reuseport`: other processes that set it too may bind the same address,
        // and the kernel spreads new connections over them (one Sluice per group of
        // cores, or an old and a new one overlapping across a restart).
        sock.set_reuse_port(true)?;
    }
    if sa.is_ipv6() {
        // `*` binds both families separately, so the v6 socket must not claim v4 too.
        sock.set_only_v6(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&sa.into())
        .map_err(|e| io::Error::new(e.kind(), format!("bind {sa}: {e}")))?;
    sock.listen(s.listen_backlog.min(i32::MAX as u32) as i32)?;
    register(
        mio::net::TcpListener::from_std(sock.into()),
        Interest::READABLE,
    )
}

/// `tcp_defer_accept`: the kernel hands a connection over when its first bytes
/// arrive (the startup packet, or an SSL request), so accepting it and reading that
/// packet are one wake-up, not two. As in PgBouncer, the wait for those bytes is
/// bounded by 45 seconds, after which the connection is handed over anyway. Also
/// turned on or off on an open listener at a reload (`on` false: off).
#[cfg(target_os = "linux")]
pub fn set_defer_accept(sock: &impl std::os::fd::AsRawFd, on: bool) -> io::Result<()> {
    let secs: libc::c_int = if on { 45 } else { 0 };
    // SAFETY: the descriptor is the open socket `sock` holds for the whole call, and
    // the option value is a valid c_int whose size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// No TCP_DEFER_ACCEPT here: the setting is accepted and has no effect.
#[cfg(not(target_os = "linux"))]
pub fn set_defer_accept(_sock: &impl std::os::fd::AsRawFd, _on: bool) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A single-loop runtime for these tests (timers for the bounded waits).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .expect("runtime")
    }

    /// A listener on a free loopback port, and its address.
    fn loopback(s: &Settings) -> (TcpListener, SocketAddr) {
        let l = bind_tcp(SocketAddr::from(([127, 0, 0, 1], 0)), s).expect("bind");
        let addr = l.get_ref().local_addr().expect("addr");
        (l, addr)
    }

    /// A connection accepted with another behind it is not alone; the last one is,
    /// and the one held back is handed out next with its own peer address.
    #[test]
    fn the_acceptor_tells_a_burst_from_a_lone_client() {
        runtime().block_on(async {
            // These clients send nothing: with TCP_DEFER_ACCEPT none would be handed over.
            let s = Settings {
                listen_backlog: 16,
                tcp_defer_accept: false,
                ..Settings::default()
            };
            let (l, addr) = loopback(&s);
            let mut acceptor = Acceptor::new(&l);

            let a = std::net::TcpStream::connect(addr).expect("connect a");
            let ((_, peer), alone) = acceptor.accept().await.expect("accept a");
            assert_eq!(peer, a.local_addr().expect("a's address"));
            assert!(alone, "one connection waiting");

            let b = std::net::TcpStream::connect(addr).expect("connect b");
            let c = std::net::TcpStream::connect(addr).expect("connect c");
            let ((_, peer), alone) = acceptor.accept().await.expect("accept b");
            assert_eq!(peer, b.local_addr().expect("b's address"));
            assert!(!alone, "c waits behind b");
            let ((_, peer), alone) = acceptor.accept().await.expect("accept c");
            assert_eq!(peer, c.local_addr().expect("c's address"));
            assert!(alone, "nothing behind c");
        });
    }

    /// With `tcp_defer_accept` a connection is handed over only once its first bytes
    /// have come: a silent one waits, a talking one is accepted with its bytes there
    /// to read at once.
    #[cfg(target_os = "linux")]
    #[test]
    fn tcp_defer_accept_hands_over_a_connection_with_its_first_bytes() {
        use std::io::{Read, Write};
        runtime().block_on(async {
            assert!(
                !Settings::default().tcp_defer_accept,
                "Sluice's default is off"
            );
            let s = Settings {
                tcp_defer_accept: true,
                ..Settings::default()
            };
            let (l, addr) = loopback(&s);
            let mut acceptor = Acceptor::new(&l);

            let _silent = std::net::TcpStream::connect(addr).expect("connect silent");
            let early =
                tokio::time::timeout(std::time::Duration::from_millis(300), acceptor.accept())
                    .await;
            assert!(early.is_err(), "a silent connection was handed over");

            let mut talker = std::net::TcpStream::connect(addr).expect("connect talker");
            talker.write_all(b"hello").expect("write");
            let ((mut conn, _), _) =
                tokio::time::timeout(std::time::Duration::from_secs(5), acceptor.accept())
                    .await
                    .expect("the talking connection is handed over")
                    .expect("accept");
            conn.set_nonblocking(false).expect("blocking");
            let mut got = [0u8; 5];
            conn.read_exact(&mut got).expect("its bytes are there");
            assert_eq!(&got, b"hello");
        });
    }
}

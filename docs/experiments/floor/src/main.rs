//! floor: about the least work a transaction pooler can do, as a measuring stick for
//! how far below PgBouncer's CPU per query any pooler can go on a given machine.
//!
//! One thread, one raw edge-triggered epoll set, one scratch buffer, sockets in a
//! table indexed by descriptor. It does what a transaction pooler must (log clients
//! in, hand them one of `default_pool_size` server connections per transaction,
//! follow message headers to find the transaction's end, queue clients while every
//! server is busy) and nothing else: `trust` only, one database, no timeouts, no
//! COPY, no cancel, no TLS, no console, no statistics; a protocol error closes the
//! connection and a lost server is not replaced. Never for real use.
//!
//! Usage: floor PGBOUNCER_INI (it reads the listeners, `default_pool_size` and the
//! first `[databases]` entry, which must name a socket directory as its host; its
//! `user`, else the first client's, logs the servers in).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{IntoRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};

mod ballast;
mod framer;
mod ini;
mod pipeline;

use ballast::Ballast;
use framer::{pipelinable, startup_user, Framer, Seen};
use ini::read_ini;

const SCRATCH: usize = 64 * 1024;
const SSL_REQUEST: u32 = 80877103;
const EV_READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

#[derive(PartialEq)]
enum Kind {
    Listener,
    Startup,
    Client,
    Server,
}

struct Conn {
    kind: Kind,
    /// The linked server of a client, or client of a server.
    peer: Option<RawFd>,
    framer: Framer,
    /// Server: ReadyForQuery messages owed; the last status.
    pending: u32,
    status: u8,
    /// Client: sent a message that a Sync has not closed yet.
    unsynced: bool,
    /// Client: bytes read while no server is linked (the startup packet, then a
    /// request), and the syncs among them.
    req: Vec<u8>,
    req_syncs: u32,
    /// Bytes a write could not take yet; write readiness is asked for meanwhile.
    out: Vec<u8>,
    /// Client: the first of its `FLOOR_COLD_LINES` lines of ballast (see [`Ballast`]).
    ballast: u32,
    /// Server: clients whose requests were sent behind its peer's, in order, each
    /// owed one ReadyForQuery; whether its peer's may have more (pipeline.rs).
    queue: VecDeque<RawFd>,
    pipe_ok: bool,
    /// Client: when its server began its request; its last one was quick (pipeline.rs).
    started: Option<std::time::Instant>,
    fast: bool,
}

impl Conn {
    fn new(kind: Kind) -> Conn {
        Conn {
            kind,
            peer: None,
            framer: Framer::default(),
            pending: 0,
            status: b'I',
            unsynced: false,
            req: Vec::new(),
            req_syncs: 0,
            out: Vec::new(),
            ballast: 0,
            queue: VecDeque::new(),
            pipe_ok: false,
            started: None,
            fast: false,
        }
    }
}

struct Floor {
    ep: RawFd,
    conns: Vec<Option<Conn>>,
    idle: Vec<RawFd>,
    line: VecDeque<RawFd>,
    /// AuthenticationOk, the first server's ParameterStatus messages, BackendKeyData
    /// and ReadyForQuery: every client's welcome.
    welcome: Vec<u8>,
    scratch: Box<[u8]>,
    /// Whether the pool is open (all of it at the first login).
    pool_open: bool,
    pool: usize,
    pg_path: String,
    dbname: String,
    user: Option<String>,
    ballast: Ballast,
    /// `FLOOR_DEFER`: answers to clients wait for the end of the epoll batch.
    defer: bool,
    /// Clients with answers held back in this batch.
    deferred: Vec<RawFd>,
    logins: usize,
    /// `FLOOR_PIPELINE=n`: up to n requests in flight on a server (1: off).
    depth: usize,
    /// `FLOOR_PIPE_US`: a client's last query's most µs for others to go behind it.
    pipe_us: u128,
}

fn env_num(name: &str) -> Option<u128> {
    std::env::var(name).ok()?.parse().ok()
}

fn die(what: &str) -> ! {
    eprintln!("floor: {what}: {}", std::io::Error::last_os_error());
    std::process::exit(1)
}

fn main() {
    let ini = std::env::args().nth(1);
    if matches!(ini.as_deref(), Some("-V" | "--version")) {
        println!("floor {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    let Some(ini) = ini else {
        eprintln!("usage: floor PGBOUNCER_INI");
        std::process::exit(2);
    };
    let set = read_ini(&ini);
    // A shell starts background jobs with SIGINT ignored; scripts stop poolers with it.
    // SAFETY: setting a signal's disposition to the default touches no memory.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
    // SAFETY: epoll_create1 takes no pointers.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        die("epoll_create1");
    }
    let mut f = Floor {
        ep,
        conns: Vec::new(),
        idle: Vec::new(),
        line: VecDeque::new(),
        welcome: Vec::new(),
        scratch: vec![0u8; SCRATCH].into_boxed_slice(),
        pool_open: false,
        pool: set.pool,
        pg_path: set.pg_path,
        dbname: set.dbname,
        user: set.user,
        ballast: Ballast::new(
            std::env::var("FLOOR_COLD_LINES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        ),
        logins: 0,
        defer: std::env::var_os("FLOOR_DEFER").is_some(),
        deferred: Vec::new(),
        depth: env_num("FLOOR_PIPELINE").unwrap_or(1) as usize,
        pipe_us: env_num("FLOOR_PIPE_US").unwrap_or(0),
    };
    let tcp = std::net::TcpListener::bind(("127.0.0.1", set.port)).unwrap_or_else(|_| die("bind"));
    tcp.set_nonblocking(true)
        .unwrap_or_else(|_| die("nonblocking"));
    f.add(tcp.into_raw_fd(), Conn::new(Kind::Listener));
    if let Some(dir) = set.unix_dir {
        let path = format!("{dir}/.s.PGSQL.{}", set.port);
        let _ = std::fs::remove_file(&path);
        let u = UnixListener::bind(&path).unwrap_or_else(|_| die("bind unix"));
        u.set_nonblocking(true)
            .unwrap_or_else(|_| die("nonblocking"));
        f.add(u.into_raw_fd(), Conn::new(Kind::Listener));
    }
    eprintln!(
        "floor: listening on 127.0.0.1:{}, pool of {}",
        set.port, set.pool
    );
    f.run()
}

impl Floor {
    /// Opens the whole pool at once, blocking: only the first login waits for it, and
    /// any failure ends the process.
    fn open_pool(&mut self, user: &str) {
        let (path, db) = (self.pg_path.clone(), self.dbname.clone());
        for i in 0..self.pool {
            let fd = self.connect_server(&path, user, &db, i == 0);
            self.add(fd, Conn::new(Kind::Server));
            self.idle.push(fd);
        }
        self.pool_open = true;
        self.welcome
            .extend_from_slice(&[b'K', 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 1]);
        self.welcome.extend_from_slice(&[b'Z', 0, 0, 0, 5, b'I']);
    }

    fn connect_server(&mut self, path: &str, user: &str, db: &str, keep: bool) -> RawFd {
        let mut s = UnixStream::connect(path).unwrap_or_else(|_| die("connect to PostgreSQL"));
        let mut body = vec![0, 3, 0, 0];
        for part in ["user", user, "database", db] {
            body.extend_from_slice(part.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut pkt = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        pkt.extend_from_slice(&body);
        s.write_all(&pkt).unwrap_or_else(|_| die("startup"));
        loop {
            let mut hdr = [0u8; 5];
            s.read_exact(&mut hdr)
                .unwrap_or_else(|_| die("server closed"));
            let len = u32::from_be_bytes([hdr[1], hdr[2], hdr[3], hdr[4]]) as usize;
            let mut msg = vec![0u8; len.saturating_sub(4)];
            s.read_exact(&mut msg)
                .unwrap_or_else(|_| die("server closed"));
            match hdr[0] {
                b'R' if msg != [0, 0, 0, 0] => die("the server asks for a password (trust only)"),
                b'R' if keep => self
                    .welcome
                    .extend_from_slice(&[b'R', 0, 0, 0, 8, 0, 0, 0, 0]),
                b'S' if keep => {
                    self.welcome.extend_from_slice(&hdr);
                    self.welcome.extend_from_slice(&msg);
                }
                b'E' => die(&format!("server error {}", String::from_utf8_lossy(&msg))),
                b'Z' => break,
                _ => {}
            }
        }
        s.set_nonblocking(true)
            .unwrap_or_else(|_| die("nonblocking"));
        s.into_raw_fd()
    }

    fn add(&mut self, fd: RawFd, c: Conn) {
        let i = fd as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        self.conns[i] = Some(c);
        self.ctl(libc::EPOLL_CTL_ADD, fd, EV_READ);
    }

    fn ctl(&self, op: i32, fd: RawFd, events: u32) {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid epoll_event for the call's duration.
        if unsafe { libc::epoll_ctl(self.ep, op, fd, &mut ev) } < 0 {
            die("epoll_ctl");
        }
    }

    fn conn(&mut self, fd: RawFd) -> &mut Conn {
        match self.conns.get_mut(fd as usize) {
            Some(Some(c)) => c,
            _ => die("no such connection"),
        }
    }

    fn run(&mut self) -> ! {
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        loop {
            // SAFETY: `evs` holds 1024 writable epoll_event entries.
            let n = unsafe { libc::epoll_wait(self.ep, evs.as_mut_ptr(), 1024, -1) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                die("epoll_wait");
            }
            for ev in &evs[..n as usize] {
                let (fd, bits) = (ev.u64 as RawFd, ev.events);
                let kind = match self.conns.get(fd as usize) {
                    Some(Some(c)) => &c.kind,
                    _ => continue,
                };
                if *kind == Kind::Listener {
                    self.accept(fd);
                    continue;
                }
                if bits & libc::EPOLLOUT as u32 != 0 && !self.flush(fd) {
                    continue;
                }
                if bits & !(libc::EPOLLOUT as u32) != 0 {
                    self.readable(fd);
                }
            }
            for fd in std::mem::take(&mut self.deferred) {
                if let Some(Some(c)) = self.conns.get(fd as usize) {
                    if !c.out.is_empty() {
                        self.flush_deferred(fd);
                    }
                }
            }
        }
    }

    fn accept(&mut self, lfd: RawFd) {
        loop {
            let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
            // SAFETY: null address pointers are allowed: the peer's address is not asked for.
            let fd =
                unsafe { libc::accept4(lfd, std::ptr::null_mut(), std::ptr::null_mut(), flags) };
            if fd < 0 {
                return;
            }
            let one: libc::c_int = 1;
            // SAFETY: `one` is a valid c_int for the call; failure (a UNIX socket) is harmless.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            self.add(fd, Conn::new(Kind::Startup));
        }
    }

    /// Reads until the socket is drained (a short read), passing each chunk on.
    fn readable(&mut self, fd: RawFd) {
        loop {
            let mut buf = std::mem::take(&mut self.scratch);
            // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            let go = match n {
                0 => Err(()),
                n if n < 0 => match std::io::Error::last_os_error().kind() {
                    std::io::ErrorKind::WouldBlock => Ok(false),
                    std::io::ErrorKind::Interrupted => Ok(true),
                    _ => Err(()),
                },
                n => {
                    let n = n as usize;
                    self.chunk(fd, &buf[..n]).map(|_| n == buf.len())
                }
            };
            self.scratch = buf;
            match go {
                Ok(true) => continue,
                Ok(false) => return,
                Err(()) => return self.close(fd),
            }
        }
    }

    fn chunk(&mut self, fd: RawFd, d: &[u8]) -> Result<(), ()> {
        let piped = self.depth > 1;
        let c = self.conn(fd);
        match c.kind {
            Kind::Startup => {
                c.req.extend_from_slice(d);
                self.startup(fd)
            }
            Kind::Server if piped => self.server_piped(fd, d),
            Kind::Server => {
                let mut seen = Seen::default();
                c.framer.scan(d, true, &mut seen)?;
                c.pending = c.pending.saturating_sub(seen.readies);
                if let Some(s) = seen.status {
                    c.status = s;
                }
                let client = c.peer.ok_or(())?;
                let head = self.conn(client).ballast;
                self.ballast.touch(head);
                self.answer(client, d);
                let c = self.conn(fd);
                if c.pending == 0 && c.status == b'I' && c.out.is_empty() {
                    let clean = !self.conn(client).unsynced && self.conn(client).req.is_empty();
                    if clean {
                        self.conn(client).peer = None;
                        self.release(fd);
                    }
                }
                Ok(())
            }
            _ => {
                let head = c.ballast;
                self.ballast.touch(head);
                let c = self.conn(fd);
                let mut seen = Seen::default();
                c.framer.scan(d, false, &mut seen)?;
                if seen.terminate {
                    return Err(());
                }
                if let Some(u) = seen.unsynced {
                    c.unsynced = u;
                }
                match c.peer {
                    Some(server) => {
                        if self.conn(server).peer != Some(fd) {
                            return Err(()); // more from a client sent behind another: not here
                        }
                        self.conn(server).pending += seen.syncs;
                        self.send(server, d);
                    }
                    None => {
                        let first = c.req.is_empty();
                        c.req.extend_from_slice(d);
                        c.req_syncs += seen.syncs;
                        if first {
                            match self.idle.pop() {
                                Some(server) => self.link(fd, server),
                                None => self.line.push_back(fd),
                            }
                        }
                    }
                }
                Ok(())
            }
        }
    }

    fn startup(&mut self, fd: RawFd) -> Result<(), ()> {
        let head = self.ballast.head(self.logins);
        let c = self.conn(fd);
        if c.req.len() < 8 {
            return Ok(());
        }
        let len = u32::from_be_bytes([c.req[0], c.req[1], c.req[2], c.req[3]]) as usize;
        if !(8..=10_000).contains(&len) {
            return Err(());
        }
        if c.req.len() < len {
            return Ok(());
        }
        let code = u32::from_be_bytes([c.req[4], c.req[5], c.req[6], c.req[7]]);
        if code == SSL_REQUEST {
            c.req.drain(..len);
            self.send(fd, b"N");
            return self.startup(fd);
        }
        if code >> 16 != 3 {
            return Err(());
        }
        c.kind = Kind::Client;
        c.ballast = head;
        self.logins += 1;
        if !self.pool_open {
            let user = match self.user.clone() {
                Some(u) => u,
                None => startup_user(&self.conn(fd).req[8..len]).ok_or(())?,
            };
            self.open_pool(&user);
        }
        let c = self.conn(fd);
        c.req.drain(..len);
        let rest = std::mem::take(&mut c.req);
        let welcome = std::mem::take(&mut self.welcome);
        self.send(fd, &welcome);
        self.welcome = welcome;
        if rest.is_empty() {
            Ok(())
        } else {
            self.chunk(fd, &rest)
        }
    }

    /// Gives a client with a buffered request the server, and sends the request.
    fn link(&mut self, client: RawFd, server: RawFd) {
        let (pipe_us, depth) = (self.pipe_us, self.depth);
        let c = self.conn(client);
        c.peer = Some(server);
        let mut req = std::mem::take(&mut c.req);
        let syncs = std::mem::take(&mut c.req_syncs);
        let fast = pipe_us == 0 || c.fast;
        if pipe_us > 0 {
            c.started = Some(std::time::Instant::now());
        }
        let ok = depth > 1 && syncs == 1 && fast && pipelinable(&req);
        let s = self.conn(server);
        s.peer = Some(client);
        s.pending += syncs;
        s.pipe_ok = ok;
        self.send(server, &req);
        req.clear();
        self.conn(client).req = req;
        self.top_up(server);
    }

    fn release(&mut self, server: RawFd) {
        self.conn(server).peer = None;
        match self.line.pop_front() {
            Some(client) => self.link(client, server),
            None => self.idle.push(server),
        }
    }

    /// Writes `d` to `fd`, keeping what the socket does not take for `flush`.
    fn send(&mut self, fd: RawFd, d: &[u8]) {
        let c = self.conn(fd);
        if !c.out.is_empty() {
            c.out.extend_from_slice(d);
            return;
        }
        // SAFETY: `d` is a live buffer of `d.len()` bytes.
        let n = unsafe { libc::send(fd, d.as_ptr().cast(), d.len(), libc::MSG_NOSIGNAL) };
        let n = if n < 0 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock {
                return; // a broken socket: its read side reports it
            }
            0
        } else {
            n as usize
        };
        if n < d.len() {
            self.conn(fd).out.extend_from_slice(&d[n..]);
            self.ctl(libc::EPOLL_CTL_MOD, fd, EV_READ | libc::EPOLLOUT as u32);
        }
    }

    /// Writes a client's answers held back for the end of the epoll batch
    /// (`FLOOR_DEFER`); what the socket does not take waits for `flush`.
    fn flush_deferred(&mut self, fd: RawFd) {
        let out = std::mem::take(&mut self.conn(fd).out);
        // SAFETY: `out` is a live buffer of `out.len()` bytes.
        let n = unsafe { libc::send(fd, out.as_ptr().cast(), out.len(), libc::MSG_NOSIGNAL) };
        let n = n.max(0) as usize;
        if n < out.len() {
            self.conn(fd).out = out[n..].to_vec();
            self.ctl(libc::EPOLL_CTL_MOD, fd, EV_READ | libc::EPOLLOUT as u32);
        } else {
            let mut out = out;
            out.clear();
            self.conn(fd).out = out;
        }
    }

    /// Server bytes for `client`: sent now, or (`FLOOR_DEFER`) at the batch's end.
    fn answer(&mut self, client: RawFd, d: &[u8]) {
        if !self.defer {
            return self.send(client, d);
        }
        let c = self.conn(client);
        c.out.extend_from_slice(d);
        if c.out.len() == d.len() {
            self.deferred.push(client);
        }
    }

    /// Writes held bytes; false when the connection was closed.
    fn flush(&mut self, fd: RawFd) -> bool {
        let out = std::mem::take(&mut self.conn(fd).out);
        // SAFETY: `out` is a live buffer of `out.len()` bytes.
        let n = unsafe { libc::send(fd, out.as_ptr().cast(), out.len(), libc::MSG_NOSIGNAL) };
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock {
            self.close(fd);
            return false;
        }
        let n = n.max(0) as usize;
        if n == out.len() {
            self.ctl(libc::EPOLL_CTL_MOD, fd, EV_READ);
        } else {
            self.conn(fd).out = out[n..].to_vec();
        }
        true
    }

    fn close(&mut self, fd: RawFd) {
        let Some(c) = self.conns.get_mut(fd as usize).and_then(Option::take) else {
            return;
        };
        // SAFETY: the table owned `fd`, and it is forgotten there now.
        unsafe { libc::close(fd) };
        match (c.kind, c.peer) {
            (Kind::Server, peer) => {
                self.idle.retain(|&s| s != fd);
                for client in c.queue {
                    self.close(client);
                }
                if let Some(client) = peer {
                    self.close(client);
                }
            }
            (_, Some(server)) => {
                let s = self.conn(server);
                if s.peer != Some(fd) {
                    return self.close(server); // sent behind another's: not here
                }
                if s.pending == 0 && s.status == b'I' && s.out.is_empty() && !c.unsynced {
                    self.release(server);
                } else {
                    self.close(server);
                }
            }
            _ => self.line.retain(|&x| x != fd),
        }
    }
}

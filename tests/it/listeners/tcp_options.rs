//! PgBouncer's TCP options (`tcp_keepalive`, `tcp_keepidle`, ...) on the sockets
//! Sluice accepts and the ones it opens to PostgreSQL, read back from the kernel's
//! table of TCP sockets.

use super::{cfg_at, md5_sluice, select};
use crate::support;

/// One IPv4 TCP socket of `/proc/net/tcp`.
#[derive(Debug)]
struct Sock {
    local_port: u16,
    state: u8,
    /// Which timer runs: 2 is keepalive.
    timer: u8,
    /// When it fires, in clock ticks (USER_HZ, 100 a second).
    when: u64,
    inode: u64,
}

fn tcp_table() -> Vec<Sock> {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = |addr: &str| u16::from_str_radix(addr.split(':').nth(1)?, 16).ok();
            let (timer, when) = f.get(5)?.split_once(':')?;
            Some(Sock {
                local_port: port(f.get(1)?)?,
                state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                timer: u8::from_str_radix(timer, 16).ok()?,
                when: u64::from_str_radix(when, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The established TCP sockets of process `pid`, once none has a retransmission
/// pending (an answer just sent is timed until its ACK comes, which the peer may
/// delay): only then does the table show the keepalive timer. At most 3 s.
fn quiet_sockets(pid: u32) -> Vec<Sock> {
    let mine = socket_inodes(pid);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let socks: Vec<Sock> = tcp_table()
            .into_iter()
            .filter(|t| t.state == 1 && mine.contains(&t.inode))
            .collect();
        if socks.iter().all(|t| t.timer != 1) || std::time::Instant::now() > deadline {
            return socks;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The socket inodes process `pid` holds.
fn socket_inodes(pid: u32) -> Vec<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("read the fd table");
    dir.filter_map(|e| {
        let target = std::fs::read_link(e.ok()?.path()).ok()?;
        let t = target.to_str()?;
        t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_timings_reach_client_and_server_sockets() {
    let s = md5_sluice()
        .setting("tcp_keepidle", "77")
        .setting("tcp_keepintvl", "9")
        .setting("tcp_keepcnt", "3")
        .start();
    let client = support::connect(&cfg_at("127.0.0.1", s.port())).await;
    // The query opens a server connection over TCP (the test database's entry).
    select(&client, 1).await;
    let established = quiet_sockets(s.pid());
    let (to_clients, to_servers): (Vec<&Sock>, Vec<&Sock>) =
        established.iter().partition(|t| t.local_port == s.port());
    assert!(
        !to_clients.is_empty() && !to_servers.is_empty(),
        "{established:?}\n{}",
        s.diagnostics()
    );
    for t in &established {
        // The keepalive timer runs, due within tcp_keepidle (not the system's 2 h).
        assert_eq!(t.timer, 2, "{t:?}");
        assert!(t.when <= 77 * 100 && t.when > 60 * 100, "{t:?}");
    }
    // Without the timings, keepalive runs on the system's (7,200 s by default).
    let system: u64 = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(7200);
    let plain = md5_sluice().start();
    let client = support::connect(&cfg_at("127.0.0.1", plain.port())).await;
    select(&client, 2).await;
    let socks = quiet_sockets(plain.pid());
    assert!(!socks.is_empty());
    for t in &socks {
        assert_eq!(t.timer, 2, "{t:?}");
        assert!(
            t.when <= system * 100 && t.when + 20 * 100 > system * 100,
            "{t:?}"
        );
    }
}

/// Whether a real client gets in while a connection that sends nothing is open to
/// Sluice, with room for one client: only if Sluice has not accepted the silent one.
/// Tries for up to 3 s, each time with a fresh silent connection, so that a change
/// of the listener's option that is still on its way is waited for.
async fn gets_in_beside_a_silent_connection(s: &support::Sluice) -> bool {
    let cfg = cfg_at("127.0.0.1", s.port());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let silent = std::net::TcpStream::connect(("127.0.0.1", s.port())).expect("connect");
        // Time for Sluice to accept it, if it will (at once on an idle loop).
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        if let Ok(c) = support::try_connect(&cfg).await {
            drop(c);
            drop(silent);
            return true;
        }
        drop(silent);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_defer_accept_follows_a_reload() {
    let mut s = md5_sluice()
        .setting("max_client_conn", "1")
        .setting("tcp_defer_accept", "0")
        .start();
    // Off: the silent connection is accepted and takes the only client slot.
    assert!(
        !gets_in_beside_a_silent_connection(&s).await,
        "{}",
        s.diagnostics()
    );
    let ini = std::fs::read_to_string(s.ini_path()).expect("read ini");
    s.rewrite_ini(&ini.replace("tcp_defer_accept = 0", "tcp_defer_accept = 1"));
    let before = s.log().matches("config reloaded").count();
    s.signal(libc::SIGHUP);
    assert!(
        support::wait_until(std::time::Duration::from_secs(5), || {
            s.log().matches("config reloaded").count() > before
        }),
        "{}",
        s.diagnostics()
    );
    assert!(
        !s.log().contains("cannot be changed by a reload"),
        "{}",
        s.log()
    );
    // On, after the reload: the kernel keeps the silent connection until it talks.
    assert!(
        gets_in_beside_a_silent_connection(&s).await,
        "{}",
        s.diagnostics()
    );
}

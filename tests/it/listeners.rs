//! Listening sockets (TCP addresses, the unix socket, `max_client_conn`), and the
//! connection log lines (`logs.rs`), against the real `sluice` binary and PostgreSQL.

mod abstract_ns;
mod logs;
mod open_files;
mod reuseport;
mod tcp_options;

use crate::support::wire::{first_error, RawClient};
use crate::support::{self, run_bounded, wait_until, Sluice, SluiceBuilder};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

fn md5_sluice() -> SluiceBuilder {
    SluiceBuilder::new().userlist(support::MD5_USER, support::MD5_PASSWORD)
}

/// tokio-postgres config for `host:port` as the md5 test user.
fn cfg_at(host: &str, port: u16) -> tokio_postgres::Config {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(host)
        .port(port)
        .user(support::MD5_USER)
        .password(support::MD5_PASSWORD)
        .dbname(support::TEST_DB)
        .connect_timeout(Duration::from_secs(10));
    cfg
}

async fn select(client: &tokio_postgres::Client, n: i32) {
    let got: i32 = client
        .query_one("SELECT $1::int4", &[&n])
        .await
        .unwrap_or_else(|e| panic!("SELECT {n}: {e}"))
        .get(0);
    assert_eq!(got, n);
}

fn ipv6_loopback_available() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_on_ipv4_and_ipv6_loopback() {
    let v6 = ipv6_loopback_available();
    let addrs = if v6 { "127.0.0.1,::1" } else { "127.0.0.1" };
    if !v6 {
        eprintln!("::1 unavailable here; checking 127.0.0.1 only");
    }
    let s = md5_sluice().setting("listen_addr", addrs).start();
    let c4 = support::connect(&cfg_at("127.0.0.1", s.port())).await;
    select(&c4, 4).await;
    if v6 {
        let c6 = support::connect(&cfg_at("::1", s.port())).await;
        select(&c6, 6).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_on_star_accepts_on_loopback() {
    let s = md5_sluice().setting("listen_addr", "*").start();
    let c = support::connect(&cfg_at("127.0.0.1", s.port())).await;
    select(&c, 1).await;
    if ipv6_loopback_available() {
        let c6 = support::connect(&cfg_at("::1", s.port())).await;
        select(&c6, 2).await;
    }
}

/// SHOW CLIENTS names both ends of a TCP client, whether the listener is bound to one
/// address (the local end is the listener's) or to all (asked of the socket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_clients_names_both_ends_on_one_address_and_on_star() {
    for listen in ["127.0.0.1", "*"] {
        let s = crate::admin::builder()
            .setting("listen_addr", listen)
            .start();
        let mut cfg = cfg_at("127.0.0.1", s.port());
        cfg.application_name("ends_test");
        let c = support::connect(&cfg).await;
        select(&c, 1).await;
        let clients = crate::admin::psql_ok(&s, "SHOW CLIENTS");
        let cell = |col| clients.cell("application_name", "ends_test", col);
        assert_eq!(
            cell("addr").as_deref(),
            Some("127.0.0.1"),
            "{listen}: {clients:?}"
        );
        assert_eq!(
            cell("local_addr").as_deref(),
            Some("127.0.0.1"),
            "{listen}: {clients:?}"
        );
        assert_eq!(
            cell("local_port"),
            Some(s.port().to_string()),
            "{listen}: {clients:?}"
        );
        let port = cell("port").and_then(|p| p.parse::<u16>().ok());
        assert!(port.is_some_and(|p| p != 0), "{listen}: {clients:?}");
    }
}

fn socket_path(s: &Sluice) -> PathBuf {
    s.socket_dir().join(format!(".s.PGSQL.{}", s.port()))
}

/// Runs `sql` with psql (the md5 user) through the UNIX socket in `dir` on `port`:
/// psql's trimmed output and its stderr.
fn psql_over_socket(port: u16, dir: &str, sql: &str) -> (String, String) {
    let mut cmd = support::psql_cmd_pw(
        port,
        dir,
        support::MD5_USER,
        support::TEST_DB,
        support::MD5_PASSWORD,
    );
    cmd.args(["-c", sql]);
    let out = run_bounded(&mut cmd, None, Duration::from_secs(30)).expect("psql hung");
    (
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unix_socket_with_mode_serves_psql() {
    let s = md5_sluice().setting("unix_socket_mode", "0700").start();
    let path = socket_path(&s);
    let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o700,
        "{}",
        path.display()
    );
    let (out, err) = psql_over_socket(
        s.port(),
        &s.socket_dir().to_string_lossy(),
        "SELECT 'via-socket'",
    );
    assert_eq!(out, "via-socket", "{err}\n{}", s.diagnostics());
}

#[test]
fn unix_socket_mode_is_applied_as_given() {
    let s = md5_sluice().setting("unix_socket_mode", "0666").start();
    let mode = std::fs::metadata(socket_path(&s))
        .expect("socket file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o666);
}

#[test]
fn empty_unix_socket_dir_creates_no_socket() {
    let s = md5_sluice().setting("unix_socket_dir", "").start();
    let sockets: Vec<_> = std::fs::read_dir(s.dir())
        .expect("read temp dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".s.PGSQL"))
        .collect();
    assert!(sockets.is_empty(), "{sockets:?}");
    // The default /tmp location must not have been used instead.
    assert!(!PathBuf::from(format!("/tmp/.s.PGSQL.{}", s.port())).exists());
}

fn socket_removed_after(sig: i32) {
    let mut s = md5_sluice().start();
    let path = socket_path(&s);
    assert!(path.exists());
    s.signal(sig);
    let status = s.wait_exit(Duration::from_secs(10));
    assert!(status.is_some(), "still running\n{}", s.diagnostics());
    assert!(
        !path.exists(),
        "{} left behind after signal {sig}",
        path.display()
    );
}

#[test]
fn socket_removed_after_sigquit() {
    socket_removed_after(libc::SIGQUIT);
}

#[test]
fn socket_removed_after_sigterm() {
    socket_removed_after(libc::SIGTERM);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_client_conn_turns_away_the_third_client() {
    let s = md5_sluice().setting("max_client_conn", "2").start();
    let cfg = cfg_at("127.0.0.1", s.port());
    let a = support::connect(&cfg).await;
    let b = support::connect(&cfg).await;
    let err = match support::try_connect(&cfg).await {
        Ok(_) => panic!("third client got in\n{}", s.diagnostics()),
        Err(e) => e,
    };
    let msg = err
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| format!("{err} ({err:?})"));
    assert!(msg.contains("no more connections allowed"), "{msg}");
    select(&a, 1).await;
    select(&b, 2).await;
    // Once one leaves, there is room again.
    drop(a);
    let c = connect_when_room(&cfg).await;
    select(&c, 3).await;
}

/// Connects with `cfg` once the pooler has room (`max_client_conn`), trying for up
/// to 10 s.
async fn connect_when_room(cfg: &tokio_postgres::Config) -> tokio_postgres::Client {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match support::try_connect(cfg).await {
            Ok(c) => return c,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                panic!("no room for a client in 10 s: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// As PgBouncer: `max_client_conn` never turns away the console or a cancel request,
/// so that an operator can look and cancel when clients fill the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_client_conn_lets_the_console_and_cancels_in() {
    use crate::admin::{builder, console, ADMIN, ADMIN_PW};
    let s = builder().setting("max_client_conn", "1").start();
    let cfg = cfg_at("127.0.0.1", s.port());
    let busy = support::connect(&cfg).await;
    let refused = support::try_connect(&cfg)
        .await
        .err()
        .and_then(|e| e.as_db_error().map(|d| d.message().to_owned()));
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("max_client_conn")),
        "{refused:?}"
    );
    // The console gets in beside it, and sees it.
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let rows = admin
        .simple_query("SHOW CLIENTS")
        .await
        .expect("SHOW CLIENTS");
    let clients = rows
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();
    assert!(clients >= 2, "{clients} rows");
    // A cancel request, a third connection, reaches the busy client's query.
    let token = busy.cancel_token();
    let running = tokio::spawn(async move { busy.simple_query("SELECT pg_sleep(20)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("cancel request");
    let e = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the query was not cancelled")
        .expect("task")
        .expect_err("pg_sleep(20) finished");
    assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e}");
}

/// Lines of the logfile containing `needle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_only_when_listen_addr_is_empty() {
    let s = md5_sluice().setting("listen_addr", "").start();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", s.port())).is_err(),
        "TCP accepted with an empty listen_addr"
    );
    let c = support::connect(&s.socket_config(
        support::MD5_USER,
        support::MD5_PASSWORD,
        support::TEST_DB,
    ))
    .await;
    select(&c, 9).await;
}

#[test]
fn port_in_use_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let (status, out) = md5_sluice()
        .setting("listen_port", &port)
        .start_expect_failure();
    assert!(!status.success());
    assert!(out.contains(&port), "error does not name the port: {out}");
}

#[test]
fn stale_socket_file_is_replaced() {
    let sock_dir = support::TempDir::new("sluice-sock");
    let port = support::free_port().to_string();
    let builder = md5_sluice()
        .setting("listen_addr", "")
        .setting("listen_port", &port)
        .setting("unix_socket_dir", &sock_dir.path().display().to_string());
    let mut first = builder.clone().start();
    let path = sock_dir.join(format!(".s.PGSQL.{port}"));
    first.signal(libc::SIGKILL);
    assert!(first.wait_exit(Duration::from_secs(5)).is_some());
    assert!(path.exists(), "SIGKILL cannot have removed the socket file");
    let second = builder.start();
    // The harness judges a unix-only Sluice ready once the socket file exists, which
    // the stale file already does; wait for the new process to say it is up.
    assert!(
        wait_until(Duration::from_secs(10), || second
            .log()
            .contains("process up")),
        "{}",
        second.diagnostics()
    );
    let (out, err) = psql_over_socket(
        second.port(),
        &sock_dir.path().to_string_lossy(),
        "SELECT 'replaced'",
    );
    assert_eq!(out, "replaced", "{err}");
}

#[test]
fn live_socket_of_another_instance_is_not_stolen() {
    let sock_dir = support::TempDir::new("sluice-sock");
    let port = support::free_port().to_string();
    let builder = md5_sluice()
        .setting("listen_addr", "")
        .setting("listen_port", &port)
        .setting("unix_socket_dir", &sock_dir.path().display().to_string());
    let mut first = builder.clone().start();
    let (status, out) = builder.start_expect_failure();
    assert!(!status.success());
    assert!(out.contains("in use"), "{out}");
    // The first instance still owns a working socket.
    assert!(first.is_running());
    let (out, err) = psql_over_socket(
        first.port(),
        &sock_dir.path().to_string_lossy(),
        "SELECT 'still-mine'",
    );
    assert_eq!(out, "still-mine", "{err}\n{}", first.diagnostics());
}

/// The `tr` (timer) field of Sluice's side of each established TCP connection on
/// `port` from the client's `peer_port`, from /proc/net/tcp{,6}: `02` means a
/// keepalive timer runs. (By both ports: other tests' sockets may show the same
/// local port, as an outgoing connection's, and once did.)
fn server_side_timers(port: u16, peer_port: u16) -> Vec<String> {
    let (local, remote) = (format!(":{port:04X}"), format!(":{peer_port:04X}"));
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in support::read_lossy(std::path::Path::new(table))
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 5 && f[1].ends_with(&local) && f[2].ends_with(&remote) && f[3] == "01" {
                out.push(f[5].split(':').next().unwrap_or_default().to_string());
            }
        }
    }
    out
}

async fn keepalive_timers(setting: &str) -> Vec<String> {
    let s = md5_sluice().setting("tcp_keepalive", setting).start();
    client_keepalive_timers(&s).await
}

/// A raw client of `s` as the md5 test user, logged in to the test database.
async fn raw_login(s: &Sluice) -> RawClient {
    RawClient::login(
        s.port(),
        support::MD5_USER,
        support::MD5_PASSWORD,
        support::TEST_DB,
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("login: {e}\n{}", s.diagnostics()))
}

/// The timers of Sluice's side of one new client connection (closed after).
async fn client_keepalive_timers(s: &support::Sluice) -> Vec<String> {
    let mut c = raw_login(s).await;
    let msgs = c.simple("SELECT 1", Duration::from_secs(10)).await;
    assert!(first_error(&msgs).is_none(), "{msgs:?}");
    let peer = c.local_port;
    // Right after a reply the retransmit timer (01) runs until the client's delayed
    // ACK arrives; only then does the idle socket show its keepalive state.
    let mut timers = Vec::new();
    wait_until(Duration::from_secs(3), || {
        timers = server_side_timers(s.port(), peer);
        !timers.is_empty() && timers.iter().all(|t| t != "01")
    });
    drop(c);
    // Gone from the table before the next client comes.
    wait_until(Duration::from_secs(3), || {
        server_side_timers(s.port(), peer).is_empty()
    });
    timers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_keepalive_applies_to_client_sockets() {
    if !std::path::Path::new("/proc/net/tcp").exists() {
        eprintln!("no /proc/net/tcp; skipping");
        return;
    }
    let on = keepalive_timers("1").await;
    assert_eq!(on, vec!["02"], "expected one keepalive-timed socket");
    let off = keepalive_timers("0").await;
    assert_eq!(off, vec!["00"], "tcp_keepalive = 0 still set a timer");
}

/// Client sockets take `SO_KEEPALIVE` from their listener (set once there), so a
/// reload of `tcp_keepalive` must reach the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_keepalive_follows_a_reload() {
    if !std::path::Path::new("/proc/net/tcp").exists() {
        eprintln!("no /proc/net/tcp; skipping");
        return;
    }
    let mut s = md5_sluice().setting("tcp_keepalive", "1").start();
    assert_eq!(client_keepalive_timers(&s).await, vec!["02"]);
    for (from, to, timer) in [("1", "0", "00"), ("0", "1", "02")] {
        s.reload_replacing(
            &format!("tcp_keepalive = {from}"),
            &format!("tcp_keepalive = {to}"),
        );
        // The first client after the reload, and the ones after it.
        for _ in 0..3 {
            assert_eq!(
                client_keepalive_timers(&s).await,
                vec![timer],
                "{}",
                s.diagnostics()
            );
        }
    }
}

/// A group other than the process's own, so that the chown is observable.
fn other_group() -> Option<(String, u32)> {
    // SAFETY: getegid has no preconditions.
    let mine = unsafe { libc::getegid() };
    let root = mine == 0;
    support::read_lossy(std::path::Path::new("/etc/group"))
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.first()?.to_string(), f.get(2)?.parse::<u32>().ok()?))
        })
        // Only root may give a file to a group it is not in.
        .find(|(_, gid)| if root { *gid != mine } else { *gid == mine })
}

#[test]
fn unix_socket_group_is_applied() {
    use std::os::unix::fs::MetadataExt;
    let Some((name, gid)) = other_group() else {
        eprintln!("no usable group in /etc/group; skipping");
        return;
    };
    let s = md5_sluice().setting("unix_socket_group", &name).start();
    let meta = std::fs::metadata(socket_path(&s)).expect("socket file");
    assert_eq!(meta.gid(), gid, "socket not given to group {name}");
}

#[test]
fn unknown_unix_socket_group_is_refused() {
    let (status, out) = md5_sluice()
        .setting("unix_socket_group", "no_such_group_sluice")
        .start_expect_failure();
    assert!(!status.success());
    assert!(out.contains("no_such_group_sluice"), "{out}");
}

//! systemd integration: state notifications to `NOTIFY_SOCKET` (what a
//! `Type=notify` unit, such as Debian's pgbouncer.service, waits for) and listening
//! on sockets passed by socket activation. The test plays systemd's part with real
//! sockets; Sluice is the real binary.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::support::probe::within;
use crate::support::{self, SluiceBuilder, TempDir, MD5_PASSWORD, MD5_USER, TEST_DB};

const T: Duration = Duration::from_secs(30);

/// The next notification, within 10 s.
fn next(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(e) => panic!("no notification: {e}"),
    }
}

#[test]
fn notifies_ready_reloading_and_stopping() {
    let dir = TempDir::new("sluice-notify");
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .env("NOTIFY_SOCKET", path.to_str().expect("utf-8 path"))
        .start();
    assert_eq!(next(&sock), "READY=1");
    // Ready means listening.
    std::net::TcpStream::connect(("127.0.0.1", s.port())).expect("listening when ready");

    s.signal(libc::SIGHUP);
    let reloading = next(&sock);
    let usec = reloading
        .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
        .and_then(|u| u.parse::<u64>().ok());
    assert!(usec.is_some_and(|u| u > 0), "{reloading:?}");
    assert_eq!(next(&sock), "READY=1");

    s.signal(libc::SIGTERM);
    assert_eq!(next(&sock), "STOPPING=1");
    assert!(s.wait_exit(Duration::from_secs(10)).is_some(), "no exit");
}

#[test]
fn notifies_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("sluice-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let sock = UnixDatagram::bind_addr(&addr).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .env("NOTIFY_SOCKET", &format!("@{name}"))
        .start();
    assert_eq!(next(&sock), "READY=1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_on_sockets_passed_by_systemd() {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp listener");
    let port = tcp.local_addr().expect("addr").port();
    let dir = TempDir::new("sluice-activation");
    let unix_path = dir.join(format!(".s.PGSQL.{port}"));
    let unix = std::os::unix::net::UnixListener::bind(&unix_path).expect("unix listener");
    let mut s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("listen_port", &port.to_string())
        // Where the passed UNIX socket is: had Sluice bound its own there, it would
        // have found it in use and refused to start.
        .setting("unix_socket_dir", dir.path().to_str().expect("utf-8 path"))
        .passed_sockets(&[tcp.as_raw_fd(), unix.as_raw_fd()])
        .start();

    // Both passed sockets serve clients.
    let mut over_unix = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    over_unix.host_path(dir.path()).port(port);
    for (n, cfg) in [
        (1, s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
        (2, over_unix),
    ] {
        let c = within(T, "connect", support::connect(&cfg)).await;
        let got: i32 = c
            .query_one("SELECT $1::int4", &[&n])
            .await
            .expect("query")
            .get(0);
        assert_eq!(got, n);
    }

    let log = s.log();
    for want in [
        "socket passed from service manager (fd 3)",
        "socket passed from service manager (fd 4)",
        "listen_addr ignored",
    ] {
        assert!(log.contains(want), "{want}: {log}");
    }
    // The passed socket's file is systemd's: Sluice leaves it when it exits (it
    // removes its own on the way out).
    s.signal(libc::SIGQUIT);
    assert!(s.wait_exit(Duration::from_secs(10)).is_some(), "no exit");
    assert!(unix_path.exists());
}

//! The open-files limit reached: accepts fail until clients leave. Sluice says so in
//! PgBouncer's words, once rather than at each retry, and serves again as soon as
//! descriptors are free.

use std::time::Duration;

use super::{cfg_at, md5_sluice, select};
use crate::support::wait_until;

const FAILED: &str = "accept() failed: Too many open files";

/// Sets the soft open-files limit of process `pid` to `n`.
fn limit_open_files(pid: u32, n: usize) {
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let pid = libc::pid_t::try_from(pid).expect("a pid");
    // SAFETY: prlimit reads `now` only when given it, and writes the old limits
    // into the struct it is given, which lives through the call.
    let got = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut now) };
    assert_eq!(got, 0, "{}", std::io::Error::last_os_error());
    let new = libc::rlimit {
        rlim_cur: n as libc::rlim_t,
        rlim_max: now.rlim_max,
    };
    // SAFETY: as above; `new` is only read.
    let set = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
}

#[tokio::test]
async fn the_open_files_limit_is_logged_once_and_outlived() {
    let s = md5_sluice().start();
    // A few connections more than it holds now reach the limit.
    limit_open_files(s.pid(), s.open_files() + 6);
    let held: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", s.port())).expect("connect"))
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || s.log().contains(FAILED)),
        "no `{FAILED}`\n{}",
        s.diagnostics()
    );
    // A second's retries at the limit (one each 50 ms) make no more lines.
    std::thread::sleep(Duration::from_secs(1));
    let log = s.log();
    let lines: Vec<_> = log.lines().filter(|l| l.contains("accept")).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains(&format!("ERROR {FAILED}")),
        "{}",
        lines[0]
    );

    // Once the clients leave, the next one is served.
    drop(held);
    let (client, conn) = cfg_at("127.0.0.1", s.port())
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect after the limit: {e}\n{}", s.diagnostics()));
    tokio::spawn(conn);
    select(&client, 7).await;
}

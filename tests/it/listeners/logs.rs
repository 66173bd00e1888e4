//! PgBouncer's log lines for client and server connections (`log_connections`,
//! `log_disconnections`).

use super::{connect_when_room, md5_sluice, raw_login, select};
use crate::support::{self, wait_until, Sluice};
use std::time::Duration;

fn log_lines(s: &Sluice, needle: &str) -> Vec<String> {
    s.log()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logfile_has_pgbouncer_style_connection_lines() {
    let s = md5_sluice().start();
    let c = support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB))
        .await;
    select(&c, 1).await;
    drop(c);
    // The client's own line: the harness's readiness probes leave theirs too (a
    // CancelRequest with a key nobody holds: `failed cancel request`).
    let who = format!("{}/{}@", support::TEST_DB, support::MD5_USER);
    let closing = || log_lines(&s, "closing because:");
    assert!(
        wait_until(Duration::from_secs(5), || closing()
            .iter()
            .any(|l| l.contains(&who))),
        "no closing line\n{}",
        s.diagnostics()
    );
    let prefix = format!(" UTC [{}] LOG C-", s.pid());
    let login = log_lines(&s, "login attempt:");
    // PgBouncer's line, to its end.
    let want = format!(
        "login attempt: db={} user={} tls=no replication=no",
        support::TEST_DB,
        support::MD5_USER
    );
    assert!(
        login
            .iter()
            .any(|l| l.contains(&prefix) && l.contains(&want)),
        "{login:?}"
    );
    let line = &login[0];
    // `YYYY-MM-DD HH:MM:SS.mmm UTC [pid] ...`
    let b = line.as_bytes();
    assert!(
        b.len() > 24 && b[4] == b'-' && b[7] == b'-' && b[10] == b' ' && b[13] == b':',
        "{line}"
    );
    assert!(
        closing()
            .iter()
            .any(|l| l.contains(&prefix) && l.contains(&who)),
        "{:?}",
        closing()
    );
}

/// Server connections get PgBouncer's lines too: one when made, one when the pool
/// closes them (here `server_idle_timeout`); none with the two settings off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_connections_are_logged_when_made_and_closed() {
    for on in [true, false] {
        let flag = if on { "1" } else { "0" };
        let s = md5_sluice()
            .setting("server_idle_timeout", "1")
            .setting("log_connections", flag)
            .setting("log_disconnections", flag)
            .start();
        let c =
            support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB))
                .await;
        select(&c, 1).await;
        // Session mode: the server goes back to the pool (and idles) when the client
        // leaves.
        drop(c);
        let server = format!("{}/{}@", support::TEST_DB, support::MD5_USER);
        let closed = || log_lines(&s, "closing because: server idle timeout (age=");
        if on {
            assert!(
                wait_until(Duration::from_secs(10), || !closed().is_empty()),
                "no server closing line\n{}",
                s.diagnostics()
            );
            assert!(closed()
                .iter()
                .all(|l| l.contains(" LOG S-") && l.contains(&server)));
            let made = log_lines(&s, "new connection to server");
            assert!(
                made.iter()
                    .any(|l| l.contains(" LOG S-") && l.contains(&server)),
                "{made:?}"
            );
        } else {
            // Past the idle timeout and a janitor sweep (a bounded wait).
            tokio::time::sleep(Duration::from_millis(2500)).await;
            assert!(log_lines(&s, "new connection to server").is_empty());
            assert!(log_lines(&s, "closing because: server").is_empty());
        }
    }
}

/// A server connection that fails under its client gets its closing line too. (A
/// raw client, which stays connected after the server's FATAL error: a driver
/// closes on it, and then its session ends before the relay sees the server go.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_lost_under_its_client_is_logged() {
    use crate::support::wire::first_column;
    let s = md5_sluice().start();
    let mut c = raw_login(&s).await;
    let step = Duration::from_secs(20);
    c.simple("BEGIN", step).await;
    let pid = first_column(&c.simple("SELECT pg_backend_pid()", step).await)
        .into_iter()
        .flatten()
        .next()
        .expect("a backend pid");
    support::pg().psql(&format!("SELECT pg_terminate_backend({pid})"));
    let line = || log_lines(&s, "closing because: server conn crashed?");
    assert!(
        wait_until(Duration::from_secs(10), || line()
            .iter()
            .any(|l| l.contains(" LOG S-"))),
        "{:?}\n{}",
        line(),
        s.diagnostics()
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_connections_off_suppresses_login_lines() {
    let s = md5_sluice().setting("log_connections", "0").start();
    let c = support::connect(&s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB))
        .await;
    select(&c, 1).await;
    drop(c);
    // The disconnection line proves the session ran its course and was logged.
    assert!(
        wait_until(Duration::from_secs(5), || !log_lines(
            &s,
            "closing because:"
        )
        .is_empty()),
        "{}",
        s.diagnostics()
    );
    assert!(log_lines(&s, "login attempt").is_empty(), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_disconnections_off_suppresses_closing_lines() {
    // With room for one client only, the second can log in only after the first
    // session has fully ended, i.e. after its closing line would have been written.
    let s = md5_sluice()
        .setting("log_disconnections", "0")
        .setting("max_client_conn", "1")
        .start();
    let cfg = s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB);
    let first = support::connect(&cfg).await;
    select(&first, 1).await;
    drop(first);
    let second = connect_when_room(&cfg).await;
    select(&second, 2).await;
    assert!(
        log_lines(&s, "login attempt").len() >= 2,
        "{}",
        s.diagnostics()
    );
    assert!(
        log_lines(&s, "closing because: client close request").is_empty(),
        "{}",
        s.log()
    );
}

/// Waits for a server connection's closing line with `reason`.
fn await_server_closing(s: &Sluice, reason: &str) {
    let server = format!("{}/{}@", support::TEST_DB, support::MD5_USER);
    let line = || log_lines(s, &format!("closing because: {reason} (age="));
    assert!(
        wait_until(Duration::from_secs(10), || line()
            .iter()
            .any(|l| l.contains(" LOG S-") && l.contains(&server))),
        "{:?}\n{}",
        line(),
        s.diagnostics()
    );
}

/// The pool's other closing reasons, PgBouncer's words: a server marked by RECONNECT
/// closes at release as `db conf changed`; one past `server_lifetime` closes while
/// idle as `server lifetime over`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_and_server_lifetime_closes_are_logged() {
    use crate::admin::{builder, psql_ok};
    let cfg = |s: &Sluice| s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB);

    // Session mode: the client holds its server through RECONNECT, and the server
    // closes when the client leaves.
    let s = builder().start();
    let c = support::connect(&cfg(&s)).await;
    select(&c, 1).await;
    psql_ok(&s, &format!("RECONNECT {}", support::TEST_DB));
    assert!(log_lines(&s, "closing because: db conf changed").is_empty());
    drop(c);
    await_server_closing(&s, "db conf changed");
    // No other reason was given for it.
    assert!(
        log_lines(&s, "closing because: server").is_empty(),
        "{}",
        s.log()
    );

    let s = md5_sluice().setting("server_lifetime", "1").start();
    let c = support::connect(&cfg(&s)).await;
    select(&c, 1).await;
    drop(c);
    await_server_closing(&s, "server lifetime over");
    assert!(
        log_lines(&s, "closing because: server idle timeout").is_empty(),
        "{}",
        s.log()
    );
}

/// A client that closes its socket without Terminate is logged as `client unexpected
/// eof`, one that sends Terminate as `client close request` (PgBouncer's words), in
/// session and in transaction mode, idle or in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_close_and_a_terminate_are_told_apart() {
    use crate::support::wire::frame;
    for mode in ["session", "transaction"] {
        let s = md5_sluice().setting("pool_mode", mode).start();
        for (sql, terminate) in [
            ("SELECT 1", false),
            ("SELECT 1", true),
            ("BEGIN", false),
            ("BEGIN", true),
        ] {
            let mut c = raw_login(&s).await;
            c.simple(sql, Duration::from_secs(10)).await;
            let port = c.local_port;
            if terminate {
                c.send(&frame(b'X', &[])).await.expect("send Terminate");
            }
            drop(c);
            let want = if terminate {
                "client close request"
            } else {
                "client unexpected eof"
            };
            let client = format!("@127.0.0.1:{port} closing because: ");
            let line = || log_lines(&s, &client);
            assert!(
                wait_until(Duration::from_secs(5), || !line().is_empty()),
                "{mode} {sql:?}: no closing line\n{}",
                s.diagnostics()
            );
            assert!(
                line().iter().all(|l| l.contains(want)),
                "{mode} {sql:?} terminate={terminate}: {:?}, not {want}",
                line()
            );
        }
    }
}

/// A client gone before its startup packet (a port probe, a load balancer's check)
/// is logged as PgBouncer logs it, with `log_disconnections`, and not without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_its_startup_packet_is_logged_with_log_disconnections() {
    const GONE: &str = "(nodb)/(nouser)@127.0.0.1:";
    const WHY: &str = "closing because: client unexpected eof (age=0s)";
    let probe = |s: &Sluice| drop(std::net::TcpStream::connect(("127.0.0.1", s.port())));
    let s = md5_sluice().start();
    probe(&s);
    let prefix = format!(" UTC [{}] LOG C-", s.pid());
    let logged = || {
        log_lines(&s, WHY)
            .iter()
            .any(|l| l.contains(&prefix) && l.contains(GONE))
    };
    assert!(
        wait_until(Duration::from_secs(5), logged),
        "no `{GONE}... {WHY}`\n{}",
        s.diagnostics()
    );

    // Off: with room for one client only, the next login gets in once the probe's
    // session has ended, after its line would have been written.
    let s = md5_sluice()
        .setting("log_disconnections", "0")
        .setting("max_client_conn", "1")
        .start();
    probe(&s);
    let cfg = s.config(support::MD5_USER, support::MD5_PASSWORD, support::TEST_DB);
    select(&connect_when_room(&cfg).await, 3).await;
    assert!(log_lines(&s, "unexpected eof").is_empty(), "{}", s.log());
}

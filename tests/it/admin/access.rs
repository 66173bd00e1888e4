//! Who may use the console and how: admin_users, stats_users, everyone else refused,
//! `pgbouncer` over the UNIX socket from the same OS user without a password,
//! `auth_type = any`, and the simple-query-only rule.

use std::process::Command;
use std::time::Duration;

use super::{builder, console, psql_as, psql_err, psql_run, ADMIN, ADMIN_PW, STATS, STATS_PW};
use crate::support::{self, MD5_PASSWORD, MD5_USER};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_users_read_but_cannot_control() {
    let mut s = builder().start();
    assert!(psql_as(&s, STATS, STATS_PW, "SHOW STATS").ok);
    for cmd in [
        "PAUSE",
        "RESUME",
        "RELOAD",
        "KILL_CLIENT 1",
        "DISABLE sluice_test",
        "SHUTDOWN",
        "SET default_pool_size = 1",
        "SHOW FDS",
    ] {
        psql_err(&s, STATS, STATS_PW, cmd, "admin access needed");
    }
    // Fake parameters are for everyone.
    assert!(psql_as(&s, STATS, STATS_PW, "SET client_encoding = 'UTF8'").ok);
    assert!(s.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_users_are_refused_after_authenticating() {
    let s = builder().start();
    // A valid pooled user, but not a console user.
    psql_err(&s, MD5_USER, MD5_PASSWORD, "SHOW VERSION", "not allowed");
    // A console user with the wrong password fails authentication first.
    psql_err(
        &s,
        ADMIN,
        "wrong",
        "SHOW VERSION",
        "password authentication failed",
    );
    // `pgbouncer` over TCP is an ordinary user name: not in the auth file.
    psql_err(
        &s,
        "pgbouncer",
        "x",
        "SHOW VERSION",
        "password authentication failed",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_over_the_unix_socket_needs_no_password() {
    let s = builder().start();
    let bin = support::pg_bindir().join("psql");
    let bin = if bin.exists() { bin } else { "psql".into() };
    let mut cmd = Command::new(bin);
    support::clear_pg_env(&mut cmd);
    cmd.env("PGCONNECT_TIMEOUT", "10")
        .args(["-X", "-A", "-F", "\u{1f}", "-P", "footer=off", "-w"])
        .arg("-h")
        .arg(s.socket_dir())
        .arg("-p")
        .arg(s.port().to_string())
        .args(["-U", "pgbouncer", "-d", "pgbouncer", "-c", "PAUSE"]);
    let o = psql_run(cmd);
    assert!(o.ok, "{}\n{}", o.stderr, s.diagnostics());
    // It is an admin: PAUSE worked.
    assert_eq!(
        super::psql_ok(&s, "SHOW STATE").cell("key", "paused", "value"),
        Some("yes".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_type_any_lets_everyone_read() {
    let s = builder().setting("auth_type", "any").start();
    assert!(psql_as(&s, "whoever", "", "SHOW POOLS").ok);
    psql_err(&s, "whoever", "", "PAUSE", "admin access needed");
    // Listed admins are still admins.
    assert!(psql_as(&s, ADMIN, "", "SHOW STATE").ok);
    assert!(psql_as(&s, ADMIN, "", "RECONNECT").ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_protocol_is_refused() {
    let s = builder().start();
    let c = console(&s, ADMIN, ADMIN_PW).await;
    // tokio-postgres' query() uses Parse/Bind/Execute.
    let err = tokio::time::timeout(Duration::from_secs(10), c.query("SHOW POOLS", &[]))
        .await
        .expect("answered in time")
        .expect_err("extended protocol must fail");
    let text = format!("{err:?}");
    assert!(
        text.contains("extended query protocol not supported by admin console"),
        "{text}"
    );
    // The simple protocol works on a new connection.
    let c = console(&s, ADMIN, ADMIN_PW).await;
    let rows = c.simple_query("SHOW VERSION").await.expect("simple query");
    assert!(!rows.is_empty());
    // Any other message: refused with its type as a number, as PgBouncer words it.
    // Both refusals end as PgBouncer's: the error and ReadyForQuery, then FATAL
    // "bad packet" and the close.
    use crate::support::wire::{frame, RawClient};
    let refused = [
        (
            frame(b'F', &[0; 6]),
            "unsupported packet type for admin console: 70",
        ),
        (
            frame(b'P', b"\0SHOW POOLS\0\0\0"),
            "extended query protocol not supported by admin console",
        ),
    ];
    for (msg, want) in refused {
        let mut raw = RawClient::login(s.port(), ADMIN, ADMIN_PW, "pgbouncer", &[])
            .await
            .expect("console login");
        raw.send(&msg).await.expect("send");
        let msgs = raw.until_closed(Duration::from_secs(10)).await;
        let seen: Vec<_> = msgs
            .iter()
            .map(|m| (m.tag, m.field(b'S'), m.field(b'M')))
            .collect();
        let error = |severity: &str, text: &str| (b'E', Some(severity.into()), Some(text.into()));
        let expected = vec![
            error("ERROR", want),
            (b'Z', None, None),
            error("FATAL", "bad packet"),
        ];
        assert_eq!(seen, expected, "{msgs:?}");
    }
    assert!(
        s.log().contains("closing because: bad packet"),
        "{}",
        s.log()
    );
}

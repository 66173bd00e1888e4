//! UNIX sockets in Linux's abstract namespace, as PgBouncer 1.16 takes them: a
//! `unix_socket_dir` or a database's `host` starting with `@` names a socket with no
//! file (`\0dir/.s.PGSQL.<port>`), the way PostgreSQL 14 and libpq read such a value.

use std::time::Duration;

use tokio_postgres::{NoTls, SimpleQueryMessage};

use super::md5_sluice;
use crate::support::{self, pg, run_bounded, TempDir, MD5_PASSWORD, MD5_USER, TEST_DB};

const T: Duration = Duration::from_secs(30);

async fn first_value(c: &tokio_postgres::Client, sql: &str) -> Option<String> {
    let msgs = support::probe::within(T, sql, c.simple_query(sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
        _ => None,
    })?
}

/// A database whose `host` starts with `@` is reached over PostgreSQL's socket in
/// the abstract namespace: a UNIX connection, so the server sees no address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_in_the_abstract_namespace_is_reached() {
    let host = pg().abstract_socket_dir();
    let s = md5_sluice()
        .database(
            "abs",
            &format!("host={host} port={} dbname={TEST_DB}", pg().port()),
        )
        .start();
    let c = support::connect(&s.config(MD5_USER, MD5_PASSWORD, "abs")).await;
    assert_eq!(first_value(&c, "SELECT 6 * 7").await.as_deref(), Some("42"));
    assert_eq!(
        first_value(&c, "SELECT inet_server_addr()").await,
        None,
        "the server connection is not over TCP\n{}",
        s.diagnostics()
    );
    // PostgreSQL's own view of the connection: a UNIX socket's has no client address.
    assert_eq!(
        first_value(
            &c,
            "SELECT client_addr FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        )
        .await,
        None
    );
}

/// `unix_socket_dir = @...`: Sluice listens in the abstract namespace, makes no
/// file, and serves libpq (psql) and tokio-postgres there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_listens_in_the_abstract_namespace() {
    let tmp = TempDir::new("sluice-abstract");
    let dir = format!("@{}", tmp.path().display());
    let s = md5_sluice().setting("unix_socket_dir", &dir).start();
    assert!(
        std::fs::read_dir(tmp.path()).map_or(true, |mut d| d.next().is_none()),
        "no socket file is made"
    );
    assert!(
        s.log()
            .contains(&format!("listening on unix:{dir}/.s.PGSQL.{}", s.port())),
        "{}",
        s.diagnostics()
    );

    // libpq reads a host starting with `@` as the abstract namespace.
    let mut cmd = support::psql_cmd_pw(s.port(), &dir, MD5_USER, TEST_DB, MD5_PASSWORD);
    cmd.args(["-c", "SELECT 'via-abstract'"]);
    let out = run_bounded(&mut cmd, None, T).expect("psql hung");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.diagnostics()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "via-abstract");

    // tokio-postgres over a socket connected by hand.
    let sock = support::unix_connect(std::path::Path::new(&dir), s.port()).expect("connect");
    sock.set_nonblocking(true).expect("nonblocking");
    let sock = tokio::net::UnixStream::from_std(sock).expect("register");
    let (c, conn) = s
        .login_config(MD5_USER, MD5_PASSWORD, TEST_DB)
        .connect_raw(sock, NoTls)
        .await
        .expect("login over the abstract socket");
    tokio::spawn(conn);
    assert_eq!(first_value(&c, "SELECT 1 + 1").await.as_deref(), Some("2"));
}

/// Two poolers cannot hold the same abstract name: the second fails to start, and
/// says which socket.
#[test]
fn an_abstract_socket_in_use_is_an_error() {
    let tmp = TempDir::new("sluice-abstract");
    let dir = format!("@{}", tmp.path().display());
    let a = md5_sluice().setting("unix_socket_dir", &dir).start();
    let (status, b) = md5_sluice()
        .setting("unix_socket_dir", &dir)
        .setting("listen_port", &a.port().to_string())
        .setting("listen_addr", "")
        .start_expect_failure();
    assert!(!status.success(), "{b}");
    assert!(
        b.contains(&format!("unix:{dir}/.s.PGSQL.{}", a.port())) && b.contains("in use"),
        "{b}"
    );
}

//! A server connection being opened is listed: SHOW SERVERS `new`, SOCKETS
//! `sv_login`, as PgBouncer lists its new servers. The "server" here accepts the
//! connection and never answers the startup packet, so the login stays under way
//! until the test closes it.

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use super::{builder, psql, PsqlOut};
use crate::support::{self, MD5_PASSWORD, MD5_USER};

/// SHOW `what`, until `done` holds for it or 10 s have passed.
fn show_until(s: &support::Sluice, what: &str, done: impl Fn(&PsqlOut) -> bool) -> PsqlOut {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = psql(s, &format!("SHOW {what}"));
        if done(&out) || Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_being_opened_is_listed_as_new() {
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let s = builder()
        .database("silent", &format!("host=127.0.0.1 port={port} dbname=x"))
        .setting("server_connect_timeout", "20")
        .start();
    let cfg = s.config(MD5_USER, MD5_PASSWORD, "silent");
    let client = tokio::spawn(async move { cfg.connect(tokio_postgres::NoTls).await.map(|_| ()) });
    // The startup packet arrives; no answer goes back.
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(10), silent.accept())
        .await
        .expect("Sluice connects")
        .expect("accept");
    let mut startup = [0u8; 8];
    conn.read_exact(&mut startup).await.expect("startup packet");

    let has_new = |o: &PsqlOut| o.column("state").iter().any(|st| st == "new");
    let servers = tokio::task::block_in_place(|| show_until(&s, "SERVERS", has_new));
    assert!(has_new(&servers), "{servers:?}\n{}", s.diagnostics());
    let cell = |col: &str| servers.cell("state", "new", col).unwrap_or_default();
    assert_eq!(cell("database"), "silent");
    assert_eq!(
        (cell("addr"), cell("port")),
        ("127.0.0.1".into(), port.to_string())
    );
    assert_eq!(
        (cell("remote_pid"), cell("link")),
        ("0".into(), String::new())
    );
    let id = cell("id");
    let sockets = tokio::task::block_in_place(|| psql(&s, "SHOW SOCKETS"));
    let col = |c: &str| {
        sockets
            .header
            .iter()
            .position(|h| h == c)
            .unwrap_or(usize::MAX)
    };
    let (ty, ident, state) = (col("type"), col("id"), col("state"));
    let row = sockets
        .rows
        .iter()
        .find(|r| r.get(ty).map(String::as_str) == Some("S") && r.get(ident) == Some(&id));
    assert_eq!(
        row.and_then(|r| r.get(state)).map(String::as_str),
        Some("sv_login"),
        "{sockets:?}"
    );
    let pools = tokio::task::block_in_place(|| psql(&s, "SHOW POOLS"));
    assert_eq!(
        pools.cell("database", "silent", "sv_login").as_deref(),
        Some("1")
    );

    // The server goes away: the login fails, and nothing is being opened any more.
    drop(conn);
    drop(silent);
    let res = tokio::time::timeout(Duration::from_secs(30), client)
        .await
        .expect("the client is answered")
        .expect("join");
    assert!(res.is_err(), "the login could not succeed");
    let gone = |o: &PsqlOut| o.column("state").iter().all(|st| st != "new");
    let servers = tokio::task::block_in_place(|| show_until(&s, "SERVERS", gone));
    assert!(gone(&servers), "{servers:?}");
}

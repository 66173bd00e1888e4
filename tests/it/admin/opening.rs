//! A server connection being opened is listed: SHOW SERVERS `new`, SOCKETS
//! `sv_login`, as PgBouncer lists its new servers. The "server" here accepts the
//! connection and never answers the startup packet, so the login stays under way
//! until the test closes it. Likewise a client whose login waits is listed in
//! SOCKETS as `cl_login`, as PgBouncer lists its login clients.

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use super::{builder, psql, PsqlOut};
use crate::support::raw::{startup_packet, RawConn};
use crate::support::{self, MD5_PASSWORD, MD5_USER, TEST_DB};

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

/// The SOCKETS rows in state `cl_login`, each as (user, database, addr, port, local
/// port).
fn login_rows(o: &PsqlOut) -> Vec<[String; 5]> {
    let col = |c: &str| o.header.iter().position(|h| h == c).unwrap_or(usize::MAX);
    let cols = [col("user"), col("database"), col("addr"), col("port")];
    let (state, local_port) = (col("state"), col("local_port"));
    let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
    o.rows
        .iter()
        .filter(|r| r.get(state).map(String::as_str) == Some("cl_login"))
        .map(|r| {
            [
                cell(r, cols[0]),
                cell(r, cols[1]),
                cell(r, cols[2]),
                cell(r, cols[3]),
                cell(r, local_port),
            ]
        })
        .collect()
}

#[test]
fn a_client_whose_login_waits_is_listed_as_cl_login() {
    let s = builder().start();
    // One sends nothing yet; the other names itself and is asked for a password it
    // never sends.
    let silent = RawConn::tcp(s.port());
    let mut asked = RawConn::tcp(s.port());
    let startup = startup_packet(196608, &[("user", MD5_USER), ("database", TEST_DB)]);
    asked.send(&startup).expect("startup packet");
    let request = asked.read_msg(Duration::from_secs(10)).expect("asked");
    assert_eq!(request.auth_code(), Some(5), "an MD5 password request");

    let both = |o: &PsqlOut| login_rows(o).len() == 2;
    let sockets = show_until(&s, "SOCKETS", both);
    let mut rows = login_rows(&sockets);
    rows.sort_by_key(|r| r[0].clone());
    let port = |c: &RawConn| c.local_port().map(|p| p.to_string()).unwrap_or_default();
    let sluice_port = s.port().to_string();
    assert_eq!(
        rows,
        [
            [
                "(nouser)".into(),
                "(nodb)".into(),
                "127.0.0.1".into(),
                port(&silent),
                sluice_port.clone(),
            ],
            [
                MD5_USER.into(),
                TEST_DB.into(),
                "127.0.0.1".into(),
                port(&asked),
                sluice_port,
            ],
        ],
        "{sockets:?}"
    );
    // Neither is a logged-in client, nor busy.
    let clients = psql(&s, "SHOW CLIENTS");
    assert!(
        clients.column("user").iter().all(|u| u != MD5_USER),
        "{clients:?}"
    );
    let active = psql(&s, "SHOW ACTIVE_SOCKETS");
    assert!(login_rows(&active).is_empty(), "{active:?}");

    // Gone with their logins.
    silent.close();
    asked.close();
    let none = |o: &PsqlOut| login_rows(o).is_empty();
    let sockets = show_until(&s, "SOCKETS", none);
    assert!(none(&sockets), "{sockets:?}");
}

/// A server whose reset query runs after its session-mode client left is listed as
/// `tested` (PgBouncer's `sv_tested`), not missing from the console, then `idle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_being_reset_is_listed_as_tested() {
    let s = builder()
        .setting("pool_mode", "session")
        .setting("server_reset_query", "SELECT pg_sleep(1.5)")
        .start();
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let c = support::connect(&cfg).await;
    let pid: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("query")
        .get(0);
    drop(c);

    let tested = |o: &PsqlOut| o.column("state").iter().any(|st| st == "tested");
    let servers = tokio::task::block_in_place(|| show_until(&s, "SERVERS", tested));
    assert!(tested(&servers), "{servers:?}\n{}", s.diagnostics());
    assert_eq!(
        servers.cell("state", "tested", "remote_pid"),
        Some(pid.to_string())
    );
    assert_eq!(servers.cell("state", "tested", "link"), Some(String::new()));
    let pools = tokio::task::block_in_place(|| psql(&s, "SHOW POOLS"));
    let during = |col: &str| pools.cell("database", TEST_DB, col);
    assert_eq!(
        (during("sv_tested"), during("sv_active")),
        (Some("1".into()), Some("0".into())),
        "{pools:?}"
    );
    // The reset done, it is idle in the pool.
    let idle = |o: &PsqlOut| o.column("state").iter().any(|st| st == "idle");
    let servers = tokio::task::block_in_place(|| show_until(&s, "SERVERS", idle));
    assert_eq!(
        servers.cell("state", "idle", "remote_pid"),
        Some(pid.to_string()),
        "{servers:?}"
    );
    assert!(!tested(&servers), "{servers:?}");
}

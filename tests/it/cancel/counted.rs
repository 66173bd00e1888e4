//! SHOW POOLS counts the cancel requests on their way (`cl_active_cancel_req`,
//! `sv_active_cancel`), and SHOW PEER_POOLS those passed on to a peer: the other
//! end here is a gate in front of the real PostgreSQL (or the peer), which passes
//! other connections straight through and holds a cancel request until the test
//! opens it, so the cancel stays in flight long enough to see.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Notify;
use tokio_postgres::{NoTls, SimpleQueryMessage};

use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::{self, pg, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

pub(super) const T: Duration = Duration::from_secs(30);
const CANCEL_CODE: u32 = 80_877_102;

/// Where a gate passes connections on to.
#[derive(Clone)]
pub(super) enum Behind {
    Tcp(u16),
    Unix(PathBuf),
}

/// Accepts connections for what is `behind` it: a cancel request is held until
/// `open` is notified, then delivered; anything else is relayed both ways.
pub(super) async fn gate(listener: TcpListener, behind: Behind, open: Arc<Notify>) {
    while let Ok((mut client, _)) = listener.accept().await {
        let (open, behind) = (open.clone(), behind.clone());
        tokio::spawn(async move {
            let mut head = [0u8; 8];
            if client.read_exact(&mut head).await.is_err() {
                return;
            }
            if u32::from_be_bytes([head[4], head[5], head[6], head[7]]) == CANCEL_CODE {
                open.notified().await;
            }
            match behind {
                Behind::Tcp(port) => {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await {
                        relay(client, server, &head).await;
                    }
                }
                Behind::Unix(path) => {
                    if let Ok(server) = UnixStream::connect(path).await {
                        relay(client, server, &head).await;
                    }
                }
            }
        });
    }
}

async fn relay<S>(mut client: TcpStream, mut server: S, head: &[u8])
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if server.write_all(head).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    }
}

/// SHOW POOLS' `(cl_active_cancel_req, cl_waiting_cancel_req, sv_active_cancel)` for
/// database `db`.
async fn cancel_columns(admin: &tokio_postgres::Client, db: &str) -> (String, String, String) {
    let msgs = within(T, "SHOW POOLS", admin.simple_query("SHOW POOLS"))
        .await
        .expect("SHOW POOLS");
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("database") == Some(db) => {
                let col = |c: &str| r.get(c).unwrap_or("?").to_owned();
                Some((
                    col("cl_active_cancel_req"),
                    col("cl_waiting_cancel_req"),
                    col("sv_active_cancel"),
                ))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no pool for {db}"))
}

/// The rows of SHOW `what` (CLIENTS or SERVERS) in `state`, each as its columns by
/// name.
pub(super) async fn socket_rows(
    admin: &tokio_postgres::Client,
    what: &str,
    state: &str,
) -> Vec<std::collections::HashMap<String, String>> {
    let q = format!("SHOW {what}");
    let msgs = within(T, "SHOW", admin.simple_query(&q))
        .await
        .expect("SHOW");
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("state") == Some(state) => Some(
                r.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_owned(), r.get(i).unwrap_or("").to_owned()))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// Waits for the query to end cancelled, and for the client's cancel call.
pub(super) async fn cancelled<E: std::fmt::Debug>(
    query: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    cancel: tokio::task::JoinHandle<Result<(), E>>,
) {
    let err = within(T, "the cancelled query", query)
        .await
        .expect("join")
        .expect_err("the query was cancelled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    let _ = within(T, "cancel_query", cancel).await;
}

/// What `read` returns once it equals `want`, or after 10 s.
pub(super) async fn settle<T: PartialEq, F: std::future::Future<Output = T>>(
    want: &T,
    mut read: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = read().await;
    while seen != *want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = read().await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_its_way_is_counted_in_show_pools() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let open = Arc::new(Notify::new());
    let gate_task = tokio::spawn(gate(listener, Behind::Tcp(pg().port()), open.clone()));
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .userlist(ADMIN, ADMIN_PW)
        .database(
            "gated",
            &format!("host=127.0.0.1 port={port} dbname={TEST_DB}"),
        )
        .start();
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let none = ("0".to_owned(), "0".to_owned(), "0".to_owned());

    let c = Arc::new(
        within(
            T,
            "connect",
            support::connect(&s.config(MD5_USER, MD5_PASSWORD, "gated")),
        )
        .await,
    );
    let query = {
        let c = c.clone();
        tokio::spawn(async move { c.batch_execute("SELECT pg_sleep(30)").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cancel_columns(&admin, "gated").await, none);

    let token = c.cancel_token();
    let cancel = tokio::spawn(async move { token.cancel_query(NoTls).await });
    let one = ("1".to_owned(), "0".to_owned(), "1".to_owned());
    let seen = settle(&one, || cancel_columns(&admin, "gated")).await;
    assert_eq!(seen, one, "the held cancel\n{}", s.diagnostics());
    assert!(
        !query.is_finished(),
        "the query ended before its cancel arrived"
    );

    // SHOW CLIENTS lists the request, SHOW SERVERS the connection it went on, each
    // linked to the other, naming the backend of the server it cancels.
    let reqs = socket_rows(&admin, "CLIENTS", "active_cancel_req").await;
    let conns = socket_rows(&admin, "SERVERS", "active_cancel").await;
    let busy = socket_rows(&admin, "SERVERS", "active").await;
    assert_eq!(
        (reqs.len(), conns.len(), busy.len()),
        (1, 1, 1),
        "{reqs:?} {conns:?}"
    );
    let (req, conn, busy) = (&reqs[0], &conns[0], &busy[0]);
    for row in [req, conn] {
        assert_eq!(row["database"], "gated", "{row:?}");
        assert_eq!(row["user"], MD5_USER, "{row:?}");
    }
    assert_eq!(req["link"], conn["ptr"]);
    assert_eq!(conn["link"], req["ptr"]);
    assert_eq!(conn["remote_pid"], busy["remote_pid"]);
    assert_eq!(
        (conn["addr"].as_str(), conn["port"].clone()),
        ("127.0.0.1", port.to_string())
    );
    assert_ne!(
        req["ptr"], busy["link"],
        "the request is not the client it cancels"
    );

    // Let it through: the query is cancelled, and nothing is on its way any more.
    open.notify_one();
    cancelled(query, cancel).await;
    let seen = settle(&none, || cancel_columns(&admin, "gated")).await;
    assert_eq!(seen, none, "after the cancel\n{}", s.diagnostics());
    assert!(socket_rows(&admin, "CLIENTS", "active_cancel_req")
        .await
        .is_empty());
    assert!(socket_rows(&admin, "SERVERS", "active_cancel")
        .await
        .is_empty());
    gate_task.abort();
}

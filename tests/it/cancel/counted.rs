//! SHOW POOLS counts the cancel requests on their way (`cl_active_cancel_req`,
//! `sv_active_cancel`): the server side here is a gate in front of the real
//! PostgreSQL, which passes server connections straight through and holds a cancel
//! request until the test opens it, so the cancel stays in flight long enough to see.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_postgres::{NoTls, SimpleQueryMessage};

use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::{self, pg, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

const T: Duration = Duration::from_secs(30);
const CANCEL_CODE: u32 = 80_877_102;

/// Accepts connections for PostgreSQL at `pg_port`: a cancel request is held until
/// `open` is notified, then delivered; anything else is relayed both ways.
async fn gate(listener: TcpListener, pg_port: u16, open: Arc<Notify>) {
    while let Ok((mut client, _)) = listener.accept().await {
        let open = open.clone();
        tokio::spawn(async move {
            let mut head = [0u8; 8];
            if client.read_exact(&mut head).await.is_err() {
                return;
            }
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", pg_port)).await else {
                return;
            };
            if u32::from_be_bytes([head[4], head[5], head[6], head[7]]) == CANCEL_CODE {
                open.notified().await;
            }
            if server.write_all(&head).await.is_ok() {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            }
        });
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

/// The columns once they read `want`, or as they read after 10 s.
async fn settle(
    admin: &tokio_postgres::Client,
    want: &(String, String, String),
) -> (String, String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = cancel_columns(admin, "gated").await;
    while seen != *want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = cancel_columns(admin, "gated").await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_its_way_is_counted_in_show_pools() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let open = Arc::new(Notify::new());
    let gate_task = tokio::spawn(gate(listener, pg().port(), open.clone()));
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
    let seen = settle(&admin, &one).await;
    assert_eq!(seen, one, "the held cancel\n{}", s.diagnostics());
    assert!(
        !query.is_finished(),
        "the query ended before its cancel arrived"
    );

    // Let it through: the query is cancelled, and nothing is on its way any more.
    open.notify_one();
    let err = within(T, "the cancelled query", query)
        .await
        .expect("join")
        .expect_err("the query was cancelled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    let _ = within(T, "cancel_query", cancel).await;
    let seen = settle(&admin, &none).await;
    assert_eq!(seen, none, "after the cancel\n{}", s.diagnostics());
    gate_task.abort();
}

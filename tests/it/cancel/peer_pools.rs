//! Cancel requests passed on to a peer: SHOW PEER_POOLS counts them, SHOW CLIENTS
//! and SERVERS list them, and a peer takes at most its `pool_size` at once, as
//! PgBouncer's peer pool. Two `so_reuseport` processes, A (peer 1, which issued the
//! keys) and B; a gate between B and A holds each cancel until the test opens it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::{NoTls, SimpleQueryMessage};

use super::counted::{cancelled, gate, settle, socket_rows, Behind, T};
use crate::admin::{ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::{self, Sluice, MD5_PASSWORD, MD5_USER, TEST_DB};

/// SHOW PEER_POOLS' rows, as `peer_id|cl_active_cancel_req|cl_waiting_cancel_req|
/// sv_active_cancel|sv_login`.
async fn peer_pools(admin: &tokio_postgres::Client) -> Vec<String> {
    let msgs = within(T, "SHOW PEER_POOLS", admin.simple_query("SHOW PEER_POOLS"))
        .await
        .expect("SHOW PEER_POOLS");
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("?"))
                    .collect::<Vec<_>>()
                    .join("|"),
            ),
            _ => None,
        })
        .collect()
}

/// A and B, B's console, and the gate B reaches A through.
struct Peers {
    a: Sluice,
    b: Sluice,
    b_socket: PathBuf,
    admin: tokio_postgres::Client,
    gate_port: u16,
    open: Arc<Notify>,
    gate_task: JoinHandle<()>,
}

/// Peers whose `[peers]` entry for A in B has `extra` (e.g. ` pool_size=1`).
async fn peers(extra: &str) -> Peers {
    let a = super::peered(1).start();
    let port = a.port();
    let a_socket = a.socket_dir().join(format!(".s.PGSQL.{port}"));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let gate_port = listener.local_addr().expect("addr").port();
    let open = Arc::new(Notify::new());
    let gate_task = tokio::spawn(gate(listener, Behind::Unix(a_socket), open.clone()));
    let b = super::peered(2)
        .userlist(ADMIN, ADMIN_PW)
        .setting("listen_port", &port.to_string())
        .raw_ini(&format!(
            "[peers]\n1 = host=127.0.0.1 port={gate_port}{extra}\n"
        ))
        .start();
    let b_socket = super::bound_socket(&b);
    let admin = within(
        T,
        "B's console",
        support::connect(&b.socket_config(ADMIN, ADMIN_PW, "pgbouncer")),
    )
    .await;
    Peers {
        a,
        b,
        b_socket,
        admin,
        gate_port,
        open,
        gate_task,
    }
}

type Handles<E> = (
    JoinHandle<Result<(), tokio_postgres::Error>>,
    JoinHandle<Result<(), E>>,
);

/// A client of A running a long query, and its cancel sent to B (which passes it on
/// through the gate).
async fn cancel_through_b(p: &Peers) -> Handles<tokio_postgres::Error> {
    let c = Arc::new(
        within(
            T,
            "connect",
            support::connect(&p.a.socket_config(MD5_USER, MD5_PASSWORD, TEST_DB)),
        )
        .await,
    );
    let query = {
        let c = c.clone();
        tokio::spawn(async move { c.batch_execute("SELECT pg_sleep(30)").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let to_b = within(T, "connect to B", UnixStream::connect(&p.b_socket))
        .await
        .expect("B's socket");
    let token = c.cancel_token();
    let cancel = tokio::spawn(async move { token.cancel_query_raw(to_b, NoTls).await });
    (query, cancel)
}

/// A cancel passed on to a peer is counted in B's SHOW PEER_POOLS while on its way,
/// listed in its CLIENTS and SERVERS, and the peer's row stays afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_passed_to_a_peer_is_counted_in_show_peer_pools() {
    let p = peers("").await;
    assert!(peer_pools(&p.admin).await.is_empty());
    let (query, cancel) = cancel_through_b(&p).await;
    let held = vec!["1|1|0|1|0".to_owned()];
    let seen = settle(&held, || peer_pools(&p.admin)).await;
    assert_eq!(seen, held, "B:\n{}", p.b.diagnostics());
    // B lists the request and its connection to the peer, with no pool's names.
    let reqs = socket_rows(&p.admin, "CLIENTS", "active_cancel_req").await;
    let conns = socket_rows(&p.admin, "SERVERS", "active_cancel").await;
    assert_eq!((reqs.len(), conns.len()), (1, 1), "{reqs:?} {conns:?}");
    for row in [&reqs[0], &conns[0]] {
        assert_eq!(
            (row["database"].as_str(), row["user"].as_str()),
            ("(nodb)", "(nouser)")
        );
    }
    assert_eq!(conns[0]["port"], p.gate_port.to_string());
    assert_eq!(reqs[0]["link"], conns[0]["ptr"]);

    p.open.notify_one();
    cancelled(query, cancel).await;
    let after = vec!["1|0|0|0|0".to_owned()];
    let seen = settle(&after, || peer_pools(&p.admin)).await;
    assert_eq!(seen, after, "B:\n{}", p.b.diagnostics());
    p.gate_task.abort();
}

/// With `pool_size=1` for the peer, a second cancel waits for the first to be done
/// (`cl_waiting_cancel_req`, `waiting_cancel_req`), then goes: both queries end
/// cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_takes_at_most_its_pool_size_of_cancels_at_once() {
    let p = peers(" pool_size=1").await;
    let (q1, c1) = cancel_through_b(&p).await;
    let one = vec!["1|1|0|1|0".to_owned()];
    let seen = settle(&one, || peer_pools(&p.admin)).await;
    assert_eq!(seen, one, "B:\n{}", p.b.diagnostics());
    let (q2, c2) = cancel_through_b(&p).await;
    let queued = vec!["1|1|1|1|0".to_owned()];
    let seen = settle(&queued, || peer_pools(&p.admin)).await;
    assert_eq!(seen, queued, "the second waits\nB:\n{}", p.b.diagnostics());
    let waiting = socket_rows(&p.admin, "CLIENTS", "waiting_cancel_req").await;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0]["link"], "", "not on a connection yet");
    // Only the first has a connection to the peer.
    let conns = socket_rows(&p.admin, "SERVERS", "active_cancel").await;
    let new = socket_rows(&p.admin, "SERVERS", "new").await;
    assert_eq!((conns.len(), new.len()), (1, 0), "{conns:?} {new:?}");

    // The first goes through; the second takes its slot and is held in turn.
    p.open.notify_one();
    cancelled(q1, c1).await;
    let seen = settle(&one, || peer_pools(&p.admin)).await;
    assert_eq!(seen, one, "the second's turn\nB:\n{}", p.b.diagnostics());
    assert!(!q2.is_finished(), "the second cancel went before its turn");
    p.open.notify_one();
    cancelled(q2, c2).await;
    let after = vec!["1|0|0|0|0".to_owned()];
    let seen = settle(&after, || peer_pools(&p.admin)).await;
    assert_eq!(seen, after, "B:\n{}", p.b.diagnostics());
    p.gate_task.abort();
}

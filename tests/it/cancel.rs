//! Query cancellation through Sluice (session mode): a client's cancel key, sent to
//! Sluice over TCP or the unix socket, cancels that client's running query and
//! nobody else's; unknown keys are ignored.

mod counted;
mod peer_pools;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::probe::within;
use crate::support::wire::{self, RawClient};
use crate::support::{self, Sluice, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};
use tokio_postgres::NoTls;

const T: Duration = Duration::from_secs(30);

fn start_sluice() -> Sluice {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .start()
}

async fn connect(cfg: &tokio_postgres::Config) -> Arc<tokio_postgres::Client> {
    Arc::new(within(T, "connect", support::connect(cfg)).await)
}

/// Starts `sql` on `c` in a task; returns the task after letting the query begin.
async fn start_query(
    c: &Arc<tokio_postgres::Client>,
    sql: &'static str,
) -> tokio::task::JoinHandle<Result<(), tokio_postgres::Error>> {
    let c = c.clone();
    let h = tokio::spawn(async move { c.batch_execute(sql).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    h
}

/// Waits for a query task and returns its SQLSTATE ("ok" on success).
async fn outcome(
    h: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    limit: Duration,
) -> String {
    match within(limit, "query outcome", h).await.expect("query task") {
        Ok(()) => "ok".into(),
        Err(e) => e
            .code()
            .map(|c| c.code().to_owned())
            .unwrap_or_else(|| format!("error without SQLSTATE: {e}")),
    }
}

async fn cancel_and_check(c: &Arc<tokio_postgres::Client>) {
    let h = start_query(c, "SELECT pg_sleep(30)").await;
    let started = Instant::now();
    within(T, "cancel_query", c.cancel_token().cancel_query(NoTls))
        .await
        .expect("send cancel");
    assert_eq!(outcome(h, Duration::from_secs(10)).await, "57014");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        started.elapsed()
    );
    // The session goes on.
    let row = within(T, "after cancel", c.query_one("SELECT 1::int4", &[]))
        .await
        .expect("query after cancel");
    assert_eq!(row.get::<_, i32>(0), 1);
}

#[tokio::test]
async fn cancel_over_tcp() {
    let s = start_sluice();
    let c = connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)).await;
    cancel_and_check(&c).await;
    // And a second time on the same session.
    cancel_and_check(&c).await;
}

#[tokio::test]
async fn cancel_over_unix_socket() {
    let s = start_sluice();
    let c = connect(&s.socket_config(MD5_USER, MD5_PASSWORD, TEST_DB)).await;
    cancel_and_check(&c).await;

    // A hand-made CancelRequest over the socket, for a raw TCP client.
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    raw.query("SELECT pg_sleep(30)").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    wire::send_cancel_unix(s.socket_dir(), s.port(), raw.pid, raw.key).await;
    let msgs = raw.until_ready(Duration::from_secs(10)).await;
    let err = wire::first_error(&msgs).expect("an error");
    assert_eq!(err.field(b'C').as_deref(), Some("57014"), "{msgs:?}");
}

#[tokio::test]
async fn unknown_cancel_keys_are_ignored() {
    let s = start_sluice();
    let c = connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)).await;
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");

    let h = start_query(&c, "SELECT pg_sleep(2)").await;
    raw.query("SELECT pg_sleep(2)").await.unwrap();
    // Random keys, and the raw client's pid with a wrong key.
    for (pid, key) in [
        (rand::random::<u32>() & 0x7fff_ffff, rand::random::<u32>()),
        (1, 1),
        (raw.pid, raw.key ^ 1),
        (raw.pid ^ 1, raw.key),
    ] {
        within(
            T,
            "send unknown cancel",
            wire::send_cancel_tcp(s.port(), pid, key),
        )
        .await;
    }
    assert_eq!(outcome(h, Duration::from_secs(10)).await, "ok");
    let msgs = raw.until_ready(Duration::from_secs(10)).await;
    assert!(wire::first_error(&msgs).is_none(), "{msgs:?}");
    // Both still work.
    within(T, "after", c.batch_execute("SELECT 1"))
        .await
        .unwrap();
    let msgs = raw.simple("SELECT 1", T).await;
    assert!(wire::first_error(&msgs).is_none(), "{msgs:?}");
}

#[tokio::test]
async fn cancel_hits_only_its_own_client() {
    let s = start_sluice();
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let a = connect(&cfg).await;
    let b = connect(&cfg).await;
    let ha = start_query(&a, "SELECT pg_sleep(30)").await;
    let hb = start_query(&b, "SELECT pg_sleep(2)").await;
    within(T, "cancel a", a.cancel_token().cancel_query(NoTls))
        .await
        .expect("send cancel");
    assert_eq!(outcome(ha, Duration::from_secs(10)).await, "57014");
    assert_eq!(outcome(hb, Duration::from_secs(10)).await, "ok");
    // PgBouncer's lines: the request's client, and the connection it went on.
    let sent = "closing because: successfully sent cancel request (age=";
    let request = "(nodb)/(nouser)@127.0.0.1:";
    let onwards = format!("{TEST_DB}/{MD5_USER}@127.0.0.1:{}", support::pg().port());
    let logged = |want: &[&str]| s.log().lines().any(|l| want.iter().all(|w| l.contains(w)));
    assert!(
        support::wait_until(Duration::from_secs(5), || {
            logged(&[" LOG C-", request, sent])
                && logged(&[" LOG S-", &onwards, "new connection to server"])
                && logged(&[" LOG S-", &onwards, sent])
        }),
        "{}",
        s.diagnostics()
    );
}

#[tokio::test]
async fn stale_and_idle_cancels_are_harmless() {
    let s = start_sluice();
    let cfg = s.config(MD5_USER, MD5_PASSWORD, TEST_DB);
    let a = connect(&cfg).await;
    // Cancel while idle: nothing to cancel; the next query is unaffected.
    within(T, "idle cancel", a.cancel_token().cancel_query(NoTls))
        .await
        .expect("send cancel");
    tokio::time::sleep(Duration::from_millis(300)).await;
    within(
        T,
        "after idle cancel",
        a.batch_execute("SELECT pg_sleep(0.5)"),
    )
    .await
    .expect("query after an idle-time cancel");

    // A departed client's key cancels nothing, even if its server was reused.
    let gone = connect(&cfg).await;
    within(T, "gone query", gone.batch_execute("SELECT 1"))
        .await
        .unwrap();
    let token = gone.cancel_token();
    drop(gone);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = connect(&cfg).await;
    let h = start_query(&c, "SELECT pg_sleep(2)").await;
    within(T, "stale cancel", token.cancel_query(NoTls))
        .await
        .expect("send stale cancel");
    assert_eq!(outcome(h, Duration::from_secs(10)).await, "ok");
    // Each request's closing line says why nothing was cancelled.
    for why in ["cancel request for idle client", "failed cancel request"] {
        let line = "(nodb)/(nouser)@127.0.0.1:";
        assert!(
            support::wait_until(Duration::from_secs(5), || {
                s.log()
                    .lines()
                    .any(|l| l.contains(line) && l.contains(&format!("closing because: {why}")))
            }),
            "{why}\n{}",
            s.diagnostics()
        );
    }
}

#[tokio::test]
async fn cancel_reaches_a_server_behind_a_unix_socket() {
    // Sluice talks to PostgreSQL over its unix socket: the forwarded cancel must too.
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .database(
            "sockdb",
            &format!("host=@PG_SOCKET_DIR@ port=@PG_PORT@ dbname={TEST_DB}"),
        )
        .start();
    let c = connect(&s.config(MD5_USER, MD5_PASSWORD, "sockdb")).await;
    cancel_and_check(&c).await;
}

/// A server named by a host name: the cancel goes to the address the server
/// connection reached (a name may have several addresses, and its lookup change).
#[tokio::test]
async fn cancel_reaches_a_server_named_by_host_name() {
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("dns_max_ttl", "0")
        .database(
            "namedb",
            &format!("host=localhost port=@PG_PORT@ dbname={TEST_DB}"),
        )
        .start();
    let c = connect(&s.config(MD5_USER, MD5_PASSWORD, "namedb")).await;
    cancel_and_check(&c).await;
}

/// The unix socket of `s`, once it is there.
fn bound_socket(s: &Sluice) -> std::path::PathBuf {
    let path = s.socket_dir().join(format!(".s.PGSQL.{}", s.port()));
    assert!(
        support::wait_until(Duration::from_secs(10), || path.exists()),
        "never bound\n{}",
        s.diagnostics()
    );
    path
}

/// A Sluice sharing its port (`so_reuseport`) as peer `id`.
fn peered(id: u16) -> SluiceBuilder {
    SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("so_reuseport", "1")
        .setting("peer_id", &id.to_string())
}

/// Two processes on one port (`so_reuseport`), peered: a cancel that reaches the
/// process which did not issue the key is passed on to the one that did.
#[tokio::test]
async fn a_peer_passes_on_a_cancel_for_the_process_that_issued_the_key() {
    let a = peered(1).start();
    let port = a.port();
    let b = peered(2)
        .setting("listen_port", &port.to_string())
        .raw_ini(&format!(
            "[peers]\n1 = host={} port={port}\n2 = host={} port={port}\n",
            a.socket_dir().display(),
            "/nonexistent"
        ))
        .start();
    let b_socket = bound_socket(&b);
    // The client is A's (through A's own socket); its cancel goes to B's.
    let c = connect(&a.socket_config(MD5_USER, MD5_PASSWORD, TEST_DB)).await;
    let h = start_query(&c, "SELECT pg_sleep(30)").await;
    let to_b = within(
        T,
        "connect to B",
        tokio::net::UnixStream::connect(&b_socket),
    )
    .await
    .expect("B's socket");
    within(
        T,
        "cancel via B",
        c.cancel_token().cancel_query_raw(to_b, NoTls),
    )
    .await
    .expect("send cancel");
    assert_eq!(
        outcome(h, Duration::from_secs(10)).await,
        "57014",
        "A:\n{}\nB:\n{}",
        a.diagnostics(),
        b.diagnostics()
    );
}

/// A key laid out as PgBouncer 1.21 lays out a peer's (the peer id in the pid's
/// second and third bytes, low byte first; hops in the key's two low bits) is read
/// the same way: one for a peer with no `[peers]` entry, and one with no hops left,
/// end with PgBouncer's lines and disturb no one.
#[tokio::test]
async fn cancels_for_unknown_peers_and_spent_keys_get_pgbouncers_lines() {
    let s = peered(2).start();
    // Peer 0x0107 (263): bytes 0x01 0x07 0x01 0x00 ...; 3 hops left.
    let pid = u32::from_be_bytes([0x01, 0x07, 0x01, 0x00]);
    within(
        T,
        "unknown peer",
        wire::send_cancel_tcp(s.port(), pid, 0x55aa_0003),
    )
    .await;
    // The same with no hops left.
    within(
        T,
        "spent",
        wire::send_cancel_tcp(s.port(), pid, 0x55aa_0000),
    )
    .await;
    for why in [
        "could not find peer to forward request to",
        "failed to forward cancel request because its TTL was exhausted",
    ] {
        assert!(
            support::wait_until(Duration::from_secs(5), || s
                .log()
                .contains(&format!("closing because: {why}"))),
            "{why}\n{}",
            s.diagnostics()
        );
    }
    let c = connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)).await;
    within(T, "after", c.batch_execute("SELECT 1"))
        .await
        .expect("a query after");
}

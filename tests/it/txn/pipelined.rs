//! Requests of two clients in flight on one server (`pool/pipeline.rs`): a one-
//! `SELECT` request first in line is written behind the one a server was just handed,
//! and the server's answers are split between the two clients. Each client gets its
//! own answers whatever the first one's answer is (big, a ParameterStatus, a
//! transaction of several requests around), the second is not failed when the first
//! client vanishes (cancels: `pipelined_cancel.rs`). Requests of the extended
//! protocol go behind others too when they parse what they run.
//!
//! The cases that need a request written behind another count how many were
//! (`sluice_pipelined_requests_total` on `/metrics`) and set the scene again until
//! one was: whether one goes depends on how quick the first client's last answer was.
//! Delegates, and so this, run on one event loop only: with `SLUICE_WORKERS` above 1
//! the answers are still checked, the count is not.

use std::io::{Read, Write};
use std::time::Duration;

use super::common::*;
use crate::admin::{psql_ok, ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::wire::{first_column, first_error, frame, query_msg};
use crate::support::{free_port, Sluice, MD5_PASSWORD, MD5_USER};
use tokio_postgres::Client;

/// How the holder ends its transaction: a COMMIT that another client's request may
/// not go behind (`pipelined_end.rs`), so that the scenes here count only their own.
pub(super) const HOLDER_COMMIT: &str = "COMMIT /* none behind it */";

/// Delegates run (one event loop): requests can go behind others.
pub(super) fn one_loop() -> bool {
    std::env::var("SLUICE_WORKERS").map_or(true, |w| w == "0" || w == "1")
}

/// Requests written behind others so far, from `/metrics` on `port`.
pub(super) fn pipelined(port: u16) -> u64 {
    counter(port, "sluice_pipelined_requests_total")
}

/// The sum of counter `name` over its labels, from `/metrics` on `port`.
pub(super) fn counter(port: u16, name: &str) -> u64 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("scrape");
    let mut out = String::new();
    s.read_to_string(&mut out).ok();
    out.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|l| l.starts_with('{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

pub(super) fn sluice(db: &str, mport: u16) -> Sluice {
    sluice_with(db, mport, true)
}

/// As [`sluice`]; without `hold_begin`, a client's plain `BEGIN` always goes to a
/// server (`SLUICE_HOLD_BEGIN=0`), so that it may go behind another's `COMMIT`.
pub(super) fn sluice_with(db: &str, mport: u16, hold_begin: bool) -> Sluice {
    let b = txn_sluice(db)
        .userlist(ADMIN, ADMIN_PW)
        .setting("default_pool_size", "1")
        .setting("metrics_listen", &format!("127.0.0.1:{mport}"));
    if hold_begin {
        b
    } else {
        b.env("SLUICE_HOLD_BEGIN", "0")
    }
    .start()
}

/// The first column of the first row up to the next ReadyForQuery, or the error's
/// SQLSTATE as `error CODE`.
pub(super) async fn answer(c: &mut RawClient) -> String {
    let msgs = c.until_ready(Duration::from_secs(20)).await;
    if let Some(e) = first_error(&msgs) {
        return format!("error {}", e.field(b'C').unwrap_or_default());
    }
    let first = first_column(&msgs).into_iter().next().flatten();
    first.unwrap_or_else(|| panic!("no row in {msgs:?}"))
}

/// A client whose requests wait in line and are answered quickly: its next request
/// may have another written behind it. `holder` holds the one server in a
/// transaction meanwhile.
pub(super) async fn quick_client(s: &Sluice, db: &str, holder: &Client) -> RawClient {
    let mut a = raw(s, db, &[]).await;
    for _ in 0..3 {
        within(STEP, "BEGIN", holder.batch_execute("BEGIN"))
            .await
            .expect("BEGIN");
        a.send(&query_msg("SELECT 'warm'")).await.expect("send");
        tokio::time::sleep(Duration::from_millis(30)).await;
        within(STEP, "COMMIT", holder.batch_execute(HOLDER_COMMIT))
            .await
            .expect("COMMIT");
        assert_eq!(answer(&mut a).await, "warm");
    }
    a
}

/// `a` (quick) and then `b` wait in line for the one server, which `holder` holds;
/// then `holder` lets it go: `b`'s request may be written behind `a`'s.
async fn line_up(holder: &Client, a: &mut RawClient, a_sql: &str, b: &mut RawClient, b_sql: &str) {
    line_up_bytes(holder, a, &query_msg(a_sql), b, &query_msg(b_sql)).await
}

/// As [`line_up`], with the requests' bytes.
pub(super) async fn line_up_bytes(
    holder: &Client,
    a: &mut RawClient,
    a_req: &[u8],
    b: &mut RawClient,
    b_req: &[u8],
) {
    within(STEP, "BEGIN", holder.batch_execute("BEGIN"))
        .await
        .expect("BEGIN");
    a.send(a_req).await.expect("send a");
    tokio::time::sleep(Duration::from_millis(30)).await;
    b.send(b_req).await.expect("send b");
    tokio::time::sleep(Duration::from_millis(30)).await;
    within(STEP, "COMMIT", holder.batch_execute(HOLDER_COMMIT))
        .await
        .expect("COMMIT");
}

/// A Sluice with one server, its `/metrics` port, and a client of its own
/// (`holder`) that holds the server in a transaction while others line up.
pub(super) struct Scene {
    pub(super) db: String,
    pub(super) mport: u16,
    pub(super) s: Sluice,
    pub(super) holder: Client,
}

impl Scene {
    pub(super) async fn new(prefix: &str) -> Scene {
        let db = fresh_db(prefix);
        let mport = free_port();
        let s = sluice(&db, mport);
        let holder = client(&s, &db).await;
        Scene {
            db,
            mport,
            s,
            holder,
        }
    }

    pub(super) fn pipelined(&self) -> u64 {
        pipelined(self.mport)
    }

    /// A quick client and another in line behind it, with these requests, the one
    /// server let go; and the count of requests written behind others before.
    pub(super) async fn pair(&self, a_sql: &str, b_sql: &str) -> (RawClient, RawClient, u64) {
        let before = self.pipelined();
        let mut a = quick_client(&self.s, &self.db, &self.holder).await;
        let mut b = raw(&self.s, &self.db, &[]).await;
        line_up(&self.holder, &mut a, a_sql, &mut b, b_sql).await;
        (a, b, before)
    }
}

#[tokio::test]
async fn every_client_gets_its_own_answers_from_a_shared_server() {
    let db = fresh_db("txn_pipe_own");
    let mport = free_port();
    let s = sluice(&db, mport);
    let mut tasks = Vec::new();
    for k in 0..16u32 {
        let (port, db) = (s.port(), db.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = RawClient::login(port, MD5_USER, MD5_PASSWORD, &db, &[])
                .await
                .expect("login");
            for i in 0..120u32 {
                let tag = format!("{k}-{i}");
                // Between plain one-SELECT requests (those that go behind others):
                // an answer bigger than a delegate gathers, one with a ParameterStatus,
                // a transaction of three requests, and an error.
                let (sql, want) = match i % 10 {
                    3 => (format!("SELECT '{tag}' || repeat('x', 60000)"), None),
                    5 => (
                        format!("SELECT set_config('application_name', '{tag}', false)"),
                        Some(tag.clone()),
                    ),
                    7 => {
                        for q in ["BEGIN", &format!("SELECT '{tag}'"), "COMMIT"] {
                            c.send(&query_msg(q)).await.expect("send");
                            let msgs = c.until_ready(Duration::from_secs(20)).await;
                            assert!(first_error(&msgs).is_none(), "{q}: {msgs:?}");
                        }
                        continue;
                    }
                    9 => (
                        format!("SELECT 1/0, '{tag}'"),
                        Some("error 22012".to_owned()),
                    ),
                    _ => (format!("SELECT '{tag}'"), Some(tag.clone())),
                };
                // Half the clients send the extended protocol's run instead.
                let req = if k % 2 == 1 {
                    ext(&sql)
                } else {
                    query_msg(&sql)
                };
                c.send(&req).await.expect("send");
                let got = answer(&mut c).await;
                match want {
                    Some(w) => assert_eq!(got, w, "client {k}, request {i}"),
                    None => assert!(
                        got.starts_with(&format!("{tag}x")) && got.len() == tag.len() + 60000,
                        "client {k}, request {i}: {} bytes",
                        got.len()
                    ),
                }
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(120), "a client's requests", t)
            .await
            .expect("client task");
    }
    if one_loop() {
        assert!(pipelined(mport) > 0, "no request went behind another");
    }
}

#[tokio::test]
async fn the_request_behind_survives_the_first_client_vanishing() {
    let sc = Scene::new("txn_pipe_gone").await;
    for round in 0..10 {
        let (a, mut b, before) = sc.pair("SELECT pg_sleep(0.3), 'a'", "SELECT 'b'").await;
        // The first client leaves while its query runs.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(a);
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        // The server is still good for the next client.
        assert_eq!(one(&sc.holder, "SELECT 'next'").await, "next");
        if !one_loop() || sc.pipelined() > before {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

#[tokio::test]
async fn a_request_sent_while_the_first_runs_waits_for_the_next_server() {
    let sc = Scene::new("txn_pipe_more").await;
    for round in 0..10 {
        let (mut a, mut b, before) = sc.pair("SELECT 'a', pg_sleep(0.3)", "SELECT 'b'").await;
        // While its first request runs with another written behind it, the first
        // client sends a second: it must not reach the server behind the other
        // client's, whose answer would then be followed by this one's.
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.send(&query_msg("SELECT 'a2'")).await.expect("send");
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        assert_eq!(answer(&mut a).await, "a2", "round {round}");
        assert_eq!(one(&sc.holder, "SELECT 'next'").await, "next");
        if !one_loop() || sc.pipelined() > before {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

#[tokio::test]
async fn nothing_goes_behind_a_client_whose_last_query_was_slow() {
    if !one_loop() {
        return;
    }
    let sc = Scene::new("txn_pipe_slow").await;
    // A quick client whose last answer, handed over in line, took 50 ms.
    let mut a = quick_client(&sc.s, &sc.db, &sc.holder).await;
    let mut none = raw(&sc.s, &sc.db, &[]).await;
    line_up(
        &sc.holder,
        &mut a,
        "SELECT 'slow', pg_sleep(0.05)",
        &mut none,
        "SELECT 1",
    )
    .await;
    assert_eq!(answer(&mut a).await, "slow");
    assert_eq!(answer(&mut none).await, "1");
    let before = sc.pipelined();
    let mut b = raw(&sc.s, &sc.db, &[]).await;
    line_up(
        &sc.holder,
        &mut a,
        "SELECT 'a', pg_sleep(0.3)",
        &mut b,
        "SELECT 'b'",
    )
    .await;
    assert_eq!(answer(&mut a).await, "a");
    assert_eq!(answer(&mut b).await, "b");
    assert_eq!(
        sc.pipelined(),
        before,
        "a request went behind a slow client's"
    );
}

#[tokio::test]
async fn the_request_behind_goes_to_another_server_when_its_server_dies() {
    let sc = Scene::new("txn_pipe_dies").await;
    for round in 0..10 {
        let server_pid = backend_pid(&sc.holder).await;
        let (mut a, mut b, before) = sc
            .pair("SELECT pg_sleep(1), 'a'", "SELECT 'b', pg_backend_pid()")
            .await;
        // (A second for the kill to land while the first query runs: psql may take
        // a few hundred ms to start on a loaded machine.)
        tokio::time::sleep(Duration::from_millis(100)).await;
        let behind = sc.pipelined() > before;
        direct(
            &sc.db,
            &format!("SELECT pg_terminate_backend({server_pid})"),
        );
        // The first client's query ran there and fails; the second client's had not
        // begun, and is written again to the next server, none of its answer having
        // come: a kill harms only the client whose query it ends.
        let got = a.until_closed(Duration::from_secs(10)).await;
        assert!(first_error(&got).is_some(), "round {round}: {got:?}");
        let msgs = b.until_ready(Duration::from_secs(20)).await;
        assert!(first_error(&msgs).is_none(), "round {round}: {msgs:?}");
        let row = msgs.iter().find(|m| m.tag == b'D').expect("a row");
        let cols = row.columns();
        assert_eq!(cols[0].as_deref(), Some("b"), "round {round}");
        let pid: i32 = cols[1].as_deref().unwrap_or("0").parse().expect("pid");
        assert_ne!(
            pid, server_pid,
            "round {round}: answered by the killed backend"
        );
        if behind || !one_loop() {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

#[tokio::test]
async fn a_parameter_changed_under_the_request_behind_fails_it_rather_than_answer_wrongly() {
    let sc = Scene::new("txn_pipe_param").await;
    // A function that changes a reported parameter for the rest of the session: a
    // request naming `set_config` never has another written behind it, this one can.
    direct(
        &sc.db,
        "CREATE FUNCTION to_tokyo() RETURNS text LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM set_config('TimeZone', 'Asia/Tokyo', false); RETURN 'a'; END $$",
    );
    // The second client asks for the server's own TimeZone, so that its request may
    // be written behind another's.
    let tz = direct(&sc.db, "SHOW TimeZone").trim().to_owned();
    for round in 0..10 {
        let before = sc.pipelined();
        let mut a = quick_client(&sc.s, &sc.db, &sc.holder).await;
        let mut b = raw(&sc.s, &sc.db, &[("TimeZone", &tz)]).await;
        let b_sql = "SELECT current_setting('TimeZone')";
        line_up(
            &sc.holder,
            &mut a,
            "SELECT to_tokyo(), pg_sleep(0.1)",
            &mut b,
            b_sql,
        )
        .await;
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        if sc.pipelined() == before {
            // In line: the server's TimeZone is set back to this client's first.
            assert_eq!(answer(&mut b).await, tz, "round {round}");
            if !one_loop() {
                return;
            }
            continue;
        }
        // It ran with the other client's TimeZone: not an answer to give it.
        let got = b.until_closed(Duration::from_secs(10)).await;
        assert!(first_column(&got).is_empty(), "round {round}: {got:?}");
        assert!(first_error(&got).is_some(), "round {round}: {got:?}");
        return;
    }
    panic!("no request went behind another in 10 rounds");
}

/// An extended-protocol run of `sql`: Parse of the unnamed statement, Bind, Describe,
/// Execute, Sync (what pgbench's `-M extended` and most drivers' parameter queries send).
fn ext(sql: &str) -> Vec<u8> {
    [extended(sql), sync_msg()].concat()
}

#[tokio::test]
async fn extended_protocol_requests_go_behind_others_and_get_their_own_answers() {
    let sc = Scene::new("txn_pipe_ext").await;
    for round in 0..10 {
        let before = sc.pipelined();
        let mut a = quick_client(&sc.s, &sc.db, &sc.holder).await;
        let mut b = raw(&sc.s, &sc.db, &[]).await;
        // The first one fails: its error is its own, and the one behind still runs.
        let (a_req, b_req) = (ext("SELECT 1/0, 'a'"), ext("SELECT 'b'"));
        line_up_bytes(&sc.holder, &mut a, &a_req, &mut b, &b_req).await;
        assert_eq!(answer(&mut a).await, "error 22012", "round {round}");
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        // Both clients and the server go on as usual.
        a.send(&ext("SELECT 'a2'")).await.expect("send");
        assert_eq!(answer(&mut a).await, "a2", "round {round}");
        assert_eq!(one(&sc.holder, "SELECT 'next'").await, "next");
        if sc.pipelined() > before || !one_loop() {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

#[tokio::test]
async fn a_request_binding_a_statement_parsed_before_waits_in_line() {
    if !one_loop() {
        return;
    }
    let sc = Scene::new("txn_pipe_bind").await;
    // Bind, Describe, Execute of the unnamed statement, parsed in an earlier request:
    // behind another's request it would run the statement that one parsed.
    let bind_only = [
        frame(b'B', &[0u8; 8]),
        frame(b'D', b"P\0"),
        frame(b'E', &[0u8; 5]),
        sync_msg(),
    ]
    .concat();
    let parse_only = [frame(b'P', b"\0SELECT 'b'\0\0\0"), sync_msg()].concat();
    for round in 0..10 {
        let before = sc.pipelined();
        let mut a = quick_client(&sc.s, &sc.db, &sc.holder).await;
        let mut b = raw(&sc.s, &sc.db, &[]).await;
        b.send(&parse_only).await.expect("send");
        let parsed = b.until_ready(STEP).await;
        assert!(first_error(&parsed).is_none(), "{parsed:?}");
        line_up_bytes(&sc.holder, &mut a, &ext("SELECT 'a'"), &mut b, &bind_only).await;
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        // (Which statement it runs is not the pooler's to know in transaction
        // pooling: the server's unnamed one, whoever parsed it.)
        b.until_ready(STEP).await;
        assert_eq!(sc.pipelined(), before, "round {round}: went behind another");
        // The same scene with a request that parses its own does go behind.
        let mut a = quick_client(&sc.s, &sc.db, &sc.holder).await;
        let mut b = raw(&sc.s, &sc.db, &[]).await;
        line_up_bytes(
            &sc.holder,
            &mut a,
            &ext("SELECT 'a'"),
            &mut b,
            &ext("SELECT 'b'"),
        )
        .await;
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        if sc.pipelined() > before {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

#[tokio::test]
async fn killing_the_first_client_does_not_fail_the_request_behind() {
    if !one_loop() {
        return;
    }
    let sc = Scene::new("txn_pipe_kill").await;
    for round in 0..10 {
        let before = sc.pipelined();
        // (A second for two psql runs to find and kill the first client while its
        // query runs.)
        let (mut a, mut b, _) = sc.pair("SELECT 'a', pg_sleep(1)", "SELECT 'b'").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if sc.pipelined() == before {
            assert_eq!(answer(&mut a).await, "a", "round {round}");
            assert_eq!(answer(&mut b).await, "b", "round {round}");
            continue;
        }
        // KILL_CLIENT ends the first client's session while its query runs, and
        // closes its server as for any linked client (PgBouncer's KILL_CLIENT): the
        // request behind, none of whose answer came, runs on the next server.
        let clients = psql_ok(&sc.s, "SHOW CLIENTS");
        let col = |c: &str| clients.header.iter().position(|h| h == c);
        let (Some(d), Some(l), Some(i)) = (col("database"), col("link"), col("id")) else {
            panic!("SHOW CLIENTS columns: {:?}", clients.header);
        };
        // The first client is the one linked to the server (the second is linked
        // when its turn comes, the holder between its transactions is not).
        let linked: Vec<_> = clients
            .rows
            .iter()
            .filter(|r| r[d] == sc.db && !r[l].is_empty())
            .collect();
        let [first] = linked[..] else {
            panic!("round {round}: {clients:?}");
        };
        psql_ok(&sc.s, &format!("KILL_CLIENT {}", first[i]));
        let told = a.until_closed(Duration::from_secs(10)).await;
        assert!(first_error(&told).is_some(), "round {round}: {told:?}");
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        assert_eq!(one(&sc.holder, "SELECT 'next'").await, "next");
        return;
    }
    panic!("no request went behind another in 10 rounds");
}

/// Three quick clients in line for the one server, `holder` holding it; then let go:
/// `b`'s request may go behind `a`'s, and `c`'s behind `b`'s. The count before.
async fn three(sc: &Scene, sql: [&str; 3]) -> ([RawClient; 3], u64) {
    let before = sc.pipelined();
    let mut a = quick_client(&sc.s, &sc.db, &sc.holder).await;
    let mut b = quick_client(&sc.s, &sc.db, &sc.holder).await;
    let mut c = quick_client(&sc.s, &sc.db, &sc.holder).await;
    within(STEP, "BEGIN", sc.holder.batch_execute("BEGIN"))
        .await
        .expect("BEGIN");
    for (x, q) in [(&mut a, sql[0]), (&mut b, sql[1]), (&mut c, sql[2])] {
        x.send(&query_msg(q)).await.expect("send");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    within(STEP, "COMMIT", sc.holder.batch_execute(HOLDER_COMMIT))
        .await
        .expect("COMMIT");
    ([a, b, c], before)
}

#[tokio::test]
async fn three_clients_requests_in_flight_on_one_server_each_get_their_own() {
    let sc = Scene::new("txn_pipe_three").await;
    for round in 0..10 {
        let sql = ["SELECT 'a', pg_sleep(0.2)", "SELECT 'b'", "SELECT 'c'"];
        let ([mut a, mut b, mut c], before) = three(&sc, sql).await;
        // Both written behind the first while it runs.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let behind = sc.pipelined() - before;
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        assert_eq!(answer(&mut c).await, "c", "round {round}");
        if !one_loop() || behind >= 2 {
            return;
        }
    }
    panic!("never two requests behind another in 10 rounds");
}

#[tokio::test]
async fn the_middle_client_vanishing_fails_nobody_and_keeps_the_server() {
    if !one_loop() {
        return;
    }
    let sc = Scene::new("txn_pipe_middle").await;
    let pid = one(&sc.holder, "SELECT pg_backend_pid()::text").await;
    for round in 0..10 {
        let sql = [
            "SELECT 'a', pg_sleep(0.3)",
            "SELECT 'b'",
            "SELECT pg_backend_pid()::text",
        ];
        let ([mut a, b, mut c], before) = three(&sc, sql).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let behind = sc.pipelined() - before;
        // The second client leaves while its request waits behind the first's: its
        // answer is read and dropped, and the server goes on to the third's.
        drop(b);
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        assert_eq!(answer(&mut c).await, pid, "round {round}: {behind} behind");
        assert_eq!(one(&sc.holder, "SELECT pg_backend_pid()::text").await, pid);
        if behind >= 2 {
            return;
        }
    }
    panic!("never two requests behind another in 10 rounds");
}

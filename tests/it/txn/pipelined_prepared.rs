//! Requests of two clients in flight on one server (`pool/pipeline.rs`) where the
//! server holds prepared statements that other clients made (the tracked kind, kept
//! on the server for them): requests go behind others there as on any server, and
//! the statements stay usable and counted.

use std::time::Duration;

use tokio_postgres::Client;

use super::common::*;
use super::pipelined::{answer, one_loop, pipelined, Scene};
use super::pipelined_drivers::{Bench, OWN_ANSWER};
use super::prepared_load::parse;
use crate::admin::psql_ok;
use crate::support::free_port;
use crate::support::probe::within;
use crate::support::wire::{frame, query_msg};

#[tokio::test]
async fn a_request_goes_behind_another_on_a_server_holding_a_prepared_statement() {
    let sc = Scene::new("txn_pipe_held").await;
    // The holder's statement is prepared on the one server and kept there.
    let held = within(STEP, "prepare", sc.holder.prepare("SELECT 'held'"))
        .await
        .expect("prepare");
    for round in 0..10 {
        let (mut a, mut b, before) = sc.pair("SELECT 'a'", "SELECT 'b', pg_sleep(1)").await;
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        let behind = sc.pipelined() > before;
        // While the second client's query runs, the console counts the statement
        // the server holds for it, as for a client linked any other way.
        if behind {
            let servers = psql_ok(&sc.s, "SHOW SERVERS");
            assert_eq!(
                servers.column("prepared_statements"),
                ["1"],
                "round {round}: {servers:?}"
            );
        }
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        if !behind && one_loop() {
            continue;
        }
        let rows = within(STEP, "query", sc.holder.query(&held, &[]))
            .await
            .expect("the held statement");
        assert_eq!(rows[0].get::<_, &str>(0), "held");
        return;
    }
    panic!("no request went behind another in 10 rounds");
}

/// Prepared statements that clients using them left on the server (the tracked
/// `-M prepared` kind) do not keep other clients' requests from going behind others
/// there, and clients of both kinds at once each get their own answers.
#[test]
fn requests_go_behind_others_on_a_server_holding_prepared_statements() {
    let b = Bench::new("txn_pipe_prep");
    // The one server is left holding the prepared clients' statements.
    b.run("own.sql", OWN_ANSWER, "prepared", 4, 50);
    let behind = b.run("own.sql", OWN_ANSWER, "simple", 16, 200);
    // A third of the answers bigger than a delegate gathers: the first client's
    // relay reads them, and cuts them where the other client's begins.
    let big = OWN_ANSWER.replace(" AS v", " AS v, repeat('x', (:r % 3 / 2) * 200000) AS pad");
    let behind_big = b.run("big.sql", &big, "simple", 16, 100);
    if one_loop() {
        assert!(behind > 0, "none behind another\n{}", b.s.diagnostics());
        assert!(behind_big > 0, "big answers: none behind another");
    }
    // Both kinds at once: the prepared ones' statements are prepared and used on
    // the server between requests written behind others.
    std::thread::scope(|scope| {
        let prepared = scope.spawn(|| b.run("own-prepared.sql", OWN_ANSWER, "prepared", 6, 200));
        b.run("own.sql", OWN_ANSWER, "extended", 12, 200);
        prepared.join().expect("prepared run");
    });
}

/// Both holders take the pool's two servers in a transaction.
async fn hold_both(h: &[Client; 2]) {
    for c in h {
        within(STEP, "BEGIN", c.batch_execute("BEGIN"))
            .await
            .expect("BEGIN");
    }
}

async fn commit(c: &Client) {
    within(STEP, "COMMIT", c.batch_execute("COMMIT"))
        .await
        .expect("COMMIT");
}

/// A named statement's Parse, Bind, Execute and Sync.
fn named(name: &str, sql: &str) -> Vec<u8> {
    let mut bind = format!("\0{name}\0").into_bytes();
    bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    let mut out = parse(name, sql);
    out.extend(frame(b'B', &bind));
    out.extend(frame(b'E', &[0, 0, 0, 0, 0]));
    out.extend(sync_msg());
    out
}

/// The first client's request that names a prepared statement, sent while another
/// client's request waits behind its first, goes to the next server it gets as it
/// would have without the other: rewritten for that server, not for the one it was
/// read on. (Rewritten for the first server, it made that one's statements list one
/// it never got, and the other server got one it did not list, so later clients'
/// statements failed on both.)
#[tokio::test]
async fn a_named_statement_sent_while_another_waits_behind_is_rewritten_for_its_own_server() {
    if !one_loop() {
        return;
    }
    let db = fresh_db("txn_pipe_named");
    let mport = free_port();
    let s = txn_sluice(&db)
        .setting("default_pool_size", "2")
        .setting("metrics_listen", &format!("127.0.0.1:{mport}"))
        .start();
    let h = [client(&s, &db).await, client(&s, &db).await];
    for round in 0..10 {
        // A client whose last answer, handed over in line, was quick.
        let mut a = raw(&s, &db, &[]).await;
        for _ in 0..3 {
            hold_both(&h).await;
            a.send(&query_msg("SELECT 'warm'")).await.expect("send");
            tokio::time::sleep(Duration::from_millis(30)).await;
            commit(&h[0]).await;
            assert_eq!(answer(&mut a).await, "warm");
            commit(&h[1]).await;
        }
        // `b` goes behind `a` on the first server let go; it runs long, so `a`'s next
        // request gets the other server.
        let before = pipelined(mport);
        let mut b = raw(&s, &db, &[]).await;
        hold_both(&h).await;
        a.send(&query_msg("SELECT 'a', pg_sleep(0.3)"))
            .await
            .expect("send a");
        tokio::time::sleep(Duration::from_millis(30)).await;
        b.send(&query_msg("SELECT 'b', pg_sleep(1)"))
            .await
            .expect("send b");
        tokio::time::sleep(Duration::from_millis(30)).await;
        commit(&h[0]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let behind = pipelined(mport) > before;
        a.send(&named("q", "SELECT 'q'")).await.expect("send named");
        tokio::time::sleep(Duration::from_millis(50)).await;
        commit(&h[1]).await;
        assert_eq!(answer(&mut a).await, "a", "round {round}");
        assert_eq!(answer(&mut a).await, "q", "round {round}");
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        if !behind {
            continue;
        }
        // The statement, prepared by other clients on each server at once.
        hold_both(&h).await;
        for c in &h {
            let st = within(STEP, "prepare", c.prepare("SELECT 'q'"))
                .await
                .unwrap_or_else(|e| panic!("prepare: {e:?}"));
            let rows = within(STEP, "query", c.query(&st, &[]))
                .await
                .unwrap_or_else(|e| panic!("query: {e}"));
            assert_eq!(rows[0].get::<_, &str>(0), "q");
        }
        commit(&h[0]).await;
        commit(&h[1]).await;
        return;
    }
    panic!("no request went behind another in 10 rounds");
}

/// A Terminate the first client sends while another's request waits behind its own
/// closes it at once, its answer drained, as with no request behind (it does not wait
/// for a server to be rewritten for); the request behind is answered.
#[tokio::test]
async fn a_terminate_sent_while_another_waits_behind_closes_the_client_at_once() {
    let sc = Scene::new("txn_pipe_term").await;
    for round in 0..10 {
        let (mut a, mut b, before) = sc.pair("SELECT 'a', pg_sleep(0.5)", "SELECT 'b'").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let behind = sc.pipelined() > before;
        a.send(&frame(b'X', &[])).await.expect("send Terminate");
        let got = a.until_closed(Duration::from_secs(10)).await;
        assert_eq!(answer(&mut b).await, "b", "round {round}");
        if behind {
            assert!(
                got.iter().all(|m| m.tag != b'D'),
                "round {round}: answered after its Terminate: {got:?}"
            );
        }
        if behind || !one_loop() {
            return;
        }
    }
    panic!("no request went behind another in 10 rounds");
}

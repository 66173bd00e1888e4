//! Requests of two clients in flight on one server (`pool/pipeline.rs`) where the
//! server holds prepared statements that other clients made (the tracked kind, kept
//! on the server for them): requests go behind others there as on any server, and
//! the statements stay usable and counted.

use super::common::*;
use super::pipelined::{answer, one_loop, Scene};
use super::pipelined_drivers::{Bench, OWN_ANSWER};
use crate::admin::psql_ok;
use crate::support::probe::within;

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

//! A request that binds prepared statements, from a client waiting in line: it is
//! rewritten before its server is known and written by whoever hands the client a
//! server that holds its statements (`prepared/deferred.rs`); a server that lacks
//! them gets their Parses first, from the client's relay. Either way the client runs
//! its own statement and gets its own answers.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::common::*;
use super::prepared_load::parse;
use crate::support::probe::within;
use crate::support::wire::{first_error, frame};
use crate::support::{free_port, Sluice};

/// Bind of statement `name` with one text parameter, Describe of the portal,
/// Execute and Sync: what libpq's `PQexecPrepared` sends.
fn bind_run(name: &str, param: &str) -> Vec<u8> {
    bind_run_of(name, &[param])
}

pub(super) fn bind_run_of(name: &str, params: &[&str]) -> Vec<u8> {
    let mut bind = vec![0u8];
    bind.extend_from_slice(name.as_bytes());
    bind.push(0);
    bind.extend_from_slice(&0u16.to_be_bytes());
    bind.extend_from_slice(&(params.len() as u16).to_be_bytes());
    for p in params {
        bind.extend_from_slice(&(p.len() as u32).to_be_bytes());
        bind.extend_from_slice(p.as_bytes());
    }
    bind.extend_from_slice(&0u16.to_be_bytes());
    let mut out = frame(b'B', &bind);
    out.extend(frame(b'D', b"P\0"));
    out.extend(frame(b'E', &[0, 0, 0, 0, 0]));
    out.extend(sync_msg());
    out
}

async fn one_answer(c: &mut RawClient, ctx: &str) -> String {
    let msgs = c.until_ready(Duration::from_secs(20)).await;
    if let Some(e) = first_error(&msgs) {
        panic!("{ctx}: {:?}", e.field(b'M'));
    }
    col(&msgs).join(",")
}

pub(super) async fn prepare(c: &mut RawClient, name: &str, sql: &str) {
    let mut req = parse(name, sql);
    req.extend(sync_msg());
    c.send(&req).await.expect("send");
    one_answer(c, name).await;
}

/// A Sluice with one server whose cache holds one statement, a client to hold that
/// server in a transaction, and two raw clients.
pub(super) async fn one_statement_server(prefix: &str) -> (Sluice, Client, RawClient, RawClient) {
    let db = fresh_db(prefix);
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("max_prepared_statements", "1")
        .start();
    let holder = client(&s, &db).await;
    let (a, b) = (raw(&s, &db, &[]).await, raw(&s, &db, &[]).await);
    (s, holder, a, b)
}

/// One server, whose cache holds one statement: a waiting client's statement is on
/// it, then evicted by another client's, then prepared again.
#[tokio::test]
async fn a_waiting_clients_statement_runs_whether_its_server_holds_it_or_not() {
    let (_s, holder, mut a, mut b) = one_statement_server("txn_prep_line").await;
    prepare(&mut a, "S_a", "SELECT 'a:' || $1::text").await;
    // (The same client name for another text: each client runs its own.)
    prepare(&mut b, "S_a", "SELECT 'b:' || $1::text").await;
    for round in 0..4 {
        // The server holds b's statement (its cache's one) when a's request waits;
        // after a's request it holds a's, which b's request then lacks.
        for (c, who) in [(&mut a, "a"), (&mut b, "b")] {
            within(STEP, "BEGIN", holder.batch_execute("BEGIN"))
                .await
                .expect("BEGIN");
            let param = format!("{round}");
            c.send(&bind_run("S_a", &param)).await.expect("send");
            tokio::time::sleep(Duration::from_millis(30)).await;
            within(STEP, "COMMIT", holder.batch_execute("COMMIT"))
                .await
                .expect("COMMIT");
            let ctx = format!("round {round}, client {who}");
            assert_eq!(one_answer(c, &ctx).await, format!("{who}:{round}"), "{ctx}");
        }
    }
    // Twice in line behind the holder, the server keeping a's statement between.
    for round in 0..3 {
        within(STEP, "BEGIN", holder.batch_execute("BEGIN"))
            .await
            .expect("BEGIN");
        a.send(&bind_run("S_a", "again")).await.expect("send");
        tokio::time::sleep(Duration::from_millis(30)).await;
        within(STEP, "COMMIT", holder.batch_execute("COMMIT"))
            .await
            .expect("COMMIT");
        assert_eq!(
            one_answer(&mut a, "again").await,
            "a:again",
            "round {round}"
        );
    }
}

/// A waiting client's statement whose plan went stale while it waited: the error
/// comes to the client (PostgreSQL's answer to this request) and reaches the
/// relay's tracker too, which gives the statement a new plan for the next request.
/// On one event loop the answer is relayed by a delegate, which must leave such an
/// error to the relay.
#[tokio::test]
async fn a_stale_plan_found_by_a_request_written_at_the_hand_over_is_mended() {
    let db = fresh_db("txn_prep_line_stale");
    direct(
        &db,
        "CREATE TABLE shape (a int); INSERT INTO shape VALUES (1); ALTER TABLE shape OWNER TO sluice_md5;",
    );
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let holder = client(&s, &db).await;
    let mut a = raw(&s, &db, &[]).await;
    prepare(&mut a, "S_shape", "SELECT * FROM shape").await;
    a.send(&bind_run_of("S_shape", &[])).await.expect("send");
    assert_eq!(one_answer(&mut a, "before").await, "1");
    within(STEP, "BEGIN", holder.batch_execute("BEGIN"))
        .await
        .expect("BEGIN");
    within(
        STEP,
        "ALTER",
        holder.batch_execute("ALTER TABLE shape ADD b int DEFAULT 2"),
    )
    .await
    .expect("ALTER");
    a.send(&bind_run_of("S_shape", &[])).await.expect("send");
    tokio::time::sleep(Duration::from_millis(30)).await;
    within(STEP, "COMMIT", holder.batch_execute("COMMIT"))
        .await
        .expect("COMMIT");
    let msgs = a.until_ready(Duration::from_secs(20)).await;
    let e = first_error(&msgs).unwrap_or_else(|| panic!("no error: {msgs:?}"));
    assert_eq!(e.field(b'C').as_deref(), Some("0A000"), "{msgs:?}");
    for round in 0..3 {
        a.send(&bind_run_of("S_shape", &[])).await.expect("send");
        let msgs = a.until_ready(Duration::from_secs(20)).await;
        assert!(first_error(&msgs).is_none(), "round {round}: {msgs:?}");
        let row = msgs.iter().find(|m| m.tag == b'D').expect("a row");
        let cols: Vec<_> = row.columns().into_iter().flatten().collect();
        assert_eq!(cols, ["1", "2"], "round {round}: the new shape");
    }
}

/// Clients of a real driver (tokio-postgres prepares named statements and binds
/// them) outnumbering the servers four to one, with a cache smaller than the
/// statements in use: every answer is its client's.
#[tokio::test]
async fn driver_clients_in_line_run_their_own_prepared_statements() {
    let db = fresh_db("txn_prep_line_drv");
    let s = Arc::new(
        txn_sluice(&db)
            .setting("default_pool_size", "2")
            .setting("max_prepared_statements", "3")
            .start(),
    );
    let mut tasks = Vec::new();
    for id in 0..8i32 {
        let (s, db) = (s.clone(), db.clone());
        tasks.push(tokio::spawn(async move {
            let c = client(&s, &db).await;
            let shared = within(STEP, "prepare", c.prepare("SELECT $1::int + 0"))
                .await
                .expect("prepare shared");
            let own_sql = format!("SELECT $1::int * 100 + {id}");
            let own = within(STEP, "prepare", c.prepare(&own_sql))
                .await
                .expect("prepare own");
            for i in 0..150i32 {
                let (stmt, want) = if i % 2 == 0 {
                    (&shared, i)
                } else {
                    (&own, i * 100 + id)
                };
                let rows = within(STEP, "query", c.query(stmt, &[&i]))
                    .await
                    .unwrap_or_else(|e| panic!("client {id}, step {i}: {e}"));
                assert_eq!(rows[0].get::<_, i32>(0), want, "client {id}, step {i}");
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client failed");
    }
}

/// Prepared `SELECT`s of tokio-postgres clients on one server go behind each other
/// (`pool/pipeline/prepared.rs`): each client's rows are its own, and an error in one
/// client's answer (a division by zero, every fifth query) stays its own, the request
/// behind it answered as usual.
#[tokio::test]
async fn prepared_selects_go_behind_others_and_errors_stay_with_their_client() {
    let db = fresh_db("txn_prep_behind");
    let mport = free_port();
    let s = super::pipelined::sluice(&db, mport);
    let mut tasks = Vec::new();
    for k in 0..12i32 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            let sql = "SELECT $1::int4 * 1000 + 100 / ($2::int4 % 5)";
            let stmt = within(
                STEP,
                "prepare",
                c.prepare_typed(sql, &[Type::INT4, Type::INT4]),
            )
            .await
            .expect("prepare");
            for i in 0..150i32 {
                let r = within(STEP, "query", c.query(&stmt, &[&k, &i])).await;
                let ctx = format!("client {k}, query {i}");
                if i % 5 == 0 {
                    let e = r.expect_err(&ctx);
                    assert_eq!(e.code().map(|c| c.code()), Some("22012"), "{ctx}: {e}");
                    continue;
                }
                let rows = r.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(rows[0].get::<_, i32>(0), k * 1000 + 100 / (i % 5), "{ctx}");
            }
        }));
    }
    super::pipelined_drivers::all_done_some_behind(tasks, mport).await;
}

//! A plain `BEGIN` from a client that would wait for a server is answered by Sluice
//! at once, and a `BEGIN` goes to the server ahead of the client's next request
//! (`session/relay/begin.rs`). The client's transaction is a real one, begun on the
//! server that runs its first statement: it sees what committed before that
//! statement, its changes are its own until it commits, and a rollback undoes them.

use std::time::Duration;

use tokio_postgres::Client;

use super::common::*;
use super::pipelined::{counter, sluice};
use super::pipelined_drivers::Bench;
use super::pipelined_end::OWN_TRANSACTION;
use super::prepared_line::{bind_run_of, one_statement_server, prepare};
use crate::support::probe::within;
use crate::support::wire::{first_error, query_msg, RawMsg, TAG_READY};
use crate::support::{free_port, Sluice};

/// How long an answer Sluice gives itself may take: far less than the holder's
/// transaction, which never ends before the test says.
const AT_ONCE: Duration = Duration::from_secs(5);

/// The command tags and ReadyForQuery status of an answer.
fn tags(msgs: &[RawMsg]) -> (Vec<String>, u8) {
    let tags = msgs
        .iter()
        .filter(|m| m.tag == b'C')
        .map(|m| String::from_utf8_lossy(m.body.strip_suffix(b"\0").unwrap_or(&m.body)).into())
        .collect();
    (tags, status(msgs))
}

/// Sends `sql` and returns its answer's first column, failing on an error.
async fn run(c: &mut RawClient, sql: &str, want_status: u8) -> Vec<String> {
    c.send(&query_msg(sql)).await.expect("send");
    let msgs = c.until_ready(STEP).await;
    if let Some(e) = first_error(&msgs) {
        panic!("{sql}: {:?}", e.field(b'M'));
    }
    assert_eq!(status(&msgs), want_status, "{sql}: {msgs:?}");
    col(&msgs)
}

/// `holder` takes the one server into a transaction, which holds it.
async fn hold(holder: &Client) {
    within(STEP, "holder", holder.batch_execute("BEGIN"))
        .await
        .expect("BEGIN");
    one(holder, "SELECT 1").await;
}

/// `holder` commits, and its server goes to the next in line.
async fn release(holder: &Client) {
    within(STEP, "commit", holder.batch_execute("COMMIT"))
        .await
        .expect("commit");
}

/// `c` sends `request`, which waits in line for the server `holder` holds; then
/// `holder` releases it, and `c`'s answer is read.
async fn answered_after_release(c: &mut RawClient, request: &[u8], holder: &Client) -> Vec<RawMsg> {
    c.send(request).await.expect("send");
    tokio::time::sleep(Duration::from_millis(50)).await;
    release(holder).await;
    c.until_ready(STEP).await
}

/// One server for a fresh database holding a table `t (column)`: Sluice (its
/// metrics on `mport`), a client to hold the server with, and a raw client.
async fn with_table(prefix: &str, mport: u16, column: &str) -> (Sluice, Client, RawClient) {
    let db = fresh_db(prefix);
    let s = sluice(&db, mport);
    let holder = client(&s, &db).await;
    let sql = format!("CREATE TABLE t ({column})");
    within(STEP, "table", holder.batch_execute(&sql))
        .await
        .expect("table");
    let b = raw(&s, &db, &[]).await;
    (s, holder, b)
}

/// `c` sends `begin` and is answered at once with `tag`, in a transaction.
async fn answered_at_once(c: &mut RawClient, begin: &str, tag: &str) {
    c.send(&query_msg(begin)).await.expect("send");
    let msgs = c.until_ready(AT_ONCE).await;
    let want = (vec![tag.to_string()], b'T');
    assert_eq!(tags(&msgs), want, "{begin}: {msgs:?}");
}

/// `c` sends a plain BEGIN and is answered at once, in a transaction.
async fn begin_at_once(c: &mut RawClient) {
    answered_at_once(c, "BEGIN", "BEGIN").await;
}

/// Queries and transactions counted so far on `/metrics` at `port`.
fn counted(port: u16) -> (u64, u64) {
    (
        counter(port, "pgbouncer_stats_queries_pooled_total"),
        counter(port, "pgbouncer_stats_sql_transactions_pooled_total"),
    )
}

#[tokio::test]
async fn a_begin_while_the_server_is_busy_is_answered_at_once_and_the_transaction_is_real() {
    let mport = free_port();
    let (_s, holder, mut b) = with_table("txn_held_begin", mport, "tag text").await;
    let rounds = [
        ("BEGIN", "BEGIN"),
        ("start transaction;", "START TRANSACTION"),
    ];
    for (round, (begin, tag)) in rounds.into_iter().enumerate() {
        // The one server, in a transaction that inserts a row: nobody else gets it.
        hold(&holder).await;
        within(
            STEP,
            "insert",
            holder.batch_execute("INSERT INTO t VALUES ('a')"),
        )
        .await
        .expect("insert");
        let (queries, xacts) = counted(mport);
        answered_at_once(&mut b, begin, tag).await;
        // Counted as a query, as the server's answer would have been.
        within(STEP, "the held BEGIN counted", async {
            while counted(mport).0 < queries + 1 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        // It waits for the server, then runs after the holder's commit: it sees it.
        let count = query_msg("SELECT count(*) FROM t");
        let msgs = answered_after_release(&mut b, &count, &holder).await;
        assert_eq!(status(&msgs), b'T', "{msgs:?}");
        // (The holder's rows, one a round: b holds the one server now.)
        let before = (round + 1).to_string();
        assert_eq!(col(&msgs), vec![before.clone()]);
        // Its changes are its own until it ends, and a rollback undoes them.
        run(&mut b, "INSERT INTO t VALUES ('b')", b'T').await;
        assert_eq!(
            run(&mut b, "SELECT count(*) FROM t WHERE tag = 'b'", b'T').await,
            vec!["1"]
        );
        run(&mut b, "ROLLBACK", b'I').await;
        assert_eq!(one(&holder, "SELECT count(*) FROM t").await, before);
        // One transaction and three queries of b's (and the holder's), no more.
        let (q, x) = counted(mport);
        assert!(
            q >= queries + 4 && x >= xacts + 2,
            "{queries}/{xacts} -> {q}/{x}"
        );
    }
    // Nothing is held when the server is idle: a BEGIN goes to it, as in PgBouncer.
    let free = one(&holder, "SELECT count(*) FROM t").await;
    assert_eq!(free, "2");
    run(&mut b, "BEGIN", b'T').await;
    let stamp = "SELECT statement_timestamp() - now() > interval '150 ms'";
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(run(&mut b, stamp, b'T').await, vec!["t"]);
    run(&mut b, "COMMIT", b'I').await;
}

#[tokio::test]
async fn a_client_that_leaves_or_commits_after_a_held_begin_costs_no_server() {
    let db = fresh_db("txn_held_begin_leave");
    let mport = free_port();
    let s = sluice(&db, mport);
    let holder = client(&s, &db).await;
    hold(&holder).await;
    let mut gone = raw(&s, &db, &[]).await;
    begin_at_once(&mut gone).await;
    drop(gone);
    let mut b = raw(&s, &db, &[]).await;
    // A transaction that ran nothing ends at once too: no server need see it.
    let (queries, xacts) = counted(mport);
    for (end, tag) in [("COMMIT", "COMMIT"), ("abort;", "ROLLBACK")] {
        begin_at_once(&mut b).await;
        b.send(&query_msg(end)).await.expect("send");
        let msgs = b.until_ready(AT_ONCE).await;
        assert_eq!(tags(&msgs), (vec![tag.to_string()], b'I'), "{msgs:?}");
    }
    // Counted as a server's answers would be: two transactions of two queries.
    within(STEP, "the held transactions counted", async {
        loop {
            let (q, x) = counted(mport);
            if q >= queries + 4 && x >= xacts + 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    release(&holder).await;
    // The one server is free again: each of them gets it.
    assert_eq!(run(&mut b, "SELECT 'b'", b'I').await, vec!["b"]);
    assert_eq!(one(&holder, "SELECT 'holder'").await, "holder");
    // A second BEGIN in the held transaction gets PostgreSQL's warning, in order.
    hold(&holder).await;
    begin_at_once(&mut b).await;
    b.send(&query_msg("BEGIN")).await.expect("send");
    release(&holder).await;
    let msgs = b.until_ready(STEP).await;
    let warned = msgs.iter().any(|m| {
        m.tag == b'N' && String::from_utf8_lossy(&m.body).contains("already a transaction")
    });
    assert!(warned, "{msgs:?}");
    assert_eq!(tags(&msgs), (vec!["BEGIN".to_string()], b'T'), "{msgs:?}");
    assert!(!msgs.iter().any(|m| m.tag == TAG_READY && m.body != b"T"));
    run(&mut b, "COMMIT", b'I').await;
}

/// A `BEGIN` with modes no server refuses is held too, and its transaction has
/// them; one a standby would refuse (`SERIALIZABLE`) waits for a server as before.
#[tokio::test]
async fn a_begin_with_modes_is_held_with_them_and_a_serializable_one_waits() {
    let (_s, holder, mut b) = with_table("txn_held_begin_modes", free_port(), "n int").await;
    let settings = "SELECT current_setting('transaction_isolation') || ' ' || \
                    current_setting('transaction_read_only') || ' ' || \
                    current_setting('transaction_deferrable')";
    for (begin, tag, want) in [
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
            "BEGIN",
            "repeatable read on off",
        ),
        (
            "start transaction read only deferrable isolation level read committed;",
            "START TRANSACTION",
            "read committed on on",
        ),
    ] {
        hold(&holder).await;
        answered_at_once(&mut b, begin, tag).await;
        let msgs = answered_after_release(&mut b, &query_msg(settings), &holder).await;
        assert_eq!(col(&msgs), vec![want.to_string()], "{begin}: {msgs:?}");
        // Read only: a write fails, as in the transaction the client asked for.
        b.send(&query_msg("INSERT INTO t VALUES (1)"))
            .await
            .expect("send");
        let msgs = b.until_ready(STEP).await;
        let code = first_error(&msgs).and_then(|e| e.field(b'C'));
        assert_eq!(code.as_deref(), Some("25006"), "{begin}: {msgs:?}");
        run(&mut b, "ROLLBACK", b'I').await;
    }
    // SERIALIZABLE, which a hot standby refuses, waits for the server that runs it.
    hold(&holder).await;
    b.send(&query_msg("BEGIN ISOLATION LEVEL SERIALIZABLE"))
        .await
        .expect("send");
    let early = b.try_recv(Duration::from_millis(300)).await;
    assert!(early.is_err(), "answered without a server: {early:?}");
    release(&holder).await;
    let msgs = b.until_ready(STEP).await;
    assert_eq!(tags(&msgs), (vec!["BEGIN".to_string()], b'T'), "{msgs:?}");
    let level = "SELECT current_setting('transaction_isolation')";
    assert_eq!(run(&mut b, level, b'T').await, vec!["serializable"]);
    run(&mut b, "COMMIT", b'I').await;
}

/// A held `BEGIN` ahead of a request that binds a prepared statement its server
/// lacks: the server gets the `BEGIN`, then the statement's Parse, then the request.
#[tokio::test]
async fn a_held_begin_goes_ahead_of_the_parse_of_a_statement_the_server_lacks() {
    let (_s, holder, mut a, mut b) = one_statement_server("txn_held_begin_prep").await;
    prepare(&mut a, "S_a", "SELECT 'a:' || $1::text").await;
    for round in 0..3 {
        // b's statement evicts a's from the one server's cache of one.
        prepare(&mut b, &format!("S_b{round}"), "SELECT 'b'").await;
        hold(&holder).await;
        begin_at_once(&mut a).await;
        let param = round.to_string();
        let msgs = answered_after_release(&mut a, &bind_run_of("S_a", &[&param]), &holder).await;
        assert!(first_error(&msgs).is_none(), "{msgs:?}");
        assert_eq!(col(&msgs), vec![format!("a:{round}")]);
        assert_eq!(status(&msgs), b'T', "still in its transaction");
        // Still the transaction its bound statement ran in.
        let begun = "SELECT xact_start < query_start FROM pg_stat_activity \
                     WHERE pid = pg_backend_pid()";
        assert_eq!(run(&mut a, begun, b'T').await, vec!["t"]);
        run(&mut a, "COMMIT", b'I').await;
    }
}

/// pgbench clients on one server, each transaction's `BEGIN` answered by Sluice while
/// the server runs another's: every answer is its client's own.
#[test]
fn pgbench_transactions_with_held_begins_get_their_own_answers() {
    let b = Bench::new("txn_held_begin_pgbench");
    for mode in ["simple", "extended"] {
        b.run("own_tx.sql", OWN_TRANSACTION, mode, 16, 200);
    }
}

/// Clients asleep (session/keeper.rs), by SHOW MEM.
fn asleep(s: &Sluice) -> u64 {
    crate::admin::psql_ok(s, "SHOW MEM")
        .cell("name", "asleep_client_cache", "used")
        .and_then(|v| v.parse().ok())
        .expect("SHOW MEM lists asleep_client_cache")
}

/// A client that sleeps after its held `BEGIN`, giving up its task, keeps it: its
/// next statement runs in the transaction, and a `COMMIT` is still answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_begin_outlives_its_client_sleeping() {
    let (s, holder, mut b) = with_table("txn_held_begin_sleep", free_port(), "n int").await;
    let slept = |s: &Sluice| {
        let ok = crate::support::wait_until(Duration::from_secs(15), || asleep(s) == 1);
        assert!(ok, "the client with a held BEGIN did not sleep");
    };
    hold(&holder).await;
    begin_at_once(&mut b).await;
    slept(&s);
    let insert = query_msg("INSERT INTO t VALUES (1)");
    let msgs = answered_after_release(&mut b, &insert, &holder).await;
    assert!(first_error(&msgs).is_none(), "{msgs:?}");
    assert_eq!(status(&msgs), b'T', "not in the held transaction: {msgs:?}");
    run(&mut b, "ROLLBACK", b'I').await;
    assert_eq!(one(&holder, "SELECT count(*) FROM t").await, "0");
    hold(&holder).await;
    begin_at_once(&mut b).await;
    slept(&s);
    b.send(&query_msg("COMMIT")).await.expect("send");
    let msgs = b.until_ready(AT_ONCE).await;
    assert_eq!(tags(&msgs), (vec!["COMMIT".to_string()], b'I'), "{msgs:?}");
    release(&holder).await;
    assert_eq!(run(&mut b, "SELECT 'b'", b'I').await, vec!["b"]);
}

/// tokio-postgres's transaction builder (`START TRANSACTION ISOLATION LEVEL
/// REPEATABLE READ, READ ONLY, DEFERRABLE`): begun at once while the one server is
/// busy, and its statements run in a transaction with those modes.
#[tokio::test]
async fn a_drivers_transaction_with_modes_begins_at_once() {
    use tokio_postgres::IsolationLevel;
    let db = fresh_db("txn_held_begin_driver");
    let s = sluice(&db, free_port());
    let holder = client(&s, &db).await;
    let mut c = client(&s, &db).await;
    hold(&holder).await;
    let builder = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .deferrable(true);
    let tx = within(AT_ONCE, "start", builder.start())
        .await
        .expect("start");
    let settings = tx.query_one(
        "SELECT current_setting('transaction_isolation'), \
         current_setting('transaction_read_only'), \
         current_setting('transaction_deferrable')",
        &[],
    );
    let (row, ()) = tokio::join!(settings, async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        release(&holder).await;
    });
    let row = row.expect("settings");
    let got: (String, String, String) = (row.get(0), row.get(1), row.get(2));
    let want = ("repeatable read", "on", "on");
    assert_eq!((got.0.as_str(), got.1.as_str(), got.2.as_str()), want);
    within(STEP, "commit", tx.commit()).await.expect("commit");
}

/// `START TRANSACTION`, then `SET TRANSACTION` with the isolation level, as
/// TypeORM and Sequelize send them: both answered at once while the one server is
/// busy, and the transaction runs with the modes set; a `SET TRANSACTION` a server
/// may refuse (`SERIALIZABLE`) waits for the server that runs it.
#[tokio::test]
async fn a_set_transaction_after_a_held_begin_is_answered_and_its_modes_kept() {
    let (_s, holder, mut b) = with_table("txn_held_begin_set", free_port(), "n int").await;
    let level = "SELECT current_setting('transaction_isolation') || ' ' || \
                 current_setting('transaction_read_only')";
    hold(&holder).await;
    answered_at_once(&mut b, "START TRANSACTION", "START TRANSACTION").await;
    let set = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;";
    answered_at_once(&mut b, set, "SET").await;
    answered_at_once(&mut b, "set transaction read only", "SET").await;
    let msgs = answered_after_release(&mut b, &query_msg(level), &holder).await;
    assert_eq!(col(&msgs), vec!["repeatable read on"], "{msgs:?}");
    run(&mut b, "COMMIT", b'I').await;

    hold(&holder).await;
    answered_at_once(&mut b, "BEGIN READ ONLY", "BEGIN").await;
    let serializable = query_msg("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE");
    let msgs = answered_after_release(&mut b, &serializable, &holder).await;
    assert_eq!(tags(&msgs), (vec!["SET".to_string()], b'T'), "{msgs:?}");
    assert_eq!(run(&mut b, level, b'T').await, vec!["serializable on"]);
    run(&mut b, "ROLLBACK", b'I').await;
}

/// With `query_timeout` set a `BEGIN` is held too: answered at once, it is no query,
/// so a client that thinks for longer than the timeout before its first statement is
/// not cut; that statement is timed from its arrival, and cut when it runs too long,
/// as through PgBouncer.
#[tokio::test]
async fn with_query_timeout_a_begin_is_held_and_the_statement_after_it_timed() {
    let db = fresh_db("txn_held_begin_qt");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("query_timeout", "1")
        .start();
    let holder = client(&s, &db).await;
    let mut b = raw(&s, &db, &[]).await;
    hold(&holder).await;
    begin_at_once(&mut b).await;
    release(&holder).await;
    // Longer than query_timeout with nothing sent (a bound wait, not a timing test).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let now = "SELECT statement_timestamp() - now() < interval '500 ms'";
    assert_eq!(
        run(&mut b, now, b'T').await,
        vec!["t"],
        "begun with this statement"
    );
    b.send(&query_msg("SELECT pg_sleep(5)"))
        .await
        .expect("send");
    let msgs = b.until_closed(Duration::from_secs(10)).await;
    let text = first_error(&msgs).and_then(|e| e.field(b'M'));
    assert!(
        text.as_deref().is_some_and(|t| t.contains("query_timeout")),
        "{msgs:?}"
    );
}

//! A waiting client whose answer could be relayed for it (`pool/delegate.rs`)
//! sends more while it runs (or while part of its answer is gathered): its task
//! takes the server back, what it sent meanwhile is owed its answers, and its server
//! goes to no other client before they come. A notice in an unfinished answer is not
//! held back, nor a part gathered once the gathering window ends.

use std::time::Duration;

use super::common::*;
use crate::support::probe::within;
use crate::support::wire::{first_column, query_msg};
use crate::support::{Sluice, MD5_PASSWORD, MD5_USER};

/// The first column of the first row up to the next ReadyForQuery.
async fn answer(c: &mut RawClient) -> String {
    let msgs = c.until_ready(Duration::from_secs(10)).await;
    let first = first_column(&msgs).into_iter().next().flatten();
    first.unwrap_or_else(|| panic!("no row in {msgs:?}"))
}

/// A client whose `sql` waits in line behind the one server (held in a transaction by
/// another client) and is written to it at the hand-over, when the holder commits:
/// the case in which a delegate may relay its answer. Returns the client, its
/// request on its way.
async fn handed_over(s: &Sluice, db: &str, sql: &str) -> RawClient {
    let holder = client(s, db).await;
    within(STEP, "BEGIN", holder.batch_execute("BEGIN"))
        .await
        .expect("BEGIN");
    let mut a = raw(s, db, &[]).await;
    a.send(&query_msg(sql)).await.expect("send");
    tokio::time::sleep(Duration::from_millis(150)).await;
    within(STEP, "COMMIT", holder.batch_execute("COMMIT"))
        .await
        .expect("COMMIT");
    a
}

#[tokio::test]
async fn requests_sent_while_a_relayed_answer_is_on_its_way_keep_their_answers() {
    let db = fresh_db("txn_deleg_more");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let sleep = |ms| tokio::time::sleep(Duration::from_millis(ms));
    // Written to the server at the hand-over; its answer comes 300 ms later.
    let mut a = handed_over(&s, &db, "SELECT 'a1', pg_sleep(0.3)").await;
    // While a1 runs, two more requests, each 300 ms long.
    sleep(100).await;
    let mut more = query_msg("SELECT 'a2', pg_sleep(0.3)");
    more.extend(query_msg("SELECT 'a3', pg_sleep(0.3)"));
    a.send(&more).await.expect("send");
    // Between a2's answer and a3's, another client waits for the server: it must
    // get it after a3's answer, and only its own.
    let b = tokio::spawn({
        let (port, db) = (s.port(), db.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(350)).await;
            let mut b = RawClient::login(port, MD5_USER, MD5_PASSWORD, &db, &[])
                .await
                .expect("login");
            b.send(&query_msg("SELECT 'b'")).await.expect("send");
            answer(&mut b).await
        }
    });
    for want in ["a1", "a2", "a3"] {
        assert_eq!(answer(&mut a).await, want);
    }
    let got = within(STEP, "the other client", b).await.expect("task");
    assert_eq!(got, "b", "the other client's answer");
}

/// A waiting client's answer that PostgreSQL sends in parts, a notice first (a long
/// function's progress): the notice reaches the client when it is sent, not when the
/// answer is whole, though a delegate gathers other answers that come in parts.
#[tokio::test]
async fn a_notice_in_an_unfinished_answer_is_not_held_back() {
    let db = fresh_db("txn_deleg_notice");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    // PostgreSQL flushes a notice at once; the answer ends 3 s later.
    let sql = "DO $$ BEGIN RAISE NOTICE 'started'; PERFORM pg_sleep(3); END $$";
    let mut a = handed_over(&s, &db, sql).await;
    let first = a.recv(Duration::from_millis(2000)).await;
    let first = first.expect("the notice, long before the answer's end");
    assert_eq!(first.tag, b'N', "{first:?}");
    assert_eq!(first.field(b'M').as_deref(), Some("started"));
    let rest = a.until_ready(Duration::from_secs(10)).await;
    let tags: Vec<u8> = rest.iter().map(|m| m.tag).collect();
    assert_eq!(tags, b"CZ", "{rest:?}");
}

/// A waiting client sends more while part of its answer has come (PostgreSQL sent
/// 16 KB, then runs on for a second): at once, while a delegate may still be
/// gathering the part (its task then takes the server back with it), and later,
/// when the part has gone on by the client's relay. Either way the answer arrives
/// whole, then the next one.
#[tokio::test]
async fn more_from_the_client_while_part_of_its_answer_has_come() {
    for wait_ms in [0, 400] {
        more_while_part_of_the_answer_has_come(wait_ms).await;
    }
}

async fn more_while_part_of_the_answer_has_come(wait_ms: u64) {
    let db = fresh_db(&format!("txn_deleg_part{wait_ms}"));
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let sql = "SELECT CASE WHEN g = 1 THEN repeat('a', 20000) ELSE pg_sleep(1)::text END \
               FROM generate_series(1, 2) g";
    let mut a = handed_over(&s, &db, sql).await;
    // The first row's 16 KB come at once; the second row is a second away.
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    a.send(&query_msg("SELECT 'next'")).await.expect("send");
    let first = a.until_ready(Duration::from_secs(10)).await;
    let rows = first_column(&first);
    assert_eq!(
        rows.len(),
        2,
        "{:?}",
        first.iter().map(|m| m.tag).collect::<Vec<_>>()
    );
    assert_eq!(rows[0].as_deref(), Some("a".repeat(20000).as_str()));
    assert_eq!(rows[1].as_deref(), Some(""));
    assert_eq!(answer(&mut a).await, "next");
}

/// Runs `sql`, handed over in line, whose answer's first 16 KB (`T`, two `D`) come
/// long before its end: they must reach the client within 2 s, and the rest (`D`,
/// `D`, `C`, `Z`) after them.
async fn first_rows_come_early(prefix: &str, sql: &str) {
    let db = fresh_db(prefix);
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut a = handed_over(&s, &db, sql).await;
    for want in [b'T', b'D', b'D'] {
        let m = a.recv(Duration::from_millis(2000)).await;
        let m = m.expect("the first rows, long before the answer's end");
        assert_eq!(m.tag, want, "{m:?}");
    }
    let rest = a.until_ready(Duration::from_secs(10)).await;
    let tags: Vec<u8> = rest.iter().map(|m| m.tag).collect();
    assert_eq!(tags, b"DDCZ", "{rest:?}");
}

/// A waiting client's answer that starts late and then comes slowly: its first
/// parts reach the client as PostgreSQL sends them, not when the answer is whole
/// (a delegate holds the first part it gathers for 10 ms at most).
#[tokio::test]
async fn a_slow_answer_is_passed_on_as_it_comes() {
    // Three 6 KB rows after 50 ms (PostgreSQL sends 16 KB of them), then 3 s more.
    let sql = "SELECT CASE WHEN g <= 3 THEN repeat('a', 6000) \
               || CASE WHEN g = 1 THEN pg_sleep(0.05)::text ELSE '' END \
               ELSE pg_sleep(3)::text END FROM generate_series(1, 4) g";
    first_rows_come_early("txn_deleg_slow", sql).await;
}

/// A waiting client's answer whose first parts come at once and the rest seconds
/// later: the parts gathered go on when the gathering window ends, not when the
/// answer is whole.
#[tokio::test]
async fn a_part_gathered_goes_on_though_the_rest_is_slow() {
    // Three 6 KB rows at once (PostgreSQL sends 16 KB of them), then 3 s more.
    let sql = "SELECT CASE WHEN g <= 3 THEN repeat('a', 6000) ELSE pg_sleep(3)::text END \
               FROM generate_series(1, 4) g";
    first_rows_come_early("txn_deleg_gathered", sql).await;
}

/// A waiting client that leaves while part of its answer has come (16 KB at once,
/// the rest half a second later): at once, while a delegate may be gathering the
/// part, within its window, and after it. The server goes to the next client with
/// the rest of that answer out of the way: the next client gets its own answer.
#[tokio::test]
async fn a_client_gone_while_part_of_its_answer_is_gathered() {
    let db = fresh_db("txn_deleg_gone");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let sql = "SELECT CASE WHEN g = 1 THEN repeat('a', 20000) ELSE pg_sleep(0.5)::text END \
               FROM generate_series(1, 2) g";
    for wait_ms in [0, 5, 50] {
        let a = handed_over(&s, &db, sql).await;
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        drop(a);
        let mut b = raw(&s, &db, &[]).await;
        b.send(&query_msg("SELECT 'b'")).await.expect("send");
        assert_eq!(answer(&mut b).await, "b", "after leaving at {wait_ms} ms");
    }
}

//! Simple queries in prepared-statement mode. A request of plain simple queries, from
//! a client and to a server that hold no prepared statements, is relayed without the
//! rewriter and the response tracker; these check the two ways that could go wrong:
//! a server that does hold statements, and rewriting that starts mid-request.

use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;

use super::tokio_postgres::client;
use super::{driver_db, driver_sluice};
use crate::support::probe::within;

const T: Duration = Duration::from_secs(20);

fn rows(msgs: &[SimpleQueryMessage]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .collect()
}

/// Another client's `DEALLOCATE ALL` as the second statement of a simple query, or a
/// `DISCARD ALL` behind a comment (neither recognised by its first word), drops the
/// server's statements: Sluice must still read the CommandComplete, because that
/// server holds statements.
#[tokio::test]
async fn a_multi_statement_discard_all_on_a_server_with_statements_is_followed() {
    let db = driver_db("plain_discard");
    let s = driver_sluice(&db).setting("default_pool_size", "1").start();
    let (a, b) = (client(&s, &db).await, client(&s, &db).await);
    let st = within(T, "prepare", a.prepare("SELECT $1::int + 1"))
        .await
        .unwrap();
    let n: i32 = within(T, "first run", a.query_one(&st, &[&1i32]))
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    for sql in ["SELECT 1; DEALLOCATE ALL", "/* reset */ discard all"] {
        within(T, sql, b.simple_query(sql)).await.unwrap();
        let r = within(T, "run after", a.query_one(&st, &[&5i32])).await;
        let r = r.unwrap_or_else(|e| panic!("after another client's {sql:?}: {e:?}"));
        assert_eq!(r.get::<_, i32>(0), 6);
    }
}

/// A prepared statement pipelined behind a slow simple query on the same client: the
/// request starts plain (nothing prepared anywhere yet) and must switch to rewriting
/// while the query's answer is still owed; that answer then goes through the response
/// tracker ahead of the new messages. A failing query checks the order too: its error
/// must not be taken for the Parse's (which would make Sluice forget the statement and
/// prepare it twice on the server).
#[tokio::test]
async fn a_statement_pipelined_behind_a_plain_query_gets_its_own_answers() {
    let db = driver_db("plain_switch");
    for (case, sql, want) in [
        (
            "ok",
            "SELECT pg_sleep(0.2)::text, 'slow'; SELECT 'second'",
            Some(["", "second"]),
        ),
        ("error", "SELECT pg_sleep(0.2)::text; SELECT 1 / 0", None),
    ] {
        // A Sluice of its own: servers that hold no statements yet.
        let s = driver_sluice(&db).setting("default_pool_size", "1").start();
        let c = client(&s, &db).await;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&41i32];
        let (slow, prepared) = within(T, "pipelined pair", async {
            tokio::join!(c.simple_query(sql), async {
                // Sent apart, so that it reaches Sluice in a read of its own.
                tokio::time::sleep(Duration::from_millis(50)).await;
                c.query_one("SELECT $1::int + 1", &params).await
            })
        })
        .await;
        match (want, slow) {
            (Some(want), Ok(msgs)) => assert_eq!(rows(&msgs), want, "{case}"),
            (None, Err(e)) => assert_eq!(
                e.code(),
                Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO),
                "{case}: {e:?}"
            ),
            (want, got) => panic!("{case}: wanted {want:?}, got {got:?}"),
        }
        let got: i32 = prepared
            .unwrap_or_else(|e| panic!("{case}, prepared statement: {e:?}"))
            .get(0);
        assert_eq!(got, 42, "{case}");
        // Then the statement again, prepared by name, and a plain query.
        let st = within(T, "prepare", c.prepare("SELECT $1::int + 1"))
            .await
            .unwrap();
        let again = within(T, "run", c.query_one(&st, &[&1i32])).await;
        let again: i32 = again
            .unwrap_or_else(|e| panic!("{case}, again: {e:?}"))
            .get(0);
        assert_eq!(again, 2, "{case}");
        let after = within(T, "after", c.simple_query("SELECT 'after'"))
            .await
            .unwrap();
        assert_eq!(rows(&after), ["after"], "{case}");
    }
}

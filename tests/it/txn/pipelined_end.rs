//! A request written behind one that ends a transaction (`Pool::send_behind_end`):
//! the client holding the one server in a transaction ends it (COMMIT, END,
//! ROLLBACK: the server is idle after it, whatever its outcome), and the request of
//! the first client in line, a BEGIN or one `SELECT`, is written right behind it.
//! Each client gets its own answers, the second's transaction starts after the
//! first's ended, and nothing goes behind a request that leaves the transaction open.

use std::time::Duration;

use super::common::*;
use super::pipelined::{one_loop, pipelined, sluice_with};
use super::pipelined_drivers::Bench;
use crate::support::probe::within;
use crate::support::wire::{first_column, first_error, query_msg, TAG_READY};
use crate::support::{free_port, Sluice};

/// The transaction status of the answer's ReadyForQuery, its error's SQLSTATE if
/// any, and its first column.
async fn outcome(c: &mut RawClient) -> (char, Option<String>, Option<String>) {
    let msgs = c.until_ready(Duration::from_secs(20)).await;
    let err = first_error(&msgs).map(|e| e.field(b'C').unwrap_or_default());
    let status = msgs
        .iter()
        .rev()
        .find(|m| m.tag == TAG_READY)
        .and_then(|m| m.body.first().copied())
        .map_or('?', char::from);
    let first = first_column(&msgs).into_iter().next().flatten();
    (status, err, first)
}

/// Runs `sql` on `c`, expecting the transaction status `want` after it.
async fn step(c: &mut RawClient, sql: &str, want: char) -> Option<String> {
    c.send(&query_msg(sql)).await.expect("send");
    let (status, err, first) = outcome(c).await;
    assert_eq!(status, want, "{sql}: status (error {err:?})");
    first
}

/// One server, on which client `a` runs `inside` in a transaction while client `b`
/// sends `b_sql` and waits in line; then `a` sends `end`.
struct Ended {
    s: Sluice,
    mport: u16,
    before: u64,
    a: RawClient,
    b: RawClient,
    /// The outcome of `a`'s `end`.
    a_out: (char, Option<String>, Option<String>),
}

impl Ended {
    async fn new(prefix: &str, inside: &[&str], end: &str, b_sql: &str) -> Ended {
        Ended::with(prefix, inside, end, b_sql, &[]).await
    }

    /// As [`Ended::new`], `b` logging in with these startup parameters.
    async fn with(
        prefix: &str,
        inside: &[&str],
        end: &str,
        b_sql: &str,
        b_params: &[(&str, &str)],
    ) -> Ended {
        let db = fresh_db(prefix);
        let mport = free_port();
        // (A `BEGIN` goes to a server here: held, it would go behind nothing.)
        let s = sluice_with(&db, mport, false);
        let setup = client(&s, &db).await;
        within(
            STEP,
            "a table",
            setup.batch_execute(
                "CREATE TABLE t (k int, tag text, \
                 CONSTRAINT u UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)",
            ),
        )
        .await
        .expect("a table");
        let mut a = raw(&s, &db, &[]).await;
        step(&mut a, "BEGIN", 'T').await;
        for sql in inside {
            a.send(&query_msg(sql)).await.expect("send");
            outcome(&mut a).await;
        }
        let mut b = raw(&s, &db, b_params).await;
        b.send(&query_msg(b_sql)).await.expect("send b");
        // (`b` is in line with its request by now: the one server is `a`'s.)
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = pipelined(mport);
        a.send(&query_msg(end)).await.expect("send end");
        let a_out = outcome(&mut a).await;
        Ended {
            s,
            mport,
            before,
            a,
            b,
            a_out,
        }
    }

    /// Requests written behind others since `a` sent its `end`.
    fn behind(&self) -> u64 {
        pipelined(self.mport) - self.before
    }
}

#[tokio::test]
async fn a_begin_behind_a_commit_starts_after_it() {
    let inside = ["INSERT INTO t VALUES (1, 'a')"];
    let mut e = Ended::new("txn_pipe_end_commit", &inside, "COMMIT", "BEGIN").await;
    assert_eq!(e.a_out, ('I', None, None), "the COMMIT");
    assert_eq!(
        outcome(&mut e.b).await,
        ('T', None, None),
        "the BEGIN behind it"
    );
    if one_loop() {
        assert_eq!(e.behind(), 1, "the BEGIN did not go behind the COMMIT");
    }
    // The second client's transaction began after the first's committed.
    let seen = step(&mut e.b, "SELECT count(*) FROM t WHERE tag = 'a'", 'T').await;
    assert_eq!(seen.as_deref(), Some("1"));
    step(&mut e.b, "INSERT INTO t VALUES (2, 'b')", 'T').await;
    step(&mut e.b, "END", 'I').await;
    step(&mut e.a, "SELECT 1", 'I').await;
}

#[tokio::test]
async fn a_commit_that_fails_still_leaves_the_server_to_the_begin_behind() {
    // Two rows with one key: the deferred constraint fails the COMMIT itself.
    let inside = [
        "INSERT INTO t VALUES (1, 'a')",
        "INSERT INTO t VALUES (1, 'a')",
    ];
    let mut e = Ended::new("txn_pipe_end_fails", &inside, "commit;", "begin;").await;
    assert_eq!(e.a_out.0, 'I', "a failed COMMIT rolls back");
    assert_eq!(e.a_out.1.as_deref(), Some("23505"), "the COMMIT's error");
    assert_eq!(
        outcome(&mut e.b).await,
        ('T', None, None),
        "the BEGIN behind it"
    );
    if one_loop() {
        assert_eq!(e.behind(), 1);
    }
    let seen = step(&mut e.b, "SELECT count(*) FROM t", 'T').await;
    assert_eq!(
        seen.as_deref(),
        Some("0"),
        "the failed transaction left nothing"
    );
    step(&mut e.b, "ROLLBACK", 'I').await;
    let again = step(&mut e.a, "SELECT 'a again'", 'I').await;
    assert_eq!(again.as_deref(), Some("a again"));
}

#[tokio::test]
async fn a_select_behind_the_rollback_of_a_failed_transaction_gets_its_own_rows() {
    let inside = ["SELECT 1/0"];
    let mut e = Ended::new(
        "txn_pipe_end_rollback",
        &inside,
        "  Rollback  ",
        "SELECT 'b alone'",
    )
    .await;
    assert_eq!(e.a_out, ('I', None, None), "the ROLLBACK");
    let b_out = outcome(&mut e.b).await;
    assert_eq!(
        b_out,
        ('I', None, Some("b alone".into())),
        "the SELECT behind"
    );
    if one_loop() {
        assert_eq!(e.behind(), 1);
    }
}

#[tokio::test]
async fn nothing_goes_behind_a_commit_that_opens_another_transaction() {
    let mut e = Ended::new(
        "txn_pipe_end_chain",
        &[],
        "COMMIT AND CHAIN",
        "SELECT 'b waited'",
    )
    .await;
    assert_eq!(e.a_out, ('T', None, None), "still in a transaction");
    assert_eq!(
        e.behind(),
        0,
        "a request went behind a transaction left open"
    );
    step(&mut e.a, "COMMIT", 'I').await;
    let b_out = outcome(&mut e.b).await;
    assert_eq!(b_out, ('I', None, Some("b waited".into())));
    drop(e.s);
}

#[tokio::test]
async fn nothing_goes_behind_a_commit_that_undoes_a_reported_parameter() {
    // The server reports `inside` for the waiter's wish until the COMMIT undoes it:
    // behind it, the waiter's query would run with the value from before.
    let inside = ["SET LOCAL application_name = 'inside'"];
    let b_sql = "SELECT current_setting('application_name')";
    let app = [("application_name", "inside")];
    let mut e = Ended::with("txn_pipe_end_local", &inside, "COMMIT", b_sql, &app).await;
    assert_eq!(e.a_out, ('I', None, None), "the COMMIT");
    let b_out = outcome(&mut e.b).await;
    assert_eq!(
        b_out,
        ('I', None, Some("inside".into())),
        "the waiter's own value"
    );
    assert_eq!(
        e.behind(),
        0,
        "a request went behind a COMMIT that undid a SET LOCAL"
    );
}

/// A pgbench transaction whose answer names its client and a random number, and that
/// divides by zero (failing the run) when the answer is not that.
pub(super) const OWN_TRANSACTION: &str = "\\set r random(1, 1000000)
BEGIN;
SELECT :client_id * 1000000 + :r AS v \\gset
\\if :v != :client_id * 1000000 + :r
SELECT 1/0;
\\endif
END;
";

#[test]
fn pgbench_transactions_begin_behind_each_others_end_and_get_their_own_answers() {
    let b = Bench::with("txn_pipe_end_pgbench", false);
    for mode in ["simple", "extended"] {
        let behind = b.run("own_tx.sql", OWN_TRANSACTION, mode, 16, 200);
        // (Extended-protocol BEGINs and ENDs are not taken: simple ones only.)
        if one_loop() && mode == "simple" {
            assert!(behind > 0, "{mode}: no BEGIN behind an END");
        }
    }
}

//! The FunctionCall message (libpq's `PQfn`, which its large-object functions use:
//! psql's `\lo_import` and `\lo_export`) in transaction pooling: answered by a
//! FunctionCallResponse and a ReadyForQuery, after which the server goes back like
//! after any request; with and without prepared-statement tracking.

use std::time::Duration;

use super::common::*;
use super::differential::function_call;
use crate::support::run_bounded;
use crate::support::wire::TAG_ERROR;
use crate::support::{MD5_PASSWORD, MD5_USER};

/// The result of a FunctionCallResponse among `msgs` (`None` for NULL or none).
fn call_result(msgs: &[RawMsg]) -> Option<String> {
    let v = msgs.iter().find(|m| m.tag == b'V')?;
    let len = i32::from_be_bytes(v.body.get(..4)?.try_into().ok()?);
    let bytes = v.body.get(4..4 + usize::try_from(len).ok()?)?;
    Some(String::from_utf8_lossy(bytes).into_owned())
}

/// Raw FunctionCalls outside and inside a transaction block, one failing, on a pool
/// of one server: each time the call is over, another client gets that server.
#[tokio::test]
async fn function_calls_give_the_server_back() {
    for max_prepared in ["200", "0"] {
        let db = fresh_db("txn_fcall");
        let s = txn_sluice(&db)
            .setting("default_pool_size", "1")
            .setting("query_wait_timeout", "10")
            .setting("max_prepared_statements", max_prepared)
            .start();
        let other = client(&s, &db).await;
        let int4pl: u32 = one(&other, "SELECT 'int4pl'::regproc::oid")
            .await
            .parse()
            .expect("an oid");
        let int4div: u32 = one(&other, "SELECT 'int4div'::regproc::oid")
            .await
            .parse()
            .expect("an oid");
        let mut a = raw(&s, &db, &[]).await;
        let ctx = format!("max_prepared_statements={max_prepared}");

        a.send(&function_call(int4pl, &["2", "40"])).await.unwrap();
        let r = a.until_ready(STEP).await;
        assert_eq!(call_result(&r).as_deref(), Some("42"), "{ctx}: {r:?}");
        assert_eq!(status(&r), b'I', "{ctx}");
        assert_eq!(one(&other, "SELECT 1").await, "1", "{ctx}");

        // A failing call: its error, then the server goes back all the same.
        a.send(&function_call(int4div, &["1", "0"])).await.unwrap();
        let r = a.until_ready(STEP).await;
        let err = first_error(&r).unwrap_or_else(|| panic!("{ctx}: no error: {r:?}"));
        assert_eq!(err.field(b'C').as_deref(), Some("22012"), "{ctx}");
        assert_eq!(one(&other, "SELECT 2").await, "2", "{ctx}");

        // Inside a transaction block the server stays until COMMIT.
        a.simple("BEGIN", STEP).await;
        a.send(&function_call(int4pl, &["1", "1"])).await.unwrap();
        let r = a.until_ready(STEP).await;
        assert_eq!(call_result(&r).as_deref(), Some("2"), "{ctx}: {r:?}");
        assert_eq!(status(&r), b'T', "{ctx}");
        let waiting = {
            let other = client(&s, &db).await;
            tokio::spawn(async move { one(&other, "SELECT 3").await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "{ctx}: the server left mid-transaction"
        );
        let r = a.simple("COMMIT", STEP).await;
        assert!(r.iter().all(|m| m.tag != TAG_ERROR), "{ctx}: {r:?}");
        assert_eq!(
            within_step(waiting).await,
            "3",
            "{ctx}: the waiting client after COMMIT"
        );
        // Pipelined: two calls and a query in one write, answered in order.
        let mut bytes = function_call(int4pl, &["5", "5"]);
        bytes.extend(function_call(int4div, &["9", "0"]));
        bytes.extend(crate::support::wire::query_msg("SELECT 'after'"));
        a.send(&bytes).await.unwrap();
        let first = a.until_ready(STEP).await;
        assert_eq!(call_result(&first).as_deref(), Some("10"), "{ctx}");
        let second = a.until_ready(STEP).await;
        assert!(first_error(&second).is_some(), "{ctx}: {second:?}");
        assert_eq!(col(&a.until_ready(STEP).await), ["after"], "{ctx}");
        assert_eq!(one(&other, "SELECT 4").await, "4", "{ctx}");
    }
}

async fn within_step(t: tokio::task::JoinHandle<String>) -> String {
    crate::support::probe::within(STEP, "a waiting client", t)
        .await
        .expect("join")
}

/// psql's `\lo_import` and `\lo_export` (libpq's large-object calls, FunctionCall
/// messages inside the transaction psql opens for them): the bytes come back whole,
/// and the server is free for the next client afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_objects_through_psql() {
    let db = fresh_db("txn_lo");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "10")
        .start();
    let dir = crate::support::TempDir::new("sluice-lo");
    let (src, dst) = (dir.path().join("in.bin"), dir.path().join("out.bin"));
    // 300 KB of varied bytes: many lo_write and lo_read calls.
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(&src, &data).expect("write the file");
    let script = format!(
        "\\lo_import '{}'\n\\lo_export :LASTOID '{}'\nSELECT length(lo_get(:LASTOID));\n\\lo_unlink :LASTOID\n",
        src.display(),
        dst.display()
    );
    let mut cmd = s.psql(MD5_USER, MD5_PASSWORD, &db);
    let out = run_bounded(&mut cmd, Some(&script), Duration::from_secs(60)).expect("psql hung");
    assert!(
        out.status.success(),
        "psql: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.diagnostics()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "300000");
    let back = std::fs::read(&dst).expect("the exported file");
    assert!(
        back == data,
        "the exported bytes differ ({} bytes)",
        back.len()
    );
    let c = client(&s, &db).await;
    assert_eq!(
        one(&c, "SELECT count(*) FROM pg_largeobject_metadata").await,
        "0"
    );
}

//! Simple Queries (and FunctionCalls) inside extended-protocol batches: PostgreSQL
//! skips them after an error in the batch, up to its Sync, and runs them otherwise;
//! either way the server must go back as soon as it is idle, with and without
//! prepared-statement tracking (without it, the relay follows them: midbatch.rs).

use std::time::Duration;

use tokio_postgres::Client;

use super::common::*;
use crate::support::wire::{frame, query_msg, TAG_ERROR};
use crate::support::Sluice;

/// A simple Query sent after extended-protocol messages, before their Sync:
/// PostgreSQL skips it (no ReadyForQuery for it) if one of them failed, and runs it
/// otherwise. Either way the server goes back after the Sync's ReadyForQuery, and
/// one that ran lets it go at its own ReadyForQuery even with no Sync after it.
#[tokio::test]
async fn a_query_inside_an_extended_batch_is_skipped_after_an_error() {
    // Followed by the response tracker, and without it by the relay (midbatch.rs).
    for max_prepared in ["200", "0"] {
        query_inside_an_extended_batch(max_prepared).await;
    }
}

/// A Sluice with one server (`query_wait_timeout` 10 s: a client waiting on one
/// that is kept fails) and two clients of it: a raw one, and a driver.
async fn one_server(prefix: &str, max_prepared: &str) -> (Sluice, RawClient, Client) {
    let db = fresh_db(prefix);
    let s = txn_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "10")
        .setting("max_prepared_statements", max_prepared)
        .start();
    let a = raw(&s, &db, &[]).await;
    let b = client(&s, &db).await;
    (s, a, b)
}

async fn query_inside_an_extended_batch(max_prepared: &str) {
    let (_s, mut a, b) = one_server("txn_mixed_q", max_prepared).await;
    let named_parse = {
        let mut p = b"n1\0SELEC 1\0".to_vec();
        p.extend_from_slice(&[0, 0]);
        frame(b'P', &p)
    };
    for (round, first) in [extended("SELEC 1"), named_parse].into_iter().enumerate() {
        let mut bytes = first;
        bytes.extend(query_msg("SELECT 'skipped'"));
        bytes.extend(sync_msg());
        a.send(&bytes).await.unwrap();
        let r = a.until_ready(STEP).await;
        assert!(first_error(&r).is_some(), "round {round}: {r:?}");
        assert!(col(&r).is_empty(), "round {round}: {r:?}");
        assert_eq!(status(&r), b'I');
        // The other client gets the one server: this one let it go.
        assert_eq!(one(&b, "SELECT 1").await, "1", "round {round}");
    }
    // Without an error the Query runs, answered before the Sync.
    let mut bytes = extended("SELECT 5");
    bytes.extend(query_msg("SELECT 6"));
    bytes.extend(sync_msg());
    a.send(&bytes).await.unwrap();
    let first = a.until_ready(STEP).await;
    assert_eq!(col(&first), ["5", "6"], "{first:?}");
    let second = a.until_ready(STEP).await;
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(one(&b, "SELECT 2").await, "2");
    assert_eq!(col(&a.simple("SELECT 7", STEP).await), ["7"]);
    // With no Sync after it, the Query that runs still ends the batch for the server
    // (it commits): its ReadyForQuery lets the server go (the relay kept it until a
    // Sync before), and a Sync sent later is answered by whichever server.
    let mut bytes = extended("SELECT 8");
    bytes.extend(query_msg("SELECT 9"));
    a.send(&bytes).await.unwrap();
    let r = a.until_ready(STEP).await;
    assert_eq!(col(&r), ["8", "9"], "{r:?}");
    assert_eq!(status(&r), b'I');
    assert_eq!(one(&b, "SELECT 3").await, "3");
    a.send(&sync_msg()).await.unwrap();
    assert_eq!(a.until_ready(STEP).await.len(), 1);
    assert_eq!(col(&a.simple("SELECT 10", STEP).await), ["10"]);
}

/// Session mode, `query_timeout` set: a client idle after a Query skipped inside its
/// batch is not taken for one whose query still runs (the relay counted a
/// ReadyForQuery for it).
#[tokio::test]
async fn an_idle_client_after_a_skipped_query_is_not_in_a_query() {
    let db = fresh_db("sess_mixed_q");
    let s = txn_sluice(&db)
        .setting("pool_mode", "session")
        .setting("query_timeout", "1")
        .start();
    let mut a = raw(&s, &db, &[]).await;
    let mut bytes = extended("SELEC 1");
    bytes.extend(query_msg("SELECT 'skipped'"));
    bytes.extend(sync_msg());
    a.send(&bytes).await.unwrap();
    let r = a.until_ready(STEP).await;
    assert!(first_error(&r).is_some(), "{r:?}");
    // Idle for longer than query_timeout (a bound wait, not a timing assertion).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(col(&a.simple("SELECT 8", STEP).await), ["8"]);
}

/// Reads messages up to and including the first with `tag`.
async fn until_tag(c: &mut RawClient, tag: u8) -> Vec<RawMsg> {
    let mut out = Vec::new();
    loop {
        let m = c.recv(STEP).await.expect("an answer");
        let done = m.tag == tag;
        out.push(m);
        if done {
            return out;
        }
    }
}

/// The cases the relay once left counted (keeping the server until the client left):
/// a batch the server answered in part before its Query came, Queries after one
/// inside the same batch, and batches with such Queries pipelined.
#[tokio::test]
async fn queries_in_batches_answered_in_part_or_one_after_another() {
    for max_prepared in ["200", "0"] {
        let (_s, mut a, b) = one_server("txn_mixed_q2", max_prepared).await;
        // The client waits for its batch's error (Flush) before the Query, which
        // PostgreSQL skips; the Sync's ReadyForQuery lets the server go.
        let mut bytes = extended("SELEC 1");
        bytes.extend(flush_msg());
        a.send(&bytes).await.unwrap();
        until_tag(&mut a, TAG_ERROR).await;
        a.send(&query_msg("SELECT 'skipped'")).await.unwrap();
        a.send(&sync_msg()).await.unwrap();
        let r = a.until_ready(STEP).await;
        assert_eq!(r.len(), 1, "{max_prepared}: {r:?}");
        assert_eq!(status(&r), b'I');
        assert_eq!(one(&b, "SELECT 1").await, "1", "{max_prepared}");
        // Without an error, the Query runs and its ReadyForQuery lets the server go.
        let mut bytes = extended("SELECT 5");
        bytes.extend(flush_msg());
        a.send(&bytes).await.unwrap();
        let r = until_tag(&mut a, b'C').await;
        assert_eq!(col(&r), ["5"], "{max_prepared}: {r:?}");
        a.send(&query_msg("SELECT 6")).await.unwrap();
        assert_eq!(col(&a.until_ready(STEP).await), ["6"]);
        assert_eq!(one(&b, "SELECT 2").await, "2", "{max_prepared}");
        a.send(&sync_msg()).await.unwrap();
        assert_eq!(a.until_ready(STEP).await.len(), 1);
        // A Query that runs, then a batch that fails before two more, all before
        // one Sync: both are skipped.
        let mut bytes = extended("SELECT 7");
        bytes.extend(query_msg("SELECT 8"));
        bytes.extend(extended("SELEC 9"));
        bytes.extend(query_msg("SELECT 'skipped'"));
        bytes.extend(frame(b'Q', b"SELECT 'skipped too'\0"));
        bytes.extend(sync_msg());
        a.send(&bytes).await.unwrap();
        let r = a.until_ready(STEP).await;
        assert_eq!(col(&r), ["7", "8"], "{max_prepared}: {r:?}");
        let r = a.until_ready(STEP).await;
        assert!(first_error(&r).is_some(), "{max_prepared}: {r:?}");
        assert!(col(&r).is_empty(), "{max_prepared}: {r:?}");
        assert_eq!(one(&b, "SELECT 3").await, "3", "{max_prepared}");
        // Two such batches pipelined in one write: the first's Query is skipped,
        // the second's runs.
        let mut bytes = extended("SELEC 1");
        bytes.extend(query_msg("SELECT 'skipped'"));
        bytes.extend(sync_msg());
        bytes.extend(extended("SELECT 11"));
        bytes.extend(query_msg("SELECT 12"));
        bytes.extend(sync_msg());
        a.send(&bytes).await.unwrap();
        let r = a.until_ready(STEP).await;
        assert!(first_error(&r).is_some(), "{max_prepared}: {r:?}");
        assert_eq!(col(&a.until_ready(STEP).await), ["11", "12"]);
        assert_eq!(a.until_ready(STEP).await.len(), 1);
        assert_eq!(one(&b, "SELECT 4").await, "4", "{max_prepared}");
        assert_eq!(col(&a.simple("SELECT 10", STEP).await), ["10"]);
    }
}

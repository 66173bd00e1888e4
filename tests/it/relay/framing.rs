//! Message framing through the relay, driven from a raw socket: several messages
//! in one write, one message over many writes, hand-made extended-protocol
//! batches. Afterwards the server must be judged clean and be reused.

use std::time::Duration;

use super::T;
use crate::support::probe::{marked_sluice, unique_marker, within, Observer};
use crate::support::wire::{self, frame, query_msg, RawClient, TAG_DATA_ROW, TAG_READY};
use crate::support::{MD5_PASSWORD, MD5_USER, TEST_DB};

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Parse + Bind + Execute + Sync for `sql` (no parameters, text results).
fn extended_batch(sql: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut parse = cstr("");
    parse.extend(cstr(sql));
    parse.extend(0u16.to_be_bytes());
    out.extend(frame(b'P', &parse));
    let mut bind = cstr("");
    bind.extend(cstr(""));
    bind.extend([0, 0, 0, 0, 0, 0]);
    out.extend(frame(b'B', &bind));
    let mut exec = cstr("");
    exec.extend(0u32.to_be_bytes());
    out.extend(frame(b'E', &exec));
    out.extend(frame(b'S', &[]));
    out
}

fn rows_and_readies(msgs: &[wire::RawMsg]) -> (Vec<Option<String>>, usize) {
    (
        wire::first_column(msgs),
        msgs.iter().filter(|m| m.tag == TAG_READY).count(),
    )
}

async fn pid_of(raw: &mut RawClient) -> String {
    let msgs = raw.simple("SELECT pg_backend_pid()", T).await;
    wire::first_column(&msgs)[0].clone().unwrap()
}

async fn read_readies(raw: &mut RawClient, n: usize) -> Vec<wire::RawMsg> {
    let mut all = Vec::new();
    for _ in 0..n {
        all.extend(raw.until_ready(T).await);
    }
    all
}

#[tokio::test]
async fn messages_merged_and_split_arbitrarily() {
    let marker = unique_marker("relay_framing");
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .start();
    let obs = Observer::new().await;
    let mut raw = within(
        T,
        "raw login",
        RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[]),
    )
    .await
    .expect("raw login");
    let pid = pid_of(&mut raw).await;

    // Three queries in one write.
    let mut batch = query_msg("SELECT 1");
    batch.extend(query_msg("SELECT 2; SELECT 3"));
    batch.extend(query_msg("SELECT 4"));
    raw.send(&batch).await.unwrap();
    let msgs = read_readies(&mut raw, 3).await;
    let some = |v: &str| Some(v.to_owned());
    assert_eq!(
        rows_and_readies(&msgs),
        (vec![some("1"), some("2"), some("3"), some("4")], 3)
    );

    // One query, one byte per write.
    for b in query_msg("SELECT 'bytewise'") {
        raw.send(&[b]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let msgs = raw.until_ready(T).await;
    assert_eq!(rows_and_readies(&msgs), (vec![some("bytewise")], 1));

    // Extended protocol: two batches in one write, then one cut at every
    // seventh byte.
    let mut two = extended_batch("SELECT 'e1'");
    two.extend(extended_batch("SELECT 'e2'"));
    raw.send(&two).await.unwrap();
    let msgs = read_readies(&mut raw, 2).await;
    assert_eq!(rows_and_readies(&msgs), (vec![some("e1"), some("e2")], 2));
    for chunk in extended_batch("SELECT 'e3'").chunks(7) {
        raw.send(chunk).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let msgs = raw.until_ready(T).await;
    assert_eq!(rows_and_readies(&msgs), (vec![some("e3")], 1));

    // Parse/Bind/Execute now, Sync later: nothing is owed until the Sync.
    let batch = extended_batch("SELECT 'late'");
    let (head, sync) = batch.split_at(batch.len() - 5);
    raw.send(head).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.send(sync).await.unwrap();
    let msgs = raw.until_ready(T).await;
    assert_eq!(rows_and_readies(&msgs), (vec![some("late")], 1));
    assert!(msgs.iter().any(|m| m.tag == TAG_DATA_ROW));

    // A proper goodbye: the server is clean and the next client gets it.
    raw.send(&frame(b'X', &[])).await.unwrap();
    assert!(raw.until_closed(T).await.is_empty());
    obs.wait_pooled(&marker, 1).await;
    let mut next = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    assert_eq!(pid_of(&mut next).await, pid, "clean server was not reused");
}

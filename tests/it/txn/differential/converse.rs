//! One batch of the differential conversation: what is sent, and how its answer is
//! read back (the same way on the direct connection and through Sluice).

use std::time::Duration;

use super::msgs::{ends_answer, show};
use crate::support::wire::{frame, RawClient};

/// How long a read after a Flush waits for what the direct connection answered.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// One round trip's worth of messages: parts that end in a Flush (each read back
/// before the next is sent), then a last part ending in Sync (or a simple Query).
#[derive(Default)]
pub(super) struct Batch {
    /// Bytes of each part, and how many messages in it expect an answer.
    pub parts: Vec<(Vec<u8>, usize)>,
    /// What was sent, for the failure message.
    pub desc: Vec<String>,
    /// A simple Query or FunctionCall before the Sync, after this many answered
    /// messages: it has a ReadyForQuery of its own unless one of them fails (then
    /// PostgreSQL skips it).
    pub query_after: Option<usize>,
    /// What the client sends when the server asks for COPY data (CopyInResponse):
    /// the data and CopyDone, or CopyFail, and a Sync after a COPY by Execute (the
    /// shape of libpq's `PQexecParams` and tokio-postgres's `copy_in`).
    pub copy: Option<Vec<u8>>,
}

impl Batch {
    pub fn push(&mut self, msg: Vec<u8>, what: String) {
        if self.parts.is_empty() {
            self.parts.push((Vec::new(), 0));
        }
        let last = self.parts.len() - 1;
        self.parts[last].0.extend(msg);
        self.parts[last].1 += 1;
        self.desc.push(what);
    }

    pub fn flush(&mut self) {
        if let Some((bytes, n)) = self.parts.last_mut() {
            if *n > 0 {
                bytes.extend(frame(b'H', &[]));
                self.parts.push((Vec::new(), 0));
                self.desc.push("Flush".into());
            }
        }
    }

    pub fn sync(&mut self) {
        if self.parts.is_empty() {
            self.parts.push((Vec::new(), 0));
        }
        let last = self.parts.len() - 1;
        self.parts[last].0.extend(frame(b'S', &[]));
        self.desc.push("Sync".into());
    }
}

/// Sends `batch` and reads its answer. After each Flush it reads until every
/// message of the part is answered or an error skips the rest; with `counts` (the
/// direct connection's answer sizes) it reads exactly that many instead, so a
/// difference shows as a difference rather than a hang. Returns the answer, as
/// text, and the size of each part's answer.
pub(super) async fn converse(
    c: &mut RawClient,
    batch: &Batch,
    counts: Option<&[usize]>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut failed = false;
    let last = batch.parts.len() - 1;
    for (i, (bytes, n)) in batch.parts.iter().enumerate() {
        let failed_before = failed;
        c.send(bytes).await.expect("send a batch");
        let before = out.len();
        loop {
            let done = if let Some(counts) = counts {
                out.len() - before >= counts[i]
            } else if i == last {
                let here: &[String] = &out[before..];
                let readies = here.iter().filter(|m| m.starts_with('Z')).count();
                match batch.query_after {
                    None => readies == 1,
                    // Skipped if an error came before the answers it follows.
                    Some(n) => {
                        let skipped = failed_before
                            || here
                                .iter()
                                .take_while(|m| !m.starts_with('Z'))
                                .scan(0, |answered, m| {
                                    let t = m.as_bytes()[0];
                                    let early = t == b'E' && *answered < n;
                                    *answered += usize::from(ends_answer(t));
                                    Some(early)
                                })
                                .any(|early| early);
                        readies == if skipped { 1 } else { 2 }
                    }
                }
            } else {
                failed
                    || out[before..]
                        .iter()
                        .filter(|m| ends_answer(m.as_bytes()[0]))
                        .count()
                        >= *n
            };
            if done {
                break;
            }
            match c.try_recv(FLUSH_WAIT).await {
                Ok(Some(m)) => {
                    failed |= m.tag == b'E';
                    if m.tag == b'G' {
                        let data = batch.copy.as_deref().expect("a COPY asked for");
                        c.send(data).await.expect("send COPY data");
                    }
                    out.push(show(&m));
                }
                Ok(None) => {
                    out.push("<closed>".into());
                    return out;
                }
                Err(()) => {
                    out.push("<nothing more>".into());
                    return out;
                }
            }
        }
        out.push(format!("-- part {i}: {}", out.len() - before));
    }
    out
}

/// The sizes of a conversation's parts, from its `-- part i: n` lines.
pub(super) fn part_sizes(answer: &[String]) -> Vec<usize> {
    answer
        .iter()
        .filter_map(|l| l.strip_prefix("-- part "))
        .filter_map(|l| l.split(": ").nth(1)?.parse().ok())
        .collect()
}

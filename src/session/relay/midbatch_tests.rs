use super::*;
use crate::fuzzing::conversation::messages;
use crate::fuzzing::model::Model;
use crate::hostile::{msg, Rng};

/// The relay's count around a [`MidBatch`], as `scan_client` and `read_server` keep
/// it: client and server messages by tag.
#[derive(Default)]
struct Count {
    m: MidBatch,
    pending: u32,
    unsynced: u64,
    await_ready: bool,
    /// A ReadyForQuery came with none counted.
    too_low: bool,
}

impl Count {
    /// One client read.
    fn client(&mut self, tags: &[u8]) {
        let fresh = !self.await_ready;
        for &t in tags {
            let before = self.unsynced;
            match t {
                b'Q' | b'F' | b'S' => (self.pending, self.unsynced) = (self.pending + 1, 0),
                b'P' | b'B' | b'D' | b'E' | b'C' => self.unsynced += 1,
                b'H' => self.unsynced |= FLUSHED,
                _ => continue,
            }
            let query = t != b'S';
            if matches!(t, b'Q' | b'F' | b'S')
                && ((before != 0 && query) || self.m.following())
                && self.m.request_end(query, before, self.pending - 1, fresh)
            {
                self.pending -= 1;
                self.await_ready = true;
            }
        }
    }

    /// One server read.
    fn server(&mut self, tags: &[u8]) {
        self.m.server_read(self.unsynced != 0);
        for &t in tags {
            if let Some(n) = self.m.server(t, self.unsynced != 0) {
                self.pending -= n;
                self.await_ready = true;
            }
            if t == b'Z' {
                self.too_low |= self.pending == 0;
                self.pending = self.pending.saturating_sub(1);
                self.await_ready = false;
            }
        }
    }

    /// Whether the relay would take the server for idle.
    fn idle(&self) -> bool {
        self.pending == 0 && self.unsynced == 0 && !self.await_ready
    }
}

#[test]
fn an_error_before_the_query_means_it_is_skipped() {
    let mut c = Count::default();
    c.client(b"PBDEQ");
    c.server(b"12E");
    assert!(!c.idle(), "the server skips to a Sync");
    c.client(b"S");
    c.server(b"Z");
    assert!(c.idle());
    // Without an error it runs, whatever its own answer, and ends the batch.
    c.client(b"PBEQ");
    c.server(b"12DCTDCZ");
    assert!(c.idle());
    c.client(b"PBEQS");
    c.server(b"12CEZ");
    assert!(!c.idle());
    c.server(b"Z");
    assert!(c.idle());
    assert!(c.m.follow.is_none());
}

#[test]
fn earlier_requests_answers_pass_first() {
    let mut c = Count::default();
    // An earlier Query, failing: its error is not the batch's.
    c.client(b"QPBEFS");
    c.server(b"EZ12CVZZ");
    assert!(c.idle());
    // One from an earlier read too, and pipelined batches after.
    c.client(b"Q");
    c.client(b"PBEQPEQSPBES");
    c.server(b"TDCZ1E");
    assert!(!c.idle());
    c.server(b"ZZ");
    assert!(c.idle(), "{:?}", c.m);
}

#[test]
fn a_batch_answered_in_part_before_its_query() {
    let mut c = Count::default();
    // The client waits for the first answers (Flush) before the Query.
    c.client(b"PBH");
    c.server(b"12");
    c.client(b"EQ");
    c.server(b"CTDCZ");
    assert!(c.idle());
    // An error already answered: the Query is skipped at once.
    c.client(b"PBH");
    c.server(b"1E");
    c.client(b"EQ");
    assert!(!c.idle());
    c.client(b"S");
    c.server(b"Z");
    assert!(c.idle());
}

#[test]
fn queries_after_one_in_the_same_batch() {
    let mut c = Count::default();
    // The first runs; the second's batch fails; the third is skipped with it.
    c.client(b"PBEQPBEQQ");
    c.server(b"12CTDCZ12E");
    assert!(!c.idle());
    c.client(b"PBEQS");
    c.server(b"Z");
    assert!(c.idle(), "{:?}", c.m);
    // A Query right after one that was skipped: skipped too, at once.
    c.client(b"PEQ");
    c.server(b"E");
    c.client(b"Q");
    assert_eq!(c.pending, 0);
    c.client(b"S");
    c.server(b"Z");
    assert!(c.idle());
}

#[test]
fn a_copy_stops_the_following_with_the_count_high() {
    let mut c = Count::default();
    // An Execute starts a COPY FROM STDIN; PostgreSQL fails it at the Query (not a
    // copy message) and skips to the Sync.
    c.client(b"PBEQ");
    c.server(b"12GE");
    c.client(b"dcS");
    c.server(b"Z");
    // The count is left as it was: high (the Query's), never low.
    assert_eq!(c.pending, 1);
}

/// The tags of the whole messages in `bytes`.
fn tags(bytes: &[u8]) -> Vec<u8> {
    messages(bytes).map(|(tag, _)| tag).collect()
}

/// Random client scripts against the model of PostgreSQL, read by both sides in
/// random pieces: the count never lets a server go that still owes an answer, and
/// lets it go once it has answered everything.
#[test]
fn the_count_follows_the_model() {
    let mut rng = Rng::new(0x5EED_1234_ABCD_0001);
    for round in 0..20000 {
        // Client messages on the unnamed statement and portal.
        let mut script = Vec::new();
        for _ in 0..rng.below(24) + 1 {
            let (tag, body): (u8, &[u8]) = match rng.below(12) {
                0 => (b'P', b"\0SELECT\0\0\0"),
                1 => (b'P', b"\0ERR\0\0\0"),
                2 => (b'B', b"\0\0\0\0\0\0\0\0"),
                3 => (b'D', b"P\0"),
                4 => (b'E', b"\0\0\0\0\0"),
                5 => (b'C', b"P\0"),
                6 => (b'H', b""),
                7 | 8 => (b'S', b""),
                9 => (b'Q', b"SELECT\0"),
                10 => (b'Q', [&b"ERR\0"[..], b"BEGIN\0", b"COMMIT\0"][rng.below(3)]),
                _ => (b'F', b"\0\0\0\0\0\0\0\0\0\0"),
            };
            script.push(msg(tag, body));
        }
        let all: Vec<u8> = script.iter().map(|m| m[0]).collect();
        // What each side read, for the failure messages.
        let mut log = String::new();
        let (mut c, mut model) = (Count::default(), Model::default());
        let (mut answers, mut server) = (Vec::new(), Vec::new());
        let (mut sent, mut delivered) = (0, 0);
        while sent < all.len() || delivered < server.len() {
            if delivered == server.len() || (sent < all.len() && rng.below(2) == 0) {
                let n = (rng.below(4) + 1).min(all.len() - sent);
                log += &format!(" client {}", String::from_utf8_lossy(&all[sent..sent + n]));
                c.client(&all[sent..sent + n]);
                // The model reads what the relay passed on and answers at once.
                for m in &script[sent..sent + n] {
                    model.feed(m, &mut answers);
                }
                server = tags(&answers);
                sent += n;
            } else {
                let n = (rng.below(4) + 1).min(server.len() - delivered);
                let read = &server[delivered..delivered + n];
                log += &format!(" server {}", String::from_utf8_lossy(read));
                c.server(read);
                delivered += n;
            }
            let owed = server[delivered..].contains(&b'Z') || !model.settled();
            assert!(!(c.idle() && owed), "round {round}: idle while owed:{log}");
            assert!(
                !c.too_low,
                "round {round}: a ReadyForQuery not counted:{log}"
            );
        }
        if model.settled() {
            assert!(c.idle(), "round {round}: kept:{log}");
        }
    }
}

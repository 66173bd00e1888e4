//! The transaction-control statements the pooler reads in a client's simple Query:
//! a `BEGIN` it may answer itself (session/relay/begin.rs) with the transaction modes
//! it carries, a `SET TRANSACTION` that changes them before the first statement, and
//! the statements that end a transaction.
//!
//! Only a text PostgreSQL certainly accepts is taken: keywords of ASCII letters,
//! spaces and commas between them, and one `;` at the end. A comment, a quoted word or
//! any other shape is left for the server to read, as is a mode a server may refuse:
//! `ISOLATION LEVEL SERIALIZABLE` and `READ WRITE` fail on a hot standby.

use std::num::NonZeroU8;

use bytes::BytesMut;

use super::pipeline::alone_text;
use crate::protocol::header::TAG_QUERY;

/// The transaction modes of a `BEGIN` that no server refuses: an isolation level
/// other than `SERIALIZABLE`, `READ ONLY`, `DEFERRABLE` or `NOT DEFERRABLE`, each at
/// most once. Kept by a client whose `BEGIN` was answered: never zero, so that an
/// `Option<Modes>` is one byte too, and an idle client no larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modes(NonZeroU8);

impl Modes {
    /// The isolation level: 0 none given, then READ COMMITTED, REPEATABLE READ and
    /// READ UNCOMMITTED.
    const ISOLATION: u8 = 0b11;
    const READ_ONLY: u8 = 0b100;
    const DEFERRABLE: u8 = 0b1000;
    const NOT_DEFERRABLE: u8 = 0b1_0000;
    /// Set in every value.
    const SET: u8 = 0b1000_0000;

    /// A plain `BEGIN`, with no modes.
    pub const PLAIN: Modes = Modes::new(0);

    const fn new(bits: u8) -> Modes {
        match NonZeroU8::new(bits | Self::SET) {
            Some(v) => Modes(v),
            // (Never: `SET` is in every value.)
            None => Modes(NonZeroU8::MIN),
        }
    }

    fn bits(self) -> u8 {
        self.0.get()
    }

    /// These modes with the kinds named in `set` (bits from `modes_of`) replaced by
    /// its own: a later `SET TRANSACTION` wins, kind by kind.
    fn with(self, set: u8) -> Modes {
        let deferrable = Self::DEFERRABLE | Self::NOT_DEFERRABLE;
        let mut bits = self.bits();
        if set & Self::ISOLATION != 0 {
            bits &= !Self::ISOLATION;
        }
        if set & deferrable != 0 {
            bits &= !deferrable;
        }
        Modes::new(bits | set)
    }

    /// Appends the simple Query of a `BEGIN` with these modes to `out`: its answer is
    /// CommandComplete `BEGIN`, then ReadyForQuery `T`.
    pub fn write_query(self, out: &mut BytesMut) {
        let at = out.len();
        out.extend_from_slice(b"Q\0\0\0\0BEGIN");
        out.extend_from_slice(match self.bits() & Self::ISOLATION {
            1 => b" ISOLATION LEVEL READ COMMITTED",
            2 => b" ISOLATION LEVEL REPEATABLE READ",
            3 => &b" ISOLATION LEVEL READ UNCOMMITTED"[..],
            _ => b"",
        });
        if self.bits() & Self::READ_ONLY != 0 {
            out.extend_from_slice(b" READ ONLY");
        }
        if self.bits() & Self::DEFERRABLE != 0 {
            out.extend_from_slice(b" DEFERRABLE");
        }
        if self.bits() & Self::NOT_DEFERRABLE != 0 {
            out.extend_from_slice(b" NOT DEFERRABLE");
        }
        out.extend_from_slice(&[0]);
        let len = (out.len() - at - 1) as u32;
        out[at + 1..at + 5].copy_from_slice(&len.to_be_bytes());
    }
}

/// If `req` is one simple Query of a `BEGIN` or `START TRANSACTION` alone, with no
/// modes or only modes no server refuses ([`Modes`]), the command tag PostgreSQL
/// answers it with and its modes.
pub fn begin_of(req: &[u8]) -> Option<(&'static [u8], Modes)> {
    // Told apart from other requests by the third letter of the text, `g` or `a`
    // (a text with spaces before it is looked at whole): this runs for every request
    // a client sends while it holds no server.
    let &[TAG_QUERY, _, _, _, _, first, _, third, ..] = req else {
        return None;
    };
    if !matches!(third | 0x20, b'g' | b'a') && !first.is_ascii_whitespace() {
        return None;
    }
    let mut words = [&b""[..]; 16];
    let n = split_words(alone_text(req)?, &mut words)?;
    let words = &words[..n];
    let is = |i: usize, w: &[u8]| words.get(i).is_some_and(|x| x.eq_ignore_ascii_case(w));
    let (tag, i): (&'static [u8], usize) = if is(0, b"begin") {
        (
            b"BEGIN",
            if is(1, b"transaction") || is(1, b"work") {
                2
            } else {
                1
            },
        )
    } else if is(0, b"start") && is(1, b"transaction") {
        (b"START TRANSACTION", 2)
    } else {
        return None;
    };
    Some((tag, Modes::new(modes_of(words, i)?)))
}

/// If `req` is one simple Query of `SET TRANSACTION` alone, with modes no server
/// refuses: `modes` with those it names in their place, as PostgreSQL leaves a
/// transaction that has run nothing yet. Answered `SET`.
pub fn set_transaction_of(req: &[u8], modes: Modes) -> Option<Modes> {
    let mut words = [&b""[..]; 16];
    let n = split_words(alone_text(req)?, &mut words)?;
    let words = &words[..n];
    let is = |i: usize, w: &[u8]| words.get(i).is_some_and(|x| x.eq_ignore_ascii_case(w));
    // Not `SET TRANSACTION` alone, which PostgreSQL refuses.
    if !(is(0, b"set") && is(1, b"transaction")) || n == 2 {
        return None;
    }
    Some(modes.with(modes_of(words, 2)?))
}

/// The modes in `words[i..]` ([`Modes`] bits), each at most once, separated by
/// spaces or commas; `None` if anything else is there.
fn modes_of(words: &[&[u8]], mut i: usize) -> Option<u8> {
    let is = |i: usize, w: &[u8]| words.get(i).is_some_and(|x| x.eq_ignore_ascii_case(w));
    let (start, n) = (i, words.len());
    let mut modes = 0u8;
    while i < n {
        // Modes may be separated by commas, not led or ended by one.
        if i > start && is(i, b",") {
            i += 1;
        }
        let (mode, kind, used) = if is(i, b"isolation") && is(i + 1, b"level") {
            let level = if is(i + 2, b"read") && is(i + 3, b"committed") {
                1
            } else if is(i + 2, b"repeatable") && is(i + 3, b"read") {
                2
            } else if is(i + 2, b"read") && is(i + 3, b"uncommitted") {
                3
            } else {
                return None;
            };
            (level, Modes::ISOLATION, 4)
        } else if is(i, b"read") && is(i + 1, b"only") {
            (Modes::READ_ONLY, Modes::READ_ONLY, 2)
        } else if is(i, b"deferrable") {
            (
                Modes::DEFERRABLE,
                Modes::DEFERRABLE | Modes::NOT_DEFERRABLE,
                1,
            )
        } else if is(i, b"not") && is(i + 1, b"deferrable") {
            (
                Modes::NOT_DEFERRABLE,
                Modes::DEFERRABLE | Modes::NOT_DEFERRABLE,
                2,
            )
        } else {
            return None;
        };
        // Each kind once: a text that repeats one is left to the server.
        if modes & kind != 0 {
            return None;
        }
        modes |= mode;
        i += used;
    }
    Some(modes)
}

/// Splits `text` into words of ASCII letters and commas, into `out`; `None` if it
/// holds anything else or more than `out` holds.
fn split_words<'a>(text: &'a [u8], out: &mut [&'a [u8]]) -> Option<usize> {
    let mut n = 0;
    let mut rest = text.trim_ascii_start();
    while !rest.is_empty() {
        let len = match rest.iter().position(|b| !b.is_ascii_alphabetic()) {
            Some(0) if rest[0] == b',' => 1,
            Some(0) => return None,
            Some(len) => len,
            None => rest.len(),
        };
        *out.get_mut(n)? = &rest[..len];
        n += 1;
        rest = rest[len..].trim_ascii_start();
    }
    Some(n)
}

/// If `req` is one simple Query that ends the transaction its client is in, alone
/// (`COMMIT`, `END`, `ROLLBACK`, `ABORT`, with `TRANSACTION` or `WORK`), the command
/// tag PostgreSQL answers it with in a transaction that has not failed.
pub fn end_tag(req: &[u8]) -> Option<&'static [u8]> {
    let text = alone_text(req)?;
    let is_any = |words: &[&[u8]]| words.iter().any(|w| text.eq_ignore_ascii_case(w));
    if is_any(&[
        b"commit",
        b"commit transaction",
        b"commit work",
        b"end",
        b"end transaction",
        b"end work",
    ]) {
        Some(b"COMMIT")
    } else if is_any(&[
        b"rollback",
        b"rollback transaction",
        b"rollback work",
        b"abort",
        b"abort transaction",
        b"abort work",
    ]) {
        Some(b"ROLLBACK")
    } else {
        None
    }
}

#[cfg(test)]
#[path = "txn_text_tests.rs"]
mod tests;

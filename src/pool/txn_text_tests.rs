//! Unit tests of txn_text.rs: which `BEGIN`s the pooler may answer, with which tag
//! and modes, and the query it sends for them.

use super::{begin_of, end_tag, set_transaction_of, Modes};
use crate::hostile::msg;

fn q(text: &str) -> Vec<u8> {
    msg(b'Q', format!("{text}\0").as_bytes())
}

/// The text of the query a `BEGIN` with `modes` is sent to a server as.
fn sent(modes: Modes) -> String {
    let mut out = bytes::BytesMut::from(&b"x"[..]);
    modes.write_query(&mut out);
    let m = &out[1..];
    assert_eq!(m[0], b'Q');
    let len = u32::from_be_bytes([m[1], m[2], m[3], m[4]]) as usize;
    assert_eq!(len + 1, m.len(), "its length");
    assert_eq!(m.last(), Some(&0));
    String::from_utf8_lossy(&m[5..m.len() - 1]).into()
}

#[test]
fn a_begin_is_taken_with_its_tag_and_the_modes_no_server_refuses() {
    for (text, tag, query) in [
        ("BEGIN", "BEGIN", "BEGIN"),
        ("begin;", "BEGIN", "BEGIN"),
        ("\tbegin transaction", "BEGIN", "BEGIN"),
        ("  Begin Work ; ", "BEGIN", "BEGIN"),
        ("start transaction;", "START TRANSACTION", "BEGIN"),
        ("  START \n TRANSACTION", "START TRANSACTION", "BEGIN"),
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "BEGIN",
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
        ),
        (
            "begin transaction isolation level read committed, read only",
            "BEGIN",
            "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY",
        ),
        (
            "START TRANSACTION READ ONLY,ISOLATION  LEVEL READ UNCOMMITTED DEFERRABLE;",
            "START TRANSACTION",
            "BEGIN ISOLATION LEVEL READ UNCOMMITTED READ ONLY DEFERRABLE",
        ),
        ("begin work not deferrable", "BEGIN", "BEGIN NOT DEFERRABLE"),
        ("BEGIN READ ONLY", "BEGIN", "BEGIN READ ONLY"),
    ] {
        let Some((got, modes)) = begin_of(&q(text)) else {
            panic!("{text:?} not taken");
        };
        assert_eq!(got, tag.as_bytes(), "{text:?}");
        assert_eq!(sent(modes), query, "{text:?}");
    }
}

#[test]
fn a_begin_a_server_may_refuse_or_of_another_shape_is_left_to_it() {
    for no in [
        // A hot standby refuses these.
        "BEGIN ISOLATION LEVEL SERIALIZABLE",
        "BEGIN READ WRITE",
        "START TRANSACTION READ ONLY, READ WRITE",
        // Repeated, or not PostgreSQL's grammar.
        "BEGIN READ ONLY READ ONLY",
        "BEGIN DEFERRABLE NOT DEFERRABLE",
        "BEGIN ISOLATION LEVEL READ COMMITTED ISOLATION LEVEL READ COMMITTED",
        "BEGIN , READ ONLY",
        "BEGIN READ ONLY,",
        "BEGIN READ ONLY,, DEFERRABLE",
        "BEGIN ISOLATION LEVEL",
        "BEGIN ISOLATION LEVEL READ",
        "BEGIN READ",
        "BEGIN WORK WORK",
        "BEGIN TRANSACTION WORK",
        "START",
        "START WORK",
        "BEGI",
        "BEGINS",
        "BEGIN1",
        "\"BEGIN\"",
        // Anything else in the text.
        "BEGIN; SELECT 1",
        "BEGIN;;",
        "/* c */ BEGIN",
        "BEGIN -- c",
        "BEGIN READ_ONLY",
        "SELECT 1",
        "COMMIT",
        "",
    ] {
        assert_eq!(begin_of(&q(no)), None, "{no:?}");
    }
    let many = format!("BEGIN {}", "READ ONLY ".repeat(9));
    assert_eq!(begin_of(&q(&many)), None, "more words than looked at");
    // Another message type, two messages, a cut one.
    assert_eq!(begin_of(&msg(b'P', b"\0BEGIN\0\0\0")), None);
    assert_eq!(begin_of(&[q("BEGIN"), q("SELECT 1")].concat()), None);
    let one = q("BEGIN");
    assert_eq!(begin_of(&one[..one.len() - 1]), None);
}

#[test]
fn the_end_of_a_transaction_is_answered_with_its_tag() {
    for (text, tag) in [
        ("COMMIT", "COMMIT"),
        ("end;", "COMMIT"),
        ("commit work", "COMMIT"),
        ("END TRANSACTION", "COMMIT"),
        (" Rollback Work ", "ROLLBACK"),
        ("ABORT", "ROLLBACK"),
        ("abort transaction;", "ROLLBACK"),
    ] {
        assert_eq!(end_tag(&q(text)), Some(tag.as_bytes()), "{text:?}");
    }
    for no in [
        "COMMIT AND CHAIN",
        "ROLLBACK TO SAVEPOINT a",
        "COMMIT PREPARED 'x'",
        "PREPARE TRANSACTION 'x'",
        "COMMIT; COMMIT",
        "BEGIN",
    ] {
        assert_eq!(end_tag(&q(no)), None, "{no:?}");
    }
}

#[test]
fn a_clients_held_modes_take_one_byte() {
    // Every idle client keeps an `Option<Modes>` (session/run.rs).
    assert_eq!(std::mem::size_of::<Option<Modes>>(), 1);
}

#[test]
fn a_set_transaction_replaces_the_modes_it_names() {
    let begun = |text: &str| begin_of(&q(text)).map(|(_, m)| m).expect("a BEGIN");
    for (begin, set, query) in [
        (
            "START TRANSACTION",
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;",
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
        ),
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY DEFERRABLE",
            "set transaction isolation level read committed, not deferrable",
            "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY NOT DEFERRABLE",
        ),
        (
            "BEGIN ISOLATION LEVEL READ UNCOMMITTED",
            "SET TRANSACTION READ ONLY",
            "BEGIN ISOLATION LEVEL READ UNCOMMITTED READ ONLY",
        ),
        (
            "BEGIN NOT DEFERRABLE",
            "SET  TRANSACTION  DEFERRABLE",
            "BEGIN DEFERRABLE",
        ),
    ] {
        let modes = set_transaction_of(&q(set), begun(begin));
        assert_eq!(modes.map(sent).as_deref(), Some(query), "{begin}; {set}");
    }
    // What a server may refuse, and any other shape, is left to it.
    for text in [
        "SET TRANSACTION",
        "SET TRANSACTION;",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET TRANSACTION READ WRITE",
        "SET TRANSACTION READ ONLY, READ ONLY",
        "SET TRANSACTION SNAPSHOT '00000003-0000001B-1'",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "SET LOCAL TRANSACTION READ ONLY",
        "SET TRANSACTION READ ONLY; SELECT 1",
        "SET TRANSACTION , READ ONLY",
        "SET TRANSACTION READ ONLY,",
        "SET transaction_read_only = on",
    ] {
        assert_eq!(set_transaction_of(&q(text), Modes::PLAIN), None, "{text}");
    }
}

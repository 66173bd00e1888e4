//! Unit tests of pipeline.rs: which requests may go behind another, a canceled
//! answer told by its SQLSTATE, and which canceled answers are written again.

use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;

use super::{canceled, ends_transaction, one_select, simple_begin};
use crate::hostile::msg;
use crate::pool::line::Request;
use crate::pool::testing::lent;
use crate::pool::Pool;
use crate::stats::conns::{test_meta, ClientInfo};

#[test]
fn only_one_select_alone_may_go_behind_another() {
    let q = |t: &str| msg(b'Q', format!("{t}\0").as_bytes());
    for ok in [
        "SELECT 1",
        "select abalance from t where aid = 3;",
        "  \n\tSelect\n1 ;  ",
        "SELECT(1)",
        "SELECT a_b, c_d FROM e_f WHERE g_ = _h",
        "select _config, set_confi, et_config",
    ] {
        assert!(one_select(&q(ok)), "{ok:?}");
    }
    for no in [
        "BEGIN; SELECT 1",
        "SELECT 1; BEGIN",
        "SELECT 1; SELECT 2",
        "select_x()",
        "SELECTED",
        "/* c */ SELECT 1",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "START TRANSACTION",
        "SELECT 'a;b'",
        "SELECT set_config('TimeZone', 'UTC', false)",
        "select pg_catalog.SET_CONFIG('a.b', 'c', false)",
        "SELECT SeT_CoNfIg('a.b', 'c', true) ;",
        "SELECT a_b, set_config",
        "SELECT x_set_config_y()",
        "",
        "SELEC",
    ] {
        assert!(!one_select(&q(no)), "{no:?}");
    }
    // Two messages, a cut one, a bad length, another message type, a NUL inside.
    assert!(!one_select(&[q("SELECT 1"), q("SELECT 1")].concat()));
    let one = q("SELECT 1");
    assert!(!one_select(&one[..one.len() - 1]));
    let mut bad = one.clone();
    bad[4] = bad[4].wrapping_add(1);
    assert!(!one_select(&bad));
    assert!(!one_select(&msg(b'P', b"\0SELECT 1\0\0\0")));
    assert!(!one_select(&msg(b'Q', b"SELECT 1\0; BEGIN\0")));
}

#[test]
fn only_a_plain_begin_or_end_of_a_transaction_is_taken() {
    let q = |t: &str| msg(b'Q', format!("{t}\0").as_bytes());
    for ok in ["BEGIN", "begin;", "  Begin Work ; ", "START TRANSACTION"] {
        assert!(simple_begin(&q(ok)), "{ok:?}");
    }
    for no in [
        "BEGIN ISOLATION LEVEL SERIALIZABLE",
        // (Held by the pooler, but not written behind another.)
        "BEGIN READ ONLY",
        "BEGIN; SELECT 1",
        "BEGIN;;",
        "/* c */ BEGIN",
        "COMMIT",
    ] {
        assert!(!simple_begin(&q(no)), "{no:?}");
    }
    for ok in [
        "COMMIT",
        "end;",
        " Rollback Work ",
        "ABORT",
        "commit transaction",
        "abort work",
    ] {
        assert!(ends_transaction(&q(ok)), "{ok:?}");
    }
    for no in [
        "COMMIT AND CHAIN",
        "ROLLBACK AND CHAIN",
        "COMMIT; BEGIN",
        "ROLLBACK TO SAVEPOINT a",
        "COMMIT PREPARED 'x'",
        "PREPARE TRANSACTION 'x'",
        "END /* c */",
        "BEGIN",
    ] {
        assert!(!ends_transaction(&q(no)), "{no:?}");
    }
    // Two messages, a cut one, another message type.
    assert!(!ends_transaction(&[q("COMMIT"), q("BEGIN")].concat()));
    let one = q("COMMIT");
    assert!(!ends_transaction(&one[..one.len() - 1]));
    assert!(!ends_transaction(&msg(b'P', b"\0COMMIT\0\0\0")));
}

#[test]
fn only_an_extended_run_of_one_select_parsed_with_it_may_go_behind_another() {
    let parse = |name: &str, text: &str| msg(b'P', format!("{name}\0{text}\0\0\0").as_bytes());
    let bind =
        |portal: &str, stmt: &str| msg(b'B', format!("{portal}\0{stmt}\0\0\0\0\0\0\0").as_bytes());
    let describe = msg(b'D', b"P\0");
    let execute = |portal: &str| msg(b'E', format!("{portal}\0\0\0\0\0").as_bytes());
    let (sync, flush) = (msg(b'S', b""), msg(b'H', b""));
    let run = |p: &[Vec<u8>]| one_select(&p.concat());
    let sel = parse("", "SELECT abalance FROM t WHERE aid = $1");
    assert!(run(&[
        sel.clone(),
        bind("", ""),
        describe.clone(),
        execute(""),
        sync.clone()
    ]));
    assert!(run(&[sel.clone(), bind("", ""), execute(""), sync.clone()]));
    let described = msg(b'D', b"S\0");
    assert!(run(&[
        sel.clone(),
        described,
        flush.clone(),
        bind("", ""),
        execute(""),
        sync.clone()
    ]));
    for (why, no) in [
        (
            "a named statement",
            vec![
                parse("s1", "SELECT 1"),
                bind("", "s1"),
                execute(""),
                sync.clone(),
            ],
        ),
        (
            "a named portal",
            vec![sel.clone(), bind("p", ""), execute("p"), sync.clone()],
        ),
        ("no Parse", vec![bind("", ""), execute(""), sync.clone()]),
        ("no Sync", vec![sel.clone(), bind("", ""), execute("")]),
        (
            "two Executes",
            vec![
                sel.clone(),
                bind("", ""),
                execute(""),
                execute(""),
                sync.clone(),
            ],
        ),
        (
            "two Parses",
            vec![
                sel.clone(),
                sel.clone(),
                bind("", ""),
                execute(""),
                sync.clone(),
            ],
        ),
        (
            "Execute before Bind",
            vec![sel.clone(), execute(""), bind("", ""), sync.clone()],
        ),
        (
            "not a SELECT",
            vec![parse("", "BEGIN"), bind("", ""), execute(""), sync.clone()],
        ),
        (
            "set_config",
            vec![
                parse("", "SELECT set_config('a.b', 'c', false)"),
                bind("", ""),
                execute(""),
                sync.clone(),
            ],
        ),
        (
            "a Close",
            vec![
                sel.clone(),
                bind("", ""),
                execute(""),
                msg(b'C', b"S\0"),
                sync.clone(),
            ],
        ),
        (
            "more after the Sync",
            vec![
                sel.clone(),
                bind("", ""),
                execute(""),
                sync.clone(),
                flush.clone(),
            ],
        ),
    ] {
        assert!(!run(&no), "{why}");
    }
    let whole = [sel.clone(), bind("", ""), execute(""), sync.clone()].concat();
    assert!(!one_select(&whole[..whole.len() - 1]), "cut");
    let mut bad = whole.clone();
    bad[4] = bad[4].wrapping_add(1);
    assert!(!one_select(&bad), "a bad length");
    assert!(
        !one_select(&msg(b'P', b"\0SELECT 1")),
        "no NUL after the text"
    );
}

fn err(code: &str) -> Vec<u8> {
    msg(
        b'E',
        format!("SERROR\0C{code}\0Mcanceling statement due to user request\0\0").as_bytes(),
    )
}

#[test]
fn a_canceled_answer_is_told_by_its_sqlstate() {
    let ready = msg(b'Z', b"I");
    let row = msg(b'T', b"\0\0");
    assert!(canceled(&[err("57014"), ready.clone()].concat()));
    assert!(canceled(
        &[row.clone(), err("57014"), ready.clone()].concat()
    ));
    assert!(!canceled(&[err("22012"), ready.clone()].concat()));
    assert!(!canceled(&[row, ready.clone()].concat()));
    // Only as the code field, not in the message text.
    let text = msg(b'E', b"SERROR\0C22012\0Mwhy C57014\0\0");
    assert!(!canceled(&[text, ready].concat()));
}

#[tokio::test]
async fn only_a_request_exposed_to_anothers_cancel_is_written_again() {
    let p = Pool::one_slot_for_tests();
    let (mut conn, mut theirs) = lent(&p);
    theirs.set_nonblocking(true).expect("nonblocking");
    let query = msg(b'Q', b"SELECT 'b'\0");
    let canceled_answer = [err("57014"), msg(b'Z', b"I")].concat();
    // As `Pool::advance` leaves it: exposed or not, the server's count of cancels
    // aimed at it when its turn came.
    let ident = conn.ident.clone();
    let behind = |exposed: bool| {
        let meta = test_meta(1);
        let mut r = Request::new(
            BytesMut::new(),
            Arc::default(),
            Arc::new(ClientInfo::new(meta)),
        );
        r.behind.resend = BytesMut::from(&query[..]);
        r.behind.exposed = exposed;
        r.behind.aimed = ident.aimed.load(Ordering::SeqCst);
        r
    };
    let mut written = || {
        let mut buf = [0u8; 64];
        theirs
            .read(&mut buf)
            .map_or(Vec::new(), |n| buf[..n].to_vec())
    };

    // Exposed, and canceled: written again, once.
    let mut r = behind(true);
    assert!(r.write_again(&mut conn, &canceled_answer));
    assert_eq!(written(), query);
    assert!(!r.write_again(&mut conn, &canceled_answer), "only once");
    assert!(written().is_empty());

    // Not exposed, or not canceled: its answer is its own.
    assert!(!behind(false).write_again(&mut conn, &canceled_answer));
    let other = [err("22012"), msg(b'Z', b"I")].concat();
    assert!(!behind(true).write_again(&mut conn, &other));

    // Its own client aimed a cancel at it since its turn came: that may be what
    // canceled it, and the client is to see it.
    let mut r = behind(true);
    ident.aimed.fetch_add(1, Ordering::SeqCst);
    assert!(!r.write_again(&mut conn, &canceled_answer));
    assert!(written().is_empty());
}

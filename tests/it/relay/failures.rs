//! Failures while relaying: errors inside transactions, clients that vanish
//! mid-query, garbage and oversized messages from raw sockets. The point each time:
//! the guilty client gets an error (or is closed), everyone else is unaffected, and
//! no dirty server connection is reused.

use std::time::{Duration, Instant};

use super::{client, config, T};
use crate::support::probe::{marked_sluice, unique_marker, within, Observer};
use crate::support::wire::{self, RawClient, TAG_ERROR};
use crate::support::{self, SluiceBuilder, MD5_PASSWORD, MD5_USER, TEST_DB};

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_owned())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

#[tokio::test]
async fn error_inside_transaction_then_recovery() {
    let s = super::start_sluice();
    let c = client(&s).await;
    within(T, "BEGIN", c.batch_execute("BEGIN")).await.unwrap();
    let e = within(
        T,
        "bad",
        c.simple_query("SELECT * FROM no_such_table_relay"),
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "42P01");
    let e = within(T, "aborted", c.query("SELECT 1", &[]))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "25P02", "{e}");
    let e = within(T, "aborted simple", c.simple_query("SELECT 1"))
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "25P02", "{e}");
    within(T, "ROLLBACK", c.batch_execute("ROLLBACK"))
        .await
        .unwrap();
    let row = within(T, "after", c.query_one("SELECT 5::int4", &[]))
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 5);

    // Savepoints: recover inside the transaction.
    within(
        T,
        "savepoint",
        c.batch_execute("BEGIN; CREATE TEMP TABLE sp(v int); SAVEPOINT s"),
    )
    .await
    .unwrap();
    let e = within(
        T,
        "bad in sp",
        c.batch_execute("INSERT INTO sp VALUES ('x')"),
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "22P02");
    within(
        T,
        "rollback to",
        c.batch_execute("ROLLBACK TO s; INSERT INTO sp VALUES (1); COMMIT"),
    )
    .await
    .unwrap();
    let n: i64 = within(T, "count", c.query_one("SELECT count(*) FROM sp", &[]))
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test]
async fn client_disconnecting_mid_query_does_not_leave_a_dirty_server() {
    let marker = unique_marker("relay_midq");
    // One server only: if the dirty one were pooled, the next client would get it.
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "20")
        .start();
    let obs = Observer::new().await;
    let mut raw = within(
        T,
        "raw login",
        RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[]),
    )
    .await
    .expect("raw login");
    let msgs = raw.simple("SELECT pg_backend_pid()", T).await;
    let old_pid: i32 = wire::first_column(&msgs)[0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    raw.query("SELECT pg_sleep(5)").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(raw); // abrupt: no Terminate

    let started = Instant::now();
    let c = client(&s).await;
    let pid: i32 = within(
        Duration::from_secs(15),
        "query after the dirty client left",
        c.query_one("SELECT pg_backend_pid()", &[]),
    )
    .await
    .expect("SELECT after a client vanished mid-query")
    .get(0);
    assert_ne!(pid, old_pid, "the server left mid-query was reused");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "new client waited {:?} (for the old query to finish?)",
        started.elapsed()
    );
    // The abandoned backend goes away once its query ends.
    let deadline = Instant::now() + Duration::from_secs(15);
    while obs.alive(old_pid).await {
        assert!(
            Instant::now() < deadline,
            "backend {old_pid} still alive 15 s later"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let row = within(T, "again", c.query_one("SELECT 1::int4", &[]))
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
}

/// Checks that `raw` is told off (an ErrorResponse, or at least closed) within 10 s.
async fn expect_error_and_close(raw: &mut RawClient, what: &str) -> Vec<wire::RawMsg> {
    let msgs = raw.until_closed(Duration::from_secs(10)).await;
    assert!(
        msgs.iter().any(|m| m.tag == TAG_ERROR),
        "{what}: no ErrorResponse before close: {msgs:?}"
    );
    msgs
}

#[tokio::test]
async fn garbage_after_login_only_hurts_its_sender() {
    let s = super::start_sluice();
    let bystander = client(&s).await;
    within(T, "bystander", bystander.query_one("SELECT 1::int4", &[]))
        .await
        .unwrap();

    // A length field no PostgreSQL message can have.
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    raw.simple("SELECT 1", T).await;
    raw.send(b"\xff\xff\xff\xff\xffgarbage garbage garbage")
        .await
        .unwrap();
    let msgs = expect_error_and_close(&mut raw, "bad length").await;
    let err = msgs.iter().find(|m| m.tag == TAG_ERROR).unwrap();
    assert_eq!(err.field(b'C').as_deref(), Some("08P01"), "{msgs:?}");

    // Well-framed, but not a frontend message type.
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    raw.simple("SELECT 1", T).await;
    raw.send(&wire::frame(b'y', b"garbage")).await.unwrap();
    let msgs = expect_error_and_close(&mut raw, "unknown message type").await;
    // PgBouncer's words, and its log line naming the type; the message reached no
    // server (PostgreSQL would have ended that server's session too).
    let err = msgs.iter().find(|m| m.tag == TAG_ERROR).unwrap();
    assert_eq!(err.field(b'M').as_deref(), Some("unknown pkt"), "{msgs:?}");
    assert!(
        s.log().contains("unknown pkt from client: 121/0x79"),
        "{}",
        s.diagnostics()
    );
    assert!(
        !s.log().contains("invalid frontend message type"),
        "{}",
        s.diagnostics()
    );

    // Random bytes.
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    let junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let _ = raw.send(&junk).await;
    raw.until_closed(Duration::from_secs(10)).await;

    // Everyone else is fine.
    let row = within(
        T,
        "bystander after",
        bystander.query_one("SELECT 2::int4", &[]),
    )
    .await
    .expect("bystander query after garbage");
    assert_eq!(row.get::<_, i32>(0), 2);
    let fresh = client(&s).await;
    let row = within(T, "fresh", fresh.query_one("SELECT 3::int4", &[]))
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 3);
}

#[tokio::test]
async fn oversized_message_is_refused() {
    let s = SluiceBuilder::new()
        .userlist(MD5_USER, MD5_PASSWORD)
        .setting("max_packet_size", "1000")
        .start();
    let c = support::connect(&config(&s)).await;

    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    // Just under the limit passes.
    let sql = format!("SELECT length('{}')", "a".repeat(900));
    let msgs = raw.simple(&sql, T).await;
    assert_eq!(wire::first_column(&msgs), [Some("900".to_owned())]);
    // Over it: an error, and the connection is closed.
    let sql = format!("SELECT length('{}')", "a".repeat(5000));
    raw.query(&sql).await.unwrap();
    let msgs = expect_error_and_close(&mut raw, "oversized Query").await;
    let err = msgs.iter().find(|m| m.tag == TAG_ERROR).unwrap();
    assert_eq!(err.field(b'C').as_deref(), Some("08P01"), "{msgs:?}");
    // PgBouncer's words: the header (tag, length) in hex.
    let why = format!("bad packet header: '51{:08x}'", sql.len() + 5);
    assert_eq!(err.field(b'M').as_deref(), Some(why.as_str()), "{msgs:?}");

    // Announcing a huge message without sending it is refused just the same.
    let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
        .await
        .expect("raw login");
    let mut header = vec![b'Q'];
    header.extend_from_slice(&100_000_000u32.to_be_bytes());
    raw.send(&header).await.unwrap();
    let msgs = expect_error_and_close(&mut raw, "huge announced length").await;
    let err = msgs.iter().find(|m| m.tag == TAG_ERROR).unwrap();
    let why = "bad packet header: '5105f5e100'";
    assert_eq!(err.field(b'M').as_deref(), Some(why), "{msgs:?}");
    assert!(
        s.log().contains(&format!("closing because: {why}")),
        "{}",
        s.diagnostics()
    );

    let row = within(T, "bystander", c.query_one("SELECT 1::int4", &[]))
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
}

/// `disable_pqexec`: a Query message closes its client with PgBouncer's reason, and
/// reaches no server; the extended protocol works, and other clients are unaffected.
/// Transaction mode reads client messages through the prepared-statement rewriter,
/// session mode through the plain scan: both are checked.
#[tokio::test]
async fn disable_pqexec_refuses_simple_queries() {
    for mode in ["session", "transaction"] {
        let s = SluiceBuilder::new()
            .userlist(MD5_USER, MD5_PASSWORD)
            .setting("pool_mode", mode)
            .setting("disable_pqexec", "1")
            .setting("admin_users", MD5_USER)
            .start();
        // The console takes its (simple) queries all the same.
        let admin = crate::admin::console(&s, MD5_USER, MD5_PASSWORD).await;
        within(T, "SHOW VERSION", admin.simple_query("SHOW VERSION"))
            .await
            .expect("console query");
        let c = support::connect(&config(&s)).await;
        let row = within(T, "extended", c.query_one("SELECT 2::int4", &[]))
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), 2);

        let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
            .await
            .expect("raw login");
        raw.query("CREATE TABLE pqexec_should_not_exist (x int)")
            .await
            .unwrap();
        let msgs = expect_error_and_close(&mut raw, "simple Query").await;
        let err = msgs.iter().find(|m| m.tag == TAG_ERROR).unwrap();
        assert_eq!(
            err.field(b'M').as_deref(),
            Some("PQexec disallowed"),
            "{msgs:?}"
        );
        assert_eq!(err.field(b'C').as_deref(), Some("08P01"), "{msgs:?}");
        assert!(
            s.log().contains("closing because: PQexec disallowed"),
            "{}",
            s.log()
        );

        let row = within(
            T,
            "bystander",
            c.query_one(
                "SELECT count(*)::int4 FROM pg_class WHERE relname = 'pqexec_should_not_exist'",
                &[],
            ),
        )
        .await
        .unwrap();
        assert_eq!(row.get::<_, i32>(0), 0, "{mode}: the refused Query ran");
    }
}

#[tokio::test]
async fn client_leaving_inside_a_transaction_commits_nothing() {
    let marker = unique_marker("relay_opentx");
    // One server: each client below gets the previous one's, unless it was closed.
    let s = marked_sluice(&marker)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "10")
        .start();
    let table = unique_marker("relay_opentx_t");
    let c = client(&s).await;
    within(
        T,
        "setup",
        c.batch_execute(&format!("CREATE TABLE {table}(v int)")),
    )
    .await
    .unwrap();
    drop(c);
    for terminate in [true, false] {
        let mut raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
            .await
            .expect("raw login");
        raw.simple(&format!("BEGIN; INSERT INTO {table} VALUES (1)"), T)
            .await;
        if terminate {
            raw.send(&wire::frame(b'X', &[])).await.unwrap();
        }
        drop(raw);
        // The next client sees nothing of it, and is not inside it: the
        // ReadyForQuery after its first query says idle, not in a transaction.
        let mut next = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, TEST_DB, &[])
            .await
            .expect("raw login");
        let msgs = next
            .simple(&format!("SELECT count(*) FROM {table}"), T)
            .await;
        assert!(
            wire::first_error(&msgs).is_none(),
            "terminate={terminate}: {msgs:?}"
        );
        assert_eq!(
            wire::first_column(&msgs),
            [Some("0".to_owned())],
            "terminate={terminate}: uncommitted insert visible"
        );
        let ready = msgs.last().unwrap();
        assert_eq!(
            ready.body, b"I",
            "terminate={terminate}: next client inherited an open transaction"
        );
    }
}

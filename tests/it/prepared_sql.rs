//! SQL-level PREPARE / EXECUTE / DEALLOCATE in transaction mode (issue 5, item 3):
//! each client's statements follow it from server to server.

use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;

use crate::support::probe::within;
use crate::txn::common::{client, fresh_db, txn_sluice, STEP};

/// First column of the rows of a simple query.
async fn col(c: &tokio_postgres::Client, sql: &str) -> Result<Vec<String>, String> {
    let msgs = within(STEP, sql, c.simple_query(sql)).await.map_err(|e| {
        e.as_db_error()
            .map(|d| d.message().to_owned())
            .unwrap_or(e.to_string())
    })?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_owned()),
            _ => None,
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_prepared_statements_follow_each_client_across_servers() {
    let db = fresh_db("prep_sql");
    let s = txn_sluice(&db).setting("default_pool_size", "2").start();
    let mut tasks = Vec::new();
    for w in 0..8i64 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            // Same name, different text per client: each must run its own.
            col(&c, &format!("PREPARE q (int) AS SELECT $1 * {}", w + 1)).await?;
            for i in 0..40i64 {
                let got = if i % 3 == 0 {
                    col(&c, "BEGIN").await?;
                    let r = col(&c, &format!("EXECUTE q({i})")).await?;
                    col(&c, "COMMIT").await?;
                    r
                } else {
                    col(&c, &format!("execute q ({i});")).await?
                };
                if got != vec![(i * (w + 1)).to_string()] {
                    return Err(format!("worker {w} step {i}: got {got:?}"));
                }
            }
            col(&c, "DEALLOCATE q").await?;
            match col(&c, "EXECUTE q(1)").await {
                Err(e) if e.contains("does not exist") => {}
                other => return Err(format!("after DEALLOCATE: {other:?}")),
            }
            // The name can be prepared again, and DEALLOCATE ALL drops it.
            col(&c, "PREPARE q AS SELECT 'again'").await?;
            if col(&c, "EXECUTE q").await? != vec!["again".to_owned()] {
                return Err("re-prepared statement".into());
            }
            col(&c, "DEALLOCATE ALL").await?;
            match col(&c, "EXECUTE q").await {
                Err(e) if e.contains("does not exist") => Ok(()),
                other => Err(format!("after DEALLOCATE ALL: {other:?}")),
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(60), "worker", t)
            .await
            .expect("join")
            .expect("worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sql_prepare_leaves_no_statement() {
    let db = fresh_db("prep_sql_err");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let c = client(&s, &db).await;
    let e = col(&c, "PREPARE bad AS SELECT * FROM no_such_table")
        .await
        .unwrap_err();
    assert!(e.contains("no_such_table"), "{e}");
    let e = col(&c, "EXECUTE bad").await.unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    // The connection and the pool are fine afterwards.
    col(&c, "PREPARE good AS SELECT 7").await.unwrap();
    assert_eq!(col(&c, "EXECUTE good").await.unwrap(), vec!["7".to_owned()]);
}

/// After DDL changes a prepared statement's result type, PostgreSQL fails its next
/// execution ("cached plan must not change result type"); a client that prepares the
/// text again must then get a working statement, as it would directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_preparing_after_a_result_type_change_works() {
    let db = fresh_db("prep_ddl");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let c = client(&s, &db).await;
    col(&c, "CREATE TABLE t (a int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let st = within(STEP, "prepare", c.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    let rows = within(STEP, "query", c.query(&st, &[])).await.unwrap();
    assert_eq!(rows[0].len(), 1);
    // DDL from elsewhere: the client's next message is its Bind, right after a Sync.
    // It prepared the statement before the DDL, so PostgreSQL fails it directly too,
    // and Sluice must not hide that (the client knows the old shape).
    crate::txn::common::direct(&db, "ALTER TABLE t ADD COLUMN b int");
    let e = within(STEP, "stale query", c.query(&st, &[]))
        .await
        .unwrap_err();
    let code = e.as_db_error().map(|d| d.code().code().to_owned());
    assert_eq!(code.as_deref(), Some("0A000"), "{e}");
    // The driver's usual reaction: prepare again.
    let st = within(STEP, "re-prepare", c.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    let rows = within(STEP, "fresh query", c.query(&st, &[]))
        .await
        .unwrap();
    assert_eq!(rows[0].len(), 2);
    // An SQL-level statement: EXECUTE fails as PostgreSQL fails it, and the next
    // EXECUTE of the name prepares the text afresh (PostgreSQL would keep failing).
    col(&c, "PREPARE q AS SELECT * FROM t").await.unwrap();
    assert_eq!(col(&c, "EXECUTE q").await, Ok(vec!["1".to_owned()]));
    crate::txn::common::direct(&db, "ALTER TABLE t DROP COLUMN a");
    let e = col(&c, "EXECUTE q").await.unwrap_err();
    assert!(e.contains("cached plan must not change result type"), "{e}");
    assert_eq!(col(&c, "EXECUTE q").await, Ok(vec!["NULL".to_owned()]));
}

/// A client that prepares a statement after DDL changed its result type must get the
/// new shape, as it would directly, even when its server still holds an older copy
/// of the same text from another client (issue 5: no client-visible error where
/// PostgreSQL would not give one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_prepared_after_ddl_sees_the_new_shape() {
    let db = fresh_db("prep_ddl2");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let a = client(&s, &db).await;
    col(&a, "CREATE TABLE t (a int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let st = within(STEP, "prepare a", a.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    within(STEP, "query a", a.query(&st, &[])).await.unwrap();
    col(&a, "ALTER TABLE t ADD COLUMN b int").await.unwrap();
    // B arrives after the DDL; the only server still has A's copy of the text.
    let b = client(&s, &db).await;
    let st = within(STEP, "prepare b", b.prepare("SELECT * FROM t"))
        .await
        .unwrap();
    assert_eq!(st.columns().len(), 2, "B was described the old shape");
    let rows = within(STEP, "query b", b.query(&st, &[])).await.unwrap();
    assert_eq!(rows[0].len(), 2);
}

/// One namespace for both kinds of statement, as in PostgreSQL: EXECUTE runs a
/// statement the client Parsed, Bind binds one it PREPAREd, DEALLOCATE drops a
/// Parsed one (its name is free again), each wherever the statement is prepared.
#[tokio::test]
async fn sql_and_protocol_statements_share_one_namespace() {
    use crate::support::wire::{frame, query_msg};
    use crate::txn::common::{col as cols, first_error, raw, status, sync_msg};
    let db = fresh_db("prep_cross");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "2")
        .setting("max_prepared_statements", "2")
        .start();
    let mut c = raw(&s, &db, &[]).await;
    let parse = |name: &str, sql: &str| {
        let mut b = Vec::new();
        for part in [name, sql] {
            b.extend_from_slice(part.as_bytes());
            b.push(0);
        }
        b.extend_from_slice(&[0, 0]);
        frame(b'P', &b)
    };
    let bind_execute = |stmt: &str, param: &str| {
        let mut b = vec![0u8];
        b.extend_from_slice(stmt.as_bytes());
        b.extend_from_slice(&[0, 0, 0, 0, 1]);
        b.extend_from_slice(&(param.len() as u32).to_be_bytes());
        b.extend_from_slice(param.as_bytes());
        b.extend_from_slice(&[0, 0]);
        let mut out = frame(b'B', &b);
        out.extend(frame(b'E', &[0, 0, 0, 0, 0]));
        out.extend(sync_msg());
        out
    };
    let mut req = parse("p1", "SELECT $1::int4 * 10");
    req.extend(sync_msg());
    c.send(&req).await.unwrap();
    let r = c.until_ready(STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    // Others, so that p1 is evicted from the servers' caches of two.
    for (i, sql) in ["SELECT 1", "SELECT 2", "SELECT 3"].iter().enumerate() {
        let mut req = parse(&format!("o{i}"), sql);
        req.extend(sync_msg());
        c.send(&req).await.unwrap();
        c.until_ready(STEP).await;
    }
    for round in 0..3 {
        let r = c.simple("EXECUTE p1(4)", STEP).await;
        assert_eq!(cols(&r), ["40"], "round {round}: {r:?}");
    }
    let r = c.simple("PREPARE q2 AS SELECT $1::int4 + 100", STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    c.send(&bind_execute("q2", "5")).await.unwrap();
    let r = c.until_ready(STEP).await;
    assert_eq!(cols(&r), ["105"], "{r:?}");
    let r = c.simple("DEALLOCATE p1", STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    let r = c.simple("EXECUTE p1(4)", STEP).await;
    let e = first_error(&r).expect("p1 is gone");
    assert_eq!(e.field(b'C').as_deref(), Some("26000"), "{r:?}");
    // A second PREPARE of q2 is refused (42P05); that refusal ends only its own
    // Query: the next requests are answered as usual.
    c.send(&query_msg("PREPARE q2 AS SELECT 1")).await.unwrap();
    let r = c.until_ready(STEP).await;
    assert_eq!(
        first_error(&r).and_then(|e| e.field(b'C')).as_deref(),
        Some("42P05")
    );
    assert_eq!(status(&r), b'I');
    // The same in a transaction (the server stays with the client): the refusal
    // fails the transaction, and a Close then a Parse of a name are answered as
    // PostgreSQL answers them.
    let r = c.simple("BEGIN", STEP).await;
    assert_eq!(status(&r), b'T');
    c.send(&query_msg("PREPARE q2 AS SELECT 1")).await.unwrap();
    let r = c.until_ready(STEP).await;
    assert_eq!(
        first_error(&r).and_then(|e| e.field(b'C')).as_deref(),
        Some("42P05")
    );
    assert_eq!(status(&r), b'E');
    let mut req = frame(b'C', b"So0\0");
    req.extend(parse("o0", "ROLLBACK"));
    let mut b = frame(b'B', b"\0o0\0\0\0\0\0\0\0");
    b.extend(frame(b'E', &[0, 0, 0, 0, 0]));
    b.extend(sync_msg());
    req.extend(b);
    c.send(&req).await.unwrap();
    let r = c.until_ready(STEP).await;
    let tags: Vec<u8> = r.iter().map(|m| m.tag).collect();
    assert_eq!(tags, b"312CZ", "{r:?}");
    assert_eq!(status(&r), b'I');
    let mut req = frame(b'C', b"Sq2\0");
    req.extend(parse("q2", "SELECT $1::int4 - 1"));
    req.extend(bind_execute("q2", "8"));
    c.send(&req).await.unwrap();
    let r = c.until_ready(STEP).await;
    assert_eq!(cols(&r), ["7"], "{r:?}");
    let mut req = parse("p1", "SELECT $1::int4 * 3");
    req.extend(bind_execute("p1", "3"));
    c.send(&req).await.unwrap();
    let r = c.until_ready(STEP).await;
    assert_eq!(cols(&r), ["9"], "{r:?}");
}

/// A waiting client's query that drops every prepared statement of its server,
/// without starting with DEALLOCATE (so it is handed over in line, and on
/// one event loop its answer may be relayed for it): the server's statements are
/// known gone, and the next client's Bind prepares its statement again.
#[tokio::test]
async fn a_waiting_clients_deallocate_all_is_seen() {
    let db = fresh_db("prep_wait_dealloc");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let a = client(&s, &db).await;
    let stmt = within(STEP, "prepare", a.prepare("SELECT $1::int + 1"))
        .await
        .expect("prepare");
    let one = |r: Vec<tokio_postgres::Row>| r[0].get::<_, i32>(0);
    let rows = within(STEP, "bind", a.query(&stmt, &[&1])).await;
    assert_eq!(rows.map(one).expect("first run"), 2);
    for round in 0..3 {
        // The one server is held, so the next query waits in line with its request.
        let holder = client(&s, &db).await;
        within(STEP, "BEGIN", holder.batch_execute("BEGIN"))
            .await
            .expect("BEGIN");
        let waiter = client(&s, &db).await;
        // (DISCARD ALL cannot share a query string: it refuses a transaction block.)
        let sql = ["SELECT 1; DEALLOCATE ALL", "select 1 ;deallocate all;"][round % 2];
        let waiting = tokio::spawn(async move { col(&waiter, sql).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        within(STEP, "COMMIT", holder.batch_execute("COMMIT"))
            .await
            .expect("COMMIT");
        let got = within(STEP, "the waiter", waiting)
            .await
            .expect("waiter task");
        assert_eq!(got, Ok(vec!["1".to_owned()]), "round {round}");
        // The statement is gone from the server: Sluice must prepare it again.
        let rows = within(STEP, "bind again", a.query(&stmt, &[&(round as i32)])).await;
        let rows = rows.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(one(rows), round as i32 + 1, "round {round}");
    }
}

/// Sluice's server-side statement names (`SLUICE_<n>`, `sluice_<n>`) are another
/// client's statements: a client that does not hold them gets PostgreSQL's answer
/// for a name it never prepared, by either protocol, and the owner's statements keep
/// working. One that drops such a statement where Sluice cannot see it (inside a
/// multi-statement query) costs the owner one error at most (none where the batch
/// can be sent again): the statement is then prepared again.
#[tokio::test]
async fn sluices_own_statement_names_are_not_other_clients_to_drop() {
    use crate::support::wire::frame;
    use crate::txn::common::{col as cols, first_error, raw, status, sync_msg};
    let db = fresh_db("prep_own_names");
    // One server: both clients get the same one.
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let a = client(&s, &db).await;
    let stmt = within(STEP, "prepare", a.prepare("SELECT $1::int + 1"))
        .await
        .expect("prepare");
    col(&a, "PREPARE q AS SELECT 7").await.expect("PREPARE");
    let owner_runs = |tag: &'static str| {
        let (a, stmt) = (&a, &stmt);
        async move {
            let rows = within(STEP, tag, a.query(stmt, &[&41])).await;
            let rows = rows.unwrap_or_else(|e| panic!("{tag}: {e}"));
            assert_eq!(rows[0].get::<_, i32>(0), 42, "{tag}");
            assert_eq!(col(a, "EXECUTE q").await, Ok(vec!["7".to_owned()]), "{tag}");
        }
    };
    owner_runs("first run").await;
    let mut b = raw(&s, &db, &[]).await;
    let r = b
        .simple(
            "SELECT name FROM pg_prepared_statements ORDER BY name",
            STEP,
        )
        .await;
    let names = cols(&r);
    let protocol = names.iter().find(|n| n.starts_with("SLUICE_")).cloned();
    let sql = names.iter().find(|n| n.starts_with("sluice_")).cloned();
    let (Some(protocol), Some(sql)) = (protocol, sql) else {
        panic!("the server's statements: {names:?}");
    };
    let code = |r: &[crate::support::wire::RawMsg]| {
        first_error(r).and_then(|e| Some((e.field(b'C')?, e.field(b'M')?)))
    };
    let missing = |name: &str| {
        Some((
            "26000".to_owned(),
            format!("prepared statement \"{name}\" does not exist"),
        ))
    };
    for (sql_text, name) in [
        (format!("DEALLOCATE \"{protocol}\""), &protocol),
        (format!("EXECUTE \"{protocol}\"(1)"), &protocol),
        (format!("deallocate {sql}"), &sql),
        (format!("EXECUTE {sql}"), &sql),
    ] {
        let r = b.simple(&sql_text, STEP).await;
        assert_eq!(code(&r), missing(name), "{sql_text}: {r:?}");
        assert_eq!(status(&r), b'I', "{sql_text}");
    }
    // In a failed transaction PostgreSQL refuses EXECUTE before it looks at the name.
    b.simple("BEGIN", STEP).await;
    let r = b.simple("SELECT 1/0", STEP).await;
    assert_eq!(status(&r), b'E', "{r:?}");
    let r = b.simple(&format!("EXECUTE {sql}"), STEP).await;
    let aborted = first_error(&r).and_then(|e| e.field(b'C'));
    assert_eq!(aborted.as_deref(), Some("25P02"), "{r:?}");
    assert_eq!(status(&r), b'E');
    b.simple("ROLLBACK", STEP).await;
    owner_runs("after SQL").await;
    // Bind and Describe of the name: 26000, and the batch is skipped to its Sync.
    let bind = |name: &str| {
        let mut body = vec![0u8];
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 1, b'1', 0, 0]);
        frame(b'B', &body)
    };
    let mut req = bind(&protocol);
    req.extend(frame(b'E', &[0, 0, 0, 0, 0]));
    req.extend(sync_msg());
    let mut describe = vec![b'S'];
    describe.extend_from_slice(sql.as_bytes());
    describe.push(0);
    req.extend(frame(b'D', &describe));
    req.extend(sync_msg());
    b.send(&req).await.expect("send");
    let r = b.until_ready(STEP).await;
    assert_eq!(code(&r), missing(&protocol), "{r:?}");
    let r = b.until_ready(STEP).await;
    assert_eq!(code(&r), missing(&sql), "{r:?}");
    // Close of a name never prepared: CloseComplete, as PostgreSQL answers it.
    let mut close = vec![b'S'];
    close.extend_from_slice(protocol.as_bytes());
    close.push(0);
    let mut req = frame(b'C', &close);
    req.extend(sync_msg());
    b.send(&req).await.expect("send");
    let r = b.until_ready(STEP).await;
    let tags: Vec<u8> = r.iter().map(|m| m.tag).collect();
    assert_eq!(tags, b"3Z", "{r:?}");
    owner_runs("after the extended protocol").await;
    // Dropped where Sluice does not look. A batch that starts with a Describe of it
    // (a driver preparing the same text again) is sent again, prepared anew: no error.
    let drop = format!("SELECT 1; DEALLOCATE \"{protocol}\"");
    let r = b.simple(&drop, STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    let again = within(STEP, "prepare again", a.prepare("SELECT $1::int + 1")).await;
    let again = again.expect("prepare of a statement dropped behind Sluice's back");
    let rows = within(STEP, "bind", a.query(&again, &[&1])).await;
    assert_eq!(rows.expect("run")[0].get::<_, i32>(0), 2);
    // A Bind of it: one error for the owner at most.
    let r = b.simple(&drop, STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    let mut failures = Vec::new();
    for round in 0..2 {
        match within(STEP, "bind", a.query(&stmt, &[&round])).await {
            Ok(rows) => assert_eq!(rows[0].get::<_, i32>(0), round + 1),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.len() <= 1, "{failures:?}");
    owner_runs("prepared again").await;
    // The same for an SQL-level statement run by EXECUTE.
    let r = b.simple(&format!("SELECT 1; DEALLOCATE {sql}"), STEP).await;
    assert!(first_error(&r).is_none(), "{r:?}");
    let mut failures = Vec::new();
    for _ in 0..2 {
        match col(&a, "EXECUTE q").await {
            Ok(rows) => assert_eq!(rows, ["7"]),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.len() <= 1, "{failures:?}");
    owner_runs("prepared again by SQL").await;
}

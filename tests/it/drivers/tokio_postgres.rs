//! tokio-postgres, which always prepares (every query is a named statement
//! `s<n>`; a `&str` query is prepared, run and closed), through Sluice: the
//! driver-matrix scenario of `drivers.rs`, in-process. Concurrent requests on one
//! client are pipelined (Binds sent before earlier answers arrive).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, Statement};

use super::{driver_db, driver_sluice, ITERS, WORKERS};
use crate::support::probe::within;
use crate::support::{connect, Sluice, MD5_PASSWORD, MD5_USER};

const Q_DOUBLE: &str = "SELECT $1::int * 2, $2::text";
const Q_INSERT: &str = "INSERT INTO items (worker, seq, val) VALUES ($1, $2, $3)";
const Q_VAL: &str = "SELECT val FROM items WHERE worker = $1 AND seq = $2";
const Q_COUNT: &str = "SELECT count(*) FROM items WHERE worker = $1";
const Q_BANG: &str = "UPDATE items SET val = val || '!' WHERE worker = $1 AND seq = $2";
const Q_DIV: &str = "SELECT 100 / $1::int";
const Q_STAR: &str = "SELECT * FROM ddl_t WHERE id = $1";
const Q_A: &str = "SELECT a FROM ddl_t WHERE id = $1";
const DDL: &str = "ALTER TABLE ddl_t ADD COLUMN b text NOT NULL DEFAULT 'x'";

/// The statements a worker keeps, re-used across transactions.
struct Stmts {
    double: Statement,
    insert: Statement,
    val: Statement,
    count: Statement,
    bang: Statement,
    div: Statement,
}

async fn prepare_all(c: &Client) -> Result<Stmts, Error> {
    Ok(Stmts {
        double: c.prepare(Q_DOUBLE).await?,
        insert: c.prepare(Q_INSERT).await?,
        val: c.prepare(Q_VAL).await?,
        count: c.prepare(Q_COUNT).await?,
        bang: c.prepare(Q_BANG).await?,
        div: c.prepare(Q_DIV).await?,
    })
}

pub(super) async fn client(s: &Sluice, db: &str) -> Client {
    connect(&s.config(MD5_USER, MD5_PASSWORD, db)).await
}

/// The error with the server's message (tokio-postgres displays just "db error").
fn why(e: &Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {} ({})", e, d.message(), d.code().code()),
        None => e.to_string(),
    }
}

fn state(r: Result<impl Sized, Error>) -> Option<SqlState> {
    r.err().and_then(|e| e.code().cloned())
}

/// Iteration `i` of worker `w` (panics on anything unexpected).
async fn iteration(c: &Client, st: &mut Stmts, w: i32, i: i32) {
    let at = format!("worker {w} iteration {i}");
    let k = w * 100_000 + i;
    let tag = format!("w{w}-i{i}");
    let row = if w % 2 == 0 {
        c.query_one(&st.double, &[&k, &tag]).await
    } else {
        // Prepared, executed and closed again every time.
        c.query_one(Q_DOUBLE, &[&k, &tag]).await
    };
    let row = row.unwrap_or_else(|e| panic!("{at}: double: {}", why(&e)));
    assert_eq!(
        (row.get::<_, i32>(0), row.get::<_, &str>(1)),
        (2 * k, &*tag)
    );

    // A transaction of several statements, the last three pipelined.
    let v = format!("v{w}-{i}");
    c.batch_execute("BEGIN").await.unwrap();
    c.execute(&st.insert, &[&w, &i, &v]).await.unwrap();
    let (wi, wo): (&[&(dyn ToSql + Sync)], &[&(dyn ToSql + Sync)]) = (&[&w, &i], &[&w]);
    let (val, count, bang) = tokio::try_join!(
        c.query_one(&st.val, wi),
        c.query_one(&st.count, wo),
        c.execute(&st.bang, wi),
    )
    .unwrap_or_else(|e| panic!("{at}: transaction: {}", why(&e)));
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(val.get::<_, &str>(0), v, "{at}");
    assert_eq!(count.get::<_, i64>(0), i64::from(i + 1), "{at}");
    assert_eq!(bang, 1, "{at}");

    if i % 7 == 3 {
        let r = c.query_one(&st.div, &[&0i32]).await;
        assert_eq!(state(r), Some(SqlState::DIVISION_BY_ZERO), "{at}: 100 / 0");
        let q: i32 = c.query_one(&st.div, &[&4i32]).await.unwrap().get(0);
        assert_eq!(q, 25, "{at}");
        if i % 14 == 3 {
            c.batch_execute("BEGIN").await.unwrap();
            c.query_one(&st.double, &[&k, &"t"]).await.unwrap();
            let r = c.query_one(&st.div, &[&0i32]).await;
            assert_eq!(state(r), Some(SqlState::DIVISION_BY_ZERO), "{at}: in txn");
            c.batch_execute("ROLLBACK").await.unwrap();
            let n: i64 = c.query_one(&st.count, &[&w]).await.unwrap().get(0);
            assert_eq!(n, i64::from(i + 1), "{at}: count after rollback");
        }
    }

    if i % 10 == 9 {
        // As with PostgreSQL itself: the statements are gone, prepare them again.
        let command = if (i / 10) % 2 == 0 {
            "DEALLOCATE ALL"
        } else {
            "DISCARD ALL"
        };
        c.batch_execute(command).await.unwrap();
        let r = c.query_one(&st.double, &[&k, &tag]).await;
        assert_eq!(
            state(r),
            Some(SqlState::INVALID_SQL_STATEMENT_NAME),
            "{at}: a statement survived {command}"
        );
        *st = prepare_all(c).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokio_postgres() {
    let db = driver_db("drv_tokio");
    let s = Arc::new(driver_sluice(&db).start());
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..WORKERS as i32 {
        let (s, db, done) = (s.clone(), db.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let c = client(&s, &db).await;
            let mut st = prepare_all(&c).await.unwrap();
            for i in 0..ITERS as i32 {
                iteration(&c, &mut st, w, i).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(180), "tokio-postgres workers", t)
            .await
            .unwrap_or_else(|e| panic!("worker failed: {e}\n{}", s.diagnostics()));
    }
    assert_eq!(done.load(Ordering::Relaxed), WORKERS * ITERS);
    let (errors, recovered) = within(Duration::from_secs(60), "ddl", ddl_phase(&s, &db)).await;
    eprintln!(
        "tokio-postgres: {} iterations; ddl: cached_plan_errors {errors}, recovered {recovered}/4",
        WORKERS * ITERS
    );
}

/// The DDL step: returns (cached-plan errors seen, connections that got the new
/// shape within 5 tries, re-preparing after each error as an application would).
async fn ddl_phase(s: &Sluice, db: &str) -> (usize, usize) {
    let mut conns = Vec::new();
    for _ in 0..4 {
        let c = client(s, db).await;
        let star = c.prepare(Q_STAR).await.unwrap();
        let a = c.prepare(Q_A).await.unwrap();
        conns.push((c, star, a));
    }
    let warm = conns
        .iter()
        .enumerate()
        .map(|(j, (c, star, a))| async move {
            for n in 0..10 {
                let id = 1 + (j as i32 * 10 + n) % 100;
                let row = c.query_one(star, &[&id]).await.unwrap();
                assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1)), (id, id * 10));
                let row = c.query_one(a, &[&id]).await.unwrap();
                assert_eq!(row.get::<_, i32>(0), id * 10);
            }
        });
    futures_join_all(warm).await;
    conns[0].0.batch_execute(DDL).await.unwrap();
    let after = conns
        .iter()
        .enumerate()
        .map(|(j, (c, star, a))| async move {
            let id = 50 + j as i32;
            let row = c.query_one(a, &[&id]).await.unwrap();
            assert_eq!(row.get::<_, i32>(0), id * 10, "SELECT a after the DDL");
            let mut errors = 0;
            let mut star = star.clone();
            for _ in 0..5 {
                match c.query_one(&star, &[&id]).await {
                    Ok(row) => {
                        let got = (row.len(), row.get::<_, i32>(0), row.get::<_, i32>(1));
                        assert_eq!(got, (3, id, id * 10), "SELECT * after the DDL");
                        assert_eq!(row.get::<_, &str>(2), "x");
                        return (errors, 1);
                    }
                    Err(e) if e.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED) => errors += 1,
                    // The server it ran on prepared the statement only after the DDL
                    // (none had it before: Sluice prepares a client's statement on a
                    // server when first needed there, as PgBouncer does), so rows of
                    // the new shape came back to a client that knows the old one, and
                    // tokio-postgres refuses them. Re-preparing recovers, as from the
                    // error (docs/prepared-statements.md).
                    Err(e) if e.code().is_none() && e.to_string().contains("parsing response") => {
                        errors += 1
                    }
                    Err(e) => panic!("SELECT * after the DDL: {}", why(&e)),
                }
                match c.prepare(Q_STAR).await {
                    Ok(fresh) => star = fresh,
                    Err(e) if e.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED) => errors += 1,
                    Err(e) => panic!("re-preparing SELECT * after the DDL: {}", why(&e)),
                }
            }
            (errors, 0)
        });
    futures_join_all(after)
        .await
        .into_iter()
        .fold((0, 0), |(e, r), (e2, r2)| (e + e2, r + r2))
}

/// Runs futures concurrently on this task (no `futures` crate in the tests).
async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futs {
        set.push(Box::pin(f));
    }
    let mut out: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in set.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

/// The smallest case of what the pgjdbc run found (fixed in 4db8d31): `DEALLOCATE
/// ALL` sent with the extended protocol (as pgjdbc, tokio-postgres and psycopg's
/// pipeline mode send every statement) drops the server's `SLUICE_<n>` statements.
/// A pooler that recognizes the command only in a simple Query keeps believing that
/// server has them and binds there without re-preparing. Sluice, like PgBouncer
/// (1.22+), reads the `DEALLOCATE ALL` / `DISCARD ALL` CommandComplete tag instead,
/// whatever the protocol, and forgets that server's statements.
#[tokio::test]
async fn extended_deallocate_all_keeps_statements_working() {
    let db = driver_db("drv_dealloc");
    let s = driver_sluice(&db).setting("default_pool_size", "1").start();
    let (a, b) = (client(&s, &db).await, client(&s, &db).await);
    let st = a.prepare("SELECT $1::int + 1").await.unwrap();
    let n: i32 = a.query_one(&st, &[&1i32]).await.unwrap().get(0);
    assert_eq!(n, 2);
    for command in ["DEALLOCATE ALL", "DISCARD ALL"] {
        // Parse/Bind/Execute, on the one server connection.
        b.execute(command, &[]).await.unwrap();
        let r = a.query_one(&st, &[&2i32]).await;
        let r = r.unwrap_or_else(|e| panic!("after another client's {command}: {}", why(&e)));
        assert_eq!(r.get::<_, i32>(0), 3);
    }
}

/// `server_reset_query_always = 1` in transaction pooling runs `DISCARD ALL` (the
/// default `server_reset_query`) on every release, which drops the server's
/// `SLUICE_<n>` statements; Sluice's per-server cache is not cleared, so the next
/// Bind of a statement there is sent without a Parse and fails. PgBouncer sees the
/// `DISCARD ALL` CommandComplete of its reset query and forgets the statements.
#[tokio::test]
async fn reset_query_always_keeps_statements_working() {
    let db = driver_db("drv_reset_always");
    let s = driver_sluice(&db)
        .setting("default_pool_size", "1")
        .setting("server_reset_query_always", "1")
        .start();
    let c = client(&s, &db).await;
    let st = c.prepare("SELECT $1::int + 1").await.unwrap();
    for n in 1..=3i32 {
        let r = c.query_one(&st, &[&n]).await;
        let r = r.unwrap_or_else(|e| panic!("execution {n}: {}", why(&e)));
        assert_eq!(r.get::<_, i32>(0), n + 1);
    }
}

/// A `DISCARD ALL` that fails (here: inside a transaction block, 25001) discards
/// nothing in PostgreSQL, but Sluice forgets the client's statement names as soon
/// as it reads the query, so the client's statements then "do not exist".
/// PgBouncer forgets them only on the `DISCARD ALL` CommandComplete.
#[tokio::test]
async fn failed_discard_all_keeps_statements() {
    let db = driver_db("drv_failed_discard");
    let s = driver_sluice(&db).start();
    let c = client(&s, &db).await;
    let st = c.prepare("SELECT $1::int + 1").await.unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    let r = c.batch_execute("DISCARD ALL").await;
    assert_eq!(state(r), Some(SqlState::ACTIVE_SQL_TRANSACTION));
    c.batch_execute("ROLLBACK").await.unwrap();
    let r = c.query_one(&st, &[&1i32]).await;
    let r = r.unwrap_or_else(|e| panic!("after a failed DISCARD ALL: {}", why(&e)));
    assert_eq!(r.get::<_, i32>(0), 2);
}

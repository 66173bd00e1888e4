//! Many clients, a small pool, and every kind of request at once: a seeded random
//! mix of simple and extended queries, pipelines, prepared statements, transactions
//! committed and rolled back, errors, cancels, COPY, large answers and requests,
//! session parameters of each client's own, and clients that vanish mid-query. Each
//! answer carries its client's id and step, so an answer lost, cut short or handed
//! to the wrong client fails the test, as does another client's time zone.
//!
//! The hand-over paths (a request written by the client releasing the server, an
//! answer's tail owed after the server went back) are only exercised when clients
//! outnumber servers, as here.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio_postgres::{CancelToken, Client, Statement};

use super::common::*;
use crate::admin::{psql_ok, ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::wire::{query_msg, TAG_ERROR};
use crate::support::{MD5_PASSWORD, MD5_USER};

const CLIENTS: u64 = 24;
const STEPS: u64 = 40;
const POOL: u32 = 3;
/// How many kinds of step [`Mixer::step`] knows.
const OPS: u64 = 16;

/// A time zone of its own for each client (up to 12 kinds).
fn zone(id: u64) -> String {
    format!("Etc/GMT-{}", id % 12)
}

/// One client of the mix, with what it has committed so far.
struct Mixer {
    id: u64,
    c: Client,
    raw: RawClient,
    doubled: Statement,
    committed: u64,
    port: u16,
    db: String,
}

impl Mixer {
    async fn step(&mut self, op: u64, step: u64) {
        let (id, tag) = (self.id, format!("c{}s{step}", self.id));
        let ctx = format!("client {id} step {step} op {op}");
        match op {
            // A simple query, and two statements in one.
            0 => assert_eq!(rows(&self.c, &format!("SELECT '{tag}'")).await, [tag]),
            1 => assert_eq!(
                rows(&self.c, &format!("SELECT 'a{tag}'; SELECT 'b{tag}'")).await,
                [format!("a{tag}"), format!("b{tag}")]
            ),
            // Extended protocol with parameters (the unnamed statement).
            2 => {
                let r = self
                    .c
                    .query_one("SELECT $1::text || '!'", &[&tag])
                    .await
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(r.get::<_, String>(0), format!("{tag}!"), "{ctx}");
            }
            // A named statement prepared once, bound on whichever server comes.
            3 => {
                let v = (id * 1000 + step) as i64;
                let r = self
                    .c
                    .query_one(&self.doubled, &[&v])
                    .await
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(r.get::<_, i64>(0), 2 * v, "{ctx}");
            }
            // Four requests pipelined (tokio-postgres writes them before reading).
            4 => {
                let ks: Vec<i32> = (0..4).map(|k| (id * 100 + step * 4 + k) as i32).collect();
                let k2 = i64::from(ks[2]);
                let (p0, p1, p2, p3) = ([&ks[0] as _], [&ks[1] as _], [&k2 as _], [&ks[3] as _]);
                let (a, b, c, d) = tokio::join!(
                    self.c.query_one("SELECT $1::int4", &p0),
                    self.c.query_one("SELECT $1::int4", &p1),
                    self.c.query_one(&self.doubled, &p2),
                    self.c.query_one("SELECT $1::int4", &p3),
                );
                let got = [
                    a.map(|r| r.get::<_, i32>(0) as i64),
                    b.map(|r| r.get::<_, i32>(0) as i64),
                    c.map(|r| r.get::<_, i64>(0) / 2),
                    d.map(|r| r.get::<_, i32>(0) as i64),
                ];
                for (k, g) in ks.iter().zip(got) {
                    assert_eq!(
                        g.unwrap_or_else(|e| panic!("{ctx}: {e}")),
                        *k as i64,
                        "{ctx}"
                    );
                }
            }
            // A transaction, committed or rolled back; it sees its own rows only.
            5 | 6 => {
                let commit = op == 5;
                let tx = self.c.transaction().await.expect("BEGIN");
                tx.batch_execute(&format!("INSERT INTO mix VALUES ({id}, {step})"))
                    .await
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                let n: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM mix WHERE client = $1",
                        &[&(id as i32)],
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"))
                    .get(0);
                assert_eq!(
                    n as u64,
                    self.committed + 1,
                    "{ctx}: rows seen in the transaction"
                );
                if commit {
                    tx.commit().await.expect("COMMIT");
                    self.committed += 1;
                } else {
                    tx.rollback().await.expect("ROLLBACK");
                }
            }
            // An error, then the next request on the same client.
            7 => {
                let e = self.c.simple_query("SELECT 1/0").await.expect_err(&ctx);
                assert_eq!(
                    e.as_db_error().map(|d| d.code().code()),
                    Some("22012"),
                    "{ctx}: {e}"
                );
                assert_eq!(
                    rows(&self.c, &format!("SELECT 'after{tag}'")).await,
                    [format!("after{tag}")]
                );
            }
            // An answer of many rows, spanning reads: from ~8 KB (one or two reads)
            // to ~75 KB (more than a delegate gathers).
            8 => {
                let n = 300 + (step % 4) * 900;
                let got = rows(
                    &self.c,
                    &format!("SELECT '{tag}:' || g FROM generate_series(1, {n}) g"),
                )
                .await;
                assert_eq!(got.len() as u64, n, "{ctx}");
                for (i, r) in got.iter().enumerate() {
                    assert_eq!(*r, format!("{tag}:{}", i + 1), "{ctx}");
                }
            }
            // A request larger than a read buffer.
            9 => {
                let big = format!("{tag}{}", "x".repeat(40_000));
                let got = rows(
                    &self.c,
                    &format!("SELECT length('{big}') || left('{big}', 12)"),
                )
                .await;
                assert_eq!(got, [format!("{}{}", big.len(), &big[..12])], "{ctx}");
            }
            // A query cancelled while it runs; the client goes on. A cancel that
            // comes while the request still waits in line is dropped (as PgBouncer
            // drops it), so the cancel is sent again until the query ends.
            10 => {
                let token = self.c.cancel_token();
                let sleeper = self.c.simple_query("SELECT pg_sleep(10)");
                tokio::pin!(sleeper);
                let r = loop {
                    tokio::select! {
                        r = &mut sleeper => break r,
                        () = tokio::time::sleep(Duration::from_millis(30)) => {
                            cancel_and_wait(&token, self.port).await;
                        }
                    }
                };
                let e = r.expect_err(&ctx);
                assert_eq!(
                    e.as_db_error().map(|d| d.code().code()),
                    Some("57014"),
                    "{ctx}: {e}"
                );
                assert_eq!(
                    rows(&self.c, &format!("SELECT 'c{tag}'")).await,
                    [format!("c{tag}")]
                );
            }
            // COPY out, through a raw client (its answer is CopyData, not rows).
            11 => {
                self.raw
                    .send(&query_msg(&format!(
                        "COPY (SELECT '{tag}:' || g FROM generate_series(1, 50) g) TO STDOUT"
                    )))
                    .await
                    .expect("send COPY");
                let msgs = self.raw.until_ready(STEP).await;
                assert!(msgs.iter().all(|m| m.tag != TAG_ERROR), "{ctx}: {msgs:?}");
                let data: Vec<String> = msgs
                    .iter()
                    .filter(|m| m.tag == b'd')
                    .map(|m| String::from_utf8_lossy(&m.body).trim_end().to_owned())
                    .collect();
                let want: Vec<String> = (1..=50).map(|g| format!("{tag}:{g}")).collect();
                assert_eq!(data, want, "{ctx}");
            }
            // A cancel sent about when its query ends: it may cancel it or come too
            // late, but never cancel another client's query.
            12 | 13 => {
                let token = self.c.cancel_token();
                let quick = self.c.simple_query("SELECT pg_sleep(0.005)");
                let cancel = async {
                    tokio::time::sleep(Duration::from_millis(2 + step % 6)).await;
                    cancel_and_wait(&token, self.port).await;
                };
                let (r, ()) = tokio::join!(quick, cancel);
                if let Err(e) = r {
                    assert_eq!(
                        e.as_db_error().map(|d| d.code().code()),
                        Some("57014"),
                        "{ctx}: {e}"
                    );
                }
                assert_eq!(
                    rows(&self.c, &format!("SELECT 'q{tag}'")).await,
                    [format!("q{tag}")]
                );
            }
            // Its own session parameters, whichever server it gets.
            14 => {
                let got = rows(&self.c, "SHOW TimeZone; SHOW application_name").await;
                assert_eq!(got, [zone(id), format!("mix{id}")], "{ctx}");
            }
            // A client that sends a query and vanishes before its answer.
            _ => {
                let mut gone = RawClient::login(self.port, MD5_USER, MD5_PASSWORD, &self.db, &[])
                    .await
                    .unwrap_or_else(|e| panic!("{ctx}: login: {e}"));
                gone.send(&query_msg("SELECT pg_sleep(0.05), 'gone'"))
                    .await
                    .expect("send");
                drop(gone);
            }
        }
    }
}

/// Cancels as libpq does: sends the CancelRequest, then waits until Sluice closes
/// the connection, which it does once PostgreSQL has the request. tokio-postgres
/// returns as soon as it has sent it, so its cancel can still be on its way when the
/// client's next query starts, and cancel that one, as it could on PostgreSQL
/// directly: a race of the client's, which the checks here must not see.
async fn cancel_and_wait(token: &CancelToken, port: u16) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect for a cancel");
    token
        .cancel_query_raw(&mut stream, tokio_postgres::NoTls)
        .await
        .expect("cancel");
    let mut rest = Vec::new();
    let read = within(STEP, "the cancel's close", stream.read_to_end(&mut rest)).await;
    read.expect("read to the cancel's close");
    assert!(rest.is_empty(), "reply to a CancelRequest: {rest:?}");
}

#[tokio::test]
async fn a_random_mix_of_requests_reaches_each_client_whole_and_only_its_own() {
    let db = fresh_db("txn_mix");
    direct(
        &db,
        "CREATE TABLE mix (client int, step int); GRANT ALL ON mix TO sluice_md5;",
    );
    let s = txn_sluice(&db)
        .userlist(ADMIN, ADMIN_PW)
        .setting("default_pool_size", &POOL.to_string())
        // Each client has a raw twin, and may have a vanishing one and a cancel
        // request connected at once.
        .setting("max_client_conn", "1000")
        .start();
    let mut tasks = Vec::new();
    for id in 0..CLIENTS {
        let c = client(&s, &db).await;
        // Tracked parameters, set as a session would: each client must keep its own.
        c.batch_execute(&format!(
            "SET TimeZone = '{}'; SET application_name = 'mix{id}'",
            zone(id)
        ))
        .await
        .expect("SET");
        let doubled = c.prepare("SELECT $1::int8 * 2").await.expect("prepare");
        let raw = RawClient::login(s.port(), MD5_USER, MD5_PASSWORD, &db, &[])
            .await
            .expect("raw login");
        let mut m = Mixer {
            id,
            c,
            raw,
            doubled,
            committed: 0,
            port: s.port(),
            db: db.clone(),
        };
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(id + 1);
            for step in 0..STEPS {
                let op = rng.below(OPS);
                m.step(op, step).await;
            }
            (m.id, m.committed)
        }));
    }
    let mut committed = Vec::new();
    for t in tasks {
        let done = within(Duration::from_secs(120), "mixed client", t)
            .await
            .expect("a mixed client failed");
        committed.push(done);
    }
    // What each client committed is there, and nothing it rolled back.
    let c = client(&s, &db).await;
    for (id, n) in committed {
        assert_eq!(
            one(&c, &format!("SELECT count(*) FROM mix WHERE client = {id}")).await,
            n.to_string(),
            "client {id}'s committed rows"
        );
    }
    // Every server held for a cancel came back once its cancels were done: the
    // console shows none held and none lent, with the clients all idle.
    let mut pools = psql_ok(&s, "SHOW POOLS");
    for _ in 0..50 {
        let held = pools.cell("database", &db, "sv_being_canceled");
        let lent = pools.cell("database", &db, "sv_active");
        if held.as_deref() == Some("0") && lent.as_deref() == Some("0") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        pools = psql_ok(&s, "SHOW POOLS");
    }
    panic!("servers still held or lent: {:?}", pools.rows);
}

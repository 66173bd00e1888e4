//! Clients that vanish at every awkward moment (inside a transaction holding a
//! lock, mid-result, mid-COPY, mid-message, in an extended batch without Sync,
//! while waiting in line) while other clients share the same small pool in
//! transaction mode. The others must not notice: no error, no answer of anyone
//! else's, no lock or transaction left behind on a server they are lent.

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use super::killed::Load;
use crate::support::probe::{within, Observer};
use crate::support::wire::frame;

const VANISHERS: u64 = 4;
const ROUNDS: u64 = 24;
/// The ways a vanishing client leaves (see [`vanish`]).
pub(super) const WAYS: u64 = 8;

/// One client that logs in, starts something and leaves without finishing it.
pub(super) async fn vanish(s: &crate::support::Sluice, db: &str, way: u64) {
    let mut c = raw(s, db, &[]).await;
    let bytes = match way {
        // A transaction holding a lock the others need, then gone.
        0 => query("BEGIN; LOCK TABLE shared IN ACCESS EXCLUSIVE MODE; SELECT 1"),
        // The same, left while its last query still runs.
        1 => query("BEGIN; LOCK TABLE shared IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(0.05)"),
        // A large result, unread.
        2 => query("SELECT g, repeat('x', 400) FROM generate_series(1, 20000) g"),
        // COPY FROM STDIN, some rows sent, no CopyDone.
        3 => {
            let mut b = query("BEGIN; LOCK TABLE shared; COPY shared FROM STDIN");
            b.extend(frame(b'd', b"1\n2\n"));
            b
        }
        // Half a message: its length says more than is sent.
        4 => {
            let mut b = query("BEGIN; LOCK TABLE shared");
            b.extend_from_slice(&[b'Q', 0, 0, 0, 100, b'S', b'E']);
            b
        }
        // An extended batch inside a transaction, flushed but never synced.
        5 => {
            let mut b = query("BEGIN; LOCK TABLE shared");
            b.extend(extended("SELECT count(*) FROM shared"));
            b.extend(flush_msg());
            b
        }
        // Requests written while the pool is busy, gone before an answer.
        6 => {
            let mut b = query("SELECT pg_sleep(0.01)");
            b.extend(query("SELECT 2"));
            b
        }
        // A pipeline whose error left the rest skipped, then gone mid-way.
        _ => {
            let mut b = extended("SELECT 1/0");
            b.extend(sync_msg());
            b.extend(query("BEGIN; LOCK TABLE shared"));
            b
        }
    };
    c.send(&bytes).await.ok();
    // All but the client left in line wait for a server to take the request, so that
    // they leave mid-answer (a bound: under load the line may be long).
    if way != 6 {
        let _ = c.try_recv(Duration::from_secs(5)).await;
    }
    drop(c);
}

fn query(sql: &str) -> Vec<u8> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    frame(b'Q', &body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_vanishing_mid_anything_disturb_no_other_client() {
    let db = fresh_db("txn_vanishing");
    direct(
        &db,
        "CREATE TABLE shared (v int); INSERT INTO shared VALUES (1); \
         GRANT ALL ON shared TO sluice_md5;",
    );
    let s = Arc::new(
        txn_sluice(&db)
            .setting("default_pool_size", "2")
            .setting("query_wait_timeout", "30")
            .start(),
    );
    let sockets = listening_sockets(&s);
    let load = Load::start(&s, &db);
    // A client reading the table the vanishing ones lock: a lock left behind
    // would stop it (and its step's bound would fail the test).
    let reader = {
        let c = client(&s, &db).await;
        tokio::spawn(async move {
            let mut n = 0u64;
            for _ in 0..200 {
                let r = within(
                    STEP,
                    "reading the locked table",
                    c.simple_query("SELECT count(*) FROM shared"),
                )
                .await;
                r.map_err(|e| err_text(&e))?;
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, String>(n)
        })
    };
    let vanishers: Vec<_> = (0..VANISHERS)
        .map(|v| {
            let (s, db) = (s.clone(), db.clone());
            tokio::spawn(async move {
                for r in 0..ROUNDS {
                    vanish(&s, &db, (v + r) % WAYS).await;
                }
            })
        })
        .collect();
    for v in vanishers {
        within(Duration::from_secs(120), "the vanishing clients", v)
            .await
            .expect("a vanishing client panicked");
    }
    let read = within(Duration::from_secs(120), "the reader", reader)
        .await
        .expect("the reader panicked");
    let read = read.unwrap_or_else(|e| panic!("the reader failed: {e}\n{}", s.diagnostics()));
    load.finish_undisturbed(&s, "clients vanishing").await;
    assert_eq!(read, 200);
    // Most left while their server was busy for them: it is closed, PgBouncer's way.
    let unclean = s
        .log()
        .lines()
        .filter(|l| l.contains("closing because: client disconnect while server was not ready"))
        .count() as u64;
    assert!(
        unclean >= VANISHERS * ROUNDS / 2,
        "only {unclean} servers left unclean: the clients left before a server took them?"
    );

    // Nothing left behind: no server inside a transaction or holding the lock.
    let obs = Observer::new().await;
    let busy = || async {
        obs.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND datname = $1 AND state <> 'idle'",
                &[&db],
            )
            .await
            .expect("count busy servers")
            .get::<_, i64>(0)
    };
    settles(&s, STEP, "servers busy after every client left", 0, busy).await;
    // And no vanished client's socket, nor a server closed for it, is kept open.
    nothing_left_open(&s, sockets, crate::support::pg::pg().port());
}

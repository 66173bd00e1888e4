//! Requests of two clients in flight on one server (`pool/pipeline.rs`), through real
//! drivers: libpq's (pgbench, simple and extended protocol) and tokio-postgres's
//! queries with parameters (`query_typed`: one extended-protocol run on the unnamed
//! statement). Many clients share one server, so most requests go behind another's;
//! every answer is checked to be its own client's.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::common::*;
use super::pipelined::{one_loop, pipelined, sluice, sluice_with};
use crate::support::probe::within;
use crate::support::{free_port, pgbench, Sluice, TempDir, MD5_PASSWORD, MD5_USER};

/// A pgbench script whose answer names its client and a random number, and that
/// divides by zero (failing the run) when the answer is not that: an answer that
/// reached another client fails it.
pub(super) const OWN_ANSWER: &str = "\\set r random(1, 1000000)
SELECT :client_id * 1000000 + :r AS v \\gset
\\if :v != :client_id * 1000000 + :r
SELECT 1/0;
\\endif
";

/// A Sluice with one server and pgbench scripts whose answers are checked.
pub(super) struct Bench {
    db: String,
    pub(super) mport: u16,
    pub(super) s: Sluice,
    dir: TempDir,
}

impl Bench {
    pub(super) fn new(prefix: &str) -> Bench {
        Bench::with(prefix, true)
    }

    /// As [`Bench::new`], `hold_begin` as in [`super::pipelined::sluice_with`].
    pub(super) fn with(prefix: &str, hold_begin: bool) -> Bench {
        let db = fresh_db(prefix);
        let mport = free_port();
        let s = sluice_with(&db, mport, hold_begin);
        let dir = TempDir::new(&format!("sluice-{prefix}"));
        Bench { db, mport, s, dir }
    }

    /// `script` (named `name`) run by `clients` clients of `mode` protocol, `count`
    /// times each, all of them answered as their own; and how many requests went
    /// behind others meanwhile.
    pub(super) fn run(
        &self,
        name: &str,
        script: &str,
        mode: &str,
        clients: u32,
        count: u32,
    ) -> u64 {
        let file = self.dir.write(name, script);
        let file = file.to_string_lossy();
        let (c, t) = (clients.to_string(), count.to_string());
        let args = ["-n", "-M", mode, "-c", &c, "-j", "2", "-t", &t, "-f", &file];
        let before = pipelined(self.mport);
        let run = pgbench(
            "127.0.0.1",
            self.s.port(),
            MD5_USER,
            &self.db,
            Some(MD5_PASSWORD),
            &args,
            Duration::from_secs(120),
        );
        let report = format!(
            "{mode}\n{}\n{}\n{}",
            run.stdout,
            run.stderr,
            self.s.diagnostics()
        );
        assert!(run.success(), "pgbench failed: {report}");
        let all = clients * count;
        assert!(
            run.stdout
                .contains(&format!("actually processed: {all}/{all}")),
            "{report}"
        );
        pipelined(self.mport) - before
    }
}

#[test]
fn pgbench_clients_each_get_their_own_answers_on_a_shared_server() {
    let b = Bench::new("txn_pipe_pgbench");
    for mode in ["simple", "extended", "prepared"] {
        let behind = b.run("own.sql", OWN_ANSWER, mode, 16, 300);
        if one_loop() {
            assert!(behind > 0, "{mode}: none behind another");
        }
    }
}

#[tokio::test]
async fn tokio_postgres_queries_with_parameters_go_behind_others_and_get_their_own_rows() {
    let db = fresh_db("txn_pipe_typed");
    let mport = free_port();
    let s = sluice(&db, mport);
    let mut tasks = Vec::new();
    for k in 0..12i32 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            for i in 0..150i32 {
                let rows = c
                    .query_typed(
                        "SELECT $1::int4 * 1000 + $2::int4",
                        &[(&k, Type::INT4), (&i, Type::INT4)],
                    )
                    .await
                    .unwrap_or_else(|e| panic!("client {k}, query {i}: {e}"));
                let v: i32 = rows[0].get(0);
                assert_eq!(v, k * 1000 + i, "client {k}, query {i}");
            }
        }));
    }
    all_done_some_behind(tasks, mport).await;
}

/// Waits for the clients' tasks; on one event loop, some request went behind another.
pub(super) async fn all_done_some_behind(tasks: Vec<tokio::task::JoinHandle<()>>, mport: u16) {
    for t in tasks {
        within(Duration::from_secs(120), "a client's queries", t)
            .await
            .expect("client task");
    }
    if one_loop() {
        assert!(pipelined(mport) > 0, "no request went behind another");
    }
}

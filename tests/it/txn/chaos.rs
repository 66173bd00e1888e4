//! Every fault at once, in a seeded random order, while clients work through a small
//! pool in transaction mode (simple and extended queries, and named prepared
//! statements with a server cache smaller than the statements in use): backends killed, RECONNECT, PAUSE and RESUME, the pool
//! resized, clients vanishing mid-request. Each fault alone has its test; together
//! they meet in every order (a PAUSE while a killed server's client is being failed,
//! a RECONNECT while a request is written in line...). No answer may be mixed or cut;
//! no client may be harmed but by a kill of its own server; and once the faults stop,
//! every client is served again. In transaction and in statement pooling;
//! `CHAOS_SEED=<n>` picks another order.

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use super::killed::{served_again, Load, SIZES};
use super::vanishing::{vanish, WAYS};
use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::{within, Observer};

const FAULTS: u64 = 80;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_together_never_mix_answers() {
    chaos("transaction").await;
}

/// The same in statement pooling, where every statement gives its server back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_together_never_mix_answers_in_statement_pooling() {
    chaos("statement").await;
}

async fn chaos(mode: &str) {
    let db = fresh_db(&format!("txn_chaos_{mode}"));
    direct(
        &db,
        "CREATE TABLE shared (v int); GRANT ALL ON shared TO sluice_md5;",
    );
    let s = Arc::new(
        txn_sluice(&db)
            .userlist(ADMIN, ADMIN_PW)
            .setting("default_pool_size", "2")
            .setting("query_wait_timeout", "30")
            .setting("max_prepared_statements", "4")
            .setting("pool_mode", mode)
            .start(),
    );
    let obs = Observer::new().await;
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    let load = Load::start(&s, &db);
    let monitor = Monitor::start(&s);
    let named = super::prepared_load::Load::start(&s, &db);
    // Transactions of several requests: transaction pooling only.
    let pairs = (mode == "transaction").then(|| {
        super::pairs::create(&db);
        super::pairs::Pairs::start(&s, &db)
    });
    let mut rng = Rng::new(
        std::env::var("CHAOS_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(54),
    );
    let (mut killed, mut log) = (0u64, Vec::new());
    for _ in 0..FAULTS {
        tokio::time::sleep(Duration::from_millis(10 + rng.below(40))).await;
        let fault = rng.below(6);
        log.push(fault);
        let run = |sql: String| {
            let admin = &admin;
            async move {
                within(STEP, &sql, admin.simple_query(&sql))
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {}", err_text(&e)));
            }
        };
        match fault {
            0 => {
                // Only backends done logging in: a kill during a login is a failed login,
                // after which clients fail fast while no server is up (as in
                // PgBouncer), harm beyond the kill's own client not counted here.
                let pids = logged_in_pids(&obs, &db).await;
                if let Some(&pid) = pids.get(rng.below(pids.len().max(1) as u64) as usize) {
                    killed += u64::from(obs.try_terminate(pid).await);
                }
            }
            1 => run("RECONNECT".into()).await,
            2 => {
                // PAUSE returns once the servers are back; clients then wait.
                run(format!("PAUSE {db}")).await;
                tokio::time::sleep(Duration::from_millis(30)).await;
                run(format!("RESUME {db}")).await;
            }
            3 => run(format!("SET default_pool_size = {}", 1 + rng.below(3))).await,
            _ => {
                let (s, db, way) = (s.clone(), db.clone(), rng.below(WAYS));
                tokio::spawn(async move { vanish(&s, &db, way).await });
            }
        }
    }
    run_final(&admin, &format!("RESUME {db}")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let polls = monitor.finish().await;
    assert!(polls > 0, "the console was never polled");

    let (named_ok, named_errors) = named.finish().await;
    let pair_errors = match pairs {
        Some(p) => p.finish(&s, &db).await,
        None => Vec::new(),
    };
    assert!(named_ok > 0, "no named statement ran");
    for e in &named_errors {
        assert!(!e.contains("does not exist"), "{e}\n{}", s.diagnostics());
    }
    let (ended, failed) = load.finish_counting().await;
    let failed = failed + (named_errors.len() + pair_errors.len()) as u64;
    eprintln!(
        "faults {log:?}: {killed} servers killed, {failed} client errors, {polls} console polls"
    );
    assert!(
        failed <= killed,
        "{failed} client errors from {killed} kills\n{}",
        s.diagnostics()
    );
    served_again(&s, &db, ended, SIZES.len() as u64).await;
}

/// A RESUME that may find nothing paused (PgBouncer then says so): either answer is
/// fine, as long as one comes.
async fn run_final(admin: &tokio_postgres::Client, sql: &str) {
    let _ = within(STEP, sql, admin.simple_query(sql)).await;
}

/// The console polled as monitoring polls it, all through the faults, on a connection
/// of its own: every SHOW that reads each client and server (under the registry's and
/// the clients' locks, on other threads than the faults') answers, and SHOW SERVERS
/// lists no server twice and no client as linked to two servers.
struct Monitor {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

const POLLED: [&str; 6] = [
    "SHOW POOLS",
    "SHOW SERVERS",
    "SHOW CLIENTS",
    "SHOW SOCKETS",
    "SHOW USERS",
    "SHOW DATABASES",
];

impl Monitor {
    fn start(s: &Arc<crate::support::Sluice>) -> Monitor {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, done) = (s.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let c = console(&s, ADMIN, ADMIN_PW).await;
            let mut polls = 0u64;
            // Bounded: the faults take a few seconds; 500 rounds at 20 ms is 10 s.
            while !done.load(std::sync::atomic::Ordering::Relaxed) && polls < 500 {
                for sql in POLLED {
                    let answer = within(STEP, sql, c.simple_query(sql))
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {}", err_text(&e)));
                    if sql == "SHOW SERVERS" {
                        once_each(&answer);
                    }
                }
                polls += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            polls
        });
        Monitor { stop, task }
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        within(STEP, "the console's poller", self.task)
            .await
            .expect("the poller panicked")
    }
}

/// No server (`ptr`) listed twice, no client (`link`) linked to two servers.
fn once_each(answer: &[tokio_postgres::SimpleQueryMessage]) {
    let (mut ptrs, mut links) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for m in answer {
        let tokio_postgres::SimpleQueryMessage::Row(r) = m else {
            continue;
        };
        let ptr = r.get("ptr").unwrap_or_default().to_owned();
        assert!(ptrs.insert(ptr.clone()), "server {ptr} listed twice");
        let link = r.get("link").unwrap_or_default();
        assert!(
            link.is_empty() || links.insert(link.to_owned()),
            "client {link} linked to two servers"
        );
    }
}

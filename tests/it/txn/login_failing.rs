//! A pool whose new server logins fail while some of its servers are up: PostgreSQL
//! refuses more connections (here a database's CONNECTION LIMIT, as it does at
//! `max_connections`). As with PgBouncer, clients wait for the servers that are up
//! rather than getting the failed login's error, new logins are tried again after
//! `server_login_retry`, and the pool grows once PostgreSQL lets it.

use std::time::Duration;

use tokio_postgres::Client;

use super::common::*;
use crate::support::probe::{within, Observer};

const CLIENTS: u64 = 8;

/// `steps` queries of 20 ms each on every client at once; the clients back, and the
/// first error, if any.
async fn work(clients: Vec<Client>, steps: u64) -> (Vec<Client>, Result<(), String>) {
    let runs: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(id, c)| {
            tokio::spawn(async move {
                for step in 0..steps {
                    let tag = format!("c{id}s{step}");
                    let sql = format!("SELECT '{tag}' FROM pg_sleep(0.02)");
                    match within(STEP, &sql, c.simple_query(&sql)).await {
                        Ok(msgs) => assert_eq!(col_of(&msgs), [tag], "client {id} step {step}"),
                        Err(e) => {
                            let e = format!("client {id} step {step}: {}", err_text(&e));
                            return (c, Err(e));
                        }
                    }
                }
                (c, Ok(()))
            })
        })
        .collect();
    let (mut back, mut first) = (Vec::new(), Ok(()));
    for r in runs {
        let (c, r) = r.await.expect("a client's task");
        back.push(c);
        first = first.and(r);
    }
    (back, first)
}

/// The first column of each row of a simple query's answer.
fn col_of(msgs: &[tokio_postgres::SimpleQueryMessage]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_wait_for_the_servers_up_while_new_logins_fail() {
    let db = fresh_db("txn_login_failing");
    direct(&db, &format!("ALTER DATABASE {db} CONNECTION LIMIT 2"));
    let s = txn_sluice(&db)
        .setting("default_pool_size", "4")
        .setting("server_login_retry", "0.3")
        .start();
    let obs = Observer::new().await;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(client(&s, &db).await);
    }

    // Two servers can log in, and serve everybody; the logins beyond them fail.
    let (mut clients, r) = work(clients, 8).await;
    r.unwrap_or_else(|e| panic!("{e}\n{}", s.diagnostics()));
    assert!(backends(&obs, &db).await <= 2);
    assert!(
        s.log().contains("too many connections for database"),
        "no login was refused: the pool never tried to grow\n{}",
        s.diagnostics()
    );

    // PostgreSQL lets more in: the pool grows to its size again.
    direct(&db, &format!("ALTER DATABASE {db} CONNECTION LIMIT -1"));
    let deadline = tokio::time::Instant::now() + STEP;
    let mut most = 0;
    while most < 3 && tokio::time::Instant::now() < deadline {
        let sampler = Sampler::start(&db, Duration::from_millis(10)).await;
        let r;
        (clients, r) = work(clients, 4).await;
        r.unwrap_or_else(|e| panic!("{e}\n{}", s.diagnostics()));
        most = most.max(sampler.finish().await.0);
    }
    assert!(
        most >= 3,
        "the pool stayed at {most} servers once logins worked again\n{}",
        s.diagnostics()
    );
}

/// With no server up there is nobody to wait for: the login's error reaches the
/// client, as before (PgBouncer's fast fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_server_up_the_failed_login_reaches_the_client() {
    let db = fresh_db("txn_login_refused");
    direct(&db, &format!("ALTER DATABASE {db} CONNECTION LIMIT 0"));
    let s = txn_sluice(&db).setting("default_pool_size", "4").start();
    let cfg = s.config(crate::support::MD5_USER, crate::support::MD5_PASSWORD, &db);
    let e = match within(STEP, "login", crate::support::try_connect(&cfg)).await {
        Ok(c) => within(STEP, "query", c.simple_query("SELECT 1"))
            .await
            .expect_err("a query ran with no server to run it"),
        Err(e) => e,
    };
    let text = err_text(&e);
    assert!(
        text.contains("too many connections for database"),
        "{text}\n{}",
        s.diagnostics()
    );
}

//! A storm of logins (SCRAM, some with a wrong password, some that leave half-way)
//! while clients work through a small pool in transaction mode. Each good login
//! gets in and is served, each bad one gets PostgreSQL's error, the working clients
//! lose nothing, and every client that left is gone from SHOW CLIENTS: no slot of
//! `max_client_conn` is kept by a login that did not finish.

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use super::killed::Load;
use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::within;
use crate::support::wire::{startup_msg, RawClient};
use crate::support::MD5_USER;
use tokio_postgres::SimpleQueryMessage;

const EACH: usize = 24;

/// What one login of the storm did.
#[derive(Debug, PartialEq)]
enum Login {
    Served,
    Refused(String),
    Left,
}

async fn login(s: &crate::support::Sluice, db: &str, kind: usize) -> Login {
    match kind {
        0 => {
            let c = client(s, db).await;
            assert_eq!(one(&c, "SELECT 41 + 1").await, "42");
            Login::Served
        }
        1 => {
            let cfg = s.config(MD5_USER, "not the password", db);
            match within(STEP, "a bad login", cfg.connect(tokio_postgres::NoTls)).await {
                Ok(_) => panic!("a wrong password got in"),
                Err(e) => Login::Refused(e.as_db_error().map_or(e.to_string(), |d| {
                    format!("{} {}", d.code().code(), d.message())
                })),
            }
        }
        _ => {
            // The startup packet, then gone before answering the SCRAM challenge.
            let mut c = RawClient::connect(s.port()).await;
            c.send(&startup_msg(&[("user", MD5_USER), ("database", db)]))
                .await
                .ok();
            let _ = c.try_recv(Duration::from_secs(5)).await;
            Login::Left
        }
    }
}

async fn client_rows(admin: &tokio_postgres::Client) -> usize {
    within(STEP, "SHOW CLIENTS", admin.simple_query("SHOW CLIENTS"))
        .await
        .unwrap_or_else(|e| panic!("SHOW CLIENTS: {}", err_text(&e)))
        .iter()
        .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_logins_costs_the_working_clients_nothing() {
    let db = fresh_db("txn_logins_load");
    let s = Arc::new(
        txn_sluice(&db)
            .userlist(ADMIN, ADMIN_PW)
            .setting("auth_type", "scram-sha-256")
            .setting("default_pool_size", "2")
            .setting("max_client_conn", "200")
            .start(),
    );
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    // The console's own client.
    let before = client_rows(&admin).await;
    let load = Load::start(&s, &db);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let storm: Vec<_> = (0..3 * EACH)
        .map(|i| {
            let (s, db) = (s.clone(), db.clone());
            tokio::spawn(async move { login(&s, &db, i % 3).await })
        })
        .collect();
    let mut served = 0;
    for (i, h) in storm.into_iter().enumerate() {
        let r = within(Duration::from_secs(60), "a login of the storm", h)
            .await
            .unwrap_or_else(|e| panic!("login {i}: {e}\n{}", s.diagnostics()));
        match r {
            Login::Served => served += 1,
            Login::Refused(e) => assert_eq!(e, "28P01 SASL authentication failed", "login {i}"),
            Login::Left => {}
        }
    }
    assert_eq!(served, EACH);
    // The working clients go on a moment after the storm: on a machine the whole
    // suite loads, the storm's key derivations can leave them little CPU meanwhile
    // (a CI run saw 10 answers in all), and the floor below is about their work.
    tokio::time::sleep(Duration::from_secs(1)).await;
    load.finish_undisturbed(&s, "the logins").await;

    // Every client of the storm (and of the load) is gone from the list.
    let listed = || async { client_rows(&admin).await as i64 };
    let what = "clients listed after the storm";
    settles(&s, Duration::from_secs(5), what, before as i64, listed).await;
}

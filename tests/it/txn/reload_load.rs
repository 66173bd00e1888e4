//! A failover by configuration under load: the ini's `[databases]` entry is pointed at
//! another database and the console's RELOAD applied while clients work through a
//! small pool in transaction mode. No client gets an error; the servers of the old
//! target close as they come back, and every transaction that starts after the
//! reload runs on the new target.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::common::*;
use crate::admin::{console, ADMIN, ADMIN_PW};
use crate::support::probe::within;

const CLIENTS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_moves_a_database_under_load_without_an_error() {
    let (old, new) = (fresh_db("txn_reload_old"), fresh_db("txn_reload_new"));
    let alias = "moving";
    let s = Arc::new(
        txn_sluice(&old)
            .database(alias, &connstr(&old, ""))
            .userlist(ADMIN, ADMIN_PW)
            .setting("default_pool_size", "2")
            .start(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    // Each client: (when it asked, which database answered), until `stop`.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (s, stop) = (s.clone(), stop.clone());
            tokio::spawn(async move {
                let c = client(&s, alias).await;
                let mut seen = Vec::new();
                for _ in 0..5_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let asked = Instant::now();
                    let db = within(STEP, "a query", c.simple_query("SELECT current_database()"))
                        .await
                        .map_err(|e| err_text(&e))?;
                    let name = db
                        .iter()
                        .find_map(|m| match m {
                            tokio_postgres::SimpleQueryMessage::Row(r) => {
                                r.get(0).map(str::to_owned)
                            }
                            _ => None,
                        })
                        .unwrap_or_default();
                    seen.push((asked, name));
                }
                Ok::<_, String>(seen)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let ini = std::fs::read_to_string(s.ini_path()).expect("read the ini");
    let moved: Vec<String> = ini
        .lines()
        .map(|l| match l.starts_with(&format!("{alias} =")) {
            true => l.replace(&format!("dbname={old}"), &format!("dbname={new}")),
            false => l.to_owned(),
        })
        .collect();
    assert_ne!(
        moved.join("\n"),
        ini.trim_end(),
        "no {alias} entry in the ini:\n{ini}"
    );
    s.rewrite_ini(&(moved.join("\n") + "\n"));
    let admin = console(&s, ADMIN, ADMIN_PW).await;
    within(STEP, "RELOAD", admin.simple_query("RELOAD"))
        .await
        .unwrap_or_else(|e| panic!("RELOAD: {}", err_text(&e)));
    let reloaded = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);

    let (mut before, mut after) = (0, 0);
    for (id, h) in clients.into_iter().enumerate() {
        let seen = within(Duration::from_secs(60), "a client", h)
            .await
            .expect("a client panicked")
            .unwrap_or_else(|e| {
                panic!(
                    "client {id} failed across the reload: {e}\n{}",
                    s.diagnostics()
                )
            });
        for (asked, db) in seen {
            if asked > reloaded {
                assert_eq!(
                    db, new,
                    "client {id}: a transaction after RELOAD ran on {db}"
                );
                after += 1;
            } else if db == old {
                before += 1;
            }
        }
    }
    assert!(
        before > 0 && after > 0,
        "{before} answers before, {after} after"
    );
}

//! Servers that PostgreSQL closes while they sit idle in the pool
//! (`idle_session_timeout`, as a firewall or a server-side timeout would): the next
//! client must not get one of them.

use std::time::Duration;

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_postgres_closed_while_idle_are_not_handed_out() {
    let db = fresh_db("txn_idle_closed");
    direct(
        &db,
        &format!("ALTER DATABASE {db} SET idle_session_timeout = '200ms'"),
    );
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let c = client(&s, &db).await;
    let mut errors = Vec::new();
    for step in 0..12u64 {
        let sql = format!("SELECT 'step{step}'");
        match c.simple_query(&sql).await {
            Ok(_) => {}
            Err(e) => errors.push(format!("step {step}: {}", err_text(&e))),
        }
        // Long enough for PostgreSQL to close the idle server, at a different point
        // of the janitor's half-second each time.
        tokio::time::sleep(Duration::from_millis(400 + 37 * step)).await;
    }
    assert!(errors.is_empty(), "{errors:?}\n{}", s.diagnostics());
}

//! Connection limits in transaction mode: max_db_connections and
//! max_user_connections across pools, the reserve pool, min_pool_size, the client
//! limits per database and user, and FIFO service of waiting clients.

use std::time::Duration;

use super::common::*;
use crate::support::probe::{within, Observer};
use crate::support::{self, Sluice, MD5_PASSWORD, MD5_USER, PLAIN_PASSWORD, PLAIN_USER};

/// `clients` clients of (`db`, `user`) each running `queries` short queries.
async fn load(s: &Sluice, db: &str, user: &str, pw: &str, clients: usize, queries: usize) {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let cfg = s.config(user, pw, db);
        let c = within(STEP, "connect", support::connect(&cfg)).await;
        tasks.push(tokio::spawn(async move {
            for _ in 0..queries {
                c.simple_query("SELECT pg_sleep(0.05)")
                    .await
                    .unwrap_or_else(|e| panic!("{}", err_text(&e)));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for t in tasks {
        within(Duration::from_secs(40), "load client", t)
            .await
            .expect("load client failed");
    }
}

/// Two loads at once (`a` and `b`: database, user, password) under a limit of 2
/// server connections: Sluice holds at most 2, and PostgreSQL (`db`) sees at most 3
/// backends (an evicted server's backend leaves pg_stat_activity a moment after
/// Sluice closed it, while its replacement may already be there).
async fn two_loads_within_two_servers(
    s: &Sluice,
    db: &str,
    a: (&str, &str, &str),
    b: (&str, &str, &str),
) {
    let sampler = Sampler::start(db, Duration::from_millis(15)).await;
    let sockets = Sampler::sockets(s, Duration::from_millis(5)).await;
    tokio::join!(load(s, a.0, a.1, a.2, 3, 6), load(s, b.0, b.1, b.2, 3, 6));
    let (max, _) = sampler.finish().await;
    let (held, _) = sockets.finish().await;
    assert!(
        (1..=2).contains(&held),
        "Sluice held {held} server connections"
    );
    assert!(max <= 3, "{max} backends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_db_connections_across_two_users() {
    let db = fresh_db("txn_maxdb");
    let s = txn_sluice(&db)
        .userlist(PLAIN_USER, PLAIN_PASSWORD)
        .setting("default_pool_size", "5")
        .setting("max_db_connections", "2")
        .setting("query_wait_timeout", "30")
        .start();
    two_loads_within_two_servers(
        &s,
        &db,
        (&db, MD5_USER, MD5_PASSWORD),
        (&db, PLAIN_USER, PLAIN_PASSWORD),
    )
    .await;
}

/// Two pools under one shared limit of 2 take turns: the second pool's clients get
/// servers by closing the first pool's idle ones, and the total never exceeds 2.
async fn shared_limit_phases(s: &Sluice, db: &str, a: (&str, &str, &str), b: (&str, &str, &str)) {
    let sampler = Sampler::sockets(s, Duration::from_millis(5)).await;
    let obs = Observer::new().await;
    for (pool_db, user, pw) in [a, b, a] {
        let mut holders = Vec::new();
        for _ in 0..2 {
            let cfg = s.config(user, pw, pool_db);
            let c = within(STEP, "connect", support::connect(&cfg)).await;
            within(STEP, "BEGIN", c.batch_execute("BEGIN; SELECT 1"))
                .await
                .unwrap_or_else(|e| panic!("{user}@{pool_db}: {}", err_text(&e)));
            holders.push(c);
        }
        // Backends of evicted servers leave pg_stat_activity a moment later.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let users: Vec<String> = obs
                .client
                .query(
                    "SELECT usename::text FROM pg_stat_activity \
                     WHERE backend_type = 'client backend' AND datname = $1",
                    &[&db],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            if users == [user, user] {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "backends while {user}@{pool_db} holds two: {users:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for c in &holders {
            within(STEP, "COMMIT", c.batch_execute("COMMIT"))
                .await
                .unwrap();
        }
    }
    let (max, _) = sampler.finish().await;
    assert_eq!(max, 2, "server connections Sluice held open to {db}");
    // Each idle server closed to make room is logged in PgBouncer's words.
    let evicted = s.log().matches("closing because: evicted").count();
    assert!(
        evicted >= 2,
        "{evicted} evictions logged\n{}",
        s.diagnostics()
    );
}

#[tokio::test]
async fn max_db_connections_caps_two_users_pools() {
    let db = fresh_db("txn_maxdb_ph");
    let s = txn_sluice(&db)
        .userlist(PLAIN_USER, PLAIN_PASSWORD)
        .setting("default_pool_size", "5")
        .setting("max_db_connections", "2")
        .setting("query_wait_timeout", "10")
        .start();
    shared_limit_phases(
        &s,
        &db,
        (&db, MD5_USER, MD5_PASSWORD),
        (&db, PLAIN_USER, PLAIN_PASSWORD),
    )
    .await;
}

#[tokio::test]
async fn max_user_connections_caps_one_users_pools() {
    let db = fresh_db("txn_maxuser_ph");
    let s = txn_sluice(&db)
        .database("alias_one", &connstr(&db, ""))
        .database("alias_two", &connstr(&db, ""))
        .setting("default_pool_size", "5")
        .setting("max_user_connections", "2")
        .setting("query_wait_timeout", "10")
        .start();
    shared_limit_phases(
        &s,
        &db,
        ("alias_one", MD5_USER, MD5_PASSWORD),
        ("alias_two", MD5_USER, MD5_PASSWORD),
    )
    .await;
}

/// A client waiting at max_db_connections gets a server once another pool of the
/// database has an idle one (PgBouncer closes it to make room), not only when a
/// server connection closes.
#[tokio::test]
async fn max_db_connections_waiter_gets_idle_server_of_other_pool() {
    let db = fresh_db("txn_maxdb_idle");
    let s = txn_sluice(&db)
        .userlist(PLAIN_USER, PLAIN_PASSWORD)
        .setting("max_db_connections", "1")
        .setting("query_wait_timeout", "20")
        .start();
    let mut a = raw(&s, &db, &[]).await;
    let r = a.simple("BEGIN; SELECT 1", STEP).await;
    assert_eq!(status(&r), b'T');
    // B is the first client of its pool: even its login needs a server (for the
    // welcome parameters), so it waits from the start.
    let cfg = s.config(PLAIN_USER, PLAIN_PASSWORD, &db);
    let waiting = tokio::spawn(async move {
        let b = support::try_connect(&cfg).await.map_err(|e| err_text(&e))?;
        let r = b.simple_query("SELECT 1").await;
        r.map(|_| ()).map_err(|e| err_text(&e))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    // A's server goes idle in A's pool.
    let r = a.simple("COMMIT", STEP).await;
    assert_eq!(status(&r), b'I');
    within(
        Duration::from_secs(5),
        "B after A's server went idle",
        waiting,
    )
    .await
    .unwrap()
    .expect("B's query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_user_connections_across_two_databases() {
    let db = fresh_db("txn_maxuser");
    let s = txn_sluice(&db)
        .database("alias_one", &connstr(&db, ""))
        .database("alias_two", &connstr(&db, ""))
        .setting("default_pool_size", "5")
        .setting("max_user_connections", "2")
        .setting("query_wait_timeout", "30")
        .start();
    two_loads_within_two_servers(
        &s,
        &db,
        ("alias_one", MD5_USER, MD5_PASSWORD),
        ("alias_two", MD5_USER, MD5_PASSWORD),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reserve_pool_gives_one_more_server_to_waiting_clients() {
    let db = fresh_db("txn_reserve");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "2")
        .setting("reserve_pool_size", "1")
        .setting("reserve_pool_timeout", "0.5")
        .start();
    let sampler = Sampler::start(&db, Duration::from_millis(20)).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = client(&s, &db).await;
        tasks.push(tokio::spawn(async move {
            let t = std::time::Instant::now();
            c.simple_query("SELECT pg_sleep(1.5)").await.expect("sleep");
            t.elapsed()
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.push(within(Duration::from_secs(30), "sleeper", t).await.unwrap());
    }
    took.sort();
    let (max, _) = sampler.finish().await;
    assert_eq!(max, 3, "pool 2 + reserve 1; took {took:?}");
    // Two ran at once, the third from the reserve after ~0.5 s, the fourth after
    // the first finished.
    assert!(took[2] < Duration::from_millis(2800), "{took:?}");
    assert!(took[3] >= Duration::from_millis(2900), "{took:?}");
    // Logged as PgBouncer logs it: a warning.
    let log = s.log();
    let taken = log
        .lines()
        .filter(|l| l.contains("taking connection from reserve_pool"));
    assert!(
        taken.clone().count() == 1 && taken.clone().all(|l| l.contains(" WARNING ")),
        "{}",
        s.diagnostics()
    );
}

#[tokio::test]
async fn min_pool_size_keeps_idle_servers() {
    let db = fresh_db("txn_minpool");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "5")
        .setting("min_pool_size", "2")
        .start();
    let obs = Observer::new().await;
    let c = client(&s, &db).await;
    one(&c, "SELECT 1").await;
    wait_backends(&obs, &db, Duration::from_secs(10), |n| n == 2).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(backends(&obs, &db).await, 2);
    drop(c);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        backends(&obs, &db).await,
        2,
        "min_pool_size after the client left"
    );
}

/// As in PgBouncer, `server_idle_timeout` leaves `min_pool_size` servers open: the
/// same backends stay, rather than being closed and opened again each time.
#[tokio::test]
async fn server_idle_timeout_leaves_min_pool_size_open() {
    let db = fresh_db("txn_minpool_idle");
    let s = txn_sluice(&db)
        .setting("default_pool_size", "5")
        .setting("min_pool_size", "2")
        .setting("server_idle_timeout", "1")
        .start();
    let obs = Observer::new().await;
    let (a, b, c) = (
        client(&s, &db).await,
        client(&s, &db).await,
        client(&s, &db).await,
    );
    // Three servers at once: one more than min_pool_size.
    let sleep = "SELECT pg_sleep(0.3)";
    tokio::join!(one(&a, sleep), one(&b, sleep), one(&c, sleep));
    assert_eq!(backends(&obs, &db).await, 3);
    // Past the idle timeout: one closes, two stay, and stay the same two.
    wait_backends(&obs, &db, Duration::from_secs(10), |n| n == 2).await;
    let before = backend_pids(&obs, &db).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut after = backend_pids(&obs, &db).await;
    let mut before = before;
    before.sort_unstable();
    after.sort_unstable();
    assert_eq!(after, before, "{}", s.diagnostics());
    let idle_closes = s
        .log()
        .matches("closing because: server idle timeout")
        .count();
    assert_eq!(idle_closes, 1, "{}", s.diagnostics());
}

async fn expect_refused(s: &Sluice, user: &str, pw: &str, db: &str, setting: &str) {
    let cfg = s.config(user, pw, db);
    match within(STEP, "refused connect", support::try_connect(&cfg)).await {
        Ok(_) => panic!("a client over {setting} was let in"),
        Err(e) => {
            let text = err_text(&e);
            assert!(
                text.contains(&format!("client connections exceeded ({setting})")),
                "{text}"
            );
        }
    }
}

#[tokio::test]
async fn max_db_client_connections_refuses_a_second_client() {
    let db = fresh_db("txn_maxdbcl");
    let s = txn_sluice(&db)
        .userlist(PLAIN_USER, PLAIN_PASSWORD)
        .setting("max_db_client_connections", "1")
        .start();
    let a = client(&s, &db).await;
    expect_refused(&s, MD5_USER, MD5_PASSWORD, &db, "max_db_client_connections").await;
    // Refused before a password is asked for, as PgBouncer refuses it.
    use crate::support::raw::{startup_packet, RawConn, PROTOCOL_3_0};
    let mut raw = RawConn::tcp(s.port());
    let startup = startup_packet(PROTOCOL_3_0, &[("user", MD5_USER), ("database", &db)]);
    raw.send(&startup).expect("startup");
    let first = raw.read_msg(STEP).expect("an answer");
    let told = first.error().map(|e| e.1);
    let want = "client connections exceeded (max_db_client_connections)";
    assert_eq!(told.as_deref(), Some(want), "{first:?}");
    expect_refused(
        &s,
        PLAIN_USER,
        PLAIN_PASSWORD,
        &db,
        "max_db_client_connections",
    )
    .await;
    assert_eq!(one(&a, "SELECT 1").await, "1");
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = client(&s, &db).await;
    assert_eq!(one(&b, "SELECT 2").await, "2");
}

#[tokio::test]
async fn max_user_client_connections_refuses_a_second_client() {
    let db = fresh_db("txn_maxusercl");
    let s = txn_sluice(&db)
        .userlist(PLAIN_USER, PLAIN_PASSWORD)
        .setting("max_user_client_connections", "1")
        .start();
    let a = client(&s, &db).await;
    expect_refused(
        &s,
        MD5_USER,
        MD5_PASSWORD,
        &db,
        "max_user_client_connections",
    )
    .await;
    // Another user is not limited by sluice_md5's count.
    let p = within(
        STEP,
        "other user",
        support::connect(&s.config(PLAIN_USER, PLAIN_PASSWORD, &db)),
    )
    .await;
    assert_eq!(one(&p, "SELECT 1").await, "1");
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = client(&s, &db).await;
    assert_eq!(one(&b, "SELECT 2").await, "2");
}

/// Clients waiting for the only server are served in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_clients_are_served_in_arrival_order() {
    let db = fresh_db("txn_fifo");
    let s = txn_sluice(&db).setting("default_pool_size", "1").start();
    let mut holder = raw(&s, &db, &[]).await;
    let r = holder.simple("BEGIN; SELECT 1", STEP).await;
    assert_eq!(status(&r), b'T');
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut clients = Vec::new();
    for _ in 1..=5 {
        clients.push(client(&s, &db).await);
    }
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            c.simple_query("SELECT pg_sleep(0.02)")
                .await
                .expect("query");
            tx.send(i + 1).unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = holder.simple("COMMIT", STEP).await;
    assert_eq!(status(&r), b'I');
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(within(STEP, "completion", rx.recv()).await.unwrap());
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(order, [1, 2, 3, 4, 5]);
}

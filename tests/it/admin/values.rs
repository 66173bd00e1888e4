//! SHOW values that must follow the pooler's state: clients, servers and pools as
//! clients come, wait and go; statistics growing with queries and averages over
//! `stats_period`; config, databases, users and lists; the canned driver parameters.

use std::time::Duration;

use super::{builder, pooled, psql_ok, select1, ADMIN, STATS, T};
use crate::support::probe::within;
use crate::support::{wait_until, MD5_USER, TEST_DB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_clients_and_servers_follow_the_clients() {
    // Session mode, one server: the first client keeps it; the second waits.
    let s = builder().setting("default_pool_size", "1").start();
    let a = pooled(&s, Some("admin_test_a")).await;
    select1(&a).await;
    let pid: i32 = a
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);

    let pools = psql_ok(&s, "SHOW POOLS");
    assert_eq!(
        pools.cell("database", TEST_DB, "user"),
        Some(MD5_USER.into())
    );
    assert_eq!(
        pools.cell("database", TEST_DB, "cl_active"),
        Some("1".into())
    );
    assert_eq!(
        pools.cell("database", TEST_DB, "sv_active"),
        Some("1".into())
    );
    assert_eq!(
        pools.cell("database", TEST_DB, "pool_mode"),
        Some("session".into())
    );
    // The console's own pool is listed, as PgBouncer lists it.
    assert_eq!(
        pools.cell("database", "pgbouncer", "cl_active"),
        Some("1".into())
    );

    let clients = psql_ok(&s, "SHOW CLIENTS");
    let a_id = clients
        .cell("application_name", "admin_test_a", "id")
        .expect("client a listed");
    assert_eq!(
        clients.cell("application_name", "admin_test_a", "state"),
        Some("active".into())
    );
    assert_eq!(
        clients.cell("application_name", "admin_test_a", "user"),
        Some(MD5_USER.into())
    );
    let a_ptr = clients.cell("id", &a_id, "ptr").expect("ptr");
    let servers = psql_ok(&s, "SHOW SERVERS");
    assert_eq!(servers.rows.len(), 1, "{servers:?}");
    assert_eq!(servers.cell("type", "S", "state"), Some("active".into()));
    assert_eq!(servers.cell("type", "S", "link"), Some(a_ptr));
    assert_eq!(
        servers.cell("type", "S", "remote_pid"),
        Some(pid.to_string())
    );
    assert_eq!(servers.cell("type", "S", "database"), Some(TEST_DB.into()));

    // A second client waits for the only server.
    let b = pooled(&s, Some("admin_test_b")).await;
    let waiting = tokio::spawn(async move {
        b.simple_query("SELECT 2").await.expect("b's query");
        b
    });
    assert!(
        wait_until(Duration::from_secs(10), || {
            psql_ok(&s, "SHOW POOLS").cell("database", TEST_DB, "cl_waiting") == Some("1".into())
        }),
        "cl_waiting never became 1"
    );
    let clients = psql_ok(&s, "SHOW CLIENTS");
    assert_eq!(
        clients.cell("application_name", "admin_test_b", "state"),
        Some("waiting".into())
    );
    drop(a);
    let b = within(Duration::from_secs(20), "b gets the server", waiting)
        .await
        .expect("join");
    // Handed from a to b while b waited: counted lent once, not twice or not at all.
    let pools = psql_ok(&s, "SHOW POOLS");
    assert_eq!(
        pools.cell("database", TEST_DB, "sv_active"),
        Some("1".into()),
        "{pools:?}"
    );
    assert_eq!(
        pools.cell("database", TEST_DB, "sv_idle"),
        Some("0".into()),
        "{pools:?}"
    );
    drop(b);
    // Both gone: the server is idle in the pool.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let p = psql_ok(&s, "SHOW POOLS");
            p.cell("database", TEST_DB, "sv_idle") == Some("1".into())
                && p.cell("database", TEST_DB, "sv_active") == Some("0".into())
                && p.cell("database", TEST_DB, "cl_active") == Some("0".into())
        }),
        "{:?}",
        psql_ok(&s, "SHOW POOLS")
    );
    let servers = psql_ok(&s, "SHOW SERVERS");
    assert_eq!(servers.cell("type", "S", "state"), Some("idle".into()));
    let sockets = psql_ok(&s, "SHOW SOCKETS");
    assert!(sockets.column("state").contains(&"sv_idle".to_string()));
}

fn total(s: &crate::support::Sluice, col: &str) -> u64 {
    psql_ok(s, "SHOW STATS_TOTALS")
        .cell("database", TEST_DB, col)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_grow_with_queries_and_averages_follow() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("stats_period", "1")
        .start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    // Sessions fold their counts into the pool's within 100 ms (batched off the hot
    // path), so each reading waits that long first.
    let settle = || std::thread::sleep(Duration::from_millis(300));
    settle();
    let before = total(&s, "query_count");
    for _ in 0..20 {
        select1(&c).await;
    }
    settle();
    let after = total(&s, "query_count");
    assert!(after >= before + 20, "query_count {before} -> {after}");
    assert!(total(&s, "xact_count") >= 21);
    assert!(total(&s, "bytes_received") > 0 && total(&s, "bytes_sent") > 0);
    assert!(total(&s, "server_assignment_count") >= 21);
    assert!(total(&s, "client_login_count") >= 1);

    let stats = psql_ok(&s, "SHOW STATS");
    let q: u64 = stats
        .cell("database", TEST_DB, "total_query_count")
        .and_then(|v| v.parse().ok())
        .expect("total_query_count");
    assert!(q >= after);
    assert!(stats.column("database").contains(&"pgbouncer".to_string()));

    // With a one-second period, averages show the load of the last period.
    let load = tokio::spawn(async move {
        for _ in 0..400 {
            select1(&c).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    assert!(
        wait_until(Duration::from_secs(10), || {
            psql_ok(&s, "SHOW STATS_AVERAGES")
                .cell("database", TEST_DB, "query_count")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|v| v > 0)
        }),
        "avg query_count stayed 0"
    );
    let totals = psql_ok(&s, "SHOW TOTALS");
    let value = |n: &str| {
        totals
            .cell("name", n, "value")
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert!(value("total_query_count").is_some_and(|v| v >= after));
    assert!(value("avg_query_count").is_some());
    load.abort();
    // The periodic stats line, in PgBouncer's words.
    assert!(
        wait_until(Duration::from_secs(5), || s
            .log()
            .lines()
            .any(|l| l.contains(" stats: ")
                && l.contains(" xacts/s, ")
                && l.contains(" wait "))),
        "no stats line\n{}",
        s.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_databases_users_lists_and_fake_params() {
    let s = builder()
        .user(MD5_USER, "pool_size=3")
        .database(
            "other",
            "host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test pool_mode=transaction",
        )
        .start();
    let c = pooled(&s, None).await;
    select1(&c).await;

    let cfg = psql_ok(&s, "SHOW CONFIG");
    assert_eq!(
        cfg.cell("key", "listen_port", "value"),
        Some(s.port().to_string())
    );
    assert_eq!(
        cfg.cell("key", "listen_port", "default"),
        Some("6432".into())
    );
    assert_eq!(
        cfg.cell("key", "listen_port", "changeable"),
        Some("no".into())
    );
    assert_eq!(
        cfg.cell("key", "default_pool_size", "changeable"),
        Some("yes".into())
    );
    assert_eq!(cfg.cell("key", "stats_users", "value"), Some(STATS.into()));

    let dbs = psql_ok(&s, "SHOW DATABASES");
    assert_eq!(
        dbs.cell("name", "other", "pool_mode"),
        Some("transaction".into())
    );
    assert_eq!(dbs.cell("name", "other", "database"), Some(TEST_DB.into()));
    assert_eq!(dbs.cell("name", TEST_DB, "pool_size"), Some("20".into()));
    assert_eq!(
        dbs.cell("name", TEST_DB, "current_connections"),
        Some("1".into())
    );
    assert_eq!(
        dbs.cell("name", TEST_DB, "current_client_connections"),
        Some("1".into())
    );
    assert_eq!(
        dbs.cell("name", "pgbouncer", "force_user"),
        Some("pgbouncer".into())
    );
    assert_eq!(
        dbs.cell("name", "pgbouncer", "pool_mode"),
        Some("statement".into())
    );

    let users = psql_ok(&s, "SHOW USERS");
    assert_eq!(users.cell("name", MD5_USER, "pool_size"), Some("3".into()));
    assert_eq!(
        users.cell("name", MD5_USER, "current_connections"),
        Some("1".into())
    );
    assert_eq!(users.cell("name", ADMIN, "pool_size"), Some(String::new()));
    assert!(users.column("name").contains(&"pgbouncer".to_string()));

    let lists = psql_ok(&s, "SHOW LISTS");
    let items = |l: &str| {
        lists
            .cell("list", l, "items")
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert_eq!(items("databases"), Some(3));
    assert_eq!(items("pools"), Some(2));
    assert!(items("used_clients").is_some_and(|n| n >= 2));
    assert_eq!(items("used_servers"), Some(1));
    assert_eq!(lists.column("list").len(), 14);

    let state = psql_ok(&s, "SHOW STATE");
    assert_eq!(state.cell("key", "active", "value"), Some("yes".into()));
    assert_eq!(state.cell("key", "paused", "value"), Some("no".into()));
    let version = psql_ok(&s, "SHOW VERSION");
    assert!(
        version.rows[0][0].starts_with("PgBouncer 1.25.2 (Sluice "),
        "{version:?}"
    );
    // SELECT is an alias of SHOW, as in PgBouncer.
    assert_eq!(psql_ok(&s, "SELECT VERSION").rows, version.rows);

    // Parameters drivers ask for get canned answers; SET on them is ignored.
    let enc = psql_ok(&s, "SHOW client_encoding");
    assert_eq!(enc.header, vec!["client_encoding"]);
    assert_eq!(enc.rows, vec![vec!["UTF-8".to_string()]]);
    let set = psql_ok(&s, "SET datestyle = 'ISO'");
    assert!(set.stderr.contains("SET ignored"), "{}", set.stderr);
    assert!(psql_ok(&s, "SHOW MEM").rows.len() >= 5);
    assert!(psql_ok(&s, "SHOW DNS_HOSTS").rows.is_empty());
    assert!(psql_ok(&s, "SHOW PEERS").rows.is_empty());
}

/// SHOW CLIENTS / SHOW SERVERS count the prepared statements each one holds in
/// transaction pooling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statement_counts_in_clients_and_servers() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start();
    let c = pooled(&s, Some("prep_counter")).await;
    let a = within(Duration::from_secs(20), "prepare", c.prepare("SELECT 1"))
        .await
        .unwrap();
    let b = within(Duration::from_secs(20), "prepare", c.prepare("SELECT 2"))
        .await
        .unwrap();
    within(Duration::from_secs(20), "query", c.query(&a, &[]))
        .await
        .unwrap();
    within(Duration::from_secs(20), "query", c.query(&b, &[]))
        .await
        .unwrap();
    let clients = psql_ok(&s, "SHOW CLIENTS");
    assert_eq!(
        clients.cell("application_name", "prep_counter", "prepared_statements"),
        Some("2".into()),
        "{:?}",
        clients
    );
    let servers = psql_ok(&s, "SHOW SERVERS");
    let held: Vec<u32> = servers
        .column("prepared_statements")
        .iter()
        .filter_map(|v| v.parse().ok())
        .collect();
    assert!(held.iter().any(|n| *n >= 2), "{servers:?}");
}

#[test]
fn peers_and_lists_follow_the_peers_section() {
    let s = builder()
        .setting("peer_id", "1")
        .setting("default_pool_size", "7")
        .raw_ini("[peers]\n2 = host=/tmp/peer2 port=7002 pool_size=3\n3 = host=10.0.0.3\n")
        .start();
    let peers = psql_ok(&s, "SHOW PEERS");
    assert_eq!(peers.column("peer_id"), ["2", "3"], "{peers:?}");
    let cell = |id: &str, col: &str| peers.cell("peer_id", id, col);
    assert_eq!(cell("2", "host").as_deref(), Some("/tmp/peer2"));
    assert_eq!(cell("2", "port").as_deref(), Some("7002"));
    assert_eq!(cell("2", "pool_size").as_deref(), Some("3"));
    // PgBouncer's defaults: port 6432, pool_size default_pool_size.
    assert_eq!(cell("3", "port").as_deref(), Some("6432"));
    assert_eq!(cell("3", "pool_size").as_deref(), Some("7"));
    let lists = psql_ok(&s, "SHOW LISTS");
    assert_eq!(lists.cell("list", "peers", "items").as_deref(), Some("2"));
    let config = psql_ok(&s, "SHOW CONFIG");
    assert_eq!(config.cell("key", "peer_id", "value").as_deref(), Some("1"));
    assert_eq!(
        config.cell("key", "peer_id", "changeable").as_deref(),
        Some("no")
    );
}

/// A client waiting in line on the single event loop is left asleep when its request
/// is written to the server handed over, until the server answers (pool/line.rs):
/// its wait still ends at the hand-over, so `wait_time` counts the time in line and
/// not the query's run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_time_ends_when_the_server_is_handed_over() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .env("SLUICE_WORKERS", "0")
        .start();
    let holder = pooled(&s, None).await;
    let waiter = pooled(&s, None).await;
    select1(&waiter).await;
    within(T, "BEGIN", holder.batch_execute("BEGIN; SELECT 1"))
        .await
        .expect("BEGIN");
    let settle = || std::thread::sleep(Duration::from_millis(300));
    settle();
    let before = total(&s, "wait_time");
    let waiting = tokio::spawn(async move {
        waiter
            .simple_query("SELECT pg_sleep(1.5)")
            .await
            .map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    within(T, "COMMIT", holder.batch_execute("COMMIT"))
        .await
        .expect("COMMIT");
    within(T, "the waiter's answer", waiting)
        .await
        .expect("join")
        .expect("the waiter's query");
    settle();
    let waited = total(&s, "wait_time") - before;
    // ~300 ms in line; 1.8 s if the query's run were counted.
    assert!(
        (200_000..1_200_000).contains(&waited),
        "wait_time grew by {waited} us"
    );
}

/// Clients waiting in line for one server get their own answers, whole, and every
/// query is counted, whichever way the answer reached them: relayed for the waiter
/// at the hand-over (pool/delegate.rs: one simple Query or one extended-protocol
/// batch, answered whole and idle), or
/// by its own relay (an answer in several reads, a transaction left open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_waiting_clients_are_their_own_and_all_counted() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start();
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(pooled(&s, None).await);
    }
    std::thread::sleep(Duration::from_millis(300));
    let (q0, x0) = (total(&s, "query_count"), total(&s, "xact_count"));
    let a0 = total(&s, "server_assignment_count");
    let mut tasks = Vec::new();
    for (id, c) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut sent = 0u64;
            for i in 0..30 {
                let want = (id * 1000 + i).to_string();
                if i % 5 == 1 {
                    // The extended protocol on the unnamed statement: Parse, Bind,
                    // Describe, Execute and Sync in one request.
                    let param = [(&want as _, tokio_postgres::types::Type::TEXT)];
                    let q = c.query_typed_one("SELECT $1::text || '!'", &param);
                    let row = within(T, "an extended query in line", q).await;
                    let got: String = row.expect("extended query").get(0);
                    assert_eq!(got, format!("{want}!"), "client {id} query {i}");
                    sent += 1;
                    continue;
                }
                let sql = match i % 10 {
                    // A large answer: several reads, gathered by a delegate.
                    3 => format!("SELECT {want} || repeat('x', 20000)"),
                    // Longer than a delegate gathers: its relay reads on.
                    5 => format!("SELECT {want} || repeat('x', 100000)"),
                    // Larger than a page, within PostgreSQL's send buffer.
                    8 => format!("SELECT {want} || repeat('x', 6000)"),
                    _ => format!("SELECT {want}"),
                };
                let got = within(T, "a query in line", c.simple_query(&sql))
                    .await
                    .expect("query");
                let text = match &got[1] {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).unwrap().to_owned(),
                    other => panic!("client {id}: {other:?}"),
                };
                assert!(
                    text.starts_with(&want),
                    "client {id} query {i} got {}",
                    &text[..20]
                );
                let extra = match i % 10 {
                    3 => 20000,
                    5 => 100000,
                    8 => 6000,
                    _ => 0,
                };
                assert_eq!(text.len(), want.len() + extra, "client {id} query {i}");
                sent += 1;
                if i % 10 == 7 {
                    // A transaction: its BEGIN's answer leaves it open.
                    c.batch_execute("BEGIN").await.expect("BEGIN");
                    c.batch_execute("SELECT 1")
                        .await
                        .expect("SELECT in a transaction");
                    c.batch_execute("COMMIT").await.expect("COMMIT");
                    sent += 3;
                }
            }
            sent
        }));
    }
    let mut sent = 0;
    for t in tasks {
        sent += t.await.expect("client task");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(total(&s, "query_count") - q0, sent, "queries counted");
    // Each plain query is its own transaction; each BEGIN ... COMMIT is one.
    let xacts = sent - 12 * 3 * 2;
    assert_eq!(total(&s, "xact_count") - x0, xacts, "transactions counted");
    // A server is assigned once per plain query and once per transaction.
    assert_eq!(
        total(&s, "server_assignment_count") - a0,
        xacts,
        "assignments"
    );
}

/// Every transaction of pgbench clients that leave at the end is counted, though
/// most answers were relayed for them (pool/delegate.rs) and a client folds those
/// counts in only at its next request, or when it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_every_transaction_of_clients_that_left() {
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start();
    for mode in ["simple", "extended"] {
        let (q0, x0) = (total(&s, "query_count"), total(&s, "xact_count"));
        let args = ["-n", "-c", "16", "-j", "2", "-t", "100", "-M", mode];
        let run = crate::support::pgbench_script(s.port(), TEST_DB, "SELECT 1;\n", &args).await;
        assert!(run.success(), "{}\n{}", run.stdout, run.stderr);
        // Sessions fold their counts in within 100 ms, or as they end.
        let counted =
            || total(&s, "xact_count") - x0 == 1600 && total(&s, "query_count") - q0 == 1600;
        assert!(
            wait_until(Duration::from_secs(5), counted),
            "{mode}: {} transactions and {} queries counted of 1600\n{}",
            total(&s, "xact_count") - x0,
            total(&s, "query_count") - q0,
            s.diagnostics()
        );
    }
}

//! SHOW commands: PgBouncer 1.25's column names and order for every one, the column
//! types, and values that must follow what clients do.

use std::time::Duration;

use super::{builder, pooled, psql, psql_ok, select1, ADMIN, ADMIN_PW, STATS, STATS_PW};
use crate::support::probe::within;
use crate::support::wire::{RawClient, RawMsg};
use crate::support::{wait_until, MD5_USER, TEST_DB};

const SOCKET_COLS: &[&str] = &[
    "type",
    "user",
    "database",
    "replication",
    "state",
    "addr",
    "port",
    "local_addr",
    "local_port",
    "connect_time",
    "request_time",
    "wait",
    "wait_us",
    "close_needed",
    "ptr",
    "link",
    "remote_pid",
    "tls",
    "application_name",
    "prepared_statements",
    "id",
];
const DEBUG_COLS: &[&str] = &[
    "recv_pos",
    "pkt_pos",
    "pkt_remain",
    "send_pos",
    "send_remain",
    "pkt_avail",
    "send_avail",
];
const STAT_NAMES: &[&str] = &[
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
    "client_login_count",
];

fn expected_columns(cmd: &str) -> Vec<String> {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match cmd {
        "CLIENTS" | "SERVERS" => v(SOCKET_COLS),
        "SOCKETS" | "ACTIVE_SOCKETS" => [v(SOCKET_COLS), v(DEBUG_COLS)].concat(),
        "POOLS" => v(&[
            "database",
            "user",
            "cl_active",
            "cl_waiting",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active",
            "sv_active_cancel",
            "sv_being_canceled",
            "sv_idle",
            "sv_used",
            "sv_tested",
            "sv_login",
            "maxwait",
            "maxwait_us",
            "pool_mode",
            "load_balance_hosts",
        ]),
        "STATS" => {
            let totals = [
                "total_server_assignment_count",
                "total_xact_count",
                "total_query_count",
                "total_received",
                "total_sent",
                "total_xact_time",
                "total_query_time",
                "total_wait_time",
                "total_client_parse_count",
                "total_server_parse_count",
                "total_bind_count",
                "total_client_login_count",
            ];
            let avgs = [
                "avg_server_assignment_count",
                "avg_xact_count",
                "avg_query_count",
                "avg_recv",
                "avg_sent",
                "avg_xact_time",
                "avg_query_time",
                "avg_wait_time",
                "avg_client_parse_count",
                "avg_server_parse_count",
                "avg_bind_count",
                "avg_client_login_count",
            ];
            [v(&["database"]), v(&totals), v(&avgs)].concat()
        }
        "STATS_TOTALS" => [v(&["database"]), v(STAT_NAMES)].concat(),
        "STATS_AVERAGES" => {
            let mut c = [v(&["database"]), v(STAT_NAMES)].concat();
            for n in &mut c[9..] {
                *n = format!("avg_{n}");
            }
            c
        }
        "TOTALS" => v(&["name", "value"]),
        "DATABASES" => v(&[
            "name",
            "host",
            "port",
            "database",
            "force_user",
            "pool_size",
            "min_pool_size",
            "reserve_pool_size",
            "server_lifetime",
            "pool_mode",
            "load_balance_hosts",
            "max_connections",
            "current_connections",
            "max_client_connections",
            "current_client_connections",
            "paused",
            "disabled",
        ]),
        "USERS" => v(&[
            "name",
            "pool_size",
            "reserve_pool_size",
            "pool_mode",
            "max_user_connections",
            "current_connections",
            "max_user_client_connections",
            "current_client_connections",
        ]),
        "PEERS" => v(&["peer_id", "host", "port", "pool_size"]),
        "PEER_POOLS" => v(&[
            "peer_id",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active_cancel",
            "sv_login",
        ]),
        "LISTS" => v(&["list", "items"]),
        "CONFIG" => v(&["key", "value", "default", "changeable"]),
        "MEM" => v(&["name", "size", "used", "free", "memtotal"]),
        "DNS_HOSTS" => v(&["hostname", "ttl", "addrs"]),
        "DNS_ZONES" => v(&["zonename", "serial", "count"]),
        "VERSION" => v(&["version"]),
        "STATE" => v(&["key", "value"]),
        other => panic!("no column list for {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_show_command_has_pgbouncer_columns() {
    let s = builder().start();
    let c = pooled(&s, None).await;
    select1(&c).await;
    for cmd in [
        "VERSION",
        "CONFIG",
        "DATABASES",
        "POOLS",
        "CLIENTS",
        "SERVERS",
        "SOCKETS",
        "ACTIVE_SOCKETS",
        "USERS",
        "STATS",
        "STATS_TOTALS",
        "STATS_AVERAGES",
        "TOTALS",
        "LISTS",
        "MEM",
        "DNS_HOSTS",
        "DNS_ZONES",
        "STATE",
        "PEERS",
        "PEER_POOLS",
    ] {
        // Case-insensitive, with or without the semicolon.
        for sql in [format!("SHOW {cmd}"), format!("show {};", cmd.to_lowercase())] {
            let o = psql_ok(&s, &sql);
            assert_eq!(o.header, expected_columns(cmd), "{sql}");
        }
    }
    let help = psql_ok(&s, "SHOW HELP");
    assert!(
        help.stderr.contains("Console usage") && help.stderr.contains("SHOW HELP|CONFIG"),
        "{}",
        help.stderr
    );
    let bad = psql(&s, "SHOW NOSUCH");
    assert!(!bad.ok);
    assert!(
        bad.stderr
            .contains("invalid command 'SHOW NOSUCH', use SHOW HELP;"),
        "{}",
        bad.stderr
    );
    // Stats users may read everything.
    let o = super::psql_as(&s, STATS, STATS_PW, "SHOW POOLS");
    assert!(o.ok, "{}", o.stderr);
}

/// Column type OIDs of a result.
fn column_types(msgs: &[RawMsg]) -> Vec<(String, u32)> {
    let t = msgs.iter().find(|m| m.tag == b'T').expect("RowDescription");
    let b = &t.body;
    let n = u16::from_be_bytes([b[0], b[1]]) as usize;
    let mut pos = 2;
    let mut out = Vec::new();
    for _ in 0..n {
        let end = pos + b[pos..].iter().position(|&x| x == 0).expect("name");
        let name = String::from_utf8_lossy(&b[pos..end]).into_owned();
        pos = end + 1 + 4 + 2;
        let oid = u32::from_be_bytes([b[pos], b[pos + 1], b[pos + 2], b[pos + 3]]);
        pos += 4 + 2 + 4 + 2;
        out.push((name, oid));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_types_and_welcome_match_pgbouncer() {
    let s = builder().start();
    let mut c = RawClient::login(s.port(), ADMIN, ADMIN_PW, "pgbouncer", &[])
        .await
        .expect("console login");
    assert_eq!(c.param("server_version"), Some("1.25.2/bouncer"));
    assert_eq!(c.param("client_encoding"), Some("UTF8"));
    assert_eq!(c.param("DateStyle"), Some("ISO"));
    let t = Duration::from_secs(10);
    const TEXT: u32 = 25;
    const INT4: u32 = 23;
    const INT8: u32 = 20;
    const NUMERIC: u32 = 1700;
    let stats = column_types(&c.simple("SHOW STATS", t).await);
    assert_eq!(stats[0], ("database".into(), TEXT));
    assert!(stats[1..].iter().all(|(_, oid)| *oid == NUMERIC), "{stats:?}");
    let totals = column_types(&c.simple("SHOW STATS_TOTALS", t).await);
    assert!(totals[1..].iter().all(|(_, oid)| *oid == NUMERIC));
    let pools = column_types(&c.simple("SHOW POOLS", t).await);
    assert_eq!(pools[0].1, TEXT);
    assert!(pools[2..15].iter().all(|(_, oid)| *oid == INT4), "{pools:?}");
    assert_eq!(pools[15].1, TEXT);
    let clients = column_types(&c.simple("SHOW CLIENTS", t).await);
    let ty = |n: &str| clients.iter().find(|(c, _)| c == n).map(|x| x.1);
    assert_eq!(ty("connect_time"), Some(TEXT));
    assert_eq!(ty("port"), Some(INT4));
    assert_eq!(ty("id"), Some(INT8));
    let totals_rows = column_types(&c.simple("SHOW TOTALS", t).await);
    assert_eq!(totals_rows, vec![("name".into(), TEXT), ("value".into(), NUMERIC)]);
}

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
    assert_eq!(pools.cell("database", TEST_DB, "user"), Some(MD5_USER.into()));
    assert_eq!(pools.cell("database", TEST_DB, "cl_active"), Some("1".into()));
    assert_eq!(pools.cell("database", TEST_DB, "sv_active"), Some("1".into()));
    assert_eq!(pools.cell("database", TEST_DB, "pool_mode"), Some("session".into()));
    // The console's own pool is listed, as PgBouncer lists it.
    assert_eq!(pools.cell("database", "pgbouncer", "cl_active"), Some("1".into()));

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
    assert_eq!(servers.cell("type", "S", "remote_pid"), Some(pid.to_string()));
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
    drop(b);
    // Both gone: the server is idle in the pool.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let p = psql_ok(&s, "SHOW POOLS");
            p.cell("database", TEST_DB, "sv_idle") == Some("1".into())
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
    let before = total(&s, "query_count");
    for _ in 0..20 {
        select1(&c).await;
    }
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
            .any(|l| l.contains(" stats: ") && l.contains(" xacts/s, ") && l.contains(" wait "))),
        "no stats line\n{}",
        s.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_databases_users_lists_and_fake_params() {
    let s = builder()
        .user(MD5_USER, "pool_size=3")
        .database("other", "host=127.0.0.1 port=@PG_PORT@ dbname=sluice_test pool_mode=transaction")
        .start();
    let c = pooled(&s, None).await;
    select1(&c).await;

    let cfg = psql_ok(&s, "SHOW CONFIG");
    assert_eq!(cfg.cell("key", "listen_port", "value"), Some(s.port().to_string()));
    assert_eq!(cfg.cell("key", "listen_port", "default"), Some("6432".into()));
    assert_eq!(cfg.cell("key", "listen_port", "changeable"), Some("no".into()));
    assert_eq!(cfg.cell("key", "default_pool_size", "changeable"), Some("yes".into()));
    assert_eq!(cfg.cell("key", "stats_users", "value"), Some(STATS.into()));

    let dbs = psql_ok(&s, "SHOW DATABASES");
    assert_eq!(dbs.cell("name", "other", "pool_mode"), Some("transaction".into()));
    assert_eq!(dbs.cell("name", "other", "database"), Some(TEST_DB.into()));
    assert_eq!(dbs.cell("name", TEST_DB, "pool_size"), Some("20".into()));
    assert_eq!(dbs.cell("name", TEST_DB, "current_connections"), Some("1".into()));
    assert_eq!(dbs.cell("name", TEST_DB, "current_client_connections"), Some("1".into()));
    assert_eq!(dbs.cell("name", "pgbouncer", "force_user"), Some("pgbouncer".into()));
    assert_eq!(dbs.cell("name", "pgbouncer", "pool_mode"), Some("statement".into()));

    let users = psql_ok(&s, "SHOW USERS");
    assert_eq!(users.cell("name", MD5_USER, "pool_size"), Some("3".into()));
    assert_eq!(users.cell("name", MD5_USER, "current_connections"), Some("1".into()));
    assert_eq!(users.cell("name", ADMIN, "pool_size"), Some(String::new()));
    assert!(users.column("name").contains(&"pgbouncer".to_string()));

    let lists = psql_ok(&s, "SHOW LISTS");
    let items = |l: &str| lists.cell("list", l, "items").and_then(|v| v.parse::<u64>().ok());
    assert_eq!(items("databases"), Some(3));
    assert_eq!(items("pools"), Some(2));
    assert!(items("used_clients").is_some_and(|n| n >= 2));
    assert_eq!(items("used_servers"), Some(1));
    assert_eq!(lists.column("list").len(), 14);

    let state = psql_ok(&s, "SHOW STATE");
    assert_eq!(state.cell("key", "active", "value"), Some("yes".into()));
    assert_eq!(state.cell("key", "paused", "value"), Some("no".into()));
    let version = psql_ok(&s, "SHOW VERSION");
    assert!(version.rows[0][0].starts_with("PgBouncer 1.25.2 (Sluice "), "{version:?}");
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

//! SHOW commands: PgBouncer 1.25's column names and order for every one, the column
//! types, and the console's welcome. Values that follow the pooler's state are in
//! `values.rs`.

use std::time::Duration;

use super::{builder, pooled, psql, psql_ok, select1, ADMIN, ADMIN_PW, STATS, STATS_PW};
use crate::support::wire::{RawClient, RawMsg};

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
        for sql in [
            format!("SHOW {cmd}"),
            format!("show {};", cmd.to_lowercase()),
        ] {
            let o = psql_ok(&s, &sql);
            assert_eq!(o.header, expected_columns(cmd), "{sql}");
        }
    }
    let help = psql_ok(&s, "SHOW HELP");
    assert!(
        help.stderr.contains("Console usage")
            && help.stderr.contains("SHOW HELP|CONFIG")
            && help.stderr.contains("KILL_CLIENT <client_id>"),
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
    assert!(
        stats[1..].iter().all(|(_, oid)| *oid == NUMERIC),
        "{stats:?}"
    );
    let totals = column_types(&c.simple("SHOW STATS_TOTALS", t).await);
    assert!(totals[1..].iter().all(|(_, oid)| *oid == NUMERIC));
    let pools = column_types(&c.simple("SHOW POOLS", t).await);
    assert_eq!(pools[0].1, TEXT);
    assert!(
        pools[2..15].iter().all(|(_, oid)| *oid == INT4),
        "{pools:?}"
    );
    assert_eq!(pools[15].1, TEXT);
    let clients = column_types(&c.simple("SHOW CLIENTS", t).await);
    let ty = |n: &str| clients.iter().find(|(c, _)| c == n).map(|x| x.1);
    assert_eq!(ty("connect_time"), Some(TEXT));
    assert_eq!(ty("port"), Some(INT4));
    assert_eq!(ty("id"), Some(INT8));
    let totals_rows = column_types(&c.simple("SHOW TOTALS", t).await);
    assert_eq!(
        totals_rows,
        vec![("name".into(), TEXT), ("value".into(), NUMERIC)]
    );
}

/// SHOW CLIENTS' times are PgBouncer's `YYYY-MM-DD HH:MM:SS UTC` and read as the time
/// they were: PostgreSQL takes the console's own `connect_time` back as a moment of
/// the last minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_times_are_utc_and_now() {
    let s = builder().start();
    let out = psql_ok(&s, "SHOW CLIENTS");
    let times = out.column("connect_time");
    let t = times.first().expect("the console's own row");
    assert!(t.len() == 23 && t.ends_with(" UTC"), "{t:?}");
    let sql = format!("SELECT extract(epoch FROM now() - '{t}'::timestamptz)::int");
    let age = crate::support::pg::pg().psql_db("postgres", &sql);
    let age: i64 = age
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{age:?}: {e}"));
    assert!((0..60).contains(&age), "{t} is {age} s ago");
}

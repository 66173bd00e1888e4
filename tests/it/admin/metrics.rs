//! The `/metrics` endpoint (scraped with a plain std TcpStream) and Debian's
//! `prometheus-pgbouncer-exporter` reading the console.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{builder, pooled, select1, STATS, STATS_PW};
use crate::support::{free_port, wait_until, TEST_DB};

/// One HTTP exchange: `(status line, headers + body)`.
fn http(port: u16, request: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.lines().next().unwrap_or("").to_owned();
    Some((status, out))
}

fn get(port: u16, path: &str) -> Option<(String, String)> {
    http(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n"),
    )
}

/// The value of the sample whose line starts with `prefix` (name and labels).
fn sample(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_exports_counters_after_load() {
    let mport = free_port();
    let s = builder()
        .setting("pool_mode", "transaction")
        .setting("metrics_listen", &format!("127.0.0.1:{mport}"))
        .start();
    let c = pooled(&s, None).await;
    for _ in 0..25 {
        select1(&c).await;
    }
    // Sessions fold their counts into the pool's within 100 ms (batched off the hot
    // path); let that pass before scraping.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, text) = get(mport, "/metrics").expect("scrape");
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    assert!(
        text.contains("Content-Type: text/plain; version=0.0.4"),
        "{text}"
    );
    let db = format!("{{database=\"{TEST_DB}\"}}");
    assert_eq!(sample(&text, "pgbouncer_up "), Some(1.0));
    assert!(text.contains("pgbouncer_version_info{version=\"PgBouncer 1.25.2 (Sluice "));
    for name in [
        "pgbouncer_stats_queries_pooled_total",
        "pgbouncer_stats_sql_transactions_pooled_total",
        "pgbouncer_stats_received_bytes_total",
        "pgbouncer_stats_sent_bytes_total",
        "pgbouncer_stats_queries_duration_seconds_total",
        "pgbouncer_stats_server_in_transaction_seconds_total",
    ] {
        let v = sample(&text, &format!("{name}{db}"));
        assert!(v.is_some_and(|v| v > 0.0), "{name}: {v:?}\n{text}");
    }
    assert!(sample(&text, &format!("pgbouncer_stats_queries_pooled_total{db}")).unwrap() >= 25.0);
    let pool = format!("{{database=\"{TEST_DB}\",user=\"sluice_md5\"}}");
    assert_eq!(
        sample(
            &text,
            &format!("pgbouncer_pools_client_active_connections{pool}")
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            &format!("pgbouncer_pools_server_idle_connections{pool}")
        ),
        Some(1.0)
    );
    for name in [
        "pgbouncer_pools_client_waiting_connections",
        "pgbouncer_pools_server_active_connections",
        "pgbouncer_pools_server_used_connections",
        "pgbouncer_pools_server_testing_connections",
        "pgbouncer_pools_server_login_connections",
        "pgbouncer_pools_client_maxwait_seconds",
    ] {
        assert!(sample(&text, &format!("{name}{pool}")).is_some(), "{name}");
    }
    assert!(text.contains("# TYPE pgbouncer_stats_queries_pooled_total counter"));
    assert!(sample(
        &text,
        "pgbouncer_databases_current_connections{name=\"sluice_test\""
    )
    .is_some_and(|v| v >= 1.0));
    assert_eq!(
        sample(&text, "pgbouncer_databases_pool_size{name=\"sluice_test\""),
        Some(20.0)
    );
    assert!(sample(
        &text,
        "pgbouncer_databases_max_connections{name=\"sluice_test\""
    )
    .is_some());
    assert_eq!(
        sample(&text, "pgbouncer_config_max_client_connections "),
        Some(100.0)
    );
    assert_eq!(
        sample(&text, "pgbouncer_config_max_user_connections "),
        Some(0.0)
    );
    // Latency histograms: cumulative buckets, in seconds.
    let inf = sample(
        &text,
        &format!("sluice_query_duration_seconds_bucket{{database=\"{TEST_DB}\",user=\"sluice_md5\",le=\"+Inf\"}}"),
    );
    assert!(inf.is_some_and(|v| v >= 25.0), "{inf:?}");
    assert!(text.contains("# TYPE sluice_transaction_duration_seconds histogram"));
    assert!(sample(
        &text,
        &format!(
            "sluice_wait_duration_seconds_count{{database=\"{TEST_DB}\",user=\"sluice_md5\"}}"
        )
    )
    .is_some_and(|v| v >= 25.0));
    // Requests written behind others, and those written again after a cancel aimed
    // at the one before: counters per pool (none written again here).
    assert!(text.contains("# TYPE sluice_pipelined_requests_total counter"));
    assert_eq!(
        sample(
            &text,
            &format!("sluice_pipelined_resent_total{{database=\"{TEST_DB}\",user=\"sluice_md5\"}}")
        ),
        Some(0.0)
    );

    // Only GET /metrics is served; oversized requests are cut off.
    assert!(get(mport, "/nope").unwrap().0.contains("404"));
    let post = http(mport, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").unwrap();
    assert!(post.0.contains("405"), "{post:?}");
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    let r = http(mport, &huge);
    assert!(
        r.as_ref().is_none_or(|(status, _)| !status.contains("200")),
        "{r:?}"
    );
    // Still serving after that.
    assert!(get(mport, "/metrics").unwrap().0.contains("200"));
}

/// Debian 12's `prometheus-pgbouncer-exporter` (1.7, Python) connects to the console
/// with psycopg2 and runs SHOW LISTS, STATS, POOLS and DATABASES.
///
/// That release still reads columns PgBouncer itself removed long ago (`total_requests`
/// from SHOW STATS, gone in 1.8; `reserve_pool` from SHOW DATABASES, renamed in 1.24),
/// so against any current PgBouncer, and so against Sluice, its per-database
/// collectors fail on the first row. Its `--database` filter skips rows before reading
/// them; with a filter that matches no database, the exporter starts and serves SHOW
/// LISTS, which is enough to prove the console works for it end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debian_exporter_scrapes_the_console() {
    let exe = "/usr/bin/prometheus-pgbouncer-exporter";
    if !std::path::Path::new(exe).exists() {
        eprintln!("note: {exe} is not installed (scripts/install-deps.sh installs it); skipping");
        return;
    }
    let s = builder().setting("pool_mode", "transaction").start();
    let eport = free_port();
    let mut child = Command::new(exe)
        .args(["--pgbouncer-host", "127.0.0.1"])
        .args(["--pgbouncer-port", &s.port().to_string()])
        .args(["--pgbouncer-user", STATS])
        .args(["--host", "127.0.0.1", "--port", &eport.to_string()])
        .args(["--database", "no_database_has_this_name"])
        .env("PGPASSWORD", STATS_PW)
        .env_remove("PGHOST")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the exporter");
    let ready = wait_until(Duration::from_secs(20), || {
        get(eport, "/").is_some_and(|(st, _)| st.contains("200"))
    });
    if !ready {
        let _ = child.kill();
        let out = child.wait_with_output().expect("exporter output");
        panic!(
            "exporter did not start:\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            s.diagnostics()
        );
    }
    // Load while scraping: clients in use show up in SHOW LISTS.
    let c1 = pooled(&s, None).await;
    let c2 = pooled(&s, None).await;
    let load = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            select1(&c1).await;
            select1(&c2).await;
        }
    });
    let (status, text) = tokio::task::spawn_blocking(move || get(eport, "/metrics"))
        .await
        .expect("join")
        .expect("scrape the exporter");
    load.abort();
    let _ = child.kill();
    let _ = child.wait();
    assert!(status.contains("200"), "{status}\n{text}");
    // The exporter's own console connection plus the two pooled clients.
    assert!(
        sample(&text, "pgbouncer_used_clients ").is_some_and(|v| v >= 3.0),
        "{text}"
    );
    assert!(
        sample(&text, "pgbouncer_databases ").is_some_and(|v| v >= 2.0),
        "{text}"
    );
    assert!(
        sample(&text, "pgbouncer_pools ").is_some_and(|v| v >= 2.0),
        "{text}"
    );
    assert!(
        sample(&text, "pgbouncer_used_servers ").is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, "pgbouncer_users ").is_some_and(|v| v >= 1.0),
        "{text}"
    );
}

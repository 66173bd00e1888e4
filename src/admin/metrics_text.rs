//! The `/metrics` body in Prometheus' text format (0.0.4).
//!
//! Metric names and labels follow the community pgbouncer_exporter, so existing
//! dashboards and alerts work against Sluice directly; the values come from the same
//! functions as the console's SHOW output. Latency histograms, which PgBouncer does
//! not have, are exported as `sluice_*` per database and user.

use std::fmt::{Display, Write};

use super::averages::current_totals;
use super::show_misc::list_rows;
use super::show_pools::{database_rows, pool_rows};
use crate::app::App;
use crate::stats::histogram::HistogramSnapshot;
use crate::stats::BUCKETS_US;

/// A text body being built.
struct Text(String);

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// One histogram series: cumulative buckets in seconds, sum and count.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0u64;
        for (i, bound) in BUCKETS_US.iter().enumerate() {
            cumulative += h.counts.get(i).copied().unwrap_or(0);
            let le = seconds(*bound).to_string();
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&format!("{name}_bucket"), &l, cumulative);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&format!("{name}_bucket"), &l, h.count);
        self.sample(&format!("{name}_sum"), labels, seconds(h.sum_us));
        self.sample(&format!("{name}_count"), labels, h.count);
    }
}

fn seconds(us: u64) -> f64 {
    us as f64 / 1e6
}

/// Renders every metric.
pub fn render(app: &App) -> String {
    let mut t = Text(String::with_capacity(16 * 1024));
    t.family("pgbouncer_up", "gauge", "The pooler answered the scrape");
    t.sample("pgbouncer_up", &[], 1);
    t.family("pgbouncer_version_info", "gauge", "The pooler version");
    t.sample(
        "pgbouncer_version_info",
        &[("version", &super::version_string())],
        1,
    );
    pools(app, &mut t);
    stats(app, &mut t);
    databases(app, &mut t);
    config_and_lists(app, &mut t);
    histograms(app, &mut t);
    pipelined(app, &mut t);
    t.0
}

/// One of a pool's counters.
type Count = fn(&crate::stats::PoolStats) -> u64;

/// Sluice's own: requests written to a server behind another client's request
/// (pool/pipeline.rs), and those written again after a cancel aimed at the one before
/// canceled them, per database and user.
fn pipelined(app: &App, t: &mut Text) {
    let mut pools = app.pools.all();
    pools.sort_by(|a, b| (&a.key.database, &a.key.user).cmp(&(&b.key.database, &b.key.user)));
    let families: [(&str, &str, Count); 2] = [
        (
            "sluice_pipelined_requests_total",
            "Requests written to a server behind another client's",
            |s| s.pipelined(),
        ),
        (
            "sluice_pipelined_resent_total",
            "Requests written behind another and written again after a cancel aimed at that one canceled them",
            |s| s.resent(),
        ),
    ];
    for (name, help, value) in families {
        t.family(name, "counter", help);
        for p in &pools {
            let labels = [
                ("database", p.key.database.as_str()),
                ("user", p.key.user.as_str()),
            ];
            t.sample(name, &labels, value(&p.stats));
        }
    }
}

fn pools(app: &App, t: &mut Text) {
    let rows = pool_rows(app);
    type Get = fn(&super::show_pools::PoolRow) -> f64;
    let gauges: [(&str, &str, Get); 12] = [
        (
            "client_active_connections",
            "Client connections linked to a server or idle",
            |r| f64::from(r.cl_active),
        ),
        (
            "client_waiting_connections",
            "Client connections waiting for a server",
            |r| f64::from(r.cl_waiting),
        ),
        (
            "client_active_cancel_connections",
            "Clients whose cancel request was forwarded",
            |r| f64::from(r.cl_active_cancel_req),
        ),
        (
            "client_waiting_cancel_connections",
            "Clients whose cancel request waits",
            |r| f64::from(r.cl_waiting_cancel_req),
        ),
        (
            "server_active_connections",
            "Server connections lent to clients",
            |r| f64::from(r.sv_active),
        ),
        (
            "server_active_cancel_connections",
            "Server connections forwarding a cancel",
            |r| f64::from(r.cl_active_cancel_req),
        ),
        (
            "server_being_canceled_connections",
            "Server connections being canceled",
            |r| f64::from(r.sv_being_canceled),
        ),
        (
            "server_idle_connections",
            "Idle server connections ready for use",
            |r| f64::from(r.sv_idle),
        ),
        (
            "server_used_connections",
            "Idle server connections that need a check before use",
            |r| f64::from(r.sv_used),
        ),
        (
            "server_testing_connections",
            "Server connections running a reset or check query",
            |r| f64::from(r.sv_tested),
        ),
        (
            "server_login_connections",
            "Server connections logging in",
            |r| f64::from(r.sv_login),
        ),
        (
            "client_maxwait_seconds",
            "How long the oldest waiting client has waited",
            |r| r.maxwait.as_secs_f64(),
        ),
    ];
    for (suffix, help, get) in gauges {
        let name = format!("pgbouncer_pools_{suffix}");
        t.family(&name, "gauge", help);
        for r in &rows {
            t.sample(
                &name,
                &[("database", &r.database), ("user", &r.user)],
                get(r),
            );
        }
    }
}

fn stats(app: &App, t: &mut Text) {
    let totals = current_totals(app);
    type Get = fn(&crate::stats::Totals) -> f64;
    let counters: [(&str, &str, Get); 10] = [
        ("queries_pooled_total", "Queries pooled", |s| {
            s.queries as f64
        }),
        (
            "queries_duration_seconds_total",
            "Seconds spent running queries on servers",
            |s| seconds(s.query_time_us),
        ),
        ("received_bytes_total", "Bytes received from clients", |s| {
            s.bytes_received as f64
        }),
        ("sent_bytes_total", "Bytes sent to clients", |s| {
            s.bytes_sent as f64
        }),
        (
            "sql_transactions_pooled_total",
            "Transactions pooled",
            |s| s.xacts as f64,
        ),
        (
            "server_in_transaction_seconds_total",
            "Seconds servers spent in transactions",
            |s| seconds(s.xact_time_us),
        ),
        (
            "client_wait_seconds_total",
            "Seconds clients waited for a server",
            |s| seconds(s.wait_time_us),
        ),
        (
            "client_parses_total",
            "Parse messages received from clients",
            |s| s.client_parses as f64,
        ),
        (
            "server_parses_total",
            "Parse messages sent to servers",
            |s| s.server_parses as f64,
        ),
        ("binds_total", "Bind messages received from clients", |s| {
            s.binds as f64
        }),
    ];
    for (suffix, help, get) in counters {
        let name = format!("pgbouncer_stats_{suffix}");
        t.family(&name, "counter", help);
        for (db, s) in &totals {
            t.sample(&name, &[("database", db)], get(s));
        }
    }
}

fn databases(app: &App, t: &mut Text) {
    let rows = database_rows(app);
    type Get = fn(&super::show_pools::DbRow) -> u64;
    let gauges: [(&str, &str, Get); 6] = [
        ("pool_size", "Server connections allowed per pool", |r| {
            u64::from(r.pool_size)
        }),
        (
            "reserve_pool",
            "Extra server connections allowed per pool",
            |r| u64::from(r.reserve_pool_size),
        ),
        (
            "max_connections",
            "Server connections allowed for the database",
            |r| u64::from(r.max_connections),
        ),
        (
            "current_connections",
            "Server connections open to the database",
            |r| u64::from(r.current_connections),
        ),
        ("paused", "1 if the database is paused", |r| {
            u64::from(r.paused)
        }),
        ("disabled", "1 if the database is disabled", |r| {
            u64::from(r.disabled)
        }),
    ];
    for (suffix, help, get) in gauges {
        let name = format!("pgbouncer_databases_{suffix}");
        t.family(&name, "gauge", help);
        for r in &rows {
            let port = r.port.to_string();
            let labels = [
                ("name", r.name.as_str()),
                ("host", r.host.as_deref().unwrap_or("")),
                ("port", port.as_str()),
                ("database", r.database.as_str()),
                ("force_user", r.force_user.as_deref().unwrap_or("")),
                ("pool_mode", r.pool_mode.unwrap_or("")),
            ];
            t.sample(&name, &labels, get(r));
        }
    }
}

fn config_and_lists(app: &App, t: &mut Text) {
    let cfg = app.config();
    let s = &cfg.settings;
    for (name, help, v) in [
        (
            "pgbouncer_config_max_client_connections",
            "max_client_conn",
            s.max_client_conn,
        ),
        (
            "pgbouncer_config_max_user_connections",
            "max_user_connections",
            s.max_user_connections,
        ),
    ] {
        t.family(name, "gauge", help);
        t.sample(name, &[], v);
    }
    for (list, v) in list_rows(app) {
        // The exporter's names for the DNS lists; the others keep SHOW LISTS' names.
        let name = match list {
            "dns_names" => "cached_dns_names",
            "dns_zones" => "cached_dns_zones",
            "dns_queries" => "in_flight_dns_queries",
            "dns_pending" | "peers" | "peer_pools" => continue,
            other => other,
        };
        let name = format!("pgbouncer_{name}");
        t.family(&name, "gauge", &format!("SHOW LISTS {list}"));
        t.sample(&name, &[], v);
    }
}

fn histograms(app: &App, t: &mut Text) {
    let mut pools = app.pools.all();
    pools.sort_by(|a, b| (&a.key.database, &a.key.user).cmp(&(&b.key.database, &b.key.user)));
    let families: [(&str, &str); 3] = [
        (
            "sluice_query_duration_seconds",
            "Query latency seen by the pooler",
        ),
        (
            "sluice_transaction_duration_seconds",
            "Transaction latency seen by the pooler",
        ),
        (
            "sluice_wait_duration_seconds",
            "Time clients waited for a server",
        ),
    ];
    for (i, (name, help)) in families.iter().enumerate() {
        t.family(name, "histogram", help);
        for p in &pools {
            let h = match i {
                0 => p.stats.query_hist.snapshot(),
                1 => p.stats.xact_hist.snapshot(),
                _ => p.stats.wait_hist.snapshot(),
            };
            let labels = [
                ("database", p.key.database.as_str()),
                ("user", p.key.user.as_str()),
            ];
            t.histogram(name, &labels, &h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_histograms() {
        let mut t = Text(String::new());
        t.sample("m", &[("a", "x\"y\\z\n")], 3);
        assert_eq!(t.0, "m{a=\"x\\\"y\\\\z\\n\"} 3\n");
        let mut t = Text(String::new());
        let mut counts = vec![0u64; BUCKETS_US.len() + 1];
        counts[0] = 2;
        counts[3] = 1;
        counts[BUCKETS_US.len()] = 1;
        let h = HistogramSnapshot {
            counts,
            sum_us: 20_000_500,
            count: 4,
        };
        t.histogram("h", &[("database", "d")], &h);
        assert!(t
            .0
            .starts_with("h_bucket{database=\"d\",le=\"0.0001\"} 2\n"));
        assert!(t.0.contains("h_bucket{database=\"d\",le=\"0.001\"} 3\n"));
        assert!(t.0.contains("h_bucket{database=\"d\",le=\"10\"} 3\n"));
        assert!(t.0.contains("h_bucket{database=\"d\",le=\"+Inf\"} 4\n"));
        assert!(t.0.contains("h_sum{database=\"d\"} 20.0005\n"));
        assert!(t.0.ends_with("h_count{database=\"d\"} 4\n"));
    }
}

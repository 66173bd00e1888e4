//! SHOW STATS, STATS_TOTALS, STATS_AVERAGES and TOTALS: per-database totals since
//! start and averages over the last `stats_period`, all counters as `numeric`.
//! Includes `client_login_count` (PgBouncer's development branch has it; 1.25.2 not).

use bytes::BytesMut;

use super::averages::current_totals;
use super::rows::{Cell, Table, Ty};
use crate::app::App;
use crate::stats::Totals;

/// The twelve counters in PgBouncer's column order.
fn fields(t: &Totals) -> [u64; 12] {
    [
        t.server_assignments,
        t.xacts,
        t.queries,
        t.bytes_received,
        t.bytes_sent,
        t.xact_time_us,
        t.query_time_us,
        t.wait_time_us,
        t.client_parses,
        t.server_parses,
        t.binds,
        t.logins,
    ]
}

const TOTAL_NAMES: [&str; 12] = [
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

const AVG_NAMES: [&str; 12] = [
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

/// STATS_TOTALS' names; STATS_AVERAGES uses them too, with `avg_` on the last four.
const PLAIN_NAMES: [&str; 12] = [
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

/// TOTALS' row names follow PgBouncer's internal field names.
const TOTALS_ROWS: [&str; 12] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "client_bytes",
    "server_bytes",
    "xact_time",
    "query_time",
    "wait_time",
    "ps_client_parse_count",
    "ps_server_parse_count",
    "ps_bind_count",
    "client_login_count",
];

fn numeric_cols<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<(&'a str, Ty)> {
    let mut cols = vec![("database", Ty::Text)];
    cols.extend(names.into_iter().map(|n| (n, Ty::Numeric)));
    cols
}

fn row(db: &str, values: impl IntoIterator<Item = u64>) -> Vec<Cell<'_>> {
    let mut r = vec![Cell::from(db)];
    r.extend(values.into_iter().map(Cell::UInt));
    r
}

/// SHOW STATS: totals then averages, per database.
pub fn stats(app: &App, out: &mut BytesMut) {
    let current = current_totals(app);
    let (avgs, _) = app.admin.history.averages(&current);
    let mut t = Table::new(out, &numeric_cols(TOTAL_NAMES.into_iter().chain(AVG_NAMES)));
    for (db, tot) in &current {
        let avg = avgs.get(db).copied().unwrap_or_default();
        t.row(row(db, fields(tot).into_iter().chain(fields(&avg))));
    }
    t.finish();
}

/// SHOW STATS_TOTALS.
pub fn stats_totals(app: &App, out: &mut BytesMut) {
    let current = current_totals(app);
    let mut t = Table::new(out, &numeric_cols(PLAIN_NAMES));
    for (db, tot) in &current {
        t.row(row(db, fields(tot)));
    }
    t.finish();
}

/// SHOW STATS_AVERAGES.
pub fn stats_averages(app: &App, out: &mut BytesMut) {
    let current = current_totals(app);
    let (avgs, _) = app.admin.history.averages(&current);
    let names: Vec<String> = PLAIN_NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| {
            // PgBouncer prefixes only the prepared-statement and login columns.
            if (8..12).contains(&i) {
                format!("avg_{n}")
            } else {
                (*n).to_owned()
            }
        })
        .collect();
    let mut t = Table::new(out, &numeric_cols(names.iter().map(String::as_str)));
    for (db, avg) in &avgs {
        t.row(row(db, fields(avg)));
    }
    t.finish();
}

/// SHOW TOTALS: the same numbers over all databases, one `name, value` row each.
pub fn totals(app: &App, out: &mut BytesMut) {
    let current = current_totals(app);
    let (_, avg) = app.admin.history.averages(&current);
    let mut all = Totals::default();
    for t in current.values() {
        all.add(t);
    }
    let mut t = Table::new(out, &[("name", Ty::Text), ("value", Ty::Numeric)]);
    for (prefix, values) in [("total", fields(&all)), ("avg", fields(&avg))] {
        for (name, v) in TOTALS_ROWS.iter().zip(values) {
            t.row(vec![format!("{prefix}_{name}").into(), Cell::UInt(v)]);
        }
    }
    t.finish();
}

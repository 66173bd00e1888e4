//! Per-database averages over `stats_period` (SHOW STATS `avg_*`, SHOW
//! STATS_AVERAGES, SHOW TOTALS) and the periodic `stats:` log line.
//!
//! As in PgBouncer, a ticker snapshots every database's totals each period; an
//! average is the change since the snapshot before last, divided by the time since
//! then. Counts become per-second rates; times become per-event means (query time per
//! query, transaction time per transaction, wait time per server assignment).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::app::App;
use crate::config::ADMIN_DB;
use crate::stats::Totals;

/// Snapshots of every database's totals at the last two ticks.
#[derive(Debug)]
pub struct History {
    inner: Mutex<Snapshots>,
}

#[derive(Debug)]
struct Snapshots {
    newer: HashMap<String, Totals>,
    older: HashMap<String, Totals>,
    new_stamp: Instant,
    old_stamp: Instant,
}

impl Default for History {
    fn default() -> Self {
        let now = Instant::now();
        History {
            inner: Mutex::new(Snapshots {
                newer: HashMap::new(),
                older: HashMap::new(),
                new_stamp: now,
                // A second back, so that averages asked for right after start divide
                // by something sensible (PgBouncer does the same).
                old_stamp: now.checked_sub(Duration::from_secs(1)).unwrap_or(now),
            }),
        }
    }
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, Snapshots> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a new snapshot; returns the averages of the period that just ended, per
    /// database and over all of them.
    pub fn tick(&self, current: &BTreeMap<String, Totals>) -> (BTreeMap<String, Totals>, Totals) {
        let mut s = self.lock();
        s.older = std::mem::take(&mut s.newer);
        s.newer = current.iter().map(|(k, v)| (k.clone(), *v)).collect();
        s.old_stamp = s.new_stamp;
        s.new_stamp = Instant::now();
        averages_locked(&s, current)
    }

    /// The averages now, per database (for the databases in `current`) and overall.
    pub fn averages(
        &self,
        current: &BTreeMap<String, Totals>,
    ) -> (BTreeMap<String, Totals>, Totals) {
        let s = self.lock();
        averages_locked(&s, current)
    }
}

fn averages_locked(
    s: &Snapshots,
    current: &BTreeMap<String, Totals>,
) -> (BTreeMap<String, Totals>, Totals) {
    let dur = s.old_stamp.elapsed();
    let mut per_db = BTreeMap::new();
    let (mut cur_all, mut old_all) = (Totals::default(), Totals::default());
    for (db, cur) in current {
        let old = s.older.get(db).copied().unwrap_or_default();
        per_db.insert(db.clone(), average(cur, &old, dur));
        cur_all.add(cur);
        old_all.add(&old);
    }
    (per_db, average(&cur_all, &old_all, dur))
}

/// PgBouncer's averaging: rates per second for counts and bytes, means for times.
pub fn average(cur: &Totals, old: &Totals, dur: Duration) -> Totals {
    let d = cur.since(old);
    let us = dur.as_micros() as u64;
    if us == 0 {
        return Totals::default();
    }
    let rate = |v: u64| ((u128::from(v) * 1_000_000) / u128::from(us)) as u64;
    let mean = |total: u64, n: u64| total.checked_div(n).unwrap_or(0);
    Totals {
        server_assignments: rate(d.server_assignments),
        xacts: rate(d.xacts),
        queries: rate(d.queries),
        bytes_received: rate(d.bytes_received),
        bytes_sent: rate(d.bytes_sent),
        xact_time_us: mean(d.xact_time_us, d.xacts),
        query_time_us: mean(d.query_time_us, d.queries),
        wait_time_us: mean(d.wait_time_us, d.server_assignments),
        client_parses: rate(d.client_parses),
        server_parses: rate(d.server_parses),
        binds: rate(d.binds),
        logins: rate(d.logins),
    }
}

/// Every database's totals now: the pools' summed per database, plus the console's own
/// traffic as database `pgbouncer` (PgBouncer lists it too).
pub fn current_totals(app: &App) -> BTreeMap<String, Totals> {
    let mut m: BTreeMap<String, Totals> = BTreeMap::new();
    for p in app.pools.all() {
        m.entry(p.key.database.clone())
            .or_default()
            .add(&p.stats.totals());
    }
    m.entry(ADMIN_DB.to_owned())
        .or_default()
        .add(&app.admin.console_stats.totals());
    m
}

/// The ticker: every `stats_period`, a new snapshot and (with `log_stats`) the log line.
pub async fn run(app: Arc<App>) {
    loop {
        let period = app
            .config()
            .settings
            .stats_period
            .max(Duration::from_secs(1));
        crate::timer::sleep(period).await;
        let current = current_totals(&app);
        let (per_db, all) = app.admin.history.tick(&current);
        if app.config().settings.log_stats {
            tracing::info!("stats: {}", line(&all));
            for (db, avg) in &per_db {
                tracing::debug!("stats for database {db}: {}", line(avg));
            }
        }
    }
}

/// The numbers of PgBouncer's stats line, in its order and units.
fn line(a: &Totals) -> String {
    format!(
        "{} xacts/s, {} queries/s, {} client parses/s, {} server parses/s, {} binds/s, \
         in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
        a.xacts,
        a.queries,
        a.client_parses,
        a.server_parses,
        a.binds,
        a.bytes_received,
        a.bytes_sent,
        a.xact_time_us,
        a.query_time_us,
        a.wait_time_us
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_means() {
        let old = Totals {
            queries: 10,
            query_time_us: 1_000,
            ..Default::default()
        };
        let cur = Totals {
            queries: 30,
            query_time_us: 5_000,
            xacts: 20,
            xact_time_us: 8_000,
            server_assignments: 4,
            wait_time_us: 400,
            bytes_received: 2_000,
            ..Default::default()
        };
        let a = average(&cur, &old, Duration::from_secs(2));
        assert_eq!(a.queries, 10);
        assert_eq!(a.query_time_us, 200);
        assert_eq!(a.xacts, 10);
        assert_eq!(a.xact_time_us, 400);
        assert_eq!(a.wait_time_us, 100);
        assert_eq!(a.bytes_received, 1_000);
        assert_eq!(
            average(&cur, &cur, Duration::from_secs(1)),
            Totals::default()
        );
        assert_eq!(
            line(&a),
            "10 xacts/s, 10 queries/s, 0 client parses/s, 0 server parses/s, 0 binds/s, \
             in 1000 B/s, out 0 B/s, xact 400 us, query 200 us, wait 100 us"
        );
    }

    #[test]
    fn tick_shifts_snapshots() {
        let h = History::default();
        let mut cur = BTreeMap::new();
        cur.insert(
            "db".to_owned(),
            Totals {
                queries: 5,
                ..Default::default()
            },
        );
        h.tick(&cur);
        std::thread::sleep(Duration::from_millis(2));
        cur.get_mut("db").unwrap().queries = 9;
        h.tick(&cur);
        let (per_db, _) = h.averages(&cur);
        // The change since the older snapshot (5 -> 9) over a tiny interval: a rate > 0.
        assert!(per_db["db"].queries > 0);
    }
}

//! Statistics: per-pool counters (PgBouncer's SHOW STATS columns) and latency
//! histograms.
//!
//! The relay accumulates a plain [`StatsDelta`] per client and folds it into the
//! pool's atomics when it gives a server back (or at session end), so the per-message
//! path touches no shared cache line; latencies go straight into the pool's
//! histograms, once per query.

mod clients;
pub mod conns;
pub mod histogram;
pub mod logins;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use histogram::{Histogram, BUCKETS_US};

/// Counts gathered by one client between flushes.
#[derive(Debug, Default, Clone)]
pub struct StatsDelta {
    pub counts: Totals,
}

impl StatsDelta {
    /// Whether nothing was counted since the last flush.
    pub fn is_empty(&self) -> bool {
        self.counts == Totals::default()
    }
}

/// Totals since start for one pool. Counters only ever grow.
#[derive(Debug, Default)]
pub struct PoolStats {
    server_assignments: AtomicU64,
    xacts: AtomicU64,
    queries: AtomicU64,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    xact_time_us: AtomicU64,
    query_time_us: AtomicU64,
    wait_time_us: AtomicU64,
    client_parses: AtomicU64,
    server_parses: AtomicU64,
    binds: AtomicU64,
    logins: AtomicU64,
    /// Requests written behind another client's on a server (pool/pipeline.rs).
    pipelined: AtomicU64,
    /// Of those, written again after a cancel aimed at the one before canceled them.
    resent: AtomicU64,
    pub query_hist: Histogram,
    pub xact_hist: Histogram,
    pub wait_hist: Histogram,
}

/// A point-in-time copy of a pool's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub server_assignments: u64,
    pub xacts: u64,
    pub queries: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub xact_time_us: u64,
    pub query_time_us: u64,
    pub wait_time_us: u64,
    pub client_parses: u64,
    pub server_parses: u64,
    pub binds: u64,
    pub logins: u64,
}

impl Totals {
    /// Field-wise sum (for per-database and global aggregates).
    pub fn add(&mut self, o: &Totals) {
        self.server_assignments += o.server_assignments;
        self.xacts += o.xacts;
        self.queries += o.queries;
        self.bytes_received += o.bytes_received;
        self.bytes_sent += o.bytes_sent;
        self.xact_time_us += o.xact_time_us;
        self.query_time_us += o.query_time_us;
        self.wait_time_us += o.wait_time_us;
        self.client_parses += o.client_parses;
        self.server_parses += o.server_parses;
        self.binds += o.binds;
        self.logins += o.logins;
    }

    /// Field-wise difference `self - earlier` (saturating).
    pub fn since(&self, e: &Totals) -> Totals {
        Totals {
            server_assignments: self.server_assignments.saturating_sub(e.server_assignments),
            xacts: self.xacts.saturating_sub(e.xacts),
            queries: self.queries.saturating_sub(e.queries),
            bytes_received: self.bytes_received.saturating_sub(e.bytes_received),
            bytes_sent: self.bytes_sent.saturating_sub(e.bytes_sent),
            xact_time_us: self.xact_time_us.saturating_sub(e.xact_time_us),
            query_time_us: self.query_time_us.saturating_sub(e.query_time_us),
            wait_time_us: self.wait_time_us.saturating_sub(e.wait_time_us),
            client_parses: self.client_parses.saturating_sub(e.client_parses),
            server_parses: self.server_parses.saturating_sub(e.server_parses),
            binds: self.binds.saturating_sub(e.binds),
            logins: self.logins.saturating_sub(e.logins),
        }
    }
}

impl PoolStats {
    /// Counts a client's login (it has no relay yet to count it in).
    pub fn count_login(&self) {
        self.logins.fetch_add(1, Relaxed);
    }

    /// Counts a request written behind another client's (pool/pipeline.rs).
    pub fn count_pipelined(&self) {
        self.pipelined.fetch_add(1, Relaxed);
    }

    /// Requests written behind another client's since start (`/metrics`).
    pub fn pipelined(&self) -> u64 {
        self.pipelined.load(Relaxed)
    }

    /// Counts a request written again after a cancel aimed at the one before it
    /// canceled it (pool/pipeline.rs).
    pub fn count_resent(&self) {
        self.resent.fetch_add(1, Relaxed);
    }

    /// Requests written again so, since start (`/metrics`).
    pub fn resent(&self) -> u64 {
        self.resent.load(Relaxed)
    }

    /// Folds a client's delta in and clears it.
    pub fn flush(&self, d: &mut StatsDelta) {
        if d.is_empty() {
            return;
        }
        let add = |a: &AtomicU64, v: u64| {
            if v != 0 {
                a.fetch_add(v, Relaxed);
            }
        };
        add(&self.server_assignments, d.counts.server_assignments);
        add(&self.xacts, d.counts.xacts);
        add(&self.queries, d.counts.queries);
        add(&self.bytes_received, d.counts.bytes_received);
        add(&self.bytes_sent, d.counts.bytes_sent);
        add(&self.xact_time_us, d.counts.xact_time_us);
        add(&self.query_time_us, d.counts.query_time_us);
        add(&self.wait_time_us, d.counts.wait_time_us);
        add(&self.client_parses, d.counts.client_parses);
        add(&self.server_parses, d.counts.server_parses);
        add(&self.binds, d.counts.binds);
        add(&self.logins, d.counts.logins);
        *d = StatsDelta::default();
    }

    /// The totals now.
    pub fn totals(&self) -> Totals {
        Totals {
            server_assignments: self.server_assignments.load(Relaxed),
            xacts: self.xacts.load(Relaxed),
            queries: self.queries.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            xact_time_us: self.xact_time_us.load(Relaxed),
            query_time_us: self.query_time_us.load(Relaxed),
            wait_time_us: self.wait_time_us.load(Relaxed),
            client_parses: self.client_parses.load(Relaxed),
            server_parses: self.server_parses.load(Relaxed),
            binds: self.binds.load(Relaxed),
            logins: self.logins.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_adds_and_clears() {
        let s = PoolStats::default();
        let mut d = StatsDelta::default();
        d.counts.queries = 3;
        d.counts.xacts = 2;
        d.counts.bytes_sent = 100;
        s.query_hist.record(150);
        s.flush(&mut d);
        assert!(d.is_empty());
        d.counts.queries = 1;
        s.flush(&mut d);
        let t = s.totals();
        assert_eq!((t.queries, t.xacts, t.bytes_sent), (4, 2, 100));
        assert_eq!(s.query_hist.snapshot().count, 1);
        let mut agg = Totals::default();
        agg.add(&t);
        agg.add(&t);
        assert_eq!(agg.queries, 8);
        assert_eq!(agg.since(&t).queries, 4);
    }
}

//! Fixed-bucket latency histograms (microseconds), Prometheus style: cumulative
//! buckets are computed on export, counts are stored per bucket. Recorded straight
//! into the pool's atomics: a client-local copy would cost every client ~240 bytes
//! and save no atomic operation, since transaction pooling flushes at each release.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the buckets in microseconds; one more bucket holds the rest.
pub const BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

const N: usize = BUCKETS_US.len() + 1;

fn bucket(us: u64) -> usize {
    BUCKETS_US
        .iter()
        .position(|&b| us <= b)
        .unwrap_or(BUCKETS_US.len())
}

/// A shared histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; N],
    sum_us: AtomicU64,
    count: AtomicU64,
}

/// A copy of a histogram: per-bucket counts (not cumulative), sum and count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    pub counts: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

impl Histogram {
    /// Counts one observation. Relaxed: readers want totals, not an ordering, and
    /// a reader may see the count before the sum (a scrape is a snapshot anyway).
    pub fn record(&self, us: u64) {
        self.counts[bucket(us)].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum_us: self.sum_us.load(Relaxed),
            count: self.count.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_by_upper_bound() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(100), 0);
        assert_eq!(bucket(101), 1);
        assert_eq!(bucket(u64::MAX), BUCKETS_US.len());
        let h = Histogram::default();
        h.record(90);
        h.record(20_000_000);
        let s = h.snapshot();
        assert_eq!(
            (s.counts[0], s.counts[N - 1], s.count, s.sum_us),
            (1, 1, 2, 20_000_090)
        );
    }
}

//! Fixed-bucket latency histograms (microseconds), Prometheus style: cumulative
//! buckets are computed on export, counts are stored per bucket.

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

/// A client-local histogram, merged into a shared one at flush.
#[derive(Debug, Default, Clone)]
pub struct LocalHistogram {
    counts: [u32; N],
    sum_us: u64,
    count: u32,
}

impl LocalHistogram {
    pub fn record(&mut self, us: u64) {
        self.counts[bucket(us)] += 1;
        self.sum_us += us;
        self.count += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
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
    /// Adds a local histogram and clears it.
    pub fn merge(&self, l: &mut LocalHistogram) {
        if l.count == 0 {
            return;
        }
        for (a, c) in self.counts.iter().zip(l.counts.iter()) {
            if *c != 0 {
                a.fetch_add(u64::from(*c), Relaxed);
            }
        }
        self.sum_us.fetch_add(l.sum_us, Relaxed);
        self.count.fetch_add(u64::from(l.count), Relaxed);
        *l = LocalHistogram::default();
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
        let mut l = LocalHistogram::default();
        l.record(90);
        l.record(20_000_000);
        let h = Histogram::default();
        h.merge(&mut l);
        let s = h.snapshot();
        assert_eq!(
            (s.counts[0], s.counts[N - 1], s.count, s.sum_us),
            (1, 1, 2, 20_000_090)
        );
        assert!(l.is_empty());
    }
}

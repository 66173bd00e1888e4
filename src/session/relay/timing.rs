//! Relay timing: the client-facing timeouts and the query/transaction clocks behind
//! SHOW STATS and the histograms.

use std::time::Duration;

use super::Relay;
use crate::clock::Tick;
use crate::stats::PoolStats;

impl Relay {
    /// The earliest moment a timeout could fire, and the reason it would give.
    pub(super) fn deadline(&self, linked: bool) -> Option<(Tick, &'static str)> {
        let t = &self.timeouts;
        if t.none() {
            // The usual case, asked twice per statement: no conversions, no clocks.
            return None;
        }
        let mut best: Option<(Tick, &'static str)> = None;
        let mut consider = |at: Tick, why: &'static str| {
            if best.is_none_or(|(b, _)| at < b) {
                best = Some((at, why));
            }
        };
        if let (false, Some(at)) = (t.query().is_zero(), self.request_started) {
            consider(at + t.query(), "query_timeout");
        }
        if let (false, Some(at)) = (t.transaction().is_zero(), self.transaction_started) {
            consider(at + t.transaction(), "transaction timeout");
        }
        let idle_in_tx = linked && self.pending == 0 && self.status != b'I';
        if !t.idle_transaction().is_zero() && idle_in_tx {
            consider(
                self.last_activity + t.idle_transaction(),
                "idle transaction timeout",
            );
        }
        if !t.client_idle().is_zero() && self.pending == 0 && self.status == b'I' {
            consider(self.last_activity + t.client_idle(), "client_idle_timeout");
        }
        best
    }

    /// Updates the timestamps after client bytes: a request starts when the server
    /// owed nothing, and a transaction starts with a request outside one.
    pub(super) fn note_client_activity(&mut self, pending_before: u32, now: Tick) {
        self.last_read = now;
        if pending_before == 0 && self.pending > 0 {
            self.last_activity = now;
            self.request_started = Some(now);
            if self.transaction_started.is_none() {
                self.transaction_started = Some(now);
            }
        } else if !self.timeouts.client_idle().is_zero()
            || !self.timeouts.idle_transaction().is_zero()
        {
            self.last_activity = now;
        }
    }

    /// When the client's last bytes arrived.
    pub fn last_read(&self) -> Tick {
        self.last_read
    }

    /// When the server's last ReadyForQuery arrived (or the client's last request).
    pub fn last_activity(&self) -> Tick {
        self.last_activity
    }

    /// After server bytes with ReadyForQuery in them: counts queries and transactions
    /// and their times, and flushes the counts when a transaction ended.
    pub(super) fn note_server_activity(&mut self, stats: &PoolStats) {
        if self.readies == 0 {
            return;
        }
        self.note_server_activity_at(stats, Tick::now());
    }

    /// [`Relay::note_server_activity`] for an answer that came at `now`.
    pub(super) fn note_server_activity_at(&mut self, stats: &PoolStats, now: Tick) {
        self.last_activity = now;
        self.stats.counts.queries += u64::from(self.readies);
        if let Some(at) = self.request_started {
            let us = now.micros_since(at);
            self.stats.counts.query_time_us += us;
            stats.query_hist.record(us);
        }
        self.request_started = (self.pending > 0).then_some(now);
        if self.xacts_done > 0 {
            self.stats.counts.xacts += u64::from(self.xacts_done);
            if let Some(at) = self.transaction_started {
                let us = now.micros_since(at);
                self.stats.counts.xact_time_us += us;
                stats.xact_hist.record(us);
            }
            self.transaction_started = if self.status != b'I' || self.pending > 0 {
                Some(now)
            } else {
                None
            };
            self.maybe_flush(stats, now);
        }
    }

    /// [`Relay::deadline`], or sooner when batched counts are waiting: they reach
    /// SHOW STATS within 100 ms even if the client then stays idle.
    pub(super) fn deadline_or_flush(&self, linked: bool) -> Option<(Tick, &'static str)> {
        let deadline = self.deadline(linked);
        if self.stats.is_empty() {
            return deadline;
        }
        let flush_at = (self.last_flush + FLUSH_EVERY, "");
        Some(deadline.map_or(flush_at, |d| d.min(flush_at)))
    }

    /// Folds the counts into the pool's stats every 64 transactions or every 100 ms,
    /// not after each one: the pool's counters are shared by all threads.
    pub(super) fn maybe_flush(&mut self, stats: &PoolStats, now: Tick) {
        if self.stats.counts.xacts >= 64 || now.reached(self.last_flush, FLUSH_EVERY) {
            stats.flush(&mut self.stats);
            self.last_flush = now;
        }
    }
}

/// How often batched counts reach the pool's stats at the latest.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Client-facing timeouts; zero disables each, as in PgBouncer. Kept in whole
/// milliseconds (up to 49 days) because every idle client keeps a copy: 16 bytes
/// instead of 64.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timeouts {
    ms: [u32; 4],
}

impl Timeouts {
    pub fn new(
        query: Duration,
        idle_transaction: Duration,
        transaction: Duration,
        client_idle: Duration,
    ) -> Timeouts {
        // A nonzero timeout below a millisecond stays nonzero.
        let ms = |d: Duration| match d.as_millis() {
            0 if !d.is_zero() => 1,
            n => u32::try_from(n).unwrap_or(u32::MAX),
        };
        Timeouts {
            ms: [
                ms(query),
                ms(idle_transaction),
                ms(transaction),
                ms(client_idle),
            ],
        }
    }

    /// Only `client_idle_timeout`: for a replication client, whose stream is one
    /// long command.
    pub fn streaming(self) -> Timeouts {
        Timeouts {
            ms: [0, 0, 0, self.ms[3]],
        }
    }

    /// Whether every timeout is off.
    pub fn none(&self) -> bool {
        self.ms == [0; 4]
    }

    pub fn query(&self) -> Duration {
        Duration::from_millis(self.ms[0].into())
    }

    pub fn idle_transaction(&self) -> Duration {
        Duration::from_millis(self.ms[1].into())
    }

    pub fn transaction(&self) -> Duration {
        Duration::from_millis(self.ms[2].into())
    }

    pub fn client_idle(&self) -> Duration {
        Duration::from_millis(self.ms[3].into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_keep_milliseconds_and_never_turn_off() {
        let t = Timeouts::new(
            Duration::from_micros(300),
            Duration::from_millis(1500),
            Duration::ZERO,
            Duration::from_secs(60 * 86_400),
        );
        // Below a millisecond: still on.
        assert_eq!(t.query(), Duration::from_millis(1));
        assert_eq!(t.idle_transaction(), Duration::from_millis(1500));
        assert!(t.transaction().is_zero());
        // Past u32 milliseconds: the longest it can hold, still on.
        assert_eq!(t.client_idle(), Duration::from_millis(u32::MAX.into()));
        assert!(!t.none());
        assert!(Timeouts::default().none());
        let one = Timeouts::new(
            Duration::ZERO,
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::ZERO,
        );
        assert!(!one.none());
    }
}

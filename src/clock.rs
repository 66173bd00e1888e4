//! The monotonic clock of the per-request path, in whole nanoseconds.
//!
//! A transaction reads the clock a few times and measures or compares some eight
//! intervals (query and transaction times, the stats flush, the idle server's age and
//! idle time, the client's request age). With `std::time::Instant` each of those is a
//! checked timespec subtraction (~40 instructions, the most of any one function in the
//! relay's profile); with [`Tick`] it is one integer subtraction. The timers
//! (`timer.rs`) keep their deadlines as `Tick`s too, and a timerfd takes them as they are.

use std::time::Duration;

/// A point on `CLOCK_MONOTONIC` (the clock `Instant` reads on Linux), in nanoseconds.
/// `Default` is the clock's origin, a placeholder until a reading replaces it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(u64);

impl Tick {
    /// Now.
    pub fn now() -> Tick {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call to fill, and
        // CLOCK_MONOTONIC exists on every Linux (so the call cannot fail and leave it
        // unset; were it to, the zero time is still a valid value).
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        // Both fields are non-negative for CLOCK_MONOTONIC (time since boot).
        Tick((ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64)
    }

    /// Nanoseconds from `earlier` to this point; zero if `earlier` is later.
    pub fn nanos_since(self, earlier: Tick) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Microseconds from `earlier` to this point; zero if `earlier` is later.
    pub fn micros_since(self, earlier: Tick) -> u64 {
        self.nanos_since(earlier) / 1_000
    }

    /// The time from `earlier` to this point; zero if `earlier` is later.
    pub fn since(self, earlier: Tick) -> Duration {
        Duration::from_nanos(self.nanos_since(earlier))
    }

    /// Whether at least `d` passed from `earlier` to this point.
    pub fn reached(self, earlier: Tick, d: Duration) -> bool {
        self.nanos_since(earlier) >= nanos(d)
    }

    /// The time elapsed since this point.
    pub fn elapsed(self) -> Duration {
        Tick::now().since(self)
    }
}

impl std::ops::Add<Duration> for Tick {
    type Output = Tick;

    /// This point plus `d` (saturating: "never" for absurd durations).
    fn add(self, d: Duration) -> Tick {
        Tick(self.0.saturating_add(nanos(d)))
    }
}

/// `d` in nanoseconds, saturating (u64 nanoseconds last 584 years).
fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn measures_and_compares_like_instant() {
        let (t0, i0) = (Tick::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, i1) = (Tick::now(), Instant::now());
        let (dt, di) = (t1.since(t0), i1.duration_since(i0));
        // Both read CLOCK_MONOTONIC: the two measures differ by the reads' spacing.
        assert!(dt >= Duration::from_millis(20), "{dt:?}");
        assert!(
            dt.abs_diff(di) < Duration::from_millis(5),
            "{dt:?} vs {di:?}"
        );
        assert!(t1 > t0);
        assert_eq!(t0.since(t1), Duration::ZERO);
        assert_eq!(t1.micros_since(t0), t1.nanos_since(t0) / 1000);
        assert!(t1.reached(t0, Duration::from_millis(20)));
        assert!(!t1.reached(t0, Duration::from_secs(3600)));
        assert_eq!(
            (t0 + Duration::from_millis(7)).since(t0),
            Duration::from_millis(7)
        );
        assert_eq!(t0 + Duration::MAX, Tick(u64::MAX));
    }
}

//! Gives the heap's free memory back to the system after a burst of busy clients.
//!
//! A client busy with a request holds a 16 KB relay buffer or two, so 300 clients
//! busy at once hold ~5-15 MB. When they are done, glibc keeps what they freed in
//! its heap: a longer-lived block above it (a table that grew during the burst)
//! stops the heap from shrinking, and the resident size stays at the burst's peak.
//! Measured by hand: 7.8 MB after one burst of 300 `pgbench -S` clients, 17.6 MB
//! after 24 such bursts, of which 2.1 MB in use; `malloc_trim` took it to 7.9 MB.
//!
//! The janitor looks every [`CHECK_TICKS`] ticks. A trim is made when glibc holds
//! [`FREE_MIN`] or more free and, after the first trim, only once the resident size
//! grew by [`GROWTH`] since the last one: a pooler whose size holds steady is not
//! trimmed again and again (a trim walks the free blocks under the arena's lock,
//! and the pages it gives back fault in again when used).

/// Janitor ticks (500 ms each) between two looks: 5 s.
pub const CHECK_TICKS: u32 = 10;
/// Growth of the resident size since the last trim that makes a trim worth trying.
const GROWTH: usize = 2 << 20;
/// Free bytes in the heap below which a trim is not worth making.
const FREE_MIN: usize = 2 << 20;

/// The janitor's record of the resident size, owned by the janitor.
#[derive(Debug, Default)]
pub struct Trimmer {
    /// The resident size after the last trim, or the lowest seen since; None
    /// before the first trim.
    baseline: Option<usize>,
    ticks: u32,
}

/// What a trim did, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trimmed {
    pub rss_before: usize,
    pub rss_after: usize,
}

impl Trimmer {
    pub fn new() -> Trimmer {
        Trimmer::default()
    }

    /// Called at each janitor tick; looks every [`CHECK_TICKS`] ticks and trims when
    /// [`worth_trimming`] says so.
    pub fn tick(&mut self) -> Option<Trimmed> {
        self.ticks += 1;
        if self.ticks < CHECK_TICKS {
            return None;
        }
        self.ticks = 0;
        let rss = heap::resident()?;
        if !worth_trimming(rss, self.baseline, heap::free_bytes()?) {
            self.baseline = self.baseline.map(|b| b.min(rss));
            return None;
        }
        heap::trim();
        let after = heap::resident().unwrap_or(rss);
        self.baseline = Some(after);
        Some(Trimmed {
            rss_before: rss,
            rss_after: after,
        })
    }
}

/// Whether a trim is worth making: the allocator holds `free` bytes it does not
/// use, at least [`FREE_MIN`], and the resident size `rss` grew by [`GROWTH`] over
/// `baseline` (the size after the last trim, or the lowest since), if there was one.
pub fn worth_trimming(rss: usize, baseline: Option<usize>, free: usize) -> bool {
    free >= FREE_MIN && baseline.is_none_or(|b| rss >= b.saturating_add(GROWTH))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod heap {
    /// The process's resident size in bytes (`/proc/self/statm`).
    pub fn resident() -> Option<usize> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        pages.checked_mul(usize::try_from(page).ok()?)
    }

    /// Bytes glibc holds free in its arenas. `mallinfo`, not `mallinfo2`: the latter
    /// came with glibc 2.33, and Sluice still builds on older systems (RHEL 8's 2.28).
    /// Its `int` fields wrap past 2 GiB; read as unsigned they hold up to 4 GiB, more
    /// than a pooler's heap.
    pub fn free_bytes() -> Option<usize> {
        // SAFETY: mallinfo only reads the allocator's counters, under its own locks.
        let info = unsafe { libc::mallinfo() };
        usize::try_from(info.fordblks as u32).ok()
    }

    pub fn trim() {
        // SAFETY: malloc_trim only gives free pages back to the system, under the
        // allocator's own locks; no block in use moves or changes.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod heap {
    //! Other allocators: nothing is looked at or trimmed.
    pub fn resident() -> Option<usize> {
        None
    }
    pub fn free_bytes() -> Option<usize> {
        None
    }
    pub fn trim() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    #[test]
    fn trims_free_memory_once_until_the_size_grows_again() {
        // Never trimmed: free memory is enough.
        assert!(worth_trimming(10 * MB, None, 2 * MB));
        assert!(!worth_trimming(10 * MB, None, MB));
        // Grown by 2 MB since the last trim, with 2 MB free: trim again.
        assert!(worth_trimming(10 * MB, Some(8 * MB), 2 * MB));
        // Grown, but the memory is in use.
        assert!(!worth_trimming(10 * MB, Some(8 * MB), MB));
        // Free memory, but no growth since the last trim: a steady size is left.
        assert!(!worth_trimming(10 * MB - 1, Some(8 * MB), 6 * MB));
        assert!(!worth_trimming(7 * MB, Some(8 * MB), 6 * MB));
    }

    #[test]
    fn looks_only_every_few_ticks() {
        let mut t = Trimmer::new();
        for _ in 1..CHECK_TICKS {
            assert_eq!(t.tick(), None);
        }
        assert_eq!(t.ticks, CHECK_TICKS - 1);
        // The look (a trim or not, as this test process's heap has it).
        let _ = t.tick();
        assert_eq!(t.ticks, 0);
    }
}

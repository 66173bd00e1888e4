//! Gives the heap's free memory back to the system after a burst of busy clients.
//!
//! A client busy with a request holds a 16 KB relay buffer or two, so 300 clients
//! busy at once hold ~5-15 MB. When they are done, glibc keeps what they freed in
//! its heap: a longer-lived block above it (a table that grew during the burst)
//! stops the heap from shrinking, and the resident size stays at the burst's peak.
//! Measured by hand: 7.8 MB after one burst of 300 `pgbench -S` clients, 17.6 MB
//! after 24 such bursts, of which 2.1 MB in use; `malloc_trim` took it to 7.9 MB.
//!
//! The janitor looks every [`CHECK_TICKS`] ticks at the resident size less what
//! the allocator has in use: the resident memory nobody uses (the binary, the
//! stacks, and the heap's free pages still mapped). It trims when glibc holds
//! [`FREE_MIN`] or more free and that figure grew by [`GROWTH`] over its low mark
//! (its value after the last trim, or the lowest since). So a burst's memory goes
//! back once its clients are done, and a pooler whose size holds steady is not
//! trimmed again and again: a trim walks the free blocks under the arena's lock,
//! and the pages it gives back fault in again when used. The first look trims on
//! free memory alone, as it may come just after a burst.

/// Janitor ticks (500 ms each) between two looks: 5 s.
pub const CHECK_TICKS: u32 = 10;
/// Growth of the unused resident memory over its low mark that makes a trim
/// worth trying.
const GROWTH: usize = 2 << 20;
/// Free bytes in the heap below which a trim is not worth making.
const FREE_MIN: usize = 2 << 20;

/// The janitor's record of unused resident memory, owned by the janitor.
#[derive(Debug, Default)]
pub struct Trimmer {
    /// Resident bytes not in use after the last trim, or the fewest seen since;
    /// None before the first look.
    low: Option<usize>,
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
        let usage = heap::usage()?;
        let unused = rss.saturating_sub(usage.in_use);
        if !worth_trimming(unused, self.low, usage.free) {
            self.low = Some(self.low.map_or(unused, |l| l.min(unused)));
            return None;
        }
        heap::trim();
        let after = heap::resident().unwrap_or(rss);
        self.low = Some(after.saturating_sub(usage.in_use));
        Some(Trimmed {
            rss_before: rss,
            rss_after: after,
        })
    }
}

/// Whether a trim is worth making: the allocator holds `free` bytes it does not
/// use, at least [`FREE_MIN`], and the resident bytes not in use, `unused`, grew by
/// [`GROWTH`] over their `low` mark, if there is one yet.
pub fn worth_trimming(unused: usize, low: Option<usize>, free: usize) -> bool {
    free >= FREE_MIN && low.is_none_or(|l| unused >= l.saturating_add(GROWTH))
}

/// The allocator's bytes: in use (in its arenas and mapped on their own), and free.
#[derive(Debug, Clone, Copy)]
struct Usage {
    in_use: usize,
    free: usize,
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

    /// What glibc has in use and free. `mallinfo`, not `mallinfo2`: the latter came
    /// with glibc 2.33, and Sluice still builds on older systems (RHEL 8's 2.28). Its
    /// `int` fields wrap past 2 GiB; read as unsigned they hold up to 4 GiB, more than
    /// a pooler's heap.
    pub fn usage() -> Option<super::Usage> {
        // SAFETY: mallinfo only reads the allocator's counters, under its own locks.
        let info = unsafe { libc::mallinfo() };
        let bytes = |v: libc::c_int| usize::try_from(v as u32).ok();
        Some(super::Usage {
            in_use: bytes(info.uordblks)?.checked_add(bytes(info.hblkhd)?)?,
            free: bytes(info.fordblks)?,
        })
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
    pub fn usage() -> Option<super::Usage> {
        None
    }
    pub fn trim() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    #[test]
    fn trims_free_memory_when_the_unused_part_grew() {
        // The first look: free memory is enough.
        assert!(worth_trimming(10 * MB, None, 2 * MB));
        assert!(!worth_trimming(10 * MB, None, MB));
        // Unused memory 2 MB over its low mark, with 2 MB free: trim.
        assert!(worth_trimming(10 * MB, Some(8 * MB), 2 * MB));
        // Grown, but too little of the heap is free.
        assert!(!worth_trimming(10 * MB, Some(8 * MB), MB));
        // Free memory, but the unused part has not grown since the last trim (the
        // free pages were given back then): left alone.
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

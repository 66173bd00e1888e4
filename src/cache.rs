//! Hints to the processor's data caches: where a task about to run will read.
//!
//! With hundreds of clients, a waiting client's state has left the nearest caches by
//! the time a server is handed to it, and its task then reaches that state pointer
//! by pointer, one miss after another. The side that hands the server over knows
//! where the state is and asks for it ahead, so the misses overlap while the server
//! runs the query (docs/performance.md, twenty-third round).

/// Addresses a waiting client's task reads when it runs again: its session, relay,
/// console entry and futures. Plain numbers, never read through: a stale one costs a
/// useless fetch and nothing else.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hints([usize; 5]);

impl Hints {
    pub fn new(at: [usize; 5]) -> Hints {
        Hints(at)
    }

    /// Asks for the two cache lines from each address: the hot fields of each
    /// (`repr(C)`) struct come first.
    pub fn fetch(&self) {
        for &a in &self.0 {
            if a != 0 {
                line(a);
                line(a.wrapping_add(64));
            }
        }
    }
}

/// Asks for the cache line that holds `addr`.
#[inline]
pub fn line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that reads nothing the program can see; the
    // processor ignores one to an unmapped or stale address without a fault
    // (PREFETCHh "does not generate exceptions" in Intel's and AMD's manuals). SSE,
    // which the instruction belongs to, is part of the x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_to_freed_unmapped_or_wild_addresses_are_harmless() {
        let freed = {
            let b = Box::new([7u8; 256]);
            &*b as *const [u8; 256] as usize
        };
        let live = vec![1u64; 32];
        Hints::new([
            freed,
            usize::MAX - 8,
            16,
            live.as_ptr() as usize,
            0xdead_beef_0000,
        ])
        .fetch();
        line(usize::MAX);
        assert_eq!(live.iter().sum::<u64>(), 32);
    }
}

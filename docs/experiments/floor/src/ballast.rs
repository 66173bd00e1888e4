//! Per-client ballast for measuring what cold client state costs.

/// One cache line of ballast: a count, and the index of the client's next line.
#[repr(align(64))]
pub(crate) struct Line {
    count: u64,
    next: u32,
}

/// `FLOOR_COLD_LINES` cache lines per client, scattered over an arena and chained, each
/// line's address read from the one before: a stand-in for a real pooler's per-client
/// state reached pointer by pointer (task, future, session, console entry, ...). A
/// client's chain is walked when its request and when its answer pass.
pub(crate) struct Ballast {
    lines: Vec<Line>,
    per_client: usize,
}

impl Ballast {
    pub(crate) fn new(per_client: usize) -> Ballast {
        const CLIENTS: usize = 1024;
        let n = CLIENTS * per_client;
        // A fixed scatter: line k of client c sits at a multiplicative hash of
        // c * per_client + k (an odd multiplier is a permutation modulo a power of 2).
        let size = n.next_power_of_two().max(1);
        let at = |i: usize| (i.wrapping_mul(0x9E37_79B1) & (size - 1)) as u32;
        let mut lines: Vec<Line> = (0..size).map(|_| Line { count: 0, next: 0 }).collect();
        for c in 0..CLIENTS {
            for k in 0..per_client {
                let i = c * per_client + k;
                let next = if k + 1 < per_client {
                    at(i + 1)
                } else {
                    u32::MAX
                };
                lines[at(i) as usize].next = next;
            }
        }
        Ballast { lines, per_client }
    }

    /// The first line of client number `c` (clients past the arena share chains).
    pub(crate) fn head(&self, c: usize) -> u32 {
        let size = self.lines.len();
        ((c % 1024 * self.per_client).wrapping_mul(0x9E37_79B1) & (size - 1)) as u32
    }

    pub(crate) fn touch(&mut self, head: u32) {
        if self.per_client == 0 {
            return;
        }
        let mut i = head;
        while let Some(l) = self.lines.get_mut(i as usize) {
            l.count = std::hint::black_box(l.count.wrapping_add(1));
            i = l.next;
        }
    }
}

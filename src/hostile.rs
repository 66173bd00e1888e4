//! Hostile input for the parsers' unit tests: valid samples bent out of shape (bytes
//! flipped, ranges cut or repeated, length fields set to extremes) and random bytes,
//! from a fixed seed so that a failure is the same on every run. Each module's tests
//! feed them to its parsers and check that nothing panics and what comes back holds
//! together; the integration tests do the same through a socket for a few cases.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// xorshift64*: small, fast and good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let n = self.below(max_len + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Length-like values that break parsers that trust them.
const EXTREMES: [u32; 8] = [0, 1, 3, 4, 5, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF];

/// One protocol message: `tag`, then the length, then `body`.
pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// `sample` bent one to four ways.
pub fn mutate(rng: &mut Rng, sample: &[u8]) -> Vec<u8> {
    let mut v = sample.to_vec();
    for _ in 0..=rng.below(4) {
        let len = v.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next() as u8;
            }
            2 if len > 0 => {
                // Cut a range out.
                let a = rng.below(len);
                let b = a + rng.below(len - a + 1);
                v.drain(a..b);
            }
            3 if len > 0 => {
                // Repeat a range.
                let a = rng.below(len);
                let b = a + rng.below((len - a).min(64) + 1);
                let piece = v[a..b].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, piece);
            }
            4 if len >= 4 => {
                // An extreme in a 4-byte field (lengths, codes, counts).
                let i = rng.below(len - 3);
                let e = EXTREMES[rng.below(EXTREMES.len())];
                v[i..i + 4].copy_from_slice(&e.to_be_bytes());
            }
            5 => v.truncate(rng.below(len + 1)),
            _ => {
                let at = rng.below(len + 1);
                let junk = rng.bytes(16);
                v.splice(at..at, junk);
            }
        }
    }
    v
}

/// Runs `check` on `cases` inputs: each a mutation of one of `samples` or, one in
/// eight, random bytes. A panic (in the code under test or in `check`'s own asserts)
/// fails the test with the case number and the input, so it can be made a test of
/// its own.
pub fn run(seed: u64, cases: usize, samples: &[&[u8]], mut check: impl FnMut(&[u8])) {
    let mut rng = Rng::new(seed);
    for case in 0..cases {
        let input = if samples.is_empty() || rng.below(8) == 0 {
            rng.bytes(96)
        } else {
            let sample = samples[rng.below(samples.len())];
            mutate(&mut rng, sample)
        };
        if catch_unwind(AssertUnwindSafe(|| check(&input))).is_err() {
            panic!(
                "case {case} (seed {seed}) panicked on input {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}

/// [`run`] for parsers of text: inputs that are not UTF-8 are made so (lossily).
pub fn run_text(seed: u64, cases: usize, samples: &[&str], mut check: impl FnMut(&str)) {
    let samples: Vec<&[u8]> = samples.iter().map(|s| s.as_bytes()).collect();
    run(seed, cases, &samples, |b| {
        check(&String::from_utf8_lossy(b))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_differ_and_are_reproducible() {
        let sample = b"some sample bytes to bend";
        let a: Vec<Vec<u8>> = {
            let mut r = Rng::new(7);
            (0..50).map(|_| mutate(&mut r, sample)).collect()
        };
        let b: Vec<Vec<u8>> = {
            let mut r = Rng::new(7);
            (0..50).map(|_| mutate(&mut r, sample)).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().filter(|m| m.as_slice() != sample).count() > 40);
    }

    #[test]
    fn a_panic_names_the_input() {
        let r = catch_unwind(|| run(1, 10, &[b"abc"], |_| panic!("boom")));
        let msg = r.err().and_then(|e| e.downcast::<String>().ok());
        assert!(msg.is_some_and(|m| m.contains("case 0")));
    }
}

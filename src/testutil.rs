//! Test helpers shared by the modules' unit tests: a small deterministic
//! generator for randomized parser tests (the same inputs on every run, so
//! a failure reproduces), and its mutations of valid messages.

/// xorshift64*: deterministic, no dependency.
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (0 for n = 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Random bytes of a random length in `0..max_len`.
    pub(crate) fn bytes_below(&mut self, max_len: u64) -> Vec<u8> {
        let n = self.below(max_len) as usize;
        self.bytes(n)
    }

    /// A value that is often at an edge: 0, 1, small, a power of two
    /// around, the top of a width, or anything.
    pub(crate) fn edgy(&mut self) -> u64 {
        match self.below(8) {
            0 => 0,
            1 => 1,
            2 => self.below(16),
            3 => 1u64 << self.below(64),
            4 => (1u64 << self.below(64)).wrapping_sub(1),
            5 => u64::MAX - self.below(4),
            6 => i32::MAX as u64 + self.below(3),
            _ => self.next(),
        }
    }

    /// `valid` changed in one to four ways: bits flipped, a word set to an
    /// edge value, cut short, extended, or bytes replaced.
    pub(crate) fn mutate(&mut self, valid: &[u8]) -> Vec<u8> {
        let mut v = valid.to_vec();
        for _ in 0..1 + self.below(4) {
            match self.below(6) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len() as u64) as usize;
                    v[i] ^= 1 << self.below(8);
                }
                1 if v.len() >= 8 => {
                    let i = (self.below(v.len() as u64 / 8) * 8) as usize;
                    let e = self.edgy();
                    v[i..i + 8].copy_from_slice(&e.to_le_bytes());
                }
                2 => {
                    let n = self.below(v.len() as u64 + 1) as usize;
                    v.truncate(n);
                }
                3 => {
                    let n = self.below(24) as usize;
                    let extra = self.bytes(n);
                    v.extend(extra);
                }
                4 if !v.is_empty() => {
                    let i = self.below(v.len() as u64) as usize;
                    v[i] = self.next() as u8;
                }
                _ => {}
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_varied() {
        let a: Vec<u64> = {
            let mut r = XorShift::new(7);
            (0..100).map(|_| r.next()).collect()
        };
        let mut r = XorShift::new(7);
        assert!(a.iter().all(|&x| x == r.next()));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 100);
        let base = [0u8; 32];
        assert!((0..100).any(|_| r.mutate(&base) != base));
    }
}

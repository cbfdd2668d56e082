//! Filling and checking large buffers on several threads (a 1 GiB check is
//! seconds of work on one core).

use std::sync::atomic::{AtomicUsize, Ordering};

static THREADS: AtomicUsize = AtomicUsize::new(1);

/// Below this many elements, one thread does the work.
const MIN_PER_THREAD: usize = 1 << 16;

/// Set how many threads fill and check buffers (at least 1).
pub fn set_threads(n: usize) {
    THREADS.store(n.max(1), Ordering::Relaxed);
}

/// A fair share of the machine's cores for one of `local_ranks` processes.
pub fn share_of_cores(local_ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / local_ranks.max(1)).clamp(1, 32)
}

fn chunk_len(len: usize) -> usize {
    let t = THREADS.load(Ordering::Relaxed).max(1);
    len.div_ceil(t).max(MIN_PER_THREAD)
}

/// `buf[j] = f(j)` for every `j`.
pub fn fill<T: Send>(buf: &mut [T], f: impl Fn(usize) -> T + Sync) {
    let chunk = chunk_len(buf.len());
    if chunk >= buf.len() {
        for (j, x) in buf.iter_mut().enumerate() {
            *x = f(j);
        }
        return;
    }
    std::thread::scope(|s| {
        for (i, part) in buf.chunks_mut(chunk).enumerate() {
            let f = &f;
            s.spawn(move || {
                let base = i * chunk;
                for (j, x) in part.iter_mut().enumerate() {
                    *x = f(base + j);
                }
            });
        }
    });
}

/// How many `k` in `range` fail `ok(k)`.
pub fn count_bad(range: std::ops::Range<usize>, ok: impl Fn(usize) -> bool + Sync) -> u64 {
    let len = range.len();
    let chunk = chunk_len(len);
    if chunk >= len {
        return range.filter(|&k| !ok(k)).count() as u64;
    }
    let start = range.start;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..len.div_ceil(chunk))
            .map(|i| {
                let ok = &ok;
                let lo = start + i * chunk;
                let hi = (lo + chunk).min(range.end);
                s.spawn(move || (lo..hi).filter(|&k| !ok(k)).count() as u64)
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(u64::MAX / 1024))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_matches_serial() {
        set_threads(4);
        let mut v = vec![0u64; 300_001];
        fill(&mut v, |j| (j as u64) * 3);
        assert!(v.iter().enumerate().all(|(j, &x)| x == j as u64 * 3));
        assert_eq!(count_bad(0..v.len(), |k| v[k] & 1 == 0), 150_000);
        assert_eq!(count_bad(5..10, |k| k != 7), 1);
        assert_eq!(count_bad(0..0, |_| false), 0);
        let mut e: Vec<u8> = Vec::new();
        fill(&mut e, |_| 1);
        set_threads(1);
    }
}

//! Pinned + device work buffers for step tables, pooled, and the cache of
//! step tables already on the device (a submission whose table is
//! byte-identical to a recent one, same plan and same buffers, reuses it
//! and uploads nothing), and the [`Resources`] one submission holds until
//! it completed.

use super::memory::{DevMem, PinnedMem};
use crate::error::Result;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Uploaded step tables kept for reuse (identical plan and buffers).
const STEP_CACHE_ENTRIES: usize = 16;
/// Largest step table (bytes) the cache keeps.
pub(super) const STEP_CACHE_MAX_BYTES: usize = 64 << 10;
/// Work buffers kept for reuse: enough for a deep queue of back-to-back
/// launches (each holds one until it completes); re-allocating pinned
/// memory costs ~100 µs.
const WORK_POOL_MAX: usize = 256;

/// A pinned host + device pair for uploading a launch's steps.
pub(super) struct WorkBuf {
    pub host: PinnedMem,
    pub dev: DevMem,
}

/// A step table already on the device: `work.host[..len]` holds the bytes
/// that were uploaded to `work.dev`, which kernels only read. Submissions
/// with byte-identical tables (same plan, same buffers) reuse it.
pub(super) struct CachedSteps {
    pub work: WorkBuf,
    pub len: usize,
}

impl CachedSteps {
    fn holds(&self, bytes: &[u8]) -> bool {
        // SAFETY: the pinned buffer holds at least `len` initialized bytes and
        // is never written after the upload (the entry is immutable).
        self.len == bytes.len()
            && unsafe { std::slice::from_raw_parts(self.work.host.host, self.len) } == bytes
    }
}

/// The pool of work buffers and the step-table cache of one backend.
#[derive(Default)]
pub(super) struct StepStore {
    pool: Mutex<Vec<WorkBuf>>,
    /// Recently uploaded step tables, most recent last.
    cache: Mutex<VecDeque<Arc<CachedSteps>>>,
}

impl StepStore {
    /// A work buffer of at least `bytes`, from the pool when one fits.
    pub(super) fn take_work(&self, bytes: usize) -> Result<WorkBuf> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = pool.iter().position(|w| w.host.bytes >= bytes) {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        let cap = bytes.next_power_of_two().max(64 << 10);
        Ok(WorkBuf {
            host: PinnedMem::alloc(cap)?,
            dev: DevMem::alloc(cap)?,
        })
    }

    pub(super) fn give_work(&self, w: WorkBuf) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < WORK_POOL_MAX {
            pool.push(w);
        }
    }

    /// A cached step table whose bytes equal `bytes`, made most recent.
    pub(super) fn cached(&self, bytes: &[u8]) -> Option<Arc<CachedSteps>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let i = cache.iter().rposition(|c| c.holds(bytes))?;
        let hit = cache.remove(i)?;
        cache.push_back(hit.clone());
        Some(hit)
    }

    /// Keep an uploaded table; the evicted one goes back to the pool once no
    /// submission in flight holds it (else its last holder returns it).
    pub(super) fn keep(&self, entry: Arc<CachedSteps>) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.push_back(entry);
        let old = if cache.len() > STEP_CACHE_ENTRIES {
            cache.pop_front()
        } else {
            None
        };
        drop(cache);
        if let Some(old) = old {
            self.release_cached(old);
        }
    }

    /// Drop a holder of a cached table; the last one returns its buffer.
    pub(super) fn release_cached(&self, c: Arc<CachedSteps>) {
        if let Ok(c) = Arc::try_unwrap(c) {
            self.give_work(c.work);
        }
    }

    /// Free every pooled buffer, then every cached table (teardown).
    pub(super) fn clear(&mut self) {
        self.pool
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.cache
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// Resources of one submission, released when it completed.
#[derive(Default)]
pub(super) struct Resources {
    pub mems: Vec<DevMem>,
    /// (host destination, device source, bytes) copied after completion.
    pub copy_back: Vec<(u64, u64, usize)>,
    pub work: Option<WorkBuf>,
    /// The cached step table this submission's kernels read.
    pub cached: Option<Arc<CachedSteps>>,
}

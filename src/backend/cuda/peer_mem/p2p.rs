//! The device side of point-to-point messages (`crate::p2p`): the CUDA
//! backend's [`DeviceMoves`].
//!
//! * **A stream of its own**, created at the first copy: a message never
//!   waits behind the collectives queued on the backend's stream (a
//!   receive that a peer's collective waits for would deadlock there). It
//!   is a blocking stream under `Config::legacy_stream_order`, so a send
//!   reads what the program wrote with `cudaMemcpy` before it, as the MPI
//!   shim's programs expect.
//! * **Exports and mappings** through a [`Registry`] of its own (not the
//!   copy-engine collectives': their lock is held through a rendezvous
//!   with the peers, which a message must never wait for). The IPC handles
//!   of our allocations are cached by buffer ID; the peers' allocations
//!   stay mapped, least recently used closed beyond the registry's limits
//!   once the copies queued before are done. A handle names one
//!   allocation, so a freed and reallocated buffer is never reached
//!   through a stale mapping (`registry.rs`). The process-wide table of
//!   opened handles is shared with the collectives.
//! * **Staging memory**, pooled: pinned host blocks for eager payloads
//!   and for messages staged through host memory, and exportable device
//!   blocks (`cuMemAlloc`, whole 2 MiB blocks) that carry a message whose
//!   own memory cannot be exported (pool, managed, VMM, a small
//!   allocation) to a peer on the node.

use super::super::driver::{self, CUstream, IPC_HANDLE_BYTES};
use super::super::handles::{Event, EventPool, Stream};
use super::super::memory::{bind, DevMem, PinnedMem};
use super::board::{Share, Target};
use super::registry::{Registry, BLOCK_BYTES};
use crate::backend::{DeviceMoves, DeviceStage, Exported, Fence, HostStage};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const _: () = assert!(IPC_HANDLE_BYTES == 64);

/// Free pinned bytes kept for reuse.
const PINNED_KEEP: usize = 256 << 20;
/// Free bounce bytes kept for reuse.
const BOUNCE_KEEP: usize = 512 << 20;
/// Smallest pinned block.
const PINNED_MIN: usize = 4096;
/// How long dropping an unfinished copy's fence waits for the copy (a copy
/// on a healthy stream takes milliseconds; a failed context never ends it).
const FENCE_DRAIN: Duration = Duration::from_secs(10);

/// Blocks of one size class, kept for reuse up to a byte budget.
struct Pool<T> {
    free: Mutex<Vec<(usize, T)>>,
    keep: usize,
}

impl<T> Pool<T> {
    fn new(keep: usize) -> Pool<T> {
        Pool {
            free: Mutex::new(Vec::new()),
            keep,
        }
    }

    fn take(&self, class: usize) -> Option<T> {
        let mut g = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = g.iter().position(|(c, _)| *c == class)?;
        Some(g.swap_remove(i).1)
    }

    fn give(&self, class: usize, t: T) {
        let mut g = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let held: usize = g.iter().map(|(c, _)| *c).sum();
        if held + class <= self.keep {
            g.push((class, t));
        }
    }
}

/// The size class of a request: a power of two, at least `min`.
fn class_of(bytes: usize, min: usize) -> usize {
    bytes.max(min).next_power_of_two()
}

/// An exportable device block and how peers map it.
struct Bounce {
    mem: DevMem,
    exported: Exported,
}

/// What the stream and the registry need, under one lock.
struct State {
    stream: Option<Stream>,
    registry: Registry,
}

/// The CUDA backend's device side of point-to-point messages.
pub(crate) struct PeerMoves {
    ordinal: i32,
    after_legacy: bool,
    /// Per rank: whether its device memory maps here.
    mappable: Vec<bool>,
    state: Mutex<State>,
    events: Arc<EventPool>,
    pinned: Arc<Pool<PinnedMem>>,
    bounces: Arc<Pool<Bounce>>,
}

impl PeerMoves {
    /// For a backend on GPU `ordinal`; `mappable[r]`: rank `r`'s device
    /// memory maps here (same node, IPC between the GPUs); `after_legacy`:
    /// `Config::legacy_stream_order`.
    pub(crate) fn new(ordinal: i32, mappable: Vec<bool>, after_legacy: bool) -> PeerMoves {
        PeerMoves {
            ordinal,
            after_legacy,
            mappable,
            state: Mutex::new(State {
                stream: None,
                registry: Registry::new(ordinal),
            }),
            events: Arc::new(EventPool::default()),
            pinned: Arc::new(Pool::new(PINNED_KEEP)),
            bounces: Arc::new(Pool::new(BOUNCE_KEEP)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn stream(&mut self, after_legacy: bool) -> Result<CUstream> {
        if self.stream.is_none() {
            self.stream = Some(Stream::create(after_legacy)?);
        }
        Ok(self
            .stream
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s.raw()))
    }

    /// How peers reach `bytes` at `addr` of our memory, if they can.
    fn export(&mut self, addr: u64, bytes: u64) -> Result<Option<Exported>> {
        let Some(alloc) = driver::allocation_of(addr)? else {
            return Ok(None);
        };
        // VMM shares need every rank's agreement (`vmm.rs`): not here.
        Ok(self
            .registry
            .share(&alloc, addr, bytes)
            .filter(|t| t.share == Share::Ipc)
            .map(|t| Exported {
                handle: t.handle,
                offset: t.offset,
                alloc_bytes: t.alloc_bytes,
                buffer_id: t.buffer_id,
            }))
    }
}

/// The completion of one copy: an event recorded after it.
struct CopyFence {
    event: Option<Event>,
    pool: Arc<EventPool>,
}

impl Fence for CopyFence {
    fn done(&mut self) -> Result<bool> {
        let Some(e) = &self.event else {
            return Ok(true);
        };
        if !driver::event_query(e.raw())? {
            return Ok(false);
        }
        if let Some(e) = self.event.take() {
            self.pool.give(e);
        }
        Ok(true)
    }
}

impl Drop for CopyFence {
    /// A message given up before its copy finished (its communicator
    /// failed) must not hand its memory back while the copy still writes
    /// it: wait for the copy, briefly.
    fn drop(&mut self) {
        let Some(e) = self.event.take() else {
            return;
        };
        let start = Instant::now();
        while start.elapsed() < FENCE_DRAIN {
            match driver::event_query(e.raw()) {
                Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                _ => break,
            }
        }
    }
}

struct PinnedStage {
    mem: Option<PinnedMem>,
    class: usize,
    pool: Arc<Pool<PinnedMem>>,
}

impl HostStage for PinnedStage {
    fn ptr(&self) -> *mut u8 {
        self.mem.as_ref().map_or(std::ptr::null_mut(), |m| m.host)
    }
}

impl Drop for PinnedStage {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            self.pool.give(self.class, m);
        }
    }
}

struct BounceStage {
    bounce: Option<Bounce>,
    class: usize,
    pool: Arc<Pool<Bounce>>,
}

impl DeviceStage for BounceStage {
    fn addr(&self) -> u64 {
        self.bounce.as_ref().map_or(0, |b| b.mem.ptr)
    }
    fn exported(&self) -> Exported {
        self.bounce.as_ref().map_or(
            Exported {
                handle: [0; 64],
                offset: 0,
                alloc_bytes: 0,
                buffer_id: 0,
            },
            |b| b.exported,
        )
    }
}

impl Drop for BounceStage {
    fn drop(&mut self) {
        if let Some(b) = self.bounce.take() {
            self.pool.give(self.class, b);
        }
    }
}

impl DeviceMoves for PeerMoves {
    fn maps_peer(&self, peer: usize) -> bool {
        self.mappable.get(peer).copied().unwrap_or(false)
    }

    fn export(&self, addr: u64, bytes: u64) -> Result<Option<Exported>> {
        bind(self.ordinal)?;
        self.lock().export(addr, bytes)
    }

    fn open(&self, peer: usize, e: &Exported) -> Result<u64> {
        if !self.maps_peer(peer) {
            return Err(Error::Backend(format!(
                "rank {peer}'s device memory cannot be mapped here"
            )));
        }
        bind(self.ordinal)?;
        let mut st = self.lock();
        let stream = st.stream(self.after_legacy)?;
        st.registry.begin_call()?;
        let target = Target {
            buffer_id: e.buffer_id,
            offset: e.offset,
            alloc_bytes: e.alloc_bytes,
            handle: e.handle,
            share: Share::Ipc,
        };
        let base = st.registry.open(peer, &target, false)?;
        st.registry.evict(stream, false)?;
        Ok(base + e.offset)
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: u64) -> Result<Box<dyn Fence>> {
        bind(self.ordinal)?;
        let n = usize::try_from(bytes).map_err(|_| Error::CountTooLarge(bytes))?;
        let stream = self.lock().stream(self.after_legacy)?;
        // SAFETY: the caller keeps both ranges valid until the fence says
        // the copy is done.
        unsafe { driver::memcpy_async(dst, src, n, stream)? };
        let e = self.events.take()?;
        driver::event_record(e.raw(), stream)?;
        Ok(Box::new(CopyFence {
            event: Some(e),
            pool: self.events.clone(),
        }))
    }

    fn pinned(&self, bytes: usize) -> Result<Box<dyn HostStage>> {
        let class = class_of(bytes, PINNED_MIN);
        let mem = match self.pinned.take(class) {
            Some(m) => m,
            None => {
                bind(self.ordinal)?;
                PinnedMem::alloc(class)?
            }
        };
        Ok(Box::new(PinnedStage {
            mem: Some(mem),
            class,
            pool: self.pinned.clone(),
        }))
    }

    fn bounce(&self, bytes: u64) -> Result<Option<Box<dyn DeviceStage>>> {
        let Ok(bytes) = usize::try_from(bytes) else {
            return Ok(None);
        };
        let class = class_of(bytes, BLOCK_BYTES as usize);
        let bounce = match self.bounces.take(class) {
            Some(b) => b,
            None => {
                bind(self.ordinal)?;
                let mem = match DevMem::alloc(class) {
                    Ok(m) => m,
                    Err(e) if e.is_out_of_memory() => return Ok(None),
                    Err(e) => return Err(e),
                };
                match self.lock().export(mem.ptr, class as u64)? {
                    Some(exported) => Bounce { mem, exported },
                    None => return Ok(None),
                }
            }
        };
        Ok(Some(Box::new(BounceStage {
            bounce: Some(bounce),
            class,
            pool: self.bounces.clone(),
        })))
    }
}

impl Drop for PeerMoves {
    fn drop(&mut self) {
        // Every copy done before the mappings close and the memory goes.
        if bind(self.ordinal).is_ok() {
            if let Some(s) = &self.lock().stream {
                let _ = driver::stream_synchronize(s.raw());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_above_the_minimum() {
        assert_eq!(class_of(0, 4096), 4096);
        assert_eq!(class_of(4097, 4096), 8192);
        assert_eq!(class_of(3 << 20, 2 << 20), 4 << 20);
    }

    #[test]
    fn a_pool_keeps_blocks_within_its_budget() {
        let p: Pool<u32> = Pool::new(100);
        p.give(64, 1);
        p.give(64, 2); // over the budget: dropped
        p.give(32, 3);
        assert_eq!(p.take(64), Some(1));
        assert_eq!(p.take(64), None);
        assert_eq!(p.take(32), Some(3));
    }
}

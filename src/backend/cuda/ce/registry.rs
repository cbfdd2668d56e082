//! The registration caches of the copy-engine collectives, per
//! communicator:
//!
//! * **exports**: our allocations' IPC handles by buffer ID (an allocation
//!   that cannot be exported, e.g. from a memory pool or VMM without a
//!   shareable handle, is remembered as such and received through a
//!   bounce buffer instead);
//! * **peer mappings**: peers' receive allocations opened in our context,
//!   keyed by (peer, IPC handle): a handle names one allocation (and the
//!   offset of a small one in the driver's shared block), so a buffer
//!   freed and allocated again elsewhere gets a new handle and is never
//!   reached through a stale mapping; the mappings themselves are shared
//!   by every communicator of the process (`OPENED`).
//!   A mapping keeps the peer's allocation alive after the peer freed it,
//!   so at most [`MAX_MAPPINGS`] allocations of at most [`MAX_MAPPED_BYTES`]
//!   together stay open; the least recently used is closed once the work
//!   queued before its eviction completed (an event), and mappings a
//!   captured CUDA graph uses stay open for the backend's life.
//! * **registrations** (`Communicator::register`, `register.rs`): the
//!   peers' allocations of one registration stay open, outside those
//!   limits, until this rank drops it; they then age out like the rest.

use super::super::driver::{self, Allocation, CUstream, IPC_HANDLE_BYTES};
use super::super::handles::{Event, IpcMapping};
use super::board::Target;
use crate::error::Result;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Peer mappings kept open (all peers together).
pub(crate) const MAX_MAPPINGS: usize = 32;
/// Bytes of peers' allocations kept mapped (all peers together), beyond
/// those the current call uses.
pub(crate) const MAX_MAPPED_BYTES: u64 = 1 << 30;
/// Our allocations whose export result is remembered.
const MAX_EXPORTS: usize = 1024;

/// The granularity of the driver's device allocations: smaller ones may
/// share a block of this size with others.
pub(crate) const BLOCK_BYTES: u64 = 2 << 20;

/// Whether `alloc` is a block of its own. The driver packs small
/// allocations into shared blocks, and the driver API's IPC opens such a
/// block once per process: a peer would reach the block's start, not the
/// allocation (seen on H200 with CUDA 13: a 1-byte push landed elsewhere
/// and the next small buffer of the same block failed with
/// `CUDA_ERROR_ALREADY_MAPPED`). Such buffers are received through a
/// bounce buffer of block size instead.
fn own_block(alloc: &Allocation) -> bool {
    alloc.bytes >= BLOCK_BYTES && alloc.base % BLOCK_BYTES == 0
}

/// Peer allocations opened in this process, by device and IPC handle:
/// the driver opens a handle once per context (a second open of the same
/// allocation fails with `CUDA_ERROR_ALREADY_MAPPED`), while several
/// communicators, or one peer's buffer freed and allocated again at the
/// same place (a new buffer ID, the same handle), reach the same memory.
/// A handle names one allocation at one offset, so a mapping found by its
/// handle always reaches the memory the peer means.
static OPENED: Mutex<Option<HashMap<(i32, Handle), Opened>>> = Mutex::new(None);

type Handle = [u8; IPC_HANDLE_BYTES];

struct Opened {
    map: IpcMapping,
    refs: usize,
}

/// The mapping of `handle` on `device`, opened or shared.
fn acquire(device: i32, handle: &Handle) -> Result<u64> {
    let mut g = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    let table = g.get_or_insert_with(HashMap::new);
    if let Some(o) = table.get_mut(&(device, *handle)) {
        o.refs += 1;
        return Ok(o.map.ptr());
    }
    let map = IpcMapping::open(handle)?;
    let ptr = map.ptr();
    table.insert((device, *handle), Opened { map, refs: 1 });
    Ok(ptr)
}

/// Drop one reference; the last closes the mapping.
fn release(device: i32, handle: &Handle) {
    let mut g = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(table) = g.as_mut() {
        if let Some(o) = table.get_mut(&(device, *handle)) {
            o.refs -= 1;
            if o.refs == 0 {
                table.remove(&(device, *handle));
            }
        }
    }
}

struct Mapped {
    ptr: u64,
    bytes: u64,
    last_use: u64,
    /// Used by a captured graph: never closed before the backend.
    pinned: bool,
    /// Live registrations naming it: kept open, outside the limits.
    regs: usize,
}

/// The caches of one communicator (used under its copy-engine lock).
pub(crate) struct Registry {
    device: i32,
    exports: HashMap<u64, Option<Handle>>,
    export_order: VecDeque<u64>,
    /// By (peer, handle).
    maps: HashMap<(usize, Handle), Mapped>,
    /// Copy-engine calls so far (the mappings' clock).
    clock: u64,
    /// Evicted mappings, released once their event completed.
    retired: Vec<(Handle, Event)>,
    /// The mappings each live registration holds, by its id.
    registrations: HashMap<u64, Vec<(usize, Handle)>>,
    /// Our own allocations (buffer IDs) of the live registrations, by id.
    own: HashMap<u64, u64>,
}

impl Registry {
    pub(crate) fn new(device: i32) -> Registry {
        Registry {
            device,
            exports: HashMap::new(),
            export_order: VecDeque::new(),
            maps: HashMap::new(),
            clock: 0,
            retired: Vec::new(),
            registrations: HashMap::new(),
            own: HashMap::new(),
        }
    }

    /// Start a call: release retired mappings no queued work uses any more.
    pub(crate) fn begin_call(&mut self) -> Result<()> {
        self.clock += 1;
        let mut keep = Vec::new();
        for (h, e) in std::mem::take(&mut self.retired) {
            if driver::event_query(e.raw())? {
                release(self.device, &h);
            } else {
                keep.push((h, e));
            }
        }
        self.retired = keep;
        Ok(())
    }

    /// The IPC handle of `alloc`, or None if it cannot be exported safely.
    pub(crate) fn export(&mut self, alloc: &Allocation) -> Option<Handle> {
        if let Some(h) = self.exports.get(&alloc.buffer_id) {
            return *h;
        }
        let h = if own_block(alloc) {
            driver::ipc_get_handle(alloc.base).ok()
        } else {
            None
        };
        if self.export_order.len() >= MAX_EXPORTS {
            if let Some(old) = self.export_order.pop_front() {
                self.exports.remove(&old);
            }
        }
        self.exports.insert(alloc.buffer_id, h);
        self.export_order.push_back(alloc.buffer_id);
        h
    }

    /// The base, in our address space, of the allocation `peer` posted in
    /// `target` (opened the first time). `pin`: a captured graph will use it.
    pub(crate) fn open(&mut self, peer: usize, target: &Target, pin: bool) -> Result<u64> {
        let clock = self.clock;
        if let Some(m) = self.maps.get_mut(&(peer, target.handle)) {
            m.last_use = clock;
            m.pinned |= pin;
            return Ok(m.ptr);
        }
        let ptr = acquire(self.device, &target.handle)?;
        self.maps.insert(
            (peer, target.handle),
            Mapped {
                ptr,
                bytes: target.alloc_bytes,
                last_use: clock,
                pinned: pin,
                regs: 0,
            },
        );
        Ok(ptr)
    }

    /// Open the allocation `peer` registered in `target` and keep it open
    /// for registration `id` until [`deregister`](Self::deregister).
    pub(crate) fn open_registered(&mut self, id: u64, peer: usize, target: &Target) -> Result<()> {
        self.open(peer, target, false)?;
        if let Some(m) = self.maps.get_mut(&(peer, target.handle)) {
            m.regs += 1;
        }
        self.registrations
            .entry(id)
            .or_default()
            .push((peer, target.handle));
        Ok(())
    }

    /// Registration `id` registered our allocation `buffer_id`.
    pub(crate) fn register_own(&mut self, id: u64, buffer_id: u64) {
        self.own.insert(id, buffer_id);
    }

    /// Whether a live registration of this rank holds allocation `buffer_id`.
    pub(crate) fn is_registered(&self, buffer_id: u64) -> bool {
        self.own.values().any(|b| *b == buffer_id)
    }

    /// Registration `id` ended: its mappings go back to the cache, as
    /// used now (evicted later by the limits, not at once: a buffer
    /// registered again soon is not opened again).
    pub(crate) fn deregister(&mut self, id: u64) {
        self.own.remove(&id);
        for key in self.registrations.remove(&id).unwrap_or_default() {
            if let Some(m) = self.maps.get_mut(&key) {
                m.regs = m.regs.saturating_sub(1);
                m.last_use = self.clock;
            }
        }
    }

    /// Live registrations (for tests and logs).
    pub(crate) fn registrations(&self) -> usize {
        self.registrations.len()
    }

    /// Mappings the limits apply to: (count, bytes).
    fn cached(&self) -> (usize, u64) {
        self.maps
            .values()
            .filter(|m| m.regs == 0)
            .fold((0, 0), |(n, b), m| (n + 1, b + m.bytes))
    }

    /// Evict least recently used mappings beyond the limits that this
    /// call does not use, releasing each once the work already queued on
    /// `stream` (the only stream earlier copies are ordered before) is done.
    /// Nothing is evicted while `stream` is being captured.
    pub(crate) fn evict(&mut self, stream: CUstream, captured: bool) -> Result<()> {
        if captured {
            return Ok(());
        }
        loop {
            let (count, bytes) = self.cached();
            if count <= MAX_MAPPINGS && bytes <= MAX_MAPPED_BYTES {
                return Ok(());
            }
            let victim = self
                .maps
                .iter()
                .filter(|(_, m)| !m.pinned && m.regs == 0 && m.last_use < self.clock)
                .min_by_key(|(_, m)| m.last_use)
                .map(|(k, _)| *k);
            let Some(k) = victim else {
                return Ok(());
            };
            if self.maps.remove(&k).is_some() {
                let e = Event::create()?;
                driver::event_record(e.raw(), stream)?;
                self.retired.push((k.1, e));
            }
        }
    }
}

/// Runs after the backend synchronized its stream (`Inner::drop`).
impl Drop for Registry {
    fn drop(&mut self) {
        for (_, h) in self.maps.keys() {
            release(self.device, h);
        }
        for (h, _) in &self.retired {
            release(self.device, h);
        }
    }
}

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
//! * **VMM shares** (`vmm.rs`): our VMM allocations that peers keep
//!   mapped (by buffer ID, with their slot in our share table), and the
//!   peers' VMM allocations we imported. An import cannot be opened again
//!   later (its descriptor is gone), so it stays outside the limits until
//!   its owner stops sharing it; it is then released like an evicted
//!   mapping, once the work queued before is done.

use super::super::driver::{self, Allocation, CUstream, VmmMapping, IPC_HANDLE_BYTES};
use super::super::handles::{Event, IpcMapping};
use super::board::{vmm_key, vmm_key_buffer, Share, Target, VMM_SLOTS};
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// Our VMM allocations that could not be offered, remembered so that a
/// call does not ask the driver again.
const MAX_VMM_REFUSED: usize = 1024;

/// One of our VMM allocations the peers keep mapped.
#[derive(Debug, Clone, Copy)]
struct VmmShare {
    slot: usize,
    base: u64,
    /// Shared by a registration (it ends with the last one), else by a
    /// copy-engine call (it ends when the allocation is gone).
    by_registration: bool,
}

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

pub(crate) type Handle = [u8; IPC_HANDLE_BYTES];

/// A peer's allocation mapped here.
enum PeerMap {
    Ipc(IpcMapping),
    Vmm(VmmMapping),
}

impl PeerMap {
    fn ptr(&self) -> u64 {
        match self {
            PeerMap::Ipc(m) => m.ptr(),
            PeerMap::Vmm(m) => m.ptr(),
        }
    }
}

struct Opened {
    map: PeerMap,
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
    let map = PeerMap::Ipc(IpcMapping::open(handle)?);
    let ptr = map.ptr();
    table.insert((device, *handle), Opened { map, refs: 1 });
    Ok(ptr)
}

/// As [`acquire`] for a peer's VMM allocation keyed `key`: imported from
/// `fd` unless another communicator of ours imported it already.
fn acquire_vmm(device: i32, key: &Handle, fd: &OwnedFd, bytes: u64) -> Result<u64> {
    let mut g = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    let table = g.get_or_insert_with(HashMap::new);
    if let Some(o) = table.get_mut(&(device, *key)) {
        o.refs += 1;
        return Ok(o.map.ptr());
    }
    let map = PeerMap::Vmm(VmmMapping::import(fd, bytes, device)?);
    let ptr = map.ptr();
    table.insert((device, *key), Opened { map, refs: 1 });
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
    /// A peer's VMM allocation: kept, outside the limits, while its owner
    /// shares it.
    vmm: bool,
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
    /// Our VMM allocations the peers keep mapped, by buffer ID.
    vmm_own: HashMap<u64, VmmShare>,
    /// Our VMM allocations that cannot be offered (by buffer ID).
    vmm_refused: std::collections::HashSet<u64>,
    /// The next share whose allocation [`vmm_gone`](Self::vmm_gone) looks at.
    vmm_cursor: usize,
    /// The generation of each peer's share table when we last compared.
    vmm_seen: HashMap<usize, u64>,
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
            vmm_own: HashMap::new(),
            vmm_refused: std::collections::HashSet::new(),
            vmm_cursor: 0,
            vmm_seen: HashMap::new(),
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

    /// How peers reach `bytes` at `addr` of our allocation `alloc`: its
    /// IPC handle, or the key of a VMM allocation the peers mapped; None
    /// if it cannot be shared (then the call uses a bounce buffer).
    pub(crate) fn share(&mut self, alloc: &Allocation, addr: u64, bytes: u64) -> Option<Target> {
        // A buffer running past its allocation (several VMM allocations
        // mapped back to back) is not in one peer mapping.
        if addr < alloc.base || addr.saturating_add(bytes) > alloc.base.saturating_add(alloc.bytes)
        {
            return None;
        }
        let (share, handle) = self.export(alloc)?;
        Some(Target {
            buffer_id: alloc.buffer_id,
            offset: addr - alloc.base,
            alloc_bytes: alloc.bytes,
            handle,
            share,
        })
    }

    /// The handle of `alloc` (see [`share`](Self::share)).
    pub(crate) fn export(&mut self, alloc: &Allocation) -> Option<(Share, Handle)> {
        if self.vmm_own.contains_key(&alloc.buffer_id) {
            return Some((Share::Vmm, vmm_key(alloc.buffer_id)));
        }
        if let Some(h) = self.exports.get(&alloc.buffer_id) {
            return h.map(|h| (Share::Ipc, h));
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
        h.map(|h| (Share::Ipc, h))
    }

    /// A VMM allocation of ours not shared yet, if it can be (a share slot
    /// is free and the driver exports it as a descriptor): its slot and
    /// descriptor.
    pub(crate) fn vmm_offer(&mut self, alloc: &Allocation) -> Result<Option<(usize, OwnedFd)>> {
        if !self.vmm_may_offer(alloc.buffer_id) {
            return Ok(None);
        }
        let Some(slot) = (0..VMM_SLOTS).find(|s| !self.vmm_own.values().any(|v| v.slot == *s))
        else {
            tracing::debug!(
                buffer = alloc.buffer_id,
                "VMM allocation not shared: {VMM_SLOTS} shared already"
            );
            return Ok(None);
        };
        let fd = driver::vmm_retain(alloc.base, alloc.bytes)?.and_then(|h| h.export_fd());
        if fd.is_none() {
            if self.vmm_refused.len() >= MAX_VMM_REFUSED {
                self.vmm_refused.clear();
            }
            self.vmm_refused.insert(alloc.buffer_id);
        }
        Ok(fd.map(|fd| (slot, fd)))
    }

    /// Whether our allocation `buffer_id` is neither shared nor known not
    /// to be offerable.
    pub(crate) fn vmm_may_offer(&self, buffer_id: u64) -> bool {
        !self.vmm_own.contains_key(&buffer_id) && !self.vmm_refused.contains(&buffer_id)
    }

    /// Our VMM allocation `alloc` is shared in `slot` now, by a
    /// registration or else by a copy-engine call.
    pub(crate) fn vmm_commit(&mut self, alloc: &Allocation, slot: usize, by_registration: bool) {
        self.vmm_own.insert(
            alloc.buffer_id,
            VmmShare {
                slot,
                base: alloc.base,
                by_registration,
            },
        );
    }

    /// Our VMM allocation `buffer_id` could not be shared (its offer failed
    /// on some rank): it is not offered again.
    pub(crate) fn vmm_refuse(&mut self, buffer_id: u64) {
        self.vmm_refused.insert(buffer_id);
    }

    /// Look at the shares copy-engine calls made (all of them, or the
    /// next one in turn): those whose allocation was freed (the address
    /// holds another buffer or none) are no longer shared; their slots,
    /// to clear.
    pub(crate) fn vmm_gone(&mut self, all: bool) -> Result<Vec<usize>> {
        let mut auto: Vec<(u64, VmmShare)> = self
            .vmm_own
            .iter()
            .filter(|(_, s)| !s.by_registration)
            .map(|(b, s)| (*b, *s))
            .collect();
        if auto.is_empty() {
            return Ok(Vec::new());
        }
        auto.sort_unstable_by_key(|(_, s)| s.slot);
        if !all {
            self.vmm_cursor = (self.vmm_cursor + 1) % auto.len();
            auto = vec![auto[self.vmm_cursor]];
        }
        let mut gone = Vec::new();
        for (buffer_id, share) in auto {
            let alive =
                driver::allocation_of(share.base)?.is_some_and(|a| a.buffer_id == buffer_id);
            if !alive {
                self.vmm_own.remove(&buffer_id);
                gone.push(share.slot);
            }
        }
        Ok(gone)
    }

    /// Import `target`, `peer`'s VMM allocation, from `fd` (kept while the
    /// peer shares it). Nothing to do when it is mapped already.
    pub(crate) fn import_vmm(&mut self, peer: usize, target: &Target, fd: &OwnedFd) -> Result<()> {
        if self.maps.contains_key(&(peer, target.handle)) {
            return Ok(());
        }
        let ptr = acquire_vmm(self.device, &target.handle, fd, target.alloc_bytes)?;
        self.maps.insert(
            (peer, target.handle),
            Mapped {
                ptr,
                bytes: target.alloc_bytes,
                last_use: self.clock,
                pinned: false,
                regs: 0,
                vmm: true,
            },
        );
        Ok(())
    }

    /// Undo [`import_vmm`](Self::import_vmm) at once (nothing queued uses
    /// it: the registration that imported it failed).
    pub(crate) fn drop_import(&mut self, peer: usize, handle: &Handle) {
        if self.maps.remove(&(peer, *handle)).is_some() {
            release(self.device, handle);
        }
    }

    /// The peers whose VMM allocations we hold.
    pub(crate) fn vmm_peers(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .maps
            .iter()
            .filter(|(_, m)| m.vmm)
            .map(|((p, _), _)| *p)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The generation of `peer`'s share table all its unshared imports
    /// were released at.
    pub(crate) fn vmm_seen(&self, peer: usize) -> Option<u64> {
        self.vmm_seen.get(&peer).copied()
    }

    /// See [`vmm_seen`](Self::vmm_seen).
    pub(crate) fn vmm_mark_seen(&mut self, peer: usize, generation: u64) {
        self.vmm_seen.insert(peer, generation);
    }

    /// Release the imports of `peer` it no longer shares (`shares` says),
    /// once the work already queued on `stream` is done. Imports a
    /// captured graph uses stay for good; those this call uses stay for
    /// now (false: look again at the next call).
    pub(crate) fn retire_unshared(
        &mut self,
        peer: usize,
        shares: impl Fn(u64) -> bool,
        stream: CUstream,
    ) -> Result<bool> {
        let unshared: Vec<((usize, Handle), bool)> = self
            .maps
            .iter()
            .filter(|((p, h), m)| *p == peer && m.vmm && !m.pinned && !shares(vmm_key_buffer(h)))
            .map(|(k, m)| (*k, m.last_use < self.clock))
            .collect();
        let complete = unshared.iter().all(|(_, idle)| *idle);
        for (k, _) in unshared.into_iter().filter(|(_, idle)| *idle) {
            if self.maps.remove(&k).is_some() {
                let e = Event::create()?;
                driver::event_record(e.raw(), stream)?;
                self.retired.push((k.1, e));
            }
        }
        Ok(complete)
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
        if target.share.is_vmm() {
            // Shared only after every rank imported it, and kept until the
            // owner stops sharing it: not reachable.
            return Err(Error::Backend(format!(
                "rank {peer} posted its VMM allocation (buffer {}) that was never imported here",
                target.buffer_id
            )));
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
                vmm: false,
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
    /// registered again soon is not opened again). Returns the share slot
    /// of our VMM allocation that no live registration holds any more
    /// (the caller clears it: peers then release their imports).
    pub(crate) fn deregister(&mut self, id: u64) -> Option<usize> {
        let unshared = self.own.remove(&id).and_then(|b| {
            let held = self.own.values().any(|o| *o == b);
            let by_reg = self.vmm_own.get(&b).is_some_and(|s| s.by_registration);
            if held || !by_reg {
                None
            } else {
                self.vmm_own.remove(&b).map(|s| s.slot)
            }
        });
        for key in self.registrations.remove(&id).unwrap_or_default() {
            if let Some(m) = self.maps.get_mut(&key) {
                m.regs = m.regs.saturating_sub(1);
                m.last_use = self.clock;
            }
        }
        unshared
    }

    /// Live registrations (for tests and logs).
    pub(crate) fn registrations(&self) -> usize {
        self.registrations.len()
    }

    /// Mappings the limits apply to: (count, bytes).
    fn cached(&self) -> (usize, u64) {
        self.maps
            .values()
            .filter(|m| m.regs == 0 && !m.vmm)
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
                .filter(|(_, m)| !m.pinned && m.regs == 0 && !m.vmm && m.last_use < self.clock)
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

/// Runs after the backend synchronized its stream (`CudaShared::drop`).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn small(buffer_id: u64) -> Allocation {
        // Under 2 MiB: never exported through IPC, no driver call.
        Allocation {
            buffer_id,
            base: 0x7000_0000_0000,
            bytes: 4096,
        }
    }

    #[test]
    fn a_vmm_share_lasts_while_a_registration_holds_it() {
        let mut r = Registry::new(0);
        let a = small(5);
        assert_eq!(r.export(&a), None);
        r.vmm_commit(&a, 3, true);
        assert_eq!(r.export(&a), Some((Share::Vmm, vmm_key(5))));
        let t = r.share(&a, a.base + 8, 64).unwrap();
        assert_eq!((t.offset, t.share, t.alloc_bytes), (8, Share::Vmm, 4096));
        // Past the allocation: not shared.
        assert!(r.share(&a, a.base + 8, 4096).is_none());
        r.register_own(10, 5);
        r.register_own(11, 5);
        assert_eq!(r.deregister(10), None);
        assert_eq!(r.export(&a), Some((Share::Vmm, vmm_key(5))));
        assert_eq!(r.deregister(11), Some(3));
        assert_eq!(r.export(&a), None);
        // A registration of another allocation frees no share.
        r.register_own(12, 6);
        assert_eq!(r.deregister(12), None);
        // A share a copy-engine call made outlives registrations of it.
        let b = small(7);
        r.vmm_commit(&b, 4, false);
        r.register_own(13, 7);
        assert_eq!(r.deregister(13), None);
        assert_eq!(r.export(&b), Some((Share::Vmm, vmm_key(7))));
    }
}

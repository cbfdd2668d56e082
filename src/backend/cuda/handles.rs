//! Owning handles of driver objects: each releases its object in `Drop`,
//! exactly once. A value that must outlive a kernel which never left is
//! leaked with `std::mem::forget` by its owner, never released early.
//!
//! The driver calls take explicit handles, so releasing does not depend on
//! which context is current on the dropping thread.

use super::driver::{self, CUdeviceptr, CUevent, CUmodule, CUstream};
use crate::error::Result;
use std::sync::Mutex;

/// A loaded kernel module (`cuModuleLoadData`).
#[derive(Debug)]
pub(super) struct Module(CUmodule);

impl Module {
    pub(super) fn load(image: &[u8]) -> Result<Module> {
        driver::module_load(image).map(Module)
    }

    pub(super) fn raw(&self) -> CUmodule {
        self.0
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        driver::module_unload(self.0);
    }
}

/// A stream of our own (`cuStreamCreate`).
#[derive(Debug)]
pub(super) struct Stream(CUstream);

impl Stream {
    /// Non-blocking, or with `after_legacy` ordered after the legacy
    /// default stream (`Config::legacy_stream_order`).
    pub(super) fn create(after_legacy: bool) -> Result<Stream> {
        driver::stream_create_ordered(after_legacy).map(Stream)
    }

    pub(super) fn raw(&self) -> CUstream {
        self.0
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        driver::stream_destroy(self.0);
    }
}

/// An event without timing (`cuEventCreate`).
#[derive(Debug)]
pub(super) struct Event(CUevent);

impl Event {
    pub(super) fn create() -> Result<Event> {
        driver::event_create().map(Event)
    }

    pub(super) fn raw(&self) -> CUevent {
        self.0
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        driver::event_destroy(self.0);
    }
}

/// A peer's device block opened through CUDA IPC (`cuIpcOpenMemHandle`).
#[derive(Debug)]
pub(super) struct IpcMapping(CUdeviceptr);

impl IpcMapping {
    pub(super) fn open(handle: &[u8; driver::IPC_HANDLE_BYTES]) -> Result<IpcMapping> {
        driver::ipc_open(handle).map(IpcMapping)
    }

    /// The block's address in our context.
    pub(super) fn ptr(&self) -> CUdeviceptr {
        self.0
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        driver::ipc_close(self.0);
    }
}

/// Host memory registered with CUDA, device-mapped (`cuMemHostRegister`).
#[derive(Debug)]
pub(super) struct HostRegistration {
    ptr: *mut u8,
    /// The device address of the first byte.
    dev: CUdeviceptr,
}

impl HostRegistration {
    /// Register `bytes` at `ptr` (current context).
    ///
    /// # Safety
    /// `ptr` is a page-aligned mapping of `bytes` that outlives the
    /// returned value.
    pub(super) unsafe fn new(ptr: *mut u8, bytes: usize) -> Result<HostRegistration> {
        // SAFETY: per this function's contract.
        unsafe { driver::host_register(ptr, bytes)? };
        let mut reg = HostRegistration { ptr, dev: 0 };
        // On failure `reg` is dropped, which unregisters the range.
        reg.dev = driver::host_device_pointer(ptr)?;
        Ok(reg)
    }

    pub(super) fn dev(&self) -> CUdeviceptr {
        self.dev
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        driver::host_unregister(self.ptr);
    }
}

// SAFETY: the handles are process-wide driver objects, usable from any
// thread (every user binds the context first); none is shared mutably.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}
// SAFETY: as above.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}
// SAFETY: as above.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}
// SAFETY: the registration only holds the address it unregisters.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

/// Completion events kept for reuse.
const EVENT_POOL_MAX: usize = 256;

/// Events of finished submissions, recorded again by later ones (creating
/// an event costs a driver call per submission).
#[derive(Debug, Default)]
pub(super) struct EventPool {
    free: Mutex<Vec<Event>>,
}

impl EventPool {
    /// An event, from the pool when one is free.
    pub(super) fn take(&self) -> Result<Event> {
        let e = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match e {
            Some(e) => Ok(e),
            None => Event::create(),
        }
    }

    /// Return the event of a completed submission; destroyed when the pool
    /// is full.
    pub(super) fn give(&self, e: Event) {
        let mut pool = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < EVENT_POOL_MAX {
            pool.push(e);
        } else {
            drop(pool);
            drop(e);
        }
    }

    /// Destroy every pooled event.
    pub(super) fn clear(&mut self) {
        self.free
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

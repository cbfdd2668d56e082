//! Per-rank host shared memory segments of the CUDA backend (`/dev/shm`),
//! on the shared [`Mapping`]: the shared control block (abort word and
//! failure reason, bytes `0..1024`), the per-channel kernel status from
//! [`STATUS_OFF`] and, when P2P is disabled, the rank's receive FIFOs and
//! head words after [`CONTROL_BYTES`]. Every rank of a node maps every
//! local segment and registers it with CUDA (`cuMemHostRegister`,
//! device-mapped) so kernels reach it.

use super::driver::CUdeviceptr;
use super::handles::HostRegistration;
use crate::backend::shared::shm::{self as shared_shm, Mapping, SegOwner};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Bytes of the CUDA backend's control area at the start of every segment
/// (the shared control block, then the kernel status).
pub(crate) const CONTROL_BYTES: usize = 16384;
/// Per-channel kernel status (`GcChanStatus`, 64 bytes each).
pub(crate) const STATUS_OFF: usize = 1024;
const _: () = assert!(STATUS_OFF >= shared_shm::CONTROL_BYTES && STATUS_OFF < CONTROL_BYTES);

/// One mapped (and CUDA-registered) segment.
#[derive(Debug)]
pub(crate) struct Segment {
    /// The CUDA registration; declared first so it is released before the
    /// mapping it covers.
    reg: Option<HostRegistration>,
    map: Mapping,
}

impl AsRef<Mapping> for Segment {
    fn as_ref(&self) -> &Mapping {
        &self.map
    }
}

/// The backend shares its segments with the NET proxy thread.
impl AsRef<Mapping> for Arc<Segment> {
    fn as_ref(&self) -> &Mapping {
        &self.map
    }
}

impl Segment {
    /// Create (zero-filled, pages reserved) a new segment.
    pub(crate) fn create(name: &str, len: usize) -> Result<Segment> {
        Ok(Segment {
            reg: None,
            map: Mapping::create(name, len)?,
        })
    }

    /// Map a peer's segment, which must hold exactly `len` bytes and be
    /// made by process `creator` ([`Mapping::open`]'s checks).
    pub(crate) fn open(name: &str, len: usize, creator: u32) -> Result<Segment> {
        Ok(Segment {
            reg: None,
            map: Mapping::open(name, len, creator)?,
        })
    }

    /// Remove the name (the mappings stay).
    pub(crate) fn unlink(&mut self) -> Result<()> {
        self.map.unlink()
    }

    /// Register with CUDA (current context) and return the device address.
    pub(crate) fn register(&mut self) -> Result<CUdeviceptr> {
        if let Some(r) = &self.reg {
            return Ok(r.dev());
        }
        // SAFETY: the mapping is page aligned, `len` long, and outlives the
        // registration (`reg` is declared before `map`, so it drops first).
        let r = unsafe { HostRegistration::new(self.map.ptr(), self.map.len())? };
        let d = r.dev();
        self.reg = Some(r);
        Ok(d)
    }

    /// Device address of byte `off`.
    pub(crate) fn dev_at(&self, off: usize) -> Result<CUdeviceptr> {
        self.reg
            .as_ref()
            .map(|r| r.dev() + off as u64)
            .ok_or_else(|| Error::Backend("segment not registered with CUDA".into()))
    }

    /// The whole abort word (host half low, kernels' half high).
    pub(crate) fn abort_word(&self) -> u64 {
        self.map.abort_word()
    }

    /// A 64-bit word of the status area, read racily with the device.
    pub(crate) fn read_u64(&self, off: usize) -> u64 {
        self.map.word(off).load(Ordering::Acquire)
    }
}

/// The segment name of `local_rank`, created by `pid` with its `nonce`.
pub(crate) fn segment_name(pid: u32, nonce: u128, local_rank: usize) -> String {
    shared_shm::segment_name(SegOwner::Cuda, pid, nonce, local_rank)
}

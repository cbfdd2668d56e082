//! Preparing a launch for the interpreter: the caller's buffers resolved,
//! scratch allocated (from a pool kept between launches), and every step
//! validated before any data moves.

use super::super::fifo;
use super::Fabric;
use crate::backend::shared::validate::{self, Limits};
use crate::backend::{BoundPlan, Launch};
use crate::buffer::{MemoryKind, RawBuffer};
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use crate::plan::{BufId, Plan, Region};
use std::sync::Arc;

/// A buffer of the launch as the interpreter uses it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mem {
    pub ptr: *mut u8,
    pub elems: u64,
}

/// One item of a launch, resolved and validated.
#[derive(Debug)]
pub(super) struct Item {
    pub(super) seq: u64,
    /// Wire stamp of this collective (sequence number and call digest).
    pub(super) stamp: u64,
    pub(super) plan: Arc<Plan>,
    pub(super) dtype: Datatype,
    pub(super) esize: usize,
    pub(super) input: Mem,
    pub(super) output: Mem,
    pub(super) scratch: Mem,
    /// Backing store of `scratch` (u64 for alignment).
    pub(super) _scratch_buf: Vec<u64>,
}

/// A launch ready to run: buffers resolved, every step checked.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(super) items: Vec<Item>,
    /// Channel ids used by any item, ascending.
    pub(super) channels: Vec<usize>,
}

// SAFETY: the raw pointers refer to the caller's buffers (valid and
// exclusively ours until the launch completes, per `Backend::submit`) and to
// scratch owned by `Prepared`; channels touch disjoint regions of them as
// the plan prescribes.
unsafe impl Send for Prepared {}
// SAFETY: as above.
unsafe impl Sync for Prepared {}

impl Prepared {
    /// Channels this launch uses.
    pub(crate) fn channels(&self) -> &[usize] {
        &self.channels
    }
}

fn mem_of(buf: &RawBuffer, what: &str, seq: u64) -> Result<Mem> {
    if buf.len > 0 && buf.memory != MemoryKind::Host {
        return Err(Error::WrongMemory(format!(
            "the host backend cannot use the {what} buffer of collective #{seq}: it is {:?} memory",
            buf.memory
        )));
    }
    Ok(Mem {
        ptr: buf.addr as usize as *mut u8,
        elems: if buf.addr == 0 { 0 } else { buf.len },
    })
}

impl Item {
    fn mem(&self, b: BufId) -> Mem {
        match b {
            BufId::Input => self.input,
            BufId::Output => self.output,
            BufId::Scratch => self.scratch,
        }
    }

    /// Pointer to `region` after checking that `count` elements fit.
    pub(super) fn region_ptr(&self, region: Region, count: u64) -> Option<*mut u8> {
        let m = self.mem(region.buf);
        let end = region.offset.checked_add(count)?;
        (end <= m.elems).then(|| {
            // SAFETY: offset + count <= elems, so the offset stays inside the buffer.
            unsafe { m.ptr.add((region.offset as usize) * self.esize) }
        })
    }

    /// In-place calls share input and output memory; only then may a plan
    /// write through the input.
    fn input_writable(&self) -> bool {
        let a0 = self.input.ptr as usize;
        let a1 = a0 + self.input.elems as usize * self.esize;
        let b0 = self.output.ptr as usize;
        let b1 = b0 + self.output.elems as usize * self.esize;
        self.plan.task.in_place || (a0 < b1 && b0 < a1)
    }

    /// Check every step against this call's buffers and the fabric.
    fn validate<F: Fabric>(&self, fab: &F) -> Result<()> {
        let limits = Limits {
            rank: fab.rank(),
            nranks: fab.nranks(),
            channels: fab.channels(),
            input_elems: self.input.elems,
            output_elems: self.output.elems,
            scratch_elems: self.scratch.elems,
            input_writable: self.input_writable(),
            rail: fab.rail(),
        };
        validate::validate(&self.plan, self.seq, &limits)
    }
}

/// Scratch buffers kept between launches: a large in-place all_to_all needs
/// one as big as its buffer, and allocating (and faulting in) that much
/// memory on every call costs more than the collective itself.
mod scratch_pool {
    use std::sync::Mutex;

    /// Keep at most this many u64s cached (512 MiB).
    const MAX_CACHED: usize = 64 << 20;

    static POOL: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

    /// A buffer of at least `len` u64s. Its contents are unspecified: plans
    /// write scratch before they read it.
    pub(super) fn take(len: usize) -> Vec<u64> {
        if len == 0 {
            return Vec::new();
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        match pool.iter().position(|b| b.len() >= len) {
            Some(i) => pool.swap_remove(i),
            None => vec![0u64; len],
        }
    }

    /// Return a buffer for reuse, keeping the largest ones up to the cap.
    pub(super) fn give(buf: Vec<u64>) {
        if buf.is_empty() || buf.len() > MAX_CACHED {
            return;
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        pool.push(buf);
        pool.sort_unstable_by_key(|b| std::cmp::Reverse(b.len()));
        let mut total = 0;
        pool.retain(|b| {
            total += b.len();
            total <= MAX_CACHED
        });
    }
}

impl Drop for Item {
    fn drop(&mut self) {
        scratch_pool::give(std::mem::take(&mut self._scratch_buf));
    }
}

/// Resolve and validate a launch (before any data moves) and allocate its
/// scratch buffers.
pub(crate) fn prepare<F: Fabric>(fab: &F, launch: &Launch) -> Result<Prepared> {
    let mut items = Vec::with_capacity(launch.items.len());
    let mut channels = Vec::new();
    for (k, bp) in launch.items.iter().enumerate() {
        let BoundPlan {
            plan,
            input,
            output,
        } = bp;
        let seq = launch.first_seq + k as u64;
        let dtype = plan.task.dtype;
        let esize = dtype.size();
        let scratch_bytes = plan
            .scratch_elems
            .checked_mul(esize as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(Error::CountTooLarge(plan.scratch_elems))?;
        let mut scratch_buf = scratch_pool::take(scratch_bytes.div_ceil(8));
        let scratch = Mem {
            ptr: scratch_buf.as_mut_ptr() as *mut u8,
            elems: plan.scratch_elems,
        };
        let item = Item {
            seq,
            stamp: fifo::call_stamp(seq, &plan.task),
            plan: plan.clone(),
            dtype,
            esize,
            input: mem_of(input, "input", seq)?,
            output: mem_of(output, "output", seq)?,
            scratch,
            _scratch_buf: scratch_buf,
        };
        item.validate(fab)?;
        for cw in &plan.channels {
            if cw.steps.iter().any(|s| s.count() > 0) && !channels.contains(&cw.channel) {
                channels.push(cw.channel);
            }
        }
        items.push(item);
    }
    channels.sort_unstable();
    Ok(Prepared { items, channels })
}

//! `--register`: gpucoll's device buffers of one size registered with the
//! peers (`Communicator::register_raw`) before its warmup calls, held
//! through the timed, checked and overlapped calls, and dropped after the
//! size (run.rs).
//!
//! Registration is collective, in call order with the collectives: every
//! rank registers the same slots in the same order, or the ranks hang. A
//! rank without a slot's buffer (the non-root ranks of reduce, gather and
//! scatter have no output or no input) registers 0 bytes at the address
//! of one of its other buffers, which keeps it in step and registers
//! nothing.

use crate::report::Registered;
use gpucoll::{Communicator, RawBuffer, ReduceOp, Registration};
use std::ffi::c_void;

/// One buffer gpucoll is given for a size, or `None` where this rank has
/// no such buffer.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    /// Whether the in-place calls use it (else the out-of-place ones).
    pub in_place: bool,
    pub buf: Option<RawBuffer>,
}

/// The registrations of one size: dropping them ends them on this rank.
pub struct Held {
    regs: Vec<Registration>,
    pub info: Registered,
}

impl Held {
    /// End the registrations now (what dropping does).
    pub fn release(self) {
        drop(self.regs);
    }
}

/// Register every slot with the peers, in order, then agree with the
/// other ranks (MPI) on the outcome: an error on any rank is an error on
/// every rank, and a placement's buffers count as direct only where every
/// rank's are (`Registration::is_direct`; 0-byte slots do not count).
pub fn register_all(world: &Communicator, slots: &[Slot]) -> Result<Held, String> {
    // Where a rank has no buffer for a slot: 0 bytes at one of its own
    // device buffers (every rank has one: run.rs skips sizes of count 0).
    let anchor = slots.iter().find_map(|s| s.buf).map_or(0, |b| b.addr);
    let mut regs = Vec::with_capacity(slots.len());
    let mut first_err: Option<String> = None;
    // Slots of each placement (out of place, in place) whose buffer the
    // peers do not map directly, on this rank.
    let mut not_direct = [0u64; 2];
    for (i, s) in slots.iter().enumerate() {
        let (addr, bytes) = s.buf.map_or((anchor, 0), |b| (b.addr, b.bytes()));
        let ptr = addr as usize as *const c_void;
        match world.register_raw(ptr, bytes as usize) {
            Ok(r) => {
                if bytes > 0 && !r.is_direct() {
                    not_direct[s.in_place as usize] += 1;
                }
                regs.push(r);
            }
            // The communicator has failed (a timeout, a peer that called
            // something else): its peers fail too, so stop here.
            Err(e) if e.is_fatal() => {
                return Err(format!(
                    "registering buffer {} of {}: {e}",
                    i + 1,
                    slots.len()
                ))
            }
            // Refused on this rank (the memory): it still took part, so the
            // peers went on; go on with them to the remaining slots.
            Err(e) => {
                first_err.get_or_insert(format!(
                    "registering buffer {} of {} ({bytes} bytes at {addr:#x}): {e}",
                    i + 1,
                    slots.len()
                ));
            }
        }
    }
    let local = [first_err.is_some() as u64, not_direct[0], not_direct[1]];
    let mut sum = [0u64; 3];
    gpucoll::reference::all_reduce(world, &local[..], &mut sum[..], ReduceOp::Sum)
        .map_err(|e| format!("MPI allreduce after the registrations: {e}"))?;
    if let Some(e) = first_err {
        return Err(e);
    }
    if sum[0] > 0 {
        return Err(format!(
            "registering the buffers failed on {} other rank(s)",
            sum[0]
        ));
    }
    let placed = |in_place: bool| slots.iter().any(|s| s.in_place == in_place);
    Ok(Held {
        regs,
        info: Registered {
            out_of_place_direct: placed(false).then_some(sum[1] == 0),
            in_place_direct: placed(true).then_some(sum[2] == 0),
        },
    })
}

//! The CUDA backend's rail bridge: collnet's [`Step::Rail`]
//! (`crate::plan::Step::Rail`) all-reduces a shard with the same local
//! rank of every other node through MPI's own `MPI_Iallreduce`.
//!
//! The kernels are unchanged. A rail step is lowered to two flows through
//! the channel's rail pair, the connector the tables give for this rank's
//! own index: one sends the shard piece by piece into the rail's staging
//! FIFO, the next receives the all-reduced pieces from the rail's receive
//! FIFO into the same place. The proxy takes each staged piece, starts an
//! all-reduce of it over the channel's rail communicator (a copy, so the
//! slot is given back at once), and publishes the results in order, as
//! slots free up. Every member of a rail splits a step into the same
//! pieces (agreed slot size, same count), so their pieces pair up.
//!
//! A piece carries only its length; the datatype and combine come from a
//! queue per channel that the submission fills, in step order, before its
//! kernels are launched (`RailJobs`). That is why a launch with rail steps
//! cannot be captured into a CUDA graph: its replays would find no job.

use super::{NetLayout, NetMem, Proxy, Wire};
use crate::backend::cuda::abi::{CONN_HEADER, CONN_META_OFF, CONN_TAIL_OFF};
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use crate::mpi::{MpiComm, RailAllReduce};
use crate::op::Combine;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// What the pieces of one rail step are: bytes still to come, their
/// datatype and combining function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RailJob {
    pub bytes: u64,
    pub dtype: Datatype,
    pub combine: Combine,
}

/// The rail steps queued per channel, oldest first.
#[derive(Debug)]
pub(crate) struct RailJobs {
    queues: Mutex<Vec<VecDeque<RailJob>>>,
}

impl RailJobs {
    pub(crate) fn new(channels: usize) -> RailJobs {
        RailJobs {
            queues: Mutex::new(vec![VecDeque::new(); channels]),
        }
    }

    /// Queue the rail steps of one launch, `(channel, job)` in step order.
    pub(crate) fn push(&self, jobs: &[(usize, RailJob)]) -> Result<()> {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for &(c, job) in jobs {
            q.get_mut(c)
                .ok_or_else(|| Error::Backend(format!("a rail step on channel {c}")))?
                .push_back(job);
        }
        Ok(())
    }

    /// Take `bytes` of channel `c`'s oldest job: its datatype and combine.
    fn take(&self, c: usize, bytes: u64) -> Option<(Datatype, Combine)> {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let queue = q.get_mut(c)?;
        let job = queue.front_mut()?;
        if bytes > job.bytes || bytes % job.dtype.size() as u64 != 0 {
            return None;
        }
        job.bytes -= bytes;
        let found = (job.dtype, job.combine);
        if job.bytes == 0 {
            queue.pop_front();
        }
        Some(found)
    }
}

/// One all-reduce in flight.
pub(crate) trait RailOp: Send {
    /// The reduced bytes once complete, None while in flight.
    fn test(&mut self) -> Result<Option<&[u8]>>;
}

/// What all-reduces a channel's pieces with the rail's other members.
pub(crate) trait RailNet: Send {
    fn start(
        &self,
        channel: usize,
        data: &[u8],
        dtype: Datatype,
        combine: Combine,
    ) -> Result<Box<dyn RailOp>>;

    /// Let go without freeing what an all-reduce in flight may still use
    /// (its communicator): after a failure.
    fn abandon(self: Box<Self>) {}
}

impl RailOp for RailAllReduce {
    fn test(&mut self) -> Result<Option<&[u8]>> {
        RailAllReduce::test(self)
    }
}

/// MPI: one rail communicator per channel (so channels never interleave
/// their all-reduces on one communicator).
pub(crate) struct MpiRails(pub Vec<MpiComm>);

impl RailNet for MpiRails {
    fn start(
        &self,
        channel: usize,
        data: &[u8],
        dtype: Datatype,
        combine: Combine,
    ) -> Result<Box<dyn RailOp>> {
        let comm = self
            .0
            .get(channel)
            .ok_or_else(|| Error::Backend(format!("no rail communicator for channel {channel}")))?;
        Ok(Box::new(comm.rail_all_reduce(data, dtype, combine)?))
    }

    fn abandon(self: Box<Self>) {
        self.0.into_iter().for_each(MpiComm::abandon);
    }
}

/// The proxy's side of one channel's rail pair.
pub(super) struct RailSide {
    /// Pieces taken from the staging FIFO (the value of its head word).
    taken: u64,
    /// Results published to the kernel (the value of the receive tail).
    tail: u64,
    /// (meta word, all-reduce) of the pieces taken, oldest first.
    inflight: VecDeque<(u64, Box<dyn RailOp>)>,
}

impl Rails {
    /// Release the rails at shutdown: a communicator with an all-reduce
    /// still in flight is abandoned, not freed (the all-reduce's own
    /// buffers are leaked with it).
    pub(super) fn close(self) {
        let busy = self.sides.iter().any(RailSide::busy);
        drop(self.sides);
        if busy {
            self.net.abandon();
        }
    }
}

impl RailSide {
    pub(super) fn new() -> RailSide {
        RailSide {
            taken: 0,
            tail: 0,
            inflight: VecDeque::new(),
        }
    }

    pub(super) fn busy(&self) -> bool {
        !self.inflight.is_empty()
    }
}

/// The rails of a proxy: the all-reduces and the jobs queue.
pub(super) struct Rails {
    pub net: Box<dyn RailNet>,
    pub jobs: std::sync::Arc<RailJobs>,
    pub sides: Vec<RailSide>,
}

fn rail_error(c: u64, what: &str) -> Error {
    Error::Backend(format!("rail of NET channel {c}: {what}"))
}

impl<W: Wire> Proxy<W> {
    /// Move channel `c`'s rail pieces: staged ones to MPI, finished ones
    /// to the kernel. `true` if anything moved.
    pub(super) fn rail_progress(&mut self, c: u64) -> Result<bool> {
        let (l, mem) = (&self.layout, self.mem);
        let (Some(i), Some(rails)) = (l.rail_index(), self.rails.as_mut()) else {
            return Ok(false);
        };
        let taken = rail_take(l, mem, rails, c, i)?;
        let published = rail_publish(l, mem, &mut rails.sides[c as usize], c, i)?;
        Ok(taken || published)
    }
}

/// Channel `c`'s staged rail pieces (pair `i`) handed to MPI's all-reduce,
/// each slot given back to the kernel once MPI took its copy.
fn rail_take(l: &NetLayout, mem: NetMem, rails: &mut Rails, c: u64, i: usize) -> Result<bool> {
    let side = &mut rails.sides[c as usize];
    let mut moved = false;
    let conn = l.send_conn(c, i);
    // Acquire: the kernel fenced the slot and its meta before the tail.
    let tail = mem.word(conn + CONN_TAIL_OFF).load(Ordering::Acquire);
    if tail < side.taken || tail - side.taken > l.slots {
        return Err(rail_error(
            c,
            &format!(
                "staging tail {tail}, {} pieces taken (the counters are inconsistent)",
                side.taken
            ),
        ));
    }
    while side.taken < tail {
        let slot = side.taken % l.slots;
        let meta = mem
            .word(conn + CONN_META_OFF + slot * 8)
            .load(Ordering::Relaxed);
        let bytes = meta & 0xffff_ffff;
        if bytes > l.slot_bytes {
            return Err(rail_error(
                c,
                &format!("a staged piece claims {bytes} bytes"),
            ));
        }
        let (dtype, combine) = rails.jobs.take(c as usize, bytes).ok_or_else(|| {
            rail_error(
                c,
                &format!("a piece of {bytes} bytes that no queued rail step expects"),
            )
        })?;
        // SAFETY: the slot's first `bytes` bytes lie in the block and
        // the kernel does not rewrite them before the head passes this
        // piece, which happens below, after MPI took its own copy.
        let data = unsafe {
            std::slice::from_raw_parts(
                mem.ptr(conn + CONN_HEADER + slot * l.slot_bytes),
                bytes as usize,
            )
        };
        let op = rails.net.start(c as usize, data, dtype, combine)?;
        side.inflight.push_back((meta, op));
        side.taken += 1;
        // The piece was copied: the kernel may refill its slot.
        mem.word(l.send_head(c, i))
            .store(side.taken, Ordering::Release);
        moved = true;
    }
    Ok(moved)
}

/// Channel `c`'s finished rail pieces (pair `i`) published to the kernel,
/// in order, as its receive slots free up.
fn rail_publish(l: &NetLayout, mem: NetMem, side: &mut RailSide, c: u64, i: usize) -> Result<bool> {
    let mut moved = false;
    let rconn = l.recv_conn(c, i);
    // Acquire: the kernel finished reading a slot before it moved the head.
    let head = mem.word(l.recv_head(c, i)).load(Ordering::Acquire);
    if head > side.tail {
        return Err(rail_error(
            c,
            &format!("receive head {head} ahead of tail {}", side.tail),
        ));
    }
    while side.tail - head < l.slots {
        let Some((meta, op)) = side.inflight.front_mut() else {
            break;
        };
        let Some(out) = op.test()? else {
            break;
        };
        let slot = side.tail % l.slots;
        let dst = mem.ptr(rconn + CONN_HEADER + slot * l.slot_bytes);
        // SAFETY: `out` holds the piece's bytes (at most a slot); the
        // kernel released this slot (head > tail - slots) and reads it
        // again only after the tail passes it.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), dst, out.len()) };
        mem.word(rconn + CONN_META_OFF + slot * 8)
            .store(*meta, Ordering::Relaxed);
        side.tail += 1;
        // Release: data and meta are visible before the kernel sees the tail.
        mem.word(rconn + CONN_TAIL_OFF)
            .store(side.tail, Ordering::Release);
        side.inflight.pop_front();
        moved = true;
    }
    Ok(moved)
}

#[cfg(test)]
mod tests;

//! Connectors to ranks on other nodes, over MPI point-to-point.
//!
//! Every piece travels as one message `[meta: u64][piece bytes]` with the
//! channel index as tag; MPI keeps the messages of one (source, tag,
//! communicator) in order, which gives each channel its own FIFO. The meta
//! word is the same `seq << 32 | bytes` the shared memory FIFOs stamp.
//!
//! * A sender owns `slots` staging buffers: a piece is built in a free one
//!   and `isend`t; a buffer is free again once its request completed.
//! * A receiver owns `slots` staging buffers and keeps receives posted for
//!   pieces it knows are coming (within one step only, so nothing stays
//!   posted between launches); pieces are consumed in posting order.
//!
//! Staging buffers are `u64` arrays so that piece data (after the 8-byte
//! header) is 8-byte aligned for the reduction kernels.

use super::fifo;
use crate::error::{Error, Result};
use crate::mpi::{MpiComm, MpiRequest};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Bytes of the message header.
pub(crate) const HEADER: usize = 8;

/// How long dropping a connector waits for each in-flight request to be
/// cancelled (only after a failure: normal launches end with none).
const CANCEL_WAIT: Duration = Duration::from_millis(200);

fn staging(slot_bytes: usize) -> Box<[u64]> {
    vec![0u64; (HEADER + slot_bytes).div_ceil(8)].into_boxed_slice()
}

/// Cancel `req`; if MPI may still use `buf` afterwards, leak it rather than
/// free memory MPI could write to.
fn retire(req: MpiRequest, buf: &mut Box<[u64]>) {
    if !req.cancel_within(CANCEL_WAIT) {
        let leaked = std::mem::take(buf);
        tracing::warn!(
            "an MPI request could not be cancelled; leaking its {} byte buffer",
            leaked.len() * 8
        );
        Box::leak(leaked);
    }
}

/// The sending side of one (channel, peer) stream.
#[derive(Debug)]
pub(crate) struct NetSend {
    peer: usize,
    tag: i32,
    slot_bytes: usize,
    bufs: Vec<Box<[u64]>>,
    free: Vec<usize>,
    inflight: Vec<(usize, MpiRequest)>,
    /// The buffer handed out by `try_acquire`, not yet committed.
    acquired: Option<usize>,
}

impl NetSend {
    pub(crate) fn new(peer: usize, tag: i32, slots: usize, slot_bytes: usize) -> NetSend {
        NetSend {
            peer,
            tag,
            slot_bytes,
            bufs: (0..slots).map(|_| staging(slot_bytes)).collect(),
            free: (0..slots).rev().collect(),
            inflight: Vec::with_capacity(slots),
            acquired: None,
        }
    }

    /// Retire completed sends.
    fn poll(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.inflight.len() {
            if self.inflight[i].1.test()?.is_some() {
                let (idx, _) = self.inflight.swap_remove(i);
                self.free.push(idx);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// A staging area of `slot_bytes` for the next piece, if one is free.
    /// Stays reserved (and the same) until [`commit`](Self::commit).
    pub(crate) fn try_acquire(&mut self) -> Result<Option<*mut u8>> {
        if self.acquired.is_none() {
            if self.free.is_empty() {
                self.poll()?;
            }
            self.acquired = self.free.pop();
        }
        Ok(self.acquired.map(|idx| {
            // SAFETY: the buffer holds HEADER + slot_bytes bytes; the offset
            // stays inside it.
            unsafe { (self.bufs[idx].as_mut_ptr() as *mut u8).add(HEADER) }
        }))
    }

    /// Send the acquired staging area's first `bytes` bytes.
    pub(crate) fn commit(&mut self, comm: &MpiComm, meta: u64, bytes: usize) -> Result<()> {
        let idx = self
            .acquired
            .take()
            .ok_or_else(|| Error::Backend("net send committed without a buffer".into()))?;
        debug_assert!(bytes <= self.slot_bytes);
        let buf = &mut self.bufs[idx];
        buf[0] = meta.to_le();
        // SAFETY: the buffer holds HEADER + slot_bytes >= HEADER + bytes
        // bytes and is neither touched nor freed until the request completes
        // (it sits in `inflight`; Drop cancels or leaks it).
        let req = unsafe {
            comm.isend(
                buf.as_ptr() as *const u8,
                HEADER + bytes.min(self.slot_bytes),
                self.peer,
                self.tag,
            )
        };
        match req {
            Ok(req) => {
                self.inflight.push((idx, req));
                Ok(())
            }
            Err(e) => {
                self.free.push(idx);
                Err(e)
            }
        }
    }

    /// Whether every send has completed (polls them).
    pub(crate) fn drained(&mut self) -> Result<bool> {
        self.poll()?;
        Ok(self.inflight.is_empty())
    }
}

impl Drop for NetSend {
    fn drop(&mut self) {
        for (idx, req) in std::mem::take(&mut self.inflight) {
            retire(req, &mut self.bufs[idx]);
        }
    }
}

/// A received piece: its meta word and payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NetPiece {
    pub meta: u64,
    pub data: *const u8,
    pub bytes: usize,
}

/// The receiving side of one (channel, peer) stream.
#[derive(Debug)]
pub(crate) struct NetRecv {
    peer: usize,
    tag: i32,
    slot_bytes: usize,
    bufs: Vec<Box<[u64]>>,
    free: Vec<usize>,
    /// Posted receives, oldest first (the order MPI matches them in).
    posted: VecDeque<(usize, MpiRequest)>,
}

impl NetRecv {
    pub(crate) fn new(peer: usize, tag: i32, slots: usize, slot_bytes: usize) -> NetRecv {
        NetRecv {
            peer,
            tag,
            slot_bytes,
            bufs: (0..slots).map(|_| staging(slot_bytes)).collect(),
            free: (0..slots).rev().collect(),
            posted: VecDeque::with_capacity(slots),
        }
    }

    /// Whether another receive can be posted.
    pub(crate) fn can_post(&self) -> bool {
        !self.free.is_empty()
    }

    /// Post a receive for the next piece.
    pub(crate) fn post(&mut self, comm: &MpiComm) -> Result<()> {
        let idx = self
            .free
            .pop()
            .ok_or_else(|| Error::Backend("net receive posted without a free buffer".into()))?;
        let buf = &mut self.bufs[idx];
        let cap = buf.len() * 8;
        // SAFETY: the buffer is writable for `cap` bytes and is neither read
        // nor freed until the request completes (it sits in `posted`; Drop
        // cancels or leaks it).
        match unsafe { comm.irecv(buf.as_mut_ptr() as *mut u8, cap, self.peer, self.tag) } {
            Ok(req) => {
                self.posted.push_back((idx, req));
                Ok(())
            }
            Err(e) => {
                self.free.push(idx);
                Err(e)
            }
        }
    }

    /// The oldest posted piece, once it arrived. `Ok(None)` while in flight
    /// (or when nothing is posted). The data stays valid until
    /// [`release`](Self::release).
    pub(crate) fn try_acquire(&mut self) -> Result<Option<NetPiece>> {
        let Some((idx, req)) = self.posted.front_mut() else {
            return Ok(None);
        };
        let Some(n) = req.test()? else {
            return Ok(None);
        };
        let buf = &self.bufs[*idx];
        if n < HEADER || n > HEADER + self.slot_bytes {
            return Err(Error::ProtocolMismatch {
                peer: self.peer,
                detail: format!("received a {n} byte message on channel {}", self.tag),
            });
        }
        Ok(Some(NetPiece {
            meta: u64::from_le(buf[0]),
            // SAFETY: HEADER < buffer length.
            data: unsafe { (buf.as_ptr() as *const u8).add(HEADER) },
            bytes: n - HEADER,
        }))
    }

    /// Consume the oldest piece.
    pub(crate) fn release(&mut self) {
        if let Some((idx, _req)) = self.posted.pop_front() {
            // The request is complete: dropping it frees nothing MPI uses.
            self.free.push(idx);
        }
    }
}

impl Drop for NetRecv {
    fn drop(&mut self) {
        for (idx, req) in std::mem::take(&mut self.posted) {
            retire(req, &mut self.bufs[idx]);
        }
    }
}

/// The MPI connectors of one channel, created on first use.
#[derive(Debug, Default)]
pub(crate) struct ChannelNet {
    sends: HashMap<usize, NetSend>,
    recvs: HashMap<usize, NetRecv>,
}

impl ChannelNet {
    pub(crate) fn send(
        &mut self,
        channel: usize,
        peer: usize,
        slots: usize,
        slot_bytes: usize,
    ) -> &mut NetSend {
        self.sends
            .entry(peer)
            .or_insert_with(|| NetSend::new(peer, channel as i32, slots, slot_bytes))
    }

    pub(crate) fn recv(
        &mut self,
        channel: usize,
        peer: usize,
        slots: usize,
        slot_bytes: usize,
    ) -> &mut NetRecv {
        self.recvs
            .entry(peer)
            .or_insert_with(|| NetRecv::new(peer, channel as i32, slots, slot_bytes))
    }

    /// Drive MPI: test every send in flight. A rank blocked on shared
    /// memory must keep calling MPI, or a large (rendezvous) send it posted
    /// earlier never moves and the peer waiting for it never progresses.
    pub(crate) fn progress(&mut self) -> Result<()> {
        for s in self.sends.values_mut() {
            s.poll()?;
        }
        Ok(())
    }

    /// The first peer whose sends are still in flight, polling all.
    pub(crate) fn undrained(&mut self) -> Result<Option<usize>> {
        let mut first = None;
        for (peer, s) in self.sends.iter_mut() {
            if !s.drained()? && first.is_none() {
                first = Some(*peer);
            }
        }
        Ok(first)
    }
}

/// Check a received piece's header against what this rank expects.
pub(crate) fn check_piece(piece: &NetPiece, stamp: u64, bytes: usize) -> Option<String> {
    fifo::meta_mismatch(stamp, bytes, piece.meta).or_else(|| {
        (piece.bytes != bytes).then(|| {
            format!(
                "expected collective #{} with {bytes} bytes, got a message of {} bytes",
                (stamp as u32) >> 8,
                piece.bytes
            )
        })
    })
}

//! A message's sending side. The sender picks how the bytes travel (the
//! receiver follows what the envelope says), in this order:
//!
//! * device memory to another rank whose GPU memory maps here, above
//!   `GPUCOLL_P2P_EAGER` (0 by default), **pull**: the envelope carries an
//!   IPC handle of the buffer, the receiver copies from it with a copy
//!   engine and answers with a completion, which completes the send (one
//!   device copy, where staging makes two, so even 8 bytes go faster);
//!   memory the driver cannot export goes the same way above
//!   [`INLINE_MAX`] through a pooled device block the bytes are copied
//!   into. A receiver that cannot map it answers with a refusal, and the
//!   bytes follow as `Mpi`;
//! * up to [`INLINE_MAX`] bytes, **inline** in the envelope (device bytes
//!   copied out through pinned memory first): the send completes when MPI
//!   sent the envelope, as MPI's own eager messages do, so programs that
//!   exchange small host messages with two blocking sends keep working;
//! * to this rank itself, **local**: the envelope carries the address;
//! * anything else, **Mpi**: data messages of the envelope's chunk size on
//!   the data communicator, sent straight from host memory, or from device
//!   memory through a pipeline of pinned blocks (copy out, send, reuse).

use super::ctx::Ctx;
use super::envelope::{Body, Envelope, Exported as WireExport};
use crate::backend::{DeviceMoves, DeviceStage, Exported, Fence, HostStage};
use crate::buffer::{MemoryKind, RawBuffer};
use crate::error::{Error, Result};
use crate::mpi::MpiRequest;
use std::collections::VecDeque;

/// Largest message sent inside its envelope.
pub(crate) const INLINE_MAX: u64 = 16 << 10;
/// Data messages of a message staged through pinned memory (and of any
/// message on the CUDA backend, whose receiver may stage it).
pub(crate) const STAGE_CHUNK: u64 = 4 << 20;
/// Data messages of a message from host memory on the host backend.
pub(crate) const HOST_CHUNK: u64 = 64 << 20;
/// Pinned blocks in flight per staged message.
pub(crate) const STAGE_SLOTS: usize = 4;

/// The receiver's answer to a pulled or local message.
pub(crate) const FIN_DONE: u64 = 1;
pub(crate) const FIN_REFUSED: u64 = 2;

/// Wait for a copy that the call itself depends on (a few microseconds
/// for an inline payload; a device-to-device copy for a bounce).
pub(crate) fn finish(fence: &mut dyn Fence) -> Result<()> {
    let mut spins = 0u32;
    while !fence.done()? {
        spins = spins.saturating_add(1);
        if spins < 4096 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    Ok(())
}

pub(crate) fn moves_of(ctx: &Ctx) -> Result<&dyn DeviceMoves> {
    ctx.moves.as_deref().ok_or_else(|| {
        Error::WrongMemory("device memory needs a communicator on the CUDA backend".into())
    })
}

/// Host memory that device bytes pass through: a pinned block from the
/// pool, or, once pinned memory ran out, a plain vector (the driver stages
/// copies from and to it itself, more slowly).
pub(crate) enum Staging {
    Pinned(Box<dyn HostStage>),
    Plain(Vec<u8>),
}

impl Staging {
    pub(crate) fn new(moves: &dyn DeviceMoves, n: usize) -> Result<Staging> {
        match moves.pinned(n) {
            Ok(p) => Ok(Staging::Pinned(p)),
            Err(e) if e.is_out_of_memory() => {
                tracing::debug!("pinned memory ran out; staging {n} bytes through pageable memory");
                Ok(Staging::Plain(vec![0u8; n]))
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn plain(n: usize) -> Staging {
        Staging::Plain(vec![0u8; n])
    }

    pub(crate) fn ptr(&mut self) -> *mut u8 {
        match self {
            Staging::Pinned(p) => p.ptr(),
            Staging::Plain(v) => v.as_mut_ptr(),
        }
    }
}

/// Test every request, dropping the completed ones; whether none is left.
pub(crate) fn all_done(reqs: &mut Vec<MpiRequest>) -> Result<bool> {
    let mut i = 0;
    while i < reqs.len() {
        if reqs[i].test()?.is_some() {
            reqs.swap_remove(i);
        } else {
            i += 1;
        }
    }
    Ok(reqs.is_empty())
}

fn wire_export(e: Exported) -> WireExport {
    WireExport {
        handle: e.handle,
        offset: e.offset,
        alloc_bytes: e.alloc_bytes,
        buffer_id: e.buffer_id,
    }
}

/// One pinned block of a staged message.
struct Slot {
    stage: Staging,
    len: usize,
    /// The copy into the block, until it is done.
    fence: Option<Box<dyn Fence>>,
    /// The data message sent from the block, once the copy is done.
    req: Option<MpiRequest>,
}

/// Device bytes sent as data messages through pinned blocks.
struct Staged {
    src: u64,
    bytes: u64,
    chunk: u64,
    /// The next chunk to copy out.
    next: u64,
    dest: usize,
    tag: i32,
    slots: VecDeque<Slot>,
    /// A bounce block the bytes are in, kept until they are sent.
    _keep: Option<Box<dyn DeviceStage>>,
}

impl Staged {
    fn advance(&mut self, ctx: &Ctx) -> Result<bool> {
        let moves = moves_of(ctx)?;
        let mut i = 0;
        while i < self.slots.len() {
            let sent = match &mut self.slots[i].req {
                Some(r) => r.test()?.is_some(),
                None => false,
            };
            if sent {
                self.slots.remove(i);
            } else {
                i += 1;
            }
        }
        // Data messages leave in chunk order: the receiver's posted
        // receives take them in that order.
        for slot in self.slots.iter_mut().filter(|s| s.req.is_none()) {
            if let Some(f) = &mut slot.fence {
                if !f.done()? {
                    break;
                }
            }
            slot.fence = None;
            // SAFETY: the block holds `len` copied bytes and stays in the
            // slot until the send completed.
            let req = unsafe {
                ctx.wire
                    .data
                    .isend(slot.stage.ptr(), slot.len, self.dest, self.tag)?
            };
            slot.req = Some(req);
        }
        while self.slots.len() < STAGE_SLOTS && self.next * self.chunk < self.bytes {
            let off = self.next * self.chunk;
            let len = self.chunk.min(self.bytes - off);
            let mut stage = Staging::new(moves, len as usize)?;
            // SAFETY: the block holds at least `len` bytes and stays in the
            // slot until the copy (then the send) is done; the source is
            // the caller's buffer (or our bounce), valid until the message
            // completes.
            let fence = unsafe { moves.copy(stage.ptr() as u64, self.src + off, len)? };
            self.slots.push_back(Slot {
                stage,
                len: len as usize,
                fence: Some(fence),
                req: None,
            });
            self.next += 1;
        }
        Ok(self.slots.is_empty() && self.next * self.chunk >= self.bytes)
    }
}

/// How the bytes follow a refused pull.
struct Fallback {
    src: u64,
    bytes: u64,
    chunk: u64,
    device: bool,
}

enum Phase {
    /// Nothing beyond the envelope.
    Envelope,
    /// Data messages straight from host memory.
    Direct(Vec<MpiRequest>),
    Staged(Staged),
    /// A pulled or local message: the receiver's answer.
    Answer {
        fin: MpiRequest,
        word: Box<[u8; 8]>,
        fallback: Fallback,
        keep: Option<Box<dyn DeviceStage>>,
    },
}

/// A message being sent.
pub(crate) struct SendOp {
    dest: usize,
    seq: u64,
    /// The envelope's send, until MPI completed it.
    env_req: Option<MpiRequest>,
    /// The envelope's bytes, read by MPI until then.
    _env: Vec<u8>,
    phase: Phase,
}

/// The inline payload of `buf`.
fn payload(ctx: &Ctx, buf: &RawBuffer) -> Result<Vec<u8>> {
    let n = buf.bytes() as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    match buf.memory {
        MemoryKind::Host => {
            // SAFETY: the caller guarantees `buf` is readable for its bytes
            // until the send completes; this copy happens now.
            Ok(unsafe { std::slice::from_raw_parts(buf.addr as *const u8, n) }.to_vec())
        }
        MemoryKind::Device { .. } => {
            let moves = moves_of(ctx)?;
            let mut stage = Staging::new(moves, n)?;
            let p = stage.ptr();
            // SAFETY: the block holds `n` bytes; the device range is the
            // caller's; the copy is waited for right here.
            let mut fence = unsafe { moves.copy(p as u64, buf.addr, n as u64)? };
            finish(fence.as_mut())?;
            // SAFETY: the copy filled the block's first `n` bytes.
            Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
        }
    }
}

/// How a peer pulls a message: the export, and the bounce block it names
/// when the bytes were copied into one.
type Pulled = (Exported, Option<Box<dyn DeviceStage>>);

/// A pooled device block holding a copy of `buf`, for memory the driver
/// cannot export (kept until the message completes). None: no block could
/// be had, and the bytes go through host memory.
fn pull_through_bounce(moves: &dyn DeviceMoves, buf: &RawBuffer) -> Result<Option<Pulled>> {
    let bytes = buf.bytes();
    let Some(bounce) = moves.bounce(bytes)? else {
        return Ok(None);
    };
    // SAFETY: the block holds at least `bytes`; the source is the caller's
    // buffer; the copy is waited for before the envelope leaves.
    let mut fence = unsafe { moves.copy(bounce.addr(), buf.addr, bytes)? };
    finish(fence.as_mut())?;
    Ok(Some((bounce.exported(), Some(bounce))))
}

impl SendOp {
    /// Send `buf` to `dest` with `tag` as message `seq` of the pair.
    pub(crate) fn start(
        ctx: &Ctx,
        buf: RawBuffer,
        dest: usize,
        tag: i32,
        seq: u64,
    ) -> Result<SendOp> {
        let bytes = buf.bytes();
        let device = matches!(buf.memory, MemoryKind::Device { .. });
        // A receiver on the CUDA backend may stage the data messages.
        let chunk = if device || ctx.moves.is_some() {
            STAGE_CHUNK
        } else {
            HOST_CHUNK
        };
        let fallback = Fallback {
            src: buf.addr,
            bytes,
            chunk,
            device,
        };
        // Device memory a peer on the node maps: pulled, when its own
        // memory can be exported and it is above the eager limit; above
        // the inline limit through a bounce block otherwise.
        let mapped = match &ctx.moves {
            Some(m) if device && bytes > 0 && dest != ctx.rank && m.maps_peer(dest) => {
                Some(m.as_ref())
            }
            _ => None,
        };
        let mut pulled = None;
        if let Some(m) = mapped {
            if bytes > ctx.eager {
                pulled = match m.export(buf.addr, bytes)? {
                    Some(e) => Some((e, None)),
                    None if bytes > INLINE_MAX => pull_through_bounce(m, &buf)?,
                    None => None,
                };
            }
        }
        let keep = pulled.as_mut().and_then(|(_, b)| b.take());
        let (body, answered) = match pulled {
            Some((e, _)) => (Body::Pull(wire_export(e)), true),
            None if bytes <= INLINE_MAX => (Body::Inline(payload(ctx, &buf)?), false),
            None if dest == ctx.rank => (
                Body::Local {
                    addr: buf.addr,
                    device,
                },
                true,
            ),
            None => (Body::Mpi, false),
        };
        let env = Envelope {
            dtype: buf.dtype,
            bytes,
            seq,
            chunk: match body {
                Body::Mpi | Body::Pull(_) => chunk,
                _ => 0,
            },
            body,
        };
        // A pull that uses a bounce block reads the block, not the buffer.
        let fallback = match &keep {
            Some(b) => Fallback {
                src: b.addr(),
                ..fallback
            },
            None => fallback,
        };
        let wire = &ctx.wire;
        let is_mpi = matches!(env.body, Body::Mpi);
        let (phase, data) = if answered {
            let mut word = Box::new([0u8; 8]);
            // SAFETY: the word is boxed and kept in the op until the
            // receive completed (or is cancelled by its drop).
            let fin = unsafe {
                wire.data
                    .irecv(word.as_mut_ptr(), 8, dest, wire.fin_tag(seq))?
            };
            let answer = Phase::Answer {
                fin,
                word,
                fallback,
                keep,
            };
            (answer, None)
        } else {
            (Phase::Envelope, is_mpi.then_some(fallback))
        };
        let bytes_env = env.encode();
        // SAFETY: the envelope's bytes stay in the op until the send completed.
        let env_req = unsafe {
            wire.env
                .isend(bytes_env.as_ptr(), bytes_env.len(), dest, tag)?
        };
        let mut op = SendOp {
            dest,
            seq,
            env_req: Some(env_req),
            _env: bytes_env,
            phase,
        };
        if let Some(f) = data {
            op.phase = op.data_phase(ctx, f)?;
        }
        Ok(op)
    }

    /// The data messages of `f`'s bytes.
    fn data_phase(&self, ctx: &Ctx, f: Fallback) -> Result<Phase> {
        let tag = ctx.wire.data_tag(self.seq);
        if f.device {
            return Ok(Phase::Staged(Staged {
                src: f.src,
                bytes: f.bytes,
                chunk: f.chunk,
                next: 0,
                dest: self.dest,
                tag,
                slots: VecDeque::new(),
                _keep: None,
            }));
        }
        let mut reqs = Vec::new();
        let mut off = 0;
        while off < f.bytes {
            let len = f.chunk.min(f.bytes - off);
            // SAFETY: the caller keeps its host buffer readable until the
            // message completes, which waits for these sends.
            let r = unsafe {
                ctx.wire
                    .data
                    .isend((f.src + off) as *const u8, len as usize, self.dest, tag)?
            };
            reqs.push(r);
            off += len;
        }
        Ok(Phase::Direct(reqs))
    }

    /// Move the message along; whether it completed.
    pub(crate) fn advance(&mut self, ctx: &Ctx) -> Result<bool> {
        if let Some(r) = &mut self.env_req {
            if r.test()?.is_some() {
                self.env_req = None;
            }
        }
        let phase_done = match &mut self.phase {
            Phase::Envelope => true,
            Phase::Direct(reqs) => all_done(reqs)?,
            Phase::Staged(s) => s.advance(ctx)?,
            Phase::Answer { fin, word, .. } => match fin.test()? {
                None => false,
                Some(8) => match u64::from_le_bytes(**word) {
                    FIN_DONE => true,
                    FIN_REFUSED => {
                        let Phase::Answer { fallback, keep, .. } =
                            std::mem::replace(&mut self.phase, Phase::Envelope)
                        else {
                            unreachable!("matched Phase::Answer above")
                        };
                        tracing::debug!(
                            dest = self.dest,
                            bytes = fallback.bytes,
                            "peer could not map the message; sending it through host memory"
                        );
                        let mut next = self.data_phase(ctx, fallback)?;
                        if let Phase::Staged(s) = &mut next {
                            s._keep = keep;
                        }
                        self.phase = next;
                        return Ok(false);
                    }
                    w => {
                        return Err(Error::ProtocolMismatch {
                            peer: self.dest,
                            detail: format!("answered a message with {w:#x}"),
                        })
                    }
                },
                Some(n) => {
                    return Err(Error::ProtocolMismatch {
                        peer: self.dest,
                        detail: format!("answered a message with {n} bytes"),
                    })
                }
            },
        };
        Ok(phase_done && self.env_req.is_none())
    }
}

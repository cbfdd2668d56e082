//! A message's receiving side: posted until the progress gives it an
//! envelope, then whatever the envelope says (`send.rs` lists the ways).
//! Bytes beyond the receive buffer are taken and dropped, so the sender
//! completes as usual; the receive then ends in `Error::Truncated` with
//! the first bytes delivered, as MPI's truncation error.

use super::ctx::{Arrived, Ctx};
use super::envelope::Body;
use super::send::{all_done, moves_of, Staging, FIN_DONE, FIN_REFUSED, STAGE_SLOTS};
use super::Status;
use crate::backend::Fence;
use crate::buffer::{MemoryKind, RawBuffer};
use crate::error::{Error, Result};
use crate::mpi::MpiRequest;
use std::collections::VecDeque;

/// Which messages a receive takes: `None` is any source / any tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Selector {
    pub source: Option<usize>,
    pub tag: Option<i32>,
}

impl Selector {
    pub fn matches(&self, a: &Arrived) -> bool {
        self.source.map_or(true, |s| s == a.source) && self.tag.map_or(true, |t| t == a.tag)
    }

    /// Exactly `a`'s source and tag.
    pub fn of(a: &Arrived) -> Selector {
        Selector {
            source: Some(a.source),
            tag: Some(a.tag),
        }
    }
}

/// Where a receive puts the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sink {
    addr: u64,
    cap: u64,
    device: bool,
    /// A dropped message: everything is taken and dropped, nobody is told.
    discard: bool,
}

impl Sink {
    pub fn of(buf: &RawBuffer) -> Sink {
        Sink {
            addr: buf.addr,
            cap: buf.bytes(),
            device: matches!(buf.memory, MemoryKind::Device { .. }),
            discard: false,
        }
    }

    pub fn discard() -> Sink {
        Sink {
            addr: 0,
            cap: 0,
            device: false,
            discard: true,
        }
    }
}

/// One posted data message, then the copy of its bytes.
struct InSlot {
    /// Its chunk index.
    k: u64,
    len: usize,
    /// None: it lands in the receive buffer itself.
    scratch: Option<Staging>,
    req: Option<MpiRequest>,
    fence: Option<Box<dyn Fence>>,
}

/// The data messages of an `Mpi` message (or a refused pull).
struct DataIn {
    source: usize,
    tag: i32,
    chunk: u64,
    bytes: u64,
    /// Bytes that fit the receive buffer.
    take: u64,
    sink: Sink,
    /// Straight into the receive buffer (host memory, no truncation).
    direct: bool,
    /// The next chunk to post.
    next: u64,
    slots: VecDeque<InSlot>,
}

impl DataIn {
    fn new(ctx: &Ctx, source: usize, seq: u64, bytes: u64, chunk: u64, sink: Sink) -> DataIn {
        let take = bytes.min(sink.cap);
        DataIn {
            source,
            tag: ctx.wire.data_tag(seq),
            chunk,
            bytes,
            take,
            sink,
            direct: !sink.device && !sink.discard && take == bytes,
            next: 0,
            slots: VecDeque::new(),
        }
    }

    fn chunks(&self) -> u64 {
        self.bytes.div_ceil(self.chunk)
    }

    fn advance(&mut self, ctx: &Ctx) -> Result<bool> {
        let data = &ctx.wire.data;
        while self.next < self.chunks() && (self.direct || self.slots.len() < STAGE_SLOTS) {
            let off = self.next * self.chunk;
            let len = self.chunk.min(self.bytes - off) as usize;
            let (scratch, at) = if self.direct {
                (None, self.sink.addr + off)
            } else {
                let mut s = if self.sink.device && off < self.take {
                    Staging::new(moves_of(ctx)?, len)?
                } else {
                    Staging::plain(len)
                };
                let p = s.ptr() as u64;
                (Some(s), p)
            };
            // SAFETY: `at` is the receive buffer's range of this chunk
            // (valid until the receive completes, the caller's promise) or
            // a scratch block kept in the slot until the message landed.
            let req = unsafe { data.irecv(at as *mut u8, len, self.source, self.tag)? };
            self.slots.push_back(InSlot {
                k: self.next,
                len,
                scratch,
                req: Some(req),
                fence: None,
            });
            self.next += 1;
        }
        let mut i = 0;
        while i < self.slots.len() {
            let slot = &mut self.slots[i];
            if let Some(r) = &mut slot.req {
                match r.test()? {
                    None => {
                        i += 1;
                        continue;
                    }
                    Some(n) if n != slot.len => {
                        return Err(Error::ProtocolMismatch {
                            peer: self.source,
                            detail: format!(
                                "sent {n} bytes as data message {} of {} bytes",
                                slot.k, slot.len
                            ),
                        })
                    }
                    Some(_) => slot.req = None,
                }
                let off = slot.k * self.chunk;
                let fit = self.take.saturating_sub(off).min(slot.len as u64);
                if let (Some(s), true) = (slot.scratch.as_mut(), fit > 0) {
                    let src = s.ptr();
                    if self.sink.device {
                        // SAFETY: the scratch block stays in the slot until
                        // the fence says the copy is done; the destination
                        // is the receive buffer's part for this chunk.
                        let f =
                            unsafe { moves_of(ctx)?.copy(self.sink.addr + off, src as u64, fit)? };
                        slot.fence = Some(f);
                    } else {
                        // SAFETY: `fit` bytes of the received scratch into
                        // the receive buffer, which holds `take` bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                src,
                                (self.sink.addr + off) as *mut u8,
                                fit as usize,
                            )
                        };
                    }
                }
            }
            let copied = match &mut slot.fence {
                Some(f) => f.done()?,
                None => true,
            };
            if copied {
                self.slots.remove(i);
            } else {
                i += 1;
            }
        }
        Ok(self.next >= self.chunks() && self.slots.is_empty())
    }
}

enum Phase {
    /// Waiting for its envelope.
    Posted,
    /// A copy from an inline payload or a peer's (or our own) memory; a
    /// pulled or local message's sender is answered when it is done.
    Copy {
        fence: Box<dyn Fence>,
        _stage: Option<Staging>,
        answer: Option<(usize, u64)>,
    },
    Data(DataIn),
    Done,
}

/// A message being received.
pub(crate) struct RecvOp {
    pub sel: Selector,
    sink: Sink,
    status: Option<Status>,
    phase: Phase,
    /// Answers sent to the sender, until MPI completed them.
    answers: Vec<MpiRequest>,
    /// Their words: boxed, so that they stay where MPI reads them while
    /// the vector grows.
    #[allow(clippy::vec_box)]
    _words: Vec<Box<[u8; 8]>>,
    /// Why the bytes are being dropped (see [`begin`](Self::begin)).
    failed: Option<Error>,
}

impl RecvOp {
    pub(crate) fn posted(sel: Selector, sink: Sink) -> RecvOp {
        RecvOp {
            sel,
            sink,
            status: None,
            phase: Phase::Posted,
            answers: Vec::new(),
            _words: Vec::new(),
            failed: None,
        }
    }

    fn answer(&mut self, ctx: &Ctx, to: usize, seq: u64, word: u64) -> Result<()> {
        let w = Box::new(word.to_le_bytes());
        // SAFETY: the word is boxed and kept in the op until the send completed.
        let r = unsafe {
            ctx.wire
                .data
                .isend(w.as_ptr(), 8, to, ctx.wire.fin_tag(seq))?
        };
        self.answers.push(r);
        self._words.push(w);
        Ok(())
    }

    /// The envelope `a` matched this receive: start taking its bytes. If
    /// that fails before the sender was answered (device memory ran out,
    /// say), the bytes are taken and dropped instead, so that the sender
    /// completes, and the receive ends in the error.
    pub(crate) fn begin(&mut self, ctx: &Ctx, a: Arrived) -> Result<()> {
        match self.start(ctx, &a) {
            Err(e) if !self.sink.discard && self.answers.is_empty() => {
                tracing::debug!(source = a.source, "receive failed; dropping its bytes: {e}");
                self.failed = Some(e);
                self.sink = Sink::discard();
                self.start(ctx, &a)
            }
            r => r,
        }
    }

    fn start(&mut self, ctx: &Ctx, a: &Arrived) -> Result<()> {
        self.status = Some(a.status());
        let sink = self.sink;
        let take = if sink.discard {
            0
        } else {
            a.env.bytes.min(sink.cap)
        };
        let (source, seq) = (a.source, a.env.seq);
        self.phase = match &a.env.body {
            Body::Inline(p) => {
                if take == 0 {
                    Phase::Done
                } else if sink.device {
                    let moves = moves_of(ctx)?;
                    let mut stage = Staging::new(moves, take as usize)?;
                    let at = stage.ptr();
                    // SAFETY: the block holds at least `take` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), at, take as usize) };
                    // SAFETY: the block stays in the phase until the fence
                    // is done; the receive buffer holds `take` bytes.
                    let fence = unsafe { moves.copy(sink.addr, at as u64, take)? };
                    Phase::Copy {
                        fence,
                        _stage: Some(stage),
                        answer: None,
                    }
                } else {
                    // SAFETY: the receive buffer holds at least `take` bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            p.as_ptr(),
                            sink.addr as *mut u8,
                            take as usize,
                        )
                    };
                    Phase::Done
                }
            }
            Body::Mpi => Phase::Data(DataIn::new(
                ctx,
                source,
                seq,
                a.env.bytes,
                a.env.chunk,
                sink,
            )),
            Body::Pull(e) => {
                let mapped = match ctx.moves.as_deref() {
                    Some(m) if m.maps_peer(source) => {
                        let exported = crate::backend::Exported {
                            handle: e.handle,
                            offset: e.offset,
                            alloc_bytes: e.alloc_bytes,
                            buffer_id: e.buffer_id,
                        };
                        m.open(source, &exported).map_err(|err| {
                            tracing::debug!(source, "mapping a peer's message failed: {err}");
                        })
                    }
                    _ => Err(()),
                };
                match mapped {
                    Ok(ptr) if take > 0 => {
                        // SAFETY: the peer keeps its buffer until we answer;
                        // the receive buffer holds `take` bytes.
                        let fence = unsafe { moves_of(ctx)?.copy(sink.addr, ptr, take)? };
                        Phase::Copy {
                            fence,
                            _stage: None,
                            answer: Some((source, seq)),
                        }
                    }
                    Ok(_) => {
                        self.answer(ctx, source, seq, FIN_DONE)?;
                        Phase::Done
                    }
                    Err(()) => {
                        self.answer(ctx, source, seq, FIN_REFUSED)?;
                        Phase::Data(DataIn::new(
                            ctx,
                            source,
                            seq,
                            a.env.bytes,
                            a.env.chunk,
                            sink,
                        ))
                    }
                }
            }
            &Body::Local { addr, device } => {
                if source != ctx.rank {
                    return Err(Error::ProtocolMismatch {
                        peer: source,
                        detail: "sent an address of its own memory".into(),
                    });
                }
                if take == 0 {
                    self.answer(ctx, source, seq, FIN_DONE)?;
                    Phase::Done
                } else if !device && !sink.device {
                    // SAFETY: our own send keeps `addr` readable until we
                    // answer; the receive buffer holds `take` bytes; MPI
                    // forbids a send and a receive on the same memory.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            addr as *const u8,
                            sink.addr as *mut u8,
                            take as usize,
                        )
                    };
                    self.answer(ctx, source, seq, FIN_DONE)?;
                    Phase::Done
                } else {
                    // SAFETY: as above, through the copy engine.
                    let fence = unsafe { moves_of(ctx)?.copy(sink.addr, addr, take)? };
                    Phase::Copy {
                        fence,
                        _stage: None,
                        answer: Some((source, seq)),
                    }
                }
            }
        };
        Ok(())
    }

    /// Move the receive along: `Some` with its status once it completed.
    pub(crate) fn advance(&mut self, ctx: &Ctx) -> Result<Option<Status>> {
        match &mut self.phase {
            Phase::Posted => return Ok(None),
            Phase::Copy { fence, answer, .. } => {
                if fence.done()? {
                    let answer = *answer;
                    self.phase = Phase::Done;
                    if let Some((to, seq)) = answer {
                        self.answer(ctx, to, seq, FIN_DONE)?;
                    }
                }
            }
            Phase::Data(d) => {
                if d.advance(ctx)? {
                    self.phase = Phase::Done;
                }
            }
            Phase::Done => {}
        }
        if !matches!(self.phase, Phase::Done) || !all_done(&mut self.answers)? {
            return Ok(None);
        }
        let Some(status) = self.status else {
            return Ok(None);
        };
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if !self.sink.discard && status.bytes > self.sink.cap {
            return Err(Error::Truncated {
                source_rank: status.source,
                tag: status.tag,
                bytes: status.bytes,
                capacity: self.sink.cap,
            });
        }
        Ok(Some(status))
    }
}

//! Point-to-point messages, rsmpi style, on host or device memory: `send`,
//! `receive_into` and their immediate forms on a [`Process`](crate::Process), receives
//! from any source on an [`AnyProcess`], probes and matched probes
//! ([`Message`]), [`Communicator::send_receive_into`](crate::Communicator::send_receive_into); `*_raw` forms on
//! pointers for the MPI shim ([`raw`]).
//!
//! ```no_run
//! # use gpucoll::prelude::*;
//! # let universe = gpucoll::initialize()?; let world = universe.world()?;
//! let (rank, size) = (world.rank(), world.size());
//! let right = world.process_at_rank((rank + 1) % size);
//! let left = world.process_at_rank((rank + size - 1) % size);
//! // A ring shift: send to the right, receive from the left.
//! let mine = vec![rank as f64; 1000];
//! let mut theirs = vec![0f64; 1000];
//! let status = world.send_receive_into(&mine, &right, &mut theirs, &left)?;
//! assert_eq!(status.source_rank(), left.rank());
//! assert_eq!(theirs[0], left.rank() as f64);
//! # Ok::<(), gpucoll::Error>(())
//! ```
//!
//! # Design
//!
//! **Matching is MPI's.** Every message starts with an *envelope*
//! (`envelope.rs`): one MPI message with the user's tag on a communicator
//! of its own (an `MPI_Comm_dup` of the communicator's, made at creation,
//! that nothing else uses: `MPI_ANY_TAG` never sees other traffic). The
//! receiving side takes envelopes out of MPI with `MPI_Improbe` on any
//! source and tag, in MPI's order, into a queue (`state.rs`); posted
//! receives, in the order they were posted, take the first queued
//! envelope they match. MPI delivers one source's envelopes in the order
//! they were sent, so non-overtaking holds per (source, tag) whatever
//! the memory and size of each message; `MPI_ANY_SOURCE` and
//! `MPI_ANY_TAG` are MPI's. A probe looks at the queue; a matched probe
//! takes its envelope out of it ([`Message`]). A receive that never
//! matches waits, as in MPI.
//!
//! **The bytes** follow the envelope one of four ways, which the sender
//! picks (`send.rs`): pulled (device memory to a rank of the same node
//! whose GPU maps it, at any size above `GPUCOLL_P2P_EAGER`: the envelope
//! carries a CUDA IPC handle, the receiver copies with a copy engine and
//! answers, which completes the send; memory the driver cannot export
//! (pools, managed, VMM, small allocations) goes inline up to 16 KiB and
//! above that is first copied into a pooled device block that can be);
//! inline in the envelope (up to 16 KiB: a send that completes at once,
//! like MPI's eager messages); local (a message to self: the address);
//! or data messages on a second private communicator, tagged by the
//! pair's sequence number (host memory straight from the buffer; device
//! memory, across nodes or where IPC is off, through pinned blocks in a
//! pipeline). The receiver takes bytes into any memory: host, or any
//! device memory of its GPU (`recv.rs`). Copies run on a stream of the
//! point-to-point side's own, never behind the collectives' stream, and
//! peer mappings are cached (`backend/cuda/peer_mem/p2p.rs`).
//!
//! **Progress** happens inside the calls, as in MPI: any wait or test of
//! a request of a communicator moves every message of that communicator,
//! and now and then those of the other communicators.
//!
//! **Errors.** A message longer than the receive buffer delivers its first
//! bytes and ends in [`Error::Truncated`](crate::Error::Truncated) (the
//! sender completes normally); a rank out of range is
//! [`Error::InvalidRank`](crate::Error::InvalidRank), a tag outside
//! `0..=MPI_TAG_UB` [`Error::InvalidTag`](crate::Error::InvalidTag). A
//! local peer whose process died, or whose failure raised the node's
//! abort word, fails every wait within `GPUCOLL_TIMEOUT` (within 100 ms,
//! in fact), as does [`Communicator::abort`](crate::Communicator::abort); both fail the communicator.
//! Across nodes a dead process is MPI's to report (Open MPI ends the job).
//!
//! **Semantics as MPI's standard mode**: a send may complete before the
//! receive is posted (inline, and data messages MPI buffers) or only once
//! it matched (pulled, local). Host messages up to 16 KiB are always
//! buffered; device messages to a peer on the node are pulled unless
//! `GPUCOLL_P2P_EAGER` buffers them, so two ranks that both send small
//! device messages before they receive need immediate sends, as MPI's
//! standard says. As with a CUDA-aware MPI, a send reads
//! and a receive writes device memory on the point-to-point stream: work
//! of the program's own streams that produces a send buffer or reads a
//! receive buffer is ordered by the program (synchronize before the
//! send; the receive has landed when its wait returns). Under
//! `GPUCOLL_LEGACY_STREAM_ORDER=1` the stream is ordered after the legacy
//! default stream.
//!
//! Not supported: messages queued on a caller's CUDA stream, in a
//! [`Group`](crate::Group) or captured into a CUDA graph (NCCL's grouped
//! `ncclSend`/`ncclRecv`); `MPI_PROC_NULL` (the shim keeps that itself);
//! cancelling a matched receive.

mod api;
mod ctx;
mod envelope;
pub mod raw;
mod recv;
mod request;
mod send;
pub(crate) mod state;

pub use api::{AnyProcess, Message, Source};
pub use raw::RawMessageRequest;
pub use request::ReceiveRequest;

use crate::datatype::Datatype;

/// Whether `data` parses as an envelope (for `crate::fuzzing`).
pub(crate) fn parse_envelope(data: &[u8]) -> bool {
    envelope::Envelope::parse(data).is_ok()
}

/// What a receive (or a probe) learned about its message.
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let mut buf = vec![0u32; 64];
/// let status = world.any_process().receive_into(&mut buf)?;
/// let n = status.count(Datatype::U32).expect("whole u32 elements");
/// println!("{n} elements from rank {} with tag {}", status.source_rank(), status.tag());
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    source: usize,
    tag: i32,
    bytes: u64,
}

impl Status {
    /// The rank that sent the message.
    pub fn source_rank(&self) -> usize {
        self.source
    }

    /// The message's tag.
    pub fn tag(&self) -> i32 {
        self.tag
    }

    /// The message's length in bytes (as sent: longer than the receive
    /// buffer after a truncation).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The message's length in elements of `dtype` (`MPI_Get_count`), None
    /// when it is not a whole number of them (`MPI_UNDEFINED`).
    pub fn count(&self, dtype: Datatype) -> Option<u64> {
        let size = dtype.size() as u64;
        (self.bytes % size == 0).then_some(self.bytes / size)
    }

    /// The status a send completes with (nobody reads it).
    pub(crate) fn sent() -> Status {
        Status {
            source: 0,
            tag: 0,
            bytes: 0,
        }
    }
}

//! The one error type of gpucoll.
//!
//! ```no_run
//! # use gpucoll::prelude::*;
//! # let universe = gpucoll::initialize()?; let world = universe.world()?;
//! let mut x = vec![1.0f32; 1024];
//! match world.all_reduce_in_place(&mut x, ReduceOp::Sum) {
//!     Ok(()) => {}
//!     // A peer died or the ranks issued different calls: this communicator
//!     // is done, the job should stop.
//!     Err(e) if e.is_fatal() => {
//!         eprintln!("rank {}: {e}", world.rank());
//!         std::process::exit(1);
//!     }
//!     // A mistake in this call (length, root, op ...): nothing moved.
//!     Err(e) => return Err(e),
//! }
//! # Ok::<(), gpucoll::Error>(())
//! ```

use crate::datatype::Datatype;

/// Result alias used throughout gpucoll.
///
/// ```
/// use gpucoll::{Datatype, ReduceOp, Result};
///
/// fn checked_op(name: &str, dtype: Datatype) -> Result<ReduceOp> {
///     let op = ReduceOp::parse(name).unwrap_or(ReduceOp::Sum);
///     op.validate(dtype)?;
///     Ok(op)
/// }
/// assert_eq!(checked_op("max", Datatype::F32), Ok(ReduceOp::Max));
/// assert!(checked_op("band", Datatype::F32).is_err());
/// ```
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in a gpucoll call.
///
/// Argument errors (`InvalidRoot`, `BufferLength`, ...) are detected locally,
/// before any data moves, and leave the communicator usable. Errors that only
/// the ranks together can see (`MismatchedCall`, `Timeout`, `PeerFailed`)
/// leave the communicator failed: later calls return `CommunicatorFailed`.
///
/// Match on the variant to react, and ask [`is_fatal`](Error::is_fatal)
/// whether the communicator can still be used:
///
/// ```
/// use gpucoll::{Datatype, Error, ReduceOp};
///
/// let err = ReduceOp::BitAnd.validate(Datatype::F64).unwrap_err();
/// match &err {
///     Error::InvalidOp { dtype, .. } => assert_eq!(*dtype, Datatype::F64),
///     other => panic!("unexpected error: {other}"),
/// }
/// // An argument error: nothing moved, the communicator stays usable.
/// assert!(!err.is_fatal());
/// assert_eq!(err.to_string(), "reduction band (integer types only) is not defined for f64");
///
/// let timeout = Error::Timeout { seq: 7, seconds: 300.0, waiting_for: "rank 3".into() };
/// assert!(timeout.is_fatal());
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An MPI call returned an error code.
    #[error("MPI call {call} failed with error code {code}: {message}")]
    Mpi {
        call: &'static str,
        code: i32,
        message: String,
    },
    /// The MPI library is not initialized or already finalized.
    #[error("MPI is not usable: {0}")]
    MpiState(String),
    /// A root rank outside `0..size`.
    #[error("root {root} is out of range for a communicator of size {size}")]
    InvalidRoot { root: usize, size: usize },
    /// A rank outside `0..size` (for `process_at_rank`, `split` keys, ...).
    #[error("rank {rank} is out of range for a communicator of size {size}")]
    InvalidRank { rank: usize, size: usize },
    /// A buffer whose length does not match what the collective needs.
    #[error("{buffer} buffer holds {actual} elements but the call needs {expected}")]
    BufferLength {
        buffer: &'static str,
        expected: u64,
        actual: u64,
    },
    /// A buffer length that must be a multiple of the communicator size.
    #[error(
        "{buffer} buffer holds {len} elements, not a multiple of the communicator size {size}"
    )]
    NotDivisible {
        buffer: &'static str,
        len: u64,
        size: usize,
    },
    /// Send and receive buffers of different element types.
    #[error("send buffer holds {send} but receive buffer holds {recv}")]
    TypeMismatch { send: Datatype, recv: Datatype },
    /// The reduction op cannot be applied to this datatype.
    #[error("reduction {op} is not defined for {dtype}")]
    InvalidOp { op: String, dtype: Datatype },
    /// Send and receive buffers overlap where the call forbids it.
    #[error("send and receive buffers overlap; use the in-place form of this collective")]
    Aliasing,
    /// Misuse of an in-place form (for example, a length that cannot hold the result).
    #[error("invalid in-place call: {0}")]
    InPlace(String),
    /// A buffer lives in memory the selected backend cannot use.
    #[error("{0}")]
    WrongMemory(String),
    /// The communicator was freed (explicitly, or the environment was finalized).
    #[error("the communicator has been freed")]
    CommunicatorFreed,
    /// An earlier collective failed and left the communicator unusable.
    #[error("the communicator failed earlier and can no longer be used: {0}")]
    CommunicatorFailed(String),
    /// The call was used where it cannot be (for example a collective inside a group of another communicator).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// `GPUCOLL_CHECK=1` found ranks that disagree about the call.
    #[error("ranks disagree about collective #{seq}: {detail}")]
    MismatchedCall { seq: u64, detail: String },
    /// The data stream from a peer does not match this rank's call (detected by the transport).
    #[error("peer rank {peer} sent data for a different call ({detail}); the ranks issued different collectives")]
    ProtocolMismatch { peer: usize, detail: String },
    /// No progress within `GPUCOLL_TIMEOUT`.
    #[error("collective #{seq} made no progress for {seconds:.1} s (GPUCOLL_TIMEOUT); a peer is dead, slow, or issued a different call: {waiting_for}")]
    Timeout {
        seq: u64,
        seconds: f64,
        waiting_for: String,
    },
    /// Another rank failed (or aborted) and told us.
    #[error("a peer failed or aborted: {0}")]
    PeerFailed(String),
    /// `Communicator::abort` was called.
    #[error("the communicator was aborted")]
    Aborted,
    /// A bad environment variable or configuration value.
    #[error("invalid configuration {name}={value}: {reason}")]
    Config {
        name: &'static str,
        value: String,
        reason: String,
    },
    /// An operating-system call failed (shared memory, threads, ...).
    #[error("{call} failed: {message}")]
    System { call: &'static str, message: String },
    /// A backend-specific failure (other than a CUDA driver call).
    #[error("backend error: {0}")]
    Backend(String),
    /// A CUDA driver call returned an error code (`CUresult`).
    #[error("{call} failed: {name} (CUresult {code})")]
    Cuda {
        call: &'static str,
        /// The `CUresult` value.
        code: i32,
        /// Its name (`CUDA_ERROR_...`).
        name: String,
    },
    /// An allocation (device, pinned or registered host memory) failed for
    /// lack of memory. Nothing was launched: the communicator stays usable.
    #[error("out of memory: {call} of {bytes} bytes failed")]
    OutOfMemory { call: &'static str, bytes: u64 },
    /// A message longer than the receive buffer (MPI's `MPI_ERR_TRUNCATE`):
    /// its first `capacity` bytes were received, the rest dropped; the
    /// fields are the message's status.
    #[error("a message of {bytes} bytes from rank {source_rank} (tag {tag}) was truncated to the receive buffer's {capacity} bytes")]
    Truncated {
        source_rank: usize,
        tag: i32,
        bytes: u64,
        capacity: u64,
    },
    /// A point-to-point tag outside `0..=max` (`max` is MPI's `MPI_TAG_UB`).
    #[error("tag {tag} is out of range (0..={max})")]
    InvalidTag { tag: i32, max: i32 },
    /// A count too large for this platform or transport.
    #[error("count {0} is too large")]
    CountTooLarge(u64),
}

impl Error {
    /// Whether this error leaves the communicator unusable.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::MismatchedCall { .. }
                | Error::ProtocolMismatch { .. }
                | Error::Timeout { .. }
                | Error::PeerFailed(_)
                | Error::Aborted
                | Error::CommunicatorFailed(_)
                | Error::System { .. }
                | Error::Backend(_)
                | Error::Cuda { .. }
        )
    }

    /// Whether the error is a lack of memory: an allocation that failed
    /// ([`Error::OutOfMemory`]) or any other driver call that reported
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Error::OutOfMemory { .. }
                | Error::Cuda {
                    code: CUDA_ERROR_OUT_OF_MEMORY,
                    ..
                }
        )
    }
}

/// `CUDA_ERROR_OUT_OF_MEMORY`, a stable value of the CUDA driver API.
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_matchable_and_not_fatal() {
        let oom = Error::OutOfMemory {
            call: "cuMemAlloc",
            bytes: 1 << 40,
        };
        assert!(oom.is_out_of_memory());
        assert!(!oom.is_fatal());
        assert!(oom.to_string().contains("1099511627776 bytes"));
    }

    #[test]
    fn cuda_errors_are_fatal_and_keep_their_code() {
        let e = Error::Cuda {
            call: "cuLaunchKernel",
            code: 719,
            name: "CUDA_ERROR_LAUNCH_FAILED".into(),
        };
        assert!(e.is_fatal());
        assert!(!e.is_out_of_memory());
        assert_eq!(
            e.to_string(),
            "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED (CUresult 719)"
        );
        let late_oom = Error::Cuda {
            call: "cuStreamSynchronize",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        };
        assert!(late_oom.is_out_of_memory());
        assert!(late_oom.is_fatal());
    }
}

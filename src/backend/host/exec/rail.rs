//! A [`Step::Rail`](crate::plan::Step::Rail) on the host backend: this
//! rank's region all-reduced by MPI's own `MPI_Iallreduce` over its rail
//! communicator (one per channel, so channels never interleave their rail
//! calls), polled like the other steps so a channel waiting on MPI does not
//! stop the others.

use crate::datatype::Datatype;
use crate::error::Result;
use crate::mpi::{MpiComm, RailAllReduce};
use crate::op::Combine;

pub(super) struct RailState<'f> {
    comm: &'f MpiComm,
    dst: *mut u8,
    bytes: usize,
    dtype: Datatype,
    combine: Combine,
    req: Option<RailAllReduce>,
}

impl std::fmt::Debug for RailState<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RailState")
            .field("bytes", &self.bytes)
            .field("started", &self.req.is_some())
            .finish()
    }
}

impl<'f> RailState<'f> {
    /// The rail step over `bytes` at `dst` (validated: inside the call's
    /// output or scratch, writable).
    pub(super) fn new(
        comm: &'f MpiComm,
        dst: *mut u8,
        bytes: usize,
        dtype: Datatype,
        combine: Combine,
    ) -> RailState<'f> {
        RailState {
            comm,
            dst,
            bytes,
            dtype,
            combine,
            req: None,
        }
    }

    /// Start the all-reduce, or see whether it completed (then the result
    /// is in place). Returns (moved, done).
    pub(super) fn poll(&mut self) -> Result<(bool, bool)> {
        let Some(req) = self.req.as_mut() else {
            // SAFETY: `dst` addresses `bytes` bytes of the call's buffers,
            // valid for the launch; no other step of this channel touches
            // them while this one runs.
            let data = unsafe { std::slice::from_raw_parts(self.dst as *const u8, self.bytes) };
            self.req = Some(self.comm.rail_all_reduce(data, self.dtype, self.combine)?);
            return Ok((true, false));
        };
        match req.test()? {
            None => Ok((false, false)),
            Some(out) => {
                // SAFETY: as above; `out` is the request's own buffer of
                // `bytes` bytes, distinct from the caller's memory.
                unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), self.dst, self.bytes) };
                Ok((true, true))
            }
        }
    }
}

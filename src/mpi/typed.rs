//! MPI's own collectives on typed host slices, for [`crate::reference`].
//!
//! Counts above MPI's `int` range are split into pieces (at most the piece
//! limit, `i32::MAX` elements by default) and issued one after another.
//! Callers validate buffer lengths; these functions only re-check what
//! memory safety depends on.

use super::{count_i32, ffi, require_usable, MpiComm};
use crate::datatype::{Datatype, Equivalence};
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use ffi::{MPI_Datatype, MPI_Op};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

static PIECE_LIMIT: AtomicUsize = AtomicUsize::new(i32::MAX as usize);

/// Set the largest element count one MPI call moves (tests of the piece
/// path). Clamped to `1..=i32::MAX`.
pub(crate) fn set_piece_limit(elements: usize) {
    PIECE_LIMIT.store(elements.clamp(1, i32::MAX as usize), Ordering::Relaxed);
}

fn piece_limit() -> usize {
    PIECE_LIMIT
        .load(Ordering::Relaxed)
        .clamp(1, i32::MAX as usize)
}

/// The MPI datatype for a gpucoll datatype. F16 and BF16 have none: they
/// travel as 16-bit units (`MPI_UINT16_T`), good for data movement only.
pub(crate) trait MpiDatatype {
    fn mpi_datatype(self) -> MPI_Datatype;
}

impl MpiDatatype for Datatype {
    fn mpi_datatype(self) -> MPI_Datatype {
        match self {
            Datatype::I8 => ffi::dt_i8(),
            Datatype::U8 => ffi::dt_u8(),
            Datatype::I32 => ffi::dt_i32(),
            Datatype::U32 => ffi::dt_u32(),
            Datatype::I64 => ffi::dt_i64(),
            Datatype::U64 => ffi::dt_u64(),
            Datatype::F32 => ffi::dt_f32(),
            Datatype::F64 => ffi::dt_f64(),
            Datatype::F16 | Datatype::BF16 => ffi::dt_u16(),
        }
    }
}

/// The MPI op for `op` on `dtype`, if MPI has one.
pub(crate) fn mpi_op(op: ReduceOp, dtype: Datatype) -> Result<MPI_Op> {
    let invalid = || Error::InvalidOp {
        op: format!("{op} (no MPI equivalent)"),
        dtype,
    };
    if matches!(dtype, Datatype::F16 | Datatype::BF16) {
        return Err(invalid());
    }
    match op {
        ReduceOp::Sum => Ok(ffi::op_sum()),
        ReduceOp::Prod => Ok(ffi::op_prod()),
        ReduceOp::Min => Ok(ffi::op_min()),
        ReduceOp::Max => Ok(ffi::op_max()),
        ReduceOp::Avg | ReduceOp::PreMulSum(_) => Err(invalid()),
        _ if dtype.is_float() => Err(Error::InvalidOp {
            op: format!("{op} (integer types only)"),
            dtype,
        }),
        ReduceOp::BitAnd => Ok(ffi::op_band()),
        ReduceOp::BitOr => Ok(ffi::op_bor()),
        ReduceOp::BitXor => Ok(ffi::op_bxor()),
        ReduceOp::LogicalAnd => Ok(ffi::op_land()),
        ReduceOp::LogicalOr => Ok(ffi::op_lor()),
        ReduceOp::LogicalXor => Ok(ffi::op_lxor()),
    }
}

fn dt_of<T: Equivalence>() -> MPI_Datatype {
    T::DATATYPE.mpi_datatype()
}

fn len_err(buffer: &'static str, expected: usize, actual: usize) -> Error {
    Error::BufferLength {
        buffer,
        expected: expected as u64,
        actual: actual as u64,
    }
}

/// Pieces `[off, off + len)` covering `0..n`, each at most `limit` long.
fn pieces(n: usize, limit: usize) -> impl Iterator<Item = (usize, usize)> {
    let limit = limit.max(1);
    (0..n)
        .step_by(limit)
        .map(move |off| (off, limit.min(n - off)))
}

/// Copy elements `[off, off + k)` of each of the `size` blocks of length
/// `n` in `src` into one contiguous buffer.
fn pack<T: Copy>(src: &[T], n: usize, off: usize, k: usize, size: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(k * size);
    for r in 0..size {
        out.extend_from_slice(&src[r * n + off..r * n + off + k]);
    }
    out
}

/// The inverse of [`pack`].
fn unpack<T: Copy>(tmp: &[T], dst: &mut [T], n: usize, off: usize, k: usize, size: usize) {
    for r in 0..size {
        dst[r * n + off..r * n + off + k].copy_from_slice(&tmp[r * k..(r + 1) * k]);
    }
}

impl MpiComm {
    fn total(&self, n: usize) -> Result<usize> {
        n.checked_mul(self.size)
            .ok_or(Error::CountTooLarge(n as u64))
    }

    /// The piece length for block-strided collectives (bounded temporaries).
    fn strided_piece(&self) -> usize {
        piece_limit().min(((1usize << 28) / self.size.max(1)).max(1))
    }

    /// `MPI_Allreduce`; `send` and `recv` of equal length.
    pub(crate) fn all_reduce_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        require_usable("MPI_Allreduce")?;
        let mop = mpi_op(op, T::DATATYPE)?;
        if recv.len() != send.len() {
            return Err(len_err("receive", send.len(), recv.len()));
        }
        for (off, k) in pieces(send.len(), piece_limit()) {
            let k = count_i32(k)?;
            // SAFETY: [off, off+k) lies within both slices (equal lengths);
            // the call is blocking and the slices outlive it.
            let rc = unsafe {
                ffi::PMPI_Allreduce(
                    send.as_ptr().add(off) as *const c_void,
                    recv.as_mut_ptr().add(off) as *mut c_void,
                    k,
                    dt_of::<T>(),
                    mop,
                    self.raw,
                )
            };
            ffi::check("MPI_Allreduce", rc)?;
        }
        Ok(())
    }

    /// `MPI_Reduce` to `root`; `recv` (length of `send`) is only used at the root.
    pub(crate) fn reduce_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        require_usable("MPI_Reduce")?;
        self.check_root(root)?;
        let mop = mpi_op(op, T::DATATYPE)?;
        let is_root = self.rank == root;
        if is_root && recv.len() != send.len() {
            return Err(len_err("receive", send.len(), recv.len()));
        }
        for (off, k) in pieces(send.len(), piece_limit()) {
            let k = count_i32(k)?;
            let out = if is_root {
                // SAFETY: at the root `recv` has the length of `send`, so `off` is in bounds.
                unsafe { recv.as_mut_ptr().add(off) }
            } else {
                recv.as_mut_ptr()
            };
            // SAFETY: [off, off+k) lies within `send` (and `recv` at the root;
            // MPI ignores the receive buffer elsewhere); the call is blocking.
            let rc = unsafe {
                ffi::PMPI_Reduce(
                    send.as_ptr().add(off) as *const c_void,
                    out as *mut c_void,
                    k,
                    dt_of::<T>(),
                    mop,
                    root as c_int,
                    self.raw,
                )
            };
            ffi::check("MPI_Reduce", rc)?;
        }
        Ok(())
    }

    /// `MPI_Scan` (`exclusive == false`) or `MPI_Exscan`; `send` and
    /// `recv` of equal length. Element-wise, so pieces of a long vector are
    /// independent scans.
    pub(crate) fn scan_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        exclusive: bool,
    ) -> Result<()> {
        let name = if exclusive { "MPI_Exscan" } else { "MPI_Scan" };
        require_usable(name)?;
        let mop = mpi_op(op, T::DATATYPE)?;
        if recv.len() != send.len() {
            return Err(len_err("receive", send.len(), recv.len()));
        }
        for (off, k) in pieces(send.len(), piece_limit()) {
            let k = count_i32(k)?;
            let (s, r) = (
                // SAFETY: [off, off+k) lies within both slices (equal lengths).
                unsafe { send.as_ptr().add(off) } as *const c_void,
                // SAFETY: as above.
                unsafe { recv.as_mut_ptr().add(off) } as *mut c_void,
            );
            // SAFETY: `s` and `r` address k elements of their slices; the
            // call is blocking and the slices outlive it.
            let rc = unsafe {
                if exclusive {
                    ffi::PMPI_Exscan(s, r, k, dt_of::<T>(), mop, self.raw)
                } else {
                    ffi::PMPI_Scan(s, r, k, dt_of::<T>(), mop, self.raw)
                }
            };
            ffi::check(name, rc)?;
        }
        Ok(())
    }

    /// `MPI_Bcast` of a typed buffer from `root`.
    pub(crate) fn bcast_typed<T: Equivalence>(&self, buf: &mut [T], root: usize) -> Result<()> {
        require_usable("MPI_Bcast")?;
        self.check_root(root)?;
        for (off, k) in pieces(buf.len(), piece_limit()) {
            let k = count_i32(k)?;
            // SAFETY: [off, off+k) lies within `buf`; the call is blocking.
            let rc = unsafe {
                ffi::PMPI_Bcast(
                    buf.as_mut_ptr().add(off) as *mut c_void,
                    k,
                    dt_of::<T>(),
                    root as c_int,
                    self.raw,
                )
            };
            ffi::check("MPI_Bcast", rc)?;
        }
        Ok(())
    }

    /// One `MPI_Allgather` of `n` elements per rank.
    fn allgather_raw<T: Equivalence>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        // Nothing to move: skipping on every rank alike keeps the call
        // collective, and avoids MPI rejecting two empty slices that share
        // one dangling address as aliased buffers.
        if send.is_empty() {
            return Ok(());
        }
        let n = count_i32(send.len())?;
        debug_assert_eq!(recv.len(), send.len() * self.size);
        // SAFETY: `send` holds n elements, `recv` n*size; the call is blocking.
        let rc = unsafe {
            ffi::PMPI_Allgather(
                send.as_ptr() as *const c_void,
                n,
                dt_of::<T>(),
                recv.as_mut_ptr() as *mut c_void,
                n,
                dt_of::<T>(),
                self.raw,
            )
        };
        ffi::check("MPI_Allgather", rc)
    }

    /// `MPI_Allgather`: `recv` holds `size * send.len()` elements.
    pub(crate) fn all_gather_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
    ) -> Result<()> {
        require_usable("MPI_Allgather")?;
        let n = send.len();
        let total = self.total(n)?;
        if recv.len() != total {
            return Err(len_err("receive", total, recv.len()));
        }
        if n <= piece_limit() {
            return self.allgather_raw(send, recv);
        }
        let size = self.size;
        for (off, k) in pieces(n, self.strided_piece()) {
            let mut tmp = vec![send[0]; k * size];
            self.allgather_raw(&send[off..off + k], &mut tmp)?;
            unpack(&tmp, recv, n, off, k, size);
        }
        Ok(())
    }

    /// One `MPI_Reduce_scatter_block` of `k` elements per rank.
    fn reduce_scatter_raw<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
        mop: MPI_Op,
    ) -> Result<()> {
        if recv.is_empty() {
            return Ok(());
        }
        let k = count_i32(recv.len())?;
        debug_assert_eq!(send.len(), recv.len() * self.size);
        // SAFETY: `send` holds k*size elements, `recv` k; the call is blocking.
        let rc = unsafe {
            ffi::PMPI_Reduce_scatter_block(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                k,
                dt_of::<T>(),
                mop,
                self.raw,
            )
        };
        ffi::check("MPI_Reduce_scatter_block", rc)
    }

    /// `MPI_Reduce_scatter_block`: `send` holds `size * recv.len()` elements.
    pub(crate) fn reduce_scatter_block_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        require_usable("MPI_Reduce_scatter_block")?;
        let mop = mpi_op(op, T::DATATYPE)?;
        let n = recv.len();
        let total = self.total(n)?;
        if send.len() != total {
            return Err(len_err("send", total, send.len()));
        }
        if n <= piece_limit() {
            return self.reduce_scatter_raw(send, recv, mop);
        }
        for (off, k) in pieces(n, self.strided_piece()) {
            let tmp = pack(send, n, off, k, self.size);
            self.reduce_scatter_raw(&tmp, &mut recv[off..off + k], mop)?;
        }
        Ok(())
    }

    /// One `MPI_Alltoall` of `k` elements per pair.
    fn alltoall_raw<T: Equivalence>(&self, send: &[T], recv: &mut [T], k: usize) -> Result<()> {
        // Nothing to move: skipping on every rank alike keeps the call
        // collective, and avoids MPI rejecting two empty slices that share
        // one dangling address as aliased buffers.
        if k == 0 {
            return Ok(());
        }
        let kc = count_i32(k)?;
        debug_assert_eq!(send.len(), k * self.size);
        debug_assert_eq!(recv.len(), k * self.size);
        // SAFETY: both buffers hold k*size elements; the call is blocking.
        let rc = unsafe {
            ffi::PMPI_Alltoall(
                send.as_ptr() as *const c_void,
                kc,
                dt_of::<T>(),
                recv.as_mut_ptr() as *mut c_void,
                kc,
                dt_of::<T>(),
                self.raw,
            )
        };
        ffi::check("MPI_Alltoall", rc)
    }

    /// `MPI_Alltoall`: both buffers hold `size * n` elements.
    pub(crate) fn all_to_all_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
    ) -> Result<()> {
        require_usable("MPI_Alltoall")?;
        let size = self.size.max(1);
        if send.len() % size != 0 {
            return Err(Error::NotDivisible {
                buffer: "send",
                len: send.len() as u64,
                size,
            });
        }
        if recv.len() != send.len() {
            return Err(len_err("receive", send.len(), recv.len()));
        }
        let n = send.len() / size;
        if n <= piece_limit() {
            return self.alltoall_raw(send, recv, n);
        }
        for (off, k) in pieces(n, self.strided_piece()) {
            let tmp_send = pack(send, n, off, k, size);
            let mut tmp_recv = vec![send[0]; k * size];
            self.alltoall_raw(&tmp_send, &mut tmp_recv, k)?;
            unpack(&tmp_recv, recv, n, off, k, size);
        }
        Ok(())
    }

    /// One `MPI_Gather` of `send.len()` elements per rank; `recv` used at the root.
    fn gather_raw<T: Equivalence>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        // Nothing to move: skipping on every rank alike keeps the call
        // collective, and avoids MPI rejecting two empty slices that share
        // one dangling address as aliased buffers.
        if send.is_empty() {
            return Ok(());
        }
        let n = count_i32(send.len())?;
        // SAFETY: `send` holds n elements; at the root `recv` holds n*size
        // (checked by the caller), elsewhere MPI ignores it; blocking call.
        let rc = unsafe {
            ffi::PMPI_Gather(
                send.as_ptr() as *const c_void,
                n,
                dt_of::<T>(),
                recv.as_mut_ptr() as *mut c_void,
                n,
                dt_of::<T>(),
                root as c_int,
                self.raw,
            )
        };
        ffi::check("MPI_Gather", rc)
    }

    /// `MPI_Gather` to `root`: at the root `recv` holds `size * send.len()` elements.
    pub(crate) fn gather_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        require_usable("MPI_Gather")?;
        self.check_root(root)?;
        let n = send.len();
        let total = self.total(n)?;
        let is_root = self.rank == root;
        if is_root && recv.len() != total {
            return Err(len_err("receive", total, recv.len()));
        }
        if n <= piece_limit() {
            return self.gather_raw(send, recv, root);
        }
        for (off, k) in pieces(n, self.strided_piece()) {
            if is_root {
                let mut tmp = vec![send[0]; k * self.size];
                self.gather_raw(&send[off..off + k], &mut tmp, root)?;
                unpack(&tmp, recv, n, off, k, self.size);
            } else {
                self.gather_raw(&send[off..off + k], &mut [], root)?;
            }
        }
        Ok(())
    }

    /// One `MPI_Scatter` of `recv.len()` elements per rank; `send` used at the root.
    fn scatter_raw<T: Equivalence>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        // Nothing to move: skipping on every rank alike keeps the call
        // collective, and avoids MPI rejecting two empty slices that share
        // one dangling address as aliased buffers.
        if recv.is_empty() {
            return Ok(());
        }
        let n = count_i32(recv.len())?;
        // SAFETY: `recv` holds n elements; at the root `send` holds n*size
        // (checked by the caller), elsewhere MPI ignores it; blocking call.
        let rc = unsafe {
            ffi::PMPI_Scatter(
                send.as_ptr() as *const c_void,
                n,
                dt_of::<T>(),
                recv.as_mut_ptr() as *mut c_void,
                n,
                dt_of::<T>(),
                root as c_int,
                self.raw,
            )
        };
        ffi::check("MPI_Scatter", rc)
    }

    /// `MPI_Scatter` from `root`: at the root `send` holds `size * recv.len()` elements.
    pub(crate) fn scatter_typed<T: Equivalence>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        require_usable("MPI_Scatter")?;
        self.check_root(root)?;
        let n = recv.len();
        let total = self.total(n)?;
        let is_root = self.rank == root;
        if is_root && send.len() != total {
            return Err(len_err("send", total, send.len()));
        }
        if n <= piece_limit() {
            return self.scatter_raw(send, recv, root);
        }
        for (off, k) in pieces(n, self.strided_piece()) {
            if is_root {
                let tmp = pack(send, n, off, k, self.size);
                self.scatter_raw(&tmp, &mut recv[off..off + k], root)?;
            } else {
                self.scatter_raw(&[], &mut recv[off..off + k], root)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_range() {
        let v: Vec<_> = pieces(10, 4).collect();
        assert_eq!(v, vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(pieces(0, 4).count(), 0);
        assert_eq!(pieces(3, 0).count(), 3);
    }

    #[test]
    fn pack_unpack_round_trip() {
        let src: Vec<u32> = (0..12).collect(); // 3 blocks of 4
        let p = pack(&src, 4, 1, 2, 3);
        assert_eq!(p, vec![1, 2, 5, 6, 9, 10]);
        let mut dst = vec![0u32; 12];
        unpack(&p, &mut dst, 4, 1, 2, 3);
        assert_eq!(dst, vec![0, 1, 2, 0, 0, 5, 6, 0, 0, 9, 10, 0]);
    }

    #[test]
    fn ops_without_mpi_equivalent() {
        assert!(mpi_op(ReduceOp::Avg, Datatype::F32).is_err());
        assert!(mpi_op(ReduceOp::PreMulSum(2.0), Datatype::I32).is_err());
        assert!(mpi_op(ReduceOp::Sum, Datatype::F16).is_err());
        assert!(mpi_op(ReduceOp::Max, Datatype::BF16).is_err());
    }
}

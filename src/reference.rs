//! MPI's own collectives on host slices: the oracle of the tests and the
//! `--vs-mpi` comparison of the bench.
//!
//! Every function runs the MPI collective of the same name on the
//! communicator's private MPI duplicate (never through gpucoll's engine), so
//! it must be called on all ranks, like any collective. Reductions exist
//! only where MPI has them: `Sum`, `Prod`, `Min` and `Max` on the eight
//! integer and IEEE types, and the bitwise and logical ops (`MPI_BAND` ...
//! `MPI_LXOR`) on the six integer types. `Avg`, `PreMulSum`, bitwise or
//! logical ops on floats and any reduction of `f16` or `bf16` return
//! [`Error::InvalidOp`]; compute those references from
//! [`all_gather`]ed inputs. Data movement works for all ten types (`f16` and
//! `bf16` travel as 16-bit units).
//!
//! Counts above MPI's `int` range are split into several MPI calls.
//!
//! ```no_run
//! use gpucoll::{reference, ReduceOp};
//!
//! let universe = gpucoll::initialize()?;
//! let world = universe.world()?;
//! let send = vec![1.0f32; 16];
//! let mut expected = vec![0.0f32; 16];
//! reference::all_reduce(&world, &send, &mut expected, ReduceOp::Sum)?;
//! assert_eq!(expected[0], world.size() as f32);
//! # Ok::<(), gpucoll::Error>(())
//! ```

use crate::comm::Communicator;
use crate::datatype::Equivalence;
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::op::ReduceOp;

fn mpi_of(comm: &Communicator) -> Result<&MpiComm> {
    Ok(&comm.inner_checked()?.mpi)
}

fn check_len(buffer: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(Error::BufferLength {
            buffer,
            expected: expected as u64,
            actual: actual as u64,
        });
    }
    Ok(())
}

fn check_root(comm: &Communicator, root: usize) -> Result<()> {
    if root >= comm.size() {
        return Err(Error::InvalidRoot {
            root,
            size: comm.size(),
        });
    }
    Ok(())
}

fn times_size(comm: &Communicator, n: usize) -> Result<usize> {
    n.checked_mul(comm.size())
        .ok_or(Error::CountTooLarge(n as u64))
}

/// `MPI_Allreduce`: `recv[i]` = `op` over every rank's `send[i]`.
/// Both slices have the same length.
pub fn all_reduce<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_len("receive", send.len(), recv.len())?;
    mpi.all_reduce_typed(send, recv, op)
}

/// `MPI_Reduce` to `root`. At the root `recv` has the length of `send`;
/// elsewhere `recv` is not touched (its length does not matter).
pub fn reduce<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_root(comm, root)?;
    if comm.rank() == root {
        check_len("receive", send.len(), recv.len())?;
    }
    mpi.reduce_typed(send, recv, op, root)
}

/// `MPI_Bcast`: every rank's `buf` receives the root's (equal lengths on all ranks).
pub fn broadcast<T: Equivalence>(comm: &Communicator, buf: &mut [T], root: usize) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_root(comm, root)?;
    mpi.bcast_typed(buf, root)
}

/// `MPI_Allgather`: `recv` holds `size * send.len()` elements, rank `r`'s
/// contribution at `r * send.len()`.
pub fn all_gather<T: Equivalence>(comm: &Communicator, send: &[T], recv: &mut [T]) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_len("receive", times_size(comm, send.len())?, recv.len())?;
    mpi.all_gather_typed(send, recv)
}

/// `MPI_Reduce_scatter_block`: `send` holds `size * recv.len()` elements;
/// rank `r` receives block `r` of the element-wise reduction.
pub fn reduce_scatter_block<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_len("send", times_size(comm, recv.len())?, send.len())?;
    mpi.reduce_scatter_block_typed(send, recv, op)
}

/// `MPI_Alltoall`: both buffers hold `size * n` elements; block `j` of
/// rank `i`'s `send` lands in block `i` of rank `j`'s `recv`.
pub fn all_to_all<T: Equivalence>(comm: &Communicator, send: &[T], recv: &mut [T]) -> Result<()> {
    let mpi = mpi_of(comm)?;
    if send.len() % comm.size().max(1) != 0 {
        return Err(Error::NotDivisible {
            buffer: "send",
            len: send.len() as u64,
            size: comm.size(),
        });
    }
    check_len("receive", send.len(), recv.len())?;
    mpi.all_to_all_typed(send, recv)
}

/// `MPI_Gather` to `root`: at the root `recv` holds `size * send.len()`
/// elements; elsewhere `recv` is not touched.
pub fn gather<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    recv: &mut [T],
    root: usize,
) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_root(comm, root)?;
    if comm.rank() == root {
        check_len("receive", times_size(comm, send.len())?, recv.len())?;
    }
    mpi.gather_typed(send, recv, root)
}

/// `MPI_Scatter` from `root`: at the root `send` holds `size * recv.len()`
/// elements (block `r` goes to rank `r`); elsewhere `send` is not read.
pub fn scatter<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    recv: &mut [T],
    root: usize,
) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_root(comm, root)?;
    if comm.rank() == root {
        check_len("send", times_size(comm, recv.len())?, send.len())?;
    }
    mpi.scatter_typed(send, recv, root)
}

/// `MPI_Barrier`.
pub fn barrier(comm: &Communicator) -> Result<()> {
    mpi_of(comm)?.barrier()
}

/// Test hook: the largest element count one MPI call of this module moves
/// (default `i32::MAX`), so that tests can exercise the split into pieces
/// with small buffers. Process-wide; clamped to `1..=i32::MAX`.
#[doc(hidden)]
pub fn set_piece_limit(elements: usize) {
    crate::mpi::set_piece_limit(elements);
}

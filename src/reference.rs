//! MPI's own collectives on host slices: the oracle of the tests and the
//! `--vs-mpi` comparison of the bench.
//!
//! [`send`], [`receive`] and [`send_receive`] are MPI's own point-to-point
//! messages, the oracle of gpucoll's (`crate::p2p`).
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

/// `MPI_Scan`: `recv[i]` of rank r = `op` over `send[i]` of ranks 0..=r.
/// Both slices have the same length.
pub fn scan<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_len("receive", send.len(), recv.len())?;
    mpi.scan_typed(send, recv, op, false)
}

/// `MPI_Exscan`: `recv[i]` of rank r > 0 = `op` over `send[i]` of ranks
/// 0..r. Rank 0's `recv` is whatever MPI leaves there (undefined by MPI).
/// Both slices have the same length.
pub fn exclusive_scan<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    recv: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let mpi = mpi_of(comm)?;
    check_len("receive", send.len(), recv.len())?;
    mpi.scan_typed(send, recv, op, true)
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

/// The bytes of a typed slice (every `Equivalence` type is plain data).
fn bytes_of<T: Equivalence>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is one of the ten plain element types (no padding, any
    // bit pattern valid); the view covers exactly the slice's memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn bytes_of_mut<T: Equivalence>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as for `bytes_of`; any bytes written are a valid `T`.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// What [`receive`] and [`send_receive`] learned: the source, the tag and
/// the bytes of the message (MPI's status).
pub type Received = crate::mpi::Received;

/// `MPI_Send` of `buf` to `dest` with `tag` (blocking, MPI's own
/// point-to-point on the communicator's private duplicate: the oracle of
/// gpucoll's messages).
pub fn send<T: Equivalence>(comm: &Communicator, buf: &[T], dest: usize, tag: i32) -> Result<()> {
    mpi_of(comm)?.send_bytes(bytes_of(buf), dest, tag)
}

/// `MPI_Recv` into `buf`; `None` is any source / any tag. A longer
/// message is MPI's truncation error ([`Error::Mpi`]).
pub fn receive<T: Equivalence>(
    comm: &Communicator,
    buf: &mut [T],
    source: Option<usize>,
    tag: Option<i32>,
) -> Result<Received> {
    mpi_of(comm)?.recv_bytes(bytes_of_mut(buf), source, tag)
}

/// `MPI_Sendrecv`.
pub fn send_receive<T: Equivalence>(
    comm: &Communicator,
    send: &[T],
    dest: usize,
    send_tag: i32,
    recv: &mut [T],
    source: Option<usize>,
    recv_tag: Option<i32>,
) -> Result<Received> {
    mpi_of(comm)?.sendrecv_bytes(
        bytes_of(send),
        dest,
        send_tag,
        bytes_of_mut(recv),
        source,
        recv_tag,
    )
}

/// Test hook: the largest element count one MPI call of this module moves
/// (default `i32::MAX`), so that tests can exercise the split into pieces
/// with small buffers. Process-wide; clamped to `1..=i32::MAX`.
#[doc(hidden)]
pub fn set_piece_limit(elements: usize) {
    crate::mpi::set_piece_limit(elements);
}

//! `--vs-mpi`: time MPI's own collective (gpucoll::reference) on the same
//! host data, in the same run.

use crate::args::Args;
use crate::data::{Case, Elem};
use crate::report::MpiMeasure;
use gpucoll::{reference, CollKind, Communicator, Error};

/// One out-of-place call of MPI's collective for `case`.
fn call<T: Elem>(
    world: &Communicator,
    case: &Case,
    send: &[T],
    recv: &mut [T],
) -> gpucoll::Result<()> {
    let s = &send[..case.input_len()];
    let out_len = case.output_len();
    match case.kind {
        CollKind::AllReduce => reference::all_reduce(world, s, &mut recv[..out_len], case.op),
        CollKind::Reduce => reference::reduce(world, s, &mut recv[..out_len], case.op, case.root),
        CollKind::Broadcast => reference::broadcast(world, &mut recv[..case.count], case.root),
        CollKind::AllGather => reference::all_gather(world, s, &mut recv[..out_len]),
        CollKind::ReduceScatter => {
            reference::reduce_scatter_block(world, s, &mut recv[..out_len], case.op)
        }
        CollKind::AllToAll => reference::all_to_all(world, s, &mut recv[..out_len]),
        CollKind::Gather => reference::gather(world, s, &mut recv[..out_len], case.root),
        CollKind::Scatter => reference::scatter(world, s, &mut recv[..out_len], case.root),
        CollKind::Scan => reference::scan(world, s, &mut recv[..out_len], case.op),
        CollKind::ExclusiveScan => {
            reference::exclusive_scan(world, s, &mut recv[..out_len], case.op)
        }
    }
}

/// Time MPI's collective like gpucoll's (warmup, barrier, mean of `iters`
/// calls, max over ranks). Reductions MPI lacks (f16/bf16, avg, premulsum)
/// give [`MpiMeasure::Unsupported`] on every rank alike.
pub fn measure<T: Elem>(
    world: &Communicator,
    args: &Args,
    case: &Case,
    send: &[T],
    recv: &mut [T],
) -> Result<MpiMeasure, String> {
    if case.kind == CollKind::Broadcast && case.is_root() {
        recv[..case.count].copy_from_slice(&send[..case.count]);
    }
    // A first untimed call tells whether MPI can do it at all.
    match call(world, case, send, recv) {
        Ok(()) => {}
        Err(Error::InvalidOp { .. }) => return Ok(MpiMeasure::Unsupported),
        Err(e) => return Err(format!("MPI reference collective: {e}")),
    }
    let mut run = || call(world, case, send, recv).map_err(|e| format!("MPI reference: {e}"));
    let t = crate::timing::time_calls(world, args, 0, &mut run)?;
    Ok(MpiMeasure::Time(t.secs * 1e6))
}

//! An rsmpi program hands its communicator to gpucoll (feature `rsmpi`).
//!
//! MPI is initialized and finalized by rsmpi; gpucoll takes a duplicate of
//! rsmpi's world, runs an all_reduce and a broadcast on it (on the GPU when
//! there is one, else on host memory), and the results are compared with
//! rsmpi's own MPI collectives on host copies.
//!
//! ```text
//! cargo build --release --example rsmpi_handover --features rsmpi
//! mpirun -n 2 target/release/examples/rsmpi_handover
//! ```

use gpucoll::prelude::*;
use mpi::collective::SystemOperation;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};

fn main() {
    let universe = mpi::initialize().expect("MPI initialized once");
    let world = universe.world();
    let code = match run(&world) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rank {}: {e}", world.rank());
            1
        }
    };
    // gpucoll's communicator was dropped inside `run`, before `universe`.
    if code != 0 {
        world.abort(code);
    }
}

fn run(world: &mpi::topology::SimpleCommunicator) -> gpucoll::Result<()> {
    let comm = gpucoll::Communicator::from_rsmpi(world)?;
    let n = 1 << 16;
    let mine: Vec<f64> = (0..n)
        .map(|j| (comm.rank() * 1000 + j % 977) as f64)
        .collect();

    // gpucoll's all_reduce (device memory when there is a GPU).
    let got = on_device_or_host(&comm, &mine, |c, buf| match buf {
        Buf::Host(v) => c.all_reduce_in_place(v, ReduceOp::Sum),
        #[cfg(feature = "cuda")]
        Buf::Dev(d) => c.all_reduce_in_place(d, ReduceOp::Sum),
    })?;
    // rsmpi's (MPI's own) all_reduce on host memory: the oracle.
    let mut want = vec![0f64; n];
    world.all_reduce_into(&mine[..], &mut want[..], SystemOperation::sum());
    if got != want {
        return Err(gpucoll::Error::InvalidUsage(
            "all_reduce differs from MPI's".into(),
        ));
    }

    let root = comm.size() - 1;
    let start: Vec<f64> = if comm.rank() == root {
        mine.clone()
    } else {
        vec![0.0; n]
    };
    let got = on_device_or_host(&comm, &start, |c, buf| match buf {
        Buf::Host(v) => c.process_at_rank(root).broadcast_into(v),
        #[cfg(feature = "cuda")]
        Buf::Dev(d) => c.process_at_rank(root).broadcast_into(d),
    })?;
    let mut want = start.clone();
    world
        .process_at_rank(root as i32)
        .broadcast_into(&mut want[..]);
    if got != want {
        return Err(gpucoll::Error::InvalidUsage(
            "broadcast differs from MPI's".into(),
        ));
    }
    if comm.rank() == 0 {
        println!(
            "rsmpi handover: {} ranks on the {} backend, all_reduce and broadcast of {n} f64 match MPI's",
            comm.size(),
            comm.backend_name()
        );
    }
    Ok(())
}

enum Buf<'a> {
    Host(&'a mut Vec<f64>),
    #[cfg(feature = "cuda")]
    Dev(&'a mut gpucoll::DeviceBuffer<f64>),
}

/// Run `f` on a copy of `data` in the communicator's GPU memory (or host
/// memory on the host backend) and return the result on the host.
fn on_device_or_host(
    comm: &gpucoll::Communicator,
    data: &[f64],
    f: impl FnOnce(&gpucoll::Communicator, Buf<'_>) -> gpucoll::Result<()>,
) -> gpucoll::Result<Vec<f64>> {
    #[cfg(feature = "cuda")]
    if comm.device().is_some() {
        let mut d = comm.alloc_from(data)?;
        f(comm, Buf::Dev(&mut d))?;
        return d.to_vec();
    }
    let mut v = data.to_vec();
    f(comm, Buf::Host(&mut v))?;
    Ok(v)
}

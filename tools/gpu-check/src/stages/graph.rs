//! `--stage graph`: collectives captured into a CUDA graph and replayed
//! between eager calls.

use super::raw::raw_case;
use super::{gv, verify, vp};
use gpucoll::{CollKind, Communicator, CudaStream, Datatype, DeviceBuffer, ReduceOp};
use std::fmt::Write as _;

/// (b) capture all_reduce (1 MiB: direct one-shot; 64 MiB: ring),
/// all_gather, reduce_scatter and exclusive_scan (its chain of steps) into
/// a CUDA graph, replay it 5 times with new inputs each time, interleaved
/// with eager calls.
pub(crate) fn stage_graph(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let (rank, n) = (world.rank(), world.size());
    let gpu = world.device().ok_or_else(|| {
        gpucoll::Error::Backend(format!("no GPU ({} backend)", world.backend_name()))
    })?;
    let nn = n as u64;
    let stream = CudaStream::new(gpu)?;
    let s = Some(stream.raw());
    let dt = Datatype::F32;
    let sum = ReduceOp::Sum;
    let (c1, c2, cg, cr) = (262_144u64, 16u64 << 20, 65_536u64, 262_144u64);
    let z = |len: u64| DeviceBuffer::<f32>::zeroed(gpu, len as usize);
    let (a1, o1) = (z(c1)?, z(c1)?);
    let (a2, o2) = (z(c2)?, z(c2)?);
    let (ga, go) = (z(cg)?, z(cg * nn)?);
    let (ra, ro) = (z(cr * nn)?, z(cr)?);
    let cx = 100_003u64;
    let (xa, xo) = (z(cx)?, z(cx)?);
    let fill = |b: &mut DeviceBuffer<f32>, len: u64, it: u64| {
        let v: Vec<f32> = (0..len).map(|j| gv(rank, j, it)).collect();
        b.copy_from_host(&v)
    };
    // Warm-up: one eager call on the stream (starts the watchdog).
    let p = raw_case(world, gpu, CollKind::AllReduce, 1000, false, 0, s)?;
    stream.synchronize()?;
    let mut fails = (verify(&p, rank, log)? > 0) as usize;
    stream.begin_capture()?;
    // SAFETY: the buffers outlive the graph and its replays (dropped at
    // the end of this function, after the last synchronize).
    let captured = unsafe {
        world
            .all_reduce_raw(vp(&a1), vp(&o1), c1, dt, sum, s)
            .and_then(|_| world.all_reduce_raw(vp(&a2), vp(&o2), c2, dt, sum, s))
            .and_then(|_| world.all_gather_raw(vp(&ga), vp(&go), cg, dt, s))
            .and_then(|_| world.reduce_scatter_block_raw(vp(&ra), vp(&ro), cr, dt, sum, s))
            .and_then(|_| world.exclusive_scan_raw(vp(&xa), vp(&xo), cx, dt, sum, s))
    };
    let graph = stream.end_capture();
    captured?;
    let graph = graph?;
    let (mut a1, mut a2, mut ga, mut ra, mut xa) = (a1, a2, ga, ra, xa);
    let check = |what: &str,
                 out: &DeviceBuffer<f32>,
                 want: &dyn Fn(u64) -> f32,
                 log: &mut String|
     -> gpucoll::Result<usize> {
        let got = out.to_vec()?;
        let bad = got
            .iter()
            .enumerate()
            .filter(|(j, g)| **g != want(*j as u64))
            .count();
        if bad > 0 {
            let j = got
                .iter()
                .enumerate()
                .position(|(j, g)| *g != want(j as u64))
                .unwrap_or(0);
            let _ = writeln!(
                log,
                "rank {rank} WRONG {what}: {bad} elements; first at {j}: got {} want {}",
                got[j],
                want(j as u64)
            );
        }
        Ok((bad > 0) as usize)
    };
    for it in 1..=5u64 {
        fill(&mut a1, c1, it)?;
        fill(&mut a2, c2, it)?;
        fill(&mut ga, cg, it)?;
        fill(&mut ra, cr * nn, it)?;
        fill(&mut xa, cx, it)?;
        graph.launch(&stream)?;
        stream.synchronize()?;
        let all = |j: u64| (0..n).map(|r| gv(r, j, it)).sum::<f32>();
        fails += check(&format!("replay {it} all_reduce 1 MiB"), &o1, &all, log)?;
        fails += check(&format!("replay {it} all_reduce 64 MiB"), &o2, &all, log)?;
        fails += check(
            &format!("replay {it} all_gather"),
            &go,
            &|j| gv((j / cg) as usize, j % cg, it),
            log,
        )?;
        fails += check(
            &format!("replay {it} reduce_scatter"),
            &ro,
            &|j| all(rank as u64 * cr + j),
            log,
        )?;
        // Rank 0's output is never written: it stays zero.
        fails += check(
            &format!("replay {it} exclusive_scan"),
            &xo,
            &|j| (0..rank).map(|r| gv(r, j, it)).sum::<f32>(),
            log,
        )?;
        // Eager calls between replays: blocking typed, then on the stream.
        let e_in: Vec<f32> = (0..5000).map(|j| gv(rank, j, it + 100)).collect();
        let e_in = DeviceBuffer::from_host(gpu, &e_in)?;
        let mut e_out = z(5000)?;
        world.all_reduce_into(&e_in, &mut e_out, sum)?;
        fails += check(
            &format!("eager all_reduce after replay {it}"),
            &e_out,
            &|j| (0..n).map(|r| gv(r, j, it + 100)).sum::<f32>(),
            log,
        )?;
        let p = raw_case(world, gpu, CollKind::AllGather, 3001, false, it, s)?;
        stream.synchronize()?;
        fails += (verify(&p, rank, log)? > 0) as usize;
    }
    world.async_error()?;
    drop(graph);
    Ok(fails)
}

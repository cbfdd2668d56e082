//! `--stage raw`: every collective through the raw device-pointer entry
//! points on callers' streams, and argument errors on the GPU.

use super::{gv, verify, vp, ErrCheck, Pending};
use gpucoll::{
    CollKind, Communicator, CudaStream, CudaStreamRaw, Datatype, DeviceBuffer, ReduceOp,
};
use std::ffi::c_void;
use std::fmt::Write as _;

/// Queue collective `kind` (f32, Sum) of `count` on `stream` with the raw
/// entry points; returns what to verify after the stream synchronized.
pub(crate) fn raw_case(
    world: &Communicator,
    gpu: i32,
    kind: CollKind,
    count: u64,
    in_place: bool,
    it: u64,
    stream: Option<CudaStreamRaw>,
) -> gpucoll::Result<Pending> {
    let (rank, n) = (world.rank(), world.size());
    let nn = n as u64;
    let root = n - 1;
    let is_root = rank == root;
    let c = count as usize;
    let cn = c * n;
    let poison = -1.0f32;
    let v = |r: usize, j: u64| gv(r, j, it);
    let sum = |f: &dyn Fn(usize) -> u64| (0..n).map(|r| v(r, f(r))).sum::<f32>();
    let dt = Datatype::F32;
    let op = ReduceOp::Sum;
    let what = format!(
        "{} count={count} in_place={in_place} round={it}",
        kind.name()
    );
    let own: Vec<f32> = (0..count).map(|j| v(rank, j)).collect();
    let own_n: Vec<f32> = (0..count * nn).map(|j| v(rank, j)).collect();
    let mut want = Vec::new();
    // SAFETY (for every raw call below): the device buffers live in the
    // returned Pending until the caller synchronized the stream.
    let p = match kind {
        CollKind::AllReduce | CollKind::Reduce => {
            for i in 0..c {
                want.push((i, sum(&|_| i as u64)));
            }
            let reduce = kind == CollKind::Reduce;
            if reduce && !is_root {
                want.clear();
            }
            if in_place && (!reduce || is_root) {
                let b = DeviceBuffer::from_host(gpu, &own)?;
                unsafe {
                    if reduce {
                        world.reduce_raw(vp(&b), vp(&b), count, dt, op, root, stream)?
                    } else {
                        world.all_reduce_raw(vp(&b), vp(&b), count, dt, op, stream)?
                    }
                };
                Pending {
                    what,
                    out: b,
                    _keep: None,
                    want,
                }
            } else {
                let s = DeviceBuffer::from_host(gpu, &own)?;
                let o = DeviceBuffer::from_host(gpu, &vec![poison; c])?;
                unsafe {
                    if reduce {
                        let recv = if is_root {
                            vp(&o)
                        } else {
                            std::ptr::null_mut()
                        };
                        world.reduce_raw(vp(&s), recv, count, dt, op, root, stream)?
                    } else {
                        world.all_reduce_raw(vp(&s), vp(&o), count, dt, op, stream)?
                    }
                };
                Pending {
                    what,
                    out: o,
                    _keep: Some(s),
                    want,
                }
            }
        }
        CollKind::Broadcast => {
            let init: Vec<f32> = if is_root {
                own.clone()
            } else {
                vec![poison; c]
            };
            let b = DeviceBuffer::from_host(gpu, &init)?;
            unsafe { world.broadcast_raw(vp(&b), count, dt, root, stream)? };
            want = (0..c).map(|i| (i, v(root, i as u64))).collect();
            Pending {
                what,
                out: b,
                _keep: None,
                want,
            }
        }
        CollKind::AllGather | CollKind::Gather => {
            let gather = kind == CollKind::Gather;
            let at = if gather { root } else { rank };
            if !gather || is_root {
                for r in 0..n {
                    for i in 0..c {
                        want.push((r * c + i, v(r, i as u64)));
                    }
                }
            }
            if in_place && (!gather || is_root) {
                let mut init = vec![poison; cn];
                init[at * c..(at + 1) * c].copy_from_slice(&own);
                let b = DeviceBuffer::from_host(gpu, &init)?;
                // Odd counts use NCCL's layout (send = own block).
                let send = if count % 2 == 1 {
                    (b.device_ptr() + (at * c * 4) as u64) as usize as *const c_void
                } else {
                    vp(&b) as *const c_void
                };
                unsafe {
                    if gather {
                        world.gather_raw(send, vp(&b), count, dt, root, stream)?
                    } else {
                        world.all_gather_raw(send, vp(&b), count, dt, stream)?
                    }
                };
                Pending {
                    what,
                    out: b,
                    _keep: None,
                    want,
                }
            } else {
                let s = DeviceBuffer::from_host(gpu, &own)?;
                let o = DeviceBuffer::from_host(gpu, &vec![poison; cn])?;
                unsafe {
                    if gather {
                        let recv = if is_root {
                            vp(&o)
                        } else {
                            std::ptr::null_mut()
                        };
                        world.gather_raw(vp(&s), recv, count, dt, root, stream)?
                    } else {
                        world.all_gather_raw(vp(&s), vp(&o), count, dt, stream)?
                    }
                };
                Pending {
                    what,
                    out: o,
                    _keep: Some(s),
                    want,
                }
            }
        }
        CollKind::ReduceScatter => {
            want = (0..c)
                .map(|i| (i, sum(&|_| (rank * c + i) as u64)))
                .collect();
            if in_place {
                let b = DeviceBuffer::from_host(gpu, &own_n)?;
                unsafe { world.reduce_scatter_block_raw(vp(&b), vp(&b), count, dt, op, stream)? };
                Pending {
                    what,
                    out: b,
                    _keep: None,
                    want,
                }
            } else {
                let s = DeviceBuffer::from_host(gpu, &own_n)?;
                let o = DeviceBuffer::from_host(gpu, &vec![poison; c])?;
                unsafe { world.reduce_scatter_block_raw(vp(&s), vp(&o), count, dt, op, stream)? };
                Pending {
                    what,
                    out: o,
                    _keep: Some(s),
                    want,
                }
            }
        }
        CollKind::AllToAll => {
            for s in 0..n {
                for i in 0..c {
                    want.push((s * c + i, v(s, (rank * c + i) as u64)));
                }
            }
            if in_place {
                let b = DeviceBuffer::from_host(gpu, &own_n)?;
                unsafe { world.all_to_all_raw(vp(&b), vp(&b), count, dt, stream)? };
                Pending {
                    what,
                    out: b,
                    _keep: None,
                    want,
                }
            } else {
                let s = DeviceBuffer::from_host(gpu, &own_n)?;
                let o = DeviceBuffer::from_host(gpu, &vec![poison; cn])?;
                unsafe { world.all_to_all_raw(vp(&s), vp(&o), count, dt, stream)? };
                Pending {
                    what,
                    out: o,
                    _keep: Some(s),
                    want,
                }
            }
        }
        CollKind::Scatter => {
            let base = if in_place && is_root { root * c } else { 0 };
            want = (0..c)
                .map(|i| (base + i, v(root, (rank * c + i) as u64)))
                .collect();
            if in_place && is_root {
                let b = DeviceBuffer::from_host(gpu, &own_n)?;
                unsafe { world.scatter_raw(vp(&b), vp(&b), count, dt, root, stream)? };
                Pending {
                    what,
                    out: b,
                    _keep: None,
                    want,
                }
            } else {
                let s = DeviceBuffer::from_host(gpu, &own_n)?;
                let o = DeviceBuffer::from_host(gpu, &vec![poison; c])?;
                let send = if is_root {
                    vp(&s) as *const c_void
                } else {
                    std::ptr::null()
                };
                unsafe { world.scatter_raw(send, vp(&o), count, dt, root, stream)? };
                Pending {
                    what,
                    out: o,
                    _keep: Some(s),
                    want,
                }
            }
        }
        CollKind::Scan | CollKind::ExclusiveScan => {
            let exclusive = kind == CollKind::ExclusiveScan;
            let upto = if exclusive { rank } else { rank + 1 };
            let prefix = |i: usize| (0..upto).map(|r| v(r, i as u64)).sum::<f32>();
            // Rank 0 of exclusive_scan has no prefix: its buffer keeps what
            // it held (its input in place, the poison otherwise).
            let keep = exclusive && rank == 0;
            let kept = |i: usize| if in_place { own[i] } else { poison };
            want = (0..c)
                .map(|i| (i, if keep { kept(i) } else { prefix(i) }))
                .collect();
            if in_place {
                let b = DeviceBuffer::from_host(gpu, &own)?;
                unsafe {
                    if exclusive {
                        world.exclusive_scan_raw(vp(&b), vp(&b), count, dt, op, stream)?
                    } else {
                        world.scan_raw(vp(&b), vp(&b), count, dt, op, stream)?
                    }
                };
                Pending {
                    what,
                    out: b,
                    _keep: None,
                    want,
                }
            } else {
                let s = DeviceBuffer::from_host(gpu, &own)?;
                let o = DeviceBuffer::from_host(gpu, &vec![poison; c])?;
                // MPI: rank 0's receive buffer of MPI_Exscan is not
                // significant; odd rounds pass none there.
                let recv = if keep && it % 2 == 1 {
                    std::ptr::null_mut()
                } else {
                    vp(&o)
                };
                unsafe {
                    if exclusive {
                        world.exclusive_scan_raw(vp(&s), recv, count, dt, op, stream)?
                    } else {
                        world.scan_raw(vp(&s), vp(&o), count, dt, op, stream)?
                    }
                };
                Pending {
                    what,
                    out: o,
                    _keep: Some(s),
                    want,
                }
            }
        }
    };
    Ok(p)
}

/// (a) every collective through the raw entry points on callers'
/// streams (two streams, alternating, plus blocking calls in between),
/// many queued before one synchronization; argument errors on the GPU.
pub(crate) fn stage_raw(world: &Communicator, log: &mut String) -> gpucoll::Result<usize> {
    let rank = world.rank();
    let gpu = match world.device() {
        Some(g) => g,
        None => {
            let _ = writeln!(
                log,
                "rank {rank} ERROR the communicator has no GPU ({})",
                world.backend_name()
            );
            return Ok(1);
        }
    };
    let mut fails = 0usize;
    let (sa, sb) = (CudaStream::new(gpu)?, CudaStream::new(gpu)?);
    // 262144 f32 = 1 MiB (direct all_reduce), 4 Mi f32 = 16 MiB (the
    // largest direct all_reduce), 1001 (unaligned tails), 0.
    for (round, &count) in [0u64, 1, 1001, 262_144, 4 << 20].iter().enumerate() {
        let mut pend = Vec::new();
        let mut k = 0usize;
        for kind in CollKind::ALL {
            for in_place in [false, true] {
                if kind == CollKind::Broadcast && in_place {
                    continue;
                }
                let s = if k % 2 == 0 { &sa } else { &sb };
                k += 1;
                pend.push(raw_case(
                    world,
                    gpu,
                    kind,
                    count,
                    in_place,
                    round as u64,
                    Some(s.raw()),
                )?);
            }
            // A blocking call (the communicator's own stream) in between.
            if kind == CollKind::AllGather {
                pend.push(raw_case(
                    world,
                    gpu,
                    CollKind::AllReduce,
                    count,
                    false,
                    7,
                    None,
                )?);
            }
        }
        sa.synchronize()?;
        sb.synchronize()?;
        for p in &pend {
            fails += (verify(p, rank, log)? > 0) as usize;
        }
        world.async_error()?;
    }
    // Errors checked before anything runs; the communicator stays usable.
    let dev = DeviceBuffer::<f32>::zeroed(gpu, 100)?;
    let host = vec![0f32; 100];
    let s = Some(sa.raw());
    let dt = Datatype::F32;
    let checks: Vec<ErrCheck> = unsafe {
        vec![
            (
                "host pointer on a stream",
                world.all_reduce_raw(
                    host.as_ptr() as *const c_void,
                    vp(&dev),
                    100,
                    dt,
                    ReduceOp::Sum,
                    s,
                ),
                |e| matches!(e, gpucoll::Error::WrongMemory(_)),
            ),
            (
                "misaligned device pointer",
                world.all_reduce_raw(
                    (dev.device_ptr() + 2) as usize as *const c_void,
                    vp(&dev),
                    10,
                    dt,
                    ReduceOp::Sum,
                    s,
                ),
                |e| matches!(e, gpucoll::Error::InvalidUsage(_)),
            ),
            (
                // 4 TiB: far past anything mapped, so never accepted.
                "past the end of the allocation",
                world.broadcast_raw(vp(&dev), 1 << 40, dt, 0, s),
                |e| matches!(e, gpucoll::Error::InvalidUsage(_)),
            ),
        ]
    };
    for (what, r, pred) in checks {
        match r {
            Err(e) if pred(&e) => {}
            other => {
                fails += 1;
                let _ = writeln!(log, "rank {rank} WRONG error check '{what}': got {other:?}");
            }
        }
    }
    let p = raw_case(
        world,
        gpu,
        CollKind::AllReduce,
        4099,
        false,
        9,
        Some(sa.raw()),
    )?;
    sa.synchronize()?;
    fails += (verify(&p, rank, log)? > 0) as usize;
    world.async_error()?;
    Ok(fails)
}

//! The raw pointer entry points on the host backend.

use super::*;

/// The raw pointer entry points on the host backend: without a stream they
/// run on host memory like the typed calls; a stream is rejected with a
/// clear, non-fatal error; bad pointers are rejected before anything runs.
pub(super) fn scenario_raw_host(world: &Communicator, fails: &mut Vec<String>) {
    use std::ffi::c_void;
    let (rank, n) = (world.rank(), world.size());
    let c = 5usize;
    let nn = n as u64;
    let root = n - 1;
    let val = |r: usize, j: usize| (r * 100 + j) as i64;
    let cv = |p: *const i64| p as *const c_void;
    let mv = |p: *mut i64| p as *mut c_void;
    let dt = Datatype::I64;
    let tri = (n * (n - 1) / 2) as i64;

    // all_reduce, out of place and in place.
    let a: Vec<i64> = (0..c).map(|j| val(rank, j)).collect();
    let mut b = vec![-1i64; c];
    let want: Vec<i64> = (0..c).map(|j| tri * 100 + (n * j) as i64).collect();
    // SAFETY: host vectors of `c` elements, alive for the blocking call.
    let r = unsafe {
        world.all_reduce_raw(
            cv(a.as_ptr()),
            mv(b.as_mut_ptr()),
            c as u64,
            dt,
            ReduceOp::Sum,
            None,
        )
    };
    ok(r, "all_reduce_raw");
    check_exact("all_reduce_raw", &b, &want, fails);
    let mut ip = a.clone();
    // SAFETY: as above; send == recv is the in-place form.
    let r = unsafe {
        world.all_reduce_raw(
            cv(ip.as_ptr()),
            mv(ip.as_mut_ptr()),
            c as u64,
            dt,
            ReduceOp::Sum,
            None,
        )
    };
    ok(r, "all_reduce_raw in place");
    check_exact("all_reduce_raw in place", &ip, &want, fails);

    // reduce (recv ignored and null off the root).
    let mut rr = vec![-1i64; c];
    let recv = if rank == root {
        mv(rr.as_mut_ptr())
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: as above.
    ok(
        unsafe {
            world.reduce_raw(
                cv(a.as_ptr()),
                recv,
                c as u64,
                dt,
                ReduceOp::Sum,
                root,
                None,
            )
        },
        "reduce_raw",
    );
    if rank == root {
        check_exact("reduce_raw", &rr, &want, fails);
    }

    // broadcast.
    let mut bc: Vec<i64> = if rank == root {
        (0..c).map(|j| val(root, j)).collect()
    } else {
        vec![-1; c]
    };
    // SAFETY: as above.
    ok(
        unsafe { world.broadcast_raw(mv(bc.as_mut_ptr()), c as u64, dt, root, None) },
        "broadcast_raw",
    );
    check_exact(
        "broadcast_raw",
        &bc,
        &(0..c).map(|j| val(root, j)).collect::<Vec<_>>(),
        fails,
    );

    // all_gather: out of place, in place (send == recv), NCCL layout.
    let gathered: Vec<i64> = (0..n)
        .flat_map(|r| (0..c).map(move |j| val(r, j)))
        .collect();
    let mut g = vec![-1i64; c * n];
    // SAFETY: as above (recv holds c*n elements).
    ok(
        unsafe { world.all_gather_raw(cv(a.as_ptr()), mv(g.as_mut_ptr()), c as u64, dt, None) },
        "all_gather_raw",
    );
    check_exact("all_gather_raw", &g, &gathered, fails);
    for nccl in [false, true] {
        let mut g = vec![-1i64; c * n];
        g[rank * c..(rank + 1) * c].copy_from_slice(&a);
        let base = g.as_mut_ptr();
        // SAFETY: rank*c is within the buffer of c*n elements.
        let send = if nccl {
            unsafe { base.add(rank * c) }
        } else {
            base
        };
        // SAFETY: as above.
        ok(
            unsafe { world.all_gather_raw(cv(send), mv(base), c as u64, dt, None) },
            "all_gather_raw in place",
        );
        check_exact(
            &format!("all_gather_raw in place (nccl layout {nccl})"),
            &g,
            &gathered,
            fails,
        );
    }

    // reduce_scatter_block.
    let rs_in: Vec<i64> = (0..c * n).map(|j| val(rank, j)).collect();
    let rs_want: Vec<i64> = (0..c)
        .map(|j| tri * 100 + (n * (rank * c + j)) as i64)
        .collect();
    let mut rs = vec![-1i64; c];
    // SAFETY: as above.
    ok(
        unsafe {
            world.reduce_scatter_block_raw(
                cv(rs_in.as_ptr()),
                mv(rs.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                None,
            )
        },
        "reduce_scatter_block_raw",
    );
    check_exact("reduce_scatter_block_raw", &rs, &rs_want, fails);
    let mut rsi = rs_in.clone();
    // SAFETY: as above, in place.
    ok(
        unsafe {
            world.reduce_scatter_block_raw(
                cv(rsi.as_ptr()),
                mv(rsi.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                None,
            )
        },
        "reduce_scatter_block_raw in place",
    );
    check_exact(
        "reduce_scatter_block_raw in place",
        &rsi[..c],
        &rs_want,
        fails,
    );

    // all_to_all.
    let a2a_want: Vec<i64> = (0..n)
        .flat_map(|s| (0..c).map(move |j| val(s, rank * c + j)))
        .collect();
    let mut t = vec![-1i64; c * n];
    // SAFETY: as above.
    ok(
        unsafe { world.all_to_all_raw(cv(rs_in.as_ptr()), mv(t.as_mut_ptr()), c as u64, dt, None) },
        "all_to_all_raw",
    );
    check_exact("all_to_all_raw", &t, &a2a_want, fails);

    // gather and scatter (root only buffers).
    let mut gr = vec![-1i64; c * n];
    let recv = if rank == root {
        mv(gr.as_mut_ptr())
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: as above.
    ok(
        unsafe { world.gather_raw(cv(a.as_ptr()), recv, c as u64, dt, root, None) },
        "gather_raw",
    );
    if rank == root {
        check_exact("gather_raw", &gr, &gathered, fails);
    }
    let sc_src: Vec<i64> = (0..c * n).map(|j| val(root, j)).collect();
    let mut sc = vec![-1i64; c];
    let send = if rank == root {
        cv(sc_src.as_ptr())
    } else {
        std::ptr::null()
    };
    // SAFETY: as above.
    ok(
        unsafe { world.scatter_raw(send, mv(sc.as_mut_ptr()), c as u64, dt, root, None) },
        "scatter_raw",
    );
    check_exact(
        "scatter_raw",
        &sc,
        &(0..c).map(|j| val(root, rank * c + j)).collect::<Vec<_>>(),
        fails,
    );

    // Errors: local, before anything runs, leaving the communicator usable.
    #[cfg(feature = "cuda")]
    if world.device().is_none() {
        expect_err(
            fails,
            "alloc on the host backend",
            world.alloc::<f32>(4).map(|_| ()),
            "WrongMemory",
            |e| matches!(e, Error::WrongMemory(m) if m.contains("no GPU")),
        );
    }
    let stream = Some(std::ptr::null_mut::<c_void>());
    // SAFETY: the calls are rejected before touching memory.
    unsafe {
        expect_err(
            fails,
            "host pointer on a stream",
            world.all_reduce_raw(
                cv(a.as_ptr()),
                mv(b.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                stream,
            ),
            "WrongMemory",
            |e| matches!(e, Error::WrongMemory(_)),
        );
        expect_err(
            fails,
            "stream on the host backend",
            world.all_reduce_raw(
                std::ptr::null(),
                std::ptr::null_mut(),
                0,
                dt,
                ReduceOp::Sum,
                stream,
            ),
            "InvalidUsage",
            |e| matches!(e, Error::InvalidUsage(m) if m.contains("stream")),
        );
        expect_err(
            fails,
            "null pointer",
            world.all_reduce_raw(
                std::ptr::null(),
                mv(b.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::Sum,
                None,
            ),
            "InvalidUsage",
            |e| matches!(e, Error::InvalidUsage(_)),
        );
        let odd = (a.as_ptr() as usize + 1) as *const c_void;
        expect_err(
            fails,
            "misaligned pointer",
            world.all_reduce_raw(odd, mv(b.as_mut_ptr()), 1, dt, ReduceOp::Sum, None),
            "InvalidUsage",
            |e| matches!(e, Error::InvalidUsage(_)),
        );
        expect_err(
            fails,
            "count overflow",
            world.all_gather_raw(cv(a.as_ptr()), mv(g.as_mut_ptr()), u64::MAX / 2, dt, None),
            "CountTooLarge",
            |e| matches!(e, Error::CountTooLarge(_)),
        );
        expect_err(
            fails,
            "bad op for the type",
            world.all_reduce_raw(
                cv(a.as_ptr()),
                mv(b.as_mut_ptr()),
                c as u64,
                dt,
                ReduceOp::PreMulSum(f64::NAN),
                None,
            ),
            "InvalidOp",
            |e| matches!(e, Error::InvalidOp { .. }),
        );
    }
    if let Err(e) = world.async_error() {
        fails.push(format!("async_error() on a healthy communicator: {e:?}"));
    }
    if world.device().is_some() {
        fails.push(format!(
            "device() is {:?} on the host backend, expected None",
            world.device()
        ));
    }
    still_works(world, "after raw errors", fails);
    let _ = nn;
}

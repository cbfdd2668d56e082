//! Argument errors found on one rank (bad roots, lengths, datatypes, ops,
//! aliasing, memory kinds) and a freed communicator: each is reported as
//! such and leaves the communicator usable.

use super::*;

pub(super) fn scenario_bad_root(world: &Communicator, fails: &mut Vec<String>) {
    let (rank, n) = (world.rank(), world.size());
    for bad in [n, n + 100] {
        let p = world.process_at_rank(bad);
        let is_bad = |e: &Error| matches!(e, Error::InvalidRoot { root, size } if *root == bad && *size == n);
        let want = format!("InvalidRoot {{ root: {bad}, size: {n} }}");
        let send = vec![1.0f32; 8];
        let mut recv = vec![0.0f32; 8];
        let mut big = vec![0.0f32; 8 * n];
        let _ = rank;
        expect_err(
            fails,
            "broadcast_into",
            p.broadcast_into(&mut recv),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "reduce_into_root",
            p.reduce_into_root(&send, &mut recv, ReduceOp::Sum),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "reduce_into",
            p.reduce_into(&send, ReduceOp::Sum),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "reduce_into_root_in_place",
            p.reduce_into_root_in_place(&mut recv, ReduceOp::Sum),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "gather_into_root",
            p.gather_into_root(&send, &mut big),
            &want,
            is_bad,
        );
        expect_err(fails, "gather_into", p.gather_into(&send), &want, is_bad);
        expect_err(
            fails,
            "gather_into_root_in_place",
            p.gather_into_root_in_place(&mut big),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "scatter_into_root",
            p.scatter_into_root(&big, &mut recv),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "scatter_into",
            p.scatter_into(&mut recv),
            &want,
            is_bad,
        );
        expect_err(
            fails,
            "scatter_into_root_in_place",
            p.scatter_into_root_in_place(&mut big),
            &want,
            is_bad,
        );
        let r: gpucoll::Result<()> = gpucoll::scope(|s| {
            let req = p.immediate_broadcast_into(s, &mut recv)?;
            req.wait()
        });
        expect_err(fails, "immediate_broadcast_into", r, &want, is_bad);
        let r = world.group(|g| {
            g.all_reduce_into(&send, &mut big[..8], ReduceOp::Sum)?;
            g.process_at_rank(bad).broadcast_into(&mut recv)
        });
        expect_err(fails, "group broadcast_into(bad root)", r, &want, is_bad);
        // the communicator is still usable
        still_works(world, &format!("after bad root {bad}"), fails);
    }
}

pub(super) fn scenario_bad_args(world: &Communicator, fails: &mut Vec<String>) {
    let n = world.size();
    let is_len = |e: &Error| matches!(e, Error::BufferLength { .. });
    let is_div = |e: &Error| matches!(e, Error::NotDivisible { .. });
    let is_len_or_div =
        |e: &Error| matches!(e, Error::BufferLength { .. } | Error::NotDivisible { .. });

    // lengths
    let send = vec![1u32; 10];
    let mut short = vec![0u32; 9];
    expect_err(
        fails,
        "all_reduce_into recv too short",
        world.all_reduce_into(&send, &mut short, ReduceOp::Sum),
        "BufferLength",
        is_len,
    );
    if let Some(Error::BufferLength {
        expected, actual, ..
    }) = world
        .all_reduce_into(&send, &mut short, ReduceOp::Sum)
        .err()
    {
        if expected != 10 || actual != 9 {
            fails.push(format!(
                "BufferLength fields: expected={expected} actual={actual}, want 10 and 9"
            ));
        }
    }
    let mut ag_short = vec![0u32; 10 * n - 1];
    expect_err(
        fails,
        "all_gather_into recv too short",
        world.all_gather_into(&send, &mut ag_short),
        "BufferLength",
        is_len,
    );
    let mut ag_long = vec![0u32; 10 * n + 1];
    expect_err(
        fails,
        "all_gather_into recv too long",
        world.all_gather_into(&send, &mut ag_long),
        "BufferLength",
        is_len,
    );
    let rs_send = vec![1u32; 10 * n + 1];
    let mut rs_recv = vec![0u32; 10];
    expect_err(
        fails,
        "reduce_scatter_block_into send not count*size",
        world.reduce_scatter_block_into(&rs_send, &mut rs_recv, ReduceOp::Sum),
        "BufferLength or NotDivisible",
        is_len_or_div,
    );
    let nd = 3 * n + 1;
    let mut nd_buf = vec![1u32; nd];
    expect_err(
        fails,
        "reduce_scatter_block_in_place len % size != 0",
        world.reduce_scatter_block_in_place(&mut nd_buf, ReduceOp::Sum),
        "NotDivisible",
        is_div,
    );
    let aa_send = vec![1u32; nd];
    let mut aa_recv = vec![0u32; nd];
    expect_err(
        fails,
        "all_to_all_into len % size != 0",
        world.all_to_all_into(&aa_send, &mut aa_recv),
        "NotDivisible",
        is_div,
    );
    if let Some(Error::NotDivisible { len, size, .. }) =
        world.all_to_all_into(&aa_send, &mut aa_recv).err()
    {
        if len != nd as u64 || size != n {
            fails.push(format!(
                "NotDivisible fields: len={len} size={size}, want {nd} and {n}"
            ));
        }
    }
    expect_err(
        fails,
        "all_to_all_in_place len % size != 0",
        world.all_to_all_in_place(&mut nd_buf),
        "NotDivisible",
        is_div,
    );
    expect_err(
        fails,
        "all_gather_in_place len % size != 0",
        world.all_gather_in_place(&mut nd_buf),
        "NotDivisible (or InPlace)",
        |e| matches!(e, Error::NotDivisible { .. } | Error::InPlace(_)),
    );
    expect_err(
        fails,
        "scan_into recv too short",
        world.scan_into(&send, &mut short, ReduceOp::Sum),
        "BufferLength",
        is_len,
    );
    let mut long = vec![0u32; 11];
    expect_err(
        fails,
        "exclusive_scan_into recv too long",
        world.exclusive_scan_into(&send, &mut long, ReduceOp::Sum),
        "BufferLength",
        is_len,
    );
    let aa_recv_short = &mut vec![0u32; 3 * n - 1];
    let aa_send3 = vec![1u32; 3 * n];
    expect_err(
        fails,
        "all_to_all_into recv too short",
        world.all_to_all_into(&aa_send3, aa_recv_short),
        "BufferLength or NotDivisible",
        is_len_or_div,
    );
    // symmetric rooted errors (every rank's call is invalid the same way)
    let root = world.process_at_rank(n - 1);
    let nd_send = vec![1u32; nd];
    if world.rank() == n - 1 {
        let mut rr = vec![0u32; 3];
        expect_err(
            fails,
            "scatter_into_root send not count*size",
            root.scatter_into_root(&nd_send, &mut rr),
            "BufferLength or NotDivisible",
            is_len_or_div,
        );
    } else {
        // non-roots issue a valid-looking call only if the root's is valid; skip
    }
    still_works(world, "after length errors", fails);

    // element types: the typed methods take one element type per call (a
    // mismatch does not compile); raw buffers can still disagree
    let is_tm = |s: Datatype, r: Datatype| move |e: &Error| matches!(e, Error::TypeMismatch { send, recv } if *send == s && *recv == r);
    let fs = vec![1.0f32; 8];
    let mut ir = vec![0i32; 8];
    let us = vec![1u8; 8];
    let mut is = vec![0i8; 8 * n];
    let hs = vec![f16::ONE; 8 * n];
    let mut bs = vec![bf16::ZERO; 8];
    let ds = vec![1.0f64; 8 * n];
    let mut ls = vec![0u64; 8 * n];
    let mismatched = [
        (
            "all_reduce f32 -> i32",
            CollKind::AllReduce,
            fs.raw(),
            ir.raw_mut(),
            (Datatype::F32, Datatype::I32),
        ),
        (
            "all_gather u8 -> i8",
            CollKind::AllGather,
            us.raw(),
            is.raw_mut(),
            (Datatype::U8, Datatype::I8),
        ),
        (
            "reduce_scatter_block f16 -> bf16",
            CollKind::ReduceScatter,
            hs.raw(),
            bs.raw_mut(),
            (Datatype::F16, Datatype::BF16),
        ),
        (
            "all_to_all f64 -> u64",
            CollKind::AllToAll,
            ds.raw(),
            ls.raw_mut(),
            (Datatype::F64, Datatype::U64),
        ),
    ];
    for (what, kind, send, recv, (s, r)) in mismatched {
        // SAFETY: both raw buffers describe live host vectors of their
        // stated lengths, not touched elsewhere during the call.
        let res =
            unsafe { world.raw_collective(kind, Some(send), Some(recv), ReduceOp::Sum, 0, false) };
        expect_err(
            fails,
            what,
            res,
            &format!("TypeMismatch({s:?}, {r:?})"),
            is_tm(s, r),
        );
    }
    still_works(world, "after type errors", fails);

    // ops
    let is_op = |e: &Error| matches!(e, Error::InvalidOp { .. });
    let mut fr = vec![0f32; 8];
    expect_err(
        fails,
        "all_reduce PreMulSum(NaN)",
        world.all_reduce_into(&fs, &mut fr, ReduceOp::PreMulSum(f64::NAN)),
        "InvalidOp",
        is_op,
    );
    expect_err(
        fails,
        "all_reduce PreMulSum(inf)",
        world.all_reduce_into(&fs, &mut fr, ReduceOp::PreMulSum(f64::INFINITY)),
        "InvalidOp",
        is_op,
    );
    // a prefix cannot average (Avg divides by the communicator's size);
    // bitwise ops exist for integers only, for scans as for the others
    let mut ur = vec![0u32; 10];
    expect_err(
        fails,
        "scan_into Avg",
        world.scan_into(&send, &mut ur, ReduceOp::Avg),
        "InvalidOp",
        is_op,
    );
    expect_err(
        fails,
        "exclusive_scan_in_place Avg",
        world.exclusive_scan_in_place(&mut ur, ReduceOp::Avg),
        "InvalidOp",
        is_op,
    );
    expect_err(
        fails,
        "scan_in_place f32 BitAnd",
        world.scan_in_place(&mut fr, ReduceOp::BitAnd),
        "InvalidOp",
        is_op,
    );
    // SAFETY: both pointers address 8 live f32, untouched elsewhere.
    let raw = unsafe {
        world.exclusive_scan_raw(
            fs.as_ptr().cast(),
            fr.as_mut_ptr().cast(),
            8,
            Datatype::F32,
            ReduceOp::Avg,
            None,
        )
    };
    expect_err(fails, "exclusive_scan_raw Avg", raw, "InvalidOp", is_op);
    // the oracle refuses what MPI cannot do
    let h = vec![f16::ONE; 4];
    let mut hr = vec![f16::ZERO; 4];
    expect_err(
        fails,
        "reference::all_reduce on f16",
        mpi::all_reduce(world, &h, &mut hr, ReduceOp::Sum),
        "InvalidOp",
        is_op,
    );
    expect_err(
        fails,
        "reference::all_reduce Avg",
        mpi::all_reduce(world, &fs, &mut fr, ReduceOp::Avg),
        "InvalidOp",
        is_op,
    );
    still_works(world, "after op errors", fails);

    // zero-length calls are fine
    let e: Vec<f32> = vec![];
    let mut er: Vec<f32> = vec![];
    if let Err(err) = world.all_reduce_into(&e, &mut er, ReduceOp::Sum) {
        fails.push(format!("zero-length all_reduce failed: {err:?}"));
    }
    still_works(world, "after zero-length call", fails);
}

pub(super) fn scenario_freed(world: &Communicator, fails: &mut Vec<String>) {
    let is_freed = |e: &Error| matches!(e, Error::CommunicatorFreed);
    let dup = ok(world.duplicate(), "duplicate");
    still_works(&dup, "dup before free", fails);
    let a = vec![1i32; 4];
    let mut b = vec![0i32; 4];
    // The host backend maps no peer memory: registering only checks it.
    let reg = ok(dup.register(&a), "register before free");
    if reg.is_direct() || reg.bytes() != 16 {
        fails.push(format!("host registration: {reg:?}, {} bytes", reg.bytes()));
    }
    let raw = ok(dup.register_raw(b.as_ptr().cast(), 16), "register_raw");
    ok(dup.free(), "free");
    drop(raw);
    let want = "CommunicatorFreed";
    expect_err(
        fails,
        "register after free",
        dup.register(&b).map(|_| ()),
        want,
        is_freed,
    );
    // A registration outlives the free; ending it later is harmless.
    reg.deregister();
    expect_err(fails, "barrier after free", dup.barrier(), want, is_freed);
    expect_err(
        fails,
        "all_reduce_into after free",
        dup.all_reduce_into(&a, &mut b, ReduceOp::Sum),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "all_reduce_in_place after free",
        dup.all_reduce_in_place(&mut b, ReduceOp::Sum),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "broadcast after free",
        dup.process_at_rank(0).broadcast_into(&mut b),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "duplicate after free",
        dup.duplicate().map(|_| ()),
        want,
        is_freed,
    );
    expect_err(
        fails,
        "split after free",
        dup.split(Some(0), 0).map(|_| ()),
        want,
        is_freed,
    );
    let r: gpucoll::Result<()> = gpucoll::scope(|s| world_immediate(&dup, s, &a, &mut b));
    expect_err(fails, "immediate_all_reduce after free", r, want, is_freed);
    let r = dup.group(|g| g.all_reduce_into(&a, &mut b, ReduceOp::Sum));
    expect_err(fails, "group after free", r, want, is_freed);
    // a clone shares the freed state
    let clone = dup.clone();
    expect_err(
        fails,
        "clone of a freed communicator",
        clone.barrier(),
        want,
        is_freed,
    );
    // the world and other communicators are untouched
    still_works(world, "world after free of a dup", fails);
    let other = ok(world.duplicate(), "second duplicate");
    still_works(&other, "another dup after free", fails);
    // free a split communicator too
    let sub = ok(world.split(Some((world.rank() % 2) as u32), 0), "split").expect("color given");
    still_works(&sub, "split before free", fails);
    ok(sub.free(), "free split");
    expect_err(
        fails,
        "split comm after free",
        sub.barrier(),
        want,
        is_freed,
    );
    still_works(world, "world at the end", fails);
}

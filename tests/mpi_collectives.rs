//! Multi-rank correctness tests of every collective, checked against MPI's own
//! collectives (gpucoll::reference) on the same host data.
//!
//! `cargo test --release --test mpi_collectives [FILTER]` launches one
//! `mpirun -n N` per case (see tests/common/mod.rs). Worker parameters travel
//! in GPUCOLL_TEST_PARAMS (`colls=..;dtypes=..;sizes=..;ops=..;modes=..`).

mod common;

use common::*;
use gpucoll::prelude::*;
use gpucoll::reference as mpi;
use std::time::{Duration, Instant};

const ALL_COLLS: &str = "all_reduce,reduce,broadcast,all_gather,reduce_scatter,all_to_all,\
     gather,scatter,scan,exclusive_scan";
const ALL_DTYPES: &str = "i8,u8,i32,u32,i64,u64,f16,bf16,f32,f64";
/// One dtype per element size, for the env/algorithm variants.
const SOME_DTYPES: &str = "u8,bf16,i32,f32,f64";
/// The scalar of PreMulSum in these tests (integers use 2).
const PMS: f64 = 2.5;

/// (name, ranks, environment, sizes) of one environment variant.
type Variant = (
    &'static str,
    usize,
    Vec<(&'static str, &'static str)>,
    &'static str,
);

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // The full matrix: every collective x dtype x op x mode x size, per N.
    for &n in &[1usize, 2, 3, 4, 8] {
        let sizes = if n >= 8 {
            "0,1,1031,4099,40009"
        } else {
            "0,1,1031,4099,300001"
        };
        for coll in ALL_COLLS.split(',') {
            v.push(Case::new(format!("matrix::n{n}::{coll}"), n, "coll").env(
                "GPUCOLL_TEST_PARAMS",
                format!("colls={coll};dtypes={ALL_DTYPES};sizes={sizes}"),
            ));
        }
    }
    // Simulated nodes (the ring crosses nodes over MPI; trees possible).
    let variants: Vec<Variant> = vec![
        (
            "sim2_n4",
            4,
            vec![("GPUCOLL_SIM_NODES", "2")],
            "0,1,1031,4099,300001",
        ),
        (
            "sim2_n8",
            8,
            vec![("GPUCOLL_SIM_NODES", "2")],
            "0,1,1031,40009",
        ),
        (
            "sim3_n6",
            6,
            vec![("GPUCOLL_SIM_NODES", "3")],
            "0,1,4099,100003",
        ),
        (
            "sim2_n5_uneven",
            5,
            vec![("GPUCOLL_SIM_NODES", "2")],
            "1,1031,65537",
        ),
        (
            "algo_tree_n4",
            4,
            vec![("GPUCOLL_ALGO", "tree")],
            "0,1,1031,4099,300001",
        ),
        (
            "algo_tree_n5",
            5,
            vec![("GPUCOLL_ALGO", "tree")],
            "1,1031,65537",
        ),
        (
            "algo_tree_sim2_n6",
            6,
            vec![("GPUCOLL_ALGO", "tree"), ("GPUCOLL_SIM_NODES", "2")],
            "1,4099,100003",
        ),
        (
            "algo_tree_nch2_n4",
            4,
            vec![("GPUCOLL_ALGO", "tree"), ("GPUCOLL_NCHANNELS", "2")],
            "1,1031,300001",
        ),
        (
            "algo_ring_nch1_n3",
            3,
            vec![("GPUCOLL_ALGO", "ring"), ("GPUCOLL_NCHANNELS", "1")],
            "0,1,1031,4099,300001",
        ),
        (
            "algo_ring_nch2_n4",
            4,
            vec![("GPUCOLL_ALGO", "ring"), ("GPUCOLL_NCHANNELS", "2")],
            "0,1,1031,4099,300001",
        ),
        (
            "algo_ring_nch4_n4",
            4,
            vec![("GPUCOLL_ALGO", "ring"), ("GPUCOLL_NCHANNELS", "4")],
            "1,1031,4099,300001",
        ),
        (
            "algo_ring_nch4_sim2_n4",
            4,
            vec![
                ("GPUCOLL_ALGO", "ring"),
                ("GPUCOLL_NCHANNELS", "4"),
                ("GPUCOLL_SIM_NODES", "2"),
            ],
            "1,4099,300001",
        ),
        // collnet: all_reduce's inter-node part through MPI's own
        // all_reduce on the rails (even nodes); uneven nodes fall back to
        // the ring with a warning.
        (
            "algo_collnet_sim2_n2",
            2,
            vec![("GPUCOLL_ALGO", "collnet"), ("GPUCOLL_SIM_NODES", "2")],
            "0,1,1031,4099,300001",
        ),
        (
            "algo_collnet_nch2_sim2_n4",
            4,
            vec![
                ("GPUCOLL_ALGO", "collnet"),
                ("GPUCOLL_NCHANNELS", "2"),
                ("GPUCOLL_SIM_NODES", "2"),
            ],
            "0,1,1031,4099,300001",
        ),
        (
            "algo_collnet_sim3_n6",
            6,
            vec![("GPUCOLL_ALGO", "collnet"), ("GPUCOLL_SIM_NODES", "3")],
            "1,4099,100003",
        ),
        (
            "algo_collnet_sim4_n8",
            8,
            vec![("GPUCOLL_ALGO", "collnet"), ("GPUCOLL_SIM_NODES", "4")],
            "0,1,1031,40009",
        ),
        (
            "algo_collnet_sim2_n5_uneven",
            5,
            vec![("GPUCOLL_ALGO", "collnet"), ("GPUCOLL_SIM_NODES", "2")],
            "1,1031,65537",
        ),
        (
            "algo_direct_n4",
            4,
            vec![("GPUCOLL_ALGO", "direct")],
            "0,1,1031,4099,300001",
        ),
        (
            "algo_oneshot_n4",
            4,
            vec![("GPUCOLL_ALGO", "oneshot")],
            "0,1,1031,4099,300001",
        ),
        (
            "algo_oneshot_nch2_n3",
            3,
            vec![("GPUCOLL_ALGO", "oneshot"), ("GPUCOLL_NCHANNELS", "2")],
            "1,1031,65537",
        ),
        (
            "proto_ll_n4",
            4,
            vec![("GPUCOLL_PROTO", "ll")],
            "1,1031,65537",
        ),
        (
            "proto_ll128_n3",
            3,
            vec![("GPUCOLL_PROTO", "ll128")],
            "1,1031,65537",
        ),
        (
            "slot256_n4",
            4,
            vec![("GPUCOLL_HOST_SLOT_BYTES", "256")],
            "1,1031,4099,65537",
        ),
        (
            "check_mode_n3",
            3,
            vec![("GPUCOLL_CHECK", "1")],
            "0,1,1031,4099",
        ),
    ];
    for (name, n, env, sizes) in variants {
        let mut c = Case::new(format!("env::{name}"), n, "coll").env(
            "GPUCOLL_TEST_PARAMS",
            format!("colls={ALL_COLLS};dtypes={SOME_DTYPES};sizes={sizes}"),
        );
        for (k, val) in env {
            c = c.env(k, val);
        }
        v.push(c);
    }
    v.push(Case::new("large::all_reduce_64mib_n4", 4, "large"));
    v.push(Case::new("large::all_reduce_64mib_sim2_n4", 4, "large").env("GPUCOLL_SIM_NODES", "2"));
    for &n in &[2usize, 3, 4] {
        v.push(Case::new(format!("immediate::n{n}"), n, "immediate"));
        v.push(Case::new(format!("group::n{n}"), n, "group"));
    }
    v.push(Case::new("immediate::sim2_n4", 4, "immediate").env("GPUCOLL_SIM_NODES", "2"));
    v.push(Case::new("group::sim2_n4", 4, "group").env("GPUCOLL_SIM_NODES", "2"));
    for &n in &[1usize, 4, 5] {
        v.push(Case::new(format!("split_dup::n{n}"), n, "split_dup"));
    }
    v.push(Case::new("split_dup::sim2_n6", 6, "split_dup").env("GPUCOLL_SIM_NODES", "2"));
    // Several communicators driven at once from threads of every rank.
    for &n in &[2usize, 4] {
        v.push(Case::new(format!("threads::n{n}"), n, "threads"));
    }
    v.push(Case::new("topology::sim2_n4", 4, "topology").env("GPUCOLL_SIM_NODES", "2"));
    v.push(Case::new("topology::sim3_n6", 6, "topology").env("GPUCOLL_SIM_NODES", "3"));
    v.push(Case::new("topology::n3", 3, "topology"));
    // gpucoll's own MPI traffic (bootstrap, NET proxy, reference) must use
    // PMPI_ names only: MPI_* of a preloaded library abort here.
    let trap = pmpi::trap_env();
    let mut trapped = vec![
        Case::new("pmpi::coll_sim2_n4", 4, "coll")
            .env("GPUCOLL_SIM_NODES", "2")
            .env(
                "GPUCOLL_TEST_PARAMS",
                format!("colls={ALL_COLLS};dtypes=i32,f64;sizes=0,1,4099"),
            ),
        Case::new("pmpi::split_dup_n4", 4, "split_dup"),
    ];
    for c in &mut trapped {
        c.env.extend(trap.iter().cloned());
    }
    v.extend(trapped);
    v
}

fn main() {
    main_with(cases(), worker)
}

fn worker(scenario: &str) -> std::result::Result<(), String> {
    pmpi::check_trap()?;
    let universe = ok(gpucoll::initialize(), "initialize");
    let world = ok(universe.world(), "universe.world()");
    let r = match scenario {
        "coll" => scenario_coll(&world),
        "large" => scenario_large(&world),
        "immediate" => scenario_immediate(&world),
        "group" => scenario_group(&world),
        "split_dup" => scenario_split_dup(&world),
        "topology" => scenario_topology(&world),
        "threads" => scenario_threads(&world),
        other => Err(format!("unknown scenario {other}")),
    };
    // every rank reaches this point on the in-sync paths: agree on the verdict
    let mine = [r.is_err() as u32];
    let mut any = [0u32];
    ok(
        mpi::all_reduce(&world, &mine, &mut any, ReduceOp::Max),
        "reference::all_reduce(verdict)",
    );
    drop(world);
    drop(universe);
    match r {
        Err(e) => Err(e),
        Ok(()) if any[0] != 0 => Err("another rank failed (see its output)".into()),
        Ok(()) => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// The matrix scenario
// ---------------------------------------------------------------------------

// The collectives are gpucoll's own `CollKind` (parse, reduces, rooted).
use gpucoll::CollKind as Coll;

struct Ctx<'c> {
    world: &'c Communicator,
    rank: usize,
    n: usize,
    fails: Vec<String>,
    checks: usize,
}

fn all_ops() -> Vec<ReduceOp> {
    vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(PMS),
        // Integral: the only PreMulSum integer types take.
        ReduceOp::PreMulSum(3.0),
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
        ReduceOp::LogicalAnd,
        ReduceOp::LogicalOr,
        ReduceOp::LogicalXor,
    ]
}

fn scenario_coll(world: &Communicator) -> std::result::Result<(), String> {
    let colls: Vec<Coll> = param("colls")
        .unwrap_or(ALL_COLLS.into())
        .split(',')
        .map(|s| Coll::parse(s).unwrap_or_else(|| fail_now(&format!("unknown collective {s}"))))
        .collect();
    let dtypes: Vec<String> = param("dtypes")
        .unwrap_or(ALL_DTYPES.into())
        .split(',')
        .map(String::from)
        .collect();
    let sizes: Vec<usize> = param("sizes")
        .unwrap_or("0,1,1031,4099,300001".into())
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let modes: Vec<bool> = match param("modes").as_deref() {
        Some("oop") => vec![false],
        Some("ip") => vec![true],
        _ => vec![false, true],
    };
    let mut ctx = Ctx {
        world,
        rank: world.rank(),
        n: world.size(),
        fails: vec![],
        checks: 0,
    };
    if ctx.rank == 0 {
        log(&format!(
            "backend={} size={} nnodes={} colls={colls:?} dtypes={dtypes:?} sizes={sizes:?}",
            world.backend_name(),
            ctx.n,
            world.nnodes()
        ));
    }
    let t0 = Instant::now();
    for &coll in &colls {
        for (di, dt) in dtypes.iter().enumerate() {
            let tc = Instant::now();
            match dt.as_str() {
                "i8" => run_dtype::<i8>(&mut ctx, coll, di, &sizes, &modes),
                "u8" => run_dtype::<u8>(&mut ctx, coll, di, &sizes, &modes),
                "i32" => run_dtype::<i32>(&mut ctx, coll, di, &sizes, &modes),
                "u32" => run_dtype::<u32>(&mut ctx, coll, di, &sizes, &modes),
                "i64" => run_dtype::<i64>(&mut ctx, coll, di, &sizes, &modes),
                "u64" => run_dtype::<u64>(&mut ctx, coll, di, &sizes, &modes),
                "f16" => run_dtype::<f16>(&mut ctx, coll, di, &sizes, &modes),
                "bf16" => run_dtype::<bf16>(&mut ctx, coll, di, &sizes, &modes),
                "f32" => run_dtype::<f32>(&mut ctx, coll, di, &sizes, &modes),
                "f64" => run_dtype::<f64>(&mut ctx, coll, di, &sizes, &modes),
                other => fail_now(&format!("unknown dtype {other}")),
            }
            if ctx.rank == 0 {
                log(&format!(
                    "{coll:?}<{dt}> done in {:.2}s",
                    tc.elapsed().as_secs_f64()
                ));
            }
        }
    }
    log(&format!(
        "{} checks, {} failures, {:.1}s",
        ctx.checks,
        ctx.fails.len(),
        t0.elapsed().as_secs_f64()
    ));
    if ctx.fails.is_empty() {
        Ok(())
    } else {
        for f in ctx.fails.iter().take(40) {
            log(&format!("MISMATCH {f}"));
        }
        Err(format!("{} mismatching checks", ctx.fails.len()))
    }
}

fn run_dtype<T: El>(ctx: &mut Ctx, coll: Coll, di: usize, sizes: &[usize], modes: &[bool]) {
    let ops = if coll.reduces() {
        all_ops()
    } else {
        vec![ReduceOp::Sum]
    };
    let n = ctx.n;
    let mut roots = vec![n - 1, n / 2];
    roots.dedup();
    for (si, &size) in sizes.iter().enumerate() {
        // per-rank block for the collectives whose buffers hold count*size:
        // keep the total near `size` for the large sizes
        let per_rank_block = matches!(
            coll,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter
        );
        let count = if per_rank_block && size > 4099 {
            (size / n) | 1
        } else {
            size
        };
        let root = roots[(di + si) % roots.len()];
        for (oi, &op) in ops.iter().enumerate() {
            for &ip in modes {
                if coll == Coll::Broadcast && ip {
                    continue; // broadcast is in place by nature
                }
                let case_seed = seed_of(&[coll as u64, di as u64, si as u64, oi as u64, ip as u64]);
                run_one::<T>(ctx, coll, count, op, ip, root, case_seed);
            }
        }
    }
}

fn data_for(coll: Coll, op: ReduceOp) -> Data {
    if !coll.reduces() {
        Data::Bits
    } else if op == ReduceOp::Prod {
        Data::Prod
    } else if matches!(
        op,
        ReduceOp::LogicalAnd | ReduceOp::LogicalOr | ReduceOp::LogicalXor
    ) {
        Data::Logic
    } else {
        Data::Reduce
    }
}

/// Whether MPI itself can compute the expected result.
fn mpi_can<T: El>(op: ReduceOp) -> bool {
    !T::HALF
        && (matches!(
            op,
            ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max
        ) || (op.integer_only() && !T::FLOAT))
}

fn run_one<T: El>(
    ctx: &mut Ctx,
    coll: Coll,
    count: usize,
    op: ReduceOp,
    ip: bool,
    root: usize,
    case_seed: u64,
) {
    let (world, rank, n) = (ctx.world, ctx.rank, ctx.n);
    let label = format!(
        "{coll:?}<{}> n={n} count={count} op={op} {} root={}",
        T::DATATYPE,
        if ip { "in-place" } else { "out-of-place" },
        if coll.rooted() {
            root.to_string()
        } else {
            "-".into()
        }
    );
    let what = |s: &str| format!("{label}: {s}");
    if coll.is_scan() && op == ReduceOp::Avg {
        // A prefix of r+1 ranks cannot divide by the communicator's size:
        // a local, non-fatal argument error on every rank.
        let (send, mut out) = (vec![T::default(); count], vec![T::default(); count]);
        ctx.checks += 1;
        let res = if coll == Coll::Scan {
            world.scan_into(&send, &mut out, op)
        } else {
            world.exclusive_scan_into(&send, &mut out, op)
        };
        if !matches!(res, Err(Error::InvalidOp { .. })) {
            ctx.fails
                .push(what(&format!("expected InvalidOp, got {res:?}")));
        }
        return;
    }
    if coll.reduces() && !op.applies_to(T::DATATYPE) {
        // MPI defines bitwise and logical ops for integers only, and an
        // integer PreMulSum needs an integer scalar: a local, non-fatal
        // argument error on every rank.
        let (send, mut out) = (vec![T::default(); count], vec![T::default(); count]);
        ctx.checks += 1;
        match world.all_reduce_into(&send, &mut out, op) {
            Err(Error::InvalidOp { .. }) => {}
            other => ctx
                .fails
                .push(what(&format!("expected InvalidOp, got {other:?}"))),
        }
        return;
    }
    let data = data_for(coll, op);
    let in_len = match coll {
        Coll::ReduceScatter | Coll::AllToAll | Coll::Scatter => count * n,
        _ => count,
    };
    let send: Vec<T> = gen_vec(seed_of(&[case_seed, rank as u64]), in_len, data);

    // ---- expected result on this rank (None: this rank has no output) ----
    let full_reduce = |ctx_world: &Communicator| -> Expect<T> {
        if mpi_can::<T>(op) {
            let mut e = poisoned::<T>(in_len);
            ok(
                mpi::all_reduce(ctx_world, &send, &mut e, op),
                &what("reference::all_reduce"),
            );
            Expect::Exact(e)
        } else {
            local_reduce(&gather_inputs(ctx_world, &send), op)
        }
    };
    let has_output = match coll {
        Coll::Reduce | Coll::Gather => rank == root,
        _ => true,
    };
    let expected: Option<Expect<T>> = match coll {
        // zero elements: nothing to compute (and the MPI oracle rejects two
        // empty slices, see docs/TEST_FINDINGS.md)
        _ if count == 0 => has_output.then(|| Expect::Exact(Vec::new())),
        Coll::AllReduce => Some(full_reduce(world)),
        Coll::Reduce => {
            let e = if mpi_can::<T>(op) {
                let mut e = poisoned::<T>(count);
                ok(
                    mpi::reduce(world, &send, &mut e, op, root),
                    &what("reference::reduce"),
                );
                Expect::Exact(e)
            } else {
                local_reduce(&gather_inputs(world, &send), op)
            };
            (rank == root).then_some(e)
        }
        Coll::ReduceScatter => {
            if mpi_can::<T>(op) {
                let mut e = poisoned::<T>(count);
                ok(
                    mpi::reduce_scatter_block(world, &send, &mut e, op),
                    &what("reference::reduce_scatter_block"),
                );
                Some(Expect::Exact(e))
            } else {
                let full = local_reduce(&gather_inputs(world, &send), op);
                Some(full.slice(rank * count, (rank + 1) * count))
            }
        }
        Coll::Broadcast => {
            let mut e = send.clone();
            ok(
                mpi::broadcast(world, &mut e, root),
                &what("reference::broadcast"),
            );
            Some(Expect::Exact(e))
        }
        Coll::AllGather => {
            let mut e = poisoned::<T>(count * n);
            ok(
                mpi::all_gather(world, &send, &mut e),
                &what("reference::all_gather"),
            );
            Some(Expect::Exact(e))
        }
        Coll::AllToAll => {
            let mut e = poisoned::<T>(count * n);
            ok(
                mpi::all_to_all(world, &send, &mut e),
                &what("reference::all_to_all"),
            );
            Some(Expect::Exact(e))
        }
        Coll::Gather => {
            let mut e = poisoned::<T>(count * n);
            ok(
                mpi::gather(world, &send, &mut e, root),
                &what("reference::gather"),
            );
            (rank == root).then_some(Expect::Exact(e))
        }
        Coll::Scatter => {
            let mut e = poisoned::<T>(count);
            ok(
                mpi::scatter(world, &send, &mut e, root),
                &what("reference::scatter"),
            );
            Some(Expect::Exact(e))
        }
        // MPI's prefix where it has the op; else every rank's input and
        // the same local fold over ranks 0..=rank (0..rank exclusive).
        Coll::Scan | Coll::ExclusiveScan => {
            let exclusive = coll == Coll::ExclusiveScan;
            let upto = rank + usize::from(!exclusive);
            let e = if mpi_can::<T>(op) {
                let mut e = poisoned::<T>(count);
                let r = if exclusive {
                    mpi::exclusive_scan(world, &send, &mut e, op)
                } else {
                    mpi::scan(world, &send, &mut e, op)
                };
                ok(r, &what("reference::scan/exclusive_scan"));
                Expect::Exact(e)
            } else {
                let inputs = gather_inputs(world, &send);
                if upto == 0 {
                    Expect::Exact(Vec::new()) // rank 0 of exclusive_scan: below
                } else {
                    local_reduce(&inputs[..upto], op)
                }
            };
            // gpucoll never writes rank 0's output of an exclusive scan
            // (MPI leaves it undefined): it keeps the poison, or in place
            // the input.
            Some(match (upto == 0, ip) {
                (false, _) => e,
                (true, false) => Expect::Exact(poisoned::<T>(count)),
                (true, true) => Expect::Exact(send.clone()),
            })
        }
    };

    // ---- the gpucoll call, outputs poisoned ----
    let p = world.process_at_rank(root);
    let is_root = rank == root;
    let mut send_after = send.clone(); // for out-of-place: must stay unchanged
    let got: Option<Vec<T>> = match (coll, ip) {
        (Coll::AllReduce, false) => {
            let mut out = poisoned::<T>(count);
            ok(
                world.all_reduce_into(&send_after, &mut out, op),
                &what("all_reduce_into"),
            );
            Some(out)
        }
        (Coll::AllReduce, true) => {
            let mut buf = send.clone();
            ok(
                world.all_reduce_in_place(&mut buf, op),
                &what("all_reduce_in_place"),
            );
            Some(buf)
        }
        (Coll::Reduce, false) if is_root => {
            let mut out = poisoned::<T>(count);
            ok(
                p.reduce_into_root(&send_after, &mut out, op),
                &what("reduce_into_root"),
            );
            Some(out)
        }
        (Coll::Reduce, true) if is_root => {
            let mut buf = send.clone();
            ok(
                p.reduce_into_root_in_place(&mut buf, op),
                &what("reduce_into_root_in_place"),
            );
            Some(buf)
        }
        (Coll::Reduce, _) => {
            ok(p.reduce_into(&send_after, op), &what("reduce_into"));
            None
        }
        (Coll::Broadcast, _) => {
            let mut buf = if is_root {
                send.clone()
            } else {
                poisoned::<T>(count)
            };
            ok(p.broadcast_into(&mut buf), &what("broadcast_into"));
            if is_root {
                ctx.checks += 1;
                check_exact(&what("root buffer changed"), &buf, &send, &mut ctx.fails);
            }
            Some(buf)
        }
        (Coll::AllGather, false) => {
            let mut out = poisoned::<T>(count * n);
            ok(
                world.all_gather_into(&send_after, &mut out),
                &what("all_gather_into"),
            );
            Some(out)
        }
        (Coll::AllGather, true) => {
            let mut buf = poisoned::<T>(count * n);
            buf[rank * count..(rank + 1) * count].copy_from_slice(&send);
            ok(
                world.all_gather_in_place(&mut buf),
                &what("all_gather_in_place"),
            );
            Some(buf)
        }
        (Coll::ReduceScatter, false) => {
            let mut out = poisoned::<T>(count);
            ok(
                world.reduce_scatter_block_into(&send_after, &mut out, op),
                &what("reduce_scatter_block_into"),
            );
            Some(out)
        }
        (Coll::ReduceScatter, true) => {
            let mut buf = send.clone();
            ok(
                world.reduce_scatter_block_in_place(&mut buf, op),
                &what("reduce_scatter_block_in_place"),
            );
            buf.truncate(count);
            Some(buf)
        }
        (Coll::AllToAll, false) => {
            let mut out = poisoned::<T>(count * n);
            ok(
                world.all_to_all_into(&send_after, &mut out),
                &what("all_to_all_into"),
            );
            Some(out)
        }
        (Coll::AllToAll, true) => {
            let mut buf = send.clone();
            ok(
                world.all_to_all_in_place(&mut buf),
                &what("all_to_all_in_place"),
            );
            Some(buf)
        }
        (Coll::Gather, false) if is_root => {
            let mut out = poisoned::<T>(count * n);
            ok(
                p.gather_into_root(&send_after, &mut out),
                &what("gather_into_root"),
            );
            Some(out)
        }
        (Coll::Gather, true) if is_root => {
            let mut out = poisoned::<T>(count * n);
            out[root * count..(root + 1) * count].copy_from_slice(&send);
            ok(
                p.gather_into_root_in_place(&mut out),
                &what("gather_into_root_in_place"),
            );
            Some(out)
        }
        (Coll::Gather, _) => {
            ok(p.gather_into(&send_after), &what("gather_into"));
            None
        }
        (Coll::Scatter, false) if is_root => {
            let mut out = poisoned::<T>(count);
            ok(
                p.scatter_into_root(&send_after, &mut out),
                &what("scatter_into_root"),
            );
            Some(out)
        }
        (Coll::Scatter, true) if is_root => {
            ok(
                p.scatter_into_root_in_place(&mut send_after),
                &what("scatter_into_root_in_place"),
            );
            // the root's block stays in place; the whole send buffer must be unchanged
            Some(send_after[root * count..(root + 1) * count].to_vec())
        }
        (Coll::Scatter, _) => {
            let mut out = poisoned::<T>(count);
            ok(p.scatter_into(&mut out), &what("scatter_into"));
            Some(out)
        }
        (Coll::Scan, false) => {
            let mut out = poisoned::<T>(count);
            ok(
                world.scan_into(&send_after, &mut out, op),
                &what("scan_into"),
            );
            Some(out)
        }
        (Coll::Scan, true) => {
            let mut buf = send.clone();
            ok(world.scan_in_place(&mut buf, op), &what("scan_in_place"));
            Some(buf)
        }
        (Coll::ExclusiveScan, false) => {
            let mut out = poisoned::<T>(count);
            ok(
                world.exclusive_scan_into(&send_after, &mut out, op),
                &what("exclusive_scan_into"),
            );
            Some(out)
        }
        (Coll::ExclusiveScan, true) => {
            let mut buf = send.clone();
            ok(
                world.exclusive_scan_in_place(&mut buf, op),
                &what("exclusive_scan_in_place"),
            );
            Some(buf)
        }
    };
    // inputs of out-of-place calls (and of the non-root/in-place-root cases above) must not change
    ctx.checks += 1;
    check_exact(
        &what("send buffer modified"),
        &send_after,
        &send,
        &mut ctx.fails,
    );
    match (got, expected) {
        (Some(g), Some(e)) => {
            ctx.checks += 1;
            check(&what("result"), &g, &e, &mut ctx.fails);
        }
        (None, None) => {}
        (g, e) => ctx.fails.push(what(&format!(
            "test bug: output present={} expected present={}",
            g.is_some(),
            e.is_some()
        ))),
    }
}

// ---------------------------------------------------------------------------
// Large all_reduce
// ---------------------------------------------------------------------------

fn scenario_large(world: &Communicator) -> std::result::Result<(), String> {
    let (rank, n) = (world.rank(), world.size());
    let len = 16 << 20; // 16 Mi f32 = 64 MiB
                        // small integers: every partial sum is exact in f32, in any order
    let val =
        |r: usize, i: usize| (((i.wrapping_mul(2654435761) >> 7) + r * 13) % 61) as f32 - 30.0;
    let send: Vec<f32> = (0..len).map(|i| val(rank, i)).collect();
    let mut fails = vec![];
    for iter in 0..2 {
        let t0 = Instant::now();
        let mut out = vec![f32::from_bits(0x7f80_0001); len]; // poison (NaN)
        if iter == 0 {
            ok(
                world.all_reduce_into(&send, &mut out, ReduceOp::Sum),
                "all_reduce_into 64MiB",
            );
        } else {
            out.copy_from_slice(&send);
            ok(
                world.all_reduce_in_place(&mut out, ReduceOp::Sum),
                "all_reduce_in_place 64MiB",
            );
        }
        let dt = t0.elapsed().as_secs_f64();
        let exp: Vec<f32> = (0..len).map(|i| (0..n).map(|r| val(r, i)).sum()).collect();
        check_exact(
            &format!("large all_reduce f32 x {len} iter {iter}"),
            &out,
            &exp,
            &mut fails,
        );
        if rank == 0 {
            log(&format!(
                "iter {iter}: 64 MiB all_reduce in {dt:.3}s ({:.2} GB/s algbw)",
                (len * 4) as f64 / dt / 1e9
            ));
        }
    }
    // cross-check a slice with MPI itself
    let k = 1 << 20;
    let mut a = vec![0f32; k];
    let mut b = vec![0f32; k];
    ok(
        mpi::all_reduce(world, &send[..k], &mut a, ReduceOp::Sum),
        "reference::all_reduce",
    );
    ok(
        world.all_reduce_into(&send[..k], &mut b, ReduceOp::Sum),
        "all_reduce_into 4MiB",
    );
    check_exact("large vs MPI (first 1Mi)", &b, &a, &mut fails);
    if fails.is_empty() {
        Ok(())
    } else {
        Err(fails.join("\n"))
    }
}

// ---------------------------------------------------------------------------
// Immediate collectives
// ---------------------------------------------------------------------------

fn scenario_immediate(world: &Communicator) -> std::result::Result<(), String> {
    let (rank, n) = (world.rank(), world.size());
    let root = n - 1;
    let p = world.process_at_rank(root);
    let is_root = rank == root;
    let mut fails = vec![];
    for round in 0..3u64 {
        let c = [1usize, 1031, 70001][round as usize];
        let sd = |k: u64| seed_of(&[round, k, rank as u64]);
        let a: Vec<i32> = gen_vec(sd(1), c, Data::Bits);
        let mut a_out = poisoned::<i32>(c);
        let mut ip: Vec<f64> = gen_vec(sd(2), c, Data::Reduce);
        let ip_in = ip.clone();
        let g_in: Vec<u8> = gen_vec(sd(3), c, Data::Bits);
        let mut g_out = poisoned::<u8>(c * n);
        let mut bc: Vec<f32> = if is_root {
            gen_vec(sd(4), c, Data::Bits)
        } else {
            poisoned(c)
        };
        let bc_in = bc.clone();
        let rs_in: Vec<u64> = gen_vec(sd(5), c * n, Data::Bits);
        let mut rs_out = poisoned::<u64>(c);
        let aa_in: Vec<bf16> = gen_vec(sd(6), c * n, Data::Bits);
        let mut aa_out = poisoned::<bf16>(c * n);
        let red_in: Vec<i64> = gen_vec(sd(7), c, Data::Bits);
        let mut red_out = poisoned::<i64>(c);
        let ga_in: Vec<f16> = gen_vec(sd(8), c, Data::Bits);
        let mut ga_out = poisoned::<f16>(c * n);
        let sc_in: Vec<u32> = gen_vec(sd(9), c * n, Data::Bits);
        let mut sc_out = poisoned::<u32>(c);
        let many_in: Vec<Vec<u32>> = (0..8)
            .map(|k| gen_vec(sd(100 + k), 17 * (k as usize + 1), Data::Bits))
            .collect();
        let mut many_out: Vec<Vec<u32>> = many_in.iter().map(|v| poisoned(v.len())).collect();
        let scan_in: Vec<u64> = gen_vec(sd(10), c, Data::Bits);
        let mut scan_out = poisoned::<u64>(c);
        let mut ex_buf: Vec<i32> = gen_vec(sd(11), c, Data::Bits);
        let ex_in = ex_buf.clone();

        let mut polls = 0u64;
        let res: gpucoll::Result<()> = gpucoll::scope(|s| {
            let r1 = world.immediate_all_reduce_into(s, &a, &mut a_out, ReduceOp::Sum)?;
            let r2 = world.immediate_all_reduce_in_place(s, &mut ip, ReduceOp::Max)?;
            let r3 = world.immediate_all_gather_into(s, &g_in, &mut g_out)?;
            let r4 = p.immediate_broadcast_into(s, &mut bc)?;
            let r5 =
                world.immediate_reduce_scatter_block_into(s, &rs_in, &mut rs_out, ReduceOp::Sum)?;
            let r6 = world.immediate_all_to_all_into(s, &aa_in, &mut aa_out)?;
            let r7 = if is_root {
                p.immediate_reduce_into_root(s, &red_in, &mut red_out, ReduceOp::Min)?
            } else {
                p.immediate_reduce_into(s, &red_in, ReduceOp::Min)?
            };
            let r8 = if is_root {
                p.immediate_gather_into_root(s, &ga_in, &mut ga_out)?
            } else {
                p.immediate_gather_into(s, &ga_in)?
            };
            let r9 = if is_root {
                p.immediate_scatter_into_root(s, &sc_in, &mut sc_out)?
            } else {
                p.immediate_scatter_into(s, &mut sc_out)?
            };
            let r10 = world.immediate_scan_into(s, &scan_in, &mut scan_out, ReduceOp::Sum)?;
            let r11 = world.immediate_exclusive_scan_in_place(s, &mut ex_buf, ReduceOp::Max)?;
            let mut many = Vec::new();
            for (i, o) in many_in.iter().zip(many_out.iter_mut()) {
                many.push(world.immediate_all_reduce_into(s, i, o, ReduceOp::Sum)?);
            }
            // poll the first one to completion with test()
            let deadline = Instant::now() + Duration::from_secs(120);
            while !r1.test()? {
                polls += 1;
                if Instant::now() > deadline {
                    fail_now("immediate all_reduce: test() never returned true within 120 s");
                }
                std::thread::yield_now();
            }
            // test() after completion stays true; wait() after test() succeeds
            if !r1.test()? {
                fail_now("test() returned false after it had returned true");
            }
            r1.wait()?;
            // wait the rest in reverse order of issue
            for r in many.into_iter().rev() {
                r.wait()?;
            }
            r11.wait()?;
            r10.wait()?;
            r9.wait()?;
            r8.wait()?;
            r7.wait()?;
            // poll r6 too
            while !r6.test()? {
                std::thread::yield_now();
            }
            r6.wait()?;
            r5.wait()?;
            r4.wait()?;
            r3.wait()?;
            r2.wait()?;
            Ok(())
        });
        ok(res, &format!("immediate round {round}"));
        // oracles (MPI)
        let lab = |s: &str| format!("immediate round {round} count {c}: {s}");
        let mut e = poisoned::<i32>(c);
        ok(mpi::all_reduce(world, &a, &mut e, ReduceOp::Sum), "ref");
        check_exact(&lab("all_reduce i32 sum"), &a_out, &e, &mut fails);
        let mut e = poisoned::<f64>(c);
        ok(mpi::all_reduce(world, &ip_in, &mut e, ReduceOp::Max), "ref");
        check_exact(&lab("all_reduce_in_place f64 max"), &ip, &e, &mut fails);
        let mut e = poisoned::<u8>(c * n);
        ok(mpi::all_gather(world, &g_in, &mut e), "ref");
        check_exact(&lab("all_gather u8"), &g_out, &e, &mut fails);
        let mut e = bc_in.clone();
        ok(mpi::broadcast(world, &mut e, root), "ref");
        check_exact(&lab("broadcast f32"), &bc, &e, &mut fails);
        let mut e = poisoned::<u64>(c);
        ok(
            mpi::reduce_scatter_block(world, &rs_in, &mut e, ReduceOp::Sum),
            "ref",
        );
        check_exact(&lab("reduce_scatter u64 sum"), &rs_out, &e, &mut fails);
        let mut e = poisoned::<bf16>(c * n);
        ok(mpi::all_to_all(world, &aa_in, &mut e), "ref");
        check_exact(&lab("all_to_all bf16"), &aa_out, &e, &mut fails);
        let mut e = poisoned::<i64>(c);
        ok(
            mpi::reduce(world, &red_in, &mut e, ReduceOp::Min, root),
            "ref",
        );
        if is_root {
            check_exact(&lab("reduce i64 min"), &red_out, &e, &mut fails);
        } else {
            check_exact(
                &lab("reduce: non-root output touched"),
                &red_out,
                &poisoned(c),
                &mut fails,
            );
        }
        let mut e = poisoned::<f16>(c * n);
        ok(mpi::gather(world, &ga_in, &mut e, root), "ref");
        if is_root {
            check_exact(&lab("gather f16"), &ga_out, &e, &mut fails);
        } else {
            check_exact(
                &lab("gather: non-root output touched"),
                &ga_out,
                &poisoned(c * n),
                &mut fails,
            );
        }
        let mut e = poisoned::<u32>(c);
        ok(mpi::scatter(world, &sc_in, &mut e, root), "ref");
        check_exact(&lab("scatter u32"), &sc_out, &e, &mut fails);
        let mut e = poisoned::<u64>(c);
        ok(mpi::scan(world, &scan_in, &mut e, ReduceOp::Sum), "ref");
        check_exact(&lab("scan u64 sum"), &scan_out, &e, &mut fails);
        let mut e = poisoned::<i32>(c);
        ok(
            mpi::exclusive_scan(world, &ex_in, &mut e, ReduceOp::Max),
            "ref",
        );
        if rank == 0 {
            e = ex_in.clone(); // never written on rank 0
        }
        check_exact(
            &lab("exclusive_scan_in_place i32 max"),
            &ex_buf,
            &e,
            &mut fails,
        );
        for (k, (i, o)) in many_in.iter().zip(&many_out).enumerate() {
            let mut e = poisoned::<u32>(i.len());
            ok(mpi::all_reduce(world, i, &mut e, ReduceOp::Sum), "ref");
            check_exact(
                &lab(&format!("outstanding all_reduce #{k}")),
                o,
                &e,
                &mut fails,
            );
        }
        if rank == 0 {
            log(&format!(
                "round {round}: {polls} test() polls before completion"
            ));
        }
    }
    // a request dropped without wait still completes (scope end waits)
    let x = vec![rank as u64 + 1; 33];
    let mut y = poisoned::<u64>(33);
    let res: gpucoll::Result<()> = gpucoll::scope(|s| {
        let _r = world.immediate_all_reduce_into(s, &x, &mut y, ReduceOp::Sum)?;
        Ok(())
    });
    ok(res, "immediate dropped request");
    let tot = (n * (n + 1) / 2) as u64;
    check_exact("dropped request result", &y, &vec![tot; 33], &mut fails);
    immediate_raw_checks(world, &mut fails);
    if fails.is_empty() {
        Ok(())
    } else {
        Err(fails.join("\n"))
    }
}

/// `immediate_raw_collective`: two overlapping requests (one tested to
/// completion, one waited), an in-place reduce, and a dropped request.
fn immediate_raw_checks(world: &Communicator, fails: &mut Vec<String>) {
    use gpucoll::CollKind;
    let (rank, n) = (world.rank(), world.size());
    let root = n - 1;
    let a: Vec<u32> = gen_vec(seed_of(&[51, rank as u64]), 4099, Data::Bits);
    let mut a_out = poisoned::<u32>(a.len());
    let b: Vec<i64> = gen_vec(seed_of(&[52, rank as u64]), 1031, Data::Logic);
    let mut b_out = poisoned::<i64>(b.len() * n);
    let mut r_buf: Vec<u8> = gen_vec(seed_of(&[53, rank as u64]), 77, Data::Bits);
    let r_in = r_buf.clone();
    let all_reduce = CollKind::AllReduce;
    let (s1, r1) = (Some(a.raw()), Some(a_out.raw_mut()));
    // SAFETY: every buffer outlives the request waited on (or tested to
    // completion) below, and nothing touches them meanwhile.
    let started =
        unsafe { world.immediate_raw_collective(all_reduce, s1, r1, ReduceOp::BitXor, 0, false) };
    let mut first = ok(started, "immediate_raw_collective(all_reduce)");
    let (s2, r2) = (Some(b.raw()), Some(b_out.raw_mut()));
    // SAFETY: as above.
    let second = ok(
        unsafe {
            world.immediate_raw_collective(CollKind::AllGather, s2, r2, ReduceOp::Sum, 0, false)
        },
        "immediate_raw_collective(all_gather)",
    );
    let t0 = Instant::now();
    while !ok(first.test(), "RawRequest::test") {
        if t0.elapsed() > Duration::from_secs(60) {
            fails.push("raw request: test() never completed".into());
            break;
        }
        std::thread::yield_now();
    }
    if !ok(first.test(), "RawRequest::test after completion") {
        fails.push("raw request: test() after completion returned false".into());
    }
    ok(second.wait(), "RawRequest::wait");
    // MPI's rule: only the root reduces in place; the others send their block.
    let at_root = rank == root;
    let (s3, r3) = if at_root {
        (None, Some(r_buf.raw_mut()))
    } else {
        (Some(r_buf.raw()), None)
    };
    // SAFETY: as above; the request is dropped (which waits) before use.
    let dropped = unsafe {
        world.immediate_raw_collective(CollKind::Reduce, s3, r3, ReduceOp::Max, root, at_root)
    };
    drop(ok(dropped, "immediate_raw_collective(reduce in place)"));
    let mut e = poisoned::<u32>(a.len());
    ok(mpi::all_reduce(world, &a, &mut e, ReduceOp::BitXor), "ref");
    check_exact("raw immediate all_reduce bxor", &a_out, &e, fails);
    let mut e = poisoned::<i64>(b.len() * n);
    ok(mpi::all_gather(world, &b, &mut e), "ref");
    check_exact("raw immediate all_gather", &b_out, &e, fails);
    let mut e = poisoned::<u8>(r_in.len());
    ok(
        mpi::reduce(world, &r_in, &mut e, ReduceOp::Max, root),
        "ref",
    );
    if rank == root {
        check_exact("raw immediate reduce in place", &r_buf, &e, fails);
    }
}

// ---------------------------------------------------------------------------
// Groups
// ---------------------------------------------------------------------------

fn scenario_group(world: &Communicator) -> std::result::Result<(), String> {
    let (rank, n) = (world.rank(), world.size());
    let root = n / 2;
    let root2 = n - 1;
    let is_root = rank == root;
    let mut fails = vec![];
    for round in 0..3u64 {
        let c = [1usize, 4099, 100003][round as usize];
        let sd = |k: u64| seed_of(&[round, k, rank as u64, 77]);
        let a: Vec<f32> = gen_vec(sd(1), c, Data::Reduce);
        let mut a_out = poisoned::<f32>(c);
        let mut bc: Vec<i8> = if rank == root2 {
            gen_vec(sd(2), c, Data::Bits)
        } else {
            poisoned(c)
        };
        let bc_in = bc.clone();
        let x: Vec<u64> = gen_vec(sd(3), c, Data::Bits);
        let mut y = poisoned::<u64>(c * n);
        let rs: Vec<i32> = gen_vec(sd(4), c * n, Data::Bits);
        let mut rs_out = poisoned::<i32>(c);
        let aa: Vec<f64> = gen_vec(sd(5), c * n, Data::Bits);
        let mut aa_out = poisoned::<f64>(c * n);
        let red: Vec<u32> = gen_vec(sd(6), c, Data::Bits);
        let mut red_out = poisoned::<u32>(c);
        let ga: Vec<f16> = gen_vec(sd(7), c, Data::Bits);
        let mut ga_out = poisoned::<f16>(c * n);
        let sc: Vec<bf16> = gen_vec(sd(8), c * n, Data::Bits);
        let mut sc_out = poisoned::<bf16>(c);
        let mut ipb: Vec<i64> = gen_vec(sd(9), c, Data::Bits);
        let ipb_in = ipb.clone();
        let small_in: Vec<Vec<u8>> = (0..20)
            .map(|k| gen_vec(sd(200 + k), k as usize + 1, Data::Bits))
            .collect();
        let mut small_out: Vec<Vec<u8>> = small_in.iter().map(|v| poisoned(v.len())).collect();
        let mut scan_buf: Vec<f32> = gen_vec(sd(13), c, Data::Reduce);
        let scan_in = scan_buf.clone();
        let ex: Vec<u32> = gen_vec(sd(14), c, Data::Bits);
        let mut ex_out = poisoned::<u32>(c);

        ok(
            world.group(|g| {
                g.scan_in_place(&mut scan_buf, ReduceOp::Sum)?;
                g.exclusive_scan_into(&ex, &mut ex_out, ReduceOp::BitXor)?;
                g.all_reduce_into(&a, &mut a_out, ReduceOp::Sum)?;
                g.process_at_rank(root2).broadcast_into(&mut bc)?;
                g.all_gather_into(&x, &mut y)?;
                g.reduce_scatter_block_into(&rs, &mut rs_out, ReduceOp::Max)?;
                g.all_to_all_into(&aa, &mut aa_out)?;
                if is_root {
                    g.process_at_rank(root)
                        .reduce_into_root(&red, &mut red_out, ReduceOp::Prod)?;
                    g.process_at_rank(root).gather_into_root(&ga, &mut ga_out)?;
                    g.process_at_rank(root)
                        .scatter_into_root(&sc, &mut sc_out)?;
                } else {
                    g.process_at_rank(root).reduce_into(&red, ReduceOp::Prod)?;
                    g.process_at_rank(root).gather_into(&ga)?;
                    g.process_at_rank(root).scatter_into(&mut sc_out)?;
                }
                g.all_reduce_in_place(&mut ipb, ReduceOp::Min)?;
                for (i, o) in small_in.iter().zip(small_out.iter_mut()) {
                    g.all_reduce_into(i, o, ReduceOp::Sum)?;
                }
                Ok(())
            }),
            &format!("group round {round}"),
        );
        let lab = |s: &str| format!("group round {round} count {c}: {s}");
        let mut e = poisoned::<f32>(c);
        ok(mpi::all_reduce(world, &a, &mut e, ReduceOp::Sum), "ref");
        check_exact(&lab("all_reduce f32 sum"), &a_out, &e, &mut fails);
        let mut e = bc_in.clone();
        ok(mpi::broadcast(world, &mut e, root2), "ref");
        check_exact(&lab("broadcast i8"), &bc, &e, &mut fails);
        let mut e = poisoned::<u64>(c * n);
        ok(mpi::all_gather(world, &x, &mut e), "ref");
        check_exact(&lab("all_gather u64"), &y, &e, &mut fails);
        let mut e = poisoned::<i32>(c);
        ok(
            mpi::reduce_scatter_block(world, &rs, &mut e, ReduceOp::Max),
            "ref",
        );
        check_exact(&lab("reduce_scatter i32 max"), &rs_out, &e, &mut fails);
        let mut e = poisoned::<f64>(c * n);
        ok(mpi::all_to_all(world, &aa, &mut e), "ref");
        check_exact(&lab("all_to_all f64"), &aa_out, &e, &mut fails);
        let mut e = poisoned::<u32>(c);
        ok(
            mpi::reduce(world, &red, &mut e, ReduceOp::Prod, root),
            "ref",
        );
        if is_root {
            check_exact(&lab("reduce u32 prod"), &red_out, &e, &mut fails);
        }
        let mut e = poisoned::<f16>(c * n);
        ok(mpi::gather(world, &ga, &mut e, root), "ref");
        if is_root {
            check_exact(&lab("gather f16"), &ga_out, &e, &mut fails);
        }
        let mut e = poisoned::<bf16>(c);
        ok(mpi::scatter(world, &sc, &mut e, root), "ref");
        check_exact(&lab("scatter bf16"), &sc_out, &e, &mut fails);
        let mut e = poisoned::<i64>(c);
        ok(
            mpi::all_reduce(world, &ipb_in, &mut e, ReduceOp::Min),
            "ref",
        );
        check_exact(&lab("all_reduce_in_place i64 min"), &ipb, &e, &mut fails);
        for (k, (i, o)) in small_in.iter().zip(&small_out).enumerate() {
            let mut e = poisoned::<u8>(i.len());
            ok(mpi::all_reduce(world, i, &mut e, ReduceOp::Sum), "ref");
            check_exact(&lab(&format!("small all_reduce #{k}")), o, &e, &mut fails);
        }
        let mut e = poisoned::<f32>(c);
        ok(mpi::scan(world, &scan_in, &mut e, ReduceOp::Sum), "ref");
        check_exact(&lab("scan_in_place f32 sum"), &scan_buf, &e, &mut fails);
        let mut e = poisoned::<u32>(c);
        ok(
            mpi::exclusive_scan(world, &ex, &mut e, ReduceOp::BitXor),
            "ref",
        );
        if rank == 0 {
            e = poisoned(c); // never written on rank 0
        }
        check_exact(&lab("exclusive_scan u32 bxor"), &ex_out, &e, &mut fails);

        // the rooted in-place forms, grouped
        let rip_in: Vec<u32> = gen_vec(sd(10), c, Data::Bits);
        let mut rip = rip_in.clone();
        let gip_mine: Vec<i32> = gen_vec(sd(11), c, Data::Bits);
        let mut gip = poisoned::<i32>(c * n);
        gip[root * c..(root + 1) * c].copy_from_slice(&gip_mine);
        let sip_in: Vec<u64> = gen_vec(sd(12), c * n, Data::Bits);
        let mut sip = sip_in.clone();
        let mut sip_out = poisoned::<u64>(c);
        ok(
            world.group(|g| {
                if is_root {
                    g.process_at_rank(root)
                        .reduce_into_root_in_place(&mut rip, ReduceOp::BitXor)?;
                    g.process_at_rank(root)
                        .gather_into_root_in_place(&mut gip)?;
                    g.process_at_rank(root).scatter_into_root_in_place(&mut sip)
                } else {
                    g.process_at_rank(root)
                        .reduce_into(&rip_in, ReduceOp::BitXor)?;
                    g.process_at_rank(root).gather_into(&gip_mine)?;
                    g.process_at_rank(root).scatter_into(&mut sip_out)
                }
            }),
            &format!("group in place round {round}"),
        );
        let mut e = poisoned::<u32>(c);
        ok(
            mpi::reduce(world, &rip_in, &mut e, ReduceOp::BitXor, root),
            "ref",
        );
        let mut eg = poisoned::<i32>(c * n);
        ok(mpi::gather(world, &gip_mine, &mut eg, root), "ref");
        let mut es = poisoned::<u64>(c);
        ok(mpi::scatter(world, &sip_in, &mut es, root), "ref");
        if is_root {
            check_exact(
                &lab("reduce_into_root_in_place u32 bxor"),
                &rip,
                &e,
                &mut fails,
            );
            check_exact(&lab("gather_into_root_in_place i32"), &gip, &eg, &mut fails);
            check_exact(
                &lab("scatter_into_root_in_place u64 (send kept)"),
                &sip,
                &sip_in,
                &mut fails,
            );
        } else {
            check_exact(
                &lab("scatter_into (in-place root) u64"),
                &sip_out,
                &es,
                &mut fails,
            );
        }
    }
    // an empty group is a no-op; a group whose closure fails runs nothing
    ok(world.group(|_g| Ok(())), "empty group");
    let v = vec![1u32; 5];
    let mut w = poisoned::<u32>(5);
    let r = world.group(|g| {
        g.all_reduce_into(&v, &mut w, ReduceOp::Sum)?;
        Err(Error::InvalidUsage("test aborts the group".into()))
    });
    if r.is_ok() {
        fails.push("group whose closure returned Err reported Ok".into());
    }
    check_exact("aborted group must not run", &w, &poisoned(5), &mut fails);
    // and the communicator still works
    let mut w = poisoned::<u32>(5);
    ok(
        world.all_reduce_into(&v, &mut w, ReduceOp::Sum),
        "all_reduce after aborted group",
    );
    check_exact(
        "all_reduce after aborted group",
        &w,
        &[n as u32; 5],
        &mut fails,
    );
    if fails.is_empty() {
        Ok(())
    } else {
        Err(fails.join("\n"))
    }
}

// ---------------------------------------------------------------------------
// split / duplicate
// ---------------------------------------------------------------------------

fn sub_collectives(comm: &Communicator, tag: &str, fails: &mut Vec<String>) {
    let (rank, n) = (comm.rank(), comm.size());
    for &c in &[1usize, 1031, 65537] {
        let sd = |k: u64| seed_of(&[k, rank as u64, c as u64, tag.len() as u64]);
        let lab = |s: &str| format!("{tag} (size {n}) count {c}: {s}");
        let a: Vec<i32> = gen_vec(sd(1), c, Data::Bits);
        let mut got = poisoned::<i32>(c);
        let mut e = poisoned::<i32>(c);
        ok(
            comm.all_reduce_into(&a, &mut got, ReduceOp::Sum),
            &lab("all_reduce"),
        );
        ok(mpi::all_reduce(comm, &a, &mut e, ReduceOp::Sum), "ref");
        check_exact(&lab("all_reduce i32 sum"), &got, &e, fails);

        let x: Vec<f64> = gen_vec(sd(2), c, Data::Bits);
        let mut got = poisoned::<f64>(c * n);
        let mut e = poisoned::<f64>(c * n);
        ok(comm.all_gather_into(&x, &mut got), &lab("all_gather"));
        ok(mpi::all_gather(comm, &x, &mut e), "ref");
        check_exact(&lab("all_gather f64"), &got, &e, fails);

        let root = n - 1;
        let mut b: Vec<u8> = if rank == root {
            gen_vec(sd(3), c, Data::Bits)
        } else {
            poisoned(c)
        };
        let mut e = b.clone();
        ok(
            comm.process_at_rank(root).broadcast_into(&mut b),
            &lab("broadcast"),
        );
        ok(mpi::broadcast(comm, &mut e, root), "ref");
        check_exact(&lab("broadcast u8"), &b, &e, fails);

        let rs: Vec<f16> = gen_vec(sd(4), c * n, Data::Reduce);
        let mut got = poisoned::<f16>(c);
        ok(
            comm.reduce_scatter_block_into(&rs, &mut got, ReduceOp::Sum),
            &lab("reduce_scatter"),
        );
        let full = local_reduce(&gather_inputs(comm, &rs), ReduceOp::Sum);
        check(
            &lab("reduce_scatter f16 sum"),
            &got,
            &full.slice(rank * c, (rank + 1) * c),
            fails,
        );

        // The prefix follows this communicator's ranks, not the world's.
        let sc: Vec<i64> = gen_vec(sd(6), c, Data::Bits);
        let mut got = poisoned::<i64>(c);
        ok(comm.scan_into(&sc, &mut got, ReduceOp::Sum), &lab("scan"));
        let mut e = poisoned::<i64>(c);
        ok(mpi::scan(comm, &sc, &mut e, ReduceOp::Sum), "ref");
        check_exact(&lab("scan i64 sum"), &got, &e, fails);
        let mut got = poisoned::<i64>(c);
        ok(
            comm.exclusive_scan_into(&sc, &mut got, ReduceOp::BitOr),
            &lab("exclusive_scan"),
        );
        let mut e = poisoned::<i64>(c);
        ok(
            mpi::exclusive_scan(comm, &sc, &mut e, ReduceOp::BitOr),
            "ref",
        );
        if rank == 0 {
            e = poisoned(c);
        }
        check_exact(&lab("exclusive_scan i64 bor"), &got, &e, fails);

        let g: Vec<u64> = gen_vec(sd(5), c, Data::Bits);
        let r0 = n / 2;
        let mut e = poisoned::<u64>(c * n);
        ok(mpi::gather(comm, &g, &mut e, r0), "ref");
        if rank == r0 {
            let mut got = poisoned::<u64>(c * n);
            ok(
                comm.process_at_rank(r0).gather_into_root(&g, &mut got),
                &lab("gather"),
            );
            check_exact(&lab("gather u64"), &got, &e, fails);
        } else {
            ok(comm.process_at_rank(r0).gather_into(&g), &lab("gather"));
        }
    }
}

/// `Communicator::from_raw_mpi[_on_device]` over MPI_COMM_WORLD. The host
/// backend ignores the device (a made-up ordinal must work); the CUDA
/// backend must put the explicit form on the named GPU.
fn from_raw_mpi_checks(world: &Communicator, fails: &mut Vec<String>) {
    let raw = gpucoll::mpi::MpiComm::world().raw();
    // SAFETY: MPI_COMM_WORLD is valid while MPI is initialized.
    let plain = ok(unsafe { Communicator::from_raw_mpi(raw) }, "from_raw_mpi");
    let device = world.device().unwrap_or(7);
    let placed = ok(
        // SAFETY: as above.
        unsafe { Communicator::from_raw_mpi_on_device(raw, device) },
        "from_raw_mpi_on_device",
    );
    if world.device().is_some() && placed.device() != Some(device) {
        fails.push(format!(
            "from_raw_mpi_on_device({device}): runs on GPU {:?}",
            placed.device()
        ));
    }
    for (c, what) in [
        (&plain, "from_raw_mpi"),
        (&placed, "from_raw_mpi_on_device"),
    ] {
        if c.rank() != world.rank() || c.size() != world.size() {
            fails.push(format!("{what}: rank/size differ from the world's"));
        }
        sub_collectives(c, what, fails);
    }
}

fn scenario_split_dup(world: &Communicator) -> std::result::Result<(), String> {
    let (rank, n) = (world.rank(), world.size());
    let mut fails = vec![];
    // even / odd, ordered by descending world rank (key = -rank)
    let sub = ok(
        world.split(Some((rank % 2) as u32), -(rank as i32)),
        "split even/odd",
    )
    .ok_or("split with a color returned None")?;
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == rank % 2).rev().collect();
    if sub.size() != members.len() {
        fails.push(format!(
            "split: size {} expected {}",
            sub.size(),
            members.len()
        ));
    }
    let want_rank = members.iter().position(|&r| r == rank).unwrap();
    if sub.rank() != want_rank {
        fails.push(format!(
            "split: rank {} expected {} (key ordering)",
            sub.rank(),
            want_rank
        ));
    }
    // a split runs on its parent's GPU (issue 9: it used to pick its own)
    if sub.device() != world.device() {
        fails.push(format!(
            "split: runs on GPU {:?}, its parent on {:?}",
            sub.device(),
            world.device()
        ));
    }
    // collectives on both halves at once, interleaved with the world
    sub_collectives(&sub, "split even/odd", &mut fails);
    sub_collectives(world, "world after split", &mut fails);

    // a color of None: rank 0 gets no communicator
    let color = if rank == 0 { None } else { Some(7) };
    let rest = ok(world.split(color, 0), "split with None color");
    match (rank, &rest) {
        (0, Some(_)) => fails.push("split(None) returned a communicator".into()),
        (0, None) => {}
        (_, None) => fails.push("split(Some) returned None".into()),
        (_, Some(c)) => {
            if c.size() != n - 1 || c.rank() != rank - 1 {
                fails.push(format!(
                    "split(rest): size {} rank {} expected {} {}",
                    c.size(),
                    c.rank(),
                    n - 1,
                    rank - 1
                ));
            }
            sub_collectives(c, "split without rank 0", &mut fails);
        }
    }

    // duplicate: independent communicator with the same ranks
    let dup = ok(world.duplicate(), "duplicate");
    if dup.rank() != rank || dup.size() != n {
        fails.push("duplicate: rank/size differ".into());
    }
    if dup.device() != world.device() {
        fails.push("duplicate: runs on another GPU than its parent".into());
    }
    from_raw_mpi_checks(world, &mut fails);
    // interleave calls on world and dup
    for i in 0..4u64 {
        let c = 1000 + i as usize * 7;
        let comm = if i % 2 == 0 { &dup } else { world };
        let a: Vec<u32> = gen_vec(seed_of(&[i, rank as u64, 9]), c, Data::Bits);
        let mut got = poisoned::<u32>(c);
        let mut e = poisoned::<u32>(c);
        ok(
            comm.all_reduce_into(&a, &mut got, ReduceOp::Max),
            "dup/world all_reduce",
        );
        ok(mpi::all_reduce(comm, &a, &mut e, ReduceOp::Max), "ref");
        check_exact(&format!("dup/world interleaved #{i}"), &got, &e, &mut fails);
    }
    sub_collectives(&dup, "duplicate", &mut fails);
    // duplicate_with: other settings on the same ranks (here a forced tree
    // across two simulated nodes), the parent's unchanged.
    let forced = ok(
        gpucoll::Config::from_lookup(|var| match var {
            "GPUCOLL_ALGO" => Some("tree".into()),
            "GPUCOLL_SIM_NODES" => Some("2".into()),
            other => std::env::var(other).ok(),
        }),
        "config",
    );
    let tree = ok(world.duplicate_with(forced.clone()), "duplicate_with");
    if tree.config() != &forced || tree.rank() != rank || tree.size() != n {
        fails.push("duplicate_with: settings, rank or size differ from what was asked".into());
    }
    if world.config().algo.is_some() && std::env::var("GPUCOLL_ALGO").is_err() {
        fails.push("duplicate_with changed the parent's settings".into());
    }
    if n >= 2 && tree.nnodes() != 2 {
        fails.push(format!(
            "duplicate_with GPUCOLL_SIM_NODES=2: {} nodes",
            tree.nnodes()
        ));
    }
    sub_collectives(
        &tree,
        "duplicate_with tree on 2 simulated nodes",
        &mut fails,
    );
    drop(tree);
    let dup2 = ok(sub.duplicate(), "duplicate of a split");
    sub_collectives(&dup2, "duplicate of split", &mut fails);

    // free: later calls fail with CommunicatorFreed, the world still works
    ok(dup.free(), "free");
    let a = vec![1i32; 4];
    let mut b = vec![0i32; 4];
    match dup.all_reduce_into(&a, &mut b, ReduceOp::Sum) {
        Err(Error::CommunicatorFreed) => {}
        other => fails.push(format!(
            "all_reduce after free: {other:?}, expected CommunicatorFreed"
        )),
    }
    ok(
        world.all_reduce_into(&a, &mut b, ReduceOp::Sum),
        "world after freeing a dup",
    );
    check_exact("world after freeing a dup", &b, &[n as i32; 4], &mut fails);
    drop(dup2);
    drop(rest);
    ok(sub.free(), "free split");
    ok(world.barrier(), "barrier");
    if fails.is_empty() {
        Ok(())
    } else {
        Err(fails.join("\n"))
    }
}

// ---------------------------------------------------------------------------
// Topology facts under simulated nodes
// ---------------------------------------------------------------------------

fn scenario_topology(world: &Communicator) -> std::result::Result<(), String> {
    let (rank, n) = (world.rank(), world.size());
    let sim: usize = std::env::var("GPUCOLL_SIM_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut fails = vec![];
    let per = n / sim;
    let facts = [
        world.node() as u64,
        world.local_rank() as u64,
        world.local_size() as u64,
        world.nnodes() as u64,
    ];
    let mut all = vec![0u64; 4 * n];
    ok(
        mpi::all_gather(world, &facts, &mut all),
        "ref all_gather facts",
    );
    if rank == 0 {
        log(&format!(
            "backend={} (node, local_rank, local_size, nnodes) per rank: {all:?}",
            world.backend_name()
        ));
    }
    if world.nnodes() != sim {
        fails.push(format!("nnodes {} expected {sim}", world.nnodes()));
    }
    if world.local_size() != per {
        fails.push(format!("local_size {} expected {per}", world.local_size()));
    }
    if world.local_rank() != rank % per {
        fails.push(format!(
            "local_rank {} expected {}",
            world.local_rank(),
            rank % per
        ));
    }
    for r in 0..n {
        for q in 0..n {
            let same_block = r / per == q / per;
            let same_node = all[4 * r] == all[4 * q];
            if same_block != same_node {
                fails.push(format!(
                    "ranks {r} and {q}: same node {same_node}, expected {same_block}"
                ));
            }
        }
        if all[4 * r] as usize >= sim {
            fails.push(format!("rank {r}: node id {} not in 0..{sim}", all[4 * r]));
        }
    }
    // a collective across the simulated nodes
    let a = vec![(rank + 1) as u64; 4097];
    let mut b = poisoned::<u64>(4097);
    ok(
        world.all_reduce_into(&a, &mut b, ReduceOp::Sum),
        "all_reduce",
    );
    check_exact(
        "all_reduce across sim nodes",
        &b,
        &vec![(n * (n + 1) / 2) as u64; 4097],
        &mut fails,
    );
    if fails.is_empty() {
        Ok(())
    } else {
        Err(fails.join("\n"))
    }
}

// ---------------------------------------------------------------------------
// Communicators used at once from several threads

/// Threads (and duplicates of the world) of the `threads` scenario.
const THREADS: usize = 3;

/// Rank `r`'s element `j` in round `it` of the `threads` scenario.
fn thread_value(r: usize, j: usize, it: usize) -> i32 {
    ((r * 7 + j * 3 + it) % 1000) as i32
}

/// One thread's rounds on its own communicator: all_reduce, all_gather and
/// broadcast, exact; ranks enter the calls at different moments.
fn thread_rounds(c: &Communicator, t: usize) -> Vec<String> {
    let (rank, n) = (c.rank(), c.size());
    let mut fails = vec![];
    for round in 0..20 {
        if (rank + t + round) % 3 == 0 {
            std::thread::sleep(Duration::from_millis(
                ((rank * 5 + t * 3 + round) % 4) as u64,
            ));
        }
        let len = [1usize, 1031, 40009][(round + t) % 3];
        let it = t * 100 + round;
        let what = |c: &str| format!("thread {t} round {round} {c} len {len}");
        let send: Vec<i32> = (0..len).map(|j| thread_value(rank, j, it)).collect();

        let mut out = vec![-1i32; len];
        match c.all_reduce_into(&send[..], &mut out[..], ReduceOp::Sum) {
            Err(e) => fails.push(format!("{}: {e}", what("all_reduce"))),
            Ok(()) => {
                let bad = (0..len)
                    .filter(|&j| out[j] != (0..n).map(|r| thread_value(r, j, it)).sum::<i32>())
                    .count();
                if bad > 0 {
                    fails.push(format!("{}: {bad} wrong", what("all_reduce")));
                }
            }
        }

        let mut all = vec![-1i32; len * n];
        match c.all_gather_into(&send[..], &mut all[..]) {
            Err(e) => fails.push(format!("{}: {e}", what("all_gather"))),
            Ok(()) => {
                let bad = (0..len * n)
                    .filter(|&k| all[k] != thread_value(k / len, k % len, it))
                    .count();
                if bad > 0 {
                    fails.push(format!("{}: {bad} wrong", what("all_gather")));
                }
            }
        }

        let root = (round + t) % n;
        let mut buf = if rank == root {
            send.clone()
        } else {
            vec![-1i32; len]
        };
        match c.process_at_rank(root).broadcast_into(&mut buf[..]) {
            Err(e) => fails.push(format!("{}: {e}", what("broadcast"))),
            Ok(()) => {
                let bad = (0..len)
                    .filter(|&j| buf[j] != thread_value(root, j, it))
                    .count();
                if bad > 0 {
                    fails.push(format!("{}: {bad} wrong", what("broadcast")));
                }
            }
        }
        if fails.len() > 5 {
            break;
        }
    }
    fails
}

/// `THREADS` duplicates of the world, each driven by its own thread at the
/// same time (the README's "Threads"; on the host backend every thread
/// waits in its own call, so no ordering across communicators is needed).
fn scenario_threads(world: &Communicator) -> std::result::Result<(), String> {
    let comms: Vec<Communicator> = (0..THREADS)
        .map(|_| ok(world.duplicate(), "duplicate"))
        .collect();
    let fails: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(t, c)| sc.spawn(move || thread_rounds(c, t)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec!["a worker thread panicked".to_string()])
            })
            .collect()
    });
    if fails.is_empty() {
        Ok(())
    } else {
        Err(format!("rank {}: {}", world.rank(), fails.join("; ")))
    }
}

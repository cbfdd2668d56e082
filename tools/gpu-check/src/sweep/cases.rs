//! One collective call of the sweep, checked element by element, and the
//! loops over kinds, ops, placements and sizes for one datatype.

use super::env::Env;
use crate::values::{as_elem, empty_at, input_val, reduce_exact, sub, val, Elem};
use gpucoll::task::Task;
use gpucoll::{Buffer, BufferMut, CollKind, DeviceBuffer, ReduceOp};
use std::fmt::Write as _;

/// One collective call: returns the number of wrong elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn case<T: Elem>(
    env: &mut Env,
    kind: CollKind,
    op: ReduceOp,
    count: u64,
    in_place: bool,
    unaligned: bool,
    host: bool,
    root: usize,
) -> gpucoll::Result<usize> {
    let (rank, n) = (env.rank, env.n);
    let nn = n as u64;
    let red = kind.reduces();
    let float = T::DATATYPE.is_float();
    let is_root = rank == root;
    let poison = T::of(-1);
    // Buffer lengths (elements).
    let (in_len, out_len) = match kind {
        CollKind::AllReduce
        | CollKind::Broadcast
        | CollKind::Reduce
        | CollKind::Scan
        | CollKind::ExclusiveScan => (count, count),
        CollKind::AllGather => (count, count * nn),
        CollKind::ReduceScatter => (count * nn, count),
        CollKind::AllToAll => (count * nn, count * nn),
        CollKind::Gather => (count, if is_root { count * nn } else { 0 }),
        CollKind::Scatter => (if is_root { count * nn } else { 0 }, count),
    };
    let ip = in_place
        && match kind {
            CollKind::Reduce | CollKind::Gather | CollKind::Scatter => is_root,
            _ => true,
        };
    let ip = ip || kind == CollKind::Broadcast;
    let task_ip = ip;
    // Host images of the buffers.
    let input: Vec<T> = (0..in_len)
        .map(|j| {
            let owner_src = match kind {
                CollKind::Broadcast if !is_root => return poison,
                _ => rank,
            };
            T::of(input_val::<T>(owner_src, j, red))
        })
        .collect();
    let big_len = in_len.max(out_len);
    let mut buf: Vec<T> = vec![poison; big_len as usize];
    if ip {
        match kind {
            CollKind::AllGather => {
                for i in 0..count {
                    buf[(rank as u64 * count + i) as usize] = T::of(input_val::<T>(rank, i, red));
                }
            }
            CollKind::Gather => {
                for i in 0..count {
                    buf[(root as u64 * count + i) as usize] = T::of(input_val::<T>(rank, i, red));
                }
            }
            _ => buf[..in_len as usize].copy_from_slice(&input),
        }
    }
    let shift = if unaligned { 1 } else { 0 };
    let mk = |data: &[T]| -> gpucoll::Result<DeviceBuffer<T>> {
        let mut v = vec![poison; data.len() + shift];
        v[shift..].copy_from_slice(data);
        DeviceBuffer::from_host(env.gpu, &v)
    };
    // Device (or host) buffers.
    let d_in = mk(&input)?;
    let out_init = vec![poison; out_len as usize];
    let mut d_out = mk(if ip { &buf } else { &out_init })?;
    let mut h_in = input.clone();
    let mut h_out: Vec<T> = if ip { buf.clone() } else { out_init.clone() };
    let (raw_in, raw_out) = if host {
        (h_in.as_mut_slice().raw(), h_out.as_mut_slice().raw_mut())
    } else {
        let ri = d_in.view(shift..shift + in_len as usize)?.raw();
        let len = if ip { big_len } else { out_len } as usize;
        let ro = d_out.view_mut(shift..shift + len)?.raw_mut();
        (ri, ro)
    };
    let (task_count, i_raw, o_raw) = if ip {
        let b = raw_out;
        match kind {
            CollKind::AllGather => (count, sub(b, rank as u64 * count, count), b),
            CollKind::Gather => (count, sub(b, root as u64 * count, count), b),
            CollKind::Scatter => (count, b, sub(b, root as u64 * count, count)),
            _ => (count, b, b),
        }
    } else {
        let o = match kind {
            CollKind::Reduce | CollKind::Gather if !is_root => empty_at(raw_in),
            CollKind::Scatter if !is_root => raw_out,
            _ => raw_out,
        };
        let i = match kind {
            CollKind::Scatter if !is_root => empty_at(raw_out),
            _ => raw_in,
        };
        (count, i, o)
    };
    let task = Task {
        kind,
        dtype: T::DATATYPE,
        op: if red { op } else { ReduceOp::Sum },
        count: task_count,
        root: if kind.rooted() { root } else { 0 },
        in_place: task_ip,
    };
    env.run(vec![(task, i_raw, o_raw)])?;
    // Fetch the result.
    let got: Vec<T> = if host {
        h_out.clone()
    } else {
        let all = d_out.to_vec()?;
        all[shift..].to_vec()
    };
    drop(d_in);
    // Expected values where defined.
    let mut wrong = 0usize;
    let mut first_bad: Option<(u64, Option<f64>, f64)> = None;
    let mut check = |idx: u64, want: f64| {
        let g = got.get(idx as usize).map(|x| x.f());
        let w = as_elem::<T>(want);
        if g != Some(w) {
            wrong += 1;
            if first_bad.is_none() {
                first_bad = Some((idx, g, w));
            }
        }
    };
    let red_at = |idx_of: &dyn Fn(usize) -> u64| {
        reduce_exact(
            op,
            (0..n).map(|r| input_val::<T>(r, idx_of(r), true)),
            n,
            float,
        )
    };
    // The prefix of element `i` over ranks `0..upto` (Avg never reaches a
    // scan: `all_cases` leaves it out, as `check::prepare` refuses it).
    let prefix = |i: u64, upto: usize| {
        reduce_exact(
            op,
            (0..upto).map(|r| input_val::<T>(r, i, true)),
            upto,
            float,
        )
    };
    match kind {
        CollKind::AllReduce => {
            for i in 0..count {
                check(i, red_at(&|_| i));
            }
        }
        CollKind::Reduce if is_root => {
            for i in 0..count {
                check(i, red_at(&|_| i));
            }
        }
        CollKind::Broadcast => {
            for i in 0..count {
                check(i, val(root, i, false) as f64);
            }
        }
        CollKind::AllGather => {
            for r in 0..n {
                for i in 0..count {
                    check(r as u64 * count + i, val(r, i, false) as f64);
                }
            }
        }
        CollKind::ReduceScatter => {
            for i in 0..count {
                check(i, red_at(&|_| rank as u64 * count + i));
            }
        }
        CollKind::AllToAll => {
            for s in 0..n {
                for i in 0..count {
                    check(
                        s as u64 * count + i,
                        val(s, rank as u64 * count + i, false) as f64,
                    );
                }
            }
        }
        CollKind::Gather if is_root => {
            for r in 0..n {
                for i in 0..count {
                    check(r as u64 * count + i, val(r, i, false) as f64);
                }
            }
        }
        CollKind::Scatter => {
            let base = if ip { root as u64 * count } else { 0 };
            for i in 0..count {
                check(base + i, val(root, rank as u64 * count + i, false) as f64);
            }
        }
        CollKind::Scan => {
            for i in 0..count {
                check(i, prefix(i, rank + 1));
            }
        }
        // Rank 0 has no prefix: its output is never written (the poison,
        // or in place its input, stays).
        CollKind::ExclusiveScan if rank == 0 => {
            for i in 0..count {
                let kept = if ip { input_val::<T>(0, i, true) } else { -1 };
                check(i, kept as f64);
            }
        }
        CollKind::ExclusiveScan => {
            for i in 0..count {
                check(i, prefix(i, rank));
            }
        }
        _ => {}
    }
    if let Some((idx, g, w)) = first_bad {
        let choice = env.tuner.choose(&task);
        let plan = env.plan(&task);
        let nsteps: Vec<usize> = plan.channels.iter().map(|c| c.steps.len()).collect();
        let _ = writeln!(
            env.detail,
            "    rank {rank} {} {} first wrong index {idx}: got {g:?} want {w}; {} ch={} chunk={} steps/ch={nsteps:?}",
            kind.name(), T::DATATYPE, choice.algorithm, choice.nchannels, choice.chunk_bytes
        );
    }
    Ok(wrong)
}

pub(crate) fn all_cases<T: Elem>(
    env: &mut Env,
    sizes: &[(u64, bool)],
    log: &mut String,
    failures: &mut usize,
) {
    for kind in CollKind::ALL {
        let ops: Vec<ReduceOp> = if kind.reduces() {
            // Every op the collective accepts (a prefix cannot average).
            let all = ReduceOp::ALL.into_iter();
            all.filter(|op| op.applies_to(T::DATATYPE) && !(kind.is_scan() && *op == ReduceOp::Avg))
                .collect()
        } else {
            vec![ReduceOp::Sum]
        };
        for op in ops {
            for in_place in [false, true] {
                for &(count, unaligned) in sizes {
                    let host = false;
                    let root = if kind.rooted() { env.n - 1 } else { 0 };
                    let r = case::<T>(env, kind, op, count, in_place, unaligned, host, root);
                    let bad = match r {
                        Ok(w) => w,
                        Err(e) => {
                            let _ = writeln!(
                                log,
                                "rank {} ERROR {} {} {} ip={} n={}: {e}",
                                env.rank,
                                kind.name(),
                                T::DATATYPE,
                                op,
                                in_place,
                                count
                            );
                            *failures += 1;
                            return;
                        }
                    };
                    if bad > 0 {
                        *failures += 1;
                        let _ =
                            writeln!(
                            log,
                            "rank {} WRONG {} {} {} ip={} count={} unaligned={}: {bad} elements",
                            env.rank, kind.name(), T::DATATYPE, op, in_place, count, unaligned
                        );
                    }
                }
            }
        }
    }
}

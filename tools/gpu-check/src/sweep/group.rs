//! One group launch mixing datatypes and kinds: two all_reduces of
//! different types, an all_gather, a broadcast, a third all_reduce of
//! the first one's type, a scan and an exclusive_scan (four datatypes,
//! five kinds; the GPU runs one launch per datatype, so the later calls
//! run with the earlier ones of their type), checked element by element.

use super::env::Env;
use crate::values::{reduce_exact, val};
use gpucoll::task::Task;
use gpucoll::{Buffer, BufferMut, CollKind, Datatype, DeviceBuffer, ReduceOp};

/// The number of wrong elements.
pub(crate) fn mixed_group(env: &mut Env) -> gpucoll::Result<usize> {
    let a: Vec<i32> = (0..3000).map(|j| val(env.rank, j, true) as i32).collect();
    let b: Vec<f64> = (0..5000).map(|j| val(env.rank, j, true) as f64).collect();
    let da = DeviceBuffer::from_host(env.gpu, &a)?;
    let db = DeviceBuffer::from_host(env.gpu, &b)?;
    let mut oa = DeviceBuffer::<i32>::zeroed(env.gpu, a.len())?;
    let mut ob = DeviceBuffer::<f64>::zeroed(env.gpu, b.len())?;
    let n = env.n;
    let c: Vec<i64> = (0..1001).map(|j| val(env.rank, j, false)).collect();
    let dc = DeviceBuffer::from_host(env.gpu, &c)?;
    let mut oc = DeviceBuffer::<i64>::zeroed(env.gpu, c.len() * n)?;
    let root = 1 % n;
    let d: Vec<f32> = (0..777)
        .map(|j| {
            if env.rank == root {
                val(root, j, false) as f32
            } else {
                -1.0
            }
        })
        .collect();
    let mut od = DeviceBuffer::from_host(env.gpu, &d)?;
    let ta = Task {
        kind: CollKind::AllReduce,
        dtype: Datatype::I32,
        op: ReduceOp::Sum,
        count: 3000,
        root: 0,
        in_place: false,
    };
    let tb = Task {
        dtype: Datatype::F64,
        count: 5000,
        op: ReduceOp::Max,
        ..ta
    };
    let tc = Task {
        kind: CollKind::AllGather,
        dtype: Datatype::I64,
        count: 1001,
        ..ta
    };
    let td = Task {
        kind: CollKind::Broadcast,
        dtype: Datatype::F32,
        count: 777,
        root,
        in_place: true,
        ..ta
    };
    let te = Task {
        count: 2000,
        op: ReduceOp::Max,
        ..ta
    };
    let mut oe = DeviceBuffer::<i32>::zeroed(env.gpu, 2000)?;
    let tf = Task {
        kind: CollKind::Scan,
        ..ta
    };
    let mut of = DeviceBuffer::<i32>::zeroed(env.gpu, 3000)?;
    let tg = Task {
        kind: CollKind::ExclusiveScan,
        ..tb
    };
    let mut og = DeviceBuffer::<f64>::zeroed(env.gpu, 5000)?;
    let od_in = od.raw();
    env.run(vec![
        (ta, da.raw(), oa.raw_mut()),
        (tb, db.raw(), ob.raw_mut()),
        (tc, dc.raw(), oc.raw_mut()),
        (td, od_in, od.raw_mut()),
        (te, da.raw(), oe.raw_mut()),
        (tf, da.raw(), of.raw_mut()),
        (tg, db.raw(), og.raw_mut()),
    ])?;
    let mut bad = 0;
    let (gf, gg) = (of.to_vec()?, og.to_vec()?);
    let me = env.rank;
    for (j, g) in gf.iter().enumerate() {
        let xs = (0..=me).map(|r| val(r, j as u64, true));
        bad += (*g as f64 != reduce_exact(ReduceOp::Sum, xs, me + 1, false)) as usize;
    }
    for (j, g) in gg.iter().enumerate() {
        // Rank 0's output is never written: it stays zero.
        let want = match me {
            0 => 0.0,
            _ => reduce_exact(
                ReduceOp::Max,
                (0..me).map(|r| val(r, j as u64, true)),
                me,
                true,
            ),
        };
        bad += (*g != want) as usize;
    }
    let ge = oe.to_vec()?;
    let (ga, gb) = (oa.to_vec()?, ob.to_vec()?);
    let (gc, gd) = (oc.to_vec()?, od.to_vec()?);
    for (k, g) in gc.iter().enumerate() {
        bad += (*g != val(k / 1001, (k % 1001) as u64, false)) as usize;
    }
    for (j, g) in gd.iter().enumerate() {
        bad += (*g != val(root, j as u64, false) as f32) as usize;
    }
    for (j, g) in ga.iter().enumerate() {
        bad += (*g as f64
            != reduce_exact(
                ReduceOp::Sum,
                (0..n).map(|r| val(r, j as u64, true)),
                n,
                false,
            )) as usize;
    }
    for (j, g) in ge.iter().enumerate() {
        bad += (*g as f64
            != reduce_exact(
                ReduceOp::Max,
                (0..n).map(|r| val(r, j as u64, true)),
                n,
                false,
            )) as usize;
    }
    for (j, g) in gb.iter().enumerate() {
        bad += (*g
            != reduce_exact(
                ReduceOp::Max,
                (0..n).map(|r| val(r, j as u64, true)),
                n,
                true,
            )) as usize;
    }
    Ok(bad)
}

//! NCCL's collective on the same data as gpucoll, in the same mode:
//! once on ordinary device buffers (gpucoll's own, copied in), once on
//! symmetric windows when this NCCL has them. Out of place, except
//! broadcast (in place, as gpucoll's broadcast is timed).

use crate::args::Mode;
use crate::bufs::{download, ptr, upload};
use crate::data::{Case, Elem};
use crate::gpu::DevBuf;
use crate::nccl::{Nccl, NcclGraph, NcclOp};
use crate::report::{self, NcclMeasure, SymMeasure};
use crate::timing::{self, sum_over_ranks, Queued};
use crate::Ctx;
use gpucoll::CollKind;
use std::marker::PhantomData;

/// The row's host vectors and device buffers.
pub struct Bufs<'a, T: Elem> {
    pub send: &'a mut Vec<T>,
    pub recv: &'a mut Vec<T>,
    pub d_send: &'a mut Option<DevBuf<T>>,
    pub d_recv: &'a mut Option<DevBuf<T>>,
    pub d_ip: &'a mut Option<DevBuf<T>>,
}

/// NCCL calls on its stream for one pair of buffers.
struct NcclQueued<'a, 'o, T: Elem> {
    nccl: &'a Nccl,
    op: &'a NcclOp<'o>,
    case: &'a Case,
    send: Option<u64>,
    recv: Option<u64>,
    _t: PhantomData<T>,
}

impl<'a, T: Elem> Queued for NcclQueued<'a, '_, T> {
    type Graph = NcclGraph<'a>;
    fn launch(&mut self) -> Result<(), String> {
        self.nccl
            .launch::<T>(self.case, self.op, self.send, self.recv)
    }
    fn sync(&mut self) -> Result<(), String> {
        self.nccl.sync()
    }
    fn begin_capture(&mut self) -> Result<(), String> {
        self.nccl.begin_capture()
    }
    fn end_capture(&mut self) -> Result<NcclGraph<'a>, String> {
        self.nccl.end_capture()
    }
    fn replay(&mut self, graph: &NcclGraph<'a>) -> Result<(), String> {
        graph.replay()
    }
}

/// Where NCCL's inputs and outputs live for one run.
enum Target {
    /// gpucoll's device buffers (cuMemAlloc).
    Ordinary,
    /// The symmetric windows at (send, receive).
    Symmetric(u64, u64),
}

/// Fill the inputs (and poison the outputs) of one NCCL run.
fn load<T: Elem>(nccl: &Nccl, case: &Case, b: &mut Bufs<'_, T>, t: &Target) -> Result<(), String> {
    let (in_len, out_len, ip_len) = (case.input_len(), case.output_len(), case.in_place_len());
    if case.kind == CollKind::Broadcast {
        case.fill_in_place(&mut b.recv[..ip_len]);
        return match t {
            Target::Ordinary => upload(b.d_ip, &b.recv[..ip_len]),
            Target::Symmetric(_, r) => nccl.sym_upload(*r, &b.recv[..ip_len]),
        };
    }
    case.fill_input(&mut b.send[..in_len]);
    b.recv[..out_len].fill(Case::poison::<T>());
    match t {
        Target::Ordinary => {
            upload(b.d_send, &b.send[..in_len])?;
            upload(b.d_recv, &b.recv[..out_len])
        }
        Target::Symmetric(s, r) => {
            nccl.sym_upload(*s, &b.send[..in_len])?;
            nccl.sym_upload(*r, &b.recv[..out_len])
        }
    }
}

/// Wrong elements of this rank after one NCCL run.
fn check<T: Elem>(
    nccl: &Nccl,
    case: &Case,
    b: &mut Bufs<'_, T>,
    t: &Target,
) -> Result<u64, String> {
    let (out_len, ip_len) = (case.output_len(), case.in_place_len());
    let bcast = case.kind == CollKind::Broadcast;
    let len = if bcast { ip_len } else { out_len };
    match t {
        Target::Ordinary if bcast => download(b.d_ip, &mut b.recv[..len])?,
        Target::Ordinary => download(b.d_recv, &mut b.recv[..len])?,
        Target::Symmetric(_, r) => nccl.sym_download(*r, &mut b.recv[..len])?,
    }
    Ok(if bcast {
        case.check_in_place(&b.recv[..len])
    } else {
        case.check_output(&b.recv[..len])
    })
}

/// Time NCCL in `mode` on ordinary buffers and on symmetric windows, for
/// the row of `bytes`.
pub fn measure<T: Elem>(
    ctx: &Ctx<'_>,
    nccl: &Nccl,
    mode: Mode,
    extra: usize,
    case: &Case,
    bytes: u64,
    b: &mut Bufs<'_, T>,
) -> Result<NcclMeasure, String> {
    let (world, args) = (ctx.world, ctx.args);
    let nop = nccl.op::<T>(case.op)?;
    let bcast = case.kind == CollKind::Broadcast;
    let (algbw_of, nranks) = (report::bandwidths, ctx.nranks);

    // One run: time, then check a fresh call's result.
    let run = |t: Target,
               b: &mut Bufs<'_, T>|
     -> Result<(timing::Timed, Option<f64>, Option<u64>), String> {
        load(nccl, case, b, &t)?;
        let ordinary = matches!(t, Target::Ordinary);
        let (send, recv) = match t {
            Target::Ordinary if bcast => (ptr(b.d_ip), ptr(b.d_ip)),
            Target::Ordinary => (ptr(b.d_send), ptr(b.d_recv)),
            Target::Symmetric(_, r) if bcast => (Some(r), Some(r)),
            Target::Symmetric(s, r) => (Some(s), Some(r)),
        };
        let mut q = NcclQueued::<T> {
            nccl,
            op: &nop,
            case,
            send,
            recv,
            _t: PhantomData,
        };
        let timed = timing::time_mode(world, args, mode, extra, &mut q)?;
        // Blocking rows also time the same calls queued (the async column;
        // ordinary buffers only, as before symmetric windows existed).
        let queued_us = match mode {
            Mode::Blocking if ordinary => {
                Some(timing::time_queued(world, args, 0, &mut q)?.secs * 1e6)
            }
            Mode::Blocking => None,
            Mode::Async => Some(timed.secs * 1e6),
            Mode::Graph => None,
        };
        let wrong = if args.check {
            load(nccl, case, b, &t)?;
            timing::call_checked(mode, &mut q)?;
            Some(sum_over_ranks(world, check(nccl, case, b, &t)?)?)
        } else {
            None
        };
        Ok((timed, queued_us, wrong))
    };

    let (t, queued_us, wrong) = run(Target::Ordinary, b)?;
    let (algbw, busbw) = algbw_of(case.kind, nranks, bytes, t.secs);
    let sym = match nccl.sym_ptrs() {
        Some((s, r)) => {
            let (st, _, sw) = run(Target::Symmetric(s, r), b)?;
            let (algbw, busbw) = algbw_of(case.kind, nranks, bytes, st.secs);
            Some(SymMeasure {
                time_us: st.secs * 1e6,
                algbw,
                busbw,
                iters: st.iters,
                wrong: sw,
            })
        }
        None => None,
    };
    Ok(NcclMeasure::Time {
        time_us: t.secs * 1e6,
        algbw,
        busbw,
        async_time_us: queued_us,
        iters: t.iters,
        wrong,
        sym,
    })
}

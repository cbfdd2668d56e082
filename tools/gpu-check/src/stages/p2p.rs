//! `--stage p2p`: point-to-point messages (`gpucoll::p2p`) on the GPU.
//!
//! * **Memory kinds**: a ring shift (every rank sends right, receives
//!   from the left, both immediate) for every kind of `memkinds` as the
//!   sender with a `cuMemAlloc` receiver, and as the receiver with a
//!   `cuMemAlloc` sender, plus pageable host vectors at either end; at
//!   0, 1, 1031, 4097 (just past the 16 KiB inline limit) and 2^21 + 3
//!   floats (several data messages when staged). Exportable device memory
//!   (`subrange` pieces of a large block) is pulled at every size; small
//!   `cuMemAlloc`, pool, managed and VMM buffers go inline up to 16 KiB.
//! * **Order**: messages of mixed sizes (inline, then pulled, then
//!   inline ...) on one tag, received with any source into receives
//!   posted ahead; then non-blocking receives completed in reverse.
//! * **Truncation** of pulled and inline messages, then a normal one.
//! * **Probes**: a matched probe received into device memory; a dropped
//!   matched message whose sender still completes.
//! * **Self**: device to device and device to host through the local path.
//! * **Halo**: left and right neighbours, six device buffers each way,
//!   immediate sends and receives, `wait_all`; `send_receive_into` on
//!   `DeviceBuffer`s.
//!
//! Every element is compared with the exact value (inputs are small
//! integers from (rank, index, round)); receive buffers start poisoned
//! (-1), and the elements past a message must stay so. Run it also with
//! `GPUCOLL_P2P_EAGER=16K` (small device messages buffered),
//! `GPUCOLL_P2P_DISABLE=1` (device bytes staged through pinned memory)
//! and with `GPUCOLL_SIM_NODES=2` on 4 ranks (across simulated nodes).

use super::gv;
use super::memkinds::{get, put, Arena, Kind, Mem};
use cudarc::driver::CudaContext;
use gpucoll::{Communicator, Datatype, DeviceBuffer, Error, Result, Status};
use std::ffi::c_void;
use std::fmt::Write as _;

/// One end of a message: memory of some kind, or a pageable vector.
#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Mem(Kind),
    Vec,
}

impl End {
    fn name(self) -> &'static str {
        match self {
            End::Mem(k) => k.name(),
            End::Vec => "vec",
        }
    }
}

/// A buffer of either end type.
enum Buf {
    Mem(Mem),
    Vec(Vec<f32>),
}

impl Buf {
    fn new(arena: &mut Arena, end: End, len: usize) -> Result<Buf> {
        Ok(match end {
            End::Mem(k) => Buf::Mem(arena.alloc(k, len * 4)?),
            End::Vec => Buf::Vec(vec![-1.0; len.max(1)]),
        })
    }

    fn ptr(&mut self) -> *mut c_void {
        match self {
            Buf::Mem(m) => m.ptr as usize as *mut c_void,
            Buf::Vec(v) => v.as_mut_ptr().cast(),
        }
    }

    fn fill(&mut self, v: &[f32]) -> Result<()> {
        match self {
            Buf::Mem(m) => put(m, v),
            Buf::Vec(x) => {
                x[..v.len()].copy_from_slice(v);
                Ok(())
            }
        }
    }

    fn read(&self, n: usize) -> Result<Vec<f32>> {
        match self {
            Buf::Mem(m) => get(m, n),
            Buf::Vec(v) => Ok(v[..n].to_vec()),
        }
    }
}

struct Run<'a> {
    world: &'a Communicator,
    gpu: i32,
    rank: usize,
    size: usize,
    messages: usize,
    wrong: usize,
}

const SIZES: [usize; 5] = [0, 1, 1031, 4097, (1 << 21) + 3];

impl Run<'_> {
    fn right(&self) -> usize {
        (self.rank + 1) % self.size
    }

    fn left(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    /// Compare `got` (of `cap` elements) with the message of `len`
    /// elements rank `from` sent in round `it`, and the rest poisoned.
    fn check(
        &mut self,
        what: &str,
        got: &[f32],
        from: usize,
        len: usize,
        it: u64,
        log: &mut String,
    ) {
        self.messages += 1;
        let bad: Vec<usize> = (0..got.len())
            .filter(|&j| {
                let want = if j < len {
                    gv(from, j as u64, it)
                } else {
                    -1.0
                };
                got[j] != want
            })
            .collect();
        if let Some(&j) = bad.first() {
            self.wrong += bad.len();
            let _ = writeln!(
                log,
                "rank {} WRONG p2p {what}: {} elements; first at {j}: got {}",
                self.rank,
                bad.len(),
                got[j]
            );
        }
    }

    fn status(
        &mut self,
        what: &str,
        st: Status,
        from: usize,
        tag: i32,
        bytes: u64,
        log: &mut String,
    ) {
        if (st.source_rank(), st.tag(), st.bytes()) != (from, tag, bytes) {
            self.wrong += 1;
            let _ = writeln!(log, "rank {} WRONG p2p {what}: status {st:?}", self.rank);
        }
    }

    /// A ring shift from a buffer of `send` to one of `recv`.
    fn ring(
        &mut self,
        arena: &mut Arena,
        send: End,
        recv: End,
        it: u64,
        log: &mut String,
    ) -> Result<()> {
        for (k, &len) in SIZES.iter().enumerate() {
            let it = it * 16 + k as u64;
            let mine: Vec<f32> = (0..len as u64).map(|j| gv(self.rank, j, it)).collect();
            let mut out = Buf::new(arena, send, len)?;
            out.fill(&mine)?;
            let mut inb = Buf::new(arena, recv, len + 3)?;
            let tag = k as i32;
            let (w, l, r) = (self.world, self.left(), self.right());
            // SAFETY: both buffers outlive the requests, waited for here.
            let st = unsafe {
                let rr = w.immediate_receive_raw(
                    inb.ptr(),
                    len as u64,
                    Datatype::F32,
                    Some(l),
                    Some(tag),
                )?;
                let sr = w.immediate_send_raw(out.ptr(), len as u64, Datatype::F32, r, tag)?;
                sr.wait()?;
                rr.wait()?
            };
            let what = format!("ring {} -> {} of {len}", send.name(), recv.name());
            self.status(&what, st, l, tag, len as u64 * 4, log);
            let got = inb.read(len + 3)?;
            self.check(&what, &got, l, len, it, log);
        }
        Ok(())
    }

    /// Mixed sizes on one tag, any source, received in order.
    fn order(&mut self, it: u64, log: &mut String) -> Result<()> {
        let lens = [3usize, 300_000, 1, 5000, 0, 2_000_001, 7];
        let (l, r) = (self.left(), self.right());
        let outs = lens
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let v: Vec<f32> = (0..n as u64)
                    .map(|j| gv(self.rank, j, it + k as u64))
                    .collect();
                DeviceBuffer::from_host(self.gpu, &v)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut ins = lens
            .iter()
            .map(|&n| DeviceBuffer::from_host(self.gpu, &vec![-1.0f32; n + 2]))
            .collect::<Result<Vec<_>>>()?;
        let any = self.world.any_process();
        let right = self.world.process_at_rank(r);
        let statuses = gpucoll::scope(|s| {
            let recvs = ins
                .iter_mut()
                .map(|b| any.immediate_receive_into_with_tag(s, b, 21))
                .collect::<Result<Vec<_>>>()?;
            let sends = outs
                .iter()
                .map(|b| right.immediate_send_with_tag(s, b, 21))
                .collect::<Result<Vec<_>>>()?;
            let mut st = recvs
                .into_iter()
                .rev()
                .map(|q| q.wait())
                .collect::<Result<Vec<_>>>()?;
            st.reverse();
            gpucoll::wait_all(sends)?;
            Ok::<_, Error>(st)
        })?;
        for (k, &n) in lens.iter().enumerate() {
            let what = format!("order message {k} of {n}");
            self.status(&what, statuses[k], l, 21, n as u64 * 4, log);
            let got = ins[k].to_vec()?;
            self.check(&what, &got, l, n, it + k as u64, log);
        }
        Ok(())
    }

    /// Truncated pulled and inline messages, each followed by a normal one.
    fn truncate(&mut self, it: u64, log: &mut String) -> Result<()> {
        let (l, r) = (self.left(), self.right());
        for (k, (len, cap)) in [(1usize << 20, 1000usize), (900, 10), (70_000, 0)]
            .into_iter()
            .enumerate()
        {
            let it = it + 2 * k as u64;
            let v: Vec<f32> = (0..len as u64).map(|j| gv(self.rank, j, it)).collect();
            let out = DeviceBuffer::from_host(self.gpu, &v)?;
            let next: Vec<f32> = (0..40).map(|j| gv(self.rank, j, it + 1)).collect();
            let next_out = DeviceBuffer::from_host(self.gpu, &next)?;
            let mut got = DeviceBuffer::from_host(self.gpu, &vec![-1.0f32; cap])?;
            let mut got2 = DeviceBuffer::from_host(self.gpu, &[-1.0f32; 40])?;
            let (first, second) = gpucoll::scope(|s| {
                let src = self.world.process_at_rank(l);
                let r1 = src.immediate_receive_into_with_tag(s, &mut got, 31)?;
                let r2 = src.immediate_receive_into_with_tag(s, &mut got2, 31)?;
                let dst = self.world.process_at_rank(r);
                let a = dst.immediate_send_with_tag(s, &out, 31)?;
                let b = dst.immediate_send_with_tag(s, &next_out, 31)?;
                a.wait()?;
                b.wait()?;
                Ok::<_, Error>((r1.wait(), r2.wait()))
            })?;
            let what = format!("truncation {len} -> {cap}");
            match first {
                Err(Error::Truncated {
                    source_rank,
                    bytes,
                    capacity,
                    ..
                }) if source_rank == l && bytes == len as u64 * 4 && capacity == cap as u64 * 4 => {
                }
                other => {
                    self.wrong += 1;
                    let _ = writeln!(log, "rank {} WRONG p2p {what}: {other:?}", self.rank);
                }
            }
            let g = got.to_vec()?;
            self.check(&what, &g, l, cap, it, log);
            let st = second?;
            self.status(&format!("{what}, next"), st, l, 31, 160, log);
            let g2 = got2.to_vec()?;
            self.check(&format!("{what}, next"), &g2, l, 40, it + 1, log);
        }
        Ok(())
    }

    /// A matched probe into device memory; a dropped matched message.
    fn probes(&mut self, it: u64, log: &mut String) -> Result<()> {
        let (l, r) = (self.left(), self.right());
        let lens = [500_000usize, 123, 40_000];
        let outs = lens
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let v: Vec<f32> = (0..n as u64)
                    .map(|j| gv(self.rank, j, it + k as u64))
                    .collect();
                DeviceBuffer::from_host(self.gpu, &v)
            })
            .collect::<Result<Vec<_>>>()?;
        gpucoll::scope(|s| {
            let dst = self.world.process_at_rank(r);
            let sends = outs
                .iter()
                .enumerate()
                .map(|(k, b)| dst.immediate_send_with_tag(s, b, 40 + k as i32))
                .collect::<Result<Vec<_>>>()?;
            let src = self.world.process_at_rank(l);
            // Tag 41 first, though 40 was sent before it.
            let (m, st) = src.matched_probe_with_tag(41)?;
            self.status("matched probe", st, l, 41, 123 * 4, log);
            let mut b = DeviceBuffer::from_host(self.gpu, &vec![-1.0f32; 123])?;
            m.matched_receive_into(&mut b)?;
            self.check("matched receive", &b.to_vec()?, l, 123, it + 1, log);
            // The pulled one, dropped: its sender still completes.
            let (m, st) = src.matched_probe_with_tag(40)?;
            self.status("matched probe to drop", st, l, 40, 2_000_000, log);
            drop(m);
            let st = self.world.any_process().probe()?;
            self.status("probe after the drop", st, l, 42, 160_000, log);
            let mut c = DeviceBuffer::from_host(self.gpu, &vec![-1.0f32; 40_000])?;
            src.receive_into(&mut c)?;
            self.check(
                "receive after the drop",
                &c.to_vec()?,
                l,
                40_000,
                it + 2,
                log,
            );
            gpucoll::wait_all(sends)
        })
    }

    /// To itself: device to device (the local path), device to host.
    fn own(&mut self, arena: &mut Arena, it: u64, log: &mut String) -> Result<()> {
        let me = self.rank;
        for (k, (send, recv)) in [
            (End::Mem(Kind::Block), End::Mem(Kind::Block)),
            (End::Mem(Kind::Pool), End::Vec),
            (End::Vec, End::Mem(Kind::Managed)),
        ]
        .into_iter()
        .enumerate()
        {
            let it = it + k as u64;
            let len = 300_001usize;
            let v: Vec<f32> = (0..len as u64).map(|j| gv(me, j, it)).collect();
            let mut out = Buf::new(arena, send, len)?;
            out.fill(&v)?;
            let mut inb = Buf::new(arena, recv, len + 1)?;
            // SAFETY: both buffers outlive the requests, waited for here.
            let st = unsafe {
                let rr = self.world.immediate_receive_raw(
                    inb.ptr(),
                    len as u64,
                    Datatype::F32,
                    Some(me),
                    None,
                )?;
                self.world
                    .send_raw(out.ptr(), len as u64, Datatype::F32, me, 50)?;
                rr.wait()?
            };
            let what = format!("to self {} -> {}", send.name(), recv.name());
            self.status(&what, st, me, 50, len as u64 * 4, log);
            let got = inb.read(len + 1)?;
            self.check(&what, &got, me, len, it, log);
        }
        Ok(())
    }

    /// A halo exchange: six buffers each way with both neighbours.
    fn halo(&mut self, it: u64, log: &mut String) -> Result<()> {
        let (l, r) = (self.left(), self.right());
        let lens = [1usize, 4096, 4097, 65_536, 1 << 20, 3];
        let mk = |n: usize, k: u64, side: u64| -> Result<DeviceBuffer<f32>> {
            let v: Vec<f32> = (0..n as u64)
                .map(|j| gv(self.rank, j, it + 2 * k + side))
                .collect();
            DeviceBuffer::from_host(self.gpu, &v)
        };
        let to_left = lens
            .iter()
            .enumerate()
            .map(|(k, &n)| mk(n, k as u64, 0))
            .collect::<Result<Vec<_>>>()?;
        let to_right = lens
            .iter()
            .enumerate()
            .map(|(k, &n)| mk(n, k as u64, 1))
            .collect::<Result<Vec<_>>>()?;
        let blank = |n: usize| DeviceBuffer::from_host(self.gpu, &vec![-1.0f32; n]);
        let mut from_left = lens.iter().map(|&n| blank(n)).collect::<Result<Vec<_>>>()?;
        let mut from_right = lens.iter().map(|&n| blank(n)).collect::<Result<Vec<_>>>()?;
        gpucoll::scope(|s| {
            let (pl, pr) = (self.world.process_at_rank(l), self.world.process_at_rank(r));
            let mut reqs: Vec<gpucoll::Request<'_>> = Vec::new();
            for (k, b) in from_left.iter_mut().enumerate() {
                reqs.push(
                    pl.immediate_receive_into_with_tag(s, b, 60 + k as i32)?
                        .into(),
                );
            }
            for (k, b) in from_right.iter_mut().enumerate() {
                reqs.push(
                    pr.immediate_receive_into_with_tag(s, b, 70 + k as i32)?
                        .into(),
                );
            }
            for (k, b) in to_right.iter().enumerate() {
                reqs.push(pr.immediate_send_with_tag(s, b, 60 + k as i32)?);
            }
            for (k, b) in to_left.iter().enumerate() {
                reqs.push(pl.immediate_send_with_tag(s, b, 70 + k as i32)?);
            }
            gpucoll::wait_all(reqs)
        })?;
        for (k, &n) in lens.iter().enumerate() {
            // The left neighbour sent its to_right (side 1), the right its to_left (side 0).
            let got = from_left[k].to_vec()?;
            self.check(
                &format!("halo from the left, {n}"),
                &got,
                l,
                n,
                it + 2 * k as u64 + 1,
                log,
            );
            let got = from_right[k].to_vec()?;
            self.check(
                &format!("halo from the right, {n}"),
                &got,
                r,
                n,
                it + 2 * k as u64,
                log,
            );
        }
        // send_receive_into on device buffers.
        let n = 1_000_003usize;
        let v: Vec<f32> = (0..n as u64).map(|j| gv(self.rank, j, it + 99)).collect();
        let out = DeviceBuffer::from_host(self.gpu, &v)?;
        let mut inb = DeviceBuffer::from_host(self.gpu, &vec![-1.0f32; n])?;
        let st = self.world.send_receive_into(
            &out,
            &self.world.process_at_rank(r),
            &mut inb,
            &self.world.process_at_rank(l),
        )?;
        self.status("send_receive_into", st, l, 0, n as u64 * 4, log);
        self.check("send_receive_into", &inb.to_vec()?, l, n, it + 99, log);
        Ok(())
    }
}

pub(crate) fn stage_p2p(world: &Communicator, log: &mut String) -> Result<usize> {
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("p2p needs the CUDA backend".into()))?;
    let ctx =
        CudaContext::new(gpu as usize).map_err(|e| Error::Backend(format!("cudarc: {e:?}")))?;
    ctx.bind_to_thread()
        .map_err(|e| Error::Backend(format!("cudarc: {e:?}")))?;
    let stream = ctx
        .new_stream()
        .map_err(|e| Error::Backend(format!("cudarc: {e:?}")))?;
    let mut run = Run {
        world,
        gpu,
        rank: world.rank(),
        size: world.size(),
        messages: 0,
        wrong: 0,
    };
    let mut ends: Vec<(End, End)> = Vec::new();
    for k in Kind::ALL {
        ends.push((End::Mem(k), End::Mem(Kind::Block)));
        if k != Kind::Block {
            ends.push((End::Mem(Kind::Block), End::Mem(k)));
        }
    }
    ends.extend([
        (End::Vec, End::Mem(Kind::Block)),
        (End::Mem(Kind::Block), End::Vec),
        (End::Vec, End::Vec),
        (End::Mem(Kind::Pool), End::Mem(Kind::Managed)),
        (End::Mem(Kind::SubRange), End::Mem(Kind::SubRange)),
    ]);
    for (i, (send, recv)) in ends.iter().enumerate() {
        // A fresh arena per pair: the sub-range block fills up otherwise.
        let mut arena = Arena::new(gpu, stream.clone())?;
        let before = run.wrong;
        if let Err(e) = run.ring(&mut arena, *send, *recv, i as u64, log) {
            let _ = writeln!(
                log,
                "rank {} ERROR p2p ring {} -> {}: {e}",
                run.rank,
                send.name(),
                recv.name()
            );
            run.wrong += 1;
        }
        let _ = writeln!(
            log,
            "rank {} p2p ring {} -> {}: {} wrong",
            run.rank,
            send.name(),
            recv.name(),
            run.wrong - before
        );
    }
    let mut arena = Arena::new(gpu, stream.clone())?;
    for name in ["order", "truncate", "probes", "self", "halo"] {
        let before = run.wrong;
        let r = match name {
            "order" => run.order(1000, log),
            "truncate" => run.truncate(2000, log),
            "probes" => run.probes(3000, log),
            "self" => run.own(&mut arena, 4000, log),
            _ => run.halo(5000, log),
        };
        if let Err(e) = r {
            let _ = writeln!(log, "rank {} ERROR p2p {name}: {e}", run.rank);
            run.wrong += 1;
        }
        let _ = writeln!(
            log,
            "rank {} p2p {name}: {} wrong",
            run.rank,
            run.wrong - before
        );
    }
    let _ = writeln!(
        log,
        "rank {} p2p: {} messages checked, {} wrong",
        run.rank, run.messages, run.wrong
    );
    Ok(run.wrong)
}

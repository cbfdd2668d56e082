//! gpucoll-p2p-bench: point-to-point messages between two ranks on device
//! memory (issue 32), against the same run's hand staging and CUDA IPC
//! copies.
//!
//! `mpirun -n 2 gpucoll-p2p-bench [-b 8] [-e 64M] [-f 2] [--window 8]
//! [--rounds 10] [--json FILE]` (ranks beyond 2 wait). Every rank on the
//! CUDA backend; both on one GPU under MPS, or one GPU each.
//!
//! Per size, rank 0 prints the half round trip of a ping-pong (rank 0
//! sends, rank 1 sends it back; time / (2 × iterations)):
//! - `gpucoll_us`: `Process::send` / `receive_into` of `DeviceBuffer`
//!   views (one 64 MiB allocation on each side, sliced);
//! - `staged_us`: by hand, as a program without a CUDA-aware MPI does:
//!   `cuMemcpyDtoH` into pinned memory, MPI's own blocking send and
//!   receive (`gpucoll::reference`, `PMPI_Send`/`PMPI_Recv`),
//!   `cuMemcpyHtoD`;
//! - `ratio` = gpucoll / staged (below 1: gpucoll is faster).
//!
//! Then at the largest size (64 MiB by default):
//! - `bw_GBs`: streaming send/receive bandwidth, OSU's `osu_bw` way:
//!   rank 0 starts `--window` immediate sends, rank 1 as many immediate
//!   receives into distinct buffers, both wait, rank 1 answers with 4
//!   bytes; `--rounds` times; bytes / time;
//! - `bw_pingpong_GBs`, `bw_staged_GBs`: size / half round trip;
//! - `memcpy_ipc_GBs`: rank 1 maps rank 0's buffer through CUDA IPC and
//!   copies it back to back (`--window` × `--rounds` `cuMemcpyDtoDAsync`
//!   on one stream, one synchronize): the copy engine's figure between the
//!   two processes; `memcpy_ipc_sync_GBs`: one synchronous `cuMemcpyDtoD`
//!   at a time.
//!
//! The last line is a JSON object with the keys of
//! `bench/results/<date>-p2p/summary.json`: `pingpong_8B_us`,
//! `pingpong_8B_staged_us`, `bw_64MiB_GBs`, `bw_64MiB_staged_GBs`,
//! `memcpy_ipc_GBs` (and the extra figures). Every size's gpucoll
//! message is checked once on rank 1 (bytes of a known pattern); a wrong
//! byte ends the run with status 1.

use cudarc::driver::{sys, CudaContext};
use gpucoll::reference as mpi;
use gpucoll::{Communicator, DeviceBuffer};
use std::ffi::c_void;

const USAGE: &str = "usage: mpirun -n 2 gpucoll-p2p-bench [-b MIN (8)] [-e MAX (64M)] \
[-f FACTOR (2)] [--window N (8)] [--rounds N (10)] [--json FILE]";

struct Opts {
    min: usize,
    max: usize,
    factor: usize,
    window: usize,
    rounds: usize,
    json: Option<String>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("not a size: {s:?}"))
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        min: 8,
        max: 64 << 20,
        factor: 2,
        window: 8,
        rounds: 10,
        json: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let val = |i: usize| args.get(i + 1).cloned().ok_or_else(|| USAGE.to_string());
        match args[i].as_str() {
            "-b" | "--minbytes" => o.min = parse_size(&val(i)?)?,
            "-e" | "--maxbytes" => o.max = parse_size(&val(i)?)?,
            "-f" | "--stepfactor" => o.factor = parse_size(&val(i)?)?,
            "--window" => o.window = parse_size(&val(i)?)?,
            "--rounds" => o.rounds = parse_size(&val(i)?)?,
            "--json" => o.json = Some(val(i)?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
        i += 2;
    }
    if o.min == 0 || o.max < o.min || o.factor < 2 || o.window == 0 || o.rounds == 0 {
        return Err(USAGE.into());
    }
    Ok(o)
}

fn ck(r: sys::CUresult, what: &str) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

fn g<T>(r: gpucoll::Result<T>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// The byte pattern of the message of `len` bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 131 + len * 7) % 251) as u8)
        .collect()
}

/// Pinned host memory (`cuMemHostAlloc`), freed on drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

impl Pinned {
    fn new(len: usize) -> Result<Pinned, String> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        ck(
            unsafe { sys::cuMemHostAlloc(&mut p, len, 0) },
            "cuMemHostAlloc",
        )?;
        Ok(Pinned {
            ptr: p as *mut u8,
            len,
        })
    }

    fn slice(&mut self, n: usize) -> &mut [u8] {
        // SAFETY: the allocation holds `len` bytes; `n` is at most that.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, n.min(self.len)) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        unsafe { sys::cuMemFreeHost(self.ptr as *mut c_void) };
    }
}

/// Iterations of a ping-pong of `size` bytes.
fn iters(size: usize) -> (usize, usize) {
    match size {
        0..=65_536 => (2000, 200),
        65_537..=4_194_304 => (200, 20),
        _ => (40, 5),
    }
}

struct Bench<'a> {
    world: &'a Communicator,
    rank: usize,
    send: DeviceBuffer<u8>,
    recv: DeviceBuffer<u8>,
    host: Pinned,
}

impl Bench<'_> {
    /// Half round trip of gpucoll's messages, in seconds.
    fn pingpong(&mut self, size: usize) -> Result<f64, String> {
        let (n, warm) = iters(size);
        let peer = self.world.process_at_rank(1 - self.rank);
        let send = g(self.send.view(0..size), "view")?;
        let mut recv = g(self.recv.view_mut(0..size), "view")?;
        let mut t0 = 0.0;
        for i in 0..n + warm {
            if i == warm {
                g(mpi::barrier(self.world), "barrier")?;
                t0 = gpucoll::wtime();
            }
            if self.rank == 0 {
                g(peer.send(&send), "send")?;
                g(peer.receive_into(&mut recv), "receive")?;
            } else {
                g(peer.receive_into(&mut recv), "receive")?;
                g(peer.send(&send), "send")?;
            }
        }
        Ok((gpucoll::wtime() - t0) / (2 * n) as f64)
    }

    /// Half round trip by hand staging, in seconds.
    fn staged(&mut self, size: usize) -> Result<f64, String> {
        let (n, warm) = iters(size);
        let peer = 1 - self.rank;
        let (dsend, drecv) = (self.send.device_ptr(), self.recv.device_ptr());
        let mut t0 = 0.0;
        for i in 0..n + warm {
            if i == warm {
                g(mpi::barrier(self.world), "barrier")?;
                t0 = gpucoll::wtime();
            }
            let h = self.host.slice(size);
            if self.rank == 0 {
                // SAFETY: pinned `h` and the device buffer hold `size` bytes.
                ck(
                    unsafe { sys::cuMemcpyDtoH_v2(h.as_mut_ptr().cast(), dsend, size) },
                    "DtoH",
                )?;
                g(mpi::send(self.world, h, peer, 1), "MPI send")?;
                g(
                    mpi::receive(self.world, h, Some(peer), Some(1)),
                    "MPI receive",
                )?;
                // SAFETY: as above.
                ck(
                    unsafe { sys::cuMemcpyHtoD_v2(drecv, h.as_ptr().cast(), size) },
                    "HtoD",
                )?;
            } else {
                g(
                    mpi::receive(self.world, h, Some(peer), Some(1)),
                    "MPI receive",
                )?;
                // SAFETY: as above.
                ck(
                    unsafe { sys::cuMemcpyHtoD_v2(drecv, h.as_ptr().cast(), size) },
                    "HtoD",
                )?;
                // SAFETY: as above.
                ck(
                    unsafe { sys::cuMemcpyDtoH_v2(h.as_mut_ptr().cast(), dsend, size) },
                    "DtoH",
                )?;
                g(mpi::send(self.world, h, peer, 1), "MPI send")?;
            }
        }
        Ok((gpucoll::wtime() - t0) / (2 * n) as f64)
    }

    /// One gpucoll message of `size` from rank 0 to 1, checked on rank 1.
    fn check(&mut self, size: usize) -> Result<(), String> {
        let want = pattern(size);
        if self.rank == 0 {
            let dst = self.send.device_ptr();
            // SAFETY: the buffer holds at least `size` bytes.
            ck(
                unsafe { sys::cuMemcpyHtoD_v2(dst, want.as_ptr().cast(), size) },
                "upload",
            )?;
            // From pageable memory the copy may return before its DMA
            // landed; the peer reads the buffer right after the send.
            // SAFETY: the legacy default stream (null handle).
            ck(
                unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) },
                "cuStreamSynchronize",
            )?;
            g(
                self.world
                    .process_at_rank(1)
                    .send_with_tag(&g(self.send.view(0..size), "view")?, 9),
                "send",
            )?;
        } else {
            let mut v = g(self.recv.view_mut(0..size), "view")?;
            g(
                self.world
                    .process_at_rank(0)
                    .receive_into_with_tag(&mut v, 9),
                "receive",
            )?;
            let mut got = vec![0u8; size];
            let src = self.recv.device_ptr();
            // SAFETY: the buffer holds at least `size` bytes, `got` as many.
            ck(
                unsafe { sys::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), src, size) },
                "download",
            )?;
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "the message of {size} bytes arrived wrong (byte {at})"
                ));
            }
        }
        Ok(())
    }

    /// Streaming bandwidth of `size`-byte messages (osu_bw), in GB/s.
    fn bandwidth(&mut self, size: usize, window: usize, rounds: usize) -> Result<f64, String> {
        let w = self.world;
        let mut sinks = Vec::new();
        if self.rank == 1 {
            for _ in 0..window {
                sinks.push(g(
                    DeviceBuffer::<u8>::zeroed(self.send.ordinal(), size),
                    "window buffer",
                )?);
            }
        }
        let send = g(self.send.view(0..size), "view")?;
        let mut t0 = 0.0;
        for round in 0..rounds + 1 {
            if round == 1 {
                g(mpi::barrier(w), "barrier")?;
                t0 = gpucoll::wtime();
            }
            let mut ack = [0u32; 1];
            if self.rank == 0 {
                let r = gpucoll::scope(|s| {
                    let reqs = (0..window)
                        .map(|_| w.process_at_rank(1).immediate_send_with_tag(s, &send, 2))
                        .collect::<gpucoll::Result<Vec<_>>>()?;
                    gpucoll::wait_all(reqs)
                });
                g(r, "window of sends")?;
                g(
                    w.process_at_rank(1).receive_into_with_tag(&mut ack, 3),
                    "ack",
                )?;
            } else {
                let r = gpucoll::scope(|s| {
                    let reqs = sinks
                        .iter_mut()
                        .map(|b| {
                            w.process_at_rank(0)
                                .immediate_receive_into_with_tag(s, b, 2)
                                .map(Into::into)
                        })
                        .collect::<gpucoll::Result<Vec<_>>>()?;
                    gpucoll::wait_all(reqs)
                });
                g(r, "window of receives")?;
                g(w.process_at_rank(0).send_with_tag(&ack, 3), "ack")?;
            }
        }
        let secs = gpucoll::wtime() - t0;
        Ok((size * window * rounds) as f64 / secs / 1e9)
    }

    /// Rank 1 copies rank 0's buffer, mapped through CUDA IPC: (back to
    /// back, one at a time) in GB/s; 0 on rank 0.
    fn memcpy_ipc(&mut self, size: usize, copies: usize) -> Result<(f64, f64), String> {
        let mut handle = [0u8; 64];
        if self.rank == 0 {
            let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: writes one handle; the buffer is a cuMemAlloc block.
            ck(
                unsafe { sys::cuIpcGetMemHandle(&mut h, self.send.device_ptr()) },
                "cuIpcGetMemHandle",
            )?;
            for (d, s) in handle.iter_mut().zip(h.reserved.iter()) {
                *d = *s as u8;
            }
            g(mpi::send(self.world, &handle, 1, 4), "send the handle")?;
            g(mpi::barrier(self.world), "barrier")?;
            return Ok((0.0, 0.0));
        }
        g(
            mpi::receive(self.world, &mut handle, Some(0), Some(4)),
            "receive the handle",
        )?;
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut peer = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: writes one pointer; the handle came from rank 0.
        ck(
            unsafe { sys::cuIpcOpenMemHandle_v2(&mut peer, h, flags) },
            "cuIpcOpenMemHandle",
        )?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one stream handle.
        ck(
            unsafe { sys::cuStreamCreate(&mut stream, 1) },
            "cuStreamCreate",
        )?;
        let dst = self.recv.device_ptr();
        let result = (|| {
            // SAFETY (every copy): both ranges hold `size` bytes: rank 0's
            // buffer stays allocated until the barrier below.
            unsafe {
                ck(
                    sys::cuMemcpyDtoDAsync_v2(dst, peer, size, stream),
                    "warm-up copy",
                )?;
                ck(sys::cuStreamSynchronize(stream), "sync")?;
                let t0 = gpucoll::wtime();
                for _ in 0..copies {
                    ck(sys::cuMemcpyDtoDAsync_v2(dst, peer, size, stream), "copy")?;
                }
                ck(sys::cuStreamSynchronize(stream), "sync")?;
                let streamed = (size * copies) as f64 / (gpucoll::wtime() - t0) / 1e9;
                let t1 = gpucoll::wtime();
                for _ in 0..copies {
                    ck(sys::cuMemcpyDtoD_v2(dst, peer, size), "synchronous copy")?;
                }
                let one = (size * copies) as f64 / (gpucoll::wtime() - t1) / 1e9;
                Ok((streamed, one))
            }
        })();
        // SAFETY: the mapping and the stream were made above, used no more.
        unsafe {
            sys::cuIpcCloseMemHandle(peer);
            sys::cuStreamDestroy_v2(stream);
        }
        g(mpi::barrier(self.world), "barrier")?;
        result
    }
}

fn run() -> Result<(), String> {
    let o = parse_opts()?;
    let universe = g(gpucoll::initialize(), "initialize")?;
    let world = g(universe.world(), "world")?;
    let gpu = world
        .device()
        .ok_or("gpucoll-p2p-bench needs the CUDA backend on every rank")?;
    if world.size() < 2 {
        return Err("gpucoll-p2p-bench needs two ranks".into());
    }
    let rank = world.rank();
    let ctx = CudaContext::new(gpu as usize).map_err(|e| format!("cudarc: {e:?}"))?;
    ctx.bind_to_thread().map_err(|e| format!("cudarc: {e:?}"))?;
    let pair = world.split(Some((rank >= 2) as u32), rank as i32);
    let pair = g(pair, "split")?.ok_or("split gave no communicator")?;
    if rank >= 2 {
        return Ok(());
    }
    let world = pair;
    let mut b = Bench {
        world: &world,
        rank,
        send: g(DeviceBuffer::from_host(gpu, &pattern(o.max)), "send buffer")?,
        recv: g(DeviceBuffer::zeroed(gpu, o.max), "receive buffer")?,
        host: Pinned::new(o.max)?,
    };
    let mut rows = Vec::new();
    if rank == 0 {
        println!(
            "# gpucoll-p2p-bench: 2 ranks, GPU {gpu} (rank 0), backend {}; half round trip of a ping-pong",
            world.backend_name()
        );
        println!(
            "{:>12} {:>12} {:>12} {:>8}",
            "size(B)", "gpucoll_us", "staged_us", "ratio"
        );
    }
    let mut size = o.min;
    let mut times = Vec::new();
    loop {
        b.check(size)?;
        let pp = b.pingpong(size)?;
        let st = b.staged(size)?;
        if rank == 0 {
            println!(
                "{size:>12} {:>12.2} {:>12.2} {:>8.3}",
                pp * 1e6,
                st * 1e6,
                pp / st
            );
        }
        rows.push(format!(
            "{{\"bytes\":{size},\"gpucoll_us\":{:.3},\"staged_us\":{:.3}}}",
            pp * 1e6,
            st * 1e6
        ));
        times.push((pp, st));
        if size >= o.max {
            break;
        }
        size = size.saturating_mul(o.factor).min(o.max);
    }
    let bw = b.bandwidth(o.max, o.window, o.rounds)?;
    let (ipc, ipc_sync) = b.memcpy_ipc(o.max, o.window * o.rounds)?;
    // Rank 1 measured the copies: rank 0 prints them.
    let mut figures = [ipc, ipc_sync];
    if rank == 1 {
        g(mpi::send(&world, &figures, 0, 5), "send the copy figures")?;
    } else {
        g(
            mpi::receive(&world, &mut figures, Some(1), Some(5)),
            "receive the copy figures",
        )?;
    }
    if rank == 0 {
        let (pp8, st8) = times.first().copied().unwrap_or((0.0, 0.0));
        let (last_pp, last_staged) = times.last().copied().unwrap_or((0.0, 0.0));
        let gb = |secs: f64| o.max as f64 / secs / 1e9;
        println!("# at {} bytes:", o.max);
        println!(
            "#   bw_GBs (osu_bw, window {} x {} rounds)  {bw:.1}",
            o.window, o.rounds
        );
        println!(
            "#   bw_pingpong_GBs                        {:.1}",
            gb(last_pp)
        );
        println!(
            "#   bw_staged_GBs                          {:.1}",
            gb(last_staged)
        );
        println!(
            "#   memcpy_ipc_GBs (back to back)          {:.1}",
            figures[0]
        );
        println!(
            "#   memcpy_ipc_sync_GBs (one at a time)    {:.1}",
            figures[1]
        );
        println!(
            "#   bw / memcpy_ipc = {:.3}; bw / staged = {:.1}",
            bw / figures[0],
            bw / gb(last_staged)
        );
        let summary = format!(
            "{{\"pingpong_{}B_us\":{:.3},\"pingpong_{}B_staged_us\":{:.3},\"bw_{}_GBs\":{:.2},\"bw_{}_staged_GBs\":{:.2},\"memcpy_ipc_GBs\":{:.2},\"bw_{}_pingpong_GBs\":{:.2},\"memcpy_ipc_sync_GBs\":{:.2}}}",
            o.min,
            pp8 * 1e6,
            o.min,
            st8 * 1e6,
            label(o.max),
            bw,
            label(o.max),
            gb(last_staged),
            figures[0],
            label(o.max),
            gb(last_pp),
            figures[1]
        );
        println!("{summary}");
        if let Some(path) = &o.json {
            let doc = format!("{{\"summary\":{summary},\"sizes\":[{}]}}\n", rows.join(","));
            std::fs::write(path, doc).map_err(|e| format!("writing {path}: {e}"))?;
        }
    }
    Ok(())
}

/// `64MiB` for 64 MiB, else the bytes.
fn label(bytes: usize) -> String {
    if bytes >= 1 << 20 && (bytes >> 20) << 20 == bytes {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{bytes}B")
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gpucoll-p2p-bench: {e}");
        std::process::exit(1);
    }
}

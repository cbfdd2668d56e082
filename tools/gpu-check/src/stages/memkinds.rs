//! `--stage memkinds`: every collective on memory that is not a plain
//! `cuMemAlloc` block, as programs' allocators hand it out:
//!
//! * `block`: `cuMemAlloc` (the reference);
//! * `subrange`: pieces of one large block at 4-byte but not 16-byte
//!   aligned offsets (caching allocators: PyTorch, CuPy's pool);
//! * `managed`: `cuMemAllocManaged` (OSU's `-d managed`, `cudaMallocManaged`);
//! * `pool`: `cuMemAllocAsync` from the device's default pool
//!   (`cudaMallocAsync`, PyTorch's `backend:cudaMallocAsync`);
//! * `vmm`, `vmm_fd`: `cuMemCreate` + `cuMemMap`, without and with a
//!   shareable (POSIX file descriptor) handle (JAX, expandable segments);
//! * `pinned`, `hostreg`: pinned host memory (`cuMemHostAlloc`) and pageable
//!   memory registered with `cuMemHostRegister`.
//!
//! For each kind: all_reduce (out of place and in place), all_gather (both),
//! reduce_scatter_block, all_to_all, broadcast, reduce, gather and scatter
//! through the raw entry points, for 1, 1031 and 2^19 + 3 elements, blocking
//! and then queued on a stream of the program's; then the same once more
//! after every rank registered its buffers (`register_raw`). Every element
//! is compared with the exact result. Host memory on a stream and its
//! registration must be refused with `WrongMemory`; anything else refused,
//! and any wrong element, fails the stage.

use super::gv;
use cudarc::driver::{sys, CudaContext, CudaStream};
use gpucoll::{Communicator, CudaStreamRaw, Datatype, Error, ReduceOp, Registration, Result};
use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::Arc;

fn ck(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Backend(format!("{what}: {r:?}")))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Block,
    SubRange,
    Managed,
    Pool,
    Vmm,
    VmmFd,
    Pinned,
    HostReg,
}

impl Kind {
    pub(crate) const ALL: [Kind; 8] = [
        Kind::Block,
        Kind::SubRange,
        Kind::Managed,
        Kind::Pool,
        Kind::Vmm,
        Kind::VmmFd,
        Kind::Pinned,
        Kind::HostReg,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Block => "block",
            Kind::SubRange => "subrange",
            Kind::Managed => "managed",
            Kind::Pool => "pool",
            Kind::Vmm => "vmm",
            Kind::VmmFd => "vmm_fd",
            Kind::Pinned => "pinned",
            Kind::HostReg => "hostreg",
        }
    }

    pub(crate) fn host(self) -> bool {
        matches!(self, Kind::Pinned | Kind::HostReg)
    }
}

/// How one allocation is given back.
enum Release {
    Free,
    Nothing,
    Pool(sys::CUstream),
    Vmm(sys::CUmemGenericAllocationHandle, usize),
    Host,
    /// The pageable buffer, kept until it is unregistered.
    Unregister {
        _buf: Vec<u8>,
    },
}

/// One allocation of some kind; freed on drop.
pub(crate) struct Mem {
    pub(crate) ptr: u64,
    release: Release,
}

impl Mem {
    /// Memory someone else frees.
    pub(crate) fn borrowed(ptr: u64) -> Mem {
        Mem {
            ptr,
            release: Release::Nothing,
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: each arm gives back what `Arena::alloc` took, once; the
        // collectives on it were synchronized before the stage drops it.
        unsafe {
            match &self.release {
                Release::Free => {
                    let _ = sys::cuMemFree_v2(self.ptr);
                }
                Release::Nothing => {}
                Release::Pool(s) => {
                    let _ = sys::cuMemFreeAsync(self.ptr, *s);
                    let _ = sys::cuStreamSynchronize(*s);
                }
                Release::Vmm(h, size) => {
                    let _ = sys::cuMemUnmap(self.ptr, *size);
                    let _ = sys::cuMemAddressFree(self.ptr, *size);
                    let _ = sys::cuMemRelease(*h);
                }
                Release::Host => {
                    let _ = sys::cuMemFreeHost(self.ptr as usize as *mut c_void);
                }
                Release::Unregister { .. } => {
                    let _ = sys::cuMemHostUnregister(self.ptr as usize as *mut c_void);
                }
            }
        }
    }
}

/// Allocations of every kind on one GPU.
pub(crate) struct Arena {
    gpu: i32,
    stream: Arc<CudaStream>,
    /// The large block `subrange` pieces come from, and the next offset.
    big: Mem,
    big_bytes: usize,
    cursor: usize,
}

const BIG_BYTES: usize = 96 << 20;

impl Arena {
    pub(crate) fn new(gpu: i32, stream: Arc<CudaStream>) -> Result<Arena> {
        let mut p = 0;
        // SAFETY: writes one device pointer.
        ck(
            unsafe { sys::cuMemAlloc_v2(&mut p, BIG_BYTES) },
            "cuMemAlloc",
        )?;
        Ok(Arena {
            gpu,
            stream,
            big: Mem {
                ptr: p,
                release: Release::Free,
            },
            big_bytes: BIG_BYTES,
            cursor: 0,
        })
    }
}

/// `bytes` (rounded up to the granularity) of `cuMemCreate` memory on
/// `gpu`, mapped read-write there; exportable as a POSIX descriptor when
/// `fd`.
pub(crate) fn vmm_alloc(gpu: i32, bytes: usize, fd: bool) -> Result<Mem> {
    let prop = vmm_prop(gpu, fd);
    let mut gran = 0usize;
    // SAFETY: writes one usize; prop is initialized.
    ck(
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    let size = bytes.div_ceil(gran.max(1)) * gran.max(1);
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: writes one handle; prop is initialized.
    ck(
        unsafe { sys::cuMemCreate(&mut h, size, &prop, 0) },
        "cuMemCreate",
    )?;
    let mut p = 0;
    // SAFETY: writes one address; size is a multiple of the granularity.
    let r = unsafe { sys::cuMemAddressReserve(&mut p, size, 0, 0, 0) };
    if let Err(e) = ck(r, "cuMemAddressReserve") {
        // SAFETY: the handle just created, unused.
        unsafe { sys::cuMemRelease(h) };
        return Err(e);
    }
    let mem = Mem {
        ptr: p,
        release: Release::Vmm(h, size),
    };
    // SAFETY: maps the whole handle at the reserved range (dropping
    // `mem` undoes both on failure).
    ck(unsafe { sys::cuMemMap(p, size, 0, h, 0) }, "cuMemMap")?;
    set_rw(p, size, gpu)?;
    Ok(mem)
}

/// Pinned device memory of `gpu`, exportable as a POSIX descriptor when
/// `fd`.
pub(crate) fn vmm_prop(gpu: i32, fd: bool) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; every field the driver reads is set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = gpu;
    prop.requestedHandleTypes = if fd {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    } else {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
    };
    prop
}

/// Make the mapped `[p, p + size)` readable and writable by `gpu`.
pub(crate) fn set_rw(p: u64, size: usize, gpu: i32) -> Result<()> {
    let desc = sys::CUmemAccessDesc {
        location: vmm_prop(gpu, false).location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: one descriptor for a range the caller mapped.
    ck(
        unsafe { sys::cuMemSetAccess(p, size, &desc, 1) },
        "cuMemSetAccess",
    )
}

impl Arena {
    /// `bytes` (at least 4) of memory of `kind`, filled with -1.0 floats.
    pub(crate) fn alloc(&mut self, kind: Kind, bytes: usize) -> Result<Mem> {
        let bytes = bytes.max(4);
        let mut p = 0;
        let mem = match kind {
            Kind::Block => {
                // SAFETY: writes one device pointer.
                ck(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, "cuMemAlloc")?;
                Mem {
                    ptr: p,
                    release: Release::Free,
                }
            }
            Kind::SubRange => {
                // 4 more than a multiple of 16 past the previous piece.
                let off = self.cursor.div_ceil(16) * 16 + 4;
                if off + bytes > self.big_bytes {
                    return Err(Error::Backend(
                        "memkinds: the sub-range block is full".into(),
                    ));
                }
                self.cursor = off + bytes;
                Mem {
                    ptr: self.big.ptr + off as u64,
                    release: Release::Nothing,
                }
            }
            Kind::Managed => {
                let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
                // SAFETY: writes one pointer.
                ck(
                    unsafe { sys::cuMemAllocManaged(&mut p, bytes, flags) },
                    "cuMemAllocManaged",
                )?;
                Mem {
                    ptr: p,
                    release: Release::Free,
                }
            }
            Kind::Pool => {
                let s = self.stream.cu_stream();
                // SAFETY: writes one pointer; the stream is the arena's.
                ck(
                    unsafe { sys::cuMemAllocAsync(&mut p, bytes, s) },
                    "cuMemAllocAsync",
                )?;
                // SAFETY: the arena's stream.
                ck(
                    unsafe { sys::cuStreamSynchronize(s) },
                    "cuStreamSynchronize",
                )?;
                Mem {
                    ptr: p,
                    release: Release::Pool(s),
                }
            }
            Kind::Vmm => vmm_alloc(self.gpu, bytes, false)?,
            Kind::VmmFd => vmm_alloc(self.gpu, bytes, true)?,
            Kind::Pinned => {
                let mut h: *mut c_void = std::ptr::null_mut();
                let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
                // SAFETY: writes one pointer.
                ck(
                    unsafe { sys::cuMemHostAlloc(&mut h, bytes, flags) },
                    "cuMemHostAlloc",
                )?;
                Mem {
                    ptr: h as usize as u64,
                    release: Release::Host,
                }
            }
            Kind::HostReg => {
                let mut v = vec![0u8; bytes];
                let h = v.as_mut_ptr() as *mut c_void;
                let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
                // SAFETY: `v` owns `bytes` bytes and lives in the Mem until
                // after the unregistration.
                ck(
                    unsafe { sys::cuMemHostRegister_v2(h, bytes, flags) },
                    "cuMemHostRegister",
                )?;
                Mem {
                    ptr: h as usize as u64,
                    release: Release::Unregister { _buf: v },
                }
            }
        };
        put(&mem, &vec![-1.0; bytes / 4])?;
        Ok(mem)
    }
}

/// Write `v` at the start of `m` (any kind: unified addressing), and wait
/// until it is there: a `cuMemcpy` from pageable memory returns once `v`
/// is staged, while the DMA into device memory may still run on the legacy
/// stream, which the collectives (on streams of their own) do not wait for
/// (the raw entry points' contract: the caller's writes are complete).
pub(crate) fn put(m: &Mem, v: &[f32]) -> Result<()> {
    // SAFETY: `m` holds at least v.len() floats; `v` is read before the
    // legacy stream's synchronization returns.
    ck(
        unsafe { sys::cuMemcpy(m.ptr, v.as_ptr() as usize as u64, std::mem::size_of_val(v)) },
        "cuMemcpy (upload)",
    )?;
    // SAFETY: the legacy default stream (null handle).
    ck(
        unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) },
        "cuStreamSynchronize (legacy stream)",
    )
}

/// The first `n` floats of `m`.
pub(crate) fn get(m: &Mem, n: usize) -> Result<Vec<f32>> {
    let mut v = vec![0f32; n];
    // SAFETY: `m` holds at least n floats; `v` has room for them.
    ck(
        unsafe { sys::cuMemcpy(v.as_mut_ptr() as usize as u64, m.ptr, n * 4) },
        "cuMemcpy (download)",
    )?;
    Ok(v)
}

fn vp(m: &Mem) -> *mut c_void {
    m.ptr as usize as *mut c_void
}

/// One collective's output and what it must hold.
struct Check {
    what: String,
    out: Mem,
    want: Vec<f32>,
    /// Inputs (and registrations) kept alive until the check.
    _keep: Vec<Mem>,
    _regs: Vec<Registration>,
}

struct Run<'a> {
    world: &'a Communicator,
    arena: Arena,
    rank: usize,
    size: usize,
    calls: usize,
    wrong: usize,
    /// Registrations made, and how many of them map peers' memory.
    regs: usize,
    direct: usize,
}

impl Run<'_> {
    fn mine(&self, it: u64, len: u64) -> Vec<f32> {
        (0..len).map(|j| gv(self.rank, j, it)).collect()
    }

    fn sum(&self, j: u64, it: u64) -> f32 {
        (0..self.size).map(|r| gv(r, j, it)).sum()
    }

    fn filled(&mut self, kind: Kind, v: &[f32]) -> Result<Mem> {
        let m = self.arena.alloc(kind, v.len() * 4)?;
        put(&m, v)?;
        Ok(m)
    }

    fn register(
        &mut self,
        regs: &mut Vec<Registration>,
        m: &Mem,
        bytes: usize,
        kind: Kind,
    ) -> Result<()> {
        match self.world.register_raw(vp(m) as *const c_void, bytes) {
            Ok(r) => {
                if kind.host() {
                    return Err(Error::Backend(format!(
                        "memkinds: {} host memory was registered",
                        kind.name()
                    )));
                }
                self.regs += 1;
                self.direct += usize::from(r.is_direct());
                regs.push(r);
                Ok(())
            }
            Err(Error::WrongMemory(_)) if kind.host() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `send` uploaded into new memory of `kind` and an output of
    /// `out_elems` floats, both registered when `reg`.
    fn pair(
        &mut self,
        kind: Kind,
        reg: bool,
        send: &[f32],
        out_elems: usize,
        regs: &mut Vec<Registration>,
    ) -> Result<(Mem, Mem)> {
        let s = self.filled(kind, send)?;
        let o = self.arena.alloc(kind, out_elems * 4)?;
        if reg {
            self.register(regs, &s, send.len() * 4, kind)?;
            self.register(regs, &o, out_elems * 4, kind)?;
        }
        Ok((s, o))
    }

    /// Every collective on `kind` for `n` elements; queued on the arena's
    /// stream when `queued`, registered first when `reg`.
    fn round(
        &mut self,
        kind: Kind,
        n: u64,
        queued: bool,
        reg: bool,
        it: u64,
    ) -> Result<Vec<Check>> {
        let (rank, size) = (self.rank, self.size);
        // The previous round's pieces were checked and dropped.
        self.arena.cursor = 0;
        let nu = n as usize;
        let total = n * size as u64;
        let root = 1 % size;
        let stream: Option<CudaStreamRaw> =
            queued.then(|| self.arena.stream.cu_stream() as CudaStreamRaw);
        let tag = format!(
            "{} n={n}{}{}",
            kind.name(),
            if queued { " queued" } else { "" },
            if reg { " registered" } else { "" }
        );
        let mut checks = Vec::new();
        let mut regs = Vec::new();
        let f32t = Datatype::F32;
        let sum = ReduceOp::Sum;
        // What `out` must hold after collective `what`; `keep` and the
        // registrations made since the last check live until it.
        let mut push = |what: &str, out: Mem, want: Vec<f32>, keep: Vec<Mem>, regs: &mut Vec<_>| {
            checks.push(Check {
                what: format!("{what} {tag}"),
                out,
                want,
                _keep: keep,
                _regs: std::mem::take(regs),
            })
        };

        // all_reduce out of place and in place
        let (send, out) = self.pair(kind, reg, &self.mine(it, n), nu, &mut regs)?;
        let ip = self.filled(kind, &self.mine(it, n))?;
        if reg {
            self.register(&mut regs, &ip, nu * 4, kind)?;
        }
        // SAFETY: the buffers live in `checks` until after the stream is synchronized.
        unsafe {
            self.world
                .all_reduce_raw(vp(&send), vp(&out), n, f32t, sum, stream)?;
            self.world
                .all_reduce_raw(vp(&ip), vp(&ip), n, f32t, sum, stream)?;
        }
        let want: Vec<f32> = (0..n).map(|j| self.sum(j, it)).collect();
        push("all_reduce", out, want.clone(), vec![send], &mut regs);
        push("all_reduce in place", ip, want, vec![], &mut vec![]);

        // all_gather out of place and in place
        let it1 = it + 1;
        let (send, out) = self.pair(kind, reg, &self.mine(it1, n), nu * size, &mut regs)?;
        let mut init = vec![-1.0; nu * size];
        init[rank * nu..(rank + 1) * nu].copy_from_slice(&self.mine(it1, n));
        let ip = self.filled(kind, &init)?;
        if reg {
            self.register(&mut regs, &ip, nu * size * 4, kind)?;
        }
        let mine_at = (ip.ptr + (rank * nu * 4) as u64) as usize as *const c_void;
        // SAFETY: as above; `mine_at` is this rank's block of `ip`.
        unsafe {
            self.world
                .all_gather_raw(vp(&send), vp(&out), n, f32t, stream)?;
            self.world
                .all_gather_raw(mine_at, vp(&ip), n, f32t, stream)?;
        }
        let want: Vec<f32> = (0..size)
            .flat_map(|r| (0..n).map(move |j| gv(r, j, it1)))
            .collect();
        push("all_gather", out, want.clone(), vec![send], &mut regs);
        push("all_gather in place", ip, want, vec![], &mut vec![]);

        // reduce_scatter_block
        let it2 = it + 2;
        let (send, out) = self.pair(kind, reg, &self.mine(it2, total), nu, &mut regs)?;
        // SAFETY: as above.
        unsafe {
            self.world
                .reduce_scatter_block_raw(vp(&send), vp(&out), n, f32t, sum, stream)?
        };
        let want: Vec<f32> = (0..n).map(|j| self.sum(rank as u64 * n + j, it2)).collect();
        push("reduce_scatter_block", out, want, vec![send], &mut regs);

        // all_to_all
        let it3 = it + 3;
        let (send, out) = self.pair(kind, reg, &self.mine(it3, total), nu * size, &mut regs)?;
        // SAFETY: as above.
        unsafe {
            self.world
                .all_to_all_raw(vp(&send), vp(&out), n, f32t, stream)?
        };
        let want: Vec<f32> = (0..size)
            .flat_map(|s| (0..n).map(move |j| gv(s, rank as u64 * n + j, it3)))
            .collect();
        push("all_to_all", out, want, vec![send], &mut regs);

        // broadcast from `root`
        let it4 = it + 4;
        let init = if rank == root {
            self.mine(it4, n)
        } else {
            vec![-1.0; nu]
        };
        let b = self.filled(kind, &init)?;
        if reg {
            self.register(&mut regs, &b, nu * 4, kind)?;
        }
        // SAFETY: as above.
        unsafe { self.world.broadcast_raw(vp(&b), n, f32t, root, stream)? };
        let want: Vec<f32> = (0..n).map(|j| gv(root, j, it4)).collect();
        push("broadcast", b, want, vec![], &mut regs);

        // reduce to rank 0
        let it5 = it + 5;
        let (send, out) = self.pair(kind, reg, &self.mine(it5, n), nu, &mut regs)?;
        // SAFETY: as above.
        unsafe {
            self.world
                .reduce_raw(vp(&send), vp(&out), n, f32t, sum, 0, stream)?
        };
        let want: Vec<f32> = if rank == 0 {
            (0..n).map(|j| self.sum(j, it5)).collect()
        } else {
            vec![-1.0; nu]
        };
        push("reduce", out, want, vec![send], &mut regs);

        // gather to `root`, scatter from `root`
        let it6 = it + 6;
        let (send, out) = self.pair(kind, reg, &self.mine(it6, n), nu * size, &mut regs)?;
        // SAFETY: as above.
        unsafe {
            self.world
                .gather_raw(vp(&send), vp(&out), n, f32t, root, stream)?
        };
        let want: Vec<f32> = if rank == root {
            (0..size)
                .flat_map(|r| (0..n).map(move |j| gv(r, j, it6)))
                .collect()
        } else {
            vec![-1.0; nu * size]
        };
        push("gather", out, want, vec![send], &mut regs);

        let it7 = it + 7;
        let (send, out) = self.pair(kind, reg, &self.mine(it7, total), nu, &mut regs)?;
        // SAFETY: as above.
        unsafe {
            self.world
                .scatter_raw(vp(&send), vp(&out), n, f32t, root, stream)?
        };
        let want: Vec<f32> = (0..n).map(|j| gv(root, rank as u64 * n + j, it7)).collect();
        push("scatter", out, want, vec![send], &mut regs);
        self.calls += 10;
        Ok(checks)
    }

    fn verify(&mut self, checks: Vec<Check>, log: &mut String) -> Result<()> {
        // SAFETY: the arena's stream (no-op when nothing was queued).
        ck(
            unsafe { sys::cuStreamSynchronize(self.arena.stream.cu_stream()) },
            "cuStreamSynchronize",
        )?;
        for c in checks {
            let got = get(&c.out, c.want.len())?;
            let bad = got.iter().zip(&c.want).filter(|(g, w)| g != w).count();
            if bad > 0 {
                let i = got
                    .iter()
                    .zip(&c.want)
                    .position(|(g, w)| g != w)
                    .unwrap_or(0);
                let _ = writeln!(
                    log,
                    "rank {} WRONG memkinds {}: {bad} elements; first at {i}: got {} want {}",
                    self.rank, c.what, got[i], c.want[i]
                );
                self.wrong += bad;
            }
        }
        Ok(())
    }

    fn kind(&mut self, kind: Kind, log: &mut String) -> Result<()> {
        let mut it = 0;
        for n in [1u64, 1031, (1 << 19) + 3] {
            for reg in [false, true] {
                // blocking
                let checks = self.round(kind, n, false, reg, it)?;
                self.verify(checks, log)?;
                it += 8;
                // queued on the program's stream
                if kind.host() {
                    let m = self.arena.alloc(kind, 64)?;
                    let s = self.arena.stream.cu_stream() as CudaStreamRaw;
                    // SAFETY: refused before it touches the memory (host memory on a stream).
                    let r = unsafe {
                        self.world.all_reduce_raw(
                            vp(&m),
                            vp(&m),
                            16,
                            Datatype::F32,
                            ReduceOp::Sum,
                            Some(s),
                        )
                    };
                    if !matches!(r, Err(Error::WrongMemory(_))) {
                        let _ = writeln!(
                            log,
                            "rank {} WRONG memkinds {}: host memory on a stream gave {r:?}",
                            self.rank,
                            kind.name()
                        );
                        self.wrong += 1;
                    }
                } else {
                    let checks = self.round(kind, n, true, reg, it)?;
                    self.verify(checks, log)?;
                    it += 8;
                }
            }
        }
        self.world.async_error()
    }
}

/// What the driver says of memory of `kind`: its memory type and whether
/// it is managed.
fn driver_view(arena: &mut Arena, kind: Kind) -> String {
    let Ok(m) = arena.alloc(kind, 64) else {
        return "no allocation".into();
    };
    let (mut mt, mut managed) = (0u32, 0u32);
    // SAFETY: each attribute writes one unsigned int.
    let r1 = unsafe {
        sys::cuPointerGetAttribute(
            &mut mt as *mut u32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            m.ptr,
        )
    };
    // SAFETY: as above.
    let r2 = unsafe {
        sys::cuPointerGetAttribute(
            &mut managed as *mut u32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            m.ptr,
        )
    };
    format!("memory type {mt} ({r1:?}), managed {managed} ({r2:?})")
}

pub(crate) fn stage_memkinds(world: &Communicator, log: &mut String) -> Result<usize> {
    let gpu = world
        .device()
        .ok_or_else(|| Error::Backend("memkinds needs the CUDA backend".into()))?;
    let ctx =
        CudaContext::new(gpu as usize).map_err(|e| Error::Backend(format!("cudarc: {e:?}")))?;
    ctx.bind_to_thread()
        .map_err(|e| Error::Backend(format!("cudarc: {e:?}")))?;
    let stream = ctx
        .new_stream()
        .map_err(|e| Error::Backend(format!("cudarc: {e:?}")))?;
    let mut run = Run {
        world,
        arena: Arena::new(gpu, stream)?,
        rank: world.rank(),
        size: world.size(),
        calls: 0,
        wrong: 0,
        regs: 0,
        direct: 0,
    };
    let only = std::env::var("GPU_MEMKINDS").ok();
    for kind in Kind::ALL {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|k| k == kind.name()))
        {
            continue;
        }
        let (before, regs, direct) = (run.wrong, run.regs, run.direct);
        if let Err(e) = run.kind(kind, log) {
            let _ = writeln!(log, "rank {} ERROR memkinds {}: {e}", run.rank, kind.name());
            return Ok(run.wrong + 1);
        }
        let _ = writeln!(
            log,
            "rank {} memkinds {} ({}): {} wrong; {} of {} registrations direct",
            run.rank,
            kind.name(),
            driver_view(&mut run.arena, kind),
            run.wrong - before,
            run.direct - direct,
            run.regs - regs
        );
    }
    let _ = writeln!(
        log,
        "rank {} memkinds: {} calls, {} wrong",
        run.rank, run.calls, run.wrong
    );
    Ok(run.wrong)
}

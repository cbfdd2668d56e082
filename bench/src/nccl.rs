//! NCCL for `--vs-nccl` (feature `cuda`): a communicator over the same ranks
//! and GPUs as gpucoll's, its own non-blocking stream, ordinary device
//! buffers and, with NCCL ≥ 2.27, two symmetric windows (`ncclMemAlloc`
//! memory registered with `ncclCommWindowRegister(...,
//! NCCL_WIN_COLL_SYMMETRIC)`). Entry points come from ncclapi.rs (the
//! library `--nccl-lib` names, or the loader's). Like cudarc's `Comm`, the
//! handle is dropped with `ncclCommAbort` (no collective teardown that could
//! hang on a dead peer). NVLink multicast stays off: the caller sets
//! `NCCL_NVLS_ENABLE=0` and nothing here creates multicast objects.

pub use imp::*;

/// Why NCCL could not be set up.
#[derive(Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub enum InitError {
    /// Every rank agrees NCCL cannot be used (no libnccl): a clean exit.
    Unavailable(String),
    /// A call failed on this rank; peers may be waiting in a collective.
    Failed(String),
}

#[cfg(feature = "cuda")]
mod imp {
    use super::InitError;
    use crate::data::{Case, Elem};
    use crate::gpu::Gpu;
    use crate::ncclapi::{
        Comm, NcclApi, UniqueId, Window, SCALAR_HOST_IMMEDIATE, WIN_COLL_SYMMETRIC,
    };
    use cudarc::driver::{sys as dsys, CudaContext, CudaStream};
    use gpucoll::{CollKind, Communicator, Datatype, DeviceBuffer, ReduceOp};
    use std::ffi::{c_char, c_int, c_void};
    use std::marker::PhantomData;
    use std::path::Path;
    use std::sync::Arc;

    /// `ncclDataType_t` of `d` (nccl.h).
    fn nccl_dtype(d: Datatype) -> c_int {
        match d {
            Datatype::I8 => 0,
            Datatype::U8 => 1,
            Datatype::I32 => 2,
            Datatype::U32 => 3,
            Datatype::I64 => 4,
            Datatype::U64 => 5,
            Datatype::F16 => 6,
            Datatype::F32 => 7,
            Datatype::F64 => 8,
            Datatype::BF16 => 9,
        }
    }

    /// One symmetric window: NCCL-allocated memory and its registration.
    struct SymWindow {
        ptr: *mut c_void,
        /// Kept for the record; the windows end with the communicator.
        _win: Window,
    }

    /// An NCCL communicator over the same ranks and GPUs as `world`, with
    /// its own non-blocking stream.
    pub struct Nccl {
        api: &'static NcclApi,
        comm: Comm,
        stream: Arc<CudaStream>,
        ctx: Arc<CudaContext>,
        /// `ncclGetVersion`, e.g. 22803.
        pub version: i32,
        /// A valid device address for arguments NCCL ignores on this rank
        /// (the receive buffer of a non-root reduce, say).
        dummy: DeviceBuffer<u64>,
        /// Send and receive windows of `sym_bytes` each, when available.
        sym: Option<[SymWindow; 2]>,
        sym_bytes: usize,
        /// Why there are no symmetric windows (printed in the header).
        sym_note: Option<String>,
    }

    impl Nccl {
        /// Make the communicator (collective over `world`) from the library
        /// `lib` (or the loader's), with symmetric windows of `sym_bytes`
        /// each when the library has them. The caller has set
        /// `NCCL_NVLS_ENABLE=0` before any NCCL call.
        pub fn init(
            world: &Communicator,
            gpu: &Gpu,
            lib: Option<&Path>,
            sym_bytes: u64,
        ) -> Result<Nccl, InitError> {
            let fail = InitError::Failed;
            let path = lib.map(|p| p.to_string_lossy().into_owned());
            let loaded = NcclApi::load(path.as_deref());
            let mut all = [0u64];
            gpucoll::reference::all_reduce(
                world,
                &[loaded.is_ok() as u64][..],
                &mut all[..],
                ReduceOp::Min,
            )
            .map_err(|e| fail(format!("MPI allreduce: {e}")))?;
            let api = match loaded {
                Ok(api) if all[0] == 1 => api,
                Ok(_) => {
                    return Err(InitError::Unavailable(
                        "NCCL cannot be loaded on another rank".into(),
                    ))
                }
                Err(e) => return Err(InitError::Unavailable(e)),
            };
            let mut version: c_int = 0;
            // SAFETY: a valid out pointer.
            api.check(
                unsafe { (api.get_version)(&mut version) },
                "ncclGetVersion",
                None,
            )
            .map_err(fail)?;
            let ctx = CudaContext::new(gpu.ordinal as usize)
                .map_err(|e| fail(format!("CUDA context of GPU {}: {e:?}", gpu.ordinal)))?;
            let stream = ctx
                .new_stream()
                .map_err(|e| fail(format!("CUDA stream on GPU {}: {e:?}", gpu.ordinal)))?;
            let dummy = DeviceBuffer::<u64>::zeroed(gpu.ordinal, 8)
                .map_err(|e| fail(format!("GPU {}: {e}", gpu.ordinal)))?;

            // Rank 0 makes the id; byte 0 says whether it could.
            let mut msg = [0u8; 129];
            if world.rank() == 0 {
                let mut id = UniqueId { internal: [0; 128] };
                // SAFETY: a valid out pointer.
                match api.check(
                    unsafe { (api.get_unique_id)(&mut id) },
                    "ncclGetUniqueId",
                    None,
                ) {
                    Ok(()) => {
                        msg[0] = 1;
                        for (m, c) in msg[1..].iter_mut().zip(id.internal.iter()) {
                            *m = *c as u8;
                        }
                    }
                    Err(e) => eprintln!("gpucoll-bench: {e}"),
                }
            }
            gpucoll::reference::broadcast(world, &mut msg[..], 0)
                .map_err(|e| fail(format!("MPI broadcast of the NCCL id: {e}")))?;
            if msg[0] != 1 {
                return Err(fail("rank 0 could not create an NCCL unique id".into()));
            }
            let mut id = UniqueId { internal: [0; 128] };
            for (c, m) in id.internal.iter_mut().zip(msg[1..].iter()) {
                *c = *m as c_char;
            }
            ctx.bind_to_thread()
                .map_err(|e| fail(format!("binding GPU {}: {e:?}", gpu.ordinal)))?;
            let mut comm: Comm = std::ptr::null_mut();
            let (n, r) = (world.size() as c_int, world.rank() as c_int);
            // SAFETY: `comm` is a valid out pointer; the id is rank 0's.
            api.check(
                unsafe { (api.comm_init_rank)(&mut comm, n, id, r) },
                "ncclCommInitRank",
                None,
            )
            .map_err(fail)?;
            let mut nccl = Nccl {
                api,
                comm,
                stream,
                ctx,
                version,
                dummy,
                sym: None,
                sym_bytes: 0,
                sym_note: None,
            };
            nccl.open_windows(world, sym_bytes)?;
            Ok(nccl)
        }

        /// Allocate and register the two symmetric windows (collective),
        /// or note why there are none.
        fn open_windows(&mut self, world: &Communicator, bytes: u64) -> Result<(), InitError> {
            let api = self.api;
            let w = match api.windows {
                Some(w) if self.version >= 22700 => w,
                _ => {
                    self.sym_note = Some(format!(
                        "NCCL {} has no symmetric windows (NCCL >= 2.27 has)",
                        self.version_string()
                    ));
                    return Ok(());
                }
            };
            let Ok(bytes) = usize::try_from(bytes.max(8)) else {
                self.sym_note = Some(format!("{bytes} bytes do not fit this machine"));
                return Ok(());
            };
            let mut ptrs = [std::ptr::null_mut::<c_void>(); 2];
            // NCCL allocates on the current device (this context's).
            let mut why = self.bind().err();
            for p in ptrs.iter_mut() {
                if why.is_some() {
                    break;
                }
                // SAFETY: a valid out pointer; NCCL allocates on the bound GPU.
                let r = unsafe { (w.mem_alloc)(p, bytes) };
                if let Err(e) = api.check(r, &format!("ncclMemAlloc({bytes})"), None) {
                    *p = std::ptr::null_mut();
                    why = Some(e);
                    break;
                }
            }
            // Registration is collective: every rank must have its memory.
            let mut all = [0u64];
            gpucoll::reference::all_reduce(
                world,
                &[why.is_none() as u64][..],
                &mut all[..],
                ReduceOp::Min,
            )
            .map_err(|e| InitError::Failed(format!("MPI allreduce: {e}")))?;
            if all[0] == 0 {
                for p in ptrs.into_iter().filter(|p| !p.is_null()) {
                    // SAFETY: memory from ncclMemAlloc, not registered, freed once.
                    let _ = unsafe { (w.mem_free)(p) };
                }
                self.sym_note =
                    Some(why.unwrap_or_else(|| "ncclMemAlloc failed on another rank".into()));
                return Ok(());
            }
            let mut wins: [Window; 2] = [std::ptr::null_mut(); 2];
            for (p, win) in ptrs.iter().zip(wins.iter_mut()) {
                // SAFETY: `p` is `bytes` of ncclMemAlloc memory of this
                // communicator's GPU; `win` is a valid out pointer. Drop
                // frees the memory only after the communicator is gone.
                let r = unsafe { (w.register)(self.comm, *p, bytes, win, WIN_COLL_SYMMETRIC) };
                if let Err(e) = api.check(r, "ncclCommWindowRegister", Some(self.comm)) {
                    // Keep the memory with the communicator; exit follows.
                    return Err(InitError::Failed(e));
                }
            }
            self.sym = Some([
                SymWindow {
                    ptr: ptrs[0],
                    _win: wins[0],
                },
                SymWindow {
                    ptr: ptrs[1],
                    _win: wins[1],
                },
            ]);
            self.sym_bytes = bytes;
            Ok(())
        }

        /// The version as NCCL prints it (2.28.3).
        pub fn version_string(&self) -> String {
            let v = self.version;
            format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
        }

        /// The library file in use.
        pub fn lib_path(&self) -> &str {
            &self.api.path
        }

        /// Whether this libnccl has the collective (all-to-all, gather and
        /// scatter entry points arrived in NCCL 2.28).
        pub fn supports(&self, kind: CollKind) -> bool {
            match kind {
                CollKind::AllToAll => self.api.all_to_all.is_some(),
                CollKind::Gather => self.api.gather.is_some(),
                CollKind::Scatter => self.api.scatter.is_some(),
                // NCCL has no prefix reduction.
                CollKind::Scan | CollKind::ExclusiveScan => false,
                _ => true,
            }
        }

        /// The symmetric windows' device addresses (send, receive), each of
        /// [`sym_bytes`](Self::sym_bytes); `None` when there are none.
        pub fn sym_ptrs(&self) -> Option<(u64, u64)> {
            self.sym
                .as_ref()
                .map(|[s, r]| (s.ptr as usize as u64, r.ptr as usize as u64))
        }

        pub fn sym_bytes(&self) -> usize {
            self.sym_bytes
        }

        /// Why there are no symmetric windows (`None` when there are).
        pub fn sym_note(&self) -> Option<&str> {
            self.sym_note.as_deref()
        }

        /// Copy `host` to the start of the symmetric window at `ptr`.
        pub fn sym_upload<T: Elem>(&self, ptr: u64, host: &[T]) -> Result<(), String> {
            self.sym_fits(ptr, std::mem::size_of_val(host))?;
            self.bind()?;
            // SAFETY: `ptr` starts a window of `sym_bytes` device bytes
            // (checked above) that no queued work uses (callers sync first).
            unsafe { cudarc::driver::result::memcpy_htod_sync(ptr, host) }
                .map_err(|e| format!("copy to a symmetric window: {e:?}"))
        }

        /// Copy the start of the symmetric window at `ptr` into `host`.
        pub fn sym_download<T: Elem>(&self, ptr: u64, host: &mut [T]) -> Result<(), String> {
            self.sym_fits(ptr, std::mem::size_of_val(host))?;
            self.bind()?;
            // SAFETY: as in `sym_upload`; `host` is writable for its length.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(host, ptr) }
                .map_err(|e| format!("copy from a symmetric window: {e:?}"))
        }

        fn sym_fits(&self, ptr: u64, bytes: usize) -> Result<(), String> {
            match self.sym_ptrs() {
                Some((s, r)) if (ptr == s || ptr == r) && bytes <= self.sym_bytes => Ok(()),
                _ => Err(format!(
                    "{bytes} bytes at {ptr:#x} are not inside a symmetric window"
                )),
            }
        }

        fn bind(&self) -> Result<(), String> {
            self.ctx
                .bind_to_thread()
                .map_err(|e| format!("binding the NCCL context: {e:?}"))
        }

        /// NCCL's form of `op` for type `T` (premulsum gets a custom op,
        /// destroyed with the returned guard).
        pub fn op<T: Elem>(&self, op: ReduceOp) -> Result<NcclOp<'_>, String> {
            let plain = |o| NcclOp {
                op: o,
                custom: false,
                nccl: self,
            };
            Ok(match op {
                ReduceOp::Sum => plain(0),
                ReduceOp::Prod => plain(1),
                ReduceOp::Max => plain(2),
                ReduceOp::Min => plain(3),
                ReduceOp::Avg => plain(4),
                ReduceOp::BitAnd
                | ReduceOp::BitOr
                | ReduceOp::BitXor
                | ReduceOp::LogicalAnd
                | ReduceOp::LogicalOr
                | ReduceOp::LogicalXor => return Err(format!("NCCL has no {op} reduction")),
                ReduceOp::PreMulSum(s) => {
                    let mut scalar = T::from_f64(s);
                    let mut out: c_int = 0;
                    // SAFETY: the scalar is read during the call (host
                    // immediate); `out` is a valid out pointer.
                    let r = unsafe {
                        (self.api.red_op_create_pre_mul_sum)(
                            &mut out,
                            &mut scalar as *mut T as *mut c_void,
                            nccl_dtype(T::DATATYPE),
                            SCALAR_HOST_IMMEDIATE,
                            self.comm,
                        )
                    };
                    self.api
                        .check(r, "ncclRedOpCreatePreMulSum", Some(self.comm))?;
                    NcclOp {
                        op: out,
                        custom: true,
                        nccl: self,
                    }
                }
            })
        }

        /// Enqueue NCCL's collective for `case` on the stream (not waited
        /// for). `send`/`recv` are device addresses of buffers of the
        /// case's lengths; `None` where the case has none on this rank.
        /// Broadcast is in place: pass the one buffer as both.
        pub fn launch<T: Elem>(
            &self,
            case: &Case,
            op: &NcclOp<'_>,
            send: Option<u64>,
            recv: Option<u64>,
        ) -> Result<(), String> {
            let missing = || format!("NCCL {} has no {}", self.version_string(), case.kind.name());
            let d = self.dummy.device_ptr();
            let s = send.unwrap_or(d) as usize as *const c_void;
            let r = recv.unwrap_or(d) as usize as *mut c_void;
            let (c, dt, comm) = (case.count, nccl_dtype(T::DATATYPE), self.comm);
            let st = self.stream.cu_stream() as *mut c_void;
            let root = case.root as c_int;
            let (o, a) = (op.op, self.api);
            // SAFETY: the caller passes device buffers of the case's lengths
            // on this communicator's GPU, alive until the stream is synced
            // (and during every replay of a graph they were captured in).
            let res = unsafe {
                match case.kind {
                    CollKind::AllReduce => (a.all_reduce)(s, r, c, dt, o, comm, st),
                    CollKind::Reduce => (a.reduce)(s, r, c, dt, o, root, comm, st),
                    CollKind::Broadcast => (a.broadcast)(s, r, c, dt, root, comm, st),
                    CollKind::AllGather => (a.all_gather)(s, r, c, dt, comm, st),
                    CollKind::ReduceScatter => (a.reduce_scatter)(s, r, c, dt, o, comm, st),
                    CollKind::AllToAll => {
                        (a.all_to_all.ok_or_else(missing)?)(s, r, c, dt, comm, st)
                    }
                    CollKind::Gather => {
                        (a.gather.ok_or_else(missing)?)(s, r, c, dt, root, comm, st)
                    }
                    CollKind::Scatter => {
                        (a.scatter.ok_or_else(missing)?)(s, r, c, dt, root, comm, st)
                    }
                    CollKind::Scan | CollKind::ExclusiveScan => return Err(missing()),
                }
            };
            a.check(res, &format!("NCCL {}", case.kind.name()), Some(comm))
        }

        /// Wait for everything enqueued on the stream.
        pub fn sync(&self) -> Result<(), String> {
            self.stream
                .synchronize()
                .map_err(|e| format!("synchronizing the NCCL stream: {e:?}"))
        }

        /// Start capturing the stream (this thread's calls only).
        pub fn begin_capture(&self) -> Result<(), String> {
            self.stream
                .begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| format!("starting a CUDA graph capture of NCCL: {e:?}"))
        }

        /// End the capture and instantiate the graph.
        pub fn end_capture(&self) -> Result<NcclGraph<'_>, String> {
            match self.stream.end_capture(dsys::CUgraphInstantiate_flags(0)) {
                Ok(Some(g)) => Ok(NcclGraph {
                    graph: g,
                    _nccl: PhantomData,
                }),
                Ok(None) => Err("the capture of NCCL calls produced no graph".into()),
                Err(e) => Err(format!("ending the CUDA graph capture of NCCL: {e:?}")),
            }
        }
    }

    impl Drop for Nccl {
        fn drop(&mut self) {
            let _ = self.ctx.bind_to_thread();
            let _ = self.stream.synchronize();
            // SAFETY: the handle came from ncclCommInitRank and is dropped once.
            let _ = unsafe { (self.api.comm_abort)(self.comm) };
            if let (Some(wins), Some(w)) = (self.sym.take(), self.api.windows) {
                for win in wins {
                    // SAFETY: ncclMemAlloc memory whose communicator (and
                    // with it the registration) is gone; freed once.
                    let _ = unsafe { (w.mem_free)(win.ptr) };
                }
            }
        }
    }

    /// A graph of captured NCCL calls; it cannot outlive the communicator.
    pub struct NcclGraph<'a> {
        graph: cudarc::driver::CudaGraph,
        _nccl: PhantomData<&'a Nccl>,
    }

    impl NcclGraph<'_> {
        /// Queue one replay on the NCCL stream.
        pub fn replay(&self) -> Result<(), String> {
            self.graph
                .launch()
                .map_err(|e| format!("replaying the NCCL graph: {e:?}"))
        }
    }

    /// A reduction op for NCCL calls (premulsum ops are destroyed on drop).
    pub struct NcclOp<'a> {
        op: c_int,
        custom: bool,
        nccl: &'a Nccl,
    }

    impl Drop for NcclOp<'_> {
        fn drop(&mut self) {
            if self.custom {
                // SAFETY: a custom op of this communicator, destroyed once,
                // after the caller's last use.
                let _ = unsafe { (self.nccl.api.red_op_destroy)(self.op, self.nccl.comm) };
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    //! Without the feature no value of these types exists.
    use crate::data::{Case, Elem};
    use crate::gpu::Gpu;
    use gpucoll::{CollKind, Communicator, ReduceOp};
    use std::marker::PhantomData;
    use std::path::Path;

    pub enum Nccl {}

    pub struct NcclOp<'a>(PhantomData<&'a Nccl>);

    pub struct NcclGraph<'a>(Nccl, PhantomData<&'a Nccl>);

    impl Nccl {
        pub fn init(
            _world: &Communicator,
            gpu: &Gpu,
            _lib: Option<&Path>,
            _sym_bytes: u64,
        ) -> Result<Nccl, super::InitError> {
            match *gpu {}
        }
        pub fn version_string(&self) -> String {
            match *self {}
        }
        pub fn lib_path(&self) -> &str {
            match *self {}
        }
        pub fn supports(&self, _kind: CollKind) -> bool {
            match *self {}
        }
        pub fn sym_ptrs(&self) -> Option<(u64, u64)> {
            match *self {}
        }
        pub fn sym_bytes(&self) -> usize {
            match *self {}
        }
        pub fn sym_note(&self) -> Option<&str> {
            match *self {}
        }
        pub fn sym_upload<T: Elem>(&self, _ptr: u64, _host: &[T]) -> Result<(), String> {
            match *self {}
        }
        pub fn sym_download<T: Elem>(&self, _ptr: u64, _host: &mut [T]) -> Result<(), String> {
            match *self {}
        }
        pub fn op<T: Elem>(&self, _op: ReduceOp) -> Result<NcclOp<'_>, String> {
            match *self {}
        }
        pub fn launch<T: Elem>(
            &self,
            _case: &Case,
            _op: &NcclOp<'_>,
            _send: Option<u64>,
            _recv: Option<u64>,
        ) -> Result<(), String> {
            match *self {}
        }
        pub fn sync(&self) -> Result<(), String> {
            match *self {}
        }
        pub fn begin_capture(&self) -> Result<(), String> {
            match *self {}
        }
        pub fn end_capture(&self) -> Result<NcclGraph<'_>, String> {
            match *self {}
        }
    }

    impl NcclGraph<'_> {
        pub fn replay(&self) -> Result<(), String> {
            match self.0 {}
        }
    }
}

//! Device buffers on the CUDA backend, and NCCL for `--vs-nccl` (feature
//! `cuda`). Without the feature the types exist but cannot be built, so the
//! rest of the bench compiles the same way in both builds.
//!
//! NCCL comes from cudarc's `nccl` module, loaded at run time (`libnccl.so`
//! must be on the loader path). The communicator is made with
//! `ncclCommInitRank` through cudarc's `result` layer rather than
//! `cudarc::nccl::Comm`, because `Comm` keeps its raw handle private and
//! `ncclAlltoAll`, `ncclGather` and `ncclScatter` (NCCL ≥ 2.28) exist only
//! in cudarc's `sys` bindings. Like `Comm`, the handle is dropped with
//! `ncclCommAbort` (no collective teardown that could hang on a dead peer).

pub use imp::*;

/// Why NCCL could not be set up.
#[derive(Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub enum InitError {
    /// Every rank agrees NCCL cannot be used (no libnccl.so): a clean exit.
    Unavailable(String),
    /// A call failed on this rank; peers may be waiting in a collective.
    Failed(String),
}

#[cfg(feature = "cuda")]
mod imp {
    use super::InitError;
    use crate::data::{Case, Elem};
    use cudarc::driver::{CudaContext, CudaStream};
    use cudarc::nccl::{result as nres, sys as nsys};
    use gpucoll::{Buffer, CollKind, Communicator, Datatype, DeviceBuffer, RawBuffer, ReduceOp};
    use std::ffi::{c_char, c_int, c_void, CStr};
    use std::sync::Arc;

    /// Whether this build can use GPUs (feature `cuda`).
    pub const COMPILED: bool = true;

    /// The GPU the CUDA backend uses for this rank.
    pub struct Gpu {
        pub ordinal: i32,
    }

    impl Gpu {
        /// `Some` when `world` runs on the CUDA backend: the backend's GPU
        /// (`Communicator::device`; simulated nodes may split a host's ranks
        /// differently from its GPUs).
        pub fn for_world(world: &Communicator) -> Result<Option<Gpu>, String> {
            if world.backend_name() != "cuda" {
                return Ok(None);
            }
            match world.device() {
                Some(ordinal) => Ok(Some(Gpu { ordinal })),
                None => Err("the CUDA backend is in use, but it reports no GPU".into()),
            }
        }

        pub fn ordinal(&self) -> i32 {
            self.ordinal
        }
    }

    /// A gpucoll `DeviceBuffer` (plain `cuMemAlloc` memory).
    pub struct DevBuf<T: Elem>(DeviceBuffer<T>);

    impl<T: Elem> DevBuf<T> {
        pub fn new(gpu: &Gpu, len: usize) -> Result<DevBuf<T>, String> {
            DeviceBuffer::zeroed(gpu.ordinal, len)
                .map(DevBuf)
                .map_err(|e| {
                    format!(
                        "allocating {} bytes on GPU {} (lower --maxbytes): {e}",
                        len.saturating_mul(T::DATATYPE.size()),
                        gpu.ordinal
                    )
                })
        }
        pub fn raw(&self) -> RawBuffer {
            self.0.raw()
        }
        pub fn ptr(&self) -> u64 {
            self.0.device_ptr()
        }
        /// Copy `host` (the buffer's length) in. Synchronous.
        pub fn upload(&mut self, host: &[T]) -> Result<(), String> {
            self.0
                .copy_from_host(host)
                .map_err(|e| format!("copy to the GPU: {e}"))
        }
        /// Copy the buffer out into `host` (the buffer's length). Synchronous.
        pub fn download(&self, host: &mut [T]) -> Result<(), String> {
            self.0
                .copy_to_host(host)
                .map_err(|e| format!("copy from the GPU: {e}"))
        }
    }

    fn nccl_dtype(d: Datatype) -> nsys::ncclDataType_t {
        use nsys::ncclDataType_t as D;
        match d {
            Datatype::I8 => D::ncclInt8,
            Datatype::U8 => D::ncclUint8,
            Datatype::I32 => D::ncclInt32,
            Datatype::U32 => D::ncclUint32,
            Datatype::I64 => D::ncclInt64,
            Datatype::U64 => D::ncclUint64,
            Datatype::F16 => D::ncclFloat16,
            Datatype::BF16 => D::ncclBfloat16,
            Datatype::F32 => D::ncclFloat32,
            Datatype::F64 => D::ncclFloat64,
        }
    }

    /// NCCL's own message for a failed call.
    fn describe(r: nsys::ncclResult_t, comm: Option<nsys::ncclComm_t>) -> String {
        // SAFETY: both return static or communicator-owned NUL-terminated
        // strings (or null), read at once.
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let mut s = format!("{r:?}: {}", text(unsafe { nsys::ncclGetErrorString(r) }));
        if let Some(c) = comm {
            let last = text(unsafe { nsys::ncclGetLastError(c) });
            if !last.is_empty() {
                s.push_str(&format!(" ({last})"));
            }
        }
        s
    }

    fn check(
        r: nsys::ncclResult_t,
        what: &str,
        comm: Option<nsys::ncclComm_t>,
    ) -> Result<(), String> {
        match r {
            nsys::ncclResult_t::ncclSuccess => Ok(()),
            e => Err(format!("{what} failed: {}", describe(e, comm))),
        }
    }

    /// An NCCL communicator over the same ranks and GPUs as `world`, with
    /// its own non-blocking stream.
    pub struct Nccl {
        comm: nsys::ncclComm_t,
        stream: Arc<CudaStream>,
        ctx: Arc<CudaContext>,
        /// `ncclGetVersion`, e.g. 22803.
        pub version: i32,
        /// A valid device address for arguments NCCL ignores on this rank
        /// (the receive buffer of a non-root reduce, say).
        dummy: DeviceBuffer<u64>,
    }

    impl Nccl {
        /// Make the communicator (collective over `world`). The caller has
        /// set `NCCL_NVLS_ENABLE=0` before any NCCL call.
        pub fn init(world: &Communicator, gpu: &Gpu) -> Result<Nccl, InitError> {
            let fail = InitError::Failed;
            // SAFETY: these only try to dlopen the libraries.
            let present =
                unsafe { cudarc::driver::sys::is_culib_present() && nsys::is_culib_present() };
            let mut all = [0u64];
            gpucoll::reference::all_reduce(
                world,
                &[present as u64][..],
                &mut all[..],
                ReduceOp::Min,
            )
            .map_err(|e| fail(format!("MPI allreduce: {e}")))?;
            if all[0] == 0 {
                return Err(InitError::Unavailable(format!(
                    "NCCL cannot be loaded{}: cudarc looks for libnccl.so (not libnccl.so.2) on \
                     the loader path; add a directory with a libnccl.so link to LD_LIBRARY_PATH",
                    if present { " on another rank" } else { "" }
                )));
            }
            let version = nres::get_nccl_version()
                .map_err(|e| fail(format!("ncclGetVersion: {}", describe(e.0, None))))?;
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
                match nres::get_uniqueid() {
                    Ok(id) => {
                        msg[0] = 1;
                        for (m, c) in msg[1..].iter_mut().zip(id.internal.iter()) {
                            *m = *c as u8;
                        }
                    }
                    Err(e) => eprintln!(
                        "gpucoll-bench: ncclGetUniqueId failed: {}",
                        describe(e.0, None)
                    ),
                }
            }
            gpucoll::reference::broadcast(world, &mut msg[..], 0)
                .map_err(|e| fail(format!("MPI broadcast of the NCCL id: {e}")))?;
            if msg[0] != 1 {
                return Err(fail("rank 0 could not create an NCCL unique id".into()));
            }
            let mut id = nsys::ncclUniqueId { internal: [0; 128] };
            for (c, m) in id.internal.iter_mut().zip(msg[1..].iter()) {
                *c = *m as c_char;
            }
            ctx.bind_to_thread()
                .map_err(|e| fail(format!("binding GPU {}: {e:?}", gpu.ordinal)))?;
            let mut comm: nsys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: `comm` is a valid out pointer; the id is rank 0's.
            unsafe {
                nres::comm_init_rank(&mut comm, world.size() as c_int, id, world.rank() as c_int)
            }
            .map_err(|e| fail(format!("ncclCommInitRank: {}", describe(e.0, None))))?;
            Ok(Nccl {
                comm,
                stream,
                ctx,
                version,
                dummy,
            })
        }

        /// The version as NCCL prints it (2.28.3).
        pub fn version_string(&self) -> String {
            let v = self.version;
            format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
        }

        /// Whether this libnccl has the collective (all-to-all, gather and
        /// scatter entry points arrived in NCCL 2.28).
        pub fn supports(&self, kind: CollKind) -> bool {
            match kind {
                CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => self.version >= 22800,
                _ => true,
            }
        }

        /// NCCL's form of `op` for type `T` (premulsum gets a custom op,
        /// destroyed with the returned guard).
        pub fn op<T: Elem>(&self, op: ReduceOp) -> Result<NcclOp<'_>, String> {
            use nsys::ncclRedOp_t as O;
            let plain = |o| NcclOp {
                op: o,
                custom: false,
                nccl: self,
            };
            Ok(match op {
                ReduceOp::Sum => plain(O::ncclSum),
                ReduceOp::Prod => plain(O::ncclProd),
                ReduceOp::Max => plain(O::ncclMax),
                ReduceOp::Min => plain(O::ncclMin),
                ReduceOp::Avg => plain(O::ncclAvg),
                ReduceOp::BitAnd
                | ReduceOp::BitOr
                | ReduceOp::BitXor
                | ReduceOp::LogicalAnd
                | ReduceOp::LogicalOr
                | ReduceOp::LogicalXor => return Err(format!("NCCL has no {op} reduction")),
                ReduceOp::PreMulSum(s) => {
                    let mut scalar = T::from_f64(s);
                    let mut out = O::ncclSum;
                    // SAFETY: the scalar is read during the call (host
                    // immediate); `out` is a valid out pointer.
                    unsafe {
                        nres::reduce_op_create_pre_mul_sum(
                            &mut out,
                            &mut scalar as *mut T as *mut c_void,
                            nccl_dtype(T::DATATYPE),
                            nsys::ncclScalarResidence_t::ncclScalarHostImmediate,
                            self.comm,
                        )
                    }
                    .map_err(|e| {
                        format!(
                            "ncclRedOpCreatePreMulSum: {}",
                            describe(e.0, Some(self.comm))
                        )
                    })?;
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
            if !self.supports(case.kind) {
                return Err(format!(
                    "NCCL {} has no {}",
                    self.version_string(),
                    case.kind.name()
                ));
            }
            let d = self.dummy.device_ptr();
            let s = send.unwrap_or(d) as *const c_void;
            let r = recv.unwrap_or(d) as *mut c_void;
            let (c, dt, comm) = (case.count, nccl_dtype(T::DATATYPE), self.comm);
            let st = self.stream.cu_stream() as nsys::cudaStream_t;
            let root = case.root as c_int;
            let o = op.op;
            // SAFETY: the caller passes device buffers of the case's lengths
            // on this communicator's GPU, alive until the stream is synced.
            let res = unsafe {
                match case.kind {
                    CollKind::AllReduce => nsys::ncclAllReduce(s, r, c, dt, o, comm, st),
                    CollKind::Reduce => nsys::ncclReduce(s, r, c, dt, o, root, comm, st),
                    CollKind::Broadcast => nsys::ncclBroadcast(s, r, c, dt, root, comm, st),
                    CollKind::AllGather => nsys::ncclAllGather(s, r, c, dt, comm, st),
                    CollKind::ReduceScatter => nsys::ncclReduceScatter(s, r, c, dt, o, comm, st),
                    CollKind::AllToAll => nsys::ncclAlltoAll(s, r, c, dt, comm, st),
                    CollKind::Gather => nsys::ncclGather(s, r, c, dt, root, comm, st),
                    CollKind::Scatter => nsys::ncclScatter(s, r, c, dt, root, comm, st),
                }
            };
            check(res, &format!("NCCL {}", case.kind.name()), Some(comm))
        }

        /// Wait for everything enqueued on the stream.
        pub fn sync(&self) -> Result<(), String> {
            self.stream
                .synchronize()
                .map_err(|e| format!("synchronizing the NCCL stream: {e:?}"))
        }
    }

    impl Drop for Nccl {
        fn drop(&mut self) {
            let _ = self.ctx.bind_to_thread();
            let _ = self.stream.synchronize();
            // SAFETY: the handle came from ncclCommInitRank and is dropped once.
            let _ = unsafe { nsys::ncclCommAbort(self.comm) };
        }
    }

    /// A reduction op for NCCL calls (premulsum ops are destroyed on drop).
    pub struct NcclOp<'a> {
        op: nsys::ncclRedOp_t,
        custom: bool,
        nccl: &'a Nccl,
    }

    impl Drop for NcclOp<'_> {
        fn drop(&mut self) {
            if self.custom {
                // SAFETY: a custom op of this communicator, destroyed once,
                // after the caller's last use.
                let _ = unsafe { nsys::ncclRedOpDestroy(self.op, self.nccl.comm) };
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    //! Without the feature no value of these types exists.
    use crate::data::{Case, Elem};
    use gpucoll::{CollKind, Communicator, RawBuffer, ReduceOp};
    use std::marker::PhantomData;

    pub const COMPILED: bool = false;

    pub enum Gpu {}

    impl Gpu {
        pub fn for_world(_world: &Communicator) -> Result<Option<Gpu>, String> {
            Ok(None)
        }
        pub fn ordinal(&self) -> i32 {
            match *self {}
        }
    }

    pub struct DevBuf<T: Elem>(Gpu, PhantomData<T>);

    impl<T: Elem> DevBuf<T> {
        pub fn new(gpu: &Gpu, _len: usize) -> Result<DevBuf<T>, String> {
            match *gpu {}
        }
        pub fn raw(&self) -> RawBuffer {
            match self.0 {}
        }
        pub fn ptr(&self) -> u64 {
            match self.0 {}
        }
        pub fn upload(&mut self, _host: &[T]) -> Result<(), String> {
            match self.0 {}
        }
        pub fn download(&self, _host: &mut [T]) -> Result<(), String> {
            match self.0 {}
        }
    }

    pub enum Nccl {}

    impl Nccl {
        pub fn init(_world: &Communicator, gpu: &Gpu) -> Result<Nccl, super::InitError> {
            match *gpu {}
        }
        pub fn version_string(&self) -> String {
            match *self {}
        }
        pub fn supports(&self, _kind: CollKind) -> bool {
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
    }

    pub struct NcclOp<'a>(PhantomData<&'a Nccl>);
}

//! Device buffers on the CUDA backend, and gpucoll's own CUDA stream and
//! graph for the async and graph modes (feature `cuda`). Without the
//! feature the types exist but no value of them can be built, so the rest
//! of the bench compiles the same way in both builds. NCCL is in nccl.rs.

pub use imp::*;

#[cfg(feature = "cuda")]
mod imp {
    use crate::data::{Case, Elem};
    use gpucoll::{Buffer, CollKind, Communicator, CudaGraph, CudaStream, DeviceBuffer, RawBuffer};
    use std::ffi::c_void;

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

    /// A stream of the rank's GPU for gpucoll's raw entry points (async
    /// and graph modes).
    pub struct GcStream(CudaStream);

    /// A CUDA graph of gpucoll calls captured on a [`GcStream`].
    pub struct GcGraph(CudaGraph);

    impl GcStream {
        pub fn new(gpu: &Gpu) -> Result<GcStream, String> {
            CudaStream::new(gpu.ordinal)
                .map(GcStream)
                .map_err(|e| format!("creating a CUDA stream on GPU {}: {e}", gpu.ordinal))
        }

        /// Queue `case`'s collective on the stream through the `*_raw`
        /// entry point of its kind. `send`/`recv` are device addresses
        /// (`None`: no such buffer on this rank); the same address for both
        /// is the in-place layout. Broadcast uses `recv` (else `send`).
        ///
        /// # Safety
        /// The buffers are device memory of the communicator's GPU of the
        /// case's lengths, untouched by anything else until the stream is
        /// synchronized (and, when captured, during every replay).
        pub unsafe fn launch<T: Elem>(
            &self,
            world: &Communicator,
            case: &Case,
            send: Option<u64>,
            recv: Option<u64>,
        ) -> Result<(), String> {
            let s = send.unwrap_or(0) as usize as *const c_void;
            let r = recv.unwrap_or(0) as usize as *mut c_void;
            let (c, dt, op, root) = (case.count as u64, T::DATATYPE, case.op, case.root);
            let st = Some(self.0.raw());
            // SAFETY: the caller's contract is the raw entry points' contract.
            let res = unsafe {
                match case.kind {
                    CollKind::AllReduce => world.all_reduce_raw(s, r, c, dt, op, st),
                    CollKind::Reduce => world.reduce_raw(s, r, c, dt, op, root, st),
                    CollKind::Broadcast => {
                        let b = recv.or(send).unwrap_or(0) as usize as *mut c_void;
                        world.broadcast_raw(b, c, dt, root, st)
                    }
                    CollKind::AllGather => world.all_gather_raw(s, r, c, dt, st),
                    CollKind::ReduceScatter => world.reduce_scatter_block_raw(s, r, c, dt, op, st),
                    CollKind::AllToAll => world.all_to_all_raw(s, r, c, dt, st),
                    CollKind::Gather => world.gather_raw(s, r, c, dt, root, st),
                    CollKind::Scatter => world.scatter_raw(s, r, c, dt, root, st),
                    CollKind::Scan => world.scan_raw(s, r, c, dt, op, st),
                    CollKind::ExclusiveScan => world.exclusive_scan_raw(s, r, c, dt, op, st),
                }
            };
            res.map_err(|e| format!("{} queued on a stream: {e}", case.kind.name()))
        }

        /// Wait for the stream, then report a failure the communicator's
        /// watchdog found while it ran.
        pub fn sync(&self, world: &Communicator) -> Result<(), String> {
            self.0
                .synchronize()
                .map_err(|e| format!("synchronizing gpucoll's stream: {e}"))?;
            world
                .async_error()
                .map_err(|e| format!("a collective queued on the stream failed: {e}"))
        }

        pub fn begin_capture(&self) -> Result<(), String> {
            self.0
                .begin_capture()
                .map_err(|e| format!("starting a CUDA graph capture: {e}"))
        }

        pub fn end_capture(&self) -> Result<GcGraph, String> {
            self.0
                .end_capture()
                .map(GcGraph)
                .map_err(|e| format!("ending the CUDA graph capture: {e}"))
        }

        pub fn replay(&self, graph: &GcGraph) -> Result<(), String> {
            graph
                .0
                .launch(&self.0)
                .map_err(|e| format!("replaying the CUDA graph: {e}"))
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    //! Without the feature no value of these types exists.
    use crate::data::{Case, Elem};
    use gpucoll::{Communicator, RawBuffer};
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

    pub enum GcStream {}

    pub enum GcGraph {}

    impl GcStream {
        pub fn new(gpu: &Gpu) -> Result<GcStream, String> {
            match *gpu {}
        }
        /// # Safety
        /// As in the CUDA build.
        pub unsafe fn launch<T: Elem>(
            &self,
            _world: &Communicator,
            _case: &Case,
            _send: Option<u64>,
            _recv: Option<u64>,
        ) -> Result<(), String> {
            match *self {}
        }
        pub fn sync(&self, _world: &Communicator) -> Result<(), String> {
            match *self {}
        }
        pub fn begin_capture(&self) -> Result<(), String> {
            match *self {}
        }
        pub fn end_capture(&self) -> Result<GcGraph, String> {
            match *self {}
        }
        pub fn replay(&self, _graph: &GcGraph) -> Result<(), String> {
            match *self {}
        }
    }
}

//! Public RAII wrappers for a CUDA stream and a captured CUDA graph, for
//! programs (and the GPU check) that drive the raw stream entry points
//! (`Communicator::all_reduce_raw` and the others in `coll::raw`) without a
//! CUDA library of their own.

use super::driver::{self, CUgraph, CUgraphExec, CUstream};
use super::memory::bind;
use crate::error::{Error, Result};
use std::ffi::c_void;

/// A non-blocking CUDA stream on one GPU (its primary context).
///
/// Queue raw collectives on it (their `stream` argument is
/// [`raw`](Self::raw)) so that they run in order with the program's other
/// work, without blocking the host:
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// use gpucoll::CudaStream;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let stream = CudaStream::new(world.device().expect("CUDA backend"))?;
/// let mut grads = world.alloc_from(&vec![1.0f32; 1 << 20])?;
/// // SAFETY: `grads` is device memory of the communicator's GPU, and the
/// // stream is synchronized before it is read or dropped.
/// unsafe {
///     world.all_reduce_raw(
///         grads.as_ptr(), grads.as_mut_ptr(), 1 << 20, Datatype::F32, ReduceOp::Sum,
///         Some(stream.raw()),
///     )?;
/// }
/// stream.synchronize()?;
/// world.async_error()?;
/// assert_eq!(grads.to_vec()?[0], world.size() as f32);
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Debug)]
pub struct CudaStream {
    stream: CUstream,
    ordinal: i32,
}

// SAFETY: a stream handle may be used from any thread once its context is
// bound (every method binds it first).
unsafe impl Send for CudaStream {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// A new non-blocking stream on GPU `ordinal`.
    pub fn new(ordinal: i32) -> Result<CudaStream> {
        bind(ordinal)?;
        Ok(CudaStream {
            stream: driver::stream_create()?,
            ordinal,
        })
    }

    /// The raw handle (`CUstream` / `cudaStream_t`) to pass to the raw
    /// entry points. Valid while `self` lives.
    pub fn raw(&self) -> *mut c_void {
        self.stream as *mut c_void
    }

    /// The GPU of the stream.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Block until all work on the stream completed.
    pub fn synchronize(&self) -> Result<()> {
        bind(self.ordinal)?;
        driver::stream_synchronize(self.stream)
    }

    /// Whether all work on the stream completed.
    pub fn is_idle(&self) -> Result<bool> {
        bind(self.ordinal)?;
        driver::stream_query(self.stream)
    }

    /// Start capturing the stream into a CUDA graph (global capture mode).
    pub fn begin_capture(&self) -> Result<()> {
        bind(self.ordinal)?;
        driver::stream_begin_capture(self.stream)
    }

    /// End the capture started by [`begin_capture`](Self::begin_capture)
    /// and instantiate the graph.
    pub fn end_capture(&self) -> Result<CudaGraph> {
        bind(self.ordinal)?;
        let graph = driver::stream_end_capture(self.stream)?;
        if graph.is_null() {
            return Err(Error::Backend(
                "the stream capture produced no graph (it was invalidated)".into(),
            ));
        }
        match driver::graph_instantiate(graph) {
            Ok(exec) => Ok(CudaGraph {
                graph,
                exec,
                ordinal: self.ordinal,
            }),
            Err(e) => {
                driver::graph_destroy(graph);
                Err(e)
            }
        }
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if bind(self.ordinal).is_ok() {
            let _ = driver::stream_synchronize(self.stream);
            driver::stream_destroy(self.stream);
        }
    }
}

/// An instantiated CUDA graph captured from a [`CudaStream`].
///
/// Capture a step once, then replay it with one launch per iteration (the
/// `graph_step` example is a full program):
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// use gpucoll::CudaStream;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let stream = CudaStream::new(world.device().expect("CUDA backend"))?;
/// let mut grads = world.alloc::<f32>(4096)?;
/// stream.begin_capture()?;
/// // SAFETY: `grads` is device memory of this GPU that outlives the graph's
/// // replays, each of which is synchronized before `grads` is touched.
/// let captured = unsafe {
///     world.all_reduce_raw(
///         grads.as_ptr(), grads.as_mut_ptr(), 4096, Datatype::F32, ReduceOp::Avg,
///         Some(stream.raw()),
///     )
/// };
/// let graph = stream.end_capture()?;
/// captured?;
/// for step in 0..10 {
///     grads.copy_from_host(&vec![step as f32; 4096])?;
///     graph.launch(&stream)?;
///     stream.synchronize()?;
/// }
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Debug)]
pub struct CudaGraph {
    graph: CUgraph,
    exec: CUgraphExec,
    ordinal: i32,
}

// SAFETY: graph handles may be used from any thread once the context is bound.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Replay the graph on `stream` (asynchronous, stream-ordered).
    pub fn launch(&self, stream: &CudaStream) -> Result<()> {
        bind(self.ordinal)?;
        driver::graph_launch(self.exec, stream.stream)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if bind(self.ordinal).is_ok() {
            driver::graph_exec_destroy(self.exec);
            driver::graph_destroy(self.graph);
        }
    }
}

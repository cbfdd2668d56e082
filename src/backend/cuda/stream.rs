//! Public RAII wrappers for a CUDA stream and a captured CUDA graph, for
//! programs (and the GPU check) that drive the raw stream entry points
//! (`Communicator::all_reduce_raw` and the others in `coll::raw`) without a
//! CUDA library of their own.

use super::driver::{self, CUgraph, CUgraphExec, CUstream};
use super::memory::bind;
use crate::error::{Error, Result};
use std::ffi::c_void;

/// A non-blocking CUDA stream on one GPU (its primary context).
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

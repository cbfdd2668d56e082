//! The buffers of one row (host vectors and, with a GPU, their device
//! copies) and gpucoll's calls queued on them, shared by the row runner
//! (`run.rs`), the NCCL comparison (`vsnccl.rs`) and the overlap tables
//! (`overlap.rs`).

use crate::data::{Case, Elem};
use crate::gpu::{DevBuf, GcGraph, GcStream, Gpu};
use crate::timing::Queued;
use crate::{Ctx, Fail};
use gpucoll::{Communicator, MemoryKind, RawBuffer};
use std::marker::PhantomData;

/// A zeroed buffer, or a clean error when memory runs out (every rank
/// allocates the same sizes, so they fail alike).
pub fn alloc<T: Elem>(len: usize) -> Result<Vec<T>, Fail> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Fail::Usage(format!(
            "cannot allocate {} bytes for the buffers (lower --maxbytes)",
            len.saturating_mul(T::DATATYPE.size())
        ))
    })?;
    v.resize(len, T::default());
    Ok(v)
}

fn host_buf<T: Elem>(s: &[T]) -> RawBuffer {
    RawBuffer {
        addr: s.as_ptr() as u64,
        len: s.len() as u64,
        dtype: T::DATATYPE,
        memory: MemoryKind::Host,
    }
}

/// A device buffer of `len` elements when running on a GPU and `len > 0`.
pub fn dev_buf<T: Elem>(
    gpu: Option<&Gpu>,
    want: bool,
    len: usize,
) -> Result<Option<DevBuf<T>>, String> {
    match gpu {
        Some(g) if want && len > 0 => DevBuf::new(g, len).map(Some),
        _ => Ok(None),
    }
}

/// The buffer a collective gets: the device buffer when there is one, else
/// the host slice.
pub fn pick<T: Elem>(dev: &Option<DevBuf<T>>, host: &[T]) -> RawBuffer {
    match dev {
        Some(d) => d.raw(),
        None => host_buf(host),
    }
}

pub fn upload<T: Elem>(dev: &mut Option<DevBuf<T>>, host: &[T]) -> Result<(), String> {
    match dev {
        Some(d) => d.upload(host),
        None => Ok(()),
    }
}

pub fn download<T: Elem>(dev: &Option<DevBuf<T>>, host: &mut [T]) -> Result<(), String> {
    match dev {
        Some(d) => d.download(host),
        None => Ok(()),
    }
}

/// Device address of a buffer, if there is one.
pub fn ptr<T: Elem>(d: &Option<DevBuf<T>>) -> Option<u64> {
    d.as_ref().map(|d| d.ptr())
}

/// gpucoll's raw entry points on its stream, for the async and graph modes.
pub struct GcQueued<'a, T: Elem> {
    world: &'a Communicator,
    stream: &'a GcStream,
    case: &'a Case,
    send: Option<u64>,
    recv: Option<u64>,
    _t: PhantomData<T>,
}

impl<T: Elem> Queued for GcQueued<'_, T> {
    type Graph = GcGraph;
    fn launch(&mut self) -> Result<(), String> {
        // SAFETY: `send`/`recv` are device buffers of this size (run_type
        // allocates them for the case), alive and untouched by the host
        // until the stream is synchronized; graphs are dropped before them.
        unsafe {
            self.stream
                .launch::<T>(self.world, self.case, self.send, self.recv)
        }
    }
    fn sync(&mut self) -> Result<(), String> {
        self.stream.sync(self.world)
    }
    fn begin_capture(&mut self) -> Result<(), String> {
        self.stream.begin_capture()
    }
    fn end_capture(&mut self) -> Result<GcGraph, String> {
        self.stream.end_capture()
    }
    fn replay(&mut self, graph: &GcGraph) -> Result<(), String> {
        self.stream.replay(graph)
    }
}

/// The stream-mode adapter for one placement: in place is send == recv
/// for the raw entry points.
pub fn queued<'a, T: Elem>(
    ctx: &Ctx<'a>,
    stream: &'a GcStream,
    case: &'a Case,
    send: Option<RawBuffer>,
    recv: Option<RawBuffer>,
    in_place: bool,
) -> GcQueued<'a, T> {
    let r = if in_place { send.or(recv) } else { recv };
    let s = if in_place { r } else { send };
    GcQueued {
        world: ctx.world,
        stream,
        case,
        send: s.map(|b| b.addr),
        recv: r.map(|b| b.addr),
        _t: PhantomData,
    }
}

//! Device contexts, RAII memory types and the public [`DeviceBuffer`].

use super::driver::{self, CUcontext, CUdevice, CUdeviceptr};
use crate::buffer::{Buffer, BufferMut, MemoryKind, RawBuffer};
use crate::datatype::Equivalence;
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Mutex, OnceLock};

/// A device's primary context, retained for the life of the process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceCtx {
    pub ordinal: i32,
    pub dev: CUdevice,
    pub ctx: CUcontext,
}

// SAFETY: a primary context handle may be used from any thread (the driver
// API is thread safe; every user binds it with cuCtxSetCurrent first).
unsafe impl Send for DeviceCtx {}
// SAFETY: as above; the struct is immutable.
unsafe impl Sync for DeviceCtx {}

/// Retain (once) and make current the primary context of `ordinal`.
pub(crate) fn bind(ordinal: i32) -> Result<DeviceCtx> {
    static CTXS: OnceLock<Mutex<Vec<DeviceCtx>>> = OnceLock::new();
    let ctxs = CTXS.get_or_init(|| Mutex::new(Vec::new()));
    let mut g = ctxs.lock().unwrap_or_else(|p| p.into_inner());
    let c = match g.iter().find(|c| c.ordinal == ordinal) {
        Some(c) => *c,
        None => {
            let n = driver::device_count()?;
            if ordinal < 0 || ordinal as usize >= n {
                return Err(Error::Backend(format!(
                    "GPU {ordinal} does not exist ({n} visible)"
                )));
            }
            let dev = driver::device_get(ordinal)?;
            let ctx = driver::primary_ctx_retain(dev)?;
            let c = DeviceCtx { ordinal, dev, ctx };
            g.push(c);
            c
        }
    };
    drop(g);
    driver::ctx_set_current(c.ctx)?;
    Ok(c)
}

/// This process's live CUDA communicators on one GPU, counted while the
/// guard lives: a timeout names the others, whose kernels may hold the SMs
/// this communicator's peers wait for.
pub(crate) struct LiveOnDevice {
    ordinal: i32,
}

/// Live communicators per GPU ordinal (GPUs beyond the array are not counted).
static LIVE: [std::sync::atomic::AtomicUsize; 64] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 64];

impl LiveOnDevice {
    pub(crate) fn new(ordinal: i32) -> LiveOnDevice {
        if let Some(c) = usize::try_from(ordinal).ok().and_then(|o| LIVE.get(o)) {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        LiveOnDevice { ordinal }
    }

    /// The other live communicators of this process on this GPU.
    pub(crate) fn others(&self) -> usize {
        usize::try_from(self.ordinal)
            .ok()
            .and_then(|o| LIVE.get(o))
            .map_or(0, |c| {
                c.load(std::sync::atomic::Ordering::Relaxed)
                    .saturating_sub(1)
            })
    }
}

impl Drop for LiveOnDevice {
    fn drop(&mut self) {
        if let Some(c) = usize::try_from(self.ordinal).ok().and_then(|o| LIVE.get(o)) {
            c.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The ordinal of the GPU whose context is current on the calling thread
/// (the CUDA runtime makes one current with `cudaSetDevice` or its first
/// call), or `None`: no driver, no current context, or a driver error.
pub(crate) fn current_device() -> Option<i32> {
    if !driver::available() {
        return None;
    }
    let found = driver::ctx_get_current().and_then(|ctx| match ctx {
        None => Ok(None),
        Some(_) => {
            // CUdevice is a handle: find the ordinal that has it.
            let dev = driver::ctx_get_device()?;
            let n = driver::device_count()? as i32;
            for ordinal in 0..n {
                if driver::device_get(ordinal)? == dev {
                    return Ok(Some(ordinal));
                }
            }
            Ok(None)
        }
    });
    found.unwrap_or_else(|e| {
        tracing::debug!("no current CUDA device: {e}");
        None
    })
}

/// Number of GPUs the driver shows this process (0 without a driver).
pub fn device_count() -> usize {
    if !driver::available() {
        return 0;
    }
    driver::device_count().unwrap_or(0)
}

/// Free and total bytes of device memory of GPU `ordinal` (`cuMemGetInfo`
/// in its primary context), e.g. to watch for leaks or size allocations.
///
/// ```no_run
/// let (free, total) = gpucoll::device_memory(0)?;
/// println!("GPU 0: {} of {} MiB free", free >> 20, total >> 20);
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub fn device_memory(ordinal: i32) -> Result<(u64, u64)> {
    bind(ordinal)?;
    driver::mem_get_info()
}

/// Where the memory at `addr` lives, as the CUDA driver sees it: device
/// memory of some GPU, or host memory (anything the driver does not know,
/// and pinned host memory). Without a CUDA driver everything is host memory.
///
/// E.g. to check a pointer from another library before a `*_raw` call:
///
/// ```
/// use gpucoll::{memory_kind_of, MemoryKind};
///
/// let host = vec![0f32; 1024];
/// assert_eq!(memory_kind_of(host.as_ptr() as u64), MemoryKind::Host);
/// ```
///
/// ```no_run
/// use gpucoll::{memory_kind_of, DeviceBuffer, MemoryKind};
///
/// let on_gpu = DeviceBuffer::<f32>::zeroed(0, 1024)?;
/// assert_eq!(memory_kind_of(on_gpu.device_ptr()), MemoryKind::Device { ordinal: 0 });
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub fn memory_kind_of(addr: u64) -> MemoryKind {
    if addr == 0 || !driver::available() {
        return MemoryKind::Host;
    }
    match driver::pointer_info(addr) {
        Ok(Some((mt, ord))) if mt == driver::MEMORYTYPE_DEVICE && ord >= 0 => {
            MemoryKind::Device { ordinal: ord }
        }
        _ => MemoryKind::Host,
    }
}

/// A `cuMemAlloc` block (never a pool allocation: CUDA IPC needs these).
#[derive(Debug)]
pub(crate) struct DevMem {
    pub ptr: CUdeviceptr,
}

impl DevMem {
    /// Allocate on the current context.
    pub(crate) fn alloc(bytes: usize) -> Result<DevMem> {
        Ok(DevMem {
            ptr: driver::mem_alloc(bytes)?,
        })
    }

    pub(crate) fn zeroed(bytes: usize) -> Result<DevMem> {
        let m = DevMem::alloc(bytes)?;
        // SAFETY: the block holds `bytes` bytes.
        unsafe { driver::memset_d8(m.ptr, 0, bytes)? };
        Ok(m)
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        driver::mem_free(self.ptr);
    }
}

/// Pinned host memory (`cuMemHostAlloc`, portable and device-mapped).
#[derive(Debug)]
pub(crate) struct PinnedMem {
    pub host: *mut u8,
    pub bytes: usize,
}

// SAFETY: plain memory owned by this value; users synchronize access.
unsafe impl Send for PinnedMem {}
// SAFETY: as above.
unsafe impl Sync for PinnedMem {}

impl PinnedMem {
    pub(crate) fn alloc(bytes: usize) -> Result<PinnedMem> {
        let host = driver::host_alloc_mapped(bytes)?;
        Ok(PinnedMem { host, bytes })
    }
}

impl Drop for PinnedMem {
    fn drop(&mut self) {
        driver::host_free(self.host);
    }
}

/// A typed buffer in the memory of one GPU (allocated with `cuMemAlloc`).
///
/// Pass it (or a [`view`](Self::view)) to any collective of a communicator
/// that uses the CUDA backend on the same GPU.
///
/// ```no_run
/// use gpucoll::prelude::*;
/// use gpucoll::DeviceBuffer;
///
/// let universe = gpucoll::initialize()?;
/// let world = universe.world()?;
/// let gpu = world.device().expect("CUDA backend");
/// let mut grads = DeviceBuffer::from_host(gpu, &vec![world.rank() as f32; 1024])?;
/// world.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
/// let mut host = vec![0f32; grads.len()];
/// grads.copy_to_host(&mut host)?;
/// println!("average rank: {}", host[0]);
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub struct DeviceBuffer<T: Equivalence> {
    ptr: CUdeviceptr,
    len: usize,
    ordinal: i32,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns its device memory; device memory is not tied to a
// host thread.
unsafe impl<T: Equivalence> Send for DeviceBuffer<T> {}
// SAFETY: `&DeviceBuffer` only reads (copies out) or hands out addresses.
unsafe impl<T: Equivalence> Sync for DeviceBuffer<T> {}

impl<T: Equivalence> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("dtype", &T::DATATYPE)
            .field("gpu", &self.ordinal)
            .finish()
    }
}

fn byte_len<T>(len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::CountTooLarge(len as u64))
}

impl<T: Equivalence> DeviceBuffer<T> {
    /// `len` zeroed elements on GPU `ordinal`.
    pub fn zeroed(ordinal: i32, len: usize) -> Result<DeviceBuffer<T>> {
        bind(ordinal)?;
        let bytes = byte_len::<T>(len)?;
        let m = DevMem::zeroed(bytes)?;
        let ptr = m.ptr;
        std::mem::forget(m);
        Ok(DeviceBuffer {
            ptr,
            len,
            ordinal,
            _t: PhantomData,
        })
    }

    /// A copy of `data` on GPU `ordinal`.
    pub fn from_host(ordinal: i32, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = DeviceBuffer::zeroed(ordinal, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU holding the buffer.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The device address of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address as the send pointer of a `*_raw` call (no casts).
    ///
    /// ```no_run
    /// # use gpucoll::{Datatype, DeviceBuffer, ReduceOp};
    /// # let universe = gpucoll::initialize()?; let world = universe.world()?;
    /// let gpu = world.device().expect("CUDA backend");
    /// let send = DeviceBuffer::from_host(gpu, &[1.0f32; 256])?;
    /// let mut recv = DeviceBuffer::<f32>::zeroed(gpu, 256)?;
    /// // SAFETY: both buffers hold 256 f32 and outlive the blocking call.
    /// unsafe {
    ///     world.all_reduce_raw(send.as_ptr(), recv.as_mut_ptr(), 256, Datatype::F32, ReduceOp::Sum, None)?;
    /// }
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    pub fn as_ptr(&self) -> *const std::ffi::c_void {
        self.ptr as usize as *const std::ffi::c_void
    }

    /// The device address as the receive pointer of a `*_raw` call.
    pub fn as_mut_ptr(&mut self) -> *mut std::ffi::c_void {
        self.ptr as usize as *mut std::ffi::c_void
    }

    /// Overwrite the whole buffer with `data` (same length). Synchronous.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::BufferLength {
                buffer: "host source",
                expected: self.len as u64,
                actual: data.len() as u64,
            });
        }
        bind(self.ordinal)?;
        // SAFETY: both ranges hold `len` elements; the source is a live slice.
        unsafe {
            driver::memcpy_htod(
                self.ptr,
                data.as_ptr() as *const u8,
                byte_len::<T>(self.len)?,
            )
        }
    }

    /// Copy the whole buffer into `out` (same length). Synchronous.
    pub fn copy_to_host(&self, out: &mut [T]) -> Result<()> {
        if out.len() != self.len {
            return Err(Error::BufferLength {
                buffer: "host destination",
                expected: self.len as u64,
                actual: out.len() as u64,
            });
        }
        bind(self.ordinal)?;
        // SAFETY: both ranges hold `len` elements; any bit pattern is a valid T.
        unsafe {
            driver::memcpy_dtoh(
                out.as_mut_ptr() as *mut u8,
                self.ptr,
                byte_len::<T>(self.len)?,
            )
        }
    }

    /// The contents as a vector. Synchronous.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(self.len);
        let bytes = byte_len::<T>(self.len)?;
        bind(self.ordinal)?;
        // SAFETY: the vector has capacity for `len` elements, which the copy
        // initializes in full before set_len; any bit pattern is a valid T.
        unsafe {
            driver::memcpy_dtoh(v.as_mut_ptr() as *mut u8, self.ptr, bytes)?;
            v.set_len(self.len);
        }
        Ok(v)
    }

    fn check_range(&self, r: &Range<usize>) -> Result<()> {
        if r.start > r.end || r.end > self.len {
            return Err(Error::InvalidUsage(format!(
                "view {}..{} of a device buffer of {} elements",
                r.start, r.end, self.len
            )));
        }
        Ok(())
    }

    /// A read-only view of elements `range`.
    pub fn view(&self, range: Range<usize>) -> Result<DeviceView<'_, T>> {
        self.check_range(&range)?;
        Ok(DeviceView {
            ptr: self.ptr + (range.start * std::mem::size_of::<T>()) as u64,
            len: range.end - range.start,
            ordinal: self.ordinal,
            _b: PhantomData,
        })
    }

    /// A writable view of elements `range`.
    pub fn view_mut(&mut self, range: Range<usize>) -> Result<DeviceViewMut<'_, T>> {
        self.check_range(&range)?;
        Ok(DeviceViewMut {
            ptr: self.ptr + (range.start * std::mem::size_of::<T>()) as u64,
            len: range.end - range.start,
            ordinal: self.ordinal,
            _b: PhantomData,
        })
    }
}

impl<T: Equivalence> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if bind(self.ordinal).is_ok() {
            driver::mem_free(self.ptr);
        }
    }
}

fn raw<T: Equivalence>(ptr: u64, len: usize, ordinal: i32) -> RawBuffer {
    RawBuffer {
        addr: ptr,
        len: len as u64,
        dtype: T::DATATYPE,
        memory: MemoryKind::Device { ordinal },
    }
}

impl<T: Equivalence> Buffer for DeviceBuffer<T> {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        raw::<T>(self.ptr, self.len, self.ordinal)
    }
}

impl<T: Equivalence> BufferMut for DeviceBuffer<T> {
    fn raw_mut(&mut self) -> RawBuffer {
        raw::<T>(self.ptr, self.len, self.ordinal)
    }
}

/// A read-only view into a [`DeviceBuffer`].
///
/// Made by [`DeviceBuffer::view`]: send part of a buffer without a copy.
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let params = world.alloc::<f32>(4096)?;
/// let mut first_layer = world.alloc::<f32>(1024)?;
/// // The sum of every rank's first 1024 parameters.
/// world.all_reduce_into(&params.view(0..1024)?, &mut first_layer, ReduceOp::Sum)?;
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a, T: Equivalence> {
    ptr: u64,
    len: usize,
    ordinal: i32,
    _b: PhantomData<&'a DeviceBuffer<T>>,
}

impl<T: Equivalence> DeviceView<'_, T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Equivalence> Buffer for DeviceView<'_, T> {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        raw::<T>(self.ptr, self.len, self.ordinal)
    }
}

/// A writable view into a [`DeviceBuffer`].
///
/// Made by [`DeviceBuffer::view_mut`]: a collective on part of a buffer,
/// e.g. one bucket of a flat gradient buffer at a time.
///
/// ```no_run
/// # use gpucoll::prelude::*;
/// # let universe = gpucoll::initialize()?; let world = universe.world()?;
/// let mut grads = world.alloc::<bf16>(1 << 20)?;
/// let bucket = 1 << 18;
/// for start in (0..grads.len()).step_by(bucket) {
///     let mut part = grads.view_mut(start..start + bucket)?;
///     world.all_reduce_in_place(&mut part, ReduceOp::Avg)?;
/// }
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Debug)]
pub struct DeviceViewMut<'a, T: Equivalence> {
    ptr: u64,
    len: usize,
    ordinal: i32,
    _b: PhantomData<&'a mut DeviceBuffer<T>>,
}

impl<T: Equivalence> DeviceViewMut<'_, T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Equivalence> Buffer for DeviceViewMut<'_, T> {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        raw::<T>(self.ptr, self.len, self.ordinal)
    }
}

impl<T: Equivalence> BufferMut for DeviceViewMut<'_, T> {
    fn raw_mut(&mut self) -> RawBuffer {
        raw::<T>(self.ptr, self.len, self.ordinal)
    }
}

/// `(start, bytes)` of the CUDA allocation that holds `addr`, when the
/// driver knows the address (device memory, or host memory it allocated or
/// registered); None otherwise or without a driver.
pub fn allocation_range(addr: u64) -> Option<(u64, u64)> {
    if addr == 0 || !driver::available() {
        return None;
    }
    driver::pointer_range(addr).ok().flatten()
}

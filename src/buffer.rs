//! What a collective's buffers look like to the engine: an address, a length
//! in elements, a datatype and where the memory lives.
//!
//! ```
//! use gpucoll::{Buffer, Datatype, MemoryKind};
//!
//! let grads = vec![gpucoll::bf16::from_f32(0.5); 1024];
//! let raw = grads[512..].raw();
//! assert_eq!((raw.len, raw.dtype, raw.bytes()), (512, Datatype::BF16, 1024));
//! assert_eq!(raw.addr, grads[512..].as_ptr() as u64);
//! assert_eq!(raw.memory, MemoryKind::Host);
//! ```

use crate::datatype::{Datatype, Equivalence};

/// Where a buffer's memory lives.
///
/// ```
/// use gpucoll::{Buffer, MemoryKind};
///
/// let host = vec![0u8; 64];
/// assert_eq!(host.raw().memory, MemoryKind::Host);
/// // A device buffer reports its GPU.
/// let where_ = MemoryKind::Device { ordinal: 1 };
/// let gpu = match where_ {
///     MemoryKind::Device { ordinal } => Some(ordinal),
///     MemoryKind::Host => None,
/// };
/// assert_eq!(gpu, Some(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Ordinary host memory of this process.
    Host,
    /// Device memory of the GPU with this ordinal.
    Device { ordinal: i32 },
}

/// A buffer as the engine sees it: untyped address plus element count.
///
/// Built by the [`Buffer`] impls from borrows, or by the raw entry points
/// from pointers whose validity the caller promises.
///
/// ```
/// use gpucoll::{Buffer, Datatype, MemoryKind, RawBuffer};
///
/// let v = vec![0f32; 16];
/// let whole: RawBuffer = v.raw();
/// assert_eq!((whole.len, whole.dtype), (16, Datatype::F32));
/// assert_eq!(whole.bytes(), 64);
/// assert_eq!(whole.memory, MemoryKind::Host);
/// // Halves of one vector touch no common byte; a slice and its vector do.
/// let (lo, hi) = (v[..8].raw(), v[8..].raw());
/// assert!(!lo.overlaps(&hi));
/// assert!(lo.overlaps(&whole));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuffer {
    /// Address of the first element (host virtual address or device pointer).
    pub addr: u64,
    /// Length in elements.
    pub len: u64,
    /// Element type.
    pub dtype: Datatype,
    /// Where the memory lives.
    pub memory: MemoryKind,
}

impl RawBuffer {
    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.len * self.dtype.size() as u64
    }

    /// Whether the byte ranges of two buffers overlap (empty buffers never do).
    pub fn overlaps(&self, other: &RawBuffer) -> bool {
        if self.memory != other.memory || self.bytes() == 0 || other.bytes() == 0 {
            return false;
        }
        let (a0, a1) = (self.addr, self.addr + self.bytes());
        let (b0, b1) = (other.addr, other.addr + other.bytes());
        a0 < b1 && b0 < a1
    }
}

/// A buffer a collective can read from: slices, vectors, and (with the CUDA
/// backend) device buffers.
///
/// Host slices, vectors, arrays and single values are buffers; so are
/// `DeviceBuffer`s and their views (feature `cuda`) and cudarc's slices
/// (feature `cudarc`). Generic code takes `impl Buffer`:
///
/// ```
/// use gpucoll::{Buffer, Datatype};
///
/// fn describe(b: &(impl Buffer + ?Sized)) -> String {
///     let raw = b.raw();
///     format!("{} x {}", raw.len, raw.dtype)
/// }
/// assert_eq!(describe(&vec![0f32; 8]), "8 x f32");
/// assert_eq!(describe(&[1u8, 2, 3][..]), "3 x u8");
/// assert_eq!(describe(&7i64), "1 x i64");
/// assert_eq!([0u32; 4].raw().dtype, Datatype::U32);
/// ```
pub trait Buffer {
    /// Element type.
    type Elem: Equivalence;
    /// The engine's view of this buffer.
    fn raw(&self) -> RawBuffer;
}

/// A buffer a collective can write into.
///
/// Receive buffers of blocking calls and buffers of in-place forms are
/// `BufferMut`; the element type of the send buffer must match
/// (`R: BufferMut<Elem = S::Elem>`), so mixing `f32` and `i32` does not
/// compile.
///
/// ```
/// use gpucoll::{Buffer, BufferMut};
///
/// /// The receive buffer's length, checked against the send buffer's type.
/// fn recv_len<S, R>(_send: &S, recv: &mut R) -> u64
/// where
///     S: Buffer + ?Sized,
///     R: BufferMut<Elem = S::Elem> + ?Sized,
/// {
///     recv.raw_mut().len
/// }
/// let send = vec![1.0f32; 4];
/// let mut recv = vec![0.0f32; 16];
/// assert_eq!(recv_len(&send, &mut recv), 16);
/// assert_eq!(recv_len(&send, &mut recv[..4]), 4);
/// ```
pub trait BufferMut: Buffer {
    /// The engine's view of this buffer, for writing.
    fn raw_mut(&mut self) -> RawBuffer;
}

impl<T: Equivalence> Buffer for [T] {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        RawBuffer {
            addr: self.as_ptr() as u64,
            len: self.len() as u64,
            dtype: T::DATATYPE,
            memory: MemoryKind::Host,
        }
    }
}

impl<T: Equivalence> BufferMut for [T] {
    fn raw_mut(&mut self) -> RawBuffer {
        RawBuffer {
            addr: self.as_mut_ptr() as u64,
            len: self.len() as u64,
            dtype: T::DATATYPE,
            memory: MemoryKind::Host,
        }
    }
}

impl<T: Equivalence> Buffer for Vec<T> {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        self.as_slice().raw()
    }
}

impl<T: Equivalence> BufferMut for Vec<T> {
    fn raw_mut(&mut self) -> RawBuffer {
        self.as_mut_slice().raw_mut()
    }
}

impl<T: Equivalence, const N: usize> Buffer for [T; N] {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        self.as_slice().raw()
    }
}

impl<T: Equivalence, const N: usize> BufferMut for [T; N] {
    fn raw_mut(&mut self) -> RawBuffer {
        self.as_mut_slice().raw_mut()
    }
}

impl<T: Equivalence> Buffer for T {
    type Elem = T;
    fn raw(&self) -> RawBuffer {
        std::slice::from_ref(self).raw()
    }
}

impl<T: Equivalence> BufferMut for T {
    fn raw_mut(&mut self) -> RawBuffer {
        std::slice::from_mut(self).raw_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_detection() {
        let v = [0u32; 16];
        let a = v[0..8].raw();
        let b = v[7..16].raw();
        let c = v[8..16].raw();
        assert!(a.overlaps(&b));
        assert!(!a.overlaps(&c));
        assert!(!v[0..0].raw().overlaps(&a));
    }
}

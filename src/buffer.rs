//! What a collective's buffers look like to the engine: an address, a length
//! in elements, a datatype and where the memory lives.

use crate::datatype::{Datatype, Equivalence};

/// Where a buffer's memory lives.
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
pub trait Buffer {
    /// Element type.
    type Elem: Equivalence;
    /// The engine's view of this buffer.
    fn raw(&self) -> RawBuffer;
}

/// A buffer a collective can write into.
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

//! Element types gpucoll moves and reduces, and the Rust types that map to them.
//!
//! ```
//! use gpucoll::{Datatype, Equivalence};
//!
//! // A generic driver picks the Rust type from a name on its command line.
//! let dtype = Datatype::parse("bf16").unwrap();
//! assert_eq!(dtype, <gpucoll::bf16 as Equivalence>::DATATYPE);
//! let total: usize = Datatype::ALL.iter().map(|d| d.size()).sum();
//! assert_eq!(total, 1 + 1 + 4 + 4 + 8 + 8 + 2 + 2 + 4 + 8);
//! ```

use half::{bf16, f16};
use std::fmt;

/// The element type of a collective's buffers.
///
/// Every Rust element type gpucoll accepts names its datatype through
/// [`Equivalence::DATATYPE`]; the raw entry points and the MPI shim take a
/// `Datatype` directly.
///
/// ```
/// use gpucoll::{bf16, Datatype, Equivalence};
///
/// assert_eq!(<bf16 as Equivalence>::DATATYPE, Datatype::BF16);
/// assert_eq!(Datatype::BF16.size(), 2);
/// assert!(Datatype::BF16.is_float() && !Datatype::U64.is_float());
/// // Names as the bench and the `GPUCOLL_*` variables write them.
/// assert_eq!(Datatype::parse("float32"), Some(Datatype::F32));
/// assert_eq!(Datatype::F64.name(), "double");
/// assert_eq!(Datatype::I8.to_string(), "i8");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Datatype {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    BF16 = 7,
    F32 = 8,
    F64 = 9,
}

impl Datatype {
    /// Every datatype, in a stable order.
    pub const ALL: [Datatype; 10] = [
        Datatype::I8,
        Datatype::U8,
        Datatype::I32,
        Datatype::U32,
        Datatype::I64,
        Datatype::U64,
        Datatype::F16,
        Datatype::BF16,
        Datatype::F32,
        Datatype::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            Datatype::I8 | Datatype::U8 => 1,
            Datatype::F16 | Datatype::BF16 => 2,
            Datatype::I32 | Datatype::U32 | Datatype::F32 => 4,
            Datatype::I64 | Datatype::U64 | Datatype::F64 => 8,
        }
    }

    /// Floating-point types (Avg and PreMulSum scale in floating point).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Datatype::F16 | Datatype::BF16 | Datatype::F32 | Datatype::F64
        )
    }

    /// Signed integer types.
    pub const fn is_signed_int(self) -> bool {
        matches!(self, Datatype::I8 | Datatype::I32 | Datatype::I64)
    }

    /// Short lower-case name, as used by the bench and `GPUCOLL_*` variables.
    pub const fn name(self) -> &'static str {
        match self {
            Datatype::I8 => "int8",
            Datatype::U8 => "uint8",
            Datatype::I32 => "int32",
            Datatype::U32 => "uint32",
            Datatype::I64 => "int64",
            Datatype::U64 => "uint64",
            Datatype::F16 => "half",
            Datatype::BF16 => "bfloat16",
            Datatype::F32 => "float",
            Datatype::F64 => "double",
        }
    }

    /// Parse a name as printed by [`Datatype::name`] or a Rust type name (`f32`, `i8`, ...).
    pub fn parse(s: &str) -> Option<Datatype> {
        let s = s.to_ascii_lowercase();
        Datatype::ALL.into_iter().find(|d| {
            d.name() == s
                || d.rust_name() == s
                || matches!(
                    (d, s.as_str()),
                    (Datatype::F32, "float32")
                        | (Datatype::F64, "float64")
                        | (Datatype::F16, "float16")
                        | (Datatype::F16, "fp16")
                        | (Datatype::BF16, "bf16")
                        | (Datatype::I32, "int")
                        | (Datatype::I8, "char")
                )
        })
    }

    /// The Rust type name (`f32`, `bf16`, ...).
    pub const fn rust_name(self) -> &'static str {
        match self {
            Datatype::I8 => "i8",
            Datatype::U8 => "u8",
            Datatype::I32 => "i32",
            Datatype::U32 => "u32",
            Datatype::I64 => "i64",
            Datatype::U64 => "u64",
            Datatype::F16 => "f16",
            Datatype::BF16 => "bf16",
            Datatype::F32 => "f32",
            Datatype::F64 => "f64",
        }
    }
}

impl fmt::Display for Datatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rust_name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type gpucoll can move: the ten types of [`Datatype`].
///
/// Sealed: every implementor is plain old data with no padding and every
/// bit pattern valid, which the engine relies on when it moves bytes.
///
/// Bound generic code by it to accept any element type a collective takes:
///
/// ```
/// use gpucoll::{f16, Datatype, Equivalence};
///
/// /// Bytes a message of `n` elements of `T` occupies.
/// fn message_bytes<T: Equivalence>(n: usize) -> usize {
///     n * T::DATATYPE.size()
/// }
/// assert_eq!(message_bytes::<f16>(1024), 2048);
/// assert_eq!(message_bytes::<u64>(3), 24);
/// assert_eq!(<i32 as Equivalence>::DATATYPE, Datatype::I32);
/// ```
pub trait Equivalence: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The datatype tag of this Rust type.
    const DATATYPE: Datatype;
}

macro_rules! equivalence {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Equivalence for $t { const DATATYPE: Datatype = Datatype::$d; }
    )*};
}

equivalence! {
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(Datatype::F16.size(), std::mem::size_of::<f16>());
        assert_eq!(Datatype::BF16.size(), std::mem::size_of::<bf16>());
        assert_eq!(Datatype::I64.size(), std::mem::size_of::<i64>());
        assert_eq!(<u8 as Equivalence>::DATATYPE.size(), 1);
    }

    #[test]
    fn parse_round_trips() {
        for d in Datatype::ALL {
            assert_eq!(Datatype::parse(d.name()), Some(d));
            assert_eq!(Datatype::parse(d.rust_name()), Some(d));
        }
        assert_eq!(Datatype::parse("float32"), Some(Datatype::F32));
        assert_eq!(Datatype::parse("nope"), None);
    }
}

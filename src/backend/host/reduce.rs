//! Element-wise kernels of the host backend: combine, pre-scale and
//! post-divide byte slices that hold elements of one [`Datatype`].
//!
//! The byte-level entry points reinterpret their slices as typed slices when
//! they are suitably aligned (FIFO slots are 64-byte aligned and user
//! buffers are typed, so this is the normal case) and run tight loops the
//! compiler vectorizes. Misaligned input takes a slow path through aligned
//! copies instead of undefined behaviour.
//!
//! Semantics (shared with every backend, see [`crate::op::Reduction`]):
//! * integers: `Sum`/`Prod` wrap; pre-scale multiplies (wrapping) by the
//!   scalar converted with `as` (truncating toward zero, saturating);
//!   post-divide truncates toward zero;
//! * `f32`/`f64` compute in their own precision; `f16`/`bf16` compute in
//!   `f32` and round to nearest even once per operation;
//! * the bitwise and logical combines are integer ops (logical ones yield
//!   1/0). Validation keeps them away from floats; should one arrive, the
//!   float kernels apply the logical ops as C does on floats (1.0/0.0) and
//!   the bitwise ones to the IEEE bit patterns, rather than panic.
//!
//! All slices of one call must have the same length; extra bytes of a
//! longer slice are ignored (debug builds assert).

use crate::datatype::Datatype;
use crate::op::Combine;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements converted per batch by the `f16`/`bf16` kernels.
const HALF_BATCH: usize = 256;

/// Typed slice kernels; one implementation per element type.
trait Kern: Copy + Default + 'static {
    /// `d[i] = a[i] ⊕ b[i]`.
    fn combine2(c: Combine, d: &mut [Self], a: &[Self], b: &[Self]);
    /// `acc[i] = acc[i] ⊕ b[i]`.
    fn combine1(c: Combine, acc: &mut [Self], b: &[Self]);
    /// `d[i] = a[i] * s`.
    fn scale2(s: f64, d: &mut [Self], a: &[Self]);
    /// `acc[i] = acc[i] * s`.
    fn scale1(s: f64, acc: &mut [Self]);
    /// `acc[i] = acc[i] / div`.
    fn div1(div: u64, acc: &mut [Self]);
}

#[inline(always)]
fn zip2<T: Copy>(d: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((d, &a), &b) in d.iter_mut().zip(a).zip(b) {
        *d = f(a, b);
    }
}

#[inline(always)]
fn zip1<T: Copy>(acc: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
    for (d, &b) in acc.iter_mut().zip(b) {
        *d = f(*d, b);
    }
}

#[inline(always)]
fn map2<T: Copy>(d: &mut [T], a: &[T], f: impl Fn(T) -> T) {
    for (d, &a) in d.iter_mut().zip(a) {
        *d = f(a);
    }
}

#[inline(always)]
fn map1<T: Copy>(acc: &mut [T], f: impl Fn(T) -> T) {
    for d in acc.iter_mut() {
        *d = f(*d);
    }
}

macro_rules! int_kern {
    ($t:ty, $div:expr) => {
        impl Kern for $t {
            fn combine2(c: Combine, d: &mut [$t], a: &[$t], b: &[$t]) {
                // One monomorphic loop per op so each one vectorizes.
                match c {
                    Combine::Sum => zip2(d, a, b, <$t>::wrapping_add),
                    Combine::Prod => zip2(d, a, b, <$t>::wrapping_mul),
                    Combine::Min => zip2(d, a, b, Ord::min),
                    Combine::Max => zip2(d, a, b, Ord::max),
                    Combine::BitAnd => zip2(d, a, b, |x, y| x & y),
                    Combine::BitOr => zip2(d, a, b, |x, y| x | y),
                    Combine::BitXor => zip2(d, a, b, |x, y| x ^ y),
                    Combine::LogicalAnd => zip2(d, a, b, |x, y| ((x != 0) & (y != 0)) as $t),
                    Combine::LogicalOr => zip2(d, a, b, |x, y| ((x != 0) | (y != 0)) as $t),
                    Combine::LogicalXor => zip2(d, a, b, |x, y| ((x != 0) ^ (y != 0)) as $t),
                }
            }
            fn combine1(c: Combine, acc: &mut [$t], b: &[$t]) {
                match c {
                    Combine::Sum => zip1(acc, b, <$t>::wrapping_add),
                    Combine::Prod => zip1(acc, b, <$t>::wrapping_mul),
                    Combine::Min => zip1(acc, b, Ord::min),
                    Combine::Max => zip1(acc, b, Ord::max),
                    Combine::BitAnd => zip1(acc, b, |x, y| x & y),
                    Combine::BitOr => zip1(acc, b, |x, y| x | y),
                    Combine::BitXor => zip1(acc, b, |x, y| x ^ y),
                    Combine::LogicalAnd => zip1(acc, b, |x, y| ((x != 0) & (y != 0)) as $t),
                    Combine::LogicalOr => zip1(acc, b, |x, y| ((x != 0) | (y != 0)) as $t),
                    Combine::LogicalXor => zip1(acc, b, |x, y| ((x != 0) ^ (y != 0)) as $t),
                }
            }
            fn scale2(s: f64, d: &mut [$t], a: &[$t]) {
                // `as` truncates toward zero and saturates (NaN -> 0).
                let k = s as $t;
                map2(d, a, |x| x.wrapping_mul(k));
            }
            fn scale1(s: f64, acc: &mut [$t]) {
                let k = s as $t;
                map1(acc, |x| x.wrapping_mul(k));
            }
            fn div1(div: u64, acc: &mut [$t]) {
                let div = div.max(1);
                let f: fn($t, u64) -> $t = $div;
                map1(acc, |x| f(x, div));
            }
        }
    };
}

/// Truncating division of a signed value by a positive divisor that may not
/// fit the element type (an `i8` average over 200 ranks divides by 200).
#[inline(always)]
fn div_signed(x: i64, div: u64) -> i64 {
    if div > i64::MAX as u64 {
        // |x| <= 2^63 <= div: only i64::MIN / 2^63 is non-zero.
        ((x as i128) / (div as i128)) as i64
    } else {
        x / div as i64
    }
}

int_kern!(i8, |x, d| div_signed(x as i64, d) as i8);
int_kern!(u8, |x, d| (x as u64 / d) as u8);
int_kern!(i32, |x, d| div_signed(x as i64, d) as i32);
int_kern!(u32, |x, d| (x as u64 / d) as u32);
int_kern!(i64, |x, d| div_signed(x, d));
int_kern!(u64, |x, d| x / d);

/// A bitwise or logical combine on a float (never reached through the
/// API, see the module doc): logical as C, bitwise on the bit patterns.
macro_rules! float_int_op {
    ($t:ty, $c:expr, $a:expr, $b:expr) => {{
        let (x, y) = ($a, $b);
        let truth = |v: bool| if v { 1.0 } else { 0.0 };
        match $c {
            Combine::BitAnd => <$t>::from_bits(x.to_bits() & y.to_bits()),
            Combine::BitOr => <$t>::from_bits(x.to_bits() | y.to_bits()),
            Combine::BitXor => <$t>::from_bits(x.to_bits() ^ y.to_bits()),
            Combine::LogicalAnd => truth((x != 0.0) & (y != 0.0)),
            Combine::LogicalOr => truth((x != 0.0) | (y != 0.0)),
            _ => truth((x != 0.0) ^ (y != 0.0)),
        }
    }};
}

macro_rules! float_kern {
    ($t:ty) => {
        impl Kern for $t {
            fn combine2(c: Combine, d: &mut [$t], a: &[$t], b: &[$t]) {
                match c {
                    Combine::Sum => zip2(d, a, b, |a, b| a + b),
                    Combine::Prod => zip2(d, a, b, |a, b| a * b),
                    Combine::Min => zip2(d, a, b, <$t>::min),
                    Combine::Max => zip2(d, a, b, <$t>::max),
                    _ => zip2(d, a, b, |a, b| float_int_op!($t, c, a, b)),
                }
            }
            fn combine1(c: Combine, acc: &mut [$t], b: &[$t]) {
                match c {
                    Combine::Sum => zip1(acc, b, |a, b| a + b),
                    Combine::Prod => zip1(acc, b, |a, b| a * b),
                    Combine::Min => zip1(acc, b, <$t>::min),
                    Combine::Max => zip1(acc, b, <$t>::max),
                    _ => zip1(acc, b, |a, b| float_int_op!($t, c, a, b)),
                }
            }
            fn scale2(s: f64, d: &mut [$t], a: &[$t]) {
                // Scale in the element's precision (as NCCL does).
                let k = s as $t;
                map2(d, a, |x| x * k);
            }
            fn scale1(s: f64, acc: &mut [$t]) {
                let k = s as $t;
                map1(acc, |x| x * k);
            }
            fn div1(div: u64, acc: &mut [$t]) {
                let k = div.max(1) as $t;
                map1(acc, |x| x / k);
            }
        }
    };
}

float_kern!(f32);
float_kern!(f64);

/// `f(a, b)` on f32 values, batch-converted from and to a half type.
#[inline(always)]
fn half_combine(c: Combine, a: &mut [f32], b: &[f32]) {
    match c {
        Combine::Sum => zip1(a, b, |a, b| a + b),
        Combine::Prod => zip1(a, b, |a, b| a * b),
        Combine::Min => zip1(a, b, f32::min),
        Combine::Max => zip1(a, b, f32::max),
        _ => zip1(a, b, |x, y| float_int_op!(f32, c, x, y)),
    }
}

macro_rules! half_kern {
    ($t:ty) => {
        impl Kern for $t {
            fn combine2(c: Combine, d: &mut [$t], a: &[$t], b: &[$t]) {
                let mut fa = [0f32; HALF_BATCH];
                let mut fb = [0f32; HALF_BATCH];
                for ((d, a), b) in d
                    .chunks_mut(HALF_BATCH)
                    .zip(a.chunks(HALF_BATCH))
                    .zip(b.chunks(HALF_BATCH))
                {
                    let n = d.len().min(a.len()).min(b.len());
                    a[..n].convert_to_f32_slice(&mut fa[..n]);
                    b[..n].convert_to_f32_slice(&mut fb[..n]);
                    half_combine(c, &mut fa[..n], &fb[..n]);
                    d[..n].convert_from_f32_slice(&fa[..n]);
                }
            }
            fn combine1(c: Combine, acc: &mut [$t], b: &[$t]) {
                let mut fa = [0f32; HALF_BATCH];
                let mut fb = [0f32; HALF_BATCH];
                for (d, b) in acc.chunks_mut(HALF_BATCH).zip(b.chunks(HALF_BATCH)) {
                    let n = d.len().min(b.len());
                    d[..n].convert_to_f32_slice(&mut fa[..n]);
                    b[..n].convert_to_f32_slice(&mut fb[..n]);
                    half_combine(c, &mut fa[..n], &fb[..n]);
                    d[..n].convert_from_f32_slice(&fa[..n]);
                }
            }
            fn scale2(s: f64, d: &mut [$t], a: &[$t]) {
                let n = d.len().min(a.len());
                d[..n].copy_from_slice(&a[..n]);
                Self::scale1(s, &mut d[..n]);
            }
            fn scale1(s: f64, acc: &mut [$t]) {
                // Half types scale in f32, then round once.
                let k = s as f32;
                let mut fa = [0f32; HALF_BATCH];
                for d in acc.chunks_mut(HALF_BATCH) {
                    let n = d.len();
                    d.convert_to_f32_slice(&mut fa[..n]);
                    map1(&mut fa[..n], |x| x * k);
                    d.convert_from_f32_slice(&fa[..n]);
                }
            }
            fn div1(div: u64, acc: &mut [$t]) {
                let k = div.max(1) as f32;
                let mut fa = [0f32; HALF_BATCH];
                for d in acc.chunks_mut(HALF_BATCH) {
                    let n = d.len();
                    d.convert_to_f32_slice(&mut fa[..n]);
                    map1(&mut fa[..n], |x| x / k);
                    d.convert_from_f32_slice(&fa[..n]);
                }
            }
        }
    };
}

half_kern!(f16);
half_kern!(bf16);

/// `bytes` as a typed slice when aligned and a whole number of elements.
fn typed<T: Kern>(bytes: &[u8]) -> Option<&[T]> {
    // SAFETY: every `Kern` type (integers, floats, f16/bf16) is plain old
    // data for which every bit pattern is a valid value.
    let (pre, mid, post) = unsafe { bytes.align_to::<T>() };
    (pre.is_empty() && post.is_empty()).then_some(mid)
}

/// `bytes` as a mutable typed slice when aligned and a whole number of elements.
fn typed_mut<T: Kern>(bytes: &mut [u8]) -> Option<&mut [T]> {
    // SAFETY: as in `typed`; any value written is a valid byte pattern too.
    let (pre, mid, post) = unsafe { bytes.align_to_mut::<T>() };
    (pre.is_empty() && post.is_empty()).then_some(mid)
}

/// Aligned copy of the whole elements in `bytes` (slow path).
fn to_vec<T: Kern>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v = vec![T::default(); n];
    // SAFETY: `v` owns `n * size_of::<T>()` writable bytes, `bytes` holds at
    // least that many, the two do not overlap, and T accepts any bit pattern.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            v.as_mut_ptr() as *mut u8,
            n * std::mem::size_of::<T>(),
        );
    }
    v
}

/// Write the elements of `v` back into `bytes` (slow path).
fn from_vec<T: Kern>(bytes: &mut [u8], v: &[T]) {
    let n = std::mem::size_of_val(v).min(bytes.len());
    // SAFETY: `v` is readable for `n` bytes, `bytes` writable for `n`
    // bytes, and they are distinct allocations.
    unsafe {
        std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, bytes.as_mut_ptr(), n);
    }
}

fn run2<T: Kern>(d: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(&mut [T], &[T], &[T])) {
    if let (Some(ta), Some(tb)) = (typed::<T>(a), typed::<T>(b)) {
        if let Some(td) = typed_mut::<T>(d) {
            return f(td, ta, tb);
        }
    }
    let (va, vb) = (to_vec::<T>(a), to_vec::<T>(b));
    let mut vd = to_vec::<T>(d);
    f(&mut vd, &va, &vb);
    from_vec(d, &vd);
}

fn run1<T: Kern>(d: &mut [u8], a: &[u8], f: impl Fn(&mut [T], &[T])) {
    if let Some(ta) = typed::<T>(a) {
        if let Some(td) = typed_mut::<T>(d) {
            return f(td, ta);
        }
    }
    let va = to_vec::<T>(a);
    let mut vd = to_vec::<T>(d);
    f(&mut vd, &va);
    from_vec(d, &vd);
}

fn run0<T: Kern>(d: &mut [u8], f: impl Fn(&mut [T])) {
    if let Some(td) = typed_mut::<T>(d) {
        return f(td);
    }
    let mut vd = to_vec::<T>(d);
    f(&mut vd);
    from_vec(d, &vd);
}

/// Call `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            Datatype::I8 => {
                type $T = i8;
                $body
            }
            Datatype::U8 => {
                type $T = u8;
                $body
            }
            Datatype::I32 => {
                type $T = i32;
                $body
            }
            Datatype::U32 => {
                type $T = u32;
                $body
            }
            Datatype::I64 => {
                type $T = i64;
                $body
            }
            Datatype::U64 => {
                type $T = u64;
                $body
            }
            Datatype::F16 => {
                type $T = f16;
                $body
            }
            Datatype::BF16 => {
                type $T = bf16;
                $body
            }
            Datatype::F32 => {
                type $T = f32;
                $body
            }
            Datatype::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

/// `dst = a ⊕ b`, element-wise.
pub fn reduce(dtype: Datatype, combine: Combine, dst: &mut [u8], a: &[u8], b: &[u8]) {
    debug_assert!(dst.len() == a.len() && a.len() == b.len());
    dispatch!(dtype, T => run2::<T>(dst, a, b, |d, a, b| T::combine2(combine, d, a, b)))
}

/// `acc = acc ⊕ b`, element-wise.
pub fn reduce_inplace(dtype: Datatype, combine: Combine, acc: &mut [u8], b: &[u8]) {
    debug_assert_eq!(acc.len(), b.len());
    dispatch!(dtype, T => run1::<T>(acc, b, |d, b| T::combine1(combine, d, b)))
}

/// `dst = src * scalar`, element-wise (a rank's pre-op).
pub fn pre_scale(dtype: Datatype, scalar: f64, dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    dispatch!(dtype, T => run1::<T>(dst, src, |d, a| T::scale2(scalar, d, a)))
}

/// `buf = buf * scalar`, element-wise.
pub fn pre_scale_inplace(dtype: Datatype, scalar: f64, buf: &mut [u8]) {
    dispatch!(dtype, T => run0::<T>(buf, |d| T::scale1(scalar, d)))
}

/// `buf = buf / divisor`, element-wise; integers truncate toward zero.
pub fn post_div(dtype: Datatype, divisor: u64, buf: &mut [u8]) {
    dispatch!(dtype, T => run0::<T>(buf, |d| T::div1(divisor, d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of a typed slice (native endianness, as buffers hold them).
    fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
        let n = std::mem::size_of_val(v);
        // SAFETY: reading the initialized bytes of a slice of plain values.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, n) }.to_vec()
    }

    /// Back from bytes (copied into an aligned vector).
    fn back<T: Kern>(b: &[u8]) -> Vec<T> {
        to_vec::<T>(b)
    }

    fn red<T: Kern>(dtype: Datatype, c: Combine, a: &[T], b: &[T]) -> Vec<T> {
        let (ab, bb) = (bytes(a), bytes(b));
        // Use a typed destination so the fast (aligned) path is taken.
        let mut d = vec![T::default(); a.len()];
        let mut db = bytes(&d);
        reduce(dtype, c, &mut db, &ab, &bb);
        d.copy_from_slice(&back::<T>(&db));
        // The in-place form must agree.
        let mut acc = bytes(a);
        reduce_inplace(dtype, c, &mut acc, &bb);
        assert_eq!(acc, db, "{dtype} {c:?}: in-place differs");
        d
    }

    #[test]
    fn integer_ops_wrap() {
        assert_eq!(
            red(Datatype::I8, Combine::Sum, &[127i8, -128, 5], &[1, -1, -7]),
            vec![-128, 127, -2]
        );
        assert_eq!(
            red(Datatype::U8, Combine::Sum, &[255u8, 3], &[2, 4]),
            vec![1, 7]
        );
        assert_eq!(
            red(Datatype::U8, Combine::Prod, &[16u8, 3], &[16, 5]),
            vec![0, 15]
        );
        assert_eq!(
            red(Datatype::I32, Combine::Prod, &[i32::MAX, -3], &[2, 7]),
            vec![-2, -21]
        );
        assert_eq!(red(Datatype::U32, Combine::Sum, &[u32::MAX], &[2]), vec![1]);
        assert_eq!(
            red(Datatype::I64, Combine::Sum, &[i64::MAX], &[1]),
            vec![i64::MIN]
        );
        assert_eq!(
            red(Datatype::U64, Combine::Prod, &[1u64 << 63], &[2]),
            vec![0]
        );
    }

    #[test]
    fn min_max_of_negatives() {
        let a = [-5i32, 3, -1, i32::MIN];
        let b = [-7i32, -3, 0, i32::MAX];
        assert_eq!(
            red(Datatype::I32, Combine::Min, &a, &b),
            vec![-7, -3, -1, i32::MIN]
        );
        assert_eq!(
            red(Datatype::I32, Combine::Max, &a, &b),
            vec![-5, 3, 0, i32::MAX]
        );
        assert_eq!(
            red(Datatype::I8, Combine::Min, &[-128i8, 0], &[127, -1]),
            vec![-128, -1]
        );
        assert_eq!(red(Datatype::I64, Combine::Max, &[-2i64], &[-3]), vec![-2]);
        assert_eq!(red(Datatype::U64, Combine::Min, &[u64::MAX], &[7]), vec![7]);
        assert_eq!(
            red(Datatype::F64, Combine::Min, &[-0.5f64, 2.0], &[-1.5, 1.0]),
            vec![-1.5, 1.0]
        );
        assert_eq!(
            red(Datatype::F32, Combine::Max, &[-0.5f32, -2.0], &[-1.5, -1.0]),
            vec![-0.5, -1.0]
        );
        let h = |x: f32| f16::from_f32(x);
        assert_eq!(
            red(
                Datatype::F16,
                Combine::Min,
                &[h(-3.0), h(2.0)],
                &[h(-4.0), h(1.0)]
            ),
            vec![h(-4.0), h(1.0)]
        );
        let b16 = |x: f32| bf16::from_f32(x);
        assert_eq!(
            red(
                Datatype::BF16,
                Combine::Max,
                &[b16(-3.0), b16(2.0)],
                &[b16(-4.0), b16(1.0)]
            ),
            vec![b16(-3.0), b16(2.0)]
        );
    }

    #[test]
    fn float_sum_prod() {
        assert_eq!(
            red(Datatype::F32, Combine::Sum, &[1.5f32, -2.0], &[2.25, 0.5]),
            vec![3.75, -1.5]
        );
        assert_eq!(
            red(Datatype::F64, Combine::Prod, &[1.5f64, -2.0], &[2.0, 0.5]),
            vec![3.0, -1.0]
        );
    }

    #[test]
    fn half_types_round_once() {
        // 2048 + 1 is not representable in f16 (spacing 2): ties round to even.
        let h = |x: f32| f16::from_f32(x);
        assert_eq!(
            red(Datatype::F16, Combine::Sum, &[h(2048.0)], &[h(1.0)]),
            vec![h(2048.0)]
        );
        assert_eq!(
            red(Datatype::F16, Combine::Sum, &[h(2050.0)], &[h(1.0)]),
            vec![h(2052.0)]
        );
        // 0.1 + 0.2 computed in f32 then rounded, not accumulated in f16 steps.
        let want = f16::from_f32(h(0.1).to_f32() + h(0.2).to_f32());
        assert_eq!(
            red(Datatype::F16, Combine::Sum, &[h(0.1)], &[h(0.2)]),
            vec![want]
        );
        assert_eq!(
            red(Datatype::F16, Combine::Prod, &[h(3.0)], &[h(-0.5)]),
            vec![h(-1.5)]
        );
        // bf16 keeps 8 bits of mantissa: 256 + 1 rounds to 256 (even).
        let b = |x: f32| bf16::from_f32(x);
        assert_eq!(
            red(Datatype::BF16, Combine::Sum, &[b(256.0)], &[b(1.0)]),
            vec![b(256.0)]
        );
        assert_eq!(
            red(Datatype::BF16, Combine::Sum, &[b(256.0)], &[b(3.0)]),
            vec![b(260.0)]
        );
        // Long slices cross the conversion batch boundary.
        let n = HALF_BATCH * 2 + 17;
        let a: Vec<f16> = (0..n).map(|i| h(i as f32)).collect();
        let ones = vec![h(1.0); n];
        let got = red(Datatype::F16, Combine::Sum, &a, &ones);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, h(i as f32 + 1.0), "element {i}");
        }
    }

    #[test]
    fn bitwise_and_logical_ops() {
        let (a, b) = ([0b1100u8, 0, 7, 0], [0b1010u8, 9, 0, 0]);
        assert_eq!(
            red(Datatype::U8, Combine::BitAnd, &a, &b),
            vec![0b1000, 0, 0, 0]
        );
        assert_eq!(
            red(Datatype::U8, Combine::BitOr, &a, &b),
            vec![0b1110, 9, 7, 0]
        );
        assert_eq!(
            red(Datatype::U8, Combine::BitXor, &a, &b),
            vec![0b0110, 9, 7, 0]
        );
        assert_eq!(
            red(Datatype::U8, Combine::LogicalAnd, &a, &b),
            vec![1, 0, 0, 0]
        );
        assert_eq!(
            red(Datatype::U8, Combine::LogicalOr, &a, &b),
            vec![1, 1, 1, 0]
        );
        assert_eq!(
            red(Datatype::U8, Combine::LogicalXor, &a, &b),
            vec![0, 1, 1, 0]
        );
        let (x, y) = ([-1i64, i64::MIN, -2], [i64::MIN, 0, -3]);
        assert_eq!(
            red(Datatype::I64, Combine::BitAnd, &x, &y),
            vec![i64::MIN, 0, -4]
        );
        assert_eq!(
            red(Datatype::I64, Combine::LogicalAnd, &x, &y),
            vec![1, 0, 1]
        );
        assert_eq!(
            red(Datatype::I64, Combine::LogicalXor, &x, &y),
            vec![0, 1, 0]
        );
        assert_eq!(
            red(Datatype::I8, Combine::BitOr, &[-128i8], &[1]),
            vec![-127]
        );
        // Floats never get here through the API; they get C's logical value.
        assert_eq!(
            red(
                Datatype::F32,
                Combine::LogicalOr,
                &[0.0f32, 0.5],
                &[0.0, 0.0]
            ),
            vec![0.0, 1.0]
        );
    }

    #[test]
    fn every_dtype_and_op_runs() {
        for dtype in Datatype::ALL {
            for c in [
                Combine::Sum,
                Combine::Prod,
                Combine::Min,
                Combine::Max,
                Combine::BitAnd,
                Combine::BitOr,
                Combine::BitXor,
                Combine::LogicalAnd,
                Combine::LogicalOr,
                Combine::LogicalXor,
            ] {
                let n = 37 * dtype.size();
                let a: Vec<u8> = (0..n).map(|i| (i % 7) as u8).collect();
                let b: Vec<u8> = (0..n).map(|i| (i % 5) as u8).collect();
                let mut d = vec![0u8; n];
                reduce(dtype, c, &mut d, &a, &b);
                let mut acc = a.clone();
                reduce_inplace(dtype, c, &mut acc, &b);
                assert_eq!(d, acc, "{dtype} {c:?}");
            }
        }
    }

    #[test]
    fn misaligned_slices_take_the_slow_path() {
        let a = [1i32, -2, 3, 4];
        let b = [10i32, 20, -30, 40];
        let mut ab = [0u8; 17];
        ab[1..].copy_from_slice(&bytes(&a));
        let mut bb = [0u8; 17];
        bb[1..].copy_from_slice(&bytes(&b));
        let mut db = [0u8; 17];
        reduce(
            Datatype::I32,
            Combine::Sum,
            &mut db[1..],
            &ab[1..],
            &bb[1..],
        );
        assert_eq!(back::<i32>(&db[1..]), vec![11, 18, -27, 44]);
        post_div(Datatype::I32, 4, &mut db[1..]);
        assert_eq!(back::<i32>(&db[1..]), vec![2, 4, -6, 11]);
    }

    #[test]
    fn pre_scale_semantics() {
        let mut d = bytes(&[0i32; 3]);
        pre_scale(Datatype::I32, 2.9, &mut d, &bytes(&[5i32, -7, i32::MAX]));
        // 2.9 as i32 == 2; the product wraps.
        assert_eq!(back::<i32>(&d), vec![10, -14, -2]);
        let mut u = bytes(&[3u8, 200]);
        pre_scale_inplace(Datatype::U8, -1.0, &mut u);
        assert_eq!(back::<u8>(&u), vec![0, 0]);
        let mut f = bytes(&[1.0f32, -3.0]);
        pre_scale_inplace(Datatype::F32, 0.25, &mut f);
        assert_eq!(back::<f32>(&f), vec![0.25, -0.75]);
        let mut g = bytes(&[0.1f64]);
        pre_scale_inplace(Datatype::F64, 1.0 / 3.0, &mut g);
        assert_eq!(back::<f64>(&g), vec![0.1 * (1.0 / 3.0)]);
        let h = |x: f32| f16::from_f32(x);
        let mut hb = bytes(&[h(3.0), h(-1.0)]);
        pre_scale_inplace(Datatype::F16, 1.0 / 3.0, &mut hb);
        assert_eq!(
            back::<f16>(&hb),
            vec![
                f16::from_f32(3.0 * (1.0f32 / 3.0)),
                f16::from_f32(-1.0 / 3.0)
            ]
        );
        let b = |x: f32| bf16::from_f32(x);
        let mut src = bytes(&[b(8.0)]);
        let mut dst = bytes(&[b(0.0)]);
        pre_scale(Datatype::BF16, 0.5, &mut dst, &src);
        assert_eq!(back::<bf16>(&dst), vec![b(4.0)]);
        pre_scale_inplace(Datatype::BF16, 0.5, &mut src);
        assert_eq!(src, dst);
    }

    #[test]
    fn post_div_truncates_toward_zero() {
        let mut v = bytes(&[7i32, -7, -1, 9, i32::MIN]);
        post_div(Datatype::I32, 2, &mut v);
        assert_eq!(back::<i32>(&v), vec![3, -3, 0, 4, i32::MIN / 2]);
        // A divisor larger than the element type's range.
        let mut s = bytes(&[-128i8, 127, -100]);
        post_div(Datatype::I8, 200, &mut s);
        assert_eq!(back::<i8>(&s), vec![0, 0, 0]);
        let mut s = bytes(&[-128i8, 100]);
        post_div(Datatype::I8, 3, &mut s);
        assert_eq!(back::<i8>(&s), vec![-42, 33]);
        let mut u = bytes(&[255u8, 10]);
        post_div(Datatype::U8, 300, &mut u);
        assert_eq!(back::<u8>(&u), vec![0, 0]);
        let mut l = bytes(&[i64::MIN, -9]);
        post_div(Datatype::I64, 1u64 << 63, &mut l);
        assert_eq!(back::<i64>(&l), vec![-1, 0]);
        let mut l = bytes(&[-9i64, u64::MAX as i64]);
        post_div(Datatype::I64, 4, &mut l);
        assert_eq!(back::<i64>(&l), vec![-2, 0]);
        let mut q = bytes(&[u64::MAX]);
        post_div(Datatype::U64, 2, &mut q);
        assert_eq!(back::<u64>(&q), vec![u64::MAX / 2]);
        let mut f = bytes(&[3.0f64]);
        post_div(Datatype::F64, 2, &mut f);
        assert_eq!(back::<f64>(&f), vec![1.5]);
    }
}

//! Element types of the sweep and the exact values it expects: inputs are
//! small integers derived from (rank, index), so every rank computes every
//! rank's input and the exact result.

use gpucoll::{bf16, f16, Datatype, Equivalence, RawBuffer, ReduceOp};

pub(crate) trait Elem: Equivalence + Copy + Default {
    fn of(v: i64) -> Self;
    fn f(self) -> f64;
}
macro_rules! elem_int { ($($t:ty),*) => {$(
    impl Elem for $t { fn of(v: i64) -> Self { v as $t } fn f(self) -> f64 { self as f64 } }
)*}; }
elem_int!(i8, u8, i32, u32, i64, u64, f32, f64);
impl Elem for f16 {
    fn of(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}
impl Elem for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
}

/// Input value of rank `r` at index `j`.
pub(crate) fn val(r: usize, j: u64, red: bool) -> i64 {
    if red {
        ((r as u64 * 7 + j * 3) % 3 + 1) as i64
    } else {
        ((r as u64 * 31 + j * 7) % 101) as i64
    }
}

/// Input value of rank `r` at index `j` for element type `T`: reduction
/// inputs of signed types run from -1 to 1, so min, max and division see
/// negative values (signed data runs on the unsigned kernels).
pub(crate) fn input_val<T: Elem>(r: usize, j: u64, red: bool) -> i64 {
    let v = val(r, j, red);
    if red && T::DATATYPE.is_signed_int() {
        v - 2
    } else {
        v
    }
}

/// The exact result as f64 (small integers; float Avg is exact for
/// power-of-two rank counts, which the runs use).
pub(crate) fn reduce_exact(
    op: ReduceOp,
    xs: impl Iterator<Item = i64>,
    n: usize,
    float: bool,
) -> f64 {
    let xs: Vec<i64> = xs.collect();
    match op {
        ReduceOp::Sum => xs.iter().sum::<i64>() as f64,
        ReduceOp::Prod => xs.iter().product::<i64>() as f64,
        ReduceOp::Min => *xs.iter().min().unwrap_or(&0) as f64,
        ReduceOp::Max => *xs.iter().max().unwrap_or(&0) as f64,
        ReduceOp::Avg if float => xs.iter().sum::<i64>() as f64 / n as f64,
        ReduceOp::Avg => (xs.iter().sum::<i64>() / n as i64) as f64,
        ReduceOp::PreMulSum(s) => xs.iter().map(|x| x * s as i64).sum::<i64>() as f64,
        ReduceOp::BitAnd => xs.iter().fold(-1, |a, x| a & x) as f64,
        ReduceOp::BitOr => xs.iter().fold(0, |a, x| a | x) as f64,
        ReduceOp::BitXor => xs.iter().fold(0, |a, x| a ^ x) as f64,
        // A lone input is returned as is (as MPI does).
        _ if xs.len() == 1 => xs[0] as f64,
        ReduceOp::LogicalAnd => xs.iter().all(|&x| x != 0) as i64 as f64,
        ReduceOp::LogicalOr => xs.iter().any(|&x| x != 0) as i64 as f64,
        ReduceOp::LogicalXor => (xs.iter().filter(|&&x| x != 0).count() % 2) as f64,
    }
}

/// `v` converted to the element type, as f64 (wrapping like the type does).
pub(crate) fn as_elem<T: Elem>(v: f64) -> f64 {
    if T::DATATYPE.is_float() {
        conv::<T>(v)
    } else {
        T::of(v as i64).f()
    }
}

pub(crate) fn conv<T: Elem>(v: f64) -> f64 {
    match T::DATATYPE {
        Datatype::F16 => f16::from_f64(v).to_f64(),
        Datatype::BF16 => bf16::from_f64(v).to_f64(),
        Datatype::F32 => v as f32 as f64,
        _ => v,
    }
}

pub(crate) fn sub(b: RawBuffer, off: u64, len: u64) -> RawBuffer {
    RawBuffer {
        addr: b.addr + off * b.dtype.size() as u64,
        len,
        ..b
    }
}
pub(crate) fn empty_at(b: RawBuffer) -> RawBuffer {
    RawBuffer { len: 0, ..b }
}

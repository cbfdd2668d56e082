//! Reduction operations.
//!
//! The bitwise (`BitAnd`, `BitOr`, `BitXor`) and logical (`LogicalAnd`,
//! `LogicalOr`, `LogicalXor`) ops exist for the six integer types only, as
//! MPI defines `MPI_BAND` ... `MPI_LXOR` for C integers: on a float type
//! [`ReduceOp::validate`] returns [`Error::InvalidOp`]. A logical op treats
//! a non-zero element as true and yields 1 or 0 (C's `&&`, `||` and
//! exclusive or). On a communicator of one rank every reduction returns the
//! input unchanged, as MPI libraries do (a lone logical input is not
//! normalized to 1/0).
//!
//! ```
//! use gpucoll::{Datatype, ReduceOp};
//!
//! // Which ops a program may offer for its u8 flags and its f16 values.
//! let ops_for = |d: Datatype| -> Vec<ReduceOp> {
//!     ReduceOp::ALL.into_iter().filter(|o| o.applies_to(d)).collect()
//! };
//! let (for_flags, for_f16) = (ops_for(Datatype::U8), ops_for(Datatype::F16));
//! assert_eq!(for_flags.len(), 12);
//! assert!(for_flags.contains(&ReduceOp::LogicalOr));
//! assert_eq!(for_f16.len(), 6);
//! assert!(!for_f16.contains(&ReduceOp::BitAnd));
//! ```

use crate::datatype::Datatype;
use crate::error::{Error, Result};
use std::fmt;

/// A reduction operation for `all_reduce`, `reduce`, `reduce_scatter`,
/// `scan` and `exclusive_scan` (which refuse `Avg`).
///
/// ```
/// use gpucoll::{Datatype, Error, ReduceOp};
///
/// // Ops as a command line or a config file names them.
/// assert_eq!(ReduceOp::parse("max"), Some(ReduceOp::Max));
/// assert_eq!(ReduceOp::parse("premulsum:0.5"), Some(ReduceOp::PreMulSum(0.5)));
/// // Bitwise ops exist for integers only; a fractional scale needs a float type.
/// assert!(ReduceOp::BitXor.applies_to(Datatype::U32));
/// assert!(matches!(
///     ReduceOp::BitXor.validate(Datatype::F32),
///     Err(Error::InvalidOp { .. })
/// ));
/// assert!(ReduceOp::PreMulSum(0.5).applies_to(Datatype::BF16));
/// assert!(!ReduceOp::PreMulSum(0.5).applies_to(Datatype::I32));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceOp {
    /// Element-wise sum (wrapping for integers).
    Sum,
    /// Element-wise product (wrapping for integers).
    Prod,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
    /// Sum divided by the number of ranks. Floats: each input is scaled by
    /// `1/size` before the sum (as NCCL does); integers: the sum is divided
    /// (truncating toward zero) at the end.
    Avg,
    /// Sum of every rank's input multiplied by `scalar` (the same scalar on all
    /// ranks), like NCCL's `ncclRedOpCreatePreMulSum`. On integer types the
    /// scalar must be an integer within the type's range ([`Error::InvalidOp`]
    /// otherwise: `PreMulSum(0.5)` on `i32` would silently give zeros).
    PreMulSum(f64),
    /// Bitwise and (`MPI_BAND`); integers only.
    BitAnd,
    /// Bitwise or (`MPI_BOR`); integers only.
    BitOr,
    /// Bitwise exclusive or (`MPI_BXOR`); integers only.
    BitXor,
    /// Logical and (`MPI_LAND`): 1 if every input is non-zero, else 0;
    /// integers only.
    LogicalAnd,
    /// Logical or (`MPI_LOR`): 1 if any input is non-zero, else 0; integers
    /// only.
    LogicalOr,
    /// Logical exclusive or (`MPI_LXOR`): 1 if an odd number of inputs are
    /// non-zero, else 0; integers only.
    LogicalXor,
}

/// Whether `s` is an integer that `dtype` (an integer type) can hold.
fn integral_in_range(s: f64, dtype: Datatype) -> bool {
    let (lo, hi) = match dtype {
        Datatype::I8 => (i8::MIN as f64, i8::MAX as f64),
        Datatype::U8 => (0.0, u8::MAX as f64),
        Datatype::I32 => (i32::MIN as f64, i32::MAX as f64),
        Datatype::U32 => (0.0, u32::MAX as f64),
        Datatype::I64 => (i64::MIN as f64, i64::MAX as f64),
        Datatype::U64 => (0.0, u64::MAX as f64),
        _ => return true,
    };
    s.fract() == 0.0 && (lo..=hi).contains(&s)
}

impl ReduceOp {
    /// Every op kind with a representative scalar, for tests and the bench,
    /// in [`ReduceOp::code`] order. The integer-only ops are among them: pair
    /// ops with datatypes through [`ReduceOp::applies_to`].
    pub const ALL: [ReduceOp; 12] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(2.0),
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
        ReduceOp::LogicalAnd,
        ReduceOp::LogicalOr,
        ReduceOp::LogicalXor,
    ];

    /// Lower-case name (`sum`, `prod`, `min`, `max`, `avg`, `premulsum`,
    /// `band`, `bor`, `bxor`, `land`, `lor`, `lxor`).
    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
            ReduceOp::LogicalAnd => "land",
            ReduceOp::LogicalOr => "lor",
            ReduceOp::LogicalXor => "lxor",
        }
    }

    /// Parse `sum|prod|min|max|avg|premulsum[:scalar]|band|bor|bxor|land|lor|lxor`.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        let lower = s.to_ascii_lowercase();
        let (head, arg) = match lower.split_once(':') {
            Some((h, a)) => (h.to_string(), Some(a.to_string())),
            None => (lower.clone(), None),
        };
        match (head.as_str(), arg) {
            ("sum", None) => Some(ReduceOp::Sum),
            ("prod", None) => Some(ReduceOp::Prod),
            ("min", None) => Some(ReduceOp::Min),
            ("max", None) => Some(ReduceOp::Max),
            ("avg", None) => Some(ReduceOp::Avg),
            ("premulsum", None) => Some(ReduceOp::PreMulSum(2.0)),
            ("premulsum", Some(a)) => a.parse().ok().map(ReduceOp::PreMulSum),
            (name, None) => ReduceOp::ALL[6..]
                .iter()
                .copied()
                .find(|o| o.name() == name),
            _ => None,
        }
    }

    /// Whether this op is defined for integer types only (the bitwise and
    /// logical ops, as in MPI).
    pub fn integer_only(&self) -> bool {
        self.code() >= ReduceOp::BitAnd.code()
    }

    /// Whether [`ReduceOp::validate`] accepts this op for `dtype`.
    pub fn applies_to(&self, dtype: Datatype) -> bool {
        self.validate(dtype).is_ok()
    }

    /// Check that this op can be applied to `dtype`.
    pub fn validate(&self, dtype: Datatype) -> Result<()> {
        if self.integer_only() && dtype.is_float() {
            return Err(Error::InvalidOp {
                op: format!("{self} (integer types only)"),
                dtype,
            });
        }
        if let ReduceOp::PreMulSum(s) = self {
            if !s.is_finite() {
                return Err(Error::InvalidOp {
                    op: format!("premulsum({s})"),
                    dtype,
                });
            }
            if !dtype.is_float() && !integral_in_range(*s, dtype) {
                return Err(Error::InvalidOp {
                    op: format!(
                        "premulsum({s}) (an integer type needs an integer scalar within its range)"
                    ),
                    dtype,
                });
            }
        }
        Ok(())
    }

    /// A stable small integer for signatures and kernel selection.
    pub fn code(&self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PreMulSum(_) => 5,
            ReduceOp::BitAnd => 6,
            ReduceOp::BitOr => 7,
            ReduceOp::BitXor => 8,
            ReduceOp::LogicalAnd => 9,
            ReduceOp::LogicalOr => 10,
            ReduceOp::LogicalXor => 11,
        }
    }

    /// The scalar bits that must agree across ranks (0 for ops without one).
    pub fn scalar_bits(&self) -> u64 {
        match self {
            ReduceOp::PreMulSum(s) => s.to_bits(),
            _ => 0,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::PreMulSum(s) => write!(f, "premulsum({s})"),
            other => f.write_str(other.name()),
        }
    }
}

/// How a reduction is carried out by the engine, derived from the op, the
/// datatype and the communicator size: the combining function plus an
/// optional scaling of each local input (pre-op) and of the final result
/// (post-op). Every backend implements exactly this.
///
/// ```
/// use gpucoll::op::{Combine, Reduction};
/// use gpucoll::{Datatype, ReduceOp};
///
/// // Avg on floats: every input is scaled by 1/size, then summed.
/// let f = Reduction::lower(ReduceOp::Avg, Datatype::F32, 4);
/// assert_eq!((f.combine, f.pre_scale, f.post_div), (Combine::Sum, Some(0.25), None));
/// // Avg on integers: summed, then divided by the size once.
/// let i = Reduction::lower(ReduceOp::Avg, Datatype::I64, 4);
/// assert_eq!((i.combine, i.pre_scale, i.post_div), (Combine::Sum, None, Some(4)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reduction {
    /// The element-wise combining function.
    pub combine: Combine,
    /// Multiply each rank's own input by this before combining.
    pub pre_scale: Option<f64>,
    /// Divide the final result by this (integer Avg), truncating toward zero.
    pub post_div: Option<u64>,
}

/// The element-wise combining function of a [`Reduction`]. The bitwise and
/// logical functions are reached for integer types only (validation rejects
/// them on floats); the logical ones yield 1 or 0.
///
/// ```
/// use gpucoll::op::{Combine, Reduction};
/// use gpucoll::{Datatype, ReduceOp};
///
/// let combine = |op| Reduction::lower(op, Datatype::I32, 8).combine;
/// assert_eq!(combine(ReduceOp::Max), Combine::Max);
/// assert_eq!(combine(ReduceOp::LogicalOr), Combine::LogicalOr);
/// // The scaled sums all combine by adding.
/// assert_eq!(combine(ReduceOp::PreMulSum(3.0)), Combine::Sum);
/// assert_eq!(combine(ReduceOp::Avg), Combine::Sum);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    Sum,
    Prod,
    Min,
    Max,
    BitAnd,
    BitOr,
    BitXor,
    LogicalAnd,
    LogicalOr,
    LogicalXor,
}

impl Reduction {
    /// Lower a user-facing op for `dtype` on a communicator of `nranks`.
    pub fn lower(op: ReduceOp, dtype: Datatype, nranks: usize) -> Reduction {
        let plain = |combine| Reduction {
            combine,
            pre_scale: None,
            post_div: None,
        };
        match op {
            ReduceOp::Sum => plain(Combine::Sum),
            ReduceOp::Prod => plain(Combine::Prod),
            ReduceOp::Min => plain(Combine::Min),
            ReduceOp::Max => plain(Combine::Max),
            ReduceOp::Avg if dtype.is_float() => Reduction {
                combine: Combine::Sum,
                pre_scale: Some(1.0 / nranks as f64),
                post_div: None,
            },
            ReduceOp::Avg => Reduction {
                combine: Combine::Sum,
                pre_scale: None,
                post_div: Some(nranks as u64),
            },
            ReduceOp::PreMulSum(s) => Reduction {
                combine: Combine::Sum,
                pre_scale: Some(s),
                post_div: None,
            },
            ReduceOp::BitAnd => plain(Combine::BitAnd),
            ReduceOp::BitOr => plain(Combine::BitOr),
            ReduceOp::BitXor => plain(Combine::BitXor),
            ReduceOp::LogicalAnd => plain(Combine::LogicalAnd),
            ReduceOp::LogicalOr => plain(Combine::LogicalOr),
            ReduceOp::LogicalXor => plain(Combine::LogicalXor),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        for op in ReduceOp::ALL {
            assert_eq!(
                ReduceOp::parse(op.name()).map(|o| o.code()),
                Some(op.code())
            );
        }
        assert_eq!(
            ReduceOp::parse("premulsum:0.5"),
            Some(ReduceOp::PreMulSum(0.5))
        );
        assert_eq!(ReduceOp::parse("xor"), None);
        assert_eq!(ReduceOp::parse("LXOR"), Some(ReduceOp::LogicalXor));
        assert_eq!(ReduceOp::parse("band:1"), None);
    }

    #[test]
    fn codes_index_all() {
        for (i, op) in ReduceOp::ALL.iter().enumerate() {
            assert_eq!(op.code() as usize, i, "{op}");
        }
    }

    #[test]
    fn bitwise_and_logical_ops_are_integer_only() {
        for op in ReduceOp::ALL {
            for dtype in Datatype::ALL {
                let ok = op.validate(dtype).is_ok();
                assert_eq!(ok, !(op.integer_only() && dtype.is_float()), "{op} {dtype}");
                assert_eq!(ok, op.applies_to(dtype));
            }
        }
        assert!(matches!(
            ReduceOp::LogicalOr.validate(Datatype::BF16),
            Err(Error::InvalidOp { .. })
        ));
        let r = Reduction::lower(ReduceOp::BitXor, Datatype::U8, 3);
        assert_eq!(r.combine, Combine::BitXor);
        assert_eq!((r.pre_scale, r.post_div), (None, None));
    }

    #[test]
    fn avg_lowers_by_type() {
        let f = Reduction::lower(ReduceOp::Avg, Datatype::F32, 4);
        assert_eq!(f.pre_scale, Some(0.25));
        assert_eq!(f.post_div, None);
        let i = Reduction::lower(ReduceOp::Avg, Datatype::I32, 4);
        assert_eq!(i.pre_scale, None);
        assert_eq!(i.post_div, Some(4));
    }

    #[test]
    fn non_finite_scalar_rejected() {
        assert!(ReduceOp::PreMulSum(f64::NAN)
            .validate(Datatype::F32)
            .is_err());
        assert!(ReduceOp::PreMulSum(3.0).validate(Datatype::I8).is_ok());
    }

    #[test]
    fn integer_premulsum_needs_an_integer_scalar_in_range() {
        let ok = |s: f64, d: Datatype| ReduceOp::PreMulSum(s).validate(d).is_ok();
        assert!(!ok(0.5, Datatype::I32) && !ok(2.5, Datatype::U64));
        assert!(!ok(-1.0, Datatype::U8) && !ok(300.0, Datatype::I8));
        assert!(ok(-3.0, Datatype::I8) && ok(255.0, Datatype::U8) && ok(2.0, Datatype::I64));
        assert!(ok(0.5, Datatype::F32) && ok(0.5, Datatype::BF16));
    }
}

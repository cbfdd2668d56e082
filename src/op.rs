//! Reduction operations.

use crate::datatype::Datatype;
use crate::error::{Error, Result};
use std::fmt;

/// A reduction operation for `all_reduce`, `reduce` and `reduce_scatter`.
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
    /// ranks), like NCCL's `ncclRedOpCreatePreMulSum`. Integers multiply by
    /// the scalar converted to the element type (truncated).
    PreMulSum(f64),
}

impl ReduceOp {
    /// Every op kind with a representative scalar, for tests and the bench.
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(2.0),
    ];

    /// Lower-case name (`sum`, `prod`, `min`, `max`, `avg`, `premulsum`).
    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }

    /// Parse `sum|prod|min|max|avg|premulsum[:scalar]`.
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
            _ => None,
        }
    }

    /// Check that this op can be applied to `dtype`.
    pub fn validate(&self, dtype: Datatype) -> Result<()> {
        if let ReduceOp::PreMulSum(s) = self {
            if !s.is_finite() {
                return Err(Error::InvalidOp {
                    op: format!("premulsum({s})"),
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
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reduction {
    /// The element-wise combining function.
    pub combine: Combine,
    /// Multiply each rank's own input by this before combining.
    pub pre_scale: Option<f64>,
    /// Divide the final result by this (integer Avg), truncating toward zero.
    pub post_div: Option<u64>,
}

/// The element-wise combining function of a [`Reduction`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    Sum,
    Prod,
    Min,
    Max,
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
}

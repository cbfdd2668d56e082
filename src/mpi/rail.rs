//! MPI's own all_reduce for the rails of collnet plans
//! ([`Step::Rail`](crate::plan::Step::Rail)): a nonblocking
//! `MPI_Iallreduce` on staging copies of the data, so that the executor can
//! poll it between its other steps and a request that never completes (a
//! peer died) cannot write into the caller's buffer afterwards.
//!
//! Types and ops MPI has (`f32`, `f64`, integers; sum, product, min, max,
//! bitwise and logical ops) go to MPI as they are, which keeps MPI's tuned
//! (and on real clusters, offloaded) paths open. `f16` and `bf16` travel as
//! 2-byte types with user-defined ops that compute like the host kernels
//! (in `f32`, rounded once per combine).

use super::{ffi, require_usable, MpiComm};
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use crate::op::Combine;
use half::{bf16, f16};
use once_cell::sync::OnceCell;
use std::os::raw::{c_int, c_void};

/// An `MPI_Iallreduce` in flight over a staging buffer it owns.
pub struct RailAllReduce {
    raw: ffi::MPI_Request,
    /// This rank's contribution and the result (mpi-sys has no
    /// `MPI_IN_PLACE`, and the copy is needed anyway).
    send: Box<[u8]>,
    recv: Box<[u8]>,
    done: bool,
}

// SAFETY: the request handle is a process-global value; it is only used
// through `&mut self`, and concurrent MPI use requires MPI_THREAD_MULTIPLE,
// which the backend checks before running plans on several threads.
unsafe impl Send for RailAllReduce {}

impl MpiComm {
    /// Start an all-reduce of `data` (`dtype` elements, combined with
    /// `combine`) over this communicator; every member passes the same
    /// length, dtype and combine, in the same order as its other rail calls.
    pub fn rail_all_reduce(
        &self,
        data: &[u8],
        dtype: Datatype,
        combine: Combine,
    ) -> Result<RailAllReduce> {
        require_usable("MPI_Iallreduce")?;
        let esize = dtype.size();
        if data.len() % esize != 0 {
            return Err(Error::Backend(format!(
                "rail all_reduce of {} bytes is not a whole number of {dtype} elements",
                data.len()
            )));
        }
        let count = c_int::try_from(data.len() / esize)
            .map_err(|_| Error::CountTooLarge((data.len() / esize) as u64))?;
        let (ty, op) = mpi_type_op(dtype, combine)?;
        let send: Box<[u8]> = data.into();
        let mut recv: Box<[u8]> = vec![0u8; data.len()].into();
        let mut raw = ffi::request_null();
        // SAFETY: `send` and `recv` hold `count` elements of `ty` and live
        // in the returned value until the request completed (or are leaked
        // with it); the communicator handle is valid while `self` is borrowed.
        let rc = unsafe {
            ffi::PMPI_Iallreduce(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                count,
                ty,
                op,
                self.raw(),
                &mut raw,
            )
        };
        ffi::check("MPI_Iallreduce", rc)?;
        Ok(RailAllReduce {
            raw,
            send,
            recv,
            done: false,
        })
    }
}

impl RailAllReduce {
    /// `MPI_Test`: the reduced bytes once complete, None while in flight.
    pub fn test(&mut self) -> Result<Option<&[u8]>> {
        if !self.done {
            require_usable("MPI_Test")?;
            let mut flag: c_int = 0;
            // SAFETY: `self.raw` is the active request started in
            // `rail_all_reduce` (MPI sets it to null once complete).
            let rc = unsafe { ffi::PMPI_Test(&mut self.raw, &mut flag, ffi::status_ignore()) };
            ffi::check("MPI_Test", rc)?;
            if flag == 0 {
                return Ok(None);
            }
            self.done = true;
        }
        Ok(Some(&self.recv))
    }
}

impl Drop for RailAllReduce {
    fn drop(&mut self) {
        if !self.done {
            // A nonblocking collective can be neither cancelled nor freed;
            // MPI may still use the buffers, so they are leaked (this only
            // happens when the communicator failed).
            std::mem::forget(std::mem::take(&mut self.send));
            std::mem::forget(std::mem::take(&mut self.recv));
        }
    }
}

/// The MPI datatype and op of (dtype, combine).
fn mpi_type_op(dtype: Datatype, combine: Combine) -> Result<(ffi::MPI_Datatype, ffi::MPI_Op)> {
    let builtin_ty = match dtype {
        Datatype::I8 => Some(ffi::dt_i8()),
        Datatype::U8 => Some(ffi::dt_u8()),
        Datatype::I32 => Some(ffi::dt_i32()),
        Datatype::U32 => Some(ffi::dt_u32()),
        Datatype::I64 => Some(ffi::dt_i64()),
        Datatype::U64 => Some(ffi::dt_u64()),
        Datatype::F32 => Some(ffi::dt_f32()),
        Datatype::F64 => Some(ffi::dt_f64()),
        Datatype::F16 | Datatype::BF16 => None,
    };
    if let Some(ty) = builtin_ty {
        let op = match combine {
            Combine::Sum => ffi::op_sum(),
            Combine::Prod => ffi::op_prod(),
            Combine::Min => ffi::op_min(),
            Combine::Max => ffi::op_max(),
            Combine::BitAnd => ffi::op_band(),
            Combine::BitOr => ffi::op_bor(),
            Combine::BitXor => ffi::op_bxor(),
            Combine::LogicalAnd => ffi::op_land(),
            Combine::LogicalOr => ffi::op_lor(),
            Combine::LogicalXor => ffi::op_lxor(),
        };
        return Ok((ty, op));
    }
    let half = HalfOps::get()?;
    let which = match combine {
        Combine::Sum => 0,
        Combine::Prod => 1,
        Combine::Min => 2,
        Combine::Max => 3,
        other => {
            return Err(Error::InvalidOp {
                op: format!("{other:?}"),
                dtype,
            })
        }
    };
    Ok(match dtype {
        Datatype::F16 => (half.f16_type, half.f16_ops[which]),
        _ => (half.bf16_type, half.bf16_ops[which]),
    })
}

/// The 2-byte types and user ops for `f16`/`bf16`, created once (MPI frees
/// them at finalize).
struct HalfOps {
    f16_type: ffi::MPI_Datatype,
    bf16_type: ffi::MPI_Datatype,
    f16_ops: [ffi::MPI_Op; 4],
    bf16_ops: [ffi::MPI_Op; 4],
}

// SAFETY: MPI datatype and op handles are process-global values.
unsafe impl Send for HalfOps {}
// SAFETY: as above; they are never mutated after creation.
unsafe impl Sync for HalfOps {}

static HALF_OPS: OnceCell<HalfOps> = OnceCell::new();

impl HalfOps {
    fn get() -> Result<&'static HalfOps> {
        HALF_OPS.get_or_try_init(|| {
            Ok(HalfOps {
                f16_type: two_byte_type()?,
                bf16_type: two_byte_type()?,
                f16_ops: [
                    user_op(f16_sum)?,
                    user_op(f16_prod)?,
                    user_op(f16_min)?,
                    user_op(f16_max)?,
                ],
                bf16_ops: [
                    user_op(bf16_sum)?,
                    user_op(bf16_prod)?,
                    user_op(bf16_min)?,
                    user_op(bf16_max)?,
                ],
            })
        })
    }
}

fn two_byte_type() -> Result<ffi::MPI_Datatype> {
    let mut ty = ffi::dt_u8();
    // SAFETY: `ty` is an out pointer; the base type is a predefined handle.
    let rc = unsafe { ffi::PMPI_Type_contiguous(2, ffi::dt_u8(), &mut ty) };
    ffi::check("MPI_Type_contiguous", rc)?;
    // SAFETY: `ty` was just created and is not committed yet.
    let rc = unsafe { ffi::PMPI_Type_commit(&mut ty) };
    ffi::check("MPI_Type_commit", rc)?;
    Ok(ty)
}

type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype);

fn user_op(f: UserFn) -> Result<ffi::MPI_Op> {
    let mut op = ffi::op_sum();
    // SAFETY: `f` has MPI's user-function signature; `op` is an out pointer.
    let rc = unsafe { ffi::PMPI_Op_create(Some(f), 1, &mut op) };
    ffi::check("MPI_Op_create", rc)?;
    Ok(op)
}

/// `inout[i] = in[i] ⊕ inout[i]` for `len` elements of a 2-byte float.
macro_rules! half_op {
    ($name:ident, $t:ty, |$a:ident, $b:ident| $e:expr) => {
        unsafe extern "C" fn $name(
            invec: *mut c_void,
            inout: *mut c_void,
            len: *mut c_int,
            _ty: *mut ffi::MPI_Datatype,
        ) {
            // SAFETY: MPI passes `*len` elements of the 2-byte type this op
            // was registered for in both vectors, which do not overlap.
            let (a, b) = unsafe {
                let n = (*len).max(0) as usize;
                (
                    std::slice::from_raw_parts(invec as *const $t, n),
                    std::slice::from_raw_parts_mut(inout as *mut $t, n),
                )
            };
            for (x, y) in a.iter().zip(b.iter_mut()) {
                let ($a, $b) = (x.to_f32(), y.to_f32());
                *y = <$t>::from_f32($e);
            }
        }
    };
}

half_op!(f16_sum, f16, |a, b| a + b);
half_op!(f16_prod, f16, |a, b| a * b);
half_op!(f16_min, f16, |a, b| a.min(b));
half_op!(f16_max, f16, |a, b| a.max(b));
half_op!(bf16_sum, bf16, |a, b| a + b);
half_op!(bf16_prod, bf16, |a, b| a * b);
half_op!(bf16_min, bf16, |a, b| a.min(b));
half_op!(bf16_max, bf16, |a, b| a.max(b));

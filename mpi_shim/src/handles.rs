//! MPI handles and sentinels from the `mpi.h` the shim is built against
//! (`csrc/handles.c`), and their gpucoll meaning: which predefined datatypes
//! gpucoll moves or reduces natively, and which ops it has.

use gpucoll::{Datatype, ReduceOp};
use mpi_sys::{MPI_Comm_copy_attr_function, MPI_Datatype, MPI_Op};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

#[repr(C)]
struct TypeEntry {
    handle: MPI_Datatype,
    class: c_int,
}

#[repr(C)]
struct OpEntry {
    handle: MPI_Op,
    code: c_int,
}

extern "C" {
    fn gcshim_type_table(n: *mut c_int) -> *const TypeEntry;
    fn gcshim_op_table(n: *mut c_int) -> *const OpEntry;
    fn gcshim_in_place() -> *mut c_void;
    fn gcshim_comm_null_copy_fn() -> MPI_Comm_copy_attr_function;
    fn gcshim_byte() -> MPI_Datatype;
}

const SIGNED: c_int = 1;
const UNSIGNED: c_int = 2;
const FLOAT: c_int = 3;
const CHAR: c_int = 4;
const BYTES: c_int = 5;
const BFLOAT: c_int = 6;

/// What gpucoll can do with an MPI datatype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeType {
    pub dtype: Datatype,
    /// Bytes without arithmetic (`MPI_BYTE`, `MPI_CHARACTER`): moved, never reduced.
    pub movement_only: bool,
}

/// The gpucoll element type for an MPI class and element size, if any.
fn native_of(class: c_int, size: c_int) -> Option<NativeType> {
    let dtype = match (class, size) {
        (SIGNED | CHAR, 1) => Datatype::I8,
        (SIGNED, 4) => Datatype::I32,
        (SIGNED, 8) => Datatype::I64,
        (UNSIGNED | BYTES, 1) => Datatype::U8,
        (UNSIGNED, 4) => Datatype::U32,
        (UNSIGNED, 8) => Datatype::U64,
        (FLOAT, 2) => Datatype::F16,
        (FLOAT, 4) => Datatype::F32,
        (FLOAT, 8) => Datatype::F64,
        (BFLOAT, 2) => Datatype::BF16,
        _ => return None,
    };
    Some(NativeType {
        dtype,
        movement_only: class == BYTES,
    })
}

struct Tables {
    types: Vec<(usize, NativeType)>,
    ops: Vec<(usize, c_int)>,
}

/// Built at the first call (MPI is initialized by then: sizes come from
/// `MPI_Type_size`, so Fortran and platform-sized names map correctly).
fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut n: c_int = 0;
        // SAFETY: the C function returns its static table and writes its length.
        let t = unsafe { gcshim_type_table(&mut n) };
        // SAFETY: `t` points at `n` entries of a static array.
        let entries = unsafe { std::slice::from_raw_parts(t, n.max(0) as usize) };
        let types = entries
            .iter()
            .filter_map(|e| {
                let mut size: c_int = 0;
                // SAFETY: a predefined datatype handle; `size` is a valid out-pointer.
                let rc = unsafe { mpi_sys::PMPI_Type_size(e.handle, &mut size) };
                if rc != 0 {
                    return None;
                }
                native_of(e.class, size).map(|nt| (e.handle.0 as usize, nt))
            })
            .collect();
        let mut m: c_int = 0;
        // SAFETY: as above, for the op table.
        let o = unsafe { gcshim_op_table(&mut m) };
        // SAFETY: `o` points at `m` entries of a static array.
        let ops = unsafe { std::slice::from_raw_parts(o, m.max(0) as usize) }
            .iter()
            .map(|e| (e.handle.0 as usize, e.code))
            .collect();
        Tables { types, ops }
    })
}

/// The native element type of a predefined MPI datatype, or `None` (derived,
/// pair or unsupported types: those are staged).
#[inline]
pub fn native_type(dt: MPI_Datatype) -> Option<NativeType> {
    let key = dt.0 as usize;
    tables()
        .types
        .iter()
        .find(|(h, _)| *h == key)
        .map(|(_, nt)| *nt)
}

/// gpucoll's op for an MPI op it has natively on `dtype`, or `None`.
#[inline]
pub fn native_op(op: MPI_Op, nt: NativeType) -> Option<ReduceOp> {
    if nt.movement_only {
        return None;
    }
    let key = op.0 as usize;
    let code = tables().ops.iter().find(|(h, _)| *h == key)?.1;
    op_of_code(code, nt.dtype)
}

fn op_of_code(code: c_int, _dtype: Datatype) -> Option<ReduceOp> {
    match code {
        0 => Some(ReduceOp::Sum),
        1 => Some(ReduceOp::Prod),
        2 => Some(ReduceOp::Min),
        3 => Some(ReduceOp::Max),
        // Bitwise and logical ops are staged until the engine has them.
        _ => None,
    }
}

/// `MPI_IN_PLACE` of the MPI the shim was built against.
#[inline]
pub fn in_place() -> *mut c_void {
    // SAFETY: returns a constant.
    unsafe { gcshim_in_place() }
}

/// Whether `p` is `MPI_IN_PLACE`.
#[inline]
pub fn is_in_place(p: *const c_void) -> bool {
    std::ptr::eq(p, in_place())
}

/// `MPI_COMM_NULL_COPY_FN`: a duplicated communicator gets no gpucoll state.
pub fn comm_null_copy_fn() -> MPI_Comm_copy_attr_function {
    // SAFETY: returns a constant.
    unsafe { gcshim_comm_null_copy_fn() }
}

/// `MPI_BYTE`.
pub fn byte_type() -> MPI_Datatype {
    // SAFETY: returns a constant.
    unsafe { gcshim_byte() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_by_size() {
        assert_eq!(native_of(SIGNED, 4).unwrap().dtype, Datatype::I32);
        assert_eq!(native_of(SIGNED, 8).unwrap().dtype, Datatype::I64);
        assert_eq!(native_of(CHAR, 1).unwrap().dtype, Datatype::I8);
        assert_eq!(native_of(UNSIGNED, 1).unwrap().dtype, Datatype::U8);
        assert_eq!(native_of(FLOAT, 2).unwrap().dtype, Datatype::F16);
        assert_eq!(native_of(BFLOAT, 2).unwrap().dtype, Datatype::BF16);
        assert!(native_of(BYTES, 1).unwrap().movement_only);
        assert!(!native_of(FLOAT, 8).unwrap().movement_only);
        // 16-bit integers and 16-byte floats are not gpucoll types.
        assert!(native_of(SIGNED, 2).is_none());
        assert!(native_of(FLOAT, 16).is_none());
        assert!(native_of(SIGNED, 0).is_none());
    }

    #[test]
    fn arithmetic_ops_map() {
        assert_eq!(op_of_code(0, Datatype::F32), Some(ReduceOp::Sum));
        assert_eq!(op_of_code(3, Datatype::I64), Some(ReduceOp::Max));
        assert_eq!(op_of_code(99, Datatype::I64), None);
    }
}

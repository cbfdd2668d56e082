//! `MPI_Pack`, `MPI_Unpack`, `MPI_Pack_external`, `MPI_Unpack_external`
//! and their MPI-4 `_c` forms on device memory: staged (`stage`) like a
//! collective's buffers. The typed side is the span of its (count,
//! datatype); the packed side is the bytes from `*position` the call may
//! pack or unpack (at most the pack size of the typed side), copied in and
//! back whole, so bytes it leaves alone come back unchanged. Host memory
//! goes to `PMPI_` unchanged; `MPI_IN_PLACE`, which Open MPI would take for
//! an address, is `MPI_ERR_BUFFER`.

use crate::misuse;
use crate::settings;
use crate::stage::{self, Scope};
use crate::staging::Span;
use mpi_sys::{MPI_Aint, MPI_Comm, MPI_Count, MPI_Datatype, MPI_Request};
use std::ffi::{c_char, c_int, c_void};

type Bufs = [*mut c_void; 2];

/// The packed bytes a call may touch: from `position` for at most `room`
/// bytes of the buffer and `size` (the typed side's pack size).
fn packed_span(position: i64, room: i64, size: i64) -> Span {
    let len = room.saturating_sub(position).min(size).max(0);
    Span {
        lo: position as isize,
        hi: (position + len) as isize,
        dense: true,
    }
}

/// The pack size of `count` elements of `dt` (`None`: MPI rejects them; the
/// call is then not staged and MPI reports it).
fn pack_size(count: c_int, dt: MPI_Datatype, comm: MPI_Comm) -> Option<i64> {
    let mut size: c_int = 0;
    // SAFETY: a valid out-pointer; MPI validates the arguments.
    let ok = count >= 0 && unsafe { mpi_sys::PMPI_Pack_size(count, dt, comm, &mut size) } == 0;
    ok.then_some(size.into())
}

/// The external32 pack size of `count` elements of `dt`.
///
/// # Safety
/// `datarep` is a NUL-terminated string.
unsafe fn external_size(datarep: *const c_char, count: c_int, dt: MPI_Datatype) -> Option<i64> {
    let mut size: MPI_Aint = 0;
    // SAFETY: a valid out-pointer; the caller's string.
    let ok = count >= 0
        && unsafe { mpi_sys::PMPI_Pack_external_size(datarep, count, dt, &mut size) } == 0;
    ok.then_some(size as i64)
}

/// Whether a call that may be staged is one: the shim on, `MPI_IN_PLACE`
/// nowhere (else its error, or `None`: straight to `PMPI_`).
fn checked(call: &str, comm: Option<MPI_Comm>, bufs: &[*const c_void]) -> Result<bool, c_int> {
    if !settings::active() {
        return Ok(false);
    }
    match misuse::refused(call, comm, bufs) {
        Some(code) => Err(code),
        None => Ok(true),
    }
}

/// # Safety
/// As `MPI_Pack`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Pack(
    inbuf: *const c_void,
    incount: c_int,
    datatype: MPI_Datatype,
    outbuf: *mut c_void,
    outsize: c_int,
    position: *mut c_int,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Pack";
    let pmpi = |[i, o]: &Bufs, _: *mut MPI_Request| {
        // SAFETY: the program's arguments, the buffers possibly replaced by
        // host copies of the same spans.
        unsafe { mpi_sys::PMPI_Pack(*i, incount, datatype, *o, outsize, position, comm) }
    };
    let args = [inbuf.cast_mut(), outbuf];
    match checked(CALL, Some(comm), &[inbuf, outbuf.cast_const()]) {
        Err(code) => return code,
        Ok(false) => return pmpi(&args, std::ptr::null_mut()),
        Ok(true) => {}
    }
    let prepare = |c: &mut stage::Copies, [i, o]: Bufs| {
        let (Some(size), false) = (pack_size(incount, datatype, comm), position.is_null()) else {
            return Ok([i, o]);
        };
        // SAFETY: the program's position (MPI's contract).
        let at = i64::from(unsafe { *position });
        let typed = c.type_span(incount.into(), datatype)?;
        let packed = packed_span(at, outsize.into(), size);
        Ok([
            c.span(i, typed, true, false)?,
            c.span(o, packed, true, true)?,
        ])
    };
    let bases = [inbuf, outbuf.cast_const()];
    // SAFETY: the program's arguments (MPI's contract).
    unsafe { stage::call(CALL, Scope::Local(comm), &bases, None, args, prepare, pmpi) }
}

/// # Safety
/// As `MPI_Unpack`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Unpack(
    inbuf: *const c_void,
    insize: c_int,
    position: *mut c_int,
    outbuf: *mut c_void,
    outcount: c_int,
    datatype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    const CALL: &str = "MPI_Unpack";
    let pmpi = |[i, o]: &Bufs, _: *mut MPI_Request| {
        // SAFETY: as for MPI_Pack.
        unsafe { mpi_sys::PMPI_Unpack(*i, insize, position, *o, outcount, datatype, comm) }
    };
    let args = [inbuf.cast_mut(), outbuf];
    match checked(CALL, Some(comm), &[inbuf, outbuf.cast_const()]) {
        Err(code) => return code,
        Ok(false) => return pmpi(&args, std::ptr::null_mut()),
        Ok(true) => {}
    }
    let prepare = |c: &mut stage::Copies, [i, o]: Bufs| {
        let (Some(size), false) = (pack_size(outcount, datatype, comm), position.is_null()) else {
            return Ok([i, o]);
        };
        // SAFETY: the program's position (MPI's contract).
        let at = i64::from(unsafe { *position });
        let packed = packed_span(at, insize.into(), size);
        let typed = c.type_span(outcount.into(), datatype)?;
        Ok([
            c.span(i, packed, true, false)?,
            c.span(o, typed, false, true)?,
        ])
    };
    let bases = [inbuf, outbuf.cast_const()];
    // SAFETY: the program's arguments (MPI's contract).
    unsafe { stage::call(CALL, Scope::Local(comm), &bases, None, args, prepare, pmpi) }
}

/// # Safety
/// As `MPI_Pack_external`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Pack_external(
    datarep: *const c_char,
    inbuf: *const c_void,
    incount: c_int,
    datatype: MPI_Datatype,
    outbuf: *mut c_void,
    outsize: MPI_Aint,
    position: *mut MPI_Aint,
) -> c_int {
    const CALL: &str = "MPI_Pack_external";
    let pmpi = |[i, o]: &Bufs, _: *mut MPI_Request| {
        // SAFETY: as for MPI_Pack.
        unsafe {
            mpi_sys::PMPI_Pack_external(datarep, *i, incount, datatype, *o, outsize, position)
        }
    };
    let args = [inbuf.cast_mut(), outbuf];
    match checked(CALL, None, &[inbuf, outbuf.cast_const()]) {
        Err(code) => return code,
        Ok(false) => return pmpi(&args, std::ptr::null_mut()),
        Ok(true) => {}
    }
    let prepare = |c: &mut stage::Copies, [i, o]: Bufs| {
        // SAFETY: the program's string (MPI's contract).
        let size = unsafe { external_size(datarep, incount, datatype) };
        let (Some(size), false) = (size, position.is_null()) else {
            return Ok([i, o]);
        };
        // SAFETY: the program's position (MPI's contract).
        let at = unsafe { *position } as i64;
        let typed = c.type_span(incount.into(), datatype)?;
        let packed = packed_span(at, outsize as i64, size);
        Ok([
            c.span(i, typed, true, false)?,
            c.span(o, packed, true, true)?,
        ])
    };
    let bases = [inbuf, outbuf.cast_const()];
    // SAFETY: the program's arguments (MPI's contract).
    unsafe { stage::call(CALL, Scope::world(), &bases, None, args, prepare, pmpi) }
}

/// # Safety
/// As `MPI_Unpack_external`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Unpack_external(
    datarep: *const c_char,
    inbuf: *const c_void,
    insize: MPI_Aint,
    position: *mut MPI_Aint,
    outbuf: *mut c_void,
    outcount: c_int,
    datatype: MPI_Datatype,
) -> c_int {
    const CALL: &str = "MPI_Unpack_external";
    let pmpi = |[i, o]: &Bufs, _: *mut MPI_Request| {
        // SAFETY: as for MPI_Pack.
        unsafe {
            mpi_sys::PMPI_Unpack_external(datarep, *i, insize, position, *o, outcount, datatype)
        }
    };
    let args = [inbuf.cast_mut(), outbuf];
    match checked(CALL, None, &[inbuf, outbuf.cast_const()]) {
        Err(code) => return code,
        Ok(false) => return pmpi(&args, std::ptr::null_mut()),
        Ok(true) => {}
    }
    let prepare = |c: &mut stage::Copies, [i, o]: Bufs| {
        // SAFETY: the program's string (MPI's contract).
        let size = unsafe { external_size(datarep, outcount, datatype) };
        let (Some(size), false) = (size, position.is_null()) else {
            return Ok([i, o]);
        };
        // SAFETY: the program's position (MPI's contract).
        let at = unsafe { *position } as i64;
        let packed = packed_span(at, insize as i64, size);
        let typed = c.type_span(outcount.into(), datatype)?;
        Ok([
            c.span(i, packed, true, false)?,
            c.span(o, typed, false, true)?,
        ])
    };
    let bases = [inbuf, outbuf.cast_const()];
    // SAFETY: the program's arguments (MPI's contract).
    unsafe { stage::call(CALL, Scope::world(), &bases, None, args, prepare, pmpi) }
}

/// A large count or position as a C one: `MPI_ERR_COUNT` raised on `comm`
/// (`None`: `MPI_COMM_WORLD`) when it does not fit.
fn narrow(value: MPI_Count, comm: Option<MPI_Comm>) -> Result<c_int, c_int> {
    c_int::try_from(value).map_err(|_| {
        tracing::warn!(target: "gpucoll_mpi::large_count", "a count does not fit a C int");
        // SAFETY: reading an immutable handle constant.
        let comm = comm.unwrap_or(unsafe { mpi_sys::RSMPI_COMM_WORLD });
        crate::errors::raise(comm, mpi_sys::MPI_ERR_COUNT as c_int)
    })
}

/// Runs `call` with the C `int` position of a large `position`, and writes
/// the advanced position back.
///
/// # Safety
/// `position` is null or the program's readable and writable position.
unsafe fn with_position(
    position: *mut MPI_Count,
    comm: Option<MPI_Comm>,
    call: impl FnOnce(*mut c_int) -> c_int,
) -> c_int {
    if position.is_null() {
        return call(std::ptr::null_mut());
    }
    // SAFETY: per the contract.
    let mut at = match narrow(unsafe { *position }, comm) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let rc = call(&mut at);
    // SAFETY: per the contract.
    unsafe { *position = at.into() };
    rc
}

/// # Safety
/// As `MPI_Pack_c`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Pack_c(
    inbuf: *const c_void,
    incount: MPI_Count,
    datatype: MPI_Datatype,
    outbuf: *mut c_void,
    outsize: MPI_Count,
    position: *mut MPI_Count,
    comm: MPI_Comm,
) -> c_int {
    let (incount, outsize) = match (narrow(incount, Some(comm)), narrow(outsize, Some(comm))) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    // SAFETY: the program's arguments, the counts narrowed losslessly.
    unsafe {
        with_position(position, Some(comm), |p| {
            MPI_Pack(inbuf, incount, datatype, outbuf, outsize, p, comm)
        })
    }
}

/// # Safety
/// As `MPI_Unpack_c`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Unpack_c(
    inbuf: *const c_void,
    insize: MPI_Count,
    position: *mut MPI_Count,
    outbuf: *mut c_void,
    outcount: MPI_Count,
    datatype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    let (insize, outcount) = match (narrow(insize, Some(comm)), narrow(outcount, Some(comm))) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    // SAFETY: as for MPI_Pack_c.
    unsafe {
        with_position(position, Some(comm), |p| {
            MPI_Unpack(inbuf, insize, p, outbuf, outcount, datatype, comm)
        })
    }
}

/// # Safety
/// As `MPI_Pack_external_c`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Pack_external_c(
    datarep: *const c_char,
    inbuf: *const c_void,
    incount: MPI_Count,
    datatype: MPI_Datatype,
    outbuf: *mut c_void,
    outsize: MPI_Count,
    position: *mut MPI_Count,
) -> c_int {
    let incount = match narrow(incount, None) {
        Ok(n) => n,
        Err(code) => return code,
    };
    // MPI_Count and MPI_Aint are both 64-bit here.
    // SAFETY: as for MPI_Pack_c; the position is read and written as MPI_Aint.
    unsafe {
        MPI_Pack_external(
            datarep,
            inbuf,
            incount,
            datatype,
            outbuf,
            outsize as MPI_Aint,
            position as *mut MPI_Aint,
        )
    }
}

/// # Safety
/// As `MPI_Unpack_external_c`.
#[no_mangle]
pub unsafe extern "C" fn MPI_Unpack_external_c(
    datarep: *const c_char,
    inbuf: *const c_void,
    insize: MPI_Count,
    position: *mut MPI_Count,
    outbuf: *mut c_void,
    outcount: MPI_Count,
    datatype: MPI_Datatype,
) -> c_int {
    let outcount = match narrow(outcount, None) {
        Ok(n) => n,
        Err(code) => return code,
    };
    // SAFETY: as for MPI_Pack_external_c.
    unsafe {
        MPI_Unpack_external(
            datarep,
            inbuf,
            insize as MPI_Aint,
            position as *mut MPI_Aint,
            outbuf,
            outcount,
            datatype,
        )
    }
}

const _: () = assert!(std::mem::size_of::<MPI_Count>() == std::mem::size_of::<MPI_Aint>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_spans_stop_at_the_buffer_and_the_pack_size() {
        assert_eq!(
            packed_span(8, 100, 20),
            Span {
                lo: 8,
                hi: 28,
                dense: true
            }
        );
        assert_eq!(
            packed_span(90, 100, 20),
            Span {
                lo: 90,
                hi: 100,
                dense: true
            }
        );
        let past = packed_span(120, 100, 20);
        assert_eq!(past.hi - past.lo, 0);
    }
}

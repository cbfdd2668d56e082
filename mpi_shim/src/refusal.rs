//! What the shim cannot do on device memory over an MPI that knows nothing
//! about GPUs: one-sided communication (MPI reads and writes window memory
//! and origin buffers at any time until a later synchronization call) and
//! MPI-IO (its transfers run inside MPI's I/O layer). Such calls with a
//! device buffer are refused with `MPI_ERR_BUFFER` through the error
//! handler of their window, communicator or file, and a `tracing` warning
//! naming the call; host memory goes to `PMPI_` unchanged. In host test
//! mode with `GPUCOLL_SHIM_HOST_REFUSE=1` host buffers count as device
//! buffers, so the refusals are tested without a GPU.

use crate::cuda;
use crate::handles::is_in_place;
use crate::route;
use crate::settings;
use std::ffi::c_void;

/// Whether one of `buffers` (each with its element count; a count of 0 or
/// a null buffer is not touched) is device memory: then the call is
/// refused, and logged as such.
pub fn refused(call: &str, buffers: &[(*const c_void, i64)]) -> bool {
    if !settings::active() {
        return false;
    }
    let host_mode = settings::get().host_mode && settings::get().host_refuse;
    let mut why = None;
    for &(p, count) in buffers {
        if count <= 0 || p.is_null() || is_in_place(p) {
            continue;
        }
        if cuda::device_of(p).is_some() {
            why = Some("device memory: one-sided and MPI-IO calls cannot take it");
            break;
        }
        if host_mode {
            why = Some("host memory, test mode: refused as device memory is");
        }
    }
    let hit = why.is_some();
    if let Some(why) = why {
        tracing::warn!(
            call,
            "device memory in one-sided communication or MPI-IO: MPI_ERR_BUFFER (the MPI library \
             cannot access it)"
        );
        route::log(call, "refused", why);
    }
    hit
}

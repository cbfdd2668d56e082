//! The kernel module: the fatbin built by `build.rs`, loaded once per
//! backend, and its entry points by datatype.

use super::abi::kernel_dtype;
use super::driver::{self, CUfunction};
use super::handles::Module;
use crate::datatype::Datatype;
use crate::error::{Error, Result};

static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpucoll_kernels.fatbin"));

/// The loaded module and its kernels, indexed by `Datatype as usize`; a
/// signed integer type's entry is its unsigned kernel (`abi::kernel_dtype`).
pub(super) struct Kernels {
    /// Step interpreter (`gc_run_*`).
    pub steps: [CUfunction; 10],
    /// One-shot all_reduce kernels (`gc_oneshot_*`).
    pub direct: [CUfunction; 10],
    /// Collectives on registered buffers (`gc_peer_*`).
    pub peer: [CUfunction; 10],
    /// The resident block of blocking one-shots (`gc_resident`, every datatype).
    pub resident: CUfunction,
    /// Unloaded last: the functions above belong to it.
    _module: Module,
}

// SAFETY: function handles of a loaded module are usable from any thread
// once the context is bound (every entry point binds it); never mutated.
unsafe impl Send for Kernels {}
// SAFETY: as above.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Load the module into the current context and look up every kernel.
    pub(super) fn load() -> Result<Kernels> {
        // cuModuleLoadData wants an aligned image; the embedded bytes are not.
        let mut image = vec![0u64; FATBIN.len().div_ceil(8) + 1];
        // SAFETY: the vector holds at least FATBIN.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                FATBIN.as_ptr(),
                image.as_mut_ptr() as *mut u8,
                FATBIN.len(),
            )
        };
        // SAFETY: u64 storage viewed as bytes, same allocation and length.
        let bytes =
            unsafe { std::slice::from_raw_parts(image.as_ptr() as *const u8, FATBIN.len()) };
        // Unloaded by its Drop if a lookup below fails.
        let module = Module::load(bytes)?;
        let mut steps = [std::ptr::null_mut(); 10];
        let mut direct = [std::ptr::null_mut(); 10];
        let mut peer = [std::ptr::null_mut(); 10];
        for d in Datatype::ALL {
            let k = kernel_dtype(d).rust_name();
            for (name, table) in [
                (format!("gc_run_{k}"), &mut steps),
                (format!("gc_oneshot_{k}"), &mut direct),
                (format!("gc_peer_{k}"), &mut peer),
            ] {
                let name = std::ffi::CString::new(name)
                    .map_err(|_| Error::Backend("kernel name".into()))?;
                table[d as usize] = driver::module_function(module.raw(), &name)?;
            }
        }
        let resident = driver::module_function(module.raw(), c"gc_resident")?;
        Ok(Kernels {
            steps,
            direct,
            peer,
            resident,
            _module: module,
        })
    }
}

//! Staging: host buffers are copied into device memory for the kernels
//! (and outputs copied back on completion); device buffers of this GPU pass
//! through.

use super::cache::Resources;
use super::driver;
use super::lower::Mem;
use super::memory::DevMem;
use super::state::CudaShared;
use crate::buffer::{MemoryKind, RawBuffer};
use crate::error::{Error, Result};

impl CudaShared {
    fn check_kind(&self, b: &RawBuffer, what: &str, seq: u64) -> Result<()> {
        match b.memory {
            MemoryKind::Device { ordinal } if ordinal != self.ctx.ordinal && b.len > 0 => {
                Err(Error::WrongMemory(format!(
                    "the {what} buffer of collective #{seq} is on GPU {ordinal}, but this \
                     communicator's rank runs on GPU {}",
                    self.ctx.ordinal
                )))
            }
            _ => Ok(()),
        }
    }

    /// Stage host memory into device memory; device buffers pass through.
    pub(super) fn resolve(
        &self,
        input: &RawBuffer,
        output: &RawBuffer,
        seq: u64,
        res: &mut Resources,
    ) -> Result<(Mem, Mem)> {
        self.check_kind(input, "input", seq)?;
        self.check_kind(output, "output", seq)?;
        let empty = |b: &RawBuffer| b.len == 0 || b.addr == 0;
        let bytes = |b: &RawBuffer| -> Result<usize> {
            usize::try_from(b.bytes()).map_err(|_| Error::CountTooLarge(b.len))
        };
        let host = |b: &RawBuffer| !empty(b) && b.memory == MemoryKind::Host;
        let direct = |b: &RawBuffer| {
            if empty(b) {
                Mem::default()
            } else {
                Mem {
                    addr: b.addr,
                    elems: b.len,
                }
            }
        };
        let stage = |lo: u64, n: usize, res: &mut Resources| -> Result<u64> {
            let m = DevMem::alloc(n)?;
            // SAFETY: the caller's host range [lo, lo+n) is valid for reads
            // (Backend::submit contract); the block holds n bytes.
            unsafe { driver::memcpy_htod(m.ptr, lo as usize as *const u8, n)? };
            let p = m.ptr;
            res.mems.push(m);
            Ok(p)
        };
        match (host(input), host(output)) {
            (false, false) => Ok((direct(input), direct(output))),
            (true, true) if input.overlaps(output) || input.addr == output.addr => {
                let lo = input.addr.min(output.addr);
                let hi = (input.addr + input.bytes()).max(output.addr + output.bytes());
                let n = usize::try_from(hi - lo).map_err(|_| Error::CountTooLarge(hi - lo))?;
                let d = stage(lo, n, res)?;
                res.copy_back
                    .push((output.addr, d + (output.addr - lo), bytes(output)?));
                Ok((
                    Mem {
                        addr: d + (input.addr - lo),
                        elems: input.len,
                    },
                    Mem {
                        addr: d + (output.addr - lo),
                        elems: output.len,
                    },
                ))
            }
            (hi, ho) => {
                let i = if hi {
                    Mem {
                        addr: stage(input.addr, bytes(input)?, res)?,
                        elems: input.len,
                    }
                } else {
                    direct(input)
                };
                let o = if ho {
                    let d = stage(output.addr, bytes(output)?, res)?;
                    res.copy_back.push((output.addr, d, bytes(output)?));
                    Mem {
                        addr: d,
                        elems: output.len,
                    }
                } else {
                    direct(output)
                };
                Ok((i, o))
            }
        }
    }
}

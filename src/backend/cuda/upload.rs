//! Upload of a submission's tables: the step and channel tables (through
//! the step cache when small), or a group's tables in one work buffer. The
//! copies are queued on the submission's stream ahead of its kernels.

use super::abi::{GcArgs, GcChan, GcStep};
use super::cache::Resources;
use super::cache::{CachedSteps, STEP_CACHE_MAX_BYTES};
use super::driver::{self, CUstream};
use super::lower::{group_parts, Item, Lowered};
use super::state::CudaShared;
use crate::datatype::Datatype;
use crate::error::Result;
use std::sync::Arc;

impl CudaShared {
    /// Upload the tables of a group launch in one work buffer held by
    /// `res`: the steps, then per datatype (in order of first appearance)
    /// the per-block descriptors, the entries and the calls' arguments. One
    /// launch per datatype: the step interpreter of that datatype with
    /// `items`/`entries` set, returned as `(dtype, args, blocks)`.
    pub(super) fn upload_group(
        &self,
        steps: &[GcStep],
        chans: &[GcChan],
        launches: &[Item],
        res: &mut Resources,
        stream: CUstream,
        captured: bool,
    ) -> Result<Vec<(Datatype, GcArgs, u32)>> {
        let mut parts = group_parts(chans, launches)?;
        let sbytes = std::mem::size_of_val(steps);
        let total = sbytes
            + parts
                .iter()
                .map(|p| {
                    std::mem::size_of_val(p.blocks.as_slice())
                        + std::mem::size_of_val(p.entries.as_slice())
                        + std::mem::size_of_val(p.items.as_slice())
                })
                .sum::<usize>();
        let work = self.store.take_work(total)?;
        let dbase = work.dev.ptr;
        let mut at = 0usize;
        let mut put = |src: *const u8, len: usize| -> u64 {
            // SAFETY: `src` is a live repr(C) slice of `len` bytes (no
            // padding: sizes asserted in abi.rs); the pinned buffer holds
            // `total` bytes, the sum of every part, and is ours until this
            // submission completed.
            unsafe { std::ptr::copy_nonoverlapping(src, work.host.host.add(at), len) };
            let dev = dbase + at as u64;
            at += len;
            dev
        };
        put(steps.as_ptr() as *const u8, sbytes);
        let mut out = Vec::with_capacity(parts.len());
        for p in parts.iter_mut() {
            for a in p.items.iter_mut() {
                a.steps = dbase;
                a.chans = 0;
                a.items = 0;
                a.entries = 0;
            }
            let dblocks = put(
                p.blocks.as_ptr() as *const u8,
                std::mem::size_of_val(p.blocks.as_slice()),
            );
            let dentries = put(
                p.entries.as_ptr() as *const u8,
                std::mem::size_of_val(p.entries.as_slice()),
            );
            let ditems = put(
                p.items.as_ptr() as *const u8,
                std::mem::size_of_val(p.items.as_slice()),
            );
            let mut head = p.items[0];
            head.chans = dblocks;
            head.entries = dentries;
            head.items = ditems;
            out.push((p.dtype, head, p.blocks.len() as u32));
        }
        self.copy_tables(dbase, work.host.host, total, stream, captured)?;
        res.work = Some(work);
        Ok(out)
    }

    /// Copy `total` bytes of tables from pinned `host` to `dev` ahead of the
    /// kernels on `stream`. While `stream` is being captured the copy is
    /// made now, on our own stream, and waited for: the graph then holds
    /// only the kernels (a copy node in it would run at every replay).
    fn copy_tables(
        &self,
        dev: u64,
        host: *mut u8,
        total: usize,
        stream: CUstream,
        captured: bool,
    ) -> Result<()> {
        let on = if captured { self.stream.raw() } else { stream };
        // SAFETY: both buffers hold `total` bytes and stay allocated until
        // the kernels that read the copy completed (the submission's
        // resources, or the backend's for a captured graph); kernels queued
        // after the copy on the same stream read it, and a captured copy is
        // complete before this returns.
        unsafe { driver::memcpy_htod_async(dev, host, total, on)? };
        if captured {
            driver::stream_synchronize(on)?;
        }
        Ok(())
    }

    /// Upload the step and channel tables of a submission that is not a
    /// group launch and point its step items at them. Small tables go
    /// through the step cache, unless `captured`: a captured kernel reads
    /// its table at every replay, so it gets its own upload, kept for the
    /// backend's life, never a cache entry that could be evicted and reused.
    pub(super) fn upload_steps(
        &self,
        lowered: &mut Lowered,
        res: &mut Resources,
        stream: CUstream,
        captured: bool,
    ) -> Result<()> {
        let (steps, chans) = (&lowered.steps, &lowered.chans);
        let sbytes = std::mem::size_of_val(steps.as_slice());
        let cbytes = std::mem::size_of_val(chans.as_slice());
        let total = sbytes + cbytes;
        // SAFETY: repr(C) structs without padding (sizes asserted in abi.rs,
        // every field initialized), viewed as bytes within their lengths.
        let (sb, cb) = unsafe {
            (
                std::slice::from_raw_parts(steps.as_ptr() as *const u8, sbytes),
                std::slice::from_raw_parts(chans.as_ptr() as *const u8, cbytes),
            )
        };
        let hit = if total <= STEP_CACHE_MAX_BYTES && !captured {
            let mut bytes = Vec::with_capacity(total);
            bytes.extend_from_slice(sb);
            bytes.extend_from_slice(cb);
            match self.store.cached(&bytes) {
                Some(c) => Some(c),
                None => {
                    let work = self.store.take_work(total)?;
                    // SAFETY: the pinned buffer holds at least `total` bytes;
                    // the device copy is read only by kernels queued after
                    // this copy on the same stream; the entry is never
                    // written again.
                    unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), work.host.host, total);
                        driver::memcpy_htod_async(work.dev.ptr, work.host.host, total, stream)?;
                    }
                    let c = Arc::new(CachedSteps { work, len: total });
                    self.store.keep(c.clone());
                    Some(c)
                }
            }
        } else {
            None
        };
        let dbase = match hit {
            Some(c) => {
                let p = c.work.dev.ptr;
                res.cached = Some(c);
                p
            }
            None => {
                let work = self.store.take_work(total)?;
                // SAFETY: the pinned buffer holds at least `total` bytes and
                // is ours until this submission completed (it returns to
                // the pool then).
                unsafe {
                    std::ptr::copy_nonoverlapping(sb.as_ptr(), work.host.host, sbytes);
                    std::ptr::copy_nonoverlapping(cb.as_ptr(), work.host.host.add(sbytes), cbytes);
                }
                self.copy_tables(work.dev.ptr, work.host.host, total, stream, captured)?;
                let p = work.dev.ptr;
                res.work = Some(work);
                p
            }
        };
        let (dsteps, dchans) = (dbase, dbase + sbytes as u64);
        for item in lowered.items.iter_mut() {
            if let Item::Steps {
                first_chan, args, ..
            } = item
            {
                args.steps = dsteps;
                args.chans = dchans + (*first_chan * std::mem::size_of::<GcChan>()) as u64;
            }
        }
        Ok(())
    }
}

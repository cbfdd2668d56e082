//! Buffer registration: `comm.register(&buf)` tells the peers, once, about
//! a device buffer the program will use in many collectives, so that they
//! keep it mapped instead of finding it in a bounded cache.
//!
//! Without registration every buffer still works: copy-engine collectives
//! open a peer's receive buffer the first time they see its allocation
//! and keep at most 32 such mappings (1 GiB together), closing the least
//! recently used ones. A program cycling through more buffers than that
//! (a model's gradient buckets, pipeline stages) pays for opening them
//! again; one that registers them does not.
//!
//! Registered buffers also change how the SM kernels move data: once
//! every rank registered the buffers of an all_reduce, reduce_scatter,
//! all_gather or broadcast of 4 MiB or more (`GPUCOLL_REGISTERED=auto`),
//! one kernel reads the peers' inputs and writes straight into their
//! outputs, with no FIFO and no receive copy.

use super::raw::classify;
use crate::backend::Registered;
use crate::buffer::{Buffer, RawBuffer};
use crate::comm::Communicator;
use crate::datatype::Datatype;
use crate::error::Result;
use std::ffi::c_void;
use std::fmt;

/// A buffer registered with a communicator's peers
/// ([`Communicator::register`]); dropping it ends the registration on
/// this rank.
///
/// It does not borrow the buffer, so the buffer stays free for the
/// collectives it was registered for. Dropping the buffer first is safe:
/// peers that still have its allocation mapped keep that memory alive
/// until they drop their own registrations, and a new allocation at the
/// same address is told apart (by the driver's handle) and never reached
/// through the old mapping.
pub struct Registration {
    comm: Communicator,
    done: Option<Registered>,
    bytes: u64,
}

impl Registration {
    /// Whether peers write into the buffer directly. False where the
    /// backend maps no peer memory (the host backend, several nodes, no
    /// P2P between the GPUs) and for memory the driver cannot share with
    /// other processes (allocations under 2 MiB, which it packs into
    /// shared blocks, memory pools, managed memory, `cuMemCreate` memory
    /// created without `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, a
    /// buffer across several `cuMemCreate` allocations mapped back to
    /// back): those are received through a bounce buffer, as they would
    /// be without registration.
    ///
    /// `cuMemCreate` memory that can be exported as a file descriptor is
    /// shared by passing the descriptor to the other ranks of the node
    /// (also without registration, from the second copy-engine call that
    /// receives into it). The peers keep it mapped while it is shared: a
    /// registration's share ends with the owner's last registration of
    /// it, a copy-engine call's once the owner sees the memory freed, and
    /// the peers release it at their next registration or copy-engine
    /// call on the communicator, or at its end (the pages stay allocated
    /// until then). A rank shares at most 64 such allocations per
    /// communicator at once (beyond that, not direct).
    pub fn is_direct(&self) -> bool {
        self.done.is_some_and(|r| r.direct)
    }

    /// Bytes registered.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// End the registration now (what dropping it does).
    pub fn deregister(self) {}
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(r) = self.done.take() {
            self.comm.inner.engine.deregister(r.id);
        }
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("rank", &self.comm.rank())
            .field("bytes", &self.bytes)
            .field("direct", &self.is_direct())
            .finish()
    }
}

impl Communicator {
    /// Register `buf` with every peer of this communicator, for as long as
    /// the returned [`Registration`] lives.
    ///
    /// **Collective**: every rank calls it at the same point of its
    /// sequence of collectives (each with a buffer of its own, of any
    /// size), as with `ncclCommRegister`. A rank that calls another
    /// collective there ends, with its peers, in an error after
    /// `GPUCOLL_TIMEOUT`. Dropping the registration is local and may
    /// happen at any time.
    ///
    /// Registration is never needed for correctness. It keeps the peers'
    /// mappings of the buffer's allocation open, so a collective receiving
    /// into it never pays for opening it again however many other buffers
    /// came and went (unregistered buffers share a cache of 32 mappings);
    /// [`Registration::is_direct`] says whether peers write into it
    /// directly. When every rank registered the buffers of an all_reduce,
    /// reduce_scatter, all_gather or broadcast of at least 4 MiB, it runs
    /// as one kernel reading the peers' inputs and writing into their
    /// outputs (`GPUCOLL_REGISTERED`, README). Where the backend maps no
    /// peer memory it only checks the memory and returns a registration
    /// that does nothing.
    ///
    /// ```no_run
    /// use gpucoll::prelude::*;
    ///
    /// let universe = gpucoll::initialize()?;
    /// let world = universe.world()?;
    /// let n = 1 << 20;
    /// let mine = world.alloc_from(&vec![world.rank() as f32; n])?;
    /// let mut all = world.alloc::<f32>(n * world.size())?;
    /// let reg = world.register(&all)?; // on every rank
    /// for _ in 0..100 {
    ///     world.all_gather_into(&mine, &mut all)?;
    /// }
    /// drop(reg);
    /// # Ok::<(), gpucoll::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::WrongMemory`](crate::Error::WrongMemory) for memory that
    /// cannot be registered here (host memory, or another GPU's, on a
    /// GPU communicator: this rank still takes part, so its peers finish
    /// theirs); [`Error::CommunicatorFreed`](crate::Error::CommunicatorFreed);
    /// the communicator's failure; the failures of a collective (timeout,
    /// a peer that called something else or died).
    pub fn register<B: Buffer + ?Sized>(&self, buf: &B) -> Result<Registration> {
        self.register_buffer(buf.raw())
    }

    /// [`register`](Self::register) for `bytes` of memory at `ptr` (device
    /// memory of this communicator's GPU, for the raw entry points' users).
    /// Safe: registering reads and writes nothing; only the collectives
    /// later given the buffer do, under their own contract.
    pub fn register_raw(&self, ptr: *const c_void, bytes: usize) -> Result<Registration> {
        let addr = ptr as usize as u64;
        let memory = classify(addr, bytes as u64, "registered")?;
        self.register_buffer(RawBuffer {
            addr,
            len: bytes as u64,
            dtype: Datatype::U8,
            memory,
        })
    }

    fn register_buffer(&self, buf: RawBuffer) -> Result<Registration> {
        let inner = self.inner_checked()?;
        let done = inner.engine.register(&buf)?;
        Ok(Registration {
            comm: self.clone(),
            done,
            bytes: buf.bytes(),
        })
    }
}

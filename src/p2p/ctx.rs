//! What every message of a communicator reads and never changes: its two
//! MPI communicators and tag scheme ([`Wire`]), its rank and device side
//! ([`Ctx`]); and an envelope taken out of MPI ([`Arrived`]).

use super::envelope::Envelope;
use super::Status;
use crate::backend::DeviceMoves;
use crate::error::Result;
use crate::mpi::MpiComm;
use std::sync::Arc;

/// The MPI side of messages: envelopes on one communicator (the user's
/// tags, so MPI matches them), data and completions on another (tags of
/// the pair's sequence numbers: even for data, odd for completions).
pub(crate) struct Wire {
    pub env: MpiComm,
    pub data: MpiComm,
    /// Sequence numbers wrap at this many (half the data tags).
    half: u64,
    pub tag_ub: i32,
}

impl Wire {
    /// Over `env` and `data`, two communicators of the same ranks that
    /// nothing else uses.
    pub fn new(env: MpiComm, data: MpiComm) -> Result<Wire> {
        let tag_ub = env.tag_ub()?;
        let half = (data.tag_ub()? as u64).div_ceil(2);
        Ok(Wire {
            env,
            data,
            half,
            tag_ub,
        })
    }

    pub fn data_tag(&self, seq: u64) -> i32 {
        ((seq % self.half) * 2) as i32
    }

    pub fn fin_tag(&self, seq: u64) -> i32 {
        ((seq % self.half) * 2 + 1) as i32
    }
}

/// What every message of the communicator reads and never changes.
pub(crate) struct Ctx {
    pub rank: usize,
    pub wire: Wire,
    /// `GPUCOLL_P2P_EAGER`: device messages up to this many bytes go
    /// buffered (inline) instead of pulled.
    pub eager: u64,
    /// The device side (CUDA backend), None on the host backend.
    pub moves: Option<Arc<dyn DeviceMoves>>,
}

/// An envelope taken out of MPI, not matched yet.
#[derive(Debug, Clone)]
pub(crate) struct Arrived {
    pub source: usize,
    pub tag: i32,
    pub env: Envelope,
}

impl Arrived {
    pub fn status(&self) -> Status {
        Status {
            source: self.source,
            tag: self.tag,
            bytes: self.env.bytes,
        }
    }
}

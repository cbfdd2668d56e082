//! The plan validator both backends run before executing a plan: a plan
//! that would touch memory outside the call's buffers, name a peer that
//! does not exist, or write through the caller's input fails with a clear
//! error instead of corrupting memory.

use crate::error::{Error, Result};
use crate::plan::{BufId, Plan, Region, Step};

/// The error for step `step` of channel `ch` of collective `seq`.
pub(crate) fn plan_error(seq: u64, ch: usize, step: usize, msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!(
        "invalid plan for collective #{seq}, channel {ch}, step {step}: {msg}"
    ))
}

/// What a plan may use on this rank for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub rank: usize,
    pub nranks: usize,
    /// Channels the backend has.
    pub channels: usize,
    /// Elements of the input, output and scratch buffers (0 for a buffer
    /// that is absent).
    pub input_elems: u64,
    pub output_elems: u64,
    pub scratch_elems: u64,
    /// Whether a step may write through the input (in place: input and
    /// output are the same memory).
    pub input_writable: bool,
    /// This rank's rail (its local index) when the backend runs
    /// [`Step::Rail`]; None when it has no inter-node collective.
    pub rail: Option<u32>,
}

impl Limits {
    fn elems(&self, b: BufId) -> u64 {
        match b {
            BufId::Input => self.input_elems,
            BufId::Output => self.output_elems,
            BufId::Scratch => self.scratch_elems,
        }
    }
}

/// Check every step of `plan` (collective `seq`) against `lim`.
pub(crate) fn validate(plan: &Plan, seq: u64, lim: &Limits) -> Result<()> {
    for cw in &plan.channels {
        let ch = cw.channel;
        if ch >= lim.channels {
            return Err(plan_error(
                seq,
                ch,
                0,
                format!("only {} channels", lim.channels),
            ));
        }
        for (i, step) in cw.steps.iter().enumerate() {
            let err = |msg: String| plan_error(seq, ch, i, msg);
            let region = |r: Region, count: u64, write: bool| -> Result<()> {
                let elems = lim.elems(r.buf);
                if r.offset.checked_add(count).map_or(true, |end| end > elems) {
                    return Err(err(format!(
                        "elements {}..{} of the {:?} buffer, which holds {elems}",
                        r.offset,
                        r.offset.saturating_add(count),
                        r.buf,
                    )));
                }
                if write && r.buf == BufId::Input && !lim.input_writable {
                    return Err(err("writes into the input buffer".into()));
                }
                Ok(())
            };
            let peer = |p: usize| -> Result<()> {
                if p >= lim.nranks {
                    return Err(err(format!("peer {p} of {} ranks", lim.nranks)));
                }
                Ok(())
            };
            match step {
                Step::Flow(f) => {
                    let inputs = f.recv.len() + f.src.is_some() as usize;
                    let outputs = f.send.len() + f.dst.is_some() as usize;
                    if !f.reduce && inputs > 1 {
                        return Err(err("copy with several inputs".into()));
                    }
                    if inputs == 0 && (outputs > 0 || f.count > 0) {
                        return Err(err("flow without input".into()));
                    }
                    if f.acc && (!f.reduce || f.dst.is_none() || !f.send.is_empty()) {
                        return Err(err(
                            "an accumulating flow must reduce into dst and send nothing".into(),
                        ));
                    }
                    for p in f.recv.iter().chain(f.send.iter()) {
                        peer(p)?;
                        if p == lim.rank {
                            return Err(err("flow to or from itself".into()));
                        }
                    }
                    if let Some(r) = f.src {
                        region(r, f.count, false)?;
                    }
                    if let Some(r) = f.dst {
                        region(r, f.count, true)?;
                    }
                }
                Step::Exchange {
                    to,
                    src,
                    from,
                    dst,
                    count,
                } => {
                    peer(*to)?;
                    peer(*from)?;
                    region(*src, *count, false)?;
                    region(*dst, *count, true)?;
                }
                Step::Rail {
                    region: r,
                    count,
                    rail,
                } => {
                    match lim.rail {
                        None => {
                            return Err(err(
                                "a rail step (collnet), which this backend does not run".into(),
                            ))
                        }
                        Some(mine) if mine != *rail => {
                            return Err(err(format!(
                                "rail {rail}, but this rank's local index is {mine}"
                            )))
                        }
                        Some(_) => {}
                    }
                    region(*r, *count, true)?;
                }
            }
        }
    }
    Ok(())
}

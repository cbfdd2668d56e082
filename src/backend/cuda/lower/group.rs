//! Grouped launches: a group's step items split into one launch per
//! kernel datatype, one block per channel, whose entries walk the calls'
//! step ranges in call order; and the order their rail steps meet NET's
//! proxy in.

use super::Item;
use crate::backend::cuda::abi::{kernel_dtype, GcArgs, GcChan, GcGroupEntry};
use crate::backend::cuda::net::RailJob;
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// The tables of one datatype's launch in a group: the calls' arguments,
/// one descriptor per block (channel) and the entries it walks.
pub(in crate::backend::cuda) struct GroupPart {
    pub dtype: Datatype,
    pub items: Vec<GcArgs>,
    pub blocks: Vec<GcChan>,
    pub entries: Vec<GcGroupEntry>,
}

/// The order in which a group launch's kernels meet their rail steps on a
/// channel: [`group_parts`] runs one launch per kernel datatype, in order
/// of first appearance, each walking its calls in call order. `jobs` come
/// in call order; a stable sort by the launch of their datatype gives the
/// order the proxy sees their pieces in.
pub(in crate::backend::cuda) fn group_rail_order(jobs: &mut [(usize, RailJob)], items: &[Item]) {
    let mut order: Vec<Datatype> = Vec::new();
    for i in items {
        if let Item::Steps { dtype, .. } = i {
            if !order.contains(dtype) {
                order.push(*dtype);
            }
        }
    }
    jobs.sort_by_key(|(_, j)| {
        let k = kernel_dtype(j.dtype);
        order.iter().position(|d| *d == k).unwrap_or(order.len())
    });
}

/// Split a group's step items by datatype (in order of first appearance):
/// one launch per datatype, one block per channel used, whose entries name
/// the calls' step ranges on that channel in call order (every rank orders
/// them alike). Every item must be a step-plan item.
pub(in crate::backend::cuda) fn group_parts(
    chans: &[GcChan],
    items: &[Item],
) -> Result<Vec<GroupPart>> {
    let mut parts: Vec<GroupPart> = Vec::new();
    for dt in items.iter().filter_map(|i| match i {
        Item::Steps { dtype, .. } => Some(*dtype),
        Item::OneShot { .. } | Item::Copy(_) | Item::Local { .. } | Item::Peer(_) => None,
    }) {
        if parts.iter().any(|p| p.dtype == dt) {
            continue;
        }
        let mut per_channel: BTreeMap<u32, Vec<GcGroupEntry>> = BTreeMap::new();
        let mut args: Vec<GcArgs> = Vec::new();
        for item in items {
            let Item::Steps {
                first_chan,
                nchans,
                args: a,
                dtype,
            } = item
            else {
                return Err(Error::Backend(
                    "a group launch holds a one-shot item".into(),
                ));
            };
            if *dtype != dt {
                continue;
            }
            let idx = args.len() as u32;
            args.push(*a);
            for c in &chans[*first_chan..*first_chan + *nchans] {
                per_channel
                    .entry(c.channel)
                    .or_default()
                    .push(GcGroupEntry {
                        item: idx,
                        pad: 0,
                        first: c.first,
                        nsteps: c.nsteps,
                    });
            }
        }
        let mut entries: Vec<GcGroupEntry> = Vec::new();
        let mut blocks: Vec<GcChan> = Vec::new();
        for (channel, list) in per_channel {
            blocks.push(GcChan {
                channel,
                first: entries.len() as u32,
                nsteps: list.len() as u32,
                pad: 0,
            });
            entries.extend(list);
        }
        parts.push(GroupPart {
            dtype: dt,
            items: args,
            blocks,
            entries,
        });
    }
    Ok(parts)
}

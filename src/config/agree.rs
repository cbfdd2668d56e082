//! Ranks agree on the settings that steer planning before a communicator
//! is built: a rank whose plan differs from its peers' would wait for
//! messages they never send. Each rank sends a digest of every field of
//! [`FIELDS`]; all fail alike, naming the variable, when any rank could
//! not parse its variables or differs from rank 0.
//!
//! Settings outside the table only change how one rank works (its GPU,
//! its channel count on the CUDA backend, its profiling), not what its
//! peers see.

use super::Config;
use crate::error::{Error, Result};
use crate::mpi::words::{decode_u64s, encode_u64s, fnv1a};
use crate::mpi::MpiComm;

type Shown = fn(&Config) -> String;

fn shown<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "(unset)".into())
}

/// The settings every rank must set alike, by variable name, with how a
/// value is shown in the error.
const FIELDS: &[(&str, Shown)] = &[
    ("GPUCOLL_ALGO", |c| shown(c.algo.map(|a| a.name()))),
    ("GPUCOLL_PROTO", |c| shown(c.proto.map(|p| p.name()))),
    ("GPUCOLL_NCHANNELS", |c| shown(c.nchannels)),
    ("GPUCOLL_CHECK", |c| u8::from(c.check).to_string()),
    ("GPUCOLL_SIM_NODES", |c| shown(c.sim_nodes)),
    ("GPUCOLL_TIMEOUT", |c| c.timeout.as_secs_f64().to_string()),
    ("GPUCOLL_BACKEND", |c| shown(c.backend.as_ref())),
    ("GPUCOLL_HOST_SLOT_BYTES", |c| shown(c.host_slot_bytes)),
    ("GPUCOLL_P2P_DISABLE", |c| {
        u8::from(c.p2p_disable).to_string()
    }),
    ("GPUCOLL_CE", |c| c.ce.name().to_string()),
    ("GPUCOLL_REGISTERED", |c| c.registered.name().to_string()),
    ("GPUCOLL_LEGACY_STREAM_ORDER", |c| {
        u8::from(c.legacy_stream_order).to_string()
    }),
    // The id itself is per rank; whether it is set must agree.
    ("GPUCOLL_NODE_ID", |c| {
        if c.node_id.is_some() {
            "(set)"
        } else {
            "(unset)"
        }
        .to_string()
    }),
];

/// Per-rank record of the exchange: a status word, then one digest per field.
const RECORD: usize = 8 * (1 + FIELDS.len());

fn digest(c: &Config) -> Vec<u64> {
    FIELDS
        .iter()
        .map(|(name, show)| fnv1a(&[name.as_bytes(), show(c).as_bytes()]))
        .collect()
}

/// The first field (index) on which some rank differs from rank 0, and that rank.
fn find_mismatch(digests: &[Vec<u64>]) -> Option<(usize, usize)> {
    let first = digests.first()?;
    (0..first.len()).find_map(|field| {
        digests
            .iter()
            .position(|d| d.get(field) != first.get(field))
            .map(|rank| (field, rank))
    })
}

/// Exchange the digests over `mpi` and fail on every rank if any rank
/// could not parse its variables or if ranks disagree. Always takes part
/// in the exchange, so no rank is left waiting.
pub(crate) fn agree(mpi: &MpiComm, mine: Result<Config>) -> Result<Config> {
    let mut record = Vec::with_capacity(1 + FIELDS.len());
    match &mine {
        Ok(c) => {
            record.push(0);
            record.extend(digest(c));
        }
        Err(_) => {
            record.push(1);
            record.extend(std::iter::repeat(0).take(FIELDS.len()));
        }
    }
    let all = mpi.allgather_bytes(&encode_u64s(&record))?;
    let config = mine?;
    let records: Vec<Vec<u64>> = all.chunks_exact(RECORD).map(decode_u64s).collect();
    if let Some(bad) = records.iter().position(|r| r.first() != Some(&0)) {
        return Err(Error::Config {
            name: "GPUCOLL_*",
            value: "?".into(),
            reason: format!("rank {bad} has an invalid GPUCOLL_* variable (see its error)"),
        });
    }
    let digests: Vec<Vec<u64>> = records.into_iter().map(|r| r[1..].to_vec()).collect();
    if let Some((field, rank)) = find_mismatch(&digests) {
        let (name, show) = FIELDS[field];
        return Err(Error::Config {
            name,
            value: show(&config),
            reason: format!(
                "ranks 0 and {rank} disagree on this setting; every rank must use the same value"
            ),
        });
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn field_of(a: &Config, b: &Config) -> Option<&'static str> {
        find_mismatch(&[digest(a), digest(b)]).map(|(f, _)| FIELDS[f].0)
    }

    #[test]
    fn digest_names_the_variable() {
        let a = Config::default();
        let mut b = a.clone();
        b.nchannels = Some(4);
        assert_eq!(find_mismatch(&[digest(&a), digest(&a)]), None);
        let (field, rank) = find_mismatch(&[digest(&a), digest(&a), digest(&b)]).unwrap();
        assert_eq!((FIELDS[field].0, rank), ("GPUCOLL_NCHANNELS", 2));
        let mut c = a.clone();
        c.timeout = Duration::from_secs(5);
        assert_eq!(field_of(&a, &c), Some("GPUCOLL_TIMEOUT"));
        // The node id itself may differ per rank; whether it is set may not.
        let mut d = a.clone();
        d.node_id = Some(1);
        let mut e = a.clone();
        e.node_id = Some(2);
        assert_eq!(field_of(&d, &e), None);
        assert_eq!(field_of(&a, &d), Some("GPUCOLL_NODE_ID"));
        let mut p = a.clone();
        p.p2p_disable = true;
        assert_eq!(field_of(&a, &p), Some("GPUCOLL_P2P_DISABLE"));
        assert_eq!(digest(&a).len(), FIELDS.len());
    }

    #[test]
    fn every_variable_is_listed_once() {
        let mut names: Vec<&str> = FIELDS.iter().map(|f| f.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FIELDS.len());
        assert!(names.iter().all(|n| n.starts_with("GPUCOLL_")));
    }
}

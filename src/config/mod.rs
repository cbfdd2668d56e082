//! Environment variables that steer gpucoll, read once per communicator.
//! Every `GPUCOLL_*` variable is read here but one: `GPUCOLL_LOG`, read by
//! `mpi/runtime.rs`, because the log subscriber is installed once per
//! process when MPI starts, before any communicator (and its `Config`)
//! exists. Which settings ranks must share is `agree.rs`'s table.
//!
//! Set them before the communicator is created (usually in the job script);
//! [`Config::from_env`] shows what a communicator would read:
//!
//! ```
//! use gpucoll::Config;
//! use std::time::Duration;
//!
//! std::env::set_var("GPUCOLL_TIMEOUT", "60");
//! std::env::set_var("GPUCOLL_CHECK", "1");
//! let c = Config::from_env()?;
//! assert_eq!((c.timeout, c.check), (Duration::from_secs(60), true));
//! # Ok::<(), gpucoll::Error>(())
//! ```

mod agree;

pub(crate) use agree::agree;

use crate::error::{Error, Result};
use crate::tune::{Algorithm, Protocol};
use std::time::Duration;

/// Default for `GPUCOLL_TIMEOUT` (seconds without progress before a
/// collective fails).
///
/// ```
/// use gpucoll::config::{Config, DEFAULT_TIMEOUT_SECS};
/// use std::time::Duration;
///
/// let unset = Config::from_lookup(|_| None)?;
/// assert_eq!(unset.timeout, Duration::from_secs_f64(DEFAULT_TIMEOUT_SECS));
/// # Ok::<(), gpucoll::Error>(())
/// ```
pub const DEFAULT_TIMEOUT_SECS: f64 = 300.0;

/// Settings read from `GPUCOLL_*` variables.
///
/// A communicator reads them when it is created
/// ([`Communicator::config`](crate::Communicator::config) shows the result);
/// [`Config::from_lookup`] parses them from any source, e.g. to validate a
/// job's settings before launching it:
///
/// ```
/// use gpucoll::{Config, Error};
/// use std::collections::HashMap;
/// use std::time::Duration;
///
/// let vars = HashMap::from([("GPUCOLL_TIMEOUT", "30"), ("GPUCOLL_CHECK", "1")]);
/// let c = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()))?;
/// assert_eq!(c.timeout, Duration::from_secs(30));
/// assert!(c.check && c.algo.is_none());
///
/// // A malformed value names the variable.
/// let bad = Config::from_lookup(|name| (name == "GPUCOLL_NCHANNELS").then(|| "0".into()));
/// assert!(matches!(bad, Err(Error::Config { name: "GPUCOLL_NCHANNELS", .. })));
/// # Ok::<(), gpucoll::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `GPUCOLL_TIMEOUT`: seconds a collective may go without progress.
    pub timeout: Duration,
    /// `GPUCOLL_CHECK=1`: compare a signature of every call across ranks first.
    pub check: bool,
    /// `GPUCOLL_ALGO`: force an algorithm where it applies.
    pub algo: Option<Algorithm>,
    /// `GPUCOLL_PROTO`: force a protocol where the backend has it.
    pub proto: Option<Protocol>,
    /// `GPUCOLL_NCHANNELS`: force the channel count (clamped to the backend's maximum).
    pub nchannels: Option<usize>,
    /// `GPUCOLL_CUDA_CHANNELS`: the most channels (thread blocks) one
    /// launch of this communicator may use on the CUDA backend (default on
    /// one node: 256 / ranks, from 16 to 128; every rank takes the smallest
    /// any rank asks for; ranks sharing a GPU are capped further). A
    /// collective's blocks hold their SMs while they wait for the peers,
    /// so communicators busy at the same time (from several threads) must
    /// fit on the GPU together: cap each so that communicators × ranks per
    /// GPU × channels ≤ the GPU's SMs (README, "Threads").
    pub cuda_channels: Option<usize>,
    /// `GPUCOLL_CUDA_SLOT_KB`: bytes per FIFO slot of the CUDA backend's
    /// connectors, given in KiB (4 to 4096; default 512 KiB up to 64
    /// channels, 256 KiB above). Every rank takes the smallest any rank
    /// asks for. Per rank.
    pub cuda_slot_bytes: Option<u64>,
    /// `GPUCOLL_MAX_MEM`: the most device memory a communicator of the
    /// CUDA backend keeps for its connectors on this rank (FIFOs and
    /// one-shot inboxes; bytes, or with a `K`, `M` or `G` suffix in
    /// binary units). The layout fits it with smaller slots first, then
    /// fewer channels, then the smallest slots; calls never fail for it,
    /// and a budget below what one channel of the smallest slots needs
    /// gets that (logged). Unset: the defaults of `GPUCOLL_CUDA_CHANNELS`
    /// and `GPUCOLL_CUDA_SLOT_KB`. Per rank: ranks agree on the smallest
    /// layout any rank asks for.
    pub max_device_memory: Option<u64>,
    /// `GPUCOLL_SIM_NODES`: split each real node's ranks into this many
    /// simulated nodes (contiguous blocks of local ranks) that talk over MPI.
    pub sim_nodes: Option<usize>,
    /// `GPUCOLL_NODE_ID`: this rank's node id, overriding discovery (ranks
    /// with equal ids share a node; set per rank, e.g. by a wrapper script).
    pub node_id: Option<u64>,
    /// `GPUCOLL_BACKEND`: `host` or `cuda` (default: cuda when a GPU is usable).
    pub backend: Option<String>,
    /// `GPUCOLL_HOST_SLOT_BYTES`: bytes per FIFO slot of the host backend.
    pub host_slot_bytes: Option<u64>,
    /// `GPUCOLL_P2P_DISABLE=1`: the CUDA backend keeps its FIFOs in pinned
    /// host shared memory instead of peer-mapped device memory (the SHM
    /// transport).
    pub p2p_disable: bool,
    /// `GPUCOLL_LEGACY_STREAM_ORDER=1`: the CUDA backend's own stream (the
    /// one blocking calls run on) is a blocking stream, ordered after work
    /// the program queued on the legacy default stream (`cudaMemset`, a
    /// kernel on stream 0) without a host wait, as CUDA-aware MPI
    /// libraries order their calls. Off: a non-blocking stream, which
    /// never waits for the program's default stream. The MPI shim sets it.
    pub legacy_stream_order: bool,
    /// `GPUCOLL_CE`: copy-engine collectives (all_gather, all_to_all,
    /// broadcast, gather, scatter on one node with a direct path):
    /// `auto` (default) where the cost model says they are cheaper, `1`
    /// always, `0` never.
    pub ce: CeMode,
    /// `GPUCOLL_REGISTERED`: all_reduce, reduce_scatter, all_gather and
    /// broadcast on one node with a direct path as kernels that read the
    /// peers' inputs and write straight into their outputs (no FIFO, no
    /// receive copy): `auto` (default) for calls of at least
    /// [`REGISTERED_AUTO_MIN_BYTES`] whose buffers every rank registered
    /// (`Communicator::register`), `1` for every call whose buffers the
    /// driver can share with the peers, registered or not, `0` never.
    pub registered: RegisteredMode,
    /// `GPUCOLL_RESIDENT`: on the CUDA backend, blocking calls that run as
    /// a one-shot of one block (the small ones: up to 4 KiB a peer with
    /// LL, 32 KiB with Simple) and come in a burst (the previous one
    /// within [`resident_linger`](Self::resident_linger)) are posted to
    /// one block that stays on the GPU between calls, instead of launching
    /// a kernel each (stores and a poll instead of a launch and a wait for
    /// it): `auto` (default) unless ranks of the communicator share a GPU,
    /// `1` always, `0` never. The block holds one SM while it waits, and
    /// leaves after the linger time without a call, before any other work
    /// of the communicator, and at its end; a `cudaDeviceSynchronize`
    /// meanwhile waits for it to leave. Per rank: ranks may differ.
    pub resident: ResidentMode,
    /// `GPUCOLL_RESIDENT_LINGER_US`: how long the resident block waits for
    /// the next call before it leaves (default
    /// [`DEFAULT_RESIDENT_LINGER_US`] µs).
    pub resident_linger: Duration,
    /// `GPUCOLL_CE_BATCH=0`: copy-engine collectives copy piece by piece
    /// over their streams instead of in one `cuMemcpyBatchAsync` (which
    /// graph capture and the legacy default stream always avoid), to
    /// compare the two or to get past a driver whose batches fail. On by
    /// default. Per rank.
    pub ce_batch: bool,
    /// `GPUCOLL_PROFILE_HOST=1`: the CUDA backend sums the host time of
    /// each phase of a call and logs the sums when the communicator ends
    /// (target `gpucoll::profile` at `info`, through `GPUCOLL_LOG`). Off by default. Per rank.
    pub profile_host: bool,
    /// `GPUCOLL_HOST_CHANNEL_THREADS`: whether the host backend runs each
    /// channel on a thread of its own (`1`, when MPI provides
    /// `MPI_THREAD_MULTIPLE`), or all channels on the calling thread
    /// (`0`); unset or `auto`: threads when MPI provides
    /// `MPI_THREAD_MULTIPLE` and the machine has at least two cores per
    /// rank of the node. Per rank.
    pub host_channel_threads: Option<bool>,
    /// `GPUCOLL_P2P_EAGER`: point-to-point messages of device memory of at
    /// most this many bytes (0 to 16 KiB; a `K` suffix is allowed) to a
    /// rank whose GPU memory maps here are sent buffered: copied out
    /// through pinned host memory inside their envelope, so that the send
    /// completes at once, whether or not the receive was posted. Larger
    /// ones (every one, by default: 0) are copied by the receiver straight
    /// from the sender's memory, one copy instead of two, and the send
    /// completes once the receiver took them, as MPI's standard mode
    /// allows; a program whose two ranks both send before they receive
    /// small device messages needs immediate sends (or this setting).
    /// Memory the driver cannot export always goes buffered up to 16 KiB.
    /// Per rank (the sender decides).
    pub p2p_eager: u64,
}

/// The largest `GPUCOLL_P2P_EAGER` (a message's inline limit).
pub const P2P_EAGER_MAX: u64 = 16 << 10;

/// Default for `GPUCOLL_RESIDENT_LINGER_US`.
pub const DEFAULT_RESIDENT_LINGER_US: u64 = 50;

/// Whether blocking small calls run on a resident block
/// (`GPUCOLL_RESIDENT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResidentMode {
    /// Every call is a kernel launch.
    Off,
    /// Always, even where ranks share a GPU.
    On,
    /// Unless ranks of the communicator share a GPU (their blocks would
    /// take turns with the resident ones).
    #[default]
    Auto,
}

impl ResidentMode {
    pub fn name(self) -> &'static str {
        match self {
            ResidentMode::Off => "0",
            ResidentMode::On => "1",
            ResidentMode::Auto => "auto",
        }
    }
}

/// Calls moving fewer bytes than this (the tuner's size of the call) keep
/// their usual kernels under `GPUCOLL_REGISTERED=auto`: below it the host
/// rendezvous and the two stream hand-shakes cost more than they save.
pub const REGISTERED_AUTO_MIN_BYTES: u64 = 4 << 20;

/// When collectives run as kernels on the peers' buffers
/// (`GPUCOLL_REGISTERED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RegisteredMode {
    /// Never: every call keeps its plan's kernels.
    Off,
    /// Wherever every rank's buffers can be mapped by the peers (device
    /// allocations the driver can export), at every size.
    On,
    /// Where every rank registered its buffers, from
    /// [`REGISTERED_AUTO_MIN_BYTES`] on.
    #[default]
    Auto,
}

impl RegisteredMode {
    pub fn name(self) -> &'static str {
        match self {
            RegisteredMode::Off => "0",
            RegisteredMode::On => "1",
            RegisteredMode::Auto => "auto",
        }
    }
}

/// When copy engines move a collective's data (`GPUCOLL_CE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CeMode {
    /// Never: kernels move everything.
    Off,
    /// Wherever the backend has copy engines for the collective.
    On,
    /// Where the tuner's cost model says they are cheaper.
    #[default]
    Auto,
}

impl CeMode {
    pub fn name(self) -> &'static str {
        match self {
            CeMode::Off => "0",
            CeMode::On => "1",
            CeMode::Auto => "auto",
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: Duration::from_secs_f64(DEFAULT_TIMEOUT_SECS),
            check: false,
            algo: None,
            proto: None,
            nchannels: None,
            cuda_channels: None,
            cuda_slot_bytes: None,
            max_device_memory: None,
            sim_nodes: None,
            node_id: None,
            backend: None,
            host_slot_bytes: None,
            p2p_disable: false,
            legacy_stream_order: false,
            ce: CeMode::Auto,
            registered: RegisteredMode::Auto,
            resident: ResidentMode::Auto,
            resident_linger: Duration::from_micros(DEFAULT_RESIDENT_LINGER_US),
            ce_batch: true,
            profile_host: false,
            host_channel_threads: None,
            p2p_eager: 0,
        }
    }
}

fn bad(name: &'static str, value: &str, reason: &str) -> Error {
    Error::Config {
        name,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn parse_bool(name: &'static str, v: &str) -> Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(bad(name, v, "expected 0 or 1")),
    }
}

/// `auto` (None) or a boolean.
fn parse_auto(name: &'static str, v: &str) -> Result<Option<bool>> {
    if v.eq_ignore_ascii_case("auto") {
        Ok(None)
    } else {
        parse_bool(name, v).map(Some)
    }
}

/// Bytes, with an optional binary `K`, `M` or `G` suffix (`64M`, `1g`).
fn parse_bytes(name: &'static str, v: &str) -> Result<u64> {
    let t = v.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 10),
        Some((i, 'm' | 'M')) => (&t[..i], 20),
        Some((i, 'g' | 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0)
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| {
            bad(
                name,
                v,
                "expected a positive byte count such as 67108864 or 64M",
            )
        })
}

fn parse_positive(name: &'static str, v: &str) -> Result<usize> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(bad(name, v, "expected a positive integer")),
    }
}

impl Config {
    /// Read every `GPUCOLL_*` variable; a malformed value is an error.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Parse the settings from `lookup` (variable name to raw value), as
    /// [`from_env`](Self::from_env) does from the environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let var = |name: &'static str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut c = Config::default();
        if let Some(v) = var("GPUCOLL_TIMEOUT") {
            let secs: f64 = v
                .parse()
                .map_err(|_| bad("GPUCOLL_TIMEOUT", &v, "expected seconds"))?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(bad("GPUCOLL_TIMEOUT", &v, "must be positive"));
            }
            c.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = var("GPUCOLL_CHECK") {
            c.check = parse_bool("GPUCOLL_CHECK", &v)?;
        }
        if let Some(v) = var("GPUCOLL_ALGO") {
            c.algo = Some(
                Algorithm::parse(&v)
                    .filter(|a| *a != Algorithm::CopyEngine)
                    .ok_or_else(|| {
                        bad(
                            "GPUCOLL_ALGO",
                            &v,
                            "expected ring, tree, pairwise, oneshot or collnet \
                             (copy engines: GPUCOLL_CE=1)",
                        )
                    })?,
            );
        }
        if let Some(v) = var("GPUCOLL_CE") {
            c.ce = match parse_auto("GPUCOLL_CE", &v)? {
                None => CeMode::Auto,
                Some(true) => CeMode::On,
                Some(false) => CeMode::Off,
            };
        }
        if let Some(v) = var("GPUCOLL_REGISTERED") {
            c.registered = match parse_auto("GPUCOLL_REGISTERED", &v)? {
                None => RegisteredMode::Auto,
                Some(true) => RegisteredMode::On,
                Some(false) => RegisteredMode::Off,
            };
        }
        if let Some(v) = var("GPUCOLL_PROTO") {
            c.proto = Some(
                Protocol::parse(&v)
                    .ok_or_else(|| bad("GPUCOLL_PROTO", &v, "expected simple, ll or ll128"))?,
            );
        }
        if let Some(v) = var("GPUCOLL_NCHANNELS") {
            c.nchannels = Some(parse_positive("GPUCOLL_NCHANNELS", &v)?);
        }
        if let Some(v) = var("GPUCOLL_CUDA_CHANNELS") {
            c.cuda_channels = Some(parse_positive("GPUCOLL_CUDA_CHANNELS", &v)?);
        }
        if let Some(v) = var("GPUCOLL_CUDA_SLOT_KB") {
            let kib = parse_positive("GPUCOLL_CUDA_SLOT_KB", v.trim())?;
            if !(4..=4096).contains(&kib) {
                return Err(bad(
                    "GPUCOLL_CUDA_SLOT_KB",
                    &v,
                    "expected KiB from 4 to 4096",
                ));
            }
            c.cuda_slot_bytes = Some((kib as u64) << 10);
        }
        if let Some(v) = var("GPUCOLL_MAX_MEM") {
            c.max_device_memory = Some(parse_bytes("GPUCOLL_MAX_MEM", &v)?);
        }
        if let Some(v) = var("GPUCOLL_SIM_NODES") {
            c.sim_nodes = Some(parse_positive("GPUCOLL_SIM_NODES", &v)?);
        }
        if let Some(v) = var("GPUCOLL_P2P_EAGER") {
            let bytes = if v.trim() == "0" {
                0
            } else {
                parse_bytes("GPUCOLL_P2P_EAGER", &v)?
            };
            if bytes > P2P_EAGER_MAX {
                return Err(bad("GPUCOLL_P2P_EAGER", &v, "expected at most 16K bytes"));
            }
            c.p2p_eager = bytes;
        }
        if let Some(v) = var("GPUCOLL_NODE_ID") {
            c.node_id = Some(
                v.parse()
                    .map_err(|_| bad("GPUCOLL_NODE_ID", &v, "expected an unsigned integer"))?,
            );
        }
        if let Some(v) = var("GPUCOLL_BACKEND") {
            let lower = v.to_ascii_lowercase();
            if lower != "host" && lower != "cuda" {
                return Err(bad("GPUCOLL_BACKEND", &v, "expected host or cuda"));
            }
            c.backend = Some(lower);
        }
        if let Some(v) = var("GPUCOLL_HOST_SLOT_BYTES") {
            let n = parse_positive("GPUCOLL_HOST_SLOT_BYTES", &v)? as u64;
            if n < 256 || n % 64 != 0 {
                return Err(bad(
                    "GPUCOLL_HOST_SLOT_BYTES",
                    &v,
                    "must be a multiple of 64 and at least 256",
                ));
            }
            c.host_slot_bytes = Some(n);
        }
        if let Some(v) = var("GPUCOLL_P2P_DISABLE") {
            c.p2p_disable = parse_bool("GPUCOLL_P2P_DISABLE", &v)?;
        }
        if let Some(v) = var("GPUCOLL_LEGACY_STREAM_ORDER") {
            c.legacy_stream_order = parse_bool("GPUCOLL_LEGACY_STREAM_ORDER", &v)?;
        }
        if let Some(v) = var("GPUCOLL_RESIDENT") {
            c.resident = match parse_auto("GPUCOLL_RESIDENT", &v)? {
                None => ResidentMode::Auto,
                Some(true) => ResidentMode::On,
                Some(false) => ResidentMode::Off,
            };
        }
        if let Some(v) = var("GPUCOLL_RESIDENT_LINGER_US") {
            let us = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&us| (1..=10_000_000).contains(&us))
                .ok_or_else(|| {
                    bad(
                        "GPUCOLL_RESIDENT_LINGER_US",
                        &v,
                        "expected microseconds from 1 to 10000000",
                    )
                })?;
            c.resident_linger = Duration::from_micros(us);
        }
        if let Some(v) = var("GPUCOLL_CE_BATCH") {
            c.ce_batch = parse_bool("GPUCOLL_CE_BATCH", &v)?;
        }
        if let Some(v) = var("GPUCOLL_PROFILE_HOST") {
            c.profile_host = parse_bool("GPUCOLL_PROFILE_HOST", &v)?;
        }
        if let Some(v) = var("GPUCOLL_HOST_CHANNEL_THREADS") {
            c.host_channel_threads = parse_auto("GPUCOLL_HOST_CHANNEL_THREADS", &v)?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Config> {
        Config::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn p2p_disable() {
        assert!(!parse(&[]).unwrap().p2p_disable);
        for v in ["1", "true", "ON", " yes "] {
            assert!(
                parse(&[("GPUCOLL_P2P_DISABLE", v)]).unwrap().p2p_disable,
                "{v}"
            );
        }
        for v in ["0", "false", "off", ""] {
            assert!(
                !parse(&[("GPUCOLL_P2P_DISABLE", v)]).unwrap().p2p_disable,
                "{v}"
            );
        }
        match parse(&[("GPUCOLL_P2P_DISABLE", "maybe")]) {
            Err(Error::Config { name, .. }) => assert_eq!(name, "GPUCOLL_P2P_DISABLE"),
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn p2p_eager_bytes() {
        assert_eq!(parse(&[]).unwrap().p2p_eager, 0);
        for (v, bytes) in [("0", 0u64), ("64", 64), ("16K", 16384), (" 8k ", 8192)] {
            assert_eq!(
                parse(&[("GPUCOLL_P2P_EAGER", v)]).unwrap().p2p_eager,
                bytes,
                "{v}"
            );
        }
        for bad in ["16385", "1M", "-1", "x"] {
            match parse(&[("GPUCOLL_P2P_EAGER", bad)]) {
                Err(Error::Config { name, .. }) => assert_eq!(name, "GPUCOLL_P2P_EAGER", "{bad}"),
                other => panic!("{bad:?}: expected a Config error, got {other:?}"),
            }
        }
    }

    #[test]
    fn cuda_slot_and_memory_budget() {
        let c = parse(&[]).unwrap();
        assert_eq!((c.cuda_slot_bytes, c.max_device_memory), (None, None));
        let c = parse(&[("GPUCOLL_CUDA_SLOT_KB", "128"), ("GPUCOLL_MAX_MEM", "64M")]).unwrap();
        assert_eq!(c.cuda_slot_bytes, Some(128 << 10));
        assert_eq!(c.max_device_memory, Some(64 << 20));
        for (v, bytes) in [("1g", 1u64 << 30), ("4096", 4096), (" 3K ", 3072)] {
            let c = parse(&[("GPUCOLL_MAX_MEM", v)]).unwrap();
            assert_eq!(c.max_device_memory, Some(bytes), "{v}");
        }
        for bad in ["0", "-1", "64X", "M", "99999999999G"] {
            match parse(&[("GPUCOLL_MAX_MEM", bad)]) {
                Err(Error::Config { name, .. }) => assert_eq!(name, "GPUCOLL_MAX_MEM", "{bad}"),
                other => panic!("{bad:?}: expected a Config error, got {other:?}"),
            }
        }
        for bad in ["0", "3", "4097", "x"] {
            assert!(parse(&[("GPUCOLL_CUDA_SLOT_KB", bad)]).is_err(), "{bad}");
        }
    }

    #[test]
    fn legacy_stream_order() {
        assert!(!parse(&[]).unwrap().legacy_stream_order);
        assert!(
            parse(&[("GPUCOLL_LEGACY_STREAM_ORDER", "1")])
                .unwrap()
                .legacy_stream_order
        );
        assert!(parse(&[("GPUCOLL_LEGACY_STREAM_ORDER", "2")]).is_err());
    }

    #[test]
    fn cuda_channels() {
        assert_eq!(parse(&[]).unwrap().cuda_channels, None);
        assert_eq!(
            parse(&[("GPUCOLL_CUDA_CHANNELS", "44")])
                .unwrap()
                .cuda_channels,
            Some(44)
        );
        for bad in ["0", "-3", "many"] {
            assert!(matches!(
                parse(&[("GPUCOLL_CUDA_CHANNELS", bad)]),
                Err(Error::Config {
                    name: "GPUCOLL_CUDA_CHANNELS",
                    ..
                })
            ));
        }
    }

    #[test]
    fn copy_engine_mode() {
        assert_eq!(parse(&[]).unwrap().ce, CeMode::Auto);
        for (v, m) in [
            ("0", CeMode::Off),
            ("1", CeMode::On),
            ("AUTO", CeMode::Auto),
            ("off", CeMode::Off),
        ] {
            assert_eq!(parse(&[("GPUCOLL_CE", v)]).unwrap().ce, m, "{v}");
        }
        assert!(matches!(
            parse(&[("GPUCOLL_CE", "sometimes")]),
            Err(Error::Config {
                name: "GPUCOLL_CE",
                ..
            })
        ));
        // Copy engines have their own switch, not an algorithm name.
        assert!(parse(&[("GPUCOLL_ALGO", "ce")]).is_err());
    }

    #[test]
    fn registered_mode() {
        assert_eq!(parse(&[]).unwrap().registered, RegisteredMode::Auto);
        for (v, m) in [
            ("0", RegisteredMode::Off),
            ("1", RegisteredMode::On),
            ("Auto", RegisteredMode::Auto),
            ("yes", RegisteredMode::On),
        ] {
            assert_eq!(
                parse(&[("GPUCOLL_REGISTERED", v)]).unwrap().registered,
                m,
                "{v}"
            );
        }
        assert!(matches!(
            parse(&[("GPUCOLL_REGISTERED", "always")]),
            Err(Error::Config {
                name: "GPUCOLL_REGISTERED",
                ..
            })
        ));
    }

    #[test]
    fn resident_mode_and_linger() {
        let d = parse(&[]).unwrap();
        assert_eq!(d.resident, ResidentMode::Auto);
        assert_eq!(
            d.resident_linger,
            Duration::from_micros(DEFAULT_RESIDENT_LINGER_US)
        );
        for (v, m) in [
            ("0", ResidentMode::Off),
            ("1", ResidentMode::On),
            ("AUTO", ResidentMode::Auto),
        ] {
            assert_eq!(parse(&[("GPUCOLL_RESIDENT", v)]).unwrap().resident, m);
        }
        assert!(matches!(
            parse(&[("GPUCOLL_RESIDENT", "sometimes")]),
            Err(Error::Config {
                name: "GPUCOLL_RESIDENT",
                ..
            })
        ));
        let c = parse(&[("GPUCOLL_RESIDENT_LINGER_US", " 50 ")]).unwrap();
        assert_eq!(c.resident_linger, Duration::from_micros(50));
        for v in ["0", "-3", "1.5", "10000001", "x"] {
            assert!(
                matches!(
                    parse(&[("GPUCOLL_RESIDENT_LINGER_US", v)]),
                    Err(Error::Config {
                        name: "GPUCOLL_RESIDENT_LINGER_US",
                        ..
                    })
                ),
                "{v}"
            );
        }
    }

    #[test]
    fn per_rank_switches() {
        let c = parse(&[]).unwrap();
        assert!(c.ce_batch && !c.profile_host && c.host_channel_threads.is_none());
        let c = parse(&[
            ("GPUCOLL_CE_BATCH", "0"),
            ("GPUCOLL_PROFILE_HOST", "1"),
            ("GPUCOLL_HOST_CHANNEL_THREADS", "off"),
        ])
        .unwrap();
        assert!(!c.ce_batch && c.profile_host);
        assert_eq!(c.host_channel_threads, Some(false));
        assert_eq!(
            parse(&[("GPUCOLL_HOST_CHANNEL_THREADS", "auto")])
                .unwrap()
                .host_channel_threads,
            None
        );
        for name in [
            "GPUCOLL_CE_BATCH",
            "GPUCOLL_PROFILE_HOST",
            "GPUCOLL_HOST_CHANNEL_THREADS",
        ] {
            match parse(&[(name, "maybe")]) {
                Err(Error::Config { name: n, .. }) => assert_eq!(n, name),
                other => panic!("{name}=maybe: {other:?}"),
            }
        }
    }

    #[test]
    fn timeout_and_defaults() {
        let c = parse(&[("GPUCOLL_TIMEOUT", "5")]).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert!(parse(&[("GPUCOLL_TIMEOUT", "-1")]).is_err());
        assert_eq!(parse(&[]).unwrap(), Config::default());
    }
}

//! Bring-up of [`CudaBackend`], collective over the communicator, in
//! stages: device and module; agreement on identities, transports and
//! layout; control segments; the transports' memory (P2P blocks over CUDA
//! IPC or SHM FIFOs in the segments, then NET's block and its measured
//! costs); connector tables; what runs beside the kernels (NET's proxy).
//! Every stage ends in [`agree`], so all ranks fail together; what a
//! failed stage leaves behind is released by the `Drop` of the values
//! built so far (in reverse order of creation).
//!
//! The stages are this file's; what each transport does in them is
//! `transport/`'s, which this file asks (`select`, `Transports`) without
//! naming any transport, so adding one changes no stage here.

use super::abi::GcConn;
use super::backend::CudaBackend;
use super::cache::StepStore;
use super::caps::caps;
use super::driver;
use super::exchange::{self, agree, RankSetup};
use super::handles::{EventPool, Stream};
use super::layout::*;
use super::lower::DeviceTargets;
use super::memory::{bind, DevMem, DeviceCtx, LiveOnDevice};
use super::module::Kernels;
use super::peer_mem::{self, CopyEngines, FdMesh, PeerMoves};
use super::profile::HostProfile;
use super::resident::Resident;
use super::shm::{self, Segment};
use super::state::CudaShared;
use super::transport::{self, reaches_node_gpus, Facts, Kind, Route, Stage, Transports};
use crate::backend::shared::failure::Failure;
use crate::backend::shared::liveness::{Peer, PeerLiveness};
use crate::backend::shared::process;
use crate::backend::shared::setup;
use crate::config::{Config, ResidentMode};
use crate::error::{Error, Result};
use crate::mpi::MpiComm;
use crate::mpi::Threading;
use crate::topo::Topology;
use std::sync::{Arc, Mutex};

/// `GPUCOLL_P2P_DISABLE=1` (parsed, validated and agreed across ranks in
/// [`Config`]): connectors in host shared memory instead of peer device
/// memory.
pub fn p2p_disabled(config: &Config) -> bool {
    config.p2p_disable
}

/// A key naming this rank's GPU across the job (host name and PCI bus id:
/// equal keys mean the same physical GPU) and its multiprocessor count
/// (0 if unknown). A rank whose GPU cannot be named gets a key of its own,
/// so it is never counted as sharing.
fn gpu_identity(ctx: &DeviceCtx, rank: usize) -> (u64, usize) {
    let sms = driver::multiprocessor_count(ctx.dev).unwrap_or(0);
    let named = crate::mpi::processor_name()
        .and_then(|host| Ok(format!("{host}/{}", driver::device_pci_bus_id(ctx.dev)?)));
    let key = match named {
        // FNV-1a: stable across processes, unlike std's hasher.
        Ok(name) => name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        }),
        Err(_) => u64::MAX - rank as u64,
    };
    (key, sms)
}

/// Stage 1 on each rank: the device, the module and our stream. Fields
/// drop in order: the stream, then the module.
struct Local {
    ctx: DeviceCtx,
    stream: Stream,
    kernels: Kernels,
}

fn open_device(ordinal: i32, after_legacy: bool) -> Result<Local> {
    let ctx = bind(ordinal)?;
    let kernels = Kernels::load()?;
    let stream = Stream::create(after_legacy)?;
    Ok(Local {
        ctx,
        stream,
        kernels,
    })
}

/// What stage 2 agrees on, identical on all ranks (but `route`, which is
/// seen from each rank).
struct Agreed {
    /// Every rank's part of the exchange (pid, segment nonce, start time).
    ranks: Vec<RankSetup>,
    pids: Vec<u32>,
    /// The transport of each peer and of our node's FIFOs.
    route: Route,
    /// Our node's FIFO layout (NET's connectors share its geometry).
    layout: Layout,
    /// Ranks of the communicator on the GPU that has the most of them.
    sharers: usize,
}

/// Stage 2: identities, device ordinals, the transports, channels and
/// slot size (the smallest request of all ranks wins).
fn negotiate(
    mpi: &MpiComm,
    topo: &Topology,
    ctx: &DeviceCtx,
    multi: bool,
    p2p_off: bool,
    config: &Config,
) -> Result<Agreed> {
    let def_channels = if multi {
        NET_CHANNELS
    } else {
        p2p_channels(topo.nranks)
    };
    let ranks = exchange_setups(mpi, topo, ctx, def_channels, p2p_off, config)?;
    let pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();
    let ords: Vec<i32> = ranks.iter().map(|r| r.ordinal).collect();
    let any_off = ranks.iter().any(|r| r.p2p_off);
    // P2P (CUDA IPC) only within a node: every rank must reach the GPUs
    // of the ranks on its node.
    let oks = mpi.allgather_bytes(&[reaches_node_gpus(ctx, topo, &ords) as u8])?;
    let facts = Facts {
        topo,
        p2p: !any_off && !oks.contains(&0),
    };
    let route = transport::select(&facts)?;
    let (layout, sharers) = node_layout(&ranks, topo, multi, def_channels, route.node());
    // The smallest budget any rank set; every rank fits the same agreed
    // layout to it, so all compute the same offsets.
    let layout = match ranks.iter().map(|r| r.budget).filter(|&b| b > 0).min() {
        Some(b) => fit_to_budget(layout, b, topo.rank),
        None => layout,
    };
    Ok(Agreed {
        ranks,
        pids,
        route,
        layout,
        sharers,
    })
}

/// Stage 2's exchange: every rank's identity, segment nonce, device and
/// layout proposals (`def_channels`: the channels a rank without
/// `GPUCOLL_CUDA_CHANNELS` asks for).
fn exchange_setups(
    mpi: &MpiComm,
    topo: &Topology,
    ctx: &DeviceCtx,
    def_channels: usize,
    p2p_off: bool,
    config: &Config,
) -> Result<Vec<RankSetup>> {
    let want_channels = config
        .cuda_channels
        .unwrap_or(def_channels)
        .clamp(1, MAX_CHANNELS);
    // 0: no preference (the default for the agreed channel count).
    let want_slot = config
        .cuda_slot_bytes
        .map_or(0, |b| b.clamp(4 << 10, 4 << 20) as usize);
    let (gpu, sms) = gpu_identity(ctx, topo.rank);
    // Our control segment's name is told over MPI only: nobody outside
    // the job can create it first or know it before it exists.
    let nonce = process::random_nonce();
    let nonce = agree(mpi, nonce, "draw a random segment name")?;
    let mine = RankSetup {
        pid: std::process::id(),
        nonce,
        ordinal: ctx.ordinal,
        p2p_off,
        channels: want_channels,
        slot: want_slot,
        gpu,
        sms: sms.min(1 << 20),
        start: process::own_start_time(),
        budget: config.max_device_memory.unwrap_or(0),
    };
    let all = mpi.allgather_bytes(&mine.encode())?;
    exchange::parse(&all, topo.nranks)
}

/// Our node's FIFO layout from every rank's proposal, shaped by the node's
/// transport (`node`), and how many ranks share the busiest GPU. Every
/// rank must use the same layout: the smallest request wins, and no more
/// channels than the ranks sharing the busiest GPU can run side by side.
fn node_layout(
    ranks: &[RankSetup],
    topo: &Topology,
    multi: bool,
    def_channels: usize,
    node: Kind,
) -> (Layout, usize) {
    let (rank, nranks) = (topo.rank, topo.nranks);
    let gpus: Vec<u64> = ranks.iter().map(|r| r.gpu).collect();
    let sharers = busiest_gpu(&gpus);
    let fewest_sms = ranks
        .iter()
        .map(|r| r.sms)
        .filter(|&n| n > 0)
        .min()
        .unwrap_or(0);
    let requested = ranks
        .iter()
        .map(|r| r.channels)
        .min()
        .unwrap_or(def_channels)
        .max(1);
    let co_resident = co_resident_channels(sharers, fewest_sms);
    let req_channels = match co_resident {
        Some(cap) if cap < requested => {
            tracing::info!(
                rank,
                sharers,
                sms = fewest_sms,
                channels = cap,
                requested,
                "CUDA backend: ranks share a GPU; channels capped so that every rank's blocks fit on it at once"
            );
            cap
        }
        _ => requested,
    };
    let req_slot = ranks
        .iter()
        .map(|r| r.slot)
        .filter(|&s| s > 0)
        .min()
        .unwrap_or(if multi {
            SLOT_BYTES_NET
        } else {
            p2p_slot_bytes(req_channels)
        })
        / 64
        * 64;
    let proposed = Layout {
        nranks: nranks as u64,
        channels: req_channels as u64,
        slots: FIFO_SLOTS as u64,
        slot_bytes: req_slot as u64,
        // The one-shot path needs every peer mapped: single node only.
        direct: !multi && nranks > 1 && nranks <= ONESHOT_MAX_RANKS,
        oneshot_bytes: ONESHOT_MAX_BYTES,
    };
    (node.row().shape(proposed, !multi, co_resident), sharers)
}

/// `layout` fitted to the smallest `budget` any rank set (`GPUCOLL_MAX_MEM`).
fn fit_to_budget(layout: Layout, budget: u64, rank: usize) -> Layout {
    let fitted = fit_budget(layout, budget);
    if fitted.total() > budget {
        tracing::warn!(
            rank,
            budget,
            needs = fitted.total(),
            "CUDA backend: GPUCOLL_MAX_MEM is below the smallest connector layout; using that"
        );
    }
    tracing::info!(
        rank,
        budget,
        channels = fitted.channels,
        slot_bytes = fitted.slot_bytes,
        oneshot_bytes = fitted.oneshot_bytes,
        bytes = fitted.total(),
        "CUDA backend: connector layout fitted to the memory budget"
    );
    fitted
}

/// Stage 3: the control segments of every rank of our node (plus what the
/// transports keep in them: SHM's FIFOs), ours unlinked once everyone
/// mapped it, registered with CUDA where the kernels need them.
fn map_segments(mpi: &MpiComm, topo: &Topology, a: &Agreed) -> Result<Vec<Arc<Segment>>> {
    let local_rank = topo.local_rank();
    let in_segments: usize = a
        .route
        .in_use()
        .into_iter()
        .map(|k| k.row().segment_bytes(&a.layout))
        .sum();
    let seg_bytes = (shm::CONTROL_BYTES + in_segments).div_ceil(4096) * 4096;
    let node: &[usize] = &topo.nodes[topo.node()];
    let own = Segment::create(
        &shm::segment_name(a.pids[topo.rank], a.ranks[topo.rank].nonce, local_rank),
        seg_bytes,
    );
    let own = agree(mpi, own, "create their shared memory segment")?;
    let mut own = Some(own);
    let segs: Result<Vec<Segment>> = node
        .iter()
        .enumerate()
        .map(|(l, &r)| {
            if l == local_rank {
                own.take()
                    .ok_or_else(|| Error::Backend("own segment taken twice".into()))
            } else {
                let name = shm::segment_name(a.pids[r], a.ranks[r].nonce, l);
                Segment::open(&name, seg_bytes, a.pids[r])
            }
        })
        .collect();
    let mut segs = agree(mpi, segs, "map their peers' shared memory segments")?;
    // Every peer mapped it (agreed above). A failed unlink only leaves the
    // name for the stale-segment cleanup: not worth failing this rank
    // alone, which would leave the others waiting in the next stage.
    if let Err(e) = segs[local_rank].unlink() {
        tracing::warn!(rank = topo.rank, "CUDA backend: {e}");
    }
    let reg = (|| -> Result<()> {
        for (l, s) in segs.iter_mut().enumerate() {
            // Peers' control words are written by our streams too: a
            // transport's FIFOs in the segments (SHM), and the copy-engine
            // flags of the direct path.
            if l == local_rank || in_segments > 0 || a.layout.direct {
                s.register()?;
            }
        }
        Ok(())
    })();
    agree(mpi, reg, "register shared memory with CUDA")?;
    Ok(segs.into_iter().map(Arc::new).collect())
}

/// Stage 3b (single-node communicators, where the copy-engine calls run):
/// the authenticated links VMM descriptors pass over (`ce/fdmesh.rs`).
/// A rank that cannot bind its socket fails the setup on every rank; links
/// that do not come up everywhere only turn descriptor passing off.
fn fd_links(mpi: &MpiComm, topo: &Topology, a: &Agreed, config: &Config) -> Result<Option<FdMesh>> {
    let n = topo.nranks;
    if topo.nnodes() > 1 || !(2..=peer_mem::MAX_RANKS).contains(&n) {
        return Ok(None);
    }
    let wait = config.timeout.min(std::time::Duration::from_secs(30));
    FdMesh::setup(
        topo.rank,
        &a.pids,
        wait,
        &mut |b| mpi.allgather_bytes(b),
        &mut process::random_nonce,
    )
}

/// Stage 5: upload the connector tables `(send, recv)`.
fn upload_conns(send: &[GcConn], recv: &[GcConn]) -> Result<(DevMem, DevMem)> {
    let bytes = std::mem::size_of_val(send);
    let s = DevMem::alloc(bytes)?;
    let r = DevMem::alloc(bytes)?;
    // SAFETY: both device blocks and host vectors hold `bytes` bytes.
    unsafe {
        driver::memcpy_htod(s.ptr, send.as_ptr() as *const u8, bytes)?;
        driver::memcpy_htod(r.ptr, recv.as_ptr() as *const u8, bytes)?;
    }
    Ok((s, r))
}

/// The NET proxy thread calls MPI while the caller's thread may too.
fn check_threads(multi: bool, topo: &Topology) -> Result<()> {
    if !multi {
        return Ok(());
    }
    match crate::mpi::query_thread()? {
        Threading::Multiple => Ok(()),
        t => Err(Error::Backend(format!(
            "the CUDA backend needs MPI_THREAD_MULTIPLE for a communicator that spans \
             {} nodes (its NET proxy thread calls MPI), but MPI provides {t:?}; \
             initialize MPI with gpucoll::initialize() or MPI_THREAD_MULTIPLE, or use \
             GPUCOLL_BACKEND=host",
            topo.nnodes()
        ))),
    }
}

/// The GPU of this process: `device` when given, else its index among the
/// processes of its host, modulo the GPU count.
fn pick_device(host_rank: usize, device: Option<i32>, after_legacy: bool) -> Result<Local> {
    if !driver::available() {
        return Err(Error::Backend(
            "the CUDA backend needs the CUDA driver (libcuda.so), which is not \
             available on this machine; use GPUCOLL_BACKEND=host"
                .into(),
        ));
    }
    let n = driver::device_count()?;
    if n == 0 {
        return Err(Error::Backend("the CUDA driver shows no GPU".into()));
    }
    open_device(device.unwrap_or((host_rank % n) as i32), after_legacy)
}

impl CudaBackend {
    /// Set up connectors with every rank of the communicator. Collective
    /// over `mpi`: every rank must call it.
    pub fn new(mpi: Arc<MpiComm>, topo: &Topology, config: &Config) -> Result<CudaBackend> {
        CudaBackend::new_on_device(mpi, topo, config, None)
    }

    /// Like [`CudaBackend::new`], on GPU `device` when given (collective;
    /// each rank passes its own). `None`: the rank's index among the
    /// processes of its host, modulo the GPU count.
    pub fn new_on_device(
        mpi: Arc<MpiComm>,
        topo: &Topology,
        config: &Config,
        device: Option<i32>,
    ) -> Result<CudaBackend> {
        setup::check_topology(&mpi, topo)?;
        // Ranks on other (real or simulated) nodes are reached through NET
        // connectors: every rank agrees on this from the topology.
        let multi = topo.nnodes() > 1;
        // Without an explicit `device`, GPUs are picked by the rank's index
        // among the processes of its host, not of its node: simulated nodes
        // split a host's ranks, not its GPUs. Collective (every rank calls
        // it, whether it needs the index or not).
        let host_rank = mpi.split_shared().map(|s| s.rank());
        let threads = check_threads(multi, topo);

        // Stage 1: driver, device, module, stream.
        let local =
            threads.and_then(|_| pick_device(host_rank?, device, config.legacy_stream_order));
        let local = agree(&mpi, local, "initialize CUDA")?;
        // From here on, a failure releases what the stages built (Drop).
        let a = negotiate(&mpi, topo, &local.ctx, multi, p2p_disabled(config), config)?;
        let segs = map_segments(&mpi, topo, &a)?;
        let mesh = fd_links(&mpi, topo, &a, config)?;
        let stage = Stage {
            mpi: &mpi,
            topo,
            route: &a.route,
            layout: &a.layout,
            segs: &segs,
        };
        // Stage 4: the memory of every transport in use, in table order
        // (P2P blocks or SHM FIFOs; then NET's block and its measured
        // costs, on several nodes).
        let mut transports = Transports::bring_up(&stage)?;

        // Stage 5: connector tables.
        let tables = transports
            .tables(a.layout.channels)
            .and_then(|(send, recv)| upload_conns(&send, &recv));
        let conns = agree(&mpi, tables, "upload their connector tables")?;

        // Start what runs beside the kernels (NET's proxy) last: from here
        // on nothing fails but its start.
        transports.start(&stage)?;
        let caps = caps(&a.layout, &transports);
        let built = Built {
            local,
            segs,
            transports,
            conns,
            mesh,
        };
        let inner = Arc::new(assemble(mpi, topo, config, &a, built)?);
        log_ready(&inner, topo, &a);
        Ok(CudaBackend::from_parts(inner, caps))
    }
}

/// What the stages built, for [`assemble`].
struct Built {
    local: Local,
    segs: Vec<Arc<Segment>>,
    transports: Transports,
    /// The connector tables `(send, recv)` on the device.
    conns: (DevMem, DevMem),
    mesh: Option<FdMesh>,
}

/// The backend's shared state from what the stages built.
fn assemble(
    mpi: Arc<MpiComm>,
    topo: &Topology,
    config: &Config,
    a: &Agreed,
    b: Built,
) -> Result<CudaShared> {
    let (rank, nranks, local_rank) = (topo.rank, topo.nranks, topo.local_rank());
    let target = device_targets(topo, a, &b)?;
    let Local {
        ctx,
        stream,
        kernels,
    } = b.local;
    let local_peers = topo.nodes[topo.node()]
        .iter()
        .filter(|&&r| r != rank)
        .map(|&r| Peer {
            rank: r,
            pid: a.pids[r],
            start: a.ranks[r].start,
        })
        .collect();
    let ce = CopyEngines::new(ctx.ordinal, config.registered, config.ce_batch, b.mesh);
    let (send_conns, recv_conns) = b.conns;
    // Point-to-point pulls from the peers whose memory this GPU maps.
    let route = b.transports.route();
    let mappable = (0..nranks)
        .map(|r| r != rank && route.of(r) == Some(Kind::P2p))
        .collect();
    let moves = Arc::new(PeerMoves::new(
        ctx.ordinal,
        mappable,
        config.legacy_stream_order,
    ));
    Ok(CudaShared {
        moves,
        ce,
        profile: HostProfile::new(config.profile_host),
        liveness: PeerLiveness::new(local_peers),
        rank,
        nranks,
        live: LiveOnDevice::new(ctx.ordinal),
        ctx,
        target,
        timeout: config.timeout,
        stream,
        kernels,
        local_rank,
        segs: b.segs,
        failure: Failure::default(),
        transports: b.transports,
        mpi,
        _send_conns: send_conns,
        _recv_conns: recv_conns,
        store: StepStore::default(),
        events: EventPool::default(),
        order: Mutex::new(Default::default()),
        resident: resident_block(config, a, rank),
        graph_keep: Mutex::new(Vec::new()),
    })
}

/// The device addresses the lowered tables point at.
fn device_targets(topo: &Topology, a: &Agreed, b: &Built) -> Result<DeviceTargets> {
    let own = &b.segs[topo.local_rank()];
    let oneshot_bases = if a.layout.direct {
        let blocks = b.transports.mapped_blocks().ok_or_else(|| {
            Error::Backend("the one-shot path needs peers' blocks mapped (P2P)".into())
        })?;
        blocks.iter().map(|b| b + a.layout.oneshot_off()).collect()
    } else {
        Vec::new()
    };
    Ok(DeviceTargets {
        rank: topo.rank,
        nranks: topo.nranks,
        layout: a.layout,
        send_conns: b.conns.0.ptr,
        recv_conns: b.conns.1.ptr,
        abort_word: own.dev_at(0)?,
        status: own.dev_at(shm::STATUS_OFF)?,
        oneshot_bases,
        rail: b
            .transports
            .net()
            .filter(|n| n.layout.rail)
            .map(|_| topo.local_rank() as u32),
    })
}

/// The resident block of blocking one-shots (`GPUCOLL_RESIDENT`), where
/// asked for and the direct path exists.
fn resident_block(config: &Config, a: &Agreed, rank: usize) -> Option<Resident> {
    let resident = match config.resident {
        ResidentMode::On => true,
        ResidentMode::Auto => a.sharers <= 1,
        ResidentMode::Off => false,
    };
    // Local: without it this rank launches every call, which the
    // peers cannot tell from a resident block.
    if resident && a.layout.direct {
        Resident::create(config.resident_linger, config.legacy_stream_order)
            .map_err(|e| tracing::warn!(rank, "resident block unavailable: {e}"))
            .ok()
    } else {
        None
    }
}

/// Which transport reaches each peer, e.g. "1:p2p 2:net 3:net", and the
/// agreed geometry.
fn log_ready(inner: &CudaShared, topo: &Topology, a: &Agreed) {
    let rank = inner.rank;
    let route = inner.transports.route();
    let peers = (0..inner.nranks)
        .filter(|&p| p != rank)
        .map(|p| format!("{p}:{}", route.of(p).map_or("?", |k| k.row().name())))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::info!(
        rank,
        gpu = inner.ctx.ordinal,
        pci = driver::device_pci_bus_id(inner.ctx.dev).unwrap_or_default(),
        transport = ?route.node(),
        nodes = topo.nnodes(),
        channels = a.layout.channels,
        slot_bytes = a.layout.slot_bytes,
        local_size = topo.local_size(),
        fifo_bytes = a.layout.total(),
        net_bytes = inner.transports.net().map_or(0, |n| n.layout.total()),
        peers = %peers,
        resident = inner.resident.is_some(),
        "cuda backend ready"
    );
}

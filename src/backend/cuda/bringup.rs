//! Bring-up of [`CudaBackend`], collective over the communicator, in
//! stages: device and module, agreement on transport and layout, control
//! segments, FIFO memory (P2P blocks over CUDA IPC or SHM), NET connectors,
//! connector tables, NET proxy. Every stage ends in [`agree`], so all
//! ranks fail together; what a failed stage leaves behind is released by
//! the `Drop` of the values built so far (in reverse order of creation).

use super::abi::GcConn;
use super::backend::CudaBackend;
use super::cache::StepStore;
use super::caps::caps;
use super::driver;
use super::exchange::{self, RankSetup};
use super::handles::{EventPool, IpcMapping, Stream};
use super::layout::*;
use super::lower::DeviceTargets;
use super::memory::{bind, DevMem, DeviceCtx, LiveOnDevice};
use super::module::Kernels;
use super::net::{self, NetLayout, NetProxy};
use super::peer_mem::{self, CopyEngines, FdMesh};
use super::profile::HostProfile;
use super::resident::Resident;
use super::shm::{self, Segment};
use super::state::CudaShared;
use crate::backend::shared::calibrate;
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

/// Whether every rank succeeded a bring-up stage (collective): our own
/// error wins, else the ranks that failed `what` are named.
fn agree<T>(mpi: &MpiComm, mine: Result<T>, what: &str) -> Result<T> {
    setup::agree(mpi, mine, |failed| {
        Error::Backend(format!(
            "CUDA backend setup: ranks {failed:?} could not {what}"
        ))
    })
}

/// `GPUCOLL_P2P_DISABLE=1` (parsed, validated and agreed across ranks in
/// [`Config`]): connectors in host shared memory instead of peer device
/// memory.
pub fn p2p_disabled(config: &Config) -> bool {
    config.p2p_disable
}

/// A positive integer from the environment, if set and valid.
fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&v| v > 0)
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

/// What stage 2 agrees on, identical on all ranks (but `ords`' use).
struct Agreed {
    /// Every rank's part of the exchange (pid, segment nonce, start time).
    ranks: Vec<RankSetup>,
    pids: Vec<u32>,
    transport: Transport,
    layout: Layout,
    /// Ranks on other nodes, reached through NET connectors.
    net_layout: NetLayout,
    /// Ranks of the communicator on the GPU that has the most of them.
    sharers: usize,
}

/// Stage 2: identities, device ordinals, P2P feasibility, channels and
/// slot size (the smallest request of all ranks wins).
fn negotiate(
    mpi: &MpiComm,
    topo: &Topology,
    ctx: &DeviceCtx,
    multi: bool,
    p2p_off: bool,
    cuda_channels: Option<usize>,
) -> Result<Agreed> {
    let (rank, nranks) = (topo.rank, topo.nranks);
    let def_channels = if multi {
        NET_CHANNELS
    } else {
        p2p_channels(nranks)
    };
    let want_channels = cuda_channels.unwrap_or(def_channels).clamp(1, MAX_CHANNELS);
    // 0: no preference (the default for the agreed channel count).
    let want_slot = env_usize("GPUCOLL_CUDA_SLOT_KB")
        .map(|k| (k << 10).clamp(4 << 10, 4 << 20))
        .unwrap_or(0);
    let (gpu, sms) = gpu_identity(ctx, rank);
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
    };
    let all = mpi.allgather_bytes(&mine.encode())?;
    let ranks = exchange::parse(&all, nranks)?;
    let pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();
    let ords: Vec<i32> = ranks.iter().map(|r| r.ordinal).collect();
    let any_off = ranks.iter().any(|r| r.p2p_off);
    // Every rank must use the same layout: the smallest request wins, and
    // no more than the ranks sharing the busiest GPU can run side by side.
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
    // P2P (CUDA IPC) only within a node: every rank must reach the GPUs
    // of the ranks on its node.
    let can_p2p = (|| -> Result<bool> {
        for (r, &o) in ords.iter().enumerate() {
            if topo.same_node(r, rank) && o != ctx.ordinal {
                let peer = driver::device_get(o)?;
                if !driver::can_access_peer(ctx.dev, peer)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    })()
    .unwrap_or(false);
    let oks = mpi.allgather_bytes(&[can_p2p as u8])?;
    let transport = if any_off || oks.contains(&0) {
        Transport::Shm
    } else {
        Transport::P2p
    };
    let (channels, slot_bytes) = match (multi, transport) {
        (true, _) | (false, Transport::P2p) => (req_channels, req_slot),
        (false, Transport::Shm) => (
            MAX_CHANNELS_SHM.min(co_resident.unwrap_or(MAX_CHANNELS_SHM)),
            SLOT_BYTES_SHM,
        ),
    };
    let layout = Layout {
        nranks: nranks as u64,
        channels: channels as u64,
        slots: FIFO_SLOTS as u64,
        slot_bytes: slot_bytes as u64,
        // The one-shot path needs every peer mapped: single node only.
        direct: !multi && transport == Transport::P2p && nranks > 1 && nranks <= ONESHOT_MAX_RANKS,
    };
    let net_layout = NetLayout {
        peers: (0..nranks).filter(|&r| !topo.same_node(r, rank)).collect(),
        channels: layout.channels,
        slots: layout.slots,
        slot_bytes: layout.slot_bytes,
        // collnet's rails wherever there are several nodes.
        rail: multi,
    };
    Ok(Agreed {
        ranks,
        pids,
        transport,
        layout,
        net_layout,
        sharers,
    })
}

/// Stage 3: the control segments of every rank of our node (plus the FIFOs
/// for SHM), ours unlinked once everyone mapped it, registered with CUDA
/// where the kernels need them.
fn map_segments(mpi: &MpiComm, topo: &Topology, a: &Agreed) -> Result<Vec<Arc<Segment>>> {
    let local_rank = topo.local_rank();
    let seg_bytes = shm::CONTROL_BYTES
        + match a.transport {
            Transport::Shm => a.layout.total() as usize,
            Transport::P2p => 0,
        };
    let seg_bytes = seg_bytes.div_ceil(4096) * 4096;
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
            // Peers' control words are written by our streams too: SHM
            // FIFOs, and the copy-engine flags of the direct path.
            if l == local_rank || a.transport == Transport::Shm || a.layout.direct {
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

/// Stage 4's result: the FIFO memory of every rank of our node. Fields
/// drop in order: the peers' mappings, then our block.
struct Fifos {
    /// Peers' P2P blocks opened through IPC.
    peers: Vec<IpcMapping>,
    /// Our P2P block (None for SHM: the FIFOs are in the segments).
    block: Option<DevMem>,
    /// Every rank's FIFO area in our address space, 0 for ranks on other
    /// nodes.
    bases: Vec<u64>,
}

/// Stage 4: FIFO memory of every rank of our node, as device addresses
/// by rank.
fn map_fifos(mpi: &MpiComm, topo: &Topology, a: &Agreed, segs: &[Arc<Segment>]) -> Result<Fifos> {
    let (rank, nranks) = (topo.rank, topo.nranks);
    let node: &[usize] = &topo.nodes[topo.node()];
    if a.transport == Transport::Shm {
        let mut bases = vec![0u64; nranks];
        for (l, &r) in node.iter().enumerate() {
            bases[r] = segs[l].dev_at(shm::CONTROL_BYTES)?;
        }
        return Ok(Fifos {
            peers: Vec::new(),
            block: None,
            bases,
        });
    }
    let block = DevMem::zeroed(a.layout.total() as usize)
        .and_then(|m| driver::ipc_get_handle(m.ptr).map(|h| (m, h)));
    let (block, handle) = agree(mpi, block, "allocate and export their FIFO memory")?;
    let handles = mpi.allgather_bytes(&handle)?;
    if handles.len() != nranks * driver::IPC_HANDLE_BYTES {
        return Err(Error::Backend(
            "CUDA IPC handle exchange was truncated".into(),
        ));
    }
    let mut bases = vec![0u64; nranks];
    bases[rank] = block.ptr;
    let mut peers = Vec::new();
    let opened: Result<()> = (|| {
        for r in 0..nranks {
            if r == rank || !topo.same_node(r, rank) {
                continue;
            }
            let mut hh = [0u8; driver::IPC_HANDLE_BYTES];
            hh.copy_from_slice(
                &handles[r * driver::IPC_HANDLE_BYTES..(r + 1) * driver::IPC_HANDLE_BYTES],
            );
            let m = IpcMapping::open(&hh)?;
            bases[r] = m.ptr();
            peers.push(m);
        }
        Ok(())
    })();
    // On failure the mappings opened so far close, then the block is freed.
    let fifos = Fifos {
        peers,
        block: Some(block),
        bases,
    };
    agree(mpi, opened, "open their peers' FIFO memory (CUDA IPC)")?;
    Ok(fifos)
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
        let (rank, nranks) = (topo.rank, topo.nranks);
        setup::check_topology(&mpi, topo)?;
        // Ranks on other (real or simulated) nodes are reached through NET
        // connectors: every rank agrees on this from the topology.
        let multi = topo.nnodes() > 1;
        let local_rank = topo.local_rank();
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
        let a = negotiate(
            &mpi,
            topo,
            &local.ctx,
            multi,
            p2p_disabled(config),
            config.cuda_channels,
        )?;
        let segs = map_segments(&mpi, topo, &a)?;
        let mesh = fd_links(&mpi, topo, &a, config)?;
        let fifos = map_fifos(&mpi, topo, &a, &segs)?;

        // Stage 4b (multi-node): our NET block (staging and receive FIFOs
        // of every inter-node pair, in pinned host memory mapped into the
        // GPU) and the private MPI duplicate its proxy talks over.
        // With the rails of collnet: one communicator per channel of the
        // ranks with our local index, ordered by node (as the host
        // backend's), so channels never interleave their all-reduces.
        let net_parts = if multi {
            let parts = mpi.dup().and_then(|comm| {
                let rails = if a.net_layout.rail {
                    let rail = mpi
                        .split(Some(topo.local_rank() as u32), topo.node() as i32)?
                        .ok_or_else(|| {
                            Error::Backend("MPI_Comm_split gave no rail communicator".into())
                        })?;
                    (0..a.net_layout.channels)
                        .map(|_| rail.dup())
                        .collect::<Result<Vec<_>>>()?
                } else {
                    Vec::new()
                };
                net::alloc_block(&a.net_layout).map(|(m, d)| (m, d, comm, rails))
            });
            Some(agree(&mpi, parts, "set up their NET connectors")?)
        } else {
            None
        };
        let net_dev = net_parts.as_ref().map(|p| p.1).unwrap_or(0);

        // Stage 4c (multi-node): the NET hop and the rail measured, as the
        // host backend does, so the tuner weighs ring, tree and collnet on
        // this cluster's figures; every rank adopts the slowest rank's.
        let inter_costs = match net_parts.as_ref().and_then(|p| p.3.first()) {
            Some(r) => {
                let t = std::time::Instant::now();
                let m = agree(&mpi, calibrate::measure(r), "measure inter-node costs")?;
                let bridge = crate::tune::caps::links::CUDA_NET_BRIDGE_US;
                Some(calibrate::agreed_costs(&mpi, m, topo.nnodes(), t, bridge)?)
            }
            None => None,
        };

        // Stage 5: connector tables.
        let (send, recv) = conn_tables(rank, &a.layout, &fifos.bases, &a.net_layout, net_dev);
        let tables = upload_conns(&send, &recv);
        let (send_conns, recv_conns) = agree(&mpi, tables, "upload their connector tables")?;

        // Start the proxy last: from here on nothing fails but its start.
        let net = match net_parts {
            None => None,
            Some((block, _, comm, rails)) => {
                let started = NetProxy::start(
                    comm,
                    rails,
                    a.net_layout.clone(),
                    block,
                    segs.clone(),
                    local_rank,
                    rank,
                );
                // A proxy that started where another rank failed is stopped
                // (joined, requests cancelled) inside `agree`.
                Some(agree(&mpi, started, "start their NET proxy thread")?)
            }
        };
        let own = &segs[local_rank];
        let target = DeviceTargets {
            rank,
            nranks,
            layout: a.layout,
            send_conns: send_conns.ptr,
            recv_conns: recv_conns.ptr,
            abort_word: own.dev_at(0)?,
            status: own.dev_at(shm::STATUS_OFF)?,
            oneshot_bases: if a.layout.direct {
                fifos
                    .bases
                    .iter()
                    .map(|b| b + a.layout.oneshot_off())
                    .collect()
            } else {
                Vec::new()
            },
            rail: a.net_layout.rail.then_some(local_rank as u32),
        };
        let Local {
            ctx,
            stream,
            kernels,
        } = local;
        let Fifos { peers, block, .. } = fifos;
        let local_peers = topo.nodes[topo.node()]
            .iter()
            .filter(|&&r| r != rank)
            .map(|&r| Peer {
                rank: r,
                pid: a.pids[r],
                start: a.ranks[r].start,
            })
            .collect();
        let ce = CopyEngines::new(ctx.ordinal, config.registered, config.ce_batch, mesh);
        let resident = match config.resident {
            ResidentMode::On => true,
            ResidentMode::Auto => a.sharers <= 1,
            ResidentMode::Off => false,
        };
        // Local: without it this rank launches every call, which the
        // peers cannot tell from a resident block.
        let resident = if resident && a.layout.direct {
            Resident::create(config.resident_linger, config.legacy_stream_order)
                .map_err(|e| tracing::warn!(rank, "resident block unavailable: {e}"))
                .ok()
        } else {
            None
        };
        let inner = Arc::new(CudaShared {
            ce,
            profile: HostProfile::new(config.profile_host),
            liveness: PeerLiveness::new(local_peers),
            rank,
            nranks,
            live: LiveOnDevice::new(ctx.ordinal),
            ctx,
            target,
            timeout: config.timeout,
            _peer_blocks: peers,
            stream,
            kernels,
            net,
            local_rank,
            segs,
            failure: Failure::default(),
            fifo: block,
            mpi: mpi.clone(),
            _send_conns: send_conns,
            _recv_conns: recv_conns,
            store: StepStore::default(),
            events: EventPool::default(),
            order: Mutex::new(Default::default()),
            resident,
            graph_keep: Mutex::new(Vec::new()),
        });
        let caps = caps(&a.layout, a.transport, inter_costs);
        log_ready(&inner, topo, &a);
        Ok(CudaBackend::from_parts(inner, caps))
    }
}

/// Which transport reaches each peer, e.g. "1:p2p 2:net 3:net", and the
/// agreed geometry.
fn log_ready(inner: &CudaShared, topo: &Topology, a: &Agreed) {
    let rank = inner.rank;
    let intra_name = match a.transport {
        Transport::P2p => "p2p",
        Transport::Shm => "shm",
    };
    let peers = (0..inner.nranks)
        .filter(|&p| p != rank)
        .map(|p| {
            let t = if a.net_layout.index_of(p).is_some() {
                "net"
            } else {
                intra_name
            };
            format!("{p}:{t}")
        })
        .collect::<Vec<_>>()
        .join(" ");
    tracing::info!(
        rank,
        gpu = inner.ctx.ordinal,
        pci = driver::device_pci_bus_id(inner.ctx.dev).unwrap_or_default(),
        transport = ?a.transport,
        nodes = topo.nnodes(),
        channels = a.layout.channels,
        slot_bytes = a.layout.slot_bytes,
        local_size = topo.local_size(),
        fifo_bytes = a.layout.total(),
        net_bytes = if topo.nnodes() > 1 { a.net_layout.total() } else { 0 },
        peers = %peers,
        resident = inner.resident.is_some(),
        "cuda backend ready"
    );
}

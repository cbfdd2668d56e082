//! `#[repr(C)]` mirrors of the structs in `kernels/gpucoll.cuh`, field by
//! field (sizes are asserted here and by `static_assert`s in the kernel).

/// Step kinds.
pub(crate) const STEP_FLOW: u32 = 0;
pub(crate) const STEP_EXCHANGE: u32 = 1;

/// Flow flags.
pub(crate) const FLAG_REDUCE: u32 = 1;
pub(crate) const FLAG_PRE_OP: u32 = 2;
pub(crate) const FLAG_POST_OP: u32 = 4;
/// Combine functions (`GC_OP_*`); the last six exist for integers only.
pub(crate) const OP_SUM: u32 = 0;
pub(crate) const OP_PROD: u32 = 1;
pub(crate) const OP_MIN: u32 = 2;
pub(crate) const OP_MAX: u32 = 3;
pub(crate) const OP_BAND: u32 = 4;
pub(crate) const OP_BOR: u32 = 5;
pub(crate) const OP_BXOR: u32 = 6;
pub(crate) const OP_LAND: u32 = 7;
pub(crate) const OP_LOR: u32 = 8;
pub(crate) const OP_LXOR: u32 = 9;
/// `GC_FLAG_LL`: the direct one-shot uses LL lines.
pub(crate) const FLAG_LL: u32 = 8;
/// `GC_LL_HEADER_LINES`: header lines before an LL inbox's data lines.
pub(crate) const LL_HEADER_LINES: u64 = 64;

/// Error codes in [`GcChanStatus::code`].
pub(crate) const ERR_NONE: u32 = 0;
pub(crate) const ERR_ABORTED: u32 = 1;
pub(crate) const ERR_META: u32 = 2;
pub(crate) const ERR_BAD_STEP: u32 = 3;
pub(crate) const ERR_COUNTERS: u32 = 4;

/// Connector layout (receiver side): tail at 0, meta at 128, data at 256.
pub(crate) const CONN_TAIL_OFF: u64 = 0;
pub(crate) const CONN_META_OFF: u64 = 128;
pub(crate) const CONN_HEADER: u64 = 256;
/// Bytes per head word slot (its own lines).
pub(crate) const HEAD_STRIDE: u64 = 128;

pub(crate) const MAX_PEERS: usize = 3;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcStep {
    pub src: u64,
    pub dst: u64,
    pub count: u64,
    pub kind: u32,
    pub flags: u32,
    pub nrecv: u32,
    pub nsend: u32,
    pub recv: [u32; MAX_PEERS],
    pub send: [u32; MAX_PEERS],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcConn {
    /// Slot 0 (in the receiver's memory).
    pub data: u64,
    /// meta[0] (receiver's memory).
    pub meta: u64,
    /// Tail word (receiver's memory).
    pub tail: u64,
    /// Head word (sender's memory).
    pub head: u64,
    /// Pieces moved so far (kernel-maintained).
    pub step: u64,
    pub pad: [u64; 3],
}

/// `GcGroupEntry`: one item's steps on one channel of a group launch.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcGroupEntry {
    pub item: u32,
    pub pad: u32,
    pub first: u32,
    pub nsteps: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcChan {
    pub channel: u32,
    pub first: u32,
    pub nsteps: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcChanStatus {
    pub code: u32,
    pub peer: u32,
    pub got: u64,
    pub want: u64,
    pub progress: u64,
    pub pad: [u64; 4],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcArgs {
    pub steps: u64,
    pub chans: u64,
    pub send: u64,
    pub recv: u64,
    pub abort_word: u64,
    pub status: u64,
    pub scale: f64,
    pub iscale: u64,
    pub div: u64,
    pub nranks: u32,
    pub rank: u32,
    pub slot_bytes: u32,
    pub slots: u32,
    pub seq: u32,
    pub op: u32,
    /// Group launch: `*const GcArgs` (one per call); 0 for a single call.
    pub items: u64,
    /// Group launch: `*const GcGroupEntry`.
    pub entries: u64,
}

/// `GC_DIRECT_MAX_RANKS`.
pub(crate) const DIRECT_RANKS: usize = 8;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcDirectArgs {
    pub input: u64,
    pub output: u64,
    pub count: u64,
    pub abort_word: u64,
    pub status: u64,
    pub scale: f64,
    pub iscale: u64,
    pub div: u64,
    pub ctl: u64,
    pub meta: u64,
    pub parity_bytes: u64,
    pub ll_off: u64,
    pub nranks: u32,
    pub rank: u32,
    pub op: u32,
    pub flags: u32,
    pub put_data: [u64; DIRECT_RANKS],
    pub put_flag: [u64; DIRECT_RANKS],
    pub get_data: [u64; DIRECT_RANKS],
    pub get_flag: [u64; DIRECT_RANKS],
}

const _: () = assert!(std::mem::size_of::<GcDirectArgs>() == 368);
const _: () = assert!(std::mem::size_of::<GcStep>() == 64);
const _: () = assert!(std::mem::size_of::<GcConn>() == 64);
const _: () = assert!(std::mem::size_of::<GcChan>() == 16);
const _: () = assert!(std::mem::size_of::<GcGroupEntry>() == 16);
const _: () = assert!(std::mem::size_of::<GcChanStatus>() == 64);
const _: () = assert!(std::mem::size_of::<GcArgs>() == 112);

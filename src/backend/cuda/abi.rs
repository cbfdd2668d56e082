//! `#[repr(C)]` mirrors of the structs in `kernels/gpucoll.cuh`, field by
//! field. The tests below compare every field's offset and size, every
//! struct's size and alignment and every constant with the header as nvcc
//! lays it out (`build/abi_layout.rs` generates the C side), so a field
//! changed on one side only fails `cargo test`.

use crate::datatype::Datatype;

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
/// `GC_OP_SIGNED`: ORed into the op of signed integer data, which runs on
/// the unsigned kernel of its width.
pub(crate) const OP_SIGNED: u32 = 256;
/// `GC_OP_MASK`: the bits of the op code proper.
pub(crate) const OP_MASK: u32 = 255;

/// The datatype whose kernel runs `dtype`: signed integers run on the
/// unsigned kernel of their width (add, mul and the bitwise ops are the
/// same bits; the kernel reads [`OP_SIGNED`] for min, max and division),
/// which keeps the kernel build short.
pub(crate) fn kernel_dtype(dtype: Datatype) -> Datatype {
    match dtype {
        Datatype::I8 => Datatype::U8,
        Datatype::I32 => Datatype::U32,
        Datatype::I64 => Datatype::U64,
        d => d,
    }
}
/// `GC_FLAG_LL`: the one-shot uses LL lines.
pub(crate) const FLAG_LL: u32 = 8;
/// `GC_FLAG_NOTIFY`: the one-shot kernel stores its end into `GcChanStatus::done`.
pub(crate) const FLAG_NOTIFY: u32 = 16;
/// `GC_ONESHOT_KIND_SHIFT`: the one-shot kernel's collective, in flags bits 8..11.
pub(crate) const ONESHOT_KIND_SHIFT: u32 = 8;
/// `GC_ONESHOT_ALL_REDUCE` and the other collectives of the one-shot kernel.
pub(crate) const ONESHOT_ALL_REDUCE: u32 = 0;
pub(crate) const ONESHOT_ALL_GATHER: u32 = 1;
pub(crate) const ONESHOT_REDUCE_SCATTER: u32 = 2;
pub(crate) const ONESHOT_ALL_TO_ALL: u32 = 3;
pub(crate) const ONESHOT_BROADCAST: u32 = 4;
pub(crate) const ONESHOT_REDUCE: u32 = 5;
pub(crate) const ONESHOT_GATHER: u32 = 6;
pub(crate) const ONESHOT_SCATTER: u32 = 7;
/// `GC_ONESHOT_ROOT_SHIFT`: the root of a rooted one-shot, in flags bits 12..15.
pub(crate) const ONESHOT_ROOT_SHIFT: u32 = 12;
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
    /// Channel 0: seq + 1 of the last launch whose blocks all finished.
    pub done: u64,
    pub pad: [u64; 3],
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
    /// 1: store the launch's end into `GcChanStatus::done`.
    pub notify: u32,
    pub pad: u32,
}

/// `GC_ONESHOT_MAX_RANKS`.
pub(crate) const ONESHOT_RANKS: usize = 8;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcOneShotArgs {
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
    pub put_data: [u64; ONESHOT_RANKS],
    pub put_flag: [u64; ONESHOT_RANKS],
    pub get_data: [u64; ONESHOT_RANKS],
    pub get_flag: [u64; ONESHOT_RANKS],
}

/// `GcFlag`: one direct-path flag. The backend addresses the flag arrays by
/// byte offset; this mirror pins their 16-byte element in the layout test.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(dead_code)]
pub(crate) struct GcFlag {
    pub epoch: u64,
    pub meta: u64,
}

/// `GcOneShotCtl`: the one-shot kernels' launch counter (one epoch per
/// block), at the start of the one-shot area (addressed by offset; mirrored
/// for the layout test).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)]
pub(crate) struct GcOneShotCtl {
    pub done: u32,
    pub pad: u32,
    /// `GC_ONESHOT_MAX_BLOCKS` entries (the backend's `ONESHOT_MAX_BLOCKS`).
    pub epochs: [u64; 64],
}

/// `GC_RESIDENT_ARGS_OFF`: the posted call's LL lines in the resident
/// kernel's mailbox, after the `GcResidentBox` header.
pub(crate) const RESIDENT_ARGS_OFF: u64 = 64;
/// `GC_RESIDENT_LINES`: a `GcOneShotArgs` as 8-byte words, then one word of
/// datatype and grid, each in a 16-byte LL line.
pub(crate) const RESIDENT_LINES: u64 = 47;
/// `GC_DT_*`: the resident kernel's datatypes.
pub(crate) const DT_U8: u32 = 0;
pub(crate) const DT_U32: u32 = 1;
pub(crate) const DT_U64: u32 = 2;
pub(crate) const DT_F16: u32 = 3;
pub(crate) const DT_BF16: u32 = 4;
pub(crate) const DT_F32: u32 = 5;
pub(crate) const DT_F64: u32 = 6;

/// The resident kernel's code for the kernel datatype of `dtype`.
pub(crate) fn resident_dtype(dtype: Datatype) -> u32 {
    match kernel_dtype(dtype) {
        Datatype::U8 => DT_U8,
        Datatype::U32 => DT_U32,
        Datatype::U64 => DT_U64,
        Datatype::F16 => DT_F16,
        Datatype::BF16 => DT_BF16,
        Datatype::F32 => DT_F32,
        _ => DT_F64,
    }
}

/// `GcResidentBox`: the header of the resident kernel's mailbox in pinned
/// host memory (written through volatile stores by both sides; mirrored
/// for the layout test and for its offsets).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcResidentBox {
    pub quit: u64,
    pub left_gen: u64,
    pub left_taken: u64,
    pub pad: [u64; 5],
}

/// `GcResidentArgs`: the resident kernel's arguments.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcResidentArgs {
    pub mailbox: u64,
    pub gen: u64,
    pub taken: u64,
    pub linger_ns: u64,
    pub abort_word: u64,
}

/// `GcPeerArgs`: the peer kernels' arguments (registered buffers).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GcPeerArgs {
    pub count: u64,
    pub scale: f64,
    pub iscale: u64,
    pub div: u64,
    pub nranks: u32,
    pub rank: u32,
    pub op: u32,
    pub flags: u32,
    pub input: [u64; ONESHOT_RANKS],
    pub output: [u64; ONESHOT_RANKS],
}

const _: () = assert!(std::mem::size_of::<GcOneShotArgs>() == 368);
const _: () = assert!(std::mem::size_of::<GcPeerArgs>() == 176);
const _: () = assert!(std::mem::size_of::<GcStep>() == 64);
const _: () = assert!(std::mem::size_of::<GcConn>() == 64);
const _: () = assert!(std::mem::size_of::<GcChan>() == 16);
const _: () = assert!(std::mem::size_of::<GcGroupEntry>() == 16);
const _: () = assert!(std::mem::size_of::<GcChanStatus>() == 64);
const _: () = assert!(std::mem::size_of::<GcArgs>() == 120);
const _: () = assert!(std::mem::size_of::<GcResidentBox>() as u64 == RESIDENT_ARGS_OFF);
const _: () = assert!(std::mem::size_of::<GcResidentArgs>() == 40);
const _: () = assert!(std::mem::size_of::<GcOneShotArgs>() as u64 / 8 + 1 == RESIDENT_LINES);

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    // C_STRUCTS, C_FIELDS and C_CONSTS: kernels/gpucoll.cuh as nvcc lays it out.
    include!(concat!(env!("OUT_DIR"), "/abi_layout.rs"));

    /// One Rust mirror: name, size, alignment, (field, offset, size) in
    /// declaration order.
    type RustLayout = (
        &'static str,
        usize,
        usize,
        Vec<(&'static str, usize, usize)>,
    );

    fn size_of_field<S, F>(_: fn(&S) -> &F) -> usize {
        size_of::<F>()
    }

    /// The layout of a Rust mirror, fields in memory order. The list must
    /// name every field: the destructuring fails to compile when one is
    /// missing.
    macro_rules! rust_layout {
        ($t:ident { $($f:ident),* $(,)? }) => {{
            let _every_field_listed = |v: $t| {
                let $t { $($f: _),* } = v;
            };
            let mut fields = vec![$((
                stringify!($f),
                offset_of!($t, $f),
                size_of_field::<$t, _>(|v| &v.$f),
            )),*];
            fields.sort_by_key(|f| f.1);
            (stringify!($t), size_of::<$t>(), align_of::<$t>(), fields)
        }};
    }

    /// The C struct each Rust mirror stands for (both connector sides are one
    /// Rust type).
    fn mirrors() -> Vec<(&'static str, RustLayout)> {
        let conn = || {
            rust_layout!(GcConn {
                data,
                meta,
                tail,
                head,
                step,
                pad
            })
        };
        vec![
            (
                "GcStep",
                rust_layout!(GcStep {
                    src,
                    dst,
                    count,
                    kind,
                    flags,
                    nrecv,
                    nsend,
                    recv,
                    send
                }),
            ),
            ("GcSendConn", conn()),
            ("GcRecvConn", conn()),
            (
                "GcChan",
                rust_layout!(GcChan {
                    channel,
                    first,
                    nsteps,
                    pad
                }),
            ),
            (
                "GcChanStatus",
                rust_layout!(GcChanStatus {
                    code,
                    peer,
                    got,
                    want,
                    progress,
                    done,
                    pad
                }),
            ),
            (
                "GcGroupEntry",
                rust_layout!(GcGroupEntry {
                    item,
                    pad,
                    first,
                    nsteps
                }),
            ),
            (
                "GcArgs",
                rust_layout!(GcArgs {
                    steps,
                    chans,
                    send,
                    recv,
                    abort_word,
                    status,
                    scale,
                    iscale,
                    div,
                    nranks,
                    rank,
                    slot_bytes,
                    slots,
                    seq,
                    op,
                    items,
                    entries,
                    notify,
                    pad,
                }),
            ),
            ("GcFlag", rust_layout!(GcFlag { epoch, meta })),
            (
                "GcOneShotCtl",
                rust_layout!(GcOneShotCtl { done, pad, epochs }),
            ),
            (
                "GcOneShotArgs",
                rust_layout!(GcOneShotArgs {
                    input,
                    output,
                    count,
                    abort_word,
                    status,
                    scale,
                    iscale,
                    div,
                    ctl,
                    meta,
                    parity_bytes,
                    ll_off,
                    nranks,
                    rank,
                    op,
                    flags,
                    put_data,
                    put_flag,
                    get_data,
                    get_flag,
                }),
            ),
            (
                "GcResidentBox",
                rust_layout!(GcResidentBox {
                    quit,
                    left_gen,
                    left_taken,
                    pad
                }),
            ),
            (
                "GcResidentArgs",
                rust_layout!(GcResidentArgs {
                    mailbox,
                    gen,
                    taken,
                    linger_ns,
                    abort_word
                }),
            ),
            (
                "GcPeerArgs",
                rust_layout!(GcPeerArgs {
                    count,
                    scale,
                    iscale,
                    div,
                    nranks,
                    rank,
                    op,
                    flags,
                    input,
                    output,
                }),
            ),
        ]
    }

    /// Every mismatch between the header and the mirrors, one line each.
    fn struct_mismatches() -> Vec<String> {
        let mirrors = mirrors();
        let mut bad = Vec::new();
        for &(c_name, size, align) in C_STRUCTS {
            let Some((_, (r_name, r_size, r_align, r_fields))) =
                mirrors.iter().find(|(c, _)| *c == c_name)
            else {
                bad.push(format!(
                    "struct {c_name} of gpucoll.cuh has no Rust mirror in abi.rs"
                ));
                continue;
            };
            if (size, align) != (*r_size, *r_align) {
                bad.push(format!(
                    "{c_name}: C size {size} align {align}, Rust {r_name} size {r_size} align {r_align}"
                ));
            }
            let c_fields: Vec<(&str, usize, usize)> = C_FIELDS
                .iter()
                .filter(|f| f.0 == c_name)
                .map(|f| (f.1, f.2, f.3))
                .collect();
            if c_fields.len() != r_fields.len() {
                bad.push(format!(
                    "{c_name}: {} fields in C, {} in Rust {r_name}",
                    c_fields.len(),
                    r_fields.len()
                ));
            }
            for (c, r) in c_fields.iter().zip(r_fields) {
                if c != r {
                    bad.push(format!(
                        "{c_name}: C field {} at offset {} size {}, Rust {r_name}.{} at offset {} size {}",
                        c.0, c.1, c.2, r.0, r.1, r.2
                    ));
                }
            }
        }
        for (c_name, _) in &mirrors {
            if !C_STRUCTS.iter().any(|s| s.0 == *c_name) {
                bad.push(format!(
                    "Rust mirrors struct {c_name}, which gpucoll.cuh lacks"
                ));
            }
        }
        bad
    }

    /// Constants of the header with their Rust value.
    fn mirrored_consts() -> Vec<(&'static str, u64)> {
        vec![
            ("GC_MAX_PEERS", MAX_PEERS as u64),
            ("GC_STEP_FLOW", STEP_FLOW.into()),
            ("GC_STEP_EXCHANGE", STEP_EXCHANGE.into()),
            ("GC_FLAG_REDUCE", FLAG_REDUCE.into()),
            ("GC_FLAG_PRE_OP", FLAG_PRE_OP.into()),
            ("GC_FLAG_POST_OP", FLAG_POST_OP.into()),
            ("GC_FLAG_LL", FLAG_LL.into()),
            ("GC_FLAG_NOTIFY", FLAG_NOTIFY.into()),
            ("GC_ONESHOT_KIND_SHIFT", ONESHOT_KIND_SHIFT.into()),
            ("GC_ONESHOT_ALL_REDUCE", ONESHOT_ALL_REDUCE.into()),
            ("GC_ONESHOT_ALL_GATHER", ONESHOT_ALL_GATHER.into()),
            ("GC_ONESHOT_REDUCE_SCATTER", ONESHOT_REDUCE_SCATTER.into()),
            ("GC_ONESHOT_ALL_TO_ALL", ONESHOT_ALL_TO_ALL.into()),
            ("GC_ONESHOT_BROADCAST", ONESHOT_BROADCAST.into()),
            ("GC_ONESHOT_REDUCE", ONESHOT_REDUCE.into()),
            ("GC_ONESHOT_GATHER", ONESHOT_GATHER.into()),
            ("GC_ONESHOT_SCATTER", ONESHOT_SCATTER.into()),
            ("GC_ONESHOT_ROOT_SHIFT", ONESHOT_ROOT_SHIFT.into()),
            ("GC_ERR_NONE", ERR_NONE.into()),
            ("GC_ERR_ABORTED", ERR_ABORTED.into()),
            ("GC_ERR_META", ERR_META.into()),
            ("GC_ERR_BAD_STEP", ERR_BAD_STEP.into()),
            ("GC_ERR_COUNTERS", ERR_COUNTERS.into()),
            ("GC_CONN_TAIL_OFF", CONN_TAIL_OFF),
            ("GC_CONN_META_OFF", CONN_META_OFF),
            ("GC_CONN_HEADER", CONN_HEADER),
            ("GC_HEAD_STRIDE", HEAD_STRIDE),
            ("GC_ONESHOT_MAX_RANKS", ONESHOT_RANKS as u64),
            ("GC_LL_HEADER_LINES", LL_HEADER_LINES),
            ("GC_OP_SUM", OP_SUM.into()),
            ("GC_OP_PROD", OP_PROD.into()),
            ("GC_OP_MIN", OP_MIN.into()),
            ("GC_OP_MAX", OP_MAX.into()),
            ("GC_OP_BAND", OP_BAND.into()),
            ("GC_OP_BOR", OP_BOR.into()),
            ("GC_OP_BXOR", OP_BXOR.into()),
            ("GC_OP_LAND", OP_LAND.into()),
            ("GC_OP_LOR", OP_LOR.into()),
            ("GC_OP_LXOR", OP_LXOR.into()),
            ("GC_OP_SIGNED", OP_SIGNED.into()),
            ("GC_RESIDENT_ARGS_OFF", RESIDENT_ARGS_OFF),
            ("GC_RESIDENT_LINES", RESIDENT_LINES),
            ("GC_DT_U8", DT_U8.into()),
            ("GC_DT_U32", DT_U32.into()),
            ("GC_DT_U64", DT_U64.into()),
            ("GC_DT_F16", DT_F16.into()),
            ("GC_DT_BF16", DT_BF16.into()),
            ("GC_DT_F32", DT_F32.into()),
            ("GC_DT_F64", DT_F64.into()),
            ("GC_OP_MASK", OP_MASK.into()),
        ]
    }

    /// Constants of the header that abi.rs does not define: the backend
    /// keeps its own copy (`ONESHOT_MAX_BLOCKS`), checked by the GPU runs.
    const UNMIRRORED_CONSTS: &[&str] = &["GC_ONESHOT_MAX_BLOCKS"];

    fn const_mismatches() -> Vec<String> {
        let rust = mirrored_consts();
        let mut bad = Vec::new();
        for &(name, value) in C_CONSTS {
            match rust.iter().find(|(n, _)| *n == name) {
                Some(&(_, r)) if r != value => {
                    bad.push(format!("{name}: {value} in gpucoll.cuh, {r} in abi.rs"))
                }
                Some(_) => {}
                None if UNMIRRORED_CONSTS.contains(&name) => {}
                None => bad.push(format!(
                    "{name} of gpucoll.cuh is neither mirrored in abi.rs nor listed as unmirrored"
                )),
            }
        }
        for (name, _) in &rust {
            if !C_CONSTS.iter().any(|c| c.0 == *name) {
                bad.push(format!("abi.rs mirrors {name}, which gpucoll.cuh lacks"));
            }
        }
        bad
    }

    #[test]
    fn structs_match_the_kernel_header_field_by_field() {
        let bad = struct_mismatches();
        assert!(
            bad.is_empty(),
            "kernels/gpucoll.cuh and abi.rs disagree:\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn constants_match_the_kernel_header() {
        let bad = const_mismatches();
        assert!(
            bad.is_empty(),
            "kernels/gpucoll.cuh and abi.rs disagree:\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn the_probe_saw_every_struct_of_the_header() {
        // Guards the generated tables themselves: an empty or truncated
        // probe output would make the comparisons above vacuous.
        assert_eq!(C_STRUCTS.len(), mirrors().len());
        let fields: usize = mirrors().iter().map(|(_, l)| l.3.len()).sum();
        assert_eq!(C_FIELDS.len(), fields);
    }
}

// Plain-old-data structures and constants shared by the kernels and the
// Rust side. src/backend/cuda/abi.rs mirrors every struct field by field;
// its tests compare each field's offset and size and each constant with this
// header (build.rs reads it: one `<fixed-width type> name;` per line).
#pragma once
#include <stdint.h>

#define GC_MAX_PEERS 3

// Step kinds.
#define GC_STEP_FLOW 0u
#define GC_STEP_EXCHANGE 1u

// Flow flags.
#define GC_FLAG_REDUCE 1u
#define GC_FLAG_PRE_OP 2u
#define GC_FLAG_POST_OP 4u

// Combine functions (same order as crate::op::Combine).
#define GC_OP_SUM 0u
#define GC_OP_PROD 1u
#define GC_OP_MIN 2u
#define GC_OP_MAX 3u
// Integer types only (the host rejects them on floats); logical ops yield 1/0.
#define GC_OP_BAND 4u
#define GC_OP_BOR 5u
#define GC_OP_BXOR 6u
#define GC_OP_LAND 7u
#define GC_OP_LOR 8u
#define GC_OP_LXOR 9u
// ORed into the op of signed integer data, which runs on the unsigned kernel
// of its width (one kernel per width keeps the build short): add, mul, the
// pre-op scale and the bitwise and logical ops are the same bits either way;
// min, max and the post-op division read this bit.
#define GC_OP_SIGNED 256u
#define GC_OP_MASK 255u

// Error codes written into GcChanStatus::code.
#define GC_ERR_NONE 0u
#define GC_ERR_ABORTED 1u   // the abort word was raised (timeout, peer failure)
#define GC_ERR_META 2u      // a received slot carried the wrong (seq, bytes)
#define GC_ERR_BAD_STEP 3u  // a step the kernel cannot execute
#define GC_ERR_COUNTERS 4u  // connector counters inconsistent

// Byte offsets inside one connector (receiver side).
#define GC_CONN_TAIL_OFF 0
#define GC_CONN_META_OFF 128
#define GC_CONN_HEADER 256   // enough for 16 slots of metadata
#define GC_HEAD_STRIDE 128   // one head word per cache line pair

// One step of one channel: 64 bytes.
struct GcStep {
  uint64_t src;    // device address of the source piece 0 (0: none)
  uint64_t dst;    // device address of the destination (0: none)
  uint64_t count;  // elements
  uint32_t kind;   // GC_STEP_*
  uint32_t flags;  // GC_FLAG_*
  uint32_t nrecv;
  uint32_t nsend;
  uint32_t recv[GC_MAX_PEERS];  // peer ranks (Exchange: recv[0] = from)
  uint32_t send[GC_MAX_PEERS];  // peer ranks (Exchange: send[0] = to)
};

// The send side of a connector as this rank sees it: 64 bytes.
struct GcSendConn {
  uint64_t data;   // address of slot 0 in the receiver's memory
  uint64_t meta;   // address of the receiver's meta[0]
  uint64_t tail;   // address of the receiver's tail word
  uint64_t head;   // address of our head word (the receiver writes it)
  uint64_t step;   // pieces sent so far (persistent across launches)
  uint64_t pad[3];
};

// The receive side of a connector: 64 bytes.
struct GcRecvConn {
  uint64_t data;   // address of our slot 0
  uint64_t meta;   // address of our meta[0]
  uint64_t tail;   // address of our tail word (the sender writes it)
  uint64_t head;   // address of the sender's head word for us
  uint64_t step;   // pieces received so far (persistent across launches)
  uint64_t pad[3];
};

// Per-block work: which channel and which steps. 16 bytes.
struct GcChan {
  uint32_t channel;
  uint32_t first;
  uint32_t nsteps;
  uint32_t pad;
};

// Per-channel status in host-mapped memory: 64 bytes.
struct GcChanStatus {
  uint32_t code;      // GC_ERR_*
  uint32_t peer;      // peer involved in the error
  uint64_t got;       // metadata received (GC_ERR_META)
  uint64_t want;      // metadata expected
  uint64_t progress;  // changes while the kernel moves pieces (seq << 32 | pieces; epoch)
  // Channel 0 only: seq + 1 of the last launch whose blocks all finished,
  // stored by its last block, so a blocking call's host thread sees the end
  // by reading host memory instead of querying the stream (1.3 us a query).
  uint64_t done;
  uint64_t pad[3];
};

// One item's steps on one channel of a group launch: 16 bytes.
struct GcGroupEntry {
  uint32_t item;    // index into GcArgs::items
  uint32_t pad;
  uint32_t first;   // first step (index into the item's GcArgs::steps)
  uint32_t nsteps;
};

// Kernel arguments (passed by value).
struct GcArgs {
  uint64_t steps;      // const GcStep*
  uint64_t chans;      // const GcChan*, one per block
  uint64_t send;       // GcSendConn*, [channel * nranks + peer]
  uint64_t recv;       // GcRecvConn*, [channel * nranks + peer]
  uint64_t abort_word; // volatile uint64_t*, host-mapped (low half: host, high half: kernels)
  uint64_t status;     // GcChanStatus*, host-mapped, [channel]
  double scale;        // pre-op factor (floats)
  uint64_t iscale;     // pre-op factor converted to the integer type (bits)
  uint64_t div;        // post-op divisor
  uint32_t nranks;
  uint32_t rank;
  uint32_t slot_bytes;
  uint32_t slots;
  uint32_t seq;        // low 32 bits of the collective's sequence number
  uint32_t op;         // GC_OP_*
  // A group launch (several calls of this datatype): `chans` holds one
  // GcChan per block {channel, first entry, entry count}, `entries` the
  // GcGroupEntry list and `items` one GcArgs per call. 0 for a single call.
  uint64_t items;      // const GcArgs*
  uint64_t entries;    // const GcGroupEntry*
  // 1: the host waits for this launch by reading GcChanStatus::done (a
  // blocking call's last launch); 0: no store (its fences cost ~2 us).
  uint32_t notify;
  uint32_t pad;
};

// ------------------------------------------------------------ direct path
// One-shot all_reduce over peer memory mapped with CUDA IPC (single node,
// every peer P2P-mapped). Each rank's one-shot area starts with a control
// word pair (GcOneShotCtl, in its own device memory) and then holds, per
// parity (launch epoch & 1), a flag array [sender][block] of GcFlag and an
// inbox per sender. See kernels/oneshot.cuh for the protocol.
#define GC_ONESHOT_MAX_RANKS 8
#define GC_ONESHOT_MAX_BLOCKS 64
// Direct flag: the inbox holds LL lines (data and epoch in every 8 bytes)
// instead of raw data followed by a fenced flag.
#define GC_FLAG_LL 8u
// Direct flag: store the launch's end into GcChanStatus::done (GcArgs::notify).
#define GC_FLAG_NOTIFY 16u
// The collective a one-shot launch runs, in flags bits 8..11.
// Every rank exchanges one segment of `count` elements with every peer:
// all_reduce and all_gather send their whole input to each peer;
// reduce_scatter and all_to_all send peer p the input's segment p.
// all_reduce and reduce_scatter fold what arrives into one segment of
// output; all_gather and all_to_all place peer p's segment at output
// segment p. The rooted ones (root in flags bits 12..15) move data only
// between the root and the others: broadcast and scatter (segment p to
// peer p) from the root, reduce (folded at the root) and gather (placed
// at segment p of the root's output) to it; every rank still exchanges
// flags with every peer, so launches stay in step on all ranks.
#define GC_ONESHOT_KIND_SHIFT 8u
#define GC_ONESHOT_ALL_REDUCE 0u
#define GC_ONESHOT_ALL_GATHER 1u
#define GC_ONESHOT_REDUCE_SCATTER 2u
#define GC_ONESHOT_ALL_TO_ALL 3u
#define GC_ONESHOT_BROADCAST 4u
#define GC_ONESHOT_REDUCE 5u
#define GC_ONESHOT_GATHER 6u
#define GC_ONESHOT_SCATTER 7u
#define GC_ONESHOT_ROOT_SHIFT 12u
// LL lines before the data lines of an inbox: one header line per block.
#define GC_LL_HEADER_LINES GC_ONESHOT_MAX_BLOCKS

// One flag: the epoch (launch number, monotone) and the call's identity.
struct GcFlag {
  uint64_t epoch;
  uint64_t meta;  // seq << 32 | (bytes & 0xffffffff)
};

// The launch counter of the one-shot kernels, in the rank's own device
// memory (zeroed at creation), one entry per block. Block b of a launch of
// g blocks reads only epochs[b] at its start and, at its end, stores the
// launch's epoch into every entry j with j % g == b. So entry b is written
// in a launch only by the block that read it, every entry holds the same
// epoch once a launch ended (all blocks of the next launch agree, whatever
// its grid; a replayed CUDA graph sees fresh epochs), and no block waits
// for another's count (a fence and an atomic cost ~0.5 us a launch).
// Reading the largest of all entries instead raced: a block that started
// late could see an entry that a block of its own launch had already
// advanced. Only a launch the host waits for counts its finished blocks,
// for the last one to tell the host.
struct GcOneShotCtl {
  uint32_t done;  // blocks of the running notify launch that finished
  uint32_t pad;
  uint64_t epochs[GC_ONESHOT_MAX_BLOCKS];
};

// Kernel arguments of the one-shot kernels (passed by value): 368 bytes.
struct GcOneShotArgs {
  uint64_t input;
  uint64_t output;
  uint64_t count;       // elements of one segment (see GC_ONESHOT_KIND_SHIFT)
  uint64_t abort_word;  // as GcArgs
  uint64_t status;      // GcChanStatus*, [block]
  double scale;
  uint64_t iscale;
  uint64_t div;
  uint64_t ctl;         // GcOneShotCtl* in our own device memory
  uint64_t meta;        // seq << 32 | bytes
  uint64_t parity_bytes;  // distance from parity 0 to parity 1 of every address below
  uint64_t ll_off;      // LL lines of an inbox: inbox address + ll_off (kept apart from
                        // Simple data, whose bytes could look like LL flags)
  uint32_t nranks;
  uint32_t rank;
  uint32_t op;
  uint32_t flags;       // GC_FLAG_PRE_OP | GC_FLAG_POST_OP | GC_FLAG_LL | GC_FLAG_NOTIFY | kind << GC_ONESHOT_KIND_SHIFT
  uint64_t put_data[GC_ONESHOT_MAX_RANKS];  // peer p's inbox for us (parity 0)
  uint64_t put_flag[GC_ONESHOT_MAX_RANKS];  // peer p's GcFlag[MAX_BLOCKS] for us (parity 0)
  uint64_t get_data[GC_ONESHOT_MAX_RANKS];  // our inbox from peer p (parity 0)
  uint64_t get_flag[GC_ONESHOT_MAX_RANKS];  // our GcFlag[MAX_BLOCKS] from peer p (parity 0)
};

// -------------------------------------------------------- resident kernel
// One block that stays on the GPU between blocking one-shot calls
// (GPUCOLL_RESIDENT): the host writes each call into a mailbox in pinned
// host memory instead of launching a kernel, and the block runs the
// call's logical blocks one after another (all pushes first, then the
// folds), so the protocol is the one-shot's whatever the peers run. The
// call travels as LL lines (its GcOneShotArgs as 8-byte words, then the
// datatype and grid, each with the call number in both halves of its
// line), so one read of the lines across PCIe both finds a new call and
// brings it. The block leaves when the host asks (a generation number),
// when the abort word is raised, after a call that stopped, or after
// `linger_ns` without a call; it then records how many calls it had
// taken, so the host can tell a call posted as it left and launch again.
#define GC_RESIDENT_ARGS_OFF 64u  // the call's LL lines, after the mailbox header
#define GC_RESIDENT_LINES 47u     // sizeof(GcOneShotArgs) / 8, then {dtype, grid}
// Datatypes of the resident kernel (the one-shot kernels' element types).
#define GC_DT_U8 0u
#define GC_DT_U32 1u
#define GC_DT_U64 2u
#define GC_DT_F16 3u
#define GC_DT_BF16 4u
#define GC_DT_F32 5u
#define GC_DT_F64 6u

// The mailbox header (pinned host memory mapped into the device; 64 bytes).
struct GcResidentBox {
  uint64_t quit;        // host: generations up to this one leave
  uint64_t left_gen;    // kernel: the last generation that left
  uint64_t left_taken;  // kernel: calls it had taken when it left
  uint64_t pad[5];
};

// Kernel arguments of gc_resident (passed by value): 40 bytes.
struct GcResidentArgs {
  uint64_t mailbox;     // GcResidentBox*, device address of the host mapping
  uint64_t gen;         // this launch's generation
  uint64_t taken;       // calls taken before this launch (the next is taken + 1)
  uint64_t linger_ns;   // idle time before it leaves
  uint64_t abort_word;  // as GcArgs
};

// ------------------------------------------------------- registered buffers
// Kernel arguments of the peer kernels (gc_peer_*, passed by value): every
// rank's input and output mapped into this process (peer memory through
// CUDA IPC, agreed per call by the host; our own at index `rank`). The
// host hand-shakes with the peers on the stream before and after, so the
// kernel itself never waits. The collective and root are in `flags` as for
// the one-shot kernels (GC_ONESHOT_ALL_REDUCE, _REDUCE_SCATTER, _ALL_GATHER,
// _BROADCAST only), with GC_FLAG_PRE_OP (a scale every rank applies alike,
// float Avg) and GC_FLAG_POST_OP.
struct GcPeerArgs {
  uint64_t count;   // elements: the buffer (all_reduce, broadcast) or one rank's block
  double scale;     // pre-op factor (floats)
  uint64_t iscale;  // pre-op factor converted to the integer type (bits)
  uint64_t div;     // post-op divisor
  uint32_t nranks;
  uint32_t rank;
  uint32_t op;      // GC_OP_*
  uint32_t flags;
  uint64_t input[GC_ONESHOT_MAX_RANKS];
  uint64_t output[GC_ONESHOT_MAX_RANKS];
};

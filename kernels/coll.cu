// The kernels of gpucoll, one compilation unit (build.rs compiles every
// kernels/*.cu into one fatbin); the code lives in headers by concern:
//   gpucoll.cuh      the argument structs shared with src/backend/cuda/abi.rs
//   primitives.cuh   volatile loads/stores and LL lines
//   reduce.cuh       reduction arithmetic per datatype and op
//   fifo.cuh         the connector protocol (thread 0 of a block)
//   interpreter.cuh  the step interpreter (gc_run_*: Flow and Exchange steps)
//   oneshot.cuh      the one-shot all_reduce, all_gather, reduce_scatter
//                    and all_to_all (gc_oneshot_*)
//   peer.cuh         all_reduce, reduce_scatter, all_gather and broadcast on
//                    registered buffers, read and written in place (gc_peer_*)
//   resident.cuh     the one-shots of blocking calls posted to a block that
//                    stays on the GPU (gc_resident)
// Entry points: one kernel per datatype and path, resolved by name; signed
// integers run on the unsigned kernel of their width (see GC_OP_SIGNED).
#include "gpucoll.cuh"
#include "interpreter.cuh"
#include "oneshot.cuh"
#include "peer.cuh"
#include "resident.cuh"

#define GC_THREADS 512

#define GC_ONESHOT_KERNEL(name, T) \
  extern "C" __global__ void __launch_bounds__(GC_THREADS, 1) name(GcOneShotArgs a) { oneshot_op<T>(a); }

GC_ONESHOT_KERNEL(gc_oneshot_u8, uint8_t)
GC_ONESHOT_KERNEL(gc_oneshot_u32, uint32_t)
GC_ONESHOT_KERNEL(gc_oneshot_u64, uint64_t)
GC_ONESHOT_KERNEL(gc_oneshot_f16, __half)
GC_ONESHOT_KERNEL(gc_oneshot_bf16, __nv_bfloat16)
GC_ONESHOT_KERNEL(gc_oneshot_f32, float)
GC_ONESHOT_KERNEL(gc_oneshot_f64, double)

#define GC_PEER_KERNEL(name, T) \
  extern "C" __global__ void __launch_bounds__(GC_THREADS, 1) name(GcPeerArgs a) { peer_op<T>(a); }

GC_PEER_KERNEL(gc_peer_u8, uint8_t)
GC_PEER_KERNEL(gc_peer_u32, uint32_t)
GC_PEER_KERNEL(gc_peer_u64, uint64_t)
GC_PEER_KERNEL(gc_peer_f16, __half)
GC_PEER_KERNEL(gc_peer_bf16, __nv_bfloat16)
GC_PEER_KERNEL(gc_peer_f32, float)
GC_PEER_KERNEL(gc_peer_f64, double)

// Every datatype in one kernel: a program may mix them without sending the
// resident block away.
extern "C" __global__ void __launch_bounds__(GC_THREADS, 1) gc_resident(GcResidentArgs r) { resident_loop(r); }

// Eight 16-byte packs in flight per thread (measured 1-5% faster than four
// on 2xH200; one variant keeps the kernel build short).
// A launch the host waits for (`notify`): channel 0's descriptor counts
// the blocks that finished (its pad word: zero in every uploaded table,
// reset by the last block), the last one tells the host.
#define GC_KERNEL(name, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(GC_THREADS, 1) name(GcArgs a) {                \
    run_block<T, 8>(a);                                                                        \
    if (a.notify) {                                                                            \
      finish_launch(&reinterpret_cast<GcChan*>(a.chans)->pad, a.status, (uint64_t)a.seq + 1);  \
    }                                                                                          \
  }

GC_KERNEL(gc_run_u8, uint8_t)
GC_KERNEL(gc_run_u32, uint32_t)
GC_KERNEL(gc_run_u64, uint64_t)
GC_KERNEL(gc_run_f16, __half)
GC_KERNEL(gc_run_bf16, __nv_bfloat16)
GC_KERNEL(gc_run_f32, float)
GC_KERNEL(gc_run_f64, double)

static_assert(sizeof(GcStep) == 64, "GcStep layout");
static_assert(sizeof(GcSendConn) == 64, "GcSendConn layout");
static_assert(sizeof(GcRecvConn) == 64, "GcRecvConn layout");
static_assert(sizeof(GcChan) == 16, "GcChan layout");
static_assert(sizeof(GcChanStatus) == 64, "GcChanStatus layout");
static_assert(sizeof(GcArgs) == 120, "GcArgs layout");
static_assert(sizeof(GcOneShotArgs) == 112 + 4 * 8 * GC_ONESHOT_MAX_RANKS, "GcOneShotArgs layout");
static_assert(sizeof(GcPeerArgs) == 48 + 2 * 8 * GC_ONESHOT_MAX_RANKS, "GcPeerArgs layout");
static_assert(sizeof(GcOneShotCtl) == 8 + 8 * GC_ONESHOT_MAX_BLOCKS, "GcOneShotCtl layout");
static_assert(sizeof(GcFlag) == 16, "GcFlag layout");
static_assert(sizeof(GcGroupEntry) == 16, "GcGroupEntry layout");
static_assert(sizeof(GcResidentBox) == GC_RESIDENT_ARGS_OFF, "GcResidentBox layout");
static_assert(sizeof(GcOneShotArgs) / 8 + 1 == GC_RESIDENT_LINES, "GcOneShotArgs in resident lines");
static_assert(sizeof(GcResidentArgs) == 40, "GcResidentArgs layout");

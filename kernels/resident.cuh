// The resident kernel (gc_resident): one block that runs blocking one-shot
// calls posted by the host into a mailbox in pinned host memory, so a
// blocking call costs a store and a poll instead of a launch and a wait
// for it (see GcResidentBox in gpucoll.cuh for the protocol).
#pragma once
#include "gpucoll.cuh"
#include "oneshot.cuh"

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One posted call of `g` logical blocks: every block's pushes first, then
// every block's folds, so a peer waiting on any block is never held up by
// a fold of ours; then the launch counter advances and the host is told.
template <typename T> struct ResidentOp {
  template <uint32_t OP> struct F {
    static __device__ __forceinline__ void run(const GcOneShotArgs& a, uint64_t g, uint64_t e, int* stop) {
      const uint64_t poff = (e & 1) * a.parity_bytes;
      const bool ll = a.flags & GC_FLAG_LL;
      for (uint64_t b = 0; b < g; b++) {
        if (ll) {
          oneshot_ll_push<T>(a, e, poff, b, g);
        } else {
          oneshot_simple_push<T>(a, e, poff, b, g);
        }
      }
      for (uint64_t b = 0; b < g; b++) {
        if (ll) {
          oneshot_ll_take<T, OP>(a, e, poff, stop, b, g);
        } else {
          oneshot_simple_take<T, OP>(a, e, poff, stop, b, g);
        }
        __syncthreads();
        if (*stop) return;
      }
    }
  };
};

template <typename T>
__device__ __forceinline__ void resident_call(const GcOneShotArgs& a, uint64_t g, uint64_t e, int* stop) {
  dispatch_op<T, ResidentOp<T>::template F>(a.op, a, g, e, stop);
}

__device__ void resident_loop(const GcResidentArgs& r) {
  // The call: GcOneShotArgs as words, then {dtype, grid}.
  __shared__ uint64_t words[GC_RESIDENT_LINES];
  __shared__ uint64_t epoch;
  __shared__ int stop;
  const GcOneShotArgs& a = *reinterpret_cast<const GcOneShotArgs*>(words);
  GcResidentBox* box = reinterpret_cast<GcResidentBox*>(r.mailbox);
  const uint64_t lines = r.mailbox + GC_RESIDENT_ARGS_OFF;
  const uint64_t tid = threadIdx.x;
  uint64_t taken = r.taken;
  uint64_t idle_since = globaltimer_ns();
  uint32_t spins = 0;
  for (;;) {
    // Wait for every line of call taken + 1 (each look is one read across
    // PCIe per thread, 1.4 µs on H200, all at once: no sleep), or a reason
    // to leave (looked at by the thread after the lines; the abort word,
    // another read, every 16th look).
    const uint32_t want = (uint32_t)(taken + 1);
    bool leave = false;
    for (;;) {
      bool fresh = true, go = false;
      if (tid < GC_RESIDENT_LINES) {
        const uint4 x = ld_vol128(reinterpret_cast<const void*>(lines + tid * 16));
        fresh = x.y == want && x.w == want;
        words[tid] = (uint64_t)x.x | (uint64_t)x.z << 32;
      } else if (tid == GC_RESIDENT_LINES) {
        go = ld_vol64((uint64_t)&box->quit) >= r.gen || globaltimer_ns() - idle_since > r.linger_ns;
        if (++spins == 16) {
          spins = 0;
          go |= ld_vol64(r.abort_word) != 0;
        }
      }
      const int any_go = __syncthreads_or(go);
      // A call that arrived runs even when the block was about to leave.
      if (__syncthreads_and(fresh)) break;
      if (any_go) {
        leave = true;
        break;
      }
    }
    if (leave) break;
    const uint64_t dtype = words[GC_RESIDENT_LINES - 1] & 0xffffffffu;
    const uint64_t g = words[GC_RESIDENT_LINES - 1] >> 32;
    GcOneShotCtl* ctl = reinterpret_cast<GcOneShotCtl*>(a.ctl);
    // Every entry of the counter holds the last launch's epoch.
    if (tid == 0) {
      epoch = oneshot_epoch_load(ctl, 0);
      stop = 0;
    }
    __syncthreads();
    const uint64_t e = epoch;
    switch (dtype) {
      case GC_DT_U8: resident_call<uint8_t>(a, g, e, &stop); break;
      case GC_DT_U32: resident_call<uint32_t>(a, g, e, &stop); break;
      case GC_DT_U64: resident_call<uint64_t>(a, g, e, &stop); break;
      case GC_DT_F16: resident_call<__half>(a, g, e, &stop); break;
      case GC_DT_BF16: resident_call<__nv_bfloat16>(a, g, e, &stop); break;
      case GC_DT_F32: resident_call<float>(a, g, e, &stop); break;
      case GC_DT_F64: resident_call<double>(a, g, e, &stop); break;
      default:
        if (tid == 0) {
          oneshot_mark_aborted(a, 0, a.rank);
          stop = 1;
        }
    }
    taken++;
    __syncthreads();
    // A call that stopped leaves its error in the status words; the host
    // sees the kernel leave and reads them.
    if (stop) break;
    // Every thread's output stores (and the epochs: one block owns every
    // entry) reach the host before it is told: thread 0's system fence
    // after the barrier orders them.
    oneshot_epoch_store(ctl, 0, 1, e);
    __syncthreads();
    if (tid == 0) {
      __threadfence_system();
      st_vol64(a.status + offsetof(GcChanStatus, done), (a.meta >> 32) + 1);
    }
    idle_since = globaltimer_ns();
  }
  if (tid == 0) {
    st_vol64((uint64_t)&box->left_taken, taken);
    __threadfence_system();
    st_vol64((uint64_t)&box->left_gen, r.gen);
  }
}

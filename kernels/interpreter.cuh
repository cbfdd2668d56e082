// The step interpreter: one generic kernel per datatype that executes the
// per-channel step lists of src/plan/step.rs (Flow and Exchange) over the
// connectors set up by src/backend/cuda. One block per channel.
//
// A Flow or Exchange step moves in pieces of one FIFO slot; thread 0 takes
// the slots (fifo.cuh) and every thread then computes the piece.
#pragma once
#include "fifo.cuh"
#include "gpucoll.cuh"
#include "primitives.cuh"
#include "reduce.cuh"

// ------------------------------------------------------------ piece compute

#define GC_MAX_OUT (GC_MAX_PEERS + 1)

// What thread 0 prepares for every thread before a piece moves.
struct PieceShared {
  const char* src;  // local input (0: none)
  const char* rp[GC_MAX_PEERS];
  char* wp[GC_MAX_OUT];
  int nr;
  int nw;
  int pre;
  int post;
  uint64_t n;  // elements
  int stop;    // 1: leave the kernel (error recorded); 2: step done
};

template <typename T>
__device__ __forceinline__ T elem_value_first(const PieceShared& s, uint64_t i, const GcArgs& a, int& have) {
  T v{};
  have = 0;
  if (s.src) {
    v = reinterpret_cast<const T*>(s.src)[i];
    if (s.pre) v = Arith<T>::scale(v, a);
    have = 1;
  }
  return v;
}

// U consecutive-stride 16-byte packs (k, k + nt, ...) of one piece: every
// load is issued before the first combine, so each thread keeps U loads per
// input in flight (one outstanding 16-byte load per thread cannot fill a link).
template <typename T, uint32_t OP, int U>
__device__ __forceinline__ void packs(const PieceShared& s, const GcArgs& a, uint64_t k, uint64_t nt) {
  uint4 acc[U];
  int have = 0;
  if (s.src) {
#pragma unroll
    for (int u = 0; u < U; u++) acc[u] = *reinterpret_cast<const uint4*>(s.src + (k + u * nt) * 16);
    if (s.pre) {
#pragma unroll
      for (int u = 0; u < U; u++) scale_pack<T>(acc[u], a);
    }
    have = 1;
  }
  for (int r = 0; r < s.nr; r++) {
    uint4 x[U];
#pragma unroll
    for (int u = 0; u < U; u++) x[u] = ld_vol128(s.rp[r] + (k + u * nt) * 16);
    if (have) {
#pragma unroll
      for (int u = 0; u < U; u++) combine_pack<T, OP>(acc[u], x[u], a.op);
    } else {
#pragma unroll
      for (int u = 0; u < U; u++) acc[u] = x[u];
    }
    have = 1;
  }
  if (s.post) {
#pragma unroll
    for (int u = 0; u < U; u++) div_pack<T>(acc[u], a.div, a.op);
  }
  for (int w = 0; w < s.nw; w++) {
#pragma unroll
    for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(s.wp[w] + (k + u * nt) * 16) = acc[u];
  }
}

// value = pre(src) (+) recv[0] (+) recv[1] ... ; post-op; written to every output.
// GC_UNROLL: 16-byte packs in flight per thread and input (the gc_run_*
// kernels use 8).
template <typename T, uint32_t OP, int GC_UNROLL>
__device__ void compute(const PieceShared& s, const GcArgs& a) {
  const uint64_t n = s.n;
  const uint64_t tid = threadIdx.x, nt = blockDim.x;
  uintptr_t orall = (uintptr_t)s.src;
  for (int r = 0; r < s.nr; r++) orall |= (uintptr_t)s.rp[r];
  for (int w = 0; w < s.nw; w++) orall |= (uintptr_t)s.wp[w];
  constexpr int E = 16 / sizeof(T);
  uint64_t done = 0;
  if ((orall & 15) == 0) {
    const uint64_t npk = n / E;
    uint64_t k = tid;
    for (; k + (GC_UNROLL - 1) * nt < npk; k += GC_UNROLL * nt) packs<T, OP, GC_UNROLL>(s, a, k, nt);
    for (; k < npk; k += nt) packs<T, OP, 1>(s, a, k, nt);
    done = npk * E;
  }
  for (uint64_t i = done + tid; i < n; i += nt) {
    int have;
    T v = elem_value_first<T>(s, i, a, have);
    for (int r = 0; r < s.nr; r++) {
      T x = ld_vol_elem(reinterpret_cast<const T*>(s.rp[r]) + i);
      v = have ? combine<T, OP>(v, x, a.op) : x;
      have = 1;
    }
    if (s.post) v = Arith<T>::div(v, a.div, a.op);
    for (int w = 0; w < s.nw; w++) reinterpret_cast<T*>(s.wp[w])[i] = v;
  }
}

template <typename T, int U> struct ComputeOp {
  template <uint32_t OP> struct F {
    static __device__ __forceinline__ void run(const PieceShared& s, const GcArgs& a) { compute<T, OP, U>(s, a); }
  };
};

template <typename T, int U>
__device__ __forceinline__ void compute_op(const PieceShared& s, const GcArgs& a) {
  dispatch_op<T, ComputeOp<T, U>::template F>(a.op, s, a);
}

// ------------------------------------------------------------------ steps

template <typename T, int U>
__device__ bool run_flow(Ctx& c, const GcStep& stp, PieceShared& sh) {
  const GcArgs& a = *c.a;
  // A step with no peer uses no slot: one piece.
  const bool local = stp.nrecv == 0 && stp.nsend == 0;
  const uint64_t pe = local ? stp.count : a.slot_bytes / sizeof(T);
  const uint64_t npieces = (stp.count + pe - 1) / pe;
  const bool reduce = stp.flags & GC_FLAG_REDUCE;
  for (uint64_t piece = 0; piece < npieces; piece++) {
    const uint64_t off = piece * pe;
    const uint64_t n = min(pe, stp.count - off);
    const uint64_t bytes = n * sizeof(T);
    if (threadIdx.x == 0) {
      int stop = 0;
      sh.nr = stp.nrecv;
      sh.nw = 0;
      for (uint32_t i = 0; i < stp.nrecv && !stop; i++) {
        uint32_t p = stp.recv[i];
        if (!spin_until(c, p, [&] { return recv_ready(c, p); })) { stop = 1; break; }
        bool ok;
        sh.rp[i] = recv_slot(c, p, bytes, ok);
        if (!ok) stop = 1;
      }
      for (uint32_t i = 0; i < stp.nsend && !stop; i++) {
        uint32_t p = stp.send[i];
        if (!spin_until(c, p, [&] { return send_ready(c, p); })) { stop = 1; break; }
        send_meta(c, p, bytes);
        sh.wp[sh.nw++] = send_slot_ptr(c, p);
      }
      if (stp.dst) sh.wp[sh.nw++] = reinterpret_cast<char*>(stp.dst + off * sizeof(T));
      sh.src = stp.src ? reinterpret_cast<const char*>(stp.src + off * sizeof(T)) : nullptr;
      sh.pre = reduce && (stp.flags & GC_FLAG_PRE_OP) && stp.src;
      sh.post = reduce && (stp.flags & GC_FLAG_POST_OP);
      sh.n = n;
      sh.stop = stop;
    }
    __syncthreads();
    if (sh.stop) return false;
    compute_op<T, U>(sh, a);
    // Data to peers must land before their tail moves; reads of our slots
    // are complete once their values were stored (before the barrier).
    if (stp.nsend > 0) __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      for (uint32_t i = 0; i < stp.nsend; i++) send_publish(c, stp.send[i]);
      for (uint32_t i = 0; i < stp.nrecv; i++) recv_release(c, stp.recv[i]);
      bump_progress(c);
    }
    __syncthreads();
  }
  return true;
}

// Sends run ahead up to a FIFO; piece i is received only after piece i was
// sent, so an in-place exchange never overwrites data it has not sent.
template <typename T, int U>
__device__ bool run_exchange(Ctx& c, const GcStep& stp, PieceShared& sh) {
  const GcArgs& a = *c.a;
  const uint32_t to = stp.send[0], from = stp.recv[0];
  const uint64_t count = stp.count;
  if (to == a.rank || from == a.rank) {
    if (to != from) {
      if (threadIdx.x == 0) record_error(c, GC_ERR_BAD_STEP, to, 0, 0);
      return false;
    }
    // Exchange with ourselves: a local copy.
    if (stp.src != stp.dst) {
      const T* s = reinterpret_cast<const T*>(stp.src);
      T* d = reinterpret_cast<T*>(stp.dst);
      for (uint64_t i = threadIdx.x; i < count; i += blockDim.x) d[i] = s[i];
    }
    __syncthreads();
    return true;
  }
  const uint64_t pe = a.slot_bytes / sizeof(T);
  const uint64_t npieces = (count + pe - 1) / pe;
  __shared__ uint64_t sent, rcvd;
  __shared__ int action;  // 0 send, 1 recv
  if (threadIdx.x == 0) { sent = 0; rcvd = 0; }
  __syncthreads();
  for (;;) {
    if (threadIdx.x == 0) {
      int stop = 0;
      if (sent == npieces && rcvd == npieces) {
        stop = 2;
      } else {
        uint32_t spins = 0;
        for (;;) {
          if (sent < npieces && send_ready(c, to)) { action = 0; break; }
          if (rcvd < sent && recv_ready(c, from)) { action = 1; break; }
          if (++spins == GC_ABORT_SPINS) {
            spins = 0;
            if (aborted(a)) {
              record_error(c, GC_ERR_ABORTED, rcvd < sent ? from : to, 0, 0);
              stop = 1;
              break;
            }
          }
        }
      }
      if (!stop) {
        uint64_t piece = action == 0 ? sent : rcvd;
        uint64_t off = piece * pe;
        uint64_t n = min(pe, count - off);
        sh.n = n;
        sh.pre = 0;
        sh.post = 0;
        sh.nw = 1;
        if (action == 0) {
          sh.src = reinterpret_cast<const char*>(stp.src + off * sizeof(T));
          sh.nr = 0;
          send_meta(c, to, n * sizeof(T));
          sh.wp[0] = send_slot_ptr(c, to);
        } else {
          bool ok;
          sh.src = nullptr;
          sh.nr = 1;
          sh.rp[0] = recv_slot(c, from, n * sizeof(T), ok);
          sh.wp[0] = reinterpret_cast<char*>(stp.dst + off * sizeof(T));
          if (!ok) stop = 1;
        }
      }
      sh.stop = stop;
    }
    __syncthreads();
    if (sh.stop == 1) return false;
    if (sh.stop == 2) break;
    compute<T, GC_OP_SUM, U>(sh, a);  // a copy: one input, no reduction
    if (action == 0) __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      if (action == 0) {
        send_publish(c, to);
        sent += 1;
      } else {
        recv_release(c, from);
        rcvd += 1;
      }
      bump_progress(c);
    }
    __syncthreads();
  }
  __syncthreads();
  return true;
}

// Run channel descriptor `ch` of a launch with arguments `a`; false when
// the block must stop (an error was recorded or the abort word raised).
template <typename T, int U>
__device__ bool run_chan(const GcArgs& a, const GcChan ch) {
  __shared__ PieceShared sh;
  Ctx c;
  c.a = &a;
  c.sc = reinterpret_cast<GcSendConn*>(a.send) + (uint64_t)ch.channel * a.nranks;
  c.rc = reinterpret_cast<GcRecvConn*>(a.recv) + (uint64_t)ch.channel * a.nranks;
  c.status = a.status + (uint64_t)ch.channel * sizeof(GcChanStatus);
  // The host only watches the counter change: starting from the call's seq
  // (high half) instead of reading the old value spares a read of host
  // memory (~1 us over PCIe) at the start of every launch.
  c.progress = (uint64_t)a.seq << 32;
  const GcStep* steps = reinterpret_cast<const GcStep*>(a.steps) + ch.first;
  for (uint32_t i = 0; i < ch.nsteps; i++) {
    const GcStep stp = steps[i];
    bool ok;
    if (stp.count == 0) continue;
    if (stp.kind == GC_STEP_FLOW) {
      ok = run_flow<T, U>(c, stp, sh);
    } else if (stp.kind == GC_STEP_EXCHANGE) {
      ok = run_exchange<T, U>(c, stp, sh);
    } else {
      if (threadIdx.x == 0) record_error(c, GC_ERR_BAD_STEP, 0, stp.kind, 0);
      ok = false;
    }
    if (!ok) return false;
  }
  return true;
}

// One block: its channel descriptor, or in a group launch, the block's
// entries in order, each one call's steps with that call's arguments (calls
// of one channel share its connectors, so they run one after the other).
// One call site of run_chan keeps the kernel (and its build) small.
template <typename T, int U>
__device__ void run_block(const GcArgs& a) {
  const GcChan blk = reinterpret_cast<const GcChan*>(a.chans)[blockIdx.x];
  const bool group = a.items != 0;
  const uint32_t n = group ? blk.nsteps : 1;
  for (uint32_t i = 0; i < n; i++) {
    GcArgs ai = a;
    GcChan ch = blk;
    if (group) {
      const GcGroupEntry e = reinterpret_cast<const GcGroupEntry*>(a.entries)[blk.first + i];
      ai = reinterpret_cast<const GcArgs*>(a.items)[e.item];
      ch = GcChan{blk.channel, e.first, e.nsteps, 0};
    }
    if (!run_chan<T, U>(ai, ch)) return;
    __syncthreads();
  }
}

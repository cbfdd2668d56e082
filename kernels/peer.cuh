// The peer kernels (gc_peer_*): collectives on registered buffers, where
// every rank's input and output are mapped into every process. No FIFO and
// no flag: the host has agreed the buffers with the peers for this call and
// hand-shakes on the stream before the launch (every buffer it touches is
// ready) and after it (every peer is done with ours), so each thread just
// loads, folds and stores.
//  all_reduce      rank r owns shard r of the buffer: it reads that shard
//                  of every rank's input (rank order), folds, and writes the
//                  result into every rank's output (the peers' included:
//                  no receive copy anywhere);
//  reduce_scatter  rank r reads block r of every rank's input, folds, and
//                  writes its own output;
//  all_gather      rank r writes its input into block r of every output;
//  broadcast       the root writes its input into every output.
// In place, all_reduce, all_gather and broadcast touch every element from
// one rank only: a shard of an in-place all_reduce is read by its owner
// only, just before the same thread overwrites it. An in-place
// reduce_scatter would overwrite block 0 of its input while rank 0 reads
// it: the host never runs one here.
#pragma once
#include "gpucoll.cuh"
#include "primitives.cuh"
#include "reduce.cuh"

// Packs of 16 bytes per thread and round (their loads are in flight together).
#define GC_PEER_UNROLL 4

// Fold packs k, k + stride, ... (U of them) of every source in rank order,
// apply the post-op, store into every destination.
template <typename T, uint32_t OP, int U>
__device__ __forceinline__ void peer_fold_packs(const GcPeerArgs& a, const GcArgs& sa, const uint64_t* src, const uint64_t* dst,
                                                uint32_t ndst, uint64_t k, uint64_t stride) {
  uint4 acc[U];
  for (uint32_t p = 0; p < a.nranks; p++) {
    uint4 x[U];
#pragma unroll
    for (int u = 0; u < U; u++) x[u] = *reinterpret_cast<const uint4*>(src[p] + (k + u * stride) * 16);
    if (a.flags & GC_FLAG_PRE_OP) {
#pragma unroll
      for (int u = 0; u < U; u++) scale_pack<T>(x[u], sa);
    }
    fold_packs<T, OP, U>(acc, x, p, a.op);
  }
  if (a.flags & GC_FLAG_POST_OP) div_packs<T, U>(acc, a.div, a.op);
  for (uint32_t j = 0; j < ndst; j++) {
#pragma unroll
    for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(dst[j] + (k + u * stride) * 16) = acc[u];
  }
}

// The same for element i, where the buffers are not 16-byte aligned or
// past the last whole pack.
template <typename T, uint32_t OP>
__device__ __forceinline__ void peer_fold_elem(const GcPeerArgs& a, const GcArgs& sa, const uint64_t* src, const uint64_t* dst,
                                               uint32_t ndst, uint64_t i) {
  T acc{};
  for (uint32_t p = 0; p < a.nranks; p++) {
    T x = reinterpret_cast<const T*>(src[p])[i];
    if (a.flags & GC_FLAG_PRE_OP) x = Arith<T>::scale(x, sa);
    acc = p == 0 ? x : combine<T, OP>(acc, x, a.op);
  }
  if (a.flags & GC_FLAG_POST_OP) acc = Arith<T>::div(acc, a.div, a.op);
  for (uint32_t j = 0; j < ndst; j++) reinterpret_cast<T*>(dst[j])[i] = acc;
}

// Copy packs k, k + stride, ... (U of them) of `src` into every destination.
template <int U>
__device__ __forceinline__ void peer_copy_packs(uint64_t src, const uint64_t* dst, uint32_t ndst, uint64_t k, uint64_t stride) {
  uint4 x[U];
#pragma unroll
  for (int u = 0; u < U; u++) x[u] = *reinterpret_cast<const uint4*>(src + (k + u * stride) * 16);
  for (uint32_t j = 0; j < ndst; j++) {
#pragma unroll
    for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(dst[j] + (k + u * stride) * 16) = x[u];
  }
}

template <typename T, uint32_t OP>
__device__ void peer_collective(const GcPeerArgs& a) {
  constexpr int E = 16 / sizeof(T);
  constexpr uint64_t S = sizeof(T);
  constexpr int U = GC_PEER_UNROLL;
  // The scaling helpers read these fields of a GcArgs.
  GcArgs sa{};
  sa.scale = a.scale;
  sa.iscale = a.iscale;
  const uint32_t kind = (a.flags >> GC_ONESHOT_KIND_SHIFT) & 15u;
  const uint32_t root = (a.flags >> GC_ONESHOT_ROOT_SHIFT) & 15u;
  const uint32_t n = a.nranks, me = a.rank;
  uint64_t src[GC_ONESHOT_MAX_RANKS], dst[GC_ONESHOT_MAX_RANKS];
  uint32_t ndst = 0;
  uint64_t elems = 0;
  bool fold = false;
  // Destinations start at the next rank, so the ranks' stores spread over
  // the links instead of all reaching rank 0 first.
  if (kind == GC_ONESHOT_ALL_REDUCE) {
    // Shards of whole packs, so every shard starts 16-byte aligned when
    // the buffers do.
    const uint64_t per = ((a.count + n - 1) / n + E - 1) / E * E;
    const uint64_t lo = min(a.count, me * per), hi = min(a.count, lo + per);
    elems = hi - lo;
    fold = true;
    for (uint32_t p = 0; p < n; p++) src[p] = a.input[p] + lo * S;
    for (uint32_t j = 0; j < n; j++) dst[ndst++] = a.output[(me + 1 + j) % n] + lo * S;
  } else if (kind == GC_ONESHOT_REDUCE_SCATTER) {
    elems = a.count;
    fold = true;
    for (uint32_t p = 0; p < n; p++) src[p] = a.input[p] + me * a.count * S;
    dst[ndst++] = a.output[me];
  } else if (kind == GC_ONESHOT_ALL_GATHER || (kind == GC_ONESHOT_BROADCAST && me == root)) {
    elems = a.count;
    const uint64_t at = kind == GC_ONESHOT_ALL_GATHER ? me * a.count * S : 0;
    src[0] = a.input[me];
    for (uint32_t j = 0; j < n; j++) {
      const uint64_t d = a.output[(me + 1 + j) % n] + at;
      if (d != src[0]) dst[ndst++] = d;  // in place: already there
    }
  }
  if (elems == 0 || ndst == 0) return;
  const uint32_t nsrc = fold ? n : 1;
  uint64_t bits = 0;
  for (uint32_t p = 0; p < nsrc; p++) bits |= src[p];
  for (uint32_t j = 0; j < ndst; j++) bits |= dst[j];
  const uint64_t gt = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const uint64_t gs = (uint64_t)gridDim.x * blockDim.x;
  uint64_t done = 0;
  if ((bits & 15) == 0) {
    const uint64_t npk = elems / E;
    uint64_t k = gt;
    if (fold) {
      for (; k + (U - 1) * gs < npk; k += U * gs) peer_fold_packs<T, OP, U>(a, sa, src, dst, ndst, k, gs);
      for (; k < npk; k += gs) peer_fold_packs<T, OP, 1>(a, sa, src, dst, ndst, k, gs);
    } else {
      for (; k + (U - 1) * gs < npk; k += U * gs) peer_copy_packs<U>(src[0], dst, ndst, k, gs);
      for (; k < npk; k += gs) peer_copy_packs<1>(src[0], dst, ndst, k, gs);
    }
    done = npk * E;
  }
  for (uint64_t i = done + gt; i < elems; i += gs) {
    if (fold) {
      peer_fold_elem<T, OP>(a, sa, src, dst, ndst, i);
    } else {
      const T v = reinterpret_cast<const T*>(src[0])[i];
      for (uint32_t j = 0; j < ndst; j++) reinterpret_cast<T*>(dst[j])[i] = v;
    }
  }
  // Our stores into peers' memory are visible to them before the stream's
  // closing flag, which follows the kernel.
  __threadfence_system();
}

template <typename T> struct PeerOp {
  template <uint32_t OP> struct F {
    static __device__ __forceinline__ void run(const GcPeerArgs& a) { peer_collective<T, OP>(a); }
  };
};

template <typename T>
__device__ void peer_op(const GcPeerArgs& a) {
  dispatch_op<T, PeerOp<T>::template F>(a.op, a);
}

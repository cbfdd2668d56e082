// The one-shot kernels (gc_oneshot_*) over peer memory mapped with
// CUDA IPC: all_reduce, all_gather, reduce_scatter and all_to_all of
// segments of `count` elements (GC_ONESHOT_KIND_SHIFT says which segment
// goes to which peer and what happens to what arrives), every block
// independent:
//  0. block b reads the epoch e = ctl.epochs[b] + 1 (each block of a launch
//     stores its epoch into the entries it owns at its end, GcOneShotCtl, so
//     all blocks of one launch agree and a replayed graph gets a fresh
//     epoch); parity = e & 1 selects one of two copies of every inbox and
//     flag.
//  Simple (GC_FLAG_LL clear):
//  1. block b writes meta into the peer's flag [us][b], pushes its slice
//     of (the peer's segment of) pre(input) into every peer's inbox
//     (NVLink stores), fences, then writes the epoch into that flag;
//  2. it waits until every peer's flag [peer][b] in our memory reached e and
//     checks its meta;
//  3. reductions: it folds its slice in rank order (own pre(input) segment
//     at position `rank`, the inboxes elsewhere), applies the post-op and
//     writes the output; gathers: it copies its slice of every inbox (and
//     of its own segment) to that peer's output segment.
//  LL (GC_FLAG_LL set; small messages): the inbox's LL area holds 16-byte lines
//  {data lo, e, data hi, e}; each 8-byte half is stored atomically, so a
//  line whose two flags equal e carries this launch's 8 data bytes and no
//  fence or separate flag is needed. Line b (< GC_LL_HEADER_LINES) is block
//  b's header {meta lo, e, meta hi, e}; data unit i (8 bytes) is line
//  GC_LL_HEADER_LINES + i. Thread 0 checks the headers, then every thread
//  waits for its own lines, reduces and writes.
// Double buffering by parity suffices: a peer can be at most one launch
// ahead (it cannot finish launch e+1 before we wrote our data of e+1, which
// we do only after launch e finished here), so it never overwrites a parity
// we still read. Launch numbers agree on all ranks because every rank picks
// the direct path for the same calls with the same grid.
#pragma once
#include "gpucoll.cuh"
#include "primitives.cuh"
#include "reduce.cuh"

// The collective of a direct launch (GC_ONESHOT_*) and its root.
__device__ __forceinline__ uint32_t oneshot_kind(const GcOneShotArgs& a) { return (a.flags >> GC_ONESHOT_KIND_SHIFT) & 15u; }
__device__ __forceinline__ uint32_t oneshot_root(const GcOneShotArgs& a) { return (a.flags >> GC_ONESHOT_ROOT_SHIFT) & 15u; }
// Whether peer p gets the input's segment p (else the whole input).
__device__ __forceinline__ bool oneshot_per_peer(uint32_t kind) {
  return kind == GC_ONESHOT_REDUCE_SCATTER || kind == GC_ONESHOT_ALL_TO_ALL || kind == GC_ONESHOT_SCATTER;
}
// Whether what arrives is folded (else placed).
__device__ __forceinline__ bool oneshot_folds(uint32_t kind) {
  return kind == GC_ONESHOT_ALL_REDUCE || kind == GC_ONESHOT_REDUCE_SCATTER || kind == GC_ONESHOT_REDUCE;
}
// Whether rank `me` pushes data to peer p (flags go to every peer).
__device__ __forceinline__ bool oneshot_sends(uint32_t kind, uint32_t me, uint32_t p, uint32_t root) {
  switch (kind) {
    case GC_ONESHOT_BROADCAST:
    case GC_ONESHOT_SCATTER: return me == root;
    case GC_ONESHOT_REDUCE:
    case GC_ONESHOT_GATHER: return p == root;
    default: return true;
  }
}
// Whether rank `me` writes output from rank p's data (p == me: its own),
// and at which output segment.
__device__ __forceinline__ bool oneshot_uses(uint32_t kind, uint32_t me, uint32_t p, uint32_t root) {
  switch (kind) {
    case GC_ONESHOT_BROADCAST:
    case GC_ONESHOT_SCATTER: return p == root;
    case GC_ONESHOT_REDUCE:
    case GC_ONESHOT_GATHER: return me == root;
    default: return true;
  }
}
__device__ __forceinline__ uint64_t oneshot_out_seg(uint32_t kind, uint32_t p) {
  return (kind == GC_ONESHOT_ALL_GATHER || kind == GC_ONESHOT_ALL_TO_ALL || kind == GC_ONESHOT_GATHER) ? p : 0;
}

// Fold packs k, k+nt, ... of this block's slice (byte offset `off`) in rank
// order: our own segment at `own`, the peers' from their inboxes.
template <typename T, uint32_t OP, int U>
__device__ __forceinline__ void oneshot_packs(const GcOneShotArgs& a, uint64_t own, uint64_t off, uint64_t poff, uint64_t k, uint64_t nt, const GcArgs& sa) {
  const bool pre = a.flags & GC_FLAG_PRE_OP;
  uint4 acc[U];
  for (uint32_t p = 0; p < a.nranks; p++) {
    uint4 x[U];
    if (p == a.rank) {
#pragma unroll
      for (int u = 0; u < U; u++) x[u] = *reinterpret_cast<const uint4*>(own + off + (k + u * nt) * 16);
      if (pre) {
#pragma unroll
        for (int u = 0; u < U; u++) scale_pack<T>(x[u], sa);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; u++) x[u] = ld_vol128(reinterpret_cast<const char*>(a.get_data[p] + poff + off) + (k + u * nt) * 16);
    }
    fold_packs<T, OP, U>(acc, x, p, a.op);
  }
  if (a.flags & GC_FLAG_POST_OP) div_packs<T, U>(acc, a.div, a.op);
#pragma unroll
  for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(a.output + off + (k + u * nt) * 16) = acc[u];
}

// Push packs k, k+nt, ... of `src` (pre-op applied) to peer `only`'s inbox,
// or to every peer's when `only` is nranks.
template <typename T, int U>
__device__ __forceinline__ void oneshot_push(const GcOneShotArgs& a, uint64_t src, uint32_t only, uint64_t off, uint64_t poff, uint64_t k, uint64_t nt, const GcArgs& sa) {
  uint4 x[U];
#pragma unroll
  for (int u = 0; u < U; u++) x[u] = *reinterpret_cast<const uint4*>(src + off + (k + u * nt) * 16);
  if (a.flags & GC_FLAG_PRE_OP) {
#pragma unroll
    for (int u = 0; u < U; u++) scale_pack<T>(x[u], sa);
  }
  const uint32_t kind = oneshot_kind(a), root = oneshot_root(a);
  for (uint32_t p = 0; p < a.nranks; p++) {
    if (p == a.rank || (only != a.nranks && p != only) || !oneshot_sends(kind, a.rank, p, root)) continue;
#pragma unroll
    for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(a.put_data[p] + poff + off + (k + u * nt) * 16) = x[u];
  }
}

// Copy packs k, k+nt, ... from `src` to `dst` (`vol`: src is a peer's inbox).
template <int U>
__device__ __forceinline__ void oneshot_copy(uint64_t src, uint64_t dst, bool vol, uint64_t k, uint64_t nt) {
  uint4 x[U];
#pragma unroll
  for (int u = 0; u < U; u++)
    x[u] = vol ? ld_vol128(reinterpret_cast<const char*>(src) + (k + u * nt) * 16)
               : *reinterpret_cast<const uint4*>(src + (k + u * nt) * 16);
#pragma unroll
  for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(dst + (k + u * nt) * 16) = x[u];
}

// Record GC_ERR_ABORTED for block `b` unless an error is recorded already.
__device__ __forceinline__ void oneshot_mark_aborted(const GcOneShotArgs& a, uint64_t b, uint32_t peer) {
  GcChanStatus* st = reinterpret_cast<GcChanStatus*>(a.status + b * sizeof(GcChanStatus));
  if (ld_vol32((uint64_t)&st->code) == GC_ERR_NONE) {
    st_vol32((uint64_t)&st->peer, peer);
    __threadfence_system();
    st_vol32((uint64_t)&st->code, GC_ERR_ABORTED);
  }
  __threadfence_system();
}

// Record a metadata mismatch with `peer` and raise the kernels' abort word.
__device__ __forceinline__ void oneshot_mark_meta(const GcOneShotArgs& a, uint64_t b, uint32_t peer, uint64_t got) {
  GcChanStatus* st = reinterpret_cast<GcChanStatus*>(a.status + b * sizeof(GcChanStatus));
  if (ld_vol32((uint64_t)&st->code) == GC_ERR_NONE) {
    st_vol32((uint64_t)&st->peer, peer);
    st_vol64((uint64_t)&st->got, got);
    st_vol64((uint64_t)&st->want, a.meta);
    __threadfence_system();
    st_vol32((uint64_t)&st->code, GC_ERR_META);
  }
  st_vol32(a.abort_word + 4, GC_ERR_META);
  __threadfence_system();
}

// The fields of a GcArgs the scaling helpers read, from the direct args.
__device__ __forceinline__ GcArgs oneshot_scale_args(const GcOneShotArgs& a) {
  GcArgs sa{};
  sa.scale = a.scale;
  sa.iscale = a.iscale;
  return sa;
}

// The slice of (logical) block `b` of `g` in a Simple one-shot: elements
// [lo, hi) of a segment, whole 16-byte packs except at the end.
template <typename T>
struct SimpleSlice {
  uint64_t lo, hi, n, off, seg, own;
  uint32_t kind, root;
  bool per_peer, folds, vec, pre;
  __device__ __forceinline__ SimpleSlice(const GcOneShotArgs& a, uint64_t b, uint64_t g) {
    constexpr int E = 16 / sizeof(T);
    const uint64_t per = ((a.count + g - 1) / g + E - 1) / E * E;
    lo = min(a.count, b * per);
    hi = min(a.count, lo + per);
    n = hi - lo;
    kind = oneshot_kind(a);
    root = oneshot_root(a);
    per_peer = oneshot_per_peer(kind);
    folds = oneshot_folds(kind);
    seg = a.count * sizeof(T);  // bytes of one segment
    // Segments other than the first are 16-byte aligned only if seg is.
    vec = ((a.input | a.output | (kind == GC_ONESHOT_ALL_REDUCE ? 0 : seg)) & 15) == 0;
    pre = a.flags & GC_FLAG_PRE_OP;
    off = lo * sizeof(T);                            // byte offset of this block's slice
    own = a.input + (per_peer ? a.rank * seg : 0);  // our own segment
  }
};

// Simple step 1 for (logical) block `b` of `g`: push its slice, fence, and
// raise our flag [us][b] in every peer.
template <typename T>
__device__ void oneshot_simple_push(const GcOneShotArgs& a, uint64_t e, uint64_t poff, uint64_t b, uint64_t g) {
  constexpr int E = 16 / sizeof(T);
  const GcArgs sa = oneshot_scale_args(a);
  const uint64_t tid = threadIdx.x, nt = blockDim.x;
  const SimpleSlice<T> s(a, b, g);
  const uint64_t n = s.n, off = s.off, seg = s.seg;
  const uint32_t kind = s.kind, root = s.root;
  const bool per_peer = s.per_peer, vec = s.vec, pre = s.pre;
  // Whether this rank pushes any data (rooted collectives: root or not).
  bool sender = false;
  for (uint32_t p = 0; p < a.nranks; p++) sender |= p != a.rank && oneshot_sends(kind, a.rank, p, root);
  // The meta goes first: a peer reads it only after our epoch below, and
  // it last read this parity's meta two launches ago, before it pushed the
  // launch we finished last.
  if (tid == 0) {
    for (uint32_t p = 0; p < a.nranks; p++)
      if (p != a.rank) st_vol64((uint64_t)&(reinterpret_cast<GcFlag*>(a.put_flag[p] + poff) + b)->meta, a.meta);
  }
  // 1. push (the whole input to all at once, or segment p to peer p)
  for (uint32_t q = 0; sender && q < (per_peer ? a.nranks : 1u); q++) {
    if (per_peer && q == a.rank) continue;
    const uint32_t only = per_peer ? q : a.nranks;
    const uint64_t src = a.input + (per_peer ? q * seg : 0);
    uint64_t done = 0;
    if (vec) {
      const uint64_t npk = n / E;
      uint64_t k = tid;
      for (; k + 3 * nt < npk; k += 4 * nt) oneshot_push<T, 4>(a, src, only, off, poff, k, nt, sa);
      for (; k < npk; k += nt) oneshot_push<T, 1>(a, src, only, off, poff, k, nt, sa);
      done = npk * E;
    }
    for (uint64_t i = done + tid; i < n; i += nt) {
      T v = reinterpret_cast<const T*>(src + off)[i];
      if (pre) v = Arith<T>::scale(v, sa);
      for (uint32_t p = 0; p < a.nranks; p++)
        if (p != a.rank && (only == a.nranks || p == only) && oneshot_sends(kind, a.rank, p, root))
          reinterpret_cast<T*>(a.put_data[p] + poff + off)[i] = v;
    }
  }
  // One system fence after the barrier orders every thread's pushes (and
  // the meta) before the epochs: the barrier puts them before the fence.
  __syncthreads();
  if (tid == 0) {
    __threadfence_system();
    for (uint32_t p = 0; p < a.nranks; p++)
      if (p != a.rank) st_vol64((uint64_t)&(reinterpret_cast<GcFlag*>(a.put_flag[p] + poff) + b)->epoch, e);
  }
}

// Simple steps 2-3 for (logical) block `b` of `g`: wait for every peer's
// flag [peer][b], then fold or place the slice.
template <typename T, uint32_t OP>
__device__ void oneshot_simple_take(const GcOneShotArgs& a, uint64_t e, uint64_t poff, int* stop, uint64_t b, uint64_t g) {
  constexpr int E = 16 / sizeof(T);
  const GcArgs sa = oneshot_scale_args(a);
  const uint64_t tid = threadIdx.x, nt = blockDim.x;
  const SimpleSlice<T> s(a, b, g);
  const uint64_t n = s.n, off = s.off, seg = s.seg, own = s.own;
  const uint32_t kind = s.kind, root = s.root;
  const bool folds = s.folds, vec = s.vec, pre = s.pre;
  if (tid == 0) {
    // 2. wait for every peer's slice
    for (uint32_t p = 0; p < a.nranks && !*stop; p++) {
      if (p == a.rank) continue;
      GcFlag* f = reinterpret_cast<GcFlag*>(a.get_flag[p] + poff) + b;
      uint32_t spins = 0;
      while (ld_vol64((uint64_t)&f->epoch) < e) {
        if (++spins == GC_ABORT_SPINS) {
          spins = 0;
          if (ld_vol64(a.abort_word) != 0) {
            oneshot_mark_aborted(a, b, p);
            *stop = 1;
            break;
          }
        }
      }
      if (*stop) break;
      __threadfence_system();
      uint64_t got = ld_vol64((uint64_t)&f->meta);
      if (got != a.meta) {
        oneshot_mark_meta(a, b, p, got);
        *stop = 1;
      }
    }
  }
  __syncthreads();
  if (*stop) return;
  if (!folds) {
    // 3. gathers: every used peer's slice (and our own) to its output segment
    for (uint32_t p = 0; p < a.nranks; p++) {
      if (!oneshot_uses(kind, a.rank, p, root)) continue;
      const bool mine = p == a.rank;
      const uint64_t src = (mine ? own : a.get_data[p] + poff) + off;
      const uint64_t dst = a.output + oneshot_out_seg(kind, p) * seg + off;
      if (src == dst) continue;  // in place
      uint64_t done = 0;
      if (vec) {
        const uint64_t npk = n / E;
        uint64_t k = tid;
        for (; k + 3 * nt < npk; k += 4 * nt) oneshot_copy<4>(src, dst, !mine, k, nt);
        for (; k < npk; k += nt) oneshot_copy<1>(src, dst, !mine, k, nt);
        done = npk * E;
      }
      for (uint64_t i = done + tid; i < n; i += nt)
        reinterpret_cast<T*>(dst)[i] = mine ? reinterpret_cast<const T*>(src)[i] : ld_vol_elem(reinterpret_cast<const T*>(src) + i);
    }
    return;
  }
  // 3. reduce in rank order (a reduce: at the root only)
  if (!oneshot_uses(kind, a.rank, a.rank, root)) return;
  uint64_t done = 0;
  if (vec) {
    const uint64_t npk = n / E;
    uint64_t k = tid;
    for (; k + 3 * nt < npk; k += 4 * nt) oneshot_packs<T, OP, 4>(a, own, off, poff, k, nt, sa);
    for (; k < npk; k += nt) oneshot_packs<T, OP, 1>(a, own, off, poff, k, nt, sa);
    done = npk * E;
  }
  for (uint64_t i = done + tid; i < n; i += nt) {
    T acc{};
    for (uint32_t p = 0; p < a.nranks; p++) {
      T x;
      if (p == a.rank) {
        x = reinterpret_cast<const T*>(own + off)[i];
        if (pre) x = Arith<T>::scale(x, sa);
      } else {
        x = ld_vol_elem(reinterpret_cast<const T*>(a.get_data[p] + poff + off) + i);
      }
      acc = p == 0 ? x : combine<T, OP>(acc, x, a.op);
    }
    if (a.flags & GC_FLAG_POST_OP) acc = Arith<T>::div(acc, a.div, a.op);
    reinterpret_cast<T*>(a.output + off)[i] = acc;
  }
}

// Unit `i` (8 bytes) of the segment at `base`, pre-op applied, as
// elements; missing elements past `count` are zero.
template <typename T>
__device__ __forceinline__ uint64_t ll_load_unit(const GcOneShotArgs& a, uint64_t base, uint64_t i, const GcArgs& sa) {
  constexpr int E8 = 8 / sizeof(T);
  T v[E8];
  const uint64_t first = i * E8;
  if ((base & 7) == 0 && first + E8 <= a.count) {
    uint64_t w = *reinterpret_cast<const uint64_t*>(base + i * 8);
    memcpy(v, &w, 8);
  } else {
#pragma unroll
    for (int j = 0; j < E8; j++) v[j] = first + j < a.count ? reinterpret_cast<const T*>(base)[first + j] : T{};
  }
  if (a.flags & GC_FLAG_PRE_OP) {
#pragma unroll
    for (int j = 0; j < E8; j++) v[j] = Arith<T>::scale(v[j], sa);
  }
  uint64_t w;
  memcpy(&w, v, 8);
  return w;
}

// Store unit `i` (8 bytes of elements) into the segment at `base`, up to
// `count` elements.
template <typename T>
__device__ __forceinline__ void ll_store_unit(const GcOneShotArgs& a, uint64_t base, uint64_t i, uint64_t w) {
  constexpr int E8 = 8 / sizeof(T);
  const uint64_t first = i * E8;
  if ((base & 7) == 0 && first + E8 <= a.count) {
    *reinterpret_cast<uint64_t*>(base + i * 8) = w;
  } else {
    T v[E8];
    memcpy(v, &w, 8);
#pragma unroll
    for (int j = 0; j < E8; j++)
      if (first + j < a.count) reinterpret_cast<T*>(base)[first + j] = v[j];
  }
}

// The units (8 bytes) of (logical) block `b` of `g` in an LL one-shot,
// [lo, hi) of a segment.
template <typename T>
struct LlSlice {
  uint64_t lo, hi, seg, own;
  uint32_t kind, root;
  bool per_peer, folds;
  __device__ __forceinline__ LlSlice(const GcOneShotArgs& a, uint64_t b, uint64_t g) {
    constexpr int E8 = 8 / sizeof(T);
    const uint64_t units = (a.count + E8 - 1) / E8;
    const uint64_t per = (units + g - 1) / g;
    lo = min(units, b * per);
    hi = min(units, lo + per);
    kind = oneshot_kind(a);
    root = oneshot_root(a);
    per_peer = oneshot_per_peer(kind);
    folds = oneshot_folds(kind);
    seg = a.count * sizeof(T);
    own = a.input + (per_peer ? a.rank * seg : 0);
  }
};

// LL step 1 for (logical) block `b` of `g` (see the protocol above): its
// header to every peer, its lines to those we send to.
template <typename T>
__device__ void oneshot_ll_push(const GcOneShotArgs& a, uint64_t e, uint64_t poff, uint64_t b, uint64_t g) {
  const GcArgs sa = oneshot_scale_args(a);
  const uint64_t tid = threadIdx.x, nt = blockDim.x;
  const uint32_t flag = (uint32_t)e;
  const LlSlice<T> s(a, b, g);
  const uint64_t lo = s.lo, hi = s.hi, seg = s.seg;
  const uint32_t kind = s.kind, root = s.root;
  const bool per_peer = s.per_peer;
  bool sender = false;
  for (uint32_t p = 0; p < a.nranks; p++) sender |= p != a.rank && oneshot_sends(kind, a.rank, p, root);
  if (tid == 0) {
    for (uint32_t p = 0; p < a.nranks; p++)
      if (p != a.rank) st_ll(a.put_data[p] + poff + a.ll_off + b * 16, a.meta, flag);
  }
  for (uint64_t i = lo + tid; sender && i < hi; i += nt) {
    if (per_peer) {
      for (uint32_t p = 0; p < a.nranks; p++)
        if (p != a.rank && oneshot_sends(kind, a.rank, p, root))
          st_ll(a.put_data[p] + poff + a.ll_off + (GC_LL_HEADER_LINES + i) * 16, ll_load_unit<T>(a, a.input + p * seg, i, sa), flag);
    } else {
      const uint64_t w = ll_load_unit<T>(a, a.input, i, sa);
      for (uint32_t p = 0; p < a.nranks; p++)
        if (p != a.rank && oneshot_sends(kind, a.rank, p, root))
          st_ll(a.put_data[p] + poff + a.ll_off + (GC_LL_HEADER_LINES + i) * 16, w, flag);
    }
  }
}

// LL steps 2-3 for (logical) block `b` of `g`: check the peers' headers,
// then fold or place every unit as its line arrives.
template <typename T, uint32_t OP>
__device__ void oneshot_ll_take(const GcOneShotArgs& a, uint64_t e, uint64_t poff, int* stop, uint64_t b, uint64_t g) {
  constexpr int E8 = 8 / sizeof(T);
  const GcArgs sa = oneshot_scale_args(a);
  const uint64_t tid = threadIdx.x, nt = blockDim.x;
  const uint32_t flag = (uint32_t)e;
  const LlSlice<T> s(a, b, g);
  const uint64_t lo = s.lo, hi = s.hi, seg = s.seg, own = s.own;
  const uint32_t kind = s.kind, root = s.root;
  const bool folds = s.folds;
  // 2. headers: the peers issued the same call
  if (tid == 0) {
    for (uint32_t p = 0; p < a.nranks && !*stop; p++) {
      if (p == a.rank) continue;
      uint64_t got;
      if (!ld_ll(a.get_data[p] + poff + a.ll_off + b * 16, flag, a.abort_word, &got)) {
        oneshot_mark_aborted(a, b, p);
        *stop = 1;
      } else if (got != a.meta) {
        oneshot_mark_meta(a, b, p, got);
        *stop = 1;
      }
    }
    if (!*stop) {
      GcChanStatus* st = reinterpret_cast<GcChanStatus*>(a.status + b * sizeof(GcChanStatus));
      // The launch epoch: new at every launch, and a store only (reading
      // the host-mapped counter would cost a PCIe round trip).
      st_vol64((uint64_t)&st->progress, e);
    }
  }
  __syncthreads();
  if (*stop) return;
  // 3. fold every unit in rank order, or place every used peer's unit
  bool aborted = false;
  for (uint64_t i = lo + tid; i < hi && !aborted; i += nt) {
    T acc[E8];
    for (uint32_t p = 0; p < a.nranks; p++) {
      if (!oneshot_uses(kind, a.rank, p, root)) continue;
      uint64_t w;
      if (p == a.rank) {
        if (!folds && own == a.output + oneshot_out_seg(kind, p) * seg) continue;  // in place
        w = ll_load_unit<T>(a, own, i, sa);
      } else if (!ld_ll(a.get_data[p] + poff + a.ll_off + (GC_LL_HEADER_LINES + i) * 16, flag, a.abort_word, &w)) {
        aborted = true;
        break;
      }
      if (!folds) {
        ll_store_unit<T>(a, a.output + oneshot_out_seg(kind, p) * seg, i, w);
        continue;
      }
      T x[E8];
      memcpy(x, &w, 8);
#pragma unroll
      for (int j = 0; j < E8; j++) acc[j] = p == 0 ? x[j] : combine<T, OP>(acc[j], x[j], a.op);
    }
    if (aborted || !folds || !oneshot_uses(kind, a.rank, a.rank, root)) continue;
    if (a.flags & GC_FLAG_POST_OP) {
#pragma unroll
      for (int j = 0; j < E8; j++) acc[j] = Arith<T>::div(acc[j], a.div, a.op);
    }
    uint64_t w;
    memcpy(&w, acc, 8);
    ll_store_unit<T>(a, a.output, i, w);
  }
  if (aborted) *stop = 1;  // benign race: every writer stores 1
  __syncthreads();
  if (*stop && tid == 0) oneshot_mark_aborted(a, b, a.rank);
}

// The epoch of block b's launch (thread 0 reads it into `epoch`).
__device__ __forceinline__ uint64_t oneshot_epoch_load(const GcOneShotCtl* ctl, uint64_t b) {
  return ld_vol64((uint64_t)&ctl->epochs[b]) + 1;
}
// Block b of g stores its epoch e into the entries it owns (GcOneShotCtl);
// every thread of the block calls it (one entry each, unless a small block
// of a one-block launch has fewer threads than entries).
__device__ __forceinline__ void oneshot_epoch_store(GcOneShotCtl* ctl, uint64_t b, uint64_t g, uint64_t e) {
  for (uint64_t j = b + threadIdx.x * g; j < GC_ONESHOT_MAX_BLOCKS; j += blockDim.x * g)
    st_vol64((uint64_t)&ctl->epochs[j], e);
}

template <typename T, uint32_t OP>
__device__ void oneshot_collective(const GcOneShotArgs& a) {
  __shared__ uint64_t epoch;
  __shared__ int stop;
  GcOneShotCtl* ctl = reinterpret_cast<GcOneShotCtl*>(a.ctl);
  const uint64_t b = blockIdx.x, g = gridDim.x;
  if (threadIdx.x == 0) {
    epoch = oneshot_epoch_load(ctl, b);
    stop = 0;
  }
  __syncthreads();
  const uint64_t e = epoch;
  const uint64_t poff = (e & 1) * a.parity_bytes;
  if (a.flags & GC_FLAG_LL) {
    oneshot_ll_push<T>(a, e, poff, b, g);
    oneshot_ll_take<T, OP>(a, e, poff, &stop, b, g);
  } else {
    oneshot_simple_push<T>(a, e, poff, b, g);
    oneshot_simple_take<T, OP>(a, e, poff, &stop, b, g);
  }
  const bool notify = a.flags & GC_FLAG_NOTIFY;
  // Every thread's output stores reach the GPU before its block counts
  // (only when the host is told and other blocks count too).
  if (notify && g > 1) __threadfence();
  __syncthreads();
  // A stopped block stores no epoch and never tells the host, which then
  // sees the end through the stream (the communicator has failed).
  if (stop) return;
  // The next launch reads the epochs (stream order publishes them). A
  // resident call, which may follow the done word, reads entry 0: thread 0
  // of block 0 stores it before the fences below.
  oneshot_epoch_store(ctl, b, g, e);
  if (threadIdx.x != 0 || !notify) return;
  if (g > 1) {
    __threadfence();
    if (atomicAdd(&ctl->done, 1u) != g - 1) return;
    ctl->done = 0;
  }
  // The last block tells a waiting host (GcChanStatus::done): thread 0's
  // system fence after the barrier orders every thread's output before it.
  __threadfence_system();
  st_vol64(a.status + offsetof(GcChanStatus, done), (a.meta >> 32) + 1);
}

template <typename T> struct OneShotOp {
  template <uint32_t OP> struct F {
    static __device__ __forceinline__ void run(const GcOneShotArgs& a) { oneshot_collective<T, OP>(a); }
  };
};

template <typename T>
__device__ void oneshot_op(const GcOneShotArgs& a) {
  dispatch_op<T, OneShotOp<T>::template F>(a.op, a);
}

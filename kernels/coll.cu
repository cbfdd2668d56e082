// The step interpreter: one generic kernel per datatype that executes the
// per-channel step lists of src/plan/step.rs (Flow and Exchange) over the
// connectors set up by src/backend/cuda. One block per channel.
//
// Connector protocol (NCCL's Simple protocol with `slots` slots):
//  * sender: wait until step - head < slots; write the piece into slot
//    step % slots of the receiver's FIFO; fence; write meta[slot] =
//    seq << 32 | bytes; fence; tail = step + 1.
//  * receiver: wait until tail > step; check meta[slot]; read the slot;
//    write the sender's head = step + 1.
// Thread 0 of the block waits and publishes; all threads move data.
#include "gpucoll.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#define GC_THREADS 512
#define GC_ABORT_SPINS 1024u

// ---------------------------------------------------------------- memory ops

__device__ __forceinline__ uint64_t ld_vol64(uint64_t addr) {
  return *reinterpret_cast<volatile uint64_t*>(addr);
}
__device__ __forceinline__ void st_vol64(uint64_t addr, uint64_t v) {
  *reinterpret_cast<volatile uint64_t*>(addr) = v;
}
__device__ __forceinline__ uint32_t ld_vol32(uint64_t addr) {
  return *reinterpret_cast<volatile uint32_t*>(addr);
}
__device__ __forceinline__ void st_vol32(uint64_t addr, uint32_t v) {
  *reinterpret_cast<volatile uint32_t*>(addr) = v;
}

// 16-byte load that bypasses L1 (the FIFO is written by another GPU or the host).
__device__ __forceinline__ uint4 ld_vol128(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int N> struct Bits;
template <> struct Bits<1> { typedef uint8_t type; };
template <> struct Bits<2> { typedef uint16_t type; };
template <> struct Bits<4> { typedef uint32_t type; };
template <> struct Bits<8> { typedef uint64_t type; };

template <typename T>
__device__ __forceinline__ T ld_vol_elem(const T* p) {
  typedef typename Bits<sizeof(T)>::type B;
  B b = *reinterpret_cast<const volatile B*>(p);
  T t;
  memcpy(&t, &b, sizeof(T));
  return t;
}

// --------------------------------------------------------------- arithmetic

template <typename T, typename U> struct IntArith {
  static __device__ __forceinline__ T add(T a, T b) { return (T)(U)((U)a + (U)b); }
  static __device__ __forceinline__ T mul(T a, T b) { return (T)(U)((U)a * (U)b); }
  static __device__ __forceinline__ T mn(T a, T b) { return a < b ? a : b; }
  static __device__ __forceinline__ T mx(T a, T b) { return a > b ? a : b; }
  static __device__ __forceinline__ T scale(T x, const GcArgs& a) {
    return mul(x, (T)a.iscale);
  }
  // GC_OP_BAND .. GC_OP_LXOR; the logical ones yield 1 or 0.
  template <uint32_t OP> static __device__ __forceinline__ T bits(T a, T b) {
    if (OP == GC_OP_BAND) return (T)(a & b);
    if (OP == GC_OP_BOR) return (T)(a | b);
    if (OP == GC_OP_BXOR) return (T)(a ^ b);
    if (OP == GC_OP_LAND) return (T)((a != 0) && (b != 0));
    if (OP == GC_OP_LOR) return (T)((a != 0) || (b != 0));
    return (T)((a != 0) != (b != 0));
  }
};

template <typename T> struct Arith;
template <> struct Arith<int8_t> : IntArith<int8_t, uint8_t> {
  static __device__ __forceinline__ int8_t div(int8_t x, uint64_t d) { return (int8_t)((int64_t)x / (int64_t)d); }
};
template <> struct Arith<uint8_t> : IntArith<uint8_t, uint8_t> {
  static __device__ __forceinline__ uint8_t div(uint8_t x, uint64_t d) { return (uint8_t)((uint64_t)x / d); }
};
template <> struct Arith<int32_t> : IntArith<int32_t, uint32_t> {
  static __device__ __forceinline__ int32_t div(int32_t x, uint64_t d) { return (int32_t)((int64_t)x / (int64_t)d); }
};
template <> struct Arith<uint32_t> : IntArith<uint32_t, uint32_t> {
  static __device__ __forceinline__ uint32_t div(uint32_t x, uint64_t d) { return (uint32_t)((uint64_t)x / d); }
};
template <> struct Arith<int64_t> : IntArith<int64_t, uint64_t> {
  static __device__ __forceinline__ int64_t div(int64_t x, uint64_t d) { return x / (int64_t)d; }
};
template <> struct Arith<uint64_t> : IntArith<uint64_t, uint64_t> {
  static __device__ __forceinline__ uint64_t div(uint64_t x, uint64_t d) { return x / d; }
};

template <> struct Arith<float> {
  static __device__ __forceinline__ float add(float a, float b) { return a + b; }
  static __device__ __forceinline__ float mul(float a, float b) { return a * b; }
  static __device__ __forceinline__ float mn(float a, float b) { return fminf(a, b); }
  static __device__ __forceinline__ float mx(float a, float b) { return fmaxf(a, b); }
  static __device__ __forceinline__ float scale(float x, const GcArgs& a) { return x * (float)a.scale; }
  static __device__ __forceinline__ float div(float x, uint64_t d) { return x / (float)d; }
};
template <> struct Arith<double> {
  static __device__ __forceinline__ double add(double a, double b) { return a + b; }
  static __device__ __forceinline__ double mul(double a, double b) { return a * b; }
  static __device__ __forceinline__ double mn(double a, double b) { return fmin(a, b); }
  static __device__ __forceinline__ double mx(double a, double b) { return fmax(a, b); }
  static __device__ __forceinline__ double scale(double x, const GcArgs& a) { return x * a.scale; }
  static __device__ __forceinline__ double div(double x, uint64_t d) { return x / (double)d; }
};

// Half types compute in float and round once per operation (as the host
// backend does).
template <typename H, typename Conv> struct HalfArith {
  static __device__ __forceinline__ H add(H a, H b) { return Conv::from(Conv::to(a) + Conv::to(b)); }
  static __device__ __forceinline__ H mul(H a, H b) { return Conv::from(Conv::to(a) * Conv::to(b)); }
  static __device__ __forceinline__ H mn(H a, H b) { return Conv::from(fminf(Conv::to(a), Conv::to(b))); }
  static __device__ __forceinline__ H mx(H a, H b) { return Conv::from(fmaxf(Conv::to(a), Conv::to(b))); }
  static __device__ __forceinline__ H scale(H x, const GcArgs& a) { return Conv::from(Conv::to(x) * (float)a.scale); }
  static __device__ __forceinline__ H div(H x, uint64_t d) { return Conv::from(Conv::to(x) / (float)d); }
};
struct ConvF16 {
  static __device__ __forceinline__ float to(__half h) { return __half2float(h); }
  static __device__ __forceinline__ __half from(float f) { return __float2half_rn(f); }
};
struct ConvBF16 {
  static __device__ __forceinline__ float to(__nv_bfloat16 h) { return __bfloat162float(h); }
  static __device__ __forceinline__ __nv_bfloat16 from(float f) { return __float2bfloat16_rn(f); }
};
template <> struct Arith<__half> : HalfArith<__half, ConvF16> {};
template <> struct Arith<__nv_bfloat16> : HalfArith<__nv_bfloat16, ConvBF16> {};

// The integer-only ops are instantiated for integer types only (see
// compute_op), so Arith of a float needs no `bits`.
template <typename T, uint32_t OP>
__device__ __forceinline__ T combine(T a, T b) {
  if constexpr (OP >= GC_OP_BAND) {
    return Arith<T>::template bits<OP>(a, b);
  } else {
    if (OP == GC_OP_SUM) return Arith<T>::add(a, b);
    if (OP == GC_OP_PROD) return Arith<T>::mul(a, b);
    if (OP == GC_OP_MIN) return Arith<T>::mn(a, b);
    return Arith<T>::mx(a, b);
  }
}

// Switch on a runtime op code into F<OP>::run(args...): the arithmetic ops
// for every T, the bitwise and logical ones for integer T only (the host
// never sends them with a float type); anything else runs as MAX, as before.
template <typename T, template <uint32_t> class F, typename... A>
__device__ __forceinline__ void dispatch_op(uint32_t op, A&... args) {
  switch (op) {
    case GC_OP_SUM: F<GC_OP_SUM>::run(args...); return;
    case GC_OP_PROD: F<GC_OP_PROD>::run(args...); return;
    case GC_OP_MIN: F<GC_OP_MIN>::run(args...); return;
    default: break;
  }
  if constexpr (std::is_integral<T>::value) {
    switch (op) {
      case GC_OP_BAND: F<GC_OP_BAND>::run(args...); return;
      case GC_OP_BOR: F<GC_OP_BOR>::run(args...); return;
      case GC_OP_BXOR: F<GC_OP_BXOR>::run(args...); return;
      case GC_OP_LAND: F<GC_OP_LAND>::run(args...); return;
      case GC_OP_LOR: F<GC_OP_LOR>::run(args...); return;
      case GC_OP_LXOR: F<GC_OP_LXOR>::run(args...); return;
      default: break;
    }
  }
  F<GC_OP_MAX>::run(args...);
}

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

// Element-wise work on one 16-byte pack of T: the pre-op scale, the
// combine of `x` into `acc`, the post-op division.
template <typename T>
__device__ __forceinline__ void scale_pack(uint4& x, const GcArgs& a) {
  constexpr int E = 16 / sizeof(T);
  T v[E];
  memcpy(v, &x, 16);
#pragma unroll
  for (int e = 0; e < E; e++) v[e] = Arith<T>::scale(v[e], a);
  memcpy(&x, v, 16);
}

template <typename T, uint32_t OP>
__device__ __forceinline__ void combine_pack(uint4& acc, const uint4& x) {
  constexpr int E = 16 / sizeof(T);
  T v[E], w[E];
  memcpy(v, &acc, 16);
  memcpy(w, &x, 16);
#pragma unroll
  for (int e = 0; e < E; e++) v[e] = combine<T, OP>(v[e], w[e]);
  memcpy(&acc, v, 16);
}

template <typename T>
__device__ __forceinline__ void div_pack(uint4& x, uint64_t d) {
  constexpr int E = 16 / sizeof(T);
  T v[E];
  memcpy(v, &x, 16);
#pragma unroll
  for (int e = 0; e < E; e++) v[e] = Arith<T>::div(v[e], d);
  memcpy(&x, v, 16);
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
      for (int u = 0; u < U; u++) combine_pack<T, OP>(acc[u], x[u]);
    } else {
#pragma unroll
      for (int u = 0; u < U; u++) acc[u] = x[u];
    }
    have = 1;
  }
  if (s.post) {
#pragma unroll
    for (int u = 0; u < U; u++) div_pack<T>(acc[u], a.div);
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
      v = have ? combine<T, OP>(v, x) : x;
      have = 1;
    }
    if (s.post) v = Arith<T>::div(v, a.div);
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

// ------------------------------------------------------- thread-0 protocol

struct Ctx {
  const GcArgs* a;
  GcSendConn* sc;  // this channel's send connectors, by peer
  GcRecvConn* rc;  // this channel's receive connectors, by peer
  uint64_t status; // GcChanStatus* of this channel
  uint64_t progress;
};

// The abort word is 64 bits: the low half is raised by the host (1 + the
// local rank that failed), the high half by a kernel that hit an error.
__device__ __forceinline__ bool aborted(const GcArgs& a) { return ld_vol64(a.abort_word) != 0; }

__device__ void record_error(const Ctx& c, uint32_t code, uint32_t peer, uint64_t got, uint64_t want) {
  GcChanStatus* st = reinterpret_cast<GcChanStatus*>(c.status);
  if (ld_vol32((uint64_t)&st->code) == GC_ERR_NONE) {
    st_vol32((uint64_t)&st->peer, peer);
    st_vol64((uint64_t)&st->got, got);
    st_vol64((uint64_t)&st->want, want);
    __threadfence_system();
    st_vol32((uint64_t)&st->code, code);
  }
  if (code != GC_ERR_ABORTED) {
    // Make every other block of this launch leave too.
    st_vol32(c.a->abort_word + 4, code);
  }
  __threadfence_system();
}

// Whether the receive connector from `peer` holds its next piece (no wait).
__device__ __forceinline__ bool recv_ready(const Ctx& c, uint32_t peer) {
  const GcRecvConn* r = &c.rc[peer];
  return ld_vol64(r->tail) > r->step;
}
__device__ __forceinline__ bool send_ready(const Ctx& c, uint32_t peer) {
  const GcSendConn* s = &c.sc[peer];
  return ld_vol64(s->head) + c.a->slots > s->step;
}

// Spin until `ready` or abort; false on abort (error recorded).
template <typename F>
__device__ bool spin_until(const Ctx& c, uint32_t peer, F ready) {
  uint32_t spins = 0;
  while (!ready()) {
    if (++spins == GC_ABORT_SPINS) {
      spins = 0;
      if (aborted(*c.a)) {
        record_error(c, GC_ERR_ABORTED, peer, 0, 0);
        return false;
      }
    }
  }
  return true;
}

__device__ __forceinline__ uint64_t make_meta(uint32_t seq, uint64_t bytes) {
  return ((uint64_t)seq << 32) | (uint64_t)(uint32_t)bytes;
}

// Receive side: check the metadata of the next piece and return its slot.
__device__ const char* recv_slot(const Ctx& c, uint32_t peer, uint64_t bytes, bool& ok) {
  const GcArgs& a = *c.a;
  GcRecvConn* r = &c.rc[peer];
  uint64_t tail = ld_vol64(r->tail);
  if (tail - r->step > a.slots) {
    record_error(c, GC_ERR_COUNTERS, peer, tail, r->step);
    ok = false;
    return nullptr;
  }
  // No acquire fence (it would also wait for this thread's remote head and
  // tail stores, a full NVLink round trip per piece): the sender fenced its
  // data before the tail, and every later read of the slot is a volatile
  // load issued after this one (bar.sync orders the other threads'), as in
  // NCCL's Simple protocol.
  uint64_t slot = r->step % a.slots;
  uint64_t got = ld_vol64(r->meta + slot * 8);
  uint64_t want = make_meta(a.seq, bytes);
  if (got != want) {
    record_error(c, GC_ERR_META, peer, got, want);
    ok = false;
    return nullptr;
  }
  ok = true;
  return reinterpret_cast<const char*>(r->data + slot * a.slot_bytes);
}

__device__ __forceinline__ char* send_slot_ptr(const Ctx& c, uint32_t peer) {
  const GcSendConn* s = &c.sc[peer];
  return reinterpret_cast<char*>(s->data + (s->step % c.a->slots) * c.a->slot_bytes);
}

// Thread 0 writes the slot's meta when it takes the slot, before the data:
// the per-thread fence after the data then covers it, and publishing the
// tail needs no fence of its own.
__device__ __forceinline__ void send_meta(const Ctx& c, uint32_t peer, uint64_t bytes) {
  const GcSendConn* s = &c.sc[peer];
  uint64_t slot = s->step % c.a->slots;
  st_vol64(s->meta + slot * 8, make_meta(c.a->seq, bytes));
}

// Called after every thread fenced its slot writes (and the meta) and a
// __syncthreads.
__device__ void send_publish(const Ctx& c, uint32_t peer) {
  GcSendConn* s = &c.sc[peer];
  s->step += 1;
  st_vol64(s->tail, s->step);
}

__device__ void recv_release(const Ctx& c, uint32_t peer) {
  GcRecvConn* r = &c.rc[peer];
  r->step += 1;
  st_vol64(r->head, r->step);
}

__device__ void bump_progress(Ctx& c) {
  c.progress += 1;
  GcChanStatus* st = reinterpret_cast<GcChanStatus*>(c.status);
  st_vol64((uint64_t)&st->progress, c.progress);
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
  c.progress = threadIdx.x == 0 ? ld_vol64(c.status + offsetof(GcChanStatus, progress)) : 0;
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

// ------------------------------------------------------- direct one-shot
//
// all_reduce of `count` elements, every block independent except for the
// launch counter:
//  0. every block reads the epoch e = ctl.epoch + 1 (the last block to
//     finish a launch advances ctl.epoch, so all blocks of one launch agree
//     and a replayed graph gets a fresh epoch); parity = e & 1 selects one of
//     two copies of every inbox and flag.
//  Simple (GC_FLAG_LL clear):
//  1. block b pushes its slice of pre(input) into every peer's inbox (NVLink
//     stores), fences, then writes meta and (fenced) epoch into the peer's
//     flag [us][b];
//  2. it waits until every peer's flag [peer][b] in our memory reached e and
//     checks its meta;
//  3. it reduces its slice in rank order (own pre(input) at position `rank`,
//     the inboxes elsewhere), applies the post-op and writes the output.
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

template <typename T, uint32_t OP, int U>
__device__ __forceinline__ void direct_packs(const GcDirectArgs& a, uint64_t off, uint64_t poff, uint64_t k, uint64_t nt, const GcArgs& sa) {
  const bool pre = a.flags & GC_FLAG_PRE_OP;
  uint4 acc[U];
  for (uint32_t p = 0; p < a.nranks; p++) {
    uint4 x[U];
    if (p == a.rank) {
#pragma unroll
      for (int u = 0; u < U; u++) x[u] = *reinterpret_cast<const uint4*>(a.input + off + (k + u * nt) * 16);
      if (pre) {
#pragma unroll
        for (int u = 0; u < U; u++) scale_pack<T>(x[u], sa);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; u++) x[u] = ld_vol128(reinterpret_cast<const char*>(a.get_data[p] + poff + off) + (k + u * nt) * 16);
    }
    if (p == 0) {
#pragma unroll
      for (int u = 0; u < U; u++) acc[u] = x[u];
    } else {
#pragma unroll
      for (int u = 0; u < U; u++) combine_pack<T, OP>(acc[u], x[u]);
    }
  }
  if (a.flags & GC_FLAG_POST_OP) {
#pragma unroll
    for (int u = 0; u < U; u++) div_pack<T>(acc[u], a.div);
  }
#pragma unroll
  for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(a.output + off + (k + u * nt) * 16) = acc[u];
}

template <typename T, int U>
__device__ __forceinline__ void direct_push(const GcDirectArgs& a, uint64_t off, uint64_t poff, uint64_t k, uint64_t nt, const GcArgs& sa) {
  uint4 x[U];
#pragma unroll
  for (int u = 0; u < U; u++) x[u] = *reinterpret_cast<const uint4*>(a.input + off + (k + u * nt) * 16);
  if (a.flags & GC_FLAG_PRE_OP) {
#pragma unroll
    for (int u = 0; u < U; u++) scale_pack<T>(x[u], sa);
  }
  for (uint32_t p = 0; p < a.nranks; p++) {
    if (p == a.rank) continue;
#pragma unroll
    for (int u = 0; u < U; u++) *reinterpret_cast<uint4*>(a.put_data[p] + poff + off + (k + u * nt) * 16) = x[u];
  }
}

// Record GC_ERR_ABORTED for block `b` unless an error is recorded already.
__device__ __forceinline__ void direct_mark_aborted(const GcDirectArgs& a, uint64_t b, uint32_t peer) {
  GcChanStatus* st = reinterpret_cast<GcChanStatus*>(a.status + b * sizeof(GcChanStatus));
  if (ld_vol32((uint64_t)&st->code) == GC_ERR_NONE) {
    st_vol32((uint64_t)&st->peer, peer);
    __threadfence_system();
    st_vol32((uint64_t)&st->code, GC_ERR_ABORTED);
  }
  __threadfence_system();
}

// Record a metadata mismatch with `peer` and raise the kernels' abort word.
__device__ __forceinline__ void direct_mark_meta(const GcDirectArgs& a, uint64_t b, uint32_t peer, uint64_t got) {
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

// The Simple one-shot body of one block (steps 1-3 above).
template <typename T, uint32_t OP>
__device__ void direct_simple(const GcDirectArgs& a, uint64_t e, uint64_t poff, int* stop) {
  constexpr int E = 16 / sizeof(T);
  // The scaling helpers read these fields of a GcArgs.
  GcArgs sa{};
  sa.scale = a.scale;
  sa.iscale = a.iscale;
  const uint64_t tid = threadIdx.x, nt = blockDim.x, b = blockIdx.x;
  const uint64_t per = ((a.count + gridDim.x - 1) / gridDim.x + E - 1) / E * E;
  const uint64_t lo = min(a.count, b * per), hi = min(a.count, lo + per);
  const uint64_t n = hi - lo;
  const bool vec = ((a.input | a.output) & 15) == 0;
  const bool pre = a.flags & GC_FLAG_PRE_OP;
  const uint64_t off = lo * sizeof(T);  // byte offset of this block's slice
  // 1. push
  uint64_t done = 0;
  if (vec) {
    const uint64_t npk = n / E;
    uint64_t k = tid;
    for (; k + 3 * nt < npk; k += 4 * nt) direct_push<T, 4>(a, off, poff, k, nt, sa);
    for (; k < npk; k += nt) direct_push<T, 1>(a, off, poff, k, nt, sa);
    done = npk * E;
  }
  for (uint64_t i = done + tid; i < n; i += nt) {
    T v = reinterpret_cast<const T*>(a.input + off)[i];
    if (pre) v = Arith<T>::scale(v, sa);
    for (uint32_t p = 0; p < a.nranks; p++)
      if (p != a.rank) reinterpret_cast<T*>(a.put_data[p] + poff + off)[i] = v;
  }
  __threadfence_system();
  __syncthreads();
  if (tid == 0) {
    for (uint32_t p = 0; p < a.nranks; p++) {
      if (p == a.rank) continue;
      GcFlag* f = reinterpret_cast<GcFlag*>(a.put_flag[p] + poff) + b;
      st_vol64((uint64_t)&f->meta, a.meta);
      __threadfence_system();
      st_vol64((uint64_t)&f->epoch, e);
    }
    // 2. wait for every peer's slice
    for (uint32_t p = 0; p < a.nranks && !*stop; p++) {
      if (p == a.rank) continue;
      GcFlag* f = reinterpret_cast<GcFlag*>(a.get_flag[p] + poff) + b;
      uint32_t spins = 0;
      while (ld_vol64((uint64_t)&f->epoch) < e) {
        if (++spins == GC_ABORT_SPINS) {
          spins = 0;
          if (ld_vol64(a.abort_word) != 0) {
            direct_mark_aborted(a, b, p);
            *stop = 1;
            break;
          }
        }
      }
      if (*stop) break;
      __threadfence_system();
      uint64_t got = ld_vol64((uint64_t)&f->meta);
      if (got != a.meta) {
        direct_mark_meta(a, b, p, got);
        *stop = 1;
      }
    }
  }
  __syncthreads();
  if (*stop) return;
  // 3. reduce in rank order
  done = 0;
  if (vec) {
    const uint64_t npk = n / E;
    uint64_t k = tid;
    for (; k + 3 * nt < npk; k += 4 * nt) direct_packs<T, OP, 4>(a, off, poff, k, nt, sa);
    for (; k < npk; k += nt) direct_packs<T, OP, 1>(a, off, poff, k, nt, sa);
    done = npk * E;
  }
  for (uint64_t i = done + tid; i < n; i += nt) {
    T acc{};
    for (uint32_t p = 0; p < a.nranks; p++) {
      T x;
      if (p == a.rank) {
        x = reinterpret_cast<const T*>(a.input + off)[i];
        if (pre) x = Arith<T>::scale(x, sa);
      } else {
        x = ld_vol_elem(reinterpret_cast<const T*>(a.get_data[p] + poff + off) + i);
      }
      acc = p == 0 ? x : combine<T, OP>(acc, x);
    }
    if (a.flags & GC_FLAG_POST_OP) acc = Arith<T>::div(acc, a.div);
    reinterpret_cast<T*>(a.output + off)[i] = acc;
  }
}

__device__ __forceinline__ void st_ll(uint64_t addr, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(addr), "r"((uint32_t)v), "r"(flag),
               "r"((uint32_t)(v >> 32)), "r"(flag)
               : "memory");
}

// Wait for the LL line at `addr` to carry `flag` in both halves; its 8 data
// bytes in *v. False when the abort word was raised meanwhile.
__device__ __forceinline__ bool ld_ll(uint64_t addr, uint32_t flag, uint64_t abort_word, uint64_t* v) {
  uint32_t spins = 0;
  for (;;) {
    uint4 x = ld_vol128(reinterpret_cast<const void*>(addr));
    if (x.y == flag && x.w == flag) {
      *v = (uint64_t)x.x | ((uint64_t)x.z << 32);
      return true;
    }
    if (++spins == GC_ABORT_SPINS) {
      spins = 0;
      if (ld_vol64(abort_word) != 0) return false;
    }
  }
}

// Unit `i` (8 bytes) of the input, pre-op applied, as elements; missing
// elements past `count` are zero.
template <typename T>
__device__ __forceinline__ uint64_t ll_load_unit(const GcDirectArgs& a, uint64_t i, const GcArgs& sa) {
  constexpr int E8 = 8 / sizeof(T);
  T v[E8];
  const uint64_t first = i * E8;
  if ((a.input & 7) == 0 && first + E8 <= a.count) {
    uint64_t w = *reinterpret_cast<const uint64_t*>(a.input + i * 8);
    memcpy(v, &w, 8);
  } else {
#pragma unroll
    for (int j = 0; j < E8; j++) v[j] = first + j < a.count ? reinterpret_cast<const T*>(a.input)[first + j] : T{};
  }
  if (a.flags & GC_FLAG_PRE_OP) {
#pragma unroll
    for (int j = 0; j < E8; j++) v[j] = Arith<T>::scale(v[j], sa);
  }
  uint64_t w;
  memcpy(&w, v, 8);
  return w;
}

// The LL one-shot body of one block (see the protocol above).
template <typename T, uint32_t OP>
__device__ void direct_ll(const GcDirectArgs& a, uint64_t e, uint64_t poff, int* stop) {
  constexpr int E8 = 8 / sizeof(T);
  GcArgs sa{};
  sa.scale = a.scale;
  sa.iscale = a.iscale;
  const uint64_t tid = threadIdx.x, nt = blockDim.x, b = blockIdx.x;
  const uint32_t flag = (uint32_t)e;
  const uint64_t units = (a.count + E8 - 1) / E8;
  const uint64_t per = (units + gridDim.x - 1) / gridDim.x;
  const uint64_t lo = min(units, b * per), hi = min(units, lo + per);
  // 1. push the header and this block's lines to every peer
  if (tid == 0) {
    for (uint32_t p = 0; p < a.nranks; p++)
      if (p != a.rank) st_ll(a.put_data[p] + poff + a.ll_off + b * 16, a.meta, flag);
  }
  for (uint64_t i = lo + tid; i < hi; i += nt) {
    const uint64_t w = ll_load_unit<T>(a, i, sa);
    for (uint32_t p = 0; p < a.nranks; p++)
      if (p != a.rank) st_ll(a.put_data[p] + poff + a.ll_off + (GC_LL_HEADER_LINES + i) * 16, w, flag);
  }
  // 2. headers: the peers issued the same call
  if (tid == 0) {
    for (uint32_t p = 0; p < a.nranks && !*stop; p++) {
      if (p == a.rank) continue;
      uint64_t got;
      if (!ld_ll(a.get_data[p] + poff + a.ll_off + b * 16, flag, a.abort_word, &got)) {
        direct_mark_aborted(a, b, p);
        *stop = 1;
      } else if (got != a.meta) {
        direct_mark_meta(a, b, p, got);
        *stop = 1;
      }
    }
    if (!*stop) {
      GcChanStatus* st = reinterpret_cast<GcChanStatus*>(a.status + b * sizeof(GcChanStatus));
      st_vol64((uint64_t)&st->progress, ld_vol64((uint64_t)&st->progress) + 1);
    }
  }
  __syncthreads();
  if (*stop) return;
  // 3. reduce every unit in rank order and write it
  bool aborted = false;
  for (uint64_t i = lo + tid; i < hi && !aborted; i += nt) {
    T acc[E8];
    for (uint32_t p = 0; p < a.nranks; p++) {
      uint64_t w;
      if (p == a.rank) {
        w = ll_load_unit<T>(a, i, sa);
      } else if (!ld_ll(a.get_data[p] + poff + a.ll_off + (GC_LL_HEADER_LINES + i) * 16, flag, a.abort_word, &w)) {
        aborted = true;
        break;
      }
      T x[E8];
      memcpy(x, &w, 8);
#pragma unroll
      for (int j = 0; j < E8; j++) acc[j] = p == 0 ? x[j] : combine<T, OP>(acc[j], x[j]);
    }
    if (aborted) break;
    if (a.flags & GC_FLAG_POST_OP) {
#pragma unroll
      for (int j = 0; j < E8; j++) acc[j] = Arith<T>::div(acc[j], a.div);
    }
    const uint64_t first = i * E8;
    if ((a.output & 7) == 0 && first + E8 <= a.count) {
      uint64_t w;
      memcpy(&w, acc, 8);
      *reinterpret_cast<uint64_t*>(a.output + i * 8) = w;
    } else {
#pragma unroll
      for (int j = 0; j < E8; j++)
        if (first + j < a.count) reinterpret_cast<T*>(a.output)[first + j] = acc[j];
    }
  }
  if (aborted) *stop = 1;  // benign race: every writer stores 1
  __syncthreads();
  if (*stop && tid == 0) direct_mark_aborted(a, b, a.rank);
}

template <typename T, uint32_t OP>
__device__ void direct_all_reduce(const GcDirectArgs& a) {
  __shared__ uint64_t epoch;
  __shared__ int stop;
  GcDirectCtl* ctl = reinterpret_cast<GcDirectCtl*>(a.ctl);
  if (threadIdx.x == 0) {
    epoch = ld_vol64((uint64_t)&ctl->epoch) + 1;
    stop = 0;
  }
  __syncthreads();
  const uint64_t e = epoch;
  const uint64_t poff = (e & 1) * a.parity_bytes;
  if (a.flags & GC_FLAG_LL) {
    direct_ll<T, OP>(a, e, poff, &stop);
  } else {
    direct_simple<T, OP>(a, e, poff, &stop);
  }
  __syncthreads();
  if (threadIdx.x == 0 && !stop) {
    // Every block read the epoch at its start, so the last one to finish
    // may advance it for the next launch (stream order publishes it).
    __threadfence();
    if (atomicAdd(&ctl->done, 1u) == gridDim.x - 1) {
      ctl->done = 0;
      ctl->epoch = e;
    }
  }
}

template <typename T> struct DirectOp {
  template <uint32_t OP> struct F {
    static __device__ __forceinline__ void run(const GcDirectArgs& a) { direct_all_reduce<T, OP>(a); }
  };
};

template <typename T>
__device__ void direct_all_reduce_op(const GcDirectArgs& a) {
  dispatch_op<T, DirectOp<T>::template F>(a.op, a);
}

#define GC_DIRECT_KERNEL(name, T) \
  extern "C" __global__ void __launch_bounds__(GC_THREADS, 1) name(GcDirectArgs a) { direct_all_reduce_op<T>(a); }

GC_DIRECT_KERNEL(gc_direct_ar_i8, int8_t)
GC_DIRECT_KERNEL(gc_direct_ar_u8, uint8_t)
GC_DIRECT_KERNEL(gc_direct_ar_i32, int32_t)
GC_DIRECT_KERNEL(gc_direct_ar_u32, uint32_t)
GC_DIRECT_KERNEL(gc_direct_ar_i64, int64_t)
GC_DIRECT_KERNEL(gc_direct_ar_u64, uint64_t)
GC_DIRECT_KERNEL(gc_direct_ar_f16, __half)
GC_DIRECT_KERNEL(gc_direct_ar_bf16, __nv_bfloat16)
GC_DIRECT_KERNEL(gc_direct_ar_f32, float)
GC_DIRECT_KERNEL(gc_direct_ar_f64, double)

// Eight 16-byte packs in flight per thread (measured 1-5% faster than four
// on 2xH200; one variant keeps the kernel build short).
#define GC_KERNEL(name, T) \
  extern "C" __global__ void __launch_bounds__(GC_THREADS, 1) name(GcArgs a) { run_block<T, 8>(a); }

GC_KERNEL(gc_run_i8, int8_t)
GC_KERNEL(gc_run_u8, uint8_t)
GC_KERNEL(gc_run_i32, int32_t)
GC_KERNEL(gc_run_u32, uint32_t)
GC_KERNEL(gc_run_i64, int64_t)
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
static_assert(sizeof(GcArgs) == 112, "GcArgs layout");
static_assert(sizeof(GcDirectArgs) == 112 + 4 * 8 * GC_DIRECT_MAX_RANKS, "GcDirectArgs layout");
static_assert(sizeof(GcDirectCtl) == 16, "GcDirectCtl layout");
static_assert(sizeof(GcFlag) == 16, "GcFlag layout");
static_assert(sizeof(GcGroupEntry) == 16, "GcGroupEntry layout");

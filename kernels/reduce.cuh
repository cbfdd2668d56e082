// Reduction arithmetic over the ten datatypes: `Arith<T>` (add, mul, min,
// max, the pre-op scale and the post-op division), `combine<T, OP>` for
// GC_OP_*, and the same applied to one 16-byte pack. Both the step
// interpreter and the one-shot reduce only through this header.
#pragma once
#include "gpucoll.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

// Unsigned integers; signed data of the same width runs here too, with
// GC_OP_SIGNED in `rop` choosing the signed comparison and division.
template <typename T> struct IntArith {
  using S = typename std::make_signed<T>::type;
  static __device__ __forceinline__ T add(T a, T b) { return (T)(a + b); }
  static __device__ __forceinline__ T mul(T a, T b) { return (T)(a * b); }
  // Flipping the sign bit maps signed order onto unsigned order, so one
  // comparison serves both (no second code path per element).
  static __device__ __forceinline__ T order_key(T a, uint32_t rop) {
    return (rop & GC_OP_SIGNED) ? (T)(a ^ ((T)1 << (8 * sizeof(T) - 1))) : a;
  }
  static __device__ __forceinline__ T mn(T a, T b, uint32_t rop) {
    return order_key(a, rop) < order_key(b, rop) ? a : b;
  }
  static __device__ __forceinline__ T mx(T a, T b, uint32_t rop) {
    return order_key(a, rop) > order_key(b, rop) ? a : b;
  }
  static __device__ __forceinline__ T scale(T x, const GcArgs& a) {
    return mul(x, (T)a.iscale);
  }
  // Signed division truncates toward zero: divide the magnitude, once.
  static __device__ __forceinline__ T div(T x, uint64_t d, uint32_t rop) {
    const bool neg = (rop & GC_OP_SIGNED) && (S)x < 0;
    const uint64_t m = neg ? 0 - (uint64_t)(int64_t)(S)x : (uint64_t)x;
    const uint64_t q = m / d;
    return neg ? (T)(0 - q) : (T)q;
  }
  // GC_OP_BAND .. GC_OP_LXOR, chosen at run time by masks rather than a
  // switch: one compiled variant for the six, and straight-line code the
  // compiler does not clone per op (they are memory-bound and rare). The
  // logical ones are the bitwise ones on operands reduced to 1 or 0.
  static __device__ __forceinline__ T bits(T a, T b, uint32_t rop) {
    const uint32_t c = (rop & GC_OP_MASK) - GC_OP_BAND;
    const bool logical = c >= GC_OP_LAND - GC_OP_BAND;
    const uint32_t k = logical ? c - (GC_OP_LAND - GC_OP_BAND) : c;
    const T x = logical ? (T)(a != 0) : a;
    const T y = logical ? (T)(b != 0) : b;
    const T all = (T)~(T)0;
    const T m_and = k == 0 ? all : (T)0;
    const T m_or = k == 1 ? all : (T)0;
    const T m_xor = k == 2 ? all : (T)0;
    return (T)(((x & y) & m_and) | ((x | y) & m_or) | ((x ^ y) & m_xor));
  }
};

template <typename T> struct Arith;
template <> struct Arith<uint8_t> : IntArith<uint8_t> {};
template <> struct Arith<uint32_t> : IntArith<uint32_t> {};
template <> struct Arith<uint64_t> : IntArith<uint64_t> {};

template <> struct Arith<float> {
  static __device__ __forceinline__ float add(float a, float b) { return a + b; }
  static __device__ __forceinline__ float mul(float a, float b) { return a * b; }
  static __device__ __forceinline__ float mn(float a, float b, uint32_t) { return fminf(a, b); }
  static __device__ __forceinline__ float mx(float a, float b, uint32_t) { return fmaxf(a, b); }
  static __device__ __forceinline__ float scale(float x, const GcArgs& a) { return x * (float)a.scale; }
  static __device__ __forceinline__ float div(float x, uint64_t d, uint32_t) { return x / (float)d; }
};
template <> struct Arith<double> {
  static __device__ __forceinline__ double add(double a, double b) { return a + b; }
  static __device__ __forceinline__ double mul(double a, double b) { return a * b; }
  static __device__ __forceinline__ double mn(double a, double b, uint32_t) { return fmin(a, b); }
  static __device__ __forceinline__ double mx(double a, double b, uint32_t) { return fmax(a, b); }
  static __device__ __forceinline__ double scale(double x, const GcArgs& a) { return x * a.scale; }
  static __device__ __forceinline__ double div(double x, uint64_t d, uint32_t) { return x / (double)d; }
};

// Half types compute in float and round once per operation (as the host
// backend does).
template <typename H, typename Conv> struct HalfArith {
  static __device__ __forceinline__ H add(H a, H b) { return Conv::from(Conv::to(a) + Conv::to(b)); }
  static __device__ __forceinline__ H mul(H a, H b) { return Conv::from(Conv::to(a) * Conv::to(b)); }
  static __device__ __forceinline__ H mn(H a, H b, uint32_t) { return Conv::from(fminf(Conv::to(a), Conv::to(b))); }
  static __device__ __forceinline__ H mx(H a, H b, uint32_t) { return Conv::from(fmaxf(Conv::to(a), Conv::to(b))); }
  static __device__ __forceinline__ H scale(H x, const GcArgs& a) { return Conv::from(Conv::to(x) * (float)a.scale); }
  static __device__ __forceinline__ H div(H x, uint64_t d, uint32_t) { return Conv::from(Conv::to(x) / (float)d); }
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

// Two compiled variants per datatype: SUM, the hot path, with its op fixed
// at compile time, and GC_OP_RT for every other op, chosen per element at
// run time from `rop` (the launch's GC_OP_* code). A variant per op would
// make the kernel build several times longer for ops that are rarer and,
// like SUM, bound by memory and links rather than arithmetic. GC_OP_RT is
// not an ABI value: the host never sends it.
constexpr uint32_t GC_OP_RT = 64u;

template <typename T>
__device__ __forceinline__ T combine_rt(T a, T b, uint32_t rop) {
  const uint32_t c = rop & GC_OP_MASK;
  if constexpr (std::is_integral<T>::value) {
    // The host sends the bitwise and logical ops with integer types only.
    if (c >= GC_OP_BAND) return Arith<T>::bits(a, b, rop);
  }
  if (c == GC_OP_PROD) return Arith<T>::mul(a, b);
  if (c == GC_OP_MIN) return Arith<T>::mn(a, b, rop);
  return Arith<T>::mx(a, b, rop);
}

template <typename T, uint32_t OP>
__device__ __forceinline__ T combine(T a, T b, uint32_t rop) {
  if constexpr (OP == GC_OP_SUM) {
    return Arith<T>::add(a, b);
  } else {
    return combine_rt<T>(a, b, rop);
  }
}

// Run F<GC_OP_SUM> or F<GC_OP_RT> for a launch's op code.
template <typename T, template <uint32_t> class F, typename... A>
__device__ __forceinline__ void dispatch_op(uint32_t op, A&... args) {
  if ((op & GC_OP_MASK) == GC_OP_SUM) {
    F<GC_OP_SUM>::run(args...);
  } else {
    F<GC_OP_RT>::run(args...);
  }
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
__device__ __forceinline__ void combine_pack(uint4& acc, const uint4& x, uint32_t rop) {
  constexpr int E = 16 / sizeof(T);
  T v[E], w[E];
  memcpy(v, &acc, 16);
  memcpy(w, &x, 16);
#pragma unroll
  for (int e = 0; e < E; e++) v[e] = combine<T, OP>(v[e], w[e], rop);
  memcpy(&acc, v, 16);
}

template <typename T>
__device__ __forceinline__ void div_pack(uint4& x, uint64_t d, uint32_t rop) {
  constexpr int E = 16 / sizeof(T);
  T v[E];
  memcpy(v, &x, 16);
#pragma unroll
  for (int e = 0; e < E; e++) v[e] = Arith<T>::div(v[e], d, rop);
  memcpy(&x, v, 16);
}

// Fold U packs of rank p into `acc` in rank order (rank 0's start it).
template <typename T, uint32_t OP, int U>
__device__ __forceinline__ void fold_packs(uint4 (&acc)[U], const uint4 (&x)[U], uint32_t p, uint32_t rop) {
  if (p == 0) {
#pragma unroll
    for (int u = 0; u < U; u++) acc[u] = x[u];
  } else {
#pragma unroll
    for (int u = 0; u < U; u++) combine_pack<T, OP>(acc[u], x[u], rop);
  }
}

// The post-op division of U packs.
template <typename T, int U>
__device__ __forceinline__ void div_packs(uint4 (&acc)[U], uint64_t d, uint32_t rop) {
#pragma unroll
  for (int u = 0; u < U; u++) div_pack<T>(acc[u], d, rop);
}

// Reduction arithmetic over the ten datatypes: `Arith<T>` (add, mul, min,
// max, the pre-op scale and the post-op division), `combine<T, OP>` for
// GC_OP_*, and the same applied to one 16-byte pack. Both the step
// interpreter and the one-shot reduce only through this header.
#pragma once
#include "gpucoll.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

template <typename T, typename U> struct IntArith {
  static __device__ __forceinline__ T add(T a, T b) { return (T)(U)((U)a + (U)b); }
  static __device__ __forceinline__ T mul(T a, T b) { return (T)(U)((U)a * (U)b); }
  static __device__ __forceinline__ T mn(T a, T b) { return a < b ? a : b; }
  static __device__ __forceinline__ T mx(T a, T b) { return a > b ? a : b; }
  static __device__ __forceinline__ T scale(T x, const GcArgs& a) {
    return mul(x, (T)a.iscale);
  }
  // GC_OP_BAND .. GC_OP_LXOR, chosen at run time (one compiled variant
  // for the six: they are memory-bound and rare, and a variant per op
  // would nearly triple the kernel build); the logical ones yield 1 or 0.
  static __device__ __forceinline__ T bits(T a, T b, uint32_t op) {
    switch (op) {
      case GC_OP_BAND: return (T)(a & b);
      case GC_OP_BOR: return (T)(a | b);
      case GC_OP_BXOR: return (T)(a ^ b);
      case GC_OP_LAND: return (T)((a != 0) && (b != 0));
      case GC_OP_LOR: return (T)((a != 0) || (b != 0));
      default: return (T)((a != 0) != (b != 0));
    }
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

// The compile-time op of the bitwise/logical family, whose member is the
// run-time `rop` (a GC_OP_* code). Not an ABI value: the host never sends it.
constexpr uint32_t GC_OP_BITS_RT = 64u;

// `rop`: the launch's GC_OP_* code, read only by the bitwise/logical family,
// which is instantiated for integer types only (see dispatch_op), so Arith
// of a float needs no `bits`.
template <typename T, uint32_t OP>
__device__ __forceinline__ T combine(T a, T b, uint32_t rop) {
  if constexpr (OP == GC_OP_BITS_RT) {
    return Arith<T>::bits(a, b, rop);
  } else {
    if (OP == GC_OP_SUM) return Arith<T>::add(a, b);
    if (OP == GC_OP_PROD) return Arith<T>::mul(a, b);
    if (OP == GC_OP_MIN) return Arith<T>::mn(a, b);
    return Arith<T>::mx(a, b);
  }
}

// Switch on a runtime op code into F<OP>::run(args...): the arithmetic ops
// for every T, the bitwise and logical ones for integer T only (the host
// never sends them with a float type); anything else runs as MAX.
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
      case GC_OP_BAND:
      case GC_OP_BOR:
      case GC_OP_BXOR:
      case GC_OP_LAND:
      case GC_OP_LOR:
      case GC_OP_LXOR: F<GC_OP_BITS_RT>::run(args...); return;
      default: break;
    }
  }
  F<GC_OP_MAX>::run(args...);
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
__device__ __forceinline__ void div_pack(uint4& x, uint64_t d) {
  constexpr int E = 16 / sizeof(T);
  T v[E];
  memcpy(v, &x, 16);
#pragma unroll
  for (int e = 0; e < E; e++) v[e] = Arith<T>::div(v[e], d);
  memcpy(&x, v, 16);
}

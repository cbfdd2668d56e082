// Device memory primitives every kernel uses: volatile loads and stores
// that bypass L1 (connector words and FIFO slots are written by another GPU
// or by the host) and the LL line format (16 bytes {data lo, flag, data hi,
// flag}: each 8-byte half is stored at once, so a reader that sees the flag
// in both halves holds that line's data without a fence).
#pragma once
#include "gpucoll.cuh"

// Spins between two looks at the abort word while waiting on a peer.
#define GC_ABORT_SPINS 1024u

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

// The end of a launch, in every block once it left its work (finished or
// stopped): the last block to get here resets the launch's block counter
// `*blocks` (device memory) and stores `tag` into channel 0's
// GcChanStatus::done (host memory). The fences make every block's writes
// visible on the GPU before the counter moves, and to the system before
// the host can see the tag.
__device__ __forceinline__ void finish_launch(uint32_t* blocks, uint64_t status, uint64_t tag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(blocks, 1u) == gridDim.x - 1) {
    *blocks = 0;
    __threadfence_system();
    st_vol64(status + offsetof(GcChanStatus, done), tag);
  }
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

// ------------------------------------------------------------- LL lines

// Store 8 data bytes with `flag` in both halves of the line at `addr`.
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

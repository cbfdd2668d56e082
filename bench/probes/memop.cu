// Queued small calls: a launch per call against a resident block driven by
// stream memory operations (write go / wait done) on the caller's stream.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <cuda.h>
#include <cuda_runtime.h>

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define CK(x) do { auto _e = (x); if (_e) { printf("error %d at %s:%d\n", (int)_e, __FILE__, __LINE__); exit(1); } } while (0)

__global__ void empty_k(unsigned* sink, unsigned v) { if (threadIdx.x == 0 && v == 0xffffffffu) *sink = v; }

// go/done: 32-bit counters; quit: leave.
__global__ void resident(volatile unsigned* go, volatile unsigned* done, volatile unsigned* quit, const volatile unsigned long long* args, unsigned long long* sink, int read_args) {
  __shared__ unsigned next;
  __shared__ unsigned long long a[46];
  unsigned taken = 0;
  for (;;) {
    if (threadIdx.x == 0) {
      unsigned g;
      while ((g = *go) == taken && !*quit) {}
      next = (g == taken) ? 0xffffffffu : taken + 1;
    }
    __syncthreads();
    if (next == 0xffffffffu) return;
    if (read_args && threadIdx.x < 46) a[threadIdx.x] = args[(next % 64) * 64 + threadIdx.x];
    __syncthreads();
    taken = next;
    if (threadIdx.x == 0) {
      if (read_args) *sink += a[3];
      __threadfence_system();
      *done = taken;
    }
    __syncthreads();
  }
}

typedef CUresult (*WV)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
typedef CUresult (*BM)(CUstream, unsigned, CUstreamBatchMemOpParams*, unsigned);

int main() {
  CK(cudaSetDevice(0));
  WV wv, wt; BM bm;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void**)&wv, 12000, cudaEnableDefault, &q));
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", (void**)&wt, 12000, cudaEnableDefault, &q));
  CK(cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", (void**)&bm, 12000, cudaEnableDefault, &q));
  int attr = 0;
  cudaDeviceGetAttribute(&attr, cudaDevAttrCanUseHostPointerForRegisteredMem, 0);
  printf("can use host pointer for registered mem: %d\n", attr);
  unsigned* dw; CK(cudaMalloc(&dw, 256));
  unsigned* hw; CK(cudaHostAlloc(&hw, 256, cudaHostAllocMapped));
  unsigned* hwd; CK(cudaHostGetDevicePointer((void**)&hwd, hw, 0));
  unsigned long long* args; CK(cudaHostAlloc(&args, 64 * 64 * 8, cudaHostAllocMapped));
  unsigned long long* argsd; CK(cudaHostGetDevicePointer((void**)&argsd, args, 0));
  unsigned long long* sink; CK(cudaMalloc(&sink, 8));
  cudaStream_t s, r;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&r, cudaStreamNonBlocking));
  const int N = 20000, W = 1000;
  for (int rep = 0; rep < 2; rep++) {
    // A. a launch per call, queued
    for (int i = 0; i < W; i++) empty_k<<<1, 512, 0, s>>>((unsigned*)sink, i);
    CK(cudaStreamSynchronize(s));
    double t0 = now_us();
    for (int i = 0; i < N; i++) empty_k<<<1, 512, 0, s>>>((unsigned*)sink, i);
    double t1 = now_us();
    CK(cudaStreamSynchronize(s));
    double t2 = now_us();
    printf("A launch queued: host %.2f us/call, total %.2f us/call\n", (t1 - t0) / N, (t2 - t0) / N);
    // A2. launch + sync each
    t0 = now_us();
    for (int i = 0; i < 2000; i++) { empty_k<<<1, 512, 0, s>>>((unsigned*)sink, i); cudaStreamSynchronize(s); }
    printf("A2 launch+sync: %.2f us/call\n", (now_us() - t0) / 2000);

    for (int variant = 0; variant < 6; variant++) {
      // 0: write+wait separate, done in device memory
      // 1: batch memop (2 ops), done in device memory
      // 2: batch memop, done in host memory
      // 3: batch, device done, block reads args from host (prefetched? no: after go)
      // 4: write only (no wait): host cost floor of one memop
      // 5: batch memop with sync each call (latency)
      const bool hostdone = variant == 2;
      volatile unsigned* go = (volatile unsigned*)dw;
      unsigned* doneh = hostdone ? hw + 16 : nullptr;
      unsigned* doned = hostdone ? hwd + 16 : dw + 16;
      unsigned* quit = hwd + 32;
      CK(cudaMemset(dw, 0, 256));
      memset(hw, 0, 256);
      CK(cudaDeviceSynchronize());
      resident<<<1, 512, 0, r>>>((volatile unsigned*)dw, (volatile unsigned*)doned, (volatile unsigned*)quit, argsd, sink, variant == 3);
      int n = variant == 5 ? 2000 : N;
      double h = 0;
      t0 = now_us();
      for (int i = 1; i <= n; i++) {
        double a0 = now_us();
        if (variant == 0) {
          CK(wv((CUstream)s, (CUdeviceptr)dw, i, 0));
          CK(wt((CUstream)s, (CUdeviceptr)doned, i, CU_STREAM_WAIT_VALUE_GEQ));
        } else if (variant == 4) {
          CK(wv((CUstream)s, (CUdeviceptr)dw, i, 0));
        } else {
          CUstreamBatchMemOpParams p[2];
          memset(p, 0, sizeof(p));
          p[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
          p[0].writeValue.address = (CUdeviceptr)dw;
          p[0].writeValue.value = i;
          p[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
          p[1].waitValue.address = (CUdeviceptr)doned;
          p[1].waitValue.value = i;
          p[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
          CK(bm((CUstream)s, 2, p, 0));
          if (variant == 5) CK(cudaStreamSynchronize(s));
        }
        h += now_us() - a0;
      }
      CK(cudaStreamSynchronize(s));
      t1 = now_us();
      printf("memop variant %d: host %.2f us/call, total %.2f us/call\n", variant, h / n, (t1 - t0) / n);
      hw[32] = 1;
      __sync_synchronize();
      CK(cudaStreamSynchronize(r));
      hw[32] = 0;
    }
  }
  printf("done\n");
  return 0;
}

// GPU time per call of a two-party LL exchange, the two parties being two
// streams of one process (one H200): kernels captured into graphs and
// replayed, so no host cost. Variants isolate the kernel's own costs.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <cuda_runtime.h>
static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define CK(x) do { auto _e = (x); if (_e) { printf("error %d at %s:%d\n", (int)_e, __FILE__, __LINE__); exit(1); } } while (0)

struct Ctl { unsigned long long epoch; unsigned done; unsigned pad; };
struct Args {
  Ctl* ctl; unsigned long long* put; unsigned long long* get; unsigned long long* host; unsigned long long* out;
  unsigned long long pad[41];  // 368 bytes like GcDirectArgs
};
enum { HOST = 1, FENCE = 2, CTLATOMIC = 4, NOSYNC = 8 };

template <int V>
__global__ void __launch_bounds__(512, 1) xk(Args a) {
  __shared__ unsigned long long epoch;
  if (threadIdx.x == 0) epoch = *(volatile unsigned long long*)&a.ctl->epoch + 1;
  __syncthreads();
  const unsigned long long e = epoch;
  const int par = e & 1;
  if (threadIdx.x == 0) {
    volatile unsigned* p = (volatile unsigned*)(a.put + par * 2);
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(7u), "r"((unsigned)e), "r"(9u), "r"((unsigned)e) : "memory");
    unsigned x, f1, y, f2;
    const unsigned* g = (const unsigned*)(a.get + par * 2);
    do {
      asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x), "=r"(f1), "=r"(y), "=r"(f2) : "l"(g) : "memory");
    } while (f1 != (unsigned)e || f2 != (unsigned)e);
    a.out[0] = x + y;
    if (V & HOST) *(volatile unsigned long long*)a.host = e;
  }
  if (V & FENCE) __threadfence();
  if (!(V & NOSYNC)) __syncthreads();
  if (threadIdx.x == 0) {
    if (V & CTLATOMIC) {
      __threadfence();
      if (atomicAdd(&a.ctl->done, 1u) == gridDim.x - 1) { a.ctl->done = 0; a.ctl->epoch = e; }
    } else {
      a.ctl->epoch = e;
    }
  }
}
__global__ void empty_k(unsigned long long* out) { if (threadIdx.x == 1000) *out = 1; }

template <int V>
double run(int threads, Args a0, Args a1, cudaStream_t s0, cudaStream_t s1, int empty) {
  const int K = 20, R = 50;
  cudaGraph_t g[2]; cudaGraphExec_t ge[2];
  cudaStream_t ss[2] = {s0, s1};
  Args aa[2] = {a0, a1};
  for (int r = 0; r < 2; r++) {
    CK(cudaStreamBeginCapture(ss[r], cudaStreamCaptureModeRelaxed));
    for (int k = 0; k < K; k++) {
      if (empty) empty_k<<<1, threads, 0, ss[r]>>>(aa[r].out);
      else xk<V><<<1, threads, 0, ss[r]>>>(aa[r]);
    }
    CK(cudaStreamEndCapture(ss[r], &g[r]));
    CK(cudaGraphInstantiate(&ge[r], g[r], 0));
  }
  for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(ge[r], ss[r]));
  CK(cudaDeviceSynchronize());
  double t0 = now_us();
  for (int i = 0; i < R; i++) for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(ge[r], ss[r]));
  CK(cudaDeviceSynchronize());
  double t = (now_us() - t0) / (R * K);
  for (int r = 0; r < 2; r++) { cudaGraphExecDestroy(ge[r]); cudaGraphDestroy(g[r]); }
  return t;
}

int main() {
  CK(cudaSetDevice(0));
  char* d; CK(cudaMalloc(&d, 1 << 20)); CK(cudaMemset(d, 0, 1 << 20));
  unsigned long long* h; CK(cudaHostAlloc(&h, 4096, cudaHostAllocMapped));
  unsigned long long* hd; CK(cudaHostGetDevicePointer((void**)&hd, h, 0));
  Args a0{}, a1{};
  a0.ctl = (Ctl*)(d + 0); a1.ctl = (Ctl*)(d + 4096);
  unsigned long long* in0 = (unsigned long long*)(d + 8192);   // inbox of party 0
  unsigned long long* in1 = (unsigned long long*)(d + 12288);
  a0.put = in1; a0.get = in0; a1.put = in0; a1.get = in1;
  a0.host = hd; a1.host = hd + 64;
  a0.out = (unsigned long long*)(d + 16384); a1.out = (unsigned long long*)(d + 20480);
  cudaStream_t s0, s1;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  for (int rep = 0; rep < 2; rep++) {
    for (int th : {64, 512}) {
      printf("threads %d: empty %.2f | plain %.2f | host %.2f | fence %.2f | ctlatomic %.2f | all %.2f | nosync %.2f us/call\n", th,
             run<0>(th, a0, a1, s0, s1, 1), run<0>(th, a0, a1, s0, s1, 0), run<HOST>(th, a0, a1, s0, s1, 0),
             run<FENCE>(th, a0, a1, s0, s1, 0), run<CTLATOMIC>(th, a0, a1, s0, s1, 0),
             run<HOST | FENCE | CTLATOMIC>(th, a0, a1, s0, s1, 0), run<NOSYNC>(th, a0, a1, s0, s1, 0));
    }
  }
  return 0;
}

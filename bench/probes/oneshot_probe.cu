// GPU time per call of gpucoll's direct one-shot kernel (kernels/oneshot.cuh),
// two "ranks" as two streams of one process on one GPU, captured into graphs.
#include <cstdio>
#include <cstring>
#include <chrono>
#include <cuda_runtime.h>
#include "gpucoll.cuh"
#include "oneshot.cuh"
static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define CK(x) do { auto _e = (x); if (_e) { printf("error %d at %s:%d\n", (int)_e, __FILE__, __LINE__); exit(1); } } while (0)
#ifdef SUMONLY
extern "C" __global__ void __launch_bounds__(512, 1) kf(GcDirectArgs a) { direct_collective<float, GC_OP_SUM>(a); }
#else
extern "C" __global__ void __launch_bounds__(512, 1) kf(GcDirectArgs a) { direct_all_reduce_op<float>(a); }
#endif
__global__ void empty_k(unsigned long long* out) { if (threadIdx.x == 1000) *out = 1; }

int main(int argc, char** argv) {
  CK(cudaSetDevice(0));
  const size_t AREA = 8 << 20, PAR = 2 << 20, INBOX = 512 << 10, LLOFF = 256 << 10;
  char* dev; CK(cudaMalloc(&dev, 2 * AREA + (64 << 20))); CK(cudaMemset(dev, 0, 2 * AREA + (64 << 20)));
  char* host; CK(cudaHostAlloc(&host, 1 << 20, cudaHostAllocMapped)); memset(host, 0, 1 << 20);
  char* hostd; CK(cudaHostGetDevicePointer((void**)&hostd, host, 0));
  char* bufs = dev + 2 * AREA;
  GcDirectArgs a[2];
  for (int r = 0; r < 2; r++) {
    memset(&a[r], 0, sizeof(GcDirectArgs));
    char* area = dev + r * AREA;  // ctl at 0; flags [sender][block] at 4096 + sender*1024; inbox per sender at 64K + sender*INBOX
    a[r].ctl = (uint64_t)area;
    a[r].abort_word = (uint64_t)hostd;
    a[r].status = (uint64_t)(hostd + 4096 + r * 8192);
    a[r].parity_bytes = PAR;
    a[r].ll_off = LLOFF;
    a[r].nranks = 2;
    a[r].rank = r;
    a[r].op = GC_OP_SUM;
    a[r].input = (uint64_t)(bufs + r * (16 << 20));
    a[r].output = (uint64_t)(bufs + r * (16 << 20) + (8 << 20));
  }
  for (int r = 0; r < 2; r++)
    for (int p = 0; p < 2; p++) {
      char* parea = dev + p * AREA;
      char* marea = dev + r * AREA;
      a[r].put_data[p] = (uint64_t)(parea + 65536 + r * INBOX);
      a[r].put_flag[p] = (uint64_t)(parea + 4096 + r * 1024);
      a[r].get_data[p] = (uint64_t)(marea + 65536 + p * INBOX);
      a[r].get_flag[p] = (uint64_t)(marea + 4096 + p * 1024);
    }
  cudaStream_t ss[2];
  for (int r = 0; r < 2; r++) CK(cudaStreamCreateWithFlags(&ss[r], cudaStreamNonBlocking));
  const int K = 20, R = 100;
  for (int rep = 0; rep < 1; rep++)
  for (uint64_t bytes : {8ull, 4096ull, 8192ull, 32768ull, 131072ull}) {
    for (int ll = 1; ll >= 0; ll--) {
      if (ll && bytes > 32768) continue;
      int grid = 1;
      if (ll && bytes > 4096) grid = bytes / 4096;
      if (!ll && bytes > 32768) grid = 4;
      GcDirectArgs b[2] = {a[0], a[1]};
      for (int r = 0; r < 2; r++) {
        b[r].count = bytes / 4;
        b[r].meta = (77ull << 32) | bytes;
        b[r].flags = (ll ? GC_FLAG_LL : 0) | (GC_DIRECT_ALL_REDUCE << GC_DIRECT_KIND_SHIFT);
      }
      cudaGraph_t g[2]; cudaGraphExec_t ge[2];
      for (int r = 0; r < 2; r++) {
        CK(cudaStreamBeginCapture(ss[r], cudaStreamCaptureModeRelaxed));
        for (int k = 0; k < K; k++) kf<<<grid, 512, 0, ss[r]>>>(b[r]);
        CK(cudaStreamEndCapture(ss[r], &g[r]));
        CK(cudaGraphInstantiate(&ge[r], g[r], 0));
      }
      for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(ge[r], ss[r]));
      CK(cudaDeviceSynchronize());
      double t0 = now_us();
      for (int i = 0; i < R; i++) for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(ge[r], ss[r]));
      CK(cudaDeviceSynchronize());
      double tg = (now_us() - t0) / (R * K);
      // queued launches, both streams
      t0 = now_us();
      for (int i = 0; i < R * K; i++) for (int r = 0; r < 2; r++) kf<<<grid, 512, 0, ss[r]>>>(b[r]);
      CK(cudaDeviceSynchronize());
      double tq = (now_us() - t0) / (R * K);
      printf("%7llu B %s grid %d: graph %.2f us/call, queued (2 streams, 1 thread) %.2f\n", (unsigned long long)bytes, ll ? "LL    " : "Simple", grid, tg, tq);
      for (int r = 0; r < 2; r++) { cudaGraphExecDestroy(ge[r]); cudaGraphDestroy(g[r]); }
    }
  }
  unsigned code = *(volatile unsigned*)(host + 4096);
  printf("status code rank0 %u\n", code);
  return 0;
}

#include <cstdio>
#include <cstring>
#include <chrono>
#include <cuda_runtime.h>
#include "gpucoll.cuh"
#include "os3.cuh"
static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define CK(x) do { auto _e = (x); if (_e) { printf("error %d at %s:%d\n", (int)_e, __FILE__, __LINE__); exit(1); } } while (0)
extern "C" __global__ void __launch_bounds__(512, 1) kf(GcDirectArgs a) { direct_all_reduce_op<float>(a); }
int main() {
  CK(cudaSetDevice(0));
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  const size_t AREA = 8 << 20, PAR = 2 << 20, INBOX = 512 << 10, LLOFF = 256 << 10;
  char* dev; CK(cudaMalloc(&dev, 2 * AREA + (64 << 20))); CK(cudaMemset(dev, 0, 2 * AREA + (64 << 20)));
  char* host; CK(cudaHostAlloc(&host, 1 << 20, cudaHostAllocMapped)); memset(host, 0, 1 << 20);
  char* hostd; CK(cudaHostGetDevicePointer((void**)&hostd, host, 0));
  char* bufs = dev + 2 * AREA;
  GcDirectArgs a[2];
  for (int r = 0; r < 2; r++) {
    memset(&a[r], 0, sizeof(GcDirectArgs));
    char* area = dev + r * AREA;
    a[r].ctl = (uint64_t)area; a[r].abort_word = (uint64_t)hostd; a[r].status = (uint64_t)(hostd + 4096 + r * 8192);
    a[r].parity_bytes = PAR; a[r].ll_off = LLOFF; a[r].nranks = 2; a[r].rank = r; a[r].op = GC_OP_SUM;
    a[r].input = (uint64_t)(bufs + r * (16 << 20)); a[r].output = (uint64_t)(bufs + r * (16 << 20) + (8 << 20));
    a[r].count = 2; a[r].meta = (77ull << 32) | 8; a[r].flags = GC_FLAG_LL;
  }
  for (int r = 0; r < 2; r++)
    for (int p = 0; p < 2; p++) {
      char* parea = dev + p * AREA; char* marea = dev + r * AREA;
      a[r].put_data[p] = (uint64_t)(parea + 65536 + r * INBOX); a[r].put_flag[p] = (uint64_t)(parea + 4096 + r * 1024);
      a[r].get_data[p] = (uint64_t)(marea + 65536 + p * INBOX); a[r].get_flag[p] = (uint64_t)(marea + 4096 + p * 1024);
    }
  cudaStream_t ss[2];
  for (int r = 0; r < 2; r++) CK(cudaStreamCreateWithFlags(&ss[r], cudaStreamNonBlocking));
  const int K = 20, R = 40;
  cudaGraph_t g[2]; cudaGraphExec_t ge[2];
  for (int r = 0; r < 2; r++) {
    CK(cudaStreamBeginCapture(ss[r], cudaStreamCaptureModeRelaxed));
    for (int k = 0; k < K; k++) kf<<<1, 512, 0, ss[r]>>>(a[r]);
    CK(cudaStreamEndCapture(ss[r], &g[r]));
    CK(cudaGraphInstantiate(&ge[r], g[r], 0));
  }
  for (int i = 0; i < 5; i++) for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(ge[r], ss[r]));
  CK(cudaDeviceSynchronize());
  double t0 = now_us();
  for (int i = 0; i < R; i++) for (int r = 0; r < 2; r++) CK(cudaGraphLaunch(ge[r], ss[r]));
  CK(cudaDeviceSynchronize());
  printf("graph %.2f us/call\n", (now_us() - t0) / (R * K));
  static unsigned long long ts[2][1024][10];
  CK(cudaMemcpyFromSymbol(ts, g_ts, sizeof(ts)));
  // epochs 1..(5+R)*K; take the last R*K - 1, within graph replays (skip the first of each graph)
  const char* nm[] = {"start", "epoch read+sync", "push", "header poll", "meta/progress+sync", "data poll+fold+store", "end sync"};
  for (int r = 0; r < 2; r++) {
    double acc[7] = {0}; double gap = 0, dur = 0; int n = 0, ng = 0;
    int last = (5 + R) * K;
    for (int e = last - 400 + 1; e <= last; e++) {
      unsigned long long* t = ts[r][e & 1023];
      for (int k = 1; k <= 6; k++) acc[k] += (double)(t[k] - t[k - 1]);
      dur += (double)(t[9] - t[8]);
      n++;
      if (e % K != 1) { gap += (double)(t[8] - ts[r][(e - 1) & 1023][9]); ng++; }
    }
    printf("rank %d (clock %d kHz):", r, clk);
    for (int k = 1; k <= 6; k++) printf(" %s %.2f us |", nm[k], acc[k] / n / (clk / 1000.0));
    printf(" kernel (globaltimer) %.2f us, gap end->next start %.2f us\n", dur / n / 1000.0, gap / ng / 1000.0);
  }
  return 0;
}

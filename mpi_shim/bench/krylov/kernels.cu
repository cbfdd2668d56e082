/* The Krylov mini-app's GPU kernels (loaded by gpu.c from the fatbin that
 * scripts/build-shim-gpubin embeds). cpu.c does the same arithmetic in the
 * same order; kr_math.h says how. Vectors are the rank's interior points,
 * x fastest, then y, then z; p has one halo plane below and above (p[-plane]
 * and p[n] onward). Built with -fmad=false. */
#include "kr_math.h"

/* Sum acc over the block (halving tree) into part[blockIdx.x]. */
__device__ static void block_sum(double acc, double *part)
{
    __shared__ double sh[KR_T];
    int t = threadIdx.x;
    sh[t] = acc;
    __syncthreads();
    for (int s = KR_T / 2; s > 0; s >>= 1) {
        if (t < s)
            sh[t] = sh[t] + sh[t + s];
        __syncthreads();
    }
    if (t == 0)
        part[blockIdx.x] = sh[0];
}

/* q = A p (7-point, 6 on the diagonal, Dirichlet zero outside in x and y;
 * the halo planes in z) and the partials of p . q. */
extern "C" __global__ void kr_stencil_dot(int nx, int ny, int n, const double *p, double *q,
                                          double *part)
{
    int lanes = gridDim.x * KR_T, plane = nx * ny;
    double acc = 0.0;
    for (int i = blockIdx.x * KR_T + threadIdx.x; i < n; i += lanes) {
        int x = i % nx, y = (i / nx) % ny;
        double c = p[i];
        double xm = x > 0 ? p[i - 1] : 0.0, xp = x < nx - 1 ? p[i + 1] : 0.0;
        double ym = y > 0 ? p[i - nx] : 0.0, yp = y < ny - 1 ? p[i + nx] : 0.0;
        double zm = p[i - plane], zp = p[i + plane];
        double v = 6.0 * c - (((((xm + xp) + ym) + yp) + zm) + zp);
        q[i] = v;
        acc = acc + c * v;
    }
    block_sum(acc, part);
}

/* x += alpha p, r -= alpha q, and the partials of r . r. */
extern "C" __global__ void kr_update_dot(int n, double alpha, double *x, double *r,
                                         const double *p, const double *q, double *part)
{
    int lanes = gridDim.x * KR_T;
    double acc = 0.0;
    for (int i = blockIdx.x * KR_T + threadIdx.x; i < n; i += lanes) {
        x[i] = x[i] + alpha * p[i];
        double v = r[i] - alpha * q[i];
        r[i] = v;
        acc = acc + v * v;
    }
    block_sum(acc, part);
}

/* p = r + beta p. */
extern "C" __global__ void kr_update_p(int n, double beta, double *p, const double *r)
{
    int lanes = gridDim.x * KR_T;
    for (int i = blockIdx.x * KR_T + threadIdx.x; i < n; i += lanes)
        p[i] = r[i] + beta * p[i];
}

/* The partials of a . b. */
extern "C" __global__ void kr_dot(int n, const double *a, const double *b, double *part)
{
    int lanes = gridDim.x * KR_T;
    double acc = 0.0;
    for (int i = blockIdx.x * KR_T + threadIdx.x; i < n; i += lanes)
        acc = acc + a[i] * b[i];
    block_sum(acc, part);
}

/* One block of KR_GMAX threads: out[1] = the sum of the g partials,
 * out[0] = its quantised value (kr_quantize). */
extern "C" __global__ void kr_finalize(int g, const double *part, double *out, double q,
                                       double inv_q, double limit)
{
    __shared__ double sh[KR_GMAX];
    int t = threadIdx.x;
    sh[t] = t < g ? part[t] : 0.0;
    __syncthreads();
    for (int s = KR_GMAX / 2; s > 0; s >>= 1) {
        if (t < s)
            sh[t] = sh[t] + sh[t + s];
        __syncthreads();
    }
    if (t == 0) {
        out[1] = sh[0];
        out[0] = kr_quantize(sh[0], q, inv_q, limit);
    }
}

/* What the GPU kernels (kernels.cu) and their CPU twins (cpu.c) share, so
 * that both do the same floating-point operations in the same order and
 * give bit-identical results: the lane layout of every reduction and the
 * quantisation of a rank's partial sum.
 *
 * Reductions: lane l = block * KR_T + thread adds the terms i = l, l + L,
 * l + 2L, ... (L = blocks * KR_T lanes) in that order; each block sums its
 * KR_T lanes as a halving tree; one block of KR_GMAX threads sums the block
 * partials (zero-padded) as a halving tree. Both sides are compiled without
 * contraction of a * b + c into fma (nvcc -fmad=false, cc -ffp-contract=off). */
#ifndef KR_MATH_H
#define KR_MATH_H

#ifdef __CUDACC__
#define KR_FN __host__ __device__ static inline
#else
#include <math.h>
#define KR_FN static inline
#endif

#define KR_T 256     /* threads per block of the vector kernels */
#define KR_GMAX 1024 /* most blocks; the threads of the final sum */

/* Blocks of a reduction over n terms. */
KR_FN int kr_blocks(long long n)
{
    long long g = (n + KR_T - 1) / KR_T;
    return g < 1 ? 1 : g > KR_GMAX ? KR_GMAX : (int)g;
}

/* A rank's partial sum rounded to a multiple of q (a power of two; inv_q
 * its inverse, so the scalings are exact), or +inf when its magnitude
 * exceeds limit (or it is not a number): every rank's contribution is then
 * an integer multiple of q small enough that any order of adding them is
 * exact, and an inf anywhere makes the sum +inf in any order (see
 * README.md, "Deterministic dot products"). inv_q = 0: raw as it is
 * (--plain-sums, to see what the quantisation avoids). */
KR_FN double kr_quantize(double raw, double q, double inv_q, double limit)
{
    if (inv_q == 0.0)
        return raw;
    double x = rint(raw * inv_q) * q;
    return fabs(x) <= limit ? x : HUGE_VAL;
}

#endif

/* The Krylov mini-app's pieces: the grid, and the vector operations it
 * runs on the GPU (gpu.c, kernels.cu) or, with --host, on the CPU (cpu.c),
 * bit-identically (kr_math.h). */
#ifndef KRYLOV_H
#define KRYLOV_H

#include <stddef.h>

/* A rank's slab: nx * ny * nz interior points (x fastest), n of them. */
struct kr_grid {
    int nx, ny, nz;
    int plane; /* nx * ny */
    int n;     /* plane * nz */
    int blocks; /* kr_blocks(n) */
};

/* Where the vectors live and how they are computed on. Memory from
 * `alloc` is what the app hands to MPI in direct mode (device memory, or
 * host memory with --host); `alloc_pinned` is host memory for staging by
 * hand (-DSTAGE). The vector operations work on a rank's n interior
 * points; `p` has a halo plane below (p[-plane]) and above (p[n]). A
 * reduction leaves one partial per block in part[0..blocks); `finalize`
 * sums them into out[1] and the quantised sum into out[0]. */
struct kr_ops {
    const char *name;
    void *(*alloc)(size_t bytes); /* zero-filled */
    void (*free)(void *p);
    void *(*alloc_pinned)(size_t bytes);
    void (*free_pinned)(void *p);
    void (*to_vec)(void *dst, const void *host, size_t bytes);
    void (*from_vec)(void *host, const void *src, size_t bytes);
    void (*sync)(void);
    void (*stencil_dot)(const struct kr_grid *g, const double *p, double *q, double *part);
    void (*update_dot)(const struct kr_grid *g, double alpha, double *x, double *r,
                       const double *p, const double *q, double *part);
    void (*update_p)(const struct kr_grid *g, double beta, double *p, const double *r);
    void (*dot)(const struct kr_grid *g, const double *a, const double *b, double *part);
    void (*finalize)(const struct kr_grid *g, const double *part, double *out, double q,
                     double inv_q, double limit);
};

extern const struct kr_ops kr_cpu_ops;
/* The GPU's operations, after selecting the device of `local_rank`; NULL
 * (with a message) when the binary has no kernels or CUDA is missing. */
const struct kr_ops *kr_gpu_ops(int local_rank);

#endif

/* The GPU side of the Krylov mini-app: kernels.cu's fatbin (embedded at
 * build time when KRYLOV_FATBIN names it: scripts/build-shim-gpubin) loaded
 * through the driver API (../cudrv.c), launched on the legacy default
 * stream, which also orders the synchronous copies and, through the shim,
 * MPI's use of the buffers (the shim's stream rule). */
#include "krylov.h"
#include "kr_math.h"
#include "../cudrv.h"

#include <stdio.h>

#ifdef KRYLOV_FATBIN
__asm__(".section .rodata\n"
        ".balign 64\n"
        "krylov_fatbin_image:\n"
        ".incbin \"" KRYLOV_FATBIN "\"\n"
        ".byte 0\n"
        ".previous\n");
extern const unsigned char krylov_fatbin_image[];

static struct {
    void *stencil_dot, *update_dot, *update_p, *dot, *finalize;
} fn;

static void *gpu_host_alloc(size_t bytes)
{
    return cd_host_alloc(bytes);
}

static void gpu_stencil_dot(const struct kr_grid *g, const double *p, double *q, double *part)
{
    void *args[] = {(void *)&g->nx, (void *)&g->ny, (void *)&g->n, &p, &q, &part};
    cd_launch(fn.stencil_dot, (unsigned)g->blocks, KR_T, args);
}

static void gpu_update_dot(const struct kr_grid *g, double alpha, double *x, double *r,
                           const double *p, const double *q, double *part)
{
    void *args[] = {(void *)&g->n, &alpha, &x, &r, &p, &q, &part};
    cd_launch(fn.update_dot, (unsigned)g->blocks, KR_T, args);
}

static void gpu_update_p(const struct kr_grid *g, double beta, double *p, const double *r)
{
    void *args[] = {(void *)&g->n, &beta, &p, &r};
    cd_launch(fn.update_p, (unsigned)g->blocks, KR_T, args);
}

static void gpu_dot(const struct kr_grid *g, const double *a, const double *b, double *part)
{
    void *args[] = {(void *)&g->n, &a, &b, &part};
    cd_launch(fn.dot, (unsigned)g->blocks, KR_T, args);
}

static void gpu_finalize(const struct kr_grid *g, const double *part, double *out, double q,
                         double inv_q, double limit)
{
    void *args[] = {(void *)&g->blocks, &part, &out, &q, &inv_q, &limit};
    cd_launch(fn.finalize, 1, KR_GMAX, args);
}

static const struct kr_ops gpu_ops = {
    .name = "device",
    .alloc = cd_malloc,
    .free = cd_free,
    .alloc_pinned = gpu_host_alloc,
    .free_pinned = cd_host_free,
    .to_vec = cd_htod,
    .from_vec = cd_dtoh,
    .sync = cd_sync,
    .stencil_dot = gpu_stencil_dot,
    .update_dot = gpu_update_dot,
    .update_p = gpu_update_p,
    .dot = gpu_dot,
    .finalize = gpu_finalize,
};

const struct kr_ops *kr_gpu_ops(int local_rank)
{
    if (cd_open() != 0)
        return NULL;
    cd_select(local_rank);
    void *m = cd_module(krylov_fatbin_image);
    fn.stencil_dot = cd_function(m, "kr_stencil_dot");
    fn.update_dot = cd_function(m, "kr_update_dot");
    fn.update_p = cd_function(m, "kr_update_p");
    fn.dot = cd_function(m, "kr_dot");
    fn.finalize = cd_function(m, "kr_finalize");
    return &gpu_ops;
}
#else
const struct kr_ops *kr_gpu_ops(int local_rank)
{
    (void)local_rank;
    fprintf(stderr, "krylov: built without GPU kernels (KRYLOV_FATBIN): only --host runs\n");
    return NULL;
}
#endif

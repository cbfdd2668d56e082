/* The CPU twins of kernels.cu (--host): the same arithmetic in the same
 * order, lane by lane (kr_math.h), so a host run's residual history is the
 * GPU run's, bit for bit. Built with -ffp-contract=off. */
#include "krylov.h"
#include "kr_math.h"

#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p)
        abort();
    return p;
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static void cpu_sync(void) {}

/* The lane sums of kernels.cu: lanes[l] = terms l, l + L, ... in order. */
static double *lanes_for(const struct kr_grid *g)
{
    static double *lanes;
    static size_t have;
    size_t want = (size_t)g->blocks * KR_T;
    if (want > have) {
        free(lanes);
        lanes = malloc(want * sizeof *lanes);
        if (!lanes)
            abort();
        have = want;
    }
    memset(lanes, 0, want * sizeof *lanes);
    return lanes;
}

/* kernels.cu's block_sum, for every block. */
static void block_sums(const struct kr_grid *g, double *lanes, double *part)
{
    for (int b = 0; b < g->blocks; b++) {
        double *sh = lanes + (size_t)b * KR_T;
        for (int s = KR_T / 2; s > 0; s >>= 1)
            for (int t = 0; t < s; t++)
                sh[t] = sh[t] + sh[t + s];
        part[b] = sh[0];
    }
}

static void cpu_stencil_dot(const struct kr_grid *g, const double *p, double *q, double *part)
{
    int nx = g->nx, ny = g->ny, plane = g->plane, n = g->n, L = g->blocks * KR_T;
    double *lanes = lanes_for(g);
    for (int i = 0, l = 0; i < n; i++, l = l + 1 == L ? 0 : l + 1) {
        int x = i % nx, y = (i / nx) % ny;
        double c = p[i];
        double xm = x > 0 ? p[i - 1] : 0.0, xp = x < nx - 1 ? p[i + 1] : 0.0;
        double ym = y > 0 ? p[i - nx] : 0.0, yp = y < ny - 1 ? p[i + nx] : 0.0;
        double zm = p[i - plane], zp = p[i + plane];
        double v = 6.0 * c - (((((xm + xp) + ym) + yp) + zm) + zp);
        q[i] = v;
        lanes[l] = lanes[l] + c * v;
    }
    block_sums(g, lanes, part);
}

static void cpu_update_dot(const struct kr_grid *g, double alpha, double *x, double *r,
                           const double *p, const double *q, double *part)
{
    int n = g->n, L = g->blocks * KR_T;
    double *lanes = lanes_for(g);
    for (int i = 0, l = 0; i < n; i++, l = l + 1 == L ? 0 : l + 1) {
        x[i] = x[i] + alpha * p[i];
        double v = r[i] - alpha * q[i];
        r[i] = v;
        lanes[l] = lanes[l] + v * v;
    }
    block_sums(g, lanes, part);
}

static void cpu_update_p(const struct kr_grid *g, double beta, double *p, const double *r)
{
    for (int i = 0; i < g->n; i++)
        p[i] = r[i] + beta * p[i];
}

static void cpu_dot(const struct kr_grid *g, const double *a, const double *b, double *part)
{
    int n = g->n, L = g->blocks * KR_T;
    double *lanes = lanes_for(g);
    for (int i = 0, l = 0; i < n; i++, l = l + 1 == L ? 0 : l + 1)
        lanes[l] = lanes[l] + a[i] * b[i];
    block_sums(g, lanes, part);
}

static void cpu_finalize(const struct kr_grid *g, const double *part, double *out, double q,
                         double inv_q, double limit)
{
    double sh[KR_GMAX];
    for (int t = 0; t < KR_GMAX; t++)
        sh[t] = t < g->blocks ? part[t] : 0.0;
    for (int s = KR_GMAX / 2; s > 0; s >>= 1)
        for (int t = 0; t < s; t++)
            sh[t] = sh[t] + sh[t + s];
    out[1] = sh[0];
    out[0] = kr_quantize(sh[0], q, inv_q, limit);
}

const struct kr_ops kr_cpu_ops = {
    .name = "host",
    .alloc = cpu_alloc,
    .free = free,
    .alloc_pinned = cpu_alloc,
    .free_pinned = free,
    .to_vec = cpu_copy,
    .from_vec = cpu_copy,
    .sync = cpu_sync,
    .stencil_dot = cpu_stencil_dot,
    .update_dot = cpu_update_dot,
    .update_p = cpu_update_p,
    .dot = cpu_dot,
    .finalize = cpu_finalize,
};

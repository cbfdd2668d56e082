/* The Krylov mini-app: conjugate gradients on the 3-D 7-point Poisson
 * problem (Dirichlet boundary; the right-hand side A u of a chosen exact
 * solution u), n^3 unknowns per rank in slabs along z. Each iteration: a
 * halo exchange of one z-plane each way (MPI_Isend/MPI_Irecv/MPI_Waitall),
 * two MPI_Allreduce of one double (p.Ap and r.r, computed on the GPU), and
 * the residual check on the host.
 *
 * Two builds of this one source:
 *   direct (default)  the vectors' memory goes to MPI as it is: device
 *                     pointers, for a CUDA-aware MPI or the gpucoll shim
 *                     (LD_PRELOAD=libgpucoll_mpi.so), which stages the halo
 *                     planes and runs the allreduce on the GPU;
 *   -DSTAGE           staging by hand, what a program does today on an MPI
 *                     that is not CUDA-aware: the planes and the partial
 *                     sums copied to page-locked host buffers, MPI on those,
 *                     the planes copied back.
 * --host runs the same algorithm on host memory with CPU loops (cpu.c),
 * bit-identical to the GPU kernels (CI runs it under the shim's host mode).
 *
 * The dot products' cross-rank sums are exact, hence the same in every
 * mode, MPI library and rank order (README.md, "Deterministic dot
 * products"): the residual history's hash must agree between runs.
 *
 *   mpirun -n 2 krylov [--host] [--sizes 16,64,192] [--tol 1e-8]
 *                      [--max-iters N] [--warmup W] [--history]
 *                      [--headroom BITS] [--plain-sums]
 *
 * Rank 0 prints one line and one JSON line per size: iterations, relative
 * residual, the true residual and the error against u after the solve, and
 * the time per iteration (median and mean over the iterations after the
 * warm-up, each the largest over the ranks). */
#include "krylov.h"
#include "kr_math.h"

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef STAGE
#define MODE "staged"
#else
#define MODE "direct"
#endif

enum { TAG_UP = 11, TAG_DOWN = 12 };
struct opts {
    int host, history, warmup, max_iters, nsizes;
    /* Bits a rank's quantised partial may grow above the previous sum's
     * exponent before the sum is redone with an agreed scale (8). */
    int headroom;
    int plain_sums; /* no quantisation: MPI's or gpucoll's sum order shows */
    int sizes[16];
    double tol;
};

struct solver {
    const struct kr_ops *ops;
    struct kr_grid g;
    MPI_Comm comm;
    int rank, size, down, up;
    int log2size; /* ceil(log2(size)) */
    /* vector memory (device, or host with --host) */
    double *x, *r, *pbase, *p, *q, *part, *out, *sum;
    /* page-locked host memory (host memory with --host) */
    double *h_scalar;
#ifdef STAGE
    double *h_send_lo, *h_send_hi, *h_recv_lo, *h_recv_hi;
#endif
    int headroom, plain_sums;
    int retries;
    uint64_t hash;
};

static void fail(const char *msg)
{
    fprintf(stderr, "krylov: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static void hash_double(struct solver *s, double v)
{
    unsigned char b[sizeof v];
    memcpy(b, &v, sizeof v);
    for (size_t k = 0; k < sizeof v; k++) {
        s->hash ^= b[k];
        s->hash *= 0x100000001b3ull;
    }
}

/* ---- communication: the only code the two builds differ in ---------- */

/* Exchange p's first and last interior planes with the neighbours, into
 * their halo planes (zero at the global boundary: no neighbour there). */
static void halo(struct solver *s, double *p)
{
    const struct kr_grid *g = &s->g;
    size_t plane = (size_t)g->plane, bytes = plane * sizeof(double);
    double *lo_halo = p - plane, *hi_halo = p + g->n;
    double *lo_plane = p, *hi_plane = p + (size_t)g->n - plane;
    MPI_Request q[4];
#ifdef STAGE
    if (s->down != MPI_PROC_NULL)
        s->ops->from_vec(s->h_send_lo, lo_plane, bytes);
    if (s->up != MPI_PROC_NULL)
        s->ops->from_vec(s->h_send_hi, hi_plane, bytes);
    MPI_Irecv(s->h_recv_lo, g->plane, MPI_DOUBLE, s->down, TAG_UP, s->comm, &q[0]);
    MPI_Irecv(s->h_recv_hi, g->plane, MPI_DOUBLE, s->up, TAG_DOWN, s->comm, &q[1]);
    MPI_Isend(s->h_send_lo, g->plane, MPI_DOUBLE, s->down, TAG_DOWN, s->comm, &q[2]);
    MPI_Isend(s->h_send_hi, g->plane, MPI_DOUBLE, s->up, TAG_UP, s->comm, &q[3]);
    MPI_Waitall(4, q, MPI_STATUSES_IGNORE);
    if (s->down != MPI_PROC_NULL)
        s->ops->to_vec(lo_halo, s->h_recv_lo, bytes);
    if (s->up != MPI_PROC_NULL)
        s->ops->to_vec(hi_halo, s->h_recv_hi, bytes);
#else
    (void)bytes;
    MPI_Irecv(lo_halo, g->plane, MPI_DOUBLE, s->down, TAG_UP, s->comm, &q[0]);
    MPI_Irecv(hi_halo, g->plane, MPI_DOUBLE, s->up, TAG_DOWN, s->comm, &q[1]);
    MPI_Isend(lo_plane, g->plane, MPI_DOUBLE, s->down, TAG_DOWN, s->comm, &q[2]);
    MPI_Isend(hi_plane, g->plane, MPI_DOUBLE, s->up, TAG_UP, s->comm, &q[3]);
    MPI_Waitall(4, q, MPI_STATUSES_IGNORE);
#endif
}

/* The sum over ranks of s->out[0] (vector memory), returned on the host. */
static double allreduce_out(struct solver *s)
{
    double sum;
#ifdef STAGE
    s->ops->from_vec(s->h_scalar, s->out, sizeof(double));
    MPI_Allreduce(s->h_scalar, &sum, 1, MPI_DOUBLE, MPI_SUM, s->comm);
#else
    MPI_Allreduce(s->out, s->sum, 1, MPI_DOUBLE, MPI_SUM, s->comm);
    s->ops->from_vec(s->h_scalar, s->sum, sizeof(double));
    sum = *s->h_scalar;
#endif
    return sum;
}

/* ---- deterministic global sums --------------------------------------- */

/* The scale for sums of magnitude about `prev`: q = 2^e such that every
 * rank's partial, quantised to a multiple of q and at most `limit` in
 * magnitude, keeps any sum of them below 2^53 q (exact). 0: no usable
 * scale. */
static int scale_from(int top_exp, int log2size, double *q, double *inv_q, double *limit)
{
    int e = top_exp + log2size - 53;
    if (e < -1000 || e > 1000)
        return 0;
    *q = ldexp(1.0, e);
    *inv_q = ldexp(1.0, -e);
    *limit = ldexp(1.0, top_exp);
    return 1;
}

/* The global sum of the partials in s->part. `prev`: the previous value of
 * the same sum (0: none), which sets the scale; a rank whose partial does
 * not fit it makes the sum +inf everywhere, and every rank then agrees on
 * the largest partial's exponent (an MPI_MAX of one int) and sums again. */
static double global_sum(struct solver *s, double prev)
{
    double q = 1.0, inv_q = 1.0, limit = 0.0;
    if (s->plain_sums) {
        s->ops->finalize(&s->g, s->part, s->out, 1.0, 0.0, 0.0);
        return allreduce_out(s);
    }
    int scaled = prev > 0.0 && isfinite(prev) &&
                 scale_from(ilogb(prev) + s->headroom + 1, s->log2size, &q, &inv_q, &limit);
    s->ops->finalize(&s->g, s->part, s->out, q, inv_q, limit);
    if (scaled) {
        double sum = allreduce_out(s);
        if (isfinite(sum))
            return sum;
        s->retries++;
    }
    double raw;
    s->ops->from_vec(&raw, s->out + 1, sizeof raw);
    int e = raw == 0.0 ? INT_MIN : !isfinite(raw) ? INT_MAX : ilogb(raw), top;
    MPI_Allreduce(&e, &top, 1, MPI_INT, MPI_MAX, s->comm);
    if (top == INT_MAX)
        fail("a dot product is not finite (breakdown)");
    if (top == INT_MIN)
        return 0.0;
    if (!scale_from(top + 1, s->log2size, &q, &inv_q, &limit))
        fail("a dot product is out of range");
    double mine = kr_quantize(raw, q, inv_q, limit);
    s->ops->to_vec(s->out, &mine, sizeof mine);
    return allreduce_out(s);
}

/* ---- the problem ------------------------------------------------------ */

/* The exact solution at global grid point (i, j, k) of an N^3-ish grid:
 * zero on the boundary (i = -1 or nx ...), smooth, no eigenvector. */
static double exact(const struct solver *s, long i, long j, long k)
{
    double x = (double)(i + 1) / (s->g.nx + 1), y = (double)(j + 1) / (s->g.ny + 1);
    double z = (double)(k + 1) / ((long)s->g.nz * s->size + 1);
    return x * (1 - x) * y * (1 - y) * z * (1 - z) * (1 + x + 2 * y + 3 * z);
}

/* b = A u on this rank's points. */
static double *rhs(const struct solver *s)
{
    const struct kr_grid *g = &s->g;
    double *b = malloc((size_t)g->n * sizeof *b);
    if (!b)
        fail("out of host memory");
    long z0 = (long)s->rank * g->nz;
    for (long k = 0; k < g->nz; k++)
        for (long j = 0; j < g->ny; j++)
            for (long i = 0; i < g->nx; i++) {
                long gk = z0 + k;
                double nb = exact(s, i - 1, j, gk) + exact(s, i + 1, j, gk) +
                            exact(s, i, j - 1, gk) + exact(s, i, j + 1, gk) +
                            exact(s, i, j, gk - 1) + exact(s, i, j, gk + 1);
                b[(k * g->ny + j) * g->nx + i] = 6 * exact(s, i, j, gk) - nb;
            }
    return b;
}

static void setup(struct solver *s, const struct kr_ops *ops, const struct opts *o, int n)
{
    const struct kr_ops *keep = ops;
    MPI_Comm comm = s->comm;
    int rank = s->rank, size = s->size;
    memset(s, 0, sizeof *s);
    s->ops = keep;
    s->comm = comm;
    s->rank = rank;
    s->size = size;
    s->headroom = o->headroom;
    s->plain_sums = o->plain_sums;
    s->down = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    s->up = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;
    while ((1 << s->log2size) < size)
        s->log2size++;
    struct kr_grid *g = &s->g;
    g->nx = g->ny = g->nz = n;
    g->plane = n * n;
    g->n = g->plane * n;
    g->blocks = kr_blocks(g->n);
    size_t vec = (size_t)g->n * sizeof(double), plane = (size_t)g->plane * sizeof(double);
    s->x = ops->alloc(vec);
    s->r = ops->alloc(vec);
    s->q = ops->alloc(vec);
    s->pbase = ops->alloc(vec + 2 * plane);
    s->p = s->pbase + g->plane;
    s->part = ops->alloc(KR_GMAX * sizeof(double));
    s->out = ops->alloc(2 * sizeof(double));
    s->sum = ops->alloc(sizeof(double));
    s->h_scalar = ops->alloc_pinned(sizeof(double));
#ifdef STAGE
    s->h_send_lo = ops->alloc_pinned(plane);
    s->h_send_hi = ops->alloc_pinned(plane);
    s->h_recv_lo = ops->alloc_pinned(plane);
    s->h_recv_hi = ops->alloc_pinned(plane);
#endif
    s->hash = 0xcbf29ce484222325ull;
}

static void teardown(struct solver *s)
{
    const struct kr_ops *ops = s->ops;
    ops->free(s->x);
    ops->free(s->r);
    ops->free(s->q);
    ops->free(s->pbase);
    ops->free(s->part);
    ops->free(s->out);
    ops->free(s->sum);
    ops->free_pinned(s->h_scalar);
#ifdef STAGE
    ops->free_pinned(s->h_send_lo);
    ops->free_pinned(s->h_send_hi);
    ops->free_pinned(s->h_recv_lo);
    ops->free_pinned(s->h_recv_hi);
#endif
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Solve at n^3 per rank and report. */
static void run(struct solver *s, const struct opts *o, int n, int shim)
{
    const struct kr_ops *ops = s->ops;
    setup(s, ops, o, n);
    const struct kr_grid *g = &s->g;
    size_t vec = (size_t)g->n * sizeof(double);
    double *b = rhs(s);
    ops->to_vec(s->r, b, vec);
    ops->to_vec(s->p, b, vec);

    ops->dot(g, s->r, s->r, s->part);
    double bb = global_sum(s, 0.0), rr = bb, pap_prev = 0.0, relres = bb > 0 ? 1.0 : 0.0;
    hash_double(s, bb);
    double *t = malloc(((size_t)o->max_iters + 1) * sizeof *t);
    if (!t)
        fail("out of host memory");
    int iters = 0;
    MPI_Barrier(s->comm);
    for (int it = 0; it < o->max_iters && relres >= o->tol; it++) {
        t[it] = MPI_Wtime();
        halo(s, s->p);
        ops->stencil_dot(g, s->p, s->q, s->part);
        double pap = global_sum(s, pap_prev);
        double alpha = rr / pap;
        ops->update_dot(g, alpha, s->x, s->r, s->p, s->q, s->part);
        double rr_new = global_sum(s, rr);
        hash_double(s, pap);
        hash_double(s, rr_new);
        relres = sqrt(rr_new / bb);
        iters = it + 1;
        if (o->history && s->rank == 0)
            printf("history n=%d it=%d relres=%.17e\n", n, iters, relres);
        if (relres < o->tol)
            break;
        double beta = rr_new / rr;
        rr = rr_new;
        pap_prev = pap;
        ops->update_p(g, beta, s->p, s->r);
    }
    ops->sync();
    t[iters] = MPI_Wtime();

    /* Time per iteration after the warm-up, each rank's median and mean,
     * the largest over the ranks. */
    int first = iters > o->warmup ? o->warmup : 0, timed = iters - first;
    double stat[2] = {0, 0}, worst[2];
    if (timed > 0) {
        double *d = malloc((size_t)timed * sizeof *d);
        if (!d)
            fail("out of host memory");
        for (int k = 0; k < timed; k++) {
            d[k] = t[first + k + 1] - t[first + k];
            stat[1] += d[k];
        }
        qsort(d, (size_t)timed, sizeof *d, by_value);
        stat[0] = timed % 2 ? d[timed / 2] : 0.5 * (d[timed / 2 - 1] + d[timed / 2]);
        stat[1] /= timed;
        free(d);
    }
    MPI_Allreduce(stat, worst, 2, MPI_DOUBLE, MPI_MAX, s->comm);

    /* The solution against the problem: the true residual b - A x and the
     * error against u (host reductions; reported, not hashed). */
    double *xh = malloc(vec), *ax = malloc(vec);
    if (!xh || !ax)
        fail("out of host memory");
    ops->from_vec(xh, s->x, vec);
    ops->to_vec(s->p, xh, vec);
    halo(s, s->p);
    ops->stencil_dot(g, s->p, s->q, s->part);
    ops->from_vec(ax, s->q, vec);
    double mine[2] = {0, 0}, all[2];
    long z0 = (long)s->rank * g->nz;
    for (long k = 0, i = 0; k < g->nz; k++)
        for (long jj = 0; jj < g->ny; jj++)
            for (long ii = 0; ii < g->nx; ii++, i++) {
                double res = b[i] - ax[i], err = fabs(xh[i] - exact(s, ii, jj, z0 + k));
                mine[0] += res * res;
                if (err > mine[1])
                    mine[1] = err;
            }
    MPI_Allreduce(&mine[0], &all[0], 1, MPI_DOUBLE, MPI_SUM, s->comm);
    MPI_Allreduce(&mine[1], &all[1], 1, MPI_DOUBLE, MPI_MAX, s->comm);
    double true_relres = bb > 0 ? sqrt(all[0] / bb) : 0.0;

    if (s->rank == 0) {
        int converged = relres < o->tol;
        printf("krylov %s %s%s ranks=%d n=%d^3 iters=%d%s relres=%.3e true_relres=%.3e "
               "max_err=%.3e retries=%d iter_us median=%.2f mean=%.2f hash=%016llx\n",
               MODE, ops->name, shim ? " (shim)" : "", s->size, n, iters,
               converged ? "" : " (cap, not converged)", relres, true_relres, all[1], s->retries,
               1e6 * worst[0], 1e6 * worst[1], (unsigned long long)s->hash);
        printf("{\"app\":\"krylov\",\"mode\":\"%s\",\"mem\":\"%s\",\"shim\":%s,\"ranks\":%d,"
               "\"n\":%d,\"unknowns_per_rank\":%d,\"iters\":%d,\"converged\":%s,\"tol\":%g,"
               "\"relres\":%.17e,\"true_relres\":%.6e,\"max_err\":%.6e,\"retries\":%d,"
               "\"timed_iters\":%d,\"iter_us_median\":%.3f,\"iter_us_mean\":%.3f,"
               "\"hash\":\"%016llx\"}\n",
               MODE, ops->name, shim ? "true" : "false", s->size, n, g->n, iters,
               converged ? "true" : "false", o->tol, relres, true_relres, all[1], s->retries,
               timed, 1e6 * worst[0], 1e6 * worst[1], (unsigned long long)s->hash);
        fflush(stdout);
    }
    free(t);
    free(b);
    free(xh);
    free(ax);
    teardown(s);
}

static void usage(void)
{
    fprintf(stderr, "usage: krylov [--host] [--sizes N,N,...] [--tol T] [--max-iters N] "
                    "[--warmup W] [--history] [--headroom BITS] [--plain-sums]\n");
    exit(2);
}

static void parse(int argc, char **argv, struct opts *o)
{
    o->tol = 1e-8;
    o->max_iters = 20000;
    o->warmup = 5;
    o->headroom = 8;
    o->nsizes = 1;
    o->sizes[0] = 16;
    for (int k = 1; k < argc; k++) {
        const char *a = argv[k], *v = k + 1 < argc ? argv[k + 1] : NULL;
        if (!strcmp(a, "--host")) {
            o->host = 1;
        } else if (!strcmp(a, "--history")) {
            o->history = 1;
        } else if (!strcmp(a, "--plain-sums")) {
            o->plain_sums = 1;
        } else if (!strcmp(a, "--headroom") && v) {
            o->headroom = atoi(v), k++;
        } else if (!strcmp(a, "--tol") && v) {
            o->tol = atof(v), k++;
        } else if (!strcmp(a, "--max-iters") && v) {
            o->max_iters = atoi(v), k++;
        } else if (!strcmp(a, "--warmup") && v) {
            o->warmup = atoi(v), k++;
        } else if (!strcmp(a, "--sizes") && v) {
            o->nsizes = 0;
            for (const char *c = v; *c && o->nsizes < 16;) {
                o->sizes[o->nsizes++] = atoi(c);
                c = strchr(c, ',');
                if (!c)
                    break;
                c++;
            }
            k++;
        } else {
            usage();
        }
    }
    if (o->max_iters < 1 || o->warmup < 0 || !(o->tol > 0) || o->headroom < 0 ||
        o->headroom > 40)
        usage();
    for (int k = 0; k < o->nsizes; k++)
        if (o->sizes[k] < 2 || o->sizes[k] > 1000)
            usage();
}

int main(int argc, char **argv)
{
    struct opts o;
    memset(&o, 0, sizeof o);
    parse(argc, argv, &o);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const struct kr_ops *ops = &kr_cpu_ops;
    if (!o.host) {
        /* The GPU first, as a CUDA-aware program picks it before MPI_Init. */
        ops = kr_gpu_ops(lr ? atoi(lr) : 0);
        if (!ops)
            return 2;
    }
    MPI_Init(&argc, &argv);
    struct solver s;
    memset(&s, 0, sizeof s);
    s.ops = ops;
    s.comm = MPI_COMM_WORLD;
    MPI_Comm_rank(s.comm, &s.rank);
    MPI_Comm_size(s.comm, &s.size);
    int shim = dlsym(RTLD_DEFAULT, "gpucoll_shim_allreduce_native") != NULL;
#ifndef STAGE
    if (!o.host && !shim && s.rank == 0)
        fprintf(stderr, "krylov: device pointers go to MPI itself (no gpucoll shim loaded): "
                        "this MPI must be CUDA-aware\n");
#endif
    for (int k = 0; k < o.nsizes; k++)
        run(&s, &o, o.sizes[k], shim);
    MPI_Finalize();
    return 0;
}

/* Blocking MPI_Allreduce (float, sum) on device buffers, 8 B .. 1 GiB, timed
 * in one job three ways: through MPI_Allreduce (the shim when it is
 * preloaded or linked), NCCL's ncclAllReduce on its own communicator
 * (libnccl.so.2 opened at run time; enqueue + cudaStreamSynchronize, the same
 * blocking semantics) and gpucoll's own call through the shim's extra export
 * gpucoll_shim_allreduce_native (skipped when absent); plus host staging by
 * hand (cudaMemcpy to host, MPI_Allreduce on host, copy back) at the sizes
 * of --staging, and the 8 B host-memory MPI_Allreduce against
 * PMPI_Allreduce (the shim's overhead on host calls: zero without a shim),
 * on MPI_COMM_WORLD and, with a shim, on a duplicate that has a gpucoll
 * communicator (made by one gpucoll_shim_allreduce_native call): there the
 * shim hands host calls to MPI's nonblocking form under GPUCOLL_TIMEOUT.
 *
 *   mpirun -n 2 shim_bench [--min B] [--max B] [--budget S] [--staging B,B]
 *                          [--host-only] [--json FILE]
 *
 * Times are per call: the ways run in 7 interleaved rounds of timed blocks
 * (so that the machine's drift hits them alike); each block's time is the
 * slowest rank's mean, and the median block is reported. Each
 * result is checked (every rank sends ones: every element must be nranks).
 * Rank 0 prints a table and, with --json, writes the rows. */
#include "shimtest.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank, nranks;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- NCCL, opened at run time ---------------------------------------- */

typedef struct { char internal[128]; } nccl_id;
static struct {
    int (*GetUniqueId)(nccl_id *);
    int (*CommInitRank)(void **, int, nccl_id, int);
    int (*AllReduce)(const void *, void *, size_t, int, int, void *, void *);
    int (*CommDestroy)(void *);
    const char *(*GetErrorString)(int);
    void *comm;
} nccl;

static int nccl_open(void)
{
    void *lib = dlopen("libnccl.so.2", RTLD_NOW);
    if (!lib)
        lib = dlopen("libnccl.so", RTLD_NOW);
    int ok = lib != NULL;
    if (ok) {
        *(void **)&nccl.GetUniqueId = dlsym(lib, "ncclGetUniqueId");
        *(void **)&nccl.CommInitRank = dlsym(lib, "ncclCommInitRank");
        *(void **)&nccl.AllReduce = dlsym(lib, "ncclAllReduce");
        *(void **)&nccl.CommDestroy = dlsym(lib, "ncclCommDestroy");
        *(void **)&nccl.GetErrorString = dlsym(lib, "ncclGetErrorString");
        ok = nccl.GetUniqueId && nccl.CommInitRank && nccl.AllReduce && nccl.CommDestroy;
    }
    /* every rank must agree before the collective bootstrap */
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (rank == 0)
            printf("# NCCL: libnccl.so.2 not usable on every rank; its column is skipped\n");
        return 0;
    }
    nccl_id id;
    if (rank == 0 && nccl.GetUniqueId(&id) != 0)
        memset(&id, 0, sizeof id);
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    int rc = nccl.CommInitRank(&nccl.comm, nranks, id, rank);
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc != 0) {
        if (rank == 0)
            printf("# NCCL: ncclCommInitRank failed (%d); its column is skipped\n", rc);
        return 0;
    }
    return 1;
}

/* ---- the ways ----------------------------------------------------------- */

typedef int (*native_fn)(const void *, void *, long long, MPI_Datatype, MPI_Op, MPI_Comm);
static native_fn native;
static st_stream stream;
static float *host_send, *host_recv; /* staging buffers */

enum way { W_MPI, W_NCCL, W_NATIVE, W_STAGED, NWAYS };
static const char *way_names[NWAYS] = {"mpi", "nccl", "gpucoll", "staged"};

static int one_call(enum way w, void *send, void *recv, size_t count)
{
    switch (w) {
    case W_MPI:
        return MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case W_NCCL: {
        int rc = nccl.AllReduce(send, recv, count, 7 /* ncclFloat32 */, 0 /* ncclSum */, nccl.comm,
                                stream);
        return rc ? rc : st_dev_stream_sync(stream);
    }
    case W_NATIVE:
        return native(send, recv, (long long)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    default: {
        size_t bytes = count * sizeof(float);
        st_dev_memcpy(host_send, send, bytes);
        int rc = MPI_Allreduce(host_send, host_recv, (int)count, MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
        st_dev_memcpy(recv, host_recv, bytes);
        return rc;
    }
    }
}

/* Calls of way `w` that fit in about `seconds` (at least one), agreed by all ranks (after
 * warm-up calls); negative when a call failed. */
static long calls_for(enum way w, void *send, void *recv, size_t count, double seconds)
{
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) /* warm-up (and first-call setup) */
        rc = one_call(w, send, recv, count);
    double t0 = now();
    rc |= one_call(w, send, recv, count);
    double once = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc)
        return -1;
    long iters = (long)(seconds / (once > 1e-7 ? once : 1e-7));
    return iters < 1 ? 1 : (iters > 400 ? 400 : iters);
}

/* Seconds per call of one block of `iters` calls (slowest rank). */
static double time_block(enum way w, void *send, void *recv, size_t count, long iters, int *rc)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    for (long k = 0; k < iters && !*rc; k++)
        *rc = one_call(w, send, recv, count);
    double per = (now() - t0) / (double)iters;
    MPI_Allreduce(MPI_IN_PLACE, &per, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return per;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The ways in `run` timed in ROUNDS interleaved blocks (so that drift of the
 * machine hits every way alike), each block about budget / ROUNDS seconds;
 * t[w] = the median block's seconds per call, or -1 when a call failed or
 * the result was wrong. */
enum { ROUNDS = 7 };
static void time_ways(const int run[NWAYS], void *send, void *recv, size_t count, double budget,
                      double t[NWAYS])
{
    long iters[NWAYS];
    int rc[NWAYS] = {0};
    double blocks[NWAYS][ROUNDS];
    for (int w = 0; w < NWAYS; w++)
        if (run[w]) {
            iters[w] = calls_for((enum way)w, send, recv, count, budget / ROUNDS);
            if (iters[w] < 0)
                rc[w] = 1;
        }
    for (int r = 0; r < ROUNDS; r++)
        for (int w = 0; w < NWAYS; w++)
            if (run[w] && !rc[w])
                blocks[w][r] = time_block((enum way)w, send, recv, count, iters[w], &rc[w]);
    for (int w = 0; w < NWAYS; w++) {
        if (!run[w])
            continue;
        /* check: every rank sent ones */
        float edge[2] = {0, 0};
        if (count) {
            /* recv holds the last way's result: call this one once more */
            one_call((enum way)w, send, recv, count);
            st_dev_memcpy(&edge[0], recv, sizeof(float));
            st_dev_memcpy(&edge[1], (float *)recv + count - 1, sizeof(float));
        }
        int bad = rc[w] != 0 || (count && (edge[0] != (float)nranks || edge[1] != (float)nranks));
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (bad && rank == 0)
            printf("# %s at %zu floats: %s\n", way_names[w], count,
                   rc[w] ? "call failed" : "wrong result");
        if (bad) {
            t[w] = -1.0;
            continue;
        }
        qsort(blocks[w], ROUNDS, sizeof(double), cmp_double);
        t[w] = blocks[w][ROUNDS / 2];
    }
}

/* ---- host-call overhead ------------------------------------------------ */

/* 8 B host MPI_Allreduce and PMPI_Allreduce on `comm`, alternating
 * blocks; medians. */
static void host_overhead(MPI_Comm comm, double *mpi_us, double *pmpi_us)
{
    enum { BLOCKS = 15, CALLS = 2000 };
    double a[BLOCKS], b[BLOCKS];
    float x[2] = {1, 1}, y[2];
    for (int k = 0; k < 500; k++)
        MPI_Allreduce(x, y, 2, MPI_FLOAT, MPI_SUM, comm);
    for (int blk = 0; blk < BLOCKS; blk++) {
        PMPI_Barrier(comm);
        double t0 = now();
        for (int k = 0; k < CALLS; k++)
            MPI_Allreduce(x, y, 2, MPI_FLOAT, MPI_SUM, comm);
        a[blk] = (now() - t0) / CALLS * 1e6;
        PMPI_Barrier(comm);
        t0 = now();
        for (int k = 0; k < CALLS; k++)
            PMPI_Allreduce(x, y, 2, MPI_FLOAT, MPI_SUM, comm);
        b[blk] = (now() - t0) / CALLS * 1e6;
    }
    if (y[0] != (float)nranks) {
        fprintf(stderr, "rank %d: host MPI_Allreduce gave %g, want %d\n", rank, y[0], nranks);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    /* medians, then the slowest rank's */
    for (int i = 0; i < BLOCKS; i++)
        for (int j = i + 1; j < BLOCKS; j++) {
            if (a[j] < a[i]) { double t = a[i]; a[i] = a[j]; a[j] = t; }
            if (b[j] < b[i]) { double t = b[i]; b[i] = b[j]; b[j] = t; }
        }
    double med[2] = {a[BLOCKS / 2], b[BLOCKS / 2]};
    PMPI_Allreduce(MPI_IN_PLACE, med, 2, MPI_DOUBLE, MPI_MAX, comm);
    *mpi_us = med[0];
    *pmpi_us = med[1];
}

/* ---- main ---------------------------------------------------------------- */

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static int local_rank(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!v)
        v = getenv("MPI_LOCALRANKID");
    return v ? atoi(v) : -1;
}

int main(int argc, char **argv)
{
    size_t min = 8, max = (size_t)1 << 30, staging[8] = {(size_t)256 << 20};
    int nstaging = 1, host_only = 0;
    double budget = 0.15;
    const char *json = NULL;
    for (int k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "--min") && k + 1 < argc) min = parse_size(argv[++k]);
        else if (!strcmp(argv[k], "--max") && k + 1 < argc) max = parse_size(argv[++k]);
        else if (!strcmp(argv[k], "--budget") && k + 1 < argc) budget = atof(argv[++k]);
        else if (!strcmp(argv[k], "--json") && k + 1 < argc) json = argv[++k];
        else if (!strcmp(argv[k], "--host-only")) host_only = 1;
        else if (!strcmp(argv[k], "--staging") && k + 1 < argc) {
            nstaging = 0;
            for (char *tok = strtok(argv[++k], ","); tok && nstaging < 8; tok = strtok(NULL, ","))
                staging[nstaging++] = parse_size(tok);
        } else {
            fprintf(stderr, "usage: %s [--min B] [--max B] [--budget S] [--staging B,B] "
                            "[--host-only] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    int lr = local_rank();
    if (!host_only && lr >= 0)
        st_dev_select(lr); /* the GPU is chosen before MPI_Init, as applications do */
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    *(void **)&native = dlsym(RTLD_DEFAULT, "gpucoll_shim_allreduce_native");
    double h_mpi, h_pmpi, g_mpi = -1, g_pmpi = -1;
    host_overhead(MPI_COMM_WORLD, &h_mpi, &h_pmpi);
    if (native) {
        /* A duplicate with a gpucoll communicator: the guarded host path. */
        MPI_Comm guarded;
        MPI_Comm_dup(MPI_COMM_WORLD, &guarded);
        float one[2] = {1, 1}, sum[2];
        if (native(one, sum, 2, MPI_FLOAT, MPI_SUM, guarded) != MPI_SUCCESS) {
            fprintf(stderr, "rank %d: gpucoll_shim_allreduce_native failed\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        host_overhead(guarded, &g_mpi, &g_pmpi);
        MPI_Comm_free(&guarded);
    }
    FILE *jf = rank == 0 && json ? fopen(json, "w") : NULL;
    if (rank == 0) {
        printf("# shim_bench: %d ranks; gpucoll_shim_allreduce_native %s\n", nranks,
               native ? "found (a shim is loaded)" : "absent (no shim)");
        printf("# host 8 B MPI_Allreduce %.3f us, PMPI_Allreduce %.3f us, difference %.3f us\n",
               h_mpi, h_pmpi, h_mpi - h_pmpi);
        if (native)
            printf("# host 8 B on a communicator with a gpucoll communicator: MPI_Allreduce "
                   "%.3f us, PMPI_Allreduce %.3f us, difference %.3f us\n",
                   g_mpi, g_pmpi, g_mpi - g_pmpi);
    }
    if (jf)
        fprintf(jf, "{\"ranks\": %d, \"shim_loaded\": %s, \"host_8B\": {\"mpi_us\": %.4f, "
                    "\"pmpi_us\": %.4f, \"overhead_us\": %.4f}, \"host_8B_guarded\": "
                    "{\"mpi_us\": %.4f, \"pmpi_us\": %.4f, \"overhead_us\": %.4f}, \"rows\": [",
                nranks, native ? "true" : "false", h_mpi, h_pmpi, h_mpi - h_pmpi, g_mpi, g_pmpi,
                g_mpi - g_pmpi);
    if (!host_only) {
        if (lr < 0) {
            MPI_Comm node;
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
            MPI_Comm_rank(node, &lr);
            MPI_Comm_free(&node);
            st_dev_select(lr);
        }
        int have_nccl = nccl_open();
        if (st_dev_stream_create(&stream) != 0) {
            fprintf(stderr, "rank %d: cannot create a CUDA stream\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        void *send = st_dev_malloc(max), *recv = st_dev_malloc(max);
        size_t max_staged = 0;
        for (int k = 0; k < nstaging; k++)
            max_staged = staging[k] > max_staged ? staging[k] : max_staged;
        {
            float *ones = malloc(max);
            for (size_t i = 0; i < max / sizeof(float); i++)
                ones[i] = 1.0f;
            st_dev_memcpy(send, ones, max);
            free(ones);
        }
        host_send = malloc(max_staged ? max_staged : 4);
        host_recv = malloc(max_staged ? max_staged : 4);
        if (rank == 0)
            printf("%12s %12s %12s %12s %12s %10s %10s %10s\n", "bytes", "mpi_us", "nccl_us",
                   "gpucoll_us", "staged_us", "mpi/nccl", "mpi/gpucoll", "staged/mpi");
        int first = 1;
        for (size_t bytes = min; bytes <= max; bytes *= 2) {
            size_t count = bytes / sizeof(float);
            double t[NWAYS] = {-2, -2, -2, -2}; /* -2: not run */
            int run[NWAYS] = {1, have_nccl, native != NULL, 0};
            for (int k = 0; k < nstaging; k++)
                if (staging[k] == bytes)
                    run[W_STAGED] = 1;
            time_ways(run, send, recv, count, budget, t);
            if (rank == 0) {
                char cell[NWAYS][16];
                for (int w = 0; w < NWAYS; w++)
                    snprintf(cell[w], 16, t[w] > 0 ? "%.2f" : (t[w] == -1 ? "FAIL" : "-"),
                             t[w] * 1e6);
                char r1[16] = "-", r2[16] = "-", r3[16] = "-";
                if (t[W_MPI] > 0 && t[W_NCCL] > 0) snprintf(r1, 16, "%.3f", t[W_MPI] / t[W_NCCL]);
                if (t[W_MPI] > 0 && t[W_NATIVE] > 0) snprintf(r2, 16, "%.3f", t[W_MPI] / t[W_NATIVE]);
                if (t[W_MPI] > 0 && t[W_STAGED] > 0) snprintf(r3, 16, "%.1f", t[W_STAGED] / t[W_MPI]);
                printf("%12zu %12s %12s %12s %12s %10s %10s %10s\n", bytes, cell[0], cell[1],
                       cell[2], cell[3], r1, r2, r3);
                fflush(stdout);
                if (jf) {
                    fprintf(jf, "%s\n  {\"bytes\": %zu", first ? "" : ",", bytes);
                    for (int w = 0; w < NWAYS; w++) {
                        if (t[w] > 0)
                            fprintf(jf, ", \"%s_us\": %.3f", way_names[w], t[w] * 1e6);
                        else if (t[w] == -1)
                            fprintf(jf, ", \"%s_us\": null, \"%s_failed\": true", way_names[w],
                                    way_names[w]);
                    }
                    fprintf(jf, "}");
                }
            }
            first = 0;
        }
        if (have_nccl)
            nccl.CommDestroy(nccl.comm);
        st_dev_free(send);
        st_dev_free(recv);
    }
    if (jf) {
        fprintf(jf, "\n]}\n");
        fclose(jf);
    }
    MPI_Finalize();
    return 0;
}

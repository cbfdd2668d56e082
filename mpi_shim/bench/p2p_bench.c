/* Point-to-point ping-pong between ranks 0 and 1 (others wait), 8 B .. 64 MiB
 * by 4x (and the top size), one way of moving the bytes per run:
 *
 *   --mode direct  device buffers straight to MPI_Send/MPI_Recv: the gpucoll
 *                  shim when it is preloaded (a CUDA-aware MPI otherwise);
 *   --mode staged  device buffers staged by hand: cuMemcpy to a page-locked
 *                  host buffer, MPI on it, cuMemcpy back (what a program
 *                  does today on an MPI that is not CUDA-aware);
 *   --mode ipc     the physical reference: each rank maps the other's device
 *                  buffer (CUDA IPC) and copies into it with cuMemcpyDtoD,
 *                  a zero-byte MPI message saying it is there; and the
 *                  copy bandwidth alone (rank 0 copying 64 MiB into rank 1's
 *                  buffer, "memcpy_ipc");
 *   --mode host    host buffers, MPI alone (runs without a GPU).
 *
 *   mpirun -n 2 p2p_bench [--mode M] [--min B] [--max B] [--budget S]
 *
 * Times: per size, 5 blocks of k round trips (k from a calibration, about
 * budget / 5 seconds a block) timed on rank 0; the half round trip of the
 * median block is reported, and bytes / half round trip as GB/s (1e9 B/s).
 * The data is checked after each size (rank 1 holds what rank 0 sent, and
 * rank 0 got it back). Rank 0 prints a table and one JSON line per size. */
#include "cudrv.h"

#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum mode { DIRECT, STAGED, IPC, HOST };
static const char *mode_names[] = {"direct", "staged", "ipc", "host"};

static int rank;
static enum mode mode = DIRECT;
static MPI_Comm pair; /* ranks 0 and 1 */

struct bufs {
    unsigned char *buf;  /* device (host in host mode) */
    unsigned char *host; /* page-locked staging buffer (staged) */
    unsigned char *peer; /* the other rank's buffer, mapped (ipc) */
};

static unsigned char pattern(size_t i, size_t bytes)
{
    return (unsigned char)(i * 7 + bytes * 13 + 1);
}

static void put(struct bufs *b, const unsigned char *src, size_t bytes)
{
    if (mode == HOST)
        memcpy(b->buf, src, bytes);
    else
        cd_htod(b->buf, src, bytes);
}

static void get(struct bufs *b, unsigned char *dst, size_t bytes)
{
    if (mode == HOST)
        memcpy(dst, b->buf, bytes);
    else
        cd_dtoh(dst, b->buf, bytes);
}

/* One round trip: rank 0 to rank 1 and back. */
static void round_trip(struct bufs *b, size_t bytes)
{
    int n = (int)bytes, other = 1 - rank;
    char token = 0;
    switch (mode) {
    case DIRECT:
    case HOST:
        if (rank == 0) {
            MPI_Send(b->buf, n, MPI_BYTE, other, 1, MPI_COMM_WORLD);
            MPI_Recv(b->buf, n, MPI_BYTE, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(b->buf, n, MPI_BYTE, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(b->buf, n, MPI_BYTE, other, 1, MPI_COMM_WORLD);
        }
        break;
    case STAGED:
        if (rank == 0) {
            cd_dtoh(b->host, b->buf, bytes);
            MPI_Send(b->host, n, MPI_BYTE, other, 1, MPI_COMM_WORLD);
            MPI_Recv(b->host, n, MPI_BYTE, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            cd_htod(b->buf, b->host, bytes);
        } else {
            MPI_Recv(b->host, n, MPI_BYTE, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            cd_htod(b->buf, b->host, bytes);
            cd_dtoh(b->host, b->buf, bytes);
            MPI_Send(b->host, n, MPI_BYTE, other, 1, MPI_COMM_WORLD);
        }
        break;
    case IPC:
        if (rank == 0) {
            cd_dtod(b->peer, b->buf, bytes);
            cd_sync(); /* a device-to-device cuMemcpy may return before it ends */
            MPI_Send(&token, 0, MPI_BYTE, other, 1, MPI_COMM_WORLD);
            MPI_Recv(&token, 0, MPI_BYTE, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&token, 0, MPI_BYTE, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            cd_dtod(b->peer, b->buf, bytes);
            cd_sync();
            MPI_Send(&token, 0, MPI_BYTE, other, 1, MPI_COMM_WORLD);
        }
        break;
    }
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median block's half round trip (rank 0's), in seconds. */
static double time_size(struct bufs *b, size_t bytes, double budget)
{
    for (int w = 0; w < 2; w++)
        round_trip(b, bytes);
    double t0 = MPI_Wtime();
    round_trip(b, bytes);
    double one = MPI_Wtime() - t0;
    long k = one > 0 ? (long)(budget / 5 / one) : 1000;
    k = k < 1 ? 1 : k > 20000 ? 20000 : k;
    MPI_Bcast(&k, 1, MPI_LONG, 0, pair);
    double blocks[5];
    for (int r = 0; r < 5; r++) {
        t0 = MPI_Wtime();
        for (long i = 0; i < k; i++)
            round_trip(b, bytes);
        blocks[r] = (MPI_Wtime() - t0) / (2.0 * (double)k);
    }
    qsort(blocks, 5, sizeof blocks[0], by_value);
    return blocks[2];
}

/* Rank 1 holds rank 0's pattern, and rank 0 got it back unchanged. */
static int check(struct bufs *b, size_t bytes, unsigned char *scratch)
{
    get(b, scratch, bytes);
    int bad = 0;
    for (size_t i = 0; i < bytes && !bad; i++)
        bad = scratch[i] != pattern(i, bytes);
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, pair);
    return !any;
}

/* rank 0 copying into rank 1's buffer, alone: bytes / second. */
static double copy_bandwidth(struct bufs *b, size_t bytes, double budget)
{
    double rate = 0;
    if (rank == 0) {
        cd_dtod(b->peer, b->buf, bytes);
        cd_sync();
        double t0 = MPI_Wtime();
        cd_dtod(b->peer, b->buf, bytes);
        cd_sync();
        double one = MPI_Wtime() - t0;
        long k = one > 0 ? (long)(budget / one) : 10;
        k = k < 3 ? 3 : k > 1000 ? 1000 : k;
        t0 = MPI_Wtime();
        for (long i = 0; i < k; i++)
            cd_dtod(b->peer, b->buf, bytes);
        cd_sync();
        rate = (double)bytes * (double)k / (MPI_Wtime() - t0);
    }
    MPI_Barrier(pair);
    return rate;
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k')
        v *= 1024;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024;
    return v < 1 ? 1 : (size_t)v;
}

int main(int argc, char **argv)
{
    size_t lo = 8, hi = 64u << 20;
    double budget = 0.3;
    for (int k = 1; k < argc; k++) {
        const char *v = k + 1 < argc ? argv[k + 1] : NULL;
        if (!strcmp(argv[k], "--mode") && v) {
            int m = -1;
            for (int i = 0; i < 4; i++)
                if (!strcmp(v, mode_names[i]))
                    m = i;
            if (m < 0) {
                fprintf(stderr, "p2p_bench: --mode direct|staged|ipc|host\n");
                return 2;
            }
            mode = (enum mode)m;
        } else if (!strcmp(argv[k], "--min") && v) {
            lo = parse_bytes(v);
        } else if (!strcmp(argv[k], "--max") && v) {
            hi = parse_bytes(v);
        } else if (!strcmp(argv[k], "--budget") && v) {
            budget = atof(v);
        } else {
            fprintf(stderr, "usage: p2p_bench [--mode direct|staged|ipc|host] [--min B] "
                            "[--max B] [--budget S]\n");
            return 2;
        }
        k++;
    }
    if (hi > (size_t)1 << 30 || lo > hi) {
        fprintf(stderr, "p2p_bench: sizes from --min to --max, at most 1 GiB\n");
        return 2;
    }
    if (mode != HOST) {
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        if (cd_open() != 0)
            return 2;
        cd_select(lr ? atoi(lr) : 0);
    }
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "p2p_bench: needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int shim = dlsym(RTLD_DEFAULT, "gpucoll_shim_allreduce_native") != NULL;
    int failed = 0;
    if (rank < 2) {
        MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &pair);
        struct bufs b = {0};
        b.buf = mode == HOST ? malloc(hi) : cd_malloc(hi);
        unsigned char *scratch = malloc(hi);
        if (!b.buf || !scratch)
            MPI_Abort(MPI_COMM_WORLD, 2);
        if (mode == STAGED)
            b.host = cd_host_alloc(hi);
        if (mode == IPC) {
            unsigned char mine[64], theirs[64];
            const char *why = NULL;
            cd_ipc_handle(b.buf, mine);
            MPI_Sendrecv(mine, 64, MPI_BYTE, 1 - rank, 2, theirs, 64, MPI_BYTE, 1 - rank, 2,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            b.peer = cd_ipc_open(theirs, &why);
            int ok = b.peer != NULL, both;
            MPI_Allreduce(&ok, &both, 1, MPI_INT, MPI_MIN, pair);
            if (!both) {
                if (rank == 0 || !ok)
                    fprintf(stderr, "p2p_bench: rank %d: cuIpcOpenMemHandle failed (%s)\n",
                            rank, ok ? "on the other rank" : why);
                if (rank == 0)
                    printf("{\"bench\":\"p2p\",\"mode\":\"ipc\",\"error\":\"cuIpcOpenMemHandle "
                           "failed\"}\n");
                MPI_Abort(MPI_COMM_WORLD, 3);
            }
        }
        if (rank == 0) {
            printf("# p2p_bench mode=%s%s: half round trip between ranks 0 and 1 (median of 5 "
                   "blocks)\n",
                   mode_names[mode], shim ? " (gpucoll shim loaded)" : "");
            printf("# %12s %12s %10s %s\n", "bytes", "half_rtt_us", "GB/s", "check");
        }
        for (size_t bytes = lo;; bytes = bytes * 4 > hi && bytes < hi ? hi : bytes * 4) {
            for (size_t i = 0; i < bytes; i++)
                scratch[i] = pattern(i, bytes);
            if (rank == 0)
                put(&b, scratch, bytes);
            else if (mode == HOST)
                memset(b.buf, 0, bytes);
            else
                cd_memset(b.buf, 0, bytes);
            MPI_Barrier(pair);
            double t = time_size(&b, bytes, budget);
            int ok = check(&b, bytes, scratch);
            failed |= !ok;
            if (rank == 0) {
                double gbs = (double)bytes / t / 1e9;
                printf("  %12zu %12.3f %10.3f %s\n", bytes, 1e6 * t, gbs, ok ? "ok" : "FAILED");
                printf("{\"bench\":\"p2p\",\"mode\":\"%s\",\"shim\":%s,\"bytes\":%zu,"
                       "\"half_rtt_us\":%.4f,\"GBs\":%.4f,\"check\":\"%s\"}\n",
                       mode_names[mode], shim ? "true" : "false", bytes, 1e6 * t, gbs,
                       ok ? "ok" : "FAILED");
                fflush(stdout);
            }
            if (bytes >= hi)
                break;
        }
        if (mode == IPC) {
            double rate = copy_bandwidth(&b, hi, budget);
            if (rank == 0)
                printf("{\"bench\":\"p2p\",\"mode\":\"memcpy_ipc\",\"bytes\":%zu,\"GBs\":%.4f}\n",
                       hi, rate / 1e9);
            cd_ipc_close(b.peer);
        }
        if (mode == HOST)
            free(b.buf);
        else
            cd_free(b.buf);
        if (b.host)
            cd_host_free(b.host);
        free(scratch);
        MPI_Comm_free(&pair);
    } else {
        MPI_Comm idle;
        MPI_Comm_split(MPI_COMM_WORLD, 1, rank, &idle);
        MPI_Comm_free(&idle);
    }
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}

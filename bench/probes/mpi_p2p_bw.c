/* What MPI point-to-point carries between two processes on this host: the
 * ceiling of gpucoll's NET transport on simulated nodes, whose proxy moves
 * every inter-node piece as MPI messages through host memory.
 *
 * Two ranks; T threads per rank (MPI_THREAD_MULTIPLE), each on its own
 * duplicate of MPI_COMM_WORLD, keep W messages of S bytes in flight each
 * way (both ranks send and receive at once, as a ring all_reduce does) until
 * about TOTAL bytes went each way per rank. Rank 0 prints the best of three
 * rounds in GB/s each way.
 *
 *   mpicc -O2 -pthread -o mpi_p2p_bw bench/probes/mpi_p2p_bw.c
 *   mpirun -n 2 ./mpi_p2p_bw T W S TOTAL
 *   (bench/probes/mpi-p2p-sweep runs the matrix of bench/results/2026-12-02-h200x1-net/)
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 64

static int nthreads, window, rounds, peer;
static size_t msg_bytes;
static MPI_Comm comms[MAX_THREADS];

static void *stream_messages(void *arg) {
    int t = (int)(long)arg;
    char *sendbuf = aligned_alloc(4096, msg_bytes * window);
    char *recvbuf = aligned_alloc(4096, msg_bytes * window);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 2 * window);
    if (!sendbuf || !recvbuf || !reqs) {
        fprintf(stderr, "mpi_p2p_bw: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Touch every page first, so that no round pays for faulting them in. */
    memset(sendbuf, 1, msg_bytes * window);
    memset(recvbuf, 0, msg_bytes * window);
    for (int r = 0; r < rounds; r++) {
        for (int w = 0; w < window; w++) {
            MPI_Irecv(recvbuf + w * msg_bytes, (int)msg_bytes, MPI_BYTE, peer, w, comms[t],
                      &reqs[2 * w]);
            MPI_Isend(sendbuf + w * msg_bytes, (int)msg_bytes, MPI_BYTE, peer, w, comms[t],
                      &reqs[2 * w + 1]);
        }
        MPI_Waitall(2 * window, reqs, MPI_STATUSES_IGNORE);
    }
    free(sendbuf);
    free(recvbuf);
    free(reqs);
    return NULL;
}

int main(int argc, char **argv) {
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2 || argc != 5) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -n 2 mpi_p2p_bw THREADS WINDOW BYTES TOTAL\n");
        MPI_Finalize();
        return 2;
    }
    nthreads = atoi(argv[1]);
    window = atoi(argv[2]);
    msg_bytes = strtoull(argv[3], NULL, 0);
    size_t total = strtoull(argv[4], NULL, 0);
    if (nthreads < 1 || nthreads > MAX_THREADS || window < 1 || msg_bytes < 1 ||
        msg_bytes > (size_t)1 << 30 || (nthreads > 1 && provided < MPI_THREAD_MULTIPLE)) {
        if (rank == 0) fprintf(stderr, "mpi_p2p_bw: bad arguments or no MPI_THREAD_MULTIPLE\n");
        MPI_Finalize();
        return 2;
    }
    peer = 1 - rank;
    rounds = (int)(total / (msg_bytes * window * nthreads));
    if (rounds < 4) rounds = 4;
    for (int t = 0; t < nthreads; t++) MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]);
    pthread_t threads[MAX_THREADS];
    double best = 1e30;
    for (int round = 0; round < 3; round++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int t = 0; t < nthreads; t++)
            pthread_create(&threads[t], NULL, stream_messages, (void *)(long)t);
        for (int t = 0; t < nthreads; t++) pthread_join(threads[t], NULL);
        MPI_Barrier(MPI_COMM_WORLD);
        double dt = MPI_Wtime() - t0;
        if (dt < best) best = dt;
    }
    if (rank == 0)
        printf("threads %2d window %2d message %8zu KiB: %6.2f GB/s each way\n", nthreads, window,
               msg_bytes >> 10, (double)msg_bytes * window * nthreads * rounds / best / 1e9);
    for (int t = 0; t < nthreads; t++) MPI_Comm_free(&comms[t]);
    MPI_Finalize();
    return 0;
}

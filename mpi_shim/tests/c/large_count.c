/* The MPI-4 large-count forms exported by the gpucoll MPI shim (MPI_Allreduce_c ...).
 * Open MPI 4.1's mpi.h does not declare them, so they are declared here as weak
 * symbols, the way mpi4py wheels find them: run with the shim preloaded. Checks exact
 * results of every blocking and nonblocking _c form on small counts, and that a count
 * above INT_MAX is MPI_ERR_COUNT through MPI_ERRORS_RETURN. Prints "N passed, M
 * failed" on rank 0 and exits nonzero on any failure. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define W __attribute__((weak))
typedef MPI_Datatype T;
W int MPI_Allreduce_c(const void *, void *, MPI_Count, T, MPI_Op, MPI_Comm);
W int MPI_Reduce_c(const void *, void *, MPI_Count, T, MPI_Op, int, MPI_Comm);
W int MPI_Bcast_c(void *, MPI_Count, T, int, MPI_Comm);
W int MPI_Allgather_c(const void *, MPI_Count, T, void *, MPI_Count, T, MPI_Comm);
W int MPI_Reduce_scatter_block_c(const void *, void *, MPI_Count, T, MPI_Op, MPI_Comm);
W int MPI_Reduce_scatter_c(const void *, void *, const MPI_Count *, T, MPI_Op, MPI_Comm);
W int MPI_Alltoall_c(const void *, MPI_Count, T, void *, MPI_Count, T, MPI_Comm);
W int MPI_Gather_c(const void *, MPI_Count, T, void *, MPI_Count, T, int, MPI_Comm);
W int MPI_Scatter_c(const void *, MPI_Count, T, void *, MPI_Count, T, int, MPI_Comm);
W int MPI_Allgatherv_c(const void *, MPI_Count, T, void *, const MPI_Count *, const MPI_Aint *, T,
                       MPI_Comm);
W int MPI_Alltoallv_c(const void *, const MPI_Count *, const MPI_Aint *, T, void *,
                      const MPI_Count *, const MPI_Aint *, T, MPI_Comm);
W int MPI_Gatherv_c(const void *, MPI_Count, T, void *, const MPI_Count *, const MPI_Aint *, T,
                    int, MPI_Comm);
W int MPI_Scatterv_c(const void *, const MPI_Count *, const MPI_Aint *, T, void *, MPI_Count, T,
                     int, MPI_Comm);
W int MPI_Iallreduce_c(const void *, void *, MPI_Count, T, MPI_Op, MPI_Comm, MPI_Request *);
W int MPI_Ibcast_c(void *, MPI_Count, T, int, MPI_Comm, MPI_Request *);
W int MPI_Iallgatherv_c(const void *, MPI_Count, T, void *, const MPI_Count *, const MPI_Aint *,
                        T, MPI_Comm, MPI_Request *);
W int MPI_Ialltoall_c(const void *, MPI_Count, T, void *, MPI_Count, T, MPI_Comm, MPI_Request *);

#define K 5
#define MAXP 16
static int rank, nproc, npass, nfail;

static void check(int ok, const char *what) {
    if (ok) {
        npass++;
    } else {
        nfail++;
        printf("rank %d FAILED: %s\n", rank, what);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);
    if (nproc > MAXP) MPI_Abort(MPI_COMM_WORLD, 2);
    if (!MPI_Allreduce_c || !MPI_Iallreduce_c || !MPI_Scatterv_c) {
        if (rank == 0) printf("0 passed, 1 failed (no MPI_*_c symbols: preload the shim)\n");
        MPI_Finalize();
        return 1;
    }
    int send[K * MAXP], recv[K * MAXP], expect[K * MAXP], ok, i, r;
    MPI_Count counts[MAXP], tri = (MPI_Count)nproc * (nproc + 1) / 2;
    MPI_Aint displs[MAXP];
    MPI_Request reqs[2];

    for (i = 0; i < K; i++) send[i] = rank + i;
    check(MPI_Allreduce_c(send, recv, K, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
          "allreduce_c code");
    for (ok = 1, i = 0; i < K; i++) ok &= recv[i] == nproc * i + nproc * (nproc - 1) / 2;
    check(ok, "allreduce_c sum");

    for (i = 0; i < K; i++) recv[i] = -1;
    MPI_Reduce_c(send, recv, K, MPI_INT, MPI_MAX, nproc - 1, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i < K && rank == nproc - 1; i++) ok &= recv[i] == nproc - 1 + i;
    check(ok, "reduce_c max");

    for (i = 0; i < K; i++) recv[i] = rank == 0 ? 40 + i : 0;
    MPI_Bcast_c(recv, K, MPI_INT, 0, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i < K; i++) ok &= recv[i] == 40 + i;
    check(ok, "bcast_c");

    MPI_Allgather_c(send, K, MPI_INT, recv, K, MPI_INT, MPI_COMM_WORLD);
    for (ok = 1, r = 0; r < nproc; r++)
        for (i = 0; i < K; i++) ok &= recv[r * K + i] == r + i;
    check(ok, "allgather_c");

    for (i = 0; i < K * nproc; i++) send[i] = rank + i;
    MPI_Reduce_scatter_block_c(send, recv, K, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i < K; i++) ok &= recv[i] == nproc * (rank * K + i) + nproc * (nproc - 1) / 2;
    check(ok, "reduce_scatter_block_c");

    for (r = 0; r < nproc; r++) counts[r] = r + 1;
    MPI_Reduce_scatter_c(send, recv, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i <= rank; i++)
        ok &= recv[i] == nproc * (rank * (rank + 1) / 2 + i) + nproc * (nproc - 1) / 2;
    check(ok, "reduce_scatter_c");

    for (r = 0; r < nproc; r++)
        for (i = 0; i < K; i++) send[r * K + i] = rank * 100 + r * 10 + i;
    MPI_Alltoall_c(send, K, MPI_INT, recv, K, MPI_INT, MPI_COMM_WORLD);
    for (ok = 1, r = 0; r < nproc; r++)
        for (i = 0; i < K; i++) ok &= recv[r * K + i] == r * 100 + rank * 10 + i;
    check(ok, "alltoall_c");

    for (i = 0; i < K; i++) send[i] = rank * 7 + i;
    /* The receive count is not significant off the root: out of range there is fine. */
    MPI_Gather_c(send, K, MPI_INT, recv, rank == 0 ? K : (MPI_Count)1 << 40, MPI_INT, 0,
                 MPI_COMM_WORLD);
    for (ok = 1, r = 0; r < nproc && rank == 0; r++)
        for (i = 0; i < K; i++) ok &= recv[r * K + i] == r * 7 + i;
    check(ok, "gather_c (huge recvcount off the root ignored)");

    for (r = 0; r < nproc; r++)
        for (i = 0; i < K; i++) send[r * K + i] = r * 3 + i;
    MPI_Scatter_c(send, K, MPI_INT, recv, K, MPI_INT, nproc - 1, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i < K; i++) ok &= recv[i] == rank * 3 + i;
    check(ok, "scatter_c");

    /* v-forms: rank r owns r + 1 elements. */
    for (r = 0; r < nproc; r++) {
        counts[r] = r + 1;
        displs[r] = (MPI_Aint)r * (r + 1) / 2;
    }
    for (r = 0; r < nproc; r++)
        for (i = 0; i <= r; i++) expect[displs[r] + i] = r * 10 + i;
    for (i = 0; i <= rank; i++) send[i] = rank * 10 + i;
    MPI_Allgatherv_c(send, rank + 1, MPI_INT, recv, counts, displs, MPI_INT, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i < tri; i++) ok &= recv[i] == expect[i];
    check(ok, "allgatherv_c");
    for (i = 0; i < tri; i++) recv[i] = -1;
    MPI_Gatherv_c(send, rank + 1, MPI_INT, recv, rank == 0 ? counts : NULL,
                  rank == 0 ? displs : NULL, MPI_INT, 0, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i < tri && rank == 0; i++) ok &= recv[i] == expect[i];
    check(ok, "gatherv_c (null arrays off the root)");
    for (i = 0; i <= rank; i++) recv[i] = -1;
    MPI_Scatterv_c(expect, rank == 0 ? counts : NULL, rank == 0 ? displs : NULL, MPI_INT, recv,
                   rank + 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (ok = 1, i = 0; i <= rank; i++) ok &= recv[i] == rank * 10 + i;
    check(ok, "scatterv_c");
    {
        MPI_Count sc[MAXP], rc[MAXP];
        MPI_Aint sd[MAXP], rd[MAXP];
        MPI_Aint pos = 0;
        for (r = 0; r < nproc; r++) {
            sc[r] = (rank + r) % 3 + 1;
            sd[r] = pos;
            for (i = 0; i < sc[r]; i++) send[pos + i] = rank * 1000 + r * 10 + i;
            pos += sc[r];
        }
        for (pos = 0, r = 0; r < nproc; r++) {
            rc[r] = (r + rank) % 3 + 1;
            rd[r] = pos;
            pos += rc[r];
        }
        MPI_Alltoallv_c(send, sc, sd, MPI_INT, recv, rc, rd, MPI_INT, MPI_COMM_WORLD);
        for (ok = 1, r = 0; r < nproc; r++)
            for (i = 0; i < rc[r]; i++) ok &= recv[rd[r] + i] == r * 1000 + rank * 10 + i;
        check(ok, "alltoallv_c");
    }

    /* Nonblocking. */
    for (i = 0; i < K; i++) send[i] = rank + i;
    MPI_Iallreduce_c(MPI_IN_PLACE, send, K, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[0]);
    MPI_Ibcast_c(recv, 0, MPI_INT, 0, MPI_COMM_WORLD, &reqs[1]);
    MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
    for (ok = 1, i = 0; i < K; i++) ok &= send[i] == nproc * i + nproc * (nproc - 1) / 2;
    check(ok, "iallreduce_c in place + ibcast_c count 0");
    for (i = 0; i <= rank; i++) send[i] = rank * 10 + i;
    MPI_Iallgatherv_c(send, rank + 1, MPI_INT, recv, counts, displs, MPI_INT, MPI_COMM_WORLD,
                      &reqs[0]);
    MPI_Wait(&reqs[0], MPI_STATUS_IGNORE);
    for (ok = 1, i = 0; i < tri; i++) ok &= recv[i] == expect[i];
    check(ok, "iallgatherv_c");
    for (r = 0; r < nproc; r++)
        for (i = 0; i < K; i++) send[r * K + i] = rank * 100 + r * 10 + i;
    MPI_Ialltoall_c(send, K, MPI_INT, recv, K, MPI_INT, MPI_COMM_WORLD, &reqs[0]);
    MPI_Wait(&reqs[0], MPI_STATUS_IGNORE);
    for (ok = 1, r = 0; r < nproc; r++)
        for (i = 0; i < K; i++) ok &= recv[r * K + i] == r * 100 + rank * 10 + i;
    check(ok, "ialltoall_c");

    /* Counts above INT_MAX: MPI_ERR_COUNT through the communicator's handler. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    {
        int code = MPI_Allreduce_c(send, recv, (MPI_Count)INT_MAX + 1, MPI_INT, MPI_SUM,
                                   MPI_COMM_WORLD);
        int cls = -1;
        MPI_Error_class(code, &cls);
        check(cls == MPI_ERR_COUNT, "allreduce_c count > INT_MAX is MPI_ERR_COUNT");
        for (r = 0; r < nproc; r++) counts[r] = r == nproc - 1 ? (MPI_Count)1 << 33 : 1;
        code = MPI_Allgatherv_c(send, 1, MPI_INT, recv, counts, displs, MPI_INT, MPI_COMM_WORLD);
        MPI_Error_class(code, &cls);
        check(cls == MPI_ERR_COUNT, "allgatherv_c count > INT_MAX is MPI_ERR_COUNT");
        displs[0] = (MPI_Aint)1 << 40;
        counts[nproc - 1] = 1;
        code = MPI_Allgatherv_c(send, 1, MPI_INT, recv, counts, displs, MPI_INT, MPI_COMM_WORLD);
        MPI_Error_class(code, &cls);
        check(cls == MPI_ERR_ARG, "allgatherv_c displacement > INT_MAX is MPI_ERR_ARG");
    }

    int totals[2] = {npass, nfail};
    MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%d passed, %d failed\n", totals[0], totals[1]);
    MPI_Finalize();
    return totals[1] != 0;
}

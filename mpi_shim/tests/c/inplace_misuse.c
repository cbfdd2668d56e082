/* MPI_IN_PLACE where MPI does not allow it, under MPI_ERRORS_RETURN: as
 * a receive buffer (every rank), at a root-only position on every rank
 * (the root's receive or send side, the others' own block), in a
 * neighbourhood collective; on 1-byte and 4-byte types whose ops gpucoll
 * has. Every rank must get the error class Open MPI's own argument check
 * gives (MPI_ERR_BUFFER for Allreduce, MPI_ERR_ARG otherwise), with
 * nothing moved, and the communicator must still work afterwards.
 * `--shim-guards` also checks the calls Open MPI does not check itself and
 * would crash in (MPI_Exscan's receive buffer, MPI_Reduce_local, MPI_Pack
 * and MPI_Unpack and their external forms): MPI_ERR_BUFFER from a shim.
 * An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IP MPI_IN_PLACE

static struct st_buf a, b;
static int cnt[64], dsp[64];
static MPI_Aint adsp[64];
static MPI_Datatype tys[64];

static void expect(int rc, int want, const char *what, MPI_Comm comm)
{
    int cls = MPI_SUCCESS;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    if (cls == want)
        st_pass();
    else
        st_fail("%s: error class %d, want %d", what, cls, want);
    /* nobody is stuck in the refused call */
    st_ok(MPI_Barrier(comm), what);
}

static void wait_req(int rc, MPI_Request *req, int want, const char *what, MPI_Comm comm)
{
    if (rc == MPI_SUCCESS) /* started after all: complete it, then fail */
        MPI_Wait(req, MPI_STATUS_IGNORE);
    else if (*req != MPI_REQUEST_NULL)
        st_fail("%s: a failed start left a request", what);
    expect(rc, want, what, comm);
}

static void checked_by_mpi(MPI_Comm comm, MPI_Datatype dt, MPI_Op op, const char *tname)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    void *s = a.mpi, *r = b.mpi;
    int root = np - 1, am_root = me == root;
    MPI_Request q = MPI_REQUEST_NULL;
    char w[120];
#define LABEL(x) (snprintf(w, sizeof w, "%s %s", x, tname), w)
    expect(MPI_Allreduce(s, IP, 1, dt, op, comm), MPI_ERR_BUFFER, LABEL("Allreduce recv"), comm);
    expect(MPI_Allreduce(IP, IP, 1, dt, op, comm), MPI_ERR_BUFFER, LABEL("Allreduce both"), comm);
    wait_req(MPI_Iallreduce(s, IP, 1, dt, op, comm, &q), &q, MPI_ERR_BUFFER,
             LABEL("Iallreduce recv"), comm);
    expect(MPI_Reduce(am_root ? s : IP, am_root ? IP : r, 1, dt, op, root, comm), MPI_ERR_ARG,
           LABEL("Reduce"), comm);
    wait_req(MPI_Ireduce(am_root ? s : IP, am_root ? IP : r, 1, dt, op, root, comm, &q), &q,
             MPI_ERR_ARG, LABEL("Ireduce"), comm);
    expect(MPI_Bcast(IP, 1, dt, root, comm), MPI_ERR_ARG, LABEL("Bcast"), comm);
    expect(MPI_Allgather(s, 1, dt, IP, 1, dt, comm), MPI_ERR_ARG, LABEL("Allgather"), comm);
    wait_req(MPI_Iallgather(s, 1, dt, IP, 1, dt, comm, &q), &q, MPI_ERR_ARG,
             LABEL("Iallgather"), comm);
    expect(MPI_Alltoall(s, 1, dt, IP, 1, dt, comm), MPI_ERR_ARG, LABEL("Alltoall"), comm);
    expect(MPI_Gather(am_root ? s : IP, 1, dt, am_root ? IP : r, 1, dt, root, comm), MPI_ERR_ARG,
           LABEL("Gather"), comm);
    expect(MPI_Scatter(am_root ? IP : s, 1, dt, am_root ? r : IP, 1, dt, root, comm), MPI_ERR_ARG,
           LABEL("Scatter"), comm);
    expect(MPI_Reduce_scatter_block(s, IP, 1, dt, op, comm), MPI_ERR_ARG,
           LABEL("Reduce_scatter_block"), comm);
    expect(MPI_Reduce_scatter(s, IP, cnt, dt, op, comm), MPI_ERR_ARG, LABEL("Reduce_scatter"),
           comm);
    wait_req(MPI_Ireduce_scatter(s, IP, cnt, dt, op, comm, &q), &q, MPI_ERR_ARG,
             LABEL("Ireduce_scatter"), comm);
    expect(MPI_Scan(s, IP, 1, dt, op, comm), MPI_ERR_ARG, LABEL("Scan"), comm);
    wait_req(MPI_Iscan(s, IP, 1, dt, op, comm, &q), &q, MPI_ERR_ARG, LABEL("Iscan"), comm);
    expect(MPI_Allgatherv(s, 1, dt, IP, cnt, dsp, dt, comm), MPI_ERR_ARG, LABEL("Allgatherv"),
           comm);
    wait_req(MPI_Iallgatherv(s, 1, dt, IP, cnt, dsp, dt, comm, &q), &q, MPI_ERR_ARG,
             LABEL("Iallgatherv"), comm);
    expect(MPI_Alltoallv(s, cnt, dsp, dt, IP, cnt, dsp, dt, comm), MPI_ERR_ARG,
           LABEL("Alltoallv"), comm);
    wait_req(MPI_Ialltoallv(s, cnt, dsp, dt, IP, cnt, dsp, dt, comm, &q), &q, MPI_ERR_ARG,
             LABEL("Ialltoallv"), comm);
    for (int i = 0; i < np; i++)
        tys[i] = dt;
    expect(MPI_Alltoallw(s, cnt, dsp, tys, IP, cnt, dsp, tys, comm), MPI_ERR_ARG,
           LABEL("Alltoallw"), comm);
    wait_req(MPI_Ialltoallw(s, cnt, dsp, tys, IP, cnt, dsp, tys, comm, &q), &q, MPI_ERR_ARG,
             LABEL("Ialltoallw"), comm);
    expect(MPI_Gatherv(am_root ? s : IP, 1, dt, am_root ? IP : r, cnt, dsp, dt, root, comm),
           MPI_ERR_ARG, LABEL("Gatherv"), comm);
    wait_req(MPI_Igatherv(am_root ? s : IP, 1, dt, am_root ? IP : r, cnt, dsp, dt, root, comm,
                          &q),
             &q, MPI_ERR_ARG, LABEL("Igatherv"), comm);
    expect(MPI_Scatterv(am_root ? IP : s, cnt, dsp, dt, am_root ? r : IP, 1, dt, root, comm),
           MPI_ERR_ARG, LABEL("Scatterv"), comm);
    wait_req(MPI_Iscatterv(am_root ? IP : s, cnt, dsp, dt, am_root ? r : IP, 1, dt, root, comm,
                           &q),
             &q, MPI_ERR_ARG, LABEL("Iscatterv"), comm);
}

static void neighbors(MPI_Datatype dt, const char *tname)
{
    MPI_Comm ring;
    int dims[1] = {st.size}, per[1] = {1};
    MPI_Cart_create(MPI_COMM_WORLD, 1, dims, per, 0, &ring);
    MPI_Comm_set_errhandler(ring, MPI_ERRORS_RETURN);
    MPI_Request q = MPI_REQUEST_NULL;
    void *s = a.mpi, *r = b.mpi;
    char w[120];
    for (int i = 0; i < 2; i++)
        tys[i] = dt;
    expect(MPI_Neighbor_allgather(IP, 1, dt, r, 1, dt, ring), MPI_ERR_ARG,
           LABEL("Neighbor_allgather send"), ring);
    expect(MPI_Neighbor_allgather(s, 1, dt, IP, 1, dt, ring), MPI_ERR_ARG,
           LABEL("Neighbor_allgather recv"), ring);
    expect(MPI_Neighbor_allgatherv(s, 1, dt, IP, cnt, dsp, dt, ring), MPI_ERR_ARG,
           LABEL("Neighbor_allgatherv"), ring);
    expect(MPI_Neighbor_alltoall(IP, 1, dt, r, 1, dt, ring), MPI_ERR_ARG,
           LABEL("Neighbor_alltoall"), ring);
    expect(MPI_Neighbor_alltoallv(IP, cnt, dsp, dt, r, cnt, dsp, dt, ring), MPI_ERR_ARG,
           LABEL("Neighbor_alltoallv"), ring);
    expect(MPI_Neighbor_alltoallw(s, cnt, adsp, tys, IP, cnt, adsp, tys, ring), MPI_ERR_ARG,
           LABEL("Neighbor_alltoallw"), ring);
    wait_req(MPI_Ineighbor_allgather(IP, 1, dt, r, 1, dt, ring, &q), &q, MPI_ERR_ARG,
             LABEL("Ineighbor_allgather"), ring);
    wait_req(MPI_Ineighbor_alltoallw(IP, cnt, adsp, tys, r, cnt, adsp, tys, ring, &q), &q,
             MPI_ERR_ARG, LABEL("Ineighbor_alltoallw"), ring);
    MPI_Comm_free(&ring);
}

/* Calls Open MPI does not check: a shim must refuse them. */
static void guarded(MPI_Comm comm)
{
    void *s = a.mpi, *r = b.mpi;
    MPI_Request q = MPI_REQUEST_NULL;
    int pos = 0;
    MPI_Aint apos = 0;
    expect(MPI_Exscan(s, IP, 1, MPI_BYTE, MPI_BOR, comm), MPI_ERR_BUFFER, "Exscan recv", comm);
    wait_req(MPI_Iexscan(s, IP, 4, MPI_INT, MPI_SUM, comm, &q), &q, MPI_ERR_BUFFER,
             "Iexscan recv", comm);
    expect(MPI_Reduce_local(IP, r, 1, MPI_BYTE, MPI_BOR), MPI_ERR_BUFFER, "Reduce_local in",
           comm);
    expect(MPI_Reduce_local(s, IP, 1, MPI_INT, MPI_SUM), MPI_ERR_BUFFER, "Reduce_local inout",
           comm);
    expect(MPI_Pack(IP, 1, MPI_BYTE, r, 64, &pos, comm), MPI_ERR_BUFFER, "Pack in", comm);
    expect(MPI_Pack(s, 1, MPI_BYTE, IP, 64, &pos, comm), MPI_ERR_BUFFER, "Pack out", comm);
    expect(MPI_Unpack(IP, 64, &pos, r, 1, MPI_BYTE, comm), MPI_ERR_BUFFER, "Unpack in", comm);
    expect(MPI_Unpack(s, 64, &pos, IP, 1, MPI_BYTE, comm), MPI_ERR_BUFFER, "Unpack out", comm);
    expect(MPI_Pack_external("external32", IP, 1, MPI_INT, r, 64, &apos), MPI_ERR_BUFFER,
           "Pack_external in", comm);
    expect(MPI_Unpack_external("external32", s, 64, &apos, IP, 1, MPI_INT), MPI_ERR_BUFFER,
           "Unpack_external out", comm);
}

int main(int argc, char **argv)
{
    int guards = 0;
    for (int k = 1; k < argc; k++)
        if (!strcmp(argv[k], "--shim-guards"))
            guards = 1;
    st_init(&argc, &argv, "inplace_misuse");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    for (int i = 0; i < 64; i++) {
        cnt[i] = 1;
        dsp[i] = i;
        adsp[i] = i;
    }
    a = st_buf_new(256);
    b = st_buf_poisoned(256);
    memset(a.host, 1, 256);
    st_push(&a);
    checked_by_mpi(MPI_COMM_WORLD, MPI_BYTE, MPI_BOR, "BYTE");
    checked_by_mpi(MPI_COMM_WORLD, MPI_CHAR, MPI_MAX, "CHAR");
    checked_by_mpi(MPI_COMM_WORLD, MPI_INT, MPI_SUM, "INT");
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    checked_by_mpi(dup, MPI_UINT8_T, MPI_BXOR, "UINT8_T on a duplicate");
    neighbors(MPI_BYTE, "BYTE");
    neighbors(MPI_DOUBLE, "DOUBLE");
    if (guards)
        guarded(dup);
    /* the receive buffer never changed */
    st_pull(&b);
    st_untouched("receive buffer after every refused call", b.host, 256);
    MPI_Comm_free(&dup);
    st_buf_free(&a);
    st_buf_free(&b);
    return st_finish();
}

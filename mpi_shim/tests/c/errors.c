/* Wrong use must come back as MPI error codes under MPI_ERRORS_RETURN, not
 * as a crash or a hang, and leave the communicator usable: negative counts,
 * roots out of range, null datatype and op, a freed communicator (its handle
 * is MPI_COMM_NULL), on host or device buffers, blocking and nonblocking.
 * With --finalize-pending the program then starts nonblocking collectives
 * and calls MPI_Finalize without completing them: MPI_Finalize must return.
 * An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct st_buf a, b;

/* rc must be an error; `want` is the error class MPI names for it (another
 * class is reported but accepted: the standard leaves the class open). */
static void expect_error(int rc, int want, const char *what)
{
    if (rc == MPI_SUCCESS) {
        st_fail("%s: returned MPI_SUCCESS, want an error", what);
        return;
    }
    int cls = -1;
    MPI_Error_class(rc, &cls);
    if (cls != want && st.rank == 0) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        printf("note: %s: error class %d, MPI's class for this is %d (%s)\n", what, cls, want, msg);
    }
    st_pass();
}

/* After each error the communicator must still work. */
static void still_works(MPI_Comm comm, const char *after)
{
    int np;
    MPI_Comm_size(comm, &np);
    int *h = a.host;
    for (int i = 0; i < 64; i++)
        h[i] = i + 1;
    st_push(&a);
    st_poison(&b);
    char what[200];
    snprintf(what, sizeof what, "Allreduce after %s", after);
    if (!st_ok(MPI_Allreduce(a.mpi, b.mpi, 64, MPI_INT, MPI_SUM, comm), what))
        return;
    st_pull(&b);
    int *g = b.host;
    for (int i = 0; i < 64; i++) {
        if (g[i] != np * (i + 1)) {
            st_fail("%s: [%d] got %d want %d", what, i, g[i], np * (i + 1));
            return;
        }
    }
    st_pass();
}

static void wrong_arguments(MPI_Comm comm, const char *cname)
{
    int np;
    MPI_Comm_size(comm, &np);
    MPI_Request r = MPI_REQUEST_NULL;
    char what[160];
#define CASE(call, cls, name)                                           \
    do {                                                                \
        snprintf(what, sizeof what, "%s on %s", name, cname);           \
        expect_error(call, cls, what);                                  \
        still_works(comm, what);                                        \
    } while (0)
    CASE(MPI_Allreduce(a.mpi, b.mpi, -1, MPI_INT, MPI_SUM, comm), MPI_ERR_COUNT,
         "MPI_Allreduce with count -1");
    CASE(MPI_Reduce(a.mpi, b.mpi, -7, MPI_FLOAT, MPI_MAX, 0, comm), MPI_ERR_COUNT,
         "MPI_Reduce with count -7");
    CASE(MPI_Bcast(a.mpi, -1, MPI_BYTE, 0, comm), MPI_ERR_COUNT, "MPI_Bcast with count -1");
    CASE(MPI_Allgather(a.mpi, -2, MPI_INT, b.mpi, -2, MPI_INT, comm), MPI_ERR_COUNT,
         "MPI_Allgather with count -2");
    CASE(MPI_Iallreduce(a.mpi, b.mpi, -1, MPI_DOUBLE, MPI_SUM, comm, &r), MPI_ERR_COUNT,
         "MPI_Iallreduce with count -1");
    CASE(MPI_Bcast(a.mpi, 4, MPI_INT, np, comm), MPI_ERR_ROOT, "MPI_Bcast with root = size");
    CASE(MPI_Bcast(a.mpi, 4, MPI_INT, -5, comm), MPI_ERR_ROOT, "MPI_Bcast with root -5");
    CASE(MPI_Reduce(a.mpi, b.mpi, 4, MPI_INT, MPI_SUM, np + 3, comm), MPI_ERR_ROOT,
         "MPI_Reduce with root = size + 3");
    CASE(MPI_Gather(a.mpi, 1, MPI_INT, b.mpi, 1, MPI_INT, -1, comm), MPI_ERR_ROOT,
         "MPI_Gather with root -1");
    CASE(MPI_Iscatter(a.mpi, 1, MPI_INT, b.mpi, 1, MPI_INT, np, comm, &r), MPI_ERR_ROOT,
         "MPI_Iscatter with root = size");
    CASE(MPI_Allreduce(a.mpi, b.mpi, 4, MPI_DATATYPE_NULL, MPI_SUM, comm), MPI_ERR_TYPE,
         "MPI_Allreduce with MPI_DATATYPE_NULL");
    CASE(MPI_Allreduce(a.mpi, b.mpi, 4, MPI_INT, MPI_OP_NULL, comm), MPI_ERR_OP,
         "MPI_Allreduce with MPI_OP_NULL");
    CASE(MPI_Ireduce(a.mpi, b.mpi, 4, MPI_FLOAT, MPI_OP_NULL, 0, comm, &r), MPI_ERR_OP,
         "MPI_Ireduce with MPI_OP_NULL");
#undef CASE
    if (r != MPI_REQUEST_NULL)
        st_fail("a failed nonblocking call on %s returned a request", cname);
}

static void freed_communicator(void)
{
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    still_works(c, "MPI_Comm_dup"); /* a shim now holds state for c */
    MPI_Comm_free(&c);
    MPI_Request r = MPI_REQUEST_NULL;
    expect_error(MPI_Allreduce(a.mpi, b.mpi, 8, MPI_INT, MPI_SUM, c), MPI_ERR_COMM,
                 "MPI_Allreduce on a freed communicator");
    expect_error(MPI_Bcast(a.mpi, 8, MPI_INT, 0, c), MPI_ERR_COMM,
                 "MPI_Bcast on a freed communicator");
    expect_error(MPI_Iallreduce(a.mpi, b.mpi, 8, MPI_INT, MPI_SUM, c, &r), MPI_ERR_COMM,
                 "MPI_Iallreduce on a freed communicator");
    expect_error(MPI_Barrier(c), MPI_ERR_COMM, "MPI_Barrier on a freed communicator");
    expect_error(MPI_Alltoall(a.mpi, 1, MPI_INT, b.mpi, 1, MPI_INT, c), MPI_ERR_COMM,
                 "MPI_Alltoall on a freed communicator");
    still_works(MPI_COMM_WORLD, "calls on a freed communicator");
}

int main(int argc, char **argv)
{
    int finalize_pending = 0;
    for (int k = 1; k < argc; k++)
        if (!strcmp(argv[k], "--finalize-pending"))
            finalize_pending = 1;
    st_init(&argc, &argv, "errors");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    a = st_buf_new(64 * 8 * 16);
    b = st_buf_new(64 * 8 * 16);
    wrong_arguments(MPI_COMM_WORLD, "world");
    MPI_Comm split;
    MPI_Comm_split(MPI_COMM_WORLD, st.rank % 2, 0, &split);
    wrong_arguments(split, "a split");
    MPI_Comm_free(&split);
    freed_communicator();
    if (!finalize_pending) {
        st_buf_free(&a);
        st_buf_free(&b);
        return st_finish();
    }
    int status = st_report();
    /* Start collectives and finalize without completing them. The buffers
     * stay allocated: MPI may still write them inside MPI_Finalize. */
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Request r[3];
    MPI_Iallreduce(a.mpi, b.mpi, 64, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r[0]);
    MPI_Ibcast(a.mpi, 64, MPI_INT, 0, dup, &r[1]);
    MPI_Iallgather(a.mpi, 4, MPI_INT, (char *)b.mpi + 4096, 4, MPI_INT, dup, &r[2]);
    int rc = MPI_Finalize();
    if (st.rank == 0)
        printf("MPI_Finalize with 3 pending requests returned %d\n", rc);
    return status;
}

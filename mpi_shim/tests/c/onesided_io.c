/* One-sided communication and MPI-IO with buffers MPI sees (device memory
 * with --device). A shim cannot make an MPI that knows nothing about GPUs
 * use device memory there, so with --device (or --expect-refused: a shim
 * run in its host test mode, where host buffers count as device memory)
 * every call that takes such a buffer must fail with MPI_ERR_BUFFER under
 * MPI_ERRORS_RETURN, leave MPI_REQUEST_NULL / MPI_WIN_NULL, and move
 * nothing. Otherwise (host memory) each must work exactly as MPI's own:
 * MPI_Win_create, MPI_Win_attach, MPI_Put, MPI_Get, MPI_Accumulate,
 * MPI_Get_accumulate, MPI_Fetch_and_op, MPI_Compare_and_swap, MPI_Rput,
 * MPI_Rget, MPI_Raccumulate, MPI_Rget_accumulate; MPI_File write/read at
 * explicit offsets, individual and shared file pointers, collective,
 * nonblocking and split collective forms; the MPI-4 large-count forms
 * where the program finds them. An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define W __attribute__((weak))
W int MPI_Put_c(const void *, MPI_Count, MPI_Datatype, int, MPI_Aint, MPI_Count, MPI_Datatype,
                MPI_Win);
W int MPI_Rget_c(void *, MPI_Count, MPI_Datatype, int, MPI_Aint, MPI_Count, MPI_Datatype,
                 MPI_Win, MPI_Request *);
W int MPI_File_write_at_c(MPI_File, MPI_Offset, const void *, MPI_Count, MPI_Datatype,
                          MPI_Status *);
W int MPI_File_iread_at_c(MPI_File, MPI_Offset, void *, MPI_Count, MPI_Datatype,
                          MPI_Request *);

#define N 64 /* ints per transfer */

static int refused; /* device memory (or host test mode): every call refused */

/* rc must be MPI_ERR_BUFFER when refused, MPI_SUCCESS otherwise. */
static int outcome(int rc, const char *what)
{
    if (!refused)
        return st_ok(rc, what);
    int cls = MPI_SUCCESS;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_BUFFER)
        st_pass();
    else
        st_fail("%s: error class %d, want MPI_ERR_BUFFER (%d)", what, cls, MPI_ERR_BUFFER);
    return 0;
}

/* As `outcome`, for a call that returns a request: a refused one leaves
 * MPI_REQUEST_NULL, a started one is waited for. */
static int req_outcome(int rc, MPI_Request *req, const char *what)
{
    if (refused && *req != MPI_REQUEST_NULL) {
        st_fail("%s: a refused call left a request", what);
        return 0;
    }
    if (!outcome(rc, what))
        return 0;
    return st_ok(MPI_Wait(req, MPI_STATUS_IGNORE), what);
}

static void ints_expect(const char *what, const int *got, const int *want, int n)
{
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            st_fail("%s: int %d is %d, want %d", what, i, got[i], want[i]);
            return;
        }
    st_pass();
}

static void one_sided(void)
{
    int me = st.rank, np = st.size, right = (me + 1) % np, left = (me + np - 1) % np;
    struct st_buf o = st_buf_new(N * 4), res = st_buf_poisoned(N * 4);
    int *op = o.host;
    for (int i = 0; i < N; i++)
        op[i] = me * 1000 + i;
    st_push(&o);
    /* A window over memory the program gives: refused on device memory.
     * Without MPI_THREAD_MULTIPLE Open MPI 4.1 may have no component for
     * such windows on one node (MPI_ERR_WIN): that is MPI's answer. */
    struct st_buf wmem = st_buf_new(N * 4);
    MPI_Win w2 = MPI_WIN_NULL;
    int rc = MPI_Win_create(wmem.mpi, N * 4, 4, MPI_INFO_NULL, MPI_COMM_WORLD, &w2);
    int cls = MPI_SUCCESS;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    if (!refused && cls == MPI_ERR_WIN) {
        if (me == 0)
            printf("MPI_Win_create: MPI_ERR_WIN from this MPI (no window component)\n");
    } else if (outcome(rc, "Win_create")) {
        MPI_Win_free(&w2);
    } else if (refused && w2 != MPI_WIN_NULL) {
        st_fail("Win_create: a refused call left a window");
    }
    /* a dynamic window: attaching the program's memory */
    MPI_Win dyn = MPI_WIN_NULL;
    if (MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &dyn) == MPI_SUCCESS) {
        MPI_Win_set_errhandler(dyn, MPI_ERRORS_RETURN);
        if (outcome(MPI_Win_attach(dyn, wmem.mpi, N * 4), "Win_attach"))
            st_ok(MPI_Win_detach(dyn, wmem.mpi), "Win_detach");
        MPI_Win_free(&dyn);
    } else if (me == 0) {
        printf("MPI_Win_create_dynamic: not available from this MPI\n");
    }
    /* the targets: MPI's own memory */
    int *base;
    MPI_Win win;
    st_ok(MPI_Win_allocate(N * 4, 4, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win), "Win_allocate");
    MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
    int want[N];
    /* Put to the right neighbour */
    memset(base, 0, N * 4);
    MPI_Win_fence(0, win);
    rc = MPI_Put(o.mpi, N, MPI_INT, right, 0, N, MPI_INT, win);
    MPI_Win_fence(0, win);
    if (outcome(rc, "Put")) {
        for (int i = 0; i < N; i++)
            want[i] = left * 1000 + i;
        ints_expect("Put", base, want, N);
    }
    /* Accumulate (sum) onto what Put left */
    MPI_Win_fence(0, win);
    rc = MPI_Accumulate(o.mpi, N, MPI_INT, right, 0, N, MPI_INT, MPI_SUM, win);
    MPI_Win_fence(0, win);
    if (outcome(rc, "Accumulate")) {
        for (int i = 0; i < N; i++)
            want[i] = 2 * (left * 1000 + i);
        ints_expect("Accumulate", base, want, N);
    }
    /* Get from the right neighbour */
    for (int i = 0; i < N; i++)
        base[i] = me * 7 + i;
    MPI_Win_fence(0, win);
    rc = MPI_Get(res.mpi, N, MPI_INT, right, 0, N, MPI_INT, win);
    MPI_Win_fence(0, win);
    if (outcome(rc, "Get")) {
        st_pull(&res);
        for (int i = 0; i < N; i++)
            want[i] = right * 7 + i;
        ints_expect("Get", res.host, want, N);
    }
    /* Get_accumulate, Fetch_and_op, Compare_and_swap, request forms */
    MPI_Win_fence(0, win);
    rc = MPI_Get_accumulate(o.mpi, N, MPI_INT, res.mpi, N, MPI_INT, right, 0, N, MPI_INT, MPI_SUM,
                            win);
    MPI_Win_fence(0, win);
    if (outcome(rc, "Get_accumulate")) {
        st_pull(&res);
        for (int i = 0; i < N; i++)
            want[i] = right * 7 + i; /* the old target values */
        ints_expect("Get_accumulate result", res.host, want, N);
        for (int i = 0; i < N; i++)
            want[i] = me * 7 + i + left * 1000 + i;
        ints_expect("Get_accumulate target", base, want, N);
    }
    MPI_Win_fence(0, win);
    rc = MPI_Fetch_and_op(o.mpi, res.mpi, MPI_INT, right, 0, MPI_SUM, win);
    MPI_Win_fence(0, win);
    if (outcome(rc, "Fetch_and_op")) {
        st_pull(&res);
        want[0] = right * 7 + me * 1000; /* right's base[0] after Get_accumulate */
        ints_expect("Fetch_and_op", res.host, want, 1);
    }
    MPI_Win_fence(0, win);
    rc = MPI_Compare_and_swap(o.mpi, res.mpi, (int *)res.mpi + 1, MPI_INT, right, 4, win);
    MPI_Win_fence(0, win);
    outcome(rc, "Compare_and_swap");
    MPI_Win_lock_all(0, win);
    MPI_Request q = MPI_REQUEST_NULL;
    rc = MPI_Rput(o.mpi, N, MPI_INT, right, 0, N, MPI_INT, win, &q);
    req_outcome(rc, &q, "Rput");
    q = MPI_REQUEST_NULL;
    rc = MPI_Raccumulate(o.mpi, N, MPI_INT, right, 0, N, MPI_INT, MPI_BOR, win, &q);
    req_outcome(rc, &q, "Raccumulate");
    MPI_Win_flush_all(win);
    q = MPI_REQUEST_NULL;
    rc = MPI_Rget(res.mpi, N, MPI_INT, right, 0, N, MPI_INT, win, &q);
    req_outcome(rc, &q, "Rget");
    q = MPI_REQUEST_NULL;
    rc = MPI_Rget_accumulate(o.mpi, N, MPI_INT, res.mpi, N, MPI_INT, right, 0, N, MPI_INT,
                             MPI_NO_OP, win, &q);
    req_outcome(rc, &q, "Rget_accumulate");
    if (MPI_Put_c && MPI_Rget_c) {
        rc = MPI_Put_c(o.mpi, N, MPI_INT, right, 0, N, MPI_INT, win);
        outcome(rc, "Put_c");
        MPI_Win_flush_all(win);
        q = MPI_REQUEST_NULL;
        rc = MPI_Rget_c(res.mpi, N, MPI_INT, right, 0, N, MPI_INT, win, &q);
        if (req_outcome(rc, &q, "Rget_c")) {
            st_pull(&res);
            for (int i = 0; i < N; i++)
                want[i] = me * 1000 + i; /* what I put there */
            ints_expect("Put_c then Rget_c", res.host, want, N);
        }
    }
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
    st_buf_free(&o);
    st_buf_free(&res);
    st_buf_free(&wmem);
}

static void file_io(void)
{
    int me = st.rank, np = st.size;
    long id = (long)getpid();
    MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    char path[128];
    snprintf(path, sizeof path, "/tmp/gpucoll-shim-io-%ld.bin", id);
    MPI_File fh;
    if (!st_ok(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR,
                             MPI_INFO_NULL, &fh),
               "File_open"))
        return;
    MPI_File_set_errhandler(fh, MPI_ERRORS_RETURN);
    struct st_buf o = st_buf_new(N * 4), in = st_buf_poisoned(N * 4);
    int *op = o.host, want[N];
    for (int i = 0; i < N; i++)
        want[i] = op[i] = me * 100000 + i;
    st_push(&o);
    MPI_Offset mine = (MPI_Offset)me * N * 4, blk = (MPI_Offset)np * N * 4;
    MPI_Status s;
    MPI_Request q;
    /* block 0: explicit offsets */
    int rc = MPI_File_write_at(fh, mine, o.mpi, N, MPI_INT, &s);
    outcome(rc, "File_write_at");
    MPI_File_sync(fh);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_sync(fh);
    rc = MPI_File_read_at(fh, mine, in.mpi, N, MPI_INT, &s);
    if (outcome(rc, "File_read_at")) {
        st_pull(&in);
        ints_expect("File_read_at", in.host, want, N);
    }
    /* block 1: collective at offsets */
    outcome(MPI_File_write_at_all(fh, blk + mine, o.mpi, N, MPI_INT, &s), "File_write_at_all");
    st_poison(&in);
    if (outcome(MPI_File_read_at_all(fh, blk + mine, in.mpi, N, MPI_INT, &s),
                "File_read_at_all")) {
        st_pull(&in);
        ints_expect("File_read_at_all", in.host, want, N);
    }
    /* block 2: nonblocking at offsets */
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iwrite_at(fh, 2 * blk + mine, o.mpi, N, MPI_INT, &q), &q,
                "File_iwrite_at");
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iwrite_at_all(fh, 2 * blk + mine, o.mpi, N, MPI_INT, &q), &q,
                "File_iwrite_at_all");
    st_poison(&in);
    q = MPI_REQUEST_NULL;
    if (req_outcome(MPI_File_iread_at(fh, 2 * blk + mine, in.mpi, N, MPI_INT, &q), &q,
                    "File_iread_at")) {
        st_pull(&in);
        ints_expect("File_iread_at", in.host, want, N);
    }
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iread_at_all(fh, 2 * blk + mine, in.mpi, N, MPI_INT, &q), &q,
                "File_iread_at_all");
    /* block 3: individual file pointer */
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    outcome(MPI_File_write(fh, o.mpi, N, MPI_INT, &s), "File_write");
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    st_poison(&in);
    if (outcome(MPI_File_read(fh, in.mpi, N, MPI_INT, &s), "File_read")) {
        st_pull(&in);
        ints_expect("File_read", in.host, want, N);
    }
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    outcome(MPI_File_write_all(fh, o.mpi, N, MPI_INT, &s), "File_write_all");
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    outcome(MPI_File_read_all(fh, in.mpi, N, MPI_INT, &s), "File_read_all");
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iwrite(fh, o.mpi, N, MPI_INT, &q), &q, "File_iwrite");
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iread(fh, in.mpi, N, MPI_INT, &q), &q, "File_iread");
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iwrite_all(fh, o.mpi, N, MPI_INT, &q), &q, "File_iwrite_all");
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iread_all(fh, in.mpi, N, MPI_INT, &q), &q, "File_iread_all");
    /* split collectives */
    MPI_File_seek(fh, 3 * blk + mine, MPI_SEEK_SET);
    if (outcome(MPI_File_write_all_begin(fh, o.mpi, N, MPI_INT), "File_write_all_begin"))
        outcome(MPI_File_write_all_end(fh, o.mpi, &s), "File_write_all_end");
    if (outcome(MPI_File_read_at_all_begin(fh, 3 * blk + mine, in.mpi, N, MPI_INT),
                "File_read_at_all_begin"))
        outcome(MPI_File_read_at_all_end(fh, in.mpi, &s), "File_read_at_all_end");
    /* shared file pointer (rank order for the ordered forms) */
    MPI_File_seek_shared(fh, 4 * blk, MPI_SEEK_SET);
    outcome(MPI_File_write_ordered(fh, o.mpi, N, MPI_INT, &s), "File_write_ordered");
    MPI_File_seek_shared(fh, 4 * blk, MPI_SEEK_SET);
    st_poison(&in);
    if (outcome(MPI_File_read_ordered(fh, in.mpi, N, MPI_INT, &s), "File_read_ordered")) {
        st_pull(&in);
        ints_expect("File_read_ordered", in.host, want, N);
    }
    if (outcome(MPI_File_write_ordered_begin(fh, o.mpi, N, MPI_INT), "File_write_ordered_begin"))
        outcome(MPI_File_write_ordered_end(fh, o.mpi, &s), "File_write_ordered_end");
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iwrite_shared(fh, o.mpi, N, MPI_INT, &q), &q, "File_iwrite_shared");
    outcome(MPI_File_write_shared(fh, o.mpi, N, MPI_INT, &s), "File_write_shared");
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_seek_shared(fh, 4 * blk, MPI_SEEK_SET);
    outcome(MPI_File_read_shared(fh, in.mpi, N, MPI_INT, &s), "File_read_shared");
    q = MPI_REQUEST_NULL;
    req_outcome(MPI_File_iread_shared(fh, in.mpi, N, MPI_INT, &q), &q, "File_iread_shared");
    MPI_Barrier(MPI_COMM_WORLD);
    if (MPI_File_write_at_c && MPI_File_iread_at_c) {
        outcome(MPI_File_write_at_c(fh, 6 * blk + mine, o.mpi, N, MPI_INT, &s),
                "File_write_at_c");
        st_poison(&in);
        q = MPI_REQUEST_NULL;
        if (req_outcome(MPI_File_iread_at_c(fh, 6 * blk + mine, in.mpi, N, MPI_INT, &q), &q,
                        "File_iread_at_c")) {
            st_pull(&in);
            ints_expect("File_iread_at_c", in.host, want, N);
        }
    }
    MPI_File_close(&fh);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0)
        MPI_File_delete(path, MPI_INFO_NULL);
    st_buf_free(&o);
    st_buf_free(&in);
}

int main(int argc, char **argv)
{
    int expect = 0;
    for (int k = 1; k < argc; k++)
        if (!strcmp(argv[k], "--expect-refused"))
            expect = 1;
    st_init(&argc, &argv, "onesided_io");
    refused = expect || st.device;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (st.rank == 0)
        printf("calls on the program's buffers %s\n", refused ? "must be refused" : "must work");
    one_sided();
    file_io();
    return st_finish();
}

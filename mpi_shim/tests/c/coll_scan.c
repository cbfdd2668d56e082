/* Prefix reductions and the nonblocking reduce-scatter: MPI_Scan,
 * MPI_Exscan, MPI_Iscan, MPI_Iexscan and MPI_Ireduce_scatter (uneven and
 * equal counts) on every datatype and op the shimtest oracle has (user ops,
 * the non-commutative one too), sizes 0, 1, 7919 and a large one, in place
 * and not, on the world, a split and a duplicate; the MPI-4 large-count
 * forms where the program finds them (weak symbols: Open MPI 4.1 has none).
 * Results are checked against the exact oracle; bytes past the result,
 * and Exscan's rank-0 receive buffer, must keep the poison. An ordinary MPI
 * program. */
#include "shimtest.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((weak))
W int MPI_Scan_c(const void *, void *, MPI_Count, MPI_Datatype, MPI_Op, MPI_Comm);
W int MPI_Exscan_c(const void *, void *, MPI_Count, MPI_Datatype, MPI_Op, MPI_Comm);
W int MPI_Iscan_c(const void *, void *, MPI_Count, MPI_Datatype, MPI_Op, MPI_Comm,
                  MPI_Request *);
W int MPI_Iexscan_c(const void *, void *, MPI_Count, MPI_Datatype, MPI_Op, MPI_Comm,
                    MPI_Request *);
W int MPI_Ireduce_scatter_c(const void *, void *, const MPI_Count *, MPI_Datatype, MPI_Op,
                            MPI_Comm, MPI_Request *);

#define TAIL 16 /* poisoned bytes after every result */

static uint64_t next_seed = 9000;
static unsigned turn;

enum form { SCAN, EXSCAN, ISCAN, IEXSCAN, NFORM };
static const char *form_names[NFORM] = {"Scan", "Exscan", "Iscan", "Iexscan"};

/* Complete `req` with a method that turns with each call. */
static int complete(MPI_Request *req, const char *label)
{
    int rc, flag = 0;
    switch (turn++ % 3) {
    case 0:
        rc = MPI_Wait(req, MPI_STATUS_IGNORE);
        break;
    case 1:
        do
            rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        while (rc == MPI_SUCCESS && !flag);
        break;
    default:
        rc = MPI_Waitall(1, req, MPI_STATUSES_IGNORE);
        break;
    }
    if (rc == MPI_SUCCESS && *req != MPI_REQUEST_NULL) {
        st_fail("%s: request not MPI_REQUEST_NULL after completion", label);
        return 0;
    }
    return st_ok(rc, label);
}

/* One scan of n elements; `large`: through the _c form. */
static void t_scan(MPI_Comm comm, const char *cname, enum form f, const struct st_type *t, int op,
                   size_t n, int inplace, int large)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    int ex = f == EXSCAN || f == IEXSCAN, nb = f == ISCAN || f == IEXSCAN;
    char label[200];
    snprintf(label, sizeof label, "%s%s %s %s n=%zu%s on %s", form_names[f], large ? "_c" : "",
             t->name, st_op_names[op], n, inplace ? " in-place" : "", cname);
    size_t bytes = n * t->size;
    struct st_buf in = st_input(t, op, seed, me, 0, n);
    struct st_buf out = st_buf_poisoned(bytes + TAIL);
    if (inplace)
        st_place(&out, 0, in.host, bytes);
    const void *send = inplace ? MPI_IN_PLACE : in.mpi;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc;
    if (large) {
        MPI_Count c = (MPI_Count)n;
        rc = f == SCAN     ? MPI_Scan_c(send, out.mpi, c, t->type, st_ops[op], comm)
             : f == EXSCAN ? MPI_Exscan_c(send, out.mpi, c, t->type, st_ops[op], comm)
             : f == ISCAN  ? MPI_Iscan_c(send, out.mpi, c, t->type, st_ops[op], comm, &req)
                           : MPI_Iexscan_c(send, out.mpi, c, t->type, st_ops[op], comm, &req);
    } else {
        int c = (int)n;
        rc = f == SCAN     ? MPI_Scan(send, out.mpi, c, t->type, st_ops[op], comm)
             : f == EXSCAN ? MPI_Exscan(send, out.mpi, c, t->type, st_ops[op], comm)
             : f == ISCAN  ? MPI_Iscan(send, out.mpi, c, t->type, st_ops[op], comm, &req)
                           : MPI_Iexscan(send, out.mpi, c, t->type, st_ops[op], comm, &req);
    }
    if (st_ok(rc, label) && (!nb || complete(&req, label))) {
        st_pull(&out);
        if (ex && me == 0) {
            /* rank 0's result is undefined: its buffer is left alone */
            if (inplace)
                st_compare(label, t, out.host, in.host, n);
            else
                st_untouched(label, out.host, bytes);
        } else {
            char *exp = malloc(bytes ? bytes : 1);
            /* the prefix over the ranks of `comm` before me (and me) */
            for (size_t i = 0; i < n; i++)
                st_store(t, exp, i, st_reduce_elem(t, op, seed, ex ? me : me + 1, i));
            st_compare(label, t, out.host, exp, n);
            free(exp);
        }
        st_untouched(label, (char *)out.host + bytes, TAIL);
    }
    st_buf_free(&in);
    st_buf_free(&out);
}

/* MPI_Ireduce_scatter: uneven counts (`uneven`) or all equal. */
static void t_ireduce_scatter(MPI_Comm comm, const char *cname, const struct st_type *t, int op,
                              size_t n, int uneven, int inplace, int large)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    char label[200];
    snprintf(label, sizeof label, "Ireduce_scatter%s %s %s n=%zu%s%s on %s", large ? "_c" : "",
             t->name, st_op_names[op], n, uneven ? " uneven" : "", inplace ? " in-place" : "",
             cname);
    int *counts = malloc(sizeof(int) * np);
    MPI_Count *lcounts = malloc(sizeof(MPI_Count) * np);
    size_t total = 0, first = 0;
    for (int r = 0; r < np; r++) {
        counts[r] = uneven ? (int)(n + (size_t)((r * 5 + 1) % 3)) - 1 : (int)n;
        if (counts[r] < 0)
            counts[r] = 0;
        lcounts[r] = counts[r];
        if (r < me)
            first += (size_t)counts[r];
        total += (size_t)counts[r];
    }
    size_t mine = (size_t)counts[me], sz = (size_t)t->size;
    struct st_buf in = st_input(t, op, seed, me, 0, total);
    struct st_buf out = st_buf_poisoned((inplace ? total : mine) * sz + TAIL);
    if (inplace)
        st_place(&out, 0, in.host, total * sz);
    const void *send = inplace ? MPI_IN_PLACE : in.mpi;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = large ? MPI_Ireduce_scatter_c(send, out.mpi, lcounts, t->type, st_ops[op], comm, &req)
                   : MPI_Ireduce_scatter(send, out.mpi, counts, t->type, st_ops[op], comm, &req);
    if (st_ok(rc, label) && complete(&req, label)) {
        st_pull(&out);
        char *exp = malloc(mine * sz + 1);
        for (size_t i = 0; i < mine; i++)
            st_store(t, exp, i, st_reduce_elem(t, op, seed, np, first + i));
        st_compare(label, t, out.host, exp, mine);
        if (!inplace)
            st_untouched(label, (char *)out.host + mine * sz, TAIL);
        free(exp);
    }
    free(counts);
    free(lcounts);
    st_buf_free(&in);
    st_buf_free(&out);
}

/* Several in flight at once, completed together. */
static void t_overlapping(MPI_Comm comm, const struct st_type *t, size_t n)
{
    int me;
    MPI_Comm_rank(comm, &me);
    uint64_t seed = next_seed++;
    size_t bytes = n * t->size;
    struct st_buf in = st_input(t, OP_SUM, seed, me, 0, n);
    struct st_buf a = st_buf_poisoned(bytes), b = st_buf_poisoned(bytes);
    MPI_Request reqs[3];
    int rc = MPI_Iscan(in.mpi, a.mpi, (int)n, t->type, MPI_SUM, comm, &reqs[0]);
    rc |= MPI_Iexscan(in.mpi, b.mpi, (int)n, t->type, MPI_SUM, comm, &reqs[1]);
    rc |= MPI_Ibarrier(comm, &reqs[2]);
    if (st_ok(rc, "overlapping Iscan+Iexscan+Ibarrier") &&
        st_ok(MPI_Waitall(3, reqs, MPI_STATUSES_IGNORE), "Waitall of Iscan+Iexscan+Ibarrier")) {
        st_pull(&a);
        st_pull(&b);
        char *ea = malloc(bytes + 1), *eb = malloc(bytes + 1);
        for (size_t i = 0; i < n; i++) {
            st_store(t, ea, i, st_reduce_elem(t, OP_SUM, seed, me + 1, i));
            if (me > 0)
                st_store(t, eb, i, st_reduce_elem(t, OP_SUM, seed, me, i));
        }
        st_compare("overlapping Iscan", t, a.host, ea, n);
        if (me > 0)
            st_compare("overlapping Iexscan", t, b.host, eb, n);
        free(ea);
        free(eb);
    }
    st_buf_free(&in);
    st_buf_free(&a);
    st_buf_free(&b);
}

static void all_forms(MPI_Comm comm, const char *cname, int step)
{
    const size_t sizes[] = {0, 1, 7919};
    int k = 0;
    for (int ti = 0; ti < st_ntypes; ti += step) {
        const struct st_type *t = &st_types[ti];
        for (int op = 0; op < OP_COUNT; op++) {
            if (!st_op_valid(t, op))
                continue;
            for (int s = 0; s < 3; s++, k++) {
                enum form f = (enum form)(k % NFORM);
                t_scan(comm, cname, f, t, op, sizes[s], k % 3 == 1, 0);
                if (op == OP_SUM || op == OP_USER_NC)
                    t_ireduce_scatter(comm, cname, t, op, sizes[s], k % 2, k % 5 == 2, 0);
            }
        }
    }
}

/* The large-count forms, where the program finds them. */
static void large_count_forms(void)
{
    if (!MPI_Scan_c || !MPI_Exscan_c || !MPI_Iscan_c || !MPI_Iexscan_c ||
        !MPI_Ireduce_scatter_c) {
        if (st.rank == 0)
            printf("large-count forms: not found (plain Open MPI 4.1)\n");
        return;
    }
    const struct st_type *d = st_type_named("DOUBLE"), *i8 = st_type_named("INT8_T");
    for (int f = 0; f < NFORM; f++) {
        t_scan(MPI_COMM_WORLD, "world", (enum form)f, d, OP_SUM, 7919, f == 1, 1);
        t_scan(MPI_COMM_WORLD, "world", (enum form)f, i8, OP_USER_NC, 1, f == 2, 1);
    }
    t_ireduce_scatter(MPI_COMM_WORLD, "world", d, OP_MAX, 101, 1, 0, 1);
    t_ireduce_scatter(MPI_COMM_WORLD, "world", i8, OP_SUM, 7, 0, 1, 1);
    /* a count beyond C int: MPI_ERR_COUNT, nothing moved */
    char one[8] = {0}, out[8];
    int rc = MPI_Scan_c(one, out, (MPI_Count)INT_MAX + 1, MPI_CHAR, MPI_SUM, MPI_COMM_WORLD);
    int cls = MPI_SUCCESS;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_COUNT)
        st_pass();
    else
        st_fail("MPI_Scan_c with count INT_MAX+1 gave class %d, want MPI_ERR_COUNT", cls);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "coll_scan");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    all_forms(MPI_COMM_WORLD, "world", st.quick ? 3 : 1);
    MPI_Comm split, dup;
    MPI_Comm_split(MPI_COMM_WORLD, st.rank % 2, -st.rank, &split);
    MPI_Comm_set_errhandler(split, MPI_ERRORS_RETURN);
    all_forms(split, "split", 5);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    all_forms(dup, "dup", 7);
    t_overlapping(dup, st_type_named("INT"), 7919);
    t_overlapping(MPI_COMM_WORLD, st_type_named("DOUBLE"), 1);
    if (st.large) {
        for (int f = 0; f < NFORM; f++)
            t_scan(MPI_COMM_WORLD, "world", (enum form)f, st_type_named("FLOAT"), OP_SUM,
                   st.large, f == 3, 0);
        t_ireduce_scatter(MPI_COMM_WORLD, "world", st_type_named("INT64_T"), OP_SUM,
                          st.large / 4, 1, 0, 0);
        t_ireduce_scatter(MPI_COMM_WORLD, "world", st_type_named("INT"), OP_SUM, st.large / 4,
                          0, 1, 0);
    }
    large_count_forms();
    MPI_Comm_free(&split);
    MPI_Comm_free(&dup);
    return st_finish();
}

/* Blocking collectives on every datatype, op, size and in-place form:
 * MPI_Allreduce, Reduce, Reduce_scatter_block, Reduce_scatter, Bcast,
 * Allgather, Alltoall, Gather, Scatter and Barrier, on MPI_COMM_WORLD, a
 * split and a duplicate. Outputs are poisoned before each call, results
 * compared exactly, and bytes past each result and send buffers checked
 * untouched. An ordinary MPI program: run it with or without any shim. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GUARD 64 /* poisoned bytes after every receive buffer */

struct cx {
    MPI_Comm comm;
    const char *name;
    int rank, size;
};

static uint64_t next_seed = 1;
static unsigned case_no;

static const char *ip_name(int inplace)
{
    return inplace ? " in-place" : "";
}

/* A receive buffer of n elements plus the guard, all poisoned. */
static struct st_buf make_output(const struct st_type *t, size_t n)
{
    return st_buf_poisoned(n * t->size + GUARD);
}

static void check_input_kept(const char *label, struct st_buf *in)
{
    void *copy = malloc(in->bytes ? in->bytes : 1);
    memcpy(copy, in->host, in->bytes);
    st_pull(in);
    if (memcmp(copy, in->host, in->bytes) != 0)
        st_fail("%s: the send buffer was modified", label);
    else
        st_pass();
    free(copy);
}

/* Pull `out` and compare elements [0, n) with exp, and the guard. */
static void check_output(const char *label, const struct st_type *t, struct st_buf *out,
                         const void *exp, size_t n, size_t valid_elems)
{
    st_pull(out);
    st_compare(label, t, out->host, exp, n);
    size_t end = valid_elems * t->size;
    st_untouched(label, (char *)out->host + end, out->bytes - end);
}

/* The end of every case: the call succeeded and, if this rank expects data
 * (`exp`), `out` holds exp[0..n) with nothing written past `valid`
 * elements; where `keep_in`, the send buffer is unchanged. Frees it all. */
static void finish(const char *label, const struct st_type *t, int rc, struct st_buf *in,
                   struct st_buf *out, char *exp, size_t n, size_t valid, int keep_in)
{
    if (st_ok(rc, label) && exp)
        check_output(label, t, out, exp, n, valid);
    if (keep_in)
        check_input_kept(label, in);
    free(exp);
    st_buf_free(in);
    st_buf_free(out);
}

/* The expected reduction over all ranks of elements first..first+n. */
static char *reduced(struct cx *c, const struct st_type *t, int op, uint64_t seed, size_t first,
                     size_t n)
{
    char *exp = malloc(n * t->size + 1);
    for (size_t i = 0; i < n; i++)
        st_store(t, exp, i, st_reduce_elem(t, op, seed, c->size, first + i));
    return exp;
}

/* ---- reductions ---------------------------------------------------- */

static void t_allreduce(struct cx *c, const struct st_type *t, int op, size_t n, int inplace)
{
    char label[200];
    uint64_t seed = next_seed++;
    snprintf(label, sizeof label, "Allreduce %s %s n=%zu%s %s", t->name, st_op_names[op], n,
             ip_name(inplace), c->name);
    struct st_buf in = st_input(t, op, seed, c->rank, 0, n);
    struct st_buf out = make_output(t, n);
    if (inplace)
        st_place(&out, 0, in.host, n * t->size);
    int rc = MPI_Allreduce(inplace ? MPI_IN_PLACE : in.mpi, out.mpi, (int)n, t->type, st_ops[op],
                           c->comm);
    finish(label, t, rc, &in, &out, reduced(c, t, op, seed, 0, n), n, n, !inplace);
}

static void t_reduce(struct cx *c, const struct st_type *t, int op, size_t n, int inplace)
{
    char label[200];
    uint64_t seed = next_seed++;
    int root = (int)(case_no++ % (unsigned)c->size);
    int am_root = c->rank == root;
    snprintf(label, sizeof label, "Reduce %s %s n=%zu%s root=%d %s", t->name, st_op_names[op], n,
             ip_name(inplace), root, c->name);
    struct st_buf in = st_input(t, op, seed, c->rank, 0, n);
    struct st_buf out = make_output(t, n);
    if (inplace && am_root)
        st_place(&out, 0, in.host, n * t->size);
    const void *send = inplace && am_root ? MPI_IN_PLACE : in.mpi;
    /* only the root's receive buffer is significant: others pass NULL */
    void *recv = am_root || !inplace ? out.mpi : NULL;
    int rc = MPI_Reduce(send, recv, (int)n, t->type, st_ops[op], root, c->comm);
    char *exp = am_root ? reduced(c, t, op, seed, 0, n) : NULL;
    finish(label, t, rc, &in, &out, exp, n, n, !(inplace && am_root));
}

/* MPI_Reduce_scatter_block (counts NULL: n each) or MPI_Reduce_scatter
 * (uneven blocks; with n = 0 a mix of empty and one-element blocks). */
static void t_reduce_scatter(struct cx *c, const struct st_type *t, int op, size_t n,
                             int inplace, int uneven)
{
    char label[200];
    uint64_t seed = next_seed++;
    int *counts = malloc(sizeof(int) * c->size);
    size_t total = 0, mine_at = 0;
    for (int i = 0; i < c->size; i++) {
        counts[i] = !uneven ? (int)n : n ? (int)n + i % 3 : i % 2;
        if (i < c->rank)
            mine_at += counts[i];
        total += counts[i];
    }
    size_t mine = counts[c->rank];
    snprintf(label, sizeof label, "%s %s %s n=%zu%s %s",
             uneven ? "Reduce_scatter" : "Reduce_scatter_block", t->name, st_op_names[op], n,
             ip_name(inplace), c->name);
    struct st_buf in = st_input(t, op, seed, c->rank, 0, total);
    struct st_buf out = make_output(t, inplace ? total : mine);
    if (inplace)
        st_place(&out, 0, in.host, total * t->size);
    const void *send = inplace ? MPI_IN_PLACE : in.mpi;
    int rc = uneven ? MPI_Reduce_scatter(send, out.mpi, counts, t->type, st_ops[op], c->comm)
                    : MPI_Reduce_scatter_block(send, out.mpi, (int)n, t->type, st_ops[op],
                                               c->comm);
    /* in place, the rest of the buffer is undefined afterwards */
    finish(label, t, rc, &in, &out, reduced(c, t, op, seed, mine_at, mine), mine,
           inplace ? total : mine, !inplace);
    free(counts);
}

/* ---- data movement ------------------------------------------------- */

/* Data movement uses full-range bit patterns (the BXOR inputs). */
#define MOVE OP_BXOR

/* The expected blocks of every rank, n elements each from element `first`. */
static char *gathered(struct cx *c, const struct st_type *t, uint64_t seed, size_t first, size_t n)
{
    char *exp = malloc(n * c->size * t->size + 1);
    for (int r = 0; r < c->size; r++)
        st_fill(t, MOVE, seed, r, first, exp + (size_t)r * n * t->size, n);
    return exp;
}

static void t_bcast(struct cx *c, const struct st_type *t, size_t n)
{
    char label[200];
    uint64_t seed = next_seed++;
    int root = (int)(case_no++ % (unsigned)c->size);
    snprintf(label, sizeof label, "Bcast %s n=%zu root=%d %s", t->name, n, root, c->name);
    struct st_buf buf = make_output(t, n);
    char *exp = malloc(n * t->size + 1);
    st_fill(t, MOVE, seed, root, 0, exp, n);
    if (c->rank == root)
        st_place(&buf, 0, exp, n * t->size);
    if (st_ok(MPI_Bcast(buf.mpi, (int)n, t->type, root, c->comm), label))
        check_output(label, t, &buf, exp, n, n);
    free(exp);
    st_buf_free(&buf);
}

/* MPI_Allgather, or MPI_Alltoall (`exchange`: a block for each rank). */
static void t_all_ranks(struct cx *c, const struct st_type *t, size_t n, int inplace,
                        int exchange)
{
    char label[200];
    uint64_t seed = next_seed++;
    size_t total = n * c->size, blk = n * t->size;
    snprintf(label, sizeof label, "%s %s n=%zu%s %s", exchange ? "Alltoall" : "Allgather",
             t->name, n, ip_name(inplace), c->name);
    struct st_buf in = st_input(t, MOVE, seed, c->rank, 0, exchange ? total : n);
    struct st_buf out = make_output(t, total);
    if (inplace)
        st_place(&out, exchange ? 0 : c->rank * blk, in.host, in.bytes);
    const void *send = inplace ? MPI_IN_PLACE : in.mpi;
    int rc = exchange ? MPI_Alltoall(send, (int)n, t->type, out.mpi, (int)n, t->type, c->comm)
                      : MPI_Allgather(send, (int)n, t->type, out.mpi, (int)n, t->type, c->comm);
    char *exp = gathered(c, t, seed, exchange ? c->rank * n : 0, n);
    finish(label, t, rc, &in, &out, exp, total, total, !inplace);
}

static void t_gather(struct cx *c, const struct st_type *t, size_t n, int inplace)
{
    char label[200];
    uint64_t seed = next_seed++;
    int root = (int)(case_no++ % (unsigned)c->size);
    int am_root = c->rank == root;
    size_t total = n * c->size, blk = n * t->size;
    snprintf(label, sizeof label, "Gather %s n=%zu%s root=%d %s", t->name, n, ip_name(inplace),
             root, c->name);
    struct st_buf in = st_input(t, MOVE, seed, c->rank, 0, n);
    struct st_buf out = make_output(t, total);
    if (inplace && am_root)
        st_place(&out, root * blk, in.host, blk);
    const void *send = inplace && am_root ? MPI_IN_PLACE : in.mpi;
    int rc = MPI_Gather(send, (int)n, t->type, am_root || !inplace ? out.mpi : NULL, (int)n,
                        t->type, root, c->comm);
    char *exp = am_root ? gathered(c, t, seed, 0, n) : NULL;
    finish(label, t, rc, &in, &out, exp, total, total, 0);
}

static void t_scatter(struct cx *c, const struct st_type *t, size_t n, int inplace)
{
    char label[200];
    uint64_t seed = next_seed++;
    int root = (int)(case_no++ % (unsigned)c->size);
    int am_root = c->rank == root;
    size_t total = n * c->size;
    snprintf(label, sizeof label, "Scatter %s n=%zu%s root=%d %s", t->name, n, ip_name(inplace),
             root, c->name);
    struct st_buf in = st_input(t, MOVE, seed, root, 0, am_root ? total : 0);
    struct st_buf out = make_output(t, n);
    void *recv = inplace && am_root ? MPI_IN_PLACE : out.mpi;
    int rc = MPI_Scatter(am_root ? in.mpi : NULL, (int)n, t->type, recv, (int)n, t->type, root,
                         c->comm);
    char *exp = NULL;
    if (!(inplace && am_root)) {
        exp = malloc(n * t->size + 1);
        st_fill(t, MOVE, seed, root, c->rank * n, exp, n);
    }
    /* in place, the root's block stays where it is */
    finish(label, t, rc, &in, &out, exp, n, n, inplace && am_root);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every rank enters at a different time; nobody may leave before the last
 * one entered. CLOCK_MONOTONIC is one clock for all processes of a node
 * (MPI_Wtime is not: Open MPI counts from each process's MPI_Init). */
static void t_barrier(struct cx *c)
{
    char label[120];
    snprintf(label, sizeof label, "Barrier %s", c->name);
    struct timespec nap = {0, 15000000L * (long)c->rank};
    nanosleep(&nap, NULL);
    double times[2] = {now(), 0};
    int rc = MPI_Barrier(c->comm);
    times[1] = now();
    if (!st_ok(rc, label))
        return;
    double *all = malloc(sizeof(double) * 2 * c->size);
    if (MPI_Allgather(times, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, c->comm) != MPI_SUCCESS) {
        st_fail("%s: allgather of the times failed", label);
    } else {
        double last_in = all[0], first_out = all[1];
        for (int r = 0; r < c->size; r++) {
            last_in = all[2 * r] > last_in ? all[2 * r] : last_in;
            first_out = all[2 * r + 1] < first_out ? all[2 * r + 1] : first_out;
        }
        if (first_out < last_in)
            st_fail("%s: a rank left %.3f ms before the last one entered", label,
                    (last_in - first_out) * 1e3);
        else
            st_pass();
    }
    free(all);
}

/* ---- the matrix ---------------------------------------------------- */

static void reductions(struct cx *c, const struct st_type *t, int op, size_t n, int inplace)
{
    t_allreduce(c, t, op, n, inplace);
    t_reduce(c, t, op, n, inplace);
    t_reduce_scatter(c, t, op, n, inplace, 0);
    t_reduce_scatter(c, t, op, n, inplace, 1);
}

static void movement(struct cx *c, const struct st_type *t, size_t n, int inplace)
{
    if (!inplace)
        t_bcast(c, t, n);
    t_all_ranks(c, t, n, inplace, 0);
    t_all_ranks(c, t, n, inplace, 1);
    t_gather(c, t, n, inplace);
    t_scatter(c, t, n, inplace);
}

/* Everything on one communicator. Every (type, op) pair runs once, at a
 * size and form that rotate through {7919, 1, 0} x {separate, in place}
 * (the rotation is offset per type, so each pair of a type meets several
 * sizes across the types); every type also runs its data movement at all
 * three sizes. `full` runs every type and op, otherwise a few. */
static void matrix(struct cx *c, int full)
{
    const size_t sizes[] = {7919, 1, 0};
    const char *few[] = {"FLOAT", "INT", "INT8_T", "DOUBLE", "UINT64_T", "BYTE"};
    int ntypes = full ? st_ntypes : (int)(sizeof few / sizeof few[0]);
    for (int k = 0; k < ntypes; k++) {
        const struct st_type *t = full ? &st_types[k] : st_type_named(few[k]);
        unsigned turn = (unsigned)k;
        for (int op = 0; op < OP_COUNT; op++) {
            if (!st_op_valid(t, op))
                continue;
            if (!full && op != OP_SUM && op != OP_MAX && op != OP_BOR)
                continue;
            reductions(c, t, op, sizes[turn % 3], (int)(turn / 3 % 2));
            turn++;
        }
        for (int s = 0; s < 3; s++)
            movement(c, t, sizes[s], (int)((k + s) % 2));
    }
    t_barrier(c);
}

static void large(struct cx *c)
{
    if (!st.large)
        return;
    struct {
        const char *type;
        int op;
    } red[] = {{"FLOAT", OP_SUM}, {"DOUBLE", OP_MAX}, {"INT", OP_BXOR}, {"INT64_T", OP_SUM},
               {"UINT8_T", OP_MIN}, {"INT32_T", OP_LOR}};
    for (size_t k = 0; k < sizeof red / sizeof red[0]; k++)
        reductions(c, st_type_named(red[k].type), red[k].op, st.large, (int)(k % 2));
    movement(c, st_type_named("FLOAT"), st.large, 0);
    movement(c, st_type_named("BYTE"), st.large, 1);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "coll_blocking");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    struct cx world = {MPI_COMM_WORLD, "world", st.rank, st.size};
    matrix(&world, !st.quick);
    large(&world);

    /* A split (reversed order, so comm ranks differ from world ranks) and a
     * duplicate: each gets its own communicator state in any shim. */
    struct cx split = {MPI_COMM_NULL, "split", 0, 0};
    MPI_Comm_split(MPI_COMM_WORLD, st.rank % 2, st.size - st.rank, &split.comm);
    MPI_Comm_rank(split.comm, &split.rank);
    MPI_Comm_size(split.comm, &split.size);
    struct cx dup = {MPI_COMM_NULL, "dup", st.rank, st.size};
    MPI_Comm_dup(MPI_COMM_WORLD, &dup.comm);
    matrix(&split, 0);
    matrix(&dup, 0);
    t_allreduce(&world, st_type_named("INT"), OP_SUM, 7919, 0); /* interleaved with the others */
    t_allreduce(&split, st_type_named("FLOAT"), OP_SUM, 7919, 1);
    MPI_Comm_free(&split.comm);
    MPI_Comm_free(&dup.comm);
    return st_finish();
}

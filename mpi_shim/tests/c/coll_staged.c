/* What a GPU shim cannot hand to its own engine and must stage (or pass
 * through): derived datatypes (contiguous with a user op, strided vectors),
 * MPI_FLOAT_INT / MPI_DOUBLE_INT / MPI_2INT with MPI_MAXLOC and MPI_MINLOC,
 * user ops in nonblocking calls, MPI_COMM_SELF, an intercommunicator; and
 * communicators created and freed many times (a cache keyed by handle value
 * would hand a stale state to a new communicator at a reused address). An
 * ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t next_seed = 9000;

/* ---- a contiguous derived type of 3 ints, reduced by a user op ---------- */

static void triple_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    int *a = in, *b = inout;
    for (int i = 0; i < 3 * *len; i++)
        b[i] = a[i] + b[i];
}

static int triple_val(uint64_t seed, int r, size_t i)
{
    return (int)(st_hash(st_hash(seed, (uint64_t)r), i) % 2001) - 1000;
}

static void t_triples(MPI_Datatype triple, MPI_Op op, size_t n, int which)
{
    const char *names[] = {"Allreduce", "Reduce", "Reduce_scatter_block", "Iallreduce"};
    char label[160];
    uint64_t seed = next_seed++;
    int root = st.size - 1;
    size_t elems = 3 * n * (which == 2 ? (size_t)st.size : 1);
    snprintf(label, sizeof label, "%s of a 3-int contiguous type, user op, n=%zu", names[which], n);
    struct st_buf in = st_buf_new(elems * sizeof(int)), out = st_buf_new(elems * sizeof(int));
    for (size_t i = 0; i < elems; i++)
        ((int *)in.host)[i] = triple_val(seed, st.rank, i);
    st_push(&in);
    st_poison(&out);
    int rc;
    MPI_Request req;
    switch (which) {
    case 0: rc = MPI_Allreduce(in.mpi, out.mpi, (int)n, triple, op, MPI_COMM_WORLD); break;
    case 1: rc = MPI_Reduce(in.mpi, out.mpi, (int)n, triple, op, root, MPI_COMM_WORLD); break;
    case 2: rc = MPI_Reduce_scatter_block(in.mpi, out.mpi, (int)n, triple, op, MPI_COMM_WORLD); break;
    default:
        rc = MPI_Iallreduce(in.mpi, out.mpi, (int)n, triple, op, MPI_COMM_WORLD, &req);
        if (rc == MPI_SUCCESS)
            rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    if (st_ok(rc, label) && (which != 1 || st.rank == root)) {
        size_t cnt = 3 * n, base = which == 2 ? 3 * n * (size_t)st.rank : 0;
        int *exp = malloc(cnt * sizeof(int) + 1);
        for (size_t i = 0; i < cnt; i++) {
            exp[i] = 0;
            for (int r = 0; r < st.size; r++)
                exp[i] += triple_val(seed, r, base + i);
        }
        st_pull(&out);
        st_compare(label, &st_types[2], out.host, exp, cnt);
        free(exp);
    }
    st_buf_free(&in);
    st_buf_free(&out);
}

/* ---- a strided vector type for data movement ---------------------------- */

/* 2 blocks of 3 floats, stride 5: the elements 0-2 and 5-7 of each 8-float
 * extent (the extent ends after the last block). */
static int in_vector(size_t k)
{
    return k % 8 < 3 || (k % 8 >= 5);
}

static void t_vectors(MPI_Datatype vec, size_t n, int which)
{
    const char *names[] = {"Bcast", "Allgather", "Alltoall", "Gather", "Scatter"};
    char label[160];
    uint64_t seed = next_seed++;
    int root = (which + 1) % st.size, np = st.size, me = st.rank;
    size_t ext = 8, per_rank = n * ext; /* floats in n vectors */
    size_t sfloats = (which == 2 || which == 4) ? per_rank * np : per_rank;
    size_t rfloats = (which == 1 || which == 2 || which == 3) ? per_rank * np : per_rank;
    snprintf(label, sizeof label, "%s of a strided vector type n=%zu root=%d", names[which], n,
             root);
    struct st_buf in = st_buf_new(sfloats * 4), out = st_buf_new(rfloats * 4);
    const struct st_type *ft = &st_types[0];
    /* sender s's float k: value of (s, k); the holes are poison */
    int sender = which == 0 || which == 4 ? root : me;
    memset(in.host, ST_POISON, in.bytes);
    for (size_t k = 0; k < sfloats; k++)
        if (in_vector(k))
            st_store(ft, in.host, k, st_gen(ft, OP_SUM, seed, sender, k));
    st_push(&in);
    st_poison(&out);
    if (which == 0 && me == root) {
        memcpy(out.host, in.host, in.bytes);
        st_push(&out);
    }
    int rc, c = (int)n;
    switch (which) {
    case 0: rc = MPI_Bcast(out.mpi, c, vec, root, MPI_COMM_WORLD); break;
    case 1: rc = MPI_Allgather(in.mpi, c, vec, out.mpi, c, vec, MPI_COMM_WORLD); break;
    case 2: rc = MPI_Alltoall(in.mpi, c, vec, out.mpi, c, vec, MPI_COMM_WORLD); break;
    case 3: rc = MPI_Gather(in.mpi, c, vec, out.mpi, c, vec, root, MPI_COMM_WORLD); break;
    default: rc = MPI_Scatter(in.mpi, c, vec, out.mpi, c, vec, root, MPI_COMM_WORLD); break;
    }
    if (st_ok(rc, label) && (which != 3 || me == root)) {
        float *exp = malloc(rfloats * 4 + 4);
        memset(exp, ST_POISON, rfloats * 4);
        for (size_t k = 0; k < rfloats; k++) {
            if (!in_vector(k))
                continue;
            size_t blk = k / per_rank, off = k % per_rank;
            int src = 0;
            size_t idx = k;
            switch (which) {
            case 0: src = root; break;
            case 1:
            case 3: src = (int)blk; idx = off; break;
            case 2: src = (int)blk; idx = (size_t)me * per_rank + off; break;
            default: src = root; idx = (size_t)me * per_rank + k; break;
            }
            st_store(ft, exp, k, st_gen(ft, OP_SUM, seed, src, idx));
        }
        st_pull(&out);
        /* bytes, so that the holes must keep their poison */
        if (memcmp(out.host, exp, rfloats * 4) != 0)
            st_fail("%s: result or holes differ", label);
        else
            st_pass();
        free(exp);
    }
    st_buf_free(&in);
    st_buf_free(&out);
}

/* ---- value-index pairs with MAXLOC / MINLOC ----------------------------- */

struct float_int { float v; int i; };
struct double_int { double v; int i; };
struct two_int { int v; int i; };

static double pair_value(uint64_t seed, int r, size_t k)
{
    return (double)(st_hash(st_hash(seed, (uint64_t)r), k) % 5); /* ties are frequent */
}

static void t_loc(int kind, int maxloc, size_t n, int nonblocking)
{
    const char *tn[] = {"FLOAT_INT", "DOUBLE_INT", "2INT"};
    MPI_Datatype types[] = {MPI_FLOAT_INT, MPI_DOUBLE_INT, MPI_2INT};
    size_t sz[] = {sizeof(struct float_int), sizeof(struct double_int), sizeof(struct two_int)};
    char label[160];
    uint64_t seed = next_seed++;
    snprintf(label, sizeof label, "%sAllreduce %s %s n=%zu", nonblocking ? "I" : "", tn[kind],
             maxloc ? "MAXLOC" : "MINLOC", n);
    struct st_buf in = st_buf_new(n * sz[kind]), out = st_buf_new(n * sz[kind]);
    for (size_t k = 0; k < n; k++) {
        double v = pair_value(seed, st.rank, k);
        char *p = (char *)in.host + k * sz[kind];
        if (kind == 0) *(struct float_int *)p = (struct float_int){(float)v, st.rank * 10};
        if (kind == 1) *(struct double_int *)p = (struct double_int){v, st.rank * 10};
        if (kind == 2) *(struct two_int *)p = (struct two_int){(int)v, st.rank * 10};
    }
    st_push(&in);
    st_poison(&out);
    MPI_Op op = maxloc ? MPI_MAXLOC : MPI_MINLOC;
    int rc;
    if (nonblocking) {
        MPI_Request req;
        rc = MPI_Iallreduce(in.mpi, out.mpi, (int)n, types[kind], op, MPI_COMM_WORLD, &req);
        if (rc == MPI_SUCCESS)
            rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else {
        rc = MPI_Allreduce(in.mpi, out.mpi, (int)n, types[kind], op, MPI_COMM_WORLD);
    }
    if (st_ok(rc, label)) {
        st_pull(&out);
        size_t bad = 0;
        for (size_t k = 0; k < n; k++) {
            double best = pair_value(seed, 0, k);
            int at = 0;
            for (int r = 1; r < st.size; r++) {
                double v = pair_value(seed, r, k);
                if (maxloc ? v > best : v < best) {
                    best = v;
                    at = r;
                }
            }
            char *p = (char *)out.host + k * sz[kind];
            double gv = kind == 0 ? ((struct float_int *)p)->v
                        : kind == 1 ? ((struct double_int *)p)->v : ((struct two_int *)p)->v;
            int gi = kind == 0 ? ((struct float_int *)p)->i
                     : kind == 1 ? ((struct double_int *)p)->i : ((struct two_int *)p)->i;
            if (gv != best || gi != at * 10) {
                if (!bad)
                    st_fail("%s: [%zu] got (%g, %d) want (%g, %d)", label, k, gv, gi, best,
                            at * 10);
                bad++;
            }
        }
        if (!bad)
            st_pass();
    }
    st_buf_free(&in);
    st_buf_free(&out);
}

/* ---- communicators ------------------------------------------------------ */

static void allreduce_on(MPI_Comm comm, const char *what, size_t n, uint64_t seed)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    const struct st_type *t = &st_types[2]; /* INT */
    struct st_buf in = st_buf_new(n * 4), out = st_buf_new(n * 4);
    st_fill(t, OP_SUM, seed, me, 0, in.host, n);
    st_push(&in);
    st_poison(&out);
    if (st_ok(MPI_Allreduce(in.mpi, out.mpi, (int)n, MPI_INT, MPI_SUM, comm), what)) {
        int *exp = malloc(n * 4 + 4);
        for (size_t i = 0; i < n; i++)
            st_store(t, exp, i, st_reduce_elem(t, OP_SUM, seed, np, i));
        st_pull(&out);
        st_compare(what, t, out.host, exp, n);
        free(exp);
    }
    st_buf_free(&in);
    st_buf_free(&out);
}

static void t_comm_churn(int rounds)
{
    char what[120];
    for (int k = 0; k < rounds; k++) {
        /* alternately a duplicate and splits of changing shape, freed at once */
        MPI_Comm c;
        int parts = 1 + k % 3;
        if (k % 2 == 0)
            MPI_Comm_dup(MPI_COMM_WORLD, &c);
        else
            MPI_Comm_split(MPI_COMM_WORLD, st.rank % parts, (k % 4 == 1) ? -st.rank : st.rank, &c);
        int np;
        MPI_Comm_size(c, &np);
        snprintf(what, sizeof what, "Allreduce on communicator %d of the churn (size %d)", k, np);
        allreduce_on(c, what, (size_t)(1 + k * 37), 20000 + (uint64_t)k);
        MPI_Comm_free(&c);
        if (c != MPI_COMM_NULL)
            st_fail("MPI_Comm_free did not set the handle to MPI_COMM_NULL");
    }
    MPI_Group world_group, half;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    int first_half = (st.size + 1) / 2, range[1][3] = {{0, first_half - 1, 1}};
    MPI_Group_range_incl(world_group, 1, range, &half);
    MPI_Comm created;
    MPI_Comm_create(MPI_COMM_WORLD, half, &created);
    if (created != MPI_COMM_NULL) {
        allreduce_on(created, "Allreduce on MPI_Comm_create's communicator", 100, 30001);
        MPI_Comm_free(&created);
    }
    MPI_Group_free(&half);
    MPI_Group_free(&world_group);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    allreduce_on(node, "Allreduce on the shared-memory split", 7919, 30002);
    MPI_Comm_free(&node);
    allreduce_on(MPI_COMM_SELF, "Allreduce on MPI_COMM_SELF", 7919, 30003);
}

/* Two halves joined by an intercommunicator: an allreduce there gives each
 * side the reduction of the other side's data. */
static void t_intercomm(void)
{
    if (st.size < 2)
        return;
    int color = st.rank % 2;
    MPI_Comm local, inter;
    MPI_Comm_split(MPI_COMM_WORLD, color, st.rank, &local);
    MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - color, 99, &inter);
    int x[5], y[5], others = 0, want = 0;
    for (int i = 0; i < 5; i++)
        x[i] = st.rank + 1 + i;
    for (int r = 1 - color; r < st.size; r += 2) {
        want += r + 1;
        others++;
    }
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    if (st_ok(MPI_Allreduce(x, y, 5, MPI_INT, MPI_SUM, inter), "Allreduce on an intercommunicator")) {
        if (y[0] != want || y[4] != want + 4 * others)
            st_fail("Allreduce on an intercommunicator: got %d..%d, want %d..%d", y[0], y[4], want,
                    want + 4 * others);
        else
            st_pass();
    }
    MPI_Comm_free(&inter);
    MPI_Comm_free(&local);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "coll_staged");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Datatype triple, vec;
    MPI_Type_contiguous(3, MPI_INT, &triple);
    MPI_Type_commit(&triple);
    MPI_Type_vector(2, 3, 5, MPI_FLOAT, &vec);
    MPI_Type_commit(&vec);
    MPI_Op tsum;
    MPI_Op_create(triple_sum, 1, &tsum);
    const size_t sizes[] = {0, 1, 7919};
    for (int s = 0; s < 3; s++) {
        for (int which = 0; which < 4; which++)
            t_triples(triple, tsum, sizes[s], which);
        for (int which = 0; which < 5; which++)
            t_vectors(vec, sizes[s], which);
        for (int kind = 0; kind < 3; kind++)
            t_loc(kind, (kind + s) % 2, sizes[s], s == 1);
    }
    if (st.large) {
        t_triples(triple, tsum, st.large / 4, 0);
        t_vectors(vec, st.large / 8, 2);
        t_loc(0, 1, st.large, 0);
    }
    t_comm_churn(24);
    t_intercomm();
    MPI_Op_free(&tsum);
    MPI_Type_free(&triple);
    MPI_Type_free(&vec);
    return st_finish();
}

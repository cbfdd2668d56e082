/* The nonblocking v-forms: MPI_Iallgatherv (uneven blocks, and equal
 * blocks packed in rank order), MPI_Ialltoallv, MPI_Igatherv and
 * MPI_Iscatterv with uneven and zero counts, displacements in reverse rank
 * order with gaps (which must keep the poison), in place; several in
 * flight at once with an MPI_Ibarrier and a point-to-point pair, completed
 * by Waitall, Waitany, Waitsome, Testall, Testany or Wait in reverse
 * order; every datatype, sizes 0, 1, 7919 and a large one. Then a
 * nonblocking allreduce that rank 0 starts before an MPI_Ibarrier on
 * another communicator, which the other ranks complete before they start
 * theirs: rank 0's wait for the allreduce must let the barrier progress
 * (skipped with --host-test-mode: a shim's host test mode runs nonblocking
 * collectives at once). An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GAP 5          /* elements between blocks */
#define MOVE OP_BXOR
#define STRIDE ((size_t)1 << 20) /* element index offset per destination */
#define MAXOPS 8

static uint64_t next_seed = 13000;
static unsigned turn;

/* One operation in flight: its output and the bytes it must hold. */
struct pend {
    char label[160];
    struct st_buf in, out;
    char *exp;  /* NULL: nothing to check at this rank */
    size_t bytes;
    int *arrays[4]; /* counts/displacements MPI may read until completion */
};

static int count_of(size_t n, int a, int b, int sym)
{
    if (n == 0)
        return (a + b) % 2;
    if (n > 1 && (sym ? (a + b) % 4 == 1 : (a * 7 + b) % 5 == 1))
        return 0;
    return (int)n + (sym ? (a + b) % 5 : (a * 7 + b * 3) % 5);
}

/* Reverse-order displacements with gaps; the buffer's element span. */
static size_t layout(int np, const int *counts, int *displs)
{
    size_t at = GAP;
    for (int r = np - 1; r >= 0; r--) {
        displs[r] = (int)at;
        at += (size_t)counts[r] + GAP;
    }
    return at;
}

static int *ints(int np)
{
    return malloc(sizeof(int) * (size_t)(np > 0 ? np : 1));
}

static void pend_free(struct pend *p)
{
    st_buf_free(&p->in);
    st_buf_free(&p->out);
    free(p->exp);
    for (int k = 0; k < 4; k++)
        free(p->arrays[k]);
}

/* Iallgatherv; `packed`: equal counts packed in rank order (gpucoll's
 * all_gather), else uneven with gaps. */
static MPI_Request s_allgatherv(struct pend *p, MPI_Comm comm, const struct st_type *t, size_t n,
                                int inplace, int packed)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    size_t sz = (size_t)t->size;
    snprintf(p->label, sizeof p->label, "Iallgatherv %s n=%zu%s%s", t->name, n,
             packed ? " packed" : "", inplace ? " in-place" : "");
    int *counts = p->arrays[0] = ints(np), *displs = p->arrays[1] = ints(np);
    size_t span;
    if (packed) {
        for (int r = 0; r < np; r++) {
            counts[r] = (int)n;
            displs[r] = (int)((size_t)r * n);
        }
        span = n * (size_t)np;
    } else {
        for (int r = 0; r < np; r++)
            counts[r] = count_of(n, r, 0, 1);
        span = layout(np, counts, displs);
    }
    p->in = st_input(t, MOVE, seed, me, 0, (size_t)counts[me]);
    p->out = st_buf_poisoned(span * sz);
    if (inplace)
        st_place(&p->out, (size_t)displs[me] * sz, p->in.host, p->in.bytes);
    p->bytes = span * sz;
    p->exp = malloc(p->bytes + 1);
    memset(p->exp, ST_POISON, p->bytes);
    for (int r = 0; r < np; r++)
        st_fill(t, MOVE, seed, r, 0, p->exp + (size_t)displs[r] * sz, (size_t)counts[r]);
    MPI_Request req = MPI_REQUEST_NULL;
    st_ok(MPI_Iallgatherv(inplace ? MPI_IN_PLACE : p->in.mpi, counts[me], t->type, p->out.mpi,
                          counts, displs, t->type, comm, &req),
          p->label);
    return req;
}

static MPI_Request s_gatherv(struct pend *p, MPI_Comm comm, const struct st_type *t, size_t n,
                             int inplace)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    int root = (int)(turn++ % (unsigned)np), am_root = me == root, ip = inplace && am_root;
    size_t sz = (size_t)t->size;
    snprintf(p->label, sizeof p->label, "Igatherv %s n=%zu%s root=%d", t->name, n,
             inplace ? " in-place" : "", root);
    int *counts = p->arrays[0] = ints(np), *displs = p->arrays[1] = ints(np);
    for (int r = 0; r < np; r++)
        counts[r] = count_of(n, r, root, 0);
    size_t span = layout(np, counts, displs);
    p->in = st_input(t, MOVE, seed, me, 0, (size_t)counts[me]);
    p->out = st_buf_poisoned(am_root ? span * sz : 0);
    if (ip)
        st_place(&p->out, (size_t)displs[me] * sz, p->in.host, p->in.bytes);
    if (am_root) {
        p->bytes = span * sz;
        p->exp = malloc(p->bytes + 1);
        memset(p->exp, ST_POISON, p->bytes);
        for (int r = 0; r < np; r++)
            st_fill(t, MOVE, seed, r, 0, p->exp + (size_t)displs[r] * sz, (size_t)counts[r]);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    st_ok(MPI_Igatherv(ip ? MPI_IN_PLACE : p->in.mpi, counts[me], t->type,
                       am_root ? p->out.mpi : NULL, counts, displs, t->type, root, comm, &req),
          p->label);
    return req;
}

static MPI_Request s_scatterv(struct pend *p, MPI_Comm comm, const struct st_type *t, size_t n,
                              int inplace)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    int root = (int)(turn++ % (unsigned)np), am_root = me == root, ip = inplace && am_root;
    size_t sz = (size_t)t->size;
    snprintf(p->label, sizeof p->label, "Iscatterv %s n=%zu%s root=%d", t->name, n,
             inplace ? " in-place" : "", root);
    int *counts = p->arrays[0] = ints(np), *displs = p->arrays[1] = ints(np);
    for (int r = 0; r < np; r++)
        counts[r] = count_of(n, root, r, 0);
    size_t span = layout(np, counts, displs);
    p->in = st_buf_new(am_root ? span * sz : 0);
    if (am_root) {
        memset(p->in.host, 0, span * sz);
        for (int r = 0; r < np; r++)
            st_fill(t, MOVE, seed, root, (size_t)r * STRIDE,
                    (char *)p->in.host + (size_t)displs[r] * sz, (size_t)counts[r]);
        st_push(&p->in);
    }
    size_t mine = (size_t)counts[me];
    p->out = st_buf_poisoned((mine + GAP) * sz);
    if (!ip) {
        p->bytes = (mine + GAP) * sz;
        p->exp = malloc(p->bytes);
        memset(p->exp, ST_POISON, p->bytes);
        st_fill(t, MOVE, seed, root, (size_t)me * STRIDE, p->exp, mine);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    st_ok(MPI_Iscatterv(am_root ? p->in.mpi : NULL, counts, displs, t->type,
                        ip ? MPI_IN_PLACE : p->out.mpi, counts[me], t->type, root, comm, &req),
          p->label);
    return req;
}

static MPI_Request s_alltoallv(struct pend *p, MPI_Comm comm, const struct st_type *t, size_t n,
                               int inplace)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    size_t sz = (size_t)t->size;
    snprintf(p->label, sizeof p->label, "Ialltoallv %s n=%zu%s", t->name, n,
             inplace ? " in-place" : "");
    int *sc = p->arrays[0] = ints(np), *sd = p->arrays[1] = ints(np);
    int *rc = p->arrays[2] = ints(np), *rd = p->arrays[3] = ints(np);
    for (int r = 0; r < np; r++) {
        sc[r] = count_of(n, me, r, inplace);
        rc[r] = count_of(n, r, me, inplace);
    }
    size_t sspan = layout(np, sc, sd), rspan = layout(np, rc, rd);
    p->in = st_buf_new(sspan * sz);
    memset(p->in.host, 0, sspan * sz);
    for (int r = 0; r < np; r++)
        st_fill(t, MOVE, seed, me, (size_t)r * STRIDE, (char *)p->in.host + (size_t)sd[r] * sz,
                (size_t)sc[r]);
    st_push(&p->in);
    p->out = st_buf_poisoned(rspan * sz);
    if (inplace) {
        for (int r = 0; r < np; r++)
            st_fill(t, MOVE, seed, me, (size_t)r * STRIDE,
                    (char *)p->out.host + (size_t)rd[r] * sz, (size_t)rc[r]);
        st_push(&p->out);
    }
    p->bytes = rspan * sz;
    p->exp = malloc(p->bytes + 1);
    memset(p->exp, ST_POISON, p->bytes);
    for (int r = 0; r < np; r++)
        st_fill(t, MOVE, seed, r, (size_t)me * STRIDE, p->exp + (size_t)rd[r] * sz,
                (size_t)rc[r]);
    MPI_Request req = MPI_REQUEST_NULL;
    st_ok(MPI_Ialltoallv(inplace ? MPI_IN_PLACE : p->in.mpi, sc, sd, t->type, p->out.mpi, rc, rd,
                         t->type, comm, &req),
          p->label);
    return req;
}

/* Complete all of `reqs` by one method of several. */
static void complete_all(int nreq, MPI_Request *reqs, const char *what)
{
    int method = (int)(turn++ % 5), rc = MPI_SUCCESS, left = nreq;
    char label[200];
    static const char *names[5] = {"Waitall", "Waitany", "Waitsome", "Testall", "Wait reversed"};
    snprintf(label, sizeof label, "%s by %s", what, names[method]);
    switch (method) {
    case 0:
        rc = MPI_Waitall(nreq, reqs, MPI_STATUSES_IGNORE);
        break;
    case 1:
        while (left > 0 && rc == MPI_SUCCESS) {
            int idx;
            rc = MPI_Waitany(nreq, reqs, &idx, MPI_STATUS_IGNORE);
            if (idx == MPI_UNDEFINED)
                break;
            left--;
        }
        break;
    case 2:
        while (left > 0 && rc == MPI_SUCCESS) {
            int out, idx[MAXOPS + 2];
            rc = MPI_Waitsome(nreq, reqs, &out, idx, MPI_STATUSES_IGNORE);
            if (out == MPI_UNDEFINED)
                break;
            left -= out;
        }
        break;
    case 3: {
        int flag = 0;
        while (!flag && rc == MPI_SUCCESS)
            rc = MPI_Testall(nreq, reqs, &flag, MPI_STATUSES_IGNORE);
        break;
    }
    default:
        for (int k = nreq - 1; k >= 0 && rc == MPI_SUCCESS; k--)
            rc = MPI_Wait(&reqs[k], MPI_STATUS_IGNORE);
        break;
    }
    if (!st_ok(rc, label))
        return;
    for (int k = 0; k < nreq; k++)
        if (reqs[k] != MPI_REQUEST_NULL) {
            st_fail("%s: request %d not MPI_REQUEST_NULL after completion", label, k);
            return;
        }
    st_pass();
}

static void round_of(MPI_Comm comm, const struct st_type *t, size_t n, int inplace)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    struct pend ps[MAXOPS];
    memset(ps, 0, sizeof ps);
    MPI_Request reqs[MAXOPS + 3];
    int k = 0;
    reqs[k] = s_allgatherv(&ps[k], comm, t, n, inplace, 0), k++;
    reqs[k] = s_allgatherv(&ps[k], comm, t, n, !inplace, 1), k++;
    reqs[k] = s_gatherv(&ps[k], comm, t, n, inplace), k++;
    reqs[k] = s_scatterv(&ps[k], comm, t, n, !inplace), k++;
    /* Open MPI 4.1.4's MPI_Ialltoallv in place mixes up blocks above its
     * eager size on 4 ranks (without any shim): in place for small blocks */
    reqs[k] = s_alltoallv(&ps[k], comm, t, n, inplace && n * (size_t)t->size <= 2048), k++;
    int nops = k;
    st_ok(MPI_Ibarrier(comm, &reqs[k++]), "Ibarrier");
    /* a point-to-point pair in the same arrays */
    int token = me * 100 + 7, got = -1;
    st_ok(MPI_Irecv(&got, 1, MPI_INT, (me + np - 1) % np, 55, comm, &reqs[k++]), "Irecv");
    st_ok(MPI_Isend(&token, 1, MPI_INT, (me + 1) % np, 55, comm, &reqs[k++]), "Isend");
    char what[120];
    snprintf(what, sizeof what, "round %s n=%zu%s", t->name, n, inplace ? " in-place" : "");
    complete_all(k, reqs, what);
    if (got == ((me + np - 1) % np) * 100 + 7)
        st_pass();
    else
        st_fail("%s: Irecv got %d", what, got);
    for (int i = 0; i < nops; i++) {
        struct pend *p = &ps[i];
        if (p->exp) {
            st_pull(&p->out);
            if (memcmp(p->out.host, p->exp, p->bytes) == 0) {
                st_pass();
            } else {
                size_t b = 0;
                while (((char *)p->out.host)[b] == p->exp[b])
                    b++;
                st_fail("%s: byte %zu of %zu differs: got 0x%02x want 0x%02x", p->label, b,
                        p->bytes, ((unsigned char *)p->out.host)[b], (unsigned char)p->exp[b]);
            }
        }
        pend_free(p);
    }
}

/* Rank 0: Iallreduce on `a`, Ibarrier on `b`, wait for both. The others:
 * Ibarrier on `b`, wait, then Iallreduce on `a`. */
static void t_barrier_first(MPI_Comm a, MPI_Comm b, size_t n)
{
    int me, np;
    MPI_Comm_rank(a, &me);
    MPI_Comm_size(a, &np);
    const struct st_type *t = st_type_named("DOUBLE");
    uint64_t seed = next_seed++;
    char label[120];
    snprintf(label, sizeof label, "Iallreduce n=%zu around an Ibarrier rank 0 joins late", n);
    struct st_buf in = st_input(t, OP_SUM, seed, me, 0, n), out = st_buf_poisoned(n * 8);
    MPI_Request ra = MPI_REQUEST_NULL, rb = MPI_REQUEST_NULL;
    int rc;
    if (me == 0) {
        rc = MPI_Iallreduce(in.mpi, out.mpi, (int)n, MPI_DOUBLE, MPI_SUM, a, &ra);
        rc |= MPI_Ibarrier(b, &rb);
        rc |= MPI_Wait(&ra, MPI_STATUS_IGNORE);
        rc |= MPI_Wait(&rb, MPI_STATUS_IGNORE);
    } else {
        rc = MPI_Ibarrier(b, &rb);
        rc |= MPI_Wait(&rb, MPI_STATUS_IGNORE);
        rc |= MPI_Iallreduce(in.mpi, out.mpi, (int)n, MPI_DOUBLE, MPI_SUM, a, &ra);
        rc |= MPI_Wait(&ra, MPI_STATUS_IGNORE);
    }
    if (st_ok(rc, label)) {
        char *exp = malloc(n * 8 + 1);
        for (size_t i = 0; i < n; i++)
            st_store(t, exp, i, st_reduce_elem(t, OP_SUM, seed, np, i));
        st_pull(&out);
        st_compare(label, t, out.host, exp, n);
        free(exp);
    }
    st_buf_free(&in);
    st_buf_free(&out);
}

int main(int argc, char **argv)
{
    int host_test = 0;
    for (int k = 1; k < argc; k++)
        if (!strcmp(argv[k], "--host-test-mode"))
            host_test = 1;
    st_init(&argc, &argv, "coll_nonblocking_v");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    const size_t sizes[] = {0, 1, 7919};
    for (int k = 0; k < st_ntypes; k += st.quick ? 3 : 1)
        for (int s = 0; s < 3; s++)
            round_of(MPI_COMM_WORLD, &st_types[k], sizes[s], (k + s) % 2);
    MPI_Comm split;
    MPI_Comm_split(MPI_COMM_WORLD, st.rank % 2, -st.rank, &split);
    MPI_Comm_set_errhandler(split, MPI_ERRORS_RETURN);
    for (int k = 0; k < st_ntypes; k += 4)
        round_of(split, &st_types[k], 7919, k % 8 == 0);
    MPI_Comm_free(&split);
    if (st.large) {
        round_of(MPI_COMM_WORLD, st_type_named("FLOAT"), st.large, 0);
        round_of(MPI_COMM_WORLD, st_type_named("BYTE"), st.large, 1);
    }
    if (!host_test) {
        MPI_Comm other;
        MPI_Comm_dup(MPI_COMM_WORLD, &other);
        t_barrier_first(MPI_COMM_WORLD, other, 7919);
        t_barrier_first(MPI_COMM_WORLD, other, 1);
        MPI_Comm_free(&other);
    }
    return st_finish();
}

/* Communicators busy at the same time, started in different orders on
 * different ranks (MPI allows any order across communicators; only the
 * order on each communicator must agree):
 *   - even ranks start MPI_Iallreduce on c1 then c2, odd ranks on c2 then
 *     c1, then MPI_Waitall (and the same with three communicators: two
 *     duplicates and a split, each rank starting them in its own rotation);
 *   - mixed collectives: MPI_Ibcast on c1 and MPI_Iallgather on c2 crossed;
 *   - a blocking call between: even ranks start MPI_Iallreduce on c1, make
 *     a blocking MPI_Allreduce on c2, then wait; odd ranks make the blocking
 *     call first and start c1's after it;
 *   - MPI_Barrier on a communicator with a nonblocking collective of its own
 *     in flight (the barrier does not wait for it; it completes at MPI_Wait).
 * Everything runs twice: on fresh communicators, then after a blocking
 * collective on each (a collectives library may set a communicator up at
 * its first blocking collective).
 * Asks for MPI_THREAD_MULTIPLE (with gpucoll's host backend, nonblocking
 * collectives then run on a thread of their own). An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRIDE_ALLGATHER ((size_t)1 << 20)

static uint64_t next_seed = 20000;

struct red {
    struct st_buf in, out;
    uint64_t seed;
    size_t n;
    const struct st_type *t;
    int op;
    MPI_Comm comm;
    char label[160];
};

static void red_init(struct red *r, const struct st_type *t, int op, size_t n, MPI_Comm comm,
                     const char *what)
{
    r->t = t;
    r->op = op;
    r->n = n;
    r->comm = comm;
    r->seed = next_seed++;
    r->in = st_input(t, op, r->seed, st.rank, 0, n);
    r->out = st_buf_poisoned(n * t->size + 1);
    snprintf(r->label, sizeof r->label, "%s %s %s n=%zu", what, t->name, st_op_names[op], n);
}

static int red_start(struct red *r, MPI_Request *q)
{
    return MPI_Iallreduce(r->in.mpi, r->out.mpi, (int)r->n, r->t->type, st_ops[r->op], r->comm, q);
}

/* The result of a reduction over the ranks of r->comm (world ranks `ranks`). */
static void red_check(struct red *r)
{
    int np;
    MPI_Comm_size(r->comm, &np);
    MPI_Group g, wg;
    MPI_Comm_group(r->comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int *local = malloc(sizeof(int) * (size_t)np), *world = malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        local[i] = i;
    MPI_Group_translate_ranks(g, np, local, wg, world);
    char *exp = malloc(r->n * r->t->size + 1);
    for (size_t i = 0; i < r->n; i++) {
        st_val acc = st_gen(r->t, r->op, r->seed, world[0], i);
        for (int k = 1; k < np; k++)
            acc = st_combine(r->t, r->op, acc, st_gen(r->t, r->op, r->seed, world[k], i));
        st_store(r->t, exp, i, acc);
    }
    st_pull(&r->out);
    st_compare(r->label, r->t, r->out.host, exp, r->n);
    free(exp);
    free(local);
    free(world);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    st_buf_free(&r->in);
    st_buf_free(&r->out);
}

/* k communicators, started in rotation (rank + j) % k on each rank. */
static void crossed_allreduce(MPI_Comm *comms, int k, const struct st_type *t, int op, size_t n,
                              const char *what)
{
    struct red r[3];
    MPI_Request q[3];
    for (int j = 0; j < k; j++) {
        char label[120];
        snprintf(label, sizeof label, "%s comm %d of %d", what, j, k);
        red_init(&r[j], t, op, n, comms[j], label);
    }
    int ok = 1;
    for (int j = 0; j < k; j++) {
        int c = (st.rank + j) % k;
        ok &= st_ok(red_start(&r[c], &q[c]), r[c].label);
    }
    if (ok && st_ok(MPI_Waitall(k, q, MPI_STATUSES_IGNORE), what)) {
        for (int j = 0; j < k; j++)
            red_check(&r[j]);
    } else {
        for (int j = 0; j < k; j++) {
            st_buf_free(&r[j].in);
            st_buf_free(&r[j].out);
        }
    }
}

/* MPI_Ibcast on c1 and MPI_Iallgather on c2, started in opposite orders. */
static void crossed_mixed(MPI_Comm c1, MPI_Comm c2, size_t n)
{
    const struct st_type *t = st_type_named("DOUBLE");
    uint64_t seed = next_seed++;
    int root = st.size - 1;
    struct st_buf b = st.rank == root ? st_input(t, OP_BXOR, seed, root, 0, n)
                                      : st_buf_poisoned(n * t->size + 1);
    struct st_buf s = st_input(t, OP_BXOR, seed, st.rank, STRIDE_ALLGATHER, n);
    struct st_buf g = st_buf_poisoned(n * (size_t)st.size * t->size + 1);
    MPI_Request q[2];
    char label[120];
    snprintf(label, sizeof label, "crossed Ibcast/Iallgather n=%zu", n);
    int rc1, rc2;
    if (st.rank % 2 == 0) {
        rc1 = MPI_Ibcast(b.mpi, (int)n, t->type, root, c1, &q[0]);
        rc2 = MPI_Iallgather(s.mpi, (int)n, t->type, g.mpi, (int)n, t->type, c2, &q[1]);
    } else {
        rc2 = MPI_Iallgather(s.mpi, (int)n, t->type, g.mpi, (int)n, t->type, c2, &q[1]);
        rc1 = MPI_Ibcast(b.mpi, (int)n, t->type, root, c1, &q[0]);
    }
    if (st_ok(rc1, label) && st_ok(rc2, label) &&
        st_ok(MPI_Waitall(2, q, MPI_STATUSES_IGNORE), label)) {
        char *exp = malloc(n * (size_t)st.size * t->size + 1);
        st_fill(t, OP_BXOR, seed, root, 0, exp, n);
        st_pull(&b);
        st_compare(label, t, b.host, exp, n);
        for (int r = 0; r < st.size; r++)
            st_fill(t, OP_BXOR, seed, r, STRIDE_ALLGATHER, exp + (size_t)r * n * t->size, n);
        st_pull(&g);
        st_compare(label, t, g.host, exp, n * (size_t)st.size);
        free(exp);
    }
    st_buf_free(&b);
    st_buf_free(&s);
    st_buf_free(&g);
}

/* A blocking collective on c2 between the start and the wait of c1's. */
static void blocking_between(MPI_Comm c1, MPI_Comm c2, size_t n)
{
    const struct st_type *t = st_type_named("INT");
    struct red a, b;
    red_init(&a, t, OP_SUM, n, c1, "nonblocking across a blocking call, c1");
    red_init(&b, t, OP_MAX, n, c2, "blocking call between, c2");
    MPI_Request q = MPI_REQUEST_NULL;
    int ok = 1;
    if (st.rank % 2 == 0) {
        ok &= st_ok(red_start(&a, &q), a.label);
        ok &= st_ok(MPI_Allreduce(b.in.mpi, b.out.mpi, (int)n, t->type, MPI_MAX, c2), b.label);
    } else {
        ok &= st_ok(MPI_Allreduce(b.in.mpi, b.out.mpi, (int)n, t->type, MPI_MAX, c2), b.label);
        ok &= st_ok(red_start(&a, &q), a.label);
    }
    ok &= st_ok(MPI_Wait(&q, MPI_STATUS_IGNORE), a.label);
    if (ok) {
        red_check(&a);
        red_check(&b);
    }
}

/* MPI_Barrier on c1 while c1's own nonblocking collective is in flight. */
static void barrier_in_flight(MPI_Comm c1, size_t n)
{
    struct red a;
    red_init(&a, st_type_named("FLOAT"), OP_SUM, n, c1, "Iallreduce across MPI_Barrier");
    MPI_Request q;
    if (st_ok(red_start(&a, &q), a.label) && st_ok(MPI_Barrier(c1), "MPI_Barrier in flight") &&
        st_ok(MPI_Wait(&q, MPI_STATUS_IGNORE), a.label))
        red_check(&a);
}

static void run_all(MPI_Comm *c, size_t n, int ntypes, const char **types, const int *ops)
{
    for (int k = 0; k < ntypes; k++) {
        const struct st_type *t = st_type_named(types[k]);
        crossed_allreduce(c, 2, t, ops[k], n, "crossed Iallreduce x2");
        crossed_allreduce(c, 3, t, ops[k], n, "crossed Iallreduce x3");
    }
    crossed_mixed(c[0], c[1], n);
    barrier_in_flight(c[2], n);
}

int main(int argc, char **argv)
{
    st_init_thread(&argc, &argv, "crossed", MPI_THREAD_MULTIPLE);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (st.rank == 0 && st.thread_level < MPI_THREAD_MULTIPLE)
        printf("crossed: MPI provides thread level %d, not MPI_THREAD_MULTIPLE\n",
               st.thread_level);
    MPI_Comm c[3];
    MPI_Comm_dup(MPI_COMM_WORLD, &c[0]);
    MPI_Comm_dup(MPI_COMM_WORLD, &c[1]);
    /* every rank, in reverse order */
    MPI_Comm_split(MPI_COMM_WORLD, 0, st.size - st.rank, &c[2]);
    size_t sizes[] = {1, 7919, st.large};
    const char *types[] = {"INT", "DOUBLE", "UINT8_T"};
    int ops[] = {OP_SUM, OP_MAX, OP_BOR};
    int nsizes = st.large ? 3 : 2, ntypes = st.quick ? 1 : 3;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            /* the first blocking collective on each, on the same buffers */
            for (int j = 0; j < 3; j++) {
                struct red w;
                red_init(&w, st_type_named("INT"), OP_SUM, 5, c[j], "first blocking Allreduce");
                if (st_ok(MPI_Allreduce(w.in.mpi, w.out.mpi, 5, MPI_INT, MPI_SUM, c[j]), w.label))
                    red_check(&w);
            }
        }
        for (int s = 0; s < (pass ? nsizes : 1); s++)
            run_all(c, sizes[s], ntypes, types, ops);
    }
    for (int s = 0; s < nsizes; s++)
        blocking_between(c[0], c[1], sizes[s]);
    for (int j = 0; j < 3; j++)
        MPI_Comm_free(&c[j]);
    return st_finish();
}

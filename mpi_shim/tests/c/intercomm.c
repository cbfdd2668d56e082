/* Every collective on intercommunicators: both groups, MPI_ROOT and
 * MPI_PROC_NULL at each root (both directions), the v-forms with arrays of
 * the remote group's size, the nonblocking forms, several datatypes and
 * the sizes 0, 1, 7 and 613. Two intercommunicators: world rank 0 against
 * the rest (local and remote sizes differ: 1+2 at 3 ranks, 1+3 at 4) and
 * even against odd world ranks (a non-contiguous mapping). Buffers a rank
 * does not use hold poison that must stay. Expected values are computed
 * locally from every rank's inputs (a pure function of seed, world rank and
 * index), exactly. An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GAP 3
#define STRIDE ((size_t)1 << 20) /* element index offset per destination */

static MPI_Comm inter;
static int group, lr, ls, rs;
static int members[2][64], nmembers[2];
static uint64_t next_seed = 9000;
static char layout_name[32];

static int remote_world(int r) { return members[1 - group][r]; }

/* The root's arguments when the root is local rank `rl` of group `g`:
 * MPI_ROOT there, MPI_PROC_NULL for its group's other ranks, `rl` in the
 * other group. Sets *is_root / *is_null. */
static int root_arg(int g, int rl, int *is_root, int *is_null)
{
    *is_root = group == g && lr == rl;
    *is_null = group == g && lr != rl;
    if (group != g)
        return rl;
    return *is_root ? MPI_ROOT : MPI_PROC_NULL;
}

static int wait_or(int rc, MPI_Request *r)
{
    if (rc != MPI_SUCCESS)
        return rc;
    return MPI_Wait(r, MPI_STATUS_IGNORE);
}

static int me_world(void) { return st.rank; }

/* The reduction over the remote group of element i of each rank's input. */
static st_val remote_reduce(const struct st_type *t, int op, uint64_t seed, size_t i)
{
    st_val acc = st_gen(t, op, seed, remote_world(0), i);
    for (int r = 1; r < rs; r++)
        acc = st_combine(t, op, acc, st_gen(t, op, seed, remote_world(r), i));
    return acc;
}

static void check_range(const char *label, const struct st_type *t, struct st_buf *b,
                        const void *exp, size_t n)
{
    st_pull(b);
    st_compare(label, t, b->host, exp, n);
}

static void check_poison(const char *label, struct st_buf *b)
{
    st_pull(b);
    st_untouched(label, b->host, b->bytes);
}

static void t_allreduce(const struct st_type *t, int op, size_t n, int nb)
{
    uint64_t seed = next_seed++;
    struct st_buf s = st_input(t, op, seed, me_world(), 0, n), d = st_buf_poisoned(n * t->size);
    char label[160];
    snprintf(label, sizeof label, "%s %sAllreduce %s %s n=%zu", layout_name, nb ? "I" : "",
             t->name, st_op_names[op], n);
    MPI_Request r;
    int rc = nb ? wait_or(MPI_Iallreduce(s.mpi, d.mpi, (int)n, t->type, st_ops[op], inter, &r), &r)
                : MPI_Allreduce(s.mpi, d.mpi, (int)n, t->type, st_ops[op], inter);
    if (st_ok(rc, label)) {
        char *exp = malloc(n * t->size + 1);
        for (size_t i = 0; i < n; i++)
            st_store(t, exp, i, remote_reduce(t, op, seed, i));
        check_range(label, t, &d, exp, n);
        free(exp);
    }
    st_buf_free(&s);
    st_buf_free(&d);
}

static void t_reduce(const struct st_type *t, int op, size_t n, int g, int nb)
{
    uint64_t seed = next_seed++;
    int rl = nmembers[g] - 1, is_root, is_null;
    int root = root_arg(g, rl, &is_root, &is_null);
    struct st_buf s = st_input(t, op, seed, me_world(), 0, n), d = st_buf_poisoned(n * t->size);
    char label[160];
    snprintf(label, sizeof label, "%s %sReduce %s %s n=%zu root group %d", layout_name,
             nb ? "I" : "", t->name, st_op_names[op], n, g);
    MPI_Request r;
    int rc = nb ? wait_or(MPI_Ireduce(s.mpi, d.mpi, (int)n, t->type, st_ops[op], root, inter, &r),
                          &r)
                : MPI_Reduce(s.mpi, d.mpi, (int)n, t->type, st_ops[op], root, inter);
    if (st_ok(rc, label)) {
        if (is_root) {
            char *exp = malloc(n * t->size + 1);
            for (size_t i = 0; i < n; i++)
                st_store(t, exp, i, remote_reduce(t, op, seed, i));
            check_range(label, t, &d, exp, n);
            free(exp);
        } else {
            check_poison(label, &d);
        }
    }
    st_buf_free(&s);
    st_buf_free(&d);
}

static void t_bcast(const struct st_type *t, size_t n, int g, int nb)
{
    uint64_t seed = next_seed++;
    int rl = nmembers[g] - 1, is_root, is_null;
    int root = root_arg(g, rl, &is_root, &is_null);
    int root_world = members[g][rl];
    struct st_buf b = is_root ? st_input(t, OP_BXOR, seed, root_world, 0, n)
                              : st_buf_poisoned(n * t->size);
    char label[160];
    snprintf(label, sizeof label, "%s %sBcast %s n=%zu root group %d", layout_name,
             nb ? "I" : "", t->name, n, g);
    MPI_Request r;
    int rc = nb ? wait_or(MPI_Ibcast(b.mpi, (int)n, t->type, root, inter, &r), &r)
                : MPI_Bcast(b.mpi, (int)n, t->type, root, inter);
    if (st_ok(rc, label)) {
        if (is_null) {
            check_poison(label, &b);
        } else {
            char *exp = malloc(n * t->size + 1);
            st_fill(t, OP_BXOR, seed, root_world, 0, exp, n);
            check_range(label, t, &b, exp, n);
            free(exp);
        }
    }
    st_buf_free(&b);
}

/* MPI_Allgather (`exchange` 0) or MPI_Alltoall (1). */
static void t_all(const struct st_type *t, size_t n, int exchange, int nb)
{
    uint64_t seed = next_seed++;
    size_t sn = exchange ? n * (size_t)rs : n;
    struct st_buf s = st_input(t, OP_BXOR, seed, me_world(), 0, sn);
    if (exchange) {
        /* block r (to remote rank r) holds elements r*STRIDE.. */
        for (int r = 0; r < rs; r++)
            st_fill(t, OP_BXOR, seed, me_world(), (size_t)r * STRIDE,
                    (char *)s.host + (size_t)r * n * t->size, n);
        st_push(&s);
    }
    struct st_buf d = st_buf_poisoned(n * (size_t)rs * t->size);
    char label[160];
    snprintf(label, sizeof label, "%s %s%s %s n=%zu", layout_name, nb ? "I" : "",
             exchange ? "Alltoall" : "Allgather", t->name, n);
    MPI_Request q;
    int rc;
    if (exchange)
        rc = nb ? wait_or(MPI_Ialltoall(s.mpi, (int)n, t->type, d.mpi, (int)n, t->type, inter, &q),
                          &q)
                : MPI_Alltoall(s.mpi, (int)n, t->type, d.mpi, (int)n, t->type, inter);
    else
        rc = nb ? wait_or(MPI_Iallgather(s.mpi, (int)n, t->type, d.mpi, (int)n, t->type, inter,
                                         &q),
                          &q)
                : MPI_Allgather(s.mpi, (int)n, t->type, d.mpi, (int)n, t->type, inter);
    if (st_ok(rc, label)) {
        char *exp = malloc(n * (size_t)rs * t->size + 1);
        for (int r = 0; r < rs; r++)
            st_fill(t, OP_BXOR, seed, remote_world(r), exchange ? (size_t)lr * STRIDE : 0,
                    exp + (size_t)r * n * t->size, n);
        check_range(label, t, &d, exp, n * (size_t)rs);
        free(exp);
    }
    st_buf_free(&s);
    st_buf_free(&d);
}

static size_t tri(int k) { return (size_t)k * (size_t)(k + 1) / 2; }

/* MPI_Reduce_scatter_block (`uneven` 0) or MPI_Reduce_scatter (1): each
 * group's vectors hold 6n elements; the reduction of one group's vectors is
 * scattered over the other group (evenly, or local rank i gets (i+1)u). */
static void t_reduce_scatter(const struct st_type *t, int op, size_t n, int uneven, int nb)
{
    size_t total = 6 * n;
    if (uneven ? total % tri(ls) : total % (size_t)ls)
        return;
    uint64_t seed = next_seed++;
    size_t rc_each = total / (size_t)ls, u = uneven ? total / tri(ls) : 0;
    int *counts = calloc((size_t)ls + 1, sizeof(int));
    for (int i = 0; i < ls; i++)
        counts[i] = (int)(uneven ? (size_t)(i + 1) * u : rc_each);
    size_t mine = (size_t)counts[lr], first = uneven ? tri(lr) * u : (size_t)lr * rc_each;
    struct st_buf s = st_input(t, op, seed, me_world(), 0, total),
                  d = st_buf_poisoned(mine * t->size);
    char label[160];
    snprintf(label, sizeof label, "%s %s%s %s %s n=%zu", layout_name, nb ? "I" : "",
             uneven ? "Reduce_scatter" : "Reduce_scatter_block", t->name, st_op_names[op], n);
    MPI_Request q;
    int rc = uneven ? MPI_Reduce_scatter(s.mpi, d.mpi, counts, t->type, st_ops[op], inter)
             : nb   ? wait_or(MPI_Ireduce_scatter_block(s.mpi, d.mpi, (int)mine, t->type,
                                                        st_ops[op], inter, &q),
                              &q)
                    : MPI_Reduce_scatter_block(s.mpi, d.mpi, (int)mine, t->type, st_ops[op], inter);
    if (st_ok(rc, label)) {
        char *exp = malloc(mine * t->size + 1);
        for (size_t j = 0; j < mine; j++)
            st_store(t, exp, j, remote_reduce(t, op, seed, first + j));
        check_range(label, t, &d, exp, mine);
        free(exp);
    }
    free(counts);
    st_buf_free(&s);
    st_buf_free(&d);
}

/* MPI_Gather (`scatter` 0) or MPI_Scatter (1), rooted in group g. */
static void t_rooted(const struct st_type *t, size_t n, int g, int scatter, int nb)
{
    uint64_t seed = next_seed++;
    int rl = nmembers[g] - 1, is_root, is_null;
    int root = root_arg(g, rl, &is_root, &is_null);
    int root_world = members[g][rl];
    size_t all = n * (size_t)rs;
    struct st_buf own, many;
    if (scatter) {
        many = st_buf_poisoned(all * t->size);
        if (is_root) {
            for (int r = 0; r < rs; r++)
                st_fill(t, OP_BXOR, seed, root_world, (size_t)r * STRIDE,
                        (char *)many.host + (size_t)r * n * t->size, n);
            st_push(&many);
        }
        own = st_buf_poisoned(n * t->size);
    } else {
        own = st_input(t, OP_BXOR, seed, me_world(), 0, n);
        many = st_buf_poisoned(all * t->size);
    }
    char label[160];
    snprintf(label, sizeof label, "%s %s%s %s n=%zu root group %d", layout_name, nb ? "I" : "",
             scatter ? "Scatter" : "Gather", t->name, n, g);
    MPI_Request q;
    int rc;
    if (scatter)
        rc = nb ? wait_or(MPI_Iscatter(many.mpi, (int)n, t->type, own.mpi, (int)n, t->type, root,
                                       inter, &q),
                          &q)
                : MPI_Scatter(many.mpi, (int)n, t->type, own.mpi, (int)n, t->type, root, inter);
    else
        rc = nb ? wait_or(MPI_Igather(own.mpi, (int)n, t->type, many.mpi, (int)n, t->type, root,
                                      inter, &q),
                          &q)
                : MPI_Gather(own.mpi, (int)n, t->type, many.mpi, (int)n, t->type, root, inter);
    if (st_ok(rc, label)) {
        char *exp = malloc(all * t->size + 1);
        if (scatter) {
            if (is_root || is_null) {
                check_poison(label, &own);
            } else {
                st_fill(t, OP_BXOR, seed, root_world, (size_t)lr * STRIDE, exp, n);
                check_range(label, t, &own, exp, n);
            }
        } else if (is_root) {
            for (int r = 0; r < rs; r++)
                st_fill(t, OP_BXOR, seed, remote_world(r), 0, exp + (size_t)r * n * t->size, n);
            check_range(label, t, &many, exp, all);
        } else {
            check_poison(label, &many);
        }
        free(exp);
    }
    st_buf_free(&own);
    st_buf_free(&many);
}

/* ---- v-forms ---------------------------------------------------------- */

/* Elements local rank i of a group sends in Allgatherv/Gatherv (and
 * receives in Scatterv). */
static int vcount(int i, size_t n) { return n == 0 ? i % 2 : (int)n + i % 3; }

/* Elements local rank a of group g sends to local rank b of the other. */
static int vpair(int g, int a, int b, size_t n)
{
    if ((a + b + g) % 4 == 3)
        return 0;
    return n == 0 ? (a + b + g) % 2 : (int)n + (2 * a + b + g) % 3;
}

/* Reverse-order displacements with gaps over np blocks; the element span. */
static size_t reversed(int np, const int *counts, int *displs)
{
    size_t at = GAP;
    for (int r = np - 1; r >= 0; r--) {
        displs[r] = (int)at;
        at += (size_t)counts[r] + GAP;
    }
    return at;
}

/* A poisoned expectation of `span` elements with block r (counts[r] of
 * remote rank r's elements from index base(r)) at displs[r]. */
static char *blocks(const struct st_type *t, uint64_t seed, const int *counts, const int *displs,
                    size_t span, int from_root_world, size_t base_lr)
{
    char *exp = malloc(span * t->size + 1);
    memset(exp, ST_POISON, span * t->size);
    for (int r = 0; r < rs; r++)
        st_fill(t, OP_BXOR, seed, from_root_world >= 0 ? from_root_world : remote_world(r),
                from_root_world >= 0 ? (size_t)r * STRIDE : base_lr,
                exp + (size_t)displs[r] * t->size, (size_t)counts[r]);
    return exp;
}

static void check_bytes(const char *label, struct st_buf *b, const char *exp, size_t bytes)
{
    st_pull(b);
    if (memcmp(b->host, exp, bytes) == 0) {
        st_pass();
        return;
    }
    size_t i = 0;
    while (((char *)b->host)[i] == exp[i])
        i++;
    st_fail("%s: byte %zu differs: got 0x%02x want 0x%02x", label, i,
            ((unsigned char *)b->host)[i], (unsigned char)exp[i]);
}

static void t_allgatherv(const struct st_type *t, size_t n)
{
    uint64_t seed = next_seed++;
    int *counts = malloc(sizeof(int) * (size_t)rs), *displs = malloc(sizeof(int) * (size_t)rs);
    for (int r = 0; r < rs; r++)
        counts[r] = vcount(r, n);
    size_t span = reversed(rs, counts, displs);
    struct st_buf s = st_input(t, OP_BXOR, seed, me_world(), 0, (size_t)vcount(lr, n)),
                  d = st_buf_poisoned(span * t->size);
    char label[160];
    snprintf(label, sizeof label, "%s Allgatherv %s n=%zu", layout_name, t->name, n);
    if (st_ok(MPI_Allgatherv(s.mpi, vcount(lr, n), t->type, d.mpi, counts, displs, t->type, inter),
              label)) {
        char *exp = blocks(t, seed, counts, displs, span, -1, 0);
        check_bytes(label, &d, exp, span * t->size);
        free(exp);
    }
    free(counts);
    free(displs);
    st_buf_free(&s);
    st_buf_free(&d);
}

static void t_alltoallv(const struct st_type *t, size_t n)
{
    uint64_t seed = next_seed++;
    int *sc = malloc(sizeof(int) * (size_t)rs), *sd = malloc(sizeof(int) * (size_t)rs);
    int *rc_ = malloc(sizeof(int) * (size_t)rs), *rd = malloc(sizeof(int) * (size_t)rs);
    size_t sspan = 0;
    for (int r = 0; r < rs; r++) {
        sc[r] = vpair(group, lr, r, n);
        sd[r] = (int)sspan;
        sspan += (size_t)sc[r];
        rc_[r] = vpair(1 - group, r, lr, n);
    }
    size_t rspan = reversed(rs, rc_, rd);
    struct st_buf s = st_buf_new(sspan * t->size + 1), d = st_buf_poisoned(rspan * t->size);
    for (int r = 0; r < rs; r++)
        st_fill(t, OP_BXOR, seed, me_world(), (size_t)r * STRIDE,
                (char *)s.host + (size_t)sd[r] * t->size, (size_t)sc[r]);
    st_push(&s);
    char label[160];
    snprintf(label, sizeof label, "%s Alltoallv %s n=%zu", layout_name, t->name, n);
    if (st_ok(MPI_Alltoallv(s.mpi, sc, sd, t->type, d.mpi, rc_, rd, t->type, inter), label)) {
        char *exp = blocks(t, seed, rc_, rd, rspan, -1, (size_t)lr * STRIDE);
        check_bytes(label, &d, exp, rspan * t->size);
        free(exp);
    }
    free(sc);
    free(sd);
    free(rc_);
    free(rd);
    st_buf_free(&s);
    st_buf_free(&d);
}

/* MPI_Gatherv (`scatter` 0) or MPI_Scatterv (1), rooted in group g. */
static void t_rooted_v(const struct st_type *t, size_t n, int g, int scatter)
{
    uint64_t seed = next_seed++;
    int rl = nmembers[g] - 1, is_root, is_null;
    int root = root_arg(g, rl, &is_root, &is_null);
    int root_world = members[g][rl];
    int *counts = malloc(sizeof(int) * (size_t)rs), *displs = malloc(sizeof(int) * (size_t)rs);
    for (int r = 0; r < rs; r++)
        counts[r] = vcount(r, n);
    size_t span = reversed(rs, counts, displs), mine = (size_t)vcount(lr, n);
    struct st_buf many = st_buf_poisoned(span * t->size), own;
    if (scatter) {
        if (is_root) {
            for (int r = 0; r < rs; r++)
                st_fill(t, OP_BXOR, seed, root_world, (size_t)r * STRIDE,
                        (char *)many.host + (size_t)displs[r] * t->size, (size_t)counts[r]);
            st_push(&many);
        }
        own = st_buf_poisoned(mine * t->size + 1);
    } else {
        own = st_input(t, OP_BXOR, seed, me_world(), 0, mine);
    }
    char label[160];
    snprintf(label, sizeof label, "%s %s %s n=%zu root group %d", layout_name,
             scatter ? "Scatterv" : "Gatherv", t->name, n, g);
    int rc = scatter ? MPI_Scatterv(many.mpi, counts, displs, t->type, own.mpi, (int)mine, t->type,
                                    root, inter)
                     : MPI_Gatherv(own.mpi, (int)mine, t->type, many.mpi, counts, displs, t->type,
                                   root, inter);
    if (st_ok(rc, label)) {
        if (scatter) {
            if (is_root || is_null) {
                check_poison(label, &own);
            } else {
                char *exp = malloc(mine * t->size + 1);
                st_fill(t, OP_BXOR, seed, root_world, (size_t)lr * STRIDE, exp, mine);
                check_range(label, t, &own, exp, mine);
                free(exp);
            }
        } else if (is_root) {
            char *exp = blocks(t, seed, counts, displs, span, -1, 0);
            check_bytes(label, &many, exp, span * t->size);
            free(exp);
        } else {
            check_poison(label, &many);
        }
    }
    free(counts);
    free(displs);
    st_buf_free(&many);
    st_buf_free(&own);
}

/* ---- driver ----------------------------------------------------------- */

struct tcase {
    const char *type;
    int op;
};

static void suite(void)
{
    struct tcase cases[] = {{"INT", OP_SUM}, {"DOUBLE", OP_MAX}, {"UINT8_T", OP_BXOR},
                            {"INT16_T", OP_SUM}, {"FLOAT", OP_USER}};
    size_t sizes[] = {0, 1, 7, 613};
    int ncases = st.quick ? 2 : (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < ncases; c++) {
        const struct st_type *t = st_type_named(cases[c].type);
        int op = cases[c].op;
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            for (int nb = 0; nb < 2; nb++) {
                t_allreduce(t, op, n, nb);
                t_all(t, n, 0, nb);
                t_all(t, n, 1, nb);
                t_reduce_scatter(t, op, n, 0, nb);
                for (int g = 0; g < 2; g++) {
                    t_reduce(t, op, n, g, nb);
                    t_bcast(t, n, g, nb);
                    t_rooted(t, n, g, 0, nb);
                    t_rooted(t, n, g, 1, nb);
                }
            }
            t_reduce_scatter(t, op, n, 1, 0);
            t_allgatherv(t, n);
            t_alltoallv(t, n);
            for (int g = 0; g < 2; g++) {
                t_rooted_v(t, n, g, 0);
                t_rooted_v(t, n, g, 1);
            }
        }
    }
    char label[80];
    snprintf(label, sizeof label, "%s Barrier", layout_name);
    st_ok(MPI_Barrier(inter), label);
    st_pass();
}

/* An intercommunicator between the ranks of `color` 0 and 1. */
static void with_layout(const char *name, int (*color)(int))
{
    nmembers[0] = nmembers[1] = 0;
    for (int w = 0; w < st.size; w++) {
        int c = color(w);
        members[c][nmembers[c]++] = w;
    }
    if (nmembers[0] == 0 || nmembers[1] == 0)
        return;
    snprintf(layout_name, sizeof layout_name, "[%s %d+%d]", name, nmembers[0], nmembers[1]);
    group = color(st.rank);
    MPI_Comm local;
    MPI_Comm_split(MPI_COMM_WORLD, group, st.rank, &local);
    if (MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, members[1 - group][0], 77, &inter) !=
        MPI_SUCCESS) {
        st_fail("%s: MPI_Intercomm_create failed", layout_name);
        MPI_Comm_free(&local);
        return;
    }
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    MPI_Comm_rank(inter, &lr);
    MPI_Comm_size(inter, &ls);
    MPI_Comm_remote_size(inter, &rs);
    if (ls != nmembers[group] || rs != nmembers[1 - group] || members[group][lr] != st.rank)
        st_fail("%s: unexpected layout (local %d, remote %d)", layout_name, ls, rs);
    else
        suite();
    MPI_Comm_free(&inter);
    MPI_Comm_free(&local);
}

static int first_vs_rest(int w) { return w == 0 ? 0 : 1; }
static int even_vs_odd(int w) { return w % 2; }

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "intercomm");
    if (st.size > 64) {
        if (st.rank == 0)
            printf("intercomm: at most 64 ranks\n");
        MPI_Finalize();
        return 1;
    }
    if (st.size < 2) {
        /* An intercommunicator needs two groups: nothing to test. */
        st_pass();
        return st_finish();
    }
    with_layout("0|rest", first_vs_rest);
    if (st.size > 2)
        with_layout("even|odd", even_vs_odd);
    return st_finish();
}

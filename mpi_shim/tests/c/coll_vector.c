/* The v-forms: MPI_Allgatherv, MPI_Alltoallv, MPI_Gatherv and MPI_Scatterv
 * with uneven counts (some zero), displacements in reverse rank order with
 * gaps (the gaps must stay untouched), in-place forms, every datatype and
 * the sizes 0, 1, 7919 and a large one. An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GAP 5 /* elements between blocks */
#define MOVE OP_BXOR
#define BLOCK_STRIDE ((size_t)1 << 24) /* element index offset per destination */

static uint64_t next_seed = 5000;
static unsigned turn;

/* Count of the block from rank a to rank b; symmetric when `sym`. */
static int count_of(size_t n, int a, int b, int sym)
{
    if (n == 0)
        return (a + b) % 2;
    if (n > 1 && (sym ? (a + b) % 4 == 1 : (a * 7 + b) % 5 == 1))
        return 0;
    return (int)n + (sym ? (a + b) % 5 : (a * 7 + b * 3) % 5);
}

/* Reverse-order displacements with gaps; returns the buffer's element span. */
static size_t layout(int np, const int *counts, int *displs)
{
    size_t at = GAP;
    for (int r = np - 1; r >= 0; r--) {
        displs[r] = (int)at;
        at += (size_t)counts[r] + GAP;
    }
    return at;
}

/* exp = poison everywhere, with block r of counts[r] elements of `src_rank`
 * (or r when src_rank < 0) at displs[r], element index base + k. */
static void expect_blocks(const struct st_type *t, uint64_t seed, int np, const int *counts,
                          const int *displs, size_t span, char *exp, int src_rank,
                          size_t index_base_per_block, size_t index_base)
{
    memset(exp, ST_POISON, span * t->size);
    for (int r = 0; r < np; r++)
        st_fill(t, MOVE, seed, src_rank < 0 ? r : src_rank,
                index_base + (size_t)r * index_base_per_block, exp + (size_t)displs[r] * t->size,
                (size_t)counts[r]);
}

static void check_all(const char *label, const struct st_type *t, struct st_buf *out,
                      const char *exp, size_t span)
{
    st_pull(out);
    /* compare as bytes: the gaps must still hold the poison */
    if (memcmp(out->host, exp, span * t->size) == 0) {
        st_pass();
        return;
    }
    size_t i = 0;
    while (((char *)out->host)[i] == exp[i])
        i++;
    st_fail("%s: byte %zu (element %zu) differs: got 0x%02x want 0x%02x", label, i,
            i / t->size, ((unsigned char *)out->host)[i], (unsigned char)exp[i]);
}

/* MPI_Allgatherv, or MPI_Gatherv (`rooted`; the root turns with each case). */
static void t_gatherv(MPI_Comm comm, const struct st_type *t, size_t n, int inplace, int rooted)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    int root = rooted ? (int)(turn++ % (unsigned)np) : -1, am_root = !rooted || me == root;
    char label[160], at[24] = "";
    if (rooted)
        snprintf(at, sizeof at, " root=%d", root);
    snprintf(label, sizeof label, "%s %s n=%zu%s%s", rooted ? "Gatherv" : "Allgatherv", t->name,
             n, inplace ? " in-place" : "", at);
    int *counts = malloc(sizeof(int) * np), *displs = malloc(sizeof(int) * np);
    for (int r = 0; r < np; r++)
        counts[r] = rooted ? count_of(n, r, root, 0) : count_of(n, r, 0, 1);
    size_t span = layout(np, counts, displs);
    struct st_buf in = st_input(t, MOVE, seed, me, 0, (size_t)counts[me]);
    struct st_buf out = st_buf_poisoned(am_root ? span * t->size : 0);
    int ip = inplace && am_root;
    if (ip)
        st_place(&out, (size_t)displs[me] * t->size, in.host, in.bytes);
    const void *send = ip ? MPI_IN_PLACE : in.mpi;
    int rc = rooted ? MPI_Gatherv(send, counts[me], t->type, am_root ? out.mpi : NULL, counts,
                                  displs, t->type, root, comm)
                    : MPI_Allgatherv(send, counts[me], t->type, out.mpi, counts, displs, t->type,
                                     comm);
    if (st_ok(rc, label) && am_root) {
        char *exp = malloc(span * t->size);
        expect_blocks(t, seed, np, counts, displs, span, exp, -1, 0, 0);
        check_all(label, t, &out, exp, span);
        free(exp);
    }
    free(counts);
    free(displs);
    st_buf_free(&in);
    st_buf_free(&out);
}

static void t_scatterv(MPI_Comm comm, const struct st_type *t, size_t n, int inplace)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    int root = (int)(turn++ % (unsigned)np), am_root = me == root, ip = inplace && am_root;
    char label[160];
    snprintf(label, sizeof label, "Scatterv %s n=%zu%s root=%d", t->name, n,
             inplace ? " in-place" : "", root);
    int *counts = malloc(sizeof(int) * np), *displs = malloc(sizeof(int) * np);
    for (int r = 0; r < np; r++)
        counts[r] = count_of(n, root, r, 0);
    size_t span = layout(np, counts, displs);
    struct st_buf in = st_buf_new(am_root ? span * t->size : 0);
    if (am_root) {
        expect_blocks(t, seed, np, counts, displs, span, in.host, root, BLOCK_STRIDE, 0);
        st_push(&in);
    }
    size_t mine = (size_t)counts[me];
    struct st_buf out = st_buf_poisoned(mine * t->size + GAP * t->size);
    int rc = MPI_Scatterv(am_root ? in.mpi : NULL, counts, displs, t->type,
                          ip ? MPI_IN_PLACE : out.mpi, counts[me], t->type, root, comm);
    if (st_ok(rc, label) && !ip) {
        char *exp = malloc(out.bytes);
        memset(exp, ST_POISON, out.bytes);
        st_fill(t, MOVE, seed, root, (size_t)me * BLOCK_STRIDE, exp, mine);
        check_all(label, t, &out, exp, mine + GAP);
        free(exp);
    }
    free(counts);
    free(displs);
    st_buf_free(&in);
    st_buf_free(&out);
}

static void t_alltoallv(MPI_Comm comm, const struct st_type *t, size_t n, int inplace)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    char label[160];
    snprintf(label, sizeof label, "Alltoallv %s n=%zu%s", t->name, n, inplace ? " in-place" : "");
    int *sc = malloc(sizeof(int) * np), *sd = malloc(sizeof(int) * np);
    int *rc_ = malloc(sizeof(int) * np), *rd = malloc(sizeof(int) * np);
    for (int r = 0; r < np; r++) {
        sc[r] = count_of(n, me, r, inplace);
        rc_[r] = count_of(n, r, me, inplace);
    }
    size_t sspan = layout(np, sc, sd), rspan = layout(np, rc_, rd);
    /* what I send to r: elements r*STRIDE.. of my sequence */
    struct st_buf in = st_buf_new(sspan * t->size);
    expect_blocks(t, seed, np, sc, sd, sspan, in.host, me, BLOCK_STRIDE, 0);
    st_push(&in);
    struct st_buf out = st_buf_poisoned(rspan * t->size);
    if (inplace) {
        /* in place, the send data sits in the receive layout */
        expect_blocks(t, seed, np, rc_, rd, rspan, out.host, me, BLOCK_STRIDE, 0);
        st_push(&out);
    }
    char *exp = malloc(rspan * t->size);
    memset(exp, ST_POISON, rspan * t->size);
    for (int r = 0; r < np; r++)
        st_fill(t, MOVE, seed, r, (size_t)me * BLOCK_STRIDE, exp + (size_t)rd[r] * t->size,
                (size_t)rc_[r]);
    int rc = MPI_Alltoallv(inplace ? MPI_IN_PLACE : in.mpi, sc, sd, t->type, out.mpi, rc_, rd,
                           t->type, comm);
    if (st_ok(rc, label))
        check_all(label, t, &out, exp, rspan);
    free(exp);
    free(sc);
    free(sd);
    free(rc_);
    free(rd);
    st_buf_free(&in);
    st_buf_free(&out);
}

static void all_forms(MPI_Comm comm, const struct st_type *t, size_t n, int inplace)
{
    t_gatherv(comm, t, n, inplace, 0);
    t_gatherv(comm, t, n, inplace, 1);
    t_scatterv(comm, t, n, inplace);
    t_alltoallv(comm, t, n, inplace);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "coll_vector");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    const size_t sizes[] = {0, 1, 7919};
    for (int k = 0; k < st_ntypes; k += st.quick ? 3 : 1)
        for (int s = 0; s < 3; s++)
            all_forms(MPI_COMM_WORLD, &st_types[k], sizes[s], (k + s) % 2);
    MPI_Comm split;
    MPI_Comm_split(MPI_COMM_WORLD, st.rank % 2, -st.rank, &split);
    for (int k = 0; k < st_ntypes; k += 4)
        all_forms(split, &st_types[k], 7919, k % 8 == 0);
    MPI_Comm_free(&split);
    if (st.large) {
        all_forms(MPI_COMM_WORLD, &st_types[0], st.large, 0);
        all_forms(MPI_COMM_WORLD, &st_types[16], st.large, 1);
    }
    return st_finish();
}

/* MPI_Alltoallw and MPI_Ialltoallw: a datatype per peer pair (int, double,
 * a strided vector, a struct with a hole, a type resized with a trailing
 * gap, a struct with a negative lower bound, bytes), uneven counts (some
 * zero), byte displacements in reverse peer order with gaps, in place; at
 * MPI_BOTTOM with absolute addresses (every block in an allocation of its
 * own); receive blocks interleaved element by element (overlapping
 * spans), at a buffer and at MPI_BOTTOM; and the MPI-4 large-count forms
 * where the program finds them. The receive buffer is poisoned: every byte
 * no datatype covers must keep the poison. An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((weak))
W int MPI_Alltoallw_c(const void *, const MPI_Count *, const MPI_Aint *, const MPI_Datatype *,
                      void *, const MPI_Count *, const MPI_Aint *, const MPI_Datatype *, MPI_Comm);
W int MPI_Ialltoallw_c(const void *, const MPI_Count *, const MPI_Aint *, const MPI_Datatype *,
                       void *, const MPI_Count *, const MPI_Aint *, const MPI_Datatype *,
                       MPI_Comm, MPI_Request *);

#define GAP 24 /* bytes between blocks */
#define NT 7

/* An element type: handle, extent, true lower bound, and which bytes of
 * its true extent are data ('x'). */
struct wtype {
    const char *name;
    MPI_Datatype type;
    long extent, lb;
    const char *mask;
};
static struct wtype wt[NT];

static void make_types(void)
{
    MPI_Datatype vec, pair, resized, neg;
    MPI_Type_vector(3, 1, 2, MPI_INT, &vec);
    int bl[2] = {1, 1};
    MPI_Aint dp[2] = {0, 8};
    MPI_Datatype tp[2] = {MPI_CHAR, MPI_DOUBLE};
    MPI_Type_create_struct(2, bl, dp, tp, &pair);
    MPI_Type_create_resized(MPI_SHORT, 0, 6, &resized);
    MPI_Aint dn[2] = {-8, 0};
    MPI_Datatype tn[2] = {MPI_INT, MPI_INT};
    MPI_Type_create_struct(2, bl, dn, tn, &neg);
    MPI_Datatype all[4] = {vec, pair, resized, neg};
    for (int k = 0; k < 4; k++)
        MPI_Type_commit(&all[k]);
    struct wtype t[NT] = {
        {"INT", MPI_INT, 4, 0, "xxxx"},
        {"DOUBLE", MPI_DOUBLE, 8, 0, "xxxxxxxx"},
        {"VECTOR", all[0], 20, 0, "xxxx....xxxx....xxxx"},
        {"STRUCT_HOLE", all[1], 16, 0, "x.......xxxxxxxx"},
        {"RESIZED", all[2], 6, 0, "xx"},
        {"NEG_LB", all[3], 12, -8, "xxxx....xxxx"},
        {"BYTE", MPI_BYTE, 1, 0, "x"},
    };
    memcpy(wt, t, sizeof t);
}

static void free_types(void)
{
    for (int k = 2; k <= 5; k++)
        MPI_Type_free(&wt[k].type);
}

static uint64_t next_seed = 7000;

/* The element type and count from rank a to rank b (symmetric: the same
 * both ways, as MPI_IN_PLACE needs). */
static int type_of(int a, int b, int sym)
{
    return sym ? (a + b) % NT : (a * 3 + b) % NT;
}
static int count_of(size_t n, int a, int b, int sym)
{
    if (n == 0)
        return (a + b) % 2;
    if (n > 1 && (sym ? (a + b) % 4 == 1 : (a * 7 + b) % 5 == 1))
        return 0;
    return (int)n + (sym ? (a + b) % 3 : (a + 2 * b) % 3);
}

/* Data byte b of element k from rank src to rank dst. */
static unsigned char byte_of(uint64_t seed, int src, int dst, size_t k, size_t b)
{
    return (unsigned char)st_hash(st_hash(seed, (uint64_t)src * 4096 + (uint64_t)dst),
                                  k * 64 + b);
}

/* Bytes of a block of c elements of t: [lo, hi) from its displacement. */
static long span_lo(const struct wtype *t)
{
    return t->lb;
}
static long span_hi(const struct wtype *t, int c)
{
    return c ? (long)(c - 1) * t->extent + t->lb + (long)strlen(t->mask) : 0;
}

/* Lay out np blocks in reverse peer order with gaps; returns the size. */
static size_t layout(int np, const int *counts, const int *tys, int *displs)
{
    long at = GAP;
    for (int r = np - 1; r >= 0; r--) {
        const struct wtype *t = &wt[tys[r]];
        long d = at - span_lo(t);
        d = (d + 7) / 8 * 8;
        displs[r] = (int)d;
        at = d + span_hi(t, counts[r]) + GAP;
    }
    return (size_t)at;
}

/* Write the data bytes of a block (c elements of t, at byte displacement
 * d of p) from src to dst. */
static void fill_block(char *p, long d, const struct wtype *t, int c, uint64_t seed, int src,
                       int dst)
{
    size_t len = strlen(t->mask);
    for (int k = 0; k < c; k++)
        for (size_t b = 0; b < len; b++)
            if (t->mask[b] == 'x')
                p[d + (long)k * t->extent + t->lb + (long)b] =
                    (char)byte_of(seed, src, dst, (size_t)k, b);
}

static void check_bytes(const char *label, const char *got, const char *exp, size_t bytes)
{
    if (memcmp(got, exp, bytes) == 0) {
        st_pass();
        return;
    }
    size_t i = 0;
    while (got[i] == exp[i])
        i++;
    st_fail("%s: byte %zu of %zu differs: got 0x%02x want 0x%02x", label, i, bytes,
            (unsigned char)got[i], (unsigned char)exp[i]);
}

/* Call MPI_Alltoallw, its I-form, or their _c forms (`how` turns). */
static int call_w(int how, const void *s, const int *sc, const int *sd, const MPI_Datatype *st_,
                  void *r, const int *rc_, const int *rd, const MPI_Datatype *rt, MPI_Comm comm,
                  int np, const char *label)
{
    int large = (how & 2) && MPI_Alltoallw_c && MPI_Ialltoallw_c, nb = how & 1, rc;
    MPI_Request req = MPI_REQUEST_NULL;
    if (large) {
        MPI_Count *lsc = malloc(sizeof(MPI_Count) * np), *lrc = malloc(sizeof(MPI_Count) * np);
        MPI_Aint *lsd = malloc(sizeof(MPI_Aint) * np), *lrd = malloc(sizeof(MPI_Aint) * np);
        for (int i = 0; i < np; i++) {
            lsc[i] = sc ? sc[i] : 0;
            lsd[i] = sd ? sd[i] : 0;
            lrc[i] = rc_[i];
            lrd[i] = rd[i];
        }
        rc = nb ? MPI_Ialltoallw_c(s, lsc, lsd, st_, r, lrc, lrd, rt, comm, &req)
                : MPI_Alltoallw_c(s, lsc, lsd, st_, r, lrc, lrd, rt, comm);
        if (rc == MPI_SUCCESS && nb)
            rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
        free(lsc);
        free(lrc);
        free(lsd);
        free(lrd);
    } else {
        rc = nb ? MPI_Ialltoallw(s, sc, sd, st_, r, rc_, rd, rt, comm, &req)
                : MPI_Alltoallw(s, sc, sd, st_, r, rc_, rd, rt, comm);
        if (rc == MPI_SUCCESS && nb) {
            int flag = 0;
            do
                rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
            while (rc == MPI_SUCCESS && !flag);
        }
    }
    return st_ok(rc, label);
}

/* Blocks at byte displacements of one buffer (in place or not). */
static void t_displaced(MPI_Comm comm, size_t n, int inplace, int how)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++; /* every rank draws, skipping or not */
    /* Open MPI before 4.1.5 scales a one-process MPI_Alltoallw's byte
     * displacements by the datatype's extent (it reads out of bounds):
     * displaced blocks are exchanged on communicators of 2 or more. */
    if (np == 1)
        return;
    char label[160];
    snprintf(label, sizeof label, "Alltoallw%s%s n=%zu%s", how & 1 ? " nonblocking" : "",
             how & 2 ? " (_c)" : "", n, inplace ? " in-place" : "");
    int *sc = malloc(sizeof(int) * np), *sd = malloc(sizeof(int) * np);
    int *rc_ = malloc(sizeof(int) * np), *rd = malloc(sizeof(int) * np);
    int *sty = malloc(sizeof(int) * np), *rty = malloc(sizeof(int) * np);
    MPI_Datatype *stypes = malloc(sizeof(MPI_Datatype) * np);
    MPI_Datatype *rtypes = malloc(sizeof(MPI_Datatype) * np);
    for (int r = 0; r < np; r++) {
        sc[r] = count_of(n, me, r, inplace);
        rc_[r] = count_of(n, r, me, inplace);
        sty[r] = type_of(me, r, inplace);
        rty[r] = type_of(r, me, inplace);
        stypes[r] = wt[sty[r]].type;
        rtypes[r] = wt[rty[r]].type;
    }
    size_t sbytes = layout(np, sc, sty, sd), rbytes = layout(np, rc_, rty, rd);
    struct st_buf in = st_buf_new(sbytes), out = st_buf_poisoned(rbytes);
    memset(in.host, 0x3C, sbytes);
    for (int r = 0; r < np; r++)
        fill_block(in.host, sd[r], &wt[sty[r]], sc[r], seed, me, r);
    st_push(&in);
    if (inplace) {
        /* the data to send sits in the receive layout */
        for (int r = 0; r < np; r++)
            fill_block(out.host, rd[r], &wt[rty[r]], rc_[r], seed, me, r);
        st_push(&out);
    }
    char *exp = malloc(rbytes);
    memset(exp, ST_POISON, rbytes);
    for (int r = 0; r < np; r++)
        fill_block(exp, rd[r], &wt[rty[r]], rc_[r], seed, r, me);
    if (call_w(how, inplace ? MPI_IN_PLACE : in.mpi, sc, sd, stypes, out.mpi, rc_, rd, rtypes,
               comm, np, label)) {
        st_pull(&out);
        check_bytes(label, out.host, exp, rbytes);
    }
    free(exp);
    free(sc);
    free(sd);
    free(rc_);
    free(rd);
    free(sty);
    free(rty);
    free(stypes);
    free(rtypes);
    st_buf_free(&in);
    st_buf_free(&out);
}

/* MPI_BOTTOM: every block in an allocation of its own, its datatype a
 * struct at the block's absolute address. */
static void t_bottom(MPI_Comm comm, size_t n, int how)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    char label[160];
    snprintf(label, sizeof label, "Alltoallw%s%s MPI_BOTTOM n=%zu", how & 1 ? " nonblocking" : "",
             how & 2 ? " (_c)" : "", n);
    struct st_buf *in = malloc(sizeof(struct st_buf) * np), *out = malloc(sizeof(struct st_buf) * np);
    int *sc = calloc((size_t)np, sizeof(int)), *rc_ = calloc((size_t)np, sizeof(int));
    int *zero = calloc((size_t)np, sizeof(int));
    MPI_Datatype *stypes = malloc(sizeof(MPI_Datatype) * np);
    MPI_Datatype *rtypes = malloc(sizeof(MPI_Datatype) * np);
    long *roff = malloc(sizeof(long) * np);
    for (int r = 0; r < np; r++) {
        const struct wtype *ts = &wt[type_of(me, r, 0)], *tr = &wt[type_of(r, me, 0)];
        int cs = count_of(n, me, r, 0), cr = count_of(n, r, me, 0);
        /* room before a negative lower bound */
        long soff = -span_lo(ts) + 8;
        roff[r] = -span_lo(tr) + 8;
        in[r] = st_buf_new((size_t)(soff + span_hi(ts, cs) + 8));
        out[r] = st_buf_poisoned((size_t)(roff[r] + span_hi(tr, cr) + 8));
        memset(in[r].host, 0x3C, in[r].bytes);
        fill_block(in[r].host, soff, ts, cs, seed, me, r);
        st_push(&in[r]);
        MPI_Aint sa, ra;
        MPI_Get_address((char *)in[r].mpi + soff, &sa);
        MPI_Get_address((char *)out[r].mpi + roff[r], &ra);
        int one = 1;
        stypes[r] = rtypes[r] = MPI_INT;
        if (cs) {
            MPI_Type_create_struct(1, &cs, &sa, &ts->type, &stypes[r]);
            MPI_Type_commit(&stypes[r]);
            sc[r] = one;
        }
        if (cr) {
            MPI_Type_create_struct(1, &cr, &ra, &tr->type, &rtypes[r]);
            MPI_Type_commit(&rtypes[r]);
            rc_[r] = one;
        }
    }
    if (call_w(how, MPI_BOTTOM, sc, zero, stypes, MPI_BOTTOM, rc_, zero, rtypes, comm, np,
               label)) {
        for (int r = 0; r < np; r++) {
            const struct wtype *tr = &wt[type_of(r, me, 0)];
            char *exp = malloc(out[r].bytes);
            memset(exp, ST_POISON, out[r].bytes);
            fill_block(exp, roff[r], tr, count_of(n, r, me, 0), seed, r, me);
            st_pull(&out[r]);
            char l2[200];
            snprintf(l2, sizeof l2, "%s block from %d", label, r);
            check_bytes(l2, out[r].host, exp, out[r].bytes);
            free(exp);
        }
    }
    for (int r = 0; r < np; r++) {
        if (stypes[r] != MPI_INT)
            MPI_Type_free(&stypes[r]);
        if (rtypes[r] != MPI_INT)
            MPI_Type_free(&rtypes[r]);
        st_buf_free(&in[r]);
        st_buf_free(&out[r]);
    }
    free(in);
    free(out);
    free(sc);
    free(rc_);
    free(zero);
    free(stypes);
    free(rtypes);
    free(roff);
}

/* Element k from rank r lands at int index k*np + r of the receive
 * buffer: every receive block's span overlaps the others. At a buffer, or
 * (`bottom`) at MPI_BOTTOM with absolute addresses. */
static void t_interleaved(MPI_Comm comm, size_t n, int bottom, int how)
{
    int me, np;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &np);
    uint64_t seed = next_seed++;
    char label[160];
    snprintf(label, sizeof label, "Alltoallw%s%s interleaved%s n=%zu",
             how & 1 ? " nonblocking" : "", how & 2 ? " (_c)" : "",
             bottom ? " at MPI_BOTTOM" : "", n);
    size_t total = n * (size_t)np + 3; /* 3 ints of tail */
    struct st_buf in = st_buf_new(n * (size_t)np * 4 + 4), out = st_buf_poisoned(total * 4);
    int *ip = in.host;
    for (int r = 0; r < np; r++)
        for (size_t k = 0; k < n; k++)
            ip[(size_t)r * n + k] = (int)st_hash(seed, (uint64_t)me * 1000003 + r * 7919 + k);
    st_push(&in);
    MPI_Datatype vec;
    MPI_Type_vector((int)n, 1, np, MPI_INT, &vec);
    MPI_Type_commit(&vec);
    int *sc = malloc(sizeof(int) * np), *sd = malloc(sizeof(int) * np);
    int *rc_ = malloc(sizeof(int) * np), *rd = malloc(sizeof(int) * np);
    MPI_Datatype *stypes = malloc(sizeof(MPI_Datatype) * np);
    MPI_Datatype *rtypes = malloc(sizeof(MPI_Datatype) * np);
    for (int r = 0; r < np; r++) {
        sc[r] = (int)n;
        sd[r] = (int)((size_t)r * n * 4);
        stypes[r] = MPI_INT;
        rc_[r] = n ? 1 : 0;
        rd[r] = r * 4;
        rtypes[r] = n ? vec : MPI_INT;
        if (bottom && n) {
            MPI_Aint a;
            MPI_Get_address((char *)out.mpi + 4 * r, &a);
            MPI_Type_create_struct(1, &rc_[r], &a, &vec, &rtypes[r]);
            MPI_Type_commit(&rtypes[r]);
            rd[r] = 0;
        }
    }
    int *exp = malloc(total * 4);
    memset(exp, ST_POISON, total * 4);
    for (int r = 0; r < np; r++)
        for (size_t k = 0; k < n; k++)
            exp[k * (size_t)np + (size_t)r] =
                (int)st_hash(seed, (uint64_t)r * 1000003 + (uint64_t)me * 7919 + k);
    if (call_w(how, in.mpi, sc, sd, stypes, bottom ? MPI_BOTTOM : out.mpi, rc_, rd, rtypes, comm,
               np, label)) {
        st_pull(&out);
        check_bytes(label, out.host, (char *)exp, total * 4);
    }
    if (bottom && n)
        for (int r = 0; r < np; r++)
            MPI_Type_free(&rtypes[r]);
    MPI_Type_free(&vec);
    free(exp);
    free(sc);
    free(sd);
    free(rc_);
    free(rd);
    free(stypes);
    free(rtypes);
    st_buf_free(&in);
    st_buf_free(&out);
}

static void all_forms(MPI_Comm comm, int base)
{
    const size_t sizes[] = {0, 1, 7, 101};
    for (int s = 0; s < 4; s++) {
        int how = (base + s) % 4;
        t_displaced(comm, sizes[s], 0, how);
        t_displaced(comm, sizes[s], 1, (how + 1) % 4);
        t_bottom(comm, sizes[s], (how + 2) % 4);
        t_interleaved(comm, sizes[s], 0, (how + 3) % 4);
        t_interleaved(comm, sizes[s], 1, how);
    }
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "coll_alltoallw");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    make_types();
    all_forms(MPI_COMM_WORLD, 0);
    MPI_Comm split;
    MPI_Comm_split(MPI_COMM_WORLD, st.rank % 2, -st.rank, &split);
    MPI_Comm_set_errhandler(split, MPI_ERRORS_RETURN);
    all_forms(split, 1);
    MPI_Comm_free(&split);
    if (st.large) {
        /* In place only blocking here: Open MPI 4.1's MPI_Ialltoallw in
         * place swaps bytes of large blocks of mixed datatypes (without
         * any shim); the small sizes above run it nonblocking too. */
        for (int how = 0; how < 4; how++) {
            t_displaced(MPI_COMM_WORLD, st.large / 16, how == 2, how);
            t_bottom(MPI_COMM_WORLD, st.large / 16, how);
        }
        t_interleaved(MPI_COMM_WORLD, st.large / 4, 0, 1);
        t_interleaved(MPI_COMM_WORLD, st.large / 4, 1, 2);
    }
    if (st.rank == 0)
        printf("large-count forms: %s\n",
               MPI_Alltoallw_c ? "found" : "not found (plain Open MPI 4.1)");
    free_types();
    return st_finish();
}

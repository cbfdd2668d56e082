/* The neighbourhood collectives, blocking and nonblocking:
 * MPI_(I)Neighbor_allgather, _allgatherv, _alltoall, _alltoallv and
 * _alltoallw on a periodic ring, a non-periodic 2D grid (MPI_PROC_NULL
 * neighbours, whose receive blocks must keep the poison), a complete graph
 * (MPI_Graph_create) and a distributed graph with uneven degrees (rank i
 * sends to every higher rank: degrees 0..np-1); uneven counts, blocks in
 * reverse order with gaps, a datatype with holes in the w-form; sizes 0,
 * 1 and 7919 (and a large one); the MPI-4 large-count forms where the
 * program finds them. An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((weak))
W int MPI_Neighbor_allgather_c(const void *, MPI_Count, MPI_Datatype, void *, MPI_Count,
                               MPI_Datatype, MPI_Comm);
W int MPI_Neighbor_alltoall_c(const void *, MPI_Count, MPI_Datatype, void *, MPI_Count,
                              MPI_Datatype, MPI_Comm);
W int MPI_Neighbor_alltoallw_c(const void *, const MPI_Count *, const MPI_Aint *,
                               const MPI_Datatype *, void *, const MPI_Count *, const MPI_Aint *,
                               const MPI_Datatype *, MPI_Comm);
W int MPI_Ineighbor_alltoall_c(const void *, MPI_Count, MPI_Datatype, void *, MPI_Count,
                               MPI_Datatype, MPI_Comm, MPI_Request *);
W int MPI_Neighbor_alltoallv_c(const void *, const MPI_Count *, const MPI_Aint *, MPI_Datatype,
                               void *, const MPI_Count *, const MPI_Aint *, MPI_Datatype,
                               MPI_Comm);
W int MPI_Ineighbor_alltoallw_c(const void *, const MPI_Count *, const MPI_Aint *,
                                const MPI_Datatype *, void *, const MPI_Count *,
                                const MPI_Aint *, const MPI_Datatype *, MPI_Comm, MPI_Request *);

#define GAP 3 /* elements (ints) between blocks */

/* Who sends what to whom in one topology. */
struct topo {
    const char *name;
    MPI_Comm comm;
    int me, np;
    int nin, nout;
    int *src;      /* source of receive slot i (MPI_PROC_NULL possible) */
    int *src_slot; /* the sender's send slot of what lands in receive slot i */
    int *dst;      /* destination of send slot q */
};

static uint64_t next_seed = 11000;
static unsigned turn;

static int ival(uint64_t seed, int sender, int slot, size_t k)
{
    return (int)(st_hash(st_hash(seed, (uint64_t)sender * 64 + (uint64_t)slot), k) & 0x7fffffff);
}

/* The count of what `sender` sends from its send slot `slot`. */
static int vcount(size_t n, int sender, int slot)
{
    if (n == 0)
        return (sender + slot) % 2;
    return (int)n + (sender * 3 + slot) % 4 - 1;
}

static void topo_free(struct topo *t)
{
    free(t->src);
    free(t->src_slot);
    free(t->dst);
    MPI_Comm_free(&t->comm);
}

static void topo_alloc(struct topo *t)
{
    MPI_Comm_rank(t->comm, &t->me);
    MPI_Comm_size(t->comm, &t->np);
    MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    t->src = malloc(sizeof(int) * (t->nin + 1));
    t->src_slot = malloc(sizeof(int) * (t->nin + 1));
    t->dst = malloc(sizeof(int) * (t->nout + 1));
}

/* A Cartesian grid: per dimension, slot 2d is the -1 neighbour, 2d+1 the
 * +1 one; what arrives from the -1 neighbour left its +1 slot. */
static struct topo make_cart(int ndims, int periodic)
{
    struct topo t = {periodic ? "periodic ring" : "2D grid", MPI_COMM_NULL, 0, 0, 0, 0, 0, 0, 0};
    int dims[2] = {0, 0}, per[2] = {periodic, periodic};
    MPI_Dims_create(st.size, ndims, dims);
    MPI_Cart_create(MPI_COMM_WORLD, ndims, dims, per, 0, &t.comm);
    t.nin = t.nout = 2 * ndims;
    topo_alloc(&t);
    for (int d = 0; d < ndims; d++) {
        int lo, hi;
        MPI_Cart_shift(t.comm, d, 1, &lo, &hi);
        t.src[2 * d] = t.dst[2 * d] = lo;
        t.src[2 * d + 1] = t.dst[2 * d + 1] = hi;
        t.src_slot[2 * d] = 2 * d + 1;
        t.src_slot[2 * d + 1] = 2 * d;
    }
    return t;
}

/* Every rank a neighbour of every other, in rank order. */
static struct topo make_graph(void)
{
    struct topo t = {"complete graph", MPI_COMM_NULL, 0, 0, 0, 0, 0, 0, 0};
    int np = st.size, nedges = np * (np - 1);
    int *index = malloc(sizeof(int) * np), *edges = malloc(sizeof(int) * (nedges + 1));
    for (int i = 0, e = 0; i < np; i++) {
        for (int j = 0; j < np; j++)
            if (j != i)
                edges[e++] = j;
        index[i] = (i + 1) * (np - 1);
    }
    MPI_Graph_create(MPI_COMM_WORLD, np, index, edges, 0, &t.comm);
    free(index);
    free(edges);
    t.nin = t.nout = np - 1;
    topo_alloc(&t);
    for (int i = 0, j = 0; j < np; j++) {
        if (j == t.me)
            continue;
        t.src[i] = t.dst[i] = j;
        t.src_slot[i] = t.me < j ? t.me : t.me - 1; /* my place in j's list */
        i++;
    }
    return t;
}

/* Rank i sends to every higher rank and receives from every lower one. */
static struct topo make_dist_graph(void)
{
    struct topo t = {"distributed graph", MPI_COMM_NULL, 0, 0, 0, 0, 0, 0, 0};
    int me = st.rank, np = st.size;
    int *srcs = malloc(sizeof(int) * (np + 1)), *dsts = malloc(sizeof(int) * (np + 1));
    int *ones = malloc(sizeof(int) * (np + 1));
    for (int j = 0; j <= np; j++)
        ones[j] = 1;
    for (int j = 0; j < me; j++)
        srcs[j] = j;
    for (int j = me + 1; j < np; j++)
        dsts[j - me - 1] = j;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, me, srcs, ones, np - me - 1, dsts, ones,
                                   MPI_INFO_NULL, 0, &t.comm);
    free(ones);
    free(srcs);
    free(dsts);
    t.nin = me;
    t.nout = np - me - 1;
    topo_alloc(&t);
    for (int i = 0; i < t.nin; i++) {
        t.src[i] = i;
        t.src_slot[i] = t.me - i - 1; /* my place in i's destinations */
    }
    for (int q = 0; q < t.nout; q++)
        t.dst[q] = t.me + 1 + q;
    return t;
}

/* Complete a request with a method that turns. */
static int finish_req(MPI_Request *req, const char *label)
{
    int rc, flag = 0;
    if (turn++ % 2) {
        rc = MPI_Wait(req, MPI_STATUS_IGNORE);
    } else {
        do
            rc = MPI_Testall(1, req, &flag, MPI_STATUSES_IGNORE);
        while (rc == MPI_SUCCESS && !flag);
    }
    return st_ok(rc, label);
}

static void check_ints(const char *label, const int *got, const int *exp, size_t n)
{
    if (memcmp(got, exp, n * sizeof(int)) == 0) {
        st_pass();
        return;
    }
    size_t i = 0;
    while (got[i] == exp[i])
        i++;
    st_fail("%s: int %zu of %zu differs: got 0x%08x want 0x%08x", label, i, n, (unsigned)got[i],
            (unsigned)exp[i]);
}

enum kind { ALLGATHER, ALLGATHERV, ALLTOALL, ALLTOALLV, ALLTOALLW, NKIND };
static const char *kind_names[NKIND] = {"allgather", "allgatherv", "alltoall", "alltoallv",
                                        "alltoallw"};

/* A vector of ints with holes: elements 0, 2, 4 of 5 (extent 5 ints). */
static MPI_Datatype holes;

/* One call of `kind` on `t`; ints everywhere (the w-form uses `holes` for
 * odd slots: 3 data ints per element, extent 5). */
static void t_call(const struct topo *t, enum kind kind, size_t n, int nb, int large)
{
    uint64_t seed = next_seed++;
    char label[200];
    snprintf(label, sizeof label, "%sneighbor_%s%s n=%zu on %s", nb ? "I" : "", kind_names[kind],
             large ? "_c" : "", n, t->name);
    int nin = t->nin, nout = t->nout;
    int *sc = calloc(nout + 1, sizeof(int)), *sd = calloc(nout + 1, sizeof(int));
    int *rc_ = calloc(nin + 1, sizeof(int)), *rd = calloc(nin + 1, sizeof(int));
    /* MPI_Aint displacements: in bytes (w-form), in elements (v-form) */
    MPI_Aint *sda = calloc(nout + 1, sizeof(MPI_Aint)), *rda = calloc(nin + 1, sizeof(MPI_Aint));
    MPI_Aint *sde = calloc(nout + 1, sizeof(MPI_Aint)), *rde = calloc(nin + 1, sizeof(MPI_Aint));
    MPI_Datatype *sty = calloc(nout + 1, sizeof(MPI_Datatype));
    MPI_Datatype *rty = calloc(nin + 1, sizeof(MPI_Datatype));
    int same = kind == ALLGATHER || kind == ALLTOALL;
    int gather = kind == ALLGATHER || kind == ALLGATHERV;
    /* the one block of an allgather, the same for every destination */
    int myc = kind == ALLGATHER ? (int)n : vcount(n, t->me, 0);
    size_t sbytes_i = GAP, rbytes_i = GAP; /* in ints */
    for (int q = nout - 1; q >= 0; q--) {
        int c = kind == ALLGATHER ? (int)n
                : kind == ALLTOALL ? (int)n
                : kind == ALLGATHERV ? vcount(n, t->me, 0)
                                     : vcount(n, t->me, q);
        int ext = kind == ALLTOALLW && q % 2 ? 5 : 1;
        sc[q] = c;
        sty[q] = ext == 5 ? holes : MPI_INT;
        if (gather)
            continue;
        sd[q] = same ? q * (int)n : (int)sbytes_i;
        sbytes_i = same ? (size_t)nout * n : sbytes_i + (size_t)c * ext + GAP;
    }
    for (int i = nin - 1; i >= 0; i--) {
        int s = t->src[i], q = t->src_slot[i];
        int c = kind == ALLGATHER || kind == ALLTOALL ? (int)n
                : kind == ALLGATHERV              ? (s >= 0 ? vcount(n, s, 0) : 0)
                                                  : (s >= 0 ? vcount(n, s, q) : 0);
        int ext = kind == ALLTOALLW && q % 2 ? 5 : 1;
        rc_[i] = c;
        rty[i] = ext == 5 ? holes : MPI_INT;
        rd[i] = same ? i * (int)n : (int)rbytes_i;
        rbytes_i = same ? (size_t)nin * n + GAP : rbytes_i + (size_t)c * ext + GAP;
    }
    if (gather) {
        sc[0] = myc;
        sd[0] = 0;
        sbytes_i = (size_t)myc + GAP;
    } else if (same) {
        sbytes_i = (size_t)nout * n + GAP;
    }
    struct st_buf in = st_buf_new(sbytes_i * 4), out = st_buf_poisoned(rbytes_i * 4);
    int *ip = in.host;
    memset(ip, 0, sbytes_i * 4);
    for (int q = 0; q < (gather ? 1 : nout); q++) {
        int ext = sty[q] == holes ? 5 : 1, slot = gather ? 0 : q;
        for (int k = 0; k < sc[q]; k++)
            for (int e = 0; e < ext; e += 2)
                ip[sd[q] + k * ext + e] = ival(seed, t->me, slot, (size_t)(k * ext + e));
    }
    st_push(&in);
    int *exp = malloc(rbytes_i * 4 + 4);
    memset(exp, ST_POISON, rbytes_i * 4);
    for (int i = 0; i < nin; i++) {
        int s = t->src[i];
        if (s < 0)
            continue; /* MPI_PROC_NULL: left alone */
        int slot = gather ? 0 : t->src_slot[i];
        int ext = rty[i] == holes ? 5 : 1;
        for (int k = 0; k < rc_[i]; k++)
            for (int e = 0; e < ext; e += 2)
                exp[rd[i] + k * ext + e] = ival(seed, s, slot, (size_t)(k * ext + e));
    }
    for (int q = 0; q < nout; q++) {
        sde[q] = sd[q];
        sda[q] = (MPI_Aint)sd[q] * 4;
    }
    for (int i = 0; i < nin; i++) {
        rde[i] = rd[i];
        rda[i] = (MPI_Aint)rd[i] * 4;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Comm c = t->comm;
    int rc = MPI_SUCCESS, ni = (int)n;
    MPI_Count *lsc = calloc(nout + 1, sizeof(MPI_Count)), *lrc = calloc(nin + 1, sizeof(MPI_Count));
    for (int q = 0; q < nout; q++)
        lsc[q] = sc[q];
    for (int i = 0; i < nin; i++)
        lrc[i] = rc_[i];
    switch (kind) {
    case ALLGATHER:
        if (large)
            rc = MPI_Neighbor_allgather_c(in.mpi, n, MPI_INT, out.mpi, n, MPI_INT, c);
        else
            rc = nb ? MPI_Ineighbor_allgather(in.mpi, ni, MPI_INT, out.mpi, ni, MPI_INT, c, &req)
                    : MPI_Neighbor_allgather(in.mpi, ni, MPI_INT, out.mpi, ni, MPI_INT, c);
        break;
    case ALLGATHERV:
        rc = nb ? MPI_Ineighbor_allgatherv(in.mpi, myc, MPI_INT, out.mpi, rc_, rd, MPI_INT, c,
                                           &req)
                : MPI_Neighbor_allgatherv(in.mpi, myc, MPI_INT, out.mpi, rc_, rd, MPI_INT, c);
        break;
    case ALLTOALL:
        if (large && nb)
            rc = MPI_Ineighbor_alltoall_c(in.mpi, n, MPI_INT, out.mpi, n, MPI_INT, c, &req);
        else if (large)
            rc = MPI_Neighbor_alltoall_c(in.mpi, n, MPI_INT, out.mpi, n, MPI_INT, c);
        else
            rc = nb ? MPI_Ineighbor_alltoall(in.mpi, ni, MPI_INT, out.mpi, ni, MPI_INT, c, &req)
                    : MPI_Neighbor_alltoall(in.mpi, ni, MPI_INT, out.mpi, ni, MPI_INT, c);
        break;
    case ALLTOALLV:
        if (large)
            rc = MPI_Neighbor_alltoallv_c(in.mpi, lsc, sde, MPI_INT, out.mpi, lrc, rde, MPI_INT,
                                          c);
        else
            rc = nb ? MPI_Ineighbor_alltoallv(in.mpi, sc, sd, MPI_INT, out.mpi, rc_, rd, MPI_INT,
                                              c, &req)
                    : MPI_Neighbor_alltoallv(in.mpi, sc, sd, MPI_INT, out.mpi, rc_, rd, MPI_INT, c);
        break;
    default:
        if (large && nb)
            rc = MPI_Ineighbor_alltoallw_c(in.mpi, lsc, sda, sty, out.mpi, lrc, rda, rty, c,
                                           &req);
        else if (large)
            rc = MPI_Neighbor_alltoallw_c(in.mpi, lsc, sda, sty, out.mpi, lrc, rda, rty, c);
        else
            rc = nb ? MPI_Ineighbor_alltoallw(in.mpi, sc, sda, sty, out.mpi, rc_, rda, rty, c,
                                              &req)
                    : MPI_Neighbor_alltoallw(in.mpi, sc, sda, sty, out.mpi, rc_, rda, rty, c);
        break;
    }
    if (st_ok(rc, label) && (req == MPI_REQUEST_NULL || finish_req(&req, label))) {
        st_pull(&out);
        check_ints(label, out.host, exp, rbytes_i);
    }
    free(exp);
    free(sc);
    free(sd);
    free(rc_);
    free(rd);
    free(sda);
    free(rda);
    free(sde);
    free(rde);
    free(sty);
    free(rty);
    free(lsc);
    free(lrc);
    st_buf_free(&in);
    st_buf_free(&out);
}

/* Whether a process is a neighbour twice (a periodic ring of 1 or 2):
 * Open MPI 4.1's nonblocking neighbourhood collectives match such a pair's
 * two messages in the wrong order (MPI_ERR_TRUNCATE, swapped blocks), so
 * only the blocking forms run there. */
static int duplicated(const struct topo *t)
{
    for (int i = 0; i < t->nin; i++)
        for (int j = i + 1; j < t->nin; j++)
            if (t->src[i] >= 0 && t->src[i] == t->src[j])
                return 1;
    return 0;
}

static void all_kinds(const struct topo *t, size_t n)
{
    for (int k = 0; k < NKIND; k++) {
        t_call(t, (enum kind)k, n, 0, 0);
        if (!duplicated(t))
            t_call(t, (enum kind)k, n, 1, 0);
    }
}

static int have_large(void)
{
    return MPI_Neighbor_allgather_c && MPI_Ineighbor_alltoall_c && MPI_Neighbor_alltoallv_c &&
           MPI_Ineighbor_alltoallw_c && MPI_Neighbor_alltoall_c && MPI_Neighbor_alltoallw_c;
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "coll_neighbor");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Type_vector(3, 1, 2, MPI_INT, &holes);
    MPI_Type_commit(&holes);
    struct topo topos[4] = {make_cart(1, 1), make_cart(2, 0), make_graph(), make_dist_graph()};
    const size_t sizes[] = {0, 1, 7919};
    for (int k = 0; k < 4; k++) {
        for (int s = 0; s < 3; s++)
            all_kinds(&topos[k], sizes[s]);
        if (st.large)
            all_kinds(&topos[k], st.large / 8);
        if (have_large()) {
            int nb = !duplicated(&topos[k]);
            t_call(&topos[k], ALLGATHER, 5, 0, 1);
            t_call(&topos[k], ALLTOALL, 7, nb, 1);
            t_call(&topos[k], ALLTOALLV, 3, 0, 1);
            t_call(&topos[k], ALLTOALLW, 2, nb, 1);
        }
    }
    /* a communicator without a topology: MPI's own error, nothing moved */
    int a = 1, b = 0;
    if (MPI_Neighbor_allgather(&a, 1, MPI_INT, &b, 1, MPI_INT, MPI_COMM_WORLD) != MPI_SUCCESS)
        st_pass();
    else
        st_fail("MPI_Neighbor_allgather on a communicator without a topology succeeded");
    if (st.rank == 0)
        printf("large-count forms: %s\n", have_large() ? "found" : "not found (plain Open MPI 4.1)");
    for (int k = 0; k < 4; k++)
        topo_free(&topos[k]);
    MPI_Type_free(&holes);
    return st_finish();
}

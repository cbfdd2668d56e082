/* Nonblocking collectives (MPI_Iallreduce, Ireduce, Ibcast, Iallgather,
 * Ireduce_scatter_block, Ialltoall, Igather, Iscatter) completed by every
 * member of the completion family (Wait, Waitall, Waitany, Waitsome, Test,
 * Testall, Testany, Testsome), in arrays that mix them with point-to-point
 * requests, MPI_REQUEST_NULL, a freed send request (MPI_Request_free) and a
 * cancelled receive (MPI_Cancel). Several collectives are in flight at once
 * on two communicators. One round of each completion call runs before the
 * communicators' first blocking collective, the rest after it (a
 * collectives library may set a communicator up at its first blocking
 * collective). An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind { IALLREDUCE, IREDUCE, IBCAST, IALLGATHER, IRSB, IALLTOALL, IGATHER, ISCATTER,
            P2P_RECV, CANCELLED, NULLREQ, NKIND };
static const char *kind_names[NKIND] = {"Iallreduce", "Ireduce", "Ibcast", "Iallgather",
                                        "Ireduce_scatter_block", "Ialltoall", "Igather",
                                        "Iscatter", "Irecv", "cancelled Irecv", "null"};
enum { WAIT, WAITALL, WAITANY, WAITSOME, TEST, TESTALL, TESTANY, TESTSOME, NMETHOD };
static const char *method_names[NMETHOD] = {"Wait", "Waitall", "Waitany", "Waitsome",
                                            "Test", "Testall", "Testany", "Testsome"};

#define P2P_TAG 77
#define NEVER_TAG 4242

struct pend {
    enum kind kind;
    MPI_Comm comm;
    int rank, size, root, inplace;
    const struct st_type *t;
    int op;
    uint64_t seed;
    size_t n;
    struct st_buf in, out;
    char label[200];
};

static uint64_t next_seed = 1000;
static unsigned turn;

static void label_of(struct pend *p, const char *method, const char *cname)
{
    snprintf(p->label, sizeof p->label, "%s %s %s n=%zu%s root=%d %s by %s", kind_names[p->kind],
             p->t ? p->t->name : "-", p->kind <= IRSB && p->kind != IBCAST && p->kind != IALLGATHER
                                        ? st_op_names[p->op] : "",
             p->n, p->inplace ? " in-place" : "", p->root, cname, method);
}

/* Start one request of `kind`; fills p and returns the request. */
static MPI_Request start(struct pend *p, enum kind kind, MPI_Comm comm, const char *cname,
                         const struct st_type *t, int op, size_t n, int inplace,
                         const char *method)
{
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->comm = comm;
    MPI_Comm_rank(comm, &p->rank);
    MPI_Comm_size(comm, &p->size);
    p->t = t;
    p->op = op;
    p->n = n;
    p->seed = next_seed++;
    p->root = (int)(turn++ % (unsigned)p->size);
    int me = p->rank, np = p->size, root = p->root, am_root = me == root, rc = MPI_SUCCESS;
    p->inplace = inplace && kind != IBCAST && (kind == IALLREDUCE || kind == IALLGATHER ||
                                               kind == IRSB || kind == IALLTOALL || am_root);
    label_of(p, method, cname);
    size_t sz = t ? (size_t)t->size : 1, total = n * np;
    MPI_Request req = MPI_REQUEST_NULL;
    int mpi_n = (int)n;
    switch (kind) {
    case IALLREDUCE:
    case IREDUCE:
    case IRSB: {
        size_t len = kind == IRSB ? total : n;
        p->in = st_input(t, op, p->seed, me, 0, len);
        p->out = st_buf_poisoned(len * sz);
        if (p->inplace)
            st_place(&p->out, 0, p->in.host, len * sz);
        const void *send = p->inplace ? MPI_IN_PLACE : p->in.mpi;
        MPI_Op mop = st_ops[op];
        if (kind == IALLREDUCE)
            rc = MPI_Iallreduce(send, p->out.mpi, mpi_n, t->type, mop, comm, &req);
        else if (kind == IREDUCE)
            rc = MPI_Ireduce(send, p->out.mpi, mpi_n, t->type, mop, root, comm, &req);
        else
            rc = MPI_Ireduce_scatter_block(send, p->out.mpi, mpi_n, t->type, mop, comm, &req);
        break;
    }
    case IBCAST:
        p->out = st_buf_poisoned(n * sz);
        if (am_root) {
            st_fill(t, OP_BXOR, p->seed, root, 0, p->out.host, n);
            st_push(&p->out);
        }
        rc = MPI_Ibcast(p->out.mpi, mpi_n, t->type, root, comm, &req);
        break;
    case IALLGATHER:
    case IGATHER:
    case IALLTOALL: {
        size_t len = kind == IALLTOALL ? total : n;
        p->in = st_input(t, OP_BXOR, p->seed, me, 0, len);
        p->out = st_buf_poisoned(total * sz);
        /* in place, my own block (all-to-all: all my blocks) is in the output */
        if (p->inplace)
            st_place(&p->out, kind == IALLTOALL ? 0 : me * n * sz, p->in.host, len * sz);
        const void *send = p->inplace ? MPI_IN_PLACE : p->in.mpi;
        void *recv = p->out.mpi;
        if (kind == IALLGATHER)
            rc = MPI_Iallgather(send, mpi_n, t->type, recv, mpi_n, t->type, comm, &req);
        else if (kind == IGATHER)
            rc = MPI_Igather(send, mpi_n, t->type, recv, mpi_n, t->type, root, comm, &req);
        else
            rc = MPI_Ialltoall(send, mpi_n, t->type, recv, mpi_n, t->type, comm, &req);
        break;
    }
    case ISCATTER:
        p->in = st_input(t, OP_BXOR, p->seed, root, 0, am_root ? total : 0);
        p->out = st_buf_poisoned(n * sz);
        rc = MPI_Iscatter(p->in.mpi, mpi_n, t->type, p->inplace ? MPI_IN_PLACE : p->out.mpi,
                          mpi_n, t->type, root, comm, &req);
        break;
    case P2P_RECV: {
        /* from the left neighbour, who sends with Isend + Request_free */
        int left = (me + np - 1) % np, right = (me + 1) % np;
        p->root = left;
        p->out = st_buf_new_host(n * sz);
        st_poison(&p->out);
        rc = MPI_Irecv(p->out.mpi, mpi_n, t->type, left, P2P_TAG, comm, &req);
        p->in = st_buf_new_host(n * sz);
        st_fill(t, OP_BXOR, p->seed + 1000000 * (uint64_t)right, me, 0, p->in.host, n);
        st_push(&p->in);
        MPI_Request send;
        if (st_ok(rc, p->label) &&
            st_ok(MPI_Isend(p->in.mpi, mpi_n, t->type, right, P2P_TAG, comm, &send), p->label))
            st_ok(MPI_Request_free(&send), "MPI_Request_free of an active Isend");
        return req;
    }
    case CANCELLED:
        p->out = st_buf_new_host(16);
        rc = MPI_Irecv(p->out.mpi, 16, MPI_BYTE, me, NEVER_TAG, comm, &req);
        if (st_ok(rc, p->label))
            rc = MPI_Cancel(&req);
        break;
    case NULLREQ:
        return MPI_REQUEST_NULL;
    default:
        break;
    }
    st_ok(rc, p->label);
    return req;
}

static void verify(struct pend *p, MPI_Status *status)
{
    const struct st_type *t = p->t;
    int me = p->rank, np = p->size, root = p->root;
    size_t n = p->n, total = n * np, sz = t ? (size_t)t->size : 1, cnt = 0;
    char *exp = malloc(total * sz + 16);
    switch (p->kind) {
    case IALLREDUCE:
    case IREDUCE:
        if (p->kind == IREDUCE && me != root)
            goto done;
        for (size_t i = 0; i < n; i++)
            st_store(t, exp, i, st_reduce_elem(t, p->op, p->seed, np, i));
        cnt = n;
        break;
    case IRSB:
        for (size_t i = 0; i < n; i++)
            st_store(t, exp, i, st_reduce_elem(t, p->op, p->seed, np, me * n + i));
        cnt = n;
        break;
    case IBCAST:
        st_fill(t, OP_BXOR, p->seed, root, 0, exp, n);
        cnt = n;
        break;
    case IALLGATHER:
    case IGATHER:
        if (p->kind == IGATHER && me != root)
            goto done;
        for (int r = 0; r < np; r++)
            st_fill(t, OP_BXOR, p->seed, r, 0, exp + r * n * sz, n);
        cnt = total;
        break;
    case IALLTOALL:
        for (int r = 0; r < np; r++)
            st_fill(t, OP_BXOR, p->seed, r, me * n, exp + r * n * sz, n);
        cnt = total;
        break;
    case ISCATTER:
        if (p->inplace)
            goto done;
        st_fill(t, OP_BXOR, p->seed, root, me * n, exp, n);
        cnt = n;
        break;
    case P2P_RECV: {
        st_fill(t, OP_BXOR, p->seed + 1000000 * (uint64_t)me, root, 0, exp, n);
        cnt = n;
        if (status) {
            int got = -1;
            MPI_Get_count(status, t->type, &got);
            if (status->MPI_SOURCE != root || status->MPI_TAG != P2P_TAG || got != (int)n)
                st_fail("%s: status source %d tag %d count %d, want %d %d %zu", p->label,
                        status->MPI_SOURCE, status->MPI_TAG, got, root, P2P_TAG, n);
            else
                st_pass();
        }
        break;
    }
    case CANCELLED: {
        int flag = 0;
        if (status) {
            MPI_Test_cancelled(status, &flag);
            if (!flag)
                st_fail("%s: MPI_Test_cancelled says not cancelled", p->label);
            else
                st_pass();
        }
        goto done;
    }
    default:
        goto done;
    }
    st_pull(&p->out);
    st_compare(p->label, t, p->out.host, exp, cnt);
done:
    free(exp);
}

static void release(struct pend *p)
{
    if (p->in.host)
        st_buf_free(&p->in);
    if (p->out.host)
        st_buf_free(&p->out);
}

/* Complete reqs[0..k) with `method`; done[i] is set and statuses kept as
 * each completes (statuses of the any and some forms land at their index). */
static void complete(int method, int k, MPI_Request *reqs, MPI_Status *stat, const char *what)
{
    int left = 0, rc = MPI_SUCCESS;
    for (int i = 0; i < k; i++)
        left += reqs[i] != MPI_REQUEST_NULL;
    int *idx = malloc(sizeof(int) * (k + 1));
    MPI_Status *tmp = malloc(sizeof(MPI_Status) * (k + 1));
    long spins = 0;
    while (left > 0 && rc == MPI_SUCCESS) {
        int flag = 0, index = MPI_UNDEFINED, outcount = 0;
        switch (method) {
        case WAIT:
            for (int i = k - 1; i >= 0 && rc == MPI_SUCCESS; i--) /* in reverse order */
                if (reqs[i] != MPI_REQUEST_NULL)
                    rc = MPI_Wait(&reqs[i], &stat[i]);
            left = 0;
            break;
        case WAITALL:
            rc = MPI_Waitall(k, reqs, stat);
            left = 0;
            break;
        case TESTALL:
            rc = MPI_Testall(k, reqs, &flag, stat);
            if (flag)
                left = 0;
            break;
        case WAITANY:
        case TESTANY:
            rc = method == WAITANY ? MPI_Waitany(k, reqs, &index, tmp)
                                   : MPI_Testany(k, reqs, &index, &flag, tmp);
            if (index != MPI_UNDEFINED) {
                stat[index] = tmp[0];
                left--;
            }
            break;
        case WAITSOME:
        case TESTSOME:
            rc = method == WAITSOME ? MPI_Waitsome(k, reqs, &outcount, idx, tmp)
                                    : MPI_Testsome(k, reqs, &outcount, idx, tmp);
            for (int j = 0; j < outcount && outcount != MPI_UNDEFINED; j++) {
                stat[idx[j]] = tmp[j];
                left--;
            }
            break;
        case TEST:
            for (int i = 0; i < k && rc == MPI_SUCCESS; i++) {
                if (reqs[i] == MPI_REQUEST_NULL)
                    continue;
                rc = MPI_Test(&reqs[i], &flag, &stat[i]);
                if (flag)
                    left--;
            }
            break;
        }
        if (++spins > 200000000L) {
            st_fail("%s: %d requests never completed", what, left);
            break;
        }
    }
    st_ok(rc, what);
    for (int i = 0; i < k; i++)
        if (reqs[i] != MPI_REQUEST_NULL)
            st_fail("%s: request %d not MPI_REQUEST_NULL after completion", what, i);
    free(idx);
    free(tmp);
}

/* One batch: every nonblocking collective (two on the duplicate), a
 * point-to-point exchange, a cancelled receive and a null request, started
 * together and completed with `method`. */
static void batch(int method, size_t n, MPI_Comm world, MPI_Comm dup, unsigned variant)
{
    const char *types[] = {"FLOAT", "INT", "INT8_T", "DOUBLE", "UINT16_T", "LONG", "BYTE",
                           "UNSIGNED"};
    const int ops[] = {OP_SUM, OP_MAX, OP_BXOR, OP_MIN, OP_PROD, OP_LAND, OP_BOR, OP_USER};
    enum { K = 13 };
    struct pend p[K];
    MPI_Request reqs[K];
    MPI_Status stat[K];
    const char *m = method_names[method];
    int k = 0;
    for (int kind = IALLREDUCE; kind <= ISCATTER; kind++) {
        const struct st_type *t = st_type_named(types[(kind + variant) % 8]);
        int op = ops[(kind + 3 * variant) % 8];
        while (!st_op_valid(t, op))
            op = (op + 1) % OP_COUNT;
        reqs[k] = start(&p[k], kind, world, "world", t, op, n, (int)((kind + variant) % 2), m);
        k++;
    }
    reqs[k] = start(&p[k], P2P_RECV, world, "world", st_type_named("DOUBLE"), 0, n + 3, 0, m);
    k++;
    reqs[k] = start(&p[k], IALLREDUCE, dup, "dup", st_type_named("INT"), OP_SUM, n, 0, m);
    k++;
    reqs[k] = start(&p[k], CANCELLED, world, "world", NULL, 0, 0, 0, m);
    k++;
    reqs[k] = start(&p[k], NULLREQ, world, "world", NULL, 0, 0, 0, m);
    k++;
    reqs[k] = start(&p[k], IBCAST, dup, "dup", st_type_named("CHAR"), 0, n, 0, m);
    k++;
    char what[120];
    snprintf(what, sizeof what, "%s of %d requests, n=%zu", m, k, n);
    for (int i = 0; i < k; i++)
        memset(&stat[i], 0, sizeof stat[i]);
    complete(method, k, reqs, stat, what);
    /* The send of the point-to-point exchange was freed while active, so
     * its buffer may be released only once the receiver has the message:
     * every rank completed its receive when the barrier ends. Without it a
     * rank frees the buffer while MPI may still copy from it (a rendezvous
     * send continues when the receiver's ack arrives). */
    MPI_Barrier(world);
    for (int i = 0; i < k; i++) {
        /* statuses of collectives are not defined; of receives they are,
         * except with MPI_Wait in reverse and *all (all filled) */
        verify(&p[i], &stat[i]);
        release(&p[i]);
    }
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "coll_nonblocking");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    const size_t sizes[] = {0, 1, 7919};
    unsigned variant = 0;
    for (int method = 0; method < NMETHOD; method++)
        batch(method, 7, MPI_COMM_WORLD, dup, variant++);
    /* the first blocking collectives, on the buffers the batches use */
    struct st_buf one = st_input(st_type_named("INT"), OP_SUM, 1, st.rank, 0, 4),
                  got = st_buf_new(4 * sizeof(int));
    st_ok(MPI_Allreduce(one.mpi, got.mpi, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD),
          "first blocking call");
    st_ok(MPI_Allreduce(one.mpi, got.mpi, 4, MPI_INT, MPI_SUM, dup), "first blocking call on dup");
    st_buf_free(&one);
    st_buf_free(&got);
    for (int s = 0; s < 3; s++)
        for (int method = 0; method < NMETHOD; method++)
            batch(method, sizes[s], MPI_COMM_WORLD, dup, variant++);
    if (st.large) {
        batch(WAITALL, st.large, MPI_COMM_WORLD, dup, variant++);
        batch(TESTSOME, st.large, MPI_COMM_WORLD, dup, variant++);
    }
    /* a request completed by MPI_Test right away and one waited twice */
    int x = st.rank + 1, sum = 0, flag = 0;
    MPI_Request r;
    MPI_Iallreduce(&x, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r);
    while (!flag && st_ok(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test loop"))
        ;
    if (sum != st.size * (st.size + 1) / 2 || r != MPI_REQUEST_NULL)
        st_fail("Iallreduce INT by a Test loop: sum %d, want %d", sum, st.size * (st.size + 1) / 2);
    else
        st_pass();
    st_ok(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait on MPI_REQUEST_NULL");
    MPI_Comm_free(&dup);
    return st_finish();
}

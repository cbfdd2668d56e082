/* Request handles under churn: nonblocking collectives and other requests
 * (MPI_Ibarrier, point-to-point) started and completed by every completion
 * call, in orders other than their start order, a send freed by
 * MPI_Request_free while in flight each round, so that MPI hands out the
 * same handle values again for other requests; a request freed or
 * completed must never be taken for the new one that reuses its handle.
 * Also MPI_REQUEST_NULL in every completion call (MPI_Request_free and
 * MPI_Cancel of it are errors MPI reports) and MPI_Request_get_status
 * before the wait. (MPI_Request_free and MPI_Cancel of a collective's
 * request are erroneous.) Half the rounds run before the first blocking
 * collective on the communicator, half after.
 * An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 60
#define N 33

static uint64_t next_seed = 31000;

struct coll {
    struct st_buf in, out;
    uint64_t seed;
};

static const struct st_type *ty;

static int start(struct coll *c, MPI_Request *r)
{
    c->seed = next_seed++;
    c->in = st_input(ty, OP_SUM, c->seed, st.rank, 0, N);
    c->out = st_buf_poisoned(N * ty->size);
    return MPI_Iallreduce(c->in.mpi, c->out.mpi, N, ty->type, MPI_SUM, MPI_COMM_WORLD, r);
}

static void check(struct coll *c, const char *label)
{
    char exp[N * 8];
    for (size_t i = 0; i < N; i++)
        st_store(ty, exp, i, st_reduce_elem(ty, OP_SUM, c->seed, st.size, i));
    st_pull(&c->out);
    st_compare(label, ty, c->out.host, exp, N);
    st_buf_free(&c->in);
    st_buf_free(&c->out);
}

/* One round: collectives a and b, an Ibarrier, a ring exchange whose send
 * is freed in flight (its buffer, `freed`, stays until the end), completed
 * by the call `how` picks. */
static void round_(int k, struct st_buf *freed)
{
    struct coll a, b;
    MPI_Request q[5];
    int hr = -1;
    int next = (st.rank + 1) % st.size, prev = (st.rank + st.size - 1) % st.size;
    char label[120];
    snprintf(label, sizeof label, "round %d", k);
    *freed = st_buf_new(sizeof(int));
    *(int *)freed->host = st.rank;
    st_push(freed);
    int ok = st_ok(start(&a, &q[0]), label);
    ok &= st_ok(MPI_Ibarrier(MPI_COMM_WORLD, &q[1]), label);
    ok &= st_ok(MPI_Isend(freed->mpi, 1, MPI_INT, next, k, MPI_COMM_WORLD, &q[4]), label);
    ok &= st_ok(MPI_Request_free(&q[4]), label);
    if (q[4] != MPI_REQUEST_NULL)
        st_fail("%s: MPI_Request_free left a handle", label);
    ok &= st_ok(MPI_Irecv(&hr, 1, MPI_INT, prev, k, MPI_COMM_WORLD, &q[2]), label);
    ok &= st_ok(start(&b, &q[3]), label);
    if (!ok)
        return;
    int how = k % 6, done = 0, idx, flag, out, ids[4];
    switch (how) {
    case 0: /* Waitall, reversed */
    {
        MPI_Request rev[4] = {q[3], q[2], q[1], q[0]};
        st_ok(MPI_Waitall(4, rev, MPI_STATUSES_IGNORE), label);
        for (int j = 0; j < 4; j++)
            q[j] = rev[3 - j];
        break;
    }
    case 1: /* Wait each, last started first */
        for (int j = 3; j >= 0; j--)
            st_ok(MPI_Wait(&q[j], MPI_STATUS_IGNORE), label);
        break;
    case 2: /* Waitany until all */
        while (done < 4 && st_ok(MPI_Waitany(4, q, &idx, MPI_STATUS_IGNORE), label)) {
            if (idx == MPI_UNDEFINED)
                break;
            done++;
        }
        if (done != 4)
            st_fail("%s: Waitany completed %d of 4", label, done);
        break;
    case 3: /* Testsome polling */
        while (done < 4 && st_ok(MPI_Testsome(4, q, &out, ids, MPI_STATUSES_IGNORE), label)) {
            if (out == MPI_UNDEFINED)
                break;
            done += out;
        }
        if (done != 4)
            st_fail("%s: Testsome completed %d of 4", label, done);
        break;
    case 4: /* Request_get_status, then Waitsome */
        flag = 0;
        while (!flag && st_ok(MPI_Request_get_status(q[3], &flag, MPI_STATUS_IGNORE), label))
            ;
        while (done < 4 && st_ok(MPI_Waitsome(4, q, &out, ids, MPI_STATUSES_IGNORE), label)) {
            if (out == MPI_UNDEFINED)
                break;
            done += out;
        }
        if (done != 4)
            st_fail("%s: Waitsome completed %d of 4", label, done);
        break;
    default: /* Test each, then Testall */
        flag = 0;
        while (!flag && st_ok(MPI_Test(&q[0], &flag, MPI_STATUS_IGNORE), label))
            ;
        flag = 0;
        while (!flag && st_ok(MPI_Testall(4, q, &flag, MPI_STATUSES_IGNORE), label))
            ;
        break;
    }
    for (int j = 0; j < 4; j++)
        if (q[j] != MPI_REQUEST_NULL)
            st_fail("%s: request %d not MPI_REQUEST_NULL after completion", label, j);
    check(&a, label);
    check(&b, label);
    if (hr == prev)
        st_pass();
    else
        st_fail("%s: ring exchange got %d want %d", label, hr, prev);
}

static void null_handles(void)
{
    MPI_Request n = MPI_REQUEST_NULL, arr[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                                                 MPI_REQUEST_NULL};
    int flag = 0, idx = 7, out = 7, ids[3];
    st_ok(MPI_Wait(&n, MPI_STATUS_IGNORE), "MPI_Wait(MPI_REQUEST_NULL)");
    if (st_ok(MPI_Test(&n, &flag, MPI_STATUS_IGNORE), "MPI_Test(MPI_REQUEST_NULL)") && !flag)
        st_fail("MPI_Test(MPI_REQUEST_NULL): flag 0");
    flag = 0;
    if (st_ok(MPI_Request_get_status(n, &flag, MPI_STATUS_IGNORE),
              "MPI_Request_get_status(MPI_REQUEST_NULL)") &&
        !flag)
        st_fail("MPI_Request_get_status(MPI_REQUEST_NULL): flag 0");
    st_ok(MPI_Waitall(3, arr, MPI_STATUSES_IGNORE), "MPI_Waitall of nulls");
    if (st_ok(MPI_Waitany(3, arr, &idx, MPI_STATUS_IGNORE), "MPI_Waitany of nulls") &&
        idx != MPI_UNDEFINED)
        st_fail("MPI_Waitany of nulls: index %d", idx);
    if (st_ok(MPI_Waitsome(3, arr, &out, ids, MPI_STATUSES_IGNORE), "MPI_Waitsome of nulls") &&
        out != MPI_UNDEFINED)
        st_fail("MPI_Waitsome of nulls: outcount %d", out);
    /* a null mixed with a live collective */
    struct coll c;
    MPI_Request mix[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (st_ok(start(&c, &mix[1]), "Iallreduce beside a null") &&
        st_ok(MPI_Waitall(2, mix, MPI_STATUSES_IGNORE), "Waitall of a null and a collective"))
        check(&c, "Waitall of a null and a collective");
    n = MPI_REQUEST_NULL;
    if (MPI_Request_free(&n) == MPI_SUCCESS)
        st_fail("MPI_Request_free(MPI_REQUEST_NULL) succeeded");
    else
        st_pass();
    if (MPI_Cancel(&n) == MPI_SUCCESS)
        st_fail("MPI_Cancel(MPI_REQUEST_NULL) succeeded");
    else
        st_pass();
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "requests");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    ty = st_type_named("INT");
    struct st_buf *freed = calloc(ROUNDS, sizeof *freed);
    for (int k = 0; k < ROUNDS; k++) {
        if (k == ROUNDS / 2) {
            /* The first blocking collective, halfway (a collectives library
             * may set a communicator up there). */
            struct coll w;
            MPI_Request r;
            if (st_ok(start(&w, &r), "Iallreduce before the first blocking call") &&
                st_ok(MPI_Wait(&r, MPI_STATUS_IGNORE), "its wait"))
                check(&w, "Iallreduce before the first blocking call");
            w.seed = next_seed++;
            w.in = st_input(ty, OP_SUM, w.seed, st.rank, 0, N);
            w.out = st_buf_poisoned(N * ty->size);
            if (st_ok(MPI_Allreduce(w.in.mpi, w.out.mpi, N, ty->type, MPI_SUM, MPI_COMM_WORLD),
                      "the first blocking Allreduce"))
                check(&w, "the first blocking Allreduce");
        }
        round_(k, &freed[k]);
    }
    null_handles();
    /* MPI does not say when a freed request's work ends: the freed sends'
     * buffers stay allocated until MPI_Finalize returned. */
    int status = st_report();
    MPI_Op_free(&st_ops[OP_USER]);
    MPI_Op_free(&st_ops[OP_USER_NC]);
    if (MPI_Finalize() != MPI_SUCCESS)
        status = 1;
    for (int k = 0; k < ROUNDS; k++)
        free(freed[k].host);
    free(freed);
    return status;
}

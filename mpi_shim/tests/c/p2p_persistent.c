/* Persistent point-to-point requests, MPI_Cancel and the statuses of
 * receives on the buffers the harness gives (device memory with --device):
 *
 *  - Send_init/Ssend_init/Bsend_init/Rsend_init with Recv_init around the
 *    ring, started and completed several times (restartable, inactive after
 *    completion) through every completion call, a host-buffer persistent
 *    request in the same Startall array, MPI_Request_free at the end;
 *  - a persistent receive of a short message and of a strided vector type
 *    (bytes no message reaches stay as they were);
 *  - MPI_Cancel of a started persistent receive (cancelled, buffer
 *    untouched, then restarted and completed), of a nonblocking receive and
 *    of a nonblocking send (MPI may or may not cancel a send: either outcome
 *    must be consistent);
 *  - MPI_Get_count/MPI_Get_elements on the statuses of every receive form
 *    and completion call, for a short message (7 of 10 ints: count 7,
 *    28 bytes, MPI_UNDEFINED doubles) and a partial vector type.
 * The oracle: the sender's data, computed by the receiver from (seed,
 * sender, index), and MPI's own status semantics (the same program without
 * the shim must pass). */
#include "shimtest.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pat(uint64_t seed, int src, size_t i)
{
    return (unsigned char)st_hash(seed, (uint64_t)src * 1000003u + i);
}

static void fill(struct st_buf *b, uint64_t seed, int src, size_t bytes)
{
    unsigned char *h = b->host;
    for (size_t i = 0; i < bytes; i++)
        h[i] = pat(seed, src, i);
    st_push(b);
}

/* h[0..n) is src's pattern, h[n..total) the poison. */
static int holds(const char *what, struct st_buf *b, uint64_t seed, int src, size_t n,
                 size_t total)
{
    st_pull(b);
    const unsigned char *h = b->host;
    for (size_t i = 0; i < n; i++)
        if (h[i] != pat(seed, src, i)) {
            st_fail("%s: byte %zu of %zu is %u, expected %u", what, i, n, h[i], pat(seed, src, i));
            return 0;
        }
    if (total > n && !st_untouched(what, h + n, total - n))
        return 0;
    st_pass();
    return 1;
}

static int next_rank(void) { return (st.rank + 1) % st.size; }
static int prev_rank(void) { return (st.rank + st.size - 1) % st.size; }

static void expect_status(const char *what, MPI_Status *s, int source, int tag, int bytes)
{
    int n = -2;
    MPI_Get_count(s, MPI_BYTE, &n);
    if (s->MPI_SOURCE != source || s->MPI_TAG != tag || n != bytes)
        st_fail("%s: status source %d tag %d count %d, expected %d %d %d", what, s->MPI_SOURCE,
                s->MPI_TAG, n, source, tag, bytes);
    else
        st_pass();
}

enum { SEND, SSEND, BSEND, RSEND };
static const char *form_names[] = {"Send_init", "Ssend_init", "Bsend_init", "Rsend_init"};

/* How round `round` completes the two requests {recv, send}. */
static void complete(MPI_Request q[2], MPI_Status s[2], int round)
{
    int flag = 0, idx = -1, out = 0, ind[2];
    MPI_Status one;
    switch (round % 6) {
    case 0:
        st_ok(MPI_Waitall(2, q, s), "MPI_Waitall");
        break;
    case 1:
        st_ok(MPI_Wait(&q[1], &s[1]), "MPI_Wait send");
        while (!flag)
            st_ok(MPI_Test(&q[0], &flag, &s[0]), "MPI_Test recv");
        break;
    case 2:
        while (!flag)
            st_ok(MPI_Testall(2, q, &flag, s), "MPI_Testall");
        break;
    case 3:
        for (int k = 0; k < 2; k++) {
            st_ok(MPI_Waitany(2, q, &idx, &one), "MPI_Waitany");
            if (idx == MPI_UNDEFINED) {
                st_fail("MPI_Waitany: no active request left");
                break;
            }
            s[idx] = one;
            /* a completed persistent request is inactive: take it out */
            q[idx] = MPI_REQUEST_NULL;
        }
        break;
    case 4: {
        int left = 2;
        while (left > 0) {
            /* statuses come in completion order: put them in place */
            MPI_Status got[2];
            st_ok(MPI_Waitsome(2, q, &out, ind, got), "MPI_Waitsome");
            if (out == MPI_UNDEFINED)
                break;
            for (int k = 0; k < out; k++) {
                s[ind[k]] = got[k];
                q[ind[k]] = MPI_REQUEST_NULL;
            }
            left -= out;
        }
        break;
    }
    default:
        while (!flag)
            st_ok(MPI_Request_get_status(q[0], &flag, &s[0]), "MPI_Request_get_status");
        st_ok(MPI_Wait(&q[0], &one), "MPI_Wait after get_status");
        st_ok(MPI_Wait(&q[1], &s[1]), "MPI_Wait send");
        break;
    }
}

/* One persistent form around the ring, several rounds, then freed. */
static void ring(int form, size_t bytes, int host_side)
{
    char what[96];
    struct st_buf sb = host_side ? st_buf_new_host(bytes) : st_buf_new(bytes);
    struct st_buf rb = st_buf_new(bytes + 8);
    MPI_Request q[2], keep[2];
    int n = (int)bytes, tag = 30 + form;
    st_ok(MPI_Recv_init(rb.mpi, n, MPI_BYTE, prev_rank(), tag, MPI_COMM_WORLD, &q[0]),
          "MPI_Recv_init");
    int rc;
    switch (form) {
    case SEND: rc = MPI_Send_init(sb.mpi, n, MPI_BYTE, next_rank(), tag, MPI_COMM_WORLD, &q[1]); break;
    case SSEND: rc = MPI_Ssend_init(sb.mpi, n, MPI_BYTE, next_rank(), tag, MPI_COMM_WORLD, &q[1]); break;
    case BSEND: rc = MPI_Bsend_init(sb.mpi, n, MPI_BYTE, next_rank(), tag, MPI_COMM_WORLD, &q[1]); break;
    default: rc = MPI_Rsend_init(sb.mpi, n, MPI_BYTE, next_rank(), tag, MPI_COMM_WORLD, &q[1]); break;
    }
    st_ok(rc, form_names[form]);
    keep[0] = q[0];
    keep[1] = q[1];
    /* Open MPI 4.1 sends zeros when a persistent Bsend is restarted (to self,
     * or above the eager limit; plain MPI, no shim): started once */
    int rounds = form == BSEND ? 1 : 6;
    for (int round = 0; round < rounds; round++) {
        uint64_t seed = 1000 + (uint64_t)form * 100 + (uint64_t)round + bytes * 7;
        fill(&sb, seed, st.rank, bytes);
        st_poison(&rb);
        q[0] = keep[0];
        q[1] = keep[1];
        if (form == RSEND) {
            /* a ready send needs its receive posted: start it, then agree */
            st_ok(MPI_Start(&q[0]), "MPI_Start recv");
            MPI_Barrier(MPI_COMM_WORLD);
            st_ok(MPI_Start(&q[1]), "MPI_Start rsend");
        } else if (round % 2) {
            st_ok(MPI_Startall(2, q), "MPI_Startall");
        } else {
            st_ok(MPI_Start(&q[1]), "MPI_Start send");
            st_ok(MPI_Start(&q[0]), "MPI_Start recv");
        }
        MPI_Status s[2];
        complete(q, s, round);
        snprintf(what, sizeof what, "%s %zu bytes round %d%s", form_names[form], bytes, round,
                 host_side ? " (host send buffer)" : "");
        if (round % 6 != 5)
            expect_status(what, &s[0], prev_rank(), tag, n);
        holds(what, &rb, seed, prev_rank(), bytes, bytes + 8);
        /* the send buffer is the program's again: MPI must not have changed it */
        holds("send buffer unchanged", &sb, seed, st.rank, bytes, bytes);
        if (round % 6 != 3 && round % 6 != 4 && (q[0] != keep[0] || q[1] != keep[1]))
            st_fail("%s: a persistent request changed its handle on completion", what);
    }
    st_ok(MPI_Request_free(&keep[0]), "MPI_Request_free recv");
    st_ok(MPI_Request_free(&keep[1]), "MPI_Request_free send");
    if (keep[0] != MPI_REQUEST_NULL || keep[1] != MPI_REQUEST_NULL)
        st_fail("MPI_Request_free left a handle");
    st_buf_free(&sb);
    st_buf_free(&rb);
}

/* A staged persistent request and a host one in the same Startall. */
static void mixed_startall(void)
{
    const size_t bytes = 333;
    struct st_buf s1 = st_buf_new(bytes), s2 = st_buf_new_host(bytes);
    struct st_buf r1 = st_buf_new_host(bytes), r2 = st_buf_new(bytes);
    MPI_Request q[4];
    MPI_Send_init(s1.mpi, (int)bytes, MPI_BYTE, next_rank(), 41, MPI_COMM_WORLD, &q[0]);
    MPI_Send_init(s2.mpi, (int)bytes, MPI_BYTE, next_rank(), 42, MPI_COMM_WORLD, &q[1]);
    MPI_Recv_init(r1.mpi, (int)bytes, MPI_BYTE, prev_rank(), 41, MPI_COMM_WORLD, &q[2]);
    MPI_Recv_init(r2.mpi, (int)bytes, MPI_BYTE, prev_rank(), 42, MPI_COMM_WORLD, &q[3]);
    for (int round = 0; round < 2; round++) {
        fill(&s1, 77 + (uint64_t)round, st.rank, bytes);
        fill(&s2, 88 + (uint64_t)round, st.rank, bytes);
        st_poison(&r1);
        st_poison(&r2);
        st_ok(MPI_Startall(4, q), "MPI_Startall mixed");
        st_ok(MPI_Waitall(4, q, MPI_STATUSES_IGNORE), "MPI_Waitall mixed");
        holds("mixed: device to host", &r1, 77 + (uint64_t)round, prev_rank(), bytes, bytes);
        holds("mixed: host to device", &r2, 88 + (uint64_t)round, prev_rank(), bytes, bytes);
    }
    for (int k = 0; k < 4; k++)
        st_ok(MPI_Request_free(&q[k]), "MPI_Request_free mixed");
    st_buf_free(&s1);
    st_buf_free(&s2);
    st_buf_free(&r1);
    st_buf_free(&r2);
}

/* 7 ints into a persistent receive of 10, and a vector type of 3 blocks of
 * 2 ints (stride 5) getting 5 ints: what no message byte reached stays. */
static void short_and_strided(void)
{
    int peer = st.rank ^ 1;
    if (peer >= st.size)
        return;
    MPI_Datatype v;
    MPI_Type_vector(3, 2, 5, MPI_INT, &v);
    MPI_Type_commit(&v);
    const size_t span = 12 * sizeof(int);
    if (st.rank % 2 == 0) {
        struct st_buf s = st_buf_new(10 * sizeof(int));
        MPI_Request q;
        MPI_Send_init(s.mpi, 7, MPI_INT, peer, 50, MPI_COMM_WORLD, &q);
        for (int round = 0; round < 2; round++) {
            fill(&s, 500 + (uint64_t)round, st.rank, 10 * sizeof(int));
            st_ok(MPI_Start(&q), "start short send");
            st_ok(MPI_Wait(&q, MPI_STATUS_IGNORE), "wait short send");
        }
        MPI_Request_free(&q);
        fill(&s, 600, st.rank, 10 * sizeof(int));
        st_ok(MPI_Send(s.mpi, 5, MPI_INT, peer, 51, MPI_COMM_WORLD), "send 5 ints");
        st_buf_free(&s);
    } else {
        struct st_buf r = st_buf_new(10 * sizeof(int));
        MPI_Request q;
        MPI_Status s;
        MPI_Recv_init(r.mpi, 10, MPI_INT, peer, 50, MPI_COMM_WORLD, &q);
        for (int round = 0; round < 2; round++) {
            st_poison(&r);
            st_ok(MPI_Start(&q), "start short recv");
            st_ok(MPI_Wait(&q, &s), "wait short recv");
            int n = -2, e = -2;
            MPI_Get_count(&s, MPI_INT, &n);
            MPI_Get_elements(&s, MPI_INT, &e);
            if (n != 7 || e != 7)
                st_fail("persistent short recv: count %d elements %d, expected 7", n, e);
            holds("persistent short recv", &r, 500 + (uint64_t)round, peer, 7 * sizeof(int),
                  10 * sizeof(int));
        }
        MPI_Request_free(&q);
        struct st_buf w = st_buf_new(span);
        st_poison(&w);
        MPI_Recv_init(w.mpi, 2, v, peer, 51, MPI_COMM_WORLD, &q);
        st_ok(MPI_Start(&q), "start vector recv");
        st_ok(MPI_Wait(&q, &s), "wait vector recv");
        int n = -2, e = -2;
        MPI_Get_count(&s, v, &n);
        MPI_Get_elements(&s, v, &e);
        if (n != MPI_UNDEFINED || e != 5)
            st_fail("partial vector: count %d elements %d, expected UNDEFINED and 5", n, e);
        else
            st_pass();
        st_pull(&w);
        const unsigned char *h = w.host;
        int bad = 0;
        /* ints 0,1 | 5,6 | 10 hold the message's ints 0..4; the rest poison */
        const int where[5] = {0, 1, 5, 6, 10};
        for (size_t i = 0; i < span && !bad; i++) {
            size_t elem = i / sizeof(int);
            int src = -1;
            for (int k = 0; k < 5; k++)
                if ((size_t)where[k] == elem)
                    src = k;
            unsigned char want =
                src < 0 ? ST_POISON : pat(600, peer, (size_t)src * sizeof(int) + i % sizeof(int));
            if (w.host && ((const unsigned char *)w.host)[i] != want) {
                st_fail("partial vector: byte %zu is %u, expected %u", i, h[i], want);
                bad = 1;
            }
        }
        if (!bad)
            st_pass();
        MPI_Request_free(&q);
        st_buf_free(&r);
        st_buf_free(&w);
    }
    MPI_Type_free(&v);
}

static int cancelled(MPI_Status *s)
{
    int flag = -1;
    MPI_Test_cancelled(s, &flag);
    return flag;
}

/* Cancel a started persistent receive, a nonblocking receive and a
 * nonblocking send, all to and from self. */
static void cancels(void)
{
    const size_t bytes = 96;
    int me = st.rank;
    struct st_buf r = st_buf_new(bytes);
    MPI_Request q;
    MPI_Status s;
    /* persistent: cancelled, untouched, then restarted and matched */
    MPI_Recv_init(r.mpi, (int)bytes, MPI_BYTE, me, 60, MPI_COMM_WORLD, &q);
    st_poison(&r);
    st_ok(MPI_Start(&q), "start the receive to cancel");
    st_ok(MPI_Cancel(&q), "MPI_Cancel persistent");
    st_ok(MPI_Wait(&q, &s), "wait cancelled persistent");
    if (!cancelled(&s))
        st_fail("a started persistent receive nobody matched was not cancelled");
    else
        st_pass();
    holds("cancelled persistent receive leaves the buffer", &r, 0, 0, 0, bytes);
    struct st_buf m = st_buf_new(bytes);
    fill(&m, 61, me, bytes);
    st_ok(MPI_Start(&q), "restart after cancel");
    st_ok(MPI_Send(m.mpi, (int)bytes, MPI_BYTE, me, 60, MPI_COMM_WORLD), "send to self");
    st_ok(MPI_Wait(&q, &s), "wait restarted receive");
    if (cancelled(&s))
        st_fail("the restarted receive says cancelled");
    expect_status("restarted after cancel", &s, me, 60, (int)bytes);
    holds("restarted after cancel", &r, 61, me, bytes, bytes);
    MPI_Request_free(&q);

    /* nonblocking receive */
    st_poison(&r);
    st_ok(MPI_Irecv(r.mpi, (int)bytes, MPI_BYTE, me, 62, MPI_COMM_WORLD, &q), "irecv to cancel");
    st_ok(MPI_Cancel(&q), "MPI_Cancel irecv");
    st_ok(MPI_Wait(&q, &s), "wait cancelled irecv");
    if (!cancelled(&s))
        st_fail("a staged Irecv nobody matched was not cancelled");
    else
        st_pass();
    holds("cancelled Irecv leaves the buffer", &r, 0, 0, 0, bytes);

    /* nonblocking send: cancelled (nothing to receive) or delivered */
    fill(&m, 63, me, bytes);
    st_ok(MPI_Isend(m.mpi, (int)bytes, MPI_BYTE, me, 63, MPI_COMM_WORLD, &q), "isend to cancel");
    st_ok(MPI_Cancel(&q), "MPI_Cancel isend");
    st_ok(MPI_Wait(&q, &s), "wait cancelled isend");
    int flag = 0;
    MPI_Iprobe(me, 63, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    if (cancelled(&s)) {
        if (flag)
            st_fail("a cancelled Isend was delivered");
        else
            st_pass();
    } else {
        st_poison(&r);
        st_ok(MPI_Recv(r.mpi, (int)bytes, MPI_BYTE, me, 63, MPI_COMM_WORLD, &s),
              "receive the send MPI did not cancel");
        holds("uncancelled Isend delivered", &r, 63, me, bytes, bytes);
    }
    st_buf_free(&r);
    st_buf_free(&m);
}

/* The counts of one status of a 7-int message received into 10 ints. */
static void seven_ints(const char *what, MPI_Status *s, int source)
{
    int c_int = -2, c_byte = -2, c_double = -2, e_int = -2, e_byte = -2;
    MPI_Get_count(s, MPI_INT, &c_int);
    MPI_Get_count(s, MPI_BYTE, &c_byte);
    MPI_Get_count(s, MPI_DOUBLE, &c_double);
    MPI_Get_elements(s, MPI_INT, &e_int);
    MPI_Get_elements(s, MPI_BYTE, &e_byte);
    if (c_int != 7 || c_byte != 28 || c_double != MPI_UNDEFINED || e_int != 7 || e_byte != 28 ||
        s->MPI_SOURCE != source || s->MPI_TAG != 70)
        st_fail("%s: counts int %d byte %d double %d, elements int %d byte %d, source %d tag %d",
                what, c_int, c_byte, c_double, e_int, e_byte, s->MPI_SOURCE, s->MPI_TAG);
    else
        st_pass();
}

enum { F_RECV, F_MRECV, F_SENDRECV, F_WAIT, F_TEST, F_WAITALL, F_WAITANY, F_WAITSOME, F_TESTANY,
       F_TESTSOME, F_TESTALL, F_GETSTATUS, F_IMRECV, F_FORMS };
static const char *f_names[] = {"Recv", "Mrecv", "Sendrecv", "Irecv+Wait", "Irecv+Test",
                                "Irecv+Waitall", "Irecv+Waitany", "Irecv+Waitsome",
                                "Irecv+Testany", "Irecv+Testsome", "Irecv+Testall",
                                "Irecv+Request_get_status", "Imrecv+Wait"};

/* Every receive form and completion call gets a 7-int message into 10
 * ints: the status and the untouched tail. */
static void statuses(void)
{
    int peer = st.rank ^ 1;
    if (peer >= st.size)
        return;
    struct st_buf r = st_buf_new(10 * sizeof(int)), m = st_buf_new(10 * sizeof(int));
    for (int f = 0; f < F_FORMS; f++) {
        uint64_t seed = 700 + (uint64_t)f;
        fill(&m, seed, st.rank, 10 * sizeof(int));
        st_poison(&r);
        MPI_Status s;
        MPI_Request q = MPI_REQUEST_NULL;
        MPI_Message msg;
        int flag = 0, idx = -1, out = 0, ind[1];
        if (f == F_SENDRECV) {
            st_ok(MPI_Sendrecv(m.mpi, 7, MPI_INT, peer, 70, r.mpi, 10, MPI_INT, peer, 70,
                               MPI_COMM_WORLD, &s),
                  "MPI_Sendrecv");
        } else if (st.rank % 2 == 0) {
            st_ok(MPI_Send(m.mpi, 7, MPI_INT, peer, 70, MPI_COMM_WORLD), "send 7 ints");
            continue;
        } else {
            switch (f) {
            case F_RECV:
                st_ok(MPI_Recv(r.mpi, 10, MPI_INT, MPI_ANY_SOURCE, 70, MPI_COMM_WORLD, &s), "recv");
                break;
            case F_MRECV:
                MPI_Mprobe(peer, 70, MPI_COMM_WORLD, &msg, MPI_STATUS_IGNORE);
                st_ok(MPI_Mrecv(r.mpi, 10, MPI_INT, &msg, &s), "MPI_Mrecv");
                break;
            case F_IMRECV:
                MPI_Mprobe(peer, 70, MPI_COMM_WORLD, &msg, MPI_STATUS_IGNORE);
                st_ok(MPI_Imrecv(r.mpi, 10, MPI_INT, &msg, &q), "MPI_Imrecv");
                st_ok(MPI_Wait(&q, &s), "wait imrecv");
                break;
            default:
                st_ok(MPI_Irecv(r.mpi, 10, MPI_INT, peer, 70, MPI_COMM_WORLD, &q), "irecv");
                switch (f) {
                case F_WAIT: st_ok(MPI_Wait(&q, &s), "wait"); break;
                case F_TEST:
                    while (!flag)
                        st_ok(MPI_Test(&q, &flag, &s), "test");
                    break;
                case F_WAITALL: st_ok(MPI_Waitall(1, &q, &s), "waitall"); break;
                case F_WAITANY: st_ok(MPI_Waitany(1, &q, &idx, &s), "waitany"); break;
                case F_WAITSOME: st_ok(MPI_Waitsome(1, &q, &out, ind, &s), "waitsome"); break;
                case F_TESTANY:
                    while (!flag)
                        st_ok(MPI_Testany(1, &q, &idx, &flag, &s), "testany");
                    break;
                case F_TESTSOME:
                    while (out == 0)
                        st_ok(MPI_Testsome(1, &q, &out, ind, &s), "testsome");
                    break;
                case F_TESTALL:
                    while (!flag)
                        st_ok(MPI_Testall(1, &q, &flag, &s), "testall");
                    break;
                default:
                    while (!flag)
                        st_ok(MPI_Request_get_status(q, &flag, &s), "get_status");
                    st_ok(MPI_Wait(&q, MPI_STATUS_IGNORE), "wait after get_status");
                    break;
                }
            }
        }
        seven_ints(f_names[f], &s, peer);
        holds(f_names[f], &r, seed, peer, 7 * sizeof(int), 10 * sizeof(int));
    }
    st_buf_free(&r);
    st_buf_free(&m);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "p2p_persistent");
    size_t bsend_bytes = (4u << 20) + 16 * MPI_BSEND_OVERHEAD;
    void *attach = malloc(bsend_bytes);
    MPI_Buffer_attach(attach, (int)bsend_bytes);
    size_t sizes[] = {0, 1, 1021, st.large ? st.large : 0};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        if (k == 3 && sizes[k] == 0)
            break;
        for (int form = 0; form < 4; form++)
            ring(form, sizes[k], 0);
        ring(SEND, sizes[k], 1);
    }
    mixed_startall();
    short_and_strided();
    cancels();
    statuses();
    int sz;
    MPI_Buffer_detach(&attach, &sz);
    free(attach);
    return st_finish();
}

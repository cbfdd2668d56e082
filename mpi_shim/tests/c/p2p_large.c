/* The MPI-4 large-count forms of point-to-point (MPI_Send_c ...) that the
 * gpucoll shim exports, on the buffers the harness gives (device memory with
 * --device). Open MPI 4.1's mpi.h declares none of them, so they are
 * declared here as weak symbols: run with the shim (preloaded or linked).
 * Each form moves a message checked against the sender's pattern, statuses
 * give the count, and a count above INT_MAX is MPI_ERR_COUNT under
 * MPI_ERRORS_RETURN. */
#include "shimtest.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#define W __attribute__((weak))
typedef MPI_Datatype T;
typedef MPI_Count C;
typedef MPI_Comm M;
typedef MPI_Request R;
W int MPI_Send_c(const void *, C, T, int, int, M);
W int MPI_Ssend_c(const void *, C, T, int, int, M);
W int MPI_Bsend_c(const void *, C, T, int, int, M);
W int MPI_Rsend_c(const void *, C, T, int, int, M);
W int MPI_Recv_c(void *, C, T, int, int, M, MPI_Status *);
W int MPI_Isend_c(const void *, C, T, int, int, M, R *);
W int MPI_Issend_c(const void *, C, T, int, int, M, R *);
W int MPI_Ibsend_c(const void *, C, T, int, int, M, R *);
W int MPI_Irsend_c(const void *, C, T, int, int, M, R *);
W int MPI_Irecv_c(void *, C, T, int, int, M, R *);
W int MPI_Send_init_c(const void *, C, T, int, int, M, R *);
W int MPI_Bsend_init_c(const void *, C, T, int, int, M, R *);
W int MPI_Ssend_init_c(const void *, C, T, int, int, M, R *);
W int MPI_Rsend_init_c(const void *, C, T, int, int, M, R *);
W int MPI_Recv_init_c(void *, C, T, int, int, M, R *);
W int MPI_Sendrecv_c(const void *, C, T, int, int, void *, C, T, int, int, M, MPI_Status *);
W int MPI_Sendrecv_replace_c(void *, C, T, int, int, int, int, M, MPI_Status *);
W int MPI_Mrecv_c(void *, C, T, MPI_Message *, MPI_Status *);
W int MPI_Imrecv_c(void *, C, T, MPI_Message *, R *);

static unsigned char pat(uint64_t seed, int src, size_t i)
{
    return (unsigned char)st_hash(seed, (uint64_t)src * 7919u + i);
}

static void fill(struct st_buf *b, uint64_t seed, size_t bytes)
{
    unsigned char *h = b->host;
    for (size_t i = 0; i < bytes; i++)
        h[i] = pat(seed, st.rank, i);
    st_push(b);
}

static void holds(const char *what, struct st_buf *b, uint64_t seed, int src, size_t n,
                  size_t total)
{
    st_pull(b);
    const unsigned char *h = b->host;
    for (size_t i = 0; i < n; i++)
        if (h[i] != pat(seed, src, i)) {
            st_fail("%s: byte %zu is %u, expected %u", what, i, h[i], pat(seed, src, i));
            return;
        }
    if (total > n && !st_untouched(what, h + n, total - n))
        return;
    st_pass();
}

static void count_is(const char *what, MPI_Status *s, int bytes)
{
    int n = -2;
    MPI_Get_count(s, MPI_BYTE, &n);
    if (n != bytes)
        st_fail("%s: status count %d, expected %d", what, n, bytes);
    else
        st_pass();
}

enum { N = 1021 };

/* Blocking sends between pairs, received with MPI_Recv_c. */
static void blocking(int peer)
{
    struct st_buf s = st_buf_new(N), r = st_buf_new(N + 5);
    for (int form = 0; form < 4; form++) {
        uint64_t seed = 10 + (uint64_t)form;
        if (st.rank % 2 == 0) {
            fill(&s, seed, N);
            if (form == 3)
                MPI_Recv(NULL, 0, MPI_BYTE, peer, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            int rc = form == 0   ? MPI_Send_c(s.mpi, N, MPI_BYTE, peer, form, MPI_COMM_WORLD)
                     : form == 1 ? MPI_Ssend_c(s.mpi, N, MPI_BYTE, peer, form, MPI_COMM_WORLD)
                     : form == 2 ? MPI_Bsend_c(s.mpi, N, MPI_BYTE, peer, form, MPI_COMM_WORLD)
                                 : MPI_Rsend_c(s.mpi, N, MPI_BYTE, peer, form, MPI_COMM_WORLD);
            st_ok(rc, "MPI_*send_c");
        } else {
            st_poison(&r);
            MPI_Status st_;
            if (form == 3) {
                MPI_Request q;
                st_ok(MPI_Irecv_c(r.mpi, N + 5, MPI_BYTE, peer, form, MPI_COMM_WORLD, &q),
                      "MPI_Irecv_c");
                MPI_Send(NULL, 0, MPI_BYTE, peer, 99, MPI_COMM_WORLD);
                st_ok(MPI_Wait(&q, &st_), "wait Irecv_c");
            } else {
                st_ok(MPI_Recv_c(r.mpi, N + 5, MPI_BYTE, peer, form, MPI_COMM_WORLD, &st_),
                      "MPI_Recv_c");
            }
            count_is("blocking _c", &st_, N);
            holds("blocking _c", &r, seed, peer, N, N + 5);
        }
    }
    st_buf_free(&s);
    st_buf_free(&r);
}

/* Nonblocking and persistent forms around the ring. */
static void ring(void)
{
    int next = (st.rank + 1) % st.size, prev = (st.rank + st.size - 1) % st.size;
    struct st_buf s = st_buf_new(N), r = st_buf_new(N);
    for (int form = 0; form < 3; form++) {
        uint64_t seed = 30 + (uint64_t)form;
        fill(&s, seed, N);
        st_poison(&r);
        MPI_Request q[2];
        MPI_Status ss[2];
        st_ok(MPI_Irecv_c(r.mpi, N, MPI_BYTE, prev, 7, MPI_COMM_WORLD, &q[0]), "MPI_Irecv_c");
        int rc = form == 0   ? MPI_Isend_c(s.mpi, N, MPI_BYTE, next, 7, MPI_COMM_WORLD, &q[1])
                 : form == 1 ? MPI_Issend_c(s.mpi, N, MPI_BYTE, next, 7, MPI_COMM_WORLD, &q[1])
                             : MPI_Ibsend_c(s.mpi, N, MPI_BYTE, next, 7, MPI_COMM_WORLD, &q[1]);
        st_ok(rc, "MPI_I*send_c");
        st_ok(MPI_Waitall(2, q, ss), "waitall _c");
        count_is("nonblocking _c", &ss[0], N);
        holds("nonblocking _c", &r, seed, prev, N, N);
    }
    for (int form = 0; form < 3; form++) {
        MPI_Request q[2];
        MPI_Status ss[2];
        st_ok(MPI_Recv_init_c(r.mpi, N, MPI_BYTE, prev, 8, MPI_COMM_WORLD, &q[0]),
              "MPI_Recv_init_c");
        int rc = form == 0   ? MPI_Send_init_c(s.mpi, N, MPI_BYTE, next, 8, MPI_COMM_WORLD, &q[1])
                 : form == 1 ? MPI_Ssend_init_c(s.mpi, N, MPI_BYTE, next, 8, MPI_COMM_WORLD, &q[1])
                             : MPI_Bsend_init_c(s.mpi, N, MPI_BYTE, next, 8, MPI_COMM_WORLD, &q[1]);
        st_ok(rc, "MPI_*send_init_c");
        uint64_t seed = 40 + (uint64_t)form;
        fill(&s, seed, N);
        st_poison(&r);
        st_ok(MPI_Startall(2, q), "startall _c");
        st_ok(MPI_Waitall(2, q, ss), "waitall persistent _c");
        count_is("persistent _c", &ss[0], N);
        holds("persistent _c", &r, seed, prev, N, N);
        MPI_Request_free(&q[0]);
        MPI_Request_free(&q[1]);
    }
    /* a ready send needs the receive posted first */
    MPI_Request q[2];
    st_ok(MPI_Recv_init_c(r.mpi, N, MPI_BYTE, prev, 9, MPI_COMM_WORLD, &q[0]), "Recv_init_c");
    st_ok(MPI_Rsend_init_c(s.mpi, N, MPI_BYTE, next, 9, MPI_COMM_WORLD, &q[1]), "Rsend_init_c");
    fill(&s, 50, N);
    st_poison(&r);
    MPI_Start(&q[0]);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Start(&q[1]);
    MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
    holds("rsend_init _c", &r, 50, prev, N, N);
    MPI_Request_free(&q[0]);
    MPI_Request_free(&q[1]);
    /* Irsend_c likewise */
    st_poison(&r);
    st_ok(MPI_Irecv_c(r.mpi, N, MPI_BYTE, prev, 10, MPI_COMM_WORLD, &q[0]), "irecv for irsend");
    MPI_Barrier(MPI_COMM_WORLD);
    fill(&s, 51, N);
    st_ok(MPI_Irsend_c(s.mpi, N, MPI_BYTE, next, 10, MPI_COMM_WORLD, &q[1]), "MPI_Irsend_c");
    MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
    holds("irsend _c", &r, 51, prev, N, N);
    /* Sendrecv_c and Sendrecv_replace_c */
    fill(&s, 52, N);
    st_poison(&r);
    MPI_Status one;
    st_ok(MPI_Sendrecv_c(s.mpi, N, MPI_BYTE, next, 11, r.mpi, N, MPI_BYTE, prev, 11,
                         MPI_COMM_WORLD, &one),
          "MPI_Sendrecv_c");
    count_is("sendrecv _c", &one, N);
    holds("sendrecv _c", &r, 52, prev, N, N);
    fill(&s, 53, N);
    st_ok(MPI_Sendrecv_replace_c(s.mpi, N, MPI_BYTE, next, 12, prev, 12, MPI_COMM_WORLD, &one),
          "MPI_Sendrecv_replace_c");
    holds("sendrecv_replace _c", &s, 53, prev, N, N);
    st_buf_free(&s);
    st_buf_free(&r);
}

/* Matched receives from self. */
static void matched(void)
{
    struct st_buf s = st_buf_new(N), r = st_buf_new(N);
    MPI_Message m;
    MPI_Status one;
    MPI_Request q;
    fill(&s, 60, N);
    st_poison(&r);
    st_ok(MPI_Isend(s.mpi, 500, MPI_BYTE, st.rank, 13, MPI_COMM_WORLD, &q), "isend to self");
    MPI_Mprobe(st.rank, 13, MPI_COMM_WORLD, &m, MPI_STATUS_IGNORE);
    st_ok(MPI_Mrecv_c(r.mpi, N, MPI_BYTE, &m, &one), "MPI_Mrecv_c");
    MPI_Wait(&q, MPI_STATUS_IGNORE);
    count_is("mrecv _c", &one, 500);
    holds("mrecv _c", &r, 60, st.rank, 500, N);
    st_poison(&r);
    st_ok(MPI_Isend(s.mpi, 300, MPI_BYTE, st.rank, 14, MPI_COMM_WORLD, &q), "isend to self");
    MPI_Mprobe(st.rank, 14, MPI_COMM_WORLD, &m, MPI_STATUS_IGNORE);
    MPI_Request rq;
    st_ok(MPI_Imrecv_c(r.mpi, N, MPI_BYTE, &m, &rq), "MPI_Imrecv_c");
    MPI_Wait(&q, MPI_STATUS_IGNORE);
    st_ok(MPI_Wait(&rq, &one), "wait imrecv _c");
    count_is("imrecv _c", &one, 300);
    holds("imrecv _c", &r, 60, st.rank, 300, N);
    st_buf_free(&s);
    st_buf_free(&r);
}

static void too_large(void)
{
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    C big = (C)INT_MAX + 1;
    struct st_buf b = st_buf_new(16);
    MPI_Request q = MPI_REQUEST_NULL;
    MPI_Message m = MPI_MESSAGE_NO_PROC;
    int codes[] = {
        MPI_Send_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD),
        MPI_Ssend_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD),
        MPI_Bsend_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD),
        MPI_Rsend_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD),
        MPI_Recv_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        MPI_Isend_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Issend_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Ibsend_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Irsend_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Irecv_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Send_init_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Bsend_init_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Ssend_init_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Rsend_init_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Recv_init_c(b.mpi, big, MPI_BYTE, st.rank, 0, MPI_COMM_WORLD, &q),
        MPI_Sendrecv_c(b.mpi, 1, MPI_BYTE, MPI_PROC_NULL, 0, b.mpi, big, MPI_BYTE, MPI_PROC_NULL,
                       0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        MPI_Sendrecv_c(b.mpi, big, MPI_BYTE, MPI_PROC_NULL, 0, b.mpi, 1, MPI_BYTE, MPI_PROC_NULL,
                       0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        MPI_Sendrecv_replace_c(b.mpi, big, MPI_BYTE, MPI_PROC_NULL, 0, MPI_PROC_NULL, 0,
                               MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        MPI_Mrecv_c(b.mpi, big, MPI_BYTE, &m, MPI_STATUS_IGNORE),
        MPI_Imrecv_c(b.mpi, big, MPI_BYTE, &m, &q),
    };
    for (size_t k = 0; k < sizeof codes / sizeof codes[0]; k++) {
        int cls = -1;
        MPI_Error_class(codes[k], &cls);
        if (cls != MPI_ERR_COUNT)
            st_fail("form %zu with a count above INT_MAX: class %d, expected MPI_ERR_COUNT", k,
                    cls);
        else
            st_pass();
    }
    if (q != MPI_REQUEST_NULL)
        st_fail("a refused _c call made a request");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    st_buf_free(&b);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "p2p_large");
    if (!MPI_Send_c || !MPI_Imrecv_c || !MPI_Recv_init_c) {
        st_fail("no MPI_*_c symbols: run with the gpucoll shim");
        return st_finish();
    }
    size_t attach_bytes = 8 * (N + MPI_BSEND_OVERHEAD);
    void *attach = malloc(attach_bytes);
    MPI_Buffer_attach(attach, (int)attach_bytes);
    int peer = st.rank ^ 1;
    if (peer < st.size)
        blocking(peer);
    ring();
    matched();
    too_large();
    int sz;
    MPI_Buffer_detach(&attach, &sz);
    free(attach);
    return st_finish();
}

/* Point-to-point on the buffers the harness gives (device memory with
 * --device): every send/receive form, matching, truncation, PROC_NULL,
 * derived types. The oracle is the sender's data, computed locally by the
 * receiver from (seed, sender, index); bytes a receive must not touch are
 * poisoned and checked. */
#include "shimtest.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pat(uint64_t seed, int src, size_t i) {
    return (unsigned char)st_hash(seed, (uint64_t)src * 1000003u + i);
}

static struct st_buf pattern_buf(uint64_t seed, int src, size_t bytes, int host) {
    struct st_buf b = host ? st_buf_new_host(bytes) : st_buf_new(bytes);
    unsigned char *h = b.host;
    for (size_t i = 0; i < bytes; i++) h[i] = pat(seed, src, i);
    st_push(&b);
    return b;
}

static struct st_buf poisoned(size_t bytes, int host) {
    struct st_buf b = host ? st_buf_new_host(bytes) : st_buf_new(bytes);
    st_poison(&b);
    return b;
}

/* got[0..n) holds src's pattern, got[n..total) the poison. */
static void expect(const char *what, struct st_buf *b, uint64_t seed, int src, size_t n,
                   size_t total) {
    st_pull(b);
    const unsigned char *h = b->host;
    for (size_t i = 0; i < n; i++)
        if (h[i] != pat(seed, src, i)) {
            st_fail("%s: byte %zu of %zu is %u, expected %u", what, i, n, h[i],
                    pat(seed, src, i));
            return;
        }
    if (total > n && !st_untouched(what, h + n, total - n)) return;
    st_pass();
}

static int next_rank(void) { return (st.rank + 1) % st.size; }
static int prev_rank(void) { return (st.rank + st.size - 1) % st.size; }

/* Isend/Irecv (and the other nonblocking sends) around the ring. */
static void ring_nonblocking(size_t bytes, int which, int mixed) {
    uint64_t seed = 100 + bytes * 7 + (uint64_t)which;
    struct st_buf s = pattern_buf(seed, st.rank, bytes, mixed && st.rank % 2);
    struct st_buf r = poisoned(bytes + 16, mixed && st.rank % 2 == 0);
    MPI_Request q[2];
    st_ok(MPI_Irecv(r.mpi, (int)bytes, MPI_BYTE, prev_rank(), 5, MPI_COMM_WORLD, &q[0]),
          "MPI_Irecv");
    int rc;
    switch (which) {
    case 0: rc = MPI_Isend(s.mpi, (int)bytes, MPI_BYTE, next_rank(), 5, MPI_COMM_WORLD, &q[1]); break;
    case 1: rc = MPI_Issend(s.mpi, (int)bytes, MPI_BYTE, next_rank(), 5, MPI_COMM_WORLD, &q[1]); break;
    default: rc = MPI_Ibsend(s.mpi, (int)bytes, MPI_BYTE, next_rank(), 5, MPI_COMM_WORLD, &q[1]); break;
    }
    st_ok(rc, "MPI_I*send");
    MPI_Status stt[2];
    st_ok(MPI_Waitall(2, q, stt), "MPI_Waitall");
    int n = -1;
    MPI_Get_count(&stt[0], MPI_BYTE, &n);
    if (n != (int)bytes || stt[0].MPI_SOURCE != prev_rank() || stt[0].MPI_TAG != 5)
        st_fail("ring %d/%zu: status count %d source %d tag %d", which, bytes, n,
                stt[0].MPI_SOURCE, stt[0].MPI_TAG);
    char what[64];
    snprintf(what, sizeof what, "ring form %d, %zu bytes%s", which, bytes, mixed ? ", mixed" : "");
    expect(what, &r, seed, prev_rank(), bytes, bytes + 16);
    st_buf_free(&s);
    st_buf_free(&r);
}

static void ring_sendrecv(size_t bytes) {
    uint64_t seed = 300 + bytes;
    struct st_buf s = pattern_buf(seed, st.rank, bytes, 0);
    struct st_buf r = poisoned(bytes + 8, 0);
    MPI_Status stt;
    st_ok(MPI_Sendrecv(s.mpi, (int)bytes, MPI_BYTE, next_rank(), 9, r.mpi, (int)bytes, MPI_BYTE,
                       prev_rank(), 9, MPI_COMM_WORLD, &stt),
          "MPI_Sendrecv");
    expect("sendrecv", &r, seed, prev_rank(), bytes, bytes + 8);
    struct st_buf x = pattern_buf(seed + 1, st.rank, bytes, 0);
    st_ok(MPI_Sendrecv_replace(x.mpi, (int)bytes, MPI_BYTE, next_rank(), 3, prev_rank(), 3,
                               MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Sendrecv_replace");
    expect("sendrecv_replace", &x, seed + 1, prev_rank(), bytes, bytes);
    st_buf_free(&s);
    st_buf_free(&r);
    st_buf_free(&x);
}

/* Blocking forms between pairs (0,1), (2,3), ...; Rsend after the receive
 * is posted. */
static void pairs_blocking(size_t bytes) {
    int peer = st.rank ^ 1;
    if (peer >= st.size) return;
    int sender = st.rank % 2 == 0;
    for (int form = 0; form < 4; form++) {
        uint64_t seed = 500 + (uint64_t)form * 11 + bytes;
        if (sender) {
            struct st_buf s = pattern_buf(seed, st.rank, bytes, 0);
            int rc = 0;
            if (form == 3) MPI_Recv(NULL, 0, MPI_BYTE, peer, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            switch (form) {
            case 0: rc = MPI_Send(s.mpi, (int)bytes, MPI_BYTE, peer, form, MPI_COMM_WORLD); break;
            case 1: rc = MPI_Ssend(s.mpi, (int)bytes, MPI_BYTE, peer, form, MPI_COMM_WORLD); break;
            case 2: rc = MPI_Bsend(s.mpi, (int)bytes, MPI_BYTE, peer, form, MPI_COMM_WORLD); break;
            default: rc = MPI_Rsend(s.mpi, (int)bytes, MPI_BYTE, peer, form, MPI_COMM_WORLD); break;
            }
            st_ok(rc, "blocking send");
            st_buf_free(&s);
        } else {
            struct st_buf r = poisoned(bytes + 4, 0);
            MPI_Status stt;
            if (form == 3) {
                MPI_Request q;
                st_ok(MPI_Irecv(r.mpi, (int)bytes, MPI_BYTE, peer, form, MPI_COMM_WORLD, &q), "irecv");
                MPI_Send(NULL, 0, MPI_BYTE, peer, 77, MPI_COMM_WORLD);
                st_ok(MPI_Wait(&q, &stt), "wait");
            } else {
                st_ok(MPI_Recv(r.mpi, (int)bytes, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG,
                               MPI_COMM_WORLD, &stt),
                      "MPI_Recv");
            }
            int n = -1;
            MPI_Get_count(&stt, MPI_BYTE, &n);
            if (n != (int)bytes || stt.MPI_SOURCE != peer || stt.MPI_TAG != form)
                st_fail("blocking form %d: count %d source %d tag %d", form, n, stt.MPI_SOURCE,
                        stt.MPI_TAG);
            expect("blocking", &r, seed, peer, bytes, bytes + 4);
            st_buf_free(&r);
        }
    }
}

/* Non-overtaking: four messages of one (source, tag, comm), from host and
 * device buffers alternately, received with ANY_TAG into alternating kinds. */
static void ordering(void) {
    int peer = st.rank ^ 1;
    if (peer >= st.size) return;
    const size_t bytes = 1021;
    if (st.rank % 2 == 0) {
        for (int k = 0; k < 4; k++) {
            struct st_buf s = pattern_buf(900 + (uint64_t)k, st.rank, bytes, k % 2);
            st_ok(MPI_Send(s.mpi, (int)bytes, MPI_BYTE, peer, 4, MPI_COMM_WORLD), "order send");
            st_buf_free(&s);
        }
    } else {
        struct st_buf r[4];
        MPI_Request q[4];
        for (int k = 0; k < 4; k++) {
            r[k] = poisoned(bytes, k % 2 == 0);
            st_ok(MPI_Irecv(r[k].mpi, (int)bytes, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG,
                            MPI_COMM_WORLD, &q[k]),
                  "order irecv");
        }
        for (int k = 3; k >= 0; k--) st_ok(MPI_Wait(&q[k], MPI_STATUS_IGNORE), "order wait");
        for (int k = 0; k < 4; k++) expect("non-overtaking", &r[k], 900 + (uint64_t)k, peer, bytes, bytes);
        for (int k = 0; k < 4; k++) st_buf_free(&r[k]);
    }
}

/* Truncation under MPI_ERRORS_RETURN, PROC_NULL, probes. */
static void edges(void) {
    int peer = st.rank ^ 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    struct st_buf r = poisoned(64, 0);
    MPI_Status stt;
    stt.MPI_SOURCE = 12345;
    int rc = MPI_Recv(r.mpi, 16, MPI_BYTE, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &stt);
    int n = -1;
    MPI_Get_count(&stt, MPI_BYTE, &n);
    if (rc != MPI_SUCCESS || stt.MPI_SOURCE != MPI_PROC_NULL || n != 0)
        st_fail("recv from PROC_NULL: rc %d source %d count %d", rc, stt.MPI_SOURCE, n);
    else
        st_pass();
    st_ok(MPI_Send(r.mpi, 16, MPI_BYTE, MPI_PROC_NULL, 0, MPI_COMM_WORLD), "send to PROC_NULL");
    expect("PROC_NULL leaves the buffer", &r, 0, 0, 0, 64);
    if (peer < st.size) {
        if (st.rank % 2 == 0) {
            struct st_buf s = pattern_buf(77, st.rank, 40, 0);
            st_ok(MPI_Send(s.mpi, 40, MPI_BYTE, peer, 21, MPI_COMM_WORLD), "trunc send");
            st_ok(MPI_Send(s.mpi, 40, MPI_BYTE, peer, 22, MPI_COMM_WORLD), "trunc isend");
            st_ok(MPI_Send(s.mpi, 33, MPI_BYTE, peer, 23, MPI_COMM_WORLD), "mprobe send");
            st_ok(MPI_Send(s.mpi, 31, MPI_BYTE, peer, 24, MPI_COMM_WORLD), "improbe send");
            st_buf_free(&s);
        } else {
            int cls = -1;
            rc = MPI_Recv(r.mpi, 20, MPI_BYTE, peer, 21, MPI_COMM_WORLD, &stt);
            MPI_Error_class(rc, &cls);
            if (cls != MPI_ERR_TRUNCATE || stt.MPI_SOURCE != peer || stt.MPI_TAG != 21)
                st_fail("truncated recv: class %d source %d tag %d", cls, stt.MPI_SOURCE,
                        stt.MPI_TAG);
            else
                st_pass();
            MPI_Request q;
            st_ok(MPI_Irecv(r.mpi, 20, MPI_BYTE, peer, 22, MPI_COMM_WORLD, &q), "trunc irecv");
            rc = MPI_Wait(&q, &stt);
            MPI_Error_class(rc, &cls);
            int cls2 = -1;
            MPI_Error_class(stt.MPI_ERROR, &cls2);
            if (rc == MPI_SUCCESS || (cls != MPI_ERR_TRUNCATE && cls2 != MPI_ERR_TRUNCATE))
                st_fail("truncated irecv: rc %d class %d status class %d", rc, cls, cls2);
            else
                st_pass();
            /* probe then matched receive */
            MPI_Message m;
            st_ok(MPI_Mprobe(peer, 23, MPI_COMM_WORLD, &m, &stt), "MPI_Mprobe");
            MPI_Get_count(&stt, MPI_BYTE, &n);
            if (n != 33) st_fail("mprobe count %d", n);
            struct st_buf a = poisoned(40, 0);
            st_ok(MPI_Mrecv(a.mpi, 40, MPI_BYTE, &m, &stt), "MPI_Mrecv");
            expect("mrecv", &a, 77, peer, 33, 40);
            int flag = 0;
            while (!flag) st_ok(MPI_Improbe(peer, 24, MPI_COMM_WORLD, &flag, &m, &stt), "improbe");
            struct st_buf b = poisoned(40, 0);
            st_ok(MPI_Imrecv(b.mpi, 40, MPI_BYTE, &m, &q), "MPI_Imrecv");
            st_ok(MPI_Wait(&q, &stt), "imrecv wait");
            MPI_Get_count(&stt, MPI_BYTE, &n);
            if (n != 31 || stt.MPI_TAG != 24) st_fail("imrecv status: count %d tag %d", n, stt.MPI_TAG);
            expect("imrecv", &b, 77, peer, 31, 40);
            st_buf_free(&a);
            st_buf_free(&b);
        }
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    st_buf_free(&r);
}

/* A strided vector type on both ends: only the blocks move, gaps stay. */
static void vectors(void) {
    MPI_Datatype v;
    MPI_Type_vector(3, 2, 5, MPI_INT, &v);
    MPI_Type_commit(&v);
    const size_t span = (2 * 5 + 2) * sizeof(int); /* true extent of the vector */
    uint64_t seed = 4242;
    struct st_buf s = pattern_buf(seed, st.rank, span, 0);
    struct st_buf r = poisoned(span, 0);
    MPI_Request q[2];
    st_ok(MPI_Irecv(r.mpi, 1, v, prev_rank(), 8, MPI_COMM_WORLD, &q[0]), "vector irecv");
    st_ok(MPI_Isend(s.mpi, 1, v, next_rank(), 8, MPI_COMM_WORLD, &q[1]), "vector isend");
    st_ok(MPI_Waitall(2, q, MPI_STATUSES_IGNORE), "vector waitall");
    st_pull(&r);
    const unsigned char *h = r.host;
    int bad = 0;
    for (size_t i = 0; i < span && !bad; i++) {
        size_t elem = i / sizeof(int);
        int in_block = elem % 5 < 2;
        unsigned char want = in_block ? pat(seed, prev_rank(), i) : ST_POISON;
        if (h[i] != want) {
            st_fail("vector: byte %zu is %u, expected %u", i, h[i], want);
            bad = 1;
        }
    }
    if (!bad) st_pass();
    /* vector on the send side, contiguous on the receive side */
    struct st_buf c = poisoned(6 * sizeof(int), 0);
    MPI_Status stt;
    st_ok(MPI_Sendrecv(s.mpi, 1, v, next_rank(), 6, c.mpi, 6, MPI_INT, prev_rank(), 6,
                       MPI_COMM_WORLD, &stt),
          "vector sendrecv");
    st_pull(&c);
    const unsigned char *g = c.host;
    bad = 0;
    for (size_t k = 0; k < 6 * sizeof(int) && !bad; k++) {
        size_t e = k / sizeof(int), blk = e / 2, off = (blk * 5 + e % 2) * sizeof(int) + k % sizeof(int);
        if (g[k] != pat(seed, prev_rank(), off)) {
            st_fail("vector to contiguous: byte %zu", k);
            bad = 1;
        }
    }
    if (!bad) st_pass();
    int n = -1;
    MPI_Get_elements(&stt, MPI_INT, &n);
    if (n != 6) st_fail("get_elements %d", n);
    MPI_Type_free(&v);
    st_buf_free(&s);
    st_buf_free(&r);
    st_buf_free(&c);
}

int main(int argc, char **argv) {
    st_init(&argc, &argv, "p2p");
    size_t bsend_bytes = (8u << 20) + 4 * MPI_BSEND_OVERHEAD + (1u << 16);
    void *attach = malloc(bsend_bytes);
    MPI_Buffer_attach(attach, (int)bsend_bytes);
    size_t sizes[] = {0, 1, 7, 1021, 65537, st.large ? st.large : 0};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t b = sizes[k];
        if (k == 5 && b == 0) break;
        for (int which = 0; which < 3; which++) ring_nonblocking(b, which, 0);
        ring_nonblocking(b, 0, 1);
        ring_sendrecv(b);
        pairs_blocking(b);
    }
    ordering();
    edges();
    vectors();
    int sz;
    MPI_Buffer_detach(&attach, &sz);
    free(attach);
    return st_finish();
}

/* Local calls on buffers MPI reads and writes itself: MPI_Reduce_local on
 * every datatype and op (user ops, the non-commutative one too), sizes 0,
 * 1, 7919 and a large one; MPI_Pack and MPI_Unpack of a strided vector
 * type (gaps must keep the poison) at an offset of the packed buffer, in
 * two pieces; MPI_Pack_external and MPI_Unpack_external ("external32",
 * checked byte by byte against big-endian ints); the MPI-4 large-count
 * forms where the program finds them. Every buffer is one MPI sees (device
 * memory with --device). An ordinary MPI program. */
#include "shimtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((weak))
W int MPI_Reduce_local_c(const void *, void *, MPI_Count, MPI_Datatype, MPI_Op);
W int MPI_Pack_c(const void *, MPI_Count, MPI_Datatype, void *, MPI_Count, MPI_Count *, MPI_Comm);
W int MPI_Unpack_c(const void *, MPI_Count, MPI_Count *, void *, MPI_Count, MPI_Datatype,
                   MPI_Comm);
W int MPI_Pack_external_c(const char *, const void *, MPI_Count, MPI_Datatype, void *, MPI_Count,
                          MPI_Count *);
W int MPI_Unpack_external_c(const char *, const void *, MPI_Count, MPI_Count *, void *,
                            MPI_Count, MPI_Datatype);

static uint64_t next_seed = 17000;

static void t_reduce_local(const struct st_type *t, int op, size_t n, int large)
{
    uint64_t seed = next_seed++;
    char label[160];
    snprintf(label, sizeof label, "Reduce_local%s %s %s n=%zu", large ? "_c" : "", t->name,
             st_op_names[op], n);
    size_t bytes = n * t->size;
    /* inbuf: rank 0's inputs, inoutbuf: rank 1's; the result is
     * in op inout, in that order */
    struct st_buf in = st_input(t, op, seed, 0, 0, n), io = st_input(t, op, seed, 1, 0, n);
    int rc = large ? MPI_Reduce_local_c(in.mpi, io.mpi, (MPI_Count)n, t->type, st_ops[op])
                   : MPI_Reduce_local(in.mpi, io.mpi, (int)n, t->type, st_ops[op]);
    if (st_ok(rc, label)) {
        char *exp = malloc(bytes + 1);
        for (size_t i = 0; i < n; i++)
            st_store(t, exp, i, st_reduce_elem(t, op, seed, 2, i));
        st_pull(&io);
        st_compare(label, t, io.host, exp, n);
        /* inbuf is read only */
        char *orig = malloc(bytes + 1);
        st_fill(t, op, seed, 0, 0, orig, n);
        st_pull(&in);
        st_compare(label, t, in.host, orig, n);
        free(exp);
        free(orig);
    }
    st_buf_free(&in);
    st_buf_free(&io);
}

/* n elements of a vector type (2 ints of every 3) packed at byte offset
 * `at` of the packed buffer in two calls, then unpacked into a poisoned
 * buffer. `large`: the _c forms. */
static void t_pack(size_t n, size_t at, int large)
{
    uint64_t seed = next_seed++;
    char label[160];
    snprintf(label, sizeof label, "Pack/Unpack%s n=%zu at %zu", large ? "_c" : "", n, at);
    MPI_Datatype vec;
    MPI_Type_vector(2, 1, 2, MPI_INT, &vec); /* ints 0 and 2 of 3 (extent 3) */
    MPI_Type_commit(&vec);
    size_t ints = 3 * n, first = n / 2;
    struct st_buf src = st_buf_new(ints * 4 + 4);
    int *sp = src.host;
    for (size_t i = 0; i < ints + 1; i++)
        sp[i] = (int)st_hash(seed, i);
    st_push(&src);
    int psize = 0;
    MPI_Pack_size((int)n, vec, MPI_COMM_WORLD, &psize);
    size_t room = at + (size_t)psize + 16;
    struct st_buf packed = st_buf_poisoned(room);
    int rc;
    int pos = (int)at;
    MPI_Count lpos = (MPI_Count)at;
    /* two pieces: the first n/2 elements, then the rest */
    char *second = (char *)src.mpi + first * 12;
    if (large) {
        rc = MPI_Pack_c(src.mpi, (MPI_Count)first, vec, packed.mpi, (MPI_Count)room, &lpos,
                        MPI_COMM_WORLD);
        if (rc == MPI_SUCCESS)
            rc = MPI_Pack_c(second, (MPI_Count)(n - first), vec, packed.mpi, (MPI_Count)room,
                            &lpos, MPI_COMM_WORLD);
        pos = (int)lpos;
    } else {
        rc = MPI_Pack(src.mpi, (int)first, vec, packed.mpi, (int)room, &pos, MPI_COMM_WORLD);
        if (rc == MPI_SUCCESS)
            rc = MPI_Pack(second, (int)(n - first), vec, packed.mpi, (int)room, &pos,
                          MPI_COMM_WORLD);
    }
    if (st_ok(rc, label)) {
        /* the packed ints in order (a homogeneous MPI packs native ints),
         * the bytes around them untouched */
        st_pull(&packed);
        if ((size_t)pos == at + 8 * n)
            st_pass();
        else
            st_fail("%s: position %d after packing, want %zu", label, pos, at + 8 * n);
        unsigned char *pb = packed.host;
        int *want = malloc(8 * n + 4);
        for (size_t e = 0; e < n; e++) {
            want[2 * e] = sp[3 * e];
            want[2 * e + 1] = sp[3 * e + 2];
        }
        if (memcmp(pb + at, want, 8 * n) == 0)
            st_pass();
        else
            st_fail("%s: packed bytes differ", label);
        st_untouched(label, pb, at);
        st_untouched(label, pb + at + 8 * n, room - at - 8 * n);
        free(want);
        /* unpack into a poisoned buffer: the gaps keep the poison */
        struct st_buf dst = st_buf_poisoned(ints * 4 + 4);
        int upos = (int)at;
        MPI_Count lupos = (MPI_Count)at;
        rc = large ? MPI_Unpack_c(packed.mpi, (MPI_Count)room, &lupos, dst.mpi, (MPI_Count)n, vec,
                                  MPI_COMM_WORLD)
                   : MPI_Unpack(packed.mpi, (int)room, &upos, dst.mpi, (int)n, vec,
                                MPI_COMM_WORLD);
        if (large)
            upos = (int)lupos;
        if (st_ok(rc, label)) {
            st_pull(&dst);
            int *dp = dst.host;
            size_t bad = 0;
            for (size_t i = 0; i < ints; i++) {
                int exp = i % 3 == 1 ? (int)0xA5A5A5A5 : sp[i];
                if (dp[i] != exp)
                    bad++;
            }
            if (bad == 0 && (size_t)upos == at + 8 * n)
                st_pass();
            else
                st_fail("%s: unpacked %zu ints wrong (position %d)", label, bad, upos);
            st_untouched(label, dp + ints, 4);
        }
        st_buf_free(&dst);
    }
    MPI_Type_free(&vec);
    st_buf_free(&src);
    st_buf_free(&packed);
}

static void t_external(size_t n, int large)
{
    uint64_t seed = next_seed++;
    char label[160];
    snprintf(label, sizeof label, "Pack_external%s n=%zu", large ? "_c" : "", n);
    struct st_buf src = st_buf_new(n * 4 + 4), ext = st_buf_poisoned(n * 4 + 8);
    int *sp = src.host;
    for (size_t i = 0; i < n; i++)
        sp[i] = (int)st_hash(seed, i);
    st_push(&src);
    MPI_Aint pos = 4;
    MPI_Count lpos = 4;
    int rc = large ? MPI_Pack_external_c("external32", src.mpi, (MPI_Count)n, MPI_INT, ext.mpi,
                                         (MPI_Count)(n * 4 + 8), &lpos)
                   : MPI_Pack_external("external32", src.mpi, (int)n, MPI_INT, ext.mpi,
                                       (MPI_Aint)(n * 4 + 8), &pos);
    if (large)
        pos = (MPI_Aint)lpos;
    if (!st_ok(rc, label))
        goto out;
    st_pull(&ext);
    unsigned char *eb = ext.host;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)sp[i];
        unsigned char be[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                               (unsigned char)(v >> 8), (unsigned char)v};
        if (memcmp(eb + 4 + 4 * i, be, 4) != 0)
            bad++;
    }
    if (bad == 0 && pos == (MPI_Aint)(4 + 4 * n))
        st_pass();
    else
        st_fail("%s: %zu ints not big-endian (position %ld)", label, bad, (long)pos);
    st_untouched(label, eb, 4);
    st_untouched(label, eb + 4 + 4 * n, 4);
    struct st_buf back = st_buf_poisoned(n * 4 + 4);
    MPI_Aint upos = 4;
    MPI_Count lupos = 4;
    rc = large ? MPI_Unpack_external_c("external32", ext.mpi, (MPI_Count)(n * 4 + 8), &lupos,
                                       back.mpi, (MPI_Count)n, MPI_INT)
               : MPI_Unpack_external("external32", ext.mpi, (MPI_Aint)(n * 4 + 8), &upos,
                                     back.mpi, (int)n, MPI_INT);
    if (st_ok(rc, label)) {
        st_pull(&back);
        const struct st_type *ti = st_type_named("INT");
        st_compare(label, ti, back.host, sp, n);
        st_untouched(label, (char *)back.host + 4 * n, 4);
    }
    st_buf_free(&back);
out:
    st_buf_free(&src);
    st_buf_free(&ext);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "local_ops");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    const size_t sizes[] = {0, 1, 7919};
    for (int k = 0; k < st_ntypes; k += st.quick ? 3 : 1)
        for (int op = 0; op < OP_COUNT; op++)
            if (st_op_valid(&st_types[k], op))
                for (int s = 0; s < 3; s++)
                    t_reduce_local(&st_types[k], op, sizes[s], 0);
    if (st.large)
        t_reduce_local(st_type_named("DOUBLE"), OP_SUM, st.large, 0);
    const size_t packs[] = {0, 1, 2, 7, 7919};
    for (int s = 0; s < 5; s++) {
        t_pack(packs[s], (size_t)(s * 3), 0);
        t_external(packs[s], 0);
    }
    if (st.large)
        t_pack(st.large, 5, 0);
    int large = MPI_Reduce_local_c && MPI_Pack_c && MPI_Unpack_c && MPI_Pack_external_c &&
                MPI_Unpack_external_c;
    if (large) {
        t_reduce_local(st_type_named("INT"), OP_USER_NC, 7919, 1);
        t_reduce_local(st_type_named("FLOAT"), OP_MAX, 1, 1);
        t_pack(101, 3, 1);
        t_external(13, 1);
    }
    if (st.rank == 0)
        printf("large-count forms: %s\n", large ? "found" : "not found (plain Open MPI 4.1)");
    return st_finish();
}

/* Element values of the shim's C tests: deterministic inputs, the exact
 * reduction of each op, and comparison (see shimtest.h). */
#include "shimtest.h"

#include <stdio.h>
#include <string.h>

int st_op_valid(const struct st_type *t, int op)
{
    switch (t->cls) {
    case ST_MOVE:
        return 0;
    case ST_BITS:
        return op == OP_BAND || op == OP_BOR || op == OP_BXOR;
    case ST_FLOAT:
        return op == OP_SUM || op == OP_PROD || op == OP_MIN || op == OP_MAX || op == OP_USER ||
               op == OP_USER_NC;
    default:
        return 1;
    }
}

uint64_t st_hash(uint64_t a, uint64_t b)
{
    uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t mask_of(const struct st_type *t)
{
    return t->size == 8 ? ~0ull : ((1ull << (8 * t->size)) - 1);
}

/* Sign-extend the low bytes of an integer of type t. */
static int64_t as_signed(const struct st_type *t, uint64_t u)
{
    int shift = 64 - 8 * t->size;
    return (int64_t)(u << shift) >> shift;
}

st_val st_gen(const struct st_type *t, int op, uint64_t seed, int r, size_t i)
{
    uint64_t h = st_hash(st_hash(seed, (uint64_t)r), (uint64_t)i);
    st_val v;
    int bits = 8 * t->size;
    if (t->cls == ST_FLOAT) {
        static const double prod[4] = {1.0, -1.0, 2.0, 0.5};
        /* Multiples of 1/4 up to 256: every sum of a few is exact. */
        v.f = op == OP_PROD ? prod[h % 4] : (double)((int64_t)(h % 2049) - 1024) * 0.25;
        return v;
    }
    if (t->cls == ST_SIGNED || t->cls == ST_UNSIGNED) {
        if (op == OP_SUM) {
            /* Small enough that up to 16 ranks never overflow (MPI
             * implementations differ on 8-bit overflow: wrap or saturate). */
            uint64_t span = 1ull << (bits - 5);
            v.u = t->cls == ST_SIGNED ? (uint64_t)((int64_t)(h % span) - (int64_t)(span / 2))
                                      : h % span;
            v.u &= mask_of(t);
            return v;
        }
        if (op == OP_PROD) {
            static const int64_t sgn[3] = {1, -1, 2}, uns[3] = {1, 2, 1};
            v.u = (uint64_t)(t->cls == ST_SIGNED ? sgn[h % 3] : uns[h % 3]) & mask_of(t);
            return v;
        }
        if (op == OP_LAND || op == OP_LOR || op == OP_LXOR) {
            /* a third zeros, so that every logical result occurs */
            v.u = h % 3 == 0 ? 0 : (h % 3 == 1 ? 1 : ((h >> 8) | 1)) & mask_of(t);
            return v;
        }
    }
    v.u = h & mask_of(t);
    return v;
}

st_val st_load(const struct st_type *t, const void *p, size_t i)
{
    st_val v;
    const char *src = (const char *)p + i * (size_t)t->size;
    if (t->cls == ST_FLOAT) {
        if (t->size == 4) {
            float f;
            memcpy(&f, src, 4);
            v.f = f;
        } else {
            memcpy(&v.f, src, 8);
        }
        return v;
    }
    v.u = 0;
    memcpy(&v.u, src, (size_t)t->size); /* little-endian hosts */
    return v;
}

void st_store(const struct st_type *t, void *p, size_t i, st_val v)
{
    char *dst = (char *)p + i * (size_t)t->size;
    if (t->cls == ST_FLOAT) {
        if (t->size == 4) {
            float f = (float)v.f;
            memcpy(dst, &f, 4);
        } else {
            memcpy(dst, &v.f, 8);
        }
        return;
    }
    memcpy(dst, &v.u, (size_t)t->size);
}

st_val st_combine(const struct st_type *t, int op, st_val a, st_val b)
{
    st_val v;
    if (t->cls == ST_FLOAT) {
        switch (op) {
        case OP_SUM: v.f = a.f + b.f; break;
        case OP_PROD: v.f = a.f * b.f; break;
        case OP_MIN: v.f = b.f < a.f ? b.f : a.f; break;
        case OP_MAX:
        case OP_USER: v.f = b.f > a.f ? b.f : a.f; break;
        default: v = a; break; /* OP_USER_NC */
        }
        if (t->size == 4)
            v.f = (float)v.f;
        return v;
    }
    int sig = t->cls == ST_SIGNED;
    int64_t sa = as_signed(t, a.u), sb = as_signed(t, b.u);
    switch (op) {
    case OP_SUM:
    case OP_USER: v.u = a.u + b.u; break;
    case OP_PROD: v.u = a.u * b.u; break;
    case OP_MIN: v = (sig ? sb < sa : b.u < a.u) ? b : a; break;
    case OP_MAX: v = (sig ? sb > sa : b.u > a.u) ? b : a; break;
    case OP_BAND: v.u = a.u & b.u; break;
    case OP_BOR: v.u = a.u | b.u; break;
    case OP_BXOR: v.u = a.u ^ b.u; break;
    case OP_LAND: v.u = (a.u != 0) && (b.u != 0); break;
    case OP_LOR: v.u = (a.u != 0) || (b.u != 0); break;
    case OP_LXOR: v.u = (a.u != 0) != (b.u != 0); break;
    default: v = a; break; /* OP_USER_NC */
    }
    v.u &= mask_of(t);
    return v;
}

int st_same(const struct st_type *t, st_val a, st_val b)
{
    if (t->cls == ST_FLOAT)
        return a.f == b.f;
    return ((a.u ^ b.u) & mask_of(t)) == 0;
}

void st_fill(const struct st_type *t, int op, uint64_t seed, int r, size_t first, void *p,
             size_t n)
{
    for (size_t i = 0; i < n; i++)
        st_store(t, p, i, st_gen(t, op, seed, r, first + i));
}

st_val st_reduce_elem(const struct st_type *t, int op, uint64_t seed, int nranks, size_t i)
{
    st_val acc = st_gen(t, op, seed, 0, i);
    for (int r = 1; r < nranks; r++)
        acc = st_combine(t, op, acc, st_gen(t, op, seed, r, i));
    return acc;
}

static void show(char *out, size_t cap, const struct st_type *t, st_val v)
{
    if (t->cls == ST_FLOAT)
        snprintf(out, cap, "%g", v.f);
    else
        snprintf(out, cap, "0x%llx", (unsigned long long)(v.u & mask_of(t)));
}

int st_compare(const char *label, const struct st_type *t, const void *got, const void *exp,
               size_t n)
{
    size_t bad = 0, first[3];
    for (size_t i = 0; i < n; i++) {
        if (!st_same(t, st_load(t, got, i), st_load(t, exp, i))) {
            if (bad < 3)
                first[bad] = i;
            bad++;
        }
    }
    if (!bad) {
        st_pass();
        return 1;
    }
    char detail[400] = "";
    size_t used = 0;
    for (size_t k = 0; k < bad && k < 3; k++) {
        char g[40], e[40];
        show(g, sizeof g, t, st_load(t, got, first[k]));
        show(e, sizeof e, t, st_load(t, exp, first[k]));
        used += (size_t)snprintf(detail + used, sizeof detail - used, " [%zu] got %s want %s;",
                                 first[k], g, e);
        if (used >= sizeof detail)
            break;
    }
    st_fail("%s: %zu of %zu elements wrong:%s", label, bad, n, detail);
    return 0;
}

int st_untouched(const char *label, const void *p, size_t bytes)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < bytes; i++) {
        if (c[i] != ST_POISON) {
            st_fail("%s: byte %zu outside the result was overwritten (0x%02x)", label, i, c[i]);
            return 0;
        }
    }
    st_pass();
    return 1;
}

/* Run context, reporting, buffers, element types and the exact oracle of
 * the shim's C test programs (see shimtest.h). */
#include "shimtest.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct st_ctx st;
struct st_type st_types[17];
int st_ntypes;
const char *st_op_names[OP_COUNT] = {"SUM", "PROD", "MIN", "MAX", "BAND", "BOR",
                                     "BXOR", "LAND", "LOR", "LXOR", "USER", "USER_NC"};
MPI_Op st_ops[OP_COUNT];

/* ---- run context --------------------------------------------------- */

static const int MAX_FAIL_LINES = 25;

static void usage(const char *program)
{
    printf("usage: %s [--device] [--large N] [--quick] [--verbose]\n"
           "  --device   buffers in GPU memory (cudaMalloc through a dlopen'ed libcudart;\n"
           "             also SHIMTEST_DEVICE=1); each rank uses GPU local_rank %% ngpus\n"
           "  --large N  element count of the large size (default 1048576; 0 skips it)\n"
           "  --quick    a few datatypes instead of all of them\n"
           "  SHIMTEST_ALLOC=malloc|managed|pool  the device allocator (cudaMalloc,\n"
           "             cudaMallocManaged, cudaMallocAsync)\n",
           program);
}

static int local_rank_from_env(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                          "PMI_LOCAL_RANK"};
    for (int k = 0; k < 4; k++) {
        const char *v = getenv(vars[k]);
        if (v && *v)
            return atoi(v);
    }
    return -1;
}

static void init_types(void)
{
    struct st_type t[] = {
        {"FLOAT", MPI_FLOAT, 4, ST_FLOAT},
        {"DOUBLE", MPI_DOUBLE, 8, ST_FLOAT},
        {"INT", MPI_INT, sizeof(int), ST_SIGNED},
        {"UNSIGNED", MPI_UNSIGNED, sizeof(unsigned), ST_UNSIGNED},
        {"LONG", MPI_LONG, sizeof(long), ST_SIGNED},
        {"INT8_T", MPI_INT8_T, 1, ST_SIGNED},
        {"INT16_T", MPI_INT16_T, 2, ST_SIGNED},
        {"INT32_T", MPI_INT32_T, 4, ST_SIGNED},
        {"INT64_T", MPI_INT64_T, 8, ST_SIGNED},
        {"UINT8_T", MPI_UINT8_T, 1, ST_UNSIGNED},
        {"UINT16_T", MPI_UINT16_T, 2, ST_UNSIGNED},
        {"UINT32_T", MPI_UINT32_T, 4, ST_UNSIGNED},
        {"UINT64_T", MPI_UINT64_T, 8, ST_UNSIGNED},
        {"CHAR", MPI_CHAR, 1, ST_MOVE},
        {"SIGNED_CHAR", MPI_SIGNED_CHAR, 1, ST_SIGNED},
        {"UNSIGNED_CHAR", MPI_UNSIGNED_CHAR, 1, ST_UNSIGNED},
        {"BYTE", MPI_BYTE, 1, ST_BITS},
    };
    st_ntypes = (int)(sizeof t / sizeof t[0]);
    memcpy(st_types, t, sizeof t);
}

const struct st_type *st_type_named(const char *name)
{
    for (int k = 0; k < st_ntypes; k++)
        if (!strcmp(st_types[k].name, name))
            return &st_types[k];
    return NULL;
}

static const struct st_type *type_of(MPI_Datatype dt)
{
    for (int k = 0; k < st_ntypes; k++)
        if (st_types[k].type == dt)
            return &st_types[k];
    return NULL;
}

/* MPI calls user functions as inout[i] = in[i] op inout[i]: `in` is the left
 * operand (lower ranks). */
static void user_op(void *in, void *inout, int *len, MPI_Datatype *dt, int op)
{
    const struct st_type *t = type_of(*dt);
    if (!t) {
        fprintf(stderr, "shimtest: user op called with an unknown datatype\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (int i = 0; i < *len; i++)
        st_store(t, inout, i, st_combine(t, op, st_load(t, in, i), st_load(t, inout, i)));
}
static void user_commutative(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    user_op(in, inout, len, dt, OP_USER);
}
static void user_keep_left(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    user_op(in, inout, len, dt, OP_USER_NC);
}

static void init_ops(void)
{
    MPI_Op predefined[] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX, MPI_BAND,
                           MPI_BOR, MPI_BXOR, MPI_LAND, MPI_LOR, MPI_LXOR};
    for (int k = 0; k < OP_USER; k++)
        st_ops[k] = predefined[k];
    MPI_Op_create(user_commutative, 1, &st_ops[OP_USER]);
    MPI_Op_create(user_keep_left, 0, &st_ops[OP_USER_NC]);
}

void st_init(int *argc, char ***argv, const char *program)
{
    st_init_thread(argc, argv, program, -1);
}

void st_init_thread(int *argc, char ***argv, const char *program, int required)
{
    memset(&st, 0, sizeof st);
    st.large = (size_t)1 << 20;
    const char *dev = getenv("SHIMTEST_DEVICE");
    st.device = dev && *dev && strcmp(dev, "0") != 0;
    for (int k = 1; k < *argc; k++) {
        const char *a = (*argv)[k];
        if (!strcmp(a, "--device")) {
            st.device = 1;
        } else if (!strcmp(a, "--quick")) {
            st.quick = 1;
        } else if (!strcmp(a, "--verbose")) {
            st.verbose = 1;
        } else if (!strcmp(a, "--large") && k + 1 < *argc) {
            st.large = strtoull((*argv)[++k], NULL, 0);
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(program);
            exit(0);
        }
    }
    int local = -1;
    if (st.device) {
        /* Pick the GPU before MPI_Init, as GPU programs do. */
        local = local_rank_from_env();
        if (local >= 0)
            st_dev_select(local);
    }
    int rc;
    if (required < 0) {
        rc = MPI_Init(argc, argv);
    } else {
        rc = MPI_Init_thread(argc, argv, required, &st.thread_level);
    }
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init failed\n", program);
        exit(2);
    }
    if (required < 0)
        MPI_Query_thread(&st.thread_level);
    MPI_Comm_rank(MPI_COMM_WORLD, &st.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &st.size);
    if (st.device && local < 0) {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
        st_dev_select(local);
    }
    init_types();
    init_ops();
    if (st.rank == 0)
        printf("%s: %d ranks, %s buffers, large size %zu\n", program, st.size,
               st.device ? "device" : "host", st.large);
    if (st.verbose && st.device)
        printf("rank %d uses GPU %d\n", st.rank, st_dev_current());
    fflush(stdout);
}

int st_report(void)
{
    long mine[2] = {st.passed, st.failed}, all[2] = {0, 0};
    int rc = MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        all[0] = st.passed;
        all[1] = st.failed + 1;
        fprintf(stderr, "rank %d: summing the counts failed (%d)\n", st.rank, rc);
    }
    fflush(stderr);
    if (st.rank == 0)
        printf("%ld passed, %ld failed\n", all[0], all[1]);
    fflush(stdout);
    return (all[1] > 0 || st.failed > 0) ? 1 : 0;
}

int st_finish(void)
{
    int status = st_report();
    MPI_Op_free(&st_ops[OP_USER]);
    MPI_Op_free(&st_ops[OP_USER_NC]);
    if (MPI_Finalize() != MPI_SUCCESS) {
        fprintf(stderr, "rank %d: MPI_Finalize failed\n", st.rank);
        status = 1;
    }
    return status;
}

void st_pass(void)
{
    st.passed++;
}

void st_fail(const char *fmt, ...)
{
    st.failed++;
    if (st.failed > MAX_FAIL_LINES)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: FAIL %s\n", st.rank, line);
    if (st.failed == MAX_FAIL_LINES)
        fprintf(stderr, "rank %d: (further failures counted, not printed)\n", st.rank);
}

int st_ok(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return 1;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    st_fail("%s returned %d (%s)", what, rc, msg);
    return 0;
}

/* ---- buffers ------------------------------------------------------- */

static struct st_buf buf_new(size_t bytes, int device)
{
    struct st_buf b = {NULL, NULL, bytes, device};
    b.host = malloc(bytes ? bytes : 1);
    if (!b.host) {
        fprintf(stderr, "shimtest: out of host memory (%zu bytes)\n", bytes);
        exit(2);
    }
    b.mpi = device ? st_dev_malloc(bytes) : malloc(bytes ? bytes : 1);
    if (!b.mpi) {
        fprintf(stderr, "shimtest: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return b;
}

struct st_buf st_buf_new(size_t bytes)
{
    return buf_new(bytes, st.device);
}

struct st_buf st_buf_new_host(size_t bytes)
{
    return buf_new(bytes, 0);
}

void st_buf_free(struct st_buf *b)
{
    if (b->device)
        st_dev_free(b->mpi);
    else
        free(b->mpi);
    free(b->host);
    b->mpi = b->host = NULL;
}

void st_push_range(struct st_buf *b, size_t off, size_t bytes)
{
    if (b->device)
        st_dev_memcpy((char *)b->mpi + off, (char *)b->host + off, bytes);
    else if (bytes)
        memcpy((char *)b->mpi + off, (char *)b->host + off, bytes);
}

void st_pull_range(struct st_buf *b, size_t off, size_t bytes)
{
    if (b->device)
        st_dev_memcpy((char *)b->host + off, (char *)b->mpi + off, bytes);
    else if (bytes)
        memcpy((char *)b->host + off, (char *)b->mpi + off, bytes);
}

void st_push(struct st_buf *b)
{
    st_push_range(b, 0, b->bytes);
}

void st_pull(struct st_buf *b)
{
    st_pull_range(b, 0, b->bytes);
}

void st_poison(struct st_buf *b)
{
    memset(b->host, ST_POISON, b->bytes);
    if (b->device)
        st_dev_memset(b->mpi, ST_POISON, b->bytes);
    else
        memset(b->mpi, ST_POISON, b->bytes);
}

struct st_buf st_buf_poisoned(size_t bytes)
{
    struct st_buf b = st_buf_new(bytes);
    st_poison(&b);
    return b;
}

void st_place(struct st_buf *b, size_t off, const void *src, size_t bytes)
{
    if (bytes)
        memcpy((char *)b->host + off, src, bytes);
    st_push_range(b, off, bytes);
}

struct st_buf st_input(const struct st_type *t, int op, uint64_t seed, int r, size_t first,
                       size_t n)
{
    struct st_buf b = st_buf_new(n * t->size);
    st_fill(t, op, seed, r, first, b.host, n);
    st_push(&b);
    return b;
}

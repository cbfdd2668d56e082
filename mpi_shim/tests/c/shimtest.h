/* Support code shared by the shim's C test programs.
 *
 * The programs are ordinary MPI programs: they include mpi.h and libc only
 * and know nothing about the shim. With --device (or SHIMTEST_DEVICE=1) every
 * buffer handed to MPI is device memory, allocated through the CUDA runtime
 * (or, failing that, the driver API) opened with dlopen at run time, so one
 * binary built without CUDA headers runs on a GPU machine too.
 *
 * Data: element i of rank r's input in case `seed` is a pure function of
 * (seed, r, i), so every rank computes the expected result of a collective
 * locally from everybody's inputs, without communicating. Values are chosen
 * so that every reduction is exact in any order (no overflow, dyadic floats).
 */
#ifndef SHIMTEST_H
#define SHIMTEST_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

/* ---- run context --------------------------------------------------- */

struct st_ctx {
    int rank, size;   /* in MPI_COMM_WORLD */
    int device;       /* buffers are device memory */
    int verbose;
    int quick;        /* --quick: fewer types (the harness's secondary modes) */
    size_t large;     /* element count of the "large" size (0: skip it) */
    int thread_level; /* what MPI provides (MPI_THREAD_*) */
    long passed, failed;
};
extern struct st_ctx st;

/* Parse the common options, select the GPU (device mode) and MPI_Init.
 * Options: --device, --large N, --quick, --verbose, --help. */
void st_init(int *argc, char ***argv, const char *program);
/* The same with MPI_Init_thread(required); st.thread_level: what MPI gave. */
void st_init_thread(int *argc, char ***argv, const char *program, int required);
/* Sum the counts over all ranks, print "N passed, M failed" on rank 0,
 * MPI_Finalize, and return the process exit status. */
int st_finish(void);
/* The same without MPI_Finalize (for programs that finalize themselves). */
int st_report(void);

/* Record one check. */
void st_pass(void);
void st_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* rc must be MPI_SUCCESS; otherwise a failure naming `what`. */
int st_ok(int rc, const char *what);

/* ---- buffers that MPI sees (host or device) ------------------------ */

struct st_buf {
    void *mpi;   /* the address handed to MPI */
    void *host;  /* host mirror, always host memory */
    size_t bytes;
    int device;  /* mpi is device memory */
};
struct st_buf st_buf_new(size_t bytes);
/* Host memory even with --device: point-to-point buffers (a collectives
 * shim leaves point-to-point to MPI, which need not take device memory). */
struct st_buf st_buf_new_host(size_t bytes);
void st_buf_free(struct st_buf *b);
/* mirror -> MPI buffer, MPI buffer -> mirror (whole buffer or a range) */
void st_push(struct st_buf *b);
void st_pull(struct st_buf *b);
void st_push_range(struct st_buf *b, size_t off, size_t bytes);
void st_pull_range(struct st_buf *b, size_t off, size_t bytes);
/* Fill both the MPI buffer and the mirror with the poison byte. */
void st_poison(struct st_buf *b);
#define ST_POISON 0xA5
/* A poisoned buffer of `bytes` (a receive buffer). */
struct st_buf st_buf_poisoned(size_t bytes);
/* Copy `bytes` from src into the buffer at byte `off`, mirror and MPI side
 * (an in-place call's own data). */
void st_place(struct st_buf *b, size_t off, const void *src, size_t bytes);

/* ---- element types and operations ---------------------------------- */

enum st_class {
    ST_SIGNED,
    ST_UNSIGNED,
    ST_FLOAT,
    ST_MOVE,   /* MPI_CHAR: data movement only */
    ST_BITS    /* MPI_BYTE: movement and bitwise ops */
};

struct st_type {
    const char *name;
    MPI_Datatype type;
    int size;
    enum st_class cls;
};
extern struct st_type st_types[];
extern int st_ntypes;
/* The type of st_types named `name` ("FLOAT", ...), NULL if none. */
const struct st_type *st_type_named(const char *name);

enum st_opid {
    OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR,
    OP_LAND, OP_LOR, OP_LXOR,
    OP_USER,    /* user-defined, commutative: wrapping add (ints), max (floats) */
    OP_USER_NC, /* user-defined, not commutative: keeps the left operand */
    OP_COUNT
};
extern const char *st_op_names[OP_COUNT];
extern MPI_Op st_ops[OP_COUNT];
/* MPI defines this op for this type (and the tests use it). */
int st_op_valid(const struct st_type *t, int op);

/* A value of any element type: integers as their bits, floats as double. */
typedef union {
    uint64_t u;
    double f;
} st_val;

uint64_t st_hash(uint64_t a, uint64_t b);
/* Input element i of rank r in case `seed`, suited to op `op`. */
st_val st_gen(const struct st_type *t, int op, uint64_t seed, int r, size_t i);
st_val st_load(const struct st_type *t, const void *p, size_t i);
void st_store(const struct st_type *t, void *p, size_t i, st_val v);
/* left op right, as MPI combines them. */
st_val st_combine(const struct st_type *t, int op, st_val left, st_val right);
int st_same(const struct st_type *t, st_val a, st_val b);
/* Fill p[0..n) with rank r's input elements first..first+n. */
void st_fill(const struct st_type *t, int op, uint64_t seed, int r, size_t first,
             void *p, size_t n);
/* A send buffer holding rank r's input elements first..first+n. */
struct st_buf st_input(const struct st_type *t, int op, uint64_t seed, int r, size_t first,
                       size_t n);
/* The reduction over ranks 0..nranks-1 (in rank order) of element i. */
st_val st_reduce_elem(const struct st_type *t, int op, uint64_t seed, int nranks,
                      size_t i);
/* Compare got[0..n) with exp[0..n); one pass or one failure for the whole
 * buffer, the failure naming the first wrong elements. */
int st_compare(const char *label, const struct st_type *t, const void *got,
               const void *exp, size_t n);
/* Every byte of p[0..bytes) is the poison byte. */
int st_untouched(const char *label, const void *p, size_t bytes);

/* ---- device runtime (device mode only) ----------------------------- */

/* Opaque stream handle of the CUDA runtime/driver, for the benchmark. */
typedef void *st_stream;
int st_dev_sync(void);
int st_dev_stream_create(st_stream *s);
int st_dev_stream_sync(st_stream s);
void *st_dev_malloc(size_t bytes);
void st_dev_free(void *p);
int st_dev_memcpy(void *dst, const void *src, size_t bytes); /* any direction */
int st_dev_count(void);
int st_dev_current(void);
void st_dev_select(int local_rank);
void st_dev_memset(void *p, int byte, size_t bytes);

#endif

/* The MPI handles and sentinels the shim compares against, taken from the
 * mpi.h the shim is built with (Open MPI's handles are link-time addresses,
 * so they cannot be emitted as Rust constants at build time). */
#include <mpi.h>

/* Element classes; the Rust side pairs a class with MPI_Type_size. */
enum { GCSHIM_SIGNED = 1, GCSHIM_UNSIGNED = 2, GCSHIM_FLOAT = 3,
       GCSHIM_CHAR = 4, GCSHIM_BYTES = 5, GCSHIM_BFLOAT = 6 };

struct gcshim_type { MPI_Datatype handle; int cls; };
struct gcshim_op { MPI_Op handle; int code; };

static const struct gcshim_type types[] = {
    /* the common ones first: the lookup is a linear scan */
    {MPI_FLOAT, GCSHIM_FLOAT}, {MPI_DOUBLE, GCSHIM_FLOAT},
    {MPI_INT, GCSHIM_SIGNED}, {MPI_UNSIGNED, GCSHIM_UNSIGNED},
    {MPI_LONG, GCSHIM_SIGNED}, {MPI_UNSIGNED_LONG, GCSHIM_UNSIGNED},
    {MPI_LONG_LONG, GCSHIM_SIGNED}, {MPI_UNSIGNED_LONG_LONG, GCSHIM_UNSIGNED},
    {MPI_INT8_T, GCSHIM_SIGNED}, {MPI_INT32_T, GCSHIM_SIGNED}, {MPI_INT64_T, GCSHIM_SIGNED},
    {MPI_UINT8_T, GCSHIM_UNSIGNED}, {MPI_UINT32_T, GCSHIM_UNSIGNED},
    {MPI_UINT64_T, GCSHIM_UNSIGNED},
    {MPI_CHAR, GCSHIM_CHAR}, {MPI_SIGNED_CHAR, GCSHIM_CHAR},
    {MPI_UNSIGNED_CHAR, GCSHIM_UNSIGNED}, {MPI_BYTE, GCSHIM_BYTES},
    {MPI_AINT, GCSHIM_SIGNED}, {MPI_OFFSET, GCSHIM_SIGNED}, {MPI_COUNT, GCSHIM_SIGNED},
    /* Fortran names: sizes are checked at run time */
    {MPI_REAL, GCSHIM_FLOAT}, {MPI_DOUBLE_PRECISION, GCSHIM_FLOAT},
    {MPI_INTEGER, GCSHIM_SIGNED}, {MPI_CHARACTER, GCSHIM_BYTES},
#if OMPI_HAVE_FORTRAN_REAL4
    {MPI_REAL4, GCSHIM_FLOAT},
#endif
#if OMPI_HAVE_FORTRAN_REAL8
    {MPI_REAL8, GCSHIM_FLOAT},
#endif
#if OMPI_HAVE_FORTRAN_REAL2
    {MPI_REAL2, GCSHIM_FLOAT},
#endif
#if OMPI_HAVE_FORTRAN_INTEGER1
    {MPI_INTEGER1, GCSHIM_SIGNED},
#endif
#if OMPI_HAVE_FORTRAN_INTEGER4
    {MPI_INTEGER4, GCSHIM_SIGNED},
#endif
#if OMPI_HAVE_FORTRAN_INTEGER8
    {MPI_INTEGER8, GCSHIM_SIGNED},
#endif
#ifdef MPIX_C_FLOAT16
    {MPIX_C_FLOAT16, GCSHIM_FLOAT},
#endif
#ifdef MPIX_SHORT_FLOAT
    {MPIX_SHORT_FLOAT, GCSHIM_FLOAT},
#endif
#ifdef MPIX_BFLOAT16
    {MPIX_BFLOAT16, GCSHIM_BFLOAT},
#endif
};

static const struct gcshim_op ops[] = {
    {MPI_SUM, 0}, {MPI_PROD, 1}, {MPI_MIN, 2}, {MPI_MAX, 3},
    {MPI_BAND, 4}, {MPI_BOR, 5}, {MPI_BXOR, 6},
    {MPI_LAND, 7}, {MPI_LOR, 8}, {MPI_LXOR, 9},
};

const struct gcshim_type *gcshim_type_table(int *n) {
    *n = (int)(sizeof(types) / sizeof(types[0]));
    return types;
}

const struct gcshim_op *gcshim_op_table(int *n) {
    *n = (int)(sizeof(ops) / sizeof(ops[0]));
    return ops;
}

void *gcshim_in_place(void) { return MPI_IN_PLACE; }

MPI_Comm_copy_attr_function *gcshim_comm_null_copy_fn(void) { return MPI_COMM_NULL_COPY_FN; }

MPI_Datatype gcshim_byte(void) { return MPI_BYTE; }

/* Preloaded by the `pmpi::` test cases: defines, under their MPI_ names,
 * every MPI function gpucoll uses, each of which kills the process with a
 * message. gpucoll must call the PMPI_ entry points only, so an
 * intercepting library (the MPI shim) never sees its internal traffic; if
 * one of its calls reaches an MPI_ name, the case fails with exit code 97. */
#include <stdio.h>
#include <unistd.h>

static void trapped(const char *name)
{
    fprintf(stderr, "pmpi trap: gpucoll called %s instead of P%s\n", name, name);
    fflush(stderr);
    _exit(97);
}

/* The argument lists do not matter: a trapped function never returns. */
#define TRAP(name)          \
    int name(void)          \
    {                       \
        trapped(#name);     \
        return 1;           \
    }

/* Looked up by the test worker to prove the library is loaded. */
int gpucoll_pmpi_trap_loaded(void) { return 1; }

double MPI_Wtime(void)
{
    trapped("MPI_Wtime");
    return 0.0;
}

TRAP(MPI_Allgather)
TRAP(MPI_Allreduce)
TRAP(MPI_Alltoall)
TRAP(MPI_Barrier)
TRAP(MPI_Bcast)
TRAP(MPI_Cancel)
TRAP(MPI_Comm_dup)
TRAP(MPI_Comm_free)
TRAP(MPI_Comm_get_attr)
TRAP(MPI_Comm_rank)
TRAP(MPI_Comm_set_errhandler)
TRAP(MPI_Comm_size)
TRAP(MPI_Comm_split)
TRAP(MPI_Comm_split_type)
TRAP(MPI_Exscan)
TRAP(MPI_Error_string)
TRAP(MPI_Finalize)
TRAP(MPI_Finalized)
TRAP(MPI_Gather)
TRAP(MPI_Get_count)
TRAP(MPI_Get_library_version)
TRAP(MPI_Get_processor_name)
TRAP(MPI_Get_version)
TRAP(MPI_Iallgather)
TRAP(MPI_Improbe)
TRAP(MPI_Init_thread)
TRAP(MPI_Initialized)
TRAP(MPI_Irecv)
TRAP(MPI_Isend)
TRAP(MPI_Mrecv)
TRAP(MPI_Query_thread)
TRAP(MPI_Recv)
TRAP(MPI_Reduce)
TRAP(MPI_Reduce_scatter_block)
TRAP(MPI_Request_free)
TRAP(MPI_Scan)
TRAP(MPI_Scatter)
TRAP(MPI_Send)
TRAP(MPI_Sendrecv)
TRAP(MPI_Test)

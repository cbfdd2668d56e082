/* The CUDA driver API for the shim's benchmark programs (krylov, p2p_bench),
 * opened with dlopen at run time: the programs build with mpicc alone, no
 * CUDA header or library, and run on a GPU machine from the carried binary.
 * Every call checks its result; a failure prints the call and the CUDA
 * error and aborts the MPI job. */
#ifndef CUDRV_H
#define CUDRV_H

#include <stddef.h>

/* Open libcuda.so.1 and initialise it; 0 on success, -1 (with a message on
 * stderr) when there is no usable driver. */
int cd_open(void);
/* Make the primary context of GPU local_rank % (GPU count) current;
 * returns the GPU's ordinal. */
int cd_select(int local_rank);
const char *cd_device_name(void);

void *cd_malloc(size_t bytes); /* device memory, zero-filled */
void cd_free(void *p);
void *cd_host_alloc(size_t bytes); /* page-locked host memory */
void cd_host_free(void *p);
/* Synchronous copies (ordered after the legacy stream's work). */
void cd_htod(void *dst, const void *src, size_t bytes);
void cd_dtoh(void *dst, const void *src, size_t bytes);
void cd_dtod(void *dst, const void *src, size_t bytes);
void cd_memset(void *p, unsigned char byte, size_t bytes);
void cd_sync(void);

/* Kernels: a module from a fatbin/cubin/PTX image in memory, its functions,
 * and launches on the legacy default stream. */
void *cd_module(const void *image);
void *cd_function(void *module, const char *name);
void cd_launch(void *function, unsigned grid, unsigned block, void **args);

/* CUDA IPC (64-byte handles); cd_ipc_open returns NULL when the driver
 * refuses (with the reason in *why). */
void cd_ipc_handle(void *dev, void *handle64);
void *cd_ipc_open(const void *handle64, const char **why);
void cd_ipc_close(void *mapped);

#endif

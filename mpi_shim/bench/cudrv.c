/* See cudrv.h. Function pointers of libcuda.so.1, looked up once. */
#include "cudrv.h"

#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long dptr;
/* CUipcMemHandle: 64 bytes, passed by value. */
typedef struct {
    char bytes[64];
} ipc_handle;

static struct {
    int (*Init)(unsigned);
    int (*DeviceGetCount)(int *);
    int (*DeviceGet)(int *, int);
    int (*DeviceGetName)(char *, int, int);
    int (*PrimaryCtxRetain)(void **, int);
    int (*CtxSetCurrent)(void *);
    int (*CtxSynchronize)(void);
    int (*MemAlloc)(dptr *, size_t);
    int (*MemFree)(dptr);
    int (*MemAllocHost)(void **, size_t);
    int (*MemFreeHost)(void *);
    int (*MemcpyHtoD)(dptr, const void *, size_t);
    int (*MemcpyDtoH)(void *, dptr, size_t);
    int (*MemcpyDtoD)(dptr, dptr, size_t);
    int (*MemsetD8)(dptr, unsigned char, size_t);
    int (*ModuleLoadData)(void **, const void *);
    int (*ModuleGetFunction)(void **, void *, const char *);
    int (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
    int (*IpcGetMemHandle)(void *, dptr);
    int (*IpcOpenMemHandle)(dptr *, ipc_handle, unsigned);
    int (*IpcCloseMemHandle)(dptr);
    int (*GetErrorName)(int, const char **);
    int device;
} cu;

static void die(const char *what, int rc)
{
    const char *name = "?";
    if (cu.GetErrorName)
        cu.GetErrorName(rc, &name);
    fprintf(stderr, "cudrv: %s failed: CUDA error %d (%s)\n", what, rc, name);
    int up = 0;
    MPI_Initialized(&up);
    if (up)
        MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

#define CK(call, what)                                                                         \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_)                                                                               \
            die(what, rc_);                                                                    \
    } while (0)

int cd_open(void)
{
    if (cu.Init)
        return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "cudrv: cannot open libcuda.so.1: %s\n", dlerror());
        return -1;
    }
    struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&cu.Init, "cuInit"},
        {(void **)&cu.DeviceGetCount, "cuDeviceGetCount"},
        {(void **)&cu.DeviceGet, "cuDeviceGet"},
        {(void **)&cu.DeviceGetName, "cuDeviceGetName"},
        {(void **)&cu.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
        {(void **)&cu.CtxSetCurrent, "cuCtxSetCurrent"},
        {(void **)&cu.CtxSynchronize, "cuCtxSynchronize"},
        {(void **)&cu.MemAlloc, "cuMemAlloc_v2"},
        {(void **)&cu.MemFree, "cuMemFree_v2"},
        {(void **)&cu.MemAllocHost, "cuMemAllocHost_v2"},
        {(void **)&cu.MemFreeHost, "cuMemFreeHost"},
        {(void **)&cu.MemcpyHtoD, "cuMemcpyHtoD_v2"},
        {(void **)&cu.MemcpyDtoH, "cuMemcpyDtoH_v2"},
        {(void **)&cu.MemcpyDtoD, "cuMemcpyDtoD_v2"},
        {(void **)&cu.MemsetD8, "cuMemsetD8_v2"},
        {(void **)&cu.ModuleLoadData, "cuModuleLoadData"},
        {(void **)&cu.ModuleGetFunction, "cuModuleGetFunction"},
        {(void **)&cu.LaunchKernel, "cuLaunchKernel"},
        {(void **)&cu.IpcGetMemHandle, "cuIpcGetMemHandle"},
        {(void **)&cu.IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"},
        {(void **)&cu.IpcCloseMemHandle, "cuIpcCloseMemHandle"},
        {(void **)&cu.GetErrorName, "cuGetErrorName"},
    };
    for (size_t k = 0; k < sizeof syms / sizeof syms[0]; k++) {
        *syms[k].slot = dlsym(lib, syms[k].name);
        if (!*syms[k].slot) {
            fprintf(stderr, "cudrv: libcuda.so.1 lacks %s\n", syms[k].name);
            cu.Init = NULL;
            return -1;
        }
    }
    int rc = cu.Init(0);
    if (rc) {
        fprintf(stderr, "cudrv: cuInit failed: CUDA error %d\n", rc);
        cu.Init = NULL;
        return -1;
    }
    return 0;
}

int cd_select(int local_rank)
{
    int n = 0, dev;
    void *ctx;
    CK(cu.DeviceGetCount(&n), "cuDeviceGetCount");
    if (n < 1)
        die("finding a GPU (none visible)", 100);
    CK(cu.DeviceGet(&dev, local_rank % n), "cuDeviceGet");
    CK(cu.PrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CK(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
    cu.device = dev;
    return local_rank % n;
}

const char *cd_device_name(void)
{
    static char name[128];
    if (cu.DeviceGetName(name, sizeof name, cu.device))
        return "?";
    return name;
}

void *cd_malloc(size_t bytes)
{
    dptr p = 0;
    CK(cu.MemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc");
    CK(cu.MemsetD8(p, 0, bytes ? bytes : 1), "cuMemsetD8");
    CK(cu.CtxSynchronize(), "cuCtxSynchronize");
    return (void *)(uintptr_t)p;
}

void cd_free(void *p)
{
    if (p)
        CK(cu.MemFree((uintptr_t)p), "cuMemFree");
}

void *cd_host_alloc(size_t bytes)
{
    void *p = NULL;
    CK(cu.MemAllocHost(&p, bytes ? bytes : 1), "cuMemAllocHost");
    return p;
}

void cd_host_free(void *p)
{
    if (p)
        CK(cu.MemFreeHost(p), "cuMemFreeHost");
}

void cd_htod(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CK(cu.MemcpyHtoD((uintptr_t)dst, src, bytes), "cuMemcpyHtoD");
}

void cd_dtoh(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CK(cu.MemcpyDtoH(dst, (uintptr_t)src, bytes), "cuMemcpyDtoH");
}

void cd_dtod(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CK(cu.MemcpyDtoD((uintptr_t)dst, (uintptr_t)src, bytes), "cuMemcpyDtoD");
}

void cd_memset(void *p, unsigned char byte, size_t bytes)
{
    if (bytes)
        CK(cu.MemsetD8((uintptr_t)p, byte, bytes), "cuMemsetD8");
}

void cd_sync(void)
{
    CK(cu.CtxSynchronize(), "cuCtxSynchronize");
}

void *cd_module(const void *image)
{
    void *m = NULL;
    CK(cu.ModuleLoadData(&m, image), "cuModuleLoadData");
    return m;
}

void *cd_function(void *module, const char *name)
{
    void *f = NULL;
    CK(cu.ModuleGetFunction(&f, module, name), name);
    return f;
}

void cd_launch(void *function, unsigned grid, unsigned block, void **args)
{
    CK(cu.LaunchKernel(function, grid, 1, 1, block, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel");
}

void cd_ipc_handle(void *dev, void *handle64)
{
    CK(cu.IpcGetMemHandle(handle64, (uintptr_t)dev), "cuIpcGetMemHandle");
}

void *cd_ipc_open(const void *handle64, const char **why)
{
    dptr p = 0;
    ipc_handle h;
    memcpy(h.bytes, handle64, sizeof h.bytes);
    int rc = cu.IpcOpenMemHandle(&p, h, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */);
    if (rc) {
        *why = "?";
        cu.GetErrorName(rc, why);
        return NULL;
    }
    return (void *)(uintptr_t)p;
}

void cd_ipc_close(void *mapped)
{
    if (mapped)
        CK(cu.IpcCloseMemHandle((uintptr_t)mapped), "cuIpcCloseMemHandle");
}

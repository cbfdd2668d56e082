/* Device memory for the test programs, through the CUDA runtime opened with
 * dlopen (libcudart.so, then versioned names, or $SHIMTEST_CUDART), falling
 * back to the driver API (libcuda.so.1, always present with a driver). No
 * CUDA header is needed to build this file.
 * SHIMTEST_ALLOC picks the allocator, as programs' own allocators differ:
 * `malloc` (cudaMalloc / cuMemAlloc, the default), `managed`
 * (cudaMallocManaged) or `pool` (cudaMallocAsync from the device's default
 * pool, synchronized before use). SHIMTEST_CTX=create allocates in a
 * context the program creates itself (see create_own_context). */
#include "shimtest.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The runtime's and the driver's entry points, as plain function pointers. */
static struct {
    int ready;
    int driver; /* 1: driver API, 0: runtime */
    /* runtime */
    int (*cudaSetDevice)(int);
    int (*cudaGetDevice)(int *);
    int (*cudaGetDeviceCount)(int *);
    int (*cudaMalloc)(void **, size_t);
    int (*cudaFree)(void *);
    int (*cudaMemcpy)(void *, const void *, size_t, int);
    int (*cudaMemset)(void *, int, size_t);
    int (*cudaDeviceSynchronize)(void);
    int (*cudaStreamCreate)(void **);
    int (*cudaStreamSynchronize)(void *);
    const char *(*cudaGetErrorString)(int);
    int (*cudaMallocManaged)(void **, size_t, unsigned);
    int (*cudaMallocAsync)(void **, size_t, void *);
    /* driver */
    int (*cuInit)(unsigned);
    int (*cuDeviceGetCount)(int *);
    int (*cuDeviceGet)(int *, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuCtxGetDevice)(int *);
    int (*cuMemAlloc)(unsigned long long *, size_t);
    int (*cuMemFree)(unsigned long long);
    int (*cuMemcpy)(unsigned long long, unsigned long long, size_t);
    int (*cuMemsetD8)(unsigned long long, unsigned char, size_t);
    int (*cuCtxSynchronize)(void);
    int (*cuStreamCreate)(void **, unsigned);
    int (*cuStreamSynchronize)(void *);
    int (*cuMemAllocManaged)(unsigned long long *, size_t, unsigned);
    int (*cuMemAllocAsync)(unsigned long long *, size_t, void *);
} cu;

static void die(const char *what, int err)
{
    const char *msg = "";
    if (!cu.driver && cu.cudaGetErrorString)
        msg = cu.cudaGetErrorString(err);
    fprintf(stderr, "shimtest: %s failed: CUDA error %d %s\n", what, err, msg);
    exit(2);
}

#define SYM(lib, name)                                   \
    do {                                                 \
        *(void **)&cu.name = dlsym(lib, #name);          \
        if (!cu.name)                                    \
            missing = #name;                             \
    } while (0)
#define SYM_AS(lib, field, sym)                          \
    do {                                                 \
        *(void **)&cu.field = dlsym(lib, sym);           \
        if (!cu.field)                                   \
            missing = sym;                               \
    } while (0)

static int open_runtime(void)
{
    const char *names[] = {getenv("SHIMTEST_CUDART"), "libcudart.so", "libcudart.so.13",
                           "libcudart.so.12", NULL};
    for (int k = 0; k < 5; k++) {
        if (!names[k] || !*names[k])
            continue;
        void *lib = dlopen(names[k], RTLD_NOW | RTLD_GLOBAL);
        if (!lib)
            continue;
        const char *missing = NULL;
        SYM(lib, cudaSetDevice);
        SYM(lib, cudaGetDevice);
        SYM(lib, cudaGetDeviceCount);
        SYM(lib, cudaMalloc);
        SYM(lib, cudaFree);
        SYM(lib, cudaMemcpy);
        SYM(lib, cudaMemset);
        SYM(lib, cudaDeviceSynchronize);
        SYM(lib, cudaStreamCreate);
        SYM(lib, cudaStreamSynchronize);
        SYM(lib, cudaGetErrorString);
        SYM(lib, cudaMallocManaged);
        SYM(lib, cudaMallocAsync);
        if (!missing)
            return 1;
        fprintf(stderr, "shimtest: %s lacks %s\n", names[k], missing);
    }
    return 0;
}

static int open_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return 0;
    const char *missing = NULL;
    SYM(lib, cuInit);
    SYM(lib, cuDeviceGetCount);
    SYM(lib, cuDeviceGet);
    SYM_AS(lib, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(lib, cuCtxSetCurrent);
    SYM(lib, cuCtxGetDevice);
    SYM_AS(lib, cuMemAlloc, "cuMemAlloc_v2");
    SYM_AS(lib, cuMemFree, "cuMemFree_v2");
    SYM(lib, cuMemcpy);
    SYM_AS(lib, cuMemsetD8, "cuMemsetD8_v2");
    SYM(lib, cuCtxSynchronize);
    SYM(lib, cuStreamCreate);
    SYM_AS(lib, cuStreamSynchronize, "cuStreamSynchronize");
    SYM(lib, cuMemAllocManaged);
    SYM(lib, cuMemAllocAsync);
    if (missing) {
        fprintf(stderr, "shimtest: libcuda.so.1 lacks %s\n", missing);
        return 0;
    }
    int rc = cu.cuInit(0);
    if (rc)
        die("cuInit", rc);
    return 1;
}

static void load(void)
{
    if (cu.ready)
        return;
    if (open_runtime()) {
        cu.driver = 0;
    } else if (open_driver()) {
        cu.driver = 1;
    } else {
        fprintf(stderr,
                "shimtest: --device needs CUDA, but neither libcudart.so (set SHIMTEST_CUDART "
                "to its path) nor libcuda.so.1 could be opened: %s\n",
                dlerror());
        exit(2);
    }
    cu.ready = 1;
}

int st_dev_count(void)
{
    load();
    int n = 0, rc = cu.driver ? cu.cuDeviceGetCount(&n) : cu.cudaGetDeviceCount(&n);
    if (rc)
        die("device count", rc);
    if (n < 1) {
        fprintf(stderr, "shimtest: --device but no CUDA device is visible\n");
        exit(2);
    }
    return n;
}

/* SHIMTEST_CTX=create: a context of the program's own (cuCtxCreate, not the
 * device's primary context) made current before MPI_Init, as the OSU
 * micro-benchmarks do; the runtime then allocates in it. */
static void create_own_context(int dev)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    int (*init)(unsigned) = lib ? (int (*)(unsigned))dlsym(lib, "cuInit") : NULL;
    int (*get)(int *, int) = lib ? (int (*)(int *, int))dlsym(lib, "cuDeviceGet") : NULL;
    int (*create)(void **, unsigned, int) =
        lib ? (int (*)(void **, unsigned, int))dlsym(lib, "cuCtxCreate_v2") : NULL;
    if (!init || !get || !create) {
        fprintf(stderr, "shimtest: SHIMTEST_CTX=create needs libcuda.so.1 with cuCtxCreate_v2\n");
        exit(2);
    }
    int handle, rc;
    void *ctx;
    if ((rc = init(0)) || (rc = get(&handle, dev)) || (rc = create(&ctx, 0, handle)))
        die("creating a context (cuCtxCreate)", rc);
}

void st_dev_select(int local_rank)
{
    int n = st_dev_count();
    int dev = local_rank % n, rc;
    const char *own = getenv("SHIMTEST_CTX");
    if (own && !strcmp(own, "create")) {
        create_own_context(dev);
        return;
    }
    if (cu.driver) {
        int handle;
        void *ctx;
        if ((rc = cu.cuDeviceGet(&handle, dev)) || (rc = cu.cuDevicePrimaryCtxRetain(&ctx, handle)) ||
            (rc = cu.cuCtxSetCurrent(ctx)))
            die("selecting the device (driver API)", rc);
    } else if ((rc = cu.cudaSetDevice(dev))) {
        die("cudaSetDevice", rc);
    }
}

int st_dev_current(void)
{
    load();
    int d = -1;
    if (cu.driver)
        cu.cuCtxGetDevice(&d);
    else
        cu.cudaGetDevice(&d);
    return d;
}

/* SHIMTEST_ALLOC: 0 malloc, 1 managed, 2 pool. */
static int alloc_kind(void)
{
    static int kind = -1;
    if (kind < 0) {
        const char *a = getenv("SHIMTEST_ALLOC");
        if (!a || !*a || !strcmp(a, "malloc"))
            kind = 0;
        else if (!strcmp(a, "managed"))
            kind = 1;
        else if (!strcmp(a, "pool"))
            kind = 2;
        else {
            fprintf(stderr, "shimtest: SHIMTEST_ALLOC=%s: expected malloc, managed or pool\n", a);
            exit(2);
        }
    }
    return kind;
}

void *st_dev_malloc(size_t bytes)
{
    load();
    if (bytes == 0)
        bytes = 1; /* a real device address even for empty buffers */
    int rc, kind = alloc_kind();
    if (kind == 1 || kind == 2) {
        /* managed: attach globally (flag 1, both APIs); pool: the legacy
         * default stream, waited for so that the memory is usable at once */
        void *p = NULL;
        unsigned long long d = 0;
        if (cu.driver)
            rc = kind == 1 ? cu.cuMemAllocManaged(&d, bytes, 1) : cu.cuMemAllocAsync(&d, bytes, NULL);
        else
            rc = kind == 1 ? cu.cudaMallocManaged(&p, bytes, 1) : cu.cudaMallocAsync(&p, bytes, NULL);
        if (rc)
            die(kind == 1 ? "cudaMallocManaged" : "cudaMallocAsync", rc);
        if (kind == 2 && (rc = st_dev_sync()))
            die("synchronizing cudaMallocAsync", rc);
        return cu.driver ? (void *)(uintptr_t)d : p;
    }
    if (cu.driver) {
        unsigned long long p = 0;
        if ((rc = cu.cuMemAlloc(&p, bytes)))
            die("cuMemAlloc", rc);
        return (void *)(uintptr_t)p;
    }
    void *p = NULL;
    if ((rc = cu.cudaMalloc(&p, bytes)))
        die("cudaMalloc", rc);
    return p;
}

void st_dev_free(void *p)
{
    if (!p)
        return;
    int rc = cu.driver ? cu.cuMemFree((uintptr_t)p) : cu.cudaFree(p);
    if (rc)
        die("cudaFree", rc);
}

int st_dev_memcpy(void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return 0;
    /* kind 4 = cudaMemcpyDefault: direction from the unified address space */
    int rc = cu.driver ? cu.cuMemcpy((uintptr_t)dst, (uintptr_t)src, bytes)
                       : cu.cudaMemcpy(dst, src, bytes, 4);
    if (rc)
        die("cudaMemcpy", rc);
    return 0;
}

void st_dev_memset(void *p, int byte, size_t bytes)
{
    if (bytes == 0)
        return;
    int rc = cu.driver ? cu.cuMemsetD8((uintptr_t)p, (unsigned char)byte, bytes)
                       : cu.cudaMemset(p, byte, bytes);
    if (!rc)
        rc = st_dev_sync();
    if (rc)
        die("cudaMemset", rc);
}

int st_dev_sync(void)
{
    return cu.driver ? cu.cuCtxSynchronize() : cu.cudaDeviceSynchronize();
}

int st_dev_stream_create(st_stream *s)
{
    load();
    return cu.driver ? cu.cuStreamCreate(s, 0) : cu.cudaStreamCreate(s);
}

int st_dev_stream_sync(st_stream s)
{
    return cu.driver ? cu.cuStreamSynchronize(s) : cu.cudaStreamSynchronize(s);
}

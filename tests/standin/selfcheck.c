/*
 * Self-check of the stand-in driver and runtime (not built by build.rs; see the end of this
 * comment). Exercises every stand-in function, prints one deterministic line per check (no
 * addresses), so that its stdout is byte-identical with and without an LD_PRELOAD interposer,
 * and ends with how many times each call that an interposer records was made ("hooked")
 * — compare those with the analyzer's summary of the trace.
 *
 *   D=$(ls -d target/debug/build/isolate-tests-*\/out/standin | head -1)
 *   cc -O1 -g -Wall -pthread -I tests/standin -o /tmp/selfcheck tests/standin/selfcheck.c \
 *      -L$D -l:libcudart.so.13 -l:libcuda.so.1 -ldl
 *   LD_LIBRARY_PATH=$D /tmp/selfcheck
 *   LD_PRELOAD=$PWD/target/debug/libisolate.so ISOLATE_TRACE=/tmp/x-%p.trace \
 *      LD_LIBRARY_PATH=$D /tmp/selfcheck
 *
 * Exit status: the number of failed checks (0: all passed).
 */
#define _GNU_SOURCE
#include "cuda_standin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (cond) {                                                                            \
            printf("ok - ");                                                                   \
        } else {                                                                               \
            printf("not ok (line %d) - ", __LINE__);                                           \
            failures++;                                                                        \
        }                                                                                      \
        printf(__VA_ARGS__);                                                                   \
        printf("\n");                                                                          \
    } while (0)

#define EQ(got, want, what)                                                                    \
    do {                                                                                       \
        long long g_ = (long long)(got), w_ = (long long)(want);                               \
        CHECK(g_ == w_, "%s: %lld (want %lld)", what, g_, w_);                                 \
    } while (0)

/* ---------------------------------------------------------------- hooked-call counts */

static struct {
    const char *name;
    int n;
} hits[64];
static int nhits;

static void hit(const char *name) {
    for (int i = 0; i < nhits; i++)
        if (strcmp(hits[i].name, name) == 0) {
            hits[i].n++;
            return;
        }
    hits[nhits].name = name;
    hits[nhits++].n = 1;
}

/* A call that an interposer records: counted, then made. */
#define H(name, call) (hit(name), (call))

static int cmp_hits(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ---------------------------------------------------------------- helpers */

static const char *sym(void *p) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_sname || info.dli_saddr != p)
        return "?";
    return info.dli_sname;
}

static sigjmp_buf probe_jmp;
static void probe_handler(int sig) {
    (void)sig;
    siglongjmp(probe_jmp, 1);
}

/* 1 if a read of p works, 0 if it faults. */
static int readable(const volatile unsigned char *p) {
    struct sigaction act, old_segv, old_bus;
    memset(&act, 0, sizeof act);
    act.sa_handler = probe_handler;
    sigemptyset(&act.sa_mask);
    sigaction(SIGSEGV, &act, &old_segv);
    sigaction(SIGBUS, &act, &old_bus);
    int ok;
    if (sigsetjmp(probe_jmp, 1) == 0) {
        (void)*p;
        ok = 1;
    } else {
        ok = 0;
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    return ok;
}

static PFN_cuGetProcAddress_v2 gpa;

static void *lookup(const char *name, int version, cuuint64_t flags, int *rc, int *status) {
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = 99;
    *rc = gpa(name, &p, version, flags, &st);
    *status = st;
    return p;
}

static void *need(const char *name, int version, cuuint64_t flags) {
    int rc, st;
    void *p = lookup(name, version, flags, &rc, &st);
    if (rc != 0 || !p) {
        printf("not ok - resolve %s@%d flags %llu: rc %d status %d\n", name, version,
               (unsigned long long)flags, rc, st);
        failures++;
        return NULL;
    }
    return p;
}

/* ---------------------------------------------------------------- kernels */

/* fill(int *dst, int value, size_t n) */
static void k_fill(void **p) {
    int *dst = (int *)(uintptr_t) * (CUdeviceptr *)p[0];
    int v = *(int *)p[1];
    size_t n = *(size_t *)p[2];
    for (size_t i = 0; i < n; i++)
        dst[i] = v;
}

/* step(int *x, int v): x[0] = x[0] * 10 + v, so that the order of launches shows */
static void k_step(void **p) {
    int *x = (int *)(uintptr_t) * (CUdeviceptr *)p[0];
    x[0] = x[0] * 10 + *(int *)p[1];
}

static void k_none(void **p) { (void)p; }

/* ================================================================ the static-runtime path */

typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_alloc_v1)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*PFN_free_v1)(CUdeviceptr_v1);
typedef CUresult (*PFN_count)(int *);

static void static_path(void) {
    printf("# static runtime path: dlopen, dlsym(cuGetProcAddress_v2), self lookup\n");
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen libcuda.so.1");
    PFN_cuGetProcAddress_v2 first = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    CHECK(first != NULL, "dlsym cuGetProcAddress_v2");
    void *self = NULL;
    CUdriverProcAddressQueryResult st = 99;
    int rc = first("cuGetProcAddress", &self, 13000, 0, &st);
    EQ(rc, 0, "cuGetProcAddress(\"cuGetProcAddress\", 13000)");
    EQ(st, CU_GET_PROC_ADDRESS_SUCCESS, "  status");
    CHECK(self == (void *)first, "  hands back itself (%s)", sym(self));
    CHECK(strcmp(sym(self), "cuGetProcAddress_v2") == 0, "  dladdr: cuGetProcAddress_v2");
    gpa = (PFN_cuGetProcAddress_v2)self;

    int s;
    void *p;
    p = lookup("cuGetProcAddress", 11030, 0, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuGetProcAddress") == 0,
          "cuGetProcAddress@11030 is the 4-argument export (%s)", sym(p));
    p = lookup("cuMemAlloc", 12000, 0, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuMemAlloc_v2") == 0, "cuMemAlloc@12000 -> %s", sym(p));
    CHECK(p == (void *)cuMemAlloc_v2, "  the very export the program links");
    p = lookup("cuMemAlloc", 3020, 0, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuMemAlloc_v2") == 0, "cuMemAlloc@3020 -> %s", sym(p));
    p = lookup("cuMemAlloc", 3000, 0, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuMemAlloc") == 0, "cuMemAlloc@3000 -> %s (v1 ABI)",
          sym(p));
    p = lookup("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuMemAllocAsync_ptsz") == 0,
          "cuMemAllocAsync per-thread -> %s", sym(p));
    p = lookup("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuMemAllocAsync") == 0, "cuMemAllocAsync legacy -> %s",
          sym(p));
    p = lookup("cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuMemcpyHtoD_v2_ptds") == 0,
          "cuMemcpyHtoD per-thread -> %s", sym(p));
    p = lookup("cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuMemAlloc_v2") == 0,
          "cuMemAlloc per-thread (no stream) -> %s", sym(p));
    p = lookup("cuEventElapsedTime", 12000, 0, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuEventElapsedTime") == 0, "cuEventElapsedTime@12000 -> %s",
          sym(p));
    p = lookup("cuEventElapsedTime", 13000, 0, &rc, &s);
    CHECK(rc == 0 && strcmp(sym(p), "cuEventElapsedTime_v2") == 0,
          "cuEventElapsedTime@13000 -> %s", sym(p));
    p = lookup("cuNoSuchThing", 12000, 0, &rc, &s);
    CHECK(rc == CUDA_ERROR_NOT_FOUND && s == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && !p,
          "unknown name: rc %d status %d null %d", rc, s, p == NULL);
    p = lookup("cuMemAlloc_v2", 12000, 0, &rc, &s);
    CHECK(rc == CUDA_ERROR_NOT_FOUND && !p, "an export name is not a base name: rc %d", rc);
    p = lookup("cuMemAllocAsync", 11000, 0, &rc, &s);
    CHECK(rc == CUDA_ERROR_NOT_FOUND && s == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && !p,
          "cuMemAllocAsync@11000: rc %d status %d null %d", rc, s, p == NULL);
    p = lookup("cuMemAlloc", 13010, 0, &rc, &s);
    EQ(rc, CUDA_ERROR_INVALID_VALUE, "version newer than the driver");
    p = lookup("cuMemAlloc", 12000, 4, &rc, &s);
    EQ(rc, CUDA_ERROR_INVALID_VALUE, "unknown flag");
    PFN_cuGetProcAddress_v1 v1 = (PFN_cuGetProcAddress_v1)need("cuGetProcAddress", 11030, 0);
    p = NULL;
    rc = v1 ? v1("cuMemFree", NULL, 12000, 0) : -1;
    EQ(rc, CUDA_ERROR_INVALID_VALUE, "v1 resolver, null pfn");
    rc = v1 ? v1("cuMemFree", &p, 12000, 0) : -1;
    CHECK(rc == 0 && strcmp(sym(p), "cuMemFree_v2") == 0, "v1 resolver: cuMemFree -> %s",
          sym(p));

    printf("# before cuInit\n");
    PFN_alloc alloc = (PFN_alloc)need("cuMemAlloc", 12000, 0);
    PFN_count count = (PFN_count)need("cuDeviceGetCount", 12000, 0);
    CUdeviceptr d = 0;
    int n = -1;
    EQ(H("cuMemAlloc_v2", alloc(&d, 16)), CUDA_ERROR_NOT_INITIALIZED, "cuMemAlloc_v2");
    EQ(count(&n), CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGetCount");
    int ver = 0;
    EQ(cuDriverGetVersion(&ver), 0, "cuDriverGetVersion works before cuInit");
    EQ(ver, 13000, "  driver version");
    const char *str = NULL;
    EQ(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &str), 0, "cuGetErrorName");
    CHECK(str && strcmp(str, "CUDA_ERROR_OUT_OF_MEMORY") == 0, "  %s", str ? str : "(null)");
    EQ(cuGetErrorString(CUDA_ERROR_INVALID_CONTEXT, &str), 0, "cuGetErrorString");
    CHECK(str && strcmp(str, "invalid device context") == 0, "  %s", str ? str : "(null)");
    EQ(cuGetErrorName(12345, &str), CUDA_ERROR_INVALID_VALUE, "cuGetErrorName of nonsense");
    EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE, "cuInit(1)");
    EQ(cuInit(0), 0, "cuInit(0)");
    EQ(count(&n), 0, "cuDeviceGetCount");
    EQ(n, 1, "  devices");
    printf("# no current context\n");
    EQ(H("cuMemAlloc_v2", alloc(&d, 16)), CUDA_ERROR_INVALID_CONTEXT, "cuMemAlloc_v2");
    CUdevice dev = -1;
    EQ(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT, "cuCtxGetDevice");
    CUcontext ctx = (CUcontext)1;
    EQ(cuCtxGetCurrent(&ctx), 0, "cuCtxGetCurrent");
    CHECK(ctx == NULL, "  is null");
    EQ(cuCtxSetCurrent((CUcontext)&n), CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent(garbage)");
    EQ(cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet(1)");
    EQ(cuDeviceGet(&dev, 0), 0, "cuDeviceGet(0)");
    EQ(cuDevicePrimaryCtxRetain(&ctx, dev), 0, "cuDevicePrimaryCtxRetain");
    EQ(cuCtxSetCurrent(ctx), 0, "cuCtxSetCurrent");
    EQ(cuCtxGetDevice(&dev), 0, "cuCtxGetDevice");
    EQ(dev, 0, "  device");
    char name[64] = "";
    EQ(cuDeviceGetName(name, sizeof name, 0), 0, "cuDeviceGetName");
    CHECK(strstr(name, "Stand-in") != NULL, "  %s", name);
    size_t total = 0, freeb = 0;
    EQ(cuDeviceTotalMem_v2(&total, 0), 0, "cuDeviceTotalMem_v2");
    EQ(total, 1ull << 30, "  1 GiB");
    EQ(cuMemGetInfo_v2(&freeb, &total), 0, "cuMemGetInfo_v2");
    EQ(freeb, total, "  all free");

    printf("# v1 cuMemAlloc: 32-bit pointer and size\n");
    PFN_alloc_v1 alloc1 = (PFN_alloc_v1)need("cuMemAlloc", 3000, 0);
    PFN_free_v1 free1 = (PFN_free_v1)need("cuMemFree", 3000, 0);
    struct {
        CUdeviceptr_v1 d;
        unsigned canary;
    } v = {0, 0xC0FFEEu};
    EQ(alloc1(&v.d, 1000), 0, "cuMemAlloc (v1)");
    CHECK(v.d != 0 && v.canary == 0xC0FFEEu, "  wrote 4 bytes, a non-null pointer");
    memset((void *)(uintptr_t)v.d, 0x11, 1000);
    EQ(free1(v.d), 0, "cuMemFree (v1)");
    EQ(alloc1(&v.d, 1000), 0, "cuMemAlloc (v1) again");
    EQ(H("cuMemFree_v2", cuMemFree_v2(v.d)), 0, "  freed by cuMemFree_v2");
}

/* ================================================================ driver memory */

static void driver_memory(void) {
    printf("# cuMemAlloc_v2 / cuMemFree_v2\n");
    CUdeviceptr a = 0, b = 0, c = 0, x = 0;
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&a, 0)), CUDA_ERROR_INVALID_VALUE, "size 0");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(NULL, 16)), CUDA_ERROR_INVALID_VALUE, "null out");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&a, 1000)), 0, "alloc a");
    EQ(a % 256, 0, "  256-byte aligned");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&b, 1000)), 0, "alloc b");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&c, 1000)), 0, "alloc c");
    CHECK(a != b && b != c && a != c, "  distinct");
    memset((void *)(uintptr_t)b, 0x7f, 1000); /* device memory is host memory */
    CUdeviceptr base = 0;
    size_t size = 0;
    EQ(cuMemGetAddressRange_v2(&base, &size, b + 999), 0, "cuMemGetAddressRange_v2 inside b");
    CHECK(base == b && size == 1000, "  base is b, size 1000 (%zu)", size);
    EQ(cuMemGetAddressRange_v2(&base, &size, 0x10), CUDA_ERROR_NOT_FOUND,
       "cuMemGetAddressRange_v2 elsewhere");
    EQ(H("cuMemFree_v2", cuMemFree_v2(b + 8)), CUDA_ERROR_INVALID_VALUE, "free inside b");
    EQ(H("cuMemFree_v2", cuMemFree_v2(0)), 0, "free 0");
    EQ(H("cuMemFree_v2", cuMemFree_v2(b)), 0, "free b");
    EQ(H("cuMemFree_v2", cuMemFree_v2(b)), CUDA_ERROR_INVALID_VALUE, "free b twice");
    EQ(H("cuMemFree_v2", cuMemFree_v2(a)), 0, "free a");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&x, 1000)), 0, "alloc x, same size");
    CHECK(x == a, "  x gets a's address back (the latest free that fits)");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&b, 900)), 0, "alloc 900");
    CHECK(b != a, "  b's old address? %d", b != a);
    EQ(H("cuMemFree_v2", cuMemFree_v2(x)), 0, "free x");
    EQ(H("cuMemFree_v2", cuMemFree_v2(b)), 0, "free b");
    EQ(H("cuMemFree_v2", cuMemFree_v2(c)), 0, "free c");
    size_t freeb = 0, total = 0;
    cuMemGetInfo_v2(&freeb, &total);
    EQ(freeb, total, "all free again");

    printf("# managed, pitched, pools\n");
    CUdeviceptr m = 0, p = 0;
    EQ(H("cuMemAllocManaged", cuMemAllocManaged(&m, 4096, 3)), CUDA_ERROR_INVALID_VALUE,
       "managed, bad flags");
    EQ(H("cuMemAllocManaged", cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL)), 0, "managed");
    ((int *)(uintptr_t)m)[1023] = 5;
    EQ(H("cuMemFree_v2", cuMemFree_v2(m)), 0, "free managed");
    size_t pitch = 0;
    EQ(H("cuMemAllocPitch_v2", cuMemAllocPitch_v2(&p, &pitch, 100, 10, 4)), 0, "pitch 100x10");
    EQ(pitch, 512, "  pitch");
    EQ(H("cuMemAllocPitch_v2", cuMemAllocPitch_v2(&x, &pitch, 513, 2, 16)), 0, "pitch 513x2");
    EQ(pitch, 1024, "  pitch");
    EQ(H("cuMemAllocPitch_v2", cuMemAllocPitch_v2(&c, &pitch, 100, 10, 3)),
       CUDA_ERROR_INVALID_VALUE, "element size 3");
    EQ(H("cuMemFree_v2", cuMemFree_v2(p)), 0, "free pitched");
    EQ(H("cuMemFree_v2", cuMemFree_v2(x)), 0, "free pitched");
    CUmemoryPool pool = NULL, mine = NULL;
    EQ(cuDeviceGetDefaultMemPool(&pool, 0), 0, "cuDeviceGetDefaultMemPool");
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    EQ(cuMemPoolCreate(&mine, &props), 0, "cuMemPoolCreate");
    cuuint64_t v64 = ~0ull;
    EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v64), 0,
       "set release threshold");
    v64 = 0;
    EQ(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v64), 0,
       "get release threshold");
    CHECK(v64 == ~0ull, "  UINT64_MAX");
    int one = 0;
    EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &one), 0,
       "set opportunistic 0");
    EQ(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &one), 0,
       "get opportunistic");
    EQ(one, 0, "  0");
    EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v64),
       CUDA_ERROR_INVALID_VALUE, "used-current is read-only");
    EQ(H("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&p, 1000, mine, NULL)), 0,
       "from my pool");
    EQ(cuMemPoolGetAttribute(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v64), 0, "used current");
    EQ(v64, 1024, "  1024 (rounded)");
    EQ(H("cuMemFreeAsync", cuMemFreeAsync(p, NULL)), 0, "free async on the legacy stream");
    EQ(cuMemPoolGetAttribute(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v64), 0, "used current");
    EQ(v64, 0, "  0");
    EQ(cuMemPoolGetAttribute(mine, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v64), 0, "used high");
    EQ(v64, 1024, "  1024");
    EQ(H("cuMemAllocFromPoolAsync_ptsz", cuMemAllocFromPoolAsync_ptsz(&p, 10, pool, NULL)), 0,
       "from the default pool, ptsz");
    EQ(H("cuMemFreeAsync_ptsz", cuMemFreeAsync_ptsz(p, NULL)), 0, "free async ptsz");
    EQ(H("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&p, 10, (CUmemoryPool)&one, NULL)),
       CUDA_ERROR_INVALID_VALUE, "from a garbage pool");
    EQ(cuMemPoolTrimTo(pool, 0), 0, "cuMemPoolTrimTo");
    EQ(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE, "destroy the default pool");
    EQ(cuMemPoolDestroy(mine), 0, "cuMemPoolDestroy");

    printf("# host memory\n");
    void *h = NULL, *h2 = NULL;
    EQ(H("cuMemAllocHost_v2", cuMemAllocHost_v2(&h, 4096)), 0, "cuMemAllocHost_v2");
    memset(h, 1, 4096);
    EQ(cuMemsetD8_v2((CUdeviceptr)(uintptr_t)h, 2, 4096), 0, "memset of pinned host memory");
    EQ(((unsigned char *)h)[4095], 2, "  set");
    EQ(H("cuMemHostAlloc", cuMemHostAlloc(&h2, 100, 8)), CUDA_ERROR_INVALID_VALUE,
       "cuMemHostAlloc bad flags");
    EQ(H("cuMemHostAlloc", cuMemHostAlloc(&h2, 100, CU_MEMHOSTALLOC_DEVICEMAP)), 0,
       "cuMemHostAlloc");
    EQ(H("cuMemHostRegister_v2", cuMemHostRegister_v2(h, 4096, 0)),
       CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "register pinned memory");
    EQ(H("cuMemFreeHost", cuMemFreeHost(h)), 0, "cuMemFreeHost");
    EQ(H("cuMemFreeHost", cuMemFreeHost(h)), CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost twice");
    EQ(H("cuMemFreeHost", cuMemFreeHost(h2)), 0, "cuMemFreeHost");
    char *buf = aligned_alloc(4096, 65536);
    EQ(H("cuMemHostRegister_v2", cuMemHostRegister_v2(buf, 65536, CU_MEMHOSTREGISTER_PORTABLE)),
       0, "cuMemHostRegister_v2");
    EQ(H("cuMemHostRegister_v2", cuMemHostRegister_v2(buf + 4096, 4096, 0)),
       CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "register inside");
    EQ(H("cuMemHostUnregister", cuMemHostUnregister(buf + 4096)),
       CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "unregister inside");
    EQ(H("cuMemFreeHost", cuMemFreeHost(buf)), CUDA_ERROR_INVALID_VALUE,
       "cuMemFreeHost of registered memory");
    EQ(H("cuMemHostUnregister", cuMemHostUnregister(buf)), 0, "cuMemHostUnregister");
    EQ(cuMemHostRegister(buf, 65536, 0), 0, "cuMemHostRegister (pre-6.5 export)");
    EQ(H("cuMemHostUnregister", cuMemHostUnregister(buf)), 0, "cuMemHostUnregister");
    free(buf);

    printf("# copies and sets\n");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&a, 4096)), 0, "alloc");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&b, 4096)), 0, "alloc");
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        in[i] = (unsigned char)(i * 7);
    EQ(cuMemcpyHtoD_v2(a, in, 4096), 0, "HtoD");
    EQ(cuMemcpyDtoD_v2(b, a, 4096), 0, "DtoD");
    memset(out, 0, sizeof out);
    EQ(cuMemcpyDtoH_v2(out, b, 4096), 0, "DtoH");
    CHECK(memcmp(in, out, 4096) == 0, "  round trip");
    EQ(cuMemsetD8_v2(a, 0xee, 4096), 0, "memset D8");
    EQ(cuMemcpy((CUdeviceptr)(uintptr_t)out, a, 4096), 0, "cuMemcpy");
    CHECK(out[0] == 0xee && out[4095] == 0xee, "  0xee");
    EQ(cuMemsetD32_v2(a + 2, 1, 4), CUDA_ERROR_INVALID_VALUE, "memset D32 misaligned");
    EQ(cuMemsetD32_v2(a, 0x01020304, 1024), 0, "memset D32");
    EQ(((unsigned *)(uintptr_t)a)[1023], 0x01020304, "  value");
    EQ(cuMemcpy_ptds(b, a, 16), 0, "cuMemcpy_ptds");
    EQ(cuMemsetD8_v2_ptds(b, 1, 16), 0, "cuMemsetD8_v2_ptds");
    EQ(cuMemcpyHtoD_v2(0, in, 4), CUDA_ERROR_INVALID_VALUE, "copy to null");
    EQ(cuMemsetD8_v2((CUdeviceptr)(uintptr_t)in, 0, 4), CUDA_ERROR_INVALID_VALUE,
       "memset of pageable host memory");
    EQ(cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)out, in, 4), CUDA_ERROR_INVALID_VALUE,
       "HtoD to pageable host memory");
    EQ(cuMemcpy((CUdeviceptr)(uintptr_t)out, (CUdeviceptr)(uintptr_t)in, 4), 0,
       "cuMemcpy host to host");
    EQ(cuMemsetD8_v2(a + 4000, 0, 200), 0, "memset past an allocation, inside the arena");
    EQ(cuMemcpyHtoD_v2(0, in, 0), 0, "copy 0 bytes");
    EQ(H("cuMemFree_v2", cuMemFree_v2(a)), 0, "free");
    EQ(H("cuMemFree_v2", cuMemFree_v2(b)), 0, "free");
}

/* ================================================================ virtual memory */

static void driver_vmm(void) {
    printf("# virtual memory: two mappings of one handle alias\n");
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    EQ(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), 0,
       "granularity");
    EQ(g, 65536, "  64 KiB");
    CUmemGenericAllocationHandle hv = 0, hf = 0;
    EQ(H("cuMemCreate", cuMemCreate(&hv, g + 1, &prop, 0)), CUDA_ERROR_INVALID_VALUE,
       "create, not a multiple");
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    EQ(H("cuMemCreate", cuMemCreate(&hf, 2 * g, &prop, 0)), CUDA_ERROR_NOT_SUPPORTED,
       "create, fabric handle");
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    EQ(H("cuMemCreate", cuMemCreate(&hv, 2 * g, &prop, 0)), 0, "create 2 granules");
    size_t freeb = 0, total = 0;
    cuMemGetInfo_v2(&freeb, &total);
    EQ(total - freeb, 2 * g, "  counted as used");
    CUdeviceptr va = 0, vb = 0;
    EQ(H("cuMemAddressReserve", cuMemAddressReserve(&va, 4 * g, 0, 0, 0)), 0, "reserve A");
    EQ(va % g, 0, "  aligned");
    EQ(H("cuMemAddressReserve", cuMemAddressReserve(&vb, 2 * g, 1 << 20, 0, 0)), 0,
       "reserve B, 1 MiB aligned");
    EQ(vb % (1 << 20), 0, "  aligned");
    CHECK(!readable((unsigned char *)(uintptr_t)va), "reserved memory is inaccessible");
    EQ(H("cuMemMap", cuMemMap(va + g, 2 * g, 0, hv, 0)), 0, "map into A");
    EQ(H("cuMemMap", cuMemMap(va + 2 * g, g, 0, hv, 0)), CUDA_ERROR_INVALID_VALUE,
       "map over a mapping");
    EQ(H("cuMemMap", cuMemMap(vb, 2 * g, 0, hv, 0)), 0, "map into B");
    CHECK(!readable((unsigned char *)(uintptr_t)(va + g)), "mapped, no access yet");
    EQ(cuMemsetD8_v2(va + g, 1, 16), CUDA_ERROR_INVALID_VALUE, "memset without access");
    EQ(cuMemsetD8_v2(va, 1, 16), CUDA_ERROR_INVALID_VALUE, "memset of reserved, unmapped space");
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EQ(H("cuMemSetAccess", cuMemSetAccess(va, 4 * g, &acc, 1)), CUDA_ERROR_INVALID_VALUE,
       "set access over unmapped space");
    EQ(H("cuMemSetAccess", cuMemSetAccess(va + g, 2 * g, &acc, 1)), 0, "set access A");
    EQ(H("cuMemSetAccess", cuMemSetAccess(vb, 2 * g, &acc, 1)), 0, "set access B");
    unsigned char *pa = (unsigned char *)(uintptr_t)(va + g), *pb = (unsigned char *)(uintptr_t)vb;
    pa[0] = 0x42;
    pa[2 * g - 1] = 0x43;
    CHECK(pb[0] == 0x42 && pb[2 * g - 1] == 0x43, "written through A, read through B");
    EQ(cuMemsetD8_v2(va + g, 1, 2 * g + 1), CUDA_ERROR_INVALID_VALUE, "memset past the mapping");
    unsigned char byte = 0;
    EQ(cuMemcpyDtoH_v2(&byte, va, 1), CUDA_ERROR_INVALID_VALUE, "copy from unmapped space");
    EQ(cuMemcpy((CUdeviceptr)(uintptr_t)&byte, va + g, 1), 0, "cuMemcpy from a mapping");
    EQ(byte, 0x42, "  read");
    CUmemAccessDesc ro = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READ};
    EQ(H("cuMemSetAccess", cuMemSetAccess(vb, 2 * g, &ro, 1)), 0, "B read-only");
    EQ(cuMemsetD8_v2(vb, 1, 1), CUDA_ERROR_INVALID_VALUE, "  memset B refused");
    EQ(cuMemcpyDtoD_v2(va + g + 1, vb, 1), 0, "  copy from B");
    EQ(H("cuMemSetAccess", cuMemSetAccess(vb, 2 * g, &acc, 1)), 0, "B read-write again");
    EQ(cuMemsetD8_v2(vb + 10, 0x99, 1), 0, "memset through B");
    EQ(pa[10], 0x99, "  seen through A");
    CUdeviceptr base = 0;
    size_t size = 0;
    EQ(cuMemGetAddressRange_v2(&base, &size, va + g + 5), 0, "address range of a mapping");
    CHECK(base == va + g && size == 2 * g, "  the mapping");
    EQ(H("cuMemRelease", cuMemRelease(hv)), 0, "release while mapped");
    CHECK(pb[0] == 0x42, "  memory stays while mapped");
    EQ(H("cuMemRelease", cuMemRelease(hv)), CUDA_ERROR_INVALID_VALUE, "release twice");
    EQ(H("cuMemUnmap", cuMemUnmap(va + g, g)), CUDA_ERROR_INVALID_VALUE, "unmap half a mapping");
    EQ(H("cuMemUnmap", cuMemUnmap(va + g, 2 * g)), 0, "unmap A");
    CHECK(!readable(pa), "  A inaccessible again");
    CHECK(pb[2 * g - 1] == 0x43, "  B still there");
    EQ(H("cuMemUnmap", cuMemUnmap(vb, 2 * g)), 0, "unmap B");
    cuMemGetInfo_v2(&freeb, &total);
    EQ(total - freeb, 0, "memory gone with the last mapping");
    CUdeviceptr want = va;
    EQ(H("cuMemAddressFree", cuMemAddressFree(va, 3 * g)), CUDA_ERROR_INVALID_VALUE,
       "address free, wrong size");
    EQ(H("cuMemAddressFree", cuMemAddressFree(va, 4 * g)), 0, "address free A");
    EQ(H("cuMemAddressFree", cuMemAddressFree(vb, 2 * g)), 0, "address free B");
    EQ(H("cuMemAddressReserve", cuMemAddressReserve(&va, 4 * g, 0, want, 0)), 0,
       "reserve at a requested address");
    CHECK(va == want, "  got it");
    EQ(H("cuMemAddressFree", cuMemAddressFree(va, 4 * g)), 0, "address free");
}

/* ================================================================ streams, events, kernels */

static CUfunction f_fill, f_step, f_none;

static void driver_streams(void) {
    printf("# streams run in order, when synchronised\n");
    CUstream s = NULL, s2 = NULL, snb = NULL;
    EQ(cuStreamCreate(&s, CU_STREAM_DEFAULT), 0, "cuStreamCreate");
    EQ(cuStreamCreateWithPriority(&s2, CU_STREAM_DEFAULT, -1), 0, "cuStreamCreateWithPriority");
    EQ(cuStreamCreate(&snb, CU_STREAM_NON_BLOCKING), 0, "cuStreamCreate non-blocking");
    EQ(cuStreamCreate(&snb, 4), CUDA_ERROR_INVALID_VALUE, "cuStreamCreate bad flags");
    EQ(cuStreamSynchronize((CUstream)&s), CUDA_ERROR_INVALID_HANDLE, "sync a garbage stream");
    CUdeviceptr d = 0, e = 0;
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&d, 4096)), 0, "alloc");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&e, 4096)), 0, "alloc");
    volatile int *di = (volatile int *)(uintptr_t)d;
    volatile unsigned char *eb = (volatile unsigned char *)(uintptr_t)e;
    memset((void *)(uintptr_t)d, 0, 4096);
    memset((void *)(uintptr_t)e, 0, 4096);
    int host = -1;
    int two = 2, three = 3;
    void *args[] = {&d, &two};
    EQ(cuMemsetD32Async(d, 1, 1, s), 0, "memset d[0]=1 on s");
    EQ(cuLaunchKernel(f_step, 1, 1, 1, 32, 1, 1, 0, s, args, NULL), 0, "step(d, 2) on s");
    two = 7; /* the launch copied the value */
    args[1] = &three;
    EQ(cuLaunchKernel_ptsz(f_step, 1, 1, 1, 1, 1, 1, 0, s, args, NULL), 0, "step(d, 3) on s");
    EQ(cuMemcpyDtoHAsync_v2(&host, d, sizeof host, s), 0, "copy d[0] to host on s");
    CHECK(di[0] == 0 && host == -1, "nothing ran yet (d[0] %d host %d)", di[0], host);
    EQ(cuStreamQuery(s), 0, "cuStreamQuery runs them");
    CHECK(di[0] == 123 && host == 123, "in order: d[0] %d host %d", di[0], host);

    printf("# events\n");
    CUevent ev = NULL, ev2 = NULL, nt = NULL;
    EQ(cuEventCreate(&ev, CU_EVENT_DEFAULT), 0, "cuEventCreate");
    EQ(cuEventCreate(&ev2, CU_EVENT_DEFAULT), 0, "cuEventCreate");
    EQ(cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING), 0, "cuEventCreate no timing");
    float ms = -1;
    EQ(cuEventElapsedTime(&ms, ev, ev2), CUDA_ERROR_INVALID_HANDLE, "elapsed, never recorded");
    EQ(cuEventRecord(ev, s), 0, "record ev on s");
    EQ(cuMemsetD8Async(e, 1, 1, s), 0, "memset e[0]=1 on s");
    EQ(cuEventRecord_ptsz(ev2, s), 0, "record ev2 on s");
    EQ(cuMemsetD8Async_ptsz(e + 1, 2, 1, s), 0, "memset e[1]=2 on s");
    EQ(cuEventElapsedTime(&ms, ev, ev2), CUDA_ERROR_NOT_READY, "elapsed, not done");
    EQ(cuEventSynchronize(ev2), 0, "cuEventSynchronize(ev2)");
    CHECK(eb[0] == 1 && eb[1] == 0, "ran up to the event and no further (%d %d)", eb[0], eb[1]);
    EQ(cuEventElapsedTime(&ms, ev, ev2), 0, "cuEventElapsedTime");
    CHECK(ms >= 0, "  non-negative");
    EQ(cuEventElapsedTime_v2(&ms, ev, ev2), 0, "cuEventElapsedTime_v2");
    EQ(cuEventRecord(nt, NULL), 0, "record on the legacy stream");
    EQ(cuEventElapsedTime(&ms, ev, nt), CUDA_ERROR_INVALID_HANDLE, "elapsed, timing disabled");
    EQ(cuStreamSynchronize(s), 0, "cuStreamSynchronize");
    EQ(eb[1], 2, "  the rest ran");

    printf("# cross-stream: cuStreamWaitEvent\n");
    EQ(cuMemsetD8Async(e + 2, 3, 1, s), 0, "memset e[2]=3 on s");
    EQ(cuEventRecord(ev, s), 0, "record ev on s");
    EQ(cuMemsetD8Async(e + 3, 4, 1, s), 0, "memset e[3]=4 on s (after ev)");
    EQ(cuStreamWaitEvent(s2, ev, 0), 0, "s2 waits for ev");
    EQ(cuMemsetD8Async(e + 4, 5, 1, s2), 0, "memset e[4]=5 on s2");
    EQ(cuStreamSynchronize(s2), 0, "sync s2");
    CHECK(eb[2] == 3 && eb[3] == 0 && eb[4] == 5, "s ran up to ev for s2 (%d %d %d)", eb[2],
          eb[3], eb[4]);
    EQ(cuEventQuery(ev), 0, "cuEventQuery");
    EQ(cuStreamWaitEvent_ptsz(s2, ev, 0), 0, "wait on a done event");
    EQ(cuStreamWaitEvent(s2, ev, 2), CUDA_ERROR_INVALID_VALUE, "wait, bad flags");
    EQ(cuStreamSynchronize_ptsz(s), 0, "sync s (ptsz)");
    EQ(eb[3], 4, "  the rest ran");

    printf("# the legacy stream waits for blocking streams, not for non-blocking ones\n");
    EQ(cuMemsetD8Async(e + 5, 6, 1, s), 0, "memset e[5]=6 on s");
    EQ(cuMemsetD8Async(e + 6, 7, 1, snb), 0, "memset e[6]=7 on the non-blocking stream");
    EQ(cuMemsetD8Async(e + 7, 8, 1, NULL), 0, "memset e[7]=8 on the legacy stream");
    CHECK(eb[5] == 6 && eb[6] == 0 && eb[7] == 8, "legacy: s ran, non-blocking did not (%d %d %d)",
          eb[5], eb[6], eb[7]);
    EQ(cuMemsetD8Async_ptsz(e + 8, 9, 1, NULL), 0, "memset e[8]=9 on the per-thread stream");
    EQ(eb[8], 9, "  at once");
    EQ(cuMemsetD8Async(e + 9, 10, 1, CU_STREAM_PER_THREAD), 0, "CU_STREAM_PER_THREAD");
    EQ(eb[9], 10, "  at once");
    EQ(eb[6], 0, "non-blocking still pending");
    unsigned char probe = 0;
    EQ(cuMemcpyDtoH_v2(&probe, e + 6, 1), 0, "a synchronous copy runs every stream first");
    EQ(probe, 7, "  saw the non-blocking memset");
    EQ(cuMemsetD8Async(e + 10, 11, 1, snb), 0, "memset e[10]=11 on the non-blocking stream");
    EQ(cuCtxSynchronize(), 0, "cuCtxSynchronize");
    EQ(eb[10], 11, "  ran");
    EQ(cuMemcpyAsync(e + 100, e, 11, s), 0, "cuMemcpyAsync");
    EQ(cuMemcpyAsync_ptsz(e + 200, e, 11, s), 0, "cuMemcpyAsync_ptsz");
    EQ(cuMemcpyHtoDAsync_v2(e + 300, &three, 4, s), 0, "cuMemcpyHtoDAsync_v2");
    EQ(cuMemcpyDtoDAsync_v2(e + 400, e, 11, s), 0, "cuMemcpyDtoDAsync_v2");
    EQ(cuMemsetD32Async(e + 512, 0xabcdef, 4, s), 0, "cuMemsetD32Async");
    EQ(eb[100] + eb[200] + eb[300] + eb[400] + eb[512], 0, "all pending");
    EQ(cuStreamSynchronize(s), 0, "sync");
    CHECK(memcmp((void *)(uintptr_t)(e + 100), (void *)(uintptr_t)e, 11) == 0 &&
              memcmp((void *)(uintptr_t)(e + 400), (void *)(uintptr_t)e, 11) == 0 &&
              eb[200] == 1 && eb[300] == 3 && ((unsigned *)(uintptr_t)(e + 512))[3] == 0xabcdef,
          "  copies and sets done");

    printf("# stream-ordered free: the address comes back only once the stream got there\n");
    CUdeviceptr a1 = 0, a2 = 0, a3 = 0;
    EQ(H("cuMemAllocAsync", cuMemAllocAsync(&a1, 8192, s)), 0, "alloc async a1 on s");
    EQ(H("cuMemFreeAsync", cuMemFreeAsync(a1, s)), 0, "free async a1 on s");
    EQ(H("cuMemFreeAsync", cuMemFreeAsync(a1, s)), CUDA_ERROR_INVALID_VALUE, "free async twice");
    EQ(H("cuMemAllocAsync", cuMemAllocAsync(&a2, 8192, s)), 0, "alloc async a2");
    CHECK(a2 != a1, "  a2 is not a1: a1 is not free yet");
    EQ(cuStreamSynchronize(s), 0, "sync s");
    EQ(H("cuMemAllocAsync_ptsz", cuMemAllocAsync_ptsz(&a3, 8192, s)), 0, "alloc async a3 (ptsz)");
    CHECK(a3 == a1, "  a3 is a1 now");
    EQ(H("cuMemFreeAsync_ptsz", cuMemFreeAsync_ptsz(a3, NULL)), 0, "free a3 (per-thread: now)");
    EQ(H("cuMemFreeAsync", cuMemFreeAsync(a2, snb)), 0, "free a2 on the non-blocking stream");
    EQ(H("cuMemFree_v2", cuMemFree_v2(a2)), CUDA_ERROR_INVALID_VALUE,
       "cuMemFree of a pending async free");
    EQ(H("cuMemAllocAsync", cuMemAllocAsync(&a1, 8192, (CUstream)&s)), CUDA_ERROR_INVALID_HANDLE,
       "alloc async on a garbage stream");
    EQ(H("cuMemAllocAsync", cuMemAllocAsync(&a1, 0, s)), CUDA_ERROR_INVALID_VALUE,
       "alloc async, 0 bytes");

    printf("# kernels\n");
    size_t off = 0, sz = 0;
    unsigned long calls = standin_param_info_calls();
    EQ(cuFuncGetParamInfo(f_fill, 0, &off, &sz), 0, "param 0");
    CHECK(off == 0 && sz == 8, "  offset %zu size %zu", off, sz);
    EQ(cuFuncGetParamInfo(f_fill, 1, &off, &sz), 0, "param 1");
    CHECK(off == 8 && sz == 4, "  offset %zu size %zu", off, sz);
    EQ(cuFuncGetParamInfo(f_fill, 2, &off, &sz), 0, "param 2");
    CHECK(off == 16 && sz == 8, "  offset %zu size %zu", off, sz);
    EQ(cuFuncGetParamInfo(f_fill, 3, &off, &sz), CUDA_ERROR_INVALID_VALUE, "param 3: past the end");
    EQ(cuFuncGetParamInfo(f_none, 0, &off, &sz), CUDA_ERROR_INVALID_VALUE, "no params");
    EQ(cuFuncGetParamInfo((CUfunction)&off, 0, &off, &sz), CUDA_ERROR_INVALID_HANDLE,
       "garbage function");
    EQ(standin_param_info_calls() - calls, 6, "standin_param_info_calls counted 6");
    const char *nm = NULL;
    EQ(cuFuncGetName(&nm, f_fill), 0, "cuFuncGetName");
    CHECK(nm && strcmp(nm, "fill") == 0, "  %s", nm ? nm : "(null)");
    CUfunction found = NULL;
    CUmodule mod = NULL;
    EQ(cuModuleLoadData(&mod, "image"), 0, "cuModuleLoadData");
    EQ(cuModuleGetFunction(&found, mod, "step"), 0, "cuModuleGetFunction");
    CHECK(found == f_step, "  the registered kernel");
    EQ(cuModuleGetFunction(&found, mod, "nope"), CUDA_ERROR_NOT_FOUND, "unknown kernel");
    EQ(cuModuleUnload(mod), 0, "cuModuleUnload");
    int val = 9;
    size_t n = 1024;
    void *fargs[] = {&d, &val, &n};
    unsigned long ran = standin_kernels_run();
    EQ(cuLaunchKernel(f_fill, 0, 1, 1, 1, 1, 1, 0, s, fargs, NULL), CUDA_ERROR_INVALID_VALUE,
       "grid 0");
    EQ(cuLaunchKernel(f_fill, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_ERROR_INVALID_VALUE,
       "no parameters");
    EQ(cuLaunchKernel(f_fill, 1, 1, 1, 1, 1, 1, 0, (CUstream)&n, fargs, NULL),
       CUDA_ERROR_INVALID_HANDLE, "garbage stream");
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 128;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    EQ(cuLaunchKernelEx(&cfg, f_fill, fargs, NULL), 0, "cuLaunchKernelEx fill(d, 9)");
    val = 10;
    CHECK(di[1023] != 9, "  pending");
    EQ(cuStreamSynchronize(s), 0, "sync");
    CHECK(di[0] == 9 && di[1023] == 9, "  filled with 9");
    struct {
        CUdeviceptr d;
        int v;
        int pad;
        size_t n;
    } pbuf = {d, 11, 0, 1024};
    size_t pbsize = sizeof pbuf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &pbuf, CU_LAUNCH_PARAM_BUFFER_SIZE, &pbsize,
                     CU_LAUNCH_PARAM_END};
    EQ(cuLaunchKernel(f_fill, 1, 1, 1, 1, 1, 1, 0, s, NULL, extra), 0, "launch with extra");
    pbuf.v = 99;
    EQ(cuLaunchKernel(f_fill, 1, 1, 1, 1, 1, 1, 0, s, fargs, extra), CUDA_ERROR_INVALID_VALUE,
       "both params and extra");
    EQ(cuStreamSynchronize(s), 0, "sync");
    EQ(di[5], 11, "  filled with 11");
    cfg.hStream = NULL;
    val = 12;
    EQ(cuLaunchKernelEx_ptsz(&cfg, f_fill, fargs, NULL), 0, "cuLaunchKernelEx_ptsz, stream 0");
    EQ(di[5], 12, "  ran at once");
    val = 13;
    EQ(cuLaunchCooperativeKernel(f_fill, 1, 1, 1, 1, 1, 1, 0, s, fargs), 0,
       "cuLaunchCooperativeKernel");
    val = 14;
    EQ(cuLaunchCooperativeKernel_ptsz(f_fill, 1, 1, 1, 1, 1, 1, 0, s, fargs), 0,
       "cuLaunchCooperativeKernel_ptsz");
    EQ(cuStreamSynchronize(s), 0, "sync");
    EQ(di[5], 14, "  in order");
    EQ(cuLaunchKernel(f_none, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), 0,
       "a kernel without parameters");
    EQ(standin_kernels_run() - ran, 6, "standin_kernels_run counted 6");

    EQ(H("cuMemFree_v2", cuMemFree_v2(d)), 0, "free");
    EQ(H("cuMemFree_v2", cuMemFree_v2(e)), 0, "free");
    EQ(cuEventDestroy_v2(ev), 0, "cuEventDestroy_v2");
    EQ(cuEventDestroy_v2(ev), CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy_v2 twice");
    EQ(cuEventDestroy(ev2), 0, "cuEventDestroy");
    EQ(cuEventDestroy_v2(nt), 0, "cuEventDestroy_v2");
    EQ(cuStreamDestroy_v2(s), 0, "cuStreamDestroy_v2");
    EQ(cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy_v2 twice");
    EQ(cuStreamDestroy(s2), 0, "cuStreamDestroy");
    EQ(cuStreamDestroy_v2(snb), 0, "destroy the non-blocking stream (runs its free)");
    size_t freeb = 0, total = 0;
    cuMemGetInfo_v2(&freeb, &total);
    EQ(freeb, total, "all memory back");
}

static void driver_graphs(void) {
    printf("# graph memory nodes\n");
    CUgraph g = NULL;
    EQ(cuGraphCreate(&g, 0), 0, "cuGraphCreate");
    CUDA_MEM_ALLOC_NODE_PARAMS np;
    memset(&np, 0, sizeof np);
    np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.bytesize = 1 << 16;
    CUgraphNode an = NULL, fn = NULL;
    EQ(H("cuGraphAddMemAllocNode", cuGraphAddMemAllocNode(&an, g, NULL, 0, &np)), 0,
       "cuGraphAddMemAllocNode");
    CHECK(np.dptr != 0 && an != NULL, "  dptr set");
    CUdeviceptr first = np.dptr;
    EQ(H("cuGraphAddMemFreeNode", cuGraphAddMemFreeNode(&fn, g, &an, 1, np.dptr + 8)),
       CUDA_ERROR_INVALID_VALUE, "free node of a wrong address");
    EQ(H("cuGraphAddMemFreeNode", cuGraphAddMemFreeNode(&fn, g, &an, 1, np.dptr)), 0,
       "cuGraphAddMemFreeNode");
    EQ(cuDeviceGraphMemTrim(0), 0, "cuDeviceGraphMemTrim");
    EQ(cuGraphDestroy(g), 0, "cuGraphDestroy");
    EQ(cuGraphCreate(&g, 0), 0, "cuGraphCreate");
    EQ(H("cuGraphAddMemAllocNode", cuGraphAddMemAllocNode(&an, g, NULL, 0, &np)), 0,
       "cuGraphAddMemAllocNode");
    CHECK(np.dptr == first, "  the destroyed graph's memory came back");
    EQ(cuGraphDestroy(g), 0, "cuGraphDestroy");
}

/* ================================================================ the runtime */

static void runtime_api(void) {
    printf("# runtime\n");
    int n = 0, dev = -1, v = 0;
    EQ(cudaGetDeviceCount(&n), 0, "cudaGetDeviceCount");
    EQ(n, 1, "  1");
    EQ(cudaSetDevice(3), cudaErrorInvalidDevice, "cudaSetDevice(3)");
    EQ(cudaGetLastError(), cudaErrorInvalidDevice, "  last error");
    EQ(cudaSetDevice(0), 0, "cudaSetDevice(0)");
    EQ(cudaGetDevice(&dev), 0, "cudaGetDevice");
    EQ(dev, 0, "  0");
    EQ(cudaRuntimeGetVersion(&v), 0, "cudaRuntimeGetVersion");
    EQ(v, 13000, "  13000");
    EQ(cudaDriverGetVersion(&v), 0, "cudaDriverGetVersion");
    EQ(v, 13000, "  13000");
    size_t freeb = 0, total = 0;
    EQ(cudaMemGetInfo(&freeb, &total), 0, "cudaMemGetInfo");
    EQ(freeb, total, "  all free");

    void *a = NULL, *b = NULL, *z = (void *)1;
    EQ(H("cudaMalloc", cudaMalloc(&z, 0)), 0, "cudaMalloc 0 bytes");
    CHECK(z == NULL, "  null");
    EQ(H("cudaMalloc", cudaMalloc(&a, 1 << 20)), 0, "cudaMalloc 1 MiB");
    EQ(H("cudaFree", cudaFree(a)), 0, "cudaFree");
    EQ(H("cudaMalloc", cudaMalloc(&b, 1 << 20)), 0, "cudaMalloc 1 MiB again");
    CHECK(a == b, "  the freed address comes straight back");
    EQ(H("cudaFree", cudaFree((char *)b + 1)), cudaErrorInvalidValue, "cudaFree inside");
    EQ(cudaPeekAtLastError(), cudaErrorInvalidValue, "cudaPeekAtLastError");
    EQ(cudaPeekAtLastError(), cudaErrorInvalidValue, "  stays");
    EQ(cudaGetLastError(), cudaErrorInvalidValue, "cudaGetLastError");
    EQ(cudaGetLastError(), cudaSuccess, "  reset");
    EQ(H("cudaFree", cudaFree(b)), 0, "cudaFree");
    EQ(H("cudaFree", cudaFree(NULL)), 0, "cudaFree(NULL)");
    CHECK(strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation") == 0,
          "cudaGetErrorName");
    CHECK(strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument") == 0,
          "cudaGetErrorString");

    cudaStream_t s = NULL, s2 = NULL;
    EQ(cudaStreamCreate(&s), 0, "cudaStreamCreate");
    EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), 0, "cudaStreamCreateWithFlags");
    void *x = NULL, *y = NULL, *w = NULL;
    EQ(H("cudaMallocAsync", cudaMallocAsync(&x, 4096, s)), 0, "cudaMallocAsync");
    EQ(cudaMemsetAsync(x, 0x5a, 4096, s), 0, "cudaMemsetAsync");
    CHECK(((unsigned char *)x)[0] != 0x5a, "  pending");
    unsigned char out[4096];
    memset(out, 0, sizeof out);
    EQ(cudaMemcpyAsync(out, x, 4096, cudaMemcpyDeviceToHost, s), 0, "cudaMemcpyAsync D2H");
    EQ(cudaStreamQuery(s), 0, "cudaStreamQuery");
    CHECK(out[0] == 0x5a && out[4095] == 0x5a, "  done, in order");
    EQ(H("cudaFreeAsync", cudaFreeAsync(x, s)), 0, "cudaFreeAsync");
    EQ(H("cudaMallocAsync", cudaMallocAsync(&y, 4096, s)), 0, "cudaMallocAsync");
    CHECK(y != x, "  not x yet");
    EQ(cudaStreamSynchronize(s), 0, "cudaStreamSynchronize");
    EQ(H("cudaMallocAsync_ptsz", cudaMallocAsync_ptsz(&w, 4096, s)), 0, "cudaMallocAsync_ptsz");
    CHECK(w == x, "  x now");
    EQ(H("cudaFreeAsync_ptsz", cudaFreeAsync_ptsz(w, NULL)), 0, "cudaFreeAsync_ptsz");
    EQ(H("cudaFreeAsync", cudaFreeAsync(y, s2)), 0, "cudaFreeAsync on s2");
    cudaMemPool_t pool = NULL;
    EQ(cudaDeviceGetDefaultMemPool(&pool, 0), 0, "cudaDeviceGetDefaultMemPool");
    uint64_t th = UINT64_MAX;
    EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &th), 0,
       "cudaMemPoolSetAttribute");
    th = 0;
    EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &th), 0,
       "cudaMemPoolGetAttribute");
    CHECK(th == UINT64_MAX, "  UINT64_MAX");
    EQ(H("cudaMallocFromPoolAsync", cudaMallocFromPoolAsync(&x, 100, pool, s)), 0,
       "cudaMallocFromPoolAsync");
    EQ(H("cudaMallocFromPoolAsync_ptsz", cudaMallocFromPoolAsync_ptsz(&y, 100, pool, s)), 0,
       "cudaMallocFromPoolAsync_ptsz");
    EQ(H("cudaFreeAsync", cudaFreeAsync(x, s)), 0, "cudaFreeAsync");
    EQ(H("cudaFreeAsync", cudaFreeAsync(y, s)), 0, "cudaFreeAsync");
    EQ(cudaDeviceSynchronize(), 0, "cudaDeviceSynchronize");
    EQ(cudaMemPoolTrimTo(pool, 0), 0, "cudaMemPoolTrimTo");

    void *m = NULL, *p = NULL;
    size_t pitch = 0;
    EQ(H("cudaMallocManaged", cudaMallocManaged(&m, 4096, cudaMemAttachGlobal)), 0,
       "cudaMallocManaged");
    EQ(H("cudaMallocManaged", cudaMallocManaged(&z, 0, cudaMemAttachGlobal)),
       cudaErrorInvalidValue, "cudaMallocManaged 0 bytes");
    cudaGetLastError();
    EQ(H("cudaFree", cudaFree(m)), 0, "cudaFree");
    EQ(H("cudaMallocPitch", cudaMallocPitch(&p, &pitch, 100, 10)), 0, "cudaMallocPitch");
    EQ(pitch, 512, "  pitch 512");
    EQ(H("cudaFree", cudaFree(p)), 0, "cudaFree");
    struct cudaPitchedPtr pp;
    memset(&pp, 0, sizeof pp);
    struct cudaExtent ext = {600, 4, 3};
    EQ(H("cudaMalloc3D", cudaMalloc3D(&pp, ext)), 0, "cudaMalloc3D");
    CHECK(pp.pitch == 1024 && pp.xsize == 600 && pp.ysize == 4, "  pitch %zu xsize %zu ysize %zu",
          pp.pitch, pp.xsize, pp.ysize);
    size_t range = 0;
    cuMemGetAddressRange_v2(NULL, &range, (CUdeviceptr)(uintptr_t)pp.ptr);
    EQ(range, 1024 * 12, "  pitch * height * depth bytes");
    EQ(H("cudaFree", cudaFree(pp.ptr)), 0, "cudaFree");

    void *h = NULL, *h2 = NULL;
    EQ(H("cudaMallocHost", cudaMallocHost(&h, 4096)), 0, "cudaMallocHost");
    EQ(H("cudaHostAlloc", cudaHostAlloc(&h2, 8192, cudaHostAllocPortable | cudaHostAllocMapped)),
       0, "cudaHostAlloc");
    EQ(H("cudaFreeHost", cudaFreeHost(h)), 0, "cudaFreeHost");
    EQ(H("cudaFreeHost", cudaFreeHost(h)), cudaErrorInvalidValue, "cudaFreeHost twice");
    cudaGetLastError();
    EQ(H("cudaFreeHost", cudaFreeHost(h2)), 0, "cudaFreeHost");
    void *buf = aligned_alloc(4096, 65536);
    EQ(H("cudaHostRegister", cudaHostRegister(buf, 65536, cudaHostRegisterDefault)), 0,
       "cudaHostRegister");
    EQ(H("cudaHostRegister", cudaHostRegister(buf, 65536, cudaHostRegisterDefault)),
       cudaErrorHostMemoryAlreadyRegistered, "cudaHostRegister twice");
    EQ(H("cudaHostUnregister", cudaHostUnregister(buf)), 0, "cudaHostUnregister");
    EQ(H("cudaHostUnregister", cudaHostUnregister(buf)), cudaErrorHostMemoryNotRegistered,
       "cudaHostUnregister twice");
    cudaGetLastError();
    free(buf);

    void *d1 = NULL, *d2 = NULL;
    EQ(H("cudaMalloc", cudaMalloc(&d1, 256)), 0, "cudaMalloc");
    EQ(H("cudaMalloc", cudaMalloc(&d2, 256)), 0, "cudaMalloc");
    unsigned char in[256];
    for (int i = 0; i < 256; i++)
        in[i] = (unsigned char)i;
    EQ(cudaMemcpy(d1, in, 256, cudaMemcpyHostToDevice), 0, "cudaMemcpy H2D");
    EQ(cudaMemcpy(d2, d1, 256, cudaMemcpyDeviceToDevice), 0, "cudaMemcpy D2D");
    memset(out, 0, 256);
    EQ(cudaMemcpy(out, d2, 256, cudaMemcpyDefault), 0, "cudaMemcpy default");
    CHECK(memcmp(in, out, 256) == 0, "  round trip");
    EQ(cudaMemcpy(out, d2, 256, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection,
       "cudaMemcpy bad kind");
    EQ(cudaGetLastError(), cudaErrorInvalidMemcpyDirection, "  last error");
    EQ(cudaMemset(d1, 0x33, 256), 0, "cudaMemset");
    EQ(((unsigned char *)d1)[255], 0x33, "  set");

    printf("# runtime events and launches\n");
    cudaEvent_t e1 = NULL, e2 = NULL;
    EQ(cudaEventCreate(&e1), 0, "cudaEventCreate");
    EQ(cudaEventCreateWithFlags(&e2, cudaEventDefault), 0, "cudaEventCreateWithFlags");
    int val = 21;
    size_t cnt = 64;
    CUdeviceptr dd = (CUdeviceptr)(uintptr_t)d1;
    void *args[] = {&dd, &val, &cnt};
    dim3 grid = {1, 1, 1}, block = {64, 1, 1};
    EQ(cudaEventRecord(e1, s), 0, "cudaEventRecord");
    EQ(cudaLaunchKernel((const void *)f_fill, grid, block, args, 0, s), 0, "cudaLaunchKernel");
    val = 22;
    EQ(cudaEventRecord(e2, s), 0, "cudaEventRecord");
    EQ(cudaStreamWaitEvent(s2, e2, 0), 0, "cudaStreamWaitEvent");
    CHECK(((int *)d1)[0] != 21, "  pending");
    EQ(cudaEventSynchronize(e2), 0, "cudaEventSynchronize");
    EQ(((int *)d1)[63], 21, "  ran with the value at launch");
    EQ(cudaEventQuery(e2), 0, "cudaEventQuery");
    float ms = -1;
    EQ(cudaEventElapsedTime(&ms, e1, e2), 0, "cudaEventElapsedTime");
    EQ(cudaLaunchKernel_ptsz((const void *)f_fill, grid, block, args, 0, NULL), 0,
       "cudaLaunchKernel_ptsz");
    EQ(((int *)d1)[0], 22, "  ran at once");
    dim3 bad = {0, 1, 1};
    EQ(cudaLaunchKernel((const void *)f_fill, bad, block, args, 0, s), cudaErrorInvalidConfiguration,
       "cudaLaunchKernel grid 0");
    EQ(cudaLaunchKernel((const void *)&val, grid, block, args, 0, s),
       cudaErrorInvalidDeviceFunction, "cudaLaunchKernel of garbage");
    cudaGetLastError();
    cudaFunction_t fbs = NULL;
    EQ(cudaGetFuncBySymbol(&fbs, (const void *)f_fill), 0, "cudaGetFuncBySymbol");
    CHECK(fbs == (cudaFunction_t)f_fill, "  the CUfunction");
    EQ(cudaEventDestroy(e1), 0, "cudaEventDestroy");
    EQ(cudaEventDestroy(e2), 0, "cudaEventDestroy");
    EQ(H("cudaFree", cudaFree(d1)), 0, "cudaFree");
    EQ(H("cudaFree", cudaFree(d2)), 0, "cudaFree");

    printf("# cudaGetDriverEntryPoint*\n");
    void *fp = NULL;
    enum cudaDriverEntryPointQueryResult st = 99;
    EQ(cudaGetDriverEntryPoint("cuMemAlloc", &fp, cudaEnableDefault, &st), 0,
       "cudaGetDriverEntryPoint(cuMemAlloc)");
    CHECK(st == 0 && strcmp(sym(fp), "cuMemAlloc_v2") == 0, "  %s", sym(fp));
    EQ(cudaGetDriverEntryPoint("cuMemAllocAsync", &fp, cudaEnablePerThreadDefaultStream, &st), 0,
       "per-thread flag");
    CHECK(strcmp(sym(fp), "cuMemAllocAsync_ptsz") == 0, "  %s", sym(fp));
    EQ(cudaGetDriverEntryPoint_ptsz("cuMemFreeAsync", &fp, cudaEnableDefault, &st), 0,
       "cudaGetDriverEntryPoint_ptsz, default flag");
    CHECK(strcmp(sym(fp), "cuMemFreeAsync_ptsz") == 0, "  %s", sym(fp));
    EQ(cudaGetDriverEntryPoint_ptsz("cuMemFreeAsync", &fp, cudaEnableLegacyStream, &st), 0,
       "cudaGetDriverEntryPoint_ptsz, legacy flag");
    CHECK(strcmp(sym(fp), "cuMemFreeAsync") == 0, "  %s", sym(fp));
    EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", &fp, 12000, cudaEnableDefault, &st), 0,
       "cudaGetDriverEntryPointByVersion(cuMemCreate, 12000)");
    CHECK(strcmp(sym(fp), "cuMemCreate") == 0, "  %s", sym(fp));
    EQ(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fp, 3000, cudaEnableDefault, &st), 0,
       "ByVersion(cuMemAlloc, 3000)");
    CHECK(strcmp(sym(fp), "cuMemAlloc") == 0, "  %s", sym(fp));
    EQ(cudaGetDriverEntryPointByVersion_ptsz("cuLaunchKernel", &fp, 12000, cudaEnableDefault, &st),
       0, "ByVersion_ptsz(cuLaunchKernel)");
    CHECK(strcmp(sym(fp), "cuLaunchKernel_ptsz") == 0, "  %s", sym(fp));
    EQ(cudaGetDriverEntryPoint("cuNoSuchThing", &fp, cudaEnableDefault, &st), 0,
       "unknown symbol: cudaSuccess");
    CHECK(fp == NULL && st == cudaDriverEntryPointSymbolNotFound, "  null, symbol not found");
    EQ(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fp, 11000, cudaEnableDefault, &st), 0,
       "too old a version: cudaSuccess");
    CHECK(fp == NULL && st == cudaDriverEntryPointVersionNotSufficent, "  null, version");
    EQ(cudaGetDriverEntryPoint("cuMemAlloc", &fp, 8, &st), cudaErrorInvalidValue, "bad flags");
    EQ(cudaGetLastError(), cudaErrorInvalidValue, "  last error");
    EQ(cudaGetLastError(), 0, "nothing left behind");
    EQ(cudaStreamDestroy(s), 0, "cudaStreamDestroy");
    EQ(cudaStreamDestroy(s2), 0, "cudaStreamDestroy");
    EQ(cudaMemGetInfo(&freeb, &total), 0, "cudaMemGetInfo");
    EQ(freeb, total, "  all free");
}

/* ================================================================ threads */

static void *thread_body(void *arg) {
    (void)arg;
    CUdeviceptr d = 0;
    void *p = NULL;
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&d, 64)), CUDA_ERROR_INVALID_CONTEXT,
       "new thread: cuMemAlloc_v2 without a context");
    EQ(H("cudaMalloc", cudaMalloc(&p, 64)), 0, "new thread: cudaMalloc makes one current");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&d, 64)), 0, "new thread: now cuMemAlloc_v2 works");
    EQ(H("cuMemFree_v2", cuMemFree_v2(d)), 0, "new thread: free");
    EQ(H("cudaFree", cudaFree(p)), 0, "new thread: free");
    return NULL;
}

static void threads(void) {
    printf("# threads\n");
    pthread_t t;
    pthread_create(&t, NULL, thread_body, NULL);
    pthread_join(t, NULL);
}

/* ================================================================ child processes */

static void child_oom(void) {
    printf("# STANDIN_MEM_BYTES=1M\n");
    CUdeviceptr d = 0, e = 0;
    void *p = NULL;
    EQ(cudaSetDevice(0), 0, "cudaSetDevice");
    size_t freeb = 0, total = 0;
    EQ(cudaMemGetInfo(&freeb, &total), 0, "cudaMemGetInfo");
    EQ(total, 1 << 20, "  1 MiB");
    EQ(H("cudaMalloc", cudaMalloc(&p, 2 << 20)), cudaErrorMemoryAllocation, "cudaMalloc 2 MiB");
    EQ(cudaGetLastError(), cudaErrorMemoryAllocation, "  last error");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&d, 768 << 10)), 0, "cuMemAlloc_v2 768 KiB");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&e, 512 << 10)), CUDA_ERROR_OUT_OF_MEMORY,
       "cuMemAlloc_v2 512 KiB more");
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h = 0;
    EQ(H("cuMemCreate", cuMemCreate(&h, 512 << 10, &prop, 0)), CUDA_ERROR_OUT_OF_MEMORY,
       "cuMemCreate past the budget");
    EQ(H("cuMemCreate", cuMemCreate(&h, 256 << 10, &prop, 0)), 0, "cuMemCreate within it");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&e, 256)), CUDA_ERROR_OUT_OF_MEMORY,
       "cuMemAlloc_v2: the budget is shared with cuMemCreate");
    EQ(H("cuMemRelease", cuMemRelease(h)), 0, "cuMemRelease");
    EQ(H("cuMemAlloc_v2", cuMemAlloc_v2(&e, 256 << 10)), 0, "cuMemAlloc_v2 256 KiB");
    EQ(H("cuMemFree_v2", cuMemFree_v2(d)), 0, "free");
    EQ(H("cuMemFree_v2", cuMemFree_v2(e)), 0, "free");
}

static void child_sync(void) {
    printf("# STANDIN_SYNC=1\n");
    cudaStream_t s = NULL;
    void *p = NULL;
    EQ(cudaStreamCreate(&s), 0, "cudaStreamCreate");
    EQ(H("cudaMalloc", cudaMalloc(&p, 64)), 0, "cudaMalloc");
    EQ(cudaMemsetAsync(p, 0x77, 64, s), 0, "cudaMemsetAsync");
    EQ(((unsigned char *)p)[63], 0x77, "  ran at once");
    void *q = NULL;
    EQ(H("cudaFreeAsync", cudaFreeAsync(p, s)), 0, "cudaFreeAsync");
    EQ(H("cudaMallocAsync", cudaMallocAsync(&q, 64, s)), 0, "cudaMallocAsync");
    CHECK(p == q, "  freed at once, so the address came back");
    EQ(H("cudaFree", cudaFree(q)), 0, "cudaFree");
    EQ(cudaStreamDestroy(s), 0, "cudaStreamDestroy");
}

static void child_nodev(void) {
    printf("# STANDIN_DEVICES=0\n");
    int n = 7;
    EQ(cuInit(0), CUDA_ERROR_NO_DEVICE, "cuInit");
    EQ(cudaGetDeviceCount(&n), cudaErrorNoDevice, "cudaGetDeviceCount");
    EQ(n, 0, "  0");
    void *p = NULL;
    EQ(H("cudaMalloc", cudaMalloc(&p, 64)), cudaErrorNoDevice, "cudaMalloc");
}

static void child_devices(void) {
    printf("# STANDIN_DEVICES=2\n");
    int n = 0, d = -1;
    EQ(cudaGetDeviceCount(&n), 0, "cudaGetDeviceCount");
    EQ(n, 2, "  2");
    EQ(cudaSetDevice(1), 0, "cudaSetDevice(1)");
    EQ(cudaGetDevice(&d), 0, "cudaGetDevice");
    EQ(d, 1, "  1");
    CUmemoryPool p0 = NULL, p1 = NULL;
    EQ(cuDeviceGetDefaultMemPool(&p0, 0), 0, "default pool 0");
    EQ(cuDeviceGetDefaultMemPool(&p1, 1), 0, "default pool 1");
    CHECK(p0 != p1, "  one per device");
}

static int run_child(const char *self, const char *mode, const char *env) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        putenv((char *)env);
        execl(self, self, mode, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    if (rc) {
        printf("not ok - child %s exited %d\n", mode, rc);
    }
    return rc;
}

static void print_hits(void) {
    printf("# hooked calls made (compare with the trace summary)\n");
    const char *names[64];
    for (int i = 0; i < nhits; i++)
        names[i] = hits[i].name;
    qsort(names, nhits, sizeof names[0], cmp_hits);
    int total = 0;
    for (int i = 0; i < nhits; i++)
        for (int j = 0; j < nhits; j++)
            if (hits[j].name == names[i]) {
                printf("hooked %-32s %d\n", names[i], hits[j].n);
                total += hits[j].n;
            }
    printf("hooked total %d\n", total);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1) {
        if (strcmp(argv[1], "oom") == 0)
            child_oom();
        else if (strcmp(argv[1], "sync") == 0)
            child_sync();
        else if (strcmp(argv[1], "nodev") == 0)
            child_nodev();
        else if (strcmp(argv[1], "devices") == 0)
            child_devices();
        print_hits();
        return failures;
    }
    size_t fill_sizes[] = {8, 4, 8};
    size_t step_sizes[] = {8, 4};
    f_fill = standin_register_kernel("fill", k_fill, 3, NULL, fill_sizes);
    f_step = standin_register_kernel("step", k_step, 2, NULL, step_sizes);
    f_none = standin_register_kernel("none", k_none, 0, NULL, NULL);
    CHECK(f_fill && f_step && f_none, "standin_register_kernel before cuInit");

    static_path();
    driver_memory();
    driver_vmm();
    driver_streams();
    driver_graphs();
    runtime_api();
    threads();
    print_hits();
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = 0;
    failures += run_child(self, "oom", "STANDIN_MEM_BYTES=1M") != 0;
    failures += run_child(self, "sync", "STANDIN_SYNC=1") != 0;
    failures += run_child(self, "nodev", "STANDIN_DEVICES=0") != 0;
    failures += run_child(self, "devices", "STANDIN_DEVICES=2") != 0;
    printf("%s: %d failed\n", failures ? "FAILED" : "PASSED", failures);
    return failures;
}

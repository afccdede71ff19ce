// link: cudart
/* Calls that fail. Every one must fail the same way with and without the preload, and every
 * one must still be an event, with the code the caller got. */
#include <pthread.h>

#include "common.h"

typedef CUresult (*PFN_init)(unsigned);
typedef CUresult (*PFN_retain)(CUcontext *, CUdevice);
typedef CUresult (*PFN_setCurrent)(CUcontext);
typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_free)(CUdeviceptr);
typedef CUresult (*PFN_allocAsync)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*PFN_freeAsync)(CUdeviceptr, CUstream);
typedef CUresult (*PFN_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*PFN_hostAlloc)(void **, size_t, unsigned);
typedef CUresult (*PFN_freeHost)(void *);

static PFN_alloc memAlloc;
static PFN_free memFree;

#define NEVER ((CUdeviceptr)0x7e5700001000ull)

static void *no_context_thread(void *arg) {
    (void)arg;
    ev_tag = NULL;
    CUdeviceptr d = 0;
    int rc = memAlloc(&d, 256);
    ev("cuMemAlloc_v2", rc, "size=256 ptr=0 device=-1");
    rc = memFree(NEVER);
    ev("cuMemFree_v2", rc, "ptr=%llu device=-1", (unsigned long long)NEVER);
    /* the runtime makes the primary context current on any thread that calls it */
    void *p = NULL;
    rc = cudaMalloc(&p, 256);
    ev("cudaMalloc", rc, "size=256 ptr=%s", AP(rc, U64(p), "tp"));
    rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=%s", L(U64(p), "tp"));
    return NULL;
}

static void lasterr(void) {
    int e = cudaGetLastError();
    int again = cudaGetLastError();
    say("  cudaGetLastError %d then %d", e, again);
}

int main(void) {
    setup();
    int rc;
    /* ---- the driver, before anything initialised it */
    drv_open();
    DRV(init, PFN_init, "cuInit", 12000, 0);
    DRV(retain, PFN_retain, "cuDevicePrimaryCtxRetain", 12000, 0);
    DRV(setCurrent, PFN_setCurrent, "cuCtxSetCurrent", 12000, 0);
    memAlloc = (PFN_alloc)drv_sym("cuMemAlloc", 12000, 0);
    memFree = (PFN_free)drv_sym("cuMemFree", 12000, 0);
    DRV(allocAsync, PFN_allocAsync, "cuMemAllocAsync", 12000, 0);
    DRV(freeAsync, PFN_freeAsync, "cuMemFreeAsync", 12000, 0);
    DRV(pitchAlloc, PFN_pitch, "cuMemAllocPitch", 12000, 0);
    DRV(hostAlloc, PFN_hostAlloc, "cuMemHostAlloc", 12000, 0);
    DRV(freeHost, PFN_freeHost, "cuMemFreeHost", 12000, 0);
    DRV(create, PFN_create, "cuMemCreate", 12000, 0);
    DRV(memRelease, PFN_memRelease, "cuMemRelease", 12000, 0);
    DRV(map, PFN_map, "cuMemMap", 12000, 0);
    DRV(unmap, PFN_unmap, "cuMemUnmap", 12000, 0);
    DRV(addressFree, PFN_addressFree, "cuMemAddressFree", 12000, 0);
    DRV(reserve, PFN_reserve, "cuMemAddressReserve", 12000, 0);
    if (!memAlloc || !memFree || !allocAsync || !freeAsync || !pitchAlloc || !hostAlloc ||
        !freeHost || !create || !memRelease || !map || !unmap || !addressFree || !reserve)
        return 1;

    CUdeviceptr d = 0;
    rc = memAlloc(&d, 1024);
    ev("cuMemAlloc_v2", rc, "size=1024 ptr=0 device=-1");
    rc = memFree(NEVER);
    ev("cuMemFree_v2", rc, "ptr=%llu", (unsigned long long)NEVER);
    rc = init(0);
    say("cuInit %d", rc);

    /* ---- initialised, but no context current on this thread yet */
    rc = memAlloc(&d, 1024);
    ev("cuMemAlloc_v2", rc, "size=1024 ptr=0 device=-1");
    CUcontext ctx = NULL;
    rc = retain(&ctx, 0);
    say("cuDevicePrimaryCtxRetain %d", rc);
    rc = setCurrent(ctx);
    say("cuCtxSetCurrent %d", rc);

    /* ---- bad arguments */
    rc = memAlloc(NULL, 16);
    ev("cuMemAlloc_v2", rc, "size=16 ptr=0");
    d = 0;
    rc = memAlloc(&d, 0);
    ev("cuMemAlloc_v2", rc, "size=0 ptr=%s", AP(rc, d, "zero"));
    d = 0;
    rc = memAlloc(&d, SIZE_MAX);
    ev("cuMemAlloc_v2", rc, "size=%zu ptr=0", SIZE_MAX);
    rc = memAlloc(&d, SIZE_MAX - 4095);
    ev("cuMemAlloc_v2", rc, "size=%zu ptr=0", SIZE_MAX - 4095);
    rc = memAlloc(&d, (size_t)1 << 62);
    ev("cuMemAlloc_v2", rc, "size=%zu ptr=0", (size_t)1 << 62);
    rc = memFree(NEVER);
    ev("cuMemFree_v2", rc, "ptr=%llu", (unsigned long long)NEVER);
    rc = memFree(0);
    ev("cuMemFree_v2", rc, "ptr=0");
    d = 0;
    rc = memAlloc(&d, 4096);
    ev("cuMemAlloc_v2", rc, "size=4096 ptr=%s", AP(rc, d, "dd"));
    rc = memFree(d);
    ev("cuMemFree_v2", rc, "ptr=@dd");
    rc = memFree(d);
    ev("cuMemFree_v2", rc, "ptr=@dd");
    rc = memFree(d + 16);
    ev("cuMemFree_v2", rc, "ptr=@dd+16");
    rc = allocAsync(NULL, 16, NULL);
    ev("cuMemAllocAsync", rc, "size=16 stream=0 ptr=0");
    rc = allocAsync(&d, SIZE_MAX, NULL);
    ev("cuMemAllocAsync", rc, "size=%zu stream=0 ptr=0", SIZE_MAX);
    rc = freeAsync(NEVER, NULL);
    ev("cuMemFreeAsync", rc, "ptr=%llu stream=0", (unsigned long long)NEVER);
    size_t pitch = 12345;
    rc = pitchAlloc(&d, &pitch, SIZE_MAX / 2, 4, 4);
    ev("cuMemAllocPitch_v2", rc, "ptr=0 flags=4");
    say("  pitch after failure %zu", pitch);
    rc = pitchAlloc(&d, NULL, 64, 4, 4);
    ev("cuMemAllocPitch_v2", rc, "ptr=0 flags=4");
    void *hp = NULL;
    rc = hostAlloc(NULL, 64, 0);
    ev("cuMemHostAlloc", rc, "size=64 ptr=0");
    rc = hostAlloc(&hp, SIZE_MAX, 0);
    ev("cuMemHostAlloc", rc, "size=%zu ptr=0", SIZE_MAX);
    rc = freeHost((void *)(uintptr_t)NEVER);
    ev("cuMemFreeHost", rc, "ptr=%llu", (unsigned long long)NEVER);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    rc = create(NULL, 2 << 20, &prop, 0);
    ev("cuMemCreate", rc, "size=%d handle=0", 2 << 20);
    CUmemGenericAllocationHandle hv = 0;
    rc = create(&hv, 12345, &prop, 0); /* not a multiple of the granularity */
    ev("cuMemCreate", rc, "size=12345 handle=%s", AP(rc, hv, "odd"));
    if (rc == 0) {
        rc = memRelease(hv);
        ev("cuMemRelease", rc, "handle=@odd");
    }
    rc = memRelease(0xdead);
    ev("cuMemRelease", rc, "handle=%d", 0xdead);
    rc = map(NEVER, 2 << 20, 0, 0xdead, 0);
    ev("cuMemMap", rc, "ptr=%llu handle=%d", (unsigned long long)NEVER, 0xdead);
    rc = unmap(NEVER, 2 << 20);
    ev("cuMemUnmap", rc, "ptr=%llu", (unsigned long long)NEVER);
    rc = addressFree(NEVER, 2 << 20);
    ev("cuMemAddressFree", rc, "ptr=%llu", (unsigned long long)NEVER);
    CUdeviceptr va = 0;
    rc = reserve(&va, 0, 0, 0, 0);
    ev("cuMemAddressReserve", rc, "size=0 ptr=%s", AP(rc, va, "va0"));

    pthread_t t;
    pthread_create(&t, NULL, no_context_thread, NULL);
    pthread_join(t, NULL);
    /* What was asked of the driver with no context current (each a line in a real driver's
     * CUDA_LOG_FILE): on stderr, since the program itself asks nothing of the kind. */
    unsigned long (*ctx_errors)(void) =
        (unsigned long (*)(void))dlsym(dlopen("libcuda.so.1", RTLD_NOW), "standin_ctx_device_errors");
    fprintf(stderr, "standin_ctx_device_errors %lu\n", ctx_errors ? ctx_errors() : 9999ul);

    /* ---- the runtime */
    void *p = NULL;
    rc = cudaMalloc(NULL, 16);
    ev("cudaMalloc", rc, "size=16 ptr=0");
    lasterr();
    p = NULL;
    rc = cudaMalloc(&p, 0);
    ev("cudaMalloc", rc, "size=0 ptr=%s", AP(rc, U64(p), "rz"));
    say("  cudaMalloc(0) ptr==0 %d", p == NULL);
    lasterr();
    rc = cudaMalloc(&p, SIZE_MAX);
    ev("cudaMalloc", rc, "size=%zu ptr=0", SIZE_MAX);
    lasterr();
    rc = cudaMalloc(&p, SIZE_MAX - 4095);
    ev("cudaMalloc", rc, "size=%zu ptr=0", SIZE_MAX - 4095);
    lasterr();
    rc = cudaFree((void *)(uintptr_t)NEVER);
    ev("cudaFree", rc, "ptr=%llu", (unsigned long long)NEVER);
    lasterr();
    p = NULL;
    rc = cudaMalloc(&p, 100);
    ev("cudaMalloc", rc, "size=100 ptr=%s", AP(rc, U64(p), "r1"));
    rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@r1");
    rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@r1");
    lasterr();
    rc = cudaFree(NULL);
    ev("cudaFree", rc, "ptr=0");

    cudaStream_t s1 = NULL, s2 = NULL;
    int c1 = cudaStreamCreate(&s1);
    int c2 = cudaStreamCreate(&s2);
    say("streams %d %d", c1, c2);
    p = NULL;
    rc = cudaMallocAsync(&p, 64, s1);
    ev("cudaMallocAsync", rc, "size=64 stream=%s ptr=%s", L(U64(s1), "s1"), AP(rc, U64(p), "ra"));
    rc = cudaFreeAsync(p, s2); /* freed on another stream than the one it was made on */
    ev("cudaFreeAsync", rc, "ptr=@ra stream=%s", L(U64(s2), "s2"));
    c1 = cudaStreamSynchronize(s1);
    c2 = cudaStreamSynchronize(s2);
    say("  sync %d %d", c1, c2);
    rc = cudaFreeAsync(p, s1); /* and again */
    ev("cudaFreeAsync", rc, "ptr=@ra stream=%s", L(U64(s1), "s1"));
    say("  sync %d", cudaStreamSynchronize(s1));
    lasterr();
    rc = cudaFreeAsync((void *)(uintptr_t)NEVER, s1);
    ev("cudaFreeAsync", rc, "ptr=%llu stream=%s", (unsigned long long)NEVER, L(U64(s1), "s1"));
    say("  sync %d", cudaStreamSynchronize(s1));
    lasterr();
    rc = cudaMallocAsync(NULL, 64, s1);
    ev("cudaMallocAsync", rc, "size=64 stream=%s ptr=0", L(U64(s1), "s1"));
    lasterr();

    rc = cudaMallocHost(NULL, 16);
    ev("cudaMallocHost", rc, "size=16 ptr=0");
    lasterr();
    rc = cudaMallocHost(&p, SIZE_MAX);
    ev("cudaMallocHost", rc, "size=%zu ptr=0", SIZE_MAX);
    lasterr();
    rc = cudaFreeHost((void *)(uintptr_t)NEVER);
    ev("cudaFreeHost", rc, "ptr=%llu", (unsigned long long)NEVER);
    lasterr();
    rc = cudaHostRegister(NULL, 4096, 0);
    ev("cudaHostRegister", rc, "ptr=0 size=4096 flags=0");
    lasterr();
    static char notreg[4096];
    rc = cudaHostUnregister(notreg);
    ev("cudaHostUnregister", rc, "ptr=%s", L(U64(notreg), "notreg"));
    lasterr();

    size_t rp = 777;
    rc = cudaMallocPitch(&p, &rp, SIZE_MAX, 2);
    ev("cudaMallocPitch", rc, "ptr=0");
    lasterr();
    struct cudaPitchedPtr pp;
    memset(&pp, 0, sizeof pp);
    struct cudaExtent huge = {SIZE_MAX / 4, 1 << 20, 1 << 20};
    rc = cudaMalloc3D(&pp, huge);
    ev("cudaMalloc3D", rc, "ptr=0");
    lasterr();
    rc = cudaMalloc3D(NULL, (struct cudaExtent){16, 16, 16});
    ev("cudaMalloc3D", rc, "ptr=0");
    lasterr();
    rc = cudaMallocManaged(&p, 64, 0); /* flags must be global or host */
    ev("cudaMallocManaged", rc, "size=64 flags=0 ptr=%s", AP(rc, U64(p), "mz"));
    if (rc == 0) {
        rc = cudaFree(p);
        ev("cudaFree", rc, "ptr=@mz");
    }
    lasterr();
    rc = cudaMallocManaged(&p, SIZE_MAX, cudaMemAttachGlobal);
    ev("cudaMallocManaged", rc, "size=%zu flags=1 ptr=0", SIZE_MAX);
    lasterr();
    say("done");
    return 0;
}

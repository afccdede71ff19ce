// link: none
/* A static runtime, as nvcc programs, cuBLAS and NCCL carry one: no libcudart, the driver
 * reached only through dlopen + dlsym("cuGetProcAddress_v2") + the resolver itself. */
#include "common.h"

typedef CUresult (*PFN_init)(unsigned);
typedef CUresult (*PFN_deviceGet)(CUdevice *, int);
typedef CUresult (*PFN_retain)(CUcontext *, CUdevice);
typedef CUresult (*PFN_release)(CUdevice);
typedef CUresult (*PFN_setCurrent)(CUcontext);
typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_alloc_v1)(unsigned int *, unsigned int);
typedef CUresult (*PFN_free)(CUdeviceptr);
typedef CUresult (*PFN_allocAsync)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*PFN_freeAsync)(CUdeviceptr, CUstream);
typedef CUresult (*PFN_fromPool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*PFN_defaultPool)(CUmemoryPool *, CUdevice);
typedef CUresult (*PFN_managed)(CUdeviceptr *, size_t, unsigned);
typedef CUresult (*PFN_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*PFN_allocHost)(void **, size_t);
typedef CUresult (*PFN_hostAlloc)(void **, size_t, unsigned);
typedef CUresult (*PFN_freeHost)(void *);
typedef CUresult (*PFN_hostRegister)(void *, size_t, unsigned);
typedef CUresult (*PFN_hostUnregister)(void *);
typedef CUresult (*PFN_streamCreate)(CUstream *, unsigned);
typedef CUresult (*PFN_streamSync)(CUstream);
typedef CUresult (*PFN_streamDestroy)(CUstream);
typedef CUresult (*PFN_memsetD8)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*PFN_dtoh)(void *, CUdeviceptr, size_t);
typedef CUresult (*PFN_graphCreate)(CUgraph *, unsigned);
typedef CUresult (*PFN_graphAlloc)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                   CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult (*PFN_graphFree)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                  CUdeviceptr);
typedef CUresult (*PFN_graphDestroy)(CUgraph);

int main(void) {
    setup();
    drv_open();
    int rc;

    DRV(init, PFN_init, "cuInit", 12000, 0);
    DRV(deviceGet, PFN_deviceGet, "cuDeviceGet", 12000, 0);
    DRV(retain, PFN_retain, "cuDevicePrimaryCtxRetain", 12000, 0);
    DRV(release, PFN_release, "cuDevicePrimaryCtxRelease", 12000, 0);
    DRV(setCurrent, PFN_setCurrent, "cuCtxSetCurrent", 12000, 0);
    rc = init(0);
    say("cuInit %d", rc);
    CUdevice dev = -1;
    rc = deviceGet(&dev, 0);
    say("cuDeviceGet %d dev=%d", rc, dev);
    CUcontext ctx = NULL;
    rc = retain(&ctx, dev);
    say("cuDevicePrimaryCtxRetain %d ctx!=0 %d", rc, ctx != NULL);
    rc = setCurrent(ctx);
    say("cuCtxSetCurrent %d", rc);

    /* cuMemAlloc at two versions: two different ABIs, two different exports */
    DRV(memAlloc, PFN_alloc, "cuMemAlloc", 12000, 0);
    DRV(memAllocV1, PFN_alloc_v1, "cuMemAlloc", 3000, 0);
    DRV(memFree, PFN_free, "cuMemFree", 12000, 0);
    say("v1!=v2 %d", (void *)memAlloc != (void *)memAllocV1);
    CUdeviceptr d = 0;
    rc = memAlloc(&d, 1000);
    ev("cuMemAlloc_v2", rc, "size=1000 ptr=%s", AP(rc, d, "d"));
    /* The v1 ABI takes and writes 32-bit values: it must reach the driver untouched (a hook
     * with the v2 signature would write 8 bytes into this 4-byte slot). Not recorded. */
    struct {
        unsigned int d32;
        unsigned int canary;
    } v1 = {0, 0xC0FFEEu};
    rc = memAllocV1(&v1.d32, 1000);
    say("call cuMemAlloc(v1) %d canary_intact %d", rc, v1.canary == 0xC0FFEEu);
    if (rc == 0 && v1.d32 != 0) {
        rc = memFree((CUdeviceptr)v1.d32);
        ev("cuMemFree_v2", rc, "ptr=%s", L(v1.d32, "v1"));
    }
    rc = memFree(d);
    ev("cuMemFree_v2", rc, "ptr=@d");

    /* stream-ordered, with and without the per-thread default stream flag */
    DRV(streamCreate, PFN_streamCreate, "cuStreamCreate", 12000, 0);
    DRV(streamSync, PFN_streamSync, "cuStreamSynchronize", 12000, 0);
    DRV(streamDestroy, PFN_streamDestroy, "cuStreamDestroy", 12000, 0);
    DRV(allocAsync, PFN_allocAsync, "cuMemAllocAsync", 12000, 0);
    DRV(allocAsyncPt, PFN_allocAsync, "cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    DRV(freeAsync, PFN_freeAsync, "cuMemFreeAsync", 12000, 0);
    DRV(freeAsyncPt, PFN_freeAsync, "cuMemFreeAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    say("ptsz!=plain %d", (void *)allocAsync != (void *)allocAsyncPt);
    CUstream s = NULL;
    rc = streamCreate(&s, CU_STREAM_NON_BLOCKING);
    say("cuStreamCreate %d", rc);
    CUdeviceptr a1 = 0, a2 = 0, a3 = 0;
    rc = allocAsync(&a1, 256, s);
    ev("cuMemAllocAsync", rc, "size=256 stream=%s ptr=%s", L(U64(s), "s"), AP(rc, a1, "a1"));
    rc = allocAsyncPt(&a2, 512, s);
    ev("cuMemAllocAsync_ptsz", rc, "size=512 stream=%s ptr=%s", L(U64(s), "s"), AP(rc, a2, "a2"));
    rc = allocAsyncPt(&a3, 768, NULL);
    ev("cuMemAllocAsync_ptsz", rc, "size=768 stream=0 ptr=%s", AP(rc, a3, "a3"));
    rc = freeAsync(a1, s);
    ev("cuMemFreeAsync", rc, "ptr=@a1 stream=%s", L(U64(s), "s"));
    rc = freeAsyncPt(a2, s);
    ev("cuMemFreeAsync_ptsz", rc, "ptr=@a2 stream=%s", L(U64(s), "s"));
    rc = freeAsyncPt(a3, NULL);
    ev("cuMemFreeAsync_ptsz", rc, "ptr=@a3 stream=0");
    say("cuStreamSynchronize %d", streamSync(s));

    /* from a pool */
    DRV(defaultPool, PFN_defaultPool, "cuDeviceGetDefaultMemPool", 12000, 0);
    DRV(fromPool, PFN_fromPool, "cuMemAllocFromPoolAsync", 12000, 0);
    DRV(fromPoolPt, PFN_fromPool, "cuMemAllocFromPoolAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    CUmemoryPool pool = NULL;
    rc = defaultPool(&pool, dev);
    say("cuDeviceGetDefaultMemPool %d pool!=0 %d", rc, pool != NULL);
    CUdeviceptr f1 = 0, f2 = 0;
    rc = fromPool(&f1, 4096, pool, s);
    ev("cuMemAllocFromPoolAsync", rc, "size=4096 handle=%s stream=%s ptr=%s", L(U64(pool), "pool"),
       L(U64(s), "s"), AP(rc, f1, "f1"));
    rc = fromPoolPt(&f2, 128, pool, NULL);
    ev("cuMemAllocFromPoolAsync_ptsz", rc, "size=128 handle=%s stream=0 ptr=%s",
       L(U64(pool), "pool"), AP(rc, f2, "f2"));
    rc = freeAsync(f1, s);
    ev("cuMemFreeAsync", rc, "ptr=@f1 stream=%s", L(U64(s), "s"));
    rc = freeAsyncPt(f2, NULL);
    ev("cuMemFreeAsync_ptsz", rc, "ptr=@f2 stream=0");
    say("cuStreamSynchronize %d", streamSync(s));

    /* managed, pitched */
    DRV(managed, PFN_managed, "cuMemAllocManaged", 12000, 0);
    DRV(pitchAlloc, PFN_pitch, "cuMemAllocPitch", 12000, 0);
    CUdeviceptr m = 0, p = 0;
    rc = managed(&m, 8192, CU_MEM_ATTACH_GLOBAL);
    ev("cuMemAllocManaged", rc, "size=8192 flags=1 ptr=%s", AP(rc, m, "m"));
    rc = memFree(m);
    ev("cuMemFree_v2", rc, "ptr=@m");
    size_t pitch = 0;
    rc = pitchAlloc(&p, &pitch, 100, 10, 4);
    ev("cuMemAllocPitch_v2", rc, "size=%zu pitch=%zu flags=4 ptr=%s", pitch * 10, pitch,
       AP(rc, p, "p"));
    say("pitch %zu", pitch);
    rc = memFree(p);
    ev("cuMemFree_v2", rc, "ptr=@p");

    /* host memory */
    DRV(allocHost, PFN_allocHost, "cuMemAllocHost", 12000, 0);
    DRV(hostAlloc, PFN_hostAlloc, "cuMemHostAlloc", 12000, 0);
    DRV(freeHost, PFN_freeHost, "cuMemFreeHost", 12000, 0);
    DRV(hostRegister, PFN_hostRegister, "cuMemHostRegister", 12000, 0);
    DRV(hostUnregister, PFN_hostUnregister, "cuMemHostUnregister", 12000, 0);
    void *h1 = NULL, *h2 = NULL;
    rc = allocHost(&h1, 4096);
    ev("cuMemAllocHost_v2", rc, "size=4096 ptr=%s", AP(rc, U64(h1), "h1"));
    rc = freeHost(h1);
    ev("cuMemFreeHost", rc, "ptr=@h1");
    rc = hostAlloc(&h2, 8192, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    ev("cuMemHostAlloc", rc, "size=8192 flags=3 ptr=%s", AP(rc, U64(h2), "h2"));
    rc = freeHost(h2);
    ev("cuMemFreeHost", rc, "ptr=@h2");
    void *reg = aligned_alloc(4096, 16384);
    rc = hostRegister(reg, 16384, CU_MEMHOSTREGISTER_PORTABLE);
    ev("cuMemHostRegister_v2", rc, "ptr=%s size=16384 flags=1", L(U64(reg), "reg"));
    rc = hostUnregister(reg);
    ev("cuMemHostUnregister", rc, "ptr=@reg");
    free(reg);

    /* virtual memory management, as NCCL's cuMem path does it */
    DRV(granularity, PFN_granularity, "cuMemGetAllocationGranularity", 12000, 0);
    DRV(reserve, PFN_reserve, "cuMemAddressReserve", 12000, 0);
    DRV(addressFree, PFN_addressFree, "cuMemAddressFree", 12000, 0);
    DRV(create, PFN_create, "cuMemCreate", 12000, 0);
    DRV(memRelease, PFN_memRelease, "cuMemRelease", 12000, 0);
    DRV(map, PFN_map, "cuMemMap", 12000, 0);
    DRV(unmap, PFN_unmap, "cuMemUnmap", 12000, 0);
    DRV(setAccess, PFN_setAccess, "cuMemSetAccess", 12000, 0);
    DRV(memsetD8, PFN_memsetD8, "cuMemsetD8", 12000, 0);
    DRV(dtoh, PFN_dtoh, "cuMemcpyDtoH", 12000, 0);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    rc = granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    say("cuMemGetAllocationGranularity %d gran=%zu", rc, gran);
    if (gran == 0)
        gran = 2 << 20;
    CUmemGenericAllocationHandle hv = 0;
    rc = create(&hv, 2 * gran, &prop, 0);
    ev("cuMemCreate", rc, "size=%zu handle=%s device=%d", 2 * gran, AP(rc, hv, "hv"), dev);
    CUdeviceptr va = 0;
    rc = reserve(&va, 4 * gran, gran, 0, 0);
    ev("cuMemAddressReserve", rc, "size=%zu offset=%zu handle=0 flags=0 ptr=%s", 4 * gran, gran,
       AP(rc, va, "va"));
    rc = map(va + gran, 2 * gran, 0, hv, 0);
    ev("cuMemMap", rc, "ptr=@va+%zu size=%zu offset=0 handle=@hv flags=0", gran, 2 * gran);
    CUmemAccessDesc acc;
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = setAccess(va + gran, 2 * gran, &acc, 1);
    ev("cuMemSetAccess", rc, "ptr=@va+%zu size=%zu handle=%d flags=3 offset=1", gran, 2 * gran,
       1 << dev);
    rc = memsetD8(va + gran, 0x3c, 2 * gran);
    unsigned char probe[2] = {0, 0};
    int rc2 = dtoh(&probe[0], va + gran, 1);
    int rc3 = dtoh(&probe[1], va + 3 * gran - 1, 1);
    say("vmm memset %d read %d %d bytes %#x %#x", rc, rc2, rc3, probe[0], probe[1]);
    rc = unmap(va + gran, 2 * gran);
    ev("cuMemUnmap", rc, "ptr=@va+%zu size=%zu", gran, 2 * gran);
    rc = memRelease(hv);
    ev("cuMemRelease", rc, "handle=@hv");
    rc = addressFree(va, 4 * gran);
    ev("cuMemAddressFree", rc, "ptr=@va size=%zu", 4 * gran);

    /* graph memory nodes */
    DRV(graphCreate, PFN_graphCreate, "cuGraphCreate", 12000, 0);
    DRV(graphAlloc, PFN_graphAlloc, "cuGraphAddMemAllocNode", 12000, 0);
    DRV(graphFree, PFN_graphFree, "cuGraphAddMemFreeNode", 12000, 0);
    DRV(graphDestroy, PFN_graphDestroy, "cuGraphDestroy", 12000, 0);
    CUgraph g = NULL;
    rc = graphCreate(&g, 0);
    say("cuGraphCreate %d", rc);
    CUDA_MEM_ALLOC_NODE_PARAMS np;
    memset(&np, 0, sizeof np);
    np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.poolProps.location.id = dev;
    np.bytesize = 1 << 16;
    CUgraphNode an = NULL, fn = NULL;
    rc = graphAlloc(&an, g, NULL, 0, &np);
    ev("cuGraphAddMemAllocNode", rc, "size=65536 handle=%s ptr=%s", L(U64(g), "g"),
       AP(rc, np.dptr, "gd"));
    say("graph node!=0 %d", an != NULL);
    rc = graphFree(&fn, g, &an, 1, np.dptr);
    ev("cuGraphAddMemFreeNode", rc, "handle=%s ptr=%s", L(U64(g), "g"), L(np.dptr, "gd"));
    say("cuGraphDestroy %d", graphDestroy(g));

    /* a name the driver does not have */
    void *nothing = drv_sym("cuNoSuchFunction", 12000, 0);
    say("cuNoSuchFunction null %d", nothing == NULL);

    /* the pre-12.0 resolver (no status out-parameter), as CUDA 11 static runtimes use it.
     * (Not through RTLD_DEFAULT: there the preload's own export answers, with or without
     * libcuda loaded globally; that difference is inherent to preloading.) */
    typedef CUresult (*PFN_gpa_v1)(const char *, void **, int, cuuint64_t);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    PFN_gpa_v1 gpa1 = (PFN_gpa_v1)dlsym(h, "cuGetProcAddress");
    say("dlsym cuGetProcAddress %d", gpa1 != NULL);
    for (int i = 0; i < 2 && gpa1; i++) {
        void *p1 = NULL, *p2 = NULL;
        /* the second time with the per-thread flag: cuMemAlloc has no _ptsz export */
        rc = gpa1("cuMemAlloc", &p1, 11000, i ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
        int rc2 = gpa1("cuMemFree", &p2, 11000, 0);
        say("v1 resolver %d: %d %d found %d %d", i, rc, rc2, p1 != NULL, p2 != NULL);
        if (!p1 || !p2)
            continue;
        CUdeviceptr x = 0;
        char label[8];
        snprintf(label, sizeof label, "r%d", i);
        rc = ((PFN_alloc)p1)(&x, 4000 + i);
        ev("cuMemAlloc_v2", rc, "size=%d ptr=%s", 4000 + i, AP(rc, x, label));
        rc = ((PFN_free)p2)(x);
        ev("cuMemFree_v2", rc, "ptr=%s", L(x, label));
    }

    say("cuStreamDestroy %d", streamDestroy(s));
    say("cuDevicePrimaryCtxRelease %d", release(dev));
    say("done");
    return 0;
}

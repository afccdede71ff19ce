// link: cuda
/* A program linked against libcuda, calling driver exports by their exported names. */
#include "common.h"

static int kernel_runs;
static CUdeviceptr kernel_saw;

static void k_touch(void **params) {
    CUdeviceptr p = *(CUdeviceptr *)params[0];
    kernel_saw = p;
    kernel_runs++;
    ((volatile unsigned char *)(uintptr_t)p)[0] = 0x77;
}

int main(void) {
    setup();
    int rc;
    CUdeviceptr early = 0;
    rc = cuMemAlloc_v2(&early, 64);
    ev("cuMemAlloc_v2", rc, "size=64 ptr=0");
    rc = cuInit(0);
    say("cuInit %d", rc);
    int version = 0;
    rc = cuDriverGetVersion(&version);
    say("cuDriverGetVersion %d version>0 %d", rc, version > 0);
    CUdevice dev = -1;
    rc = cuDeviceGet(&dev, 0);
    say("cuDeviceGet %d dev=%d", rc, dev);
    CUcontext ctx = NULL;
    rc = cuCtxCreate_v2(&ctx, 0, dev);
    say("cuCtxCreate_v2 %d ctx!=0 %d", rc, ctx != NULL);

    CUdeviceptr d = 0;
    rc = cuMemAlloc_v2(&d, 4096);
    ev("cuMemAlloc_v2", rc, "size=4096 ptr=%s device=0", AP(rc, d, "d"));
    unsigned int d32 = 0;
    rc = cuMemAlloc(&d32, 4096); /* the CUDA < 3.2 ABI export: not ours, not recorded */
    say("call cuMemAlloc(v1) %d", rc);
    if (rc == 0 && d32 != 0) {
        rc = cuMemFree_v2((CUdeviceptr)d32);
        ev("cuMemFree_v2", rc, "ptr=%s", L(d32, "v1"));
    }
    size_t bytes = 0;
    CUdeviceptr base = 0;
    rc = cuMemGetAddressRange_v2(&base, &bytes, d + 100);
    say("cuMemGetAddressRange_v2 %d base==d %d size %zu", rc, base == d, bytes);

    /* a kernel, launched by name: launches are not events */
    size_t off = 0, sz = sizeof(CUdeviceptr);
    CUfunction k = standin_register_kernel("k_touch", k_touch, 1, &off, &sz);
    void *params[] = {&d};
    rc = cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    say("cuLaunchKernel %d", rc);
    rc = cuCtxSynchronize();
    unsigned char back = 0;
    int rc2 = cuMemcpyDtoH_v2(&back, d, 1);
    say("cuCtxSynchronize %d runs %d saw==d %d byte %d %#x", rc, kernel_runs, kernel_saw == d, rc2,
        back);

    CUstream s = NULL;
    rc = cuStreamCreate(&s, CU_STREAM_DEFAULT);
    say("cuStreamCreate %d", rc);
    CUdeviceptr a = 0, b = 0;
    rc = cuMemAllocAsync(&a, 1024, s);
    ev("cuMemAllocAsync", rc, "size=1024 stream=%s ptr=%s", L(U64(s), "s"), AP(rc, a, "a"));
    rc = cuMemAllocAsync_ptsz(&b, 2048, CU_STREAM_PER_THREAD);
    ev("cuMemAllocAsync_ptsz", rc, "size=2048 stream=2 ptr=%s", AP(rc, b, "b"));
    rc = cuMemFreeAsync(a, s);
    ev("cuMemFreeAsync", rc, "ptr=@a stream=%s", L(U64(s), "s"));
    rc = cuMemFreeAsync_ptsz(b, CU_STREAM_PER_THREAD);
    ev("cuMemFreeAsync_ptsz", rc, "ptr=@b stream=2");
    say("cuStreamSynchronize %d", cuStreamSynchronize(s));

    CUmemoryPool pool = NULL;
    rc = cuDeviceGetDefaultMemPool(&pool, dev);
    say("cuDeviceGetDefaultMemPool %d", rc);
    CUdeviceptr f = 0;
    rc = cuMemAllocFromPoolAsync(&f, 512, pool, s);
    ev("cuMemAllocFromPoolAsync", rc, "size=512 handle=%s stream=%s ptr=%s", L(U64(pool), "pool"),
       L(U64(s), "s"), AP(rc, f, "f"));
    rc = cuMemFreeAsync(f, s);
    ev("cuMemFreeAsync", rc, "ptr=@f stream=%s", L(U64(s), "s"));
    say("cuStreamSynchronize %d", cuStreamSynchronize(s));

    CUdeviceptr m = 0, p = 0;
    rc = cuMemAllocManaged(&m, 100, CU_MEM_ATTACH_HOST);
    ev("cuMemAllocManaged", rc, "size=100 flags=2 ptr=%s", AP(rc, m, "m"));
    rc = cuMemFree_v2(m);
    ev("cuMemFree_v2", rc, "ptr=@m");
    size_t pitch = 0;
    rc = cuMemAllocPitch_v2(&p, &pitch, 300, 7, 8);
    ev("cuMemAllocPitch_v2", rc, "size=%zu pitch=%zu flags=8 ptr=%s", pitch * 7, pitch,
       AP(rc, p, "p"));
    rc = cuMemFree_v2(p);
    ev("cuMemFree_v2", rc, "ptr=@p");

    void *h = NULL, *h2 = NULL;
    rc = cuMemAllocHost_v2(&h, 1000);
    ev("cuMemAllocHost_v2", rc, "size=1000 ptr=%s", AP(rc, U64(h), "h"));
    rc = cuMemHostAlloc(&h2, 3000, CU_MEMHOSTALLOC_WRITECOMBINED);
    ev("cuMemHostAlloc", rc, "size=3000 flags=4 ptr=%s", AP(rc, U64(h2), "h2"));
    rc = cuMemFreeHost(h);
    ev("cuMemFreeHost", rc, "ptr=@h");
    rc = cuMemFreeHost(h2);
    ev("cuMemFreeHost", rc, "ptr=@h2");
    void *reg = aligned_alloc(4096, 8192);
    rc = cuMemHostRegister_v2(reg, 8192, 0);
    ev("cuMemHostRegister_v2", rc, "ptr=%s size=8192 flags=0", L(U64(reg), "reg"));
    rc = cuMemHostRegister_v2(reg, 8192, 0);
    ev("cuMemHostRegister_v2", rc, "ptr=@reg size=8192 flags=0");
    rc = cuMemHostUnregister(reg);
    ev("cuMemHostUnregister", rc, "ptr=@reg");
    rc = cuMemHostUnregister(reg);
    ev("cuMemHostUnregister", rc, "ptr=@reg");
    free(reg);

    rc = cuMemFree_v2(d);
    ev("cuMemFree_v2", rc, "ptr=@d");
    say("cuStreamDestroy_v2 %d", cuStreamDestroy_v2(s));
    say("cuCtxDestroy_v2 %d", cuCtxDestroy_v2(ctx));
    say("done");
    return 0;
}

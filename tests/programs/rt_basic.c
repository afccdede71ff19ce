// link: cudart
/* The runtime linked dynamically, as PyTorch links it: every allocation entry point once. */
#include "common.h"

int main(void) {
    setup();
    int rc, n = -1;
    rc = cudaGetDeviceCount(&n);
    say("cudaGetDeviceCount %d n=%d", rc, n);
    rc = cudaSetDevice(0);
    say("cudaSetDevice %d", rc);

    /* plain */
    void *a = NULL, *b = NULL;
    rc = cudaMalloc(&a, 1024);
    ev("cudaMalloc", rc, "size=1024 ptr=%s", AP(rc, U64(a), "a"));
    rc = cudaMalloc(&b, 1 << 20);
    ev("cudaMalloc", rc, "size=1048576 ptr=%s", AP(rc, U64(b), "b"));
    say("a!=0 %d b!=0 %d a!=b %d", a != NULL, b != NULL, a != b);
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");
    rc = cudaFree(NULL);
    ev("cudaFree", rc, "ptr=0");

    /* stream-ordered, two streams and the legacy stream */
    cudaStream_t s1 = NULL, s2 = NULL;
    rc = cudaStreamCreate(&s1);
    say("cudaStreamCreate %d", rc);
    rc = cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    say("cudaStreamCreateWithFlags %d", rc);
    void *x1 = NULL, *x2 = NULL, *x3 = NULL;
    rc = cudaMallocAsync(&x1, 4096, s1);
    ev("cudaMallocAsync", rc, "size=4096 stream=%s ptr=%s", L(U64(s1), "s1"), AP(rc, U64(x1), "x1"));
    rc = cudaMallocAsync(&x2, 8192, s2);
    ev("cudaMallocAsync", rc, "size=8192 stream=%s ptr=%s", L(U64(s2), "s2"), AP(rc, U64(x2), "x2"));
    rc = cudaMallocAsync(&x3, 100, NULL);
    ev("cudaMallocAsync", rc, "size=100 stream=0 ptr=%s", AP(rc, U64(x3), "x3"));
    unsigned char host[8192];
    memset(host, 0, sizeof host);
    rc = cudaMemsetAsync(x1, 0x5a, 4096, s1);
    say("cudaMemsetAsync %d", rc);
    rc = cudaMemcpyAsync(host, x1, 4096, cudaMemcpyDeviceToHost, s1);
    say("cudaMemcpyAsync %d", rc);
    rc = cudaStreamSynchronize(s1);
    say("cudaStreamSynchronize %d host[0]=%#x host[4095]=%#x", rc, host[0], host[4095]);
    rc = cudaFreeAsync(x1, s1);
    ev("cudaFreeAsync", rc, "ptr=@x1 stream=%s", L(U64(s1), "s1"));
    rc = cudaFreeAsync(x2, s2);
    ev("cudaFreeAsync", rc, "ptr=@x2 stream=%s", L(U64(s2), "s2"));
    rc = cudaFreeAsync(x3, NULL);
    ev("cudaFreeAsync", rc, "ptr=@x3 stream=0");
    int q1 = cudaStreamSynchronize(s1);
    int q2 = cudaStreamSynchronize(s2);
    int q3 = cudaDeviceSynchronize();
    say("sync %d %d %d", q1, q2, q3);

    /* the per-thread-default-stream exports */
    void *y = NULL;
    rc = cudaMallocAsync_ptsz(&y, 512, NULL);
    ev("cudaMallocAsync_ptsz", rc, "size=512 stream=0 ptr=%s", AP(rc, U64(y), "y"));
    rc = cudaFreeAsync_ptsz(y, NULL);
    ev("cudaFreeAsync_ptsz", rc, "ptr=@y stream=0");

    /* from a pool */
    cudaMemPool_t pool = NULL;
    rc = cudaDeviceGetDefaultMemPool(&pool, 0);
    say("cudaDeviceGetDefaultMemPool %d pool!=0 %d", rc, pool != NULL);
    uint64_t threshold = UINT64_MAX;
    rc = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    say("cudaMemPoolSetAttribute %d", rc);
    void *z = NULL, *z2 = NULL;
    rc = cudaMallocFromPoolAsync(&z, 2048, pool, s1);
    ev("cudaMallocFromPoolAsync", rc, "size=2048 handle=%s stream=%s ptr=%s", L(U64(pool), "pool"),
       L(U64(s1), "s1"), AP(rc, U64(z), "z"));
    rc = cudaFreeAsync(z, s1);
    ev("cudaFreeAsync", rc, "ptr=@z stream=%s", L(U64(s1), "s1"));
    rc = cudaMallocFromPoolAsync_ptsz(&z2, 64, pool, NULL);
    ev("cudaMallocFromPoolAsync_ptsz", rc, "size=64 handle=%s stream=0 ptr=%s",
       L(U64(pool), "pool"), AP(rc, U64(z2), "z2"));
    rc = cudaFreeAsync_ptsz(z2, NULL);
    ev("cudaFreeAsync_ptsz", rc, "ptr=@z2 stream=0");
    say("sync %d", cudaStreamSynchronize(s1));
    rc = cudaMemPoolTrimTo(pool, 0);
    say("cudaMemPoolTrimTo %d", rc);

    /* managed */
    void *m = NULL;
    rc = cudaMallocManaged(&m, 4096, cudaMemAttachGlobal);
    ev("cudaMallocManaged", rc, "size=4096 flags=1 ptr=%s", AP(rc, U64(m), "m"));
    if (rc == 0) {
        ((volatile int *)m)[0] = 7;
        say("managed readback %d", ((volatile int *)m)[0]);
    }
    rc = cudaFree(m);
    ev("cudaFree", rc, "ptr=@m");

    /* pitched and 3D */
    void *p = NULL;
    size_t pitch = 0;
    rc = cudaMallocPitch(&p, &pitch, 100, 10);
    ev("cudaMallocPitch", rc, "size=%zu pitch=%zu ptr=%s", pitch * 10, pitch, AP(rc, U64(p), "p"));
    say("pitch %zu pitch>=100 %d", pitch, pitch >= 100);
    rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@p");
    struct cudaPitchedPtr pp;
    memset(&pp, 0, sizeof pp);
    struct cudaExtent ext = {64, 4, 3};
    rc = cudaMalloc3D(&pp, ext);
    ev("cudaMalloc3D", rc, "size=%zu pitch=%zu ptr=%s", pp.pitch * 4 * 3, pp.pitch,
       AP(rc, U64(pp.ptr), "p3"));
    say("3d pitch %zu xsize %zu ysize %zu", pp.pitch, pp.xsize, pp.ysize);
    rc = cudaFree(pp.ptr);
    ev("cudaFree", rc, "ptr=@p3");

    /* pinned host memory */
    void *h = NULL, *h2 = NULL;
    rc = cudaMallocHost(&h, 4096);
    ev("cudaMallocHost", rc, "size=4096 ptr=%s", AP(rc, U64(h), "h"));
    if (rc == 0) {
        memset(h, 1, 4096);
        say("host memory writable 1");
    }
    rc = cudaFreeHost(h);
    ev("cudaFreeHost", rc, "ptr=@h");
    rc = cudaHostAlloc(&h2, 8192, cudaHostAllocPortable | cudaHostAllocMapped);
    ev("cudaHostAlloc", rc, "size=8192 flags=3 ptr=%s", AP(rc, U64(h2), "h2"));
    rc = cudaFreeHost(h2);
    ev("cudaFreeHost", rc, "ptr=@h2");

    /* registered host memory */
    void *buf = aligned_alloc(4096, 65536);
    rc = cudaHostRegister(buf, 65536, cudaHostRegisterDefault);
    ev("cudaHostRegister", rc, "ptr=%s size=65536 flags=0", L(U64(buf), "buf"));
    rc = cudaHostUnregister(buf);
    ev("cudaHostUnregister", rc, "ptr=%s", L(U64(buf), "buf"));
    free(buf);

    /* memset / memcpy round trip */
    void *d1 = NULL, *d2 = NULL;
    rc = cudaMalloc(&d1, 256);
    ev("cudaMalloc", rc, "size=256 ptr=%s", AP(rc, U64(d1), "d1"));
    rc = cudaMalloc(&d2, 256);
    ev("cudaMalloc", rc, "size=256 ptr=%s", AP(rc, U64(d2), "d2"));
    unsigned char in[256], out[256];
    rc = cudaMemset(d1, 0xab, 256);
    say("cudaMemset %d", rc);
    rc = cudaMemcpy(d2, d1, 256, cudaMemcpyDeviceToDevice);
    say("cudaMemcpy D2D %d", rc);
    memset(out, 0, sizeof out);
    rc = cudaMemcpy(out, d2, 256, cudaMemcpyDeviceToHost);
    int all = 1;
    for (int i = 0; i < 256; i++)
        all &= out[i] == 0xab;
    say("cudaMemcpy D2H %d all_0xab %d", rc, all);
    for (int i = 0; i < 256; i++)
        in[i] = (unsigned char)i;
    rc = cudaMemcpy(d1, in, 256, cudaMemcpyHostToDevice);
    say("cudaMemcpy H2D %d", rc);
    memset(out, 0, sizeof out);
    rc = cudaMemcpy(out, d1, 256, cudaMemcpyDeviceToHost);
    say("cudaMemcpy D2H %d round_trip %d", rc, memcmp(in, out, 256) == 0);
    rc = cudaFree(d1);
    ev("cudaFree", rc, "ptr=@d1");
    rc = cudaFree(d2);
    ev("cudaFree", rc, "ptr=@d2");

    q1 = cudaStreamDestroy(s1);
    q2 = cudaStreamDestroy(s2);
    say("cudaStreamDestroy %d %d", q1, q2);
    say("cudaGetLastError %d", cudaGetLastError());
    say("done");
    return 0;
}

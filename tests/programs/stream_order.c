// link: cudart
/* A reader queued on a stream, then the free of what it reads queued on the same stream: in
 * stream order the reader runs first and sees the data, whatever a preload does at the free. */
#include "common.h"

#define N 4096

static unsigned char kernel_saw[N];
static int kernel_runs;

static void k_read(void **params) {
    const unsigned char *src = (const unsigned char *)(uintptr_t)(*(CUdeviceptr *)params[0]);
    memcpy(kernel_saw, src, N);
    kernel_runs++;
}

typedef CUfunction (*PFN_register)(const char *, standin_kernel_fn, unsigned, const size_t *,
                                   const size_t *);

int main(void) {
    setup();
    cudaStream_t s1 = NULL;
    int rc = cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    say("cudaStreamCreateWithFlags %d", rc);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    PFN_register reg = (PFN_register)dlsym(drv, "standin_register_kernel");
    size_t off = 0, sz = 8;
    CUfunction k = reg ? reg("k_read", k_read, 1, &off, &sz) : NULL;
    say("kernel %d", k != NULL);

    void *x = NULL;
    rc = cudaMalloc(&x, N);
    ev("cudaMalloc", rc, "size=%d ptr=%s", N, AP(rc, U64(x), "x"));
    rc = cudaMemset(x, 0x42, N);
    say("cudaMemset %d", rc);
    static unsigned char copy[N];
    memset(copy, 0, N);

    /* queued readers: a copy and a kernel */
    rc = cudaMemcpyAsync(copy, x, N, cudaMemcpyDeviceToHost, s1);
    say("cudaMemcpyAsync %d", rc);
    CUdeviceptr xp = U64(x);
    void *params[] = {&xp};
    dim3 grid = {1, 1, 1}, block = {1, 1, 1};
    rc = cudaLaunchKernel((const void *)k, grid, block, params, 0, s1);
    say("cudaLaunchKernel %d", rc);
    /* then the free, on the same stream, before anything ran */
    rc = cudaFreeAsync(x, s1);
    ev("cudaFreeAsync", rc, "ptr=@x stream=%s", L(U64(s1), "s1"));
    say("before sync: kernel runs %d copy[0]=%#x", kernel_runs, copy[0]);
    rc = cudaStreamSynchronize(s1);
    say("cudaStreamSynchronize %d", rc);
    int copy_ok = 1, kernel_ok = 1;
    for (int i = 0; i < N; i++) {
        copy_ok &= copy[i] == 0x42;
        kernel_ok &= kernel_saw[i] == 0x42;
    }
    say("copy saw %#x..%#x all_0x42 %d", copy[0], copy[N - 1], copy_ok);
    say("kernel runs %d saw %#x..%#x all_0x42 %d", kernel_runs, kernel_saw[0], kernel_saw[N - 1],
        kernel_ok);
    say("cudaStreamDestroy %d", cudaStreamDestroy(s1));
    say("done");
    return 0;
}

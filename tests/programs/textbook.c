// link: cudart
/* The textbook use-after-free, as public memory-error suites write it:
 *
 *     cudaMalloc(&p, SIZE); cudaFree(p); kernel<<<1,1>>>(p);   // the kernel writes p[0] = 42
 *     cudaDeviceReset(); return 0;
 *
 * Arguments: SIZE (default 4096), then any of `noreset` (no cudaDeviceReset: the exit check
 * finds the write) and `sync` (cudaDeviceSynchronize after the launch, its result printed:
 * where guard mode's fault comes back). The kernel is a library kernel (a CUkernel, as the CUDA
 * 12+ runtime launches them: only cuKernelGetParamInfo and cuKernelGetName answer for it),
 * with one 8-byte parameter. On the stand-in, the kernel first asks standin_touch whether the
 * word is accessible (unmapped guard memory faults the context instead of the process). */
#include "common.h"

static void k_write42(void **params) {
    CUdeviceptr p = *(CUdeviceptr *)params[0];
    if (standin_touch(p, 4))
        *(volatile int *)(uintptr_t)p = 42;
}

int main(int argc, char **argv) {
    setup();
    size_t size = 4096;
    int reset = 1, sync = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "noreset") == 0)
            reset = 0;
        else if (strcmp(argv[i], "sync") == 0)
            sync = 1;
        else
            size = strtoull(argv[i], NULL, 0);
    }
    size_t sz1[] = {8};
    CUfunction k = standin_register_kernel_as(1, "k_write42", k_write42, 1, NULL, sz1);
    say("registered %d", k != NULL);
    void *p = NULL;
    int rc = cudaMalloc(&p, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(p), "P"));
    rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@P");
    void *args[] = {&p};
    dim3 one = {1, 1, 1};
    say("kernel<<<1,1>>>(p) %d", cudaLaunchKernel((const void *)k, one, one, args, 0, NULL));
    if (sync)
        say("cudaDeviceSynchronize %d", cudaDeviceSynchronize());
    if (reset)
        say("cudaDeviceReset %d", cudaDeviceReset());
    return 0;
}

// A kernel launch that needs device memory of the driver's own while the device is full, on a
// real GPU (tests/gpu/launch_room.sh). The program fills the device with cudaMalloc, frees
// FREED_MIB of it, and then launches, for the first time:
//   lazy   a kernel whose module the driver loads at its first launch (CUDA_MODULE_LOADING=LAZY,
//          the default): the module's code and data need device memory;
//   local  a kernel with a large per-thread local array: the driver must grow the context's
//          local memory (per thread x the threads the device can hold) before it runs.
// Without the library the freed memory is free, so the launch runs. Under isolate mode the freed
// memory sits in the quarantine; the launch gets it back only if the library gives it back when
// the launch (or the call that loads the module) runs out of memory.
//   launch_room lazy|local [freed MiB]   prints: "launch <scenario>: launch=<code> sync=<code>"
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__global__ void lazy_kernel(int *out) {
    if (out) out[threadIdx.x] = threadIdx.x;
}

__global__ void local_kernel(int *out, int n) {
    volatile char buf[16 * 1024];
    for (int i = 0; i < n; i++) buf[(i * 977 + threadIdx.x) % sizeof(buf)] = (char)i;
    if (out && threadIdx.x == 0) out[blockIdx.x] = buf[n % sizeof(buf)];
}

int main(int argc, char **argv) {
    const char *scenario = argc > 1 ? argv[1] : "lazy";
    size_t freed_mib = argc > 2 ? strtoul(argv[2], 0, 10) : 8192;
    cudaFree(0);
    size_t free0 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    // Fill: big blocks, then smaller, then small, until each size fails.
    static void *blocks[1 << 16];
    size_t n = 0, sizes[] = {256u << 20, 16u << 20, 1u << 20, 64u << 10};
    size_t big = 0;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        while (n < sizeof(blocks) / sizeof(blocks[0]) && cudaMalloc(&blocks[n], sizes[s]) == cudaSuccess) {
            if (s == 0) big++;
            n++;
        }
        cudaGetLastError();
    }
    // Free the first freed_mib of the 256 MiB blocks.
    size_t nfree = freed_mib / 256;
    if (nfree > big) nfree = big;
    for (size_t i = 0; i < nfree; i++) cudaFree(blocks[i]);
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    int *out = 0;
    int launch, sync;
    if (!strcmp(scenario, "local")) {
        local_kernel<<<4096, 1024>>>(out, 20000);
    } else {
        lazy_kernel<<<1, 32>>>(out);
    }
    launch = cudaGetLastError();
    sync = cudaDeviceSynchronize();
    printf("launch %s: filled %zu blocks (%zu MiB free before, of %zu), freed %zu MiB, %zu MiB free "
           "as the program sees it; launch=%d sync=%d\n",
           scenario, n, free0 >> 20, total >> 20, nfree * 256, free1 >> 20, launch, sync);
    for (size_t i = nfree; i < n; i++) cudaFree(blocks[i]);
    return launch != cudaSuccess || sync != cudaSuccess;
}

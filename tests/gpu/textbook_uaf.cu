// The textbook use-after-free, as public memory-error suites write it (issue 30):
//
//   cudaMalloc(&p, BYTES); cudaFree(p); kernel<<<1,1>>>(p) writes p[0] = 42;
//   [cudaDeviceSynchronize();] [cudaDeviceReset();] return 0;
//
//   nvcc -O2 -o textbook_uaf tests/gpu/textbook_uaf.cu          (static runtime, nvcc's default)
//   textbook_uaf [BYTES] [sync] [reset|noreset]                 (defaults: 4096, no sync, reset)
//
// Prints `bytes=N sync=<code|-> reset=<code|->`; exit 0. compute-sanitizer memcheck reports
// the write; isolate mode should report a stale launch (the kernel's only parameter is the freed
// pointer) and a stale write (checked before the reset takes the memory away); guard mode a
// device fault naming the launch. tests/gpu/uaf_check.sh runs every variant.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void write42(int *p) { p[0] = 42; }

int main(int argc, char **argv) {
    size_t bytes = 4096;
    bool sync = false, reset = true;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "sync"))
            sync = true;
        else if (!std::strcmp(argv[i], "noreset"))
            reset = false;
        else if (!std::strcmp(argv[i], "reset"))
            reset = true;
        else
            bytes = std::strtoull(argv[i], nullptr, 0);
    }
    int *p = nullptr;
    cudaMalloc(&p, bytes);
    cudaFree(p);
    write42<<<1, 1>>>(p);
    int s = -1, r = -1;
    if (sync) s = (int)cudaDeviceSynchronize();
    if (reset) r = (int)cudaDeviceReset();
    std::printf("bytes=%zu sync=%d reset=%d\n", bytes, s, r);
    return 0;
}

// The textbook use-after-free, as public memory-error suites write it (issue 30):
//
//   cudaMalloc(&p, BYTES); cudaFree(p); kernel<<<1,1>>>(p) writes p[0] = 42;
//   [cudaDeviceSynchronize();] [cudaDeviceReset();] return 0;
//
//   nvcc -O2 -o textbook_uaf tests/gpu/textbook_uaf.cu          (static runtime, nvcc's default)
//   textbook_uaf [BYTES] [reset|noreset]                        (defaults 4096 reset)
//
// Prints `bytes=N sync=<code> reset=<code|skipped>`; exit 0. compute-sanitizer memcheck reports
// the write; isolate mode should report a stale launch (the kernel's only parameter is the freed
// pointer) and a stale write (checked before the reset takes the memory away); guard mode a fault.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void write42(int *p) { p[0] = 42; }

int main(int argc, char **argv) {
    size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : 4096;
    bool reset = !(argc > 2 && !std::strcmp(argv[2], "noreset"));
    int *p = nullptr;
    cudaMalloc(&p, bytes);
    cudaFree(p);
    write42<<<1, 1>>>(p);
    cudaError_t sync = cudaDeviceSynchronize();
    int r = -1;
    if (reset) r = (int)cudaDeviceReset();
    std::printf("bytes=%zu sync=%d reset=%d\n", bytes, (int)sync, r);
    return 0;
}

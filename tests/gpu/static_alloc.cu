// A plain nvcc program: the CUDA runtime is linked statically (no libcudart in `ldd`), so a
// preload only sees its allocations as driver calls resolved through cuGetProcAddress.
//
//   static_alloc [K] [M]
//     K x cudaMalloc/cudaFree, M x cudaMallocAsync/cudaFreeAsync on a non-blocking stream,
//     1 cudaMallocManaged (freed with cudaFree), 1 cudaMallocHost/cudaFreeHost,
//     and a kernel that writes each device buffer; the results are checked on the host.
//
// Prints one line `RESULT {json}` with the counts of each call it made and the driver calls
// they should become.

#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        cudaError_t err_ = (call);                                                   \
        if (err_ != cudaSuccess) {                                                   \
            std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                         cudaGetErrorString(err_));                                  \
            return 1;                                                                \
        }                                                                            \
    } while (0)

__global__ void fill(float* p, size_t n, float value) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = value;
}

static void launch_fill(float* p, size_t n, float value, cudaStream_t stream) {
    const unsigned threads = 256;
    const unsigned blocks = (unsigned)((n + threads - 1) / threads);
    fill<<<blocks, threads, 0, stream>>>(p, n, value);
}

// Reads back the last element of a device buffer; 1 when it holds `value`.
static int last_is(const float* p, size_t n, float value) {
    float got = 0;
    if (cudaMemcpy(&got, p + n - 1, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
    return got == value;
}

int main(int argc, char** argv) {
    const int K = argc > 1 ? std::atoi(argv[1]) : 100;
    const int M = argc > 2 ? std::atoi(argv[2]) : 50;
    int kernels_ok = 0, kernels = 0;

    CHECK(cudaSetDevice(0));

    // K synchronous allocations of distinct sizes (1 MiB + k pages).
    for (int k = 0; k < K; ++k) {
        const size_t n = ((1u << 20) + 4096u * k) / sizeof(float);
        float* p = nullptr;
        CHECK(cudaMalloc(&p, n * sizeof(float)));
        launch_fill(p, n, (float)k, 0);
        CHECK(cudaGetLastError());
        kernels_ok += last_is(p, n, (float)k);
        ++kernels;
        CHECK(cudaFree(p));
    }

    // M stream-ordered allocations on a non-blocking stream.
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int m = 0; m < M; ++m) {
        const size_t n = (1u << 18) + 64u * m;
        float* q = nullptr;
        CHECK(cudaMallocAsync((void**)&q, n * sizeof(float), stream));
        launch_fill(q, n, 1.0f, stream);
        CHECK(cudaGetLastError());
        CHECK(cudaFreeAsync(q, stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaStreamDestroy(stream));

    // Managed memory, written by the device and read on the host.
    const size_t managed_n = 1u << 18;
    float* managed = nullptr;
    CHECK(cudaMallocManaged(&managed, managed_n * sizeof(float)));
    launch_fill(managed, managed_n, 2.0f, 0);
    CHECK(cudaDeviceSynchronize());
    kernels_ok += managed[managed_n - 1] == 2.0f;
    ++kernels;
    CHECK(cudaFree(managed));

    // Pinned host memory.
    void* host = nullptr;
    CHECK(cudaMallocHost(&host, 1u << 20));
    CHECK(cudaFreeHost(host));

    CHECK(cudaDeviceSynchronize());
    std::printf(
        "RESULT {\"cudaMalloc\": %d, \"cudaFree\": %d, \"cudaMallocAsync\": %d, "
        "\"cudaFreeAsync\": %d, \"cudaMallocManaged\": %d, \"cudaMallocHost\": %d, "
        "\"cudaFreeHost\": %d, "
        "\"expect_driver\": {\"cuMemAlloc_v2\": %d, \"cuMemFree_v2\": %d, "
        "\"cuMemAllocAsync\": %d, \"cuMemFreeAsync\": %d, \"cuMemAllocManaged\": 1, "
        "\"host_alloc\": 1, \"cuMemFreeHost\": 1}, "
        "\"kernels\": %d, \"kernels_ok\": %d}\n",
        K, K, M, M, 1, 1, 1, K, K + 1, M, M, kernels, kernels_ok);
    return kernels_ok == kernels ? 0 : 2;
}

// Host-side cost of a kernel launch, for the launch check's figure (issue 4).
//
//   nvcc -O2 -o launch_bench tests/gpu/launch_bench.cu && ./launch_bench [ROUNDS]
//
// Before timing, 64 buffers of 1 MiB are allocated and every other one freed, so that under
// isolation the quarantine holds freed ranges among the live ones: every pointer parameter then
// lies between the lowest and highest freed address and has to be looked up (the check's slow
// path), without being stale. Two kernels: three pointers and an int (a typical elementwise
// kernel), and a 256-byte struct by value with 8 pointers and 24 small integers (how PyTorch's
// TensorIterator kernels receive their operands). Each round times 512 launches on the host
// (below the launch queue's depth, so the GPU never holds the host back), then synchronises
// untimed. Prints the median ns per launch of each kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

struct Big {
    float *p[8];
    long n[24];
};
static_assert(sizeof(Big) == 256, "256-byte struct");

__global__ void k3(float *a, const float *b, const float *c, int n) {
    if (n < 0) a[0] = b[0] + c[0];  // never true: the kernel does nothing, quickly
}

__global__ void kbig(Big s) {
    if (s.n[0] < 0) s.p[0][0] = 1.0f;
}

static double now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e));           \
            return 1;                                                                \
        }                                                                            \
    } while (0)

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    const int per_round = 512;
    std::vector<float *> bufs(64);
    for (auto &b : bufs) CHECK(cudaMalloc(&b, 1 << 20));
    std::vector<float *> live;
    for (size_t i = 0; i < bufs.size(); i++) {
        if (i % 2) CHECK(cudaFree(bufs[i]));
        else live.push_back(bufs[i]);
    }
    Big big;
    for (int i = 0; i < 8; i++) big.p[i] = live[1 + i];
    for (int i = 0; i < 24; i++) big.n[i] = i + 1;
    float *a = live[1], *b = live[5], *c = live[9];
    for (int i = 0; i < 2000; i++) {  // warm up (and let the check cache both layouts)
        k3<<<1, 32>>>(a, b, c, 1);
        kbig<<<1, 32>>>(big);
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<double> t3, tb;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (int i = 0; i < per_round; i++) k3<<<1, 32>>>(a, b, c, 1);
        double t1 = now_ns();
        CHECK(cudaDeviceSynchronize());
        double t2 = now_ns();
        for (int i = 0; i < per_round; i++) kbig<<<1, 32>>>(big);
        double t3_ = now_ns();
        CHECK(cudaDeviceSynchronize());
        t3.push_back((t1 - t0) / per_round);
        tb.push_back((t3_ - t2) / per_round);
    }
    CHECK(cudaGetLastError());
    std::sort(t3.begin(), t3.end());
    std::sort(tb.begin(), tb.end());
    printf("RESULT k3_ns %.1f kbig_ns %.1f rounds %d launches %d\n", t3[t3.size() / 2],
           tb[tb.size() / 2], rounds, 2 * rounds * per_round);
    return 0;
}

// Host-side cost of a kernel launch by the size of its parameters (twenty-eighth session):
// whether the deferred poisons' fill launch (`isolate_poison_many`, a 1 KiB buffer of 64
// ranges, 2.5 of them used on average in the full tier) would cost less with a smaller one.
//
//   nvcc -O2 -o param_cost tests/gpu/param_cost.cu && ./param_cost [ROUNDS]
//
// Each kernel takes one struct by value (16, 128, 1,024 or 4,000 bytes) and does nothing. A
// round times 512 launches of one kernel on the host (below the launch queue's depth, so the
// device never holds the host back), then synchronises untimed; the kernels take turns round by
// round. Prints the median ns per launch of each size, and each against the 16-byte one.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

template <int N>
struct P {
    unsigned long long w[N / 8];
};

template <int N>
__global__ void k(P<N> p) {
    if (p.w[0] == 0x5eed && p.w[N / 8 - 1] == 1) asm volatile("trap;");  // never: reads both ends
}

static double now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

template <int N>
static double round_ns(cudaStream_t s) {
    P<N> p{};
    const int n = 512;
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        p.w[0] = i;
        k<N><<<1, 32, 0, s>>>(p);
    }
    double t = (now_ns() - t0) / n;
    cudaStreamSynchronize(s);
    return t;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    std::vector<double> r16, r128, r1024, r4000;
    for (int warm = 0; warm < 3; warm++) {
        round_ns<16>(s), round_ns<128>(s), round_ns<1024>(s), round_ns<4000>(s);
    }
    for (int i = 0; i < rounds; i++) {
        r16.push_back(round_ns<16>(s));
        r128.push_back(round_ns<128>(s));
        r1024.push_back(round_ns<1024>(s));
        r4000.push_back(round_ns<4000>(s));
    }
    if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) {
        fprintf(stderr, "param_cost: a launch failed\n");
        return 1;
    }
    auto med = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    double b = med(r16);
    printf("param bytes  ns/launch (median of %d rounds of 512)  x 16 B\n", rounds);
    printf("%11d  %9.0f  %6.2f\n", 16, b, 1.0);
    printf("%11d  %9.0f  %6.2f\n", 128, med(r128), med(r128) / b);
    printf("%11d  %9.0f  %6.2f\n", 1024, med(r1024), med(r1024) / b);
    printf("%11d  %9.0f  %6.2f\n", 4000, med(r4000), med(r4000) / b);
    return 0;
}

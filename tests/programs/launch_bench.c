// link: cudart
/*
 * The launch check's cost per launch: N launches of a kernel with a PyTorch-like parameter
 * list (three pointers, two sizes, and a 128-byte structure passed by value that holds two
 * pointers and strides), after 1000 allocations of which half were freed (so in isolate mode
 * the quarantine index holds 500 ranges). Prints ns per launch, timed inside the program.
 * Used by hand: `ISOLATE_MODE=isolate ISOLATE_CHECK_LAUNCH=on|off launch_bench N`
 * (docs/performance.md). STANDIN_SYNC=1 makes the stand-in run each (empty) kernel at once.
 */
#include "bench.h"

int main(int argc, char **argv) {
    setup();
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    PFN_register reg;
    PFN_launch launch;
    if (bench_setup(&reg, &launch) != 0)
        return 1;
    size_t off[] = {0, 8, 16, 24, 32, 40}, sz[] = {8, 8, 8, 8, 8, 128};
    CUfunction k = reg("bench_kernel", k_nothing, 6, off, sz);
    void *bufs[1000];
    for (int i = 0; i < 1000; i++)
        if (cudaMalloc(&bufs[i], 4096) != 0)
            return 1;
    for (int i = 0; i < 1000; i += 2)
        cudaFree(bufs[i]);
    CUdeviceptr a = (CUdeviceptr)bufs[1], b = (CUdeviceptr)bufs[3], c = (CUdeviceptr)bufs[5];
    unsigned long long n1 = 1 << 20, n2 = 7;
    struct { CUdeviceptr p; long long sizes[6]; CUdeviceptr q; long long strides[8]; } s = {0};
    s.p = (CUdeviceptr)bufs[7];
    s.q = (CUdeviceptr)bufs[9];
    for (int i = 0; i < 6; i++)
        s.sizes[i] = 32 << i;
    for (int i = 0; i < 8; i++)
        s.strides[i] = 1 << i;
    void *params[] = {&a, &b, &c, &n1, &n2, &s};
    for (int i = 0; i < 1000; i++) /* warm-up: layouts cached, pages touched */
        launch(k, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        if (launch(k, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) != 0)
            return 1;
    double t1 = now_ns();
    printf("launches %ld ns_per_launch %.1f\n", n, (t1 - t0) / n);
    return 0;
}

// link: cudart
/*
 * What isolation costs a training step's host thread, PyTorch-style, on the stand-in: each
 * "step" allocates N tensors with cudaMallocAsync on one stream (sizes from a fixed list of
 * 16, as PyTorch's repeat every step), launches a kernel with three of them as parameters
 * after each allocation, and frees each tensor with cudaFreeAsync a few tensors later.
 * Prints the host time per step and per tensor, timed inside the program; with
 * ISOLATE_PROFILE=on the trace's exit note splits the hooks' time. For profiling the library's
 * own time by hand (`perf record`), docs/performance.md:
 *   step_bench STEPS TENSORS [SITES [THRASH_KB [BYTES]]]
 * SITES (1 to 64, default 1): the allocations are made from that many call sites in turn, each
 * a function of its own at the same depth, as PyTorch's autograd thread allocates for many
 * backward nodes from one place in its engine (a thread without Python: its stacks are native
 * walks, remembered by where they start; docs/performance.md, "Call stacks").
 * THRASH_KB (default 0): before each tensor's calls, write that many KiB of a buffer of the
 * program's own (a cache line at a time), as a framework's own work between two allocations
 * evicts the library's data from the caches: the hooks then run cold, as in a real step.
 * BYTES, when given, is every tensor's size instead of the list's (256: the stand-in's device
 * work, poisons and checks done by its CPU, then costs next to nothing beside the hooks').
 */
#include "bench.h"

#define LAG 4

typedef cudaError_t (*alloc_fn)(void **, size_t, cudaStream_t);

#define SITE(k)                                                                                  \
    __attribute__((noinline)) static cudaError_t site##k(void **p, size_t n, cudaStream_t s) { \
        cudaError_t r = cudaMallocAsync(p, n, s);                                              \
        __asm__ volatile("" ::: "memory"); /* not a tail call: a frame of its own */          \
        return r;                                                                              \
    }
#define SITE8(k)                                                                                 \
    SITE(k##0) SITE(k##1) SITE(k##2) SITE(k##3) SITE(k##4) SITE(k##5) SITE(k##6) SITE(k##7)
SITE8(1) SITE8(2) SITE8(3) SITE8(4) SITE8(5) SITE8(6) SITE8(7) SITE8(8)
#define SITES8(k) site##k##0, site##k##1, site##k##2, site##k##3, site##k##4, site##k##5, \
                  site##k##6, site##k##7
static const alloc_fn SITES[64] = {SITES8(1), SITES8(2), SITES8(3), SITES8(4),
                                   SITES8(5), SITES8(6), SITES8(7), SITES8(8)};

int main(int argc, char **argv) {
    setup();
    long steps = argc > 1 ? atol(argv[1]) : 200;
    long tensors = argc > 2 ? atol(argv[2]) : 600;
    long sites = argc > 3 ? atol(argv[3]) : 1;
    long thrash = argc > 4 ? atol(argv[4]) * 1024 : 0;
    long bytes = argc > 5 ? atol(argv[5]) : 0;
    volatile unsigned char *junk = thrash > 0 ? calloc((size_t)thrash, 1) : NULL;
    if (sites < 1 || sites > 64) {
        fprintf(stderr, "SITES is 1 to 64\n");
        return 2;
    }
    PFN_register reg;
    PFN_launch launch;
    if (bench_setup(&reg, &launch) != 0)
        return 1;
    size_t off[] = {0, 8, 16, 24}, sz[] = {8, 8, 8, 8};
    CUfunction k = reg("step_kernel", k_nothing, 4, off, sz);
    cudaStream_t s;
    if (cudaStreamCreate(&s) != 0)
        return 1;
    /* Small: the stand-in's poisons and checks are CPU work proportional to the bytes. */
    size_t sizes[16] = {512, 4096, 1024, 16384, 32768, 512, 8192, 2048,
                        65536, 1024, 16384, 4096, 49152, 2048, 32768, 8192};
    for (int j = 0; bytes > 0 && j < 16; j++)
        sizes[j] = (size_t)bytes;
    void **held = calloc((size_t)tensors, sizeof(void *));
    long failed = 0;
    double t0 = 0;
    for (long st = 0; st < steps + 5; st++) {
        if (st == 5) /* warm-up steps: layouts cached, stacks interned, pool grown */
            t0 = now_ns();
        for (long i = 0; i < tensors; i++) {
            for (long j = 0; j < thrash; j += 64)
                junk[j]++;
            if (SITES[i % sites](&held[i], sizes[i % 16], s) != 0) {
                failed++;
                held[i] = NULL;
            }
            CUdeviceptr a = (CUdeviceptr)held[i], b = (CUdeviceptr)held[i >= 1 ? i - 1 : i];
            CUdeviceptr c = (CUdeviceptr)held[i >= 2 ? i - 2 : i];
            unsigned long long n = sizes[i % 16];
            void *params[] = {&a, &b, &c, &n};
            if (launch(k, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, params, NULL) != 0)
                failed++;
            if (i >= LAG && held[i - LAG] && cudaFreeAsync(held[i - LAG], s) != 0)
                failed++;
        }
        for (long i = tensors - LAG; i < tensors; i++)
            if (i >= 0 && held[i] && cudaFreeAsync(held[i], s) != 0)
                failed++;
        if (cudaStreamSynchronize(s) != 0)
            failed++;
    }
    double t1 = now_ns();
    printf("steps %ld tensors %ld us_per_step %.1f ns_per_tensor %.1f failed %ld\n", steps,
           tensors, (t1 - t0) / 1e3 / steps, (t1 - t0) / steps / tensors, failed);
    return failed != 0;
}

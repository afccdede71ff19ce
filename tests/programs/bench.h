/*
 * What the benchmark programs (launch_bench.c, step_bench.c) share: the stand-in's kernel
 * registration and the driver's launch, found the way a program would find them, an empty
 * kernel, and a monotonic clock.
 */
#pragma once
#include "common.h"
#include <time.h>

typedef CUresult (*PFN_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
typedef CUfunction (*PFN_register)(const char *, standin_kernel_fn, unsigned, const size_t *,
                                   const size_t *);

static void k_nothing(void **params) { (void)params; }

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* The context made, then the stand-in's kernel registration and cuLaunchKernel (through
 * cudaGetDriverEntryPoint, as the runtime's users get it, so the library's hook answers); 0
 * when all went well. */
static int bench_setup(PFN_register *reg, PFN_launch *launch) {
    if (cudaFree(NULL) != 0)
        return 1;
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    *reg = drv ? (PFN_register)dlsym(drv, "standin_register_kernel") : NULL;
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (!*reg || cudaGetDriverEntryPoint("cuLaunchKernel", &fn, cudaEnableDefault, &q) != 0 || !fn)
        return 1;
    *launch = (PFN_launch)fn;
    return 0;
}

// link: cudart
/* threads N M: N threads, each M alloc/free pairs; even threads through the runtime, odd ones
 * through the driver path a static runtime uses (cuGetProcAddress). Prints totals; the time
 * goes to stderr. For load tests and benchmarks. */
#include <pthread.h>
#include <time.h>

#include "common.h"

typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_free)(CUdeviceptr);
typedef CUresult (*PFN_retain)(CUcontext *, CUdevice);
typedef CUresult (*PFN_setCurrent)(CUcontext);

static PFN_alloc memAlloc;
static PFN_free memFree;
static PFN_setCurrent setCurrent;
static CUcontext ctx;
static long pairs;

struct result {
    long alloc_ok, free_ok, failures;
};

static void *worker(void *arg) {
    long id = (long)(intptr_t)arg;
    struct result *r = calloc(1, sizeof *r);
    int driver = id % 2 == 1;
    if (driver && setCurrent(ctx) != 0)
        r->failures++;
    for (long i = 0; i < pairs; i++) {
        size_t size = 256 + (size_t)((id * 7 + i) % 64) * 16;
        if (driver) {
            CUdeviceptr d = 0;
            if (memAlloc(&d, size) != 0) {
                r->failures++;
                continue;
            }
            r->alloc_ok++;
            if (memFree(d) == 0)
                r->free_ok++;
            else
                r->failures++;
        } else {
            void *p = NULL;
            if (cudaMalloc(&p, size) != 0) {
                r->failures++;
                continue;
            }
            r->alloc_ok++;
            if (cudaFree(p) == 0)
                r->free_ok++;
            else
                r->failures++;
        }
    }
    return r;
}

int main(int argc, char **argv) {
    setup();
    if (argc != 3)
        return 2;
    long n = atol(argv[1]);
    pairs = atol(argv[2]);
    int rc = cudaFree(NULL);
    ev("cudaFree", rc, "ptr=0");
    drv_open();
    memAlloc = (PFN_alloc)drv_sym("cuMemAlloc", 12000, 0);
    memFree = (PFN_free)drv_sym("cuMemFree", 12000, 0);
    PFN_retain retain = (PFN_retain)drv_sym("cuDevicePrimaryCtxRetain", 12000, 0);
    setCurrent = (PFN_setCurrent)drv_sym("cuCtxSetCurrent", 12000, 0);
    if (!memAlloc || !memFree || !retain || !setCurrent)
        return 1;
    say("cuDevicePrimaryCtxRetain %d", retain(&ctx, 0));

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t *t = calloc((size_t)n, sizeof *t);
    for (long i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    long rt_alloc = 0, rt_free = 0, drv_alloc = 0, drv_free = 0, failures = 0;
    for (long i = 0; i < n; i++) {
        struct result *r;
        pthread_join(t[i], (void **)&r);
        if (i % 2) {
            drv_alloc += r->alloc_ok;
            drv_free += r->free_ok;
        } else {
            rt_alloc += r->alloc_ok;
            rt_free += r->free_ok;
        }
        failures += r->failures;
        free(r);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    say("threads %ld pairs %ld", n, pairs);
    say("runtime cudaMalloc %ld cudaFree %ld", rt_alloc, rt_free);
    say("driver cuMemAlloc_v2 %ld cuMemFree_v2 %ld", drv_alloc, drv_free);
    say("failures %ld", failures);
    fprintf(stderr, "elapsed %.3f s, %.0f pairs/s\n", secs, (double)(n * pairs) / secs);
    return 0;
}

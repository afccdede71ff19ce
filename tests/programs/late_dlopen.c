// link: cudart
/* late_dlopen LIB|-: allocates through the runtime and the driver, then dlopen()s LIB (the
 * interposer, RTLD_NOW | RTLD_GLOBAL; "-" loads nothing), then frees what it allocated before the
 * load and allocates more: through the runtime's PLT entries, through LIB's own exports (the
 * hooks, called directly), and through the driver via cuGetProcAddress, both with the resolver
 * fetched before the load and with one fetched from LIB after it. Every return code goes to
 * stdout as free text (none of this is an `ev` line: a library loaded this late records what it
 * can, not everything), so a run with LIB and a run with "-" must print the same. Whether LIB
 * loaded goes to stderr. Exit status 0, or 3 when dlopen failed. */
#include "common.h"

typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_free)(CUdeviceptr);
typedef cudaError_t (*PFN_cudaMalloc)(void **, size_t);
typedef cudaError_t (*PFN_cudaFree)(void *);

#define MIB (1u << 20)

int main(int argc, char **argv) {
    setup();
    if (argc != 2)
        return 2;
    const char *lib = argv[1];

    /* Before the load. */
    void *a = NULL, *b = NULL, *t = NULL;
    say("before: cudaMalloc a %d", cudaMalloc(&a, MIB));
    say("before: cudaMalloc b %d", cudaMalloc(&b, 2 * MIB));
    say("before: cudaMalloc t %d", cudaMalloc(&t, 4096));
    say("before: cudaFree t %d", cudaFree(t));
    drv_open();
    PFN_alloc memAlloc = (PFN_alloc)drv_sym("cuMemAlloc", 12000, 0);
    PFN_free memFree = (PFN_free)drv_sym("cuMemFree", 12000, 0);
    if (!memAlloc || !memFree)
        return 1;
    CUdeviceptr d = 0, e = 0;
    say("before: cuMemAlloc d %d", memAlloc(&d, 3 * MIB));
    say("before: cuMemAlloc e %d", memAlloc(&e, 4 * MIB));

    /* The load. */
    void *h = NULL;
    if (strcmp(lib, "-") != 0) {
        h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            fprintf(stderr, "late_dlopen: dlopen %s: %s\n", lib, dlerror());
            return 3;
        }
        fprintf(stderr, "late_dlopen: loaded %s\n", lib);
    }
    /* LIB's exports when loaded, else the runtime's and the driver's own: the same calls. */
    void *rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!rt || !drv)
        return 1;
    PFN_cudaMalloc lateMalloc = (PFN_cudaMalloc)dlsym(h ? h : rt, "cudaMalloc");
    PFN_cudaFree lateFree = (PFN_cudaFree)dlsym(h ? h : rt, "cudaFree");
    PFN_cuGetProcAddress_v2 lateGpa =
        (PFN_cuGetProcAddress_v2)dlsym(h ? h : drv, "cuGetProcAddress_v2");
    say("after: found cudaMalloc %d cudaFree %d cuGetProcAddress_v2 %d", lateMalloc != NULL,
        lateFree != NULL, lateGpa != NULL);
    if (!lateMalloc || !lateFree || !lateGpa)
        return 1;

    /* The runtime: memory from before the load, freed through the hook and through the PLT; the
     * stand-in hands the latest freed address that fits straight back, so getting `a` again
     * shows that its free really happened. */
    say("after: hook cudaFree a %d", lateFree(a));
    void *a2 = NULL;
    int rc = lateMalloc(&a2, MIB);
    say("after: hook cudaMalloc a2 %d reuses a %d", rc, rc == 0 && a2 == a);
    say("after: cudaFree b %d", cudaFree(b));
    void *b2 = NULL;
    rc = cudaMalloc(&b2, 2 * MIB);
    say("after: cudaMalloc b2 %d reuses b %d", rc, rc == 0 && b2 == b);
    say("after: hook cudaFree b2 %d", lateFree(b2));
    say("after: cudaFree a2 %d", cudaFree(a2));
    void *c = NULL;
    rc = lateMalloc(&c, 8192);
    say("after: hook cudaMalloc c %d", rc);
    say("after: hook cudaFree c %d", lateFree(c));
    /* A double free is refused the same way, loaded or not. */
    say("after: hook cudaFree c again %d", lateFree(c));

    /* The driver: the resolver from before the load, and one from after it. */
    void *p = NULL;
    CUdriverProcAddressQueryResult st = 99;
    rc = lateGpa("cuMemAlloc", &p, 12000, 0, &st);
    say("after: cuGetProcAddress(cuMemAlloc) %d status %d found %d", rc, st, p != NULL);
    PFN_alloc lateAlloc = (PFN_alloc)p;
    p = NULL;
    rc = lateGpa("cuMemFree", &p, 12000, 0, &st);
    say("after: cuGetProcAddress(cuMemFree) %d status %d found %d", rc, st, p != NULL);
    PFN_free lateMemFree = (PFN_free)p;
    if (!lateAlloc || !lateMemFree)
        return 1;
    say("after: late cuMemFree d %d", lateMemFree(d));
    CUdeviceptr d2 = 0;
    rc = lateAlloc(&d2, 3 * MIB);
    say("after: late cuMemAlloc d2 %d reuses d %d", rc, rc == 0 && d2 == d);
    say("after: early cuMemFree e %d", memFree(e));
    CUdeviceptr e2 = 0;
    rc = memAlloc(&e2, 4 * MIB);
    say("after: early cuMemAlloc e2 %d reuses e %d", rc, rc == 0 && e2 == e);
    say("after: early cuMemFree d2 %d", memFree(d2));
    say("after: late cuMemFree e2 %d", lateMemFree(e2));
    say("after: late cuMemFree e2 again %d", lateMemFree(e2));
    return 0;
}

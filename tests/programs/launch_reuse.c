// link: cudart
/* A kernel handle reused for another kernel, as a driver does when a module is unloaded and
 * another loaded (XLA's autotuning): kernel reuse_four (4 parameters of 8 bytes) is launched
 * with a freed pointer as parameter 2, then becomes reuse_one (1 parameter of 8 bytes) under
 * the same CUfunction, and is launched with a parameter array of exactly one element that ends
 * a page followed by an inaccessible one, whose value (8 bytes, a pointer into a second freed
 * allocation) also ends such a page: reading a parameter with the old kernel's layout would
 * crash the process. A last launch passes the first freed pointer through the new layout. In
 * isolate mode the launch check may report the freed pointers, under each kernel's own name;
 * it must not read past the new kernel's parameters. */
#include "common.h"

#include <sys/mman.h>

typedef CUresult (*PFN_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
typedef CUfunction (*PFN_register)(const char *, standin_kernel_fn, unsigned, const size_t *,
                                   const size_t *);
typedef CUfunction (*PFN_reregister)(CUfunction, const char *, standin_kernel_fn, unsigned,
                                     const size_t *, const size_t *);
typedef unsigned long (*PFN_count)(void);
typedef CUresult (*PFN_load)(CUmodule *, const void *);
typedef CUresult (*PFN_unload)(CUmodule);

static int four_runs;
static uint64_t four_saw[4];
static int one_runs;
static uint64_t one_saw[4];

static void k_four(void **params) {
    if (four_runs == 0)
        for (int i = 0; i < 4; i++)
            four_saw[i] = *(uint64_t *)params[i];
    four_runs++;
}

static void k_one(void **params) {
    if (one_runs < 4)
        one_saw[one_runs] = *(uint64_t *)params[0];
    one_runs++;
}

/* n bytes that end a readable, writable page followed by a PROT_NONE one. */
static void *at_page_end(size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED || mprotect(m + page, (size_t)page, PROT_NONE) != 0)
        return NULL;
    return m + page - n;
}

int main(void) {
    setup();
    int rc = cudaFree(NULL);
    ev("cudaFree", rc, "ptr=0");
    void *drv = standin_driver();
    PFN_register reg = (PFN_register)dlsym(drv, "standin_register_kernel");
    PFN_reregister rereg = (PFN_reregister)dlsym(drv, "standin_reregister_kernel");
    PFN_count info_calls = (PFN_count)dlsym(drv, "standin_param_info_calls");
    PFN_count query_errors = (PFN_count)dlsym(drv, "standin_kernel_query_errors");
    if (!reg || !rereg || !info_calls || !query_errors)
        return 1;
    PFN_launch launch = (PFN_launch)rt_entry("cuLaunchKernel", cudaEnableDefault);
    PFN_load load = (PFN_load)rt_entry("cuModuleLoadData", cudaEnableDefault);
    PFN_unload unload = (PFN_unload)rt_entry("cuModuleUnload", cudaEnableDefault);
    CUmodule mod = NULL;
    if (!load || !unload || load(&mod, "the kernels' module") != CUDA_SUCCESS)
        return 1;

    size_t off4[] = {0, 8, 16, 24}, sz4[] = {8, 8, 8, 8};
    CUfunction k = reg("reuse_four", k_four, 4, off4, sz4);
    say("registered %d", k != NULL);
    if (!k)
        return 1;

    void *A = NULL, *B = NULL;
    rc = cudaMalloc(&A, 1 << 20);
    ev("cudaMalloc", rc, "size=1048576 ptr=%s", AP(rc, U64(A), "A"));
    rc = cudaMalloc(&B, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(B), "B"));
    rc = cudaFree(A);
    ev("cudaFree", rc, "ptr=@A");

    /* the old kernel: a live pointer, an integer, the freed A (parameter 2), an integer */
    CUdeviceptr live = U64(B), freed = U64(A);
    unsigned long long n = 0x123456789abcull, m = 7;
    void *params4[] = {&live, &n, &freed, &m};
    rc = launch(k, 1, 1, 1, 32, 1, 1, 0, NULL, params4, NULL);
    say("cuLaunchKernel reuse_four %d", rc);
    say("cudaDeviceSynchronize %d", cudaDeviceSynchronize());
    say("reuse_four runs %d saw (live, n, freed, m) %d", four_runs,
        four_saw[0] == live && four_saw[1] == n && four_saw[2] == freed && four_saw[3] == m);

    /* its module unloaded: B (its scratch) freed, and the handle now another kernel's */
    rc = cudaFree(B);
    ev("cudaFree", rc, "ptr=@B");
    say("cuModuleUnload %d", unload(mod));
    size_t off1[] = {0}, sz1[] = {8};
    CUfunction k2 = rereg(k, "reuse_one", k_one, 1, off1, sz1);
    say("reregistered same handle %d", k2 == k);
    if (k2 != k)
        return 1;

    /* one parameter, nothing readable after it; its value ends a page too */
    void **guarded = at_page_end(sizeof(void *));
    uint64_t *value = at_page_end(sizeof(uint64_t));
    say("guard pages %d", guarded && value);
    if (!guarded || !value)
        return 1;
    *value = U64(B);
    guarded[0] = value;
    rc = launch(k, 1, 1, 1, 32, 1, 1, 0, NULL, guarded, NULL);
    say("cuLaunchKernel reuse_one (guarded, freed B) %d", rc);

    /* the freed A again, through the new layout */
    CUdeviceptr freed2 = U64(A);
    void *params1[] = {&freed2};
    rc = launch(k, 1, 1, 1, 32, 1, 1, 0, NULL, params1, NULL);
    say("cuLaunchKernel reuse_one (freed A) %d", rc);
    /* and once more: no unload since, so the layout is used as it is */
    rc = launch(k, 1, 1, 1, 32, 1, 1, 0, NULL, params1, NULL);
    say("cuLaunchKernel reuse_one (freed A, again) %d", rc);
    say("cudaDeviceSynchronize %d", cudaDeviceSynchronize());
    say("reuse_one runs %d saw B %d saw A %d", one_runs, one_saw[0] == U64(B),
        one_saw[1] == freed2);
    say("reuse_four runs after %d", four_runs);
    fprintf(stderr, "standin_param_info_calls %lu\n", info_calls());
    fprintf(stderr, "standin_kernel_query_errors %lu\n", query_errors());
    say("done");
    return 0;
}

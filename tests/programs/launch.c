// link: cudart
/* Kernel launches whose parameters hold a freed pointer, a live one and a plain integer, by
 * every launch entry point; a 32-byte struct passed by value with pointers at offsets 8 and
 * 24; the same kernel 100 times. Launches are never events; in isolate mode the launch check
 * may report the freed pointer, and must ask for the parameter layout once per kernel. */
#include "common.h"

typedef CUresult (*PFN_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*PFN_launchEx)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*PFN_launchCoop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, CUstream, void **);
typedef CUfunction (*PFN_register)(const char *, standin_kernel_fn, unsigned, const size_t *,
                                   const size_t *);
typedef CUfunction (*PFN_register_as)(int, const char *, standin_kernel_fn, unsigned,
                                      const size_t *, const size_t *);
typedef unsigned long (*PFN_count)(void);

static PFN_register_as reg_as;
static int kernel_kind;

static CUfunction reg_kind(const char *name, standin_kernel_fn fn, unsigned n,
                           const size_t *offsets, const size_t *sizes) {
    return reg_as(kernel_kind, name, fn, n, offsets, sizes);
}

struct by_value {
    uint64_t x;   /* offset 0 */
    CUdeviceptr p1; /* offset 8 */
    uint64_t y;   /* offset 16 */
    CUdeviceptr p2; /* offset 24 */
};
_Static_assert(sizeof(struct by_value) == 32, "32-byte struct");

#define MAX_RUNS 256
static struct {
    CUdeviceptr a, b;
    unsigned long long n;
} ptr_runs[MAX_RUNS];
static int n_ptr_runs;
static struct by_value struct_runs[16];
static CUdeviceptr struct_first[16];
static int n_struct_runs;

static void k_ptrs(void **params) {
    if (n_ptr_runs < MAX_RUNS) {
        ptr_runs[n_ptr_runs].a = *(CUdeviceptr *)params[0];
        ptr_runs[n_ptr_runs].b = *(CUdeviceptr *)params[1];
        ptr_runs[n_ptr_runs].n = *(unsigned long long *)params[2];
    }
    n_ptr_runs++;
    /* only the live pointer is ever written through */
    CUdeviceptr live = *(CUdeviceptr *)params[1];
    ((volatile unsigned *)(uintptr_t)live)[0] += 1;
}

static void k_struct(void **params) {
    if (n_struct_runs < 16) {
        struct_first[n_struct_runs] = *(CUdeviceptr *)params[0];
        memcpy(&struct_runs[n_struct_runs], params[1], sizeof(struct by_value));
    }
    n_struct_runs++;
}

int main(void) {
    setup();
    int rc = cudaFree(NULL);
    ev("cudaFree", rc, "ptr=0");
    void *drv = standin_driver();
    /* LAUNCH_KIND=1: every kernel a library's CUkernel (what the CUDA 12+ runtime launches)
     * instead of a module's function. */
    const char *kind_env = getenv("LAUNCH_KIND");
    kernel_kind = kind_env ? atoi(kind_env) : 0;
    reg_as = (PFN_register_as)dlsym(drv, "standin_register_kernel_as");
    PFN_register reg = reg_as ? reg_kind : NULL;
    PFN_count info_calls = (PFN_count)dlsym(drv, "standin_param_info_calls");
    PFN_count query_errors = (PFN_count)dlsym(drv, "standin_kernel_query_errors");
    if (!reg || !info_calls || !query_errors)
        return 1;
    PFN_launch launch = (PFN_launch)rt_entry("cuLaunchKernel", cudaEnableDefault);
    PFN_launch launchPt = (PFN_launch)rt_entry("cuLaunchKernel", cudaEnablePerThreadDefaultStream);
    PFN_launchEx launchEx = (PFN_launchEx)rt_entry("cuLaunchKernelEx", cudaEnableDefault);
    PFN_launchCoop launchCoop = (PFN_launchCoop)rt_entry("cuLaunchCooperativeKernel", cudaEnableDefault);

    /* One kernel per launch path: the launch check reports a stale pointer once per kernel
     * and allocation, so each path gets its own report. */
    size_t off3[] = {0, 8, 16}, sz3[] = {8, 8, 8};
    CUfunction kp = reg("kp_launch", k_ptrs, 3, off3, sz3);
    CUfunction kp_pt = reg("kp_ptsz", k_ptrs, 3, off3, sz3);
    CUfunction kp_ex = reg("kp_ex", k_ptrs, 3, off3, sz3);
    CUfunction kp_coop = reg("kp_coop", k_ptrs, 3, off3, sz3);
    CUfunction kp_rt = reg("kp_rt", k_ptrs, 3, off3, sz3);
    size_t off2[] = {0, 8}, sz2[] = {8, 32};
    CUfunction ks = reg("ks_p1", k_struct, 2, off2, sz2);
    CUfunction ks2 = reg("ks_p2", k_struct, 2, off2, sz2);
    say("registered %d", kp && kp_pt && kp_ex && kp_coop && kp_rt && ks && ks2);

    void *A = NULL, *B = NULL;
    rc = cudaMalloc(&A, 1 << 20);
    ev("cudaMalloc", rc, "size=1048576 ptr=%s", AP(rc, U64(A), "A"));
    rc = cudaMalloc(&B, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(B), "B"));
    rc = cudaMemset(B, 0, 4096);
    say("cudaMemset %d", rc);
    rc = cudaFree(A);
    ev("cudaFree", rc, "ptr=@A");

    cudaStream_t s = NULL;
    say("cudaStreamCreate %d", cudaStreamCreate(&s));
    CUdeviceptr freed = U64(A), live = U64(B);
    unsigned long long n = 0x123456789abcull;
    void *params[] = {&freed, &live, &n};

    rc = launch(kp, 1, 1, 1, 32, 1, 1, 0, (CUstream)s, params, NULL);
    say("cuLaunchKernel %d", rc);
    rc = launchPt(kp_pt, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    say("cuLaunchKernel_ptsz %d", rc);
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = (CUstream)s;
    rc = launchEx(&cfg, kp_ex, params, NULL);
    say("cuLaunchKernelEx %d", rc);
    rc = launchCoop(kp_coop, 1, 1, 1, 32, 1, 1, 0, (CUstream)s, params);
    say("cuLaunchCooperativeKernel %d", rc);
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    rc = cudaLaunchKernel((const void *)kp_rt, grid, block, params, 0, s);
    say("cudaLaunchKernel %d", rc);

    struct by_value sv = {1, U64(A), 2, live};
    void *sparams[] = {&live, &sv};
    rc = launch(ks, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, sparams, NULL);
    say("cuLaunchKernel struct(p1 freed) %d", rc);
    struct by_value sv2 = {3, live, 4, U64(A) + 4096};
    void *sparams2[] = {&live, &sv2};
    rc = launch(ks2, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, sparams2, NULL);
    say("cuLaunchKernel struct(p2 freed) %d", rc);

    say("before sync: ptr runs %d struct runs %d", n_ptr_runs, n_struct_runs);
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    say("cudaDeviceSynchronize %d", cudaDeviceSynchronize());
    int ok = 1;
    for (int i = 0; i < n_ptr_runs && i < MAX_RUNS; i++)
        ok &= ptr_runs[i].a == freed && ptr_runs[i].b == live && ptr_runs[i].n == n;
    say("ptr runs %d all saw (freed, live, n) %d", n_ptr_runs, ok);
    say("struct runs %d", n_struct_runs);
    for (int i = 0; i < n_struct_runs && i < 16; i++)
        say("  struct %d: first==live %d x=%llu p1==A %d p1==live %d y=%llu p2==A+4096 %d "
            "p2==live %d",
            i, struct_first[i] == live, (unsigned long long)struct_runs[i].x,
            struct_runs[i].p1 == U64(A), struct_runs[i].p1 == live,
            (unsigned long long)struct_runs[i].y, struct_runs[i].p2 == U64(A) + 4096,
            struct_runs[i].p2 == live);

    /* the same kernel, 100 times, live pointers only */
    void *lparams[] = {&live, &live, &n};
    int fails = 0;
    for (int i = 0; i < 100; i++)
        fails += launch(kp, 1, 1, 1, 32, 1, 1, 0, (CUstream)s, lparams, NULL) != 0;
    int synced = cudaStreamSynchronize(s);
    say("100 launches failures %d sync %d runs %d", fails, synced, n_ptr_runs);
    unsigned counter = 0;
    rc = cudaMemcpy(&counter, B, sizeof counter, cudaMemcpyDeviceToHost);
    say("live counter %d %u", rc, counter);
    fprintf(stderr, "standin_param_info_calls %lu\n", info_calls());
    fprintf(stderr, "standin_kernel_query_errors %lu\n", query_errors());
    say("standin_param_info_calls %lu", info_calls());

    rc = cudaFree(B);
    ev("cudaFree", rc, "ptr=@B");
    say("cudaStreamDestroy %d", cudaStreamDestroy(s));
    say("done");
    return 0;
}

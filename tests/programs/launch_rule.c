// link: cudart
/* The launch check's evidence rule (docs/isolation.md), one kernel per case, each launched once
 * after A (1 MiB) was freed, A's words placed as real kernels carry them:
 *
 *   k_divider      one 320-byte struct by value (PyTorch's OffsetCalculator): words inside A
 *                  at bytes 16 and 312 that are not its start (integer dividers, packed pairs)
 *                                                      -> a suspect (stale value), no finding
 *   k_struct_base  one 64-byte struct whose word at byte 24 is exactly A (PyTorch's unused
 *                  CatArrInputTensorMetadata slots)    -> a suspect
 *   k_lib_ptr      a library kernel (CUkernel: only cuKernelGet* answer) with one 8-byte
 *                  parameter, A + 16 (PyTorch's StoreWithCast<1> reads so) -> a suspect
 *   k_packed       (pointer, 32-byte struct) through a packed buffer (CU_LAUNCH_PARAM_BUFFER_*):
 *                  exactly A at byte 0 (the pointer) and A + 0x40 at byte 16 (inside the struct)
 *                                                      -> a stale launch and a suspect
 *   k_nolayout     no layout from any query, a packed buffer: A + 8 at byte 0, exactly A at
 *                  byte 8                              -> a suspect (one a kernel and allocation)
 *   k_nolayout_p   no layout, a kernelParams array     -> not readable: counted, not checked
 *   k_ex           a library kernel by cuLaunchKernelEx, pointer exactly A -> a stale launch,
 *                  named k_ex
 *
 * The kernels do nothing: the same output with and without the library. */
#include "common.h"

typedef CUresult (*PFN_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*PFN_launchEx)(const CUlaunchConfig *, CUfunction, void **, void **);

static void k_nothing(void **params) { (void)params; }

int main(void) {
    setup();
    PFN_launch launch = (PFN_launch)rt_entry("cuLaunchKernel", cudaEnableDefault);
    PFN_launchEx launchEx = (PFN_launchEx)rt_entry("cuLaunchKernelEx", cudaEnableDefault);
    size_t s320[] = {320}, s64[] = {64}, s8[] = {8}, o_packed[] = {0, 8}, s_packed[] = {8, 32};
    CUfunction kd = standin_register_kernel_as(0, "k_divider", k_nothing, 1, NULL, s320);
    CUfunction kb = standin_register_kernel_as(0, "k_struct_base", k_nothing, 1, NULL, s64);
    CUfunction kl = standin_register_kernel_as(1, "k_lib_ptr", k_nothing, 1, NULL, s8);
    CUfunction kp = standin_register_kernel_as(0, "k_packed", k_nothing, 2, o_packed, s_packed);
    size_t s88[] = {8, 8};
    CUfunction kn = standin_register_kernel_as(2, "k_nolayout", k_nothing, 2, NULL, s88);
    CUfunction knp = standin_register_kernel_as(2, "k_nolayout_p", k_nothing, 1, NULL, s8);
    CUfunction kx = standin_register_kernel_as(1, "k_ex", k_nothing, 1, NULL, s8);
    say("registered %d", kd && kb && kl && kp && kn && knp && kx && launch && launchEx);

    void *A = NULL;
    int rc = cudaMalloc(&A, 1 << 20);
    ev("cudaMalloc", rc, "size=1048576 ptr=%s", AP(rc, U64(A), "A"));
    rc = cudaFree(A);
    ev("cudaFree", rc, "ptr=@A");
    uint64_t a = U64(A);

    uint64_t divider[40] = {0};
    divider[0] = 11;            /* a divisor */
    divider[2] = a + 0x1a3;     /* byte 16: inside A, not its start */
    divider[39] = a + 0x500;    /* byte 312 */
    void *pd[] = {divider};
    say("k_divider %d", launch(kd, 1, 1, 1, 1, 1, 1, 0, NULL, pd, NULL));

    uint64_t base[8] = {1, 2, 3, a, 5, 6, 7, 8}; /* byte 24: exactly A */
    void *pb[] = {base};
    say("k_struct_base %d", launch(kb, 1, 1, 1, 1, 1, 1, 0, NULL, pb, NULL));

    uint64_t lp = a + 16;
    void *pl[] = {&lp};
    say("k_lib_ptr %d", launch(kl, 1, 1, 1, 1, 1, 1, 0, NULL, pl, NULL));

    uint64_t packed[5] = {a, 0, a + 0x40, 0, 0};
    size_t packed_size = sizeof packed;
    void *xp[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                  &packed_size, CU_LAUNCH_PARAM_END};
    say("k_packed %d", launch(kp, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, xp));

    uint64_t nolayout[2] = {a + 8, a};
    size_t nolayout_size = sizeof nolayout;
    void *xn[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, nolayout, CU_LAUNCH_PARAM_BUFFER_SIZE,
                  &nolayout_size, CU_LAUNCH_PARAM_END};
    say("k_nolayout %d", launch(kn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, xn));

    void *pnp[] = {&a};
    say("k_nolayout_p %d", launch(knp, 1, 1, 1, 1, 1, 1, 0, NULL, pnp, NULL));

    uint64_t xptr = a;
    void *px[] = {&xptr};
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    say("k_ex %d", launchEx(&cfg, kx, px, NULL));

    say("cudaDeviceSynchronize %d", cudaDeviceSynchronize());
    /* Failed kernel queries (each a line in a real driver's CUDA_LOG_FILE): on stderr, since
     * the plain run makes none. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    unsigned long (*errors)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_kernel_query_errors") : NULL;
    fprintf(stderr, "standin_kernel_query_errors %lu\n", errors ? errors() : 0ul);
    say("done");
    return 0;
}

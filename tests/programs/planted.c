// link: cudart
/* Planted stale writes, for the detection table of isolation's tiers (tests/tests/tiers.rs):
 *
 *   planted SEED TRIALS [BIGTRIALS]
 *
 * For each write size of SIZES, TRIALS blocks (BIGTRIALS for the writes of 1 MiB and more,
 * TRIALS when not given), one after another on one stream: cudaMallocAsync of the block,
 * cudaFreeAsync, then cudaMemsetAsync of the size's bytes (0x5A, never the poison) at an offset
 * drawn uniformly from [0, block - size] (xorshift64 seeded with SEED), through the freed
 * pointer. The block is twice the write, at least 1 MiB: larger than what the fast tier checks
 * whole. Then three sizes again in 64 KiB blocks (checked whole in both tiers). One line per
 * trial, in the order of the frees (the test matches the k-th line with the trace's k-th
 * cudaFreeAsync):
 *
 *   trial K SIZE BLOCK OFFSET
 *
 * The write lands in quarantined memory (isolation holds the block back); without isolation it
 * lands in whatever got the address, which is why no test runs this without the preload.
 */
#include "common.h"

static uint64_t g_rng;

static uint64_t next(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static int bad;
static unsigned long trial;
/* The library's regions (absent without it): each trial is a region "trial", the steps the
 * summary's floor is given per. */
static int (*region_push)(const char *);
static int (*region_pop)(void);

static void plant(cudaStream_t s, size_t size, size_t block) {
    void *p = NULL;
    if (region_push)
        region_push("trial");
    bad += cudaMallocAsync(&p, block, s) != 0;
    bad += cudaFreeAsync(p, s) != 0;
    size_t off = (size_t)(next() % (uint64_t)(block - size + 1));
    bad += cudaMemsetAsync((char *)p + off, 0x5A, size, s) != 0;
    printf("trial %lu %zu %zu %zu\n", trial++, size, block, off);
    if (region_pop)
        region_pop();
}

int main(int argc, char **argv) {
    setup();
    if (argc < 3) {
        say("usage: planted SEED TRIALS [BIGTRIALS]");
        return 2;
    }
    g_rng = strtoull(argv[1], NULL, 0) | 1;
    int trials = atoi(argv[2]);
    int big = argc > 3 ? atoi(argv[3]) : trials;
    region_push = (int (*)(const char *))dlsym(RTLD_DEFAULT, "isolate_region_push");
    region_pop = (int (*)(void))dlsym(RTLD_DEFAULT, "isolate_region_pop");
    static const size_t SIZES[] = {4, 64, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20};
    cudaStream_t s = NULL;
    bad += cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++) {
        size_t size = SIZES[i], block = 2 * size < (1u << 20) ? (1u << 20) : 2 * size;
        int n = size >= (1u << 20) ? big : trials;
        for (int k = 0; k < n; k++)
            plant(s, size, block);
    }
    static const size_t SMALL[] = {4, 64, 1 << 10};
    for (size_t i = 0; i < sizeof SMALL / sizeof SMALL[0]; i++)
        for (int k = 0; k < trials; k++)
            plant(s, SMALL[i], 64 << 10);
    bad += cudaStreamSynchronize(s) != 0;
    say("planted calls failed %d", bad);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    unsigned long (*fills)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_sparse_fills") : NULL;
    unsigned long (*checks)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_sparse_checks") : NULL;
    say("sparse_fills %lu", fills ? fills() : 0UL);
    say("sparse_checks %lu", checks ? checks() : 0UL);
    return bad != 0;
}

// Issue 33 on real CUDA: the cases of "the host process first, round two" that need a GPU, each a
// mode of one program so that tests/gpu/host_round2.sh can run it without the library, then under
// the library as it was and as it is, and compare.
//
//   nvcc -O2 -o host_round2 tests/gpu/host_round2.cu -lpthread
//   host_round2 fresh-free THREADS          item 2: each of THREADS fresh threads frees, as its
//                                           first CUDA call, one buffer the main thread allocated
//                                           (half cudaFree, half cudaFreeAsync on stream 0)
//   host_round2 near-limit ROUNDS [MIB [THREADS]]
//                                           item 3: all but ~1 GiB of the device held by one
//                                           cudaMalloc, then on each of THREADS threads (1), on a
//                                           stream of its own, ROUNDS x (cudaMallocAsync MIB (768),
//                                           memset, cudaFreeAsync, synchronize)
//   host_round2 probe                       item 9: a 4 MiB buffer freed, cudaMalloc(1 << 40) (fails),
//                                           4 MiB again (must not get the freed address), a stale
//                                           write through the freed pointer, synchronize
//   host_round2 end-exec|end-term|end-abort|end-hang
//                                           item 8: a stale write through a freed 4 MiB buffer,
//                                           synchronize, then the process ends by execv("/bin/true"),
//                                           raise(SIGTERM), abort(), or sleeping until `timeout`
//                                           kills it
//
// Prints one line `case=... ok=N failed=M [detail]` on stdout; exits 0 when every CUDA call
// returned what it returns without the library (the caller compares), 1 otherwise, 2 on bad use.
#include <cuda_runtime.h>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

__global__ void stale_fill(uint32_t *p, size_t n, uint32_t v) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

static int fresh_free(int threads) {
    std::vector<void *> bufs(threads, nullptr);
    for (int i = 0; i < threads; i++) {
        if (cudaMalloc(&bufs[i], 1 << 20) != cudaSuccess) {
            std::printf("case=fresh-free ok=0 failed=%d detail=setup-malloc\n", threads);
            return 1;
        }
    }
    cudaDeviceSynchronize();
    std::atomic<int> ok{0}, failed{0};
    std::atomic<int> first_err{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; i++) {
        // A fresh thread each: its first CUDA call is the free.
        ts.emplace_back([&, i] {
            cudaError_t e = (i % 2) ? cudaFreeAsync(bufs[i], 0) : cudaFree(bufs[i]);
            if (e == cudaSuccess) {
                ok++;
            } else {
                int z = 0;
                first_err.compare_exchange_strong(z, (int)e);
                failed++;
            }
        });
    }
    for (auto &t : ts) t.join();
    cudaDeviceSynchronize();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    std::printf("case=fresh-free ok=%d failed=%d first_error=%d\n", ok.load(), failed.load(),
                first_err.load());
    return failed.load() ? 1 : 0;
}

static int near_limit(int rounds, int chunk_mib, int threads) {
    size_t free_b = 0, total_b = 0;
    cudaFree(0);
    cudaMemGetInfo(&free_b, &total_b);
    const size_t keep_free = (size_t)1 << 30;  // 1 GiB left to the loop
    // Each thread's chunk: all of them fit at once, and two rounds of them do not.
    const size_t chunk = (size_t)chunk_mib << 20;
    void *hog = nullptr;
    if (free_b <= keep_free + (256u << 20) ||
        cudaMalloc(&hog, free_b - keep_free) != cudaSuccess) {
        std::printf("case=near-limit ok=0 failed=%d detail=setup\n", rounds * threads);
        return 1;
    }
    std::atomic<int> ok{0}, failed{0}, first_err{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++) {
        ts.emplace_back([&] {
            cudaStream_t s;
            cudaStreamCreate(&s);
            for (int r = 0; r < rounds; r++) {
                void *p = nullptr;
                cudaError_t e = cudaMallocAsync(&p, chunk, s);
                if (e == cudaSuccess) e = cudaMemsetAsync(p, 1, chunk, s);
                if (e == cudaSuccess) e = cudaFreeAsync(p, s);
                if (e == cudaSuccess) e = cudaStreamSynchronize(s);
                if (e == cudaSuccess) {
                    ok++;
                } else {
                    int z = 0;
                    first_err.compare_exchange_strong(z, (int)e);
                    failed++;
                    cudaGetLastError();
                }
            }
            cudaStreamDestroy(s);
        });
    }
    for (auto &t : ts) t.join();
    cudaFree(hog);
    std::printf("case=near-limit ok=%d failed=%d first_error=%d chunk_mib=%d threads=%d\n",
                ok.load(), failed.load(), first_err.load(), chunk_mib, threads);
    return failed.load() ? 1 : 0;
}

static uint32_t *freed_buffer(size_t bytes) {
    uint32_t *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    cudaMemset(p, 0, bytes);
    cudaFree(p);
    return p;
}

static void stale_write(uint32_t *p) {
    // 4,096 bytes from offset 4,096 of the freed buffer.
    stale_fill<<<4, 256>>>(p + 1024, 1024, 0x2a2a2a2au);
    cudaDeviceSynchronize();
}

static int probe() {
    const size_t mib4 = (size_t)4 << 20;
    uint32_t *old = freed_buffer(mib4);
    if (!old) {
        std::printf("case=probe ok=0 failed=1 detail=setup\n");
        return 1;
    }
    void *huge = nullptr;
    cudaError_t e_huge = cudaMalloc(&huge, (size_t)1 << 40);
    cudaGetLastError();
    void *again = nullptr;
    cudaError_t e_again = cudaMalloc(&again, mib4);
    cudaMemset(again, 0, mib4);
    cudaDeviceSynchronize();
    stale_write(old);
    // The new buffer reads back as it was written unless the stale write landed in it.
    std::vector<uint32_t> host(mib4 / 4);
    cudaMemcpy(host.data(), again, mib4, cudaMemcpyDeviceToHost);
    size_t corrupted = 0;
    for (uint32_t v : host) corrupted += v != 0;
    std::printf("case=probe ok=%d failed=%d huge_rc=%d same_address=%d corrupted_words=%zu\n",
                e_again == cudaSuccess, e_again != cudaSuccess, (int)e_huge, again == (void *)old,
                corrupted);
    cudaFree(again);
    return e_again == cudaSuccess ? 0 : 1;
}

static int end_case(const char *how) {
    uint32_t *old = freed_buffer((size_t)4 << 20);
    if (!old) {
        std::printf("case=%s ok=0 failed=1 detail=setup\n", how);
        return 1;
    }
    stale_write(old);
    std::printf("case=%s ok=1 failed=0\n", how);
    std::fflush(stdout);
    if (!std::strcmp(how, "end-exec")) {
        execl("/bin/true", "true", (char *)nullptr);
        return 1;
    }
    if (!std::strcmp(how, "end-term")) raise(SIGTERM);
    if (!std::strcmp(how, "end-abort")) abort();
    if (!std::strcmp(how, "end-hang")) {
        for (;;) pause();
    }
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: host_round2 fresh-free N | near-limit N | probe | end-*\n");
        return 2;
    }
    const char *c = argv[1];
    int n = argc > 2 ? std::atoi(argv[2]) : 0;
    if (!std::strcmp(c, "fresh-free")) return fresh_free(n ? n : 64);
    if (!std::strcmp(c, "near-limit"))
        return near_limit(n ? n : 200, argc > 3 ? std::atoi(argv[3]) : 768,
                          argc > 4 ? std::atoi(argv[4]) : 1);
    if (!std::strcmp(c, "probe")) return probe();
    if (!std::strncmp(c, "end-", 4)) return end_case(c);
    std::fprintf(stderr, "host_round2: unknown case %s\n", c);
    return 2;
}

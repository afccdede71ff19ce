// Many threads allocating and freeing at once, for tests/gpu/trust.sh: does the trace of a busy
// multithreaded program stay consistent (no invalid frees, no lost allocations)?
//
//   nvcc -O2 -o threads_many tests/gpu/threads_many.cu
//   threads_many [THREADS] [PAIRS_PER_THREAD] [MEMSET]    (defaults 16 5000 1: 80,000 pairs)
//   threads_many doublefree
//
// Default mode: THREADS threads start together (a spin barrier) and each runs PAIRS_PER_THREAD
// times: cudaMalloc of a size drawn from a small set (256 B .. 4 MiB, a per-thread xorshift seeded
// with the thread index, so every run asks for the same sizes), then (MEMSET=1) a cudaMemset of
// its first 256 bytes, then cudaFree. Every return code is checked; the first 20 failures are
// printed on stderr. Prints
//
//   threads=N pairs=M failures=K          (M = all pairs, N x PAIRS_PER_THREAD)
//   seconds=S
//
// and exits 1 when K > 0 (2 on bad arguments or when CUDA cannot start).
//
// `doublefree`: cudaMalloc(p, 1 MiB); cudaFree(p); cudaFree(p) once, and prints
//
//   doublefree ptr=0x... first_free=0 second_free=E (cudaErrorName) last_error=L
//
// where E is the second free's code (non-zero expected). Exits 0 (1 when the allocation or the
// first free fails).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

static const size_t kSizes[] = {
    256,
    3000,                  // not a multiple of 256
    4096,
    65536,
    1u << 20,
    (2u << 20) + 512,      // just over 2 MiB
    3u << 20,
    4u << 20,
};
static const int kNumSizes = sizeof kSizes / sizeof kSizes[0];

static std::atomic<long> g_failures{0};
static std::atomic<int> g_ready{0};

static void report(int thread, int pair, const char *what, size_t size, cudaError_t err) {
    long n = ++g_failures;
    if (n <= 20) {
        std::fprintf(stderr, "thread %d pair %d: %s (size %zu) failed: %d %s\n", thread, pair, what,
                     size, (int)err, cudaGetErrorName(err));
    }
}

static void worker(int t, int threads, int pairs, int memset_on) {
    uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
    cudaError_t err = cudaSetDevice(0);
    if (err != cudaSuccess) report(t, -1, "cudaSetDevice", 0, err);
    ++g_ready;
    while (g_ready.load() < threads) std::this_thread::yield();
    for (int i = 0; i < pairs; ++i) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const size_t size = kSizes[state % kNumSizes];
        void *p = nullptr;
        err = cudaMalloc(&p, size);
        if (err != cudaSuccess) {
            report(t, i, "cudaMalloc", size, err);
            continue;
        }
        if (p == nullptr) {
            report(t, i, "cudaMalloc returned NULL", size, cudaSuccess);
            continue;
        }
        if (memset_on) {
            err = cudaMemset(p, (i + t) & 0xff, 256);
            if (err != cudaSuccess) report(t, i, "cudaMemset", size, err);
        }
        err = cudaFree(p);
        if (err != cudaSuccess) report(t, i, "cudaFree", size, err);
    }
}

static int doublefree() {
    void *p = nullptr;
    cudaError_t err = cudaMalloc(&p, 1u << 20);
    if (err != cudaSuccess) {
        std::printf("doublefree cudaMalloc failed: %d %s\n", (int)err, cudaGetErrorName(err));
        return 1;
    }
    cudaError_t first = cudaFree(p);
    if (first != cudaSuccess) {
        std::printf("doublefree ptr=%p first_free=%d (%s): the first free failed\n", p, (int)first,
                    cudaGetErrorName(first));
        return 1;
    }
    cudaError_t second = cudaFree(p);
    cudaError_t last = cudaGetLastError();
    std::printf("doublefree ptr=%p first_free=%d second_free=%d (%s) last_error=%d\n", p,
                (int)first, (int)second, cudaGetErrorName(second), (int)last);
    return 0;
}

static int parse(const char *s, int dflt, int min) {
    if (s == nullptr) return dflt;
    char *end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < min || v > 100000000) return -1;
    return (int)v;
}

int main(int argc, char **argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc > 1 && std::strcmp(argv[1], "doublefree") == 0) return doublefree();
    const int threads = parse(argc > 1 ? argv[1] : nullptr, 16, 1);
    const int pairs = parse(argc > 2 ? argv[2] : nullptr, 5000, 0);
    const int memset_on = parse(argc > 3 ? argv[3] : nullptr, 1, 0);
    if (threads < 0 || pairs < 0 || memset_on < 0) {
        std::fprintf(stderr, "usage: %s [THREADS] [PAIRS_PER_THREAD] [MEMSET 0|1] | doublefree\n",
                     argv[0]);
        return 2;
    }
    // Start CUDA (the primary context) before the threads, so they race on allocations only.
    cudaError_t err = cudaSetDevice(0);
    if (err == cudaSuccess) err = cudaFree(nullptr);
    if (err != cudaSuccess) {
        std::fprintf(stderr, "CUDA does not start: %d %s\n", (int)err, cudaGetErrorName(err));
        return 2;
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t, threads, pairs, memset_on);
    for (auto &th : pool) th.join();
    err = cudaDeviceSynchronize();
    if (err != cudaSuccess) report(-1, -1, "cudaDeviceSynchronize", 0, err);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const long failures = g_failures.load();
    std::printf("threads=%d pairs=%ld failures=%ld\n", threads, (long)threads * pairs, failures);
    std::printf("seconds=%.2f\n", seconds);
    return failures == 0 ? 0 : 1;
}

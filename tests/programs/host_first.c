// link: cudart
/* The host process first (issue 33): programs that behaved differently under the library.
 * Every scenario prints only what must be the same with and without the library; timings go
 * to stderr.
 *
 *   fresh_free N      N allocations made on the main thread, each freed with cudaFree by a
 *                     thread of its own whose first CUDA call that is
 *   fresh_free_async N  the same with cudaFreeAsync on the legacy stream
 *   fresh_alloc N     N threads, each whose first CUDA call is a cudaMalloc of 4 KiB (no
 *                     context current when it is made), then a memset and a cudaFree
 *   fresh_alloc_async N  the same with cudaMallocAsync and cudaFreeAsync on the legacy stream
 *   async_limit N [T] N rounds of cudaMallocAsync of 48 MiB (run with a 64 MiB device), a
 *                     memset, cudaFreeAsync and a synchronize; with T threads, each that many
 *                     rounds of 48/T MiB
 *   probe             1 MiB allocated and freed, a cudaMalloc(1 << 40) memory probe that fails,
 *                     a write through the freed pointer, another allocation
 *   small_stack KIB   a thread with a KIB KiB stack allocates, launches a kernel and frees
 *   nofile LIMIT      the soft descriptor limit set to LIMIT, one allocation, then files opened
 *                     until none can be: prints how many
 *   stderr_reuse      a stale write, stderr closed and a file opened in its place
 *                     (`program.txt`, in the working directory), the program's own line
 *                     written there, then the quarantine checked (over its budget)
 *   samebase          libsamebase_a.so loaded, its function allocating and freeing, unloaded;
 *                     then libsamebase_b.so (the same code) loaded, at the same address, and
 *                     the same; where each was loaded goes to stderr
 *   trim N SIZE       N allocations of SIZE bytes, all freed (the quarantine trims when over
 *                     budget); the longest single free goes to stderr
 *   fdsize            the descriptor table's size (FDSize, /proc/self/status) before the
 *                     first CUDA call and after it (the library's trace opens then), to stderr;
 *                     one allocation made and freed
 *   destroyed_stream  an allocation made on a stream, the stream destroyed, then the
 *                     allocation freed on it (as PyTorch's stream-ordered backend frees a tensor
 *                     on a CuPy stream the program destroyed first): the free's error printed;
 *                     then a stream created (which may get the old handle) and a second
 *                     allocation made and freed on it
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include "common.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------- fresh_free, fresh_alloc */

/* Runs fn(args[i]) (args NULL: fn(NULL)) on a thread of its own for each of n, eight at a
 * time; returns how many returned non-zero, the last of them in *last. */
static int in_fresh_threads(int n, void *(*fn)(void *), void **args, int *last) {
    int bad = 0;
    for (int i = 0; i < n; i += 8) {
        pthread_t t[8];
        int m = n - i < 8 ? n - i : 8;
        for (int j = 0; j < m; j++)
            pthread_create(&t[j], NULL, fn, args ? args[i + j] : NULL);
        for (int j = 0; j < m; j++) {
            void *rc = NULL;
            pthread_join(t[j], &rc);
            if (rc) {
                bad++;
                *last = (int)(intptr_t)rc;
            }
        }
    }
    return bad;
}

/* What was asked of the driver with no context current (a line each in a real driver's
 * CUDA_LOG_FILE): on stderr, the plain run asks nothing. */
static void say_ctx_errors(void) {
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    unsigned long (*errors)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_ctx_device_errors") : NULL;
    fprintf(stderr, "standin_ctx_device_errors %lu\n", errors ? errors() : 9999ul);
}

static int use_async;

static void *free_first(void *p) {
    int rc = use_async ? cudaFreeAsync(p, 0) : cudaFree(p);
    return (void *)(intptr_t)rc;
}

static int fresh_free(int n, int async) {
    use_async = async;
    void **p = calloc(n, sizeof *p);
    int failed = 0;
    for (int i = 0; i < n; i++)
        if (cudaMalloc(&p[i], 4096) != 0)
            failed++;
    say("allocated %d, failed %d", n, failed);
    int last = 0;
    int bad = in_fresh_threads(n, free_first, p, &last);
    say("%s from a fresh thread: %d of %d failed (last code %d)",
        async ? "cudaFreeAsync" : "cudaFree", bad, n, last);
    say("synchronize %d", cudaDeviceSynchronize());
    /* The memory really was given back: all of it can be allocated again. */
    size_t fr = 0, total = 0;
    cudaMemGetInfo(&fr, &total);
    void *big = NULL;
    int rc = cudaMalloc(&big, fr);
    say("all free memory allocated again %d", rc);
    if (rc == 0)
        cudaFree(big);
    free(p);
    say_ctx_errors();
    return 0;
}

static void *alloc_first(void *unused) {
    (void)unused;
    void *p = NULL;
    int rc = use_async ? cudaMallocAsync(&p, 4096, 0) : cudaMalloc(&p, 4096);
    if (rc)
        return (void *)(intptr_t)rc;
    if ((rc = cudaMemset(p, 0x5a, 4096)))
        return (void *)(intptr_t)rc;
    rc = use_async ? cudaFreeAsync(p, 0) : cudaFree(p);
    return (void *)(intptr_t)rc;
}

static int fresh_alloc(int n, int async) {
    use_async = async;
    int last = 0;
    int bad = in_fresh_threads(n, alloc_first, NULL, &last);
    say("%s, a memset and a free from a fresh thread: %d of %d failed (last code %d)",
        async ? "cudaMallocAsync" : "cudaMalloc", bad, n, last);
    say("synchronize %d", cudaDeviceSynchronize());
    say_ctx_errors();
    return 0;
}

/* ------------------------------------------------------------------------ async_limit */

struct limit_args {
    int rounds;
    size_t size;
    int ok, fail;
};

static void *async_rounds(void *arg) {
    struct limit_args *a = arg;
    for (int i = 0; i < a->rounds; i++) {
        void *p = NULL;
        int rc = cudaMallocAsync(&p, a->size, 0);
        if (rc != 0) {
            a->fail++;
            cudaGetLastError();
            continue;
        }
        cudaMemsetAsync(p, 1, a->size, 0);
        cudaFreeAsync(p, 0);
        cudaStreamSynchronize(0);
        a->ok++;
    }
    return NULL;
}

/* THREADS threads (1 by default) share the 48 MiB, each ROUNDS rounds. */
static int async_limit(int rounds, int threads) {
    if (threads < 1 || threads > 16)
        return 2;
    struct limit_args a[16];
    pthread_t t[16];
    for (int i = 0; i < threads; i++) {
        a[i] = (struct limit_args){rounds, ((size_t)48 << 20) / threads, 0, 0};
        pthread_create(&t[i], NULL, async_rounds, &a[i]);
    }
    int ok = 0, fail = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        ok += a[i].ok;
        fail += a[i].fail;
    }
    say("cudaMallocAsync of 48 MiB in %d: %d ok, %d failed", threads, ok, fail);
    return 0;
}

/* ------------------------------------------------------------------------------ probe */

static int probe(void) {
    void *a = NULL, *big = NULL, *b = NULL;
    say("cudaMalloc 1 MiB %d", cudaMalloc(&a, 1 << 20));
    say("cudaFree %d", cudaFree(a));
    say("cudaMalloc(1 << 40) %d", cudaMalloc(&big, (size_t)1 << 40));
    say("cudaGetLastError %d", cudaGetLastError());
    /* A stale write: the stand-in's device memory is host memory. */
    ((volatile char *)a)[100] = 0x5a;
    say("cudaMalloc 1 MiB %d", cudaMalloc(&b, 1 << 20));
    say("cudaFree %d", cudaFree(b));
    return 0;
}

/* ------------------------------------------------------------------------ small_stack */

typedef CUresult (*PFN_launch_s)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);
static PFN_launch_s g_launch;
static CUfunction g_small_kernel;

static void k_small(void **params) { (void)params; }

/* Allocates, launches a kernel naming the allocation (isolate mode's launch check, its cache
 * of layouts made at the thread's first launch), frees. */
static void *small(void *arg) {
    (void)arg;
    void *p = NULL;
    int a = cudaMalloc(&p, 4096);
    uint64_t word = U64(p);
    void *params[] = {&word};
    int l = g_launch(g_small_kernel, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    int f = cudaFree(p);
    int s = cudaStreamSynchronize(0);
    return (void *)(intptr_t)(a * 1000000 + l * 10000 + f * 100 + s);
}

static int small_stack(int kib) {
    void *p = NULL;
    say("main thread: cudaMalloc %d cudaFree %d", cudaMalloc(&p, 4096), cudaFree(p));
    size_t s8[] = {8};
    g_small_kernel = standin_register_kernel("k_small", k_small, 1, NULL, s8);
    g_launch = (PFN_launch_s)rt_entry("cuLaunchKernel", cudaEnableDefault);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    int rc = pthread_attr_setstacksize(&attr, (size_t)kib << 10);
    say("stack size %d KiB: %d", kib, rc);
    pthread_t t;
    if (pthread_create(&t, &attr, small, NULL) != 0)
        return 1;
    void *r = NULL;
    pthread_join(t, &r);
    say("small-stack thread: %d", (int)(intptr_t)r);
    return 0;
}

/* ----------------------------------------------------------------------------- nofile */

static int nofile(int limit) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = limit;
    say("setrlimit %d", setrlimit(RLIMIT_NOFILE, &rl));
    void *p = NULL;
    say("cudaMalloc %d", cudaMalloc(&p, 4096));
    int fds[4096], n = 0, err = 0;
    while (n < 4096) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0) {
            err = errno;
            break;
        }
        fds[n++] = fd;
    }
    say("opened %d files, then errno %d", n, err);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    say("cudaFree %d", cudaFree(p));
    getrlimit(RLIMIT_NOFILE, &rl);
    say("soft limit %d", (int)rl.rlim_cur);
    return 0;
}

/* ----------------------------------------------------------------------------- fdsize */

/* FDSize of /proc/self/status: how many descriptors the process's table holds now. */
static int fd_table_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "FDSize: %d", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

static int fdsize(void) {
    fprintf(stderr, "fdsize_before %d\n", fd_table_size());
    void *p = NULL;
    double t0 = now_s();
    say("cudaMalloc %d", cudaMalloc(&p, 4096));
    fprintf(stderr, "first_call_ms %.3f\n", (now_s() - t0) * 1e3);
    fprintf(stderr, "fdsize_after %d\n", fd_table_size());
    say("cudaFree %d", cudaFree(p));
    return 0;
}

/* ----------------------------------------------------------------------- stderr_reuse */

static int stderr_reuse(void) {
    void *a = NULL, *b = NULL;
    say("cudaMalloc %d", cudaMalloc(&a, 1 << 20));
    say("cudaFree %d", cudaFree(a));
    ((volatile char *)a)[7] = 0x11;
    close(2);
    int fd = open("program.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    say("program's file at %d", fd);
    const char line[] = "the program's own line\n";
    say("write %d", (int)write(fd, line, sizeof line - 1));
    /* Over the quarantine budget (run with ISOLATE_QUARANTINE=1MiB): the stale allocation is
     * checked now, while the file is open at 2. */
    say("cudaMalloc %d", cudaMalloc(&b, 2 << 20));
    say("cudaFree %d", cudaFree(b));
    say("close %d", close(fd));
    return 0;
}

/* ------------------------------------------------------------------------------- trim */

static int trim(int n, size_t size) {
    void **p = calloc(n, sizeof *p);
    int failed = 0;
    for (int i = 0; i < n; i++)
        failed += cudaMalloc(&p[i], size) != 0;
    double longest = 0, total = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        bad += cudaFree(p[i]) != 0;
        double dt = now_s() - t0;
        total += dt;
        if (dt > longest)
            longest = dt;
    }
    say("%d allocations of %zu bytes: %d failed; %d frees failed", n, size, failed, bad);
    fprintf(stderr, "longest free: %.6f s, all frees: %.3f s\n", longest, total);
    free(p);
    return 0;
}

/* --------------------------------------------------------------------------- samebase */

static int samebase(void) {
    char dir[4096], path[4200];
    exe_dir(dir, sizeof dir);
    const char *names[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/libsamebase_%s.so", dir, names[i]);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            return 1;
        int (*f)(const char *) = (int (*)(const char *))dlsym(h, "samebase_alloc");
        say("%s: samebase_alloc %d", names[i], f ? f(names[i]) : -1);
        fprintf(stderr, "%s at %p\n", names[i], (void *)f);
        say("%s: dlclose %d", names[i], dlclose(h));
    }
    return 0;
}

/* -------------------------------------------------------------------- destroyed_stream */

static int destroyed_stream(void) {
    cudaStream_t s = NULL;
    say("cudaStreamCreate %d", cudaStreamCreate(&s));
    void *p = NULL;
    int rc = cudaMallocAsync(&p, 1 << 20, s);
    ev("cudaMallocAsync", rc, "size=%d ptr=%s", 1 << 20, AP(rc, U64(p), "p"));
    say("cudaMemsetAsync %d", cudaMemsetAsync(p, 0x42, 1 << 20, s));
    say("cudaStreamDestroy %d", cudaStreamDestroy(s));
    say("cudaFreeAsync on the destroyed stream %d", cudaFreeAsync(p, s) != cudaSuccess);
    (void)cudaGetLastError();
    say("cudaFree %d", cudaFree(p));
    cudaStream_t t = NULL;
    say("cudaStreamCreate %d", cudaStreamCreate(&t));
    void *q = NULL;
    rc = cudaMallocAsync(&q, 1 << 20, t);
    ev("cudaMallocAsync", rc, "size=%d ptr=%s", 1 << 20, AP(rc, U64(q), "q"));
    say("cudaFreeAsync on the new stream %d", cudaFreeAsync(q, t));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(t));
    say("cudaStreamDestroy %d", cudaStreamDestroy(t));
    return 0;
}

int main(int argc, char **argv) {
    setup();
    if (argc < 2)
        return 2;
    const char *s = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 0;
    if (!strcmp(s, "fresh_free"))
        return fresh_free(n, 0);
    if (!strcmp(s, "fresh_free_async"))
        return fresh_free(n, 1);
    if (!strcmp(s, "fresh_alloc"))
        return fresh_alloc(n, 0);
    if (!strcmp(s, "fresh_alloc_async"))
        return fresh_alloc(n, 1);
    if (!strcmp(s, "async_limit"))
        return async_limit(n, argc > 3 ? atoi(argv[3]) : 1);
    if (!strcmp(s, "probe"))
        return probe();
    if (!strcmp(s, "small_stack"))
        return small_stack(n);
    if (!strcmp(s, "nofile"))
        return nofile(n);
    if (!strcmp(s, "stderr_reuse"))
        return stderr_reuse();
    if (!strcmp(s, "samebase"))
        return samebase();
    if (!strcmp(s, "destroyed_stream"))
        return destroyed_stream();
    if (!strcmp(s, "fdsize"))
        return fdsize();
    if (!strcmp(s, "trim"))
        return trim(n, argc > 3 ? (size_t)atol(argv[3]) : 768);
    return 2;
}

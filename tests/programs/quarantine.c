// link: cudart cuda
/* What isolation does to freed memory, one scenario per run (tests/tests/isolation.rs):
 *
 *   quarantine reuse    free A, look at A's bytes, allocate the same size again
 *   quarantine stale    write through A after its free (24 bytes at 1000, 1 byte at 5000)
 *   quarantine oom      fill memory, free it, fill it again, then ask for more than there is
 *                       (runtime, then driver)
 *   quarantine budget   20 x 1 MiB allocated, all freed, then 16 more: where do they come from
 *   quarantine stream   a copy and a kernel read X on a stream, then cudaFreeAsync(X) on it
 *   quarantine double   double frees (runtime, stream-ordered, driver, a thread with no context)
 *   quarantine capture  stream-ordered frees on a stream capturing a CUDA graph (begun and
 *                       ended with cuStreamBeginCapture_v2 / cuStreamEndCapture): of memory
 *                       the capture allocated, and of memory from before it (refused); then
 *                       the same size again on that stream
 *   quarantine graph-memory  graph memory through cuStreamBeginCapture_v2: see graph_memory
 *   quarantine pool     the default pool's used-memory counters (what PyTorch's memory_allocated
 *                       reads on its stream-ordered backend) around stream-ordered frees
 *   quarantine async    4 threads, each on its own stream, 300 x cudaMallocAsync, a stream-
 *                       ordered write, cudaFreeAsync; thread 0 writes through a freed pointer
 *                       on its stream (8 bytes at offset 100) after the free
 *   quarantine late     stream A frees its allocation, then writes 8 bytes at offset 100 through
 *                       the freed pointer and frees nothing more; stream B's frees then push
 *                       the allocation out of quarantine (1 MiB): the check must see the write
 *   quarantine late-destroyed  the same, with stream A destroyed right after its stale write
 *   quarantine late-captured   the same, with stream A capturing a graph from right after its
 *                       stale write until after B's frees (cuStreamBeginCapture_v2 and
 *                       cuStreamEndCapture; the stand-in's capture makes no graph)
 *   quarantine late-captured-legacy  the same through CUDA 10.0's cuStreamBeginCapture (no mode)
 *   quarantine lazy     the deferred poisons and the launches after a free (see lazy_poisons):
 *                       stale writes by kernels handed the freed pointer plainly, inside a wide
 *                       struct, or only through a pointer table in device memory
 *   quarantine pressure another tenant holds most of the device (one block of 5/8 of it:
 *                       another process's share), then 400 x 4 MiB allocated, written and
 *                       freed stream-ordered: the least free memory the program saw after the
 *                       first 100
 *   quarantine launch-room  56 x 1 MiB allocated and freed stream-ordered, then the first launch
 *                       of a kernel (the stand-in's STANDIN_LAUNCH_ROOM: a first launch needs
 *                       that much free, as a lazily loaded module does): its result
 *   quarantine module-room  the first allocation leaves less free than a module needs (the
 *                       stand-in's STANDIN_LAUNCH_ROOM), so isolate's kernels cannot be loaded;
 *                       it is freed; a second later, 4 x 2 MiB allocated and freed (all
 *                       stream-ordered)
 *   quarantine module-early  a first allocation of 1 MiB, then the same first allocation, held
 *                       while the 4 x 2 MiB are allocated and freed at once, then both freed
 *   quarantine reset    8 x 1 MiB allocated, set and freed stream-ordered, cudaDeviceReset, the
 *                       same again, then a stale write of 16 bytes through the last one freed
 *   quarantine crowded  another tenant takes all but 4 MiB of the device and gives it back 60 ms
 *                       later (another process's quarantine giving way); meanwhile 16 MiB
 *                       are asked for: its result
 *   quarantine query-room  the same as launch-room, but the kernel's first use is an occupancy query
 *                       (cuOccupancyMaxActiveBlocksPerMultiprocessor, as PyTorch's softmax asks
 *                       before its first launch), then its launch: both results
 *   quarantine flush-race  thread A frees a block stream-ordered on its stream; thread B then
 *                       queues a set on its own stream (isolate queues A's deferred poison
 *                       there, slowly with the stand-in's STANDIN_SLOW_FILL_MS); meanwhile A
 *                       writes 8 bytes at offset 100 through the freed pointer on its stream
 *   quarantine stuck    a stream-ordered free, then the device hangs (the stand-in's
 *                       standin_device_stuck: nothing finishes any more) and the program exits;
 *                       an exit handler frees one more allocation after isolate's exit check
 *
 * Lines that print where memory came from or what freed memory holds (`b==a`, `... bytes:`,
 * `index`) differ between isolate mode and a plain run by design; every other line must not.
 */
#include <pthread.h>
#include <unistd.h>
#include <sys/wait.h>

#include "common.h"

#define MIB (1u << 20)

typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_free)(CUdeviceptr);
typedef CUresult (*PFN_freeAsync)(CUdeviceptr, CUstream);

/* What `n` bytes at `p` hold: "all 0xNN" or "mixed". Read directly: stand-in device memory is
 * host memory, and reading it goes through no CUDA call at all. */
static void bytes(const char *what, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t first_other = n;
    for (size_t i = 1; i < n; i++)
        if (b[i] != b[0]) {
            first_other = i;
            break;
        }
    if (first_other == n)
        say("%s bytes: all 0x%02x", what, b[0]);
    else
        say("%s bytes: mixed 0x%02x at 0, 0x%02x at %zu", what, b[0], b[first_other], first_other);
}

static void lasterr(void) {
    int e = cudaGetLastError();
    int again = cudaGetLastError();
    say("cudaGetLastError %d then %d", e, again);
}

static int reuse(void) {
    const size_t size = MIB;
    void *a = NULL, *b = NULL;
    int rc = cudaMalloc(&a, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(a), "a"));
    if (rc)
        return 1;
    say("cudaMemset %d", cudaMemset(a, 0x11, size));
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    bytes("a after free", a, size);
    rc = cudaMalloc(&b, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(b), "b"));
    say("b==a %d", b == a);
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");
    return 0;
}

static int stale(void) {
    const size_t size = 64 << 10;
    void *a = NULL, *b = NULL;
    int rc = cudaMalloc(&a, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(a), "a"));
    if (rc)
        return 1;
    say("cudaMemset a %d", cudaMemset(a, 0, size));
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    rc = cudaMalloc(&b, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(b), "b"));
    say("cudaMemset b %d", cudaMemset(b, 0, size));
    say("b==a %d", b == a);
    /* the stale writes: 24 bytes through the runtime, one byte straight through the pointer */
    say("cudaMemset through a %d", cudaMemset((char *)a + 1000, 0x33, 24));
    ((volatile unsigned char *)a)[5000] = 0x44;
    static unsigned char host[64 << 10];
    rc = cudaMemcpy(host, b, size, cudaMemcpyDeviceToHost);
    size_t changed = 0;
    for (size_t i = 0; i < size; i++)
        changed += host[i] != 0;
    say("cudaMemcpy %d", rc);
    say("b==a changed %zu", changed);
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");
    return 0;
}

#define MAXN 256

/* Fills memory with 1 MiB allocations, frees them, fills it again, asks for more than there is. */
static int oom(void) {
    static void *p[MAXN];
    static CUdeviceptr q[MAXN];
    char label[32];
    int rc, n = 0;
    for (;;) {
        if (n == MAXN)
            return 1;
        rc = cudaMalloc(&p[n], MIB);
        snprintf(label, sizeof label, "p%d", n);
        ev("cudaMalloc", rc, "size=%u ptr=%s", MIB, AP(rc, U64(p[n]), label));
        if (rc)
            break;
        n++;
    }
    say("runtime allocated %d then %d", n, rc);
    lasterr();
    for (int i = 0; i < n; i++) {
        rc = cudaFree(p[i]);
        ev("cudaFree", rc, "ptr=@p%d", i);
    }
    int again = 0;
    for (int i = 0; i < n; i++) {
        rc = cudaMalloc(&p[i], MIB);
        snprintf(label, sizeof label, "r%d", i);
        ev("cudaMalloc", rc, "size=%u ptr=%s", MIB, AP(rc, U64(p[i]), label));
        again += rc == 0;
    }
    say("runtime allocated again %d of %d", again, n);
    lasterr();
    for (int i = 0; i < n; i++) {
        rc = cudaFree(p[i]);
        ev("cudaFree", rc, "ptr=@r%d", i);
    }
    void *huge = NULL;
    size_t huge_size = (size_t)(n + 1) * MIB;
    rc = cudaMalloc(&huge, huge_size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", huge_size, AP(rc, U64(huge), "huge"));
    say("runtime more than there is %d", rc);
    lasterr();
    if (rc == 0) {
        rc = cudaFree(huge);
        ev("cudaFree", rc, "ptr=@huge");
    }

    drv_open();
    PFN_alloc memAlloc = (PFN_alloc)drv_sym("cuMemAlloc", 12000, 0);
    PFN_free memFree = (PFN_free)drv_sym("cuMemFree", 12000, 0);
    if (!memAlloc || !memFree)
        return 1;
    int m = 0;
    for (;;) {
        if (m == MAXN)
            return 1;
        rc = memAlloc(&q[m], MIB);
        snprintf(label, sizeof label, "q%d", m);
        ev("cuMemAlloc_v2", rc, "size=%u ptr=%s", MIB, AP(rc, q[m], label));
        if (rc)
            break;
        m++;
    }
    say("driver allocated %d then %d", m, rc);
    for (int i = 0; i < m; i++) {
        rc = memFree(q[i]);
        ev("cuMemFree_v2", rc, "ptr=@q%d", i);
    }
    again = 0;
    for (int i = 0; i < m; i++) {
        rc = memAlloc(&q[i], MIB);
        snprintf(label, sizeof label, "s%d", i);
        ev("cuMemAlloc_v2", rc, "size=%u ptr=%s", MIB, AP(rc, q[i], label));
        again += rc == 0;
    }
    say("driver allocated again %d of %d", again, m);
    for (int i = 0; i < m; i++) {
        rc = memFree(q[i]);
        ev("cuMemFree_v2", rc, "ptr=@s%d", i);
    }
    CUdeviceptr dhuge = 0;
    huge_size = (size_t)(m + 1) * MIB;
    rc = memAlloc(&dhuge, huge_size);
    ev("cuMemAlloc_v2", rc, "size=%zu ptr=%s", huge_size, AP(rc, dhuge, "dhuge"));
    say("driver more than there is %d", rc);
    return 0;
}

#define NB 20
#define NB_AGAIN 16

static int budget(void) {
    static void *p[NB];
    char label[32];
    int rc;
    for (int i = 0; i < NB; i++) {
        rc = cudaMalloc(&p[i], MIB);
        snprintf(label, sizeof label, "p%d", i);
        ev("cudaMalloc", rc, "size=%u ptr=%s", MIB, AP(rc, U64(p[i]), label));
        if (rc)
            return 1;
    }
    size_t free0 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    for (int i = 0; i < NB; i++) {
        rc = cudaFree(p[i]);
        ev("cudaFree", rc, "ptr=@p%d", i);
    }
    /* Isolate mode's keeper thread releases what went over the budget in the background: wait
     * (at most 5 s) until the device has NB_AGAIN of them back (at once without the library). */
    for (int k = 0; k < 500; k++) {
        size_t f = 0, t = 0;
        if (cudaMemGetInfo(&f, &t) || f >= free0 + (size_t)NB_AGAIN * MIB)
            break;
        usleep(10000);
    }
    /* Where the next allocations come from: the index of the freed allocation whose address
     * they got, or -1 for fresh memory. */
    void *again[NB_AGAIN];
    char names[NB_AGAIN][16];
    for (int j = 0; j < NB_AGAIN; j++) {
        again[j] = NULL;
        rc = cudaMalloc(&again[j], MIB);
        int index = -1;
        for (int i = 0; i < NB; i++)
            if (again[j] == p[i])
                index = i;
        /* a reused address is p's label, not one of its own */
        if (index >= 0)
            snprintf(names[j], sizeof names[j], "p%d", index);
        else
            snprintf(names[j], sizeof names[j], "a%d", j);
        ev("cudaMalloc", rc, "size=%u ptr=%s", MIB, AP(rc, U64(again[j]), names[j]));
        say("again %d index %d", j, index);
    }
    for (int j = 0; j < NB_AGAIN; j++) {
        rc = cudaFree(again[j]);
        ev("cudaFree", rc, "ptr=@%s", names[j]);
    }
    return 0;
}

#define NS 4096

static unsigned char kernel_saw[NS];
static int kernel_runs;

static void k_read(void **params) {
    const unsigned char *src = (const unsigned char *)(uintptr_t)(*(CUdeviceptr *)params[0]);
    memcpy(kernel_saw, src, NS);
    kernel_runs++;
}

static int all(const unsigned char *b, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != v)
            return 0;
    return 1;
}

static int stream(void) {
    cudaStream_t s = NULL;
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t off = 0, sz = 8;
    CUfunction k = standin_register_kernel("k_read", k_read, 1, &off, &sz);
    say("kernel %d", k != NULL);
    void *x = NULL, *y = NULL;
    int rc = cudaMalloc(&x, NS);
    ev("cudaMalloc", rc, "size=%d ptr=%s", NS, AP(rc, U64(x), "x"));
    rc = cudaMalloc(&y, NS);
    ev("cudaMalloc", rc, "size=%d ptr=%s", NS, AP(rc, U64(y), "y"));
    if (!x || !y || !k)
        return 1;
    say("cudaMemset x %d", cudaMemset(x, 0x42, NS));
    say("cudaMemset y %d", cudaMemset(y, 0, NS));
    /* readers of x, queued on s: a device-to-device copy into y and a kernel */
    say("cudaMemcpyAsync %d", cudaMemcpyAsync(y, x, NS, cudaMemcpyDeviceToDevice, s));
    CUdeviceptr xp = U64(x);
    void *params[] = {&xp};
    dim3 grid = {1, 1, 1}, block = {1, 1, 1};
    say("cudaLaunchKernel %d", cudaLaunchKernel((const void *)k, grid, block, params, 0, s));
    /* then x's free, on the same stream, before any of it ran */
    rc = cudaFreeAsync(x, s);
    ev("cudaFreeAsync", rc, "ptr=@x stream=%s", L(U64(s), "s"));
    say("before sync: kernel runs %d y[0] 0x%02x", kernel_runs, ((unsigned char *)y)[0]);
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    say("copy into y saw all 0x42 %d", all((const unsigned char *)y, NS, 0x42));
    say("kernel runs %d saw all 0x42 %d", kernel_runs, all(kernel_saw, NS, 0x42));
    bytes("x after sync", x, NS);
    rc = cudaFree(y);
    ev("cudaFree", rc, "ptr=@y");
    say("cudaStreamDestroy %d", cudaStreamDestroy(s));
    return 0;
}

static PFN_free g_memFree;
static CUdeviceptr g_freed;

static void *no_context(void *arg) {
    (void)arg;
    int rc = g_memFree(g_freed);
    ev("cuMemFree_v2", rc, "ptr=@d device=-1");
    return NULL;
}

static int double_free(void) {
    const size_t size = 4096;
    void *a = NULL, *b = NULL;
    int rc = cudaMalloc(&a, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(a), "a"));
    if (rc)
        return 1;
    say("cudaMemset %d", cudaMemset(a, 0x11, size));
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    say("cudaFree twice %d", rc);
    lasterr();
    /* the second free neither released A nor touched its bytes */
    bytes("a after double free", a, size);
    rc = cudaMalloc(&b, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(b), "b"));
    say("b==a %d", b == a);
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");

    cudaStream_t s = NULL;
    say("cudaStreamCreate %d", cudaStreamCreate(&s));
    void *c = NULL;
    rc = cudaMallocAsync(&c, size, s);
    ev("cudaMallocAsync", rc, "size=%zu stream=%s ptr=%s", size, L(U64(s), "s"), AP(rc, U64(c), "c"));
    rc = cudaFreeAsync(c, s);
    ev("cudaFreeAsync", rc, "ptr=@c stream=%s", L(U64(s), "s"));
    /* again before the stream ran the first, then after */
    rc = cudaFreeAsync(c, s);
    ev("cudaFreeAsync", rc, "ptr=@c stream=%s", L(U64(s), "s"));
    say("cudaFreeAsync twice, queued %d", rc);
    lasterr();
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    rc = cudaFreeAsync(c, s);
    ev("cudaFreeAsync", rc, "ptr=@c stream=%s", L(U64(s), "s"));
    say("cudaFreeAsync twice, ran %d", rc);
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    lasterr();

    drv_open();
    PFN_alloc memAlloc = (PFN_alloc)drv_sym("cuMemAlloc", 12000, 0);
    g_memFree = (PFN_free)drv_sym("cuMemFree", 12000, 0);
    PFN_freeAsync memFreeAsync = (PFN_freeAsync)drv_sym("cuMemFreeAsync", 12000, 0);
    if (!memAlloc || !g_memFree || !memFreeAsync)
        return 1;
    CUdeviceptr d = 0;
    rc = memAlloc(&d, size);
    ev("cuMemAlloc_v2", rc, "size=%zu ptr=%s", size, AP(rc, d, "d"));
    rc = g_memFree(d);
    ev("cuMemFree_v2", rc, "ptr=@d");
    rc = g_memFree(d);
    ev("cuMemFree_v2", rc, "ptr=@d");
    say("cuMemFree_v2 twice %d", rc);
    /* a third time, from a thread with no current context */
    g_freed = d;
    pthread_t t;
    pthread_create(&t, NULL, no_context, NULL);
    pthread_join(t, NULL);
    /* a runtime allocation freed by the driver's stream-ordered free, twice */
    rc = cudaMalloc(&a, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(a), "e"));
    rc = memFreeAsync(U64(a), (CUstream)s);
    ev("cuMemFreeAsync", rc, "ptr=@e stream=%s", L(U64(s), "s"));
    rc = memFreeAsync(U64(a), (CUstream)s);
    ev("cuMemFreeAsync", rc, "ptr=@e stream=%s", L(U64(s), "s"));
    say("cuMemFreeAsync twice %d", rc);
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    say("cudaStreamDestroy %d", cudaStreamDestroy(s));
    return 0;
}

typedef CUresult (*PFN_begin_capture)(CUstream, int);
typedef CUresult (*PFN_begin_capture_legacy)(CUstream);
typedef CUresult (*PFN_end_capture)(CUstream, void **);

/* A driver export, looked up in libcuda itself (NULL without it). */
static void *driver_fn(const char *name) {
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    return drv ? dlsym(drv, name) : NULL;
}

/* `n` stream-ordered allocations of 64 KiB on `s`, each freed at once: the calls that failed. */
static int churn(int n, cudaStream_t s) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        void *y = NULL;
        bad += cudaMallocAsync(&y, 64 << 10, s) != 0;
        bad += cudaFreeAsync(y, s) != 0;
    }
    return bad;
}

/* The stand-in's switch `fn` (NULL without it), then a non-blocking stream `s` with a 1 MiB
 * stream-ordered allocation `a` on it. */
static void *switch_and_stream(const char *fn, const char *what, cudaStream_t *s, void **a) {
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    void *f = drv ? dlsym(drv, fn) : NULL;
    say("stand-in %s switch %d", what, f != NULL);
    if (!f)
        return NULL;
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    say("cudaMallocAsync %d", cudaMallocAsync(a, MIB, *s));
    return f;
}

static int capture(void) {
    cudaStream_t s = NULL;
    void *a = NULL, *b = NULL, *c = NULL;
    /* Begun and ended through the driver's calls, as a program does (the library counts the
     * captures it sees begin, and asks a stream only while one may run). */
    PFN_begin_capture begin = (PFN_begin_capture)driver_fn("cuStreamBeginCapture_v2");
    PFN_end_capture end = (PFN_end_capture)driver_fn("cuStreamEndCapture");
    say("capture functions %d", begin && end);
    if (!begin || !end)
        return 1;
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    say("cudaMallocAsync %d", cudaMallocAsync(&a, MIB, s));
    say("capturing %d", begin((CUstream)s, 0));
    say("cudaMallocAsync %d", cudaMallocAsync(&c, MIB, s));
    say("cudaFreeAsync %d", cudaFreeAsync(c, s));
    /* A capture frees only what it allocated: the driver refuses memory from before it. */
    say("cudaFreeAsync of earlier memory refused %d", cudaFreeAsync(a, s) != cudaSuccess);
    (void)cudaGetLastError();
    void *graph = NULL;
    say("not capturing %d", end((CUstream)s, &graph));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    say("cudaMallocAsync %d", cudaMallocAsync(&b, MIB, s));
    say("b==c %d", c == b);
    say("cudaFreeAsync %d", cudaFreeAsync(b, s));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    return 0;
}

/* Graph memory through the driver's real capture calls (cuStreamBeginCapture_v2, as PyTorch's
 * CUDA graphs): with ISOLATE_REUSE=on, 64 KiB blocks freed before the capture are kept; the
 * capture allocates 64 KiB and frees it (legal: the graph frees what it allocated), allocates
 * another it does not free; after the capture that one is freed outside it, which the driver
 * refuses ("invalid argument": PyTorch's tests free a captured tensor whose graph never ran).
 * Prints each free's result; isolate mode must give the same. */
static int graph_memory(void) {
    PFN_begin_capture begin = (PFN_begin_capture)driver_fn("cuStreamBeginCapture_v2");
    PFN_end_capture end = (PFN_end_capture)driver_fn("cuStreamEndCapture");
    if (!begin || !end) {
        say("no capture functions");
        return 1;
    }
    cudaStream_t s = NULL;
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int bad = churn(64, s);
    say("before the capture: calls failed %d", bad);
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    void *c = NULL, *d = NULL;
    say("cuStreamBeginCapture_v2 %d", begin((CUstream)s, 0));
    say("cudaMallocAsync in the capture %d", cudaMallocAsync(&c, 64 << 10, s));
    say("cudaFreeAsync in the capture %d", cudaFreeAsync(c, s));
    say("cudaMallocAsync in the capture %d", cudaMallocAsync(&d, 64 << 10, s));
    say("cuStreamEndCapture %d", end((CUstream)s, NULL));
    say("cudaFreeAsync of graph memory after the capture refused %d",
        cudaFreeAsync(d, s) != cudaSuccess);
    (void)cudaGetLastError();
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    return bad != 0;
}

static void pool_used(cudaMemPool_t pool, const char *when) {
    cuuint64_t used = 0, high = 0, reserved = 0;
    int a = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    int b = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
    int c = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    say("%s: used %d %llu high %d %llu reserved %d %llu", when, a, (unsigned long long)used, b,
        (unsigned long long)high, c, (unsigned long long)reserved);
}

static int pool_stats(void) {
    cudaMemPool_t pool = NULL;
    int rc = cudaDeviceGetDefaultMemPool(&pool, 0);
    say("cudaDeviceGetDefaultMemPool %d", rc);
    if (rc)
        return 1;
    void *p[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        say("cudaMallocAsync %d", cudaMallocAsync(&p[i], MIB, 0));
    pool_used(pool, "3 live");
    say("cudaFreeAsync %d", cudaFreeAsync(p[0], 0));
    say("cudaFreeAsync %d", cudaFreeAsync(p[1], 0));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(0));
    pool_used(pool, "1 live");
    cuuint64_t zero = 0;
    say("reset high %d", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    pool_used(pool, "after reset");
    say("cudaFreeAsync %d", cudaFreeAsync(p[2], 0));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(0));
    pool_used(pool, "0 live");
    return 0;
}

#define ASYNC_THREADS 4
#define ASYNC_ROUNDS 300

static pthread_barrier_t g_mid[2];

static void *async_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    cudaStream_t s = NULL;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))
        return (void *)1;
    intptr_t bad = 0;
    void *held = NULL;
    for (int i = 0; i < ASYNC_ROUNDS; i++) {
        size_t size = 16384 + (size_t)((i * 7 + id * 3) % 16) * 4096;
        void *p = NULL;
        if (cudaMallocAsync(&p, size, s))
            bad++; /* and on to the barriers all the same: the others wait there */
        else
            bad += cudaMemsetAsync(p, 0x5A, size, s) != 0;
        int mid = i == ASYNC_ROUNDS / 2, next = i == ASYNC_ROUNDS / 2 + 1;
        /* Halfway, the other threads hold their frees until thread 0 has freed, written through
         * the freed pointer, and freed once more. On a loaded machine their frees could
         * otherwise push its allocation out of quarantine between its free and the write:
         * a write after the allocation left quarantine is not isolation's to see. */
        if (mid)
            pthread_barrier_wait(&g_mid[0]);
        if (next && id != 0) {
            pthread_barrier_wait(&g_mid[1]);
            bad += cudaFreeAsync(held, s) != 0;
        }
        if (mid && id != 0)
            held = p;
        else
            bad += cudaFreeAsync(p, s) != 0;
        if (mid && id == 0) {
            /* A stale write, queued on the stream after the free. */
            bad += cudaMemsetAsync((char *)p + 100, 0x01, 8, s) != 0;
        }
        if (next && id == 0)
            pthread_barrier_wait(&g_mid[1]);
    }
    bad += cudaStreamSynchronize(s) != 0;
    bad += cudaStreamDestroy(s) != 0;
    return (void *)bad;
}

static pthread_barrier_t g_race;
static cudaStream_t g_race_b;
static void *g_race_y;

/* Thread B of flush_race: its set comes right after A's free. */
static void *flush_race_b(void *arg) {
    (void)arg;
    intptr_t bad = cudaSetDevice(0) != 0; /* the context current before the set's hook runs */
    pthread_barrier_wait(&g_race);
    bad += cudaMemsetAsync(g_race_y, 0x22, 4096, g_race_b) != 0;
    bad += cudaStreamSynchronize(g_race_b) != 0;
    return (void *)bad;
}

static int flush_race(void) {
    cudaStream_t a = NULL;
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&g_race_b, cudaStreamNonBlocking));
    void *x = NULL;
    say("cudaMallocAsync %d", cudaMallocAsync(&x, 64 << 10, a));
    say("cudaMallocAsync %d", cudaMallocAsync(&g_race_y, 4096, g_race_b));
    say("cudaMemsetAsync %d", cudaMemsetAsync(x, 0x11, 64 << 10, a));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(a));
    pthread_barrier_init(&g_race, NULL, 2);
    pthread_t t;
    pthread_create(&t, NULL, flush_race_b, NULL);
    say("cudaFreeAsync %d", cudaFreeAsync(x, a));
    pthread_barrier_wait(&g_race);
    /* B is now queuing A's poison (slowly, under STANDIN_SLOW_FILL_MS): the stale write must
     * still run after it on stream a. */
    usleep(50 * 1000);
    say("cudaMemsetAsync %d", cudaMemsetAsync((char *)x + 100, 0x01, 8, a));
    void *r = NULL;
    pthread_join(t, &r);
    say("thread b calls failed %ld", (long)(intptr_t)r);
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(a));
    say("cudaFreeAsync %d", cudaFreeAsync(g_race_y, g_race_b));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(g_race_b));
    return r != NULL;
}

enum late_how { LATE, LATE_DESTROYED, LATE_CAPTURED, LATE_CAPTURED_LEGACY };

static int late(enum late_how how) {
    int destroy = how == LATE_DESTROYED;
    PFN_begin_capture begin = (PFN_begin_capture)driver_fn("cuStreamBeginCapture_v2");
    PFN_begin_capture_legacy begin0 = (PFN_begin_capture_legacy)driver_fn("cuStreamBeginCapture");
    PFN_end_capture end = (PFN_end_capture)driver_fn("cuStreamEndCapture");
    int captured = how == LATE_CAPTURED || how == LATE_CAPTURED_LEGACY;
    if (captured && (!begin || !begin0 || !end)) {
        say("no capture functions");
        return 1;
    }
    cudaStream_t a = NULL, b = NULL;
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    void *x = NULL;
    say("cudaMallocAsync %d", cudaMallocAsync(&x, 64 << 10, a));
    say("cudaFreeAsync %d", cudaFreeAsync(x, a));
    /* The stale write, queued after the stream's last free. */
    say("cudaMemsetAsync %d", cudaMemsetAsync((char *)x + 100, 0x01, 8, a));
    if (destroy)
        say("cudaStreamDestroy %d", cudaStreamDestroy(a));
    if (how == LATE_CAPTURED)
        say("cuStreamBeginCapture_v2 %d", begin((CUstream)a, 0));
    if (how == LATE_CAPTURED_LEGACY)
        say("cuStreamBeginCapture %d", begin0((CUstream)a));
    int bad = churn(32, b);
    say("stream b calls failed %d", bad);
    if (captured)
        say("cuStreamEndCapture %d", end((CUstream)a, NULL));
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(b));
    if (!destroy)
        say("cudaStreamSynchronize %d", cudaStreamSynchronize(a));
    return bad != 0;
}

typedef void (*PFN_stuck)(void);

static void *g_late;
static cudaStream_t g_late_stream;

/* Runs after isolate's exit check (registered before it, at the first free: exit handlers run
 * last first) and before the runtime's (registered at the first CUDA call), as a library's
 * static destructor freeing its memory would. */
static void late_free(void) { say("late cudaFreeAsync %d", cudaFreeAsync(g_late, g_late_stream)); }

static int stuck(void) {
    cudaStream_t s = NULL;
    void *a = NULL;
    PFN_stuck hang = (PFN_stuck)switch_and_stream("standin_device_stuck", "stuck", &s, &a);
    if (!hang)
        return 1;
    atexit(late_free);
    g_late_stream = s;
    say("cudaMallocAsync %d", cudaMallocAsync(&g_late, MIB, s));
    say("cudaFreeAsync %d", cudaFreeAsync(a, s));
    hang();
    return 0;
}

static int async_release(void) {
    pthread_t t[ASYNC_THREADS];
    pthread_barrier_init(&g_mid[0], NULL, ASYNC_THREADS);
    pthread_barrier_init(&g_mid[1], NULL, ASYNC_THREADS);
    for (int i = 0; i < ASYNC_THREADS; i++)
        pthread_create(&t[i], NULL, async_worker, (void *)(intptr_t)i);
    intptr_t bad = 0;
    for (int i = 0; i < ASYNC_THREADS; i++) {
        void *r = NULL;
        pthread_join(t[i], &r);
        bad += (intptr_t)r;
    }
    say("async calls failed %ld", (long)bad);
    /* Which check kernel the release ran (the stand-in counts its 128-bit one). */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    unsigned long (*runs16)(void) = drv ? (unsigned long (*)(void))dlsym(drv, "standin_verify16_runs") : NULL;
    say("verify16_runs %lu", runs16 ? runs16() : 0UL);
    return bad != 0;
}

/* Runs of stream-ordered frees, each followed by a stale write through a different kind of
 * stream work: a set, an asynchronous copy, a synchronous copy (the legacy stream), and a set
 * on another stream that waits for an event recorded after the frees. Each run's poisons are
 * deferred to that work and queued by one launch before it, so every stale write lands after
 * its poison and is found. Prints the stand-in's count of multi-range poison launches. */
static int batch(void) {
    cudaStream_t s = NULL, t = NULL;
    int bad = 0;
    bad += cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    bad += cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking) != 0;
    void *p[8];
    for (int i = 0; i < 8; i++) {
        bad += cudaMallocAsync(&p[i], 64 << 10, s) != 0;
        bad += cudaMemsetAsync(p[i], 0x5A, 64 << 10, s) != 0;
    }
    unsigned char src[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    for (int i = 0; i < 4; i++)
        bad += cudaFreeAsync(p[i], s) != 0;
    bad += cudaMemsetAsync((char *)p[0] + 100, 0x01, 8, s) != 0;
    for (int i = 4; i < 6; i++)
        bad += cudaFreeAsync(p[i], s) != 0;
    bad += cudaMemcpyAsync((char *)p[4] + 200, src, 8, cudaMemcpyHostToDevice, s) != 0;
    bad += cudaFreeAsync(p[6], s) != 0;
    bad += cudaMemcpy((char *)p[6] + 300, src, 8, cudaMemcpyHostToDevice) != 0;
    bad += cudaFreeAsync(p[7], s) != 0;
    cudaEvent_t e = NULL;
    bad += cudaEventCreate(&e) != 0;
    bad += cudaEventRecord(e, s) != 0;
    bad += cudaStreamWaitEvent(t, e, 0) != 0;
    bad += cudaMemsetAsync((char *)p[7] + 400, 0x03, 8, t) != 0;
    bad += cudaStreamSynchronize(s) != 0;
    bad += cudaStreamSynchronize(t) != 0;
    say("batch calls failed %d", bad);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    unsigned long (*runs)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_poison_many_runs") : NULL;
    unsigned long (*ranges)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_poison_many_ranges") : NULL;
    unsigned long (*records)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_event_records") : NULL;
    say("poison_many_runs %lu", runs ? runs() : 0UL);
    say("poison_many_ranges %lu", ranges ? ranges() : 0UL);
    say("event_records %lu", records ? records() : 0UL);
    return bad != 0;
}

typedef CUresult (*PFN_launch_q)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);

/* k_write8(p): 8 bytes of 0x01 at p. */
static void k_write8(void **params) {
    uint64_t p = *(uint64_t *)params[0];
    if (standin_touch((CUdeviceptr)p, 8))
        memset((void *)(uintptr_t)p, 0x01, 8);
}

/* k_write_wide(96-byte struct): 8 bytes of 0x01 at the pointer in its word 5 (cuDNN's and
 * CUTLASS's kernels take their tensors so, in parameter blocks wider than 64 bytes). */
static void k_write_wide(void **params) {
    const uint64_t *w = (const uint64_t *)params[0];
    if (standin_touch((CUdeviceptr)w[5], 8))
        memset((void *)(uintptr_t)w[5], 0x01, 8);
}

/* k_write_table(t): 8 bytes of 0x01 at the pointer stored at device address t (a pointer table
 * in device memory: batched GEMMs, nested tensors). */
static void k_write_table(void **params) {
    uint64_t t = *(uint64_t *)params[0];
    if (!standin_touch((CUdeviceptr)t, 8))
        return;
    uint64_t p = *(const uint64_t *)(uintptr_t)t;
    if (standin_touch((CUdeviceptr)p, 8))
        memset((void *)(uintptr_t)p, 0x01, 8);
}

/* k_touch(p): reads nothing, writes nothing (a kernel of a live tensor). */
static void k_touch(void **params) { (void)params; }

/* Stream-ordered frees of 64 KiB blocks on stream s, each followed by kernels on s:
 *   A  freed, then k_write8(A + 100): a stale write by a kernel handed a pointer into A
 *   B  freed, then k_write_wide(struct with B + 200 in word 5)
 *   C  freed, then k_touch(L) three times (L live), then k_write8(C + 300)
 *   D0..D7  each freed, then k_touch(L)
 *   G  freed, then k_touch(A + 200): a word inside A, long since poisoned (a suspect), not in
 *      a block whose poison waits
 *   E  freed, then k_write_table(T), T a live block holding E + 400
 * then the stream synchronised. Every write lands after its block's free in stream order; where
 * it also lands after the poison, the check finds it. Prints the stand-in's count of multi-range
 * poison launches. */
static int lazy_poisons(void) {
    PFN_launch_q launch = (PFN_launch_q)rt_entry("cuLaunchKernel", cudaEnableDefault);
    size_t s8[] = {8}, s96[] = {96};
    CUfunction kw = standin_register_kernel("k_write8", k_write8, 1, NULL, s8);
    CUfunction kwide = standin_register_kernel("k_write_wide", k_write_wide, 1, NULL, s96);
    CUfunction ktab = standin_register_kernel("k_write_table", k_write_table, 1, NULL, s8);
    CUfunction kt = standin_register_kernel("k_touch", k_touch, 1, NULL, s8);
    if (!launch || !kw || !kwide || !ktab || !kt) {
        say("lazy: no launch");
        return 1;
    }
    cudaStream_t s = NULL;
    int bad = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    void *a = NULL, *b = NULL, *c = NULL, *e = NULL, *g = NULL, *l = NULL, *t = NULL, *d[8];
    bad += cudaMallocAsync(&a, 64 << 10, s) != 0;
    bad += cudaMallocAsync(&b, 64 << 10, s) != 0;
    bad += cudaMallocAsync(&c, 64 << 10, s) != 0;
    bad += cudaMallocAsync(&e, 64 << 10, s) != 0;
    bad += cudaMallocAsync(&g, 64 << 10, s) != 0;
    bad += cudaMallocAsync(&l, 64 << 10, s) != 0;
    bad += cudaMallocAsync(&t, 4096, s) != 0;
    for (int i = 0; i < 8; i++)
        bad += cudaMallocAsync(&d[i], 64 << 10, s) != 0;
    uint64_t entry = U64(e) + 400;
    bad += cudaMemcpy(t, &entry, 8, cudaMemcpyHostToDevice) != 0;
    uint64_t pa = U64(a) + 100, pc = U64(c) + 300, pl = U64(l), pt = U64(t), pa2 = U64(a) + 200;
    uint64_t wide[12] = {1, 2, 3, 4, 5, U64(b) + 200, 7, 8, 9, 10, 11, 12};
    void *arg_a[] = {&pa}, *arg_c[] = {&pc}, *arg_l[] = {&pl}, *arg_t[] = {&pt}, *arg_a2[] = {&pa2};
    void *arg_wide[] = {wide};
    CUstream cs = (CUstream)s;
    bad += cudaFreeAsync(a, s) != 0;
    bad += launch(kw, 1, 1, 1, 1, 1, 1, 0, cs, arg_a, NULL) != 0;
    bad += cudaFreeAsync(b, s) != 0;
    bad += launch(kwide, 1, 1, 1, 1, 1, 1, 0, cs, arg_wide, NULL) != 0;
    bad += cudaFreeAsync(c, s) != 0;
    for (int i = 0; i < 3; i++)
        bad += launch(kt, 1, 1, 1, 1, 1, 1, 0, cs, arg_l, NULL) != 0;
    bad += launch(kw, 1, 1, 1, 1, 1, 1, 0, cs, arg_c, NULL) != 0;
    for (int i = 0; i < 8; i++) {
        bad += cudaFreeAsync(d[i], s) != 0;
        bad += launch(kt, 1, 1, 1, 1, 1, 1, 0, cs, arg_l, NULL) != 0;
    }
    bad += cudaFreeAsync(g, s) != 0;
    bad += launch(kt, 1, 1, 1, 1, 1, 1, 0, cs, arg_a2, NULL) != 0;
    bad += cudaFreeAsync(e, s) != 0;
    bad += launch(ktab, 1, 1, 1, 1, 1, 1, 0, cs, arg_t, NULL) != 0;
    bad += cudaStreamSynchronize(s) != 0;
    say("lazy calls failed %d", bad);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    unsigned long (*runs)(void) =
        drv ? (unsigned long (*)(void))dlsym(drv, "standin_poison_many_runs") : NULL;
    say("poison_many_runs %lu", runs ? runs() : 0UL);
    return bad != 0;
}

/* Checked allocations kept for reuse (ISOLATE_REUSE=on), then allocations that need their
 * memory: 200 rounds of a 512 KiB block allocated, written and freed on one stream (checked
 * blocks are kept and served again), then blocks of argv[2] KiB (3 MiB) until one fails. Prints how many of
 * those it got: isolation must get as many as a run without it. */
static int reuse_oom(size_t big_size) {
    cudaStream_t s = NULL;
    int bad = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    for (int i = 0; i < 200; i++) {
        void *a = NULL;
        bad += cudaMallocAsync(&a, 512 << 10, s) != 0;
        bad += cudaMemsetAsync(a, 0x11, 512 << 10, s) != 0;
        bad += cudaFreeAsync(a, s) != 0;
        /* The stand-in's pool takes a free back only once its stream ran it. */
        bad += cudaStreamSynchronize(s) != 0;
    }
    say("reuse calls failed %d", bad);
    /* The C API's counters, printed only where the library is preloaded (its export) and
     * fills all 12 fields: device_allocs (the 5th) and kept_allocs (the 12th, how many
     * allocations kept memory served). */
    int (*counters)(uint64_t *, size_t) =
        (int (*)(uint64_t *, size_t))dlsym(RTLD_DEFAULT, "isolate_counters");
    uint64_t c[12] = {0};
    if (counters && counters(c, sizeof c) == 0 && c[0] == sizeof c)
        say("counters allocations %llu kept %llu", (unsigned long long)c[4],
            (unsigned long long)c[11]);
    void *big[64];
    int n = 0, sticky = 0;
    while (n < 64) {
        void *b = NULL;
        int rc = cudaMallocAsync(&b, big_size, s);
        if (rc) {
            say("big failed with %d", rc);
            cudaGetLastError();
            break;
        }
        /* A call that succeeded leaves no error behind (PyTorch throws on one). */
        sticky += cudaPeekAtLastError() != cudaSuccess;
        big[n++] = b;
    }
    say("big allocated %d", n);
    say("errors left by allocations that succeeded %d", sticky);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    say("free after the failure %zu of %zu", free_b, total_b);
    for (int i = 0; i < n; i++)
        cudaFreeAsync(big[i], s);
    cudaStreamSynchronize(s);
    return bad != 0;
}

typedef CUresult (*PFN_occupancy)(int *, CUfunction, int, size_t);

/* See the header: a launch (or, with `query`, an occupancy query first) the driver needs room
 * for, after frees. */
static int launch_room(int query) {
    PFN_launch_q launch = (PFN_launch_q)rt_entry("cuLaunchKernel", cudaEnableDefault);
    PFN_occupancy occupancy = (PFN_occupancy)rt_entry(
        "cuOccupancyMaxActiveBlocksPerMultiprocessor", cudaEnableDefault);
    size_t s8[] = {8};
    CUfunction kt = standin_register_kernel("k_touch", k_touch, 1, NULL, s8);
    if (!launch || !kt || !occupancy) {
        say("launch-room: no launch");
        return 1;
    }
    cudaStream_t s = NULL;
    int bad = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    void *keep = NULL;
    bad += cudaMallocAsync(&keep, 4096, s) != 0;
    for (int i = 0; i < 56; i++) {
        void *a = NULL;
        bad += cudaMallocAsync(&a, MIB, s) != 0;
        bad += cudaFreeAsync(a, s) != 0;
    }
    bad += cudaStreamSynchronize(s) != 0;
    uint64_t pk = U64(keep);
    void *args[] = {&pk};
    int qc = 0, blocks = 0;
    if (query) {
        qc = occupancy(&blocks, kt, 256, 0);
        say("query-room occupancy query %d: %d blocks", qc, blocks);
    }
    int rc = launch(kt, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, args, NULL);
    say("launch-room first launch %d", rc);
    bad += cudaStreamSynchronize(s) != 0;
    bad += cudaFreeAsync(keep, s) != 0;
    bad += cudaStreamSynchronize(s) != 0;
    say("launch-room calls failed %d", bad);
    return bad != 0 || rc != 0 || qc != 0;
}

/* See the header: isolate's own module while the device is full, then with room. */
static int module_room(int early) {
    cudaStream_t s = NULL;
    int bad = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    void *first = NULL;
    if (early)
        bad += cudaMallocAsync(&first, MIB, s) != 0;
    size_t free_b = 0, total_b = 0;
    bad += cudaMemGetInfo(&free_b, &total_b) != 0;
    void *big = NULL, *a = NULL;
    bad += cudaMallocAsync(&big, free_b - 8 * MIB, s) != 0;
    if (!early) {
        bad += cudaFreeAsync(big, s) != 0;
        bad += cudaStreamSynchronize(s) != 0;
        usleep(1100 * 1000);
    }
    for (int i = 0; i < 4; i++) {
        bad += cudaMallocAsync(&a, 2 * MIB, s) != 0;
        bad += cudaMemsetAsync(a, 0x33, 2 * MIB, s) != 0;
        bad += cudaFreeAsync(a, s) != 0;
        bad += cudaStreamSynchronize(s) != 0;
    }
    if (early) {
        bad += cudaFreeAsync(big, s) != 0;
        bad += cudaFreeAsync(first, s) != 0;
    }
    bad += cudaStreamSynchronize(s) != 0;
    say("module-room calls failed %d", bad);
    return bad != 0;
}

/* See the header: a device crowded by another tenant for a moment. */
static uintptr_t g_tenant;

static void *tenant_leaves(void *arg) {
    (void)arg;
    usleep(60 * 1000);
    standin_tenant_free(g_tenant);
    return NULL;
}

static int crowded(void) {
    cudaStream_t s = NULL;
    int bad = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    size_t free_b = 0, total_b = 0;
    bad += cudaMemGetInfo(&free_b, &total_b) != 0;
    g_tenant = standin_tenant_alloc(free_b - 4 * MIB);
    bad += g_tenant == 0;
    pthread_t t;
    pthread_create(&t, NULL, tenant_leaves, NULL);
    void *a = NULL;
    int rc = cudaMallocAsync(&a, 16 * MIB, s);
    say("crowded allocation %d", rc);
    if (rc)
        cudaGetLastError();
    pthread_join(t, NULL);
    if (!rc)
        bad += cudaFreeAsync(a, s) != 0;
    bad += cudaStreamSynchronize(s) != 0;
    say("crowded calls failed %d", bad);
    return bad != 0;
}

/* See the header: isolation across a device reset. */
static int reset_round(void **last) {
    cudaStream_t s = NULL;
    int bad = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    for (int i = 0; i < 8; i++) {
        void *a = NULL;
        bad += cudaMallocAsync(&a, MIB, s) != 0;
        bad += cudaMemsetAsync(a, 0x44, MIB, s) != 0;
        bad += cudaFreeAsync(a, s) != 0;
        *last = a;
    }
    bad += cudaStreamSynchronize(s) != 0;
    bad += cudaStreamDestroy(s) != 0;
    return bad;
}

static int reset(void) {
    void *last = NULL;
    int bad = reset_round(&last);
    int rc = cudaDeviceReset();
    say("reset cudaDeviceReset %d", rc);
    bad += rc != 0;
    bad += reset_round(&last);
    bad += cudaMemset((char *)last + 4096, 0x5A, 16) != 0;
    bad += cudaDeviceSynchronize() != 0;
    say("reset calls failed %d", bad);
    return bad != 0;
}

/* See the header: what isolation leaves free for everyone else while the device is short. */
static int pressure(void) {
    cudaStream_t s = NULL;
    int bad = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != 0;
    size_t free_b = 0, total_b = 0;
    bad += cudaMemGetInfo(&free_b, &total_b) != 0;
    void *tenant = NULL;
    bad += cudaMalloc(&tenant, total_b / 8 * 5) != 0;
    size_t least = (size_t)-1;
    for (int i = 0; i < 400; i++) {
        void *a = NULL;
        if (cudaMallocAsync(&a, 4 * MIB, s) != 0) {
            bad++;
            cudaGetLastError();
            continue;
        }
        bad += cudaMemsetAsync(a, 0x22, 4 * MIB, s) != 0;
        bad += cudaFreeAsync(a, s) != 0;
        bad += cudaMemGetInfo(&free_b, &total_b) != 0;
        if (i >= 100 && free_b < least)
            least = free_b;
    }
    bad += cudaStreamSynchronize(s) != 0;
    bad += cudaFree(tenant) != 0;
    say("pressure calls failed %d", bad);
    say("pressure least free MiB %zu", least >> 20);
    return bad != 0;
}

int main(int argc, char **argv) {
    setup();
    const char *what = argc > 1 ? argv[1] : "";
    int r;
    if (!strcmp(what, "reuse"))
        r = reuse();
    else if (!strcmp(what, "stale"))
        r = stale();
    else if (!strcmp(what, "oom"))
        r = oom();
    else if (!strcmp(what, "budget"))
        r = budget();
    else if (!strcmp(what, "stream"))
        r = stream();
    else if (!strcmp(what, "double"))
        r = double_free();
    else if (!strcmp(what, "capture"))
        r = capture();
    else if (!strcmp(what, "graph-memory"))
        r = graph_memory();
    else if (!strcmp(what, "pool"))
        r = pool_stats();
    else if (!strcmp(what, "async"))
        r = async_release();
    else if (!strcmp(what, "fork-async")) {
        /* As the tier benchmark's models: forked before any CUDA call, the child does the work
         * (and exits through exit(): its exit check and trace end run), the parent waits. */
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0)
            exit(async_release());
        int status = 0;
        r = pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ? 1 : WEXITSTATUS(status);
    }
    else if (!strcmp(what, "batch"))
        r = batch();
    else if (!strcmp(what, "lazy"))
        r = lazy_poisons();
    else if (!strcmp(what, "kept"))
        r = reuse_oom(argc > 2 ? (size_t)atol(argv[2]) << 10 : (size_t)3 << 20);
    else if (!strcmp(what, "stuck"))
        r = stuck();
    else if (!strcmp(what, "pressure"))
        r = pressure();
    else if (!strcmp(what, "launch-room"))
        r = launch_room(0);
    else if (!strcmp(what, "module-room"))
        r = module_room(0);
    else if (!strcmp(what, "module-early"))
        r = module_room(1);
    else if (!strcmp(what, "crowded"))
        r = crowded();
    else if (!strcmp(what, "reset"))
        r = reset();
    else if (!strcmp(what, "query-room"))
        r = launch_room(1);
    else if (!strcmp(what, "flush-race"))
        r = flush_race();
    else if (!strcmp(what, "late"))
        r = late(LATE);
    else if (!strcmp(what, "late-destroyed"))
        r = late(LATE_DESTROYED);
    else if (!strcmp(what, "late-captured"))
        r = late(LATE_CAPTURED);
    else if (!strcmp(what, "late-captured-legacy"))
        r = late(LATE_CAPTURED_LEGACY);
    else {
        say("usage: quarantine reuse|stale|oom|budget|stream|double|capture|graph-memory|pool|async|fork-async|batch|lazy|kept|stuck|flush-race|late|late-destroyed|late-captured|late-captured-legacy");
        return 2;
    }
    say("done %d", r);
    return r;
}

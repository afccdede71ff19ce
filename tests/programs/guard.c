// link: cudart cuda
/* Guard mode (ISOLATE_MODE=isolate ISOLATE_GUARD=on), one scenario per run (tests/tests/guard.rs):
 *
 *   guard layout    every guardable allocation call (runtime, driver, async, pool, _ptsz): where
 *                   the pointer lies in its mapping, what is accessible around it, that all of it
 *                   is usable; then each freed by its matching free. Also calls that fail or
 *                   hand out nothing (size 0, NULL out-pointer, more than there is).
 *   guard free      A (1 MiB) and A2 (1000 bytes) freed: their bytes, double and interior frees,
 *                   then 32 more allocations: do any get an address inside A or A2?
 *   guard managed   managed and host allocations: never guarded
 *   guard stale [nosync]
 *                   A freed; kernel k_ignore gets A in a by-value struct but writes only B;
 *                   a scratch allocation is freed (a clean synchronisation; skipped with
 *                   `nosync`); kernel k_use gets A and touches it; then B and C are freed
 *   guard recycle   12 x (1 MiB allocated, freed), then 5 live: run with STANDIN_VA_BYTES small
 *   guard touch     the stand-in's standin_touch and its sticky fault, without guard mode
 *   guard first     the process's first CUDA call is a cudaMalloc (no context current yet)
 *
 * Lines starting with "probe " show what differs between guard mode and a plain run by design
 * (what is mapped, where memory comes from, what freed memory holds); every other line must be
 * the same with and without the preload. Accessibility is checked with process_vm_readv, which
 * fails with EFAULT on unmapped or PROT_NONE memory instead of raising SIGSEGV.
 */
#include "common.h"

#include <sys/uio.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static size_t up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* 1 when all of [p, p+n) can be read, without touching it. */
static int readable(uint64_t p, size_t n) {
    static char buf[64 << 10];
    for (size_t at = 0; at < n;) {
        size_t chunk = n - at < sizeof buf ? n - at : sizeof buf;
        struct iovec local = {buf, chunk};
        struct iovec remote = {(void *)(uintptr_t)(p + at), chunk};
        if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)chunk)
            return 0;
        at += chunk;
    }
    return 1;
}

/* What n bytes at p hold ("all 0xNN" or "mixed"), read directly; "unreadable" when they cannot
 * be read. */
static const char *content(uint64_t p, size_t n) {
    static char out[64];
    if (!readable(p, n))
        return "unreadable";
    const unsigned char *b = (const unsigned char *)(uintptr_t)p;
    for (size_t i = 1; i < n; i++)
        if (b[i] != b[0]) {
            snprintf(out, sizeof out, "mixed");
            return out;
        }
    snprintf(out, sizeof out, "all 0x%02x", b[0]);
    return out;
}

/* Every byte of [p, p+n) written and read back: a device memset, the first and last byte
 * through the pointer, a copy to the host. */
static int usable(uint64_t p, size_t n) {
    if (!readable(p, n))
        return 0;
    if (cudaMemset((void *)(uintptr_t)p, 0x5a, n) != cudaSuccess)
        return 0;
    volatile unsigned char *d = (volatile unsigned char *)(uintptr_t)p;
    d[0] = 0xa5;
    d[n - 1] = 0xa5;
    unsigned char *h = malloc(n);
    if (!h)
        return 0;
    int ok = cudaMemcpy(h, (void *)(uintptr_t)p, n, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (size_t i = 0; ok && i < n; i++)
        ok = h[i] == ((i == 0 || i == n - 1) ? 0xa5 : 0x5a);
    free(h);
    return ok;
}

static void lasterr(void) {
    int e = cudaGetLastError();
    int again = cudaGetLastError();
    say("cudaGetLastError %d then %d", e, again);
}

/* Reservations held now (and their bytes), for deltas. */
static unsigned long g_res;
static size_t g_res_bytes;

static void mark(void) { g_res = standin_reserved(&g_res_bytes); }

/* Whether the byte before an allocation is readable says something only when what lies before
 * it is known: not for the stand-in arena's first block (main() keeps that one). */
static int g_before_known = 1;

/* The probe line of one allocation (reservations made since mark(), its address range as the
 * driver reports it, the bytes around it), then the lines every mode must print the same. */
static void place(const char *name, uint64_t p, size_t size) {
    size_t bytes = 0;
    unsigned long res = standin_reserved(&bytes);
    CUdeviceptr base = 0;
    size_t rsize = 0;
    int rr = cuMemGetAddressRange_v2(&base, &rsize, p);
    say("probe name=%s reserved=%lu reserved_bytes=%zu range_rc=%d range_off=%llu range_size=%zu "
        "past_end=%d before_start=%d",
        name, res - g_res, bytes - g_res_bytes, rr, (unsigned long long)(p - base), rsize,
        readable(p + up(size, 256), 1), g_before_known ? readable(p - 1, 1) : -1);
    say("%s size %zu aligned256 %d readable %d usable %d", name, size, p % 256 == 0,
        readable(p, size), usable(p, size));
}

/* ------------------------------------------------------------------------------- layout */

enum how { RT, RT_ASYNC, RT_ASYNC_PT, RT_POOL, RT_POOL_PT, DRV, DRV_ASYNC, DRV_ASYNC_PT,
           DRV_POOL, DRV_POOL_PT };

static const struct {
    const char *name;
    enum how how;
    size_t size;
} g_layout[] = {
    {"rt_1000", RT, 1000},
    {"rt_4096", RT, 4096},
    {"rt_64k", RT, 64 << 10},
    {"rt_1m_plus_1", RT, (1 << 20) + 1},
    {"rt_async", RT_ASYNC, 5000},
    {"rt_async_pt", RT_ASYNC_PT, 300},
    {"rt_pool", RT_POOL, 2048},
    {"rt_pool_pt", RT_POOL_PT, 70000},
    {"drv_3000", DRV, 3000},
    {"drv_2m", DRV, 2 << 20},
    {"drv_async", DRV_ASYNC, 777},
    {"drv_async_pt", DRV_ASYNC_PT, 256},
    {"drv_pool", DRV_POOL, 100000},
    {"drv_pool_pt", DRV_POOL_PT, 1},
};
#define NLAYOUT (sizeof g_layout / sizeof g_layout[0])

static const char *alloc_api(enum how h) {
    static const char *names[] = {"cudaMalloc",
                                  "cudaMallocAsync",
                                  "cudaMallocAsync_ptsz",
                                  "cudaMallocFromPoolAsync",
                                  "cudaMallocFromPoolAsync_ptsz",
                                  "cuMemAlloc_v2",
                                  "cuMemAllocAsync",
                                  "cuMemAllocAsync_ptsz",
                                  "cuMemAllocFromPoolAsync",
                                  "cuMemAllocFromPoolAsync_ptsz"};
    return names[h];
}

static const char *free_api(enum how h) {
    static const char *names[] = {"cudaFree",        "cudaFreeAsync",      "cudaFreeAsync_ptsz",
                                  "cudaFreeAsync",   "cudaFreeAsync_ptsz", "cuMemFree_v2",
                                  "cuMemFreeAsync",  "cuMemFreeAsync_ptsz", "cuMemFreeAsync",
                                  "cuMemFreeAsync_ptsz"};
    return names[h];
}

static int layout(void) {
    cudaStream_t s = NULL;
    say("cudaStreamCreate %d", cudaStreamCreate(&s));
    cudaMemPool_t rpool = NULL;
    say("cudaDeviceGetDefaultMemPool %d", cudaDeviceGetDefaultMemPool(&rpool, 0));
    CUmemoryPool dpool = NULL;
    say("cuDeviceGetDefaultMemPool %d", cuDeviceGetDefaultMemPool(&dpool, 0));
    uint64_t ptr[NLAYOUT];
    unsigned long before_all = standin_reserved(NULL);
    for (size_t i = 0; i < NLAYOUT; i++) {
        size_t size = g_layout[i].size;
        void *p = NULL;
        CUdeviceptr d = 0;
        int rc;
        mark();
        switch (g_layout[i].how) {
        case RT: rc = cudaMalloc(&p, size); break;
        case RT_ASYNC: rc = cudaMallocAsync(&p, size, s); break;
        case RT_ASYNC_PT: rc = cudaMallocAsync_ptsz(&p, size, NULL); break;
        case RT_POOL: rc = cudaMallocFromPoolAsync(&p, size, rpool, s); break;
        case RT_POOL_PT: rc = cudaMallocFromPoolAsync_ptsz(&p, size, rpool, NULL); break;
        case DRV: rc = cuMemAlloc_v2(&d, size); break;
        case DRV_ASYNC: rc = cuMemAllocAsync(&d, size, (CUstream)s); break;
        case DRV_ASYNC_PT: rc = cuMemAllocAsync_ptsz(&d, size, NULL); break;
        case DRV_POOL: rc = cuMemAllocFromPoolAsync(&d, size, dpool, (CUstream)s); break;
        default: rc = cuMemAllocFromPoolAsync_ptsz(&d, size, dpool, NULL); break;
        }
        ptr[i] = p ? U64(p) : d;
        ev(alloc_api(g_layout[i].how), rc, "size=%zu ptr=%s", size, AP(rc, ptr[i], g_layout[i].name));
        if (rc)
            return 1;
        place(g_layout[i].name, ptr[i], size);
    }
    say("probe reserved_live=%lu", standin_reserved(NULL) - before_all);
    for (size_t i = 0; i < NLAYOUT; i++) {
        void *p = (void *)(uintptr_t)ptr[i];
        int rc;
        switch (g_layout[i].how) {
        case RT: rc = cudaFree(p); break;
        case RT_ASYNC: case RT_POOL: rc = cudaFreeAsync(p, s); break;
        case RT_ASYNC_PT: case RT_POOL_PT: rc = cudaFreeAsync_ptsz(p, NULL); break;
        case DRV: rc = cuMemFree_v2(ptr[i]); break;
        case DRV_ASYNC: case DRV_POOL: rc = cuMemFreeAsync(ptr[i], (CUstream)s); break;
        default: rc = cuMemFreeAsync_ptsz(ptr[i], NULL); break;
        }
        ev(free_api(g_layout[i].how), rc, "ptr=@%s", g_layout[i].name);
    }
    say("cudaStreamSynchronize %d", cudaStreamSynchronize(s));
    for (size_t i = 0; i < NLAYOUT; i++)
        say("probe name=%s freed_readable=%d", g_layout[i].name,
            readable(ptr[i], g_layout[i].size));
    /* The reservations stay after the frees. */
    say("probe reserved_after_free=%lu", standin_reserved(NULL) - before_all);

    /* Calls that hand out nothing or fail: the same codes (and sticky error) as a plain run. */
    void *z = (void *)1;
    int rc = cudaMalloc(&z, 0);
    ev("cudaMalloc", rc, "size=0 ptr=0");
    say("cudaMalloc 0 bytes null %d", z == NULL);
    CUdeviceptr dz = 0;
    rc = cuMemAlloc_v2(&dz, 0);
    ev("cuMemAlloc_v2", rc, "size=0 ptr=0");
    rc = cudaMalloc(NULL, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=0");
    lasterr();
    rc = cuMemAlloc_v2(NULL, 4096);
    ev("cuMemAlloc_v2", rc, "size=4096 ptr=0");
    void *huge = NULL;
    size_t huge_size = (size_t)8 << 30;
    rc = cudaMalloc(&huge, huge_size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", huge_size, AP(rc, U64(huge), "huge"));
    lasterr();
    CUdeviceptr dhuge = 0;
    rc = cuMemAlloc_v2(&dhuge, huge_size);
    ev("cuMemAlloc_v2", rc, "size=%zu ptr=%s", huge_size, AP(rc, dhuge, "dhuge"));
    rc = cudaMallocAsync(&huge, huge_size, s);
    ev("cudaMallocAsync", rc, "size=%zu ptr=%s", huge_size, AP(rc, U64(huge), "ahuge"));
    lasterr();
    say("cudaStreamDestroy %d", cudaStreamDestroy(s));
    return 0;
}

/* --------------------------------------------------------------------------------- free */

#define NAGAIN 32

static int overlaps(uint64_t p, size_t n, uint64_t lo, size_t len) {
    return p < lo + len && lo < p + n;
}

static int freed(void) {
    void *a = NULL;
    CUdeviceptr a2 = 0;
    int rc = cudaMalloc(&a, MIB);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", MIB, AP(rc, U64(a), "a"));
    rc |= cuMemAlloc_v2(&a2, 1000);
    ev("cuMemAlloc_v2", rc, "size=1000 ptr=%s", AP(rc, a2, "a2"));
    if (rc)
        return 1;
    CUdeviceptr base = 0, base2 = 0;
    size_t len = 0, len2 = 0;
    say("cuMemGetAddressRange a %d a2 %d", cuMemGetAddressRange_v2(&base, &len, U64(a)),
        cuMemGetAddressRange_v2(&base2, &len2, a2));
    say("cudaMemset a %d a2 %d", cudaMemset(a, 0x11, MIB),
        cudaMemset((void *)(uintptr_t)a2, 0x22, 1000));
    unsigned long before = standin_reserved(NULL);
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    rc = cuMemFree_v2(a2);
    ev("cuMemFree_v2", rc, "ptr=@a2");
    say("probe a after free: %s", content(U64(a), MIB));
    say("probe a2 after free: %s", content(a2, 1000));
    say("probe reservations_before_free=%lu after=%lu", before, standin_reserved(NULL));

    /* A second free, and a free of an address inside: what a plain run gets. */
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    lasterr();
    rc = cuMemFree_v2(a2);
    ev("cuMemFree_v2", rc, "ptr=@a2");
    rc = cudaFree((char *)a + 256);
    ev("cudaFree", rc, "ptr=@a+256");
    lasterr();
    rc = cuMemFree_v2(a2 + 256);
    ev("cuMemFree_v2", rc, "ptr=@a2+256");

    /* More allocations of both sizes: none may land in what was freed. */
    uint64_t got[NAGAIN];
    size_t sz[NAGAIN];
    int inside = 0, in_range = 0;
    char label[16];
    for (int i = 0; i < NAGAIN; i++) {
        snprintf(label, sizeof label, "n%d", i);
        sz[i] = i % 2 ? 1000 : MIB;
        if (i % 2) {
            CUdeviceptr d = 0;
            rc = cuMemAlloc_v2(&d, sz[i]);
            got[i] = d;
            ev("cuMemAlloc_v2", rc, "size=%zu ptr=%s", sz[i], AP(rc, d, label));
        } else {
            void *p = NULL;
            rc = cudaMalloc(&p, sz[i]);
            got[i] = U64(p);
            ev("cudaMalloc", rc, "size=%zu ptr=%s", sz[i], AP(rc, U64(p), label));
        }
        if (rc)
            return 1;
        inside += overlaps(got[i], sz[i], U64(a), MIB) || overlaps(got[i], sz[i], a2, 1000);
        in_range += overlaps(got[i], sz[i], base, len) || overlaps(got[i], sz[i], base2, len2);
    }
    say("probe again inside_freed=%d inside_freed_ranges=%d", inside, in_range);
    for (int i = 0; i < NAGAIN; i++) {
        if (i % 2) {
            rc = cuMemFree_v2(got[i]);
            ev("cuMemFree_v2", rc, "ptr=@n%d", i);
        } else {
            rc = cudaFree((void *)(uintptr_t)got[i]);
            ev("cudaFree", rc, "ptr=@n%d", i);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------ managed */

static int managed(void) {
    void *m1 = NULL, *h1 = NULL, *h2 = NULL, *h3 = NULL, *h4 = NULL;
    CUdeviceptr m2 = 0;
    unsigned long before = standin_reserved(NULL);
    int rc = cudaMallocManaged(&m1, MIB, cudaMemAttachGlobal);
    ev("cudaMallocManaged", rc, "size=%zu ptr=%s", MIB, AP(rc, U64(m1), "m1"));
    rc |= cuMemAllocManaged(&m2, 4096, CU_MEM_ATTACH_GLOBAL);
    ev("cuMemAllocManaged", rc, "size=4096 ptr=%s", AP(rc, m2, "m2"));
    rc |= cudaMallocHost(&h1, 4096);
    ev("cudaMallocHost", rc, "size=4096 ptr=%s", AP(rc, U64(h1), "h1"));
    rc |= cudaHostAlloc(&h2, 8192, cudaHostAllocDefault);
    ev("cudaHostAlloc", rc, "size=8192 ptr=%s", AP(rc, U64(h2), "h2"));
    rc |= cuMemAllocHost_v2(&h3, 1000);
    ev("cuMemAllocHost_v2", rc, "size=1000 ptr=%s", AP(rc, U64(h3), "h3"));
    rc |= cuMemHostAlloc(&h4, 3000, 0);
    ev("cuMemHostAlloc", rc, "size=3000 ptr=%s", AP(rc, U64(h4), "h4"));
    if (rc)
        return 1;
    say("reservations made %lu", standin_reserved(NULL) - before);
    const struct {
        const char *name;
        uint64_t p;
        size_t size;
        int device;
    } all[] = {{"m1", U64(m1), MIB, 1},  {"m2", m2, 4096, 1},      {"h1", U64(h1), 4096, 0},
               {"h2", U64(h2), 8192, 0}, {"h3", U64(h3), 1000, 0}, {"h4", U64(h4), 3000, 0}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CUdeviceptr base = 0;
        size_t len = 0;
        int rr = all[i].device ? cuMemGetAddressRange_v2(&base, &len, all[i].p) : -1;
        say("%s range %d off %llu size %zu usable %d", all[i].name, rr,
            (unsigned long long)(all[i].p - base) * (rr == 0), len, usable(all[i].p, all[i].size));
    }
    rc = cudaFree(m1);
    ev("cudaFree", rc, "ptr=@m1");
    rc = cuMemFree_v2(m2);
    ev("cuMemFree_v2", rc, "ptr=@m2");
    say("probe m1 after free: %s", content(U64(m1), MIB));
    say("probe m2 after free: %s", content(m2, 4096));
    rc = cudaFreeHost(h1);
    ev("cudaFreeHost", rc, "ptr=@h1");
    rc = cudaFreeHost(h2);
    ev("cudaFreeHost", rc, "ptr=@h2");
    rc = cuMemFreeHost(h3);
    ev("cuMemFreeHost", rc, "ptr=@h3");
    rc = cuMemFreeHost(h4);
    ev("cuMemFreeHost", rc, "ptr=@h4");
    say("reservations made %lu", standin_reserved(NULL) - before);
    return 0;
}

/* -------------------------------------------------------------------------------- stale */

/* CUTLASS-style parameters: a struct by value with a field the kernel never uses. */
struct ignore_args {
    uint64_t n;         /* offset 0 */
    CUdeviceptr unused; /* offset 8: the freed A */
    CUdeviceptr out;    /* offset 16: B, the only memory it touches */
};

static int ignore_runs, use_runs, use_ok = -1;

static void k_ignore(void **params) {
    struct ignore_args a;
    memcpy(&a, params[0], sizeof a);
    ((volatile uint64_t *)(uintptr_t)a.out)[0] = a.n;
    ignore_runs++;
}

static void k_use(void **params) {
    CUdeviceptr p = *(CUdeviceptr *)params[0];
    use_ok = standin_touch(p, 16);
    use_runs++;
}

static int stale(int sync) {
    size_t off1[] = {0}, sz_ignore[] = {sizeof(struct ignore_args)}, sz_use[] = {8};
    CUfunction ki = standin_register_kernel("k_ignore", k_ignore, 1, off1, sz_ignore);
    CUfunction ku = standin_register_kernel("k_use", k_use, 1, off1, sz_use);
    say("registered %d", ki && ku);
    void *a = NULL, *b = NULL, *c = NULL;
    CUdeviceptr scratch = 0;
    int rc = cudaMalloc(&a, MIB);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", MIB, AP(rc, U64(a), "A"));
    rc |= cudaMalloc(&b, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(b), "B"));
    rc |= cudaMalloc(&c, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(c), "C"));
    rc |= cuMemAlloc_v2(&scratch, 65536);
    ev("cuMemAlloc_v2", rc, "size=65536 ptr=%s", AP(rc, scratch, "S"));
    if (rc || !ki || !ku)
        return 1;
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@A");

    struct ignore_args ia = {0x600d, U64(a), U64(b)};
    void *pi[] = {&ia};
    say("launch k_ignore %d", cuLaunchKernel(ki, 1, 1, 1, 32, 1, 1, 0, NULL, pi, NULL));
    say("k_ignore wrote B %d", ((volatile uint64_t *)b)[0] == 0x600d);
    if (sync) {
        /* A free synchronises the device: everything launched before it ran without a fault. */
        rc = cuMemFree_v2(scratch);
        ev("cuMemFree_v2", rc, "ptr=@S");
    }
    CUdeviceptr stale_a = U64(a);
    void *pu[] = {&stale_a};
    say("launch k_use %d", cuLaunchKernel(ku, 1, 1, 1, 32, 1, 1, 0, NULL, pu, NULL));
    say("probe k_use touched A ok=%d", use_ok);
    /* The first call after the fault that is recorded, then another. */
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@B");
    say("probe free B %d", rc);
    rc = cudaFree(c);
    ev("cudaFree", rc, "ptr=@C");
    say("probe free C %d", rc);
    say("probe cudaDeviceSynchronize %d", cudaDeviceSynchronize());
    say("kernel runs k_ignore %d k_use %d", ignore_runs, use_runs);
    return 0;
}

/* ------------------------------------------------------------------------------ recycle */

#define NCYCLE 12
#define NLIVE 5

static int recycle(void) {
    char label[16];
    int rc;
    for (int i = 0; i < NCYCLE; i++) {
        void *p = NULL;
        snprintf(label, sizeof label, "c%d", i);
        rc = cudaMalloc(&p, MIB);
        ev("cudaMalloc", rc, "size=%zu ptr=%s", MIB, AP(rc, U64(p), label));
        if (rc)
            return 1;
        say("c%d usable %d", i, usable(U64(p), MIB));
        rc = cudaFree(p);
        ev("cudaFree", rc, "ptr=@%s", label);
        say("probe c%d reserved=%lu", i, standin_reserved(NULL));
    }
    void *live[NLIVE];
    for (int i = 0; i < NLIVE; i++) {
        snprintf(label, sizeof label, "l%d", i);
        mark();
        rc = cudaMalloc(&live[i], MIB);
        ev("cudaMalloc", rc, "size=%zu ptr=%s", MIB, AP(rc, U64(live[i]), label));
        if (rc)
            return 1;
        place(label, U64(live[i]), MIB);
        say("probe l%d reserved_now=%lu", i, standin_reserved(NULL));
    }
    for (int i = 0; i < NLIVE; i++) {
        rc = cudaFree(live[i]);
        ev("cudaFree", rc, "ptr=@l%d", i);
    }
    return 0;
}

/* -------------------------------------------------------------------------------- touch */

static int touch_runs;

static void k_touch(void **params) {
    CUdeviceptr p = *(CUdeviceptr *)params[0];
    size_t n = *(size_t *)params[1];
    say("k_touch ok %d", standin_touch(p, n));
    touch_runs++;
}

static int touch(void) {
    size_t sizes[] = {8, 8};
    CUfunction k = standin_register_kernel("k_touch", k_touch, 2, NULL, sizes);
    say("registered %d", k != NULL);
    CUdeviceptr d = 0;
    int rc = cuMemAlloc_v2(&d, 4096);
    ev("cuMemAlloc_v2", rc, "size=4096 ptr=%s", AP(rc, d, "d"));
    if (rc || !k)
        return 1;
    say("touch device memory %d", standin_touch(d, 4096));
    say("touch nothing %d", standin_touch(d, 0));
    say("cuCtxSynchronize %d", cuCtxSynchronize());

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    say("cuMemGetAllocationGranularity %d", cuMemGetAllocationGranularity(&gran, &prop, 0));
    CUdeviceptr va = 0;
    rc = cuMemAddressReserve(&va, 2 * gran, 0, 0, 0);
    ev("cuMemAddressReserve", rc, "size=%zu ptr=%s", 2 * gran, AP(rc, va, "va"));
    size_t rbytes = 0;
    unsigned long nres = standin_reserved(&rbytes);
    say("standin_reserved %lu bytes==2*gran %d", nres, rbytes == 2 * gran);
    CUmemGenericAllocationHandle h = 0;
    rc = cuMemCreate(&h, gran, &prop, 0);
    ev("cuMemCreate", rc, "size=%zu handle=%s", gran, L(h, "h"));
    rc = cuMemMap(va, gran, 0, h, 0);
    ev("cuMemMap", rc, "ptr=@va size=%zu handle=@h", gran);
    CUmemAccessDesc desc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    rc = cuMemSetAccess(va, gran, &desc, 1);
    ev("cuMemSetAccess", rc, "ptr=@va size=%zu", gran);
    say("readable mapped %d unmapped %d", readable(va, gran), readable(va + gran, 1));
    say("touch mapped %d", standin_touch(va, gran));
    say("cuCtxSynchronize %d", cuCtxSynchronize());

    /* A kernel on a created stream touches 8 bytes past the mapping; one queued after it
     * touches good memory. */
    CUstream s = NULL;
    say("cuStreamCreate %d", cuStreamCreate(&s, 0));
    CUdeviceptr bad = va + gran - 8, good = d;
    size_t n = 16, one = 1;
    void *params[] = {&bad, &n};
    void *gparams[] = {&good, &one};
    rc = cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
    say("cuLaunchKernel %d (queued, runs %d)", rc, touch_runs);
    rc = cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, gparams, NULL);
    say("cuLaunchKernel %d (queued, runs %d)", rc, touch_runs);
    rc = cuStreamSynchronize(s);
    say("cuStreamSynchronize %d runs %d", rc, touch_runs);
    /* The context stays faulted. */
    say("cuStreamSynchronize again %d", cuStreamSynchronize(s));
    say("cuCtxSynchronize %d", cuCtxSynchronize());
    rc = cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, NULL, gparams, NULL);
    say("cuLaunchKernel after the fault %d runs %d", rc, touch_runs);
    CUdeviceptr e = 0;
    rc = cuMemAlloc_v2(&e, 4096);
    ev("cuMemAlloc_v2", rc, "size=4096 ptr=%s", AP(rc, e, "e"));
    void *f = NULL;
    rc = cudaMalloc(&f, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(f), "f"));
    lasterr();
    say("cudaMemset %d", cudaMemset((void *)(uintptr_t)d, 0, 16));
    say("cudaDeviceSynchronize %d", cudaDeviceSynchronize());
    rc = cuMemFree_v2(d);
    ev("cuMemFree_v2", rc, "ptr=@d");
    /* Not context work: unaffected. */
    CUdeviceptr base = 0;
    size_t len = 0;
    say("cuMemGetAddressRange %d", cuMemGetAddressRange_v2(&base, &len, d));
    rc = cuMemUnmap(va, gran);
    ev("cuMemUnmap", rc, "ptr=@va size=%zu", gran);
    rc = cuMemRelease(h);
    ev("cuMemRelease", rc, "handle=@h");
    rc = cuMemAddressFree(va, 2 * gran);
    ev("cuMemAddressFree", rc, "ptr=@va size=%zu", 2 * gran);
    say("standin_reserved %lu", standin_reserved(NULL));
    /* Releasing the primary context's last reference resets it. */
    say("cuDevicePrimaryCtxRelease_v2 %d", cuDevicePrimaryCtxRelease_v2(0));
    say("cuCtxSynchronize after the reset %d", cuCtxSynchronize());
    rc = cuMemFree_v2(d);
    ev("cuMemFree_v2", rc, "ptr=@d");
    say("cuStreamDestroy %d", cuStreamDestroy_v2(s));
    return 0;
}

/* -------------------------------------------------------------------------------- first */

/* The process's first CUDA call is an allocation: no context is current yet. */
static int first(void) {
    g_before_known = 0;
    void *p = NULL;
    mark();
    int rc = cudaMalloc(&p, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(p), "p"));
    if (rc)
        return 1;
    place("first", U64(p), 4096);
    rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@p");
    return 0;
}

int main(int argc, char **argv) {
    setup();
    const char *what = argc > 1 ? argv[1] : "";
    if (!strcmp(what, "first")) {
        int r = first();
        say("done %d", r);
        return r;
    }
    /* The runtime binds the primary context first: every driver call below has one. */
    int rc = cudaFree(NULL);
    ev("cudaFree", rc, "ptr=0");
    /* The arena's first block, held to the end (managed memory: never guarded), so that what
     * lies before every later block is arena memory, in every mode. */
    void *warm = NULL;
    rc = cudaMallocManaged(&warm, 4096, cudaMemAttachGlobal);
    ev("cudaMallocManaged", rc, "size=4096 ptr=%s", AP(rc, U64(warm), "warm"));
    int r;
    if (!strcmp(what, "layout"))
        r = layout();
    else if (!strcmp(what, "free"))
        r = freed();
    else if (!strcmp(what, "managed"))
        r = managed();
    else if (!strcmp(what, "stale"))
        r = stale(!(argc > 2 && !strcmp(argv[2], "nosync")));
    else if (!strcmp(what, "recycle"))
        r = recycle();
    else if (!strcmp(what, "touch"))
        r = touch();
    else {
        say("usage: guard layout|free|managed|stale [nosync]|recycle|touch|first");
        return 2;
    }
    say("done %d", r);
    return r;
}

/*
 * libcuda.so.1 — a stand-in CUDA driver backed by host memory.
 *
 * Device addresses are plain host addresses: test programs can read and write device memory
 * directly. Everything here follows the real driver's ABI (names, signatures, error codes);
 * what it cannot do (run device code) is played by host functions registered with
 * standin_register_kernel.
 *
 * Environment:
 *   STANDIN_DEVICES      number of devices (default 1; 0 makes cuInit fail with NO_DEVICE)
 *   STANDIN_MEM_BYTES    device memory, shared by all devices (default 1 GiB; K/M/G suffixes)
 *   STANDIN_GRANULARITY  VMM granularity (default 64 KiB; a power of two, at least a page)
 *   STANDIN_SYNC=1       run every stream operation at once instead of in stream order
 *   STANDIN_VA_BYTES     address space that cuMemAddressReserve may hold at once (default: no
 *                        limit; K/M/G suffixes): a reservation that would go over it fails
 *                        with CUDA_ERROR_OUT_OF_MEMORY, as a driver does when the GPU's virtual
 *                        address space runs out
 *
 * Device faults. standin_touch(p, n) is what a kernel's access to [p, p+n) does on a GPU: it
 * returns 1 when every byte is accessible (checked with process_vm_readv on this process, so
 * unmapped and PROT_NONE memory, such as reserved or freed VMM space, is found without a
 * SIGSEGV); otherwise it returns 0 and the context faults: the context the kernel was launched
 * in (outside a kernel, the calling thread's current context) gets the sticky error
 * CUDA_ERROR_ILLEGAL_ADDRESS (700). From then on, in that context, cuCtxSynchronize,
 * cuStreamSynchronize/Query, cuEventSynchronize/Query/Record, kernel launches, device
 * allocations and frees (cuMemAlloc*, cuMemFree*, cuMemAllocManaged, cuMemAllocPitch) and
 * copies and sets return 700, and its kernels still queued do not run. The error stays until
 * the context is destroyed (cuCtxDestroy) or its primary context's last reference is released;
 * other calls (context queries, VMM, host memory, modules) are unaffected. Nothing else sets
 * it: without standin_touch the stand-in never faults.
 *
 * Other stand-in-only exports (also in the cuGetProcAddress table): standin_register_kernel,
 * standin_reregister_kernel (another kernel under an existing handle, as a driver reuses a
 * CUfunction's address after a module unload; not in cuda_standin.h nor forwarded by the
 * runtime: programs reach it with dlsym on libcuda),
 * standin_param_info_calls, standin_kernels_run, and standin_reserved (the reservations held
 * now, and their bytes). See cuda_standin.h.
 *
 * Every exported function is a distinct function (never an alias), and every internal helper
 * is static: exports never call exports, so a preloaded library that overrides driver names
 * never sees the driver's own inner calls. The library is linked -Bsymbolic so that the
 * addresses in the cuGetProcAddress table are this library's functions, never an
 * interposer's (the table is never filled by dlsym).
 */
#define _GNU_SOURCE
#include "cuda_standin.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 16
#define ARENA_ALIGN 256
#define PITCH_ALIGN 512
#define RECENT_MAX 256
#define LOW_ARENA_BYTES (64u << 20)
#define DRIVER_VERSION 13000

/* ================================================================ configuration, state */

/* g_lock guards every table below; g_exec (recursive) is held while stream operations run,
 * so that at most one operation runs at a time (one "device"), in order. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_exec = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

static pthread_once_t g_setup_once = PTHREAD_ONCE_INIT;
static CUresult g_setup_result;
static atomic_int g_initialized;

static int g_ndev = 1;
static size_t g_capacity = (size_t)1 << 30;
static size_t g_gran = (size_t)64 << 10;
static int g_sync;
static size_t g_used; /* bytes held: arena blocks + cuMemCreate handles */

static atomic_ulong g_param_info_calls;
static atomic_ulong g_kernels_run;

struct CUctx_st {
    int device;
    int primary;
    int alive;
    int refcount;
    atomic_int fault; /* the sticky error of a device fault (standin_touch), 0 if none */
    struct CUctx_st *next;
};
static struct CUctx_st g_primary[MAX_DEVICES];
static struct CUctx_st *g_contexts; /* cuCtxCreate'd */
static __thread CUcontext t_ctx;
/* The context of the kernel running on this thread (NULL outside a kernel). */
static __thread CUcontext t_kernel_ctx;

static size_t g_va_limit; /* STANDIN_VA_BYTES, 0: no limit */
static size_t g_va_used;  /* bytes reserved now (under g_lock) */

/* The sticky error of the calling thread's current context (0: none). */
static CUresult ctx_fault(void) {
    return t_ctx ? (CUresult)atomic_load(&t_ctx->fault) : CUDA_SUCCESS;
}

static size_t parse_size(const char *s, size_t dflt) {
    if (!s || !*s)
        return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s)
        return dflt;
    while (*end == ' ')
        end++;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; break;
    case 'm': case 'M': mul = 1ull << 20; break;
    case 'g': case 'G': mul = 1ull << 30; break;
    case 't': case 'T': mul = 1ull << 40; break;
    default: break;
    }
    return (size_t)(v * mul);
}

static int is_pow2(size_t v) { return v && !(v & (v - 1)); }

static size_t round_up(size_t v, size_t a) {
    size_t r = (v + a - 1) & ~(a - 1);
    return r < v ? 0 : r; /* 0 on overflow */
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ================================================================ the device arena */

enum alloc_kind { K_PLAIN, K_ASYNC, K_MANAGED, K_PITCH, K_GRAPH, K_V1 };

struct block {
    uintptr_t addr;
    size_t size; /* rounded to ARENA_ALIGN */
    size_t req;  /* as asked */
    int used;
    int kind;
    int pending_free; /* a cuMemFreeAsync for it is queued */
    struct CUmemPoolHandle_st *pool;
    struct CUgraph_st *graph;
    struct block *prev, *next;   /* all blocks, in address order */
    struct block *fprev, *fnext; /* free blocks only, in address order */
    struct block *hnext;         /* in the arena's index bucket */
};

#define INDEX_BUCKETS 4096

struct arena {
    uintptr_t base;
    size_t size;
    struct block *head;
    struct block *free_head;
    struct block *index[INDEX_BUCKETS]; /* every block, by start address */
    uintptr_t recent[RECENT_MAX];       /* recently freed addresses, newest last */
    int nrecent;
};

static size_t index_slot(uintptr_t addr) {
    return (size_t)((addr / ARENA_ALIGN) * 0x9E3779B97F4A7C15ull >> 52) % INDEX_BUCKETS;
}

static void index_add(struct arena *a, struct block *b) {
    size_t i = index_slot(b->addr);
    b->hnext = a->index[i];
    a->index[i] = b;
}

static void index_del(struct arena *a, struct block *b) {
    for (struct block **pp = &a->index[index_slot(b->addr)]; *pp; pp = &(*pp)->hnext)
        if (*pp == b) {
            *pp = b->hnext;
            return;
        }
}

static struct block *index_get(struct arena *a, uintptr_t addr) {
    for (struct block *b = a->index[index_slot(addr)]; b; b = b->hnext)
        if (b->addr == addr)
            return b;
    return NULL;
}

/* Puts free block b into the free list after `pos` (NULL: first). */
static void free_insert(struct arena *a, struct block *pos, struct block *b) {
    b->fprev = pos;
    b->fnext = pos ? pos->fnext : a->free_head;
    if (b->fnext)
        b->fnext->fprev = b;
    if (pos)
        pos->fnext = b;
    else
        a->free_head = b;
}

static void free_remove(struct arena *a, struct block *b) {
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        a->free_head = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
}

static struct arena g_main, g_low;

static int arena_init(struct arena *a, void *base, size_t size) {
    struct block *b = calloc(1, sizeof *b);
    if (!b)
        return -1;
    a->base = (uintptr_t)base;
    a->size = size;
    b->addr = a->base;
    b->size = size;
    a->head = b;
    a->free_head = b;
    index_add(a, b);
    return 0;
}

static int arena_contains(const struct arena *a, uintptr_t p) {
    return a->head && p >= a->base && p < a->base + a->size;
}

static struct block *arena_block_containing(struct arena *a, uintptr_t p) {
    struct block *hit = index_get(a, p);
    if (hit)
        return hit;
    for (struct block *b = a->head; b; b = b->next)
        if (p >= b->addr && p < b->addr + b->size)
            return b;
    return NULL;
}

/* Makes [at, at+size) of free block b a used block; the rest stays free. */
static struct block *arena_carve(struct block *b, struct arena *a, uintptr_t at, size_t size,
                                 size_t req) {
    if (at > b->addr) {
        struct block *front = calloc(1, sizeof *front);
        if (!front)
            return NULL;
        front->addr = b->addr;
        front->size = at - b->addr;
        front->prev = b->prev;
        front->next = b;
        if (b->prev)
            b->prev->next = front;
        else
            a->head = front;
        b->prev = front;
        b->size -= front->size;
        index_del(a, b);
        b->addr = at;
        index_add(a, b);
        index_add(a, front);
        free_insert(a, b->fprev, front);
    }
    if (b->size > size) {
        struct block *back = calloc(1, sizeof *back);
        if (!back)
            return NULL;
        back->addr = at + size;
        back->size = b->size - size;
        back->prev = b;
        back->next = b->next;
        if (b->next)
            b->next->prev = back;
        b->next = back;
        b->size = size;
        index_add(a, back);
        free_insert(a, b, back);
    }
    free_remove(a, b);
    b->used = 1;
    b->req = req;
    b->kind = K_PLAIN;
    b->pending_free = 0;
    b->pool = NULL;
    b->graph = NULL;
    g_used += size;
    return b;
}

/* First fit, except that a recently freed address that fits is handed straight back (newest
 * first), as real drivers do: free(A); alloc(same size) gives A again. Under g_lock. */
static struct block *arena_alloc(struct arena *a, size_t req) {
    size_t size = round_up(req, ARENA_ALIGN);
    if (!a->head || size == 0 || size > g_capacity - g_used)
        return NULL;
    for (int i = a->nrecent - 1; i >= 0; i--) {
        uintptr_t at = a->recent[i];
        /* The newest may have merged into a free block before it: looked for in full. An
         * older one is still a block start, or given up. */
        struct block *b = i == a->nrecent - 1 ? arena_block_containing(a, at) : index_get(a, at);
        int fits = b && !b->used && at + size > at && at + size <= b->addr + b->size;
        if (fits || !b || b->used) {
            memmove(&a->recent[i], &a->recent[i + 1], (a->nrecent - i - 1) * sizeof a->recent[0]);
            a->nrecent--;
        }
        if (fits)
            return arena_carve(b, a, at, size, req);
    }
    for (struct block *b = a->free_head; b; b = b->fnext)
        if (b->size >= size)
            return arena_carve(b, a, b->addr, size, req);
    return NULL;
}

static void arena_release(struct arena *a, struct block *b) {
    uintptr_t at = b->addr;
    b->used = 0;
    b->pending_free = 0;
    g_used -= b->size;
    struct block *before; /* the free block before b */
    if (b->prev && !b->prev->used)
        before = b->prev;
    else if (b->next && !b->next->used)
        before = b->next->fprev;
    else
        for (before = b->prev; before && before->used; before = before->prev)
            ;
    free_insert(a, before, b);
    if (b->next && !b->next->used) {
        struct block *n = b->next;
        free_remove(a, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        index_del(a, n);
        free(n);
    }
    if (b->prev && !b->prev->used) {
        struct block *p = b->prev;
        p->size += b->size;
        p->next = b->next;
        if (b->next)
            b->next->prev = p;
        free_remove(a, b);
        index_del(a, b);
        free(b);
    }
    for (int i = 0; i < a->nrecent; i++)
        if (a->recent[i] == at) {
            memmove(&a->recent[i], &a->recent[i + 1], (a->nrecent - i - 1) * sizeof a->recent[0]);
            a->nrecent--;
            break;
        }
    if (a->nrecent == RECENT_MAX) {
        memmove(&a->recent[0], &a->recent[1], (RECENT_MAX - 1) * sizeof a->recent[0]);
        a->nrecent--;
    }
    a->recent[a->nrecent++] = at;
}

static struct arena *arena_of(uintptr_t p) {
    if (arena_contains(&g_main, p))
        return &g_main;
    if (arena_contains(&g_low, p))
        return &g_low;
    return NULL;
}

/* The live allocation that starts at p (under g_lock). */
static struct block *live_block_at(uintptr_t p, struct arena **ap) {
    struct arena *a = arena_of(p);
    if (!a)
        return NULL;
    struct block *b = index_get(a, p);
    if (!b || !b->used)
        return NULL;
    if (ap)
        *ap = a;
    return b;
}

/* The 32-bit arena for the CUDA < 3.2 cuMemAlloc, made on first use (under g_lock). */
static int low_arena_ready(void) {
    if (g_low.head)
        return 1;
    size_t size = g_capacity < LOW_ARENA_BYTES ? round_up(g_capacity, 4096) : LOW_ARENA_BYTES;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_32BIT, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    if ((uintptr_t)p + size > 0xFFFFFFFFull) {
        munmap(p, size);
        return 0;
    }
    if (arena_init(&g_low, p, size)) {
        munmap(p, size);
        return 0;
    }
    return 1;
}

/* ================================================================ setup, init, checks */

static void setup(void) {
    const char *s = getenv("STANDIN_DEVICES");
    if (s && *s) {
        long n = strtol(s, NULL, 10);
        g_ndev = n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : (int)n;
    }
    g_capacity = parse_size(getenv("STANDIN_MEM_BYTES"), g_capacity);
    size_t gran = parse_size(getenv("STANDIN_GRANULARITY"), g_gran);
    long page = sysconf(_SC_PAGESIZE);
    if (is_pow2(gran) && gran >= (size_t)page)
        g_gran = gran;
    s = getenv("STANDIN_SYNC");
    g_sync = s && *s && strcmp(s, "0") != 0;
    g_va_limit = parse_size(getenv("STANDIN_VA_BYTES"), 0);
    for (int i = 0; i < MAX_DEVICES; i++) {
        g_primary[i].device = i;
        g_primary[i].primary = 1;
        g_primary[i].alive = 1;
    }
    if (g_ndev == 0) {
        g_setup_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    size_t size = round_up(g_capacity ? g_capacity : 1, (size_t)page);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED || arena_init(&g_main, p, size)) {
        g_setup_result = CUDA_ERROR_OUT_OF_MEMORY;
        return;
    }
    g_setup_result = CUDA_SUCCESS;
}

/* A fork while another thread holds the locks must not leave the child deadlocked. */
static void fork_prepare(void) {
    pthread_mutex_lock(&g_exec);
    pthread_mutex_lock(&g_lock);
}
static void fork_parent(void) {
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_exec);
}
/* The child's only thread has a new id, which a recursive mutex's owner no longer matches:
 * made anew rather than unlocked. */
static void fork_child(void) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_exec, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_mutex_init(&g_lock, NULL);
}
__attribute__((constructor)) static void register_fork_handlers(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

#define NEED_INIT()                                                                            \
    do {                                                                                       \
        if (!atomic_load_explicit(&g_initialized, memory_order_acquire))                      \
            return CUDA_ERROR_NOT_INITIALIZED;                                                 \
    } while (0)

#define NEED_CTX()                                                                             \
    do {                                                                                       \
        NEED_INIT();                                                                           \
        if (!t_ctx)                                                                            \
            return CUDA_ERROR_INVALID_CONTEXT;                                                 \
    } while (0)

/* NEED_CTX, and the context has not faulted. */
#define NEED_LIVE_CTX()                                                                        \
    do {                                                                                       \
        NEED_CTX();                                                                            \
        CUresult f_ = ctx_fault();                                                             \
        if (f_)                                                                                \
            return f_;                                                                         \
    } while (0)

static int valid_device(CUdevice d) { return d >= 0 && d < g_ndev; }

static int valid_ctx(CUcontext c) {
    for (int i = 0; i < g_ndev; i++)
        if (c == &g_primary[i])
            return 1;
    int ok = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUctx_st *x = g_contexts; x; x = x->next)
        if (x == c && x->alive)
            ok = 1;
    pthread_mutex_unlock(&g_lock);
    return ok;
}

CUresult cuInit(unsigned int Flags) {
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_setup_once, setup);
    if (g_setup_result != CUDA_SUCCESS)
        return g_setup_result;
    atomic_store_explicit(&g_initialized, 1, memory_order_release);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    NEED_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Stand-in CUDA Device %d", dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_capacity;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    g_primary[dev].refcount++;
    pthread_mutex_unlock(&g_lock);
    *pctx = &g_primary[dev];
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev) {
    NEED_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    if (g_primary[dev].refcount > 0 && --g_primary[dev].refcount == 0)
        atomic_store(&g_primary[dev].fault, 0); /* a reset, as cudaDeviceReset */
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->device = dev;
    c->alive = 1;
    pthread_mutex_lock(&g_lock);
    c->next = g_contexts;
    g_contexts = c;
    pthread_mutex_unlock(&g_lock);
    t_ctx = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    NEED_INIT();
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUctx_st **pp = &g_contexts; *pp; pp = &(*pp)->next)
        if (*pp == ctx && ctx->alive) {
            ctx->alive = 0; /* kept: a stale handle must stay readable */
            *pp = ctx->next;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx == ctx)
        t_ctx = NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    NEED_INIT();
    if (ctx && !valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    NEED_CTX();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = t_ctx->device;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    NEED_CTX();
    if (!free_ || !total)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    *free_ = g_capacity - g_used;
    *total = g_capacity;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* ================================================================ errors */

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **pStr, int text) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == error) {
            *pStr = text ? g_errors[i].text : g_errors[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr) { return error_lookup(error, pStr, 0); }
CUresult cuGetErrorString(CUresult error, const char **pStr) {
    return error_lookup(error, pStr, 1);
}

/* ================================================================ streams and events */

enum op_kind { OP_MEMSET, OP_MEMCPY, OP_KERNEL, OP_FREE, OP_RECORD, OP_WAIT };

struct op {
    enum op_kind kind;
    unsigned long long seq;
    struct op *next;
    union {
        struct {
            uintptr_t dst;
            unsigned value;
            unsigned elem; /* 1 or 4 bytes */
            size_t n;
        } set;
        struct {
            uintptr_t dst, src;
            size_t n;
        } cpy;
        struct {
            standin_kernel_fn fn;
            void *buf;
            void **args;
            struct CUctx_st *ctx; /* launched in */
        } kern;
        struct {
            uintptr_t addr;
        } fr;
        struct {
            struct CUevent_st *ev;
            unsigned long gen;
        } rec;
        struct {
            struct CUstream_st *stream;
            unsigned long long seq;
        } wait;
    } u;
};

struct CUstream_st {
    unsigned flags;
    int priority;
    struct op *head, *tail;
    struct CUstream_st *next;
};

struct CUevent_st {
    unsigned flags;
    int recorded;
    int done;
    unsigned long gen;
    struct CUstream_st *stream; /* where the pending record is queued */
    unsigned long long seq;
    double t_ms;
    struct CUevent_st *next;
};

static struct CUstream_st *g_streams;
static struct CUevent_st *g_events;
static unsigned long long g_seq;

enum stream_kind { SK_LEGACY, SK_PER_THREAD, SK_REAL };

/* Which stream a handle means. `ptsz`: the call is a per-thread-default-stream export, where
 * handle 0 means the per-thread stream. */
static CUresult resolve_stream(CUstream h, int ptsz, enum stream_kind *kind,
                               struct CUstream_st **out) {
    *out = NULL;
    if (h == NULL) {
        *kind = ptsz ? SK_PER_THREAD : SK_LEGACY;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_LEGACY) {
        *kind = SK_LEGACY;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_PER_THREAD) {
        *kind = SK_PER_THREAD;
        return CUDA_SUCCESS;
    }
    int ok = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUstream_st *s = g_streams; s; s = s->next)
        if (s == h)
            ok = 1;
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    *kind = SK_REAL;
    *out = h;
    return CUDA_SUCCESS;
}

static int stream_alive_locked(struct CUstream_st *h) {
    for (struct CUstream_st *s = g_streams; s; s = s->next)
        if (s == h)
            return 1;
    return 0;
}

static struct CUevent_st *find_event(CUevent e) {
    struct CUevent_st *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct CUevent_st *x = g_events; x; x = x->next)
        if (x == e)
            found = x;
    pthread_mutex_unlock(&g_lock);
    return found;
}

static void drain(struct CUstream_st *s, unsigned long long upto);

static void pool_account(struct CUmemPoolHandle_st *pool, long long delta);

static void run_op(struct op *o) {
    switch (o->kind) {
    case OP_MEMSET:
        if (o->u.set.elem == 1) {
            memset((void *)o->u.set.dst, (int)o->u.set.value, o->u.set.n);
        } else {
            unsigned *d = (unsigned *)o->u.set.dst;
            for (size_t i = 0; i < o->u.set.n; i++)
                d[i] = o->u.set.value;
        }
        break;
    case OP_MEMCPY:
        memmove((void *)o->u.cpy.dst, (const void *)o->u.cpy.src, o->u.cpy.n);
        break;
    case OP_KERNEL: {
        /* A context that faulted runs nothing more. */
        struct CUctx_st *c = o->u.kern.ctx;
        if (!c || !atomic_load(&c->fault)) {
            CUcontext outer = t_kernel_ctx;
            t_kernel_ctx = c;
            o->u.kern.fn(o->u.kern.args);
            t_kernel_ctx = outer;
            atomic_fetch_add(&g_kernels_run, 1);
        }
        free(o->u.kern.buf);
        free(o->u.kern.args);
        break;
    }
    case OP_FREE: {
        pthread_mutex_lock(&g_lock);
        struct arena *a = NULL;
        struct block *b = live_block_at(o->u.fr.addr, &a);
        if (b && b->pending_free) {
            if (b->pool)
                pool_account(b->pool, -(long long)b->size);
            arena_release(a, b);
        }
        pthread_mutex_unlock(&g_lock);
        break;
    }
    case OP_RECORD: {
        double t = now_ms();
        pthread_mutex_lock(&g_lock);
        struct CUevent_st *e = o->u.rec.ev;
        if (e->gen == o->u.rec.gen) {
            e->done = 1;
            e->stream = NULL;
            e->t_ms = t;
        }
        pthread_mutex_unlock(&g_lock);
        break;
    }
    case OP_WAIT: {
        pthread_mutex_lock(&g_lock);
        int alive = stream_alive_locked(o->u.wait.stream);
        pthread_mutex_unlock(&g_lock);
        if (alive)
            drain(o->u.wait.stream, o->u.wait.seq);
        break;
    }
    }
}

/* Runs the operations queued on s, in order, up to and including sequence number `upto`. */
static void drain(struct CUstream_st *s, unsigned long long upto) {
    pthread_mutex_lock(&g_exec);
    for (;;) {
        pthread_mutex_lock(&g_lock);
        struct op *o = s->head;
        if (!o || o->seq > upto) {
            pthread_mutex_unlock(&g_lock);
            break;
        }
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&g_lock);
        run_op(o);
        free(o);
    }
    pthread_mutex_unlock(&g_exec);
}

/* Runs every queued operation of every stream (only blocking streams: `blocking_only`). */
static void drain_all(int blocking_only) {
    pthread_mutex_lock(&g_exec);
    for (;;) {
        struct CUstream_st *pick = NULL;
        pthread_mutex_lock(&g_lock);
        for (struct CUstream_st *s = g_streams; s && !pick; s = s->next)
            if (s->head && !(blocking_only && (s->flags & CU_STREAM_NON_BLOCKING)))
                pick = s;
        pthread_mutex_unlock(&g_lock);
        if (!pick)
            break;
        drain(pick, ~0ull);
    }
    pthread_mutex_unlock(&g_exec);
}

/* Puts o on a stream: the legacy stream first waits for all blocking streams and runs it at
 * once, the per-thread stream runs it at once, a created stream queues it. */
static void submit(enum stream_kind kind, struct CUstream_st *s, struct op *o) {
    if (kind != SK_REAL) {
        if (kind == SK_LEGACY)
            drain_all(1);
        pthread_mutex_lock(&g_exec);
        run_op(o);
        pthread_mutex_unlock(&g_exec);
        free(o);
        return;
    }
    pthread_mutex_lock(&g_lock);
    o->seq = ++g_seq;
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    if (o->kind == OP_RECORD && o->u.rec.ev->gen == o->u.rec.gen) {
        o->u.rec.ev->stream = s;
        o->u.rec.ev->seq = o->seq;
    }
    unsigned long long seq = o->seq;
    pthread_mutex_unlock(&g_lock);
    if (g_sync)
        drain(s, seq);
}

static struct op *new_op(enum op_kind kind) {
    struct op *o = calloc(1, sizeof *o);
    if (o)
        o->kind = kind;
    return o;
}

static CUresult stream_create(CUstream *ph, unsigned flags, int priority) {
    NEED_CTX();
    if (!ph)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->flags = flags;
    s->priority = priority;
    pthread_mutex_lock(&g_lock);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_lock);
    *ph = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    return stream_create(phStream, Flags, 0);
}

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    /* Like the real driver: priorities clamp to [greatest, least] = [-5, 0]. */
    if (priority > 0)
        priority = 0;
    if (priority < -5)
        priority = -5;
    return stream_create(phStream, flags, priority);
}

/* Pending work completes first (the real driver lets it finish after the call returns). */
static CUresult stream_destroy(CUstream h) {
    NEED_CTX();
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(h, 0, &kind, &s);
    if (r)
        return r;
    pthread_mutex_lock(&g_exec);
    drain(s, ~0ull);
    pthread_mutex_lock(&g_lock);
    int found = 0;
    for (struct CUstream_st **pp = &g_streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_exec);
    if (!found)
        return CUDA_ERROR_INVALID_HANDLE;
    free(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream) { return stream_destroy(hStream); }
CUresult cuStreamDestroy_v2(CUstream hStream) { return stream_destroy(hStream); }

static CUresult stream_sync(CUstream h, int ptsz) {
    NEED_CTX();
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(h, ptsz, &kind, &s);
    if (r)
        return r;
    if (kind == SK_REAL)
        drain(s, ~0ull);
    else if (kind == SK_LEGACY)
        drain_all(1);
    return ctx_fault();
}

CUresult cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream, 0); }
CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream, 1); }
/* A query runs the stream's work and reports it done (never CUDA_ERROR_NOT_READY), so that a
 * polling loop always ends. */
CUresult cuStreamQuery(CUstream hStream) { return stream_sync(hStream, 0); }
CUresult cuStreamQuery_ptsz(CUstream hStream) { return stream_sync(hStream, 1); }

CUresult cuCtxSynchronize(void) {
    NEED_CTX();
    drain_all(0);
    return ctx_fault();
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    NEED_CTX();
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                            CU_EVENT_INTERPROCESS))
        return CUDA_ERROR_INVALID_VALUE;
    if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = Flags;
    pthread_mutex_lock(&g_lock);
    e->next = g_events;
    g_events = e;
    pthread_mutex_unlock(&g_lock);
    *phEvent = e;
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent h, CUstream hs, int ptsz) {
    NEED_LIVE_CTX();
    struct CUevent_st *e = find_event(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    struct op *o = new_op(OP_RECORD);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    e->gen++;
    e->recorded = 1;
    e->done = 0;
    e->stream = NULL;
    o->u.rec.ev = e;
    o->u.rec.gen = e->gen;
    pthread_mutex_unlock(&g_lock);
    submit(kind, s, o);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    return event_record(hEvent, hStream, 0);
}
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
    return event_record(hEvent, hStream, 1);
}

/* Runs the event's stream up to the event. */
static CUresult event_complete(CUevent h) {
    NEED_CTX();
    struct CUevent_st *e = find_event(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_exec);
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *s = (e->recorded && !e->done) ? e->stream : NULL;
    unsigned long long seq = e->seq;
    pthread_mutex_unlock(&g_lock);
    if (s)
        drain(s, seq);
    pthread_mutex_unlock(&g_exec);
    return ctx_fault();
}

CUresult cuEventSynchronize(CUevent hEvent) { return event_complete(hEvent); }
/* Like cuStreamQuery: runs the work up to the event and reports it done. */
CUresult cuEventQuery(CUevent hEvent) { return event_complete(hEvent); }

static CUresult event_destroy(CUevent h) {
    NEED_CTX();
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUevent_st **pp = &g_events; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            found = 1;
            break;
        }
    /* A record still queued points at the event: keep it alive (leaked) in that case. */
    int pending = found && h->recorded && !h->done;
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pending)
        free(h);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) { return event_destroy(hEvent); }
CUresult cuEventDestroy_v2(CUevent hEvent) { return event_destroy(hEvent); }

static CUresult event_elapsed(float *ms, CUevent hs, CUevent he) {
    NEED_CTX();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *a = find_event(hs), *b = find_event(he);
    if (!a || !b)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded || !b->recorded)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->done || !b->done)
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)(b->t_ms - a->t_ms);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return event_elapsed(pMilliseconds, hStart, hEnd);
}
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return event_elapsed(pMilliseconds, hStart, hEnd);
}

static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned flags, int ptsz) {
    NEED_CTX();
    if (flags & ~1u) /* CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_EXTERNAL */
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = find_event(he);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *target = (e->recorded && !e->done) ? e->stream : NULL;
    unsigned long long seq = e->seq;
    pthread_mutex_unlock(&g_lock);
    if (!target)
        return CUDA_SUCCESS; /* nothing outstanding to wait for */
    struct op *o = new_op(OP_WAIT);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->u.wait.stream = target;
    o->u.wait.seq = seq;
    submit(kind, s, o);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, 0);
}
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, 1);
}

/* ================================================================ memory pools */

struct CUmemPoolHandle_st {
    int device;
    int is_default;
    int alive;
    int reuse[3]; /* follow event dependencies, opportunistic, internal dependencies */
    cuuint64_t threshold;
    cuuint64_t used, used_high, reserved_high;
    struct CUmemPoolHandle_st *next;
};

static struct CUmemPoolHandle_st g_default_pool[MAX_DEVICES];
static struct CUmemPoolHandle_st *g_pools;

/* Under g_lock. */
static void pool_account(struct CUmemPoolHandle_st *pool, long long delta) {
    pool->used += (cuuint64_t)delta;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    if (pool->used > pool->reserved_high)
        pool->reserved_high = pool->used;
}

static struct CUmemPoolHandle_st *default_pool(int dev) {
    struct CUmemPoolHandle_st *p = &g_default_pool[dev];
    if (!p->alive) {
        p->device = dev;
        p->is_default = 1;
        p->alive = 1;
        p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    }
    return p;
}

/* Under g_lock. */
static int valid_pool_locked(CUmemoryPool pool) {
    if (!pool)
        return 0;
    for (int i = 0; i < g_ndev; i++)
        if (pool == &g_default_pool[i])
            return 1;
    for (struct CUmemPoolHandle_st *p = g_pools; p; p = p->next)
        if (p == pool && p->alive)
            return 1;
    return 0;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    NEED_INIT();
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    *pool_out = default_pool(dev);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    NEED_INIT();
    if (!pool || !poolProps)
        return CUDA_ERROR_INVALID_VALUE;
    if (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(poolProps->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    if (poolProps->handleTypes & ~(int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->device = poolProps->location.id;
    p->alive = 1;
    pthread_mutex_lock(&g_lock);
    p->next = g_pools;
    g_pools = p;
    pthread_mutex_unlock(&g_lock);
    *pool = p;
    return CUDA_SUCCESS;
}

/* Pools are never freed (allocations still out keep pointing at theirs); a destroyed pool is
 * only marked dead. */
CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    NEED_INIT();
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (valid_pool_locked(pool) && !pool->is_default) {
        pool->alive = 0;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    NEED_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!valid_pool_locked(pool)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            pool->reuse[attr - 1] = *(int *)value != 0;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            pool->threshold = *(cuuint64_t *)value;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            if (*(cuuint64_t *)value != 0)
                r = CUDA_ERROR_INVALID_VALUE;
            else
                pool->reserved_high = pool->used;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            if (*(cuuint64_t *)value != 0)
                r = CUDA_ERROR_INVALID_VALUE;
            else
                pool->used_high = pool->used;
            break;
        default:
            r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* The pool keeps nothing cached: reserved memory is exactly the memory in use. */
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    NEED_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!valid_pool_locked(pool)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            *(int *)value = pool->reuse[attr - 1];
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    (void)minBytesToKeep;
    NEED_INIT();
    pthread_mutex_lock(&g_lock);
    int ok = valid_pool_locked(pool);
    pthread_mutex_unlock(&g_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ================================================================ device allocations */

/* Allocates from arena a (under g_lock). */
static CUresult alloc_locked(uintptr_t *out, size_t req, int kind, struct arena *a) {
    struct block *b = arena_alloc(a, req);
    if (!b)
        return CUDA_ERROR_OUT_OF_MEMORY;
    b->kind = kind;
    *out = b->addr;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    NEED_LIVE_CTX();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    CUresult r = alloc_locked(&p, bytesize, K_PLAIN, &g_main);
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

/* The CUDA < 3.2 ABI: 32-bit size and pointer, memory from a low arena below 4 GiB. */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    NEED_LIVE_CTX();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p = 0;
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    if (low_arena_ready())
        r = alloc_locked(&p, bytesize, K_V1, &g_low);
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p;
    return r;
}

/* A synchronous free: the device finishes its queued work first, as cuMemFree does. */
static CUresult device_free(uintptr_t p) {
    NEED_CTX();
    if (p == 0)
        return ctx_fault();
    drain_all(0);
    CUresult r = ctx_fault();
    if (r)
        return r;
    r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct arena *a = NULL;
    struct block *b = live_block_at(p, &a);
    if (b && !b->pending_free) {
        if (b->pool)
            pool_account(b->pool, -(long long)b->size);
        arena_release(a, b);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return device_free((uintptr_t)dptr); }
CUresult cuMemFree(CUdeviceptr_v1 dptr) { return device_free((uintptr_t)dptr); }

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, int use_pool,
                            CUstream hs, int ptsz) {
    NEED_LIVE_CTX();
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    if (!use_pool)
        pool = default_pool(t_ctx->device);
    if (!valid_pool_locked(pool)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        r = alloc_locked(&p, size, K_ASYNC, &g_main);
        if (r == CUDA_SUCCESS) {
            struct block *b = live_block_at(p, NULL);
            b->pool = pool;
            pool_account(pool, (long long)b->size);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, NULL, 0, hStream, 0);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, NULL, 0, hStream, 1);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream) {
    return alloc_async(dptr, bytesize, pool, 1, hStream, 0);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
    return alloc_async(dptr, bytesize, pool, 1, hStream, 1);
}

/* The free is queued on the stream and happens when the stream gets there. */
static CUresult free_async(CUdeviceptr dptr, CUstream hs, int ptsz) {
    NEED_LIVE_CTX();
    if (dptr == 0)
        return CUDA_SUCCESS;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    struct op *o = new_op(OP_FREE);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    struct block *b = live_block_at((uintptr_t)dptr, NULL);
    if (b && !b->pending_free)
        b->pending_free = 1;
    else
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_lock);
    if (r) {
        free(o);
        return r;
    }
    o->u.fr.addr = (uintptr_t)dptr;
    submit(kind, s, o);
    return CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, 0); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    return free_async(dptr, hStream, 1);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    NEED_LIVE_CTX();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    CUresult r = alloc_locked(&p, bytesize, K_MANAGED, &g_main);
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes) {
    NEED_LIVE_CTX();
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = round_up(WidthInBytes, PITCH_ALIGN);
    if (pitch == 0 || Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    CUresult r = alloc_locked(&p, pitch * Height, K_PITCH, &g_main);
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS) {
        *dptr = p;
        *pPitch = pitch;
    }
    return r;
}

/* ================================================================ host memory */

struct hostmem {
    uintptr_t p;
    size_t size;
    int registered; /* 0: allocated here (cuMemAllocHost / cuMemHostAlloc), 1: registered */
    unsigned flags;
    struct hostmem *next;
};
static struct hostmem *g_host;

static CUresult host_alloc(void **pp, size_t size, unsigned flags) {
    NEED_CTX();
    if (!pp || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    struct hostmem *h = calloc(1, sizeof *h);
    void *p = NULL;
    if (!h || posix_memalign(&p, 4096, size) != 0) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->p = (uintptr_t)p;
    h->size = size;
    h->flags = flags;
    pthread_mutex_lock(&g_lock);
    h->next = g_host;
    g_host = h;
    pthread_mutex_unlock(&g_lock);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return host_alloc(pp, bytesize, 0); }
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    return host_alloc(pp, bytesize, Flags);
}

CUresult cuMemFreeHost(void *p) {
    NEED_CTX();
    drain_all(0);
    struct hostmem *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct hostmem **hp = &g_host; *hp; hp = &(*hp)->next)
        if (!(*hp)->registered && (*hp)->p == (uintptr_t)p) {
            found = *hp;
            *hp = found->next;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    free((void *)found->p);
    free(found);
    return CUDA_SUCCESS;
}

static CUresult host_register(void *p, size_t size, unsigned flags) {
    NEED_CTX();
    if (!p || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                            CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY))
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t lo = (uintptr_t)p, hi = lo + size;
    if (hi < lo)
        return CUDA_ERROR_INVALID_VALUE;
    struct hostmem *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    for (struct hostmem *x = g_host; x; x = x->next)
        if (lo < x->p + x->size && x->p < hi)
            r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (r == CUDA_SUCCESS) {
        h->p = lo;
        h->size = size;
        h->registered = 1;
        h->flags = flags;
        h->next = g_host;
        g_host = h;
    }
    pthread_mutex_unlock(&g_lock);
    if (r)
        free(h);
    return r;
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags) {
    return host_register(p, bytesize, Flags);
}
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    return host_register(p, bytesize, Flags);
}

CUresult cuMemHostUnregister(void *p) {
    NEED_CTX();
    struct hostmem *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct hostmem **hp = &g_host; *hp; hp = &(*hp)->next)
        if ((*hp)->registered && (*hp)->p == (uintptr_t)p) {
            found = *hp;
            *hp = found->next;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    free(found);
    return CUDA_SUCCESS;
}

/* ================================================================ virtual memory */

struct vreserve {
    uintptr_t base;
    size_t size;
    struct vreserve *next;
};

struct vhandle {
    CUmemGenericAllocationHandle id;
    int fd;
    size_t size;
    int released;
    int maps;
    struct vhandle *next;
};

struct vmap {
    uintptr_t base;
    size_t size;
    size_t offset;
    int prot; /* as cuMemSetAccess last set it */
    struct vhandle *h;
    struct vmap *next;
};

static struct vreserve *g_reserves;
static struct vhandle *g_handles;
static struct vmap *g_maps;
static CUmemGenericAllocationHandle g_next_handle = 0x5ca1ab1e0001ull;

static int valid_prop(const CUmemAllocationProp *prop) {
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(prop->location.id);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    NEED_INIT();
    if (!granularity || !valid_prop(prop))
        return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
        option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = g_gran;
    return CUDA_SUCCESS;
}

/* Under g_lock: the reservation holding all of [p, p+size). */
static struct vreserve *reserve_holding(uintptr_t p, size_t size) {
    for (struct vreserve *r = g_reserves; r; r = r->next)
        if (p >= r->base && p + size >= p && p + size <= r->base + r->size)
            return r;
    return NULL;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)flags;
    NEED_INIT();
    if (!ptr || size == 0 || size % g_gran)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment == 0)
        alignment = g_gran;
    if (!is_pow2(alignment))
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < g_gran)
        alignment = g_gran;
    pthread_mutex_lock(&g_lock);
    int room = !g_va_limit || size <= g_va_limit - g_va_used;
    if (room)
        g_va_used += size;
    pthread_mutex_unlock(&g_lock);
    if (!room)
        return CUDA_ERROR_OUT_OF_MEMORY; /* STANDIN_VA_BYTES */
    struct vreserve *r = calloc(1, sizeof *r);
    if (!r) {
        pthread_mutex_lock(&g_lock);
        g_va_used -= size;
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const int mflags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *got = MAP_FAILED;
    if (addr && addr % alignment == 0) {
        got = mmap((void *)(uintptr_t)addr, size, PROT_NONE, mflags | MAP_FIXED_NOREPLACE, -1, 0);
        if (got != MAP_FAILED && (uintptr_t)got != addr) {
            munmap(got, size); /* kernel without MAP_FIXED_NOREPLACE: took it as a hint */
            got = MAP_FAILED;
        }
    }
    if (got == MAP_FAILED) {
        size_t span = size + alignment;
        void *raw = span < size ? MAP_FAILED : mmap(NULL, span, PROT_NONE, mflags, -1, 0);
        if (raw == MAP_FAILED) {
            free(r);
            pthread_mutex_lock(&g_lock);
            g_va_used -= size;
            pthread_mutex_unlock(&g_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        uintptr_t lo = (uintptr_t)raw, al = (lo + alignment - 1) & ~(uintptr_t)(alignment - 1);
        if (al > lo)
            munmap(raw, al - lo);
        if (lo + span > al + size)
            munmap((void *)(al + size), lo + span - (al + size));
        got = (void *)al;
    }
    r->base = (uintptr_t)got;
    r->size = size;
    pthread_mutex_lock(&g_lock);
    r->next = g_reserves;
    g_reserves = r;
    pthread_mutex_unlock(&g_lock);
    *ptr = r->base;
    return CUDA_SUCCESS;
}

/* Under g_lock. */
static void handle_unref(struct vhandle *h) {
    if (h->released && h->maps == 0) {
        for (struct vhandle **hp = &g_handles; *hp; hp = &(*hp)->next)
            if (*hp == h) {
                *hp = h->next;
                break;
            }
        close(h->fd);
        g_used -= h->size;
        free(h);
    }
}

/* Under g_lock: drops the mapping record m (the pages are handled by the caller). */
static void map_drop(struct vmap *m) {
    for (struct vmap **mp = &g_maps; *mp; mp = &(*mp)->next)
        if (*mp == m) {
            *mp = m->next;
            break;
        }
    m->h->maps--;
    handle_unref(m->h);
    free(m);
}

/* Mappings still in the range go with it. */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    struct vreserve *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct vreserve **rp = &g_reserves; *rp; rp = &(*rp)->next)
        if ((*rp)->base == ptr && (*rp)->size == size) {
            found = *rp;
            *rp = found->next;
            break;
        }
    if (found) {
        for (struct vmap *m = g_maps, *next; m; m = next) {
            next = m->next;
            if (m->base >= found->base && m->base < found->base + found->size)
                map_drop(m);
        }
        munmap((void *)found->base, found->size);
        g_va_used -= found->size;
    }
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    free(found);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    NEED_INIT();
    if (!handle || size == 0 || size % g_gran || flags != 0 || !valid_prop(prop))
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->requestedHandleTypes & ~(int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* fabric, win32: not on this "platform" */
    struct vhandle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    int room = size <= g_capacity - g_used;
    if (room)
        g_used += size;
    pthread_mutex_unlock(&g_lock);
    if (!room) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int fd = memfd_create("standin-cuMemCreate", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        free(h);
        pthread_mutex_lock(&g_lock);
        g_used -= size;
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->fd = fd;
    h->size = size;
    pthread_mutex_lock(&g_lock);
    h->id = g_next_handle++;
    h->next = g_handles;
    g_handles = h;
    pthread_mutex_unlock(&g_lock);
    *handle = h->id;
    return CUDA_SUCCESS;
}

/* Under g_lock. */
static struct vhandle *find_handle(CUmemGenericAllocationHandle id) {
    for (struct vhandle *h = g_handles; h; h = h->next)
        if (h->id == id && !h->released)
            return h;
    return NULL;
}

/* The memory stays while it is mapped, as in CUDA. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    NEED_INIT();
    pthread_mutex_lock(&g_lock);
    struct vhandle *h = find_handle(handle);
    if (h) {
        h->released = 1;
        handle_unref(h);
    }
    pthread_mutex_unlock(&g_lock);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    NEED_INIT();
    if (flags != 0 || size == 0 || size % g_gran || offset % g_gran || ptr % g_gran)
        return CUDA_ERROR_INVALID_VALUE;
    struct vmap *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    struct vhandle *h = find_handle(handle);
    if (!h || offset > h->size || size > h->size - offset || !reserve_holding(ptr, size))
        r = CUDA_ERROR_INVALID_VALUE;
    for (struct vmap *x = g_maps; x && r == CUDA_SUCCESS; x = x->next)
        if (ptr < x->base + x->size && x->base < ptr + size)
            r = CUDA_ERROR_INVALID_VALUE; /* already mapped */
    if (r == CUDA_SUCCESS) {
        void *got = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd,
                         (off_t)offset);
        if (got == MAP_FAILED) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            m->base = ptr;
            m->size = size;
            m->offset = offset;
            m->h = h;
            h->maps++;
            m->next = g_maps;
            g_maps = m;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (r)
        free(m);
    return r;
}

/* Under g_lock: 1 if [p, p+size) is covered by mappings with no gap, each with at least the
 * protection `prot`. */
static int fully_mapped(uintptr_t p, size_t size, int prot) {
    uintptr_t at = p, end = p + size;
    while (at < end) {
        struct vmap *hit = NULL;
        for (struct vmap *x = g_maps; x; x = x->next)
            if (at >= x->base && at < x->base + x->size)
                hit = x;
        if (!hit || (hit->prot & prot) != prot)
            return 0;
        at = hit->base + hit->size;
    }
    return 1;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    NEED_INIT();
    if (!desc || count == 0 || size == 0 || ptr + size < ptr)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            !valid_device(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        switch (desc[i].flags) {
        case CU_MEM_ACCESS_FLAGS_PROT_NONE: break;
        case CU_MEM_ACCESS_FLAGS_PROT_READ: prot |= PROT_READ; break;
        case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: prot |= PROT_READ | PROT_WRITE; break;
        default: return CUDA_ERROR_INVALID_VALUE;
        }
    }
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (!fully_mapped(ptr, size, 0)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (mprotect((void *)(uintptr_t)ptr, size, prot) != 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (struct vmap *m = g_maps; m; m = m->next)
            if (m->base < ptr + size && ptr < m->base + m->size)
                m->prot = prot; /* (a mapping set in part counts as set whole) */
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* The range must be made of whole mappings; it goes back to reserved, inaccessible address
 * space. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    if (size == 0 || ptr + size < ptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    uintptr_t at = ptr, end = ptr + size;
    while (at < end) {
        struct vmap *hit = NULL;
        for (struct vmap *x = g_maps; x; x = x->next)
            if (x->base == at)
                hit = x;
        if (!hit || hit->base + hit->size > end) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        at = hit->base + hit->size;
    }
    if (r == CUDA_SUCCESS) {
        at = ptr;
        while (at < end) {
            struct vmap *hit = NULL;
            for (struct vmap *x = g_maps; x; x = x->next)
                if (x->base == at)
                    hit = x;
            at = hit->base + hit->size;
            mmap((void *)hit->base, hit->size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            map_drop(hit);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    NEED_CTX();
    CUresult r = CUDA_ERROR_NOT_FOUND;
    uintptr_t base = 0;
    size_t size = 0;
    pthread_mutex_lock(&g_lock);
    struct arena *a = arena_of((uintptr_t)dptr);
    struct block *b = a ? arena_block_containing(a, (uintptr_t)dptr) : NULL;
    if (b && b->used) {
        base = b->addr;
        size = b->req;
        r = CUDA_SUCCESS;
    } else {
        for (struct vmap *m = g_maps; m; m = m->next)
            if (dptr >= m->base && dptr < m->base + m->size) {
                base = m->base;
                size = m->size;
                r = CUDA_SUCCESS;
            }
    }
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS) {
        if (pbase)
            *pbase = base;
        if (psize)
            *psize = size;
    }
    return r;
}

/* ================================================================ copies and sets */

/* What a copy or set may touch, as the driver checks it: device memory is the arena (all of
 * it: freed memory stays mapped, as in a real driver's sub-allocator), pinned or registered host
 * memory, and VMM mappings with the access asked for; host memory is anything except reserved
 * virtual address space without that access. Anything else is CUDA_ERROR_INVALID_VALUE, where
 * touching it would fault. Kernels are not checked (a stand-in kernel is host code). */
enum side { SIDE_DEVICE, SIDE_HOST };

/* Under g_lock. */
static int range_ok(uintptr_t p, size_t n, int write, enum side side) {
    if (!p || p + n < p)
        return 0;
    int prot = write ? PROT_READ | PROT_WRITE : PROT_READ;
    for (struct vreserve *r = g_reserves; r; r = r->next)
        if (p < r->base + r->size && r->base < p + n)
            return fully_mapped(p, n, prot);
    if (side == SIDE_HOST)
        return 1;
    const struct arena *arenas[] = {&g_main, &g_low};
    for (int i = 0; i < 2; i++)
        if (arenas[i]->head && p >= arenas[i]->base &&
            p + n <= arenas[i]->base + arenas[i]->size)
            return 1;
    for (struct hostmem *h = g_host; h; h = h->next)
        if (p >= h->p && p + n <= h->p + h->size)
            return 1;
    return 0;
}

static int ranges_ok(uintptr_t dst, enum side dside, uintptr_t src, enum side sside, size_t n) {
    pthread_mutex_lock(&g_lock);
    int ok = range_ok(dst, n, 1, dside) && (!src || range_ok(src, n, 0, sside));
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* Synchronous copies and sets run after everything queued on every stream. */
static CUresult copy_sync(uintptr_t dst, enum side dside, uintptr_t src, enum side sside,
                          size_t n) {
    NEED_LIVE_CTX();
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src || !ranges_ok(dst, dside, src, sside, n))
        return CUDA_ERROR_INVALID_VALUE;
    drain_all(0);
    if (ctx_fault())
        return ctx_fault();
    memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

static CUresult copy_async(uintptr_t dst, enum side dside, uintptr_t src, enum side sside,
                           size_t n, CUstream hs, int ptsz) {
    NEED_LIVE_CTX();
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src || !ranges_ok(dst, dside, src, sside, n))
        return CUDA_ERROR_INVALID_VALUE;
    struct op *o = new_op(OP_MEMCPY);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->u.cpy.dst = dst;
    o->u.cpy.src = src;
    o->u.cpy.n = n;
    submit(kind, s, o);
    return CUDA_SUCCESS;
}

static CUresult set_sync(uintptr_t dst, unsigned value, unsigned elem, size_t n) {
    NEED_LIVE_CTX();
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || dst % elem || n > SIZE_MAX / elem || !ranges_ok(dst, SIDE_DEVICE, 0, 0, n * elem))
        return CUDA_ERROR_INVALID_VALUE;
    drain_all(0);
    if (ctx_fault())
        return ctx_fault();
    struct op o = {.kind = OP_MEMSET, .u.set = {dst, value, elem, n}};
    run_op(&o);
    return CUDA_SUCCESS;
}

static CUresult set_async(uintptr_t dst, unsigned value, unsigned elem, size_t n, CUstream hs,
                          int ptsz) {
    NEED_LIVE_CTX();
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || dst % elem || n > SIZE_MAX / elem || !ranges_ok(dst, SIDE_DEVICE, 0, 0, n * elem))
        return CUDA_ERROR_INVALID_VALUE;
    struct op *o = new_op(OP_MEMSET);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->u.set.dst = dst;
    o->u.set.value = value;
    o->u.set.elem = elem;
    o->u.set.n = n;
    submit(kind, s, o);
    return CUDA_SUCCESS;
}

#define U(p) ((uintptr_t)(p))
#define DEV SIDE_DEVICE
#define HOST SIDE_HOST

/* cuMemcpy takes unified addresses: either side may be host memory. */
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_sync(dst, HOST, src, HOST, n);
}
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_sync(dst, HOST, src, HOST, n);
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    return copy_sync(dst, DEV, U(src), HOST, n);
}
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) {
    return copy_sync(dst, DEV, U(src), HOST, n);
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    return copy_sync(U(dst), HOST, src, DEV, n);
}
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) {
    return copy_sync(U(dst), HOST, src, DEV, n);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_sync(dst, DEV, src, DEV, n);
}
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_sync(dst, DEV, src, DEV, n);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_async(dst, HOST, src, HOST, n, s, 0);
}
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_async(dst, HOST, src, HOST, n, s, 1);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return copy_async(dst, DEV, U(src), HOST, n, s, 0);
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return copy_async(dst, DEV, U(src), HOST, n, s, 1);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_async(U(dst), HOST, src, DEV, n, s, 0);
}
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_async(U(dst), HOST, src, DEV, n, s, 1);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_async(dst, DEV, src, DEV, n, s, 0);
}
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy_async(dst, DEV, src, DEV, n, s, 1);
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n) {
    return set_sync(dst, uc, 1, n);
}
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char uc, size_t n) {
    return set_sync(dst, uc, 1, n);
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int ui, size_t n) {
    return set_sync(dst, ui, 4, n);
}
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int ui, size_t n) {
    return set_sync(dst, ui, 4, n);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream s) {
    return set_async(dst, uc, 1, n, s, 0);
}
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char uc, size_t n, CUstream s) {
    return set_async(dst, uc, 1, n, s, 1);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream s) {
    return set_async(dst, ui, 4, n, s, 0);
}
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int ui, size_t n, CUstream s) {
    return set_async(dst, ui, 4, n, s, 1);
}

/* ================================================================ kernels */

struct CUfunc_st {
    standin_kernel_fn fn;
    char *name;
    unsigned nparams;
    size_t *offsets, *sizes;
    size_t bufsize;
    struct CUfunc_st *next;
};

struct CUmod_st {
    int alive;
};

static struct CUfunc_st *g_funcs;

static struct CUfunc_st *find_func(CUfunction f) {
    struct CUfunc_st *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct CUfunc_st *x = g_funcs; x; x = x->next)
        if (x == f)
            found = x;
    pthread_mutex_unlock(&g_lock);
    return found;
}

/* Fills f's parameter layout (offsets, sizes, bufsize) from standin_register_kernel's
 * arguments; 0 when out of memory (f's layout fields are then untouched). */
static int make_layout(struct CUfunc_st *f, unsigned nparams, const size_t *offsets,
                       const size_t *sizes) {
    size_t *o = calloc(nparams ? nparams : 1, sizeof(size_t));
    size_t *z = calloc(nparams ? nparams : 1, sizeof(size_t));
    if (!o || !z) {
        free(o);
        free(z);
        return 0;
    }
    size_t at = 0, bufsize = 0;
    for (unsigned i = 0; i < nparams; i++) {
        size_t sz = sizes ? sizes[i] : 8;
        size_t off;
        if (offsets) {
            off = offsets[i];
        } else {
            size_t al = 1;
            while (al < sz && al < 8)
                al <<= 1;
            off = (at + al - 1) & ~(al - 1);
        }
        z[i] = sz;
        o[i] = off;
        at = off + sz;
        if (at > bufsize)
            bufsize = at;
    }
    f->nparams = nparams;
    f->offsets = o;
    f->sizes = z;
    f->bufsize = bufsize;
    return 1;
}

CUfunction standin_register_kernel(const char *name, standin_kernel_fn fn, unsigned nparams,
                                   const size_t *offsets, const size_t *sizes) {
    if (!name || !fn)
        return NULL;
    struct CUfunc_st *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->fn = fn;
    f->name = strdup(name);
    if (!f->name || !make_layout(f, nparams, offsets, sizes)) {
        free(f->name);
        free(f);
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    f->next = g_funcs;
    g_funcs = f;
    pthread_mutex_unlock(&g_lock);
    return f;
}

/* Makes the registered kernel f another kernel, under the same handle: a new name, host
 * function and parameter layout (arguments as standin_register_kernel's). This is a real
 * driver reusing a CUfunction's address for a kernel of a module loaded after the old one's
 * was unloaded. Launches already queued keep what they were given; f must not be in use on
 * another thread meanwhile. Returns f, or NULL (f unchanged) when f is not a registered kernel,
 * name or fn is NULL, or memory runs out. */
CUfunction standin_reregister_kernel(CUfunction f, const char *name, standin_kernel_fn fn,
                                     unsigned nparams, const size_t *offsets,
                                     const size_t *sizes) {
    if (!name || !fn)
        return NULL;
    struct CUfunc_st *old = find_func(f);
    if (!old)
        return NULL;
    struct CUfunc_st next = {.fn = fn, .name = strdup(name)};
    if (!next.name || !make_layout(&next, nparams, offsets, sizes)) {
        free(next.name);
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    char *old_name = old->name;
    size_t *old_offsets = old->offsets, *old_sizes = old->sizes;
    old->fn = next.fn;
    old->name = next.name;
    old->nparams = next.nparams;
    old->offsets = next.offsets;
    old->sizes = next.sizes;
    old->bufsize = next.bufsize;
    pthread_mutex_unlock(&g_lock);
    free(old_name);
    free(old_offsets);
    free(old_sizes);
    return old;
}

unsigned long standin_param_info_calls(void) { return atomic_load(&g_param_info_calls); }
unsigned long standin_kernels_run(void) { return atomic_load(&g_kernels_run); }

/* What a kernel's access to [p, p+n) does (see the comment at the top): 1 if it is all
 * accessible, else 0 and the context faults. */
int standin_touch(CUdeviceptr p, size_t n) {
    int ok = p + n >= p && (p != 0 || n == 0);
    char buf[1 << 12];
    pid_t self = getpid();
    for (size_t at = 0; ok && at < n;) {
        size_t chunk = n - at < sizeof buf ? n - at : sizeof buf;
        struct iovec local = {buf, chunk};
        struct iovec remote = {(void *)(uintptr_t)(p + at), chunk};
        ok = process_vm_readv(self, &local, 1, &remote, 1, 0) == (ssize_t)chunk;
        at += chunk;
    }
    if (!ok) {
        struct CUctx_st *c = t_kernel_ctx ? t_kernel_ctx : t_ctx;
        if (c) {
            int none = 0;
            atomic_compare_exchange_strong(&c->fault, &none, CUDA_ERROR_ILLEGAL_ADDRESS);
        }
    }
    return ok;
}

/* The address reservations held now (cuMemAddressReserve'd, not yet freed); their bytes in
 * *bytes (if not NULL). */
unsigned long standin_reserved(size_t *bytes) {
    unsigned long n = 0;
    size_t total = 0;
    pthread_mutex_lock(&g_lock);
    for (struct vreserve *r = g_reserves; r; r = r->next) {
        n++;
        total += r->size;
    }
    pthread_mutex_unlock(&g_lock);
    if (bytes)
        *bytes = total;
    return n;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    NEED_CTX();
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->alive = 1;
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod) {
    NEED_CTX();
    if (!hmod)
        return CUDA_ERROR_INVALID_HANDLE;
    free(hmod);
    return CUDA_SUCCESS;
}

/* Any module (even NULL) holds every registered kernel, found by name. */
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    (void)hmod;
    NEED_CTX();
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct CUfunc_st *x = g_funcs; x && !found; x = x->next)
        if (strcmp(x->name, name) == 0)
            found = x;
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_NOT_FOUND;
    *hfunc = found;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                            size_t *paramSize) {
    atomic_fetch_add(&g_param_info_calls, 1);
    NEED_INIT();
    struct CUfunc_st *f = find_func(func);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (paramIndex >= f->nparams)
        return CUDA_ERROR_INVALID_VALUE;
    if (paramOffset)
        *paramOffset = f->offsets[paramIndex];
    if (paramSize)
        *paramSize = f->sizes[paramIndex];
    return CUDA_SUCCESS;
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    NEED_INIT();
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = find_func(hfunc);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = f->name;
    return CUDA_SUCCESS;
}

/* Queues a launch; the parameter values are copied now, as CUDA does. */
static CUresult launch(CUfunction hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shmem, CUstream hs, void **params,
                       void **extra, int ptsz) {
    (void)shmem;
    NEED_LIVE_CTX();
    struct CUfunc_st *f = find_func(hf);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz)
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    const void *xbuf = NULL;
    size_t xsize = 0;
    int have_xsize = 0;
    if (extra) {
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
                xbuf = extra[i + 1];
            } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
                if (!extra[i + 1])
                    return CUDA_ERROR_INVALID_VALUE;
                xsize = *(size_t *)extra[i + 1];
                have_xsize = 1;
            } else {
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        if (!xbuf || !have_xsize)
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (f->nparams && !params && !extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (extra && xsize < f->bufsize)
        return CUDA_ERROR_INVALID_VALUE;
    struct op *o = new_op(OP_KERNEL);
    void *buf = malloc(f->bufsize ? f->bufsize : 1);
    void **args = calloc(f->nparams ? f->nparams : 1, sizeof(void *));
    if (!o || !buf || !args) {
        free(o);
        free(buf);
        free(args);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (extra)
        memcpy(buf, xbuf, f->bufsize);
    for (unsigned i = 0; i < f->nparams; i++) {
        char *slot = (char *)buf + f->offsets[i];
        if (params) {
            if (!params[i]) {
                free(o);
                free(buf);
                free(args);
                return CUDA_ERROR_INVALID_VALUE;
            }
            memcpy(slot, params[i], f->sizes[i]);
        }
        args[i] = slot;
    }
    o->u.kern.fn = f->fn;
    o->u.kern.buf = buf;
    o->u.kern.args = args;
    o->u.kern.ctx = t_ctx;
    submit(kind, s, o);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, extra, 0);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX,
                             unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                             void **extra) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, extra, 1);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra,
                          int ptsz) {
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (c->numAttrs && !c->attrs)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->sharedMemBytes, c->hStream, params, extra, ptsz);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    return launch_ex(config, f, kernelParams, extra, 0);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra) {
    return launch_ex(config, f, kernelParams, extra, 1);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, NULL, 0);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void **kernelParams) {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream, kernelParams, NULL, 1);
}

/* ================================================================ graphs */

enum node_kind { NODE_MEM_ALLOC, NODE_MEM_FREE };

struct CUgraphNode_st {
    enum node_kind kind;
    CUdeviceptr dptr;
    struct CUgraphNode_st *next;
};

struct CUgraph_st {
    struct CUgraphNode_st *nodes;
    struct CUgraph_st *next;
};

static struct CUgraph_st *g_graphs;

/* Under g_lock. */
static int valid_graph_locked(CUgraph g) {
    for (struct CUgraph_st *x = g_graphs; x; x = x->next)
        if (x == g)
            return 1;
    return 0;
}

static int valid_deps_locked(CUgraph g, const CUgraphNode *deps, size_t n) {
    if (n && !deps)
        return 0;
    for (size_t i = 0; i < n; i++) {
        int ok = 0;
        for (struct CUgraphNode_st *x = g->nodes; x; x = x->next)
            if (x == deps[i])
                ok = 1;
        if (!ok)
            return 0;
    }
    return 1;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    NEED_INIT();
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    g->next = g_graphs;
    g_graphs = g;
    pthread_mutex_unlock(&g_lock);
    *phGraph = g;
    return CUDA_SUCCESS;
}

/* The address is handed out when the node is made (as CUDA does) and stays the graph's until
 * the graph is destroyed. */
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    NEED_CTX();
    if (!phGraphNode || !nodeParams || nodeParams->bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodeParams->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_device(nodeParams->poolProps.location.id))
        return CUDA_ERROR_INVALID_VALUE;
    if (nodeParams->accessDescCount && !nodeParams->accessDescs)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r;
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    if (!valid_graph_locked(hGraph) || !valid_deps_locked(hGraph, dependencies, numDependencies)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        r = alloc_locked(&p, nodeParams->bytesize, K_GRAPH, &g_main);
        if (r == CUDA_SUCCESS) {
            live_block_at(p, NULL)->graph = hGraph;
            n->kind = NODE_MEM_ALLOC;
            n->dptr = p;
            n->next = hGraph->nodes;
            hGraph->nodes = n;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (r) {
        free(n);
        return r;
    }
    nodeParams->dptr = p;
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr) {
    NEED_CTX();
    if (!phGraphNode)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    struct block *b = live_block_at((uintptr_t)dptr, NULL);
    if (!valid_graph_locked(hGraph) || !valid_deps_locked(hGraph, dependencies, numDependencies))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!b || (b->kind != K_GRAPH && b->kind != K_ASYNC))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        n->kind = NODE_MEM_FREE;
        n->dptr = dptr;
        n->next = hGraph->nodes;
        hGraph->nodes = n;
    }
    pthread_mutex_unlock(&g_lock);
    if (r) {
        free(n);
        return r;
    }
    *phGraphNode = n;
    return CUDA_SUCCESS;
}

/* Memory of the graph's allocation nodes still held goes back to the arena. */
CUresult cuGraphDestroy(CUgraph hGraph) {
    NEED_INIT();
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUgraph_st **gp = &g_graphs; *gp; gp = &(*gp)->next)
        if (*gp == hGraph) {
            *gp = hGraph->next;
            found = 1;
            break;
        }
    if (found) {
        for (struct CUgraphNode_st *n = hGraph->nodes, *next; n; n = next) {
            next = n->next;
            if (n->kind == NODE_MEM_ALLOC) {
                struct arena *a = NULL;
                struct block *b = live_block_at((uintptr_t)n->dptr, &a);
                if (b && b->kind == K_GRAPH && b->graph == hGraph && !b->pending_free)
                    arena_release(a, b);
            }
            free(n);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    free(hGraph);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGraphMemTrim(CUdevice device) {
    NEED_INIT();
    return valid_device(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* ================================================================ cuGetProcAddress */

struct proc {
    const char *name; /* base name, as callers ask for it */
    int version;      /* the CUDA version that introduced this ABI */
    void *fn;
    void *ptsz; /* the per-thread-default-stream export, if there is one */
};

#define F(f) ((void *)(f))

/* Every entry of one name is listed oldest ABI first. */
static const struct proc g_procs[] = {
    {"cuInit", 2000, F(cuInit), NULL},
    {"cuDriverGetVersion", 2020, F(cuDriverGetVersion), NULL},
    {"cuDeviceGet", 2000, F(cuDeviceGet), NULL},
    {"cuDeviceGetCount", 2000, F(cuDeviceGetCount), NULL},
    {"cuDeviceGetName", 2000, F(cuDeviceGetName), NULL},
    {"cuDeviceTotalMem", 3020, F(cuDeviceTotalMem_v2), NULL},
    {"cuDevicePrimaryCtxRetain", 7000, F(cuDevicePrimaryCtxRetain), NULL},
    {"cuDevicePrimaryCtxRelease", 7000, F(cuDevicePrimaryCtxRelease), NULL},
    {"cuDevicePrimaryCtxRelease", 11000, F(cuDevicePrimaryCtxRelease_v2), NULL},
    {"cuCtxCreate", 3020, F(cuCtxCreate_v2), NULL},
    {"cuCtxDestroy", 4000, F(cuCtxDestroy_v2), NULL},
    {"cuCtxGetCurrent", 4000, F(cuCtxGetCurrent), NULL},
    {"cuCtxSetCurrent", 4000, F(cuCtxSetCurrent), NULL},
    {"cuCtxGetDevice", 2000, F(cuCtxGetDevice), NULL},
    {"cuCtxSynchronize", 2000, F(cuCtxSynchronize), NULL},
    {"cuMemGetInfo", 3020, F(cuMemGetInfo_v2), NULL},
    {"cuGetErrorName", 6000, F(cuGetErrorName), NULL},
    {"cuGetErrorString", 6000, F(cuGetErrorString), NULL},
    {"cuGetProcAddress", 11030, F(cuGetProcAddress), NULL},
    {"cuGetProcAddress", 12000, F(cuGetProcAddress_v2), NULL},

    {"cuMemAlloc", 2000, F(cuMemAlloc), NULL},
    {"cuMemAlloc", 3020, F(cuMemAlloc_v2), NULL},
    {"cuMemFree", 2000, F(cuMemFree), NULL},
    {"cuMemFree", 3020, F(cuMemFree_v2), NULL},
    {"cuMemAllocAsync", 11020, F(cuMemAllocAsync), F(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, F(cuMemFreeAsync), F(cuMemFreeAsync_ptsz)},
    {"cuMemAllocFromPoolAsync", 11020, F(cuMemAllocFromPoolAsync),
     F(cuMemAllocFromPoolAsync_ptsz)},
    {"cuDeviceGetDefaultMemPool", 11020, F(cuDeviceGetDefaultMemPool), NULL},
    {"cuMemPoolCreate", 11020, F(cuMemPoolCreate), NULL},
    {"cuMemPoolDestroy", 11020, F(cuMemPoolDestroy), NULL},
    {"cuMemPoolSetAttribute", 11020, F(cuMemPoolSetAttribute), NULL},
    {"cuMemPoolGetAttribute", 11020, F(cuMemPoolGetAttribute), NULL},
    {"cuMemPoolTrimTo", 11020, F(cuMemPoolTrimTo), NULL},
    {"cuMemAllocManaged", 6000, F(cuMemAllocManaged), NULL},
    {"cuMemAllocPitch", 3020, F(cuMemAllocPitch_v2), NULL},
    {"cuMemAllocHost", 3020, F(cuMemAllocHost_v2), NULL},
    {"cuMemHostAlloc", 2020, F(cuMemHostAlloc), NULL},
    {"cuMemFreeHost", 2000, F(cuMemFreeHost), NULL},
    {"cuMemHostRegister", 4000, F(cuMemHostRegister), NULL},
    {"cuMemHostRegister", 6050, F(cuMemHostRegister_v2), NULL},
    {"cuMemHostUnregister", 4000, F(cuMemHostUnregister), NULL},
    {"cuMemGetAddressRange", 3020, F(cuMemGetAddressRange_v2), NULL},

    {"cuMemGetAllocationGranularity", 10020, F(cuMemGetAllocationGranularity), NULL},
    {"cuMemAddressReserve", 10020, F(cuMemAddressReserve), NULL},
    {"cuMemAddressFree", 10020, F(cuMemAddressFree), NULL},
    {"cuMemCreate", 10020, F(cuMemCreate), NULL},
    {"cuMemRelease", 10020, F(cuMemRelease), NULL},
    {"cuMemMap", 10020, F(cuMemMap), NULL},
    {"cuMemSetAccess", 10020, F(cuMemSetAccess), NULL},
    {"cuMemUnmap", 10020, F(cuMemUnmap), NULL},

    {"cuMemcpy", 4000, F(cuMemcpy), F(cuMemcpy_ptds)},
    {"cuMemcpyHtoD", 3020, F(cuMemcpyHtoD_v2), F(cuMemcpyHtoD_v2_ptds)},
    {"cuMemcpyDtoH", 3020, F(cuMemcpyDtoH_v2), F(cuMemcpyDtoH_v2_ptds)},
    {"cuMemcpyDtoD", 3020, F(cuMemcpyDtoD_v2), F(cuMemcpyDtoD_v2_ptds)},
    {"cuMemcpyAsync", 4000, F(cuMemcpyAsync), F(cuMemcpyAsync_ptsz)},
    {"cuMemcpyHtoDAsync", 3020, F(cuMemcpyHtoDAsync_v2), F(cuMemcpyHtoDAsync_v2_ptsz)},
    {"cuMemcpyDtoHAsync", 3020, F(cuMemcpyDtoHAsync_v2), F(cuMemcpyDtoHAsync_v2_ptsz)},
    {"cuMemcpyDtoDAsync", 3020, F(cuMemcpyDtoDAsync_v2), F(cuMemcpyDtoDAsync_v2_ptsz)},
    {"cuMemsetD8", 3020, F(cuMemsetD8_v2), F(cuMemsetD8_v2_ptds)},
    {"cuMemsetD32", 3020, F(cuMemsetD32_v2), F(cuMemsetD32_v2_ptds)},
    {"cuMemsetD8Async", 3020, F(cuMemsetD8Async), F(cuMemsetD8Async_ptsz)},
    {"cuMemsetD32Async", 3020, F(cuMemsetD32Async), F(cuMemsetD32Async_ptsz)},

    {"cuStreamCreate", 2000, F(cuStreamCreate), NULL},
    {"cuStreamCreateWithPriority", 5050, F(cuStreamCreateWithPriority), NULL},
    {"cuStreamDestroy", 2000, F(cuStreamDestroy), NULL},
    {"cuStreamDestroy", 4000, F(cuStreamDestroy_v2), NULL},
    {"cuStreamSynchronize", 2000, F(cuStreamSynchronize), F(cuStreamSynchronize_ptsz)},
    {"cuStreamQuery", 2000, F(cuStreamQuery), F(cuStreamQuery_ptsz)},
    {"cuStreamWaitEvent", 3020, F(cuStreamWaitEvent), F(cuStreamWaitEvent_ptsz)},
    {"cuEventCreate", 2000, F(cuEventCreate), NULL},
    {"cuEventRecord", 2000, F(cuEventRecord), F(cuEventRecord_ptsz)},
    {"cuEventSynchronize", 2000, F(cuEventSynchronize), NULL},
    {"cuEventQuery", 2000, F(cuEventQuery), NULL},
    {"cuEventDestroy", 2000, F(cuEventDestroy), NULL},
    {"cuEventDestroy", 4000, F(cuEventDestroy_v2), NULL},
    {"cuEventElapsedTime", 2000, F(cuEventElapsedTime), NULL},
    {"cuEventElapsedTime", 12080, F(cuEventElapsedTime_v2), NULL},

    {"cuModuleLoadData", 2000, F(cuModuleLoadData), NULL},
    {"cuModuleUnload", 2000, F(cuModuleUnload), NULL},
    {"cuModuleGetFunction", 2000, F(cuModuleGetFunction), NULL},
    {"cuFuncGetParamInfo", 12040, F(cuFuncGetParamInfo), NULL},
    {"cuFuncGetName", 12030, F(cuFuncGetName), NULL},
    {"cuLaunchKernel", 4000, F(cuLaunchKernel), F(cuLaunchKernel_ptsz)},
    {"cuLaunchKernelEx", 11060, F(cuLaunchKernelEx), F(cuLaunchKernelEx_ptsz)},
    {"cuLaunchCooperativeKernel", 9000, F(cuLaunchCooperativeKernel),
     F(cuLaunchCooperativeKernel_ptsz)},

    {"cuGraphCreate", 10000, F(cuGraphCreate), NULL},
    {"cuGraphAddMemAllocNode", 11040, F(cuGraphAddMemAllocNode), NULL},
    {"cuGraphAddMemFreeNode", 11040, F(cuGraphAddMemFreeNode), NULL},
    {"cuGraphDestroy", 10000, F(cuGraphDestroy), NULL},
    {"cuDeviceGraphMemTrim", 11040, F(cuDeviceGraphMemTrim), NULL},

    /* stand-in only, so that a runtime can reach them without a dlsym */
    {"standin_register_kernel", 0, F(standin_register_kernel), NULL},
    {"standin_reregister_kernel", 0, F(standin_reregister_kernel), NULL},
    {"standin_param_info_calls", 0, F(standin_param_info_calls), NULL},
    {"standin_kernels_run", 0, F(standin_kernels_run), NULL},
    {"standin_touch", 0, F(standin_touch), NULL},
    {"standin_reserved", 0, F(standin_reserved), NULL},
};

static CUresult proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    if (version > DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE; /* newer than this driver, as the real one says */
    const struct proc *best = NULL;
    int named = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        if (strcmp(g_procs[i].name, symbol) != 0)
            continue;
        named = 1;
        if (g_procs[i].version <= version && (!best || g_procs[i].version > best->version))
            best = &g_procs[i];
    }
    if (!best) {
        if (status && named)
            *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    *pfn = per_thread && best->ptsz ? best->ptsz : best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    return proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
}

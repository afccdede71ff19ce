/*
 * The stand-in driver (see driver_internal.h): kernels (standin_register_kernel and
 * standin_reregister_kernel), modules, functions (cuModuleGetFunction, cuFuncGetParamInfo,
 * cuFuncGetName), launches, the stand-in counters and standin_touch (device faults).
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* ================================================================ kernels */

struct CUfunc_st {
    standin_kernel_fn fn;
    char *name;
    unsigned nparams;
    size_t *offsets, *sizes;
    size_t bufsize;
    int kind; /* standin_register_kernel_as: 0 function, 1 library kernel, 2 no layout */
    int loaded; /* launched once: its "module" is loaded (STANDIN_LAUNCH_ROOM) */
    struct CUfunc_st *next;
};

struct CUmod_st {
    int alive;
    /* isolate's verification module (its image names isolate_verify_many): the module global
     * isolate_ring lives here. */
    unsigned char *ring;
};

static atomic_ulong g_param_info_calls;
/* Failed kernel queries (parameter info and counts, names): each is a line in a real driver's
 * error log (CUDA_LOG_FILE). */
static atomic_ulong g_kernel_query_errors;
atomic_ulong g_kernels_run;

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
    return standin_register_kernel_as(0, name, fn, nparams, offsets, sizes);
}

CUfunction standin_register_kernel_as(int kind, const char *name, standin_kernel_fn fn,
                                      unsigned nparams, const size_t *offsets,
                                      const size_t *sizes) {
    if (!name || !fn || kind < 0 || kind > 2)
        return NULL;
    struct CUfunc_st *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->fn = fn;
    f->kind = kind;
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

static void isolate_verify_many(void **params);
static void isolate_verify_many16(void **params);
static void isolate_poison(void **params);
static void isolate_poison_many(void **params);
static atomic_ulong g_verify16_runs;
static atomic_ulong g_poison_many_runs, g_poison_many_ranges;
static void isolate_verify_sparse(void **params);
static void isolate_poison_sparse(void **params);
static atomic_ulong g_sparse_fills, g_sparse_checks;

/* isolate's fast-tier module (sparse.ptx, ISOLATE_CHECK=fast): its two kernels. */
static void register_sparse_kernels(void) {
    static const size_t sizes[4] = {8, 4, 4, 8};
    standin_register_kernel("isolate_verify_sparse", isolate_verify_sparse, 4, NULL, sizes);
    static const size_t many_sizes[3] = {1024, 4, 4};
    standin_register_kernel("isolate_poison_sparse", isolate_poison_sparse, 3, NULL, many_sizes);
}

static void register_isolate_kernels(void) {
    static const size_t sizes[4] = {8, 4, 4, 8};
    standin_register_kernel("isolate_verify_many", isolate_verify_many, 4, NULL, sizes);
    /* Its 128-bit-load twin gives the same answers (tests/gpu/verify_bw.py shows it on a GPU). */
    standin_register_kernel("isolate_verify_many16", isolate_verify_many16, 4, NULL, sizes);
    static const size_t poison_sizes[3] = {8, 8, 4};
    standin_register_kernel("isolate_poison", isolate_poison, 3, NULL, poison_sizes);
    static const size_t many_sizes[3] = {1024, 4, 4};
    standin_register_kernel("isolate_poison_many", isolate_poison_many, 3, NULL, many_sizes);
}

unsigned long standin_param_info_calls(void) { return atomic_load(&g_param_info_calls); }
unsigned long standin_kernel_query_errors(void) { return atomic_load(&g_kernel_query_errors); }
unsigned long standin_kernels_run(void) { return atomic_load(&g_kernels_run); }
/* Launches of isolate's 128-bit-load check that ran (the release picks it for aligned batches). */
unsigned long standin_verify16_runs(void) { return atomic_load(&g_verify16_runs); }
/* Launches of isolate's multi-range poison (deferred poisons), and the ranges they filled. */
unsigned long standin_poison_many_runs(void) { return atomic_load(&g_poison_many_runs); }
unsigned long standin_poison_many_ranges(void) { return atomic_load(&g_poison_many_ranges); }
/* Launches of isolate's fast-tier fill and check. */
unsigned long standin_sparse_fills(void) { return atomic_load(&g_sparse_fills); }
unsigned long standin_sparse_checks(void) { return atomic_load(&g_sparse_checks); }

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

/* isolate_verify_many(descs, count, pattern, out), as isolate's PTX defines it, run on the
 * host: for each i < count, descs[2i] = ptr, descs[2i+1] = len; out[2i] += the bytes of
 * [ptr, ptr+len) that differ from the pattern's byte, out[2i+1] = min(out[2i+1], the first
 * such offset). Lets CI run isolate's asynchronous release exactly as a GPU would. */
static void isolate_verify_many(void **params) {
    const uint64_t *descs = (const uint64_t *)(uintptr_t) * (uint64_t *)params[0];
    unsigned count = *(unsigned *)params[1];
    unsigned char byte = (unsigned char)(*(unsigned *)params[2] & 0xff);
    uint64_t *out = (uint64_t *)(uintptr_t) * (uint64_t *)params[3];
    for (unsigned i = 0; i < count; i++) {
        const unsigned char *p = (const unsigned char *)(uintptr_t)descs[2 * i];
        uint64_t len = descs[2 * i + 1], changed = 0, first = UINT64_MAX;
        if (!standin_touch((CUdeviceptr)(uintptr_t)p, len))
            return;
        for (uint64_t k = 0; k < len; k++)
            if (p[k] != byte) {
                changed++;
                if (first == UINT64_MAX)
                    first = k;
            }
        out[2 * i] += changed;
        if (changed && first < out[2 * i + 1])
            out[2 * i + 1] = first;
    }
}

/* isolate_verify_many16: the same answers as isolate_verify_many, counted apart. */
static void isolate_verify_many16(void **params) {
    isolate_verify_many(params);
    atomic_fetch_add(&g_verify16_runs, 1);
}

/* isolate_poison(p, n, pattern), as isolate's PTX defines it, run on the host: [p, p+n) filled
 * with the pattern's byte (ISOLATE_TEST_POISON_BY=kernel). */
static void isolate_poison(void **params) {
    unsigned char *p = (unsigned char *)(uintptr_t) * (uint64_t *)params[0];
    uint64_t n = *(uint64_t *)params[1];
    unsigned char byte = (unsigned char)(*(unsigned *)params[2] & 0xff);
    if (!standin_touch((CUdeviceptr)(uintptr_t)p, n))
        return;
    memset(p, byte, n);
}

/* isolate_poison_many(ranges, count, pattern), as isolate's PTX defines it, run on the host:
 * ranges (passed by value, 64 pairs) [2i] = ptr, [2i+1] = len, each filled with the pattern's
 * byte for i < count (at most 64). */
static void isolate_poison_many(void **params) {
    const uint64_t *ranges = (const uint64_t *)params[0];
    unsigned count = *(unsigned *)params[1];
    unsigned char byte = (unsigned char)(*(unsigned *)params[2] & 0xff);
    if (count > 64)
        count = 64;
    for (unsigned i = 0; i < count; i++) {
        unsigned char *p = (unsigned char *)(uintptr_t)ranges[2 * i];
        uint64_t n = ranges[2 * i + 1];
        if (!standin_touch((CUdeviceptr)(uintptr_t)p, n))
            return;
        memset(p, byte, n);
    }
    atomic_fetch_add(&g_poison_many_runs, 1);
    atomic_fetch_add(&g_poison_many_ranges, count);
}

/* The fast tier's pattern of a block (isolate's interposer/src/policy/tier.rs, sparse.ptx): the
 * descriptor's length carries a shift in its top byte (0: 4, every 16-byte vector). Vector v
 * is at offset v << shift for v < ((len - 16) >> shift) + 1 (none when len < 16), then the
 * bytes from max(len - 16, the last vector's end) to len. Calls f(offset, n) for each piece. */
static void sparse_pattern(uint64_t field, uint64_t *len_out,
                           void (*f)(void *ctx, uint64_t off, uint64_t n), void *ctx) {
    unsigned shift = (unsigned)(field >> 56);
    uint64_t len = field & ((1ull << 56) - 1), count = 0, tail = 0;
    if (shift == 0)
        shift = 4;
    *len_out = len;
    if (len >= 16) {
        count = ((len - 16) >> shift) + 1;
        uint64_t last_end = ((count - 1) << shift) + 16;
        tail = last_end > len - 16 ? last_end : len - 16;
    }
    if (shift == 4) {
        if (len)
            f(ctx, 0, len);
        return;
    }
    for (uint64_t v = 0; v < count; v++)
        f(ctx, v << shift, 16);
    if (tail < len)
        f(ctx, tail, len - tail);
}

struct sparse_fill { unsigned char *p; unsigned char byte; };
static void fill_piece(void *c, uint64_t off, uint64_t n) {
    struct sparse_fill *s = c;
    memset(s->p + off, s->byte, n);
}

struct sparse_check { const unsigned char *p; unsigned char byte; uint64_t changed, first; };
static void check_piece(void *c, uint64_t off, uint64_t n) {
    struct sparse_check *s = c;
    for (uint64_t k = off; k < off + n; k++)
        if (s->p[k] != s->byte) {
            s->changed++;
            if (k < s->first)
                s->first = k;
        }
}

/* isolate_poison_sparse(ranges, count, pattern): isolate_poison_many over each range's pattern. */
static void isolate_poison_sparse(void **params) {
    const uint64_t *ranges = (const uint64_t *)params[0];
    unsigned count = *(unsigned *)params[1];
    unsigned char byte = (unsigned char)(*(unsigned *)params[2] & 0xff);
    if (count > 64)
        count = 64;
    for (unsigned i = 0; i < count; i++) {
        unsigned char *p = (unsigned char *)(uintptr_t)ranges[2 * i];
        uint64_t len = ranges[2 * i + 1] & ((1ull << 56) - 1);
        if (!standin_touch((CUdeviceptr)(uintptr_t)p, len))
            return;
        struct sparse_fill s = {p, byte};
        sparse_pattern(ranges[2 * i + 1], &len, fill_piece, &s);
    }
    atomic_fetch_add(&g_sparse_fills, 1);
}

/* isolate_verify_sparse(descs, count, pattern, out): isolate_verify_many over each block's
 * pattern. */
static void isolate_verify_sparse(void **params) {
    const uint64_t *descs = (const uint64_t *)(uintptr_t) * (uint64_t *)params[0];
    unsigned count = *(unsigned *)params[1];
    unsigned char byte = (unsigned char)(*(unsigned *)params[2] & 0xff);
    uint64_t *out = (uint64_t *)(uintptr_t) * (uint64_t *)params[3];
    for (unsigned i = 0; i < count; i++) {
        const unsigned char *p = (const unsigned char *)(uintptr_t)descs[2 * i];
        uint64_t len = descs[2 * i + 1] & ((1ull << 56) - 1);
        if (!standin_touch((CUdeviceptr)(uintptr_t)p, len))
            return;
        struct sparse_check s = {p, byte, 0, UINT64_MAX};
        sparse_pattern(descs[2 * i + 1], &len, check_piece, &s);
        out[2 * i] += s.changed;
        if (s.changed && s.first < out[2 * i + 1])
            out[2 * i + 1] = s.first;
    }
    atomic_fetch_add(&g_sparse_checks, 1);
}

#define ISOLATE_RING_BYTES 65536
#define MAX_RINGS 64

/* Module globals are device memory: copies and sets may touch them (driver_copy.c asks). */
static uintptr_t g_rings[MAX_RINGS];
static atomic_int g_nrings;

int standin_module_global(uintptr_t p, size_t n) {
    int k = atomic_load(&g_nrings);
    for (int i = 0; i < k && i < MAX_RINGS; i++)
        if (g_rings[i] && p >= g_rings[i] && p + n <= g_rings[i] + ISOLATE_RING_BYTES)
            return 1;
    return 0;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    NEED_CTX();
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    if (g_launch_room) {
        /* STANDIN_LAUNCH_ROOM: a module's code needs room on the device. */
        pthread_mutex_lock(&g_lock);
        int short_of_room = g_capacity - g_used < g_launch_room;
        pthread_mutex_unlock(&g_lock);
        if (short_of_room)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->alive = 1;
    if (strstr((const char *)image, ".entry isolate_verify_many(")) {
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        int slot = atomic_fetch_add(&g_nrings, 1);
        m->ring = slot < MAX_RINGS ? calloc(1, ISOLATE_RING_BYTES) : NULL;
        if (!m->ring) {
            free(m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_rings[slot] = (uintptr_t)m->ring;
        pthread_once(&once, register_isolate_kernels);
    }
    if (strstr((const char *)image, ".entry isolate_verify_sparse(")) {
        static pthread_once_t sparse_once = PTHREAD_ONCE_INIT;
        pthread_once(&sparse_once, register_sparse_kernels);
    }
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name) {
    NEED_CTX();
    if (!hmod || !name)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *m = hmod;
    if (!m->ring || strcmp(name, "isolate_ring") != 0)
        return CUDA_ERROR_NOT_FOUND;
    if (dptr)
        *dptr = (CUdeviceptr)(uintptr_t)m->ring;
    if (bytes)
        *bytes = ISOLATE_RING_BYTES;
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

/* One parameter's place and size, for a handle of the given kind (0 a module's function, 1 a
 * library's kernel; a kind-2 function has no layout): cuFuncGetParamInfo and
 * cuKernelGetParamInfo. */
static CUresult param_info(void *handle, int kind, size_t paramIndex, size_t *paramOffset,
                           size_t *paramSize) {
    atomic_fetch_add(&g_param_info_calls, 1);
    NEED_INIT();
    struct CUfunc_st *f = find_func(handle);
    if (!f || f->kind != kind) {
        atomic_fetch_add(&g_kernel_query_errors, 1);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (paramIndex >= f->nparams) {
        atomic_fetch_add(&g_kernel_query_errors, 1);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (paramOffset)
        *paramOffset = f->offsets[paramIndex];
    if (paramSize)
        *paramSize = f->sizes[paramIndex];
    return CUDA_SUCCESS;
}

/* A handle's parameter count, for cuFuncGetParamCount (kind 0) and cuKernelGetParamCount (kind
 * 1). STANDIN_NO_PARAM_COUNT=1: a driver without them (CUDA_ERROR_NOT_SUPPORTED, not counted
 * as an error: the real drivers without them have no such symbol at all). */
static CUresult param_count(void *handle, int kind, size_t *count) {
    NEED_INIT();
    if (g_no_param_count)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct CUfunc_st *f = find_func(handle);
    if (!count) {
        atomic_fetch_add(&g_kernel_query_errors, 1);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!f || f->kind != kind) {
        atomic_fetch_add(&g_kernel_query_errors, 1);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *count = f->nparams;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetParamCount(CUfunction func, size_t *paramCount) {
    return param_count(func, 0, paramCount);
}

CUresult cuKernelGetParamCount(CUkernel kernel, size_t *paramCount) {
    return param_count(kernel, 1, paramCount);
}

/* A handle's name, for cuFuncGetName (`kernel` 0: a function of any kind but a library's kernel)
 * and cuKernelGetName (`kernel` 1: a library's kernel only). */
static CUresult func_name(const char **name, void *handle, int kernel) {
    NEED_INIT();
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUfunc_st *f = find_func(handle);
    if (!f || (f->kind == 1) != kernel) {
        atomic_fetch_add(&g_kernel_query_errors, 1);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *name = f->name;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                            size_t *paramSize) {
    return param_info(func, 0, paramIndex, paramOffset, paramSize);
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc) { return func_name(name, hfunc, 0); }

CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                              size_t *paramSize) {
    return param_info(kernel, 1, paramIndex, paramOffset, paramSize);
}

CUresult cuKernelGetName(const char **name, CUkernel hfunc) { return func_name(name, hfunc, 1); }

/* STANDIN_LAUNCH_ROOM: the first use of a kernel (its launch, or a query about it) loads its
 * module (lazy loading): it needs room on the device, and fails with out of memory without it.
 * (Not a library's kernels, kind 1: CUkernel handles, loaded with their library.) Isolate's own
 * kernels are kind 0, so they need room too. Returns 1 when short. */
static int load(struct CUfunc_st *f) {
    if (!g_launch_room)
        return 0;
    pthread_mutex_lock(&g_lock);
    int short_of_room = !f->loaded && f->kind != 1 && g_capacity - g_used < g_launch_room;
    if (!short_of_room)
        f->loaded = 1;
    pthread_mutex_unlock(&g_lock);
    return short_of_room;
}

/* Loads a kernel now (CUDA 12.4's cuFuncLoad), under the same rule as its first use. */
CUresult cuFuncLoad(CUfunction hf) {
    NEED_LIVE_CTX();
    struct CUfunc_st *f = find_func(hf);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    return load(f) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

/* As PyTorch's softmax asks before its first launch. Every kernel fits 8 blocks of 256
 * threads a "multiprocessor". */
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction hf, int block,
                                                     size_t smem) {
    (void)smem;
    NEED_LIVE_CTX();
    struct CUfunc_st *f = find_func(hf);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!n || block <= 0 || block > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (load(f))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *n = 2048 / block;
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
    if (load(f))
        return CUDA_ERROR_OUT_OF_MEMORY;
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
    if (g_slow_fill_ms && f->fn == isolate_poison_many)
        usleep(g_slow_fill_ms * 1000u);
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

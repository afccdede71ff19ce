/*
 * The stand-in driver (see driver_internal.h): memory pools, device allocations (cuMemAlloc*,
 * cuMemFree*, the stream-ordered cuMemAllocAsync/cuMemFreeAsync, managed, pitched) and host
 * memory (cuMemAllocHost, cuMemHostAlloc, cuMemHostRegister).
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <stdlib.h>
#include <string.h>

#define PITCH_ALIGN 512

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
void pool_account(struct CUmemPoolHandle_st *pool, long long delta) {
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
CUresult alloc_locked(uintptr_t *out, size_t req, int kind, struct arena *a) {
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
    if (b && !b->pending_free && b->kind != K_IPC) { /* opened memory is closed, not freed */
        if (b->pool)
            pool_account(b->pool, -(long long)b->size);
        arena_release(a, b);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return device_free((uintptr_t)dptr); }

/* Another process's memory on the same device (a test hook, not a CUDA call, so no preloaded
 * library sees it): taken from and given back to the device directly. */
uintptr_t standin_tenant_alloc(size_t bytes) {
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    CUresult r = alloc_locked(&p, bytes, K_PLAIN, &g_main);
    pthread_mutex_unlock(&g_lock);
    return r == CUDA_SUCCESS ? p : 0;
}

void standin_tenant_free(uintptr_t p) {
    pthread_mutex_lock(&g_lock);
    struct arena *a = NULL;
    struct block *b = live_block_at(p, &a);
    if (b && !b->pending_free)
        arena_release(a, b);
    pthread_mutex_unlock(&g_lock);
}

/* cuDevicePrimaryCtxReset: the context's memory is gone. Every live plain, async and pitched
 * allocation is zeroed (what it held is lost) and given back, as a real driver tears the
 * context's memory down; a stale copy from it afterwards fails. */
void reset_device_memory(void) {
    drain_all(0);
    pthread_mutex_lock(&g_lock);
    for (struct block *b = g_main.head, *next; b; b = next) {
        next = b->next;
        if (b->used && !b->pending_free &&
            (b->kind == K_PLAIN || b->kind == K_ASYNC || b->kind == K_PITCH)) {
            memset((void *)b->addr, 0, b->size);
            if (b->pool)
                pool_account(b->pool, -(long long)b->size);
            arena_release(&g_main, b);
        }
    }
    pthread_mutex_unlock(&g_lock);
}
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
            b->captured = stream_capturing(s);
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
    /* As the driver: a free recorded into a graph frees only what that capture allocated, and
     * memory a capture allocated is the graph's until the graph has run; freed outside it before
     * that, the driver answers "invalid argument" (which PyTorch's stream-ordered backend turns
     * into an abort). The stand-in's capture makes no graph, so none ever runs. Capture is not
     * emulated otherwise: the free still happens when the stream gets there. */
    int in_capture = stream_capturing(s);
    if (b && !b->pending_free && b->captured == in_capture)
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

struct hostmem *g_host;

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

/*
 * The stand-in driver (see driver_internal.h): copies and sets, synchronous and stream-ordered,
 * with the range checks a driver makes.
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

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
    return standin_module_global(p, n);
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
    stuck_wait();
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
    stuck_wait();
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

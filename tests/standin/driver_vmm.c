/*
 * The stand-in driver (see driver_internal.h): virtual memory management (cuMemCreate,
 * cuMemAddressReserve/Free, cuMemMap/Unmap, cuMemSetAccess, cuMemRelease), the address ranges
 * of allocations (cuMemGetAddressRange) and standin_reserved.
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* ================================================================ virtual memory */

struct vhandle {
    CUmemGenericAllocationHandle id;
    int fd;
    size_t size;
    int released;
    int retains; /* references taken by cuMemRetainAllocationHandle, not yet released */
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

struct vreserve *g_reserves;
static struct vhandle *g_handles;
static struct vmap *g_maps;
static CUmemGenericAllocationHandle g_next_handle = 0x5ca1ab1e0001ull;
static size_t g_va_used; /* bytes reserved now (under g_lock) */

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
    if (h && h->retains > 0) {
        h->retains--; /* a retained reference goes; the handle stays */
    } else if (h) {
        h->released = 1;
        handle_unref(h);
    }
    pthread_mutex_unlock(&g_lock);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The handle mapped at addr (anywhere in a mapping), with one more reference: one more
 * cuMemRelease of it is then valid (NCCL's ncclCuMemFree: retain, release, unmap, release). A
 * handle already released but still mapped is live again until that release. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    NEED_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t a = (uintptr_t)addr;
    struct vhandle *h = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct vmap *m = g_maps; m; m = m->next)
        if (a >= m->base && a < m->base + m->size)
            h = m->h;
    if (h) {
        if (h->released)
            h->released = 0;
        else
            h->retains++;
        *handle = h->id;
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
int fully_mapped(uintptr_t p, size_t size, int prot) {
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

/* The floor of PyTorch's stream-ordered backend (issue 31), for `tier_bench.py`'s and
 * `free_cost.py`'s `backend-pool` configuration: preloaded WITHOUT the library under
 * PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, it answers the backend's cudaMallocAsync
 * and cudaFreeAsync itself from blocks freed before, kept by exact size and stream (a block is
 * handed out again only on the stream that freed it, so the stream's own order keeps reuse
 * correct, as a one-stream caching allocator's is). What is left of the backend's cost is
 * PyTorch's own bookkeeping (CudaMallocAsyncAllocator: its lock, its maps, its device guard)
 * and this file's few instructions: the least any design that sees every tensor through the
 * backend can cost, the driver's pool taken out. The library's fast tier also serves most
 * allocations without the driver (its kept memory), so this, not `backend` alone, is the line
 * its own cost is measured against.
 *
 * A measuring tool, not an allocator: kept blocks are never given back to the driver (a model
 * that runs the device out of memory under it would fail where the backend trims its pool).
 *
 * Built on the GPU machine with gcc (no CUDA toolkit: the runtime's functions are found with
 * dlsym(RTLD_NEXT)). At exit it prints one line to stderr: how many allocations it served. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*malloc_async_t)(void **, size_t, void *);
typedef int (*free_async_t)(void *, void *);

static malloc_async_t real_malloc;
static free_async_t real_free;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Free blocks: chained by (size, stream). Live blocks: ptr -> (size, stream). */
struct blk {
    void *p;
    size_t size;
    void *stream;
    struct blk *next;
};
#define SLOTS 8192
static struct blk *free_slot[SLOTS];
static struct blk *live_slot[SLOTS];
static struct blk *spare;
static unsigned long served, asked, kept;

static size_t mix(uint64_t a, uint64_t b) {
    return (size_t)(((a ^ (b * 0xff51afd7ed558ccdull)) * 0x9E3779B97F4A7C15ull) >> 51) % SLOTS;
}

static struct blk *take(struct blk **b, void *p, size_t size, void *stream, int by_ptr) {
    for (; *b; b = &(*b)->next) {
        struct blk *k = *b;
        if (by_ptr ? k->p == p : (k->size == size && k->stream == stream)) {
            *b = k->next;
            return k;
        }
    }
    return NULL;
}

static struct blk *node(void) {
    struct blk *k = spare;
    if (k) {
        spare = k->next;
        return k;
    }
    return malloc(sizeof *k);
}

static void report(void) {
    fprintf(stderr, "backend-pool: %lu of %lu allocations served from %lu kept blocks\n",
            served, asked, kept);
}

static void init(void) {
    if (real_malloc)
        return;
    real_free = (free_async_t)dlsym(RTLD_NEXT, "cudaFreeAsync");
    real_malloc = (malloc_async_t)dlsym(RTLD_NEXT, "cudaMallocAsync");
    atexit(report);
}

int cudaMallocAsync(void **p, size_t size, void *stream) {
    pthread_mutex_lock(&lock);
    init();
    asked++;
    struct blk *k = take(&free_slot[mix(size, (uint64_t)stream)], NULL, size, stream, 0);
    if (k) {
        served++;
        *p = k->p;
        k->next = live_slot[mix((uint64_t)k->p, 0)];
        live_slot[mix((uint64_t)k->p, 0)] = k;
        pthread_mutex_unlock(&lock);
        return 0;
    }
    pthread_mutex_unlock(&lock);
    if (!real_malloc)
        return 2; /* cudaErrorMemoryAllocation */
    int rc = real_malloc(p, size, stream);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&lock);
    k = node();
    if (k) {
        kept++;
        k->p = *p;
        k->size = size;
        k->stream = stream;
        k->next = live_slot[mix((uint64_t)*p, 0)];
        live_slot[mix((uint64_t)*p, 0)] = k;
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

int cudaFreeAsync(void *p, void *stream) {
    pthread_mutex_lock(&lock);
    init();
    struct blk *k = p ? take(&live_slot[mix((uint64_t)p, 0)], p, 0, NULL, 1) : NULL;
    if (k) {
        /* Kept for the stream the free is ordered on (PyTorch's backend frees a block on its
         * creation stream, after syncing any stream it was recorded on to that one). */
        k->stream = stream;
        k->next = free_slot[mix(k->size, (uint64_t)k->stream)];
        free_slot[mix(k->size, (uint64_t)k->stream)] = k;
        pthread_mutex_unlock(&lock);
        return 0;
    }
    pthread_mutex_unlock(&lock);
    return real_free ? real_free(p, stream) : 0;
}

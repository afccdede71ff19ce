/*
 * The stand-in driver (see driver_internal.h): the device arena that plain, async, managed,
 * pitched and graph allocations come from, and the low (32-bit) arena of the v1 cuMemAlloc.
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define LOW_ARENA_BYTES (64u << 20)

/* ================================================================ the device arena */

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

struct arena g_main, g_low;

int arena_init(struct arena *a, void *base, size_t size) {
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

struct block *arena_block_containing(struct arena *a, uintptr_t p) {
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
    b->captured = 0;
    b->pool = NULL;
    b->graph = NULL;
    g_used += size;
    return b;
}

/* First fit, except that a recently freed address that fits is handed straight back (newest
 * first), as real drivers do: free(A); alloc(same size) gives A again. Under g_lock. */
struct block *arena_alloc(struct arena *a, size_t req) {
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

void arena_release(struct arena *a, struct block *b) {
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

struct arena *arena_of(uintptr_t p) {
    if (arena_contains(&g_main, p))
        return &g_main;
    if (arena_contains(&g_low, p))
        return &g_low;
    return NULL;
}

/* The live allocation that starts at p (under g_lock). */
struct block *live_block_at(uintptr_t p, struct arena **ap) {
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
int low_arena_ready(void) {
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

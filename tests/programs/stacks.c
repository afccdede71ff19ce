// link: cudart
// cflags: -O2 -g0 -fomit-frame-pointer
/* Call stacks (issue 13), built the way libraries users run are: -O2, no debug information, no
 * frame pointers. Each scenario allocates and frees in functions of their own (never inlined,
 * never cloned), so the stacks in the trace must name them through the symbol table alone.
 *
 *   stacks stale       allocate in stacks_make_buffer, free in stacks_release_buffer, then a
 *                      stale write through the freed pointer (as stale_write.c)
 *   stacks sites N     N allocations (and frees), in turn from three call sites
 *   stacks late N      as stale (allocated in stacks_make_buffer, freed in
 *                      stacks_release_buffer, then the stale write), then N allocations and
 *                      frees from the three sites: the write is found at exit, long after
 *   stacks deep D      one allocation D calls deep (stacks_recurse), for the depth limit
 *   stacks bench N D   N allocations and frees D calls deep (isolate-bench: cost per stack)
 *   stacks rbp N       N allocations and frees from one site that holds a value of its own
 *                      in rbp (another each call) across them, as code built without frame
 *                      pointers does: the walks' saved rbp words differ, their frames not
 *   stacks fprbp N     as rbp, called through a function built with frame pointers (its
 *                      frame's rule unwinds through its saved rbp, a stack address): the walks
 *                      use one saved rbp and not the other
 */
#include "common.h"

#define SIZE (1 << 20)
#define NOINLINE __attribute__((noinline, noclone))

NOINLINE void *stacks_make_buffer(size_t n) {
    void *p = NULL;
    int rc = cudaMalloc(&p, n);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", n, AP(rc, U64(p), "a"));
    return p;
}

NOINLINE void stacks_release_buffer(void *p) {
    int rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@a");
}

static int stale(void) {
    void *a = stacks_make_buffer(SIZE);
    stacks_release_buffer(a);
    void *b = NULL;
    int rc = cudaMalloc(&b, SIZE);
    ev("cudaMalloc", rc, "size=%d ptr=%s", SIZE, AP(rc, U64(b), "b"));
    /* the stale write */
    rc = cudaMemset((char *)a + 4096, 0x11, 16);
    say("cudaMemset through a %d", rc);
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");
    return 0;
}

/* The three sites: each allocates and frees through the same two calls. */
static volatile int sink;
NOINLINE void stacks_free_one(void *p) { sink += cudaFree(p); }
NOINLINE void stacks_site_a(void) { void *p; sink += cudaMalloc(&p, 256); stacks_free_one(p); }
NOINLINE void stacks_site_b(void) { void *p; sink += cudaMalloc(&p, 512); stacks_free_one(p); }
NOINLINE void stacks_site_c(void) { void *p; sink += cudaMalloc(&p, 768); stacks_free_one(p); }

NOINLINE void stacks_sites(long n) {
    for (long i = 0; i < n; i++) {
        switch (i % 3) {
        case 0: stacks_site_a(); break;
        case 1: stacks_site_b(); break;
        default: stacks_site_c(); break;
        }
    }
}

/* The stale write first, then `n` allocations and frees: found at exit, after all of them. */
static int late(long n) {
    void *a = stacks_make_buffer(SIZE);
    stacks_release_buffer(a);
    int rc = cudaMemset((char *)a + 4096, 0x11, 16);
    say("cudaMemset through a %d", rc);
    stacks_sites(n);
    say("late %ld done", n);
    return 0;
}

NOINLINE int stacks_recurse(int d) {
    if (d <= 1) {
        void *p = NULL;
        int rc = cudaMalloc(&p, 4096);
        ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(p), "d"));
        rc = cudaFree(p);
        ev("cudaFree", rc, "ptr=@d");
        return rc;
    }
    int r = stacks_recurse(d - 1);
    sink += d; /* not a tail call */
    return r;
}

NOINLINE int stacks_bench(int d, long n) {
    if (d > 1) {
        int r = stacks_bench(d - 1, n);
        sink += d; /* not a tail call */
        return r;
    }
    for (long i = 0; i < n; i++) {
        void *p;
        sink += cudaMalloc(&p, 256);
        sink += cudaFree(p);
    }
    return 0;
}

/* rbp holds i * 7919 across both calls: the hooks' frames save it, so each walk reads a
 * saved word that differs from the last one's, and starts with another rbp. */
NOINLINE void stacks_rbp_site(long i) {
    register long v asm("rbp") = i * 7919;
    asm volatile("" : "+r"(v));
    void *p;
    sink += cudaMalloc(&p, 256);
    asm volatile("" : "+r"(v));
    sink += (int)v;
    sink += cudaFree(p);
}

/* Built with a frame pointer: unwinding its frame uses its saved rbp. */
__attribute__((noinline, noclone, optimize("no-omit-frame-pointer"))) void
stacks_fp_caller(long i) {
    stacks_rbp_site(i);
    sink += 1; /* not a tail call */
}

int main(int argc, char **argv) {
    setup();
    const char *what = argc > 1 ? argv[1] : "stale";
    if (!strcmp(what, "stale"))
        return stale();
    if (!strcmp(what, "sites")) {
        long n = argc > 2 ? atol(argv[2]) : 1000;
        stacks_sites(n);
        say("sites %ld done", n);
        return 0;
    }
    if (!strcmp(what, "late"))
        return late(argc > 2 ? atol(argv[2]) : 70000);
    if (!strcmp(what, "deep")) {
        int d = argc > 2 ? atoi(argv[2]) : 10;
        return stacks_recurse(d) != 0;
    }
    if (!strcmp(what, "rbp")) {
        long n = argc > 2 ? atol(argv[2]) : 1000;
        for (long i = 0; i < n; i++)
            stacks_rbp_site(i);
        return 0;
    }
    if (!strcmp(what, "fprbp")) {
        long n = argc > 2 ? atol(argv[2]) : 1000;
        for (long i = 0; i < n; i++)
            stacks_fp_caller(i);
        return 0;
    }
    if (!strcmp(what, "bench") && argc > 3)
        return stacks_bench(atoi(argv[3]), atol(argv[2]));
    fprintf(stderr, "usage: stacks stale | sites N | late N | deep D | bench N D | rbp N | fprbp N\n");
    return 2;
}

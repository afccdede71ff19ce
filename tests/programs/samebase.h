/* The body of libsamebase_a.so and libsamebase_b.so (samebase_a.c, samebase_b.c): the same
 * code under two file names, so that one loaded where the other was unloaded has its
 * functions at the same addresses. */
#include "common.h"

__attribute__((noinline)) int samebase_alloc(const char *tag) {
    void *p = NULL;
    int rc = cudaMalloc(&p, 4096);
    ev_tag = tag;
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(p), tag));
    int f = cudaFree(p);
    ev("cudaFree", f, "ptr=%s", L(U64(p), tag));
    ev_tag = NULL;
    return rc * 1000 + f;
}

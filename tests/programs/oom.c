// link: cudart
/* Allocate until out of memory (run with a small STANDIN_MEM_BYTES), free half, allocate
 * again: OOM stays exactly cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY, every
 * failure is an event, and memory freed is memory available. */
#include "common.h"

typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_free)(CUdeviceptr);

#define CHUNK (1 << 20)
#define MAX 4096

static void *p[MAX];
static CUdeviceptr q[MAX];

int main(void) {
    setup();
    char label[32];
    int rc, n = 0;
    for (;;) {
        if (n == MAX)
            return 1;
        rc = cudaMalloc(&p[n], CHUNK);
        snprintf(label, sizeof label, "p%d", n);
        ev("cudaMalloc", rc, "size=%d ptr=%s", CHUNK, AP(rc, U64(p[n]), label));
        if (rc != 0)
            break;
        n++;
    }
    say("allocated %d then %d", n, rc);
    int e1 = cudaGetLastError();
    int e2 = cudaGetLastError();
    say("cudaGetLastError %d then %d", e1, e2);
    int freed = 0;
    for (int i = 0; i < n; i += 2) {
        rc = cudaFree(p[i]);
        ev("cudaFree", rc, "ptr=@p%d", i);
        freed += rc == 0;
    }
    say("freed %d", freed);
    int again = 0;
    for (;;) {
        void *x = NULL;
        rc = cudaMalloc(&x, CHUNK);
        snprintf(label, sizeof label, "r%d", again);
        ev("cudaMalloc", rc, "size=%d ptr=%s", CHUNK, AP(rc, U64(x), label));
        if (rc != 0)
            break;
        p[again * 2] = x;
        again++;
        if (again * 2 >= MAX)
            return 1;
    }
    say("allocated again %d (freed %d) then %d", again, freed, rc);
    say("cudaGetLastError %d", cudaGetLastError());
    for (int i = 1; i < n; i += 2) {
        rc = cudaFree(p[i]);
        ev("cudaFree", rc, "ptr=@p%d", i);
    }
    for (int i = 0; i < again; i++) {
        rc = cudaFree(p[i * 2]);
        ev("cudaFree", rc, "ptr=@r%d", i);
    }

    /* the driver path: same story, CUDA_ERROR_OUT_OF_MEMORY */
    drv_open();
    PFN_alloc memAlloc = (PFN_alloc)drv_sym("cuMemAlloc", 12000, 0);
    PFN_free memFree = (PFN_free)drv_sym("cuMemFree", 12000, 0);
    if (!memAlloc || !memFree)
        return 1;
    int m = 0;
    for (;;) {
        if (m == MAX)
            return 1;
        rc = memAlloc(&q[m], CHUNK);
        snprintf(label, sizeof label, "q%d", m);
        ev("cuMemAlloc_v2", rc, "size=%d ptr=%s", CHUNK, AP(rc, q[m], label));
        if (rc != 0)
            break;
        m++;
    }
    say("driver allocated %d then %d", m, rc);
    for (int i = 0; i < m; i++) {
        rc = memFree(q[i]);
        ev("cuMemFree_v2", rc, "ptr=@q%d", i);
    }
    say("done");
    return 0;
}

// link: cudart
/* The planted bug of the call-path notes, section 6: a write through a pointer kept after its
 * free lands in the allocation that got the address back. */
#include "common.h"

#define SIZE (1 << 20)

int main(void) {
    setup();
    void *a = NULL, *b = NULL;
    int rc = cudaMalloc(&a, SIZE);
    ev("cudaMalloc", rc, "size=%d ptr=%s", SIZE, AP(rc, U64(a), "a"));
    rc = cudaMemset(a, 0, SIZE);
    say("cudaMemset a %d", rc);
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    rc = cudaMalloc(&b, SIZE);
    ev("cudaMalloc", rc, "size=%d ptr=%s", SIZE, AP(rc, U64(b), "b"));
    rc = cudaMemset(b, 0, SIZE);
    say("cudaMemset b %d", rc);
    /* the stale write */
    rc = cudaMemset((char *)a + 4096, 0x11, 16);
    say("cudaMemset through a %d", rc);
    static unsigned char host[SIZE];
    rc = cudaMemcpy(host, b, SIZE, cudaMemcpyDeviceToHost);
    size_t changed = 0, first = SIZE;
    for (size_t i = 0; i < SIZE; i++)
        if (host[i] != 0) {
            changed++;
            if (first == SIZE)
                first = i;
        }
    say("cudaMemcpy %d", rc);
    say("b==a %d", b == a);
    say("b changed %d bytes %zu first %zu", changed != 0, changed, changed ? first : 0);
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");
    say("done");
    return 0;
}

// link: cudart
/* A thread that changes the environment (setenv and unsetenv of many variables, so that glibc
 * reallocates and frees `environ` under any reader) while the main thread makes the first CUDA
 * allocation, which starts the trace. Nothing may read the environment then but the program itself:
 * a `getenv` on another thread can walk a freed array and crash (issue 33.4). Prints one line
 * and the allocation's result; exits 0. */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

static atomic_int stop;
static atomic_int started;

static void *hammer(void *arg) {
    (void)arg;
    char name[32], value[32];
    atomic_store(&started, 1);
    while (!atomic_load(&stop)) {
        for (int i = 0; i < 256; i++) {
            snprintf(name, sizeof name, "HAMMER_%d", i);
            snprintf(value, sizeof value, "%d", i);
            setenv(name, value, 1);
        }
        for (int i = 0; i < 256; i++) {
            snprintf(name, sizeof name, "HAMMER_%d", i);
            unsetenv(name);
        }
    }
    return NULL;
}

int main(void) {
    setup();
    /* CUDA initialised first (it reads the environment, as the real driver does: that race
     * would be the program's own), with calls that start no trace. */
    int n = -1;
    int rc = cudaGetDeviceCount(&n);
    say("cudaGetDeviceCount %d n=%d", rc, n);
    rc = cudaSetDevice(0);
    say("cudaSetDevice %d", rc);
    pthread_t t;
    pthread_create(&t, NULL, hammer, NULL);
    while (!atomic_load(&started))
        ;
    void *p = NULL;
    rc = cudaMalloc(&p, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(p), "p"));
    rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@p");
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    say("done");
    return 0;
}

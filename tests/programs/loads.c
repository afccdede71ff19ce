// link: cudart
/* loads [LIB…]: dlopen()s each LIB (RTLD_NOW), then makes one CUDA allocation and frees it (the
 * trace starts at the allocation). With bin/libc10_cuda.so or bin/libxla_extension.so (empty
 * libraries named as PyTorch's and JAX's are) it is a program that has loaded a framework, as far
 * as the library can tell. */
#include "common.h"
#include <dlfcn.h>

int main(int argc, char **argv) {
    setup();
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        say("dlopen %s %s", argv[i], h ? "ok" : dlerror());
    }
    void *a = NULL;
    int rc = cudaMalloc(&a, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(a), "a"));
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    return 0;
}

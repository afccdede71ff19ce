// link: none
/* The runtime reached through dlsym on its handle, as ctypes, cffi and JIT runtimes reach it:
 * dlopen("libcudart.so.13", RTLD_LOCAL), dlsym(h, "cudaMalloc"), call. Each call is one event
 * under its runtime name (not the driver's cuMemAlloc_v2 underneath).
 *
 * Then a second copy of the runtime (the same file copied to a temporary directory, loaded by
 * path): its functions are not the ones the hooks call, so dlsym hands out its own and its
 * allocations are seen at the driver only. Last, a failing call through the first handle's
 * cudaMalloc sets the first copy's last error and not the second's: the hook still calls the
 * first copy. */
#include "common.h"

#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>

typedef cudaError_t (*PFN_malloc)(void **, size_t);
typedef cudaError_t (*PFN_free)(void *);
typedef cudaError_t (*PFN_mallocAsync)(void **, size_t, cudaStream_t);
typedef cudaError_t (*PFN_freeAsync)(void *, cudaStream_t);
typedef cudaError_t (*PFN_sync)(void);
typedef cudaError_t (*PFN_lastError)(void);

/* Copies the file at FROM to TO; 0 on success. */
static int copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY);
    if (in < 0)
        return -1;
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    if (out < 0) {
        close(in);
        return -1;
    }
    char buf[1 << 16];
    ssize_t n;
    int rc = 0;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) {
            rc = -1;
            break;
        }
    if (n < 0)
        rc = -1;
    close(in);
    close(out);
    return rc;
}

#define SYM(h, var, type, name)                                                                \
    type var = (type)dlsym(h, name);                                                           \
    if (!var) {                                                                                \
        say("dlsym %s missing", name);                                                         \
        return 1;                                                                              \
    }

int main(void) {
    setup();
    void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    say("dlopen libcudart.so.13 %d", h != NULL);
    if (!h)
        return 1;
    SYM(h, rtMalloc, PFN_malloc, "cudaMalloc");
    SYM(h, rtFree, PFN_free, "cudaFree");
    SYM(h, rtMallocHost, PFN_malloc, "cudaMallocHost");
    SYM(h, rtFreeHost, PFN_free, "cudaFreeHost");
    SYM(h, rtMallocAsync, PFN_mallocAsync, "cudaMallocAsync");
    SYM(h, rtFreeAsync, PFN_freeAsync, "cudaFreeAsync");
    SYM(h, rtSync, PFN_sync, "cudaDeviceSynchronize");
    SYM(h, rtLastError, PFN_lastError, "cudaGetLastError");
    /* The same name asked twice gets the same function. */
    say("dlsym cudaMalloc twice same %d", dlsym(h, "cudaMalloc") == (void *)rtMalloc);
    dlerror();
    void *none = dlsym(h, "cudaMallocNoSuchThing");
    const char *e = dlerror();
    say("missing: null %d dlerror set %d", none == NULL, e != NULL);

    void *a = NULL, *b = NULL, *hp = NULL, *x = NULL;
    int rc = rtMalloc(&a, 4096);
    ev("cudaMalloc", rc, "size=4096 ptr=%s", AP(rc, U64(a), "a"));
    rc = rtMalloc(&b, 1 << 20);
    ev("cudaMalloc", rc, "size=1048576 ptr=%s", AP(rc, U64(b), "b"));
    say("a!=0 %d b!=0 %d a!=b %d", a != NULL, b != NULL, a != b);
    rc = rtFree(a);
    ev("cudaFree", rc, "ptr=@a");
    rc = rtFree(b);
    ev("cudaFree", rc, "ptr=@b");
    rc = rtMallocHost(&hp, 8192);
    ev("cudaMallocHost", rc, "size=8192 ptr=%s", AP(rc, U64(hp), "hp"));
    if (rc == 0) {
        memset(hp, 1, 8192);
        say("host memory writable 1");
    }
    rc = rtFreeHost(hp);
    ev("cudaFreeHost", rc, "ptr=@hp");
    rc = rtMallocAsync(&x, 512, NULL);
    ev("cudaMallocAsync", rc, "size=512 stream=0 ptr=%s", AP(rc, U64(x), "x"));
    rc = rtFreeAsync(x, NULL);
    ev("cudaFreeAsync", rc, "ptr=@x stream=0");
    say("cudaDeviceSynchronize %d", rtSync());

    /* A second copy of the runtime, loaded by path. */
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name[0]) {
        say("dlinfo failed");
        return 1;
    }
    char dir[] = "/tmp/rt_dlsym.XXXXXX";
    if (!mkdtemp(dir)) {
        say("mkdtemp failed");
        return 1;
    }
    char copy[sizeof dir + 32];
    snprintf(copy, sizeof copy, "%s/libcudart.so.13", dir);
    int copied = copy_file(lm->l_name, copy);
    void *h2 = copied == 0 ? dlopen(copy, RTLD_NOW | RTLD_LOCAL) : NULL;
    unlink(copy);
    rmdir(dir);
    say("second copy loaded %d distinct %d", h2 != NULL, h2 != NULL && h2 != h);
    if (!h2)
        return 1;
    SYM(h2, cpMalloc, PFN_malloc, "cudaMalloc");
    SYM(h2, cpFree, PFN_free, "cudaFree");
    SYM(h2, cpLastError, PFN_lastError, "cudaGetLastError");
    say("second copy's cudaMalloc is another function %d", (void *)cpMalloc != (void *)rtMalloc);
    void *c = NULL;
    rc = cpMalloc(&c, 2048);
    ev("cuMemAlloc_v2", rc, "size=2048 ptr=%s", AP(rc, U64(c), "c"));
    rc = cpFree(c);
    ev("cuMemFree_v2", rc, "ptr=@c");

    /* The first handle's functions still call the first copy. */
    say("last errors before %d %d", rtLastError(), cpLastError());
    rc = rtMalloc(NULL, 16);
    ev("cudaMalloc", rc, "size=16 ptr=0");
    int first = rtLastError(), second = cpLastError();
    say("last error: first copy %d second copy %d", first, second);
    void *d = NULL;
    rc = rtMalloc(&d, 256);
    ev("cudaMalloc", rc, "size=256 ptr=%s", AP(rc, U64(d), "d"));
    rc = rtFree(d);
    ev("cudaFree", rc, "ptr=@d");
    say("done");
    return 0;
}

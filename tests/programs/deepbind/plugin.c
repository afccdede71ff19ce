// shared: libdeepbind_plugin.so
// link: cudart cuda
/* A plugin, as a host opens it with RTLD_DEEPBIND (main.c; tests/tests/deepbind.rs): linked
 * against the runtime and the driver, so that with RTLD_DEEPBIND its calls bind to them before
 * the global scope, where the preloaded hooks are. plugin_run() allocates and frees through
 * every way a plugin reaches them:
 *
 *   - the runtime, called (R_X86_64_JUMP_SLOT) and through its address (R_X86_64_GLOB_DAT, in
 *     the RELRO pages);
 *   - the driver, called;
 *   - the driver's resolver (cuGetProcAddress_v2, called), and a driver function fetched by name
 *     with the plugin's own dlsym (which RTLD_DEEPBIND binds to libc's, past the preload).
 *
 * One `ev` line per call that must be recorded. Lines that show where memory came from or what
 * freed memory holds (`b==a`, `a after free bytes`, `b changed`) differ in isolate mode by
 * design. Where the plugin's function pointers lead goes to stderr (`plugin: NAME in FILE`). Also
 * built with -Wl,-z,now as libdeepbind_plugin_now.so (tests/build.rs): every slot bound at load
 * and read-only. */
#include "../common.h"

#define SIZE 65536

typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*PFN_free)(CUdeviceptr);

/* Also defined, as 1, by libdeepbind_other.so, loaded RTLD_GLOBAL before this one. */
int deepbind_probe(void);
int deepbind_probe(void) { return 2; }

/* The file (without directories) the function at P lies in. */
static const char *file_of(const void *p) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_fname)
        return "-";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

/* What N bytes at P hold: "all 0xNN" or "mixed". Stand-in device memory is host memory. */
static void bytes(const char *what, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i = 1;
    while (i < n && b[i] == b[0])
        i++;
    if (i == n)
        say("%s bytes: all 0x%02x", what, b[0]);
    else
        say("%s bytes: mixed", what);
}

int plugin_run(void);

int plugin_run(void) {
    say("probe %d", deepbind_probe());

    /* Through its address: a GLOB_DAT slot. */
    cudaError_t (*volatile free_ptr)(void *) = cudaFree;
    CUresult (*volatile launch_ptr)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, CUstream, void **, void **) =
        cuLaunchKernel;
    fprintf(stderr, "plugin: cudaFree in %s\n", file_of((const void *)free_ptr));
    fprintf(stderr, "plugin: cuLaunchKernel in %s\n", file_of((const void *)launch_ptr));

    /* The runtime. */
    void *a = NULL, *b = NULL;
    int rc = cudaMalloc(&a, SIZE);
    ev("cudaMalloc", rc, "size=%d ptr=%s", SIZE, AP(rc, U64(a), "a"));
    if (rc)
        return 1;
    say("cudaMemset a %d", cudaMemset(a, 0x11, SIZE));
    rc = free_ptr(a);
    ev("cudaFree", rc, "ptr=@a");
    bytes("a after free", a, SIZE);
    rc = cudaMalloc(&b, SIZE);
    ev("cudaMalloc", rc, "size=%d ptr=%s", SIZE, AP(rc, U64(b), "b"));
    if (rc)
        return 1;
    say("cudaMemset b %d", cudaMemset(b, 0, SIZE));
    say("b==a %d", b == a);
    /* A stale write, straight through the freed pointer. */
    ((volatile unsigned char *)a)[100] = 0x44;
    say("b changed %d", ((volatile unsigned char *)b)[100] != 0);
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");

    /* The driver (the runtime made a context current on this thread). */
    CUdeviceptr d = 0;
    rc = cuMemAlloc_v2(&d, 4096);
    ev("cuMemAlloc_v2", rc, "size=4096 ptr=%s", AP(rc, d, "d"));
    rc = cuMemFree_v2(d);
    ev("cuMemFree_v2", rc, "ptr=@d");

    /* The resolver, and a driver function by name through the plugin's own dlsym. */
    void *p = NULL;
    CUdriverProcAddressQueryResult st = 99;
    rc = cuGetProcAddress_v2("cuMemAlloc", &p, 12000, 0, &st);
    say("cuGetProcAddress_v2(cuMemAlloc) %d status %d found %d", rc, st, p != NULL);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    PFN_free by_name = drv ? (PFN_free)dlsym(drv, "cuMemFree_v2") : NULL;
    say("dlsym(cuMemFree_v2) found %d", by_name != NULL);
    if (!p || !by_name)
        return 1;
    CUdeviceptr e = 0;
    rc = ((PFN_alloc)p)(&e, 8192);
    ev("cuMemAlloc_v2", rc, "size=8192 ptr=%s", AP(rc, e, "e"));
    rc = by_name(e);
    ev("cuMemFree_v2", rc, "ptr=@e");
    return 0;
}

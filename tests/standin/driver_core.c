/*
 * The stand-in driver (see driver_internal.h): configuration and shared state, setup,
 * the fork handlers, cuInit, devices, contexts, cuMemGetInfo and the error names.
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ================================================================ configuration, state */

/* g_lock guards every table (of all the driver files); g_exec (recursive) is held while stream
 * operations run, so that at most one operation runs at a time (one "device"), in order. */
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_exec = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

static pthread_once_t g_setup_once = PTHREAD_ONCE_INIT;
static CUresult g_setup_result;
atomic_int g_initialized;
/* Set by standin_shutdown (the runtime's exit handler): every later call that needs the driver
 * answers CUDA_ERROR_DEINITIALIZED. */
atomic_int g_unloaded;

void standin_shutdown(void) { atomic_store_explicit(&g_unloaded, 1, memory_order_release); }

int g_ndev = 1;
size_t g_capacity = (size_t)1 << 30;
/* STANDIN_LAUNCH_ROOM: a kernel's first launch or query, and a module's load, fail with out of
 * memory while less than this is free, as real ones do when the driver cannot load a kernel's
 * module (lazy loading) or grow its local memory. 0: never. */
size_t g_launch_room = 0;
unsigned g_slow_fill_ms = 0;
int g_no_param_count = 0;
size_t g_gran = (size_t)64 << 10;
int g_sync;
size_t g_used; /* bytes held: arena blocks + cuMemCreate handles */

static struct CUctx_st g_primary[MAX_DEVICES];
static struct CUctx_st *g_contexts; /* cuCtxCreate'd */
__thread CUcontext t_ctx;
/* The context of the kernel running on this thread (NULL outside a kernel). */
__thread CUcontext t_kernel_ctx;

size_t g_va_limit; /* STANDIN_VA_BYTES, 0: no limit */

/* The sticky error of the calling thread's current context (0: none). */
CUresult ctx_fault(void) {
    return t_ctx ? (CUresult)atomic_load(&t_ctx->fault) : CUDA_SUCCESS;
}

static size_t parse_size(const char *s, size_t dflt) {
    if (!s || !*s)
        return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s)
        return dflt;
    while (*end == ' ')
        end++;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; break;
    case 'm': case 'M': mul = 1ull << 20; break;
    case 'g': case 'G': mul = 1ull << 30; break;
    case 't': case 'T': mul = 1ull << 40; break;
    default: break;
    }
    return (size_t)(v * mul);
}

int is_pow2(size_t v) { return v && !(v & (v - 1)); }

size_t round_up(size_t v, size_t a) {
    size_t r = (v + a - 1) & ~(a - 1);
    return r < v ? 0 : r; /* 0 on overflow */
}

/* ================================================================ setup, init, checks */

/* STANDIN_UUID as read at initialisation: 0 not set (or not 32 characters), 1 its 16 bytes
 * in g_fixed_uuid, -1 set but not hex (every ask then fails, as a malformed value did). */
static int g_fixed_uuid_set;
static unsigned char g_fixed_uuid[16];

static void setup(void) {
    const char *s = getenv("STANDIN_DEVICES");
    if (s && *s) {
        long n = strtol(s, NULL, 10);
        g_ndev = n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : (int)n;
    }
    g_capacity = parse_size(getenv("STANDIN_MEM_BYTES"), g_capacity);
    size_t gran = parse_size(getenv("STANDIN_GRANULARITY"), g_gran);
    long page = sysconf(_SC_PAGESIZE);
    if (is_pow2(gran) && gran >= (size_t)page)
        g_gran = gran;
    s = getenv("STANDIN_SYNC");
    g_sync = s && *s && strcmp(s, "0") != 0;
    g_va_limit = parse_size(getenv("STANDIN_VA_BYTES"), 0);
    g_launch_room = parse_size(getenv("STANDIN_LAUNCH_ROOM"), 0);
    g_slow_fill_ms = (unsigned)parse_size(getenv("STANDIN_SLOW_FILL_MS"), 0);
    g_no_param_count = parse_size(getenv("STANDIN_NO_PARAM_COUNT"), 0) == 1;
    /* Read here, at initialisation, as a real driver reads its environment: not later, where
     * a program's own setenv on another thread could free the array under the read (the
     * library asks for a device's UUID at its first free; environment.rs's setenv_race
     * crashed in about 1 of 100 runs under load while this was read there). */
    s = getenv("STANDIN_UUID");
    if (s && strlen(s) == 32) {
        g_fixed_uuid_set = 1;
        for (int i = 0; i < 16 && g_fixed_uuid_set == 1; i++) {
            unsigned v = 0;
            if (sscanf(s + 2 * i, "%2x", &v) != 1)
                g_fixed_uuid_set = -1;
            g_fixed_uuid[i] = (unsigned char)v;
        }
    }
    for (int i = 0; i < MAX_DEVICES; i++) {
        g_primary[i].device = i;
        g_primary[i].primary = 1;
        g_primary[i].alive = 1;
    }
    if (g_ndev == 0) {
        g_setup_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    size_t size = round_up(g_capacity ? g_capacity : 1, (size_t)page);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED || arena_init(&g_main, p, size)) {
        g_setup_result = CUDA_ERROR_OUT_OF_MEMORY;
        return;
    }
    g_setup_result = CUDA_SUCCESS;
}

/* A fork while another thread holds the locks must not leave the child deadlocked. */
static void fork_prepare(void) {
    pthread_mutex_lock(&g_exec);
    pthread_mutex_lock(&g_lock);
}
static void fork_parent(void) {
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_exec);
}
/* The child's only thread has a new id, which a recursive mutex's owner no longer matches:
 * made anew rather than unlocked. */
static void fork_child(void) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_exec, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_mutex_init(&g_lock, NULL);
}
__attribute__((constructor)) static void register_fork_handlers(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int valid_device(CUdevice d) { return d >= 0 && d < g_ndev; }

static int valid_ctx(CUcontext c) {
    for (int i = 0; i < g_ndev; i++)
        if (c == &g_primary[i])
            return 1;
    int ok = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUctx_st *x = g_contexts; x; x = x->next)
        if (x == c && x->alive)
            ok = 1;
    pthread_mutex_unlock(&g_lock);
    return ok;
}

CUresult cuInit(unsigned int Flags) {
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_setup_once, setup);
    if (g_setup_result != CUDA_SUCCESS)
        return g_setup_result;
    atomic_store_explicit(&g_initialized, 1, memory_order_release);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    NEED_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Stand-in CUDA Device %d", dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_capacity;
    return CUDA_SUCCESS;
}

/* A device's UUID. The stand-in's devices are each process's own (its memory is the process's),
 * so each process's are different: the process id and the ordinal in its bytes. STANDIN_UUID
 * (32 hex digits) names device 0 of processes meant to share one (the quarantine's tenants). */
static CUresult device_uuid(unsigned char *uuid, CUdevice dev) {
    NEED_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (g_fixed_uuid_set && dev == 0) {
        if (g_fixed_uuid_set < 0)
            return CUDA_ERROR_INVALID_VALUE;
        memcpy(uuid, g_fixed_uuid, 16);
        return CUDA_SUCCESS;
    }
    memset(uuid, 0, 16);
    unsigned pid = (unsigned)getpid();
    memcpy(uuid, "standin", 7);
    memcpy(uuid + 8, &pid, sizeof pid);
    uuid[12] = (unsigned char)dev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    return device_uuid(uuid ? (unsigned char *)uuid->bytes : NULL, dev);
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    return device_uuid(uuid ? (unsigned char *)uuid->bytes : NULL, dev);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    g_primary[dev].refcount++;
    pthread_mutex_unlock(&g_lock);
    *pctx = &g_primary[dev];
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev) {
    NEED_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    if (g_primary[dev].refcount > 0 && --g_primary[dev].refcount == 0)
        atomic_store(&g_primary[dev].fault, 0); /* a reset, as cudaDeviceReset */
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev); }

/* cudaDeviceReset's call: the primary context's state and memory are gone (every live device
 * allocation freed, what it held lost), its refcount 0, its fault cleared. */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    NEED_INIT();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    reset_device_memory();
    pthread_mutex_lock(&g_lock);
    g_primary[dev].refcount = 0;
    atomic_store(&g_primary[dev].fault, 0);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }
/* The pre-11.0 export, which libcudart 13 still asks for (cuDevicePrimaryCtxReset at version
 * 7000): the same reset. */
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->device = dev;
    c->alive = 1;
    pthread_mutex_lock(&g_lock);
    c->next = g_contexts;
    g_contexts = c;
    pthread_mutex_unlock(&g_lock);
    t_ctx = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    NEED_INIT();
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUctx_st **pp = &g_contexts; *pp; pp = &(*pp)->next)
        if (*pp == ctx && ctx->alive) {
            ctx->alive = 0; /* kept: a stale handle must stay readable */
            *pp = ctx->next;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx == ctx)
        t_ctx = NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    NEED_INIT();
    if (ctx && !valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = ctx;
    return CUDA_SUCCESS;
}

/* cuCtxGetDevice calls made with no context current: each a line in a real driver's error log
 * (CUDA_LOG_FILE). */
static atomic_ulong g_ctx_device_errors;
unsigned long standin_ctx_device_errors(void) { return atomic_load(&g_ctx_device_errors); }

CUresult cuCtxGetDevice(CUdevice *device) {
    if (g_initialized && !t_ctx)
        atomic_fetch_add(&g_ctx_device_errors, 1);
    NEED_CTX();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = t_ctx->device;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    NEED_CTX();
    if (!free_ || !total)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    *free_ = g_capacity - g_used;
    *total = g_capacity;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* ================================================================ errors */

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **pStr, int text) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == error) {
            *pStr = text ? g_errors[i].text : g_errors[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr) { return error_lookup(error, pStr, 0); }
CUresult cuGetErrorString(CUresult error, const char **pStr) {
    return error_lookup(error, pStr, 1);
}

/*
 * libcuda.so.1 — a stand-in CUDA driver backed by host memory.
 *
 * Device addresses are plain host addresses: test programs can read and write device memory
 * directly. Everything here follows the real driver's ABI (names, signatures, error codes);
 * what it cannot do (run device code) is played by host functions registered with
 * standin_register_kernel.
 *
 * Environment:
 *   STANDIN_DEVICES      number of devices (default 1; 0 makes cuInit fail with NO_DEVICE)
 *   STANDIN_MEM_BYTES    device memory, shared by all devices (default 1 GiB; K/M/G suffixes)
 *   STANDIN_GRANULARITY  VMM granularity (default 64 KiB; a power of two, at least a page)
 *   STANDIN_SYNC=1       run every stream operation at once instead of in stream order
 *   STANDIN_VA_BYTES     address space that cuMemAddressReserve may hold at once (default: no
 *                        limit; K/M/G suffixes): a reservation that would go over it fails
 *                        with CUDA_ERROR_OUT_OF_MEMORY, as a driver does when the GPU's virtual
 *                        address space runs out
 *
 * Device faults. standin_touch(p, n) is what a kernel's access to [p, p+n) does on a GPU: it
 * returns 1 when every byte is accessible (checked with process_vm_readv on this process, so
 * unmapped and PROT_NONE memory, such as reserved or freed VMM space, is found without a
 * SIGSEGV); otherwise it returns 0 and the context faults: the context the kernel was launched
 * in (outside a kernel, the calling thread's current context) gets the sticky error
 * CUDA_ERROR_ILLEGAL_ADDRESS (700). From then on, in that context, cuCtxSynchronize,
 * cuStreamSynchronize/Query, cuEventSynchronize/Query/Record, kernel launches, device
 * allocations and frees (cuMemAlloc*, cuMemFree*, cuMemAllocManaged, cuMemAllocPitch) and
 * copies and sets return 700, and its kernels still queued do not run. The error stays until
 * the context is destroyed (cuCtxDestroy) or its primary context's last reference is released;
 * other calls (context queries, VMM, host memory, modules) are unaffected. Nothing else sets
 * it: without standin_touch the stand-in never faults.
 *
 * Other stand-in-only exports (also in the cuGetProcAddress table): standin_register_kernel,
 * standin_reregister_kernel (another kernel under an existing handle, as a driver reuses a
 * CUfunction's address after a module unload; not in cuda_standin.h nor forwarded by the
 * runtime: programs reach it with dlsym on libcuda),
 * standin_param_info_calls, standin_kernels_run, and standin_reserved (the reservations held
 * now, and their bytes). See cuda_standin.h.
 *
 * Every exported function is a distinct function (never an alias), and every internal helper
 * is static, or, when other files of the library use it, declared in this header with hidden
 * visibility (HIDDEN): exports never call exports, so a preloaded library that overrides
 * driver names never sees the driver's own inner calls, and the library exports exactly the
 * driver's names and the stand-in's. The library is linked -Bsymbolic so that the addresses in
 * the cuGetProcAddress table are this library's functions, never an interposer's (the table is
 * never filled by dlsym).
 *
 * The sources, one per API area, all compiled into libcuda.so.1 (tests/build.rs):
 *   driver_internal.h  this header: the state, types and helpers the files share
 *   driver_core.c      settings and shared state, setup, fork handlers, cuInit, devices,
 *                      contexts, cuMemGetInfo, cuGetErrorName/String
 *   driver_arena.c     the device arena (first fit, recently freed addresses first) and the
 *                      32-bit low arena of the v1 cuMemAlloc
 *   driver_stream.c    streams, events, the queue of stream operations
 *   driver_memory.c    memory pools, device allocations (cuMemAlloc*, cuMemFree*, async, managed,
 *                      pitched), host memory (cuMemAllocHost, cuMemHostAlloc, cuMemHostRegister)
 *   driver_vmm.c       cuMemCreate, cuMemAddressReserve/Free, cuMemMap/Unmap, cuMemSetAccess,
 *                      cuMemRelease, cuMemGetAddressRange, standin_reserved
 *   driver_copy.c      copies and sets (cuMemcpy*, cuMemset*) and their range checks
 *   driver_launch.c    kernels (standin_register_kernel), modules, functions, param info,
 *                      launches, standin_touch, the stand-in counters
 *   driver_graph.c     graphs with memory allocation and free nodes
 *   driver_proc.c      cuGetProcAddress and its table
 */
#ifndef STANDIN_DRIVER_INTERNAL_H
#define STANDIN_DRIVER_INTERNAL_H

#include "cuda_standin.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Shared between the files of the library, never exported. */
#define HIDDEN __attribute__((visibility("hidden")))

#define MAX_DEVICES 16
#define ARENA_ALIGN 256
#define RECENT_MAX 256
#define DRIVER_VERSION 13000

/* Below, by the file that defines them: what the other files use. */

/* ================================================================ driver_core.c */

/* g_lock guards every table; g_exec (recursive) is held while stream operations run, so that
 * at most one operation runs at a time (one "device"), in order. */
HIDDEN extern pthread_mutex_t g_lock;
HIDDEN extern pthread_mutex_t g_exec;

HIDDEN extern atomic_int g_initialized;
HIDDEN extern atomic_int g_unloaded;
HIDDEN extern int g_ndev;
HIDDEN extern size_t g_capacity;
HIDDEN extern size_t g_launch_room; /* STANDIN_LAUNCH_ROOM (driver_core.c) */
/* STANDIN_SLOW_FILL_MS: a launch of isolate's isolate_poison_many takes that long to queue (a
 * host busy elsewhere), so that another thread's work can come in the meantime. */
HIDDEN extern unsigned g_slow_fill_ms;
/* STANDIN_NO_PARAM_COUNT=1: a driver without cuFuncGetParamCount and cuKernelGetParamCount. */
HIDDEN extern int g_no_param_count;
HIDDEN extern size_t g_gran;
HIDDEN extern int g_sync;
HIDDEN extern atomic_int g_stuck; /* standin_device_stuck: nothing on the device ever finishes */
HIDDEN void stuck_wait(void);     /* a synchronising call on a stuck device: never returns */
HIDDEN extern size_t g_used;     /* bytes held: arena blocks + cuMemCreate handles */
HIDDEN extern size_t g_va_limit; /* STANDIN_VA_BYTES, 0: no limit */

struct CUctx_st {
    int device;
    int primary;
    int alive;
    int refcount;
    atomic_int fault; /* the sticky error of a device fault (standin_touch), 0 if none */
    struct CUctx_st *next;
};
HIDDEN extern __thread CUcontext t_ctx;
/* The context of the kernel running on this thread (NULL outside a kernel). */
HIDDEN extern __thread CUcontext t_kernel_ctx;

/* The sticky error of the calling thread's current context (0: none). */
HIDDEN CUresult ctx_fault(void);
HIDDEN int is_pow2(size_t v);
/* v rounded up to a multiple of a (a power of two); 0 on overflow. */
HIDDEN size_t round_up(size_t v, size_t a);
HIDDEN int valid_device(CUdevice d);
HIDDEN int stream_capturing(struct CUstream_st *s);

#define NEED_INIT()                                                                            \
    do {                                                                                       \
        if (atomic_load_explicit(&g_unloaded, memory_order_acquire))                          \
            return CUDA_ERROR_DEINITIALIZED;                                                   \
        if (!atomic_load_explicit(&g_initialized, memory_order_acquire))                      \
            return CUDA_ERROR_NOT_INITIALIZED;                                                 \
    } while (0)

#define NEED_CTX()                                                                             \
    do {                                                                                       \
        NEED_INIT();                                                                           \
        if (!t_ctx)                                                                            \
            return CUDA_ERROR_INVALID_CONTEXT;                                                 \
    } while (0)

/* NEED_CTX, and the context has not faulted. */
#define NEED_LIVE_CTX()                                                                        \
    do {                                                                                       \
        NEED_CTX();                                                                            \
        CUresult f_ = ctx_fault();                                                             \
        if (f_)                                                                                \
            return f_;                                                                         \
    } while (0)

/* ================================================================ driver_arena.c */

enum alloc_kind { K_PLAIN, K_ASYNC, K_MANAGED, K_PITCH, K_GRAPH, K_V1, K_IPC };

struct block {
    uintptr_t addr;
    size_t size; /* rounded to ARENA_ALIGN */
    size_t req;  /* as asked */
    int used;
    int kind;
    int pending_free; /* a cuMemFreeAsync for it is queued */
    int captured;     /* allocated on a capturing stream: graph memory (see free_async) */
    struct CUmemPoolHandle_st *pool;
    struct CUgraph_st *graph;
    struct block *prev, *next;   /* all blocks, in address order */
    struct block *fprev, *fnext; /* free blocks only, in address order */
    struct block *hnext;         /* in the arena's index bucket */
};

#define INDEX_BUCKETS 4096

struct arena {
    uintptr_t base;
    size_t size;
    struct block *head;
    struct block *free_head;
    struct block *index[INDEX_BUCKETS]; /* every block, by start address */
    uintptr_t recent[RECENT_MAX];       /* recently freed addresses, newest last */
    int nrecent;
};

HIDDEN extern struct arena g_main, g_low;

HIDDEN int arena_init(struct arena *a, void *base, size_t size);
HIDDEN struct block *arena_block_containing(struct arena *a, uintptr_t p);
/* First fit, recently freed addresses first (under g_lock). */
HIDDEN struct block *arena_alloc(struct arena *a, size_t req);
HIDDEN void arena_release(struct arena *a, struct block *b);
HIDDEN struct arena *arena_of(uintptr_t p);
/* The live allocation that starts at p (under g_lock). */
HIDDEN struct block *live_block_at(uintptr_t p, struct arena **ap);
/* The 32-bit arena for the CUDA < 3.2 cuMemAlloc, made on first use (under g_lock). */
HIDDEN int low_arena_ready(void);
/* cuDevicePrimaryCtxReset's end of the device's memory (driver_memory.c). */
HIDDEN void reset_device_memory(void);

/* ================================================================ driver_stream.c */

enum op_kind { OP_MEMSET, OP_MEMCPY, OP_KERNEL, OP_FREE, OP_RECORD, OP_WAIT };

struct op {
    enum op_kind kind;
    unsigned long long seq;
    struct op *next;
    union {
        struct {
            uintptr_t dst;
            unsigned value;
            unsigned elem; /* 1 or 4 bytes */
            size_t n;
        } set;
        struct {
            uintptr_t dst, src;
            size_t n;
        } cpy;
        struct {
            standin_kernel_fn fn;
            void *buf;
            void **args;
            struct CUctx_st *ctx; /* launched in */
        } kern;
        struct {
            uintptr_t addr;
        } fr;
        struct {
            struct CUevent_st *ev;
            unsigned long gen;
        } rec;
        struct {
            struct CUstream_st *stream;
            unsigned long long seq;
        } wait;
    } u;
};

enum stream_kind { SK_LEGACY, SK_PER_THREAD, SK_REAL };

/* Which stream a handle means. `ptsz`: the call is a per-thread-default-stream export, where
 * handle 0 means the per-thread stream. */
HIDDEN CUresult resolve_stream(CUstream h, int ptsz, enum stream_kind *kind,
                               struct CUstream_st **out);
HIDDEN void run_op(struct op *o);
/* Runs every queued operation of every stream (only blocking streams: `blocking_only`). */
HIDDEN void drain_all(int blocking_only);
/* Puts o on a stream (the legacy and per-thread streams run it at once). */
HIDDEN void submit(enum stream_kind kind, struct CUstream_st *s, struct op *o);
HIDDEN struct op *new_op(enum op_kind kind);

/* ================================================================ driver_memory.c */

/* Under g_lock. */
HIDDEN void pool_account(struct CUmemPoolHandle_st *pool, long long delta);
/* Allocates from arena a (under g_lock). */
HIDDEN CUresult alloc_locked(uintptr_t *out, size_t req, int kind, struct arena *a);

struct hostmem {
    uintptr_t p;
    size_t size;
    int registered; /* 0: allocated here (cuMemAllocHost / cuMemHostAlloc), 1: registered */
    unsigned flags;
    struct hostmem *next;
};
HIDDEN extern struct hostmem *g_host;

/* ================================================================ driver_vmm.c */

struct vreserve {
    uintptr_t base;
    size_t size;
    struct vreserve *next;
};
HIDDEN extern struct vreserve *g_reserves;

/* Under g_lock: 1 if [p, p+size) is covered by mappings with no gap, each with at least the
 * protection `prot`. */
HIDDEN int fully_mapped(uintptr_t p, size_t size, int prot);

/* ================================================================ driver_launch.c */

HIDDEN extern atomic_ulong g_kernels_run;

/* Exported, but not in cuda_standin.h (programs reach it with dlsym): declared here for the
 * cuGetProcAddress table. */
/* 1 when [p, p+n) is inside a module global (driver_launch.c). */
int standin_module_global(uintptr_t p, size_t n);
CUfunction standin_reregister_kernel(CUfunction f, const char *name, standin_kernel_fn fn,
                                     unsigned nparams, const size_t *offsets,
                                     const size_t *sizes);

#endif

/*
 * Shared by the test programs (not compiled on its own: build.rs compiles `*.c` only).
 *
 * Output convention, read by the harness (tests/src/lib.rs, `Expected`):
 *
 *     [TAG:] ev API RC [KEY=VALUE ...]
 *
 * one line for every call the interposer must record, in the order the calls were made, where
 * API is the exact name the trace must carry (`cudaMalloc`, `cuMemAlloc_v2`,
 * `cuMemAllocAsync_ptsz`, ...) and RC the code the call returned. KEY is one of the event
 * fields `ptr size pitch stream handle offset flags device`; VALUE is a number, or `@label`
 * (`@label+N`) for a value the program cannot print deterministically (an address, a handle):
 * the first line that names a label binds it, every later one must see the same value.
 * Every other line is free text, compared byte for byte between runs with and without the
 * preload. Calls the interposer must NOT record print lines that do not start with `ev`.
 *
 * stdout is line-buffered, so that fork never duplicates buffered output and `_exit` or a
 * fatal signal never loses it.
 */
#ifndef ISOLATE_TEST_COMMON_H
#define ISOLATE_TEST_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_standin.h"

#define MAYBE_UNUSED __attribute__((unused))

MAYBE_UNUSED static const char *ev_tag = NULL;

MAYBE_UNUSED static void setup(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

/* One `ev` line: API, result, then the printf-formatted fields. */
MAYBE_UNUSED __attribute__((format(printf, 3, 4))) static void ev(const char *api, int rc, const char *fmt,
                                                     ...) {
    char fields[512] = "";
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(fields, sizeof fields, fmt, ap);
        va_end(ap);
    }
    if (ev_tag)
        printf("%s: ev %s %d%s%s\n", ev_tag, api, rc, *fields ? " " : "", fields);
    else
        printf("ev %s %d%s%s\n", api, rc, *fields ? " " : "", fields);
}

/* A free-text line, tagged like the `ev` lines. */
MAYBE_UNUSED __attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* fputs, not printf("%s\n"): the compiler turns that into puts, which dlsym_next wraps */
    if (ev_tag) {
        fputs(ev_tag, stdout);
        fputs(": ", stdout);
    }
    fputs(line, stdout);
    fputc('\n', stdout);
}

/* "@name" for a non-zero value, "0" for zero (rotating buffers: several per printf). */
MAYBE_UNUSED static const char *L(uint64_t v, const char *name) {
    static char bufs[8][64];
    static unsigned next;
    char *b = bufs[next++ % 8];
    if (v == 0)
        snprintf(b, 64, "0");
    else
        snprintf(b, 64, "@%s", name);
    return b;
}

/* The address an allocation call reports in its event: the out-value on success, else 0. */
MAYBE_UNUSED static const char *AP(int rc, uint64_t v, const char *name) { return rc == 0 ? L(v, name) : "0"; }

#define U64(p) ((uint64_t)(uintptr_t)(p))

/* ------------------------------------------------------------------ the static-runtime path */

/* What a static runtime, cuBLAS or NCCL do: dlopen the driver, dlsym its resolver, ask the
 * resolver for itself, and resolve everything else through what it handed back. */
MAYBE_UNUSED static PFN_cuGetProcAddress_v2 gpa;

MAYBE_UNUSED static void drv_open(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("dlopen libcuda.so.1 %d\n", h != NULL);
    if (!h)
        exit(1);
    PFN_cuGetProcAddress_v2 first = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    printf("dlsym cuGetProcAddress_v2 %d\n", first != NULL);
    if (!first)
        exit(1);
    void *self = NULL;
    CUdriverProcAddressQueryResult st = 99;
    int rc = first("cuGetProcAddress", &self, 12000, 0, &st);
    printf("cuGetProcAddress(cuGetProcAddress@12000) %d status=%d found=%d same=%d\n", rc, st,
           self != NULL, self == (void *)first);
    gpa = self ? (PFN_cuGetProcAddress_v2)self : first;
}

/* Resolves NAME at VERSION with FLAGS through the resolver; prints what it got. */
MAYBE_UNUSED static void *drv_sym(const char *name, int version, unsigned long long flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = 99;
    int rc = gpa(name, &p, version, flags, &st);
    printf("cuGetProcAddress(%s@%d,%llu) %d status=%d found=%d\n", name, version, flags, rc, st,
           p != NULL);
    return p;
}

#define DRV(var, type, name, version, flags) type var = (type)drv_sym(name, version, flags)

/* ---------------------------------------------------------------- the runtime's entry points */

/* The virtual memory API's function types, for pointers fetched by name. */
typedef CUresult (*PFN_granularity)(size_t *, const CUmemAllocationProp *,
                                    CUmemAllocationGranularity_flags);
typedef CUresult (*PFN_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*PFN_addressFree)(CUdeviceptr, size_t);
typedef CUresult (*PFN_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
typedef CUresult (*PFN_memRelease)(CUmemGenericAllocationHandle);
typedef CUresult (*PFN_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                            unsigned long long);
typedef CUresult (*PFN_unmap)(CUdeviceptr, size_t);
typedef CUresult (*PFN_setAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);

/* A driver function through the runtime (cudaGetDriverEntryPointByVersion at 12000, FLAGS);
 * prints what it got and exits when it got nothing. `inline`, so that programs that do not
 * link the runtime never reference it. */
MAYBE_UNUSED static inline void *rt_entry(const char *name, unsigned long long flags) {
    void *p = NULL;
    enum cudaDriverEntryPointQueryResult st = 99;
    int rc = cudaGetDriverEntryPointByVersion(name, &p, 12000, flags, &st);
    say("cudaGetDriverEntryPointByVersion(%s,%llu) %d status=%d found=%d", name, flags, rc, st,
        p != NULL);
    if (!p)
        exit(1);
    return p;
}

/* The stand-in driver the runtime loaded (loaded here if it did not), for its stand-in-only
 * exports (standin_register_kernel, …). */
MAYBE_UNUSED static inline void *standin_driver(void) {
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    say("libcuda loaded by the runtime %d", drv != NULL);
    if (!drv)
        drv = dlopen("libcuda.so.1", RTLD_NOW);
    return drv;
}

/* The directory the program lives in (for shared libraries built beside it). */
MAYBE_UNUSED static void exe_dir(char *out, size_t n) {
    ssize_t len = readlink("/proc/self/exe", out, n - 1);
    if (len < 0)
        len = 0;
    out[len] = 0;
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = 0;
}

#endif

// shared: libclockcount.so
/*
 * Counts the process's reads of the clock: preloaded (after libisolate.so: the global scope
 * finds this clock_gettime before libc's for every object, the library's own calls included),
 * it passes each call to libc's and prints at exit, on stderr,
 *   clock reads: monotonic N coarse M other K
 * For tests/tests/paths.rs: how many fine clock reads a tensor the hooks make.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

static atomic_long monotonic, coarse, other;

int clock_gettime(clockid_t c, struct timespec *t) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (c == CLOCK_MONOTONIC)
        atomic_fetch_add(&monotonic, 1);
    else if (c == CLOCK_MONOTONIC_COARSE)
        atomic_fetch_add(&coarse, 1);
    else
        atomic_fetch_add(&other, 1);
    return real(c, t);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "clock reads: monotonic %ld coarse %ld other %ld\n", (long)monotonic,
            (long)coarse, (long)other);
}

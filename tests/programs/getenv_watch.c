// shared: libgetenvwatch.so
/* A second preload that watches `getenv`: every call made on a thread other than the process's
 * first is remembered (its name, the first 16), and written to stderr at exit as
 *
 *   getenv off the main thread: N [NAME NAME ...]
 *
 * so a test can see, deterministically, whether anything read the environment off the main
 * thread while the program's own thread was changing it (issue 33.4: the library's writer
 * thread read WORLD_SIZE for the trace header; with a thread calling setenv that crashed 22 of
 * 2,000 runs). The real getenv is found with dlsym(RTLD_NEXT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char *(*real_getenv)(const char *);
static atomic_int off_main;
static char names[16][48];

char *getenv(const char *name) {
    if (!real_getenv)
        real_getenv = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
    if (syscall(SYS_gettid) != getpid()) {
        int i = atomic_fetch_add(&off_main, 1);
        if (i < 16 && name)
            snprintf(names[i], sizeof names[i], "%s", name);
    }
    return real_getenv ? real_getenv(name) : NULL;
}

__attribute__((destructor)) static void report(void) {
    char line[1024];
    int n = atomic_load(&off_main);
    int len = snprintf(line, sizeof line, "getenv off the main thread: %d [", n);
    for (int i = 0; i < n && i < 16 && len < (int)sizeof line - 64; i++)
        len += snprintf(line + len, sizeof line - len, "%s%s", i ? " " : "", names[i]);
    len += snprintf(line + len, sizeof line - len, "]\n");
    ssize_t w = write(2, line, (size_t)len);
    (void)w;
}

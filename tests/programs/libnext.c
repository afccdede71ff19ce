// shared: libnext.so
/* Another interposer, as a profiler or a second preload would be: a `puts` wrapper that finds
 * the real one with dlsym(RTLD_NEXT). If our `dlsym` made lookups relative to libisolate.so,
 * RTLD_NEXT from here would come back to this very wrapper and recurse forever. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

static int (*real_puts)(const char *);
static unsigned long wrapped_calls;

static int next_puts_impl(const char *s) {
    if (!real_puts)
        real_puts = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
    wrapped_calls++;
    if (!real_puts || real_puts == next_puts_impl)
        return EOF;
    fputs("[next] ", stdout);
    return real_puts(s);
}

int puts(const char *s) __attribute__((alias("next_puts_impl")));

void *next_puts_addr(void) { return (void *)next_puts_impl; }
void *next_real_puts(void) { return (void *)real_puts; }
void *next_rtld_next(const char *name) { return dlsym(RTLD_NEXT, name); }
void *next_rtld_default(const char *name) { return dlsym(RTLD_DEFAULT, name); }
unsigned long next_wrapped_calls(void) { return wrapped_calls; }

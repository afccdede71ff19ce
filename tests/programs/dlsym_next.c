// link: none
/* dlsym answers the same with and without the preload: RTLD_NEXT (from the program and from
 * another library), RTLD_DEFAULT, a handle, a missing name, dlvsym. */
#include "common.h"

typedef void *(*PFN_addr)(void);
typedef void *(*PFN_lookup)(const char *);
typedef unsigned long (*PFN_count)(void);

int main(void) {
    setup();
    say("libnext preloaded %d", dlsym(RTLD_DEFAULT, "next_puts_addr") != NULL);
    char path[4096];
    exe_dir(path, sizeof path - 16);
    strcat(path, "/libnext.so");
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL); /* the preloaded one, when it is */
    say("libnext loaded %d", lib != NULL);
    if (!lib)
        return 1;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    say("libc handle %d", libc != NULL);
    void *libc_puts = dlsym(libc, "puts");
    PFN_addr next_puts_addr = (PFN_addr)dlsym(lib, "next_puts_addr");
    PFN_addr next_real_puts = (PFN_addr)dlsym(lib, "next_real_puts");
    PFN_lookup next_rtld_next = (PFN_lookup)dlsym(lib, "next_rtld_next");
    PFN_lookup next_rtld_default = (PFN_lookup)dlsym(lib, "next_rtld_default");
    PFN_count next_wrapped_calls = (PFN_count)dlsym(lib, "next_wrapped_calls");
    say("libnext functions %d", next_puts_addr && next_real_puts && next_rtld_next &&
                                    next_rtld_default && next_wrapped_calls);
    void *wrapper = next_puts_addr();

    void *by_handle = dlsym(lib, "puts");
    say("dlsym(libnext, puts): wrapper %d libc %d", by_handle == wrapper, by_handle == libc_puts);
    void *n1 = next_rtld_next("puts");
    say("dlsym(RTLD_NEXT, puts) from libnext: wrapper %d libc %d null %d", n1 == wrapper,
        n1 == libc_puts, n1 == NULL);
    void *n2 = dlsym(RTLD_NEXT, "puts");
    say("dlsym(RTLD_NEXT, puts) from main: wrapper %d libc %d null %d", n2 == wrapper,
        n2 == libc_puts, n2 == NULL);
    void *d1 = dlsym(RTLD_DEFAULT, "puts");
    say("dlsym(RTLD_DEFAULT, puts) from main: wrapper %d libc %d", d1 == wrapper, d1 == libc_puts);
    void *d2 = next_rtld_default("puts");
    say("dlsym(RTLD_DEFAULT, puts) from libnext: wrapper %d libc %d", d2 == wrapper,
        d2 == libc_puts);
    void *m1 = dlsym(RTLD_NEXT, "malloc");
    void *m2 = next_rtld_next("malloc");
    void *m3 = dlsym(libc, "malloc");
    say("malloc: next-from-main==libc %d next-from-libnext==libc %d", m1 == m3, m2 == m3);
    void *v = dlvsym(libc, "puts", "GLIBC_2.2.5");
    say("dlvsym(libc, puts, GLIBC_2.2.5)==libc %d", v == libc_puts);

    dlerror();
    void *none = dlsym(RTLD_DEFAULT, "isolate_no_such_symbol");
    const char *e = dlerror();
    say("missing: null %d dlerror set %d", none == NULL, e != NULL);
    dlerror();
    none = dlsym(RTLD_NEXT, "cuGetNoSuchThing"); /* shares the prefix we look at */
    e = dlerror();
    say("missing cuG*: null %d dlerror set %d", none == NULL, e != NULL);
    dlerror();
    none = dlsym(libc, "cuGetProcAddress_v2"); /* a name we answer, in a handle without it */
    e = dlerror();
    say("cuGetProcAddress_v2 in libc: null %d dlerror set %d", none == NULL, e != NULL);
    dlerror();
    none = dlsym(lib, "cu");
    e = dlerror();
    say("short name: null %d dlerror set %d", none == NULL, e != NULL);

    /* calls through the wrapper (bound at load time when libnext is preloaded) */
    puts("hello through puts");
    int (*p)(const char *) = (int (*)(const char *))n2;
    if (p)
        p("hello through RTLD_NEXT");
    say("wrapper resolved the real puts: libc %d", next_real_puts() == libc_puts ||
                                                       next_real_puts() == NULL);
    say("wrapped calls %lu", next_wrapped_calls());
    say("done");
    return 0;
}

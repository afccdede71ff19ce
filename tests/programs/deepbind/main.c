// link: none
/* A host that opens a plugin (libdeepbind_plugin.so, beside it) and calls it:
 *
 *   deepbind FLAGS WHERE [LIB]
 *
 * FLAGS: `now` (RTLD_NOW | RTLD_DEEPBIND), `lazy` (RTLD_LAZY | RTLD_DEEPBIND), `plain`
 * (RTLD_NOW). WHERE: `path` (its full path), `name` (the bare name, found only through this
 * program's DT_RUNPATH, $ORIGIN: tests/build.rs links it so), `origin` ("$ORIGIN/LIB"). LIB:
 * the plugin's file name (libdeepbind_plugin_now.so: the same, linked -z now).
 *
 * libdeepbind_other.so is opened first, RTLD_GLOBAL: the plugin's `probe` line says 2 when it
 * was opened with RTLD_DEEPBIND, 1 without. Exit status: plugin_run()'s, or 2 (usage), 3 (the
 * plugin did not open), 4 (no plugin_run). */
#include "../common.h"

int main(int argc, char **argv) {
    setup();
    if (argc < 3)
        return 2;
    const char *lib = argc > 3 ? argv[3] : "libdeepbind_plugin.so";
    int flags;
    if (!strcmp(argv[1], "now"))
        flags = RTLD_NOW | RTLD_DEEPBIND;
    else if (!strcmp(argv[1], "lazy"))
        flags = RTLD_LAZY | RTLD_DEEPBIND;
    else if (!strcmp(argv[1], "plain"))
        flags = RTLD_NOW;
    else
        return 2;

    char dir[4096];
    exe_dir(dir, sizeof dir);
    char other[4200];
    snprintf(other, sizeof other, "%s/libdeepbind_other.so", dir);
    say("other loaded %d", dlopen(other, RTLD_NOW | RTLD_GLOBAL) != NULL);

    char file[4200];
    if (!strcmp(argv[2], "path"))
        snprintf(file, sizeof file, "%s/%s", dir, lib);
    else if (!strcmp(argv[2], "name"))
        snprintf(file, sizeof file, "%s", lib);
    else if (!strcmp(argv[2], "origin"))
        snprintf(file, sizeof file, "$ORIGIN/%s", lib);
    else
        return 2;
    dlerror();
    void *h = dlopen(file, flags);
    const char *err = dlerror();
    say("dlopen %s %s: %d, dlerror %s", argv[1], argv[2], h != NULL, err ? "set" : "clear");
    if (!h) {
        fprintf(stderr, "deepbind: %s\n", err ? err : "?");
        return 3;
    }
    int (*run)(void) = (int (*)(void))dlsym(h, "plugin_run");
    if (!run)
        return 4;
    int rc = run();
    say("plugin_run %d", rc);
    return rc;
}

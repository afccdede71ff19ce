// shared: libdeepbind_other.so
/* Loaded RTLD_GLOBAL by tests/programs/deepbind/main.c before the plugin: its `deepbind_probe`
 * (1) comes first in the global scope, so the plugin's call to its own `deepbind_probe` (2) shows
 * whether the plugin was really opened with RTLD_DEEPBIND (its own scope first). */
int deepbind_probe(void);

int deepbind_probe(void) { return 1; }

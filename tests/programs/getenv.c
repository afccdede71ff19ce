// link: none
/* Prints each variable named on the command line as NAME=VALUE, or NAME unset: what a program
 * under the preload sees of the environment the library's constructor set up (isolate mode
 * switches frameworks' pools off through variables). */
#include "common.h"

int main(int argc, char **argv) {
    setup();
    for (int i = 1; i < argc; i++) {
        const char *v = getenv(argv[i]);
        if (v)
            say("%s=%s", argv[i], v);
        else
            say("%s unset", argv[i]);
    }
    return 0;
}

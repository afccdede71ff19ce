// link: none
/* Never touches CUDA, as a shell or a compiler spawned by a job: under the preload it must
 * leave no trace file behind, also from its children and through exec. */
#include <sys/wait.h>

#include "common.h"

int main(int argc, char **argv) {
    setup();
    if (argc > 1 && !strcmp(argv[1], "child")) {
        say("exec'd child");
        return 0;
    }
    say("hello");
    say("puts found %d", dlsym(RTLD_DEFAULT, "puts") != NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(7);
    int st = 0;
    waitpid(pid, &st, 0);
    say("forked child exited %d", WEXITSTATUS(st));
    pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "child", (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &st, 0);
    say("exec'd child exited %d", WEXITSTATUS(st));
    say("system %d", system("exit 0"));
    say("done");
    return 0;
}

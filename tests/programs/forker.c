// link: cudart
/* forker MODE: the ways a process multiplies or ends. Lines are tagged with who printed them
 * (`parent:`, `child:`, ...), so the harness can match each trace to its own lines.
 *
 *   simple TAG N   N alloc/free pairs, return from main
 *   fork           pairs in the parent, fork, pairs in the child, child _exit(0), parent waits
 *   fork-exec      fork; the child execs `simple child 4`
 *   exec           pairs, then exec `simple after 3` in the same process (execv)
 *   execl          the same through execl
 *   daemon         double fork; the grandchild (setsid) allocates and exits on its own
 *   spawn          posix_spawn `simple spawned 2`
 *   atexit         allocation from an atexit handler
 *   tls-dtor       allocation from a pthread_key destructor and a C11 tss destructor
 *   busy-exit      threads still allocating while main returns
 *   _exit abort sigterm sigint segv   pairs, then end that way
 *   sigint-handled a SIGINT the program handles itself: it goes on
 *   sigkill        allocate forever, printing the pair count after each pair
 */
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <threads.h>
#include <time.h>

#include "common.h"

extern char **environ;

static int label_no;

static void pairs(const char *tag, int n, size_t base) {
    const char *old = ev_tag;
    ev_tag = tag;
    for (int i = 0; i < n; i++) {
        char label[32];
        snprintf(label, sizeof label, "p%d", label_no++);
        void *p = NULL;
        size_t size = base + (size_t)i;
        int rc = cudaMalloc(&p, size);
        ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(p), label));
        rc = cudaFree(p);
        ev("cudaFree", rc, "ptr=%s", L(U64(p), label));
    }
    ev_tag = old;
}

static void self_exec(char *const args[]) {
    execv("/proc/self/exe", args);
    perror("execv");
    _exit(127);
}

static int wait_for(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void atexit_handler(void) {
    pairs("atexit", 2, 700);
    ev_tag = "atexit";
    say("handler done");
}

static pthread_key_t key;
static tss_t tss;

static void key_dtor(void *v) {
    (void)v;
    pairs("keydtor", 2, 800);
}

static void tss_dtor(void *v) {
    (void)v;
    pairs("tssdtor", 1, 900);
}

static void *tls_thread(void *arg) {
    (void)arg;
    pthread_setspecific(key, (void *)1);
    tss_set(tss, (void *)1);
    pairs("thread", 1, 600);
    return NULL;
}

static volatile sig_atomic_t got_sigint;

static void on_sigint(int sig) { got_sigint = sig; }

static atomic_long busy_pairs[4];

static void *busy_thread(void *arg) {
    long id = (long)(intptr_t)arg;
    for (;;) {
        void *p = NULL;
        if (cudaMalloc(&p, 512 + (size_t)id) == 0)
            cudaFree(p);
        atomic_fetch_add(&busy_pairs[id], 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    setup();
    if (argc < 2)
        return 2;
    const char *mode = argv[1];
    ev_tag = NULL;

    if (!strcmp(mode, "simple") && argc == 4) {
        pairs(argv[2], atoi(argv[3]), 100);
        ev_tag = argv[2];
        say("done");
        return 0;
    }
    if (!strcmp(mode, "fork")) {
        ev_tag = "parent";
        pairs("parent", 2, 1000);
        pid_t pid = fork();
        if (pid == 0) {
            ev_tag = "child";
            pairs("child", 5, 2000);
            say("child done");
            _exit(0);
        }
        /* waits first, so that stdout is the same on every run */
        say("child exited %d", wait_for(pid));
        pairs("parent", 3, 1010);
        return 0;
    }
    if (!strcmp(mode, "fork-exec")) {
        ev_tag = "parent";
        pairs("parent", 2, 1000);
        pid_t pid = fork();
        if (pid == 0) {
            char *args[] = {argv[0], "simple", "child", "4", NULL};
            self_exec(args);
        }
        say("child exited %d", wait_for(pid));
        pairs("parent", 3, 1010);
        return 0;
    }
    if (!strcmp(mode, "exec")) {
        ev_tag = "before";
        pairs("before", 2, 1000);
        say("exec");
        char *args[] = {argv[0], "simple", "after", "3", NULL};
        self_exec(args);
    }
    if (!strcmp(mode, "execl")) {
        /* glibc's execl calls its internal execve, not the exported one */
        ev_tag = "before";
        pairs("before", 2, 1000);
        say("execl");
        execl("/proc/self/exe", argv[0], "simple", "after", "3", (char *)NULL);
        perror("execl");
        return 127;
    }
    if (!strcmp(mode, "daemon")) {
        ev_tag = "parent";
        pairs("parent", 1, 1000);
        int fds[2];
        if (pipe(fds) != 0)
            return 1;
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            if (fork() == 0) {
                setsid();
                ev_tag = "daemon";
                pairs("daemon", 3, 3000);
                say("daemon done");
                exit(0); /* the pipe's write end closes when this process is gone */
            }
            _exit(0);
        }
        close(fds[1]);
        int middle = wait_for(pid);
        char c;
        while (read(fds[0], &c, 1) > 0) {
        }
        say("middle exited %d", middle); /* after the daemon is gone: the same on every run */
        pairs("parent", 1, 1001);
        say("daemon gone");
        return 0;
    }
    if (!strcmp(mode, "spawn")) {
        ev_tag = "parent";
        pairs("parent", 1, 1000);
        pid_t pid = 0;
        char *args[] = {argv[0], "simple", "spawned", "2", NULL};
        int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ);
        int code = rc == 0 ? wait_for(pid) : -1;
        say("posix_spawn %d", rc); /* after the wait, so that stdout is the same on every run */
        say("spawned exited %d", code);
        pairs("parent", 1, 1001);
        return 0;
    }
    if (!strcmp(mode, "atexit")) {
        pairs("main", 1, 1000);
        atexit(atexit_handler); /* after the runtime's own exit handlers: runs before them */
        ev_tag = "main";
        say("returning");
        return 0;
    }
    if (!strcmp(mode, "tls-dtor")) {
        pairs("main", 1, 1000);
        pthread_key_create(&key, key_dtor);
        tss_create(&tss, tss_dtor);
        pthread_t t;
        pthread_create(&t, NULL, tls_thread, NULL);
        pthread_join(t, NULL);
        pairs("main", 1, 1001);
        ev_tag = "main";
        say("joined");
        return 0;
    }
    if (!strcmp(mode, "busy-exit")) {
        void *p = NULL;
        say("cudaFree %d", cudaFree(p));
        pthread_t t[4];
        for (long i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, busy_thread, (void *)(intptr_t)i);
        for (int i = 0; i < 4; i++)
            while (atomic_load(&busy_pairs[i]) < 200)
                usleep(1000);
        say("returning with threads running");
        return 0;
    }
    if (!strcmp(mode, "_exit")) {
        pairs("main", 2, 1000);
        _exit(3);
    }
    if (!strcmp(mode, "abort")) {
        pairs("main", 2, 1000);
        abort();
    }
    if (!strcmp(mode, "sigterm")) {
        pairs("main", 2, 1000);
        raise(SIGTERM);
        say("survived SIGTERM");
        return 1;
    }
    if (!strcmp(mode, "sigint")) {
        pairs("main", 2, 1000);
        raise(SIGINT);
        say("survived SIGINT");
        return 1;
    }
    if (!strcmp(mode, "sigint-handled")) {
        /* the program's own handler, installed before CUDA is touched: it must still run,
         * and the process go on (and its trace with it) */
        signal(SIGINT, on_sigint);
        pairs("main", 1, 1000);
        raise(SIGINT);
        ev_tag = "main";
        say("handler ran %d", (int)got_sigint);
        pairs("main", 1, 1001);
        return 0;
    }
    if (!strcmp(mode, "segv")) {
        pairs("main", 2, 1000);
        *(volatile int *)(uintptr_t)8 = 1;
        say("survived SIGSEGV");
        return 1;
    }
    if (!strcmp(mode, "sigkill")) {
        unsigned long n = 0;
        for (;;) {
            void *p = NULL;
            if (cudaMalloc(&p, 4096) != 0 || cudaFree(p) != 0)
                return 1;
            n++;
            printf("%lu\n", n);
        }
    }
    fprintf(stderr, "forker: unknown mode %s\n", mode);
    return 2;
}

// link: cudart
/* ends MODE: the ends of a process other than exit (issue 33, items 8 and 10);
 * tests/tests/ends.rs. Every mode touches CUDA first, so that the trace is in place.
 *
 *   stale END            A (64 KiB) allocated, zeroed and freed, then 24 bytes written through
 *                        it at offset 1000 (a stale write), then END: exec (execv of this
 *                        program's `after`), sigterm (raise(SIGTERM)), abort (abort()), wait
 *                        ("ready", then waits for a signal: the test sends SIGTERM, as `timeout`
 *                        does), exit (return from main: the baseline)
 *   stuck END            a stream-ordered free, then the device hangs (the stand-in's
 *                        standin_device_stuck: nothing finishes any more), then END: sigterm or
 *                        exec, as above (the quarantine check waits for the device: bounded)
 *   exec-fail            3 pairs, an execv of a missing program (it fails: ENOENT), 3 pairs, the
 *                        same again, and exit: the program goes on after each failed exec
 *   WAY N                N pairs, then leaves by WAY: fexecve, execveat, sys-execve
 *                        (syscall(SYS_execve)), sys-execveat, quick-exit (quick_exit(3), with an
 *                        at_quick_exit handler that makes one more pair), sys-exit-group
 *                        (syscall(SYS_exit_group, 4)); the exec ways run this program's `after`
 *   exit-join            3 pairs, then exit(0) from main, whose atexit handler joins a thread
 *                        that calls exit(5) once the handler runs: glibc before 2.41 ends the
 *                        process with status 5 (the second exit runs what is left and ends it);
 *                        2.41 and later wait in the second exit for good (a hang, as designed)
 *   after                "after exec" (no CUDA: no trace of its own)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/syscall.h>

#include "common.h"

extern char **environ;
/* glibc 2.34+ has it; its headers declared it only later */
extern int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags);

static int label_no;

static void pairs(int n) {
    for (int i = 0; i < n; i++) {
        char label[32];
        snprintf(label, sizeof label, "p%d", label_no++);
        void *p = NULL;
        size_t size = 4096 + (size_t)i;
        int rc = cudaMalloc(&p, size);
        ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(p), label));
        rc = cudaFree(p);
        ev("cudaFree", rc, "ptr=@%s", label);
    }
}

static char *after_args[] = {"ends", "after", NULL};

static int stale(const char *end) {
    const size_t size = 64 << 10;
    void *a = NULL;
    int rc = cudaMalloc(&a, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(a), "a"));
    if (rc)
        return 1;
    say("cudaMemset a %d", cudaMemset(a, 0, size));
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    say("cudaMemset through a %d", cudaMemset((char *)a + 1000, 0x33, 24));
    say("end %s", end);
    if (!strcmp(end, "exec")) {
        execv("/proc/self/exe", after_args);
        perror("execv");
        return 1;
    }
    if (!strcmp(end, "sigterm"))
        raise(SIGTERM);
    if (!strcmp(end, "abort"))
        abort();
    if (!strcmp(end, "wait")) {
        say("ready");
        for (;;)
            pause();
    }
    return 0;
}

static int stuck(const char *end) {
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    void (*hang)(void) = drv ? (void (*)(void))dlsym(drv, "standin_device_stuck") : NULL;
    say("stand-in stuck switch %d", hang != NULL);
    if (!hang)
        return 1;
    cudaStream_t s = NULL;
    void *a = NULL;
    say("cudaStreamCreateWithFlags %d", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    say("cudaMallocAsync %d", cudaMallocAsync(&a, 1 << 20, s));
    say("cudaFreeAsync %d", cudaFreeAsync(a, s));
    hang();
    say("end %s", end);
    if (!strcmp(end, "exec")) {
        execv("/proc/self/exe", after_args);
        perror("execv");
        return 1;
    }
    if (!strcmp(end, "sigterm"))
        raise(SIGTERM);
    return 0;
}

static int exec_fail(void) {
    for (int round = 0; round < 2; round++) {
        pairs(3);
        char *args[] = {"isolate-no-such-program", NULL};
        int r = execv("/nonexistent/isolate-no-such-program", args);
        say("execv of a missing program %d errno %s", r, errno == ENOENT ? "ENOENT" : "other");
    }
    pairs(3);
    return 0;
}

static void one_more_pair(void) {
    pairs(1);
    say("at_quick_exit handler ran");
}

static int way_out(const char *way, int n) {
    if (!strcmp(way, "quick-exit"))
        at_quick_exit(one_more_pair);
    pairs(n);
    say("leaving by %s", way);
    if (!strcmp(way, "fexecve")) {
        int fd = open("/proc/self/exe", O_RDONLY);
        fexecve(fd, after_args, environ);
    } else if (!strcmp(way, "execveat")) {
        execveat(AT_FDCWD, "/proc/self/exe", after_args, environ, 0);
    } else if (!strcmp(way, "sys-execve")) {
        syscall(SYS_execve, "/proc/self/exe", after_args, environ);
    } else if (!strcmp(way, "sys-execveat")) {
        syscall(SYS_execveat, AT_FDCWD, "/proc/self/exe", after_args, environ, 0);
    } else if (!strcmp(way, "quick-exit")) {
        quick_exit(3);
    } else if (!strcmp(way, "sys-exit-group")) {
        syscall(SYS_exit_group, 4);
    }
    perror(way);
    return 1;
}

static atomic_int in_handler;
static pthread_t second;

static void *second_exit(void *arg) {
    (void)arg;
    while (!atomic_load(&in_handler))
        usleep(1000);
    say("the second thread calls exit(5)");
    exit(5);
}

static void join_second(void) {
    say("atexit handler joins the second thread");
    atomic_store(&in_handler, 1);
    pthread_join(second, NULL);
    say("joined");
}

static int exit_join(void) {
    atexit(join_second);
    pthread_create(&second, NULL, second_exit, NULL);
    pairs(3);
    exit(0);
}

int main(int argc, char **argv) {
    setup();
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "stale") && argc > 2)
        return stale(argv[2]);
    if (!strcmp(mode, "stuck") && argc > 2)
        return stuck(argv[2]);
    if (!strcmp(mode, "exec-fail"))
        return exec_fail();
    if (!strcmp(mode, "exit-join"))
        return exit_join();
    if (!strcmp(mode, "after")) {
        say("after exec");
        return 0;
    }
    if (argc > 2)
        return way_out(mode, atoi(argv[2]));
    fprintf(stderr, "usage: ends stale exec|sigterm|abort|wait|exit | exec-fail | WAY N | after\n");
    return 2;
}

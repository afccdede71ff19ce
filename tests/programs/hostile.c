// link: cudart
/* hostile MODE: a program that is hard on the library's process life (issue 18, "the host
 * process first"); tests/tests/hostile.rs. Every mode touches CUDA first, so that the trace, and
 * with it the fatal-signal wrapper, is in place before the hostile part.
 *
 *   wait                 SIGINT, SIGQUIT, SIGHUP at their default action; 3 pairs, "ready",
 *                        then waits for signals
 *   eintr [restart]      SIGALRM handler without (with) SA_RESTART, installed before CUDA; a
 *                        blocking read() on a pipe gets the timer's SIGALRM: -1/EINTR (restarted
 *                        and completed by a helper thread's byte)
 *   resethand [inside]   SIGINT handler with SA_RESETHAND: the first raise runs it once, the second
 *                        kills (inside: the handler itself raises SIGINT again, which kills as it
 *                        returns)
 *   masks                SIGUSR1 (SA_SIGINFO, sa_mask {USR2, TERM}), SIGUSR2 (SA_NODEFER, sa_mask
 *                        {HUP}), SIGHUP (neither): each handler prints what its mask holds and
 *                        whether raising its own signal inside runs it at once
 *   fork-threads N       4 threads allocate and free in a loop while a fifth thread forks N
 *                        times; even children do one cudaMalloc/cudaFree, odd ones just _exit(0)
 *   vfork-fail           free A, vfork a child whose exec fails (_exit(127)), then double free A
 *                        and write through A
 *   spawn-fail           the same with posix_spawn/posix_spawnp of missing commands
 *   close-fds range|loop|dup2|early
 *                        after the first CUDA calls: close every descriptor >= 3 (close_range,
 *                        or close() up to 1024), or dup2 its own file onto the trace's number;
 *                        open mydata.txt, write 19 bytes, allocate on (early: close_range at
 *                        once, while the library may still be opening its trace)
 *   fault-threads segv|abort|exit N
 *                        4 threads do N pairs each, meet at a barrier, then all fault (NULL write),
 *                        abort() or exit(3) at once
 *   barrier N            a SIGSEGV handler makes a read-only page writable and returns (a garbage
 *                        collector's write barrier), N faults; the time goes to stderr
 *
 * Handlers are installed before the first CUDA call: the library's wrapper goes in when the first
 * trace starts, around the program's action. Lines on stderr say whether the action in place is
 * still the program's own ("wrapped 1": the library's wrapper is there), and timings.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>

#include "common.h"

extern char **environ;

static int label_no;

static void pairs(int n, size_t base) {
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
}

/* On stderr: is the action of SIG still the program's HANDLER, or something in its place? */
static void note_wrapped(const char *name, int sig, void *handler) {
    struct sigaction cur;
    sigaction(sig, NULL, &cur);
    void *h = (cur.sa_flags & SA_SIGINFO) ? (void *)cur.sa_sigaction : (void *)cur.sa_handler;
    fprintf(stderr, "%s wrapped %d\n", name, h != handler);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------------------ eintr */

static volatile sig_atomic_t alarms;
static int pipe_fds[2];

static void on_alarm(int sig) {
    (void)sig;
    alarms++;
}

/* SIGALRM blocked here: the timer's signal goes to the main thread, in its read(). Once the
 * handler ran, a byte completes a read that was restarted. */
static void *unblocker(void *arg) {
    (void)arg;
    while (!alarms)
        usleep(1000);
    usleep(200 * 1000);
    if (write(pipe_fds[1], "x", 1) != 1)
        _exit(90);
    return NULL;
}

static int eintr(int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    pairs(2, 1000);
    note_wrapped("SIGALRM", SIGALRM, (void *)on_alarm);
    if (pipe(pipe_fds) != 0)
        return 1;
    sigset_t alrm, old;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, &old);
    pthread_t t;
    pthread_create(&t, NULL, unblocker, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    struct itimerval it = {{0, 0}, {0, 50 * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
    char c = 0;
    ssize_t n = read(pipe_fds[0], &c, 1);
    int e = errno;
    say("read %zd %s", n, n < 0 ? (e == EINTR ? "EINTR" : "other error") : "no error");
    say("alarms %d", (int)alarms);
    pthread_join(t, NULL);
    pairs(1, 1100);
    return 0;
}

/* -------------------------------------------------------------------------------- resethand */

static volatile sig_atomic_t int_calls, int_self_blocked = -1, inside;

static void on_int_once(int sig) {
    int_calls++;
    sigset_t cur;
    sigprocmask(SIG_BLOCK, NULL, &cur);
    int_self_blocked = sigismember(&cur, sig);
    if (inside) {
        /* blocked now (no SA_NODEFER); at the default action once this returns */
        const char msg[] = "handler raises SIGINT again\n";
        if (write(1, msg, sizeof msg - 1) < 0)
            _exit(91);
        raise(sig);
        const char msg2[] = "handler returns\n";
        if (write(1, msg2, sizeof msg2 - 1) < 0)
            _exit(91);
    }
}

static int resethand(int raise_inside) {
    inside = raise_inside;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int_once;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    pairs(2, 1000);
    note_wrapped("SIGINT", SIGINT, (void *)on_int_once);
    raise(SIGINT);
    say("handler ran %d, SIGINT blocked inside %d", (int)int_calls, (int)int_self_blocked);
    pairs(1, 1100);
    raise(SIGINT);
    say("survived the second SIGINT");
    return 1;
}

/* ------------------------------------------------------------------------------------ masks */

static sigset_t usr1_mask, usr2_mask, hup_mask;
static volatile sig_atomic_t usr1_code, usr1_value, usr1_pid_ok;
static volatile sig_atomic_t usr2_calls, usr2_nested, hup_calls, hup_nested;

static void on_usr1(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    sigprocmask(SIG_BLOCK, NULL, &usr1_mask);
    usr1_code = si->si_code;
    usr1_value = si->si_value.sival_int;
    usr1_pid_ok = si->si_pid == getpid();
}

static void on_usr2(int sig) {
    int me = ++usr2_calls;
    if (me == 1) {
        sigprocmask(SIG_BLOCK, NULL, &usr2_mask);
        raise(sig); /* SA_NODEFER: runs now, nested */
        usr2_nested = usr2_calls == 2;
    }
}

static void on_hup(int sig) {
    int me = ++hup_calls;
    if (me == 1) {
        sigprocmask(SIG_BLOCK, NULL, &hup_mask);
        raise(sig); /* blocked: runs once this returns */
        hup_nested = hup_calls == 2;
    }
}

static void act(int sig, void *handler, int flags, int mask1, int mask2) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    if (flags & SA_SIGINFO)
        sa.sa_sigaction = (void (*)(int, siginfo_t *, void *))handler;
    else
        sa.sa_handler = (void (*)(int))handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (mask1)
        sigaddset(&sa.sa_mask, mask1);
    if (mask2)
        sigaddset(&sa.sa_mask, mask2);
    sigaction(sig, &sa, NULL);
}

static int masks(void) {
    act(SIGUSR1, (void *)on_usr1, SA_SIGINFO, SIGUSR2, SIGTERM);
    act(SIGUSR2, (void *)on_usr2, SA_NODEFER, SIGHUP, 0);
    act(SIGHUP, (void *)on_hup, 0, 0, 0);
    pairs(2, 1000);
    note_wrapped("SIGUSR1", SIGUSR1, (void *)on_usr1);
    note_wrapped("SIGUSR2", SIGUSR2, (void *)on_usr2);
    note_wrapped("SIGHUP", SIGHUP, (void *)on_hup);

    union sigval v = {.sival_int = 42};
    sigqueue(getpid(), SIGUSR1, v);
    sigset_t *m = &usr1_mask;
    say("usr1 mask: SIGUSR2 %d SIGTERM %d SIGUSR1 %d SIGINT %d SIGHUP %d", sigismember(m, SIGUSR2),
        sigismember(m, SIGTERM), sigismember(m, SIGUSR1), sigismember(m, SIGINT),
        sigismember(m, SIGHUP));
    say("usr1 info: SI_QUEUE %d value %d pid %d", usr1_code == SI_QUEUE, (int)usr1_value,
        (int)usr1_pid_ok);

    raise(SIGUSR2);
    m = &usr2_mask;
    say("usr2 mask: SIGHUP %d SIGUSR2 %d SIGINT %d SIGTERM %d", sigismember(m, SIGHUP),
        sigismember(m, SIGUSR2), sigismember(m, SIGINT), sigismember(m, SIGTERM));
    say("usr2 nested inside %d calls %d", (int)usr2_nested, (int)usr2_calls);

    raise(SIGHUP);
    m = &hup_mask;
    say("hup mask: SIGHUP %d SIGUSR2 %d SIGINT %d", sigismember(m, SIGHUP), sigismember(m, SIGUSR2),
        sigismember(m, SIGINT));
    say("hup nested inside %d calls %d", (int)hup_nested, (int)hup_calls);

    sigset_t now;
    sigprocmask(SIG_BLOCK, NULL, &now);
    say("after: SIGUSR1 %d SIGUSR2 %d SIGHUP %d SIGTERM %d blocked", sigismember(&now, SIGUSR1),
        sigismember(&now, SIGUSR2), sigismember(&now, SIGHUP), sigismember(&now, SIGTERM));
    pairs(1, 1100);
    return 0;
}

/* ----------------------------------------------------------------------------- fork-threads */

static atomic_int stop;
static atomic_long loop_pairs;
static int nforks;

static void *alloc_loop(void *arg) {
    size_t size = 256 + (size_t)(intptr_t)arg;
    while (!atomic_load(&stop)) {
        void *p = NULL;
        if (cudaMalloc(&p, size) == 0)
            cudaFree(p);
        atomic_fetch_add(&loop_pairs, 1);
    }
    return NULL;
}

static void *fork_loop(void *arg) {
    (void)arg;
    long ok = 0;
    for (int i = 0; i < nforks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (i % 2 == 0) {
                void *p = NULL;
                int a = cudaMalloc(&p, 4096);
                int f = cudaFree(p);
                _exit(a || f ? 3 : 0);
            }
            _exit(0);
        }
        if (pid < 0)
            continue;
        int st = 0;
        if (waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
            ok++;
    }
    return (void *)(intptr_t)ok;
}

static int fork_threads(int n) {
    nforks = n;
    pairs(1, 1000);
    pthread_t t[4], f;
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, alloc_loop, (void *)(intptr_t)i);
    while (atomic_load(&loop_pairs) < 100)
        usleep(1000);
    void *ok = NULL;
    pthread_create(&f, NULL, fork_loop, NULL);
    pthread_join(f, &ok);
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    say("forks %d children exited 0: %ld", n, (long)(intptr_t)ok);
    pairs(1, 1100);
    return 0;
}

/* ----------------------------------------------------------------------- vfork / spawn fail */

static int fail_to_start(int spawn) {
    const size_t size = 64 << 10;
    void *a = NULL, *b = NULL;
    int rc = cudaMalloc(&a, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(a), "a"));
    if (rc)
        return 1;
    say("cudaMemset a %d", cudaMemset(a, 0, size));
    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");

    if (!spawn) {
        /* as Python's subprocess does: vfork, exec (through the PLT), _exit on failure */
        pid_t pid = vfork();
        if (pid == 0) {
            char *args[] = {"isolate-no-such-program", NULL};
            execv("/nonexistent/isolate-no-such-program", args);
            _exit(127);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        say("vfork child exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    } else {
        pid_t pid = 0;
        char *args[] = {"isolate-no-such-command", NULL};
        int r = posix_spawnp(&pid, "isolate-no-such-command", NULL, NULL, args, environ);
        say("posix_spawnp of a missing command %d", r);
        r = posix_spawn(&pid, "/nonexistent/isolate-no-such-program", NULL, NULL, args, environ);
        say("posix_spawn of a missing path %d", r);
    }

    rc = cudaFree(a);
    ev("cudaFree", rc, "ptr=@a");
    say("double free %d", rc);
    rc = cudaMalloc(&b, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(b), "b"));
    say("cudaMemset b %d", cudaMemset(b, 0, size));
    /* the stale writes: 24 bytes through the runtime, one byte straight through the pointer */
    say("cudaMemset through a %d", cudaMemset((char *)a + 1000, 0x33, 24));
    ((volatile unsigned char *)a)[5000] = 0x44;
    rc = cudaFree(b);
    ev("cudaFree", rc, "ptr=@b");
    return 0;
}

/* -------------------------------------------------------------------------------- close-fds */

/* The descriptor of the trace file once the library settled it (its header is written, so it
 * has its final number), -1 without the preload. */
static int trace_fd(void) {
    for (int fd = 3; fd < 4096; fd++) {
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = 0;
        struct stat st;
        if (strstr(target, ".trace") && stat(target, &st) == 0 && st.st_size > 0)
            return fd;
    }
    return -1;
}

static int close_fds(const char *how) {
    pairs(3, 1000);
    /* the writer thread opens the trace when the first event arrives: wait for it (early: not,
     * closing while the writer may be opening the trace) */
    int tfd = -1, early = !strcmp(how, "early");
    for (int i = 0; i < 5000 && !early && getenv("LD_PRELOAD"); i++) {
        if ((tfd = trace_fd()) >= 0)
            break;
        usleep(1000);
    }
    if (!early) {
        fprintf(stderr, "trace descriptor %d\n", tfd);
        usleep(120 * 1000); /* what the writer had is written */
    }
    int fd;
    const char data[] = "my own data: 12345\n"; /* 19 bytes */
    if (!strcmp(how, "dup2")) {
        fd = open("mydata.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int target = tfd >= 0 ? tfd : 1000;
        if (fd < 0 || dup2(fd, target) != target)
            return 1;
        close(fd);
        fd = target;
    } else {
        if (!strcmp(how, "range") || early) {
            if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
                return 1;
        } else {
            for (int i = 3; i < 1024; i++)
                close(i);
        }
        fd = open("mydata.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    say("mydata.txt open %d", fd >= 0);
    if (fd < 0)
        return 1;
    say("wrote %zd", write(fd, data, sizeof data - 1));
    pairs(10, 1100);
    usleep(120 * 1000); /* the writer writes (and finds its descriptor gone) while it is open */
    pairs(2, 1200);
    say("close %d", close(fd));
    return 0;
}

/* ---------------------------------------------------------------------------- fault-threads */

static pthread_barrier_t barrier;
static const char *fault_kind;
static int per_thread;

static void *fault_thread(void *arg) {
    size_t size = 512 + (size_t)(intptr_t)arg;
    for (int i = 0; i < per_thread; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, size) != 0 || cudaFree(p) != 0)
            _exit(92);
    }
    pthread_barrier_wait(&barrier);
    if (!strcmp(fault_kind, "segv"))
        *(volatile int *)(uintptr_t)8 = 1;
    else if (!strcmp(fault_kind, "abort"))
        abort();
    else if (!strcmp(fault_kind, "exit"))
        exit(3);
    return NULL;
}

static int fault_threads(const char *kind, int n) {
    fault_kind = kind;
    per_thread = n;
    pairs(1, 1000);
    pthread_barrier_init(&barrier, NULL, 4);
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, fault_thread, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    say("survived %s", kind);
    return 1;
}

/* ---------------------------------------------------------------------------------- barrier */

static char *region;
static size_t page, npages;
static volatile long barrier_faults;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    char *at = (char *)((uintptr_t)si->si_addr & ~(uintptr_t)(page - 1));
    if (at < region || at >= region + npages * page) {
        signal(sig, SIG_DFL); /* a real fault: dies of it as the instruction runs again */
        return;
    }
    mprotect(at, page, PROT_READ | PROT_WRITE);
    barrier_faults++;
}

static int write_barrier(int n) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    npages = (size_t)n;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    pairs(1, 1000);
    note_wrapped("SIGSEGV", SIGSEGV, (void *)on_segv);
    region = mmap(NULL, npages * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        return 1;
    double t0 = now_s();
    for (size_t i = 0; i < npages; i++)
        region[i * page + i % page] = (char)(1 + i % 200);
    double t1 = now_s();
    size_t right = 0;
    for (size_t i = 0; i < npages; i++)
        right += region[i * page + i % page] == (char)(1 + i % 200);
    say("faults %ld pages written %zu of %zu", (long)barrier_faults, right, npages);
    fprintf(stderr, "barrier: %zu faults in %.6f s (%.2f us each)\n", npages, t1 - t0,
            (t1 - t0) / (double)npages * 1e6);
    pairs(1, 1100);
    return 0;
}

/* ------------------------------------------------------------------------------------- main */

int main(int argc, char **argv) {
    setup();
    if (argc < 2)
        return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "wait")) {
        /* as a shell does for a foreground job: the default actions, whatever was ignored */
        signal(SIGINT, SIG_DFL);
        signal(SIGQUIT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        pairs(3, 1000);
        say("ready");
        for (;;)
            pause();
    }
    if (!strcmp(mode, "eintr"))
        return eintr(argc > 2 && !strcmp(argv[2], "restart"));
    if (!strcmp(mode, "resethand"))
        return resethand(argc > 2 && !strcmp(argv[2], "inside"));
    if (!strcmp(mode, "masks"))
        return masks();
    if (!strcmp(mode, "fork-threads") && argc > 2)
        return fork_threads(atoi(argv[2]));
    if (!strcmp(mode, "vfork-fail"))
        return fail_to_start(0);
    if (!strcmp(mode, "spawn-fail"))
        return fail_to_start(1);
    if (!strcmp(mode, "close-fds") && argc > 2)
        return close_fds(argv[2]);
    if (!strcmp(mode, "fault-threads") && argc > 3)
        return fault_threads(argv[2], atoi(argv[3]));
    if (!strcmp(mode, "barrier") && argc > 2)
        return write_barrier(atoi(argv[2]));
    fprintf(stderr, "hostile: unknown mode %s\n", mode);
    return 2;
}

// link: none
// sigchild: the command of the `isolate run` signal tests (tests/tests/run_signals.rs). It never
// touches CUDA.
//
//   sigchild DIR wait       waits for signals, each at its default action
//   sigchild DIR log        SIGHUP, SIGINT, SIGQUIT, SIGTERM and SIGUSR2 each append a line
//                           "SIGNO SENDER CODE" (si_pid, si_code) to DIR/log; SIGUSR1 appends
//                           its line and exits with status 7. The handlers run one at a time,
//                           and of two signals pending together the lower number comes first
//   sigchild DIR group      as log, after sending SIGHUP to its own process group
//   sigchild DIR status     writes the SigBlk and SigIgn lines of /proc/self/status to
//                           DIR/status and exits 0
//   sigchild DIR exit N     exits with status N
//   sigchild DIR raise SIG  raises signal SIG on itself (no core file)
//   sigchild DIR segv       writes through a null pointer (no core file)
//
// The waiting modes write DIR/ready (whole, by rename) holding the pid once they are ready.
// DIR "-" is for modes that write nothing.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>

static int log_fd = -1;

// Async-signal-safe: digits of v (may be negative) at the end of buf; returns the start.
static char *fmt_int(char *end, long v) {
    int neg = v < 0;
    unsigned long u = neg ? -(unsigned long)v : (unsigned long)v;
    do {
        *--end = '0' + u % 10;
        u /= 10;
    } while (u);
    if (neg)
        *--end = '-';
    return end;
}

static void on_signal(int sig, siginfo_t *info, void *ctx) {
    (void)ctx;
    char buf[96];
    char *end = buf + sizeof buf;
    char *p = end;
    *--p = '\n';
    p = fmt_int(p, info->si_code);
    *--p = ' ';
    p = fmt_int(p, info->si_pid);
    *--p = ' ';
    p = fmt_int(p, sig);
    if (write(log_fd, p, end - p) < 0)
        _exit(90);
    if (sig == SIGUSR1)
        _exit(7);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        exit(91);
    }
}

static void ready(const char *dir) {
    char text[32];
    snprintf(text, sizeof text, "%d\n", (int)getpid());
    write_file(dir, "ready", text);
}

static void no_core(void) {
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

static void wait_forever(void) {
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: sigchild DIR MODE [ARG]\n");
        return 2;
    }
    const char *dir = argv[1], *mode = argv[2];
    if (!strcmp(mode, "wait")) {
        ready(dir);
        wait_forever();
    }
    if (!strcmp(mode, "log") || !strcmp(mode, "group")) {
        char path[4096];
        snprintf(path, sizeof path, "%s/log", dir);
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (log_fd < 0) {
            perror(path);
            return 92;
        }
        const int sigs[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        struct sigaction act;
        memset(&act, 0, sizeof act);
        act.sa_sigaction = on_signal;
        act.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&act.sa_mask);
        for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            sigaddset(&act.sa_mask, sigs[i]);
        for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            sigaction(sigs[i], &act, NULL);
        if (!strcmp(mode, "group"))
            kill(0, SIGHUP); // delivered to this process before kill returns
        ready(dir);
        wait_forever();
    }
    if (!strcmp(mode, "status")) {
        FILE *f = fopen("/proc/self/status", "r");
        char line[512], text[2048] = "";
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "SigBlk:", 7) || !strncmp(line, "SigIgn:", 7))
                strncat(text, line, sizeof text - strlen(text) - 1);
        write_file(dir, "status", text);
        return 0;
    }
    if (!strcmp(mode, "exit") && argc > 3)
        return atoi(argv[3]);
    if (!strcmp(mode, "raise") && argc > 3) {
        no_core();
        raise(atoi(argv[3]));
        return 93;
    }
    if (!strcmp(mode, "segv")) {
        no_core();
        *(volatile int *)0 = 1;
        return 94;
    }
    fprintf(stderr, "sigchild: unknown mode %s\n", mode);
    return 2;
}

/* What a clock read costs on this host (issue 31): the hooks read CLOCK_MONOTONIC ~9 times a
 * tensor in isolate mode. On a VM whose clocksource the vDSO cannot read, each read is a system
 * call. Prints ns a read for each clock, and the clocksource.
 *   cc -O2 -o /tmp/clock_probe tests/gpu/clock_probe.c && /tmp/clock_probe */
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>

static uint64_t ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

int main(void) {
    const int n = 2000000;
    struct { const char *name; clockid_t id; } clocks[] = {
        {"CLOCK_MONOTONIC", CLOCK_MONOTONIC},
        {"CLOCK_MONOTONIC_COARSE", CLOCK_MONOTONIC_COARSE},
        {"CLOCK_REALTIME", CLOCK_REALTIME},
        {"CLOCK_THREAD_CPUTIME_ID", CLOCK_THREAD_CPUTIME_ID},
    };
    volatile uint64_t sink = 0;
    for (unsigned i = 0; i < sizeof clocks / sizeof clocks[0]; i++) {
        uint64_t t0 = ns(CLOCK_MONOTONIC);
        for (int k = 0; k < n; k++) sink += ns(clocks[i].id);
        uint64_t t1 = ns(CLOCK_MONOTONIC);
        printf("%-24s %7.1f ns a read\n", clocks[i].name, (double)(t1 - t0) / n);
    }
    uint64_t t0 = ns(CLOCK_MONOTONIC);
    for (int k = 0; k < n; k++) sink += __rdtsc();
    uint64_t t1 = ns(CLOCK_MONOTONIC);
    printf("%-24s %7.1f ns a read\n", "rdtsc", (double)(t1 - t0) / n);
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    char buf[64] = "?";
    if (f) { if (!fgets(buf, sizeof buf, f)) buf[0] = 0; fclose(f); }
    printf("clocksource %s", buf);
    return (int)(sink & 0);
}

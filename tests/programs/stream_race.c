// link: cudart
/* The stream-order check (docs/ordering.md): for every ordering edge, a correct program and a
 * wrong one. Each scenario allocates its own X with cudaMallocAsync on stream A (its size,
 * 4096 * the scenario's number, tells the scenarios apart in the trace), uses it on stream B
 * (a kernel handed X as its pointer parameter, a copy or a set of it), makes (or misses) one
 * edge, and frees X with cudaFreeAsync on A (or as the scenario says). The wrong variants are
 * the bug of a missing record_stream: nothing orders the use before the free.
 *
 * Run with the scenario names to run (in order), or none for all. The kernels do nothing: the
 * same output with and without the library. With STREAM_RACE_PAUSE=1 the first scenario run
 * runs with the check paused (the library's test-only isolate_test_order_pause) and the rest
 * with it resumed. */
#include "common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

typedef CUresult (*PFN_capture_begin)(CUstream, int);
typedef CUresult (*PFN_capture_end)(CUstream, void **);

static void k_nothing(void **params) { (void)params; }

static CUfunction k_use, k_array;
static PFN_capture_begin capture_begin;
static PFN_capture_end capture_end;
static unsigned char host_buf[1 << 20];

static cudaStream_t stream(int blocking) {
    cudaStream_t s = NULL;
    int rc = cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking);
    if (rc)
        say("stream create %d", rc);
    return s;
}

static void use(void *x, cudaStream_t s) {
    void *args[] = {&x};
    int rc = cudaLaunchKernel((const void *)k_use, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, s);
    if (rc)
        say("launch %d", rc);
}

/* A kernel taking a 16-byte struct by value, as PyTorch's elementwise kernels take their
 * operands (at::detail::Array<char*, 2>): {out, in}. */
static void use_array(uint64_t first, uint64_t second, cudaStream_t s) {
    uint64_t arr[2] = {first, second};
    void *args[] = {arr};
    int rc = cudaLaunchKernel((const void *)k_array, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, s);
    if (rc)
        say("launch %d", rc);
}

static cudaEvent_t recorded(cudaStream_t s) {
    cudaEvent_t e = NULL;
    cudaEventCreateWithFlags(&e, 2 /* cudaEventDisableTiming */);
    cudaEventRecord(e, s);
    return e;
}

/* PyTorch's sync_raw (CUDAMallocAsyncAllocator.cpp): `dependent` waits for `dependency`. */
static void sync_raw(cudaStream_t dependency, cudaStream_t dependent) {
    cudaEvent_t e = recorded(dependency);
    cudaStreamWaitEvent(dependent, e, 0);
    cudaEventDestroy(e);
}

static cudaStream_t g_sync_me;
static void *synchronizer(void *arg) {
    (void)arg;
    cudaStreamSynchronize(g_sync_me);
    return NULL;
}

/* One scenario: X on A, used on B, `edge` between, freed on A. */
static void run(int n, const char *name) {
    int blocking_b = !strcmp(name, "legacy_launch") || !strcmp(name, "legacy_free") ||
                     !strcmp(name, "sync_copy");
    int blocking_a = !strcmp(name, "legacy_launch") || !strcmp(name, "legacy_launch_nb") ||
                     !strcmp(name, "per_thread_legacy") || !strcmp(name, "per_thread");
    cudaStream_t a = stream(blocking_a), b = stream(blocking_b), u = stream(0);
    size_t size = 4096 * (size_t)n;
    void *x = NULL, *y = NULL;
    /* legacy_free*: X lives on the legacy default stream, and is freed there. */
    int on_legacy = !strncmp(name, "legacy_free", 11);
    cudaStream_t home = on_legacy ? NULL : a;
    int rc = cudaMallocAsync(&x, size, home);
    if (rc)
        say("malloc %d", rc);
    cudaStream_t user = b;
    if (!strncmp(name, "per_thread", 10))
        user = cudaStreamPerThread;
    if (!strcmp(name, "same_stream"))
        user = a;
    cudaEvent_t early = NULL;
    if (!strcmp(name, "event_early") || !strcmp(name, "event_sync_early") ||
        !strcmp(name, "event_query_early"))
        early = recorded(user); /* before the use: orders nothing of it */
    if (!strcmp(name, "device_sync_early"))
        cudaDeviceSynchronize();
    if (!strcmp(name, "capture") || !strcmp(name, "capture_after"))
        say("capture begin %d", capture_begin(user, 0));
    if (strcmp(name, "capture_after") != 0) {
        if (!strcmp(name, "copy") || !strcmp(name, "copy_event"))
            cudaMemcpyAsync(host_buf, x, 64, cudaMemcpyDeviceToHost, user);
        else if (!strcmp(name, "set") || !strcmp(name, "set_event"))
            cudaMemsetAsync(x, 0, 64, user);
        else if (!strcmp(name, "array")) {
            cudaMallocAsync(&y, 64, user);
            use_array(U64(y), U64(x), user); /* {out, in}: both allocations' starts */
        } else if (!strcmp(name, "struct_int"))
            use_array(U64(x), 7, user); /* an integer beside it: no evidence of a use */
        else
            use(x, user);
    }
    if (!strcmp(name, "capture") || !strcmp(name, "capture_after")) {
        void *graph = NULL;
        say("capture end %d", capture_end(user, &graph));
    }
    if (!strcmp(name, "capture_after"))
        use(x, user); /* after the capture ended: a use like any other */

    if (!strcmp(name, "event") || !strcmp(name, "copy_event") || !strcmp(name, "set_event")) {
        cudaEvent_t e = recorded(user);
        cudaStreamWaitEvent(a, e, 0);
        cudaEventDestroy(e);
    } else if (early && !strcmp(name, "event_early")) {
        cudaStreamWaitEvent(a, early, 0);
    } else if (!strcmp(name, "stream_sync")) {
        cudaStreamSynchronize(user);
    } else if (!strcmp(name, "stream_sync_other")) {
        cudaStreamSynchronize(a); /* the freeing stream, not the using one */
    } else if (!strcmp(name, "stream_query")) {
        while (cudaStreamQuery(user) != cudaSuccess)
            ;
    } else if (!strcmp(name, "stream_query_other")) {
        while (cudaStreamQuery(a) != cudaSuccess)
            ;
    } else if (!strcmp(name, "event_sync")) {
        cudaEvent_t e = recorded(user);
        cudaEventSynchronize(e);
        cudaEventDestroy(e);
    } else if (!strcmp(name, "event_sync_early")) {
        cudaEventSynchronize(early);
    } else if (!strcmp(name, "event_query")) {
        cudaEvent_t e = recorded(user);
        while (cudaEventQuery(e) != cudaSuccess)
            ;
        cudaEventDestroy(e);
    } else if (!strcmp(name, "event_query_early")) {
        while (cudaEventQuery(early) != cudaSuccess)
            ;
    } else if (!strcmp(name, "device_sync")) {
        cudaDeviceSynchronize();
    } else if (!strcmp(name, "legacy_launch") || !strcmp(name, "legacy_launch_nb") ||
               !strcmp(name, "per_thread_legacy")) {
        use(host_buf, NULL); /* any work on the legacy default stream (no allocation of ours) */
    } else if (!strcmp(name, "sync_copy") || !strcmp(name, "sync_copy_nb")) {
        cudaMalloc(&y, 64);
        cudaMemcpy(host_buf, y, 64, cudaMemcpyDeviceToHost); /* the legacy stream, then the host */
    } else if (!strcmp(name, "host_thread")) {
        pthread_t t;
        g_sync_me = user;
        pthread_create(&t, NULL, synchronizer, NULL);
        pthread_join(t, NULL);
    } else if (!strcmp(name, "unifier")) {
        sync_raw(a, u);
        sync_raw(user, u);
    } else if (!strcmp(name, "unifier_missing")) {
        sync_raw(a, u); /* the usage stream's sync_raw missing: record_stream not called */
    }

    if (!strcmp(name, "sync_free"))
        rc = cudaFree(x);
    else if (!strncmp(name, "unifier", 7))
        rc = cudaFreeAsync(x, u);
    else
        rc = cudaFreeAsync(x, home);
    if (rc)
        say("free %d", rc);
    if (y && !strcmp(name, "array"))
        cudaFreeAsync(y, user);
    else if (y)
        cudaFree(y); /* after X's free: a synchronous free orders everything before it */
    if (early)
        cudaEventDestroy(early);
    cudaDeviceSynchronize();
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaStreamDestroy(u);
    say("%s done", name);
}

/* Each scenario, by number (its X is 4096 * number bytes). */
static const char *SCENARIOS[] = {
    NULL,
    "none",               /* 1  wrong: nothing between the use on B and the free on A */
    "event",              /* 2  right: event recorded on B after the use, waited on by A */
    "event_early",        /* 3  wrong: the event was recorded before the use */
    "stream_sync",        /* 4  right: B synchronised by the host */
    "stream_sync_other",  /* 5  wrong: A synchronised instead */
    "stream_query",       /* 6  right: B queried until done */
    "stream_query_other", /* 7  wrong: A queried instead */
    "event_sync",         /* 8  right: an event after the use synchronised */
    "event_sync_early",   /* 9  wrong: an event before the use synchronised */
    "event_query",        /* 10 right: an event after the use queried until done */
    "event_query_early",  /* 11 wrong: an event before the use queried */
    "device_sync",        /* 12 right: cudaDeviceSynchronize after the use */
    "device_sync_early",  /* 13 wrong: before the use */
    "legacy_launch",      /* 14 right: B and A blocking, work on the legacy stream between */
    "legacy_launch_nb",   /* 15 wrong: B non-blocking: the legacy stream does not wait for it */
    "legacy_free",        /* 16 right: X on the legacy stream, used on blocking B, freed there */
    "legacy_free_nb",     /* 17 wrong: B non-blocking */
    "per_thread_legacy",  /* 18 right: used on the per-thread stream, then legacy-stream work */
    "per_thread",         /* 19 wrong: used on the per-thread stream, freed on blocking A */
    "sync_copy",          /* 20 right: B blocking, a synchronous copy between */
    "sync_copy_nb",       /* 21 wrong: B non-blocking */
    "copy",               /* 22 wrong: a copy from X on B */
    "copy_event",         /* 23 right: the copy, then an event */
    "set",                /* 24 wrong: a set of X on B */
    "set_event",          /* 25 right: the set, then an event */
    "capture",            /* 26 right: the launch was captured into a graph, not run */
    "capture_after",      /* 27 wrong: launched after the capture ended */
    "sync_free",          /* 28 right: cudaFree waits for the device */
    "same_stream",        /* 29 right: used and freed on A */
    "host_thread",        /* 30 right: another host thread synchronised B, then A freed */
    "unifier",            /* 31 right: PyTorch's record_stream free (both streams joined) */
    "unifier_missing",    /* 32 wrong: only the allocating stream joined */
    "array",              /* 33 wrong: X in a struct of operands {Y, X} on B */
    "struct_int",         /* 34 not read as a use: X beside an integer in a struct */
};
#define N_SCENARIOS ((int)(sizeof SCENARIOS / sizeof SCENARIOS[0]))

int main(int argc, char **argv) {
    setup();
    size_t s8[] = {8};
    k_use = standin_register_kernel_as(0, "k_use", k_nothing, 1, NULL, s8);
    size_t s16[] = {16};
    k_array = standin_register_kernel_as(1, "k_array", k_nothing, 1, NULL, s16);
    capture_begin = (PFN_capture_begin)rt_entry("cuStreamBeginCapture", cudaEnableDefault);
    capture_end = (PFN_capture_end)rt_entry("cuStreamEndCapture", cudaEnableDefault);
    say("registered %d", k_use && k_array && capture_begin && capture_end);
    int (*pause)(int) = NULL;
    if (getenv("STREAM_RACE_PAUSE")) {
        pause = (int (*)(int))dlsym(RTLD_DEFAULT, "isolate_test_order_pause");
        say("pause %d", pause ? pause(1) : -9);
    }
    for (int n = 1; n < N_SCENARIOS; n++) {
        int chosen = argc < 2;
        for (int i = 1; i < argc; i++)
            chosen |= !strcmp(argv[i], SCENARIOS[n]);
        if (chosen) {
            run(n, SCENARIOS[n]);
            if (pause) {
                say("resume %d", pause(0));
                pause = NULL;
            }
        }
    }
    return 0;
}

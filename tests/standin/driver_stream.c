/*
 * The stand-in driver (see driver_internal.h): streams and events, and the stream operations
 * (queued, run in order when something waits for them).
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ================================================================ streams and events */

struct CUstream_st {
    unsigned flags;
    int priority;
    int capturing; /* standin_set_capturing: what cuStreamIsCapturing says */
    struct op *head, *tail;
    struct CUstream_st *next;
};

struct CUevent_st {
    unsigned flags;
    int recorded;
    int done;
    unsigned long gen;
    struct CUstream_st *stream; /* where the pending record is queued */
    unsigned long long seq;
    double t_ms;
    struct CUevent_st *next;
};

static struct CUstream_st *g_streams;
static struct CUevent_st *g_events;
static unsigned long long g_seq;

/* Which stream a handle means. `ptsz`: the call is a per-thread-default-stream export, where
 * handle 0 means the per-thread stream. */
CUresult resolve_stream(CUstream h, int ptsz, enum stream_kind *kind, struct CUstream_st **out) {
    *out = NULL;
    if (h == NULL) {
        *kind = ptsz ? SK_PER_THREAD : SK_LEGACY;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_LEGACY) {
        *kind = SK_LEGACY;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_PER_THREAD) {
        *kind = SK_PER_THREAD;
        return CUDA_SUCCESS;
    }
    int ok = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUstream_st *s = g_streams; s; s = s->next)
        if (s == h)
            ok = 1;
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    *kind = SK_REAL;
    *out = h;
    return CUDA_SUCCESS;
}

static int stream_alive_locked(struct CUstream_st *h) {
    for (struct CUstream_st *s = g_streams; s; s = s->next)
        if (s == h)
            return 1;
    return 0;
}

static struct CUevent_st *find_event(CUevent e) {
    struct CUevent_st *found = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct CUevent_st *x = g_events; x; x = x->next)
        if (x == e)
            found = x;
    pthread_mutex_unlock(&g_lock);
    return found;
}

static void drain(struct CUstream_st *s, unsigned long long upto);

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void run_op(struct op *o) {
    switch (o->kind) {
    case OP_MEMSET:
        if (o->u.set.elem == 1) {
            memset((void *)o->u.set.dst, (int)o->u.set.value, o->u.set.n);
        } else {
            unsigned *d = (unsigned *)o->u.set.dst;
            for (size_t i = 0; i < o->u.set.n; i++)
                d[i] = o->u.set.value;
        }
        break;
    case OP_MEMCPY:
        memmove((void *)o->u.cpy.dst, (const void *)o->u.cpy.src, o->u.cpy.n);
        break;
    case OP_KERNEL: {
        /* A context that faulted runs nothing more. */
        struct CUctx_st *c = o->u.kern.ctx;
        if (!c || !atomic_load(&c->fault)) {
            CUcontext outer = t_kernel_ctx;
            t_kernel_ctx = c;
            o->u.kern.fn(o->u.kern.args);
            t_kernel_ctx = outer;
            atomic_fetch_add(&g_kernels_run, 1);
        }
        free(o->u.kern.buf);
        free(o->u.kern.args);
        break;
    }
    case OP_FREE: {
        pthread_mutex_lock(&g_lock);
        struct arena *a = NULL;
        struct block *b = live_block_at(o->u.fr.addr, &a);
        if (b && b->pending_free) {
            if (b->pool)
                pool_account(b->pool, -(long long)b->size);
            arena_release(a, b);
        }
        pthread_mutex_unlock(&g_lock);
        break;
    }
    case OP_RECORD: {
        double t = now_ms();
        pthread_mutex_lock(&g_lock);
        struct CUevent_st *e = o->u.rec.ev;
        if (e->gen == o->u.rec.gen) {
            e->done = 1;
            e->stream = NULL;
            e->t_ms = t;
        }
        pthread_mutex_unlock(&g_lock);
        break;
    }
    case OP_WAIT: {
        pthread_mutex_lock(&g_lock);
        int alive = stream_alive_locked(o->u.wait.stream);
        pthread_mutex_unlock(&g_lock);
        if (alive)
            drain(o->u.wait.stream, o->u.wait.seq);
        break;
    }
    }
}

/* Runs the operations queued on s, in order, up to and including sequence number `upto`. */
static void drain(struct CUstream_st *s, unsigned long long upto) {
    pthread_mutex_lock(&g_exec);
    for (;;) {
        pthread_mutex_lock(&g_lock);
        struct op *o = s->head;
        if (!o || o->seq > upto) {
            pthread_mutex_unlock(&g_lock);
            break;
        }
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&g_lock);
        run_op(o);
        free(o);
    }
    pthread_mutex_unlock(&g_exec);
}

/* Runs every queued operation of every stream (only blocking streams: `blocking_only`). */
void drain_all(int blocking_only) {
    pthread_mutex_lock(&g_exec);
    for (;;) {
        struct CUstream_st *pick = NULL;
        pthread_mutex_lock(&g_lock);
        for (struct CUstream_st *s = g_streams; s && !pick; s = s->next)
            if (s->head && !(blocking_only && (s->flags & CU_STREAM_NON_BLOCKING)))
                pick = s;
        pthread_mutex_unlock(&g_lock);
        if (!pick)
            break;
        drain(pick, ~0ull);
    }
    pthread_mutex_unlock(&g_exec);
}

/* Puts o on a stream: the legacy stream first waits for all blocking streams and runs it at
 * once, the per-thread stream runs it at once, a created stream queues it. */
void submit(enum stream_kind kind, struct CUstream_st *s, struct op *o) {
    if (kind != SK_REAL) {
        if (kind == SK_LEGACY)
            drain_all(1);
        pthread_mutex_lock(&g_exec);
        run_op(o);
        pthread_mutex_unlock(&g_exec);
        free(o);
        return;
    }
    pthread_mutex_lock(&g_lock);
    o->seq = ++g_seq;
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    if (o->kind == OP_RECORD && o->u.rec.ev->gen == o->u.rec.gen) {
        o->u.rec.ev->stream = s;
        o->u.rec.ev->seq = o->seq;
    }
    unsigned long long seq = o->seq;
    pthread_mutex_unlock(&g_lock);
    if (g_sync)
        drain(s, seq);
}

struct op *new_op(enum op_kind kind) {
    struct op *o = calloc(1, sizeof *o);
    if (o)
        o->kind = kind;
    return o;
}

static CUresult stream_create(CUstream *ph, unsigned flags, int priority) {
    NEED_CTX();
    if (!ph)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->flags = flags;
    s->priority = priority;
    pthread_mutex_lock(&g_lock);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_lock);
    *ph = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    return stream_create(phStream, Flags, 0);
}

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    /* Like the real driver: priorities clamp to [greatest, least] = [-5, 0]. */
    if (priority > 0)
        priority = 0;
    if (priority < -5)
        priority = -5;
    return stream_create(phStream, flags, priority);
}

/* Pending work completes first (the real driver lets it finish after the call returns). */
static CUresult stream_destroy(CUstream h) {
    NEED_CTX();
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(h, 0, &kind, &s);
    if (r)
        return r;
    pthread_mutex_lock(&g_exec);
    drain(s, ~0ull);
    pthread_mutex_lock(&g_lock);
    int found = 0;
    for (struct CUstream_st **pp = &g_streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_exec);
    if (!found)
        return CUDA_ERROR_INVALID_HANDLE;
    free(s);
    return CUDA_SUCCESS;
}

/* The flags a stream was created with; the default streams' handles are blocking (0). */
CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags) {
    NEED_CTX();
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hStream, 0, &kind, &s);
    if (r)
        return r;
    *flags = s ? s->flags : 0;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream) { return stream_destroy(hStream); }
CUresult cuStreamDestroy_v2(CUstream hStream) { return stream_destroy(hStream); }

atomic_int g_stuck;

/* A device that never finishes its work (a hung kernel): every synchronising call waits for
 * good and every query says not ready. For the exit check's time limit (tests/tests/isolation.rs). */
void standin_device_stuck(void) { atomic_store(&g_stuck, 1); }

void stuck_wait(void) {
    while (atomic_load(&g_stuck))
        sleep(1);
}

static CUresult stream_sync(CUstream h, int ptsz) {
    NEED_CTX();
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(h, ptsz, &kind, &s);
    if (r)
        return r;
    if (kind == SK_REAL)
        drain(s, ~0ull);
    else if (kind == SK_LEGACY)
        drain_all(1);
    return ctx_fault();
}

CUresult cuStreamSynchronize(CUstream hStream) {
    stuck_wait();
    return stream_sync(hStream, 0);
}
CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
    stuck_wait();
    return stream_sync(hStream, 1);
}
/* A query runs the stream's work and reports it done (never CUDA_ERROR_NOT_READY), so that a
 * polling loop always ends. */
CUresult cuStreamQuery(CUstream hStream) {
    return atomic_load(&g_stuck) ? CUDA_ERROR_NOT_READY : stream_sync(hStream, 0);
}

/* Stream capture is not emulated: a test marks a created stream as capturing (1) or not (0),
 * by standin_set_capturing or by cuStreamBeginCapture_v2 / cuStreamEndCapture (which make no
 * graph: work queued meanwhile still runs), and cuStreamIsCapturing reports it
 * (CU_STREAM_CAPTURE_STATUS_ACTIVE = 1). */
int standin_set_capturing(CUstream hStream, int on) {
    enum stream_kind kind;
    struct CUstream_st *s;
    if (resolve_stream(hStream, 0, &kind, &s) || !s)
        return -1;
    s->capturing = on;
    return 0;
}

/* Whether the stream (NULL: a default stream, which never captures here) is capturing. */
int stream_capturing(struct CUstream_st *s) { return s && s->capturing; }

CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode) {
    NEED_CTX();
    (void)mode;
    return standin_set_capturing(hStream, 1) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* CUDA 10.0's export, without a mode. */
CUresult cuStreamBeginCapture(CUstream hStream) { return cuStreamBeginCapture_v2(hStream, 0); }

CUresult cuStreamEndCapture(CUstream hStream, void **graph) {
    NEED_CTX();
    if (graph)
        *graph = NULL;
    return standin_set_capturing(hStream, 0) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, int *status) {
    NEED_CTX();
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hStream, 0, &kind, &s);
    if (r)
        return r;
    *status = s ? s->capturing : 0;
    return CUDA_SUCCESS;
}
CUresult cuStreamQuery_ptsz(CUstream hStream) {
    return atomic_load(&g_stuck) ? CUDA_ERROR_NOT_READY : stream_sync(hStream, 1);
}

CUresult cuCtxSynchronize(void) {
    stuck_wait();
    NEED_CTX();
    drain_all(0);
    return ctx_fault();
}

/* CUDA 13's form (what "cuCtxSynchronize" at version 13000 gives, and what libcudart 13 asks
 * for besides the old one): the given context, or the current one for NULL. */
CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    if (!ctx || ctx == t_ctx)
        return cuCtxSynchronize();
    CUcontext was = t_ctx;
    t_ctx = ctx;
    CUresult r = cuCtxSynchronize();
    t_ctx = was;
    return r;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    /* As on the H200: after a kernel's fault the context's sticky error is every call's answer,
     * an event's creation too (the library's fault check at exit must read it from there). */
    NEED_LIVE_CTX();
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                            CU_EVENT_INTERPROCESS))
        return CUDA_ERROR_INVALID_VALUE;
    if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = Flags;
    pthread_mutex_lock(&g_lock);
    e->next = g_events;
    g_events = e;
    pthread_mutex_unlock(&g_lock);
    *phEvent = e;
    return CUDA_SUCCESS;
}

/* Successful event records, the program's and the library's: how many a scenario costs. */
static atomic_ulong g_event_records;
unsigned long standin_event_records(void) { return atomic_load(&g_event_records); }

static CUresult event_record(CUevent h, CUstream hs, int ptsz) {
    NEED_LIVE_CTX();
    struct CUevent_st *e = find_event(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    struct op *o = new_op(OP_RECORD);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    e->gen++;
    e->recorded = 1;
    e->done = 0;
    e->stream = NULL;
    o->u.rec.ev = e;
    o->u.rec.gen = e->gen;
    pthread_mutex_unlock(&g_lock);
    submit(kind, s, o);
    atomic_fetch_add(&g_event_records, 1);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    return event_record(hEvent, hStream, 0);
}
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
    return event_record(hEvent, hStream, 1);
}

/* Runs the event's stream up to the event. */
static CUresult event_complete(CUevent h) {
    NEED_CTX();
    struct CUevent_st *e = find_event(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_exec);
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *s = (e->recorded && !e->done) ? e->stream : NULL;
    unsigned long long seq = e->seq;
    pthread_mutex_unlock(&g_lock);
    if (s)
        drain(s, seq);
    pthread_mutex_unlock(&g_exec);
    return ctx_fault();
}

CUresult cuEventSynchronize(CUevent hEvent) {
    stuck_wait();
    return event_complete(hEvent);
}
/* Like cuStreamQuery: runs the work up to the event and reports it done. */
CUresult cuEventQuery(CUevent hEvent) {
    return atomic_load(&g_stuck) ? CUDA_ERROR_NOT_READY : event_complete(hEvent);
}

static CUresult event_destroy(CUevent h) {
    NEED_CTX();
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct CUevent_st **pp = &g_events; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            found = 1;
            break;
        }
    /* A record still queued points at the event: keep it alive (leaked) in that case. */
    int pending = found && h->recorded && !h->done;
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pending)
        free(h);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) { return event_destroy(hEvent); }
CUresult cuEventDestroy_v2(CUevent hEvent) { return event_destroy(hEvent); }

static CUresult event_elapsed(float *ms, CUevent hs, CUevent he) {
    NEED_CTX();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *a = find_event(hs), *b = find_event(he);
    if (!a || !b)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded || !b->recorded)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->done || !b->done)
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)(b->t_ms - a->t_ms);
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return event_elapsed(pMilliseconds, hStart, hEnd);
}
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return event_elapsed(pMilliseconds, hStart, hEnd);
}

static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned flags, int ptsz) {
    NEED_CTX();
    if (flags & ~1u) /* CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_EXTERNAL */
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = find_event(he);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    enum stream_kind kind;
    struct CUstream_st *s;
    CUresult r = resolve_stream(hs, ptsz, &kind, &s);
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *target = (e->recorded && !e->done) ? e->stream : NULL;
    unsigned long long seq = e->seq;
    pthread_mutex_unlock(&g_lock);
    if (!target)
        return CUDA_SUCCESS; /* nothing outstanding to wait for */
    struct op *o = new_op(OP_WAIT);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->u.wait.stream = target;
    o->u.wait.seq = seq;
    submit(kind, s, o);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, 0);
}
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, 1);
}

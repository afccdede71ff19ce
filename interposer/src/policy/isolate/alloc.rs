//! Allocation and free in isolate mode: an allocation that runs out of memory is retried after
//! quarantined memory is released (the program never sees an out-of-memory a normal run would
//! not have had); a free is poisoned and quarantined instead of given back; a second free of
//! held memory answers as a double free does. Also the bytes of stream-ordered allocations the
//! program holds, for its pool statistics.
//!
//! Layer: policies. Uses the base, recording, [`crate::policy::guard`], [`crate::policy::reuse`],
//! [`crate::policy::release`], [`crate::policy::order`] and the folder's state, poison, quarantine, release paths, exit
//! check and counters.

use super::counters::{CAPTURED, POISON_BYTES, POISON_TIME, POISONED, WRITTEN_BYTES};
use super::exit::EXIT_GAVE_UP;
use super::leave::{
    IN_FLIGHT, INFLIGHT, POLL_EVERY, SINCE_POLL, device_memory, free_to_driver, reap,
    trim_default_pool,
};
use super::poison::poison;
use super::quarantine::{
    Leaving, forget_range, quarantine, quarantine_index_only, release_oldest, reserve,
    wait_for_leaving,
};
use super::state::{Held, Live, current_ctx, freed, st, state};
use crate::base::config;
use crate::base::cu;
use crate::base::cuda::*;
use crate::base::real::{self, *};
use crate::base::sys::{ForkLock, now_ns, raise};
use crate::policy::{device, guard, order, release, reuse};
use crate::record::event::{self, Pending};
use crate::record::profile::{self, Part};
use isolate_trace::{Api, Event, Memory, NoteKind, Source};
use rustc_hash::FxHashSet;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

pub(super) fn quarantinable(api: Api) -> bool {
    matches!(api.memory(), Memory::Device | Memory::Managed)
}

pub fn alloc(
    proto: Event,
    out: Out,
    mut call: impl FnMut() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    let mut p = Pending::after(proto.api);
    p.ev = proto;
    let guarded = guard::guardable(proto.api, proto.size) && !out.is_null();
    // Made while its stream captures a graph: graph memory, which the driver must make (a kept
    // allocation handed out here was freed inside the capture by the driver's rules: an
    // "invalid argument" abort in PyTorch's tests), and no release may synchronise (it would
    // invalidate the capture).
    let captured = proto.api.stream_ordered() && capturing(proto.stream as CUstream);
    // Checked memory of this size kept by the library (`ISOLATE_REUSE=on`): no driver call.
    // The context it was asked in (`asked`) is still current after, whether kept memory was
    // found or the driver allocated: an allocation call never changes a current context, only
    // makes one current where the thread had none (the runtime's first call on a thread).
    let mut asked = 0;
    let kept = if !guarded
        && !captured
        && !out.is_null()
        && proto.api.source() == Source::DefaultPool
        && reuse::enabled()
    {
        profile::timed(Part::Kept, || {
            asked = current_ctx();
            reuse::take(asked, proto.size)
        })
    } else {
        None
    };
    let mut attempt = || {
        if let Some(ptr) = kept {
            out.write(ptr);
            return CUDA_SUCCESS;
        }
        // Guard mode cannot make it, or ran out of memory: the real call answers, as in a
        // normal run (a runtime call also leaves its sticky error, which a code alone cannot).
        if guarded && let Ok(Some(ptr)) = guard::alloc(proto.api, proto.size, forget_range) {
            out.write(ptr);
            return CUDA_SUCCESS;
        }
        call()
    };
    let first = attempt();
    let mut r = first;
    if r == CUDA_ERROR_OUT_OF_MEMORY && quarantinable(proto.api) && !captured {
        // Isolation must never cause an out-of-memory a normal run would not have had.
        // Meanwhile what releases free goes to the driver, not into the reuse cache.
        let _short = reuse::Short::start();
        let (rr, released) = reclaim_rounds(proto.size, &mut attempt);
        r = rr;
        if released > 0 || r == CUDA_SUCCESS {
            // Also where no quarantined byte went and the retry still ran (kept memory given
            // back, the pool trimmed, batches in flight freed, or another process's memory
            // freed meanwhile): the retry is what the program's call became.
            event::note(
                NoteKind::OomRetry,
                0,
                proto.size,
                released,
                format!(
                    "{} of {} bytes ran out of memory; released {released} quarantined bytes \
                     and kept memory, and retried: {}",
                    proto.api,
                    proto.size,
                    if r == CUDA_SUCCESS {
                        "it succeeded"
                    } else {
                        "it failed again"
                    }
                ),
            );
        }
        if r == CUDA_SUCCESS && proto.api.is_runtime() {
            // The failed attempt left the runtime's last error, which PyTorch's next check
            // (`cudaGetLastError` after a launch) would throw as "CUDA error: out of memory"
            // (the H100, four model processes: GPT-2 and BERT failed so in isolate mode with
            // every allocation successful). It is cleared whether or not quarantine went.
            let _ = cu::get_last_error();
        }
        if r != CUDA_SUCCESS {
            r = first; // exactly the code a normal run gets
        }
    }
    p.ev.seq = event::next_seq();
    p.ev.result = r;
    if r == CUDA_SUCCESS {
        p.ev.ptr = out.read();
    }
    after(&mut p.ev);
    if r == CUDA_SUCCESS && proto.api.from_pool() && p.ev.ptr != 0 {
        let now = POOL_LIVE.fetch_add(p.ev.size, Relaxed) + p.ev.size;
        raise(&POOL_PEAK, now);
    }
    if r == CUDA_SUCCESS && quarantinable(proto.api) && p.ev.ptr != 0 && !captured {
        // The kernels the first frees need, loaded while the device has room for them.
        let ctx = if asked != 0 { asked } else { current_ctx() };
        device::prepare(ctx);
        if p.ev.device < 0 && ctx != 0 {
            // Asked of the driver once (the event's device is the context's).
            p.ev.device = event::device_of(ctx);
        }
    }
    if r == CUDA_SUCCESS && quarantinable(proto.api) && p.ev.ptr != 0 {
        let live = Live {
            size: p.ev.size,
            seq: p.ev.seq,
            pooled: proto.api.from_pool(),
            default_pool: proto.api.source() == Source::DefaultPool,
            captured,
            // Taken now rather than in `finish` (once either way): the event has the same id.
            stack: p.stack(),
        };
        profile::timed(Part::Live, || st!(state()).live.insert(p.ev.ptr, live));
        order::allocated(
            p.ev.ptr,
            live.size,
            live.seq,
            live.stack,
            proto.api,
            proto.stream,
        );
    }
    p.finish(r);
    r
}

pub fn free(proto: Event, call: impl FnOnce() -> i32) -> i32 {
    let mut p = Pending::before(proto.api);
    let seq = p.ev.seq;
    p.ev = Event { seq, ..proto };
    if EXIT_GAVE_UP.load(Relaxed) {
        // The exit check is stuck waiting for the device, maybe holding the release queue:
        // what is freed from now on (the exit's last frees) goes to the driver as it is.
        let r = call();
        p.finish(r);
        return r;
    }
    // From here until it is in quarantine the memory is in no place an allocation that runs
    // out of memory on another thread looks: counted as leaving, which that one waits for.
    let mut leaving = None;
    let (live, held) = if proto.ptr != 0 && quarantinable(proto.api) {
        profile::timed(Part::Live, || {
            let mut g = state();
            let s = st!(g);
            let live = s.live.remove(&proto.ptr);
            leaving = live.map(|_| Leaving::start());
            (live, live.is_none() && s.q.contains(proto.ptr))
        })
    } else {
        (None, false)
    };
    if held {
        // A second free of memory we hold: the driver must not be asked (it would really free
        // memory that is in quarantine), but the caller gets what a double free gets.
        let r = double_free(proto.api, proto.stream as CUstream);
        p.finish(r);
        return r;
    }
    let Some(live) = live else {
        let r = call();
        p.finish(r);
        return r;
    };
    p.ev.size = live.size;
    if live.pooled {
        let _ = POOL_LIVE.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(live.size)));
    }
    let ordered = proto.api.stream_ordered();
    let Some(ctx) = context(proto.api) else {
        // No context to poison in, not even the one the runtime would have made current.
        return to_driver(p, proto.ptr, live, call);
    };
    if live.captured {
        // Graph memory (allocated while its stream captured): the graph owns it. Its free,
        // in the capture or after it (PyTorch frees a captured tensor whose graph never ran),
        // goes to the driver as it is: the same answer as without the library, and no poison
        // written into memory the graph may not have mapped (the H100: 15 false device faults
        // and 2 false stale writes in PyTorch's graph tests).
        if ordered && capturing(proto.stream as CUstream) {
            CAPTURED.fetch_add(1, Relaxed);
        }
        return to_driver(p, proto.ptr, live, call);
    }
    if ordered && !stream_usable(proto.stream) {
        // A stream-ordered free on a stream the program destroyed (PyTorch's stream-ordered
        // backend frees a tensor on its creation stream; CuPy's stream may be gone by then):
        // the library queues nothing on it, and the program sees the driver's error as it
        // would without the library.
        return to_driver(p, proto.ptr, live, call);
    }
    // The stream-order check, at the free and before its poison is queued: a use on another
    // stream not ordered before it is a finding (the free's stack is taken once either way).
    let unordered = if order::active() {
        let free_stack = p.stack();
        order::freed(proto.ptr, proto.api, proto.stream, seq, free_stack)
    } else {
        None
    };
    if guard::owns(proto.ptr) {
        let r = guard::free(proto.ptr, ordered.then_some(proto.stream as CUstream));
        let t = now_ns();
        p.at(t);
        let entry = freed(&proto, live, seq, p.stack(), Held::Guarded, t, ctx);
        p.finish(r);
        // The range stays reserved and unmapped for good: listed so launches into it are named.
        quarantine_index_only(entry);
        return r;
    }
    if ordered && capturing(proto.stream as CUstream) {
        // A free recorded into a CUDA graph (stream capture): the graph must free what it
        // allocated, and nothing may be queued on a capturing stream that the graph does not
        // own (a capture frees only what it allocated: the driver answers the rest).
        CAPTURED.fetch_add(1, Relaxed);
        return to_driver(p, proto.ptr, live, call);
    }
    // Taken before the poison's clock starts (`finish` writes the same id in the event).
    let free_stack = p.stack();
    let poisoning = POISON_TIME.start();
    let t = poisoning.started().unwrap_or_else(now_ns);
    p.at(t);
    let mut entry = freed(&proto, live, seq, free_stack, Held::Allocation, t, ctx);
    // Asked of the driver once: no call between changes the context.
    p.ev.device = entry.device;
    if let Some(user) = unordered
        && stream_usable(user)
    {
        entry.also = release::mark_use(entry.ctx, user as usize);
        if entry.also != 0 {
            order::waited();
        }
    }
    // Deferred to the stream's next work: one launch poisons a run of frees (release::defer).
    let deferred = if ordered && defers(proto.api, proto.ptr) {
        profile::timed(Part::Poison, || {
            release::defer(entry.ctx, proto.stream as usize, proto.ptr, live.size)
        })
    } else {
        None
    };
    let r = match deferred {
        Some((ev, shift)) => {
            entry.mark = ev;
            entry.shift = shift;
            CUDA_SUCCESS
        }
        None => profile::timed(Part::Poison, || {
            poison(
                proto.ptr,
                live.size,
                ordered,
                proto.stream as CUstream,
                entry.ctx,
            )
        }),
    };
    if ordered && deferred.is_none() {
        if release::enabled() {
            entry.mark = release::mark(entry.ctx, proto.stream as usize);
        } else {
            entry.event = release::record_event(proto.stream as usize);
        }
    }
    POISON_TIME.stop(poisoning);
    POISONED.fetch_add(1, Relaxed);
    POISON_BYTES.fetch_add(live.size, Relaxed);
    if config::get().poison.is_some() {
        WRITTEN_BYTES.fetch_add(entry.touched(), Relaxed);
    }
    p.finish(r);
    profile::timed(Part::Quarantine, || quarantine(entry));
    drop(leaving);
    if IN_FLIGHT.load(Relaxed) > 0 && SINCE_POLL.fetch_add(1, Relaxed).is_multiple_of(POLL_EVERY) {
        // Checked batches give their memory back soon, not only at the next release.
        profile::timed(Part::Reap, || reap(false));
    }
    r
}

/// [`reclaim`] again while other threads' frees come in (a free takes longer under isolation
/// than without, and one that finished meanwhile may have freed what is needed), 8 rounds at
/// most: the last attempt's result and the quarantined bytes released in all.
fn reclaim_rounds(size: u64, attempt: &mut dyn FnMut() -> i32) -> (i32, u64) {
    // Releases stay on the freeing threads for a while (memory is tight: keeper.rs).
    super::keeper::out_of_memory();
    let mut r = CUDA_ERROR_OUT_OF_MEMORY;
    let mut released = 0u64;
    for _ in 0..8 {
        let frees = POISONED.load(Relaxed);
        let (rr, n) = reclaim(size, attempt);
        r = rr;
        released += n;
        if r != CUDA_ERROR_OUT_OF_MEMORY || POISONED.load(Relaxed) == frees {
            break;
        }
    }
    if r == CUDA_ERROR_OUT_OF_MEMORY {
        r = wait_for_others(attempt);
    }
    (r, released)
}

/// How long an allocation or launch that still ran out of memory after this process gave its
/// memory back waits for other processes' isolation to give theirs, in steps of
/// [`OTHERS_STEP`].
const OTHERS_WAIT: std::time::Duration = std::time::Duration::from_millis(200);
const OTHERS_STEP: std::time::Duration = std::time::Duration::from_millis(20);

/// After this process gave back all it could and `attempt` still ran out of memory: where the
/// device's free memory is below the reserve (`ISOLATE_RESERVE`), other processes hold it —
/// under isolate mode, likely their quarantines, which give way within their next 20 ms of
/// frees (quarantine.rs, `short_of_memory`). So the attempt is made again every 20 ms for up
/// to 200 ms. On the H100, four model processes on one device: BERT's 238 MiB allocation
/// failed with 25 MiB free while the other three held their quarantines. Nothing waits with
/// the reserve off, or while the device has the reserve free (the request is then simply too
/// large). Returns the last attempt's result.
fn wait_for_others(attempt: &mut dyn FnMut() -> i32) -> i32 {
    let mut r = CUDA_ERROR_OUT_OF_MEMORY;
    let start = std::time::Instant::now();
    while start.elapsed() < OTHERS_WAIT {
        let Some((free, total)) = device_memory() else {
            break;
        };
        let reserve = reserve(total);
        if reserve == 0 || free >= reserve {
            break;
        }
        std::thread::sleep(OTHERS_STEP);
        r = attempt();
        if r != CUDA_ERROR_OUT_OF_MEMORY {
            break;
        }
    }
    r
}

/// One round of giving memory back for an allocation of `size` bytes that ran out of memory,
/// trying it again (`attempt`) after each step that could help; returns its last result and
/// the quarantined bytes released.
fn reclaim(size: u64, attempt: &mut dyn FnMut() -> i32) -> (i32, u64) {
    let mut r = CUDA_ERROR_OUT_OF_MEMORY;
    // Entries another thread took out of quarantine are in no place looked at below
    // until it hands them on: waited for (at most 1 s; the device bounds it).
    wait_for_leaving(1_000_000_000);
    // First the batches already on their way out: their frees run on the release stream.
    // (Taking the queue's lock also waits for another thread giving a batch back.)
    if !EXIT_GAVE_UP.load(Relaxed) && !INFLIGHT.lock().is_empty() {
        reap(true);
        r = attempt();
    }
    // Memory already given back on the release stream is free only once the device has
    // run those frees (a batch read without waiting queues them there and goes on), and
    // stream-ordered memory goes back to its pool, which holds it until trimmed.
    if r == CUDA_ERROR_OUT_OF_MEMORY && !EXIT_GAVE_UP.load(Relaxed) && release::drain(current_ctx())
    {
        trim_default_pool();
        r = attempt();
    }
    // Then the checked memory kept for reuse: back to the driver, waited for.
    if r == CUDA_ERROR_OUT_OF_MEMORY {
        let ctx = current_ctx();
        let given_back = reuse::drain(ctx);
        if !given_back.is_empty() {
            free_to_driver(ctx, &given_back, true);
            r = attempt();
        }
    }
    // Then the quarantine, oldest first: only as much as could make the request succeed
    // (the first time what the device lacks, then the request's size again while the
    // free memory is in pieces), and nothing when no release could (a memory probe
    // asking for more than the device has must not empty the quarantine).
    let mut released = 0u64;
    let mut need = match room_after_release(size) {
        Some(short) => short.max(1),
        None => 0,
    };
    while r == CUDA_ERROR_OUT_OF_MEMORY && need > 0 {
        let n = release_oldest(need);
        if n == 0 {
            break;
        }
        released += n;
        trim_default_pool();
        r = attempt();
        need = size.max(1);
    }
    (r, released)
}

/// A kernel launch, or a call that loads a kernel (hooks/room.rs), that ran out of memory
/// (named `what`): the driver needed device memory of its own for it (a lazily loaded module,
/// more local memory), which no hook of the library sees asked for. Isolation must not cause
/// that either: what the library holds goes back as for an allocation (batches in flight, kept
/// memory, then the quarantine's oldest, until the device has the reserve free or the
/// quarantine is empty), `attempt` calling again after each step; an `OomRetry` note (size 0)
/// says so. Returns the last attempt's result.
pub fn out_of_room(what: &str, attempt: &mut dyn FnMut() -> i32) -> i32 {
    let _short = reuse::Short::start();
    let room = match device_memory() {
        Some((free, total)) => reserve(total)
            .max(1 << 30)
            .min(free.saturating_add(st!(state()).held))
            .max(1),
        None => 1 << 30,
    };
    let (r, released) = reclaim_rounds(room, attempt);
    event::note(
        NoteKind::OomRetry,
        0,
        0,
        released,
        format!(
            "{what} ran out of memory; released {released} quarantined bytes and kept memory, \
             and called it again: {}",
            if r == CUDA_SUCCESS {
                "it ran"
            } else {
                "it failed again"
            }
        ),
    );
    r
}

/// What the device lacks for an allocation of `size` bytes (its free memory short of `size`,
/// at least 1), or `None` when releasing the whole quarantine could not make it: more than
/// the device's memory, or more than its free memory and every quarantined byte together.
/// Where the driver cannot say, the whole request.
fn room_after_release(size: u64) -> Option<u64> {
    let Some((free, total)) = device_memory() else {
        return Some(size);
    };
    let held = st!(state()).held;
    if size > total || size > free.saturating_add(held) {
        return None;
    }
    Some(size.saturating_sub(free).max(1))
}

/// The calling thread's current context for the library's own driver calls (the synchronize,
/// the poison, the quarantine entry's context), if it has one. A runtime free that is its
/// thread's first CUDA call finds none: the runtime makes the device's primary context current
/// as it starts any call, so here that is done first, as the runtime does it (`cudaFree(NULL)`,
/// which frees nothing). Without this, such a free returned 201 (invalid context) and freed
/// nothing.
fn context(api: Api) -> Option<usize> {
    let ctx = current_ctx();
    if ctx != 0 {
        return Some(ctx);
    }
    if api.is_runtime()
        && let Some(f) = real::FREE.get()
    {
        // SAFETY: the real runtime's cudaFree; a null pointer frees nothing (the runtime only
        // makes the thread's context current, as at any call's start).
        unsafe { f(std::ptr::null_mut()) };
        return Some(current_ctx()).filter(|&c| c != 0);
    }
    None
}

/// A free the library leaves to the driver as it is (nothing quarantined, nothing queued): the
/// caller gets the driver's answer, and memory the driver did not free is still live (and
/// counted in [`POOL_LIVE`] again).
fn to_driver(p: Pending, ptr: u64, live: Live, call: impl FnOnce() -> i32) -> i32 {
    let r = call();
    if r != CUDA_SUCCESS {
        st!(state()).live.insert(ptr, live);
        if live.pooled {
            POOL_LIVE.fetch_add(live.size, Relaxed);
        }
    }
    p.finish(r);
    r
}

/// Whether `stream` names a default stream (0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`),
/// which the program never destroys.
fn default_stream(stream: u64) -> bool {
    matches!(stream, 0 | STREAM_LEGACY | STREAM_PER_THREAD)
}

/// The streams the program destroyed (`cuStreamDestroy`): looked up at every stream-ordered
/// free once any was, so a set, with the order they came in to forget the oldest past
/// [`GONE_KEPT`]. A handle may name a new stream later (the driver reuses them): such a handle
/// is asked about before it is trusted again.
#[derive(Default)]
struct Gone {
    set: FxHashSet<u64>,
    order: VecDeque<u64>,
}

static GONE: ForkLock<Option<Gone>> = ForkLock::new(None);
static ANY_GONE: AtomicBool = AtomicBool::new(false);
const GONE_KEPT: usize = 4096;

/// The program is about to destroy `stream`.
pub fn stream_destroyed(stream: u64) {
    if default_stream(stream) {
        return;
    }
    let mut g = GONE.lock();
    let g = g.get_or_insert_with(Gone::default);
    if g.set.insert(stream) {
        if g.order.len() == GONE_KEPT
            && let Some(old) = g.order.pop_front()
        {
            g.set.remove(&old);
        }
        g.order.push_back(stream);
    }
    ANY_GONE.store(true, Release);
}

/// Whether work may be queued on `stream`: not a stream the program destroyed, unless the driver
/// says the handle names a stream again (asked only for handles once destroyed).
fn stream_usable(stream: u64) -> bool {
    if default_stream(stream) || !ANY_GONE.load(Acquire) {
        return true;
    }
    let mut g = GONE.lock();
    let Some(g) = g.as_mut().filter(|g| g.set.contains(&stream)) else {
        return true;
    };
    // SAFETY: the handle the program passed to its own free, which the runtime validates the
    // same way (a destroyed handle is answered with an error, not followed).
    match unsafe { cu::stream_get_flags(stream as CUstream) } {
        Err(cu::CuError::Code(_)) => false,
        _ => {
            // A new stream under the old handle.
            g.set.remove(&stream);
            g.order.retain(|&s| s != stream);
            true
        }
    }
}

/// In a fork child: the parent's streams are not the child's (another thread of the parent may
/// have held the lock at the fork).
pub fn forget_destroyed_streams() {
    GONE.reset_in_child(None);
    ANY_GONE.store(false, Release);
}

/// Whether the poison of a stream-ordered free by `api` of `ptr` waits for the stream's next
/// work ([`release::batching`]): not on the per-thread default stream (only its own thread may
/// queue there), not where the start is not 16-byte aligned (the fill kernel's stores).
pub(super) fn defers(api: Api, ptr: u64) -> bool {
    release::batching() && ptr.is_multiple_of(16) && !api.per_thread_stream()
}

/// What a double free returns, without touching the memory: the runtime is asked to free an
/// address nothing can own, so it also sets its sticky last error exactly as for a double free.
pub(super) fn double_free(api: Api, stream: CUstream) -> i32 {
    let bogus = std::ptr::dangling_mut::<c_void>(); // address 1: never allocated
    // SAFETY (every arm): the address 1 is no allocation's, so the real free rejects it
    // without touching memory (as it does the program's double free); `stream` is the one
    // the program passed to its own call, handed on unchanged.
    let r = match api {
        // SAFETY: see above.
        Api::CudaFree => real::FREE.get().map(|f| unsafe { f(bogus) }),
        // SAFETY: see above.
        Api::CudaFreeAsync => real::FREE_ASYNC.get().map(|f| unsafe { f(bogus, stream) }),
        Api::CudaFreeAsyncPtsz => real::FREE_ASYNC_PTSZ
            .get()
            // SAFETY: see above.
            .map(|f| unsafe { f(bogus, stream) }),
        // The driver too decides the code (no context is reported before a bad address).
        // SAFETY: see above.
        Api::CuMemFree => real::MEM_FREE.get().map(|f| unsafe { f(1) }),
        // SAFETY: see above.
        Api::CuMemFreeAsync => real::MEM_FREE_ASYNC.get().map(|f| unsafe { f(1, stream) }),
        Api::CuMemFreeAsyncPtsz => real::MEM_FREE_ASYNC_PTSZ
            .get()
            // SAFETY: see above.
            .map(|f| unsafe { f(1, stream) }),
        _ => None,
    };
    r.unwrap_or(CUDA_ERROR_INVALID_VALUE)
}

/// Whether `stream` is capturing a CUDA graph (false where the driver cannot say). The driver
/// is asked only while a capture may run ([`crate::policy::may_capture`]).
pub(super) fn capturing(stream: CUstream) -> bool {
    if !crate::policy::may_capture() || STREAM_IS_CAPTURING.get().is_none() {
        return false;
    }
    profile::timed(Part::Capturing, || {
        // SAFETY: the stream the program passed to the free it is making: it exists.
        unsafe { cu::stream_is_capturing(stream) }.unwrap_or(false)
    })
}

/// Bytes of the stream-ordered allocations the program holds, and their peak since the last
/// reset: what its pool statistics report in isolate mode (hooks/pool.rs).
pub(super) static POOL_LIVE: AtomicU64 = AtomicU64::new(0);

pub(super) static POOL_PEAK: AtomicU64 = AtomicU64::new(0);

pub fn pool_used(peak: bool) -> u64 {
    if peak {
        POOL_PEAK.load(Relaxed)
    } else {
        POOL_LIVE.load(Relaxed)
    }
}

pub fn pool_peak_reset() {
    POOL_PEAK.store(POOL_LIVE.load(Relaxed), Relaxed);
}

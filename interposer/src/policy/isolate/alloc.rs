//! Allocation and free in isolate mode: an allocation that runs out of memory is retried after
//! quarantined memory is released (the program never sees an out-of-memory a normal run would
//! not have had); a free is poisoned and quarantined instead of given back; a second free of
//! held memory answers as a double free does. Also the bytes of stream-ordered allocations the
//! program holds, for its pool statistics.
//!
//! Layer: policies. Uses the base, recording, [`crate::policy::guard`], [`crate::policy::reuse`],
//! [`crate::policy::release`] and the folder's state, poison, quarantine, release paths, exit
//! check and counters.

use super::counters::{CAPTURED, POISON_BYTES, POISON_NS, POISONED};
use super::exit::EXIT_GAVE_UP;
use super::leave::{IN_FLIGHT, INFLIGHT, POLL_EVERY, SINCE_POLL, free_to_driver, reap};
use super::poison::poison;
use super::quarantine::{forget_range, quarantine, quarantine_index_only, release_oldest};
use super::state::{Held, Live, current_ctx, freed, st, state};
use crate::base::cu;
use crate::base::cuda::*;
use crate::base::real::{self, *};
use crate::base::sys::now_ns;
use crate::policy::{guard, release, reuse};
use crate::record::event::{self, Pending};
use crate::record::profile::{self, Part};
use isolate_trace::{Api, Event, Memory, NoteKind, Source};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::*};

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
    // Checked memory of this size kept by the library (`ISOLATE_REUSE=on`): no driver call.
    let kept = if !guarded
        && !out.is_null()
        && proto.api.source() == Source::DefaultPool
        && reuse::enabled()
    {
        profile::timed(Part::Kept, || reuse::take(current_ctx(), proto.size))
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
    if r == CUDA_ERROR_OUT_OF_MEMORY && quarantinable(proto.api) {
        // Isolation must never cause an out-of-memory a normal run would not have had.
        // Meanwhile what releases free goes to the driver, not into the reuse cache.
        let _short = reuse::Short::start();
        // First the batches already on their way out: their frees run on the release stream.
        if !EXIT_GAVE_UP.load(Relaxed) && !INFLIGHT.lock().is_empty() {
            reap(true);
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
        let mut released = 0u64;
        while r == CUDA_ERROR_OUT_OF_MEMORY {
            let n = release_oldest(proto.size.max(1));
            if n == 0 {
                break;
            }
            released += n;
            r = attempt();
        }
        if released > 0 {
            event::note(
                NoteKind::OomRetry,
                0,
                proto.size,
                released,
                format!(
                    "{} of {} bytes ran out of memory; released {released} quarantined bytes and retried",
                    proto.api, proto.size
                ),
            );
            if r == CUDA_SUCCESS && proto.api.is_runtime() {
                // The failed attempt left a sticky runtime error that PyTorch would throw on.
                let _ = cu::get_last_error();
            }
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
        POOL_PEAK.fetch_max(now, Relaxed);
    }
    if r == CUDA_SUCCESS && quarantinable(proto.api) && p.ev.ptr != 0 {
        let live = Live {
            size: p.ev.size,
            seq: p.ev.seq,
            pooled: proto.api.from_pool(),
            default_pool: proto.api.source() == Source::DefaultPool,
        };
        profile::timed(Part::Live, || st!(state()).live.insert(p.ev.ptr, live));
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
    let (live, held) = if proto.ptr != 0 && quarantinable(proto.api) {
        profile::timed(Part::Live, || {
            let mut g = state();
            let s = st!(g);
            let live = s.live.remove(&proto.ptr);
            (live, live.is_none() && s.index.contains_key(&proto.ptr))
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
    let ordered = proto.api.stream_ordered();
    if live.pooled {
        let _ = POOL_LIVE.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(live.size)));
    }
    if guard::owns(proto.ptr) {
        let r = guard::free(proto.ptr, ordered.then_some(proto.stream as CUstream));
        p.finish(r);
        // The range stays reserved and unmapped for good: listed so launches into it are named.
        quarantine_index_only(freed(&proto, live, seq, Held::Guarded));
        return r;
    }
    if ordered && capturing(proto.stream as CUstream) {
        // A free recorded into a CUDA graph (stream capture): the graph must free what it
        // allocated, and nothing may be queued on a capturing stream that the graph does not
        // own, so the free goes to the driver as it is (not quarantined).
        let r = call();
        p.finish(r);
        CAPTURED.fetch_add(1, Relaxed);
        return r;
    }
    let t0 = now_ns();
    let mut entry = freed(&proto, live, seq, Held::Allocation);
    // Deferred to the stream's next work: one launch poisons a run of frees (release::defer).
    let deferred = if ordered && defers(proto.api, proto.ptr) {
        profile::timed(Part::Poison, || {
            release::defer(entry.ctx, proto.stream as usize, proto.ptr, live.size)
        })
    } else {
        None
    };
    let r = match deferred {
        Some(ev) => {
            entry.mark = ev;
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
    POISON_NS.fetch_add(now_ns().saturating_sub(t0), Relaxed);
    POISONED.fetch_add(1, Relaxed);
    POISON_BYTES.fetch_add(live.size, Relaxed);
    p.finish(r);
    profile::timed(Part::Quarantine, || quarantine(entry));
    if IN_FLIGHT.load(Relaxed) > 0 && SINCE_POLL.fetch_add(1, Relaxed).is_multiple_of(POLL_EVERY) {
        // Checked batches give their memory back soon, not only at the next release.
        profile::timed(Part::Reap, || reap(false));
    }
    r
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

/// Whether `stream` is capturing a CUDA graph (false where the driver cannot say).
pub(super) fn capturing(stream: CUstream) -> bool {
    if STREAM_IS_CAPTURING.get().is_none() {
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

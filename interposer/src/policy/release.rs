//! The asynchronous release of stream-ordered frees: quarantined memory is verified and really
//! freed in stream order on a stream of the library's own, so no host thread waits for the
//! device.
//!
//! A stream-ordered free is poisoned on its stream, and that stream's event (one per stream,
//! recorded again at each free: [`mark`]) then stands for "every poison queued on it so far".
//! When a batch leaves quarantine, the release stream waits for those events, checks up to
//! [`BATCH`] allocations with one launch of `isolate_verify_many`, copies the results to pinned
//! host memory, and records a completion event. The results are read when that event has passed
//! ([`poll`]: every few frees, at the next release, or at exit), and only then are the
//! allocations freed ([`free_all`], `cuMemFreeAsync` on the then idle release stream). Freed
//! behind the check instead, they would be memory whose free has not happened yet when the
//! program allocates again: the driver's pool then either makes the program's stream wait for
//! the check (its internal dependencies) or grows. Descriptors and results live in [`SLOTS`]
//! slots of a module global ([`device`]: the context's module, kernels, buffers and release
//! stream), so the library makes no allocation of device memory through the API it hooks.
//!
//! Layer: policies. Uses the base, [`super::device`] and [`super::tier`] (a block's pattern in
//! the fast tier).

use super::device::{self, BATCH, SLOT_BYTES, SLOTS, launch_kernel};
use super::tier;
use crate::base::config;
use crate::base::cu::{self, CuError};
use crate::base::cuda::*;
use crate::base::real::*;
use crate::base::sys::{self, ForkLock};
use rustc_hash::FxHashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// A context's release side and the state of its slots.
struct Res<'a> {
    d: device::Release,
    busy: &'a mut [bool; SLOTS],
}

/// A stream's event: recorded after the stream's poisons, or recorded again by [`refresh`]
/// before a check of memory freed there.
#[derive(Clone, Copy)]
struct Mark {
    ev: usize,
    /// The stream still exists (false once the program destroyed it: [`stream_gone`]).
    live: bool,
    /// Deferred poisons were queued on the stream after the event was last recorded
    /// ([`flush_locked`] leaves the record to [`refresh`] while it can make it).
    behind: bool,
}

struct State {
    /// Per (context, stream): the stream's event.
    marks: FxHashMap<(usize, usize), Mark>,
    /// Poisons not queued yet ([`defer`]): (context, stream, ptr, len), in the order freed; the
    /// length carries the block's pattern ([`tier::encode`]).
    pending: Vec<(usize, usize, u64, u64)>,
    /// [`flush_locked`]'s scratch (stream, ptr, len), kept to spare an allocation a flush.
    taken: Vec<(usize, u64, u64)>,
}

/// Deferred poisons, all contexts: read without the lock by every hook of stream work, which
/// has nothing to do while it is 0.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// The span of the deferred poisons' blocks, all contexts: [lowest start, highest end), empty
/// (MAX, 0) while none waits. Read without the lock by the fast tier's launch check
/// ([`deferred_span`]); written under it.
static SPAN_LOW: AtomicU64 = AtomicU64::new(u64::MAX);
static SPAN_HIGH: AtomicU64 = AtomicU64::new(0);
/// Deferred poisons queued, and the launches that queued them (noted at exit).
static DEFERRED: AtomicU64 = AtomicU64::new(0);
static FILLS: AtomicU64 = AtomicU64::new(0);

/// Ranges one `isolate_poison_many` launch fills: its parameter buffer holds 64 (ptr, len).
pub const FILL_RANGES: usize = 64;

/// A stream capture has begun in this process ([`capture_start`]), or the driver cannot say
/// whether a stream captures: from then on a flush records the stream's event after its
/// poisons at once, because [`refresh`] cannot record on a capturing stream.
static CAPTURE_SEEN: AtomicBool = AtomicBool::new(false);

static STATE: ForkLock<Option<State>> = ForkLock::new(None);

/// Per context: which of its release slots are in flight. A lock apart from [`STATE`]'s: a
/// batch's launch ([`launch`]: waits, copies, the check, an event; tens of microseconds, now on
/// the library's keeper thread) holds this one only, so the program's frees, which take
/// [`STATE`]'s to defer their poisons, do not wait for it (on the H100 they did, for up to
/// 0.56 ms, once the launches had moved to the keeper). Launches of one context may then
/// interleave on its release stream: each batch's waits still come before its check there,
/// and each slot is one batch's.
static BUSY: ForkLock<Vec<(usize, [bool; SLOTS])>> = ForkLock::new(Vec::new());

/// In a fork child: the parent's handles are not the child's.
pub fn after_fork_child() {
    STATE.reset_in_child(None);
    BUSY.reset_in_child(Vec::new());
    PENDING.store(0, Relaxed);
    SPAN_LOW.store(u64::MAX, Relaxed);
    SPAN_HIGH.store(0, Relaxed);
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let lock = crate::record::profile::PartSpan::start(crate::record::profile::Part::ReleaseLock);
    let mut g = STATE.lock();
    drop(lock);
    let s = g.get_or_insert_with(|| State {
        marks: FxHashMap::default(),
        pending: Vec::new(),
        taken: Vec::new(),
    });
    f(s)
}

/// A new event without timing; 0 where the driver makes none.
fn new_event() -> usize {
    // CU_EVENT_DISABLE_TIMING = 2
    cu::event_create(2).map_or(0, |e| e as usize)
}

/// Records the library's event `ev` on `stream`; true when recorded.
///
/// # Safety
/// `ev` is an event of the library's not destroyed yet, and `stream` exists: a stream the
/// program freed on and has not destroyed (a mark's `live`), or the library's own.
unsafe fn record_on(ev: usize, stream: usize) -> bool {
    // SAFETY: the caller vouches for both handles.
    unsafe { cu::event_record(ev as cu::CUevent, stream as CUstream) }.is_ok()
}

/// A new event recorded on `stream`; 0 where it cannot be made or recorded (one made is then
/// destroyed).
pub fn record_event(stream: usize) -> usize {
    let ev = new_event();
    if EVENT_RECORD.get().is_none() {
        return 0;
    }
    // SAFETY: `ev` was just made; the caller's `stream` is one it is about to free on (it
    // exists), or the library's release stream.
    if ev != 0 && !unsafe { record_on(ev, stream) } {
        // SAFETY: made just now, used by nothing else.
        let _ = unsafe { cu::event_destroy(ev as cu::CUevent) };
        return 0;
    }
    ev
}

/// The event of `stream` of context `ctx` (made on its first free, kept for the stream's
/// later ones), marked as a stream that exists; 0 where none can be made.
fn stream_event(s: &mut State, ctx: usize, stream: usize) -> usize {
    if let Some(m) = s.marks.get_mut(&(ctx, stream)) {
        m.live = true;
        return m.ev;
    }
    let ev = new_event();
    if ev != 0 {
        let m = Mark {
            ev,
            live: true,
            behind: false,
        };
        s.marks.insert((ctx, stream), m);
    }
    ev
}

/// After a stream-ordered poison on `stream` of context `ctx`: records the stream's event, and
/// returns it (0 when no event could be made: the caller then cannot release asynchronously).
pub fn mark(ctx: usize, stream: usize) -> usize {
    if EVENT_RECORD.get().is_none() {
        return 0;
    }
    // Under the lock, as `stream_gone` records its last: a destroyed handle is never recorded on.
    with(|s| {
        let ev = stream_event(s, ctx, stream);
        if ev == 0 {
            return 0;
        }
        // SAFETY: the stream's event is never destroyed; the program just freed on `stream`,
        // so it exists.
        if !unsafe { record_on(ev, stream) } {
            return 0;
        }
        if let Some(m) = s.marks.get_mut(&(ctx, stream)) {
            m.behind = false;
        }
        ev
    })
}

/// `CU_STREAM_PER_THREAD`: names the calling thread's own default stream, so only the freeing
/// thread may record on it.
const PER_THREAD: usize = STREAM_PER_THREAD as usize;

/// An unordered free (the stream-order check's finding): `stream` may still use the freed
/// allocation. Records that stream's event now, after the use and before the free's poison is
/// queued, and returns it (0 when it cannot be recorded: the per-thread default stream of
/// another thread, a capturing stream, no events), for the allocation's check and release to
/// wait for as well as for its freeing stream. Without it the release stream, ordered only
/// after the freeing stream, gave the memory back to the driver while the other stream's kernel
/// could still read it: an illegal address in PyTorch's `test_cusparse_multiple_threads_same_device`
/// that the caching allocator (which keeps the block mapped) never shows. The caller has
/// checked that the program has not destroyed `stream`.
pub fn mark_use(ctx: usize, stream: usize) -> usize {
    if stream == PER_THREAD || EVENT_RECORD.get().is_none() {
        return 0;
    }
    with(|s| {
        flush_locked(s, ctx);
        let ev = stream_event(s, ctx, stream);
        // The caller checked the program has not destroyed the stream.
        if ev != 0 && record_now(s, ctx, stream, ev) {
            ev
        } else {
            0
        }
    })
}

/// Records `stream`'s event `ev` (context `ctx`, current) now, after the poisons deferred so
/// far (the caller flushed them), where that can be done: the stream is not capturing a graph,
/// or the driver cannot say and no capture has begun anywhere. True when recorded; the
/// stream's mark is then no longer behind its poisons. The caller knows the program has not
/// destroyed the stream.
fn record_now(s: &mut State, ctx: usize, stream: usize, ev: usize) -> bool {
    // SAFETY: the stream exists (the caller's word).
    match unsafe { cu::stream_is_capturing(stream as CUstream) } {
        Ok(false) => {}
        // Capturing: nothing may be queued on it that the graph does not own.
        Ok(true) => return false,
        // Cannot tell: record only while no capture has begun anywhere.
        Err(_) if CAPTURE_SEEN.load(Relaxed) => return false,
        Err(_) => {}
    }
    // SAFETY: as above; a stream's event is never destroyed.
    if !unsafe { record_on(ev, stream) } {
        return false;
    }
    if let Some(m) = s.marks.get_mut(&(ctx, stream)) {
        m.behind = false;
    }
    true
}

/// Before a check of allocations freed on `stream` of context `ctx` (which must be current):
/// records the stream's event again, so the check waits for everything queued there so far
/// (its deferred poisons and a stale write queued after the stream's last free included),
/// where that can be done: the stream still exists, is not the per-thread default stream, and
/// is not capturing a graph. Otherwise the event stays as the stream's last record left it:
/// after its poisons, since a flush records at once once a capture has begun
/// ([`capture_start`] records the events behind their poisons first).
pub fn refresh(ctx: usize, stream: usize) {
    if stream == PER_THREAD || EVENT_RECORD.get().is_none() {
        return;
    }
    with(|s| {
        flush_locked(s, ctx);
        // A live mark: the program has not destroyed the stream (`stream_gone` is told before
        // it does, under this lock).
        if let Some(&Mark { ev, live: true, .. }) = s.marks.get(&(ctx, stream)) {
            record_now(s, ctx, stream, ev);
        }
    });
}

/// A stream capture is about to begin in context `ctx` (current), on a stream of it: the
/// deferred poisons are queued and every stream's event that is behind its poisons is
/// recorded now, while none of the context's streams captures (any of them may join the
/// capture later, and [`refresh`] cannot record on a capturing stream). From now on flushes
/// record at once.
pub fn capture_start(ctx: usize) {
    CAPTURE_SEEN.store(true, Relaxed);
    if EVENT_RECORD.get().is_none() {
        return;
    }
    with(|s| {
        flush_locked(s, ctx);
        for (&(c, stream), m) in s.marks.iter_mut() {
            if c == ctx
                && m.live
                && m.behind
                && stream != PER_THREAD
                // SAFETY: a live mark's stream exists; its event is never destroyed.
                && unsafe { record_on(m.ev, stream) }
            {
                m.behind = false;
            }
        }
    });
}

/// The program is about to destroy `stream`: its event is recorded a last time (after all its
/// work, which still completes after the destruction) and never again on that handle, until a
/// free on a stream of the same handle (a new stream) marks it again.
pub fn stream_gone(stream: usize) {
    if EVENT_RECORD.get().is_none() {
        return;
    }
    with(|s| {
        // Its deferred poisons first: after the destruction nothing can be queued on it.
        let streams_ctx: Vec<usize> = s
            .pending
            .iter()
            .filter(|p| p.1 == stream)
            .map(|p| p.0)
            .collect();
        for ctx in streams_ctx {
            flush_locked(s, ctx);
        }
        for ((_, st), m) in s.marks.iter_mut() {
            if *st == stream && m.live {
                m.live = false;
                if stream != PER_THREAD {
                    // SAFETY: the program destroys the stream after this returns; the event
                    // is never destroyed.
                    unsafe { record_on(m.ev, stream) };
                    m.behind = false;
                }
            }
        }
    });
}

/// Poisons [ptr, ptr+len) (4-byte aligned) on `stream` of context `ctx` with one launch of
/// `isolate_poison`; `None` where the kernel is not to be had (the caller then uses the
/// driver's memset).
pub fn poison(ctx: usize, stream: usize, ptr: u64, len: u64, byte: u8) -> Option<CUresult> {
    let stream = stream as CUstream;
    let fill = device::release(ctx)?.fill?;
    let (mut p, mut n, mut pat) = (ptr, len, u32::from_ne_bytes([byte; 4]));
    let mut params: [*mut c_void; 3] = [
        (&mut p as *mut u64).cast(),
        (&mut n as *mut u64).cast(),
        (&mut pat as *mut u32).cast(),
    ];
    let blocks = (len / 4).div_ceil(256).clamp(1, 1024) as u32;
    // SAFETY: `isolate_poison(ptr, len, pattern)` of this context's module, its three
    // parameters pointing at locals of their types; [ptr, ptr+len) was just freed by the
    // program on `stream` (it is quarantined: nobody else's now).
    unsafe { launch_kernel(fill, (blocks, 1), stream, &mut params) }
}

/// Defers the poison of [ptr, ptr+len) (16-byte aligned), freed on `stream` of context `ctx`
/// (current), until just before the next work the program queues on any stream of the context
/// ([`flush`], called by every hook of stream work; in the fast tier by a launch only when it
/// may reach a deferred block, `policy::launch_check`), so that the poisons of consecutive frees
/// are queued by one launch of `isolate_poison_many` instead of a memset each. Returns the
/// stream's event, which [`refresh`] records after the poison is queued, and the block's
/// pattern ([`tier`]: in the fast tier, where its kernels loaded, a large block's canaries
/// only; its check must then read no more than that); `None` where the poison cannot be
/// deferred (no fill kernel, no event: the caller poisons at once, every byte).
pub fn defer(ctx: usize, stream: usize, ptr: u64, len: u64) -> Option<(usize, u8)> {
    if stream == PER_THREAD || EVENT_RECORD.get().is_none() {
        return None;
    }
    with(|s| {
        device::release(ctx)?.fill_many?;
        let ev = stream_event(s, ctx, stream);
        if ev == 0 {
            return None;
        }
        let shift = match tier::shift_for(ptr, len) {
            0 => 0,
            sh if device::sparse(ctx).is_some() => sh,
            _ => 0,
        };
        s.pending.push((ctx, stream, ptr, tier::encode(len, shift)));
        sys::widen(&SPAN_LOW, &SPAN_HIGH, ptr, ptr + len);
        PENDING.fetch_add(1, Relaxed);
        DEFERRED.fetch_add(1, Relaxed);
        // The context's count only once there are that many in all (it was counted at every
        // free, a walk of everything pending: ~30 entries on average).
        if s.pending.len() >= FILL_RANGES
            && s.pending.iter().filter(|p| p.0 == ctx).count() >= FILL_RANGES
        {
            flush_locked(s, ctx);
        }
        Some((ev, shift))
    })
}

/// Whether any poison waits to be queued (one relaxed load: the hooks' fast path).
#[inline]
pub fn pending() -> bool {
    PENDING.load(Relaxed) != 0
}

/// The span of the deferred poisons' blocks, [low, high) (empty while none waits), read
/// without the lock: a word inside it may lie in one of them, which [`deferred_holds_any`]
/// settles.
#[inline]
pub fn deferred_span() -> (u64, u64) {
    (SPAN_LOW.load(Relaxed), SPAN_HIGH.load(Relaxed))
}

/// Whether any of `words` lies inside a block whose poison is deferred.
pub fn deferred_holds_any(words: &[u64]) -> bool {
    with(|s| {
        s.pending.iter().any(|&(_, _, p, n)| {
            let end = p + tier::decode(n).0;
            words.iter().any(|&w| w >= p && w < end)
        })
    })
}

/// Queues the deferred poisons of context `ctx` (current): before the program's next work on
/// any of its streams, so that work runs after them in stream order (or, on another stream,
/// after an event or a wait that comes after them).
pub fn flush(ctx: usize) {
    if pending() {
        with(|s| flush_locked(s, ctx));
    }
}

/// (deferred poisons, launches that queued them) so far.
pub fn deferred_stats() -> (u64, u64) {
    (DEFERRED.load(Relaxed), FILLS.load(Relaxed))
}

fn flush_locked(s: &mut State, ctx: usize) {
    if !s.pending.iter().any(|p| p.0 == ctx) {
        return;
    }
    let _t = crate::record::profile::PartSpan::start(crate::record::profile::Part::FlushAll);
    let mut mine = std::mem::take(&mut s.taken);
    mine.clear();
    s.pending.retain(|p| {
        if p.0 == ctx {
            mine.push((p.1, p.2, p.3));
        }
        p.0 != ctx
    });
    if let Some(byte) = config::get().poison {
        // By stream, each stream's in the order freed (a stable sort).
        mine.sort_by_key(|p| p.0);
        let fill = device::release(ctx).and_then(|d| d.fill_many);
        let sparse = device::sparse(ctx).map(|k| k.fill);
        // Recorded after the poisons now only where `refresh` might not be able to later.
        let record = EVENT_RECORD.get().is_some()
            && (CAPTURE_SEEN.load(Relaxed) || STREAM_IS_CAPTURING.get().is_none());
        for run in mine.chunk_by(|a, b| a.0 == b.0) {
            let stream = run[0].0;
            for chunk in run.chunks(FILL_RANGES) {
                // A block with a pattern needs the fast tier's fill (which also fills whole
                // blocks); the memsets below fill every byte, more than its check reads.
                let f = if chunk.iter().any(|r| tier::decode(r.2).1 != 0) {
                    sparse
                } else {
                    fill
                };
                let launched = f.is_some_and(|f| fill_ranges(f, stream, chunk, byte));
                if launched {
                    FILLS.fetch_add(1, Relaxed);
                } else {
                    // The launch failed: a memset each, as without deferral.
                    for &(_, p, n) in chunk {
                        let n = tier::decode(n).0;
                        // SAFETY: each range was freed by the program on `stream`, which has
                        // not been destroyed (`stream_gone` flushes first); it is quarantined.
                        let r =
                            unsafe { cu::memset_d8_async(p, byte, n as usize, stream as CUstream) };
                        if r == Err(CuError::Missing) {
                            break;
                        }
                    }
                }
            }
            if let Some(m) = s.marks.get_mut(&(ctx, stream)) {
                if record {
                    let _t = crate::record::profile::PartSpan::start(
                        crate::record::profile::Part::FlushRecord,
                    );
                    // SAFETY: as the memsets above; the mark's event is never destroyed.
                    unsafe { record_on(m.ev, stream) };
                    m.behind = false;
                } else {
                    m.behind = true;
                }
            }
        }
    }
    // Only now, with every poison queued, do the hooks' lock-free checks ([`pending`],
    // [`deferred_span`]) stop seeing them: a thread that queues work on a freed block's stream
    // while another is queuing its poison must wait for this lock (and go after the poison), not
    // go before it. Lowered earlier, a stale write queued meanwhile ran before its block's poison
    // and was erased by it: missed.
    PENDING.fetch_sub(mine.len(), Relaxed);
    // The span of what still waits (other contexts' poisons).
    let (lo, hi) = s
        .pending
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &(_, _, p, n)| {
            (lo.min(p), hi.max(p + tier::decode(n).0))
        });
    SPAN_LOW.store(lo, Relaxed);
    SPAN_HIGH.store(hi, Relaxed);
    s.taken = mine;
}

/// One launch of `isolate_poison_many` (or the fast tier's `isolate_poison_sparse`) over
/// `ranges` ((stream, ptr, length field), at most [`FILL_RANGES`]) on `stream`; false where it
/// could not be queued.
fn fill_ranges(fill: CUfunction, stream: usize, ranges: &[(usize, u64, u64)], byte: u8) -> bool {
    let mut buf = [0u64; 2 * FILL_RANGES];
    for (i, &(_, p, n)) in ranges.iter().enumerate() {
        buf[2 * i] = p;
        buf[2 * i + 1] = n;
    }
    let mut count = ranges.len() as u32;
    let mut pat = u32::from_ne_bytes([byte; 4]);
    let mut params: [*mut c_void; 3] = [
        buf.as_mut_ptr().cast(),
        (&mut count as *mut u32).cast(),
        (&mut pat as *mut u32).cast(),
    ];
    let longest = ranges
        .iter()
        .map(|r| tier::vector_bytes(r.2))
        .max()
        .unwrap_or(0);
    let bx = wide_blocks(longest, ranges.len());
    let _t = crate::record::profile::PartSpan::start(crate::record::profile::Part::FillLaunch);
    // SAFETY: `isolate_poison_many(ranges, count, pattern)` of this context's module, its
    // parameters pointing at locals of their types (`buf` is the by-value array of 64
    // ranges); every range was freed by the program on `stream` and is quarantined.
    let r = unsafe {
        launch_kernel(
            fill,
            (bx, ranges.len() as u32),
            stream as CUstream,
            &mut params,
        )
    };
    r == Some(CUDA_SUCCESS)
}

/// One batch on its way: read its results with [`poll`].
#[derive(Clone, Copy)]
pub struct Launched {
    ctx: usize,
    slot: usize,
    n: usize,
    done: usize,
}

impl Launched {
    /// The context whose release stream it is on.
    pub fn ctx(&self) -> usize {
        self.ctx
    }
}

/// The release side of context `ctx` ([`device::release`], made on first use) and its slots;
/// `None` where the driver cannot load the kernel (e.g. the CI stand-in without its emulation)
/// or any piece fails.
fn resources(busy: &mut Vec<(usize, [bool; SLOTS])>, ctx: usize) -> Option<Res<'_>> {
    let d = device::release(ctx)?;
    if !busy.iter().any(|(c, _)| *c == ctx) {
        busy.push((ctx, [false; SLOTS]));
    }
    let busy = &mut busy.iter_mut().find(|(c, _)| *c == ctx)?.1;
    Some(Res { d, busy })
}

/// `f` with the slots' lock ([`BUSY`]) held.
fn slots<R>(f: impl FnOnce(&mut Vec<(usize, [bool; SLOTS])>) -> R) -> R {
    f(&mut BUSY.lock())
}

/// Whether context `ctx` can release asynchronously (loads its resources on first use).
pub fn available(ctx: usize) -> bool {
    slots(|b| resources(b, ctx).is_some())
}

/// Whether a slot of `ctx` is free for [`launch`].
pub fn slot_free(ctx: usize) -> bool {
    slots(|b| resources(b, ctx).is_some_and(|r| r.busy.iter().any(|b| !b)))
}

/// Queues on the release stream of `ctx` (which must be current): a wait for each of
/// `waits` (stream events from [`mark`]), the check of `items` (ptr, size with its pattern,
/// [`tier::encode`]; at most [`BATCH`]; one with a pattern is checked by the fast tier's kernel,
/// or not at all here when it cannot be had), the result copy and the completion event. `None` when nothing could be queued
/// (no resources, no free slot, a call failed before the check): the caller then releases these
/// the synchronous way. Once the check is queued, the allocations are freed after [`poll`] has
/// read its results, whatever they are (they are the program's memory, given back late).
pub fn launch(ctx: usize, waits: &[usize], items: &[(u64, u64)], byte: u8) -> Option<Launched> {
    let n = items.len().min(BATCH);
    slots(|b| {
        let r = resources(b, ctx)?;
        let slot = r.busy.iter().position(|b| !b)?;
        STREAM_WAIT_EVENT.get()?;
        MEMCPY_HTOD_ASYNC.get()?;
        MEMCPY_DTOH_ASYNC.get()?;
        LAUNCH_KERNEL.get()?;
        // The completion event is made below: nothing is queued without a way to make it.
        EVENT_CREATE.get()?;
        EVENT_RECORD.get()?;
        // A block with a pattern is checked by the fast tier's kernel, found before anything
        // is queued; its 128-bit loads need every start of the batch 16-byte aligned (else the
        // synchronous way, whose host check takes any).
        let sparse = if items[..n].iter().any(|i| tier::decode(i.1).1 != 0) {
            if !items[..n].iter().all(|i| i.0.is_multiple_of(16)) {
                return None;
            }
            Some(device::sparse(ctx)?.verify)
        } else {
            None
        };
        for &ev in waits {
            // SAFETY: the release stream is ours; `ev` is a stream's mark, never destroyed.
            unsafe { cu::stream_wait_event(r.d.stream, ev as cu::CUevent) }.ok()?;
        }
        // Descriptors then initial results ({0, MAX}) in the slot's host half, one copy down.
        // SAFETY: `slot < SLOTS`, and the pinned buffer holds SLOTS * SLOT_BYTES.
        let host = unsafe { r.d.host.add(slot * SLOT_BYTES) } as *mut u64;
        for (i, &(p, len)) in items[..n].iter().enumerate() {
            // SAFETY: `i < n <= BATCH`: the four words lie in the slot (4 * BATCH words), which
            // is free (not busy), so no copy of the device reads or writes it now.
            unsafe {
                *host.add(2 * i) = p;
                *host.add(2 * i + 1) = len;
                *host.add(2 * BATCH + 2 * i) = 0;
                *host.add(2 * BATCH + 2 * i + 1) = u64::MAX;
            }
        }
        let dev = r.d.ring + (slot * SLOT_BYTES) as u64;
        let res_off = (BATCH * 16) as u64;
        // SAFETY: both halves of the slot, on the host (pinned, ours, not reused until the slot is
        // polled) and on the device (the module's `isolate_ring`), `n * 16 <= BATCH * 16` bytes.
        unsafe { cu::memcpy_htod_async(dev, host.cast(), n * 16, r.d.stream) }.ok()?;
        // SAFETY: as above, the results half.
        unsafe {
            cu::memcpy_htod_async(
                dev + res_off,
                host.add(2 * BATCH).cast(),
                n * 16,
                r.d.stream,
            )
        }
        .ok()?;
        let (func, bx) = match sparse {
            Some(verify) => (verify, sparse_blocks(&items[..n])),
            None => grid(&r, &items[..n]),
        };
        let mut descs = dev;
        let mut count = n as u32;
        let mut pat = u32::from_ne_bytes([byte; 4]);
        let mut out = dev + res_off;
        let mut params: [*mut c_void; 4] = [
            (&mut descs as *mut u64).cast(),
            (&mut count as *mut u32).cast(),
            (&mut pat as *mut u32).cast(),
            (&mut out as *mut u64).cast(),
        ];
        // SAFETY: `isolate_verify_many(descs, count, pattern, out)` (or its 16-byte twin) of this
        // context's module, its parameters pointing at locals of their types; it reads the
        // quarantined ranges the descriptors name and writes the slot's results.
        unsafe { cu::launch_kernel(func, (bx, n as u32), r.d.stream, &mut params) }.ok()?;
        // SAFETY: as the copies down.
        let copied = unsafe {
            cu::memcpy_dtoh_async(
                host.add(2 * BATCH).cast(),
                dev + res_off,
                n * 16,
                r.d.stream,
            )
        };
        let done = if copied.is_ok() {
            record_event(r.d.stream as usize)
        } else {
            0
        };
        if done == 0 {
            // The check is queued but its results cannot be waited for: wait here instead.
            // SAFETY: the release stream is ours and never destroyed.
            let _ = unsafe { cu::stream_synchronize(r.d.stream) };
        }
        r.busy[slot] = true;
        Some(Launched { ctx, slot, n, done })
    })
}

/// The kernel for a batch and its blocks per allocation. With every allocation 16-byte aligned,
/// `isolate_verify_many16`, about four vectors (64 bytes) a thread for the longest allocation,
/// and at most ~16K blocks in all (rows of short allocations end at once, but each block still
/// costs a scheduling slot); otherwise `isolate_verify_many`, a word a thread up to 64 blocks.
/// Short and wide is right: capped at 256 blocks a launch (tried on the H200, seventh session),
/// the long-lived check blocks sat beside the program's kernels on every SM and ResNet-50's
/// step took 2.48× the default's (1.33× with this shape), GPT-2's 2.32× (1.16×).
fn grid(r: &Res<'_>, items: &[(u64, u64)]) -> (CUfunction, u32) {
    let (wide, bx) = shape(r.d.func16.is_some(), items);
    (r.d.func16.filter(|_| wide).unwrap_or(r.d.func), bx)
}

/// Blocks per row of the fast tier's check over `items`: as [`wide_blocks`], by the bytes of
/// the longest's vectors.
fn sparse_blocks(items: &[(u64, u64)]) -> u32 {
    let longest = items
        .iter()
        .map(|i| tier::vector_bytes(i.1))
        .max()
        .unwrap_or(0);
    wide_blocks(longest, items.len())
}

/// [`grid`]'s choice: whether the 128-bit kernel checks `items` (it exists and every start is
/// 16-byte aligned), and the blocks per allocation.
fn shape(have16: bool, items: &[(u64, u64)]) -> (bool, u32) {
    let longest = items.iter().map(|i| i.1).max().unwrap_or(0);
    if have16 && items.iter().all(|&(p, _)| p.is_multiple_of(16)) {
        (true, wide_blocks(longest, items.len()))
    } else {
        (false, (longest / 4).div_ceil(256).clamp(1, 64) as u32)
    }
}

/// Blocks per row of a 128-bit kernel (the check's, the deferred poisons' fill) over `rows`
/// items, one row each: about four vectors (64 bytes) a thread of 256 for the `longest`, at
/// most ~16K blocks in all.
fn wide_blocks(longest: u64, rows: usize) -> u32 {
    let cap = (16384 / rows.max(1) as u64).max(64);
    (longest / 16).div_ceil(256 * 4).clamp(1, cap) as u32
}

/// The results of `l` — (first changed offset, changed bytes) per item — once its check has
/// run; `None` while it has not (`wait` makes it wait). The slot is free again afterwards.
pub fn poll(l: &Launched, wait: bool) -> Option<Vec<(u64, u64)>> {
    if l.done != 0 {
        let ev = l.done as cu::CUevent;
        if wait {
            // SAFETY: the batch's completion event, destroyed only below, once.
            if unsafe { cu::event_synchronize(ev) } == Err(CuError::Missing) {
                return None;
            }
        } else {
            // SAFETY: as above.
            unsafe { cu::event_query(ev) }.ok()?;
        }
        // SAFETY: as above; the batch is polled no more after this (its `Launched` is dropped).
        let _ = unsafe { cu::event_destroy(ev) };
    }
    slots(|b| {
        let r = resources(b, l.ctx)?;
        // SAFETY: `l.slot < SLOTS`, inside the pinned buffer.
        let host = unsafe { r.d.host.add(l.slot * SLOT_BYTES) } as *const u64;
        let out = (0..l.n)
            .map(|i| {
                // SAFETY: `i < l.n <= BATCH`: the results half of the slot, which the device
                // finished writing (the completion event has passed, or the stream was waited for).
                let (changed, first) = unsafe {
                    (
                        *host.add(2 * BATCH + 2 * i),
                        *host.add(2 * BATCH + 2 * i + 1),
                    )
                };
                (if changed == 0 { 0 } else { first }, changed)
            })
            .collect();
        r.busy[l.slot] = false;
        Some(out)
    })
}

/// Frees `ptrs` (stream-ordered allocations whose check has run) on the release stream of
/// `ctx` (which must be current): nothing else is queued there by then, so each free happens at
/// once and the driver's pool can hand the memory out again without making anyone wait. With
/// `wait`, returns once they have (an allocation that ran out of memory is about to retry).
/// False where `ctx` has no release stream.
pub fn free_all(ctx: usize, ptrs: &[u64], wait: bool) -> bool {
    if MEM_FREE_ASYNC.get().is_none() {
        return false;
    }
    let Some(stream) = device::release(ctx).map(|r| r.stream) else {
        return false;
    };
    for &p in ptrs {
        // SAFETY: each is a stream-ordered allocation whose check has run: it leaves
        // quarantine here, used by nobody; the release stream is ours.
        let _ = unsafe { cu::mem_free_async(p, stream) };
    }
    if wait {
        // SAFETY: the release stream is ours and never destroyed.
        let _ = unsafe { cu::stream_synchronize(stream) };
    }
    true
}

/// Waits for everything queued on context `ctx`'s release stream, its frees included: memory
/// given back there is free once this returns. False where the context has none (nothing is
/// made for it here: this runs when memory has run out).
pub fn drain(ctx: usize) -> bool {
    let Some(r) = device::release_if_made(ctx) else {
        return false;
    };
    // SAFETY: the release stream is ours and never destroyed.
    let _ = unsafe { cu::stream_synchronize(r.stream) };
    true
}

/// Whether the asynchronous release is on (`ISOLATE_TEST_RELEASE`, on by default).
pub fn enabled() -> bool {
    config::get().async_release
}

/// Whether stream-ordered frees' poisons wait for the next stream work ([`defer`]): a poison,
/// `ISOLATE_TEST_POISON_BATCH=on`, the asynchronous release, the memset poison (not
/// `ISOLATE_TEST_POISON_BY=kernel`).
pub fn batching() -> bool {
    let c = config::get();
    c.poison.is_some() && c.poison_batch && c.async_release && !c.poison_kernel
}

#[cfg(test)]
mod tests {
    use super::{shape, wide_blocks};

    /// The deferred poisons' fill: a row per range, as wide as the longest needs.
    #[test]
    fn a_fill_gets_enough_blocks_for_its_longest_range() {
        // 100 MiB and two small ones: 6400 blocks a row (16384 / 3 = 5461 at most).
        assert_eq!(wide_blocks(100 << 20, 3), 5461);
        // 64 ranges of 1 MiB: 64 blocks each (the cap's floor), 4,096 in all.
        assert_eq!(wide_blocks(1 << 20, 64), 64);
        // One of 64 MiB alone: 4,096 blocks of 256 threads, four 16-byte vectors each.
        assert_eq!(wide_blocks(64 << 20, 1), 4096);
        // Shorter than one vector: still a block, whose thread 0 stores the tail.
        assert_eq!(wide_blocks(3, 1), 1);
    }

    #[test]
    fn aligned_batches_get_the_wide_kernel_and_enough_blocks_to_read_at_bandwidth() {
        const GIB: u64 = 1 << 30;
        // Four 1 GiB allocations: 4096 blocks each (the 32-bit kernel had 64, and read
        // 0.69 TB/s on the H200 where this reads 4.48: tests/gpu/verify_bw.py).
        let big = [(0x7f00_0000_0000, GIB), (0x7f00_4000_0000, GIB)];
        assert_eq!(shape(true, &big), (true, 8192));
        let four: Vec<(u64, u64)> = (0..4).map(|i| (0x7f00_0000_0000 + i * GIB, GIB)).collect();
        assert_eq!(shape(true, &four), (true, 4096));
        // A full batch of small ones: a block each at the least, 64 at the most.
        let small: Vec<(u64, u64)> = (0..256)
            .map(|i| (0x7f00_0000_0000 + i * 512, 100))
            .collect();
        assert_eq!(shape(true, &small), (true, 1));
        let mib: Vec<(u64, u64)> = (0..256)
            .map(|i| (0x7f00_0000_0000 + (i << 20), 1 << 20))
            .collect();
        assert_eq!(shape(true, &mib), (true, 64));
    }

    #[test]
    fn one_unaligned_start_or_no_wide_kernel_falls_back_to_words() {
        let mixed = [(0x7f00_0000_0000, 1 << 20), (0x7f00_0010_0004, 1 << 20)];
        assert_eq!(shape(true, &mixed), (false, 64));
        let aligned = [(0x7f00_0000_0000, 4096)];
        assert_eq!(shape(false, &aligned), (false, 4));
    }
}

//! Isolation mode: freed device memory is not given back. It is poisoned (in stream order for
//! stream-ordered frees), held in a quarantine that no allocation can get an address from, and
//! really freed only when the quarantine is over its budget (oldest first) or an allocation runs
//! out of memory. When an allocation leaves quarantine, and for all of them at exit, the poison
//! is checked on the device: a changed byte is a write through a stale pointer.
//!
//! Layer: policies. Uses the base, recording, [`super::log`] and [`super::guard`].

use super::{guard, log, release, reuse};
use crate::base::config::{self, Budget};
use crate::base::cuda::*;
use crate::base::real::{self, *};
use crate::base::sys::{ForkLock, ForkLockGuard};
use crate::base::sys::{now_ns, wait_until, warn};
use crate::record::event::{self, Pending};
use crate::record::profile::{self, Part};
use crate::record::thread::Inside;
use crate::record::writer;
use crate::record::writer::{Q_EARLY, Q_PEAK, Q_RELEASES};
use isolate_trace::{Api, Event, Kind, Memory, NoteKind, Record, Violation};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// An allocation isolation handed out and still tracks.
#[derive(Clone, Copy)]
struct Live {
    size: u64,
    seq: u64,
    /// From a stream-ordered pool: counted in [`POOL_LIVE`].
    pooled: bool,
    /// From the device's default pool (`cudaMallocAsync`, `cuMemAllocAsync`): what
    /// [`reuse`] may keep once checked.
    default_pool: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Device or managed memory from an allocation call: really freed with `cuMemFree`.
    Allocation,
    /// A virtual-memory range the program unmapped: really unmapped on release.
    Mapping,
    /// A guard-mode allocation: unmapped at its free, its range reserved for good. Only in the
    /// index (for the launch check), never released or verified.
    Guarded,
}

/// A freed allocation held back.
#[derive(Clone, Copy)]
pub struct Entry {
    pub ptr: u64,
    pub size: u64,
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub free_ts: u64,
    pub free_api: Api,
    device: i32,
    ctx: usize,
    /// Event recorded on the freeing stream after the poison, for stream-ordered frees
    /// (`ISOLATE_RELEASE=sync`: made for this entry, destroyed at its release).
    event: usize,
    /// The freeing stream's event from [`release::mark`], recorded after this poison (shared by
    /// the stream's later frees, never destroyed): what the asynchronous release waits for.
    mark: usize,
    /// The freeing stream (stream-ordered frees), whose event [`release::refresh`] records
    /// again before the check.
    stream: usize,
    held: Held,
    /// As [`Live::default_pool`].
    default_pool: bool,
}

impl Entry {
    /// Guard mode's unmapped memory: any access through a pointer into it faults.
    pub fn guarded(&self) -> bool {
        self.held == Held::Guarded
    }
}

#[derive(Default)]
struct State {
    live: FxHashMap<u64, Live>,
    queue: VecDeque<Entry>,
    /// Quarantined ranges by start address: what the launch check looks up.
    index: BTreeMap<u64, Entry>,
    held: u64,
    budget: Option<u64>,
    /// Virtual-memory mappings made with `cuMemMap`, by start: what `cuMemUnmap` may hold back.
    mapped: BTreeMap<u64, u64>,
    /// Physical handles made by this process's `cuMemCreate` and not yet released.
    created: std::collections::HashSet<u64>,
}

static STATE: ForkLock<Option<State>> = ForkLock::new(None);
/// Lowest start and highest end ever quarantined: a cheap first test for the launch check.
pub static LOW: AtomicU64 = AtomicU64::new(u64::MAX);
pub static HIGH: AtomicU64 = AtomicU64::new(0);
static ATEXIT: AtomicBool = AtomicBool::new(false);
static SAID_PYTORCH: AtomicBool = AtomicBool::new(false);

impl State {
    /// Takes the oldest entry out of quarantine (queue, index and byte count together).
    fn pop_oldest(&mut self) -> Option<Entry> {
        let old = self.queue.pop_front()?;
        self.held -= old.size;
        self.index.remove(&old.ptr);
        Some(old)
    }
}

fn state() -> ForkLockGuard<'static, Option<State>> {
    let mut g = STATE.lock();
    if g.is_none() {
        *g = Some(State::default());
    }
    g
}

macro_rules! st {
    ($g:expr) => {
        $g.as_mut().expect("state initialised by state()")
    };
}

/// Before `main`: PyTorch's caching allocator hands freed blocks straight back out, which is
/// what isolation exists to stop. Unless the user chose, PyTorch is switched to its
/// stream-ordered backend (`backend:cudaMallocAsync`: every tensor one `cudaMallocAsync` and
/// one `cudaFreeAsync`, which isolation poisons and releases in stream order, without waiting
/// for the device). Where the user set other allocator options, the cache is switched off
/// instead (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, every free a `cudaFree`), as before.
pub fn before_main() {
    let say = |what: &str| {
        if !SAID_PYTORCH.swap(true, Relaxed) {
            warn(&format!("isolate mode: {what}"));
        }
    };
    match pytorch_substrate(
        std::env::var("PYTORCH_NO_CUDA_MEMORY_CACHING").ok(),
        std::env::var("PYTORCH_ALLOC_CONF").ok(),
        std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok(),
    ) {
        Substrate::UserChose => {}
        Substrate::StreamOrdered => {
            unsafe {
                libc::setenv(
                    c"PYTORCH_CUDA_ALLOC_CONF".as_ptr(),
                    c"backend:cudaMallocAsync".as_ptr(),
                    1,
                )
            };
            say(
                "set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (PyTorch's caching allocator off; \
                 each tensor from the driver's stream-ordered pool)",
            );
        }
        Substrate::NoCaching(name) => {
            unsafe { libc::setenv(c"PYTORCH_NO_CUDA_MEMORY_CACHING".as_ptr(), c"1".as_ptr(), 1) };
            say(&format!(
                "set PYTORCH_NO_CUDA_MEMORY_CACHING=1 (PyTorch's caching allocator off; {name} \
                 is set without backend:cudaMallocAsync, which isolates faster)"
            ));
        }
    }
}

/// What isolate mode does to PyTorch's allocator, from the user's settings.
#[derive(Debug, PartialEq, Eq)]
pub enum Substrate {
    /// The user switched the cache off or chose the stream-ordered backend: nothing to do.
    UserChose,
    /// Nothing set: the stream-ordered backend.
    StreamOrdered,
    /// Allocator options set (named) without a backend: the cache off.
    NoCaching(&'static str),
}

pub fn pytorch_substrate(
    no_caching: Option<String>,
    alloc_conf: Option<String>,
    cuda_alloc_conf: Option<String>,
) -> Substrate {
    if no_caching.is_some() {
        return Substrate::UserChose;
    }
    let confs = [
        ("PYTORCH_ALLOC_CONF", alloc_conf),
        ("PYTORCH_CUDA_ALLOC_CONF", cuda_alloc_conf),
    ];
    let stream_ordered = |v: &str| {
        v.split(',').any(|kv| {
            let mut it = kv.splitn(2, ':');
            it.next().map(str::trim) == Some("backend")
                && it.next().map(str::trim) == Some("cudaMallocAsync")
        })
    };
    if confs
        .iter()
        .any(|(_, v)| v.as_deref().is_some_and(stream_ordered))
    {
        return Substrate::UserChose;
    }
    match confs
        .iter()
        .find(|(_, v)| v.as_deref().is_some_and(|v| !v.trim().is_empty()))
    {
        Some((name, _)) => Substrate::NoCaching(name),
        None => Substrate::StreamOrdered,
    }
}

/// In a fork child: the parent's CUDA memory is not the child's to manage, and another thread
/// of the parent may have held these locks at the fork.
pub fn after_fork_child() {
    STATE.reset_in_child(None);
    KERNELS.reset_in_child(Vec::new());
    INFLIGHT.reset_in_child(VecDeque::new());
    IN_FLIGHT.store(0, Relaxed);
    EXIT_OWNER.store(unsafe { libc::getpid() } as u32, Release);
    release::after_fork_child();
}

fn quarantinable(api: Api) -> bool {
    matches!(api.memory(), Memory::Device | Memory::Managed)
}

fn stream_ordered(api: Api) -> bool {
    matches!(
        api,
        Api::CudaFreeAsync | Api::CudaFreeAsyncPtsz | Api::CuMemFreeAsync | Api::CuMemFreeAsyncPtsz
    )
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
    let kept = if !guarded && !out.is_null() && default_pool(proto.api) && reuse::enabled() {
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
                if let Some(f) = GET_LAST_ERROR.get() {
                    unsafe { f() };
                }
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
    if r == CUDA_SUCCESS && stream_ordered_alloc(proto.api) && p.ev.ptr != 0 {
        let now = POOL_LIVE.fetch_add(p.ev.size, Relaxed) + p.ev.size;
        POOL_PEAK.fetch_max(now, Relaxed);
    }
    if r == CUDA_SUCCESS && quarantinable(proto.api) && p.ev.ptr != 0 {
        let live = Live {
            size: p.ev.size,
            seq: p.ev.seq,
            pooled: stream_ordered_alloc(proto.api),
            default_pool: default_pool(proto.api),
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
    let ordered = stream_ordered(proto.api);
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
fn defers(api: Api, ptr: u64) -> bool {
    release::batching()
        && ptr.is_multiple_of(16)
        && !matches!(api, Api::CudaFreeAsyncPtsz | Api::CuMemFreeAsyncPtsz)
}

/// The quarantine entry of the allocation `live` (a mapping: no allocation event) that the
/// free `proto` (event `seq`) gave back.
fn freed(proto: &Event, live: Live, seq: u64, held: Held) -> Entry {
    Entry {
        ptr: proto.ptr,
        size: live.size,
        alloc_seq: live.seq,
        free_seq: seq,
        free_ts: now_ns(),
        free_api: proto.api,
        device: event::current_device(),
        ctx: current_ctx(),
        event: 0,
        mark: 0,
        stream: proto.stream as usize,
        held,
        default_pool: live.default_pool,
    }
}

/// Stream-ordered allocations from the device's current pool (not a pool the program named).
fn default_pool(api: Api) -> bool {
    matches!(
        api,
        Api::CudaMallocAsync
            | Api::CudaMallocAsyncPtsz
            | Api::CuMemAllocAsync
            | Api::CuMemAllocAsyncPtsz
    )
}

pub fn other(
    proto: Event,
    before: bool,
    call: impl FnMut() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    match proto.api.kind() {
        Kind::Unmap => return unmap(proto, call),
        // The program sees what it would without isolation: a range it unmapped (held back here,
        // still mapped) is really unmapped before it frees the reservation or maps into it again.
        Kind::AddressFree | Kind::Map => release_overlapping(proto.ptr, proto.size),
        _ => {}
    }
    log::other(proto, before, call, |e| {
        after(e);
        if e.result == CUDA_SUCCESS {
            track_mapping(e);
        }
    })
}

/// Remembers the physical memory this process made and where it mapped it: only such mappings
/// are ever held back, since a handle imported from a peer (NCCL) is someone else's memory,
/// never to be poisoned.
fn track_mapping(e: &Event) {
    match e.api.kind() {
        Kind::Create => {
            st!(state()).created.insert(e.handle);
        }
        Kind::Release => {
            st!(state()).created.remove(&e.handle);
        }
        Kind::Map => {
            let mut g = state();
            let s = st!(g);
            if s.created.contains(&e.handle) {
                s.mapped.insert(e.ptr, e.size);
            }
        }
        _ => {}
    }
}

/// `cuMemUnmap` in isolate mode: the range stays mapped (poisoned) until it leaves quarantine.
fn unmap(proto: Event, call: impl FnOnce() -> i32) -> i32 {
    let mut p = Pending::before(proto.api);
    let seq = p.ev.seq;
    p.ev = Event { seq, ..proto };
    // Only a range made entirely of mappings we saw is held back; anything else is the
    // driver's to judge (and to refuse).
    if !(proto.ptr != 0 && proto.size != 0 && take_mapped(proto.ptr, proto.size)) {
        let r = call();
        p.finish(r);
        return r;
    }
    let r = poison(proto.ptr, proto.size, false, std::ptr::null_mut(), 0);
    if r != CUDA_SUCCESS {
        // Not a range we can touch (not mapped, no access): let the driver say what it is.
        let r = call();
        p.finish(r);
        return r;
    }
    p.finish(CUDA_SUCCESS);
    let mapping = Live {
        size: proto.size,
        seq: u64::MAX,
        pooled: false,
        default_pool: false,
    };
    quarantine(freed(&proto, mapping, seq, Held::Mapping));
    CUDA_SUCCESS
}

/// What a double free returns, without touching the memory: the runtime is asked to free an
/// address nothing can own, so it also sets its sticky last error exactly as for a double free.
fn double_free(api: Api, stream: CUstream) -> i32 {
    let bogus = std::ptr::dangling_mut::<c_void>(); // address 1: never allocated
    let r = match api {
        Api::CudaFree => real::FREE.get().map(|f| unsafe { f(bogus) }),
        Api::CudaFreeAsync => real::FREE_ASYNC.get().map(|f| unsafe { f(bogus, stream) }),
        Api::CudaFreeAsyncPtsz => real::FREE_ASYNC_PTSZ
            .get()
            .map(|f| unsafe { f(bogus, stream) }),
        // The driver too decides the code (no context is reported before a bad address).
        Api::CuMemFree => real::MEM_FREE.get().map(|f| unsafe { f(1) }),
        Api::CuMemFreeAsync => real::MEM_FREE_ASYNC.get().map(|f| unsafe { f(1, stream) }),
        Api::CuMemFreeAsyncPtsz => real::MEM_FREE_ASYNC_PTSZ
            .get()
            .map(|f| unsafe { f(1, stream) }),
        _ => None,
    };
    r.unwrap_or(CUDA_ERROR_INVALID_VALUE)
}

/// True (and the range forgotten) when [ptr, ptr+size) is covered by mappings we saw made.
fn take_mapped(ptr: u64, size: u64) -> bool {
    let mut g = state();
    let s = st!(g);
    let end = ptr + size;
    let parts: Vec<(u64, u64)> = s
        .mapped
        .range(..end)
        .rev()
        .take_while(|(k, v)| **k + **v > ptr)
        .map(|(k, v)| (*k, *v))
        .collect();
    let mut at = ptr;
    for &(k, v) in parts.iter().rev() {
        if k <= at {
            at = at.max(k + v);
        }
    }
    if at < end {
        return false;
    }
    for (k, v) in parts {
        s.mapped.remove(&k);
        // The parts of a mapping outside the unmapped range stay mapped.
        if k < ptr {
            s.mapped.insert(k, ptr - k);
        }
        if k + v > end {
            s.mapped.insert(end, k + v - end);
        }
    }
    true
}

/// Queues the deferred poisons of the current context (see [`release::defer`]).
pub fn flush_current() {
    release::flush(current_ctx());
}

/// A stream capture is about to begin in the current context (see [`release::capture_start`]).
pub fn capture_start() {
    release::capture_start(current_ctx());
}

fn current_ctx() -> usize {
    profile::timed(Part::Context, || {
        let mut c: CUcontext = std::ptr::null_mut();
        if let Some(f) = CTX_GET_CURRENT.get() {
            unsafe { f(&mut c) };
        }
        c as usize
    })
}

/// Fills freed memory with the poison byte. A plain free behaves as `cudaFree` does (waits for
/// the device, so work still in flight finishes first); a stream-ordered free is poisoned on its
/// stream, after the work queued there (by the fill kernel of context `ctx` with
/// `ISOLATE_POISON_BY=kernel`).
fn poison(ptr: u64, size: u64, ordered: bool, stream: CUstream, ctx: usize) -> CUresult {
    let byte = config::get().poison;
    if ordered {
        if let Some(b) = byte
            && config::get().poison_kernel
            && ptr.is_multiple_of(4)
            && let Some(r) = release::poison(ctx, stream as usize, ptr, size, b)
        {
            BY_KERNEL.fetch_add(1, Relaxed);
            return r;
        }
        if let (Some(b), Some(f)) = (byte, MEMSET_D8_ASYNC.get()) {
            return unsafe { f(ptr, b, size as usize, stream) };
        }
        return CUDA_SUCCESS;
    }
    if let Some(sync) = CTX_SYNCHRONIZE.get() {
        let r = unsafe { sync() };
        if r != CUDA_SUCCESS {
            return r;
        }
    }
    match (byte, MEMSET_D8.get()) {
        (Some(b), Some(f)) => unsafe { f(ptr, b, size as usize) },
        _ => CUDA_SUCCESS,
    }
}

fn budget(s: &mut State, device: i32) -> u64 {
    if let Some(b) = s.budget {
        return b;
    }
    let b = match config::get().quarantine {
        Budget::Bytes(b) => b,
        Budget::Percent(pct) => {
            let mut total = 0usize;
            if let Some(f) = DEVICE_TOTAL_MEM.get() {
                unsafe { f(&mut total, device.max(0)) };
            }
            if total == 0 {
                total = 8 << 30;
            }
            (total as f64 * pct / 100.0) as u64
        }
    };
    s.budget = Some(b);
    b
}

fn quarantine(entry: Entry) {
    if !ATEXIT.swap(true, AcqRel) {
        // Registered after the CUDA runtime's own exit handler, so it runs before the context
        // goes away.
        EXIT_OWNER.store(unsafe { libc::getpid() } as u32, Release);
        unsafe { libc::atexit(verify_all_at_exit) };
    }
    let mut over = Vec::new();
    {
        let mut g = state();
        let s = st!(g);
        s.held += entry.size;
        Q_PEAK.fetch_max(s.held, Relaxed);
        LOW.fetch_min(entry.ptr, Relaxed);
        HIGH.fetch_max(entry.ptr + entry.size, Relaxed);
        s.index.insert(entry.ptr, entry);
        s.queue.push_back(entry);
        let limit = budget(s, entry.device);
        // Over budget: release down to 80% of it in one batch (verified with one round trip).
        let low_water = if s.held > limit {
            limit / 10 * 8
        } else {
            u64::MAX
        };
        while s.held > low_water {
            let Some(old) = s.pop_oldest() else {
                break;
            };
            over.push(old);
        }
    }
    if !over.is_empty() {
        profile::timed(Part::Release, || release_batch(&over, Release::Budget));
    }
}

/// A guard-mode free: in the index for the launch check, never released, never verified
/// (the memory is unmapped: any access faults).
fn quarantine_index_only(entry: Entry) {
    LOW.fetch_min(entry.ptr, Relaxed);
    HIGH.fetch_max(entry.ptr + entry.size, Relaxed);
    st!(state()).index.insert(entry.ptr, entry);
}

/// Releases the oldest entries until at least `need` bytes are free; returns the bytes released.
/// Only for an allocation that ran out of memory, so every release is counted as early.
fn release_oldest(need: u64) -> u64 {
    let mut taken = Vec::new();
    let mut bytes = 0;
    {
        let mut g = state();
        let s = st!(g);
        while bytes < need {
            let Some(old) = s.pop_oldest() else {
                break;
            };
            bytes += old.size;
            taken.push(old);
        }
    }
    Q_EARLY.fetch_add(taken.len() as u64, Relaxed);
    release_batch(&taken, Release::Now);
    bytes
}

/// Before a reserved range is freed or mapped again, the held entries that overlap it are
/// released (verified, then really unmapped or freed) first. Guard mode's entries are never
/// held bytes: they stay in the index.
fn release_overlapping(ptr: u64, size: u64) {
    let end = ptr.saturating_add(size.max(1));
    let mut taken = Vec::new();
    {
        let mut g = state();
        let s = st!(g);
        // Freed ranges never overlap one another: going down from `end`, the first that ends
        // at or below `ptr` is the last to look at.
        let overlapping: Vec<u64> = s
            .index
            .range(..end)
            .rev()
            .take_while(|(_, e)| e.ptr.saturating_add(e.size) > ptr)
            .filter(|(_, e)| e.held != Held::Guarded)
            .map(|(k, _)| *k)
            .collect();
        for k in overlapping {
            if let Some(e) = s.index.remove(&k) {
                s.held -= e.size;
                s.queue.retain(|q| q.ptr != k);
                taken.push(e);
            }
        }
    }
    release_batch(&taken, Release::Now);
}

/// Verifies, then really frees (or unmaps) entries: per context, every check is launched first
/// and the results come back in one copy.
fn release_batch(entries: &[Entry], how: Release) {
    if entries.is_empty() {
        return;
    }
    let t0 = now_ns();
    let free = how != Release::CheckOnly;
    if free {
        Q_RELEASES.fetch_add(entries.len() as u64, Relaxed);
    }
    reap(false);
    let entries = &if how == Release::Budget {
        release_async(entries)
    } else {
        entries.to_vec()
    };
    release_sync(entries, free, false);
    RELEASE_NS.fetch_add(now_ns().saturating_sub(t0), Relaxed);
}

/// How entries leave quarantine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Release {
    /// Over the budget: stream-ordered frees go the asynchronous way.
    Budget,
    /// Memory is needed at once (an allocation ran out, a range is mapped again): freed before
    /// the call returns.
    Now,
    /// Checked, not freed (exit, a test's check).
    CheckOnly,
}

/// Calls `f` with each context's entries among `entries`, that context made current for the
/// call (and the caller's put back after).
fn in_each_context(entries: &[Entry], mut f: impl FnMut(usize, Vec<Entry>)) {
    let cur = current_ctx();
    let mut ctxs: Vec<usize> = entries.iter().map(|e| e.ctx).collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    for ctx in ctxs {
        let switch = ctx != 0 && ctx != cur;
        if switch && let Some(set) = CTX_SET_CURRENT.get() {
            unsafe { set(ctx as CUcontext) };
        }
        f(
            ctx,
            entries.iter().filter(|e| e.ctx == ctx).copied().collect(),
        );
        if switch && let Some(set) = CTX_SET_CURRENT.get() {
            unsafe { set(cur as CUcontext) };
        }
    }
}

/// Stream-ordered frees of device memory leave quarantine on the release stream (see
/// [`release`]): verified and freed there, their results read later by [`reap`]. Returns the
/// entries that must go the synchronous way (not stream-ordered, mappings, or where the
/// context has no release stream).
fn release_async(entries: &[Entry]) -> Vec<Entry> {
    let Some(byte) = config::get().poison else {
        return entries.to_vec();
    };
    if !release::enabled() {
        return entries.to_vec();
    }
    let (mut rest, mut ours): (Vec<Entry>, Vec<Entry>) = (Vec::new(), Vec::new());
    for e in entries {
        if e.held == Held::Allocation && e.mark != 0 && e.ctx != 0 {
            ours.push(*e);
        } else {
            rest.push(*e);
        }
    }
    if ours.is_empty() {
        return rest;
    }
    in_each_context(&ours, |ctx, group| {
        if !release::available(ctx) {
            rest.extend(group);
        } else {
            refresh_streams(ctx, &group);
            for chunk in group.chunks(release::BATCH) {
                let mut waits: Vec<usize> = chunk.iter().map(|e| e.mark).collect();
                waits.sort_unstable();
                waits.dedup();
                let items: Vec<(u64, u64)> = chunk.iter().map(|e| (e.ptr, e.size)).collect();
                // Every slot in flight (here or on another thread): wait for the oldest batch
                // of this context, then try again; a few tries, then the synchronous way.
                let mut launched = None;
                for _ in 0..4 {
                    if !release::slot_free(ctx) && !reap_oldest(ctx) {
                        continue;
                    }
                    launched = release::launch(ctx, &waits, &items, byte);
                    if launched.is_some() || release::slot_free(ctx) {
                        break;
                    }
                }
                match launched {
                    Some(l) => {
                        ASYNC_BATCHES.fetch_add(1, Relaxed);
                        ON_DEVICE.fetch_add(chunk.len() as u64, Relaxed);
                        INFLIGHT.lock().push_back((l, chunk.to_vec()));
                        IN_FLIGHT.fetch_add(1, Relaxed);
                    }
                    None => rest.extend_from_slice(chunk),
                }
            }
        }
    });
    rest
}

/// Records again the event of each stream `entries` were freed on (see [`release::refresh`]),
/// once per stream, with context `ctx` current.
fn refresh_streams<E: std::borrow::Borrow<Entry>>(ctx: usize, entries: &[E]) {
    let mut streams: Vec<usize> = entries
        .iter()
        .map(|e| e.borrow())
        .filter(|e| e.mark != 0)
        .map(|e| e.stream)
        .collect();
    streams.sort_unstable();
    streams.dedup();
    for st in streams {
        release::refresh(ctx, st);
    }
}

/// A batch whose check has run: its entries and, for each, (first changed offset, changed
/// bytes).
type Checked = (Vec<Entry>, Vec<(u64, u64)>);

/// Batches on the release streams whose results have not been read.
static INFLIGHT: ForkLock<VecDeque<(release::Launched, Vec<Entry>)>> =
    ForkLock::new(VecDeque::new());

/// Reads the results of the batches whose checks have run (all of them, waiting, with
/// `wait`), in order, and reports what changed. One thread reads at a time (the queue's lock is
/// held while it polls: a batch's slot is free again once polled); without `wait`, a thread
/// that finds another reading leaves it to that one.
fn reap(wait: bool) {
    let t0 = now_ns();
    let done = {
        let q = if wait {
            Some(INFLIGHT.lock())
        } else {
            INFLIGHT.try_lock()
        };
        let Some(mut q) = q else { return };
        take_done(&mut q, wait, usize::MAX)
    };
    settle(done, wait, wait.then_some(t0));
}

/// What follows reading checked batches: their memory given back (`wait_frees`: free before
/// this returns), the wait since `waited_since` counted, their findings reported.
fn settle(done: Vec<Checked>, wait_frees: bool, waited_since: Option<u64>) {
    free_checked(&done, wait_frees);
    if let Some(t0) = waited_since {
        WAIT_NS.fetch_add(now_ns().saturating_sub(t0), Relaxed);
    }
    report_all(done);
}

/// Batches in [`INFLIGHT`], read without its lock: the freeing path polls only when there are.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Frees since the freeing path last polled the batches in flight.
static SINCE_POLL: AtomicUsize = AtomicUsize::new(0);
/// How many frees go by between two polls (each a `cuEventQuery` of the oldest batch).
const POLL_EVERY: usize = 32;

/// Gives back the memory of batches whose check has run (see [`release::free_all`]); with
/// `wait`, it is free when this returns.
fn free_checked(done: &[Checked], wait: bool) {
    let entries: Vec<Entry> = done.iter().flat_map(|(e, _)| e.iter().copied()).collect();
    if entries.is_empty() {
        return;
    }
    IN_FLIGHT.fetch_sub(done.len(), Relaxed);
    // Asked of the driver only when something could be kept.
    let cap = if reuse::enabled() && entries.iter().any(|e| e.default_pool) {
        reuse_cap()
    } else {
        0
    };
    in_each_context(&entries, |ctx, group| {
        // Checked memory of the default pool is kept for the next allocation of its size
        // (`ISOLATE_REUSE=on`), the rest freed.
        let ptrs: Vec<u64> = group
            .iter()
            .filter(|e| !(e.default_pool && reuse::keep(ctx, e.size, e.ptr, cap)))
            .map(|e| e.ptr)
            .collect();
        free_to_driver(ctx, &ptrs, wait);
    });
}

/// Frees `ptrs` of context `ctx` (current) on its release stream (with `wait`, freed when
/// this returns).
fn free_to_driver(ctx: usize, ptrs: &[u64], wait: bool) {
    if ptrs.is_empty() {
        return;
    }
    if !release::free_all(ctx, ptrs, wait)
        && let Some(f) = MEM_FREE.get()
    {
        // Unreachable in practice (a batch was launched on this context's stream).
        for &p in ptrs {
            unsafe { f(p) };
        }
    }
}

/// The most checked memory [`reuse`] keeps (the current context's device): a quarter of the
/// quarantine budget, and up to the whole budget while the device has room to spare (more
/// than a quarter of its memory free beyond the extra kept). A quarter alone left ~12% of
/// ResNet-50's allocations to the driver on the H200 (~16 µs each: a step frees more than a
/// quarter of the default budget), but a half or the whole budget lost a block in the
/// stand-in's out-of-memory test, where the device is nearly full (the program's blocks land
/// between the kept ones, whose holes are too small once given back): see the kept-memory
/// test and isolation.md. One `cuMemGetInfo` per set of checked batches with something to keep.
fn reuse_cap() -> u64 {
    let Some(budget) = st!(state()).budget else {
        return 0;
    };
    cap_for(budget, device_memory())
}

/// [`reuse_cap`] for a quarantine `budget` and the device's (free, total) bytes, if known.
fn cap_for(budget: u64, mem: Option<(u64, u64)>) -> u64 {
    let spare = mem.map_or(0, |(free, total)| free.saturating_sub(total / 4));
    (budget / 4).max(budget.min(spare))
}

/// The current context's device memory: (free, total) bytes, as the driver says.
fn device_memory() -> Option<(u64, u64)> {
    let f = MEM_GET_INFO.get()?;
    let (mut free, mut total) = (0usize, 0usize);
    (unsafe { f(&mut free, &mut total) } == CUDA_SUCCESS && total > 0)
        .then_some((free as u64, total as u64))
}

/// Pops the batches at the head of `q` whose checks have run, with their results: with
/// `wait`, every one up to and including the `upto`-th (all when `upto` is past the end).
fn take_done(
    q: &mut VecDeque<(release::Launched, Vec<Entry>)>,
    wait: bool,
    upto: usize,
) -> Vec<Checked> {
    let mut done = Vec::new();
    let mut i = 0;
    while let Some((l, _)) = q.front() {
        let l = *l;
        let Some(found) = release::poll(&l, wait && i <= upto) else {
            break;
        };
        if let Some((_, entries)) = q.pop_front() {
            done.push((entries, found));
        }
        i += 1;
    }
    done
}

fn report_all(done: Vec<Checked>) {
    for (entries, found) in done {
        for (e, (first, changed)) in entries.iter().zip(found) {
            report(e, first, changed);
        }
    }
}

/// Waits for the oldest batch in flight of context `ctx` (and reads every batch before it);
/// false when there is none.
fn reap_oldest(ctx: usize) -> bool {
    let t0 = now_ns();
    let done = {
        let mut q = INFLIGHT.lock();
        let Some(pos) = q.iter().position(|(l, _)| l.ctx() == ctx) else {
            return false;
        };
        take_done(&mut q, true, pos)
    };
    settle(done, false, Some(t0));
    true
}

/// The way every release went before the release stream: the host waits for the freeing
/// streams' events, checks each allocation with a launch and one copy per batch, and frees.
/// With `repoison`, an allocation found changed is filled with the poison again (it stays in
/// quarantine), so that the next check reports only what is written after this one.
fn release_sync(entries: &[Entry], free: bool, repoison: bool) {
    if entries.is_empty() {
        return;
    }
    in_each_context(entries, |ctx, group| {
        let group: Vec<&Entry> = group.iter().collect();
        let t0 = now_ns();
        for e in &group {
            if e.event != 0 {
                if let Some(s) = EVENT_SYNCHRONIZE.get() {
                    unsafe { s(e.event as *mut c_void) };
                }
                if let Some(d) = EVENT_DESTROY.get() {
                    unsafe { d(e.event as *mut c_void) };
                }
            }
        }
        refresh_streams(ctx, &group);
        let mut marks: Vec<usize> = group.iter().map(|e| e.mark).filter(|&m| m != 0).collect();
        marks.sort_unstable();
        marks.dedup();
        for m in marks {
            if let Some(s) = EVENT_SYNCHRONIZE.get() {
                unsafe { s(m as *mut c_void) };
            }
        }
        WAIT_NS.fetch_add(now_ns().saturating_sub(t0), Relaxed);
        if let Some(byte) = config::get().poison {
            for chunk in group.chunks(BATCH) {
                let found = verify_batch_on_device(chunk, byte);
                let by = if found.is_some() {
                    &ON_DEVICE
                } else {
                    &ON_HOST
                };
                by.fetch_add(chunk.len() as u64, Relaxed);
                for (i, e) in chunk.iter().enumerate() {
                    let r = match &found {
                        Some(v) => Some(v[i]),
                        None => verify_on_host(e.ptr, e.size, byte),
                    };
                    if let Some((first, changed)) = r {
                        report(e, first, changed);
                        if repoison
                            && changed > 0
                            && let Some(set) = MEMSET_D8.get()
                        {
                            unsafe { set(e.ptr, byte, e.size as usize) };
                        }
                    }
                }
            }
        }
        if free {
            for e in &group {
                match e.held {
                    Held::Allocation => {
                        if let Some(f) = real::MEM_FREE.get() {
                            unsafe { f(e.ptr) };
                        }
                    }
                    Held::Mapping => {
                        if let Some(f) = real::MEM_UNMAP.get() {
                            unsafe { f(e.ptr, e.size as usize) };
                        }
                    }
                    Held::Guarded => {} // never queued
                }
            }
        }
    });
}

/// Entries verified with one result copy.
const BATCH: usize = 256;

/// Entries verified by the kernel on the device, and by copies to the host (the fallback where
/// the driver cannot load the kernel): noted at exit.
static ON_DEVICE: AtomicU64 = AtomicU64::new(0);
static ON_HOST: AtomicU64 = AtomicU64::new(0);
/// Where isolation's time goes, noted at exit: frees poisoned and the time the calling threads
/// spent on them (poison, events), time in releases, of it waiting for the device, and the
/// batches released on the release streams.
static POISONED: AtomicU64 = AtomicU64::new(0);
/// Bytes those frees held: what the device writes with the poison, and reads again to check.
static POISON_BYTES: AtomicU64 = AtomicU64::new(0);
/// Of those frees, the ones poisoned by the library's fill kernel (`ISOLATE_POISON_BY=kernel`).
static BY_KERNEL: AtomicU64 = AtomicU64::new(0);
static POISON_NS: AtomicU64 = AtomicU64::new(0);
static RELEASE_NS: AtomicU64 = AtomicU64::new(0);
static WAIT_NS: AtomicU64 = AtomicU64::new(0);
static ASYNC_BATCHES: AtomicU64 = AtomicU64::new(0);
/// Stream-ordered frees made during stream capture, passed to the driver (noted at exit).
static CAPTURED: AtomicU64 = AtomicU64::new(0);

/// Whether `stream` is capturing a CUDA graph (false where the driver cannot say).
fn capturing(stream: CUstream) -> bool {
    let Some(f) = STREAM_IS_CAPTURING.get() else {
        return false;
    };
    profile::timed(Part::Capturing, || {
        let mut status: std::ffi::c_int = 0;
        let r = unsafe { f(stream, &mut status) };
        r == CUDA_SUCCESS && status != 0
    })
}
/// Bytes of the stream-ordered allocations the program holds, and their peak since the last
/// reset: what its pool statistics report in isolate mode (hooks/pool.rs).
static POOL_LIVE: AtomicU64 = AtomicU64::new(0);
static POOL_PEAK: AtomicU64 = AtomicU64::new(0);

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

fn stream_ordered_alloc(api: Api) -> bool {
    matches!(
        api,
        Api::CudaMallocAsync
            | Api::CudaMallocAsyncPtsz
            | Api::CudaMallocFromPoolAsync
            | Api::CudaMallocFromPoolAsyncPtsz
            | Api::CuMemAllocAsync
            | Api::CuMemAllocAsyncPtsz
            | Api::CuMemAllocFromPoolAsync
            | Api::CuMemAllocFromPoolAsyncPtsz
    )
}

/// Records a violation (and says so on stderr) when the poison changed.
fn report(e: &Entry, first: u64, changed: u64) {
    if changed == 0 {
        return;
    }
    let v = Violation {
        seq: event::next_seq(),
        ts_ns: now_ns(),
        device: e.device,
        ptr: e.ptr,
        size: e.size,
        first_offset: first,
        changed_bytes: changed,
        alloc_seq: e.alloc_seq,
        free_seq: e.free_seq,
        free_ts_ns: e.free_ts,
        free_api: e.free_api,
    };
    warn(&format!(
        "STALE WRITE: {changed} {} of freed allocation 0x{:x} ({} bytes, freed by {} at event {}) changed \
         after the free; first at offset {first}",
        if changed == 1 { "byte" } else { "bytes" },
        e.ptr,
        e.size,
        e.free_api,
        e.free_seq
    ));
    writer::submit(Record::Violation(v));
}

struct Kernel {
    func: CUfunction,
    result: CUdeviceptr,
}

// SAFETY: CUDA handles are usable from any thread.
unsafe impl Send for Kernel {}

static KERNELS: ForkLock<Vec<(usize, Option<Kernel>)>> = ForkLock::new(Vec::new());

/// The verification kernel of the current context, loaded on first use (`None` if the driver
/// cannot load it, e.g. the CI stand-in: then the host path is used).
fn kernel_for_current() -> Option<(CUfunction, CUdeviceptr)> {
    let ctx = current_ctx();
    let mut g = KERNELS.lock();
    if let Some((_, k)) = g.iter().find(|(c, _)| *c == ctx) {
        return k.as_ref().map(|k| (k.func, k.result));
    }
    let loaded = (|| {
        let load = MODULE_LOAD_DATA.get()?;
        let get = MODULE_GET_FUNCTION.get()?;
        let global = MODULE_GET_GLOBAL.get()?;
        let mut module: *mut c_void = std::ptr::null_mut();
        if unsafe { load(&mut module, release::PTX.as_ptr().cast()) } != CUDA_SUCCESS {
            return None;
        }
        let mut func: CUfunction = std::ptr::null_mut();
        if unsafe { get(&mut func, module, c"isolate_verify".as_ptr()) } != CUDA_SUCCESS {
            return None;
        }
        // The result buffer is the module's own global: no allocation call of ours in a hook.
        let (mut result, mut bytes): (CUdeviceptr, usize) = (0, 0);
        if unsafe { global(&mut result, &mut bytes, module, c"isolate_result".as_ptr()) }
            != CUDA_SUCCESS
            || bytes < BATCH * 16
        {
            return None;
        }
        Some(Kernel { func, result })
    })();
    let r = loaded.as_ref().map(|k| (k.func, k.result));
    g.push((ctx, loaded));
    r
}

/// (first changed offset, changed bytes) of each entry, counted by kernels on the device: all
/// launched, then one copy back.
fn verify_batch_on_device(entries: &[&Entry], byte: u8) -> Option<Vec<(u64, u64)>> {
    let (func, result) = kernel_for_current()?;
    real::LAUNCH_KERNEL.get()?;
    let htod = MEMCPY_HTOD.get()?;
    let dtoh = MEMCPY_DTOH.get()?;
    let n = entries.len().min(BATCH);
    let init: Vec<u64> = (0..n).flat_map(|_| [0u64, u64::MAX]).collect();
    if unsafe { htod(result, init.as_ptr().cast(), n * 16) } != CUDA_SUCCESS {
        return None;
    }
    for (i, e) in entries[..n].iter().enumerate() {
        let mut p = e.ptr;
        let mut len = e.size;
        let mut pat = u32::from_ne_bytes([byte; 4]);
        let mut out = result + (i as u64) * 16;
        let mut params: [*mut c_void; 4] = [
            (&mut p as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut pat as *mut u32).cast(),
            (&mut out as *mut u64).cast(),
        ];
        let blocks = (e.size / 4).div_ceil(256).clamp(1, 132 * 8) as u32;
        let r = unsafe {
            release::launch_kernel(func, (blocks, 1), std::ptr::null_mut(), &mut params)?
        };
        if r != CUDA_SUCCESS {
            return None;
        }
    }
    let mut res = vec![0u64; n * 2];
    if unsafe { dtoh(res.as_mut_ptr().cast(), result, n * 16) } != CUDA_SUCCESS {
        return None;
    }
    Some(
        (0..n)
            .map(|i| (if res[2 * i] == 0 { 0 } else { res[2 * i + 1] }, res[2 * i]))
            .collect(),
    )
}

/// The same count with large copies to the host (the path when no kernel can be loaded).
fn verify_on_host(ptr: u64, size: u64, byte: u8) -> Option<(u64, u64)> {
    let dtoh = MEMCPY_DTOH.get()?;
    const CHUNK: u64 = 16 << 20;
    let mut buf = vec![0u8; CHUNK.min(size) as usize];
    let (mut first, mut changed) = (u64::MAX, 0u64);
    let mut off = 0;
    while off < size {
        let n = CHUNK.min(size - off) as usize;
        if unsafe { dtoh(buf.as_mut_ptr().cast(), ptr + off, n) } != CUDA_SUCCESS {
            return None;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            if b != byte {
                changed += 1;
                first = first.min(off + i as u64);
            }
        }
        off += n as u64;
    }
    Some((if changed == 0 { 0 } else { first }, changed))
}

extern "C" fn verify_all_at_exit() {
    let _inside = Inside::enter();
    let _ = std::panic::catch_unwind(at_exit_bounded);
}

/// The process whose quarantine this is (set when the first free is quarantined, and in a fork
/// child); a `vfork` child sharing the parent's memory is not it.
static EXIT_OWNER: AtomicU32 = AtomicU32::new(0);
/// An exit check ran past its limit: later ones (the library's destructor) do not start.
static EXIT_GAVE_UP: AtomicBool = AtomicBool::new(false);

/// The longest the exit check may hold up the process's exit. It waits for the device (the
/// batches in flight, the freeing streams, its own kernels); a device that never gets there must
/// not turn into a process that never ends because of the library.
const EXIT_CHECK_LIMIT_NS: u64 = 30_000_000_000;

/// [`at_exit`] on a thread of its own (with the calling thread's context), waited for at most
/// [`EXIT_CHECK_LIMIT_NS`]; past that the exit goes on without it, says so on stderr and in the
/// trace, and the unfinished check is left to die with the process.
pub fn at_exit_bounded() {
    let owner = EXIT_OWNER.load(Acquire);
    if owner != 0 && owner != unsafe { libc::getpid() } as u32 {
        return; // a vfork child: the quarantine is its parent's, and so is the address space
    }
    if EXIT_GAVE_UP.load(Acquire) {
        return; // an earlier check is still waiting for the device (and holds the queue)
    }
    if !ATEXIT.load(Acquire) {
        at_exit(); // nothing was ever quarantined: nothing to wait for
        return;
    }
    let ctx = current_ctx();
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let spawned = std::thread::Builder::new()
        .name("isolate-exit".into())
        .spawn(move || {
            let _inside = Inside::enter();
            if ctx != 0
                && let Some(set) = CTX_SET_CURRENT.get()
            {
                unsafe { set(ctx as CUcontext) };
            }
            let _ = std::panic::catch_unwind(at_exit);
            flag.store(true, Release);
        });
    if spawned.is_err() {
        at_exit(); // no thread to be had: the check runs here, unbounded
        return;
    }
    let limit = match config::get().test_exit_check_ms {
        0 => EXIT_CHECK_LIMIT_NS,
        ms => ms * 1_000_000,
    };
    if !wait_until(now_ns() + limit, || done.load(Acquire)) {
        let text = format!(
            "the exit check of the quarantine did not finish within {:.1} s (waiting for the \
             device?): the process exits without its results",
            limit as f64 / 1e9
        );
        EXIT_GAVE_UP.store(true, Release);
        warn(&text);
        event::note(NoteKind::Info, 0, 0, 0, text);
    }
}

/// At exit: every allocation still in quarantine is checked (not freed: the process is ending).
pub fn at_exit() {
    reap(true);
    let entries: Vec<Entry> = {
        let mut g = state();
        let s = st!(g);
        s.index.clear();
        s.held = 0;
        s.queue.drain(..).collect()
    };
    release_batch(&entries, Release::CheckOnly);
}

/// The exit notes: what was verified, kept, captured and poisoned, and the time it took. Once,
/// from the library's own exit (its destructor, or before `_exit`), after the last check: the
/// `atexit` handler's check ([`at_exit_bounded`]) runs before it and writes none, so that a
/// process that runs both has each note once, with the final counts.
pub fn exit_notes() {
    // Only into a trace that exists: a process that never touched CUDA leaves no file.
    if !writer::started() {
        return;
    }
    let (device, host) = (ON_DEVICE.load(Relaxed), ON_HOST.load(Relaxed));
    if device + host > 0 {
        event::note(
            NoteKind::Info,
            0,
            device,
            host,
            format!("poison verified for {device} allocations on the device, {host} on the host"),
        );
    }
    let (served, kept) = reuse::stats();
    if kept > 0 {
        event::note(
            NoteKind::Info,
            0,
            served,
            kept,
            format!(
                "reuse (ISOLATE_REUSE=on): {kept} checked allocations kept instead of freed, \
                 {served} stream-ordered allocations served from them without the driver"
            ),
        );
    }
    let captured = CAPTURED.load(Relaxed);
    if captured > 0 {
        event::note(
            NoteKind::Info,
            0,
            captured,
            0,
            format!(
                "{captured} stream-ordered frees during CUDA graph capture went to the driver \
                 unquarantined"
            ),
        );
    }
    let poisoned = POISONED.load(Relaxed);
    if poisoned > 0 {
        let (done, bytes) = if config::get().poison.is_some() {
            (
                "poisoned",
                "written by the device once and read once to check",
            )
        } else {
            (
                "quarantined unpoisoned (ISOLATE_POISON=off)",
                "neither written nor checked",
            )
        };
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        let (deferred, fills) = release::deferred_stats();
        event::note(
            NoteKind::Info,
            0,
            poisoned,
            ASYNC_BATCHES.load(Relaxed),
            format!(
                "isolation's time: {poisoned} frees {done} ({} bytes, {bytes}; {} by the \
                 library's fill kernel; {deferred} deferred to their stream's next work and \
                 poisoned by {fills} launches), {:.1} ms on the freeing threads ({:.2} us each); \
                 releases {:.1} ms, of it {:.1} ms waiting for the device; {} batches released \
                 on the release stream",
                POISON_BYTES.load(Relaxed),
                BY_KERNEL.load(Relaxed),
                ms(&POISON_NS),
                ms(&POISON_NS) * 1e3 / poisoned as f64,
                ms(&RELEASE_NS),
                ms(&WAIT_NS),
                ASYNC_BATCHES.load(Relaxed)
            ),
        );
    }
}

/// Checks every allocation in quarantine now (they stay there) and every batch on its way out;
/// what it finds is recorded (and counted by the tally) like any stale write. For a test
/// framework's "no stale write in this test" at the end of each test.
pub fn verify_now() {
    let _inside = Inside::enter();
    reap(true);
    let entries: Vec<Entry> = {
        let g = STATE.lock();
        g.as_ref()
            .map(|s| s.queue.iter().copied().collect())
            .unwrap_or_default()
    };
    release_sync(&entries, false, true);
}

/// Drops index entries inside [ptr, ptr+size): guard mode gave that address range back.
pub fn forget_range(ptr: u64, size: u64) {
    let mut g = state();
    let s = st!(g);
    let inside: Vec<u64> = s
        .index
        .range(ptr..ptr.saturating_add(size))
        .map(|(k, _)| *k)
        .collect();
    for k in inside {
        s.index.remove(&k);
    }
}

/// Looks up each word of `words` (all inside [`LOW`], [`HIGH`]) under one lock: `found(i, e)`
/// for each word `i` inside freed memory `e`.
pub fn lookup_each(words: &[u64], mut found: impl FnMut(usize, Entry)) {
    let hits: Vec<(usize, Entry)> = {
        let g = STATE.lock();
        let Some(s) = g.as_ref() else { return };
        words
            .iter()
            .enumerate()
            .filter_map(|(i, &addr)| {
                let (_, e) = s.index.range(..=addr).next_back()?;
                (addr < e.ptr + e.size).then_some((i, *e))
            })
            .collect()
    };
    // Called without the lock: `found` records and may wait for the writer.
    for (i, e) in hits {
        found(i, e);
    }
}

#[cfg(test)]
mod tests {
    use super::{Substrate, cap_for, pytorch_substrate};

    /// Kept memory's cap: a quarter of the budget on a nearly full device (or one whose memory
    /// is not known), up to the whole budget while more than a quarter of the device is free.
    #[test]
    fn kept_memory_grows_past_a_quarter_of_the_budget_only_with_room_to_spare() {
        const GIB: u64 = 1 << 30;
        // The H200: 140 GiB, the program and the quarantine hold 40: 100 free, 65 to spare.
        assert_eq!(cap_for(35 * GIB, Some((100 * GIB, 140 * GIB))), 35 * GIB);
        // 50 free: 15 to spare.
        assert_eq!(cap_for(35 * GIB, Some((50 * GIB, 140 * GIB))), 15 * GIB);
        // Nearly full, or unknown: a quarter.
        assert_eq!(cap_for(8 << 20, Some((3 << 20, 12 << 20))), 2 << 20);
        assert_eq!(cap_for(8 << 20, None), 2 << 20);
        assert_eq!(cap_for(0, Some((100 * GIB, 140 * GIB))), 0);
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn pytorch_gets_the_stream_ordered_backend_unless_the_user_chose() {
        assert_eq!(
            pytorch_substrate(None, None, None),
            Substrate::StreamOrdered
        );
        assert_eq!(
            pytorch_substrate(None, None, s("")),
            Substrate::StreamOrdered
        );
        assert_eq!(pytorch_substrate(s("1"), None, None), Substrate::UserChose);
        assert_eq!(
            pytorch_substrate(s("0"), None, s("x:1")),
            Substrate::UserChose
        );
        assert_eq!(
            pytorch_substrate(None, None, s("backend:cudaMallocAsync")),
            Substrate::UserChose
        );
        assert_eq!(
            pytorch_substrate(
                None,
                s("expandable_segments:True, backend: cudaMallocAsync"),
                None
            ),
            Substrate::UserChose
        );
        assert_eq!(
            pytorch_substrate(None, None, s("expandable_segments:True")),
            Substrate::NoCaching("PYTORCH_CUDA_ALLOC_CONF")
        );
        assert_eq!(
            pytorch_substrate(None, s("max_split_size_mb:128"), None),
            Substrate::NoCaching("PYTORCH_ALLOC_CONF")
        );
        assert_eq!(
            pytorch_substrate(None, None, s("backend:native")),
            Substrate::NoCaching("PYTORCH_CUDA_ALLOC_CONF")
        );
    }
}

//! The stream-order check: an allocation freed on one stream while a use of it on another
//! stream is not ordered before the free (a missing `record_stream`, a missing event wait) is a
//! finding, decided by happens-before at the free whether or not the bytes changed
//! (docs/ordering.md).
//!
//! Vector clocks: one per stream (streams indexed in a small table, the legacy default stream
//! index 0, each thread's per-thread default stream one of its own) and one for the host,
//! shared by every host thread. Host threads order each other through locks the library cannot
//! see; one clock for all of them only adds edges, so it can hide a finding but never make one.
//! Every operation queued on stream S first joins the host clock into S (work queued after the
//! host saw something is ordered after it); a use then ticks S's own component, and its
//! timestamp is `S.vc[S]`. Edges: an event record copies the stream's clock into the event; a
//! stream wait joins the event's into the stream; an event or stream synchronisation (or a query
//! that says done) joins it into the host; a context synchronisation and a synchronous free join
//! every stream into the host. The legacy default stream waits for every blocking stream before
//! each of its operations, and every blocking stream waits for it (both joins are made lazily,
//! when the other side changed: generation counters, so a launch costs a hash lookup).
//!
//! A use is a launch with a whole 8-byte parameter exactly equal to a tracked allocation's
//! start (the launch check's evidence rule), or a copy or set whose destination or source is
//! an allocation's start. Each allocation keeps the latest use per stream; a use on a stream
//! other than the allocation's own (its allocating stream, or its first use's for a plain
//! allocation) also gets the launching thread's stack, captured after the lock is let go.
//!
//! A free on stream A of an allocation with a use on B ≠ A whose tick is above `A.vc[B]` is a
//! [`FreedInUse`] record and one `FREED IN USE` line on stderr, once per allocation. Nothing is
//! decided while any stream captures a graph for the capturing streams (their work runs at the
//! graph's launches; a graph launch is an operation ordered after every stream, uses inside
//! graphs are not tracked).
//!
//! Never a CUDA call while the lock is held: a stream's flags (`cuStreamGetFlags`) and whether it
//! captures (`cuStreamIsCapturing`) are asked before it is taken.
//!
//! Layer: policies. Uses the base and recording.

use crate::base::config::{self, Mode};
use crate::base::cu;
use crate::base::cuda::*;
use crate::base::sys::{ForkLock, gettid, now_ns, warn};
use crate::record::{event, stacks, writer};
use isolate_trace::{Api, FreedInUse, Record};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// `CU_STREAM_NON_BLOCKING`.
const NON_BLOCKING: u32 = 0x1;
/// The legacy default stream's index.
const LEGACY: u32 = 0;
/// No stream yet (a plain allocation's own stream before its first use).
const NONE: u32 = u32::MAX;
/// Most addresses of one launch looked at.
pub const WORDS: usize = 64;
/// Most words of a struct parameter read as a group of pointers.
pub const GROUP: usize = 8;

/// True when the check runs: isolate mode with the launch check on (the uses come from its
/// walk of the parameters, and its hooks are handed out) and `ISOLATE_TEST_ORDER` not off.
#[inline]
pub fn active() -> bool {
    let c = config::get();
    c.mode == Mode::Isolate && c.check_launch && c.order
}

/// Which stream a handle names, as the program passed it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Key {
    Legacy,
    /// The calling thread's own default stream (by Linux thread id).
    PerThread(u32),
    /// A stream the program created.
    Created(u64),
}

impl Key {
    /// The stream `handle` names on an entry point whose null stream is the per-thread one
    /// (`ptsz`, the `_ptsz`/`_ptds` exports) or the legacy one.
    pub fn of(handle: u64, ptsz: bool) -> Key {
        match handle {
            0 if ptsz => Key::PerThread(gettid()),
            0 | STREAM_LEGACY => Key::Legacy,
            STREAM_PER_THREAD => Key::PerThread(gettid()),
            h => Key::Created(h),
        }
    }

    fn map_key(self) -> Option<u64> {
        match self {
            Key::Legacy => None,
            Key::PerThread(tid) => Some(1 << 63 | tid as u64),
            Key::Created(h) => Some(h),
        }
    }

    /// The handle a record names: 0 the legacy stream, 2 the per-thread one, else the handle.
    fn handle(self) -> u64 {
        match self {
            Key::Legacy => 0,
            Key::PerThread(_) => STREAM_PER_THREAD,
            Key::Created(h) => h,
        }
    }

    /// The handle to ask the driver about it with (`cuStreamIsCapturing`).
    fn query_handle(self) -> CUstream {
        match self {
            Key::Legacy => std::ptr::null_mut(),
            Key::PerThread(_) => STREAM_PER_THREAD as CUstream,
            Key::Created(h) => h as CUstream,
        }
    }
}

/// One stream's clock and what it has seen of the others.
struct Stream {
    vc: Vec<u64>,
    /// Synchronises with the legacy default stream (not created `CU_STREAM_NON_BLOCKING`).
    blocking: bool,
    /// Bumped whenever `vc` grows.
    generation: u64,
    /// The host's, the legacy stream's and (for the legacy stream) the blocking streams'
    /// generation last joined in.
    host_seen: u64,
    legacy_seen: u64,
    blocking_seen: u64,
    handle: u64,
}

impl Stream {
    fn new(blocking: bool, handle: u64) -> Stream {
        Stream {
            vc: Vec::new(),
            blocking,
            generation: 1,
            host_seen: 0,
            legacy_seen: 0,
            blocking_seen: 0,
            handle,
        }
    }
}

/// `a ⊔= b`; true when `a` grew.
fn join(a: &mut Vec<u64>, b: &[u64]) -> bool {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    let mut grew = false;
    for (x, &y) in a.iter_mut().zip(b) {
        if y > *x {
            *x = y;
            grew = true;
        }
    }
    grew
}

/// A use of an allocation: the latest on its stream.
#[derive(Clone, Copy, Debug)]
struct Use {
    stream: u32,
    handle: u64,
    tick: u64,
    after_seq: u64,
    ts: u64,
    stack: u32,
    name: &'static str,
    kernel: bool,
}

/// A tracked allocation.
struct Alloc {
    size: u64,
    seq: u64,
    stack: u32,
    own: u32,
    uses: Uses,
}

/// An allocation's latest use on each stream that used it: the first in place (most tensors
/// are used on one stream; a `Vec` of them was an allocation and a free of the heap a tensor),
/// the others after it.
#[derive(Default)]
struct Uses {
    first: Option<Use>,
    rest: Vec<Use>,
}

impl Uses {
    fn iter(&self) -> impl Iterator<Item = &Use> {
        self.first.iter().chain(&self.rest)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Use> {
        self.first.iter_mut().chain(&mut self.rest)
    }

    /// `u` in place of the use on its stream, or added.
    fn set(&mut self, u: Use) {
        if let Some(old) = self.iter_mut().find(|old| old.stream == u.stream) {
            *old = u;
        } else if self.first.is_none() {
            self.first = Some(u);
        } else {
            self.rest.push(u);
        }
    }
}

/// What an unordered use at a free is, for the record.
#[derive(Debug)]
pub struct Race {
    alloc: (u64, u64, u64, u32),
    free_handle: u64,
    seen: u64,
    u: Use,
}

#[derive(Default)]
struct State {
    streams: Vec<Stream>,
    by_key: FxHashMap<u64, u32>,
    /// Indices of destroyed streams, given to the next new stream with their clocks (each
    /// component only grows, so a reused index never makes a finding).
    spare: Vec<u32>,
    host: Vec<u64>,
    host_generation: u64,
    /// Bumped whenever a blocking stream's clock grows.
    blocking_generation: u64,
    /// Each event's clock at its last record the library saw, with the number of graph
    /// launches before that record.
    events: FxHashMap<usize, (Vec<u64>, u64)>,
    /// Graph launches so far: a graph may record an event itself (an event-record node), which
    /// the library does not see, so an event not recorded since the last graph launch may stand
    /// for anything a graph ran: waiting for it orders after every stream.
    graphs: u64,
    allocs: FxHashMap<u64, Alloc>,
}

impl State {
    fn new() -> State {
        let mut s = State::default();
        s.streams.push(Stream::new(true, 0));
        s.host_generation = 1;
        s.blocking_generation = 1;
        s
    }

    /// The index of a known stream, `None` for a created stream not seen yet (its flags must be
    /// asked first, without the lock).
    fn index(&self, key: Key) -> Option<u32> {
        match key.map_key() {
            None => Some(LEGACY),
            Some(k) => self.by_key.get(&k).copied(),
        }
    }

    /// Adds a stream (its flags known); returns its index.
    fn add(&mut self, key: Key, blocking: bool) -> u32 {
        if let Some(i) = self.index(key) {
            return i;
        }
        let handle = key.handle();
        let i = match self.spare.pop() {
            Some(i) => {
                let s = &mut self.streams[i as usize];
                s.blocking = blocking;
                s.handle = handle;
                s.generation += 1;
                i
            }
            None => {
                self.streams.push(Stream::new(blocking, handle));
                (self.streams.len() - 1) as u32
            }
        };
        if let Some(k) = key.map_key() {
            self.by_key.insert(k, i);
        }
        i
    }

    /// The stream was destroyed: its handle may name another stream from now on.
    fn gone(&mut self, key: Key) {
        if let Some(k) = key.map_key()
            && let Some(i) = self.by_key.remove(&k)
        {
            self.spare.push(i);
        }
    }

    /// `streams[i].vc ⊔= src` (a clone of another's); keeps the generations.
    fn grow(&mut self, i: u32, src: &[u64]) {
        let s = &mut self.streams[i as usize];
        if join(&mut s.vc, src) {
            s.generation += 1;
            if s.blocking && i != LEGACY {
                self.blocking_generation += 1;
            }
        }
    }

    /// What every operation queued on stream `i` first does: it is ordered after what the host
    /// saw, the legacy stream after every blocking stream, a blocking stream after the legacy
    /// stream. Each join only when the other side changed since.
    fn enter(&mut self, i: u32) {
        if self.streams[i as usize].host_seen != self.host_generation {
            let host = std::mem::take(&mut self.host);
            self.grow(i, &host);
            self.host = host;
            self.streams[i as usize].host_seen = self.host_generation;
        }
        if i == LEGACY {
            if self.streams[0].blocking_seen != self.blocking_generation {
                for j in 1..self.streams.len() {
                    if self.streams[j].blocking {
                        let vc = std::mem::take(&mut self.streams[j].vc);
                        self.grow(LEGACY, &vc);
                        self.streams[j].vc = vc;
                    }
                }
                self.streams[0].blocking_seen = self.blocking_generation;
            }
        } else if self.streams[i as usize].blocking
            && self.streams[i as usize].legacy_seen != self.streams[0].generation
        {
            let vc = std::mem::take(&mut self.streams[0].vc);
            self.grow(i, &vc);
            self.streams[0].vc = vc;
            self.streams[i as usize].legacy_seen = self.streams[0].generation;
        }
    }

    /// A use on stream `i`: its own component ticks; returns the tick. (Of the streams and the
    /// blocking generation only, so that it can run while an allocation is borrowed.)
    fn tick(streams: &mut [Stream], blocking_generation: &mut u64, i: u32) -> u64 {
        let s = &mut streams[i as usize];
        if s.vc.len() <= i as usize {
            s.vc.resize(i as usize + 1, 0);
        }
        s.vc[i as usize] += 1;
        s.generation += 1;
        if s.blocking && i != LEGACY {
            *blocking_generation += 1;
        }
        s.vc[i as usize]
    }

    /// The host is ordered after stream `i`'s work so far (for the legacy stream, also after
    /// every blocking stream's: its work waited for theirs).
    fn host_after(&mut self, i: u32) {
        let mut grew = join(&mut self.host, &self.streams[i as usize].vc);
        if i == LEGACY {
            for s in &self.streams {
                if s.blocking {
                    grew |= join(&mut self.host, &s.vc);
                }
            }
        }
        if grew {
            self.host_generation += 1;
        }
    }

    fn host_after_all(&mut self) {
        let mut grew = false;
        for s in &self.streams {
            grew |= join(&mut self.host, &s.vc);
        }
        if grew {
            self.host_generation += 1;
        }
    }

    /// Whether event `e` may have been recorded by a graph since the library last saw it
    /// recorded (a graph launched after that, or it was never seen recorded while graphs ran).
    fn graph_may_have_recorded(&self, e: usize) -> bool {
        self.graphs > 0 && self.events.get(&e).is_none_or(|(_, g)| *g < self.graphs)
    }

    fn host_after_event(&mut self, e: usize) {
        if self.graph_may_have_recorded(e) {
            return self.host_after_all();
        }
        if let Some((vc, _)) = self.events.get(&e)
            && join(&mut self.host, vc)
        {
            self.host_generation += 1;
        }
    }

    fn record(&mut self, e: usize, i: u32) {
        self.enter(i);
        let graphs = self.graphs;
        let (vc, g) = self.events.entry(e).or_default();
        vc.clear();
        vc.extend_from_slice(&self.streams[i as usize].vc);
        *g = graphs;
    }

    fn wait(&mut self, i: u32, e: usize) {
        if self.graph_may_have_recorded(e) {
            return self.wait_all(i);
        }
        self.enter(i);
        if let Some((vc, g)) = self.events.remove(&e) {
            self.grow(i, &vc);
            self.events.insert(e, (vc, g));
        }
    }

    /// A graph launched on stream `i`: what it waits for inside is not seen (ordered after
    /// every stream), and the events it may record are not either.
    fn graph(&mut self, i: u32) {
        self.graphs += 1;
        self.wait_all(i);
    }

    /// Stream `i` waits for what nothing here shows (a memory value, a graph's own waits):
    /// ordered after every stream, which can only hide findings.
    fn wait_all(&mut self, i: u32) {
        self.enter(i);
        for j in 0..self.streams.len() {
            if j != i as usize {
                let vc = std::mem::take(&mut self.streams[j].vc);
                self.grow(i, &vc);
                self.streams[j].vc = vc;
            }
        }
    }

    /// Uses of the allocations among `words` (in groups: `groups` says where each starts) by
    /// an operation on stream `i`: each word of a group whose every word is an allocation's
    /// start or zero. Puts the (allocation, tick) of those that need a stack (not on the
    /// allocation's own stream) in `need_stack`.
    #[allow(clippy::too_many_arguments)]
    fn uses(
        &mut self,
        i: u32,
        words: &[u64],
        groups: &[u8],
        name: &'static str,
        kernel: bool,
        after_seq: u64,
        need_stack: &mut Vec<(u64, u64)>,
    ) {
        self.enter(i);
        let mut tick = 0;
        let mut ts = 0;
        let handle = self.streams[i as usize].handle;
        let State {
            streams,
            blocking_generation,
            allocs,
            ..
        } = self;
        for (g, &start) in groups.iter().enumerate() {
            let end = groups.get(g + 1).map_or(words.len(), |&e| e as usize);
            let group = &words[start as usize..end];
            // A group of one word is looked up once, below.
            if group.len() > 1 && group.iter().any(|w| *w != 0 && !allocs.contains_key(w)) {
                continue; // an integer, or something else: not an array of operands
            }
            for &w in group {
                if w == 0 {
                    continue;
                }
                let Some(a) = allocs.get_mut(&w) else {
                    continue; // a single word that is no allocation's start
                };
                if tick == 0 {
                    tick = State::tick(streams, blocking_generation, i);
                    ts = now_ns();
                }
                if a.own == NONE {
                    a.own = i;
                }
                let u = Use {
                    stream: i,
                    handle,
                    tick,
                    after_seq,
                    ts,
                    stack: 0,
                    name,
                    kernel,
                };
                if a.own != i {
                    need_stack.push((w, tick));
                }
                a.uses.set(u);
            }
        }
    }

    /// The allocation at `ptr` is freed on stream `i` (`None`: a synchronous free, which waits
    /// for the device): the first use not ordered before the free, if any.
    fn free(&mut self, ptr: u64, i: Option<u32>) -> Option<Race> {
        let a = self.allocs.remove(&ptr)?;
        let Some(i) = i else {
            self.host_after_all();
            return None;
        };
        self.enter(i);
        let vc = &self.streams[i as usize].vc;
        let race = a
            .uses
            .iter()
            .find(|u| u.stream != i && vc.get(u.stream as usize).copied().unwrap_or(0) < u.tick)?;
        Some(Race {
            alloc: (ptr, a.size, a.seq, a.stack),
            free_handle: self.streams[i as usize].handle,
            seen: vc.get(race.stream as usize).copied().unwrap_or(0),
            u: *race,
        })
    }
}

static STATE: ForkLock<Option<State>> = ForkLock::new(None);

/// Streams capturing a graph now (begun and not yet ended): while any does, each operation asks
/// whether its stream is one of them.
static CAPTURES: AtomicU64 = AtomicU64::new(0);
/// Findings so far (the exit note).
pub static FOUND: AtomicU64 = AtomicU64::new(0);
/// Unordered frees whose check and release wait for the using stream too ([`waited`]).
static WAITED: AtomicU64 = AtomicU64::new(0);
/// Test-only ([`pause`]): uses and allocations are not tracked while set.
static PAUSED: AtomicBool = AtomicBool::new(false);
/// Uses recorded (the exit note).
static USES: AtomicU64 = AtomicU64::new(0);

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock();
    f(g.get_or_insert_with(State::new))
}

/// Whether some stream captures a graph now (begun and not yet ended); false is certain, true
/// means asking the stream.
pub fn any_capture() -> bool {
    CAPTURES.load(Relaxed) > 0
}

/// Whether work on `key` is recorded into a graph now (nothing of it runs until a launch).
fn capturing(key: Key) -> bool {
    if CAPTURES.load(Relaxed) == 0 {
        return false;
    }
    // SAFETY: the stream the program passed to the call it is making.
    unsafe { cu::stream_is_capturing(key.query_handle()) }.unwrap_or(false)
}

/// `f` with the state and `key`'s stream index, under one lock when the stream is known (the
/// common case: a launch takes the lock once); a new stream's flags are asked first, without it.
fn with_stream<R>(key: Key, f: impl FnOnce(&mut State, u32) -> R) -> R {
    let mut f = Some(f);
    if let Some(r) = with(|s| s.index(key).map(|i| (f.take().expect("once"))(s, i))) {
        return r;
    }
    let blocking = flags_blocking(key);
    with(|s| {
        let i = s.add(key, blocking);
        (f.take().expect("once"))(s, i)
    })
}

/// Whether `key`'s stream synchronises with the legacy default stream (asked of the driver for
/// a created stream; never under the lock).
fn flags_blocking(key: Key) -> bool {
    match key {
        Key::Legacy | Key::PerThread(_) => true,
        // A handle the driver does not know (the call fails anyway) counts as blocking: more
        // edges, never a finding.
        Key::Created(h) => {
            // SAFETY: the stream the program passed to the call it is making.
            let flags = unsafe { cu::stream_get_flags(h as CUstream) };
            flags.map_or(true, |f| f & NON_BLOCKING == 0)
        }
    }
}

/// What a hook of stream work tells the check: the call's kind and arguments.
#[derive(Clone, Copy)]
pub enum Op {
    /// Work queued on a stream that may touch a destination and a source (copies; a set has
    /// no source): each a use when it is an allocation's start.
    Work {
        stream: CUstream,
        ptsz: bool,
        name: &'static str,
        dst: u64,
        src: u64,
    },
    /// A synchronous copy or set: work on the legacy default stream (the thread's own with the
    /// `_ptds` exports), after which the host is ordered after that stream.
    SyncWork {
        ptds: bool,
        name: &'static str,
        dst: u64,
        src: u64,
    },
    Record {
        event: usize,
        stream: CUstream,
        ptsz: bool,
    },
    Wait {
        stream: CUstream,
        event: usize,
        ptsz: bool,
    },
    /// Work whose waits the library cannot see (memory-value waits, batched memory operations,
    /// external semaphores): the stream is ordered after every stream.
    WaitAll {
        stream: CUstream,
        ptsz: bool,
    },
    /// A graph launch: as `WaitAll`, and every event not recorded since may have been recorded
    /// by a graph (waiting for one orders after every stream).
    Graph {
        stream: CUstream,
        ptsz: bool,
    },
    /// A host function or callback: its body may tell a host thread the stream got there, so the
    /// host is ordered after the stream at once (more edges, never a finding).
    HostFunc {
        stream: CUstream,
        ptsz: bool,
    },
    /// `cuStreamSynchronize`, and `cuStreamQuery` when it says done.
    StreamSync {
        stream: CUstream,
        ptsz: bool,
    },
    /// `cuEventSynchronize`, and `cuEventQuery` when it says done.
    EventSync {
        event: usize,
    },
    CtxSync,
    /// `cuEventDestroy`: the event's clock is forgotten (its handle may name a new event).
    EventGone {
        event: usize,
    },
    CaptureBegin,
    CaptureEnd,
}

impl Op {
    fn key(&self) -> Option<Key> {
        Some(match *self {
            Op::Work { stream, ptsz, .. }
            | Op::Record { stream, ptsz, .. }
            | Op::Wait { stream, ptsz, .. }
            | Op::WaitAll { stream, ptsz }
            | Op::Graph { stream, ptsz }
            | Op::HostFunc { stream, ptsz }
            | Op::StreamSync { stream, ptsz } => Key::of(stream as u64, ptsz),
            Op::SyncWork { ptds, .. } => Key::of(0, ptds),
            Op::EventSync { .. }
            | Op::EventGone { .. }
            | Op::CtxSync
            | Op::CaptureBegin
            | Op::CaptureEnd => return None,
        })
    }
}

/// Before the real call of stream work: uses, and the joins that order the stream's later work.
pub fn before(op: &Op) {
    if !active() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let Some(key) = op.key() else { return };
        if matches!(op, Op::StreamSync { .. }) || capturing(key) {
            return;
        }
        match *op {
            Op::Work { name, dst, src, .. } | Op::SyncWork { name, dst, src, .. } => {
                // Two groups of one: the destination and the source, each named by the call.
                uses(key, &[dst, src], &[0, 1], name, false)
            }
            Op::Wait { event, .. } => with_stream(key, |s, i| s.wait(i, event)),
            Op::WaitAll { .. } => with_stream(key, |s, i| s.wait_all(i)),
            Op::Graph { .. } => with_stream(key, |s, i| s.graph(i)),
            _ => with_stream(key, |s, i| s.enter(i)),
        }
    });
}

/// After the real call returned `r`: what the call made true once it was made (an event's
/// capture, the host's waits).
pub fn after(op: &Op, r: CUresult) {
    // Counted whether the check runs or not: isolation asks too ([`any_capture`]).
    match *op {
        Op::CaptureBegin if r == CUDA_SUCCESS => {
            CAPTURES.fetch_add(1, AcqRel);
            return;
        }
        Op::CaptureEnd => {
            let _ = CAPTURES.fetch_update(AcqRel, Acquire, |n| Some(n.saturating_sub(1)));
            return;
        }
        _ => {}
    }
    if !active() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        match *op {
            Op::CtxSync if r == CUDA_SUCCESS => return with(|s| s.host_after_all()),
            Op::EventGone { event } if r == CUDA_SUCCESS => {
                return with(|s| {
                    s.events.remove(&event);
                });
            }
            Op::EventSync { event } if r == CUDA_SUCCESS => {
                return with(|s| s.host_after_event(event));
            }
            _ => {}
        }
        if r != CUDA_SUCCESS {
            return;
        }
        let Some(key) = op.key() else { return };
        if capturing(key) {
            return;
        }
        match *op {
            Op::Record { event, .. } => with_stream(key, |s, i| s.record(event, i)),
            Op::Wait { event, .. } => with_stream(key, |s, i| s.wait(i, event)),
            Op::WaitAll { .. } => with_stream(key, |s, i| s.wait_all(i)),
            Op::Graph { .. } => with_stream(key, |s, i| s.graph(i)),
            Op::SyncWork { .. } | Op::HostFunc { .. } | Op::StreamSync { .. } => {
                with_stream(key, |s, i| s.host_after(i))
            }
            _ => {}
        }
    });
}

/// A kernel launch on `stream` with the parameters' words in groups (`groups`: where each
/// starts in `words`): a whole 8-byte parameter (the launch check's evidence: a use when it is
/// an allocation's start), or a small struct passed by value, a use only when every word of it
/// is an allocation's start or zero (an array of operands, as PyTorch's elementwise kernels
/// take them; a struct with an integer or a stale pointer in it is not read as uses). Every
/// launch comes here, with or without words: on the legacy stream it is ordered after the
/// blocking streams.
pub fn launch(stream: CUstream, ptsz: bool, words: &[u64], groups: &[u8], name: &'static str) {
    let key = Key::of(stream as u64, ptsz);
    if capturing(key) {
        return;
    }
    uses(key, words, groups, name, true);
}

fn uses(key: Key, words: &[u64], groups: &[u8], name: &'static str, kernel: bool) {
    if PAUSED.load(Relaxed) {
        return;
    }
    let mut need = Vec::new();
    let after_seq = event::last_seq();
    let i = with_stream(key, |s, i| {
        s.uses(i, words, groups, name, kernel, after_seq, &mut need);
        i
    });
    if need.is_empty() {
        return;
    }
    USES.fetch_add(need.len() as u64, Relaxed);
    // On another stream than the allocation's own: where it was queued, captured without the
    // lock and put in the use if it is still the latest.
    let stack = stacks::capture();
    with(|s| {
        for (ptr, tick) in need {
            if let Some(a) = s.allocs.get_mut(&ptr)
                && let Some(u) = a.uses.iter_mut().find(|u| u.stream == i && u.tick == tick)
            {
                u.stack = stack;
            }
        }
    });
}

/// A device allocation (quarantinable memory) was made: tracked until its free. A
/// stream-ordered one's own stream is its stream; a plain one's, its first use's.
pub fn allocated(ptr: u64, size: u64, seq: u64, stack: u32, api: Api, stream: u64) {
    if !active() || PAUSED.load(Relaxed) {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let alloc = |own| Alloc {
            size,
            seq,
            stack,
            own,
            uses: Uses::default(),
        };
        let key = Key::of(stream, api.per_thread_stream());
        if api.stream_ordered() && !capturing(key) {
            with_stream(key, |s, i| s.allocs.insert(ptr, alloc(i)));
        } else {
            with(|s| s.allocs.insert(ptr, alloc(NONE)));
        }
    });
}

/// The allocation at `ptr` is being freed by `api` (on `stream` when stream-ordered; event
/// `seq`, stack `free_stack`), before the real call and before its poison is queued: a use on
/// another stream not ordered before it is a finding. Returns the handle of that use's stream
/// (isolation's release then waits for it too: the program's race is named, and the library
/// does not add to it by giving the memory back to the driver while that stream may still
/// read it).
pub fn freed(ptr: u64, api: Api, stream: u64, seq: u64, free_stack: u32) -> Option<u64> {
    if !active() {
        return None;
    }
    std::panic::catch_unwind(|| {
        let key = api
            .stream_ordered()
            .then(|| Key::of(stream, api.per_thread_stream()));
        if let Some(k) = key
            && capturing(k)
        {
            // Recorded into a graph: freed when the graph runs (uses in graphs are not tracked).
            with(|s| s.allocs.remove(&ptr));
            return None;
        }
        let race = match key {
            Some(k) => with_stream(k, |s, i| s.free(ptr, Some(i))),
            None => with(|s| s.free(ptr, None)),
        };
        let race = race?;
        let handle = race.u.handle;
        report(race, api, seq, free_stack);
        Some(handle)
    })
    .unwrap_or(None)
}

/// The finding: its record, and one line on stderr.
fn report(race: Race, api: Api, seq: u64, free_stack: u32) {
    FOUND.fetch_add(1, Relaxed);
    let (ptr, size, alloc_seq, alloc_stack) = race.alloc;
    let u = race.u;
    let what = if u.kernel {
        format!("kernel {}", u.name)
    } else {
        u.name.to_string()
    };
    warn(&format!(
        "FREED IN USE: allocation 0x{ptr:x} ({size} bytes, allocated at event {alloc_seq}) freed \
         by {api} on stream 0x{:x} at event {seq} while {what} on stream 0x{:x} (queued after \
         event {}) may still use it: nothing orders that use before the free (no event recorded \
         on stream 0x{:x} after it was waited on by stream 0x{:x}, no synchronisation). In \
         PyTorch: x.record_stream(s) or torch.cuda.current_stream().wait_stream(s) before del x. \
         `isolate summary` names the lines",
        race.free_handle, u.handle, u.after_seq, u.handle, race.free_handle
    ));
    writer::submit(Record::FreedInUse(Box::new(FreedInUse {
        seq: event::next_seq(),
        ts_ns: now_ns(),
        tid: gettid(),
        device: event::current_device(),
        alloc_ptr: ptr,
        alloc_size: size,
        alloc_seq,
        alloc_stack,
        free_seq: seq,
        free_api: api,
        free_stream: race.free_handle,
        free_stack,
        use_name: u.name.to_string(),
        use_kernel: u.kernel,
        use_stream: u.handle,
        use_after_seq: u.after_seq,
        use_ts_ns: u.ts,
        use_stack: u.stack,
        use_tick: u.tick,
        seen_tick: race.seen,
    })));
}

/// Isolation made an unordered free's check and release wait for the stream of its use (the
/// handle [`freed`] returned), counted for the exit note.
pub fn waited() {
    WAITED.fetch_add(1, Relaxed);
}

/// Test-only, for measuring the check's cost inside one process (`tests/gpu/tier_bench.py`'s
/// `isolate-ab`, steps alternately with and without it): while paused, launches, copies and
/// sets record no use and allocations are not tracked; the ordering edges (records, waits,
/// synchronisations) are still followed. A pause can only hide a finding (a use not recorded,
/// or an allocation whose free is not looked at), never make one. Returns whether the check
/// runs at all (false outside isolate mode or with `ISOLATE_TEST_ORDER=off`).
pub fn pause(paused: bool) -> bool {
    PAUSED.store(paused, Relaxed);
    active()
}

/// The program is about to destroy `stream`.
pub fn stream_gone(stream: usize) {
    if !active() {
        return;
    }
    let _ = std::panic::catch_unwind(|| with(|s| s.gone(Key::of(stream as u64, false))));
}

/// In a fork child: the parent's streams and allocations are not the child's.
pub fn after_fork_child() {
    STATE.reset_in_child(None);
    CAPTURES.store(0, Relaxed);
}

/// The note written at exit: the check ran, and what it saw.
pub fn note_at_exit() {
    if !active() {
        return;
    }
    let (streams, tracked) = {
        let g = STATE.lock();
        g.as_ref()
            .map_or((1, 0), |s| (s.streams.len(), s.allocs.len()))
    };
    let found = FOUND.load(Relaxed);
    event::cost_note(
        isolate_trace::CostTopic::StreamOrder,
        found,
        streams as u64,
        format!(
            "stream order: {streams} streams, {} uses on another stream than their \
             allocation's, {found} freed while in use on another stream ({} of them released \
             only after that stream's use); {tracked} allocations still tracked",
            USES.load(Relaxed),
            WAITED.load(Relaxed)
        ),
    );
}

#[cfg(test)]
mod tests;

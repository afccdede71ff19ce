//! The memory model every analysis shares: which ranges, handles and mappings are live after
//! each event, decided from [`Api::kind`] and [`Api::memory`] alone.
//!
//! The [`Tracker`] turns events into *nodes* (anything with a lifetime: an allocation, a pinned
//! host buffer, a registration, a virtual address reservation, a physical handle, a mapping) and
//! tells an [`Observer`] when each one starts and ends, and when a call gives back something that
//! was not live. The rules:
//!
//! - A successful `Alloc`-kind call with a non-null pointer starts a node; a successful
//!   `Free`-kind call ends the node that *starts* at `ptr` (host frees look among host memory,
//!   every other free among device, managed and graph memory).
//!   Freeing null is a no-op. Graph memory nodes are kept apart from other device memory
//!   (graphs may share addresses).
//! - Failed calls (result ≠ 0) change nothing; but a failed free (unregister, address free,
//!   release) of something that is not live is still the program's bug.
//! - Giving back something that is not live is an **invalid free** when the driver refused it,
//!   or when the trace saw it given back before (a **double free**, named with the first free
//!   and the allocation, from the last [`FREED_KEPT`] frees). A call the driver *accepted* for
//!   something the trace never saw start is a free of memory allocated where the trace could
//!   not see it (before a late load, or through an entry point that is not recorded, such as
//!   the CUDA 3.1 `cuMemAlloc` ABI): reported apart ([`Observer::earlier`]), never as invalid.
//! - `cuMemAddressReserve`/`cuMemAddressFree` start and end reservations (keyed by address),
//!   `cuMemCreate`/`cuMemRelease` physical handles (keyed by handle; each
//!   `cuMemRetainAllocationHandle` of a live handle allows one more release that leaves it live),
//!   `cuMemMap`/`cuMemUnmap` mappings (an unmap ends every mapping that starts inside its range).
//! - An allocation handed out at the start of a node that is still live means the trace missed
//!   that node's free: the old node ends as [`EndHow::Lost`] (just before the new one starts).
//! - A trace with a [`NoteKind::LateLoad`] note was written by a library loaded after CUDA was
//!   already in use: memory allocated before the load is not in it. There, a call that gives back
//!   an address (or handle) that never started a node in this trace is a free of an *earlier
//!   allocation* ([`Observer::earlier`]), not an invalid free; giving back one that was seen and
//!   is no longer live (a double free) is still invalid.
//!
//! [`Live`] counts bytes per [`Category`]; device memory in use is device + managed + physical
//! handles ([`Live::device_bytes`]). Reservations and mappings are address space, not memory.

use isolate_trace::{Api, Event, Header, Kind, Memory, NoteKind, Record, Retained};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// `cudaMalloc`, `cuMemAlloc`, the async and pool variants, pitched and 3D.
    Device,
    /// `cudaMallocManaged`, `cuMemAllocManaged`.
    Managed,
    /// Graph memory nodes (`cuGraphAddMemAllocNode`).
    Graph,
    /// Pinned host memory (`cudaMallocHost`, `cudaHostAlloc`, …).
    Host,
    /// Host memory registered with `cudaHostRegister`.
    Registered,
    /// A virtual address range from `cuMemAddressReserve`.
    Reservation,
    /// Physical memory from `cuMemCreate`.
    Handle,
    /// A `cuMemMap` of (part of) a handle into a reserved range.
    Mapping,
}

impl Category {
    pub const ALL: [Category; 8] = [
        Category::Device,
        Category::Managed,
        Category::Graph,
        Category::Host,
        Category::Registered,
        Category::Reservation,
        Category::Handle,
        Category::Mapping,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Device => "device",
            Category::Managed => "managed",
            Category::Graph => "graph",
            Category::Host => "host",
            Category::Registered => "registered",
            Category::Reservation => "reservation",
            Category::Handle => "handle",
            Category::Mapping => "mapping",
        }
    }

    /// True for the categories that hold device memory (device, managed, physical handles).
    pub fn is_device_memory(self) -> bool {
        matches!(
            self,
            Category::Device | Category::Managed | Category::Handle
        )
    }

    /// True for things that occupy an address range (all but handles).
    pub fn has_address(self) -> bool {
        self != Category::Handle
    }
}

/// Anything with a lifetime that the trace shows starting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// Order in which nodes started in this trace, from 0.
    pub id: u64,
    pub category: Category,
    /// The call that started it.
    pub api: Api,
    pub device: i32,
    pub tid: u32,
    /// Start address (0 for handles).
    pub ptr: u64,
    pub size: u64,
    /// The physical handle (handles and mappings).
    pub handle: u64,
    /// Offset into the handle (mappings).
    pub offset: u64,
    pub stream: u64,
    pub seq: u64,
    pub ts_ns: u64,
    /// For a mapping: the node of the handle it maps, when that handle's creation was seen.
    pub handle_node: Option<u64>,
    /// For a mapping: the reservation that contains it.
    pub reservation: Option<u64>,
    /// The call stack of the call that started it (a [`Stack`](isolate_trace::Stack)'s id; 0
    /// when the trace has none).
    pub stack: u32,
}

impl Node {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.ptr.saturating_add(self.size)
    }

    pub fn covers(&self, addr: u64) -> bool {
        self.category.has_address() && self.ptr <= addr && addr < self.end()
    }
}

/// How a node ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndHow {
    /// Freed, released, unmapped or unregistered by a call.
    Freed,
    /// Its start address was handed out again while it was live: its free was never seen.
    Lost,
}

/// The end of a node: the call that ended it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub seq: u64,
    pub ts_ns: u64,
    pub api: Api,
    pub tid: u32,
    pub how: EndHow,
    /// For [`EndHow::Lost`]: the node that was handed its address.
    pub by: Option<u64>,
    /// The call stack of the call that ended it (0 when none).
    pub stack: u32,
}

/// What an invalid call tried to give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InvalidKind {
    /// A free of an address where no allocation starts.
    Free,
    /// `cuMemAddressFree` of an address where no reservation starts.
    AddressFree,
    /// `cuMemRelease` of a handle that is not live.
    Release,
    /// `cuMemUnmap` of a range where nothing is mapped.
    Unmap,
    /// `cudaHostUnregister` of memory that is not registered.
    Unregister,
}

impl InvalidKind {
    pub fn name(self) -> &'static str {
        match self {
            InvalidKind::Free => "free",
            InvalidKind::AddressFree => "address_free",
            InvalidKind::Release => "release",
            InvalidKind::Unmap => "unmap",
            InvalidKind::Unregister => "unregister",
        }
    }
}

/// A call that gave back something that was not live (whatever it returned: a free the driver
/// refused is still the program's bug).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub kind: InvalidKind,
    pub event: Event,
    /// A double free: what was given back had been given back before, by this call (and the
    /// node it ended). `None` when it never was live in this trace, or its free is older than
    /// the last [`FREED_KEPT`] frees.
    pub previous: Option<(Node, Ended)>,
}

impl Invalid {
    pub fn is_double(&self) -> bool {
        self.previous.is_some()
    }
}

/// How many recent frees are remembered to name the first free of a double free.
pub const FREED_KEPT: usize = 1 << 15;

/// The last [`FREED_KEPT`] frees, by what they gave back: a later call that gives the same back
/// while it is not live again is a double free, and names this one. Bounded: the oldest go.
#[derive(Default)]
struct Freed {
    by_key: FxHashMap<FreedKey, (Node, Ended)>,
    /// Keys in the order they were freed, with the free's number (an entry whose key was
    /// freed again since is skipped when it comes out).
    order: std::collections::VecDeque<(FreedKey, u64)>,
}

/// What a free gives back: the kind of call and the address (or handle). Host memory has its
/// own addresses, apart from device memory's.
type FreedKey = (InvalidKind, bool, u64);

impl Freed {
    fn key(kind: InvalidKind, ev_ptr: u64, ev_handle: u64, memory: Memory) -> FreedKey {
        match kind {
            InvalidKind::Release => (kind, false, ev_handle),
            _ => (kind, memory == Memory::Host, ev_ptr),
        }
    }

    fn insert(&mut self, key: FreedKey, n: Node, e: Ended) {
        self.by_key.insert(key, (n, e));
        self.order.push_back((key, e.seq));
        while self.order.len() > FREED_KEPT {
            let Some((k, seq)) = self.order.pop_front() else {
                break;
            };
            if self.by_key.get(&k).is_some_and(|(_, e)| e.seq == seq) {
                self.by_key.remove(&k);
            }
        }
    }

    /// Something started again at `key`: frees of it from now on are of the new node.
    fn forget(&mut self, key: FreedKey) {
        self.by_key.remove(&key);
    }
}

/// Live bytes and counts per category after an event.
///
/// Bytes are added up in 128 bits, so that a hostile trace (sizes near `u64::MAX`) can neither
/// wrap them nor make a later free subtract more than was added; what the accessors return
/// saturates at `u64::MAX`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    bytes: [u128; 8],
    count: [u64; 8],
}

/// `v`, or `u64::MAX` when it does not fit.
#[inline]
pub fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

impl Live {
    /// Live bytes of category `c` (saturating at `u64::MAX`).
    pub fn bytes(&self, c: Category) -> u64 {
        saturate(self.bytes[c as usize])
    }

    pub fn count(&self, c: Category) -> u64 {
        self.count[c as usize]
    }

    /// Device memory in use: device + managed allocations and physical handles (saturating at
    /// `u64::MAX`).
    pub fn device_bytes(&self) -> u64 {
        saturate(
            self.bytes[Category::Device as usize]
                + self.bytes[Category::Managed as usize]
                + self.bytes[Category::Handle as usize],
        )
    }

    pub fn device_count(&self) -> u64 {
        self.count[Category::Device as usize]
            + self.count[Category::Managed as usize]
            + self.count[Category::Handle as usize]
    }

    #[inline]
    fn add(&mut self, n: &Node) {
        let i = n.category as usize;
        // At most 2^64 nodes of at most 2^64 - 1 bytes each: 128 bits cannot overflow.
        self.bytes[i] += u128::from(n.size);
        self.count[i] += 1;
    }

    #[inline]
    fn sub(&mut self, n: &Node) {
        let i = n.category as usize;
        // Only nodes that were added are taken away.
        self.bytes[i] -= u128::from(n.size);
        self.count[i] -= 1;
    }
}

/// What an analysis sees of a trace. Every method has an empty default.
///
/// For each event, [`Observer::event`] comes first, then whatever the event ended, then what it
/// started.
/// `live` is always the state after the whole event.
#[allow(unused_variables)]
pub trait Observer {
    /// Once per trace, before any record.
    fn begin(&mut self, header: &Header) {}
    /// Every event, failed ones included.
    fn event(&mut self, ev: &Event, live: &Live) {}
    fn started(&mut self, node: &Node, live: &Live) {}
    fn ended(&mut self, node: &Node, end: &Ended, live: &Live) {}
    fn invalid(&mut self, inv: &Invalid, live: &Live) {}
    /// A successful call gave back something this trace never saw start: memory allocated
    /// before the library was loaded ([`NoteKind::LateLoad`]), or through an entry point that is
    /// not recorded. The driver accepted it, so it was live: not an invalid free, and
    /// [`Observer::invalid`] is not called for it.
    fn earlier(&mut self, inv: &Invalid, live: &Live) {}
    /// Every record that is not an event.
    fn other(&mut self, rec: &Record, live: &Live) {}
    /// Once at the end of the trace, with every node still live, in start order.
    fn finish(&mut self, still_live: &[Node], live: &Live) {}
}

impl Observer for () {}

impl<A: Observer, B: Observer> Observer for (A, B) {
    fn begin(&mut self, h: &Header) {
        self.0.begin(h);
        self.1.begin(h);
    }
    fn event(&mut self, ev: &Event, live: &Live) {
        self.0.event(ev, live);
        self.1.event(ev, live);
    }
    fn started(&mut self, n: &Node, live: &Live) {
        self.0.started(n, live);
        self.1.started(n, live);
    }
    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        self.0.ended(n, e, live);
        self.1.ended(n, e, live);
    }
    fn invalid(&mut self, i: &Invalid, live: &Live) {
        self.0.invalid(i, live);
        self.1.invalid(i, live);
    }
    fn earlier(&mut self, i: &Invalid, live: &Live) {
        self.0.earlier(i, live);
        self.1.earlier(i, live);
    }
    fn other(&mut self, r: &Record, live: &Live) {
        self.0.other(r, live);
        self.1.other(r, live);
    }
    fn finish(&mut self, s: &[Node], live: &Live) {
        self.0.finish(s, live);
        self.1.finish(s, live);
    }
}

impl<O: Observer + ?Sized> Observer for &mut O {
    fn begin(&mut self, h: &Header) {
        (**self).begin(h);
    }
    fn event(&mut self, ev: &Event, live: &Live) {
        (**self).event(ev, live);
    }
    fn started(&mut self, n: &Node, live: &Live) {
        (**self).started(n, live);
    }
    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        (**self).ended(n, e, live);
    }
    fn invalid(&mut self, i: &Invalid, live: &Live) {
        (**self).invalid(i, live);
    }
    fn earlier(&mut self, i: &Invalid, live: &Live) {
        (**self).earlier(i, live);
    }
    fn other(&mut self, r: &Record, live: &Live) {
        (**self).other(r, live);
    }
    fn finish(&mut self, s: &[Node], live: &Live) {
        (**self).finish(s, live);
    }
}

/// The live state of one trace.
#[derive(Default)]
pub struct Tracker {
    next_id: u64,
    /// Device and managed memory.
    dev: FxHashMap<u64, Node>,
    /// Graph memory nodes: their addresses may be shared between graphs, so they are kept apart.
    graph: FxHashMap<u64, Node>,
    host: FxHashMap<u64, Node>,
    registered: FxHashMap<u64, Node>,
    reservations: BTreeMap<u64, Node>,
    handles: FxHashMap<u64, Node>,
    /// References taken to a live handle by `cuMemRetainAllocationHandle` and not yet given
    /// back: a `cuMemRelease` of such a handle gives one back, and the handle lives on (NCCL's
    /// free retains the handle of the range it frees, releases it, unmaps, releases it again).
    retained: Retained,
    mappings: BTreeMap<u64, Node>,
    live: Live,
    scratch: Vec<u64>,
    /// Recent frees, to name the first free of a double free.
    freed: Freed,
    /// Set by a [`NoteKind::LateLoad`] note: from then on, what every node started at is kept
    /// in `seen`, to tell frees of earlier allocations from double frees.
    late: Option<Box<Seen>>,
}

/// Where nodes started, in a trace of a library loaded late (it grows with the distinct
/// addresses of the trace, so it is only kept for such traces).
#[derive(Default)]
struct Seen {
    /// Device, managed and graph memory (a free looks in both maps).
    dev: FxHashSet<u64>,
    host: FxHashSet<u64>,
    registered: FxHashSet<u64>,
    reservations: FxHashSet<u64>,
    handles: FxHashSet<u64>,
    /// Ordered: an unmap covers a range.
    mappings: BTreeSet<u64>,
}

impl Seen {
    fn add(&mut self, n: &Node) {
        match n.category {
            Category::Device | Category::Managed | Category::Graph => {
                self.dev.insert(n.ptr);
            }
            Category::Host => {
                self.host.insert(n.ptr);
            }
            Category::Registered => {
                self.registered.insert(n.ptr);
            }
            Category::Reservation => {
                self.reservations.insert(n.ptr);
            }
            Category::Handle => {
                self.handles.insert(n.handle);
            }
            Category::Mapping => {
                self.mappings.insert(n.ptr);
            }
        }
    }

    /// True when what `ev` gives back started a node of this trace at some point.
    fn has(&self, kind: InvalidKind, ev: &Event) -> bool {
        match kind {
            InvalidKind::Free if ev.api.memory() == Memory::Host => self.host.contains(&ev.ptr),
            InvalidKind::Free => self.dev.contains(&ev.ptr),
            InvalidKind::AddressFree => self.reservations.contains(&ev.ptr),
            InvalidKind::Release => self.handles.contains(&ev.handle),
            InvalidKind::Unregister => self.registered.contains(&ev.ptr),
            InvalidKind::Unmap => {
                let stop = ev.ptr.saturating_add(ev.size.max(1));
                self.mappings.range(ev.ptr..stop).next().is_some()
            }
        }
    }
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn live(&self) -> &Live {
        &self.live
    }

    /// The live physical handle `handle`, if any.
    pub fn handle(&self, handle: u64) -> Option<&Node> {
        self.handles.get(&handle)
    }

    /// True once the trace said the library was loaded late ([`NoteKind::LateLoad`]).
    pub fn late_load(&self) -> bool {
        self.late.is_some()
    }

    /// Feeds one record through the model.
    #[inline]
    pub fn record<O: Observer>(&mut self, rec: &Record, obs: &mut O) {
        match rec {
            Record::Event(ev) => self.event(ev, obs),
            Record::Note(n) if n.kind == NoteKind::LateLoad => {
                self.begin_late();
                obs.other(rec, &self.live);
            }
            other => obs.other(other, &self.live),
        }
    }

    /// The library was loaded late. The note is the trace's first record, but another thread's
    /// first events may come before it: what is live by then counts as seen.
    #[cold]
    fn begin_late(&mut self) {
        if self.late.is_some() {
            return;
        }
        let mut seen = Box::<Seen>::default();
        for n in self.still_live() {
            seen.add(&n);
        }
        self.late = Some(seen);
    }

    /// `ev` gave back something that is not live. It is an invalid free when the driver refused
    /// it, or when the trace saw it given back before (a double free: named with that free);
    /// a call the driver *accepted* for something this trace never saw start gave back memory
    /// allocated where the trace could not see it (before a late load, or through an entry point
    /// that is not recorded, such as the CUDA 3.1 `cuMemAlloc` ABI): not the program's bug.
    #[inline]
    fn not_live<O: Observer>(&self, kind: InvalidKind, ev: &Event, obs: &mut O) {
        let key = Freed::key(kind, ev.ptr, ev.handle, ev.api.memory());
        let previous = match kind {
            InvalidKind::Unmap => None,
            _ => self.freed.by_key.get(&key).copied(),
        };
        let inv = Invalid {
            kind,
            event: *ev,
            previous,
        };
        let seen_before =
            previous.is_some() || self.late.as_ref().is_some_and(|seen| seen.has(kind, ev));
        if ev.ok() && !seen_before {
            obs.earlier(&inv, &self.live)
        } else {
            obs.invalid(&inv, &self.live)
        }
    }

    /// A call that failed: it changed nothing, but one that gives back something that is not
    /// live is the program's bug all the same (a double free the driver refused).
    #[inline]
    fn failed<O: Observer>(&self, kind: Kind, ev: &Event, obs: &mut O) {
        obs.event(ev, &self.live);
        let invalid = match kind {
            Kind::Free if ev.ptr != 0 => {
                let live = match ev.api.memory() {
                    Memory::Host => self.host.contains_key(&ev.ptr),
                    _ => self.dev.contains_key(&ev.ptr) || self.graph.contains_key(&ev.ptr),
                };
                (!live).then_some(InvalidKind::Free)
            }
            Kind::Unregister if ev.ptr != 0 => {
                (!self.registered.contains_key(&ev.ptr)).then_some(InvalidKind::Unregister)
            }
            Kind::AddressFree if ev.ptr != 0 => {
                (!self.reservations.contains_key(&ev.ptr)).then_some(InvalidKind::AddressFree)
            }
            Kind::Release if ev.handle != 0 => {
                (!self.handles.contains_key(&ev.handle)).then_some(InvalidKind::Release)
            }
            _ => None,
        };
        if let Some(k) = invalid {
            self.not_live(k, ev, obs);
        }
    }

    fn node(&mut self, ev: &Event, category: Category) -> Node {
        let id = self.next_id;
        self.next_id += 1;
        Node {
            id,
            category,
            api: ev.api,
            device: ev.device,
            tid: ev.tid,
            ptr: ev.ptr,
            size: ev.size,
            handle: ev.handle,
            offset: ev.offset,
            stream: ev.stream,
            seq: ev.seq,
            ts_ns: ev.ts_ns,
            handle_node: None,
            reservation: None,
            stack: ev.stack,
        }
    }

    /// Feeds one event through the model.
    #[inline]
    pub fn event<O: Observer>(&mut self, ev: &Event, obs: &mut O) {
        let kind = ev.api.kind();
        if kind == Kind::Launch || kind == Kind::SetAccess {
            obs.event(ev, &self.live);
            return;
        }
        if kind == Kind::Retain {
            // A reference to a handle this trace saw made; one to a handle made before it (or
            // never seen) changes nothing the trace can check.
            if ev.ok() && self.handles.contains_key(&ev.handle) {
                self.retained.retain(ev.handle);
            }
            obs.event(ev, &self.live);
            return;
        }
        if kind == Kind::Release && ev.ok() && self.retained.release(ev.handle) {
            // The retained reference went; the handle stays live.
            obs.event(ev, &self.live);
            return;
        }
        if !ev.ok() {
            self.failed(kind, ev, obs);
            return;
        }
        let end = |how| Ended {
            seq: ev.seq,
            ts_ns: ev.ts_ns,
            api: ev.api,
            tid: ev.tid,
            how,
            by: None,
            stack: ev.stack,
        };
        match kind {
            Kind::Alloc => {
                if ev.ptr == 0 {
                    obs.event(ev, &self.live);
                    return;
                }
                let cat = match ev.api.memory() {
                    Memory::Host => Category::Host,
                    Memory::Managed => Category::Managed,
                    Memory::Graph => Category::Graph,
                    _ => Category::Device,
                };
                let n = self.node(ev, cat);
                let map = match cat {
                    Category::Host => &mut self.host,
                    Category::Graph => &mut self.graph,
                    _ => &mut self.dev,
                };
                let old = map.insert(ev.ptr, n);
                self.started_replacing(ev, n, old, obs);
            }
            Kind::Free => {
                if ev.ptr == 0 {
                    obs.event(ev, &self.live);
                    return;
                }
                // Graph memory may also be freed with cudaFree(Async), and a free node may
                // name memory allocated outside the graph: look in the other map second.
                let gone = match ev.api.memory() {
                    Memory::Host => self.host.remove(&ev.ptr),
                    Memory::Graph => self
                        .graph
                        .remove(&ev.ptr)
                        .or_else(|| self.dev.remove(&ev.ptr)),
                    _ => self
                        .dev
                        .remove(&ev.ptr)
                        .or_else(|| self.graph.remove(&ev.ptr)),
                };
                self.finish_removal(ev, gone, InvalidKind::Free, obs);
            }
            Kind::Register => {
                let n = self.node(ev, Category::Registered);
                let old = self.registered.insert(ev.ptr, n);
                self.started_replacing(ev, n, old, obs);
            }
            Kind::Unregister => {
                let gone = self.registered.remove(&ev.ptr);
                self.finish_removal(ev, gone, InvalidKind::Unregister, obs);
            }
            Kind::Reserve => {
                let n = self.node(ev, Category::Reservation);
                let old = self.reservations.insert(ev.ptr, n);
                self.started_replacing(ev, n, old, obs);
            }
            Kind::AddressFree => {
                let gone = self.reservations.remove(&ev.ptr);
                self.finish_removal(ev, gone, InvalidKind::AddressFree, obs);
            }
            Kind::Create => {
                let mut n = self.node(ev, Category::Handle);
                n.ptr = 0;
                let old = self.handles.insert(ev.handle, n);
                self.started_replacing(ev, n, old, obs);
            }
            Kind::Release => {
                let gone = self.handles.remove(&ev.handle);
                self.finish_removal(ev, gone, InvalidKind::Release, obs);
            }
            Kind::Map => {
                let mut n = self.node(ev, Category::Mapping);
                n.handle_node = self.handles.get(&ev.handle).map(|h| h.id);
                n.reservation = self
                    .reservations
                    .range(..=ev.ptr)
                    .next_back()
                    .filter(|(_, r)| r.end() > ev.ptr)
                    .map(|(_, r)| r.id);
                let old = self.mappings.insert(ev.ptr, n);
                self.started_replacing(ev, n, old, obs);
            }
            Kind::Unmap => {
                let stop = ev.ptr.saturating_add(ev.size.max(1));
                self.scratch.clear();
                self.scratch
                    .extend(self.mappings.range(ev.ptr..stop).map(|(&k, _)| k));
                if self.scratch.is_empty() {
                    obs.event(ev, &self.live);
                    self.not_live(InvalidKind::Unmap, ev, obs);
                    return;
                }
                let mut gone = Vec::with_capacity(self.scratch.len());
                for k in &self.scratch {
                    if let Some(n) = self.mappings.remove(k) {
                        self.live.sub(&n);
                        gone.push(n);
                    }
                }
                obs.event(ev, &self.live);
                for n in &gone {
                    obs.ended(n, &end(EndHow::Freed), &self.live);
                }
            }
            Kind::Launch | Kind::SetAccess | Kind::Retain => unreachable!("handled above"),
        }
    }

    #[inline]
    fn started_replacing<O: Observer>(
        &mut self,
        ev: &Event,
        n: Node,
        old: Option<Node>,
        obs: &mut O,
    ) {
        self.live.add(&n);
        if let Some(o) = &old {
            self.live.sub(o);
        }
        if let Some(seen) = &mut self.late {
            seen.add(&n);
        }
        if let Some(k) = free_kind(n.category) {
            self.freed
                .forget(Freed::key(k, n.ptr, n.handle, n.api.memory()));
        }
        obs.event(ev, &self.live);
        // The old node ends first, so that no observer ever sees two live nodes at one key.
        if let Some(o) = old {
            let e = Ended {
                seq: ev.seq,
                ts_ns: ev.ts_ns,
                api: ev.api,
                tid: ev.tid,
                how: EndHow::Lost,
                by: Some(n.id),
                stack: ev.stack,
            };
            obs.ended(&o, &e, &self.live);
        }
        obs.started(&n, &self.live);
    }

    #[inline]
    fn finish_removal<O: Observer>(
        &mut self,
        ev: &Event,
        gone: Option<Node>,
        kind: InvalidKind,
        obs: &mut O,
    ) {
        match gone {
            Some(n) => {
                self.live.sub(&n);
                obs.event(ev, &self.live);
                let e = Ended {
                    seq: ev.seq,
                    ts_ns: ev.ts_ns,
                    api: ev.api,
                    tid: ev.tid,
                    how: EndHow::Freed,
                    by: None,
                    stack: ev.stack,
                };
                self.freed
                    .insert(Freed::key(kind, ev.ptr, ev.handle, ev.api.memory()), n, e);
                obs.ended(&n, &e, &self.live);
            }
            None => {
                obs.event(ev, &self.live);
                self.not_live(kind, ev, obs);
            }
        }
    }

    /// Every node still live, in start order.
    pub fn still_live(&self) -> Vec<Node> {
        let mut v: Vec<Node> = self
            .dev
            .values()
            .chain(self.graph.values())
            .chain(self.host.values())
            .chain(self.registered.values())
            .chain(self.reservations.values())
            .chain(self.handles.values())
            .chain(self.mappings.values())
            .copied()
            .collect();
        v.sort_unstable_by_key(|n| n.id);
        v
    }

    /// Ends the trace: hands every node still live to the observer.
    pub fn finish<O: Observer>(&mut self, obs: &mut O) {
        let v = self.still_live();
        obs.finish(&v, &self.live);
    }
}

/// The kind of call that gives back a node of category `c` (for double-free bookkeeping).
fn free_kind(c: Category) -> Option<InvalidKind> {
    match c {
        Category::Device | Category::Managed | Category::Graph | Category::Host => {
            Some(InvalidKind::Free)
        }
        Category::Registered => Some(InvalidKind::Unregister),
        Category::Reservation => Some(InvalidKind::AddressFree),
        Category::Handle => Some(InvalidKind::Release),
        Category::Mapping => None,
    }
}

//! `isolate export --format memory-viz`: PyTorch's memory snapshot, the pickle that
//! pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` read, written from a trace, so
//! every allocation the trace saw (raw `cudaMalloc`, cuBLAS's driver allocations, NCCL's and
//! expandable segments' `cuMemCreate` handles, stream-ordered allocations) opens in the viewer
//! PyTorch users know.
//!
//! The schema is PyTorch's (`torch.cuda.memory._snapshot()`): a dict with
//!
//! - `segments`: what is live at the end of the trace (the snapshot state), one segment per
//!   allocation, each holding one block: `{device, address, total_size, allocated_size,
//!   active_size, requested_size, stream, segment_type, segment_pool_id, is_expandable, frames,
//!   blocks: [{address, size, requested_size, state: "active_allocated", frames}]}`;
//! - `device_traces`: one list per device, from 0 to the largest device seen, of entries
//!   `{action, addr, size, stream, time_us, frames, compile_context, user_metadata}` in the
//!   order things happened: an allocation is `segment_alloc` + `alloc`, its free
//!   `free_requested` + `free_completed` + `segment_free` (`segment_map`/`segment_unmap` for the
//!   physical handles of the VMM API), and an allocation that failed for lack of memory is
//!   `oom` (with `device_free` = 0 in place of `addr`: the trace does not know it).
//!
//! Device memory is what `isolate summary` counts as device memory (device and managed
//! allocations, `cuMemCreate` handles), so the export's allocations, peak and memory held at the
//! end are the summary's. A handle has no address until it is mapped: it is shown from its
//! `cuMemCreate` to its `cuMemRelease`, at the address of its first mapping (its alloc entry is
//! given that address when the mapping comes), or at the handle's value when it is never mapped.
//!
//! Memory: the segments are what is live; `device_traces` keeps the most recent `max_events`
//! entries (PyTorch's own `max_entries` ring buffer does the same), whole allocations and frees
//! at a time, so memory is bounded by that and by what is live, whatever the trace's length.
//! Call stacks (format version 2) are kept whole and symbolised once each (`crate::stacks`):
//! they grow with the distinct call sites, not with the events.
//!
//! Integers are written as signed 64-bit values, as PyTorch writes them: the web viewer's
//! unpickler turns a longer integer into a `BigInt`, which its arithmetic cannot mix with
//! numbers.

use crate::Error;
use crate::source::{Progress, TraceInfo, analyze};
use crate::stacks::{StackTable, export_frames};
use crate::track::{Category, EndHow, Ended, Live, Node, Observer};
use isolate_trace::{Event, Header, Kind, Memory, Record};
use rustc_hash::FxHashMap;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::rc::Rc;

/// How many trace entries `device_traces` keeps by default (the most recent ones).
pub const DEFAULT_MAX_EVENTS: usize = 1_000_000;

/// The highest device index written: a (corrupt) trace naming a larger one has it counted as
/// this one, so that `device_traces` never holds millions of empty lists.
pub const MAX_DEVICE: u32 = 1023;

/// One frame as PyTorch writes it: `{filename, line, name}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PyFrame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

/// The trace's call stacks (format version 2: `Stack`, `PyCode` and `Module` records), turned
/// into PyTorch's frames by [`Stacks::frames`]. Empty for version-1 traces.
#[derive(Default)]
pub struct Stacks {
    table: StackTable,
    /// Stack id → its frames, symbolised once (the ids the snapshot names: distinct call
    /// sites, not events).
    cache: RefCell<FxHashMap<u32, Rc<[PyFrame]>>>,
}

impl Stacks {
    /// Keeps what `rec` says about stacks; false for records of other kinds.
    pub fn record(&mut self, rec: &Record) -> bool {
        self.table.record(rec)
    }

    /// The frames of stack `id`, innermost first (as PyTorch orders them); empty for 0 (no
    /// stack) and for a stack the trace never described.
    ///
    /// From the analyzer's symbolizer ([`crate::stacks::export_frames`]): Python frames are
    /// `{filename: co_filename, line, name: co_qualname}`; native frames their source file and
    /// line when the module has DWARF, else the module's path and line 0, and their function
    /// (or the `0x…` address when no symbol covers it); `??` outside every module.
    pub fn frames(&self, id: u32) -> Rc<[PyFrame]> {
        if id == 0 {
            return Rc::from(Vec::new());
        }
        if let Some(f) = self.cache.borrow().get(&id) {
            return f.clone();
        }
        let f: Rc<[PyFrame]> = export_frames(&self.table, id)
            .into_iter()
            .map(|(filename, line, name)| PyFrame {
                filename,
                line: i64::from(line),
                name,
            })
            .collect();
        self.cache.borrow_mut().insert(id, f.clone());
        f
    }
}

/// What the export wrote, in the figures `isolate summary` gives for the same trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryVizStats {
    /// Device-memory allocations (device, managed, `cuMemCreate` handles): the summary's
    /// `allocations`.
    pub allocations: u64,
    /// Calls that freed one (not those lost): the summary's `frees`.
    pub frees: u64,
    /// Peak device memory in use: the summary's `peak_live_bytes`.
    pub peak_bytes: u64,
    /// Allocations still held at the end (the snapshot's `segments`): `live_at_end`.
    pub held_at_end: u64,
    pub held_at_end_bytes: u64,
    /// Entries written to `device_traces`, on `devices` lists.
    pub entries: u64,
    pub devices: u32,
    /// Older entries left out to keep `max_events`.
    pub dropped_entries: u64,
    pub max_events: u64,
}

impl MemoryVizStats {
    /// What the export says on standard error: one line, and one more when entries were
    /// dropped.
    pub fn describe(&self) -> Vec<String> {
        use crate::util::human_bytes;
        let mut v = vec![format!(
            "memory-viz: {} allocations, {} freed; peak {} of device memory; held at end: {} allocations ({}); device_traces: {} entries on {} device list{}",
            self.allocations,
            self.frees,
            human_bytes(self.peak_bytes),
            self.held_at_end,
            human_bytes(self.held_at_end_bytes),
            self.entries,
            self.devices,
            if self.devices == 1 { "" } else { "s" }
        )];
        if self.dropped_entries > 0 {
            v.push(format!(
                "memory-viz: {} older entries dropped: device_traces keeps the most recent {} (--max-events); the segments (what is held at the end) are complete",
                self.dropped_entries, self.max_events
            ));
        }
        v
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// `segment_alloc` (`segment_map`) + `alloc`.
    Alloc,
    /// `free_requested` + `free_completed` + `segment_free` (`segment_unmap`).
    Free,
    /// `oom`.
    Oom,
}

impl Action {
    fn entries(self) -> usize {
        match self {
            Action::Alloc => 2,
            Action::Free => 3,
            Action::Oom => 1,
        }
    }
}

/// One allocation, free or failure, as kept for `device_traces`.
#[derive(Clone, Copy, Debug)]
struct Op {
    action: Action,
    /// A physical handle: `segment_map`/`segment_unmap`.
    mapped: bool,
    device: u32,
    addr: u64,
    size: u64,
    stream: u64,
    ts_ns: u64,
    stack: u32,
}

/// A live allocation: where it is shown.
#[derive(Clone, Copy, Debug)]
struct Shown {
    device: u32,
    addr: u64,
    size: u64,
    stream: u64,
    stack: u32,
    expandable: bool,
}

fn device_index(d: i32) -> u32 {
    u32::try_from(d).unwrap_or(0).min(MAX_DEVICE)
}

/// PyTorch's integers are signed 64-bit (see the module's doc).
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

struct MemViz {
    start_ns: u64,
    stacks: Stacks,
    max_events: usize,
    ring: VecDeque<Op>,
    ring_entries: usize,
    /// Number of `ring.front()` among every op pushed.
    first_op: u64,
    dropped_entries: u64,
    max_device: Option<u32>,
    /// The event being handled.
    cur: Event,
    live: FxHashMap<u64, Shown>,
    /// Handle node → number of its alloc op, until its first mapping gives it an address.
    unmapped: FxHashMap<u64, u64>,
    stats: MemoryVizStats,
    /// What is live at the end, in start order.
    end: Vec<Shown>,
}

impl MemViz {
    fn new(max_events: usize) -> Self {
        MemViz {
            start_ns: 0,
            stacks: Stacks::default(),
            max_events,
            ring: VecDeque::new(),
            ring_entries: 0,
            first_op: 0,
            dropped_entries: 0,
            max_device: None,
            cur: Event::default(),
            live: FxHashMap::default(),
            unmapped: FxHashMap::default(),
            stats: MemoryVizStats {
                max_events: max_events as u64,
                ..MemoryVizStats::default()
            },
            end: Vec::new(),
        }
    }

    /// Keeps `op`, dropping the oldest ops past `max_events` entries; returns its number.
    fn push(&mut self, op: Op) -> u64 {
        self.max_device = Some(self.max_device.map_or(op.device, |d| d.max(op.device)));
        let id = self.first_op + self.ring.len() as u64;
        self.ring_entries += op.action.entries();
        self.ring.push_back(op);
        while self.ring_entries > self.max_events {
            let Some(old) = self.ring.pop_front() else {
                break;
            };
            self.first_op += 1;
            self.ring_entries -= old.action.entries();
            self.dropped_entries += old.action.entries() as u64;
        }
        id
    }

    fn time_us(&self, ts_ns: u64) -> i64 {
        int(ts_ns.saturating_sub(self.start_ns) / 1000)
    }
}

impl Observer for MemViz {
    fn begin(&mut self, h: &Header) {
        self.start_ns = h.start_mono_ns;
    }

    fn event(&mut self, ev: &Event, _live: &Live) {
        self.cur = *ev;
        // cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY are both 2.
        let oom = ev.result == 2
            && match ev.api.kind() {
                Kind::Alloc => matches!(ev.api.memory(), Memory::Device | Memory::Managed),
                Kind::Create => true,
                _ => false,
            };
        if oom {
            self.push(Op {
                action: Action::Oom,
                mapped: false,
                device: device_index(ev.device),
                addr: 0,
                size: ev.size,
                stream: ev.stream,
                ts_ns: ev.ts_ns,
                stack: ev.stack,
            });
        }
    }

    fn started(&mut self, n: &Node, live: &Live) {
        if n.category.is_device_memory() {
            let handle = n.category == Category::Handle;
            let shown = Shown {
                device: device_index(n.device),
                addr: if handle { n.handle } else { n.ptr },
                size: n.size,
                stream: n.stream,
                stack: self.cur.stack,
                expandable: handle,
            };
            let id = self.push(Op {
                action: Action::Alloc,
                mapped: handle,
                device: shown.device,
                addr: shown.addr,
                size: shown.size,
                stream: shown.stream,
                ts_ns: n.ts_ns,
                stack: shown.stack,
            });
            if handle {
                self.unmapped.insert(n.id, id);
            }
            self.live.insert(n.id, shown);
            self.stats.allocations += 1;
            self.stats.peak_bytes = self.stats.peak_bytes.max(live.device_bytes());
        } else if n.category == Category::Mapping {
            // A handle's first mapping gives it its address.
            let Some(h) = n.handle_node else { return };
            let Some(id) = self.unmapped.remove(&h) else {
                return;
            };
            if let Some(s) = self.live.get_mut(&h) {
                s.addr = n.ptr;
            }
            if let Some(i) = id.checked_sub(self.first_op)
                && let Some(op) = self.ring.get_mut(i as usize)
            {
                op.addr = n.ptr;
            }
        }
    }

    fn ended(&mut self, n: &Node, e: &Ended, _live: &Live) {
        let Some(s) = self.live.remove(&n.id) else {
            return;
        };
        self.unmapped.remove(&n.id);
        let freed = e.how == EndHow::Freed;
        if freed {
            self.stats.frees += 1;
        }
        self.push(Op {
            action: Action::Free,
            mapped: s.expandable,
            device: s.device,
            addr: s.addr,
            size: s.size,
            stream: s.stream,
            ts_ns: e.ts_ns,
            // A lost allocation's free was never seen: no stack.
            stack: if freed { self.cur.stack } else { 0 },
        });
    }

    fn other(&mut self, rec: &Record, _live: &Live) {
        self.stacks.record(rec);
    }

    fn finish(&mut self, still: &[Node], _live: &Live) {
        for n in still {
            if let Some(s) = self.live.get(&n.id) {
                self.end.push(*s);
                self.stats.held_at_end += 1;
                self.stats.held_at_end_bytes = self.stats.held_at_end_bytes.saturating_add(s.size);
            }
        }
        for s in &self.end {
            self.max_device = Some(self.max_device.map_or(s.device, |d| d.max(s.device)));
        }
        self.stats.dropped_entries = self.dropped_entries;
        self.stats.entries = self.ring_entries as u64;
        self.stats.devices = self.max_device.map_or(0, |d| d + 1);
    }
}

// The snapshot, serialized straight from the model's state.

struct Snapshot<'a>(&'a MemViz);
struct Frames<'a>(&'a Stacks, u32);
struct Segments<'a>(&'a MemViz);
struct Seg<'a>(&'a MemViz, &'a Shown);
struct Blocks<'a>(&'a MemViz, &'a Shown);
struct Traces<'a>(&'a MemViz);
struct DeviceTrace<'a>(&'a MemViz, u32);
struct Entry<'a>(&'a MemViz, &'a Op, &'static str);

impl Serialize for Frames<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.1 == 0 {
            return s.serialize_seq(Some(0))?.end();
        }
        let frames = self.0.frames(self.1);
        let mut seq = s.serialize_seq(Some(frames.len()))?;
        for f in frames.iter() {
            seq.serialize_element(f)?;
        }
        seq.end()
    }
}

impl Serialize for Snapshot<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("segments", &Segments(self.0))?;
        m.serialize_entry("device_traces", &Traces(self.0))?;
        m.end()
    }
}

impl Serialize for Segments<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.end.len()))?;
        for sh in &self.0.end {
            seq.serialize_element(&Seg(self.0, sh))?;
        }
        seq.end()
    }
}

impl Serialize for Seg<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (mv, sh) = (self.0, self.1);
        let size = int(sh.size);
        let mut m = s.serialize_map(Some(12))?;
        m.serialize_entry("device", &i64::from(sh.device))?;
        m.serialize_entry("address", &int(sh.addr))?;
        m.serialize_entry("total_size", &size)?;
        m.serialize_entry("allocated_size", &size)?;
        m.serialize_entry("active_size", &size)?;
        m.serialize_entry("requested_size", &size)?;
        m.serialize_entry("stream", &int(sh.stream))?;
        // PyTorch's large pool holds blocks over 1 MiB.
        m.serialize_entry(
            "segment_type",
            if sh.size > 1 << 20 { "large" } else { "small" },
        )?;
        m.serialize_entry("segment_pool_id", &(0i64, 0i64))?;
        m.serialize_entry("is_expandable", &sh.expandable)?;
        m.serialize_entry("frames", &Frames(&mv.stacks, sh.stack))?;
        m.serialize_entry("blocks", &Blocks(mv, sh))?;
        m.end()
    }
}

impl Serialize for Blocks<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Block<'a>(&'a MemViz, &'a Shown);
        impl Serialize for Block<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(5))?;
                m.serialize_entry("address", &int(self.1.addr))?;
                m.serialize_entry("size", &int(self.1.size))?;
                m.serialize_entry("requested_size", &int(self.1.size))?;
                m.serialize_entry("state", "active_allocated")?;
                m.serialize_entry("frames", &Frames(&self.0.stacks, self.1.stack))?;
                m.end()
            }
        }
        let mut seq = s.serialize_seq(Some(1))?;
        seq.serialize_element(&Block(self.0, self.1))?;
        seq.end()
    }
}

impl Serialize for Traces<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = self.0.max_device.map_or(0, |d| d + 1);
        let mut seq = s.serialize_seq(Some(n as usize))?;
        for d in 0..n {
            seq.serialize_element(&DeviceTrace(self.0, d))?;
        }
        seq.end()
    }
}

impl Serialize for DeviceTrace<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mv = self.0;
        let mut seq = s.serialize_seq(None)?;
        for op in mv.ring.iter().filter(|op| op.device == self.1) {
            let actions: &[&'static str] = match (op.action, op.mapped) {
                (Action::Alloc, false) => &["segment_alloc", "alloc"],
                (Action::Alloc, true) => &["segment_map", "alloc"],
                (Action::Free, false) => &["free_requested", "free_completed", "segment_free"],
                (Action::Free, true) => &["free_requested", "free_completed", "segment_unmap"],
                (Action::Oom, _) => &["oom"],
            };
            for a in actions {
                seq.serialize_element(&Entry(mv, op, a))?;
            }
        }
        seq.end()
    }
}

impl Serialize for Entry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (mv, op) = (self.0, self.1);
        let mut m = s.serialize_map(Some(8))?;
        m.serialize_entry("action", self.2)?;
        if op.action == Action::Oom {
            // Unknown: the trace does not record the device's free memory.
            m.serialize_entry("device_free", &0i64)?;
        } else {
            m.serialize_entry("addr", &int(op.addr))?;
        }
        m.serialize_entry("size", &int(op.size))?;
        m.serialize_entry("stream", &int(op.stream))?;
        m.serialize_entry("time_us", &mv.time_us(op.ts_ns))?;
        m.serialize_entry("frames", &Frames(&mv.stacks, op.stack))?;
        m.serialize_entry("compile_context", "")?;
        m.serialize_entry("user_metadata", "")?;
        m.end()
    }
}

/// Writes PyTorch's memory snapshot of the trace at `path` to `out` (a pickle, protocol 3),
/// keeping the most recent `max_events` entries of `device_traces`.
pub fn memory_viz<W: Write>(
    path: &Path,
    out: &mut W,
    max_events: usize,
    progress: &mut dyn Progress,
) -> Result<(TraceInfo, MemoryVizStats), Error> {
    let mut mv = MemViz::new(max_events);
    let info = analyze(path, progress, &mut mv)?;
    serde_pickle::to_writer(out, &Snapshot(&mv), serde_pickle::SerOptions::new()).map_err(|e| {
        match e {
            serde_pickle::Error::Io(e) => Error::io(None, e),
            e => Error::io(None, std::io::Error::other(e.to_string())),
        }
    })?;
    out.flush().map_err(|e| Error::io(None, e))?;
    Ok((info, mv.stats))
}

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
use crate::finding::{Fault, Finding, Renders, Streamed, Tally};
use crate::source::{Progress, TraceInfo, analyze};
use crate::stacks::{StackTable, export_frames};
use crate::track::{Category, EndHow, Ended, Live, Node, Observer};
use isolate_trace::{Event, Header, Kind as ApiKind, Memory, Record};
use rustc_hash::FxHashMap;
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
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
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
    /// The trace's findings, every one counted: PyTorch's snapshot has no place for them, so
    /// the export names them on standard error.
    #[serde(skip)]
    pub findings: Tally,
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
        if self.findings.total() > 0 {
            v.push(format!(
                "memory-viz: not in the snapshot (its format has no place for findings): {}; `isolate summary` tells them",
                self.findings.kinds(|_| true)
            ));
        }
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

impl Renders for MemViz {
    /// Counted for the line on standard error: the snapshot's schema (segments, blocks, trace
    /// entries of allocations and frees) has no entry for any kind of finding.
    fn finding(&mut self, f: Finding<'_>, _live: &Live) {
        match f {
            Finding::StaleWrite(_)
            | Finding::StaleLaunch(_)
            | Finding::UnorderedFree(_)
            | Finding::InvalidFree(_)
            | Finding::DoubleFree(_)
            | Finding::DeviceFault(Fault::Noted(_) | Fault::Returned(_)) => {}
            Finding::Leak(l) => {
                self.stats.findings.leak_bytes = self
                    .stats
                    .findings
                    .leak_bytes
                    .saturating_add(l.bytes_per_step)
            }
        }
        self.stats.findings.count(f.kind());
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
                ApiKind::Alloc => matches!(ev.api.memory(), Memory::Device | Memory::Managed),
                ApiKind::Create => true,
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

// The snapshot, written straight from the model's state by a pickler with Python's memo.

/// Python's pickle, protocol 4, as much of it as the snapshot needs, written by hand for its
/// **memo**: every string (the dicts' keys, the actions, file and function names) is written
/// once and named by its memo index after that (`BINGET`, 2 bytes while the index is below 256,
/// `LONG_BINGET`, 5 bytes, beyond), every distinct frame dict once, and every stack's frames
/// list once: an entry's `frames` is one `BINGET` of its stack's list. PyTorch's own snapshot is
/// shared the same way (its pickler memoizes strings, and `ivalue_symbolize` makes one dict per
/// distinct frame and one list per distinct traceback), so the file grows with the distinct
/// frames and stacks, not with allocations × depth. serde-pickle has no memo: with it, 10
/// GPT-2 steps (8,607 allocations, every entry's frames written in full) made 248 MB.
///
/// The strings of [`VOCAB`] (keys and actions, in every entry) have the memo's first indices,
/// whenever they are first written, so that naming them takes 2 bytes however many frames
/// come before: objects are memoized with `BINPUT`/`LONG_BINPUT` at indices chosen here, not
/// with `MEMOIZE` (whose index is the memo's size, which reserved indices would upset).
///
/// `pickle.load` gives back one list object per stack (entries of one stack share it), as it
/// does for PyTorch's snapshot; `pickle.dumps` of it (what `_memory_viz trace_plot` embeds in
/// its page) keeps the sharing. The opcodes are among those the web viewer's unpickler reads
/// (MemoryViz.js: `BINPUT`, `LONG_BINPUT`, `BINGET`, `LONG_BINGET`, `SHORT_BINUNICODE`, …).
struct Pickler<'a, W: Write> {
    out: &'a mut W,
    /// The next memo index for an object not in [`VOCAB`].
    memo: u32,
    strings: FxHashMap<Box<str>, u32>,
    /// Frame `(filename, line, name)` → the memo index of its dict.
    frames: FxHashMap<PyFrame, u32>,
    /// Stack id → the memo index of its frames list.
    stacks: FxHashMap<u32, u32>,
}

/// The strings every snapshot repeats: memo indices 0 to `VOCAB.len() - 1` are theirs.
const VOCAB: [&str; 40] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "compile_context",
    "user_metadata",
    "",
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "device_free",
    "filename",
    "line",
    "name",
    "segments",
    "device_traces",
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "blocks",
    "state",
    "active_allocated",
    "small",
    "large",
    "??",
    "<module>",
    "forward",
];

/// Items per `MARK … APPENDS`/`SETITEMS` batch, as Python's pickler batches them.
const BATCH: usize = 1000;

mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const EMPTY_DICT: u8 = b'}';
    pub const EMPTY_LIST: u8 = b']';
    pub const SETITEMS: u8 = b'u';
    pub const APPENDS: u8 = b'e';
    pub const TUPLE2: u8 = 0x86;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const BININT: u8 = b'J';
    pub const LONG1: u8 = 0x8a;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
}

impl<'a, W: Write> Pickler<'a, W> {
    fn new(out: &'a mut W) -> Self {
        Pickler {
            out,
            memo: VOCAB.len() as u32,
            strings: FxHashMap::default(),
            frames: FxHashMap::default(),
            stacks: FxHashMap::default(),
        }
    }

    fn op(&mut self, b: u8) -> std::io::Result<()> {
        self.out.write_all(&[b])
    }

    /// A memo opcode with index `i`: its one-byte form (`short`) where `i` fits a byte, else
    /// its four-byte form (`long`).
    fn memo_op(&mut self, short: u8, long: u8, i: u32) -> std::io::Result<()> {
        match u8::try_from(i) {
            Ok(b) => self.out.write_all(&[short, b]),
            Err(_) => {
                self.op(long)?;
                self.out.write_all(&i.to_le_bytes())
            }
        }
    }

    /// Memoizes the object on top of the stack at index `i`.
    fn put(&mut self, i: u32) -> std::io::Result<()> {
        self.memo_op(op::BINPUT, op::LONG_BINPUT, i)
    }

    /// Memoizes the object on top of the stack at the next free index; returns it.
    fn memoize(&mut self) -> std::io::Result<u32> {
        let i = self.memo;
        self.memo += 1;
        self.put(i)?;
        Ok(i)
    }

    /// Pushes the object memoized at index `i`.
    fn get(&mut self, i: u32) -> std::io::Result<()> {
        self.memo_op(op::BINGET, op::LONG_BINGET, i)
    }

    fn str(&mut self, s: &str) -> std::io::Result<()> {
        if let Some(&i) = self.strings.get(s) {
            return self.get(i);
        }
        match u8::try_from(s.len()) {
            Ok(n) => self.out.write_all(&[op::SHORT_BINUNICODE, n])?,
            Err(_) => {
                self.op(op::BINUNICODE)?;
                // A string over 4 GiB cannot come from a trace (its records are smaller).
                let n = u32::try_from(s.len()).unwrap_or(u32::MAX);
                self.out.write_all(&n.to_le_bytes())?;
            }
        }
        self.out.write_all(s.as_bytes())?;
        let i = match VOCAB.iter().position(|v| *v == s) {
            Some(v) => {
                self.put(v as u32)?;
                v as u32
            }
            None => self.memoize()?,
        };
        self.strings.insert(s.into(), i);
        Ok(())
    }

    /// A signed 64-bit integer, in the fewest bytes Python would use.
    fn int(&mut self, v: i64) -> std::io::Result<()> {
        if let Ok(b) = u8::try_from(v) {
            self.out.write_all(&[op::BININT1, b])
        } else if let Ok(h) = u16::try_from(v) {
            self.op(op::BININT2)?;
            self.out.write_all(&h.to_le_bytes())
        } else if let Ok(w) = i32::try_from(v) {
            self.op(op::BININT)?;
            self.out.write_all(&w.to_le_bytes())
        } else {
            // LONG1: little-endian two's complement, without the sign's extra bytes.
            let b = v.to_le_bytes();
            let mut n = 8;
            while n > 1
                && ((b[n - 1] == 0 && b[n - 2] & 0x80 == 0)
                    || (b[n - 1] == 0xff && b[n - 2] & 0x80 != 0))
            {
                n -= 1;
            }
            self.out.write_all(&[op::LONG1, n as u8])?;
            self.out.write_all(&b[..n])
        }
    }

    fn bool(&mut self, v: bool) -> std::io::Result<()> {
        self.op(if v { op::NEWTRUE } else { op::NEWFALSE })
    }

    /// `(key, value)` pairs of a dict already on the stack: `MARK … SETITEMS`.
    fn items(&mut self, f: impl FnOnce(&mut Self) -> std::io::Result<()>) -> std::io::Result<()> {
        self.op(op::MARK)?;
        f(self)?;
        self.op(op::SETITEMS)
    }

    /// Stack `id`'s frames: `[]` for none, else its list, written the first time and named by
    /// its memo index after that.
    fn frames(&mut self, stacks: &Stacks, id: u32) -> std::io::Result<()> {
        if id == 0 {
            return self.op(op::EMPTY_LIST);
        }
        if let Some(&i) = self.stacks.get(&id) {
            return self.get(i);
        }
        let frames = stacks.frames(id);
        self.list(frames.iter(), |p, f| p.frame(f))?;
        if frames.is_empty() {
            // A stack with no frames: an empty list of its own, as for no stack.
            return Ok(());
        }
        let i = self.memoize()?;
        self.stacks.insert(id, i);
        Ok(())
    }

    /// One frame: `{filename, line, name}`, written the first time and named after that.
    fn frame(&mut self, f: &PyFrame) -> std::io::Result<()> {
        if let Some(&i) = self.frames.get(f) {
            return self.get(i);
        }
        self.op(op::EMPTY_DICT)?;
        self.items(|p| {
            p.str("filename")?;
            p.str(&f.filename)?;
            p.str("line")?;
            p.int(f.line)?;
            p.str("name")?;
            p.str(&f.name)
        })?;
        let i = self.memoize()?;
        self.frames.insert(f.clone(), i);
        Ok(())
    }

    /// A list of `items`, each written by `one`, in batches.
    fn list<T>(
        &mut self,
        items: impl Iterator<Item = T>,
        mut one: impl FnMut(&mut Self, T) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.op(op::EMPTY_LIST)?;
        let mut items = items.peekable();
        while items.peek().is_some() {
            self.op(op::MARK)?;
            for x in items.by_ref().take(BATCH) {
                one(self, x)?;
            }
            self.op(op::APPENDS)?;
        }
        Ok(())
    }

    fn snapshot(&mut self, mv: &MemViz) -> std::io::Result<()> {
        self.out.write_all(&[op::PROTO, 4])?;
        self.op(op::EMPTY_DICT)?;
        self.items(|p| {
            p.str("segments")?;
            p.list(mv.end.iter(), |p, sh| p.segment(mv, sh))?;
            p.str("device_traces")?;
            let n = mv.max_device.map_or(0, |d| d + 1);
            p.list(0..n, |p, d| {
                p.list(
                    mv.ring.iter().filter(|op| op.device == d),
                    |p, op| -> std::io::Result<()> {
                        for a in op_actions(op) {
                            p.entry(mv, op, a)?;
                        }
                        Ok(())
                    },
                )
            })
        })?;
        self.op(op::STOP)
    }

    fn segment(&mut self, mv: &MemViz, sh: &Shown) -> std::io::Result<()> {
        let size = int(sh.size);
        self.op(op::EMPTY_DICT)?;
        self.items(|p| {
            p.str("device")?;
            p.int(i64::from(sh.device))?;
            p.str("address")?;
            p.int(int(sh.addr))?;
            for k in [
                "total_size",
                "allocated_size",
                "active_size",
                "requested_size",
            ] {
                p.str(k)?;
                p.int(size)?;
            }
            p.str("stream")?;
            p.int(int(sh.stream))?;
            p.str("segment_type")?;
            // PyTorch's large pool holds blocks over 1 MiB.
            p.str(if sh.size > 1 << 20 { "large" } else { "small" })?;
            p.str("segment_pool_id")?;
            p.int(0)?;
            p.int(0)?;
            p.op(op::TUPLE2)?;
            p.str("is_expandable")?;
            p.bool(sh.expandable)?;
            p.str("frames")?;
            p.frames(&mv.stacks, sh.stack)?;
            p.str("blocks")?;
            p.list(std::iter::once(sh), |p, sh| {
                p.op(op::EMPTY_DICT)?;
                p.items(|p| {
                    p.str("address")?;
                    p.int(int(sh.addr))?;
                    p.str("size")?;
                    p.int(size)?;
                    p.str("requested_size")?;
                    p.int(size)?;
                    p.str("state")?;
                    p.str("active_allocated")?;
                    p.str("frames")?;
                    p.frames(&mv.stacks, sh.stack)
                })
            })
        })
    }

    fn entry(&mut self, mv: &MemViz, op: &Op, action: &str) -> std::io::Result<()> {
        self.op(op::EMPTY_DICT)?;
        self.items(|p| {
            p.str("action")?;
            p.str(action)?;
            if op.action == Action::Oom {
                // Unknown: the trace does not record the device's free memory.
                p.str("device_free")?;
                p.int(0)?;
            } else {
                p.str("addr")?;
                p.int(int(op.addr))?;
            }
            p.str("size")?;
            p.int(int(op.size))?;
            p.str("stream")?;
            p.int(int(op.stream))?;
            p.str("time_us")?;
            p.int(mv.time_us(op.ts_ns))?;
            p.str("frames")?;
            p.frames(&mv.stacks, op.stack)?;
            p.str("compile_context")?;
            p.str("")?;
            p.str("user_metadata")?;
            p.str("")
        })
    }
}

/// The `device_traces` actions an op is.
fn op_actions(op: &Op) -> &'static [&'static str] {
    match (op.action, op.mapped) {
        (Action::Alloc, false) => &["segment_alloc", "alloc"],
        (Action::Alloc, true) => &["segment_map", "alloc"],
        (Action::Free, false) => &["free_requested", "free_completed", "segment_free"],
        (Action::Free, true) => &["free_requested", "free_completed", "segment_unmap"],
        (Action::Oom, _) => &["oom"],
    }
}

/// Writes PyTorch's memory snapshot of the trace at `path` to `out` (a pickle, protocol 4, with the memo: see [`Pickler`]),
/// keeping the most recent `max_events` entries of `device_traces`.
pub fn memory_viz<W: Write>(
    path: &Path,
    out: &mut W,
    max_events: usize,
    progress: &mut dyn Progress,
) -> Result<(TraceInfo, MemoryVizStats), Error> {
    let mut st = Streamed::new(0, MemViz::new(max_events));
    let info = analyze(path, progress, &mut st)?;
    let mv = st.out;
    Pickler::new(out)
        .snapshot(&mv)
        .map_err(|e| Error::io(None, e))?;
    out.flush().map_err(|e| Error::io(None, e))?;
    Ok((info, mv.stats))
}

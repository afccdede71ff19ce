//! `isolate summary`: what a run called, allocated, leaked and broke, in one streaming pass.
//!
//! Memory is bounded by what is live at once plus a few capped lists ([`LIST_CAP`] entries of
//! violations, stale launches and invalid frees; their full counts are kept beside them).

use crate::Error;
use crate::source::{Progress, TraceInfo, analyze};
use crate::track::{Category, EndHow, Ended, Invalid, Live, Node, Observer};
use crate::util::{hex, human_bytes, human_ns, ser_hex};
use isolate_trace::{Api, EndReason, Event, Header, NoteKind, Record};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Lists (violations, stale launches, invalid frees) keep at most this many entries.
pub const LIST_CAP: usize = 10_000;
/// How many of the last events a summary keeps.
pub const LAST_EVENTS: usize = 16;

const N_API: usize = Api::ALL.len();

/// Count and bytes of what is live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CountBytes {
    pub count: u64,
    pub bytes: u64,
}

impl CountBytes {
    fn add(&mut self, o: CountBytes) {
        self.count += o.count;
        self.bytes += o.bytes;
    }
}

/// One category of memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CategoryStats {
    /// Nodes started (allocations, reservations, handles created, mappings made).
    pub started: u64,
    /// Nodes ended by a call.
    pub ended: u64,
    /// Bytes handed out over the whole run.
    pub bytes_started: u64,
    pub peak_live_bytes: u64,
    pub live_at_end: CountBytes,
}

/// One device ordinal of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    pub allocations: u64,
    pub frees: u64,
    /// Peak of device + managed + physical handle bytes on this device.
    pub peak_live_bytes: u64,
    pub live_at_end: CountBytes,
}

/// A stale write found in quarantine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoisonViolation {
    pub trace: usize,
    pub seq: u64,
    pub ts_ns: u64,
    pub device: i32,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    pub size: u64,
    pub first_offset: u64,
    pub changed_bytes: u64,
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub freed_at_ns: u64,
    pub free_api: String,
}

/// Where a stale launch's pointer led: the allocation and its free.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreedAt {
    pub seq: u64,
    pub ts_ns: u64,
}

/// A kernel launched with a pointer into freed memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StaleLaunchEntry {
    pub trace: usize,
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    pub kernel: String,
    pub param_index: u32,
    pub param_offset: u32,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    /// The `alloc_seq` of the freed allocation.
    pub allocation: u64,
    #[serde(serialize_with = "ser_hex")]
    pub alloc_ptr: u64,
    pub alloc_size: u64,
    pub freed_at: FreedAt,
    /// Guard mode: the pointer led into unmapped memory and a device fault followed (its error
    /// code); null for a pointer into quarantine (found by the launch check alone).
    pub fault: Option<u64>,
}

/// A device fault that a call the library saw returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceFault {
    pub trace: usize,
    pub seq: u64,
    pub ts_ns: u64,
    /// The CUDA error code (700: illegal address, 719: launch failure, …).
    pub code: u64,
    /// Launches named as suspects: guarded stale values launched since the last device-wide
    /// synchronisation seen to succeed (they follow as stale launches with `fault` set).
    pub suspects: u64,
}

/// A successful call that gave back something that was not live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InvalidFree {
    pub trace: usize,
    /// `free`, `address_free`, `release`, `unmap` or `unregister`.
    pub kind: String,
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    #[serde(serialize_with = "ser_hex")]
    pub handle: u64,
    /// What the call returned: a refused free (non-zero) is listed too.
    pub result: i32,
    /// True when what it gave back had already been given back (a double free); `first_free`
    /// names that earlier call and `allocated` the call that made it.
    pub double_free: bool,
    pub first_free: Option<CallRef>,
    pub allocated: Option<CallRef>,
}

/// One call of a trace, as findings name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallRef {
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub api: String,
}

/// How the trace's file order compared with sequence order (analyses use sequence order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sequence {
    /// Records that were not in sequence order in the file (normal with several threads).
    pub reordered: u64,
    /// Sequence numbers never seen: a thread took one and never recorded its call (it was
    /// inside a call when the process ended or died). Nothing is inferred from a gap.
    pub gaps: u64,
    /// Records that arrived too far out of order to be put back in place (more than the
    /// reordering window); findings about them may be off.
    pub late: u64,
}

/// One recent event, for the moments before a fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventEntry {
    pub trace: usize,
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: String,
    pub result: i32,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    pub size: u64,
    #[serde(serialize_with = "ser_hex")]
    pub stream: u64,
    #[serde(serialize_with = "ser_hex")]
    pub handle: u64,
}

impl EventEntry {
    fn new(trace: usize, e: &Event) -> Self {
        EventEntry {
            trace,
            seq: e.seq,
            ts_ns: e.ts_ns,
            tid: e.tid,
            device: e.device,
            api: e.api.name().into(),
            result: e.result,
            ptr: e.ptr,
            size: e.size,
            stream: e.stream,
            handle: e.handle,
        }
    }
}

/// What the quarantine did (from the library's Stats and End records and its notes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Quarantine {
    pub peak_bytes: u64,
    pub releases: u64,
    pub early_releases: u64,
    /// Allocations retried after releasing quarantine (OomRetry notes).
    pub oom_retries: u64,
}

/// Host memory, kept apart from device memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostStats {
    pub allocations: u64,
    pub frees: u64,
    pub peak_live_bytes: u64,
    pub live_at_end: CountBytes,
    /// `cudaHostRegister`ed memory still registered at the end.
    pub registered_at_end: CountBytes,
}

/// The writer's own counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriterStats {
    /// Events the hooks accepted (from the last Stats/End record), to compare with `events`.
    pub events_accepted: u64,
    pub queue_waits: u64,
    pub queue_wait_ns: u64,
}

/// The header of a trace, as the summary shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeaderInfo {
    pub pid: u32,
    pub ppid: u32,
    pub exe: String,
    pub argv: Vec<String>,
    pub hostname: String,
    pub mode: String,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub library_version: String,
    pub start_unix_ns: u64,
    pub format_version: u32,
    pub config: BTreeMap<String, String>,
}

impl HeaderInfo {
    pub fn new(h: &Header, format_version: u32) -> Self {
        HeaderInfo {
            pid: h.pid,
            ppid: h.ppid,
            exe: h.exe.clone(),
            argv: h.argv.clone(),
            hostname: h.hostname.clone(),
            mode: h.mode.clone(),
            rank: h.rank,
            local_rank: h.local_rank,
            world_size: h.world_size,
            library_version: h.library_version.clone(),
            start_unix_ns: h.start_unix_ns,
            format_version,
            config: h.config.iter().cloned().collect(),
        }
    }
}

/// The figures of one trace, or of several added up (see [`Summary`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// API name → calls, failed ones included.
    pub calls: BTreeMap<String, u64>,
    /// API name → failed calls.
    pub failed: BTreeMap<String, u64>,
    /// Event records read.
    pub events: u64,
    /// Device memory allocations: successful device and managed allocations and physical
    /// handles created (`cuMemCreate`), the same things `peak_live_bytes` and `live_at_end`
    /// count. Pinned host memory is in [`Totals::host`], graph memory, reservations and
    /// mappings are in [`Totals::categories`].
    pub allocations: u64,
    /// Calls that ended one of those (frees, `cuMemRelease`).
    pub frees: u64,
    /// Peak device memory in use: device + managed allocations + physical handles. For several
    /// traces, the sum of their peaks.
    pub peak_live_bytes: u64,
    /// Device memory still held at the end: of [`Totals::allocations`], those neither freed nor
    /// lost (`allocations = frees + lost device memory + live_at_end.count`).
    pub live_at_end: CountBytes,
    pub invalid_free_count: u64,
    /// Of those, frees of something already freed (double frees).
    pub double_free_count: u64,
    /// The first [`LIST_CAP`] invalid frees.
    pub invalid_frees: Vec<InvalidFree>,
    /// Frees, unmaps, releases, … that the driver accepted, of something the trace never saw
    /// allocated: made before a late load (a `late_load` note), through a call bound before
    /// it, or through an entry point that is not recorded (the CUDA 3.1 `cuMemAlloc` ABI). The
    /// driver's success says the memory was live: not invalid frees.
    pub frees_of_earlier_allocations: u64,
    /// Live allocations whose start address was handed out again: their free was not seen.
    pub lost: u64,
    pub poison_violation_count: u64,
    pub poison_violations: Vec<PoisonViolation>,
    pub stale_launch_count: u64,
    /// Kernels that got a pointer into freed memory and used it: a pointer into quarantine,
    /// or (guard mode) into unmapped memory with a device fault after the launch.
    pub stale_launches: Vec<StaleLaunchEntry>,
    /// Guard mode: pointers into freed, unmapped memory that kernels received but, as no fault
    /// followed, never dereferenced (stale fields a kernel ignores). Not errors.
    pub stale_value_count: u64,
    pub stale_values: Vec<StaleLaunchEntry>,
    pub device_faults: Vec<DeviceFault>,
    pub quarantine: Quarantine,
    pub host: HostStats,
    /// Category name → its figures (device, managed, graph, host, registered, reservation,
    /// handle, mapping).
    pub categories: BTreeMap<String, CategoryStats>,
    /// Note kind → how many notes of it.
    pub notes: BTreeMap<String, u64>,
    pub writer: WriterStats,
    /// The last events (of all traces, by time).
    pub last_events: Vec<EventEntry>,
    /// Null, or the byte offset where the (first truncated) trace ends inside a record.
    pub truncated: Option<u64>,
    /// True when every trace ends with an End record.
    pub complete: bool,
    pub sequence: Sequence,
}

/// One trace's summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceSummary {
    /// The file name (no directories, so outputs compare across machines).
    pub file: String,
    pub header: HeaderInfo,
    /// `exit`, `signal N`, `exec`, or null when the trace has no End record.
    pub end_reason: Option<String>,
    /// The fatal signal a Signal note or the End record names.
    pub signal: Option<u64>,
    pub first_ts_ns: Option<u64>,
    pub last_ts_ns: Option<u64>,
    /// Device ordinal → its figures.
    pub devices: BTreeMap<String, DeviceStats>,
    #[serde(flatten)]
    pub totals: Totals,
}

/// The summary of one or more traces: the totals, and each trace on its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    #[serde(flatten)]
    pub totals: Totals,
    pub traces: Vec<TraceSummary>,
}

impl std::ops::Deref for Summary {
    type Target = Totals;
    fn deref(&self) -> &Totals {
        &self.totals
    }
}

/// The observer that builds one [`TraceSummary`].
pub struct Summarizer {
    trace: usize,
    calls: [u64; N_API],
    failed: [u64; N_API],
    events: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    peak: u64,
    cats: [CategoryStats; 8],
    devices: Vec<(i32, DeviceStats, u64)>,
    invalid_count: u64,
    double_count: u64,
    invalid: Vec<InvalidFree>,
    earlier: u64,
    lost: u64,
    violation_count: u64,
    violations: Vec<PoisonViolation>,
    stale_count: u64,
    stale: Vec<StaleLaunchEntry>,
    /// Guarded stale values not (yet) followed by a fault, most recent last, at most
    /// [`PENDING_CAP`].
    pending_values: std::collections::VecDeque<StaleLaunchEntry>,
    value_count: u64,
    faults: Vec<DeviceFault>,
    /// Stale-launch records still to come that name the suspects of the last fault.
    suspects_due: u64,
    quarantine: Quarantine,
    notes: [u64; N_NOTES],
    note_releases: u64,
    note_early: u64,
    writer: WriterStats,
    signal: Option<u64>,
    end_reason: Option<String>,
    ring: [Event; LAST_EVENTS],
    ring_len: usize,
    header: Header,
    live_end: Live,
}

/// What the top-level `allocations`, `frees`, `peak_live_bytes` and `live_at_end` count:
/// device memory (the categories of [`Category::is_device_memory`]).
pub const DEVICE_MEMORY: [Category; 3] = [Category::Device, Category::Managed, Category::Handle];

/// Guarded stale values kept waiting for a fault that would make them stale launches.
const PENDING_CAP: usize = 4096;

const N_NOTES: usize = 11;

const NOTE_NAMES: [&str; N_NOTES] = [
    "info",
    "quarantine_release",
    "quarantine_early_release",
    "oom_retry",
    "guard_recycle",
    "writer_error",
    "signal",
    "fork",
    "exec",
    "device_fault",
    "late_load",
];

fn note_index(k: NoteKind) -> usize {
    match k {
        NoteKind::Info => 0,
        NoteKind::QuarantineRelease => 1,
        NoteKind::QuarantineEarlyRelease => 2,
        NoteKind::OomRetry => 3,
        NoteKind::GuardRecycle => 4,
        NoteKind::WriterError => 5,
        NoteKind::Signal => 6,
        NoteKind::Fork => 7,
        NoteKind::Exec => 8,
        NoteKind::DeviceFault => 9,
        NoteKind::LateLoad => 10,
    }
}

impl Summarizer {
    /// `trace` is the index of the trace among those summarised together.
    pub fn new(trace: usize) -> Self {
        Summarizer {
            trace,
            calls: [0; N_API],
            failed: [0; N_API],
            events: 0,
            first_ts: None,
            last_ts: 0,
            peak: 0,
            cats: Default::default(),
            devices: Vec::new(),
            invalid_count: 0,
            double_count: 0,
            invalid: Vec::new(),
            earlier: 0,
            lost: 0,
            violation_count: 0,
            violations: Vec::new(),
            stale_count: 0,
            stale: Vec::new(),
            pending_values: Default::default(),
            value_count: 0,
            faults: Vec::new(),
            suspects_due: 0,
            quarantine: Quarantine::default(),
            notes: [0; N_NOTES],
            note_releases: 0,
            note_early: 0,
            writer: WriterStats::default(),
            signal: None,
            end_reason: None,
            ring: [Event::default(); LAST_EVENTS],
            ring_len: 0,
            header: Header::default(),
            live_end: Live::default(),
        }
    }

    fn device(&mut self, d: i32) -> &mut (i32, DeviceStats, u64) {
        let i = match self.devices.iter().position(|x| x.0 == d) {
            Some(i) => i,
            None => {
                self.devices.push((d, DeviceStats::default(), 0));
                self.devices.len() - 1
            }
        };
        &mut self.devices[i]
    }

    /// The finished summary of this trace.
    pub fn into_summary(self, info: &TraceInfo) -> TraceSummary {
        let names = |a: &[u64; N_API]| -> BTreeMap<String, u64> {
            Api::ALL
                .iter()
                .zip(a.iter())
                .filter(|(_, n)| **n > 0)
                .map(|(api, n)| (api.name().to_owned(), *n))
                .collect()
        };
        let mut categories = BTreeMap::new();
        for c in Category::ALL {
            let mut s = self.cats[c as usize].clone();
            s.live_at_end = CountBytes {
                count: self.live_end.count(c),
                bytes: self.live_end.bytes(c),
            };
            categories.insert(c.name().to_owned(), s);
        }
        let cat = |c: Category| &self.cats[c as usize];
        let host = HostStats {
            allocations: cat(Category::Host).started,
            frees: cat(Category::Host).ended,
            peak_live_bytes: cat(Category::Host).peak_live_bytes,
            live_at_end: CountBytes {
                count: self.live_end.count(Category::Host),
                bytes: self.live_end.bytes(Category::Host),
            },
            registered_at_end: CountBytes {
                count: self.live_end.count(Category::Registered),
                bytes: self.live_end.bytes(Category::Registered),
            },
        };
        let allocs = DEVICE_MEMORY;
        let mut notes = BTreeMap::new();
        for (i, n) in self.notes.iter().enumerate() {
            if *n > 0 {
                notes.insert(NOTE_NAMES[i].to_owned(), *n);
            }
        }
        let mut quarantine = self.quarantine.clone();
        quarantine.releases = quarantine.releases.max(self.note_releases);
        quarantine.early_releases = quarantine.early_releases.max(self.note_early);
        let mut last: Vec<EventEntry> = Vec::with_capacity(self.ring_len);
        let n = self.ring_len.min(LAST_EVENTS);
        for i in 0..n {
            let idx = (self.ring_len - n + i) % LAST_EVENTS;
            last.push(EventEntry::new(self.trace, &self.ring[idx]));
        }
        let mut devices = BTreeMap::new();
        for (d, s, _) in &self.devices {
            devices.insert(d.to_string(), s.clone());
        }
        let totals = Totals {
            calls: names(&self.calls),
            failed: names(&self.failed),
            events: self.events,
            allocations: allocs.iter().map(|&c| cat(c).started).sum(),
            frees: allocs.iter().map(|&c| cat(c).ended).sum(),
            peak_live_bytes: self.peak,
            live_at_end: CountBytes {
                count: self.live_end.device_count(),
                bytes: self.live_end.device_bytes(),
            },
            invalid_free_count: self.invalid_count,
            double_free_count: self.double_count,
            invalid_frees: self.invalid,
            frees_of_earlier_allocations: self.earlier,
            lost: self.lost,
            poison_violation_count: self.violation_count,
            poison_violations: self.violations,
            stale_launch_count: self.stale_count,
            stale_launches: self.stale,
            stale_value_count: self.value_count,
            stale_values: self.pending_values.into_iter().take(LIST_CAP).collect(),
            device_faults: self.faults,
            quarantine,
            host,
            categories,
            notes,
            writer: self.writer,
            last_events: last,
            truncated: info.truncated_at,
            complete: info.complete(),
            sequence: Sequence {
                reordered: info.order.reordered,
                gaps: info.order.gaps,
                late: info.order.late,
            },
        };
        TraceSummary {
            file: info.file.clone(),
            header: HeaderInfo::new(&self.header, info.format_version),
            end_reason: self.end_reason,
            signal: self.signal,
            first_ts_ns: self.first_ts,
            last_ts_ns: self.first_ts.map(|_| self.last_ts),
            devices,
            totals,
        }
    }
}

impl Observer for Summarizer {
    fn begin(&mut self, h: &Header) {
        self.header = h.clone();
    }

    #[inline]
    fn event(&mut self, ev: &Event, _live: &Live) {
        let a = ev.api as usize;
        self.calls[a] += 1;
        if !ev.ok() {
            self.failed[a] += 1;
        }
        self.events += 1;
        if self.first_ts.is_none() {
            self.first_ts = Some(ev.ts_ns);
        }
        self.last_ts = ev.ts_ns;
        self.ring[self.ring_len % LAST_EVENTS] = *ev;
        self.ring_len += 1;
    }

    #[inline]
    fn started(&mut self, n: &Node, live: &Live) {
        let c = &mut self.cats[n.category as usize];
        c.started += 1;
        c.bytes_started = c.bytes_started.wrapping_add(n.size);
        c.peak_live_bytes = c.peak_live_bytes.max(live.bytes(n.category));
        if n.category.is_device_memory() {
            self.peak = self.peak.max(live.device_bytes());
            let d = self.device(n.device);
            d.1.allocations += 1;
            d.1.live_at_end.count += 1;
            d.1.live_at_end.bytes = d.1.live_at_end.bytes.wrapping_add(n.size);
            d.1.peak_live_bytes = d.1.peak_live_bytes.max(d.1.live_at_end.bytes);
        }
    }

    #[inline]
    fn ended(&mut self, n: &Node, e: &Ended, _live: &Live) {
        match e.how {
            EndHow::Freed => self.cats[n.category as usize].ended += 1,
            // Graphs may share addresses: a graph node handed out again is not a lost free.
            EndHow::Lost if n.category != Category::Graph => self.lost += 1,
            EndHow::Lost => {}
        }
        if n.category.is_device_memory() {
            let d = self.device(n.device);
            if e.how == EndHow::Freed {
                d.1.frees += 1;
            }
            d.1.live_at_end.count -= 1;
            d.1.live_at_end.bytes = d.1.live_at_end.bytes.wrapping_sub(n.size);
        }
    }

    fn invalid(&mut self, inv: &Invalid, _live: &Live) {
        self.invalid_count += 1;
        if inv.is_double() {
            self.double_count += 1;
        }
        if self.invalid.len() < LIST_CAP {
            let e = &inv.event;
            self.invalid.push(InvalidFree {
                trace: self.trace,
                kind: inv.kind.name().into(),
                seq: e.seq,
                ts_ns: e.ts_ns,
                tid: e.tid,
                device: e.device,
                api: e.api.name().into(),
                ptr: e.ptr,
                handle: e.handle,
                result: e.result,
                double_free: inv.is_double(),
                first_free: inv.previous.map(|(_, f)| CallRef {
                    seq: f.seq,
                    ts_ns: f.ts_ns,
                    tid: f.tid,
                    api: f.api.name().into(),
                }),
                allocated: inv.previous.map(|(n, _)| CallRef {
                    seq: n.seq,
                    ts_ns: n.ts_ns,
                    tid: n.tid,
                    api: n.api.name().into(),
                }),
            });
        }
    }

    fn earlier(&mut self, _inv: &Invalid, _live: &Live) {
        self.earlier += 1;
    }

    fn other(&mut self, rec: &Record, _live: &Live) {
        match rec {
            Record::Event(_) => {}
            Record::Violation(v) => {
                self.violation_count += 1;
                if self.violations.len() < LIST_CAP {
                    self.violations.push(PoisonViolation {
                        trace: self.trace,
                        seq: v.seq,
                        ts_ns: v.ts_ns,
                        device: v.device,
                        ptr: v.ptr,
                        size: v.size,
                        first_offset: v.first_offset,
                        changed_bytes: v.changed_bytes,
                        alloc_seq: v.alloc_seq,
                        free_seq: v.free_seq,
                        freed_at_ns: v.free_ts_ns,
                        free_api: v.free_api.name().into(),
                    });
                }
            }
            Record::StaleLaunch(s) => {
                let mut fault = None;
                if self.suspects_due > 0 {
                    // A suspect of the fault just before: its stale value was used.
                    self.suspects_due -= 1;
                    fault = self.faults.last().map(|f| f.code);
                    if let Some(at) = self
                        .pending_values
                        .iter()
                        .rposition(|v| v.kernel == s.kernel && v.allocation == s.alloc_seq)
                    {
                        self.pending_values.remove(at);
                        self.value_count -= 1;
                    }
                }
                self.stale_count += 1;
                if self.stale.len() < LIST_CAP {
                    self.stale.push(stale_entry(self.trace, s, fault));
                }
            }
            Record::StaleValue(s) => {
                self.value_count += 1;
                if self.pending_values.len() == PENDING_CAP {
                    self.pending_values.pop_front();
                }
                self.pending_values
                    .push_back(stale_entry(self.trace, s, None));
            }
            Record::Note(n) if n.kind == NoteKind::DeviceFault => {
                self.notes[note_index(n.kind)] += 1;
                self.faults.push(DeviceFault {
                    trace: self.trace,
                    seq: n.seq,
                    ts_ns: n.ts_ns,
                    code: n.value,
                    suspects: n.size,
                });
                self.suspects_due = n.size;
            }
            Record::Note(n) => {
                self.notes[note_index(n.kind)] += 1;
                match n.kind {
                    NoteKind::QuarantineRelease => self.note_releases += 1,
                    NoteKind::QuarantineEarlyRelease => self.note_early += 1,
                    NoteKind::OomRetry => self.quarantine.oom_retries += 1,
                    NoteKind::Signal => self.signal = Some(n.value),
                    _ => {}
                }
            }
            Record::Stats(s) => self.stats(s),
            Record::End(e) => {
                self.stats(&e.stats);
                self.end_reason = Some(match e.reason {
                    EndReason::Exit => "exit".into(),
                    EndReason::Signal(n) => {
                        self.signal = Some(n as u64);
                        format!("signal {n}")
                    }
                    EndReason::Exec => "exec".into(),
                });
            }
        }
    }

    fn finish(&mut self, _still: &[Node], live: &Live) {
        self.live_end = *live;
    }
}

/// The name of a CUDA device-fault error code.
pub fn fault_name(code: u64) -> &'static str {
    isolate_trace::device_fault_name(code).unwrap_or("device fault")
}

fn stale_entry(
    trace: usize,
    s: &isolate_trace::StaleLaunch,
    fault: Option<u64>,
) -> StaleLaunchEntry {
    StaleLaunchEntry {
        trace,
        seq: s.seq,
        ts_ns: s.ts_ns,
        tid: s.tid,
        device: s.device,
        api: s.api.name().into(),
        kernel: s.kernel.clone(),
        param_index: s.param_index,
        param_offset: s.param_offset,
        ptr: s.ptr,
        allocation: s.alloc_seq,
        alloc_ptr: s.alloc_ptr,
        alloc_size: s.alloc_size,
        freed_at: FreedAt {
            seq: s.free_seq,
            ts_ns: s.free_ts_ns,
        },
        fault,
    }
}

impl Summarizer {
    fn stats(&mut self, s: &isolate_trace::Stats) {
        let q = &mut self.quarantine;
        q.peak_bytes = q.peak_bytes.max(s.quarantine_peak_bytes);
        q.releases = q.releases.max(s.quarantine_releases);
        q.early_releases = q.early_releases.max(s.quarantine_early_releases);
        let w = &mut self.writer;
        w.events_accepted = w.events_accepted.max(s.events);
        w.queue_waits = w.queue_waits.max(s.queue_waits);
        w.queue_wait_ns = w.queue_wait_ns.max(s.queue_wait_ns);
    }
}

/// Summarises one trace.
pub fn summarize_one(
    path: &Path,
    trace: usize,
    progress: &mut dyn Progress,
) -> Result<TraceSummary, Error> {
    let mut s = Summarizer::new(trace);
    let info = analyze(path, progress, &mut s)?;
    Ok(s.into_summary(&info))
}

/// Summarises several traces, each on its own and added up.
pub fn summarize<P: AsRef<Path>>(
    paths: &[P],
    progress: &mut dyn Progress,
) -> Result<Summary, Error> {
    let mut traces = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        traces.push(summarize_one(p.as_ref(), i, progress)?);
    }
    Ok(combine(traces))
}

/// Adds up trace summaries.
pub fn combine(traces: Vec<TraceSummary>) -> Summary {
    let mut t = Totals {
        complete: !traces.is_empty(),
        ..Totals::default()
    };
    let mut last: Vec<EventEntry> = Vec::new();
    for s in &traces {
        let x = &s.totals;
        for (k, v) in &x.calls {
            *t.calls.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &x.failed {
            *t.failed.entry(k.clone()).or_default() += v;
        }
        t.events += x.events;
        t.allocations += x.allocations;
        t.frees += x.frees;
        t.peak_live_bytes += x.peak_live_bytes;
        t.live_at_end.add(x.live_at_end);
        t.invalid_free_count += x.invalid_free_count;
        t.double_free_count += x.double_free_count;
        t.sequence.reordered += x.sequence.reordered;
        t.sequence.gaps += x.sequence.gaps;
        t.sequence.late += x.sequence.late;
        t.invalid_frees.extend(x.invalid_frees.iter().cloned());
        t.frees_of_earlier_allocations += x.frees_of_earlier_allocations;
        t.lost += x.lost;
        t.poison_violation_count += x.poison_violation_count;
        t.poison_violations
            .extend(x.poison_violations.iter().cloned());
        t.stale_launch_count += x.stale_launch_count;
        t.stale_launches.extend(x.stale_launches.iter().cloned());
        t.stale_value_count += x.stale_value_count;
        t.stale_values.extend(x.stale_values.iter().cloned());
        t.device_faults.extend(x.device_faults.iter().cloned());
        let q = &mut t.quarantine;
        q.peak_bytes += x.quarantine.peak_bytes;
        q.releases += x.quarantine.releases;
        q.early_releases += x.quarantine.early_releases;
        q.oom_retries += x.quarantine.oom_retries;
        let h = &mut t.host;
        h.allocations += x.host.allocations;
        h.frees += x.host.frees;
        h.peak_live_bytes += x.host.peak_live_bytes;
        h.live_at_end.add(x.host.live_at_end);
        h.registered_at_end.add(x.host.registered_at_end);
        for (k, c) in &x.categories {
            let e = t.categories.entry(k.clone()).or_default();
            e.started += c.started;
            e.ended += c.ended;
            e.bytes_started += c.bytes_started;
            e.peak_live_bytes += c.peak_live_bytes;
            e.live_at_end.add(c.live_at_end);
        }
        for (k, v) in &x.notes {
            *t.notes.entry(k.clone()).or_default() += v;
        }
        t.writer.events_accepted += x.writer.events_accepted;
        t.writer.queue_waits += x.writer.queue_waits;
        t.writer.queue_wait_ns += x.writer.queue_wait_ns;
        last.extend(x.last_events.iter().cloned());
        if t.truncated.is_none() {
            t.truncated = x.truncated;
        }
        t.complete &= x.complete;
    }
    t.invalid_frees.truncate(LIST_CAP);
    t.poison_violations.truncate(LIST_CAP);
    t.stale_launches.truncate(LIST_CAP);
    t.stale_values.truncate(LIST_CAP);
    t.device_faults.truncate(LIST_CAP);
    last.sort_by_key(|e| (e.ts_ns, e.trace, e.seq));
    let skip = last.len().saturating_sub(LAST_EVENTS);
    t.last_events = last.split_off(skip);
    Summary { totals: t, traces }
}

/// The summary as people read it.
pub fn render_text(s: &Summary) -> String {
    let mut o = String::new();
    for t in &s.traces {
        let h = &t.header;
        let _ = writeln!(o, "== {} ==", t.file);
        let _ = writeln!(
            o,
            "process  pid {} (parent {}), {}{}",
            h.pid,
            h.ppid,
            if h.exe.is_empty() { "?" } else { &h.exe },
            match h.rank {
                Some(r) => format!(
                    ", rank {r}{}",
                    h.world_size.map(|w| format!(" of {w}")).unwrap_or_default()
                ),
                None => String::new(),
            }
        );
        if !h.argv.is_empty() {
            let _ = writeln!(o, "command  {}", shell_words(&h.argv));
        }
        let _ = writeln!(
            o,
            "mode     {}   host {}   library {}",
            or_dash(&h.mode),
            or_dash(&h.hostname),
            or_dash(&h.library_version)
        );
        if let (Some(a), Some(b)) = (t.first_ts_ns, t.last_ts_ns) {
            let _ = writeln!(
                o,
                "span     {} over {} events",
                human_ns(b.saturating_sub(a)),
                t.totals.events
            );
        }
        let _ = writeln!(
            o,
            "ended    {}",
            match &t.end_reason {
                Some(r) => r.clone(),
                None => "no End record: the process did not exit cleanly (crash, kill, or still running)".into(),
            }
        );
        if let Some(at) = t.totals.truncated {
            let _ = writeln!(
                o,
                "TRUNCATED: the file ends inside a record at byte {at}; analysed up to there"
            );
        }
        totals_text(&mut o, &t.totals, Some(&t.devices));
        o.push('\n');
    }
    if s.traces.len() > 1 {
        let _ = writeln!(o, "== all {} traces ==", s.traces.len());
        totals_text(&mut o, &s.totals, None);
    }
    o
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// Quotes argv for display (so the line can be pasted back into a shell).
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `6 device, 17 VMM handles`: what a device-memory figure is made of, when it is made of more
/// than one category.
fn device_memory_parts(t: &Totals, figure: impl Fn(&CategoryStats) -> u64) -> Option<String> {
    let parts: Vec<String> = DEVICE_MEMORY
        .iter()
        .filter_map(|c| {
            let n = figure(t.categories.get(c.name())?);
            let what = match c {
                Category::Handle => "VMM handles",
                c => c.name(),
            };
            (n > 0).then(|| format!("{n} {what}"))
        })
        .collect();
    (parts.len() > 1).then(|| parts.join(", "))
}

fn totals_text(o: &mut String, t: &Totals, devices: Option<&BTreeMap<String, DeviceStats>>) {
    let calls: u64 = t.calls.values().sum();
    let failed: u64 = t.failed.values().sum();
    let _ = writeln!(o, "calls    {calls} ({failed} failed)");
    for (api, n) in &t.calls {
        let f = t.failed.get(api).copied().unwrap_or(0);
        if f > 0 {
            let _ = writeln!(o, "  {api:<30} {n:>10}  {f} failed");
        } else {
            let _ = writeln!(o, "  {api:<30} {n:>10}");
        }
    }
    let _ = writeln!(
        o,
        "memory   {} allocations{}, {} frees; peak {} of device memory",
        t.allocations,
        device_memory_parts(t, |c| c.started).map_or(String::new(), |p| format!(" ({p})")),
        t.frees,
        human_bytes(t.peak_live_bytes)
    );
    if t.live_at_end.count > 0 {
        let _ = writeln!(
            o,
            "LEAK?    {} device allocations ({}) still held at the end{}",
            t.live_at_end.count,
            human_bytes(t.live_at_end.bytes),
            device_memory_parts(t, |c| c.live_at_end.count)
                .map_or(String::new(), |p| format!(": {p}"))
        );
    } else {
        let _ = writeln!(o, "         no device memory held at the end");
    }
    if let Some(devs) = devices
        && (devs.len() > 1 || devs.keys().any(|k| k != "0"))
    {
        for (d, s) in devs {
            let _ = writeln!(
                o,
                "  device {d:<3} {} allocations, peak {}, {} ({}) held at the end",
                s.allocations,
                human_bytes(s.peak_live_bytes),
                s.live_at_end.count,
                human_bytes(s.live_at_end.bytes)
            );
        }
    }
    let g = t.categories.get("graph");
    if let Some(g) = g.filter(|g| g.started > 0) {
        let _ = writeln!(
            o,
            "graph    {} graph memory nodes, peak {}, {} held at the end",
            g.started,
            human_bytes(g.peak_live_bytes),
            g.live_at_end.count
        );
    }
    if t.host.allocations > 0 || t.host.registered_at_end.count > 0 {
        let _ = writeln!(
            o,
            "host     {} pinned allocations, peak {}, {} ({}) held at the end; {} registrations left",
            t.host.allocations,
            human_bytes(t.host.peak_live_bytes),
            t.host.live_at_end.count,
            human_bytes(t.host.live_at_end.bytes),
            t.host.registered_at_end.count
        );
    }
    if let Some(r) = t.categories.get("reservation").filter(|r| r.started > 0) {
        let h = &t.categories["handle"];
        let m = &t.categories["mapping"];
        let _ = writeln!(
            o,
            "vmm      {} reservations, {} handles created ({} released), {} mappings",
            r.started, h.started, h.ended, m.started
        );
    }
    if t.invalid_free_count > 0 {
        let doubles = match t.double_free_count {
            0 => String::new(),
            n => format!(" ({n} double free{})", if n == 1 { "" } else { "s" }),
        };
        let _ = writeln!(
            o,
            "INVALID  {} frees of memory that was not live{doubles}:",
            t.invalid_free_count
        );
        for f in t.invalid_frees.iter().take(10) {
            let what = if f.kind == "release" {
                format!("handle {}", hex(f.handle))
            } else {
                hex(f.ptr)
            };
            let refused = match f.result {
                0 => String::new(),
                r => format!(", refused with error {r}"),
            };
            let _ = write!(
                o,
                "  seq {} {} {what} (tid {}{refused})",
                f.seq, f.api, f.tid
            );
            match (&f.first_free, &f.allocated) {
                (Some(first), Some(a)) => {
                    let _ = writeln!(
                        o,
                        ": DOUBLE FREE, first freed at seq {} by {} (tid {}), allocated at seq {} \
                         by {} (tid {})",
                        first.seq, first.api, first.tid, a.seq, a.api, a.tid
                    );
                }
                _ => {
                    let _ = writeln!(o, ": nothing live starts there");
                }
            }
        }
    }
    let sq = &t.sequence;
    if sq.gaps > 0 || sq.late > 0 {
        let _ = writeln!(
            o,
            "order    {} sequence numbers never recorded (calls in flight when the process \
             ended), {} records too far out of order to put back{}",
            sq.gaps,
            sq.late,
            if sq.late > 0 {
                ": findings about them may be off"
            } else {
                ""
            }
        );
    }
    if t.notes.contains_key("late_load") {
        let _ = writeln!(
            o,
            "late     loaded after CUDA was in use (dlopen, not LD_PRELOAD): memory allocated \
             before is not in the trace; {} frees of such memory, not counted as invalid",
            t.frees_of_earlier_allocations
        );
    } else if t.frees_of_earlier_allocations > 0 {
        let _ = writeln!(
            o,
            "unseen   {} frees the driver accepted of memory the trace never saw allocated (an \
             entry point isolate does not record); not counted as invalid",
            t.frees_of_earlier_allocations
        );
    }
    if t.lost > 0 {
        let _ = writeln!(
            o,
            "lost     {} allocations whose free the trace never showed",
            t.lost
        );
    }
    let q = &t.quarantine;
    if q.peak_bytes > 0 || q.releases > 0 {
        let _ = writeln!(
            o,
            "quarantine peak {}, {} releases ({} early)",
            human_bytes(q.peak_bytes),
            q.releases,
            q.early_releases
        );
    }
    if t.poison_violation_count == 0 {
        let _ = writeln!(o, "stale writes: none found");
    } else {
        let _ = writeln!(
            o,
            "STALE WRITES: {} freed allocations were written to after their free:",
            t.poison_violation_count
        );
        for v in t.poison_violations.iter().take(20) {
            let _ = writeln!(
                o,
                "  {} ({} B, alloc seq {}, freed seq {} by {}): {} bytes changed from offset {}",
                hex(v.ptr),
                v.size,
                v.alloc_seq,
                v.free_seq,
                v.free_api,
                v.changed_bytes,
                v.first_offset
            );
        }
    }
    if t.stale_launch_count == 0 {
        let _ = writeln!(o, "stale launches: none found");
    } else {
        let _ = writeln!(
            o,
            "STALE LAUNCHES: {} kernels were launched with a pointer into freed memory:",
            t.stale_launch_count
        );
        for s in t.stale_launches.iter().take(20) {
            let _ = writeln!(
                o,
                "  {} param {} = {} (into {} B at {}, alloc seq {}, freed seq {})",
                s.kernel.escape_debug(),
                s.param_index,
                hex(s.ptr),
                s.alloc_size,
                hex(s.alloc_ptr),
                s.allocation,
                s.freed_at.seq
            );
            if let Some(code) = s.fault {
                let _ = writeln!(
                    o,
                    "    (unmapped guard memory; a device fault, error {code}, followed the launch)"
                );
            }
        }
    }
    for f in t.device_faults.iter().take(10) {
        let _ = writeln!(
            o,
            "FAULT    seq {}: CUDA error {} ({}), {} suspect launch(es) named above",
            f.seq,
            f.code,
            fault_name(f.code),
            f.suspects
        );
    }
    if t.stale_value_count > 0 {
        let _ = writeln!(
            o,
            "stale values: {} pointers into freed, unmapped guard memory passed to kernels that \
             never used them (no fault followed; not errors)",
            t.stale_value_count
        );
    }
    if !t.complete {
        let _ = writeln!(o, "incomplete: no End record");
    }
}

//! The [`Summarizer`]: the observer that builds one trace's [`TraceSummary`] in one streaming
//! pass — calls, categories, devices, findings (capped lists beside full counts), notes, the
//! writer's counters and the last events.

use super::{DEVICE_MEMORY, LAST_EVENTS, LIST_CAP, MARKS_CAP, SITES_SHOWN, types::*};
use crate::finding::{Fault, Finding};
use crate::regions::{Closed, Regions, UserNote, user_note};
use crate::source::TraceInfo;
use crate::stacks::{self, StackTable};
use crate::track::{Category, EndHow, Ended, Invalid, Live, Node, Observer, saturate};
use isolate_trace::{Api, EndReason, Event, Header, NoteKind, Record};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

const N_API: usize = Api::ALL.len();

/// The observer that builds one [`TraceSummary`].
pub struct Summarizer {
    trace: usize,
    pid: u32,
    calls: [u64; N_API],
    failed: [u64; N_API],
    /// (API, what it returned; `None`: a code past the first [`CODES_CAP`] of that API) → calls.
    failed_codes: BTreeMap<(usize, Option<i32>), u64>,
    first_fault: Option<FaultedCall>,
    /// (allocation event, the call that made it, the call that freed it) of freed device
    /// memory, in the slot `allocation event % FREED_CAP` (a later free takes the slot over):
    /// names the calls in stale-write and stale-launch findings.
    freed_calls: Vec<FreedCall>,
    /// False in log mode (and off), which has no stale writes or launches to name: the slots
    /// cost a cache miss a free.
    remember_frees: bool,
    held: HeldAtExit,
    leaks: Vec<HeldAllocation>,
    /// Steps and loops, for leaks as growth.
    growth: crate::growth::Growth,
    grown: Vec<LeakEntry>,
    grown_count: u64,
    grown_bytes_per_step: u64,
    events: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    peak: u64,
    cats: [CategoryStats; 8],
    /// Device ordinal → its figures and its live bytes (in 128 bits, see [`Live`]).
    devices: Vec<(i32, DeviceStats, u128)>,
    invalid_count: u64,
    double_count: u64,
    invalid: Vec<InvalidFree>,
    earlier: u64,
    lost: u64,
    violation_count: u64,
    violations: Vec<PoisonViolation>,
    stale_count: u64,
    stale: Vec<StaleLaunchEntry>,
    in_use_count: u64,
    in_use: Vec<FreedInUseEntry>,
    /// Guarded stale values not (yet) followed by a fault, most recent last, at most
    /// [`PENDING_CAP`].
    pending_values: std::collections::VecDeque<StaleLaunchEntry>,
    value_count: u64,
    faults: Vec<DeviceFault>,
    /// Stale-launch records still to come that name the suspects of the last fault.
    suspects_due: u64,
    quarantine: Quarantine,
    device_work: DeviceWork,
    library_cost: Vec<String>,
    notes: [u64; N_NOTES],
    regions: Regions,
    /// Per region name, in the order one of them first closed.
    region_stats: Vec<RegionStats>,
    region_index: std::collections::HashMap<String, usize>,
    region_count: u64,
    marks: Vec<MarkEntry>,
    mark_count: u64,
    /// The End record's time (0 without one).
    end_ts: u64,
    /// The latest note's time (marks and regions may come after the last call).
    last_note_ts: u64,
    note_releases: u64,
    note_early: u64,
    writer: WriterStats,
    signal: Option<u64>,
    end_reason: Option<String>,
    ring: [Event; LAST_EVENTS],
    ring_len: usize,
    header: Header,
    live_end: Live,
    /// The trace's stacks, modules and code objects (format version 2).
    stacks: StackTable,
    /// Stack id → live device memory allocations from it (count, bytes), once the trace has
    /// stacks.
    site_live: FxHashMap<u32, (u64, u64)>,
    /// `site_live` at the peak; `peak_dirty` while the peak is the current state (the copy is
    /// made when memory first goes down from it).
    site_peak: Vec<(u32, u64, u64)>,
    peak_dirty: bool,
    site_end: Vec<(u32, u64, u64)>,
    /// Streaming mode ([`Summarizer::streaming`]): the findings filled since the last
    /// [`Summarizer::drain`], every one of them (the kept lists stop at [`LIST_CAP`]).
    fresh: Option<Fresh>,
}

/// The findings filled since the last [`Summarizer::drain`], by kind of record (one record of
/// the trace fills at most one; the end of the trace fills the leaks).
#[derive(Default)]
struct Fresh {
    stale_writes: Vec<PoisonViolation>,
    stale_launches: Vec<StaleLaunchEntry>,
    unordered: Vec<FreedInUseEntry>,
    frees: Vec<InvalidFree>,
    faults: Vec<DeviceFault>,
    returned: Option<FaultedCall>,
    leaks: Vec<LeakEntry>,
    /// The last stale launch, until the record after it: the library writes a launch's stack
    /// (a `StackOf` record) right after the launch's record ([`Summarizer::next_record`]).
    held: Option<StaleLaunchEntry>,
}

/// (allocation event, the call that made it, the call that freed it, their stacks).
type FreedCall = (u64, Api, Api, u32, u32);

/// A record's stack id as a finding holds it: `None` for 0 (no stack).
fn stack_id(s: u32) -> Option<u32> {
    (s != 0).then_some(s)
}

/// What a finding names of a freed allocation: the calls that made and freed it and their
/// stack ids, when known ([`Summarizer::freed`]).
#[derive(Clone, Copy, Default)]
struct Freed {
    alloc_api: Option<Api>,
    free_api: Option<Api>,
    alloc_stack: Option<u32>,
    free_stack: Option<u32>,
}

/// Guarded stale values kept waiting for a fault that would make them stale launches.
const PENDING_CAP: usize = 4096;
/// Distinct error codes counted one by one for each API.
const CODES_CAP: usize = 32;
/// Slots of frees whose calls are remembered for naming findings.
const FREED_CAP: usize = 65_536;
/// Caching allocators' segments and handles come in multiples of this.
const SEGMENT_GRAIN: u64 = 2 << 20;

const N_NOTES: usize = 14;

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
    "mark",
    "region_push",
    "region_pop",
];

/// How the library's notes about its own cost began before they were `Cost` notes (format
/// version 2 and older; see `Summary::library_cost`).
const COST_NOTES: [&str; 4] = [
    "isolation's time: ",
    "call stacks: ",
    "reuse (ISOLATE_REUSE=on): ",
    // the hooks' time and its parts (`ISOLATE_PROFILE=on`)
    "hooks' ",
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
        NoteKind::Mark => 11,
        NoteKind::RegionPush => 12,
        NoteKind::RegionPop => 13,
        // Counted with the `Info` notes, as these were before they had a kind of their own.
        NoteKind::Cost => 0,
    }
}

impl Summarizer {
    /// `trace` is the index of the trace among those summarised together.
    pub fn new(trace: usize) -> Self {
        Summarizer {
            trace,
            pid: 0,
            calls: [0; N_API],
            failed: [0; N_API],
            failed_codes: BTreeMap::new(),
            first_fault: None,
            freed_calls: Vec::new(),
            remember_frees: true,
            held: HeldAtExit::default(),
            leaks: Vec::new(),
            growth: Default::default(),
            grown: Vec::new(),
            grown_count: 0,
            grown_bytes_per_step: 0,
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
            in_use_count: 0,
            in_use: Vec::new(),
            pending_values: Default::default(),
            value_count: 0,
            faults: Vec::new(),
            suspects_due: 0,
            quarantine: Quarantine::default(),
            device_work: DeviceWork::default(),
            library_cost: Vec::new(),
            notes: [0; N_NOTES],
            regions: Regions::default(),
            region_stats: Vec::new(),
            region_index: Default::default(),
            region_count: 0,
            marks: Vec::new(),
            mark_count: 0,
            end_ts: 0,
            last_note_ts: 0,
            note_releases: 0,
            note_early: 0,
            writer: WriterStats::default(),
            signal: None,
            end_reason: None,
            ring: [Event::default(); LAST_EVENTS],
            ring_len: 0,
            header: Header::default(),
            live_end: Live::default(),
            stacks: StackTable::new(),
            site_live: FxHashMap::default(),
            site_peak: Vec::new(),
            peak_dirty: false,
            site_end: Vec::new(),
            fresh: None,
        }
    }

    /// A summarizer that also hands out every finding as soon as it is filled
    /// ([`Summarizer::drain`]), past [`LIST_CAP`] too: for the outputs that render findings as
    /// the trace is read ([`crate::finding::Streamed`]). The summary it makes is the same.
    pub fn streaming(trace: usize) -> Self {
        Summarizer {
            fresh: Some(Fresh::default()),
            ..Summarizer::new(trace)
        }
    }

    /// Hands each finding filled since the last call to `f`, as a [`Finding`], in the order
    /// they were filled (nothing unless [`Summarizer::streaming`]). Their stacks are stack ids
    /// ([`Finding::sites`]); a stale launch's own is the one known when its record was read.
    pub fn drain(&mut self, mut f: impl FnMut(Finding<'_>)) {
        let Some(x) = self.fresh.as_mut() else { return };
        if x.stale_writes.is_empty()
            && x.stale_launches.is_empty()
            && x.unordered.is_empty()
            && x.frees.is_empty()
            && x.faults.is_empty()
            && x.returned.is_none()
            && x.leaks.is_empty()
        {
            return;
        }
        let x = std::mem::take(x);
        x.stale_writes
            .iter()
            .for_each(|v| f(Finding::StaleWrite(v)));
        x.stale_launches
            .iter()
            .for_each(|s| f(Finding::StaleLaunch(s)));
        x.unordered
            .iter()
            .for_each(|u| f(Finding::UnorderedFree(u)));
        x.frees.iter().for_each(|i| f(Finding::of_free(i)));
        x.faults
            .iter()
            .for_each(|d| f(Finding::DeviceFault(Fault::Noted(d))));
        x.returned
            .iter()
            .for_each(|c| f(Finding::DeviceFault(Fault::Returned(c))));
        x.leaks.iter().for_each(|l| f(Finding::Leak(l)));
    }

    /// Told before each callback of a streaming summarizer (`rec`: the record about to be read;
    /// `None` for an event or the end): the stale launch held since the last record is ready to
    /// hand out, with its own stack when `rec` is the `StackOf` that names it.
    pub fn next_record(&mut self, rec: Option<&Record>) {
        let Some(x) = self.fresh.as_mut() else { return };
        let Some(mut h) = x.held.take() else { return };
        if let Some(Record::StackOf(so)) = rec
            && so.seq == h.seq
        {
            h.stack_ids[0] = stack_id(so.stack);
        }
        x.stale_launches.push(h);
    }

    /// Whether a finding past the kept lists' [`LIST_CAP`] is still filled (to be handed out).
    fn streams(&self) -> bool {
        self.fresh.is_some()
    }

    fn device(&mut self, d: i32) -> &mut (i32, DeviceStats, u128) {
        let i = match self.devices.iter().position(|x| x.0 == d) {
            Some(i) => i,
            None => {
                self.devices.push((d, DeviceStats::default(), 0));
                self.devices.len() - 1
            }
        };
        &mut self.devices[i]
    }

    /// The steps of the run as [`crate::growth`] recognises them (regions, or a loop's
    /// iterations from the call stacks), once the trace is read: the report draws them.
    pub fn steps(&self) -> Option<crate::growth::Steps> {
        self.growth.steps(&self.stacks)
    }

    /// The finished summary of this trace.
    pub fn into_summary(mut self, info: &TraceInfo) -> TraceSummary {
        let no_stacks = stacks::why_none(info.format_version, &self.stacks, &self.header.config);
        let (sites_at_end, sites_at_peak) = self.symbolise();
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
        let mut last: Vec<EventEntry> = Vec::with_capacity(self.ring_len.min(LAST_EVENTS));
        let n = self.ring_len.min(LAST_EVENTS);
        for i in 0..n {
            let idx = (self.ring_len - n + i) % LAST_EVENTS;
            last.push(EventEntry::new(self.trace, &self.ring[idx]));
        }
        let mut failed_results: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for ((api, code), n) in &self.failed_codes {
            let key = code.map_or_else(|| "other".to_owned(), |c| c.to_string());
            *failed_results
                .entry(Api::ALL[*api].name().to_owned())
                .or_default()
                .entry(key)
                .or_default() += n;
        }
        let mut faults = self.faults;
        for f in &mut faults {
            if f.call.is_none() {
                f.call = self.first_fault.clone().filter(|c| c.code == f.code);
            }
        }
        let fault_findings = match (faults.len(), &self.first_fault) {
            (0, Some(_)) => 1,
            (n, _) => n as u64,
        };
        let mut devices = BTreeMap::new();
        for (d, s, live) in &self.devices {
            let mut s = s.clone();
            s.live_at_end.bytes = saturate(*live);
            devices.insert(d.to_string(), s);
        }
        let mut totals = Totals {
            calls: names(&self.calls),
            failed: names(&self.failed),
            failed_results,
            events: self.events,
            allocations: allocs.iter().map(|&c| cat(c).started).sum(),
            frees: allocs.iter().map(|&c| cat(c).ended).sum(),
            peak_live_bytes: self.peak,
            peak_is_sum_of_processes: false,
            live_at_end: CountBytes {
                count: self.live_end.device_count(),
                bytes: self.live_end.device_bytes(),
            },
            held_at_exit: self.held,
            possible_leaks: self.leaks,
            leak_count: self.grown_count,
            leak_bytes_per_step: self.grown_bytes_per_step,
            leaks: self.grown,
            sites_at_end,
            sites_at_peak,
            no_stacks,
            findings: 0,
            invalid_free_count: self.invalid_count,
            double_free_count: self.double_count,
            invalid_frees: self.invalid,
            frees_of_earlier_allocations: self.earlier,
            lost: self.lost,
            poison_violation_count: self.violation_count,
            poison_violations: self.violations,
            stale_launch_count: self.stale_count,
            stale_launches: self.stale,
            freed_in_use_count: self.in_use_count,
            freed_in_use: self.in_use,
            stale_value_count: self.value_count,
            stale_values: self.pending_values.into_iter().take(LIST_CAP).collect(),
            device_faults: faults,
            device_fault_count: fault_findings,
            quarantine,
            device_work: self.device_work,
            library_cost: self.library_cost,
            host,
            categories,
            notes,
            regions: self.region_stats,
            region_count: self.region_count,
            marks: self.marks,
            mark_count: self.mark_count,
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
        // Every finding, counted or not (the JSON's `findings`), as the model counts them.
        totals.findings = crate::finding::Tally::of(&totals).total();
        TraceSummary {
            file: info.file.clone(),
            header: HeaderInfo::new(&self.header, info.format_version),
            end_reason: self.end_reason,
            signal: self.signal,
            first_ts_ns: self.first_ts,
            last_ts_ns: self.first_ts.map(|_| self.last_ts),
            span_ns: self.first_ts.map(|f| {
                self.last_ts
                    .max(self.end_ts)
                    .max(self.last_note_ts)
                    .saturating_sub(f)
            }),
            devices,
            first_faulted_call: self.first_fault,
            totals,
        }
    }
}

impl Observer for Summarizer {
    fn begin(&mut self, h: &Header) {
        self.header = h.clone();
        self.pid = h.pid;
        self.remember_frees = !matches!(h.mode.as_str(), "log" | "off");
    }

    #[inline]
    fn event(&mut self, ev: &Event, _live: &Live) {
        let a = ev.api as usize;
        self.calls[a] += 1;
        if !ev.ok() {
            self.failed[a] += 1;
            self.failed_call(ev);
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
        c.bytes_started = c.bytes_started.saturating_add(n.size);
        c.peak_live_bytes = c.peak_live_bytes.max(live.bytes(n.category));
        if n.category.is_device_memory() {
            if self.stacks.has_stacks() {
                if n.stack != 0 {
                    self.growth.allocated(&self.stacks, n.stack, n.tid, n.ts_ns);
                }
                let e = self.site_live.entry(n.stack).or_default();
                e.0 += 1;
                e.1 = e.1.saturating_add(n.size);
            }
            let now = live.device_bytes();
            if now > self.peak {
                self.peak = now;
                self.peak_dirty = true;
            }
            if !self.regions.none_open() {
                self.regions.sample(live.device_bytes());
            }
            let d = self.device(n.device);
            d.1.allocations += 1;
            d.1.live_at_end.count += 1;
            d.2 += u128::from(n.size);
            d.1.peak_live_bytes = d.1.peak_live_bytes.max(saturate(d.2));
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
            if self.remember_frees && e.how == EndHow::Freed && n.category != Category::Handle {
                self.remember_free((n.seq, n.api, e.api, n.stack, e.stack));
            }
            if self.stacks.has_stacks() {
                self.site_ended(n);
                if e.how == EndHow::Freed {
                    self.growth.freed();
                }
            }
            let d = self.device(n.device);
            if e.how == EndHow::Freed {
                d.1.frees += 1;
            }
            d.1.live_at_end.count -= 1;
            d.2 -= u128::from(n.size);
        }
    }

    fn invalid(&mut self, inv: &Invalid, _live: &Live) {
        self.invalid_count += 1;
        if inv.is_double() {
            self.double_count += 1;
        }
        if self.invalid.len() < LIST_CAP || self.streams() {
            let e = &inv.event;
            let f = InvalidFree {
                trace: self.trace,
                pid: self.pid,
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
                stack: None,
                first_free_stack: None,
                alloc_stack: None,
                stack_ids: [
                    stack_id(e.stack),
                    inv.previous.and_then(|(_, f)| stack_id(f.stack)),
                    inv.previous.and_then(|(n, _)| stack_id(n.stack)),
                ],
            };
            if let Some(x) = self.fresh.as_mut() {
                x.frees.push(f.clone());
            }
            if self.invalid.len() < LIST_CAP {
                self.invalid.push(f);
            }
        }
    }

    fn earlier(&mut self, _inv: &Invalid, _live: &Live) {
        self.earlier += 1;
    }

    fn other(&mut self, rec: &Record, live: &Live) {
        if let Record::Note(n) = rec {
            self.last_note_ts = self.last_note_ts.max(n.ts_ns);
        }
        match rec {
            Record::Event(_) => {}
            Record::Violation(v) => {
                self.violation_count += 1;
                if self.violations.len() < LIST_CAP || self.streams() {
                    let freed = self.freed(v.alloc_seq, [v.alloc_stack, v.free_stack]);
                    let f = PoisonViolation {
                        trace: self.trace,
                        pid: self.pid,
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
                        alloc_api: freed.alloc_api.map(|a| a.name().into()),
                        alloc_stack: None,
                        free_stack: None,
                        stack_ids: [freed.alloc_stack, freed.free_stack],
                    };
                    if let Some(x) = self.fresh.as_mut() {
                        x.stale_writes.push(f.clone());
                    }
                    if self.violations.len() < LIST_CAP {
                        self.violations.push(f);
                    }
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
                if self.streams() {
                    let mut f = self.stale_entry(s, fault);
                    f.stack_ids[0] = stack_id(self.stacks.stack_of(s.seq));
                    if let Some(x) = self.fresh.as_mut()
                        && let Some(before) = x.held.replace(f)
                    {
                        x.stale_launches.push(before);
                    }
                }
                if self.stale.len() < LIST_CAP {
                    self.stale.push(self.stale_entry(s, fault));
                }
            }
            Record::FreedInUse(f) => {
                self.in_use_count += 1;
                if self.in_use.len() < LIST_CAP || self.streams() {
                    let freed = self.freed(f.alloc_seq, [f.alloc_stack, f.free_stack]);
                    let e = FreedInUseEntry {
                        trace: self.trace,
                        pid: self.pid,
                        seq: f.seq,
                        ts_ns: f.ts_ns,
                        tid: f.tid,
                        device: f.device,
                        alloc_ptr: f.alloc_ptr,
                        alloc_size: f.alloc_size,
                        alloc_seq: f.alloc_seq,
                        alloc_api: freed.alloc_api.map(|a| a.name().into()),
                        free_seq: f.free_seq,
                        free_api: f.free_api.name().into(),
                        free_stream: f.free_stream,
                        use_name: f.use_name.clone(),
                        use_kernel: f.use_kernel,
                        use_stream: f.use_stream,
                        use_after_seq: f.use_after_seq,
                        use_ts_ns: f.use_ts_ns,
                        use_tick: f.use_tick,
                        seen_tick: f.seen_tick,
                        alloc_stack: None,
                        free_stack: None,
                        use_stack: None,
                        stack_ids: [freed.alloc_stack, freed.free_stack, stack_id(f.use_stack)],
                    };
                    if let Some(x) = self.fresh.as_mut() {
                        x.unordered.push(e.clone());
                    }
                    if self.in_use.len() < LIST_CAP {
                        self.in_use.push(e);
                    }
                }
            }
            Record::StaleValue(s) => {
                self.value_count += 1;
                if self.pending_values.len() == PENDING_CAP {
                    self.pending_values.pop_front();
                }
                let entry = self.stale_entry(s, None);
                self.pending_values.push_back(entry);
            }
            Record::Note(n) if n.kind == NoteKind::DeviceFault => {
                self.notes[note_index(n.kind)] += 1;
                self.faults.push(DeviceFault {
                    trace: self.trace,
                    pid: self.pid,
                    seq: n.seq,
                    ts_ns: n.ts_ns,
                    code: n.value,
                    suspects: n.size,
                    call: None,
                    text: n.text.clone(),
                });
                if let (Some(x), Some(d)) = (self.fresh.as_mut(), self.faults.last()) {
                    x.faults.push(d.clone());
                }
                self.suspects_due = n.size;
            }
            Record::Note(n) if user_note(n).is_some() => self.user_note(n, live),
            Record::Note(n) => {
                self.notes[note_index(n.kind)] += 1;
                match n.kind {
                    NoteKind::QuarantineRelease => self.note_releases += 1,
                    NoteKind::QuarantineEarlyRelease => self.note_early += 1,
                    NoteKind::OomRetry if n.size == 0 => self.quarantine.launch_oom_retries += 1,
                    NoteKind::OomRetry => self.quarantine.oom_retries += 1,
                    NoteKind::Signal => self.signal = Some(n.value),
                    NoteKind::Cost
                        if isolate_trace::CostTopic::of(n)
                            == Some(isolate_trace::CostTopic::Freed) =>
                    {
                        self.device_work.freed_bytes = n.size;
                        self.device_work.frees = n.value;
                    }
                    NoteKind::Cost
                        if isolate_trace::CostTopic::of(n)
                            == Some(isolate_trace::CostTopic::DeviceBytes) =>
                    {
                        self.device_work.written_bytes = n.size;
                        self.device_work.read_bytes = n.value;
                    }
                    NoteKind::Cost
                        if isolate_trace::CostTopic::of(n).is_some_and(|t| {
                            // The order check's line says it ran, what it saw, and how many
                            // unordered frees' releases waited for their use; the pressure
                            // line, that the quarantine was cut for the device's sake; the
                            // budget's, when other processes shared the device's share.
                            t.is_time()
                                || t == isolate_trace::CostTopic::StreamOrder
                                || t == isolate_trace::CostTopic::MemoryPressure
                                || (t == isolate_trace::CostTopic::QuarantineBudget && n.value > 1)
                        }) && self.library_cost.len() < LIST_CAP =>
                    {
                        self.library_cost.push(n.text.clone())
                    }
                    NoteKind::Info
                        if COST_NOTES.iter().any(|p| n.text.starts_with(p))
                            && self.library_cost.len() < LIST_CAP =>
                    {
                        self.library_cost.push(n.text.clone())
                    }
                    _ => {}
                }
            }
            Record::Stats(s) => self.stats(s),
            Record::End(e) => {
                self.end_ts = e.ts_ns;
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
            Record::Module(_) | Record::Stack(_) | Record::PyCode(_) | Record::StackOf(_) => {
                self.stacks.record(rec);
            }
        }
    }

    fn finish(&mut self, still: &[Node], live: &Live) {
        self.live_end = *live;
        for c in self.regions.close_all(self.last_ts.max(self.end_ts)) {
            self.region_closed(c);
        }
        self.classify_held(still);
        self.judge_growth(still);
        if let Some(x) = self.fresh.as_mut()
            && self.faults.is_empty()
        {
            // As the summary counts it: a fault code returned, with no device-fault note.
            x.returned = self.first_fault.clone();
        }
        if self.device_work.any() {
            if let Some(steps) = self.growth.steps(&self.stacks) {
                self.device_work.steps = steps.spans.len() as u64;
                self.device_work.steps_from = Some(steps.what);
            }
            let last = self.last_ts.max(self.end_ts);
            self.device_work.run_ns = self.first_ts.map_or(0, |f| last.saturating_sub(f));
            self.device_work.settle();
        }
        if self.stacks.has_stacks() {
            if self.peak_dirty {
                self.snapshot_peak();
            }
            let mut by: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
            for n in still.iter().filter(|n| n.category.is_device_memory()) {
                let e = by.entry(n.stack).or_default();
                e.0 += 1;
                e.1 = e.1.saturating_add(n.size);
            }
            self.site_end = ranked(by.into_iter().map(|(k, (c, b))| (k, c, b)).collect());
        }
    }
}

/// Functions that allocate device memory a framework keeps for the life of the process: PyTorch's
/// cuBLAS workspace per handle and stream, and its cuBLASLt workspace (seen held at exit in every
/// GPT-2 run on the H200 with the cache off).
const WORKSPACE_FUNCTIONS: &[&str] = &[
    "at::cuda::setWorkspaceForHandle",
    "at::cuda::getCUDABlasLtWorkspace",
];

/// Whether stack `id` allocates inside one of [`WORKSPACE_FUNCTIONS`].
fn framework_workspace(table: &crate::stacks::StackTable, id: u32) -> bool {
    crate::stacks::shown(table, id).is_some_and(|s| {
        s.frames.iter().any(|f| {
            f.function
                .as_deref()
                .is_some_and(|name| WORKSPACE_FUNCTIONS.iter().any(|w| name.starts_with(w)))
        })
    })
}

/// The last path component: `/usr/bin/python3.12` → `python3.12`.
fn base_name(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// True when the header shows a Python process (the executable or `argv[0]`), a `torchrun`
/// launch, or records a `PYTORCH_*` setting.
pub(super) fn is_python(h: &Header) -> bool {
    let py = |s: &str| {
        let b = base_name(s);
        b.starts_with("python") || b.starts_with("pypy")
    };
    py(&h.exe)
        || h.argv.first().is_some_and(|a| py(a))
        || h.argv.iter().any(|a| base_name(a) == "torchrun")
        || h.config.iter().any(|(k, _)| k.starts_with("PYTORCH_"))
}

/// True unless the header says PyTorch's caching allocator was off: isolate mode turns it off
/// (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, unless that was set already), and so do that setting
/// and `PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync` when the header records them.
pub(super) fn pytorch_cache_on(h: &Header) -> bool {
    let get = |k: &str| h.config.iter().find(|(n, _)| n == k).map(|(_, v)| v.trim());
    let uncached = match get("PYTORCH_NO_CUDA_MEMORY_CACHING") {
        Some(v) => !v.is_empty() && v != "0",
        None => h.mode == "isolate",
    };
    let async_backend =
        get("PYTORCH_CUDA_ALLOC_CONF").is_some_and(|v| v.contains("backend:cudaMallocAsync"));
    !uncached && !async_backend
}

/// PyTorch's caching allocator's segments, where its cache is on: `cudaMalloc`s of whole
/// multiples of [`SEGMENT_GRAIN`], or (expandable segments, with address reservations in the
/// trace) physical handles of such sizes.
#[derive(Clone, Copy)]
struct CacheSegments {
    reserved: bool,
}

impl CacheSegments {
    fn grain(n: &Node) -> bool {
        n.size > 0 && n.size.is_multiple_of(SEGMENT_GRAIN)
    }

    fn expandable(&self, n: &Node) -> bool {
        self.reserved && n.category == Category::Handle && Self::grain(n)
    }

    fn is(&self, n: &Node) -> bool {
        (n.category == Category::Device && n.api == Api::CudaMalloc && Self::grain(n))
            || self.expandable(n)
    }
}

impl Summarizer {
    #[cold]
    #[inline(never)]
    fn failed_call(&mut self, ev: &Event) {
        let a = ev.api as usize;
        let distinct = self
            .failed_codes
            .range((a, Some(i32::MIN))..=(a, Some(i32::MAX)))
            .count();
        let key = if distinct < CODES_CAP || self.failed_codes.contains_key(&(a, Some(ev.result))) {
            (a, Some(ev.result))
        } else {
            (a, None)
        };
        *self.failed_codes.entry(key).or_default() += 1;
        if self.first_fault.is_none()
            && let Ok(code) = u64::try_from(ev.result)
            && isolate_trace::device_fault_name(code).is_some()
        {
            self.first_fault = Some(FaultedCall {
                seq: ev.seq,
                ts_ns: ev.ts_ns,
                tid: ev.tid,
                api: ev.api.name().into(),
                code,
            });
        }
    }

    #[inline]
    fn remember_free(&mut self, call: FreedCall) {
        let slot = (call.0 % FREED_CAP as u64) as usize;
        match self.freed_calls.get_mut(slot) {
            Some(s) => *s = call,
            None => self.first_free(slot, call),
        }
    }

    #[cold]
    #[inline(never)]
    fn first_free(&mut self, slot: usize, call: FreedCall) {
        self.freed_calls = vec![(u64::MAX, Api::default(), Api::default(), 0, 0); FREED_CAP];
        self.freed_calls[slot] = call;
    }

    /// The calls that made and freed the allocation of event `alloc_seq`, and their stack ids,
    /// for a stale write's or stale launch's finding: **the one place** the findings get them.
    /// The stack ids come from the record (`carried`: its `alloc_stack` and `free_stack`,
    /// format version 3) when it has them; else, as for older traces, from the calls of recent
    /// frees remembered in [`FREED_CAP`] slots (a free more than that many frees ago may have
    /// lost its slot: then all are `None`). The calls' APIs always come from the slots.
    fn freed(&self, alloc_seq: u64, carried: [u32; 2]) -> Freed {
        let slot = self
            .freed_calls
            .get((alloc_seq % FREED_CAP as u64) as usize)
            .filter(|c| c.0 == alloc_seq);
        let mut f = match slot {
            None => Freed::default(),
            Some(c) => Freed {
                alloc_api: Some(c.1),
                free_api: Some(c.2),
                alloc_stack: stack_id(c.3),
                free_stack: stack_id(c.4),
            },
        };
        if carried != [0, 0] {
            (f.alloc_stack, f.free_stack) = (stack_id(carried[0]), stack_id(carried[1]));
        }
        f
    }

    /// A device memory node of site `n.stack` ended: the peak's picture is taken first when
    /// memory goes down from a peak.
    fn site_ended(&mut self, n: &Node) {
        if self.peak_dirty {
            self.snapshot_peak();
        }
        if let Some(e) = self.site_live.get_mut(&n.stack) {
            e.0 = e.0.saturating_sub(1);
            e.1 = e.1.saturating_sub(n.size);
            if e.0 == 0 {
                self.site_live.remove(&n.stack);
            }
        }
    }

    #[cold]
    fn snapshot_peak(&mut self) {
        self.peak_dirty = false;
        self.site_peak = ranked(
            self.site_live
                .iter()
                .map(|(&k, &(c, b))| (k, c, b))
                .collect(),
        );
    }

    /// Symbolises the stacks the summary shows; returns the sites at the end and at the peak.
    fn symbolise(&mut self) -> (Vec<SiteEntry>, Vec<SiteEntry>) {
        if !self.stacks.has_stacks() {
            return (Vec::new(), Vec::new());
        }
        let t = &self.stacks;
        let show = |id: Option<u32>| id.and_then(|id| stacks::shown(t, id));
        for v in &mut self.violations {
            v.alloc_stack = show(v.stack_ids[0]);
            v.free_stack = show(v.stack_ids[1]);
        }
        for s in self.stale.iter_mut().chain(self.pending_values.iter_mut()) {
            s.stack_ids[0] = stack_id(t.stack_of(s.seq));
            s.launch_stack = show(s.stack_ids[0]);
            s.alloc_stack = show(s.stack_ids[1]);
            s.free_stack = show(s.stack_ids[2]);
        }
        for f in &mut self.in_use {
            f.alloc_stack = show(f.stack_ids[0]);
            f.free_stack = show(f.stack_ids[1]);
            f.use_stack = show(f.stack_ids[2]);
        }
        for f in &mut self.invalid {
            f.stack = show(f.stack_ids[0]);
            f.first_free_stack = show(f.stack_ids[1]);
            f.alloc_stack = show(f.stack_ids[2]);
        }
        for l in &mut self.leaks {
            l.alloc_stack = show(l.stack_id);
        }
        for l in &mut self.grown {
            l.alloc_stack = show(l.stack_id);
        }
        let trace = self.trace;
        // Stacks that differ only in hidden frames are one site.
        let sites = |v: &[(u32, u64, u64)]| -> Vec<SiteEntry> {
            let mut out: Vec<SiteEntry> = Vec::new();
            for &(id, count, bytes) in v {
                let Some(stack) = show(Some(id)) else {
                    continue;
                };
                let key = stack.key();
                match out.iter_mut().find(|x| x.stack.key() == key) {
                    Some(x) => {
                        x.count = x.count.saturating_add(count);
                        x.bytes = x.bytes.saturating_add(bytes);
                    }
                    None => out.push(SiteEntry {
                        trace,
                        site: stack.site.clone(),
                        count,
                        bytes,
                        stack,
                    }),
                }
            }
            out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
            out.truncate(SITES_SHOWN);
            out
        };
        (sites(&self.site_end), sites(&self.site_peak))
    }

    /// The leaks: sites whose memory grew step by step ([`crate::growth`]).
    fn judge_growth(&mut self, still: &[Node]) {
        // Steps recognised from the call stacks are not judged on a caching allocator's
        // segments: the cache grows while it fills (the first step's layers, called in turn,
        // look like a loop's iterations from the stacks) and keeps its segments to the end, so
        // its growth says nothing about what the program keeps (issue 30: 3 false leaks a run
        // of timm's ViT in log mode on the H100). Named regions still judge them.
        let Some(steps) = self.growth.steps(&self.stacks) else {
            return;
        };
        let kept: Vec<Node>;
        let still = match self.cache_segments().filter(|_| steps.from_stacks) {
            Some(seg) => {
                kept = still.iter().filter(|n| !seg.is(n)).copied().collect();
                &kept[..]
            }
            None => still,
        };
        for g in crate::growth::Growth::judge(steps, &self.stacks, still) {
            self.grown_count += 1;
            self.grown_bytes_per_step =
                self.grown_bytes_per_step.saturating_add(g.bytes_per_step());
            if self.grown.len() < LIST_CAP || self.fresh.is_some() {
                let n = &g.first;
                let f = LeakEntry {
                    trace: self.trace,
                    pid: self.pid,
                    steps: g.steps.clone(),
                    step_count: g.step_count,
                    steps_judged: g.judged,
                    bytes_per_step: g.bytes_per_step(),
                    count: g.count,
                    bytes: g.bytes,
                    seq: n.seq,
                    ts_ns: n.ts_ns,
                    tid: n.tid,
                    device: n.device,
                    api: n.api.name().into(),
                    size: n.size,
                    alloc_stack: None,
                    stack_id: stack_id(n.stack),
                };
                if let Some(x) = self.fresh.as_mut() {
                    x.leaks.push(f.clone());
                }
                if self.grown.len() < LIST_CAP {
                    self.grown.push(f);
                }
            }
        }
    }

    /// How PyTorch's caching allocator's segments look in this trace; `None` when its cache is
    /// off (isolate mode, `PYTORCH_NO_CUDA_MEMORY_CACHING`, the stream-ordered backend) or the
    /// program is not Python.
    fn cache_segments(&self) -> Option<CacheSegments> {
        (is_python(&self.header) && pytorch_cache_on(&self.header)).then(|| CacheSegments {
            reserved: self.cats[Category::Reservation as usize].started > 0,
        })
    }

    /// Tells the device memory still live at the end apart (see [`HeldAtExit`]).
    fn classify_held(&mut self, still: &[Node]) {
        let python = is_python(&self.header);
        let cache = self.cache_segments();
        let died = !matches!(self.end_reason.as_deref(), Some("exit" | "exec"));
        let h = &mut self.held;
        for n in still {
            let one = CountBytes {
                count: 1,
                bytes: n.size,
            };
            if n.category == Category::Reservation {
                h.address_space.add(one);
                continue;
            }
            if !n.category.is_device_memory() {
                continue;
            }
            h.count = h.count.saturating_add(1);
            h.bytes = h.bytes.saturating_add(n.size);
            if let Some(c) = cache.filter(|c| c.is(n)) {
                h.caching_allocator.add(one);
                if c.expandable(n) {
                    h.expandable_segments.add(one);
                }
            } else if python && n.category == Category::Device && !n.api.is_runtime() {
                h.library.add(one);
            } else if python && n.stack != 0 && framework_workspace(&self.stacks, n.stack) {
                h.framework_workspaces.add(one);
            } else if died {
                h.process_died.add(one);
            } else {
                h.possible_leak.add(one);
                if self.leaks.len() < LIST_CAP {
                    self.leaks.push(HeldAllocation {
                        trace: self.trace,
                        pid: self.pid,
                        seq: n.seq,
                        ts_ns: n.ts_ns,
                        tid: n.tid,
                        device: n.device,
                        api: n.api.name().into(),
                        category: n.category.name().into(),
                        ptr: n.ptr,
                        handle: n.handle,
                        size: n.size,
                        alloc_stack: None,
                        stack_id: stack_id(n.stack),
                    });
                }
            }
        }
    }

    fn stale_entry(&self, s: &isolate_trace::StaleLaunch, fault: Option<u64>) -> StaleLaunchEntry {
        let freed = self.freed(s.alloc_seq, [s.alloc_stack, s.free_stack]);
        StaleLaunchEntry {
            launch_stack: None,
            alloc_stack: None,
            free_stack: None,
            stack_ids: [None, freed.alloc_stack, freed.free_stack],
            trace: self.trace,
            pid: self.pid,
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
            alloc_api: freed.alloc_api.map(|a| a.name().into()),
            free_api: freed.free_api.map(|a| a.name().into()),
        }
    }
}

impl Summarizer {
    /// A mark or a region's push or pop, in either form.
    fn user_note(&mut self, n: &isolate_trace::Note, live: &Live) {
        let Some(u) = user_note(n) else { return };
        self.notes[note_index(u.kind())] += 1;
        match u {
            UserNote::Mark(text) => {
                self.mark_count += 1;
                if self.marks.len() < MARKS_CAP {
                    self.marks.push(MarkEntry {
                        trace: self.trace,
                        seq: n.seq,
                        ts_ns: n.ts_ns,
                        text: text.to_owned(),
                    });
                }
            }
            UserNote::RegionPush(name) => {
                self.regions.push(n.ptr, name, n.ts_ns, live.device_bytes())
            }
            UserNote::RegionPop(_) => {
                if let Some(c) = self.regions.pop(n.ptr, n.ts_ns) {
                    self.region_closed(c);
                }
            }
        }
    }

    fn region_closed(&mut self, c: Closed) {
        self.region_count += 1;
        if c.depth == 1 {
            self.growth.region(&c.name, c.from_ns, c.to_ns);
        }
        let i = match self.region_index.get(&c.name) {
            Some(&i) => i,
            None if self.region_stats.len() < LIST_CAP => {
                self.region_stats.push(RegionStats {
                    name: c.name.clone(),
                    ..RegionStats::default()
                });
                self.region_index
                    .insert(c.name, self.region_stats.len() - 1);
                self.region_stats.len() - 1
            }
            None => return,
        };
        let r = &mut self.region_stats[i];
        r.count += 1;
        r.total_ns = r.total_ns.saturating_add(c.to_ns - c.from_ns);
        r.peak_live_bytes = r.peak_live_bytes.max(c.peak_live_bytes);
    }

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

/// Sites (stack id, count, bytes) by bytes, then count, largest first (stack 0, no stack,
/// is left out); the summary keeps [`SITES_SHOWN`] once stacks of one site are merged.
fn ranked(mut v: Vec<(u32, u64, u64)>) -> Vec<(u32, u64, u64)> {
    v.retain(|x| x.0 != 0 && x.1 > 0);
    v.sort_unstable_by(|a, b| b.2.cmp(&a.2).then(b.1.cmp(&a.1)).then(a.0.cmp(&b.0)));
    v
}

//! The [`Summarizer`]: the observer that builds one trace's [`TraceSummary`] in one streaming
//! pass — calls, categories, devices, findings (capped lists beside full counts), notes, the
//! writer's counters and the last events.

use super::{DEVICE_MEMORY, LAST_EVENTS, LIST_CAP, types::*};
use crate::source::TraceInfo;
use crate::track::{Category, EndHow, Ended, Invalid, Live, Node, Observer, saturate};
use isolate_trace::{Api, EndReason, Event, Header, NoteKind, Record};
use std::collections::BTreeMap;

const N_API: usize = Api::ALL.len();

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
        let mut last: Vec<EventEntry> = Vec::with_capacity(self.ring_len.min(LAST_EVENTS));
        let n = self.ring_len.min(LAST_EVENTS);
        for i in 0..n {
            let idx = (self.ring_len - n + i) % LAST_EVENTS;
            last.push(EventEntry::new(self.trace, &self.ring[idx]));
        }
        let mut devices = BTreeMap::new();
        for (d, s, live) in &self.devices {
            let mut s = s.clone();
            s.live_at_end.bytes = saturate(*live);
            devices.insert(d.to_string(), s);
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
        c.bytes_started = c.bytes_started.saturating_add(n.size);
        c.peak_live_bytes = c.peak_live_bytes.max(live.bytes(n.category));
        if n.category.is_device_memory() {
            self.peak = self.peak.max(live.device_bytes());
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

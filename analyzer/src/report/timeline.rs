//! The report's timeline, bucketed while the trace is read: live device, graph and host memory
//! in the buckets where it changed (at most [`POINTS`] of them), the largest allocations as
//! bands of their own, and markers at the moments that matter.
//!
//! Buckets are **sparse**: only a bucket in which memory changed is kept, so a long stretch
//! without allocations (CUDA start-up, an evaluation pass) costs nothing, and the resolution goes
//! where the activity is. The bucket width starts at 1 µs and doubles whenever more than
//! [`POINTS`] buckets would be kept. The page zooms into them; bands and markers keep their exact
//! times.
//!
//! Markers sit where the thing happened, not where it was found: a stale write at the free of
//! the allocation that was written to (the check that finds it runs much later, often at
//! exit), a stale launch at the launch, a crash at the signal.

use super::{BANDS, MARKERS, POINTS};
use crate::finding::{Fault, Finding, Kind, Renders};
use crate::regions::{Closed, Regions, UserNote, user_note};
use crate::track::{Category, Ended, Live, Node, Observer};
use crate::util::{hex, human_ns};
use crate::words::{self, call_result, cuda_error, plural, size};
use isolate_trace::{EndReason, Event, Note, NoteKind, Record};
use rustc_hash::FxHashSet;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Default)]
struct Bucket {
    /// Bucket index: it covers `[t0 + at * width, t0 + (at + 1) * width)`.
    at: u64,
    max: [u64; 3],
    last: [u64; 3],
    /// Allocations and frees in it.
    changes: u64,
}

impl Bucket {
    /// `self` followed by `later`.
    fn merge(&mut self, later: &Bucket) {
        for k in 0..3 {
            self.max[k] = self.max[k].max(later.max[k]);
        }
        self.last = later.last;
        self.changes = self.changes.saturating_add(later.changes);
    }
}

/// One allocation drawn as its own band. Times are from the trace's first event.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Band {
    pub id: u64,
    /// The event that made it (findings name freed allocations by it: [`Marker::alloc`]).
    pub seq: u64,
    pub api: &'static str,
    pub size: u64,
    pub ptr: String,
    pub from_ns: u64,
    /// Null when never freed.
    pub to_ns: Option<u64>,
    /// Trace format 2: the stack ids of its allocation and of its free (the page's `stacks`
    /// has them); absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub stack: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub free_stack: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Something to point at on the timeline.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Marker {
    /// From the trace's first event.
    pub t_ns: u64,
    /// Findings: `stale_write` (at the free of the memory written to), `stale_launch`,
    /// `invalid_free`; the end of the run: `device_fault`, `crash`; other events: `failure`,
    /// `oom_retry`.
    pub kind: &'static str,
    /// A few words drawn beside the marker.
    pub short: String,
    /// The whole story, for the tooltip.
    pub text: String,
    /// The freed allocation a stale write or stale launch is about (its allocation's sequence
    /// number): the page links the markers of one allocation.
    pub alloc: Option<u64>,
}

/// A stretch of the run the program named (`isolate_region_push`/`_pop`: a training step, a
/// test): the page draws them in a strip above the plot, outer ones first.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Region {
    pub from_ns: u64,
    pub to_ns: u64,
    pub label: String,
    /// 1 for an outermost region of its thread.
    pub depth: u64,
    /// The most device memory live while it was open.
    pub peak_live_bytes: u64,
}

/// The first view of the timeline when the run starts or ends with a long quiet stretch (CUDA
/// start-up, tear-down, a wait for the exit): where memory activity is.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FirstView {
    /// From the trace's first event.
    pub from_ns: u64,
    pub to_ns: u64,
    /// What is left out, for the page.
    pub text: String,
}

/// The bucketed timeline of one trace. Every time but `start_ns` counts from `start_ns`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Timeline {
    /// The trace's first event (trace clock).
    pub start_ns: u64,
    /// From the first event to the last record.
    pub span_ns: u64,
    pub bucket_ns: u64,
    /// The buckets in which memory changed, in time order: bucket `at[i]` covers
    /// `[at[i] * bucket_ns, (at[i] + 1) * bucket_ns)`.
    pub at: Vec<u64>,
    /// Per such bucket, the most live device memory in it (device + managed + handles)…
    pub device: Vec<u64>,
    /// … what was live at its end …
    pub device_end: Vec<u64>,
    /// … and the most graph memory and pinned host memory.
    pub graph: Vec<u64>,
    pub host: Vec<u64>,
    pub peak: u64,
    pub bands: Vec<Band>,
    pub markers: Vec<Marker>,
    pub marker_count: u64,
    /// The first [`MARKERS`] regions to close (a region open at the end lasts to the end).
    pub regions: Vec<Region>,
    pub region_count: u64,
    /// Null unless the run starts or ends with a long quiet stretch, which the page leaves out
    /// of its first view.
    pub first_view: Option<FirstView>,
}

/// What the timeline saw that the findings at the top of the page need.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// The first call that returned a device fault's code (700, 719, …) or the first
    /// device-fault note: when (from the first event), the code, the API and the event (none
    /// for a note).
    pub first_fault: Option<(u64, i64, Option<&'static str>, Option<u64>)>,
}

/// `allocations and frees`, counted.
fn changes(n: u64) -> String {
    if n == 1 {
        "1 allocation or free".into()
    } else {
        format!("{} allocations and frees", words::count(n))
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Scored {
    score: u128,
    id: u64,
    node: NodeLite,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct NodeLite {
    seq: u64,
    ptr: u64,
    size: u64,
    start: u64,
    end: Option<u64>,
    api: isolate_trace::Api,
    stack: u32,
    free_stack: u32,
}

pub(super) struct TimelineObs {
    t0: Option<u64>,
    width: u64,
    buckets: Vec<Bucket>,
    peak: u64,
    top: BinaryHeap<Reverse<Scored>>,
    /// `(ts, kind, short, text, alloc)`, absolute times.
    markers: Vec<(u64, &'static str, String, String, Option<u64>)>,
    marker_count: u64,
    /// Allocations whose stale write is marked already.
    written: FxHashSet<u64>,
    signal_marked: bool,
    last_ts: u64,
    seen: Seen,
    open: Regions,
    /// Closed regions, absolute times.
    regions: Vec<Closed>,
    region_count: u64,
    /// Marks among `markers`.
    marks: usize,
}

/// Marks kept as markers, so that a program marking often leaves room for the findings.
const MARKS: usize = MARKERS / 4;

impl TimelineObs {
    pub(super) fn new() -> Self {
        TimelineObs {
            t0: None,
            width: 1024,
            buckets: Vec::new(),
            peak: 0,
            top: BinaryHeap::new(),
            markers: Vec::new(),
            marker_count: 0,
            written: FxHashSet::default(),
            signal_marked: false,
            last_ts: 0,
            seen: Seen::default(),
            open: Regions::default(),
            regions: Vec::new(),
            region_count: 0,
            marks: 0,
        }
    }

    fn rel(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.t0.unwrap_or(ts))
    }

    /// Live memory after a change at `ts` (`changes`: 1 for an allocation or free, 0 for the
    /// closing sample).
    fn sample(&mut self, ts: u64, live: &Live, changes: u64) {
        let t0 = *self.t0.get_or_insert(ts);
        let v = [
            live.device_bytes(),
            live.bytes(Category::Graph),
            live.bytes(Category::Host),
        ];
        self.peak = self.peak.max(v[0]);
        let at = ts.saturating_sub(t0) / self.width;
        // Records come in sequence order, whose times are nearly (not quite) in order: the
        // bucket is almost always the last one.
        let i = match self.buckets.last() {
            Some(b) if b.at == at => self.buckets.len() - 1,
            Some(b) if b.at < at => self.push(at, v),
            None => self.push(at, v),
            Some(_) => match self.buckets.binary_search_by_key(&at, |b| b.at) {
                Ok(i) => i,
                Err(i) => {
                    self.buckets.insert(
                        i,
                        Bucket {
                            at,
                            max: v,
                            last: v,
                            changes: 0,
                        },
                    );
                    i
                }
            },
        };
        let b = &mut self.buckets[i];
        for (m, x) in b.max.iter_mut().zip(v) {
            *m = (*m).max(x);
        }
        b.last = v;
        b.changes += changes;
        if self.buckets.len() > POINTS {
            self.coarsen();
        }
    }

    fn push(&mut self, at: u64, v: [u64; 3]) -> usize {
        self.buckets.push(Bucket {
            at,
            max: v,
            last: v,
            changes: 0,
        });
        self.buckets.len() - 1
    }

    /// Doubles the bucket width until at most [`POINTS`] / 2 buckets are left… or at least
    /// until there are no more than [`POINTS`].
    fn coarsen(&mut self) {
        while self.buckets.len() > POINTS / 2 && self.width < u64::MAX / 2 {
            self.width *= 2;
            let old = std::mem::take(&mut self.buckets);
            for mut b in old {
                b.at /= 2;
                match self.buckets.last_mut() {
                    Some(l) if l.at == b.at => l.merge(&b),
                    _ => self.buckets.push(b),
                }
            }
        }
    }

    fn mark(
        &mut self,
        ts: u64,
        kind: &'static str,
        short: String,
        text: String,
        alloc: Option<u64>,
    ) {
        self.marker_count += 1;
        if self.markers.len() < MARKERS {
            self.markers.push((ts, kind, short, text, alloc));
        }
    }

    /// A mark (a thin marker) or a region's push or pop.
    fn user_note(&mut self, n: &Note, live: &Live) {
        match user_note(n) {
            Some(UserNote::Mark(text)) => {
                if self.marks < MARKS {
                    self.marks += 1;
                    self.mark(
                        n.ts_ns,
                        "mark",
                        text.to_owned(),
                        format!("mark: {text}"),
                        None,
                    );
                } else {
                    self.marker_count += 1;
                }
            }
            Some(UserNote::RegionPush(name)) => {
                self.open.push(n.ptr, name, n.ts_ns, live.device_bytes())
            }
            Some(UserNote::RegionPop(_)) => {
                if let Some(c) = self.open.pop(n.ptr, n.ts_ns) {
                    self.region(c);
                }
            }
            None => {}
        }
    }

    fn region(&mut self, c: Closed) {
        self.region_count += 1;
        if self.regions.len() < MARKERS {
            self.regions.push(c);
        }
    }

    fn offer(&mut self, n: &Node, end: Option<u64>, free_stack: u32) {
        if !n.category.is_device_memory() {
            return;
        }
        let life = end.unwrap_or(self.last_ts).saturating_sub(n.ts_ns).max(1);
        let s = Scored {
            score: u128::from(n.size) * u128::from(life),
            id: n.id,
            node: NodeLite {
                seq: n.seq,
                ptr: n.ptr,
                size: n.size,
                start: n.ts_ns,
                end,
                api: n.api,
                stack: n.stack,
                free_stack,
            },
        };
        if self.top.len() < BANDS {
            self.top.push(Reverse(s));
        } else if self.top.peek().is_some_and(|m| m.0 < s) {
            self.top.pop();
            self.top.push(Reverse(s));
        }
    }

    pub(super) fn into_timeline(self) -> (Timeline, Seen) {
        let t0 = self.t0.unwrap_or(0);
        let w = self.width;
        let rel = |ts: u64| ts.saturating_sub(t0);
        let span_ns = rel(self.last_ts);
        let mut bands: Vec<Band> = self
            .top
            .into_iter()
            .map(|Reverse(s)| Band {
                id: s.id,
                seq: s.node.seq,
                api: s.node.api.name(),
                size: s.node.size,
                ptr: hex(s.node.ptr),
                from_ns: rel(s.node.start),
                to_ns: s.node.end.map(rel),
                stack: s.node.stack,
                free_stack: s.node.free_stack,
            })
            .collect();
        bands.sort_by_key(|b| b.id);
        let mut markers: Vec<Marker> = self
            .markers
            .into_iter()
            .map(|(ts, kind, short, text, alloc)| Marker {
                t_ns: rel(ts),
                kind,
                short,
                text,
                alloc,
            })
            .collect();
        markers.sort_by_key(|m| m.t_ns);
        let serious = markers
            .iter()
            .filter(|m| !matches!(m.kind, "failure" | "oom_retry" | "mark"))
            .map(|m| m.t_ns);
        let serious = serious
            .clone()
            .min()
            .and_then(|lo| Some((lo, serious.max()?)));
        let first_view = first_view(&self.buckets, w, span_ns, serious);
        let mut regions: Vec<Region> = self
            .regions
            .into_iter()
            .map(|c| Region {
                from_ns: rel(c.from_ns),
                to_ns: rel(c.to_ns),
                label: c.name,
                depth: c.depth,
                peak_live_bytes: c.peak_live_bytes,
            })
            .collect();
        regions.sort_by_key(|r| (r.depth, r.from_ns));
        let b = &self.buckets;
        (
            Timeline {
                start_ns: t0,
                span_ns,
                bucket_ns: w,
                at: b.iter().map(|b| b.at).collect(),
                device: b.iter().map(|b| b.max[0]).collect(),
                device_end: b.iter().map(|b| b.last[0]).collect(),
                graph: b.iter().map(|b| b.max[1]).collect(),
                host: b.iter().map(|b| b.max[2]).collect(),
                peak: self.peak,
                bands,
                markers,
                marker_count: self.marker_count,
                regions,
                region_count: self.region_count,
                first_view,
            },
            self.seen,
        )
    }
}

/// What leaving out one allocation or free costs, against leaving out the whole run: a stretch
/// is left out of the first view when its share of the run's time is more than this many times
/// its share of the allocations and frees (it is at least ten times sparser than the run).
const SPARSE: f64 = 10.0;

/// Where the quiet start ends, if there is one worth skipping: of the moments where activity
/// resumes (a bucket's start), the one that leaves out the most time for the fewest
/// allocations and frees (time share minus [`SPARSE`] × share of changes), when it leaves out
/// at least a third of the run and 1 ms, at most 2% of the allocations and frees (or 16), with
/// at least 16 and four times as many after it, and no finding before it (`first_serious`).
/// Start-up need not be one pause: weights copied one by one while a data set loads are left
/// out as well. `(where the view starts, changes before, the pause just before it)`.
fn quiet_start(
    buckets: &[Bucket],
    w: u64,
    span_ns: u64,
    first_serious: Option<u64>,
) -> Option<(u64, u64, u64)> {
    let total: u64 = buckets.iter().map(|b| b.changes).sum();
    let allowed = (total / 50).max(16);
    let span = span_ns.max(1) as f64;
    let share = |changes: u64| changes as f64 / total.max(1) as f64;
    let mut best: Option<(f64, u64, u64, u64)> = None; // (score, until, changes before, pause)
    let mut before = 0u64;
    let mut end_prev = 0u64;
    for b in buckets {
        if before > allowed {
            break;
        }
        let start = b.at.saturating_mul(w);
        if first_serious.is_some_and(|t| start > t) {
            break;
        }
        if b.changes > 0 {
            let score = start as f64 / span - SPARSE * share(before);
            if best.is_none_or(|(s, ..)| score > s) {
                best = Some((score, start, before, start.saturating_sub(end_prev)));
            }
        }
        before += b.changes;
        end_prev = start.saturating_add(w);
    }
    let (score, until, changes, pause) = best?;
    let after = total - changes;
    if score <= 0.0
        || until < 1_000_000
        || until.saturating_mul(3) < span_ns
        || after < 16
        || after < changes.saturating_mul(4)
    {
        return None;
    }
    Some((until, changes, pause))
}

/// Where the quiet end begins, if there is one worth leaving out (tear-down, a wait for the
/// exit, frees at exit after a long pause): the end of a bucket, chosen as [`quiet_start`]
/// chooses, when what follows is at least a third of the time from `from` and 1 ms, with at
/// most 2% of the allocations and frees (or 16) and no finding or crash marked in it.
/// `(where the view ends, changes after)`.
fn quiet_end(
    buckets: &[Bucket],
    w: u64,
    span_ns: u64,
    from: u64,
    last_serious: Option<u64>,
) -> Option<(u64, u64)> {
    let total: u64 = buckets.iter().map(|b| b.changes).sum();
    let allowed = (total / 50).max(16);
    let span = span_ns.max(1) as f64;
    let mut best: Option<(f64, u64, u64)> = None; // (score, cut, changes after)
    let mut after = 0u64;
    for b in buckets.iter().rev() {
        if after > allowed {
            break;
        }
        let end = b.at.saturating_add(1).saturating_mul(w).min(span_ns);
        if last_serious.is_some_and(|t| end < t) || end <= from {
            break;
        }
        if b.changes > 0 {
            let score = (span_ns - end) as f64 / span - SPARSE * (after as f64 / total as f64);
            if best.is_none_or(|(s, ..)| score > s) {
                best = Some((score, end, after));
            }
        }
        after += b.changes;
    }
    let (score, cut, after) = best?;
    let tail = span_ns - cut;
    if score <= 0.0 || tail < 1_000_000 || tail.saturating_mul(3) < span_ns.saturating_sub(from) {
        return None;
    }
    Some((cut, after))
}

/// Where the first view starts and ends: past a quiet start, and short of a quiet end, with
/// every finding and crash in it.
fn first_view(
    buckets: &[Bucket],
    w: u64,
    span_ns: u64,
    serious: Option<(u64, u64)>,
) -> Option<FirstView> {
    let lead = quiet_start(buckets, w, span_ns, serious.map(|s| s.0));
    let from = lead.map_or(0, |(until, _, _)| until);
    let trail = quiet_end(buckets, w, span_ns, from, serious.map(|s| s.1));
    if lead.is_none() && trail.is_none() {
        return None;
    }
    let to = trail.map_or(span_ns, |t| t.0);
    // A little room on either side of the activity.
    let pad = to.saturating_sub(from) / 40;
    let from_ns = if lead.is_some() {
        from.saturating_sub(pad)
    } else {
        0
    };
    let to_ns = if trail.is_some() {
        to.saturating_add(pad).min(span_ns)
    } else {
        span_ns
    };
    let start = lead.map(|(until, changes, pause)| {
        if changes == 0 {
            format!(
                "the first {}, before anything was allocated",
                human_ns(until)
            )
        } else if pause.saturating_mul(2) >= until {
            format!(
                "the first {} ({}, then {} without any)",
                human_ns(until),
                self::changes(changes),
                human_ns(pause)
            )
        } else {
            format!(
                "the first {} (start-up: {} in it)",
                human_ns(until),
                self::changes(changes)
            )
        }
    });
    let end = trail.map(|(cut, after)| {
        if after == 0 {
            format!(
                "the last {}, without allocations or frees",
                human_ns(span_ns - cut)
            )
        } else {
            format!(
                "the last {} ({} in it)",
                human_ns(span_ns - cut),
                self::changes(after)
            )
        }
    });
    let text = match (start, end) {
        (Some(s), Some(e)) => format!("Left out of view: {s}, and {e}."),
        (Some(s), None) => format!("Left out of view: {s}."),
        (None, Some(e)) => format!("Left out of view: {e}."),
        (None, None) => return None,
    };
    Some(FirstView {
        from_ns,
        to_ns,
        text,
    })
}

/// How the page names an invalid free of kind `kind` (a [`crate::track::InvalidKind`] name).
fn free_word(kind: &str) -> &'static str {
    match kind {
        "free" => "free",
        "release" => "release",
        "unmap" => "unmap",
        "unregister" => "unregister",
        _ => "address free",
    }
}

impl Renders for TimelineObs {
    /// A finding's marker, where it happened (a stale write at the free of the memory written to).
    fn finding(&mut self, f: Finding<'_>, _live: &Live) {
        match f {
            Finding::InvalidFree(i) | Finding::DoubleFree(i) => {
                let what = free_word(&i.kind);
                self.mark(
                    i.ts_ns,
                    // Double frees too: the page marks them all as invalid frees.
                    Kind::InvalidFree.key(),
                    format!("invalid {what}"),
                    format!(
                        "invalid {what}: {} of {}, which was not allocated then",
                        i.api,
                        hex(i.ptr)
                    ),
                    None,
                );
            }
            Finding::StaleWrite(v) => {
                if self.written.contains(&v.alloc_seq) || self.markers.len() >= MARKERS {
                    self.marker_count += 1;
                    return;
                }
                self.written.insert(v.alloc_seq);
                self.mark(
                    v.freed_at_ns,
                    f.kind().key(),
                    "freed, then written to".into(),
                    format!(
                        "{} at {} freed here by {} ({}); written to after its free: {} changed \
                         from offset {} (found when the freed memory was checked, {} later)",
                        size(v.size),
                        hex(v.ptr),
                        v.free_api,
                        words::event(v.free_seq),
                        plural(v.changed_bytes, "byte"),
                        words::count(v.first_offset),
                        human_ns(v.ts_ns.saturating_sub(v.freed_at_ns))
                    ),
                    Some(v.alloc_seq),
                );
            }
            Finding::StaleLaunch(s) => self.mark(
                s.ts_ns,
                f.kind().key(),
                format!("kernel {}", short_name(&s.kernel)),
                format!(
                    "kernel {} ({}) launched with a pointer into freed memory: parameter {} = \
                     {}, into the {} at {} freed {} before",
                    s.kernel,
                    words::event(s.seq),
                    s.param_index,
                    hex(s.ptr),
                    size(s.alloc_size),
                    hex(s.alloc_ptr),
                    human_ns(s.ts_ns.saturating_sub(s.freed_at.ts_ns))
                ),
                Some(s.allocation),
            ),
            Finding::UnorderedFree(u) => self.mark(
                u.ts_ns,
                f.kind().key(),
                "freed while in use".into(),
                format!(
                    "the {} at {} freed by {} ({}) on {} while {} on {} may still use it \
                     (nothing ordered that use before the free)",
                    size(u.alloc_size),
                    hex(u.alloc_ptr),
                    u.free_api,
                    words::event(u.free_seq),
                    words::stream_name(u.free_stream),
                    if u.use_kernel {
                        format!("kernel {}", short_name(&u.use_name))
                    } else {
                        u.use_name.clone()
                    },
                    words::stream_name(u.use_stream)
                ),
                Some(u.alloc_seq),
            ),
            Finding::DeviceFault(Fault::Noted(d)) => {
                let code = i64::try_from(d.code).unwrap_or(i64::MAX);
                if self.seen.first_fault.is_none() {
                    self.seen.first_fault = Some((self.rel(d.ts_ns), code, None, None));
                }
                self.mark(
                    d.ts_ns,
                    f.kind().key(),
                    format!("device fault {code}"),
                    format!(
                        "the device faulted: CUDA error {}",
                        u64::try_from(code).map_or(code.to_string(), cuda_error)
                    ),
                    None,
                );
            }
            // Marked at the call, as every call that returned a fault code is (`event`).
            Finding::DeviceFault(Fault::Returned(_)) => {}
            // Growth has no moment: the findings at the top of the page show it.
            Finding::Leak(_) => {}
        }
    }
}

impl Observer for TimelineObs {
    fn event(&mut self, ev: &Event, _live: &Live) {
        self.last_ts = self.last_ts.max(ev.ts_ns);
        if self.t0.is_none() {
            self.t0 = Some(ev.ts_ns);
        }
        if !ev.ok() {
            let api = ev.api.name();
            let code = i64::from(ev.result);
            let what = if ev.api.kind() == isolate_trace::Kind::Alloc && ev.size > 0 {
                format!("{api} of {}", size(ev.size))
            } else {
                api.to_string()
            };
            let fault = u64::try_from(code)
                .ok()
                .filter(|&c| isolate_trace::device_fault_name(c).is_some());
            if let Some(c) = fault {
                if self.seen.first_fault.is_none() {
                    self.seen.first_fault =
                        Some((self.rel(ev.ts_ns), code, Some(api), Some(ev.seq)));
                }
                self.mark(
                    ev.ts_ns,
                    Kind::DeviceFault.key(),
                    format!("error {code} in {api}"),
                    format!(
                        "{what} returned CUDA error {}: a kernel before it faulted ({})",
                        call_result(ev.api, ev.result),
                        words::device_fault(c)
                    ),
                    None,
                );
            } else {
                self.mark(
                    ev.ts_ns,
                    "failure",
                    format!("{api} failed"),
                    format!(
                        "{what} failed: CUDA error {}",
                        call_result(ev.api, ev.result)
                    ),
                    None,
                );
            }
        }
    }
    fn started(&mut self, n: &Node, live: &Live) {
        self.sample(n.ts_ns, live, 1);
        if !self.open.none_open() {
            self.open.sample(live.device_bytes());
        }
    }
    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        self.sample(e.ts_ns, live, 1);
        self.offer(n, Some(e.ts_ns), e.stack);
    }
    fn other(&mut self, rec: &Record, live: &Live) {
        // The span runs to the last thing recorded, as the summary's does (`span_ns`).
        if let Record::Note(n) = rec {
            self.last_ts = self.last_ts.max(n.ts_ns);
        }
        match rec {
            Record::Note(n) if user_note(n).is_some() => self.user_note(n, live),
            Record::Note(n) if n.kind == NoteKind::Signal => {
                self.last_ts = self.last_ts.max(n.ts_ns);
                self.signal_marked = true;
                self.mark(
                    n.ts_ns,
                    "crash",
                    format!("signal {}", n.value),
                    format!("the process got signal {}", words::signal(n.value)),
                    None,
                );
            }
            Record::Note(n) if n.kind == NoteKind::OomRetry => self.mark(
                n.ts_ns,
                "oom_retry",
                "retried".into(),
                format!(
                    "an allocation of {} ran out of memory and was retried after freed memory \
                     held back by isolate mode was released",
                    size(n.size)
                ),
                None,
            ),
            Record::End(e) => {
                self.last_ts = self.last_ts.max(e.ts_ns);
                if let EndReason::Signal(s) = e.reason
                    && !self.signal_marked
                {
                    let s = u64::try_from(s).unwrap_or(0);
                    self.mark(
                        e.ts_ns,
                        "crash",
                        format!("signal {s}"),
                        format!("the process was killed by signal {}", words::signal(s)),
                        None,
                    );
                }
            }
            _ => {}
        }
    }
    fn finish(&mut self, still: &[Node], live: &Live) {
        let end = self.last_ts;
        for c in self.open.close_all(end) {
            self.region(c);
        }
        if self.t0.is_some() && !self.buckets.is_empty() {
            self.sample(end, live, 0);
        }
        for n in still {
            self.offer(n, None, 0);
        }
    }
}

/// A kernel's name without return type, namespaces, template arguments and parameters, for a
/// label: `void at::native::k<4>(int)` is `k`.
fn short_name(kernel: &str) -> String {
    let cut = kernel.find(['(', '<']).unwrap_or(kernel.len());
    let base = kernel[..cut].trim();
    let base = base.rsplit(' ').next().unwrap_or(base);
    let base = base.rsplit("::").next().unwrap_or(base);
    if base.is_empty() {
        return "?".into();
    }
    if base.chars().count() > 40 {
        let mut s: String = base.chars().take(39).collect();
        s.push('…');
        return s;
    }
    base.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(at: u64, changes: u64) -> Bucket {
        Bucket {
            at,
            changes,
            ..Bucket::default()
        }
    }

    #[test]
    fn a_quiet_start_is_found() {
        // 4 changes in the first bucket, 3.7 s of nothing, then 2000 changes.
        let w = 1_000_000;
        let mut bs = vec![b(0, 4)];
        bs.extend((3700..3900).map(|i| b(i, 10)));
        assert_eq!(
            quiet_start(&bs, w, 3_900_000_000, None),
            Some((3_700_000_000, 4, 3_699_000_000))
        );
        let v = first_view(&bs, w, 3_900_000_000, None).unwrap();
        assert_eq!(
            (v.from_ns, v.to_ns),
            (3_700_000_000 - 5_000_000, 3_900_000_000)
        );
        assert_eq!(
            v.text,
            "Left out of view: the first 3.70 s (4 allocations and frees, then 3.70 s without any)."
        );
    }

    #[test]
    fn a_busy_start_is_not_skipped() {
        let w = 1_000_000;
        // Activity all along, with one pause of a fifth of the run.
        let mut bs: Vec<Bucket> = (0..400).map(|i| b(i, 10)).collect();
        bs.extend((500..900).map(|i| b(i, 10)));
        assert_eq!(quiet_start(&bs, w, 900_000_000, None), None);
        assert_eq!(first_view(&bs, w, 900_000_000, None), None);
        // A long pause, but after most of the work.
        let mut bs: Vec<Bucket> = (0..400).map(|i| b(i, 10)).collect();
        bs.push(b(5000, 1));
        assert_eq!(quiet_start(&bs, w, 5_001_000_000, None), None);
    }

    #[test]
    fn a_quiet_end_is_left_out_unless_something_is_marked_there() {
        // 14 changes in 7 ms, then a long wait for the exit.
        let w = 1_000_000;
        let mut bs: Vec<Bucket> = (0..7).map(|i| b(i, 2)).collect();
        bs.push(b(560, 0));
        assert_eq!(quiet_start(&bs, w, 561_000_000, None), None);
        let v = first_view(&bs, w, 561_000_000, Some((3_000_000, 3_000_000))).unwrap();
        assert_eq!((v.from_ns, v.to_ns), (0, 7_000_000 + 175_000));
        assert_eq!(
            v.text,
            "Left out of view: the last 554.00 ms, without allocations or frees."
        );
        // A crash at the end keeps the end in view.
        assert_eq!(
            first_view(&bs, w, 561_000_000, Some((561_000_000, 561_000_000))),
            None
        );
    }

    #[test]
    fn both_ends() {
        let w = 1_000_000;
        let mut bs = vec![b(0, 4)];
        bs.extend((3700..4100).map(|i| b(i, 5)));
        bs.push(b(4740, 0));
        let v = first_view(&bs, w, 4_740_000_000, None).unwrap();
        assert_eq!((v.from_ns, v.to_ns), (3_690_000_000, 4_110_000_000));
        assert!(
            v.text
                .ends_with("and the last 640.00 ms, without allocations or frees."),
            "{}",
            v.text
        );
    }

    #[test]
    fn a_start_up_of_scattered_allocations_is_left_out() {
        // Weights copied one by one over 5 s (20 allocations, 250 ms apart), then 2 s of
        // training with 4,000 allocations and frees: no single pause is a third of the run.
        let w = 1_000_000;
        let mut bs: Vec<Bucket> = (0..20).map(|i| b(i * 250, 1)).collect();
        bs.extend((5000..7000).map(|i| b(i, 2)));
        let span = 7_000_000_000;
        assert_eq!(
            quiet_start(&bs, w, span, None),
            Some((5_000_000_000, 20, 249_000_000))
        );
        let v = first_view(&bs, w, span, None).unwrap();
        assert_eq!((v.from_ns, v.to_ns), (5_000_000_000 - 50_000_000, span));
        assert_eq!(
            v.text,
            "Left out of view: the first 5.00 s (start-up: 20 allocations and frees in it)."
        );
        // A finding in the start-up keeps it in view.
        assert_eq!(quiet_start(&bs, w, span, Some(1_000_000_000)), None);
        // Spread evenly, nothing is left out.
        let even: Vec<Bucket> = (0..7000).map(|i| b(i, 1)).collect();
        assert_eq!(first_view(&even, w, span, None), None);
    }

    #[test]
    fn frees_at_exit_after_a_long_pause_are_left_out() {
        // 2 s of training, 6 s of evaluation without device memory, 150 frees at exit.
        let w = 1_000_000;
        let mut bs: Vec<Bucket> = (0..2000).map(|i| b(i, 4)).collect();
        bs.push(b(7999, 150));
        let span = 8_000_000_000;
        assert_eq!(quiet_end(&bs, w, span, 0, None), Some((2_000_000_000, 150)));
        let v = first_view(&bs, w, span, None).unwrap();
        assert_eq!((v.from_ns, v.to_ns), (0, 2_050_000_000));
        assert_eq!(
            v.text,
            "Left out of view: the last 6.00 s (150 allocations and frees in it)."
        );
    }

    #[test]
    fn a_late_first_allocation_is_skipped() {
        let bs: Vec<Bucket> = (2000..2100).map(|i| b(i, 3)).collect();
        let v = first_view(&bs, 1_000_000, 2_100_000_000, None).unwrap();
        assert_eq!(
            (v.from_ns, v.to_ns),
            (2_000_000_000 - 2_500_000, 2_100_000_000)
        );
        assert_eq!(
            v.text,
            "Left out of view: the first 2.00 s, before anything was allocated."
        );
    }

    #[test]
    fn kernel_names_are_shortened() {
        assert_eq!(short_name("void k<float>(float*)"), "k");
        assert_eq!(short_name("stale_fill"), "stale_fill");
        assert_eq!(
            short_name("void at::native::vectorized_elementwise_kernel<4>(int)"),
            "vectorized_elementwise_kernel"
        );
        assert_eq!(short_name(&"x".repeat(50)).chars().count(), 40);
    }
}

//! The report's timeline, bucketed while the trace is read: live device, graph and host memory
//! per column (at most [`COLUMNS`] of them), the largest allocations as bands of their own, and
//! markers for failures and findings.

use super::{BANDS, COLUMNS, MARKERS};
use crate::track::{Category, Ended, Invalid, Live, Node, Observer};
use crate::util::hex;
use isolate_trace::{Event, Record};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Default)]
struct Bucket {
    max: [u64; 3],
    last: [u64; 3],
    touched: bool,
}

/// One allocation drawn as its own band.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Band {
    pub id: u64,
    pub api: &'static str,
    pub size: u64,
    pub ptr: String,
    pub start_ns: u64,
    /// Null when never freed.
    pub end_ns: Option<u64>,
    /// First and last column it covers.
    pub c0: usize,
    pub c1: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Marker {
    pub ts_ns: u64,
    pub col: usize,
    /// `failure`, `invalid_free`, `stale_write`, `stale_launch`, `device_fault`, `signal`, `oom_retry`.
    pub kind: &'static str,
    pub label: String,
}

/// The bucketed timeline of one trace.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Timeline {
    pub t0_ns: u64,
    pub bucket_ns: u64,
    pub columns: usize,
    /// Per column, the most live bytes seen in it: device (device + managed + handles), graph, host.
    pub device: Vec<u64>,
    pub graph: Vec<u64>,
    pub host: Vec<u64>,
    pub bands: Vec<Band>,
    pub markers: Vec<Marker>,
    pub marker_count: u64,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Scored {
    score: u128,
    id: u64,
    node: NodeLite,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct NodeLite {
    ptr: u64,
    size: u64,
    start: u64,
    end: Option<u64>,
    api: isolate_trace::Api,
}

pub(super) struct TimelineObs {
    t0: Option<u64>,
    width: u64,
    buckets: Vec<Bucket>,
    top: BinaryHeap<Reverse<Scored>>,
    markers: Vec<(u64, &'static str, String)>,
    marker_count: u64,
    last_ts: u64,
}

impl TimelineObs {
    pub(super) fn new() -> Self {
        TimelineObs {
            t0: None,
            width: 1024,
            buckets: Vec::new(),
            top: BinaryHeap::new(),
            markers: Vec::new(),
            marker_count: 0,
            last_ts: 0,
        }
    }

    fn sample(&mut self, ts: u64, live: &Live) {
        let t0 = *self.t0.get_or_insert(ts);
        let mut idx = (ts.saturating_sub(t0) / self.width) as usize;
        while idx >= COLUMNS {
            // Halve the resolution: merge pairs of columns.
            let old = std::mem::take(&mut self.buckets);
            for pair in old.chunks(2) {
                let mut b = pair[0];
                if let Some(c) = pair.get(1)
                    && c.touched
                {
                    for k in 0..3 {
                        b.max[k] = if b.touched {
                            b.max[k].max(c.max[k])
                        } else {
                            c.max[k]
                        };
                    }
                    b.last = c.last;
                    b.touched = true;
                }
                self.buckets.push(b);
            }
            self.width *= 2;
            idx = (ts.saturating_sub(t0) / self.width) as usize;
        }
        if self.buckets.len() <= idx {
            self.buckets.resize(idx + 1, Bucket::default());
        }
        let v = [
            live.device_bytes(),
            live.bytes(Category::Graph),
            live.bytes(Category::Host),
        ];
        let b = &mut self.buckets[idx];
        for (m, x) in b.max.iter_mut().zip(v) {
            *m = if b.touched { (*m).max(x) } else { x };
        }
        b.last = v;
        b.touched = true;
    }

    fn mark(&mut self, ts: u64, kind: &'static str, label: String) {
        self.marker_count += 1;
        if self.markers.len() < MARKERS {
            self.markers.push((ts, kind, label));
        }
    }

    fn offer(&mut self, n: &Node, end: Option<u64>) {
        if !n.category.is_device_memory() {
            return;
        }
        let life = end.unwrap_or(self.last_ts).saturating_sub(n.ts_ns).max(1);
        let s = Scored {
            score: u128::from(n.size) * u128::from(life),
            id: n.id,
            node: NodeLite {
                ptr: n.ptr,
                size: n.size,
                start: n.ts_ns,
                end,
                api: n.api,
            },
        };
        if self.top.len() < BANDS {
            self.top.push(Reverse(s));
        } else if self.top.peek().is_some_and(|m| m.0 < s) {
            self.top.pop();
            self.top.push(Reverse(s));
        }
    }

    pub(super) fn into_timeline(self) -> Timeline {
        let t0 = self.t0.unwrap_or(0);
        let w = self.width;
        let mut cols: [Vec<u64>; 3] = Default::default();
        let mut entering = [0u64; 3];
        for b in &self.buckets {
            for k in 0..3 {
                let v = if b.touched {
                    b.max[k].max(entering[k])
                } else {
                    entering[k]
                };
                cols[k].push(v);
            }
            if b.touched {
                entering = b.last;
            }
        }
        let n = self.buckets.len();
        let col = |ts: u64| ((ts.saturating_sub(t0) / w) as usize).min(n.saturating_sub(1));
        let mut bands: Vec<Band> = self
            .top
            .into_iter()
            .map(|Reverse(s)| Band {
                id: s.id,
                api: s.node.api.name(),
                size: s.node.size,
                ptr: hex(s.node.ptr),
                start_ns: s.node.start,
                end_ns: s.node.end,
                c0: col(s.node.start),
                c1: col(s.node.end.unwrap_or(u64::MAX)),
            })
            .collect();
        bands.sort_by_key(|b| b.id);
        let markers = self
            .markers
            .into_iter()
            .map(|(ts, kind, label)| Marker {
                ts_ns: ts,
                col: col(ts),
                kind,
                label,
            })
            .collect();
        let [device, graph, host] = cols;
        Timeline {
            t0_ns: t0,
            bucket_ns: w,
            columns: n,
            device,
            graph,
            host,
            bands,
            markers,
            marker_count: self.marker_count,
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
            self.mark(
                ev.ts_ns,
                "failure",
                format!(
                    "{} failed with {} (size {})",
                    ev.api.name(),
                    ev.result,
                    ev.size
                ),
            );
        }
    }
    fn started(&mut self, n: &Node, live: &Live) {
        self.sample(n.ts_ns, live);
    }
    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        self.sample(e.ts_ns, live);
        self.offer(n, Some(e.ts_ns));
    }
    fn invalid(&mut self, inv: &Invalid, _live: &Live) {
        let ev = inv.event;
        self.mark(
            ev.ts_ns,
            "invalid_free",
            format!(
                "invalid {} of {} by {}",
                inv.kind.name(),
                hex(ev.ptr),
                ev.api.name()
            ),
        );
    }
    fn other(&mut self, rec: &Record, _live: &Live) {
        match rec {
            Record::Violation(v) => self.mark(
                v.ts_ns,
                "stale_write",
                format!(
                    "stale write: {} bytes of {} ({} B) changed after the free",
                    v.changed_bytes,
                    hex(v.ptr),
                    v.size
                ),
            ),
            Record::StaleLaunch(s) => self.mark(
                s.ts_ns,
                "stale_launch",
                format!(
                    "stale launch: {} param {} = {}",
                    s.kernel,
                    s.param_index,
                    hex(s.ptr)
                ),
            ),
            Record::Note(n) if n.kind == isolate_trace::NoteKind::DeviceFault => self.mark(
                n.ts_ns,
                "device_fault",
                format!(
                    "device fault: CUDA error {} ({})",
                    n.value,
                    crate::summary::fault_name(n.value)
                ),
            ),
            Record::Note(n) if n.kind == isolate_trace::NoteKind::Signal => {
                self.mark(n.ts_ns, "signal", format!("signal {}", n.value))
            }
            Record::Note(n) if n.kind == isolate_trace::NoteKind::OomRetry => self.mark(
                n.ts_ns,
                "oom_retry",
                format!(
                    "allocation of {} B retried after releasing quarantine",
                    n.size
                ),
            ),
            _ => {}
        }
    }
    fn finish(&mut self, still: &[Node], live: &Live) {
        let end = self.last_ts;
        if self.t0.is_some() {
            self.sample(end, live);
        }
        for n in still {
            self.offer(n, None);
        }
    }
}

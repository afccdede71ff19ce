//! `isolate report`: one self-contained HTML page (inline script and style, nothing fetched).
//!
//! Live device memory over time, stacked by allocation like PyTorch's memory viewer: the
//! largest allocations (by bytes × lifetime) get their own band, everything else is one "other"
//! band. The time axis is bucketed here, while reading, into at most [`COLUMNS`] columns (the
//! bucket width doubles whenever the trace outgrows them), so a trace of a million events makes
//! a page of a few hundred kilobytes that draws on a canvas at once. Failures and violations are
//! marked on the timeline; below it the top reuse chains (connected parts of the aliasing
//! graph) and the summary tables.
//!
//! All text from the trace reaches the page only as JSON inside a `<script type=
//! "application/json">` element, escaped with [`json_for_script`], and the script puts it into
//! the page with `textContent`, never as HTML.

use crate::Error;
use crate::graph::{
    Anomaly, Edge, EdgeKind, Filter, GraphBuilder, GraphNode, GraphSink, GraphTrace,
};
use crate::source::{Progress, TraceInfo, analyze};
use crate::summary::{Summarizer, TraceSummary};
use crate::track::{Category, Ended, Invalid, Live, Node, Observer};
use crate::util::{escape_html, hex, json_for_script};
use isolate_trace::{Event, Record};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

/// The most columns of the timeline.
pub const COLUMNS: usize = 2048;
/// Allocations drawn as their own band.
pub const BANDS: usize = 160;
/// Markers kept per trace.
pub const MARKERS: usize = 4000;
/// Reuse chains shown.
pub const CHAINS: usize = 12;

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

struct TimelineObs {
    t0: Option<u64>,
    width: u64,
    buckets: Vec<Bucket>,
    top: BinaryHeap<Reverse<Scored>>,
    markers: Vec<(u64, &'static str, String)>,
    marker_count: u64,
    last_ts: u64,
}

impl TimelineObs {
    fn new() -> Self {
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

    fn into_timeline(self) -> Timeline {
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

/// One node of a reuse chain, for the page.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ChainNode {
    pub id: u64,
    pub api: &'static str,
    pub ptr: String,
    pub size: u64,
    pub alloc_ts_ns: u64,
    pub free_ts_ns: Option<u64>,
}

/// A connected part of the reuse graph: allocations that took over each other's memory.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Chain {
    pub allocations: u64,
    pub reuse_edges: u64,
    pub bytes: u64,
    pub lo: String,
    pub hi: String,
    pub first_ns: u64,
    pub last_ns: u64,
    /// The first allocations of the chain, in order.
    pub sample: Vec<ChainNode>,
}

/// Finds the connected parts of the reuse graph with a union-find over node slots. Edges come
/// before the nodes they lead to, so a slot is made for whichever id shows up first.
#[derive(Default)]
struct ChainSink {
    nodes: Vec<Option<GraphNode>>,
    index: rustc_hash::FxHashMap<u64, u32>,
    parent: Vec<u32>,
    edges: Vec<u32>,
    anomalies: Vec<Anomaly>,
    leaks: Vec<(u64, u64, &'static str, u64)>,
}

impl ChainSink {
    fn slot(&mut self, id: u64) -> u32 {
        if let Some(&i) = self.index.get(&id) {
            return i;
        }
        let i = self.nodes.len() as u32;
        self.index.insert(id, i);
        self.nodes.push(None);
        self.parent.push(i);
        self.edges.push(0);
        i
    }

    fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let p = self.parent[x as usize];
            self.parent[x as usize] = self.parent[p as usize];
            x = p;
        }
        x
    }

    fn chains(&mut self) -> Vec<Chain> {
        let n = self.nodes.len();
        let mut size = vec![0u64; n];
        let mut edges = vec![0u64; n];
        let roots_of: Vec<u32> = (0..n as u32).map(|i| self.find(i)).collect();
        for (i, &r) in roots_of.iter().enumerate() {
            size[r as usize] += 1;
            edges[r as usize] += u64::from(self.edges[i]);
        }
        let id_of =
            |i: usize, nodes: &[Option<GraphNode>]| nodes[i].as_ref().map_or(u64::MAX, |g| g.id);
        let mut roots: Vec<usize> = (0..n)
            .filter(|&i| size[i] > 1 && roots_of[i] as usize == i)
            .collect();
        roots.sort_by_key(|&r| (Reverse(size[r]), id_of(r, &self.nodes)));
        roots.truncate(CHAINS);
        let mut out = Vec::new();
        for r in roots {
            let mut ns: Vec<&GraphNode> = (0..n)
                .filter(|&i| roots_of[i] as usize == r)
                .filter_map(|i| self.nodes[i].as_ref())
                .collect();
            ns.sort_by_key(|g| g.id);
            out.push(Chain {
                allocations: size[r],
                reuse_edges: edges[r],
                bytes: ns.iter().map(|g| g.size).sum(),
                lo: hex(ns.iter().map(|g| g.ptr).min().unwrap_or(0)),
                hi: hex(ns
                    .iter()
                    .map(|g| g.ptr.saturating_add(g.size))
                    .max()
                    .unwrap_or(0)),
                first_ns: ns.iter().map(|g| g.alloc_ts_ns).min().unwrap_or(0),
                last_ns: ns
                    .iter()
                    .map(|g| g.free_ts_ns.unwrap_or(g.alloc_ts_ns))
                    .max()
                    .unwrap_or(0),
                sample: ns
                    .iter()
                    .take(16)
                    .map(|g| ChainNode {
                        id: g.id,
                        api: g.api,
                        ptr: hex(g.ptr),
                        size: g.size,
                        alloc_ts_ns: g.alloc_ts_ns,
                        free_ts_ns: g.free_ts_ns,
                    })
                    .collect(),
            });
        }
        out
    }
}

impl GraphSink for ChainSink {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        if n.free_seq.is_none() && matches!(n.category, "device" | "managed" | "handle" | "graph") {
            self.leaks.push((n.size, n.id, n.api, n.ptr));
        }
        let i = self.slot(n.id);
        self.nodes[i as usize] = Some(n.clone());
        Ok(())
    }
    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        if e.kind != EdgeKind::Reuse {
            return Ok(());
        }
        let (a, b) = (self.slot(e.from), self.slot(e.to));
        let (ra, rb) = (self.find(a), self.find(b));
        self.edges[b as usize] += 1;
        if ra != rb {
            self.parent[ra.max(rb) as usize] = ra.min(rb);
        }
        Ok(())
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        if self.anomalies.len() < 500 {
            self.anomalies.push(a.clone());
        }
        Ok(())
    }
    fn finish(&mut self, _: &[GraphTrace], _: &Filter) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Serialize)]
struct Leak {
    id: u64,
    api: &'static str,
    size: u64,
    ptr: String,
}

#[derive(Serialize)]
struct TracePage {
    summary: TraceSummary,
    timeline: Timeline,
    chains: Vec<Chain>,
    anomalies: Vec<Anomaly>,
    leaks: Vec<Leak>,
    leak_count: usize,
}

#[derive(Serialize)]
struct Page {
    generator: String,
    traces: Vec<TracePage>,
}

fn one(
    path: &Path,
    index: usize,
    progress: &mut dyn Progress,
) -> Result<(TracePage, TraceInfo), Error> {
    let mut sink = ChainSink::default();
    let mut obs = (
        Summarizer::new(index),
        (
            TimelineObs::new(),
            GraphBuilder::new(&mut sink, Filter::default()),
        ),
    );
    let info = analyze(path, progress, &mut obs)?;
    let (summ, (tl, builder)) = obs;
    builder.finish()?;
    let mut summary = summ.into_summary(&info);
    summary.totals.invalid_frees.truncate(200);
    summary.totals.poison_violations.truncate(200);
    summary.totals.stale_launches.truncate(200);
    let chains = sink.chains();
    let leak_count = sink.leaks.len();
    sink.leaks.sort_by_key(|l| (Reverse(l.0), l.1));
    let leaks = sink
        .leaks
        .iter()
        .take(100)
        .map(|&(size, id, api, ptr)| Leak {
            id,
            api,
            size,
            ptr: hex(ptr),
        })
        .collect();
    let anomalies = sink
        .anomalies
        .iter()
        .filter(|a| !matches!(a, Anomaly::NeverFreed { .. }))
        .cloned()
        .collect();
    Ok((
        TracePage {
            summary,
            timeline: tl.into_timeline(),
            chains,
            anomalies,
            leaks,
            leak_count,
        },
        info,
    ))
}

/// A rendered report.
pub struct Report {
    /// The whole HTML document.
    pub html: String,
    /// What was read of each trace (whether it was truncated, …).
    pub traces: Vec<TraceInfo>,
}

/// Renders the report of `paths` as one HTML document.
pub fn render<P: AsRef<Path>>(paths: &[P], progress: &mut dyn Progress) -> Result<Report, Error> {
    let mut traces = Vec::new();
    let mut title = Vec::new();
    let mut infos = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let (page, info) = one(p.as_ref(), i, progress)?;
        title.push(format!("{} (pid {})", info.file, info.header.pid));
        traces.push(page);
        infos.push(info);
    }
    let page = Page {
        generator: format!("isolate {}", env!("CARGO_PKG_VERSION")),
        traces,
    };
    let json = serde_json::to_string(&page).map_err(|e| Error::invalid(e.to_string()))?;
    // Split the template rather than search-and-replace in it, so that nothing from the trace
    // can ever be taken for a placeholder.
    let (head, rest) = TEMPLATE.split_once("{{TITLE}}").unwrap_or((TEMPLATE, ""));
    let (mid, tail) = rest.split_once("{{DATA}}").unwrap_or((rest, ""));
    let title = escape_html(&format!("isolate report: {}", title.join(", ")));
    let data = json_for_script(&json);
    let mut out = String::with_capacity(TEMPLATE.len() + title.len() + data.len());
    out.push_str(head);
    out.push_str(&title);
    out.push_str(mid);
    out.push_str(&data);
    out.push_str(tail);
    Ok(Report {
        html: out,
        traces: infos,
    })
}

const TEMPLATE: &str = include_str!("report.html");

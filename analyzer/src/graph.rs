//! `isolate graph`: the aliasing graph — which allocation was handed memory that which other
//! had given back, how virtual ranges map physical handles, and what looks wrong.
//!
//! One node per [`Node`] of the model (allocations, registrations, reservations, handles,
//! mappings). Edges:
//!
//! - `reuse` A→B: B was given memory overlapping A's after A ended. Only the most recent previous
//!   occupant of each overlapping part gets an edge (a freed range is remembered as disjoint
//!   pieces, each naming its last occupant; an allocation consumes the pieces it overlaps), so
//!   there are at most a few edges per allocation. `overlap_bytes` is the overlap, `gap_ns` the
//!   time between A's end and B's start. Reuse is tracked per address space: device memory and
//!   mappings, graph memory, pinned host memory, registered host memory, reservations.
//! - `maps` M→H: mapping M maps (part of) physical handle H; `overlap_bytes` is its size.
//! - `contains` R→M: reservation R holds mapping M.
//! - `alias` M1→M2: two mappings of the same handle, live at once, over the same handle bytes
//!   (a true alias: two addresses for the same memory); also listed as an anomaly.
//!
//! Anomalies: `overlap` (two live allocations overlap), `invalid_free`, `never_freed`,
//! `true_alias`, `stale_launch` and `poison_violation` (tied to the freed node they hit).
//!
//! Nodes are handed to a [`GraphSink`] when they end (never-freed ones at the end of their trace,
//! in start order), so the graph of a long trace never has to be held whole; edges and anomalies
//! come after all nodes, once filters have decided which nodes stay.

use crate::Error;
use crate::source::{Progress, TraceInfo, analyze};
use crate::track::{Category, EndHow, Ended, Invalid, Live, Node, Observer};
use crate::util::{escape_dot, hex, human_bytes, ser_hex, size_class};
use isolate_trace::{Header, Record};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Which chains to keep. Every filter set must hold; edges and anomalies stay when the nodes
/// they name do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Filter {
    /// Keep nodes that cover this address (and the handles mapped there).
    #[serde(serialize_with = "ser_opt_hex")]
    pub address: Option<u64>,
    /// Keep nodes whose [`size_class`] is that of this size.
    pub size_class: Option<u64>,
    /// Keep nodes live at some time in `[from, to]` (trace clock, ns, as in `alloc_ts_ns`).
    pub from_ns: Option<u64>,
    pub to_ns: Option<u64>,
}

fn ser_opt_hex<S: serde::Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&hex(*v)),
        None => s.serialize_none(),
    }
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    fn keep(&self, n: &Node, end: Option<&Ended>, wanted_handle: bool) -> bool {
        if let Some(a) = self.address {
            let hit = if n.category == Category::Handle {
                wanted_handle
            } else {
                n.covers(a)
            };
            if !hit {
                return false;
            }
        }
        if let Some(c) = self.size_class
            && size_class(n.size) != size_class(c)
        {
            return false;
        }
        if let Some(f) = self.from_ns
            && end.is_some_and(|e| e.ts_ns < f)
        {
            return false;
        }
        if let Some(t) = self.to_ns
            && n.ts_ns > t
        {
            return false;
        }
        true
    }
}

/// A node as the graph outputs show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GraphNode {
    /// Unique over all traces of one graph (traces are numbered in the order given).
    pub id: u64,
    pub trace: usize,
    /// `device`, `managed`, `graph`, `host`, `registered`, `reservation`, `handle`, `mapping`.
    pub category: &'static str,
    pub api: &'static str,
    pub device: i32,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    pub size: u64,
    #[serde(serialize_with = "ser_hex")]
    pub handle: u64,
    pub offset: u64,
    pub tid: u32,
    #[serde(serialize_with = "ser_hex")]
    pub stream: u64,
    pub alloc_seq: u64,
    pub alloc_ts_ns: u64,
    pub free_seq: Option<u64>,
    pub free_ts_ns: Option<u64>,
    pub free_api: Option<&'static str>,
    /// Its start address was handed out again while it was live (its free was never seen).
    pub lost: bool,
    /// For a mapping: the reservation holding it and the handle it maps.
    pub reservation: Option<u64>,
    pub handle_node: Option<u64>,
}

/// What an edge says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    Reuse,
    Maps,
    Contains,
    Alias,
}

impl EdgeKind {
    pub fn name(self) -> &'static str {
        match self {
            EdgeKind::Reuse => "reuse",
            EdgeKind::Maps => "maps",
            EdgeKind::Contains => "contains",
            EdgeKind::Alias => "alias",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Edge {
    pub from: u64,
    pub to: u64,
    pub kind: EdgeKind,
    pub overlap_bytes: u64,
    /// For `reuse`: ns from the end of `from` to the start of `to`.
    pub gap_ns: Option<u64>,
}

/// Something that looks wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Anomaly {
    /// Two live allocations overlap (`nodes`: the older, then the newer).
    Overlap { nodes: [u64; 2], overlap_bytes: u64 },
    /// A successful call gave back what was not live.
    InvalidFree {
        trace: usize,
        /// `free`, `address_free`, `release`, `unmap`, `unregister`.
        what: &'static str,
        seq: u64,
        ts_ns: u64,
        api: &'static str,
        tid: u32,
        #[serde(serialize_with = "ser_hex")]
        ptr: u64,
        /// The node that last occupied `ptr`, if any.
        after: Option<u64>,
        /// That node started at `ptr` and was freed already: this is a double free.
        double_free: bool,
    },
    /// Still live at the end of its trace.
    NeverFreed {
        node: u64,
        category: &'static str,
        size: u64,
    },
    /// Two live mappings of the same handle bytes.
    TrueAlias {
        nodes: [u64; 2],
        #[serde(serialize_with = "ser_hex")]
        handle: u64,
        overlap_bytes: u64,
    },
    /// A kernel was launched with a pointer into a freed node.
    StaleLaunch {
        node: Option<u64>,
        trace: usize,
        seq: u64,
        kernel: String,
        #[serde(serialize_with = "ser_hex")]
        ptr: u64,
    },
    /// A freed node's poison changed while it sat in quarantine.
    PoisonViolation {
        node: Option<u64>,
        trace: usize,
        seq: u64,
        #[serde(serialize_with = "ser_hex")]
        ptr: u64,
        changed_bytes: u64,
    },
}

impl Anomaly {
    fn nodes(&self) -> Vec<u64> {
        match self {
            Anomaly::Overlap { nodes, .. } | Anomaly::TrueAlias { nodes, .. } => nodes.to_vec(),
            Anomaly::InvalidFree { after, .. } => after.iter().copied().collect(),
            Anomaly::NeverFreed { node, .. } => vec![*node],
            Anomaly::StaleLaunch { node, .. } | Anomaly::PoisonViolation { node, .. } => {
                node.iter().copied().collect()
            }
        }
    }
}

/// One trace of the graph (the header parts people need to tell traces apart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GraphTrace {
    pub index: usize,
    pub file: String,
    pub pid: u32,
    pub rank: Option<u32>,
    pub exe: String,
    pub argv: Vec<String>,
    pub truncated: Option<u64>,
    pub complete: bool,
}

/// Where a graph goes.
pub trait GraphSink {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()>;
    fn edge(&mut self, e: &Edge) -> std::io::Result<()>;
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()>;
    /// After everything else.
    fn finish(&mut self, traces: &[GraphTrace], filter: &Filter) -> std::io::Result<()>;
}

/// A graph held whole (for tests, the report, small traces). Nodes are in the order they ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Graph {
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<Edge>,
    pub anomalies: Vec<Anomaly>,
    pub traces: Vec<GraphTrace>,
    pub filter: Filter,
}

impl Graph {
    pub fn node(&self, id: u64) -> Option<&GraphNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub fn edges_of_kind(&self, k: EdgeKind) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(move |e| e.kind == k)
    }
}

impl GraphSink for Graph {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        self.nodes.push(n.clone());
        Ok(())
    }
    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        self.edges.push(*e);
        Ok(())
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        self.anomalies.push(a.clone());
        Ok(())
    }
    fn finish(&mut self, traces: &[GraphTrace], filter: &Filter) -> std::io::Result<()> {
        self.traces = traces.to_vec();
        self.filter = *filter;
        Ok(())
    }
}

/// Counts and nothing else (for benchmarks and the diff).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub nodes: u64,
    pub edges: BTreeMap<EdgeKind, u64>,
    /// Size class of the new occupant → reuse edges.
    pub reuse_by_class: BTreeMap<u64, u64>,
    pub anomalies: BTreeMap<&'static str, u64>,
    sizes: FxHashMap<u64, u64>,
}

impl GraphSink for Counts {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        self.nodes += 1;
        self.sizes.insert(n.id, n.size);
        Ok(())
    }
    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        *self.edges.entry(e.kind).or_default() += 1;
        if e.kind == EdgeKind::Reuse {
            let c = size_class(self.sizes.get(&e.to).copied().unwrap_or(0));
            *self.reuse_by_class.entry(c).or_default() += 1;
        }
        Ok(())
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        let k = match a {
            Anomaly::Overlap { .. } => "overlap",
            Anomaly::InvalidFree { .. } => "invalid_free",
            Anomaly::NeverFreed { .. } => "never_freed",
            Anomaly::TrueAlias { .. } => "true_alias",
            Anomaly::StaleLaunch { .. } => "stale_launch",
            Anomaly::PoisonViolation { .. } => "poison_violation",
        };
        *self.anomalies.entry(k).or_default() += 1;
        Ok(())
    }
    fn finish(&mut self, _: &[GraphTrace], _: &Filter) -> std::io::Result<()> {
        self.sizes = FxHashMap::default();
        Ok(())
    }
}

/// Counts only, for speed: nodes and edges by kind (what the benchmark measures).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NullSink {
    pub nodes: u64,
    pub edges: u64,
    pub anomalies: u64,
}

impl GraphSink for NullSink {
    fn node(&mut self, _: &GraphNode) -> std::io::Result<()> {
        self.nodes += 1;
        Ok(())
    }
    fn edge(&mut self, _: &Edge) -> std::io::Result<()> {
        self.edges += 1;
        Ok(())
    }
    fn anomaly(&mut self, _: &Anomaly) -> std::io::Result<()> {
        self.anomalies += 1;
        Ok(())
    }
    fn finish(&mut self, _: &[GraphTrace], _: &Filter) -> std::io::Result<()> {
        Ok(())
    }
}

/// A freed range and its last occupant.
#[derive(Clone, Copy, Debug)]
struct Piece {
    end: u64,
    id: u64,
    free_ts: u64,
    /// Where the occupant started (to tell a double free).
    node_ptr: u64,
}

/// One address space.
#[derive(Default)]
struct Layer {
    /// (start, id) → end of every live node.
    live: BTreeMap<(u64, u64), u64>,
    /// Disjoint freed pieces by start.
    freed: BTreeMap<u64, Piece>,
    /// Report overlaps of live nodes (not for graph memory, which graphs may share).
    check_overlap: bool,
}

impl Layer {
    /// Removes `[s, e)` from the freed pieces; what was there goes to `out` (when given) as
    /// (occupant, bytes, its free time).
    fn carve(&mut self, s: u64, e: u64, mut out: Option<&mut Vec<(u64, u64, u64)>>) {
        if let Some((&ps, p)) = self.freed.range(..s).next_back()
            && p.end > s
        {
            let p = *p;
            if let Some(o) = out.as_deref_mut() {
                o.push((p.id, p.end.min(e) - s, p.free_ts));
            }
            if let Some(q) = self.freed.get_mut(&ps) {
                q.end = s;
            }
            if p.end > e {
                self.freed.insert(e, p);
            }
        }
        while let Some((&ps, p)) = self.freed.range(s..e).next() {
            let p = *p;
            self.freed.remove(&ps);
            if let Some(o) = out.as_deref_mut() {
                o.push((p.id, p.end.min(e) - ps, p.free_ts));
            }
            if p.end > e {
                self.freed.insert(e, p);
                break;
            }
        }
    }

    /// The freed piece covering `addr`.
    fn freed_at(&self, addr: u64) -> Option<&Piece> {
        self.freed
            .range(..=addr)
            .next_back()
            .map(|(_, p)| p)
            .filter(|p| p.end > addr)
    }
}

const LAYERS: usize = 5;

fn layer_of(c: Category) -> Option<usize> {
    match c {
        Category::Device | Category::Managed | Category::Mapping => Some(0),
        Category::Graph => Some(1),
        Category::Host => Some(2),
        Category::Registered => Some(3),
        Category::Reservation => Some(4),
        Category::Handle => None,
    }
}

/// A reuse edge as held until the end: 24 bytes.
#[derive(Clone, Copy)]
struct RawReuse {
    from: u32,
    to: u32,
    overlap: u64,
    gap: u64,
}

/// Builds the graph of one or more traces into a [`GraphSink`].
pub struct GraphBuilder<'a, S: GraphSink> {
    sink: &'a mut S,
    filter: Filter,
    trace: usize,
    base: u64,
    next_base: u64,
    layers: [Layer; LAYERS],
    /// Live mappings of each handle node: (mapping id, handle offset, size).
    handle_maps: FxHashMap<u64, Vec<(u64, u64, u64)>>,
    /// Handle nodes mapped at the filter address.
    wanted_handles: rustc_hash::FxHashSet<u64>,
    reuse: Vec<RawReuse>,
    other_edges: Vec<Edge>,
    anomalies: Vec<Anomaly>,
    kept: Vec<u64>,
    traces: Vec<GraphTrace>,
    scratch: Vec<(u64, u64, u64)>,
    error: Option<std::io::Error>,
}

impl<'a, S: GraphSink> GraphBuilder<'a, S> {
    pub fn new(sink: &'a mut S, filter: Filter) -> Self {
        let mut layers: [Layer; LAYERS] = Default::default();
        for (i, l) in layers.iter_mut().enumerate() {
            l.check_overlap = i != 1;
        }
        GraphBuilder {
            sink,
            filter,
            trace: 0,
            base: 0,
            next_base: 0,
            layers,
            handle_maps: FxHashMap::default(),
            wanted_handles: Default::default(),
            reuse: Vec::new(),
            other_edges: Vec::new(),
            anomalies: Vec::new(),
            kept: Vec::new(),
            traces: Vec::new(),
            scratch: Vec::new(),
            error: None,
        }
    }

    /// Adds one trace.
    pub fn add(&mut self, path: &Path, progress: &mut dyn Progress) -> Result<TraceInfo, Error> {
        self.base = self.next_base;
        self.trace = self.traces.len();
        for l in &mut self.layers {
            let check = l.check_overlap;
            *l = Layer::default();
            l.check_overlap = check;
        }
        self.handle_maps.clear();
        self.wanted_handles.clear();
        let info = analyze(path, progress, self)?;
        if let Some(e) = self.error.take() {
            return Err(Error::io(None, e));
        }
        self.traces.push(GraphTrace {
            index: self.trace,
            file: info.file.clone(),
            pid: info.header.pid,
            rank: info.header.rank,
            exe: info.header.exe.clone(),
            argv: info.header.argv.clone(),
            truncated: info.truncated_at,
            complete: info.complete(),
        });
        Ok(info)
    }

    /// Hands the edges and anomalies to the sink, then finishes it.
    pub fn finish(self) -> Result<Vec<GraphTrace>, Error> {
        let kept = &self.kept;
        let is_kept = |id: u64| {
            kept.get((id / 64) as usize)
                .is_some_and(|w| w & (1 << (id % 64)) != 0)
        };
        let filtering = !self.filter.is_empty();
        let mut run = || -> std::io::Result<()> {
            for r in &self.reuse {
                let (from, to) = (u64::from(r.from), u64::from(r.to));
                if filtering && !(is_kept(from) && is_kept(to)) {
                    continue;
                }
                self.sink.edge(&Edge {
                    from,
                    to,
                    kind: EdgeKind::Reuse,
                    overlap_bytes: r.overlap,
                    gap_ns: Some(r.gap),
                })?;
            }
            for e in &self.other_edges {
                if filtering && !(is_kept(e.from) && is_kept(e.to)) {
                    continue;
                }
                self.sink.edge(e)?;
            }
            for a in &self.anomalies {
                let ns = a.nodes();
                if filtering && (ns.is_empty() || !ns.iter().all(|&n| is_kept(n))) {
                    continue;
                }
                self.sink.anomaly(a)?;
            }
            self.sink.finish(&self.traces, &self.filter)
        };
        run().map_err(|e| Error::io(None, e))?;
        Ok(self.traces)
    }

    fn gid(&self, local: u64) -> u64 {
        self.base + local
    }

    fn emit(&mut self, n: &Node, end: Option<&Ended>) {
        let id = self.gid(n.id);
        let wanted = self.wanted_handles.contains(&n.id);
        if !self.filter.keep(n, end, wanted) {
            return;
        }
        let w = (id / 64) as usize;
        if self.kept.len() <= w {
            self.kept.resize(w + 1, 0);
        }
        self.kept[w] |= 1 << (id % 64);
        if self.error.is_some() {
            return;
        }
        let g = GraphNode {
            id,
            trace: self.trace,
            category: n.category.name(),
            api: n.api.name(),
            device: n.device,
            ptr: n.ptr,
            size: n.size,
            handle: n.handle,
            offset: n.offset,
            tid: n.tid,
            stream: n.stream,
            alloc_seq: n.seq,
            alloc_ts_ns: n.ts_ns,
            free_seq: end.map(|e| e.seq),
            free_ts_ns: end.map(|e| e.ts_ns),
            free_api: end.map(|e| e.api.name()),
            lost: end.is_some_and(|e| e.how == EndHow::Lost),
            reservation: n.reservation.map(|r| self.base + r),
            handle_node: n.handle_node.map(|h| self.base + h),
        };
        if let Err(e) = self.sink.node(&g) {
            self.error = Some(e);
        }
    }

    /// The node that last occupied `addr` in the device address space (or graph memory).
    fn freed_owner(&self, addr: u64) -> Option<&Piece> {
        self.layers[0]
            .freed_at(addr)
            .or_else(|| self.layers[1].freed_at(addr))
    }
}

impl<S: GraphSink> Observer for GraphBuilder<'_, S> {
    fn begin(&mut self, _h: &Header) {}

    fn started(&mut self, n: &Node, _live: &Live) {
        let id = self.gid(n.id);
        self.next_base = self.next_base.max(id + 1);
        if n.category == Category::Mapping {
            if let Some(h) = n.handle_node {
                let hid = self.base + h;
                self.other_edges.push(Edge {
                    from: id,
                    to: hid,
                    kind: EdgeKind::Maps,
                    overlap_bytes: n.size,
                    gap_ns: None,
                });
                let maps = self.handle_maps.entry(h).or_default();
                for &(other, off, size) in maps.iter() {
                    let lo = off.max(n.offset);
                    let hi = off
                        .saturating_add(size)
                        .min(n.offset.saturating_add(n.size));
                    if hi > lo {
                        self.other_edges.push(Edge {
                            from: other,
                            to: id,
                            kind: EdgeKind::Alias,
                            overlap_bytes: hi - lo,
                            gap_ns: None,
                        });
                        self.anomalies.push(Anomaly::TrueAlias {
                            nodes: [other, id],
                            handle: n.handle,
                            overlap_bytes: hi - lo,
                        });
                    }
                }
                maps.push((id, n.offset, n.size));
                if self.filter.address.is_some_and(|a| n.covers(a)) {
                    self.wanted_handles.insert(h);
                }
            }
            if let Some(r) = n.reservation {
                self.other_edges.push(Edge {
                    from: self.base + r,
                    to: id,
                    kind: EdgeKind::Contains,
                    overlap_bytes: n.size,
                    gap_ns: None,
                });
            }
        }
        let Some(li) = layer_of(n.category) else {
            return;
        };
        let (s, e) = (n.ptr, n.end().max(n.ptr + 1));
        let base = self.base;
        let layer = &mut self.layers[li];
        if layer.check_overlap {
            // Live nodes that start inside [s, e), and the one just before s if it reaches in.
            for (&(ls, lid), &le) in layer.live.range(..(e, 0)).rev() {
                if le > s {
                    self.anomalies.push(Anomaly::Overlap {
                        nodes: [base + lid, id],
                        overlap_bytes: le.min(e) - ls.max(s),
                    });
                }
                if ls < s {
                    break;
                }
            }
        }
        self.scratch.clear();
        layer.carve(s, e, Some(&mut self.scratch));
        layer.live.insert((s, n.id), e);
        if !self.scratch.is_empty() {
            // Several pieces of one occupant make one edge.
            self.scratch.sort_unstable_by_key(|x| x.0);
            let mut i = 0;
            while i < self.scratch.len() {
                let (from, mut bytes, free_ts) = self.scratch[i];
                let mut j = i + 1;
                while j < self.scratch.len() && self.scratch[j].0 == from {
                    bytes += self.scratch[j].1;
                    j += 1;
                }
                self.reuse.push(RawReuse {
                    from: from as u32,
                    to: id as u32,
                    overlap: bytes,
                    gap: n.ts_ns.saturating_sub(free_ts),
                });
                i = j;
            }
        }
    }

    fn ended(&mut self, n: &Node, end: &Ended, _live: &Live) {
        if n.category == Category::Mapping
            && let Some(h) = n.handle_node
        {
            let id = self.gid(n.id);
            if let Some(v) = self.handle_maps.get_mut(&h) {
                v.retain(|x| x.0 != id);
                if v.is_empty() {
                    self.handle_maps.remove(&h);
                }
            }
        }
        if let Some(li) = layer_of(n.category) {
            let (s, e) = (n.ptr, n.end().max(n.ptr + 1));
            let id = self.gid(n.id);
            let layer = &mut self.layers[li];
            layer.live.remove(&(s, n.id));
            if end.how == EndHow::Lost {
                // Its range belongs to the node that replaced it now.
                self.emit(n, Some(end));
                return;
            }
            let overlaps = layer
                .freed
                .range(..e)
                .next_back()
                .is_some_and(|(_, p)| p.end > s);
            if overlaps {
                layer.carve(s, e, None);
            }
            layer.freed.insert(
                s,
                Piece {
                    end: e,
                    id,
                    free_ts: end.ts_ns,
                    node_ptr: s,
                },
            );
        }
        self.emit(n, Some(end));
    }

    fn invalid(&mut self, inv: &Invalid, _live: &Live) {
        let ev = &inv.event;
        let owner = if inv.kind == crate::track::InvalidKind::Free {
            if ev.api.is_host() {
                self.layers[2].freed_at(ev.ptr)
            } else {
                self.freed_owner(ev.ptr)
            }
        } else if inv.kind == crate::track::InvalidKind::AddressFree {
            self.layers[4].freed_at(ev.ptr)
        } else {
            None
        };
        let (after, double) = match owner {
            Some(p) => (Some(p.id), p.node_ptr == ev.ptr),
            None => (None, false),
        };
        self.anomalies.push(Anomaly::InvalidFree {
            trace: self.trace,
            what: inv.kind.name(),
            seq: ev.seq,
            ts_ns: ev.ts_ns,
            api: ev.api.name(),
            tid: ev.tid,
            ptr: ev.ptr,
            after,
            double_free: double,
        });
    }

    fn other(&mut self, rec: &Record, _live: &Live) {
        match rec {
            Record::StaleLaunch(s) => {
                let node = self.freed_owner(s.ptr).map(|p| p.id);
                self.anomalies.push(Anomaly::StaleLaunch {
                    node,
                    trace: self.trace,
                    seq: s.seq,
                    kernel: s.kernel.clone(),
                    ptr: s.ptr,
                });
            }
            Record::Violation(v) => {
                let node = self.freed_owner(v.ptr).map(|p| p.id);
                self.anomalies.push(Anomaly::PoisonViolation {
                    node,
                    trace: self.trace,
                    seq: v.seq,
                    ptr: v.ptr,
                    changed_bytes: v.changed_bytes,
                });
            }
            _ => {}
        }
    }

    fn finish(&mut self, still: &[Node], _live: &Live) {
        for n in still {
            self.anomalies.push(Anomaly::NeverFreed {
                node: self.gid(n.id),
                category: n.category.name(),
                size: n.size,
            });
            self.emit(n, None);
        }
    }
}

/// Builds the graph of `paths` into `sink`.
pub fn build<P: AsRef<Path>, S: GraphSink>(
    paths: &[P],
    filter: Filter,
    sink: &mut S,
    progress: &mut dyn Progress,
) -> Result<Vec<GraphTrace>, Error> {
    let mut b = GraphBuilder::new(sink, filter);
    for p in paths {
        b.add(p.as_ref(), progress)?;
    }
    b.finish()
}

/// Builds the whole graph in memory.
pub fn graph<P: AsRef<Path>>(
    paths: &[P],
    filter: Filter,
    progress: &mut dyn Progress,
) -> Result<Graph, Error> {
    let mut g = Graph::default();
    build(paths, filter, &mut g, progress)?;
    Ok(g)
}

/// Writes the graph as JSON while it is built: `{"nodes": [...], "edges": [...],
/// "anomalies": [...], "traces": [...], "filter": {...}}`, one node or edge per line.
pub struct JsonSink<W: Write> {
    out: W,
    state: u8,
    first: bool,
}

impl<W: Write> JsonSink<W> {
    pub fn new(out: W) -> Self {
        JsonSink {
            out,
            state: 0,
            first: true,
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    /// Moves on to section `state` (1 nodes, 2 edges, 3 anomalies), opening it.
    fn section(&mut self, state: u8) -> std::io::Result<()> {
        const NAMES: [&str; 4] = ["", "nodes", "edges", "anomalies"];
        while self.state < state {
            if self.state == 0 {
                self.out.write_all(b"{")?;
            } else {
                self.out.write_all(b"\n],")?;
            }
            self.state += 1;
            write!(self.out, "\n\"{}\": [", NAMES[self.state as usize])?;
            self.first = true;
        }
        Ok(())
    }

    fn item<T: Serialize>(&mut self, state: u8, v: &T) -> std::io::Result<()> {
        self.section(state)?;
        self.out
            .write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        serde_json::to_writer(&mut self.out, v)?;
        Ok(())
    }
}

impl<W: Write> GraphSink for JsonSink<W> {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        self.item(1, n)
    }
    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        self.item(2, e)
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        self.item(3, a)
    }
    fn finish(&mut self, traces: &[GraphTrace], filter: &Filter) -> std::io::Result<()> {
        self.section(3)?;
        self.out.write_all(b"\n],\n\"traces\": ")?;
        serde_json::to_writer(&mut self.out, traces)?;
        self.out.write_all(b",\n\"filter\": ")?;
        serde_json::to_writer(&mut self.out, filter)?;
        self.out.write_all(b"\n}\n")?;
        self.out.flush()
    }
}

/// Writes the graph in Graphviz DOT while it is built. All text from the trace is escaped
/// ([`escape_dot`]).
pub struct DotSink<W: Write> {
    out: W,
    started: bool,
}

impl<W: Write> DotSink<W> {
    pub fn new(out: W) -> Self {
        DotSink {
            out,
            started: false,
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    fn start(&mut self) -> std::io::Result<()> {
        if !self.started {
            self.started = true;
            writeln!(self.out, "digraph isolate {{")?;
            writeln!(
                self.out,
                "  graph [rankdir=LR, fontname=\"monospace\"];\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n  edge [fontname=\"monospace\", fontsize=9];"
            )?;
        }
        Ok(())
    }
}

impl<W: Write> GraphSink for DotSink<W> {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        self.start()?;
        let life = match (n.free_seq, n.lost) {
            (_, true) => format!("seq {}..lost", n.alloc_seq),
            (Some(f), _) => format!("seq {}..{}", n.alloc_seq, f),
            (None, _) => format!("seq {}..(live)", n.alloc_seq),
        };
        let label = format!(
            "#{} {}\\n{} {}\\n{}\\ndev {} tid {}",
            n.id,
            escape_dot(n.api),
            hex(n.ptr),
            escape_dot(&human_bytes(n.size)),
            life,
            n.device,
            n.tid
        );
        let style = match (n.category, n.free_seq) {
            ("handle", _) => ", style=filled, fillcolor=\"#dde8ff\"",
            ("reservation", _) => ", style=dashed",
            ("mapping", _) => ", style=filled, fillcolor=\"#eef6ee\"",
            (_, None) => ", style=filled, fillcolor=\"#ffdddd\"",
            _ => "",
        };
        writeln!(self.out, "  n{} [label=\"{label}\"{style}];", n.id)
    }

    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        self.start()?;
        let (label, style) = match e.kind {
            EdgeKind::Reuse => (
                format!(
                    "reuse {} after {}",
                    human_bytes(e.overlap_bytes),
                    crate::util::human_ns(e.gap_ns.unwrap_or(0))
                ),
                "",
            ),
            EdgeKind::Maps => (
                format!("maps {}", human_bytes(e.overlap_bytes)),
                ", color=blue",
            ),
            EdgeKind::Contains => ("contains".to_owned(), ", style=dashed"),
            EdgeKind::Alias => (
                format!("ALIAS {}", human_bytes(e.overlap_bytes)),
                ", color=red, penwidth=2",
            ),
        };
        writeln!(
            self.out,
            "  n{} -> n{} [label=\"{}\"{style}];",
            e.from,
            e.to,
            escape_dot(&label)
        )
    }

    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        self.start()?;
        let (nodes, text) = match a {
            Anomaly::Overlap {
                nodes,
                overlap_bytes,
            } => (nodes.to_vec(), format!("OVERLAP {overlap_bytes} B")),
            Anomaly::TrueAlias { nodes, .. } => (nodes.to_vec(), "TRUE ALIAS".to_owned()),
            Anomaly::StaleLaunch {
                node: Some(n),
                kernel,
                ..
            } => (vec![*n], format!("stale launch: {kernel}")),
            Anomaly::PoisonViolation { node: Some(n), .. } => (vec![*n], "stale write".to_owned()),
            Anomaly::InvalidFree {
                after: Some(n),
                api,
                double_free,
                ..
            } => (
                vec![*n],
                format!(
                    "{} {api}",
                    if *double_free {
                        "double free"
                    } else {
                        "invalid free"
                    }
                ),
            ),
            _ => return Ok(()),
        };
        let id = format!(
            "a{}",
            nodes
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join("_")
        );
        writeln!(
            self.out,
            "  {id} [shape=note, color=red, label=\"{}\"];",
            escape_dot(&text)
        )?;
        for n in nodes {
            writeln!(self.out, "  {id} -> n{n} [color=red, style=dotted];")?;
        }
        Ok(())
    }

    fn finish(&mut self, traces: &[GraphTrace], _filter: &Filter) -> std::io::Result<()> {
        self.start()?;
        let title: Vec<String> = traces
            .iter()
            .map(|t| {
                format!(
                    "{} pid {}{}: {}",
                    t.file,
                    t.pid,
                    t.rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
                    t.argv.join(" ")
                )
            })
            .collect();
        writeln!(
            self.out,
            "  label=\"{}\";\n  labelloc=t;\n}}",
            escape_dot(&title.join(" | "))
        )?;
        self.out.flush()
    }
}

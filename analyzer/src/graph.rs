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
//! `true_alias`, `stale_launch`, `stale_value` and `poison_violation` (tied to the freed node
//! they hit).
//!
//! Nodes are handed to a [`GraphSink`] when they end (never-freed ones at the end of their trace,
//! in start order), so the graph of a long trace never has to be held whole; edges and anomalies
//! come after all nodes, once filters have decided which nodes stay.

use crate::Error;
use crate::source::{Progress, TraceInfo, analyze};
use crate::track::{Category, EndHow, Ended, Invalid, InvalidKind, Live, Node, Observer};
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

    /// What can be decided when the node starts (handles wait for their mappings).
    fn keep_at_start(&self, n: &Node) -> bool {
        if let Some(a) = self.address
            && n.category != Category::Handle
            && !n.covers(a)
        {
            return false;
        }
        if let Some(c) = self.size_class
            && size_class(n.size) != size_class(c)
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

    /// The whole decision, once the node has ended (or the trace has).
    fn keep(&self, n: &Node, end: Option<&Ended>, wanted_handle: bool) -> bool {
        if self.address.is_some() && n.category == Category::Handle && !wanted_handle {
            return false;
        }
        if let Some(f) = self.from_ns
            && end.is_some_and(|e| e.ts_ns < f)
        {
            return false;
        }
        self.keep_at_start(n)
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
    /// A freed node's poison changed while it sat in quarantine (a stale write).
    PoisonViolation {
        node: Option<u64>,
        trace: usize,
        seq: u64,
        /// The freed allocation's base address.
        #[serde(serialize_with = "ser_hex")]
        ptr: u64,
        /// Offset from `ptr` of the first byte that lost its poison.
        first_offset: u64,
        changed_bytes: u64,
    },
    /// Guard mode: a kernel was launched with a pointer into a freed, unmapped node. Harmless
    /// unless a device fault follows (then a `stale_launch` names the same kernel).
    StaleValue {
        node: Option<u64>,
        trace: usize,
        seq: u64,
        kernel: String,
        #[serde(serialize_with = "ser_hex")]
        ptr: u64,
    },
}

impl Anomaly {
    /// The `kind` tag of its JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            Anomaly::Overlap { .. } => "overlap",
            Anomaly::InvalidFree { .. } => "invalid_free",
            Anomaly::NeverFreed { .. } => "never_freed",
            Anomaly::TrueAlias { .. } => "true_alias",
            Anomaly::StaleLaunch { .. } => "stale_launch",
            Anomaly::PoisonViolation { .. } => "poison_violation",
            Anomaly::StaleValue { .. } => "stale_value",
        }
    }

    /// The nodes it names.
    pub fn nodes(&self) -> Vec<u64> {
        match self {
            Anomaly::Overlap { nodes, .. } | Anomaly::TrueAlias { nodes, .. } => nodes.to_vec(),
            Anomaly::InvalidFree { after, .. } => after.iter().copied().collect(),
            Anomaly::NeverFreed { node, .. } => vec![*node],
            Anomaly::StaleLaunch { node, .. }
            | Anomaly::StaleValue { node, .. }
            | Anomaly::PoisonViolation { node, .. } => node.iter().copied().collect(),
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

/// Counts and nothing else (for the diff). Expects an unfiltered graph, where every edge
/// arrives before its `to` node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub nodes: u64,
    pub edges: BTreeMap<EdgeKind, u64>,
    /// Size class of the new occupant → reuse edges.
    pub reuse_by_class: BTreeMap<u64, u64>,
    pub anomalies: BTreeMap<&'static str, u64>,
    /// Reuse edges whose `to` node has not ended yet.
    pending: FxHashMap<u64, u64>,
}

impl GraphSink for Counts {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        self.nodes += 1;
        if let Some(k) = self.pending.remove(&n.id) {
            *self.reuse_by_class.entry(size_class(n.size)).or_default() += k;
        }
        Ok(())
    }
    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        *self.edges.entry(e.kind).or_default() += 1;
        if e.kind == EdgeKind::Reuse {
            *self.pending.entry(e.to).or_default() += 1;
        }
        Ok(())
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        *self.anomalies.entry(a.kind()).or_default() += 1;
        Ok(())
    }
    fn finish(&mut self, _: &[GraphTrace], _: &Filter) -> std::io::Result<()> {
        Ok(())
    }
}

/// Counts only, for speed: what the benchmark measures.
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

/// `free_ts` of a segment whose node is live.
const LIVE: u64 = u64::MAX;

/// A stretch of one address space and the node that holds it (live) or last held it (freed).
#[derive(Clone, Copy, Debug)]
struct Seg {
    end: u64,
    id: u64,
    /// When its node ended, or [`LIVE`].
    free_ts: u64,
    /// Where its node started (to tell a double free from a free into the middle).
    node_ptr: u64,
}

/// One address space: disjoint segments by start, live and freed alike, so that the usual
/// event — a free, or an allocation at the start of a freed block — is one or two tree steps.
#[derive(Default)]
struct Layer {
    segs: BTreeMap<u64, Seg>,
    /// Live nodes that overlapped another live node when they started; they are kept out of
    /// `segs` (which stays disjoint) and leave no freed segment behind.
    extra: rustc_hash::FxHashSet<u64>,
    /// Report overlaps of live nodes (not for graph memory, which graphs may share).
    check_overlap: bool,
    scratch: Vec<(u64, Seg)>,
}

/// What an allocation found where it landed.
enum Landing {
    /// Only freed memory (or none): the previous occupants, as (id, bytes, their end).
    Free,
    /// Live memory: the nodes it overlaps, as (id, bytes).
    Live,
}

impl Layer {
    /// Places a node on `[s, e)`. Previous occupants go to `reuse`, live nodes it overlaps to
    /// `overlaps`.
    fn start(
        &mut self,
        s: u64,
        e: u64,
        id: u64,
        reuse: &mut Vec<(u64, u64, u64)>,
        overlaps: &mut Vec<(u64, u64)>,
    ) -> Landing {
        use std::ops::Bound::Excluded;
        let ov = &mut self.scratch;
        ov.clear();
        let mut covered = false;
        if let Some((&ps, p)) = self.segs.range(..=s).next_back()
            && p.end > s
        {
            ov.push((ps, *p));
            covered = p.end >= e;
        }
        if !covered {
            ov.extend(
                self.segs
                    .range((Excluded(s), Excluded(e)))
                    .map(|(&k, v)| (k, *v)),
            );
        }
        let bytes = |ps: u64, p: &Seg| p.end.min(e) - ps.max(s);
        if ov.iter().any(|(_, p)| p.free_ts == LIVE) {
            // It cannot have its own segment; the freed parts it took still make reuse edges.
            for (ps, p) in ov.iter() {
                if p.free_ts == LIVE {
                    overlaps.push((p.id, bytes(*ps, p)));
                } else {
                    reuse.push((p.id, bytes(*ps, p), p.free_ts));
                }
            }
            self.extra.insert(id);
            return Landing::Live;
        }
        for &(ps, p) in ov.iter() {
            reuse.push((p.id, bytes(ps, &p), p.free_ts));
            if ps < s {
                if let Some(q) = self.segs.get_mut(&ps) {
                    q.end = s;
                }
            } else if ps != s {
                self.segs.remove(&ps);
            }
            if p.end > e {
                self.segs.insert(e, p);
            }
        }
        self.segs.insert(
            s,
            Seg {
                end: e,
                id,
                free_ts: LIVE,
                node_ptr: s,
            },
        );
        Landing::Free
    }

    /// The node `id` on `[s, …)` ended at `ts`: its segment becomes freed (or goes, if lost).
    fn end(&mut self, s: u64, id: u64, ts: u64, lost: bool) {
        if !self.extra.is_empty() && self.extra.remove(&id) {
            return;
        }
        if lost {
            if self.segs.get(&s).is_some_and(|p| p.id == id) {
                self.segs.remove(&s);
            }
        } else if let Some(p) = self.segs.get_mut(&s)
            && p.id == id
        {
            p.free_ts = ts;
        }
    }

    /// The freed segment covering `addr`.
    fn freed_at(&self, addr: u64) -> Option<&Seg> {
        self.segs
            .range(..=addr)
            .next_back()
            .map(|(_, p)| p)
            .filter(|p| p.end > addr && p.free_ts != LIVE)
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

/// A set of node ids.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    fn set(&mut self, id: u64) {
        let w = (id / 64) as usize;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (id % 64);
    }
    fn get(&self, id: u64) -> bool {
        self.0
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}

/// Builds the graph of one or more traces into a [`GraphSink`].
///
/// Without a filter, nodes and edges go to the sink as soon as they are final, and the builder
/// holds only what is live. With one, edges wait (those between nodes that pass the filter's
/// start-time tests) until the nodes they join are decided.
pub struct GraphBuilder<'a, S: GraphSink> {
    sink: &'a mut S,
    filter: Filter,
    filtering: bool,
    trace: usize,
    base: u64,
    next_base: u64,
    layers: [Layer; LAYERS],
    /// Live mappings of each handle node: (mapping id, handle offset, size).
    handle_maps: FxHashMap<u64, Vec<(u64, u64, u64)>>,
    /// Handle nodes mapped at the filter address.
    wanted_handles: rustc_hash::FxHashSet<u64>,
    /// Filtering: nodes that passed the start-time tests, and nodes kept.
    maybe: Bits,
    kept: Bits,
    held_edges: Vec<Edge>,
    anomalies: Vec<Anomaly>,
    traces: Vec<GraphTrace>,
    reuse: Vec<(u64, u64, u64)>,
    overlaps: Vec<(u64, u64)>,
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
            filtering: !filter.is_empty(),
            trace: 0,
            base: 0,
            next_base: 0,
            layers,
            handle_maps: FxHashMap::default(),
            wanted_handles: Default::default(),
            maybe: Bits::default(),
            kept: Bits::default(),
            held_edges: Vec::new(),
            anomalies: Vec::new(),
            traces: Vec::new(),
            reuse: Vec::new(),
            overlaps: Vec::new(),
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

    /// Hands the held edges and the anomalies to the sink, then finishes it.
    pub fn finish(mut self) -> Result<Vec<GraphTrace>, Error> {
        if let Some(e) = self.error.take() {
            return Err(Error::io(None, e));
        }
        let kept = &self.kept;
        let filtering = self.filtering;
        let mut run = || -> std::io::Result<()> {
            for e in &self.held_edges {
                if kept.get(e.from) && kept.get(e.to) {
                    self.sink.edge(e)?;
                }
            }
            for a in &self.anomalies {
                if filtering {
                    let ns = a.nodes();
                    if ns.is_empty() || !ns.iter().all(|&n| kept.get(n)) {
                        continue;
                    }
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

    fn edge(&mut self, e: Edge) {
        if !self.filtering {
            if self.error.is_none()
                && let Err(err) = self.sink.edge(&e)
            {
                self.error = Some(err);
            }
        } else if self.maybe.get(e.from) && self.maybe.get(e.to) {
            self.held_edges.push(e);
        }
    }

    fn emit(&mut self, n: &Node, end: Option<&Ended>) {
        let id = self.gid(n.id);
        if self.filtering {
            let wanted = self.wanted_handles.contains(&n.id);
            if !self.maybe.get(id) || !self.filter.keep(n, end, wanted) {
                return;
            }
            self.kept.set(id);
        }
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
    fn freed_owner(&self, addr: u64) -> Option<&Seg> {
        self.layers[0]
            .freed_at(addr)
            .or_else(|| self.layers[1].freed_at(addr))
    }

    fn mapping_started(&mut self, n: &Node, id: u64) {
        if let Some(h) = n.handle_node {
            let hid = self.base + h;
            self.edge(Edge {
                from: id,
                to: hid,
                kind: EdgeKind::Maps,
                overlap_bytes: n.size,
                gap_ns: None,
            });
            let maps = self.handle_maps.entry(h).or_default();
            let mut aliases = Vec::new();
            for &(other, off, size) in maps.iter() {
                let lo = off.max(n.offset);
                let hi = off
                    .saturating_add(size)
                    .min(n.offset.saturating_add(n.size));
                if hi > lo {
                    aliases.push((other, hi - lo));
                }
            }
            maps.push((id, n.offset, n.size));
            for (other, bytes) in aliases {
                self.edge(Edge {
                    from: other,
                    to: id,
                    kind: EdgeKind::Alias,
                    overlap_bytes: bytes,
                    gap_ns: None,
                });
                self.anomalies.push(Anomaly::TrueAlias {
                    nodes: [other, id],
                    handle: n.handle,
                    overlap_bytes: bytes,
                });
            }
            if self.filter.address.is_some_and(|a| n.covers(a)) {
                self.wanted_handles.insert(h);
            }
        }
        if let Some(r) = n.reservation {
            self.edge(Edge {
                from: self.base + r,
                to: id,
                kind: EdgeKind::Contains,
                overlap_bytes: n.size,
                gap_ns: None,
            });
        }
    }
}

impl<S: GraphSink> Observer for GraphBuilder<'_, S> {
    fn begin(&mut self, _h: &Header) {}

    #[inline]
    fn started(&mut self, n: &Node, _live: &Live) {
        let id = self.gid(n.id);
        self.next_base = self.next_base.max(id + 1);
        if self.filtering && self.filter.keep_at_start(n) {
            self.maybe.set(id);
        }
        if n.category == Category::Mapping {
            self.mapping_started(n, id);
        }
        let Some(li) = layer_of(n.category) else {
            return;
        };
        let (s, e) = (n.ptr, n.end().max(n.ptr + 1));
        self.reuse.clear();
        self.overlaps.clear();
        let layer = &mut self.layers[li];
        if let Landing::Live = layer.start(s, e, id, &mut self.reuse, &mut self.overlaps)
            && layer.check_overlap
        {
            for &(other, bytes) in &self.overlaps {
                self.anomalies.push(Anomaly::Overlap {
                    nodes: [other, id],
                    overlap_bytes: bytes,
                });
            }
        }
        if self.reuse.is_empty() {
            return;
        }
        // Several segments of one occupant make one edge.
        let mut v = std::mem::take(&mut self.reuse);
        if v.len() > 1 {
            v.sort_unstable_by_key(|x| x.0);
        }
        let mut i = 0;
        while i < v.len() {
            let (from, mut bytes, free_ts) = v[i];
            let mut j = i + 1;
            while j < v.len() && v[j].0 == from {
                bytes += v[j].1;
                j += 1;
            }
            self.edge(Edge {
                from,
                to: id,
                kind: EdgeKind::Reuse,
                overlap_bytes: bytes,
                gap_ns: Some(n.ts_ns.saturating_sub(free_ts)),
            });
            i = j;
        }
        self.reuse = v;
    }

    #[inline]
    fn ended(&mut self, n: &Node, end: &Ended, _live: &Live) {
        let id = self.gid(n.id);
        if n.category == Category::Mapping
            && let Some(h) = n.handle_node
            && let Some(v) = self.handle_maps.get_mut(&h)
        {
            v.retain(|x| x.0 != id);
            if v.is_empty() {
                self.handle_maps.remove(&h);
            }
        }
        if let Some(li) = layer_of(n.category) {
            let lost = end.how == EndHow::Lost;
            let layer = &mut self.layers[li];
            layer.end(n.ptr, id, end.ts_ns, lost);
            if lost
                && layer.check_overlap
                && let Some(by) = end.by
            {
                self.anomalies.push(Anomaly::Overlap {
                    nodes: [id, self.base + by],
                    overlap_bytes: n.size.max(1),
                });
            }
        }
        self.emit(n, Some(end));
    }

    fn invalid(&mut self, inv: &Invalid, _live: &Live) {
        let ev = &inv.event;
        let owner = match inv.kind {
            InvalidKind::Free if ev.api.is_host() => self.layers[2].freed_at(ev.ptr),
            InvalidKind::Free => self.freed_owner(ev.ptr),
            InvalidKind::AddressFree => self.layers[4].freed_at(ev.ptr),
            InvalidKind::Unregister => self.layers[3].freed_at(ev.ptr),
            _ => None,
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
                    first_offset: v.first_offset,
                    changed_bytes: v.changed_bytes,
                });
            }
            Record::StaleValue(s) => {
                let node = self.freed_owner(s.ptr).map(|p| p.id);
                self.anomalies.push(Anomaly::StaleValue {
                    node,
                    trace: self.trace,
                    seq: s.seq,
                    kernel: s.kernel.clone(),
                    ptr: s.ptr,
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
/// "anomalies": [...], "traces": [...], "filter": {...}}`, one node, edge or anomaly per line.
///
/// Edges are known before the nodes they join have ended, so they wait in a spool (memory up
/// to [`SPOOL_IN_MEMORY`] bytes, then an unlinked temporary file) until the nodes are written.
pub struct JsonSink<W: Write> {
    out: W,
    state: u8,
    first: bool,
    spool: Spool,
}

/// Bytes of edge JSON held in memory before the spool moves to a temporary file.
pub const SPOOL_IN_MEMORY: usize = 16 << 20;

#[derive(Default)]
struct Spool {
    mem: Vec<u8>,
    file: Option<std::io::BufWriter<std::fs::File>>,
    items: u64,
}

impl Spool {
    fn push<T: Serialize>(&mut self, v: &T) -> std::io::Result<()> {
        self.mem
            .extend_from_slice(if self.items == 0 { b"\n" } else { b",\n" });
        self.items += 1;
        serde_json::to_writer(&mut self.mem, v)?;
        if self.mem.len() >= SPOOL_IN_MEMORY {
            if self.file.is_none() {
                self.file = Some(std::io::BufWriter::with_capacity(1 << 20, temp_file()?));
            }
            if let Some(f) = &mut self.file {
                f.write_all(&self.mem)?;
            }
            self.mem.clear();
        }
        Ok(())
    }

    fn drain_into(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        if let Some(f) = self.file.take() {
            let mut f = f.into_inner().map_err(|e| e.into_error())?;
            f.seek(SeekFrom::Start(0))?;
            std::io::copy(&mut f, out)?;
        }
        out.write_all(&self.mem)?;
        self.mem = Vec::new();
        Ok(())
    }
}

/// A temporary file that is gone from the directory as soon as it is open.
fn temp_file() -> std::io::Result<std::fs::File> {
    let dir = std::env::temp_dir();
    for i in 0..100u32 {
        let p = dir.join(format!(".isolate-spool-{}-{i}", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => {
                let _ = std::fs::remove_file(&p);
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no temporary file name was free"))
}

impl<W: Write> JsonSink<W> {
    pub fn new(out: W) -> Self {
        JsonSink {
            out,
            state: 0,
            first: true,
            spool: Spool::default(),
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    /// Moves on to section `state` (1 nodes, 2 edges, 3 anomalies), opening it; entering the
    /// edges writes out the spool.
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
            if self.state == 2 {
                self.spool.drain_into(&mut self.out)?;
                self.first = self.spool.items == 0;
            }
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
        if self.state < 2 {
            self.spool.push(e)
        } else {
            self.item(2, e)
        }
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
///
/// Node ids: `n<id>` for the graph's nodes (ids are unique over all traces of the graph) and
/// `a<k>` for the k-th anomaly (counting from 0 in the order of the JSON output's `anomalies`,
/// `never_freed` included although it has no note of its own: its node is drawn filled red and
/// labelled "live at end"). Every other anomaly gets a note node of its own, with a dotted edge
/// to each node it names, so two findings on one allocation are two notes.
pub struct DotSink<W: Write> {
    out: W,
    started: bool,
    /// Anomalies seen so far: the next one is `a<anomalies>`.
    anomalies: u64,
}

impl<W: Write> DotSink<W> {
    pub fn new(out: W) -> Self {
        DotSink {
            out,
            started: false,
            anomalies: 0,
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

/// Lines of a DOT label: each escaped, joined with DOT's `\n`.
fn dot_lines(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| escape_dot(l))
        .collect::<Vec<_>>()
        .join("\\n")
}

/// The nodes an anomaly's note points at, its label lines and its colour; `None` for
/// `never_freed`, which the node's own style shows.
fn dot_note(a: &Anomaly) -> Option<(Vec<u64>, Vec<String>, &'static str)> {
    let trace_seq = |trace: &usize, seq: &u64| format!("trace {trace} seq {seq}");
    Some(match a {
        Anomaly::NeverFreed { .. } => return None,
        Anomaly::Overlap {
            nodes,
            overlap_bytes,
        } => (
            nodes.to_vec(),
            vec![format!("OVERLAP {}", human_bytes(*overlap_bytes))],
            "red",
        ),
        Anomaly::TrueAlias {
            nodes,
            handle,
            overlap_bytes,
        } => (
            nodes.to_vec(),
            vec![
                "TRUE ALIAS".to_owned(),
                format!("{} of handle {}", human_bytes(*overlap_bytes), hex(*handle)),
            ],
            "red",
        ),
        Anomaly::InvalidFree {
            trace,
            what,
            seq,
            api,
            ptr,
            after,
            double_free,
            ..
        } => (
            after.iter().copied().collect(),
            vec![
                format!(
                    "{} {api}",
                    if *double_free {
                        "double free"
                    } else {
                        "invalid free"
                    }
                ),
                format!("{what} {}", hex(*ptr)),
                trace_seq(trace, seq),
            ],
            "red",
        ),
        Anomaly::StaleLaunch {
            node,
            trace,
            seq,
            kernel,
            ptr,
        }
        | Anomaly::StaleValue {
            node,
            trace,
            seq,
            kernel,
            ptr,
        } => {
            let (what, note, color) = match a {
                Anomaly::StaleLaunch { .. } => ("launch", "", "red"),
                _ => ("value", " (unused unless a fault followed)", "orange"),
            };
            (
                node.iter().copied().collect(),
                vec![
                    format!("stale {what}: {kernel}"),
                    format!("ptr {}{note}", hex(*ptr)),
                    trace_seq(trace, seq),
                ],
                color,
            )
        }
        Anomaly::PoisonViolation {
            node,
            trace,
            seq,
            ptr,
            first_offset,
            changed_bytes,
        } => (
            node.iter().copied().collect(),
            vec![
                format!(
                    "stale write at offset {first_offset} ({})",
                    hex(ptr.saturating_add(*first_offset))
                ),
                format!("{} changed", human_bytes(*changed_bytes)),
                trace_seq(trace, seq),
            ],
            "red",
        ),
    })
}

impl<W: Write> GraphSink for DotSink<W> {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        self.start()?;
        let life = match (n.free_seq, n.lost) {
            (_, true) => format!("seq {}..lost", n.alloc_seq),
            (Some(f), _) => format!("seq {}..{}", n.alloc_seq, f),
            (None, _) => format!("seq {}..(live at end)", n.alloc_seq),
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
        let id = self.anomalies;
        self.anomalies += 1;
        let Some((nodes, lines, color)) = dot_note(a) else {
            return Ok(());
        };
        writeln!(
            self.out,
            "  a{id} [shape=note, color={color}, label=\"{}\"];",
            dot_lines(&lines)
        )?;
        for n in nodes {
            writeln!(self.out, "  a{id} -> n{n} [color={color}, style=dotted];")?;
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

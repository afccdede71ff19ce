//! Building the graph: each address space kept as disjoint segments naming their holder or last
//! holder ([`Layer`]), and the [`GraphBuilder`] observer that turns the model's nodes into graph
//! nodes, reuse/maps/contains/alias edges and anomalies, and hands them to a [`GraphSink`].

use super::spool::Spool;
use super::{Anomaly, Edge, EdgeKind, Filter, GraphNode, GraphSink, GraphTrace};
use crate::Error;
use crate::source::{Progress, TraceInfo, analyze};
use crate::track::{Category, EndHow, Ended, Invalid, InvalidKind, Live, Node, Observer};
use isolate_trace::{Header, Record};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Write};
use std::path::Path;

/// How many frees each address space remembers: a block freed longer ago (counted in frees of
/// its address space) is forgotten, so an allocation that lands on it later gets no reuse edge
/// from it, and a finding into it names no node. This bounds the graph's memory by what is live
/// plus this window (about 90 bytes a free) on traces that never hand an address out again,
/// such as guard mode's.
pub const FREED_KEPT: usize = 1 << 16;

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
    /// The last `window` frees, oldest first: `(start, end, id)` of the segment each freed.
    /// Splitting a freed segment keeps its pieces inside that range.
    freed: VecDeque<(u64, u64, u64)>,
    /// [`FREED_KEPT`] (tests make it smaller).
    window: usize,
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
    /// True when it left a freed segment behind (it retires when that is forgotten); the node
    /// forgotten to make room, if any, goes to `retired`.
    fn end(&mut self, s: u64, id: u64, ts: u64, lost: bool, retired: &mut Vec<u64>) -> bool {
        if !self.extra.is_empty() && self.extra.remove(&id) {
            return false;
        }
        if lost {
            if self.segs.get(&s).is_some_and(|p| p.id == id) {
                self.segs.remove(&s);
            }
            return false;
        }
        let Some(p) = self.segs.get_mut(&s).filter(|p| p.id == id) else {
            return false;
        };
        p.free_ts = ts;
        let end = p.end;
        if self.freed.len() == self.freed.capacity() {
            // Grow to the window and no further (doubling would overshoot it by up to half).
            let more = self
                .freed
                .len()
                .max(16)
                .min(self.window + 1 - self.freed.len());
            self.freed.reserve_exact(more);
        }
        self.freed.push_back((s, end, id));
        if self.freed.len() > self.window
            && let Some(old) = self.forget_oldest()
        {
            retired.push(old);
        }
        true
    }

    /// Forgets the oldest free: every piece of its segment that no allocation has taken over
    /// since. Returns its node.
    fn forget_oldest(&mut self) -> Option<u64> {
        let (s, e, id) = self.freed.pop_front()?;
        let mut gone = std::mem::take(&mut self.scratch);
        gone.clear();
        gone.extend(
            self.segs
                .range(s..e)
                .filter(|(_, p)| p.id == id && p.free_ts != LIVE)
                .map(|(&k, p)| (k, *p)),
        );
        for (k, _) in &gone {
            self.segs.remove(k);
        }
        self.scratch = gone;
        Some(id)
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
/// Without a filter, nodes, edges and anomalies go to the sink as soon as they are final, and
/// the builder holds only what is live and the last [`FREED_KEPT`] frees of each address space.
/// With one, edges (those between nodes that pass the filter's start-time tests) wait in a
/// spool, and anomalies in memory, until the nodes they join are decided; which nodes were kept
/// is one bit a node.
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
    /// Filtering: edges waiting for the end ([`encode_edge`]) and anomalies.
    held_edges: Spool,
    anomalies: Vec<Anomaly>,
    /// Nodes to hand to [`GraphSink::retired`].
    retired: Vec<u64>,
    traces: Vec<GraphTrace>,
    reuse: Vec<(u64, u64, u64)>,
    overlaps: Vec<(u64, u64)>,
    error: Option<std::io::Error>,
    /// The trace's stacks, and the ids its emitted nodes name.
    table: crate::stacks::StackTable,
    used_stacks: std::collections::BTreeSet<u32>,
}

impl<'a, S: GraphSink> GraphBuilder<'a, S> {
    pub fn new(sink: &'a mut S, filter: Filter) -> Self {
        let mut layers: [Layer; LAYERS] = Default::default();
        for (i, l) in layers.iter_mut().enumerate() {
            l.check_overlap = i != 1;
            l.window = FREED_KEPT;
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
            held_edges: Spool::default(),
            anomalies: Vec::new(),
            retired: Vec::new(),
            traces: Vec::new(),
            reuse: Vec::new(),
            overlaps: Vec::new(),
            error: None,
            table: Default::default(),
            used_stacks: Default::default(),
        }
    }

    /// Adds one trace.
    pub fn add(&mut self, path: &Path, progress: &mut dyn Progress) -> Result<TraceInfo, Error> {
        self.base = self.next_base;
        self.trace = self.traces.len();
        for l in &mut self.layers {
            let (check, window) = (l.check_overlap, l.window);
            *l = Layer::default();
            l.check_overlap = check;
            l.window = window;
        }
        self.handle_maps.clear();
        self.wanted_handles.clear();
        self.table = Default::default();
        self.used_stacks.clear();
        let info = analyze(path, progress, self)?;
        let stacks = self
            .used_stacks
            .iter()
            .filter_map(|&id| Some((id, crate::stacks::shown(&self.table, id)?)))
            .collect();
        // The layers start afresh with the next trace: what they remember retires.
        for l in 0..LAYERS {
            while let Some((_, _, id)) = self.layers[l].freed.pop_front() {
                self.retire(id);
            }
        }
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
            stacks,
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
            let mut r = self.held_edges.reader()?;
            while let Some(e) = decode_edge(&mut r)? {
                if kept.get(e.from) && kept.get(e.to) {
                    self.sink.edge(&e)?;
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

    /// Remembers the last `frees` frees of each address space instead of [`FREED_KEPT`] (tests
    /// make the window small to see what leaving it does).
    #[cfg(test)]
    pub(crate) fn remember_frees(&mut self, frees: usize) {
        for l in &mut self.layers {
            l.window = frees.max(1);
        }
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
        } else if self.maybe.get(e.from)
            && self.maybe.get(e.to)
            && self.error.is_none()
            && let Err(err) = encode_edge(&e, &mut self.held_edges)
        {
            self.error = Some(err);
        }
    }

    /// Hands an anomaly to the sink, or (filtering) keeps it for the end.
    fn anomaly(&mut self, a: Anomaly) {
        if self.filtering {
            self.anomalies.push(a);
        } else if self.error.is_none()
            && let Err(err) = self.sink.anomaly(&a)
        {
            self.error = Some(err);
        }
    }

    fn retire(&mut self, id: u64) {
        if self.error.is_none()
            && let Err(err) = self.sink.retired(id)
        {
            self.error = Some(err);
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
            stack: n.stack,
            free_stack: end.map_or(0, |e| e.stack),
        };
        for s in [g.stack, g.free_stack] {
            if s != 0 {
                self.used_stacks.insert(s);
            }
        }
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
                self.anomaly(Anomaly::TrueAlias {
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
        // A node at the very last address has no room for a segment (and is no real memory).
        let (s, e) = (n.ptr, n.end().max(n.ptr.saturating_add(1)));
        if s >= e {
            return;
        }
        self.reuse.clear();
        self.overlaps.clear();
        let layer = &mut self.layers[li];
        if let Landing::Live = layer.start(s, e, id, &mut self.reuse, &mut self.overlaps)
            && layer.check_overlap
        {
            let overlaps = std::mem::take(&mut self.overlaps);
            for &(other, bytes) in &overlaps {
                self.anomaly(Anomaly::Overlap {
                    nodes: [other, id],
                    overlap_bytes: bytes,
                });
            }
            self.overlaps = overlaps;
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
        let mut remembered = false;
        if let Some(li) = layer_of(n.category) {
            let lost = end.how == EndHow::Lost;
            let layer = &mut self.layers[li];
            remembered = layer.end(n.ptr, id, end.ts_ns, lost, &mut self.retired);
            if lost
                && layer.check_overlap
                && let Some(by) = end.by
            {
                self.anomaly(Anomaly::Overlap {
                    nodes: [id, self.base + by],
                    overlap_bytes: n.size.max(1),
                });
            }
        }
        self.emit(n, Some(end));
        if !remembered {
            self.retire(id);
        }
        while let Some(old) = self.retired.pop() {
            self.retire(old);
        }
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
        self.anomaly(Anomaly::InvalidFree {
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
                self.anomaly(Anomaly::StaleLaunch {
                    node,
                    trace: self.trace,
                    seq: s.seq,
                    kernel: s.kernel.clone(),
                    ptr: s.ptr,
                });
            }
            Record::Violation(v) => {
                let node = self.freed_owner(v.ptr).map(|p| p.id);
                self.anomaly(Anomaly::PoisonViolation {
                    node,
                    trace: self.trace,
                    seq: v.seq,
                    ptr: v.ptr,
                    first_offset: v.first_offset,
                    changed_bytes: v.changed_bytes,
                });
            }
            Record::Module(_) | Record::Stack(_) | Record::PyCode(_) | Record::StackOf(_) => {
                self.table.record(rec);
            }
            Record::StaleValue(s) => {
                let node = self.freed_owner(s.ptr).map(|p| p.id);
                self.anomaly(Anomaly::StaleValue {
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
            self.anomaly(Anomaly::NeverFreed {
                node: self.gid(n.id),
                category: n.category.name(),
                size: n.size,
            });
            self.emit(n, None);
            self.retire(self.gid(n.id));
        }
    }
}

/// An edge as 34 bytes, to wait in a spool: from, to, kind, overlap, gap (a flag and a value).
fn encode_edge(e: &Edge, out: &mut impl Write) -> std::io::Result<()> {
    let mut b = [0u8; 34];
    b[0..8].copy_from_slice(&e.from.to_le_bytes());
    b[8..16].copy_from_slice(&e.to.to_le_bytes());
    b[16] = e.kind as u8;
    b[17..25].copy_from_slice(&e.overlap_bytes.to_le_bytes());
    b[25] = u8::from(e.gap_ns.is_some());
    b[26..34].copy_from_slice(&e.gap_ns.unwrap_or(0).to_le_bytes());
    out.write_all(&b)
}

/// The next edge [`encode_edge`] wrote, or `None` at the end.
fn decode_edge(r: &mut impl Read) -> std::io::Result<Option<Edge>> {
    let mut b = [0u8; 34];
    match r.read_exact(&mut b) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let kind = match b[16] {
        0 => EdgeKind::Reuse,
        1 => EdgeKind::Maps,
        2 => EdgeKind::Contains,
        _ => EdgeKind::Alias,
    };
    Ok(Some(Edge {
        from: u(0),
        to: u(8),
        kind,
        overlap_bytes: u(17),
        gap_ns: (b[25] != 0).then(|| u(26)),
    }))
}

//! The report's reuse chains: connected parts of the reuse graph, followed as the graph is
//! built, in memory bounded by what can still take part in a reuse edge.

use super::CHAINS;
use crate::graph::{Anomaly, Edge, EdgeKind, Filter, GraphNode, GraphSink, GraphTrace};
use crate::util::hex;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::cmp::Reverse;

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

/// A node as a chain needs it.
#[derive(Clone, Copy)]
struct Member {
    /// When the sink first saw it (ties between chains of one size go to the one whose
    /// first-seen node has the lower id).
    seen: u64,
    id: u64,
    api: &'static str,
    ptr: u64,
    size: u64,
    alloc_ts_ns: u64,
    free_ts_ns: Option<u64>,
}

/// A connected part of the reuse graph while it can still grow: its figures so far, and the
/// members that can still take part in a reuse edge.
struct Component {
    allocations: u64,
    reuse_edges: u64,
    bytes: u64,
    lo: u64,
    hi: u64,
    first_ns: u64,
    last_ns: u64,
    /// `(seen, id)` of the member seen first.
    first: (u64, u64),
    /// Some member's figures were added (else the extent and times are 0, as for no node).
    known: bool,
    /// The members with the lowest ids, in order (at most [`SAMPLE`]).
    sample: Vec<Member>,
    /// Members not retired yet.
    open: Vec<u64>,
}

/// Nodes a chain shows.
const SAMPLE: usize = 16;
/// Leaks the page names (all are counted).
pub(super) const LEAKS: usize = 100;

impl Component {
    fn new() -> Self {
        Component {
            allocations: 0,
            reuse_edges: 0,
            bytes: 0,
            lo: u64::MAX,
            hi: 0,
            first_ns: u64::MAX,
            last_ns: 0,
            first: (u64::MAX, u64::MAX),
            known: false,
            sample: Vec::new(),
            open: Vec::new(),
        }
    }

    /// A member's figures (once per member, when its node is known).
    fn add(&mut self, m: &Member) {
        self.known = true;
        self.bytes = self.bytes.saturating_add(m.size);
        self.lo = self.lo.min(m.ptr);
        self.hi = self.hi.max(m.ptr.saturating_add(m.size));
        self.first_ns = self.first_ns.min(m.alloc_ts_ns);
        self.last_ns = self.last_ns.max(m.free_ts_ns.unwrap_or(m.alloc_ts_ns));
        if self.sample.len() < SAMPLE || self.sample.last().is_some_and(|l| l.id > m.id) {
            let at = self.sample.partition_point(|c| c.id < m.id);
            self.sample.insert(at, *m);
            self.sample.truncate(SAMPLE);
        }
    }

    /// Takes `o` in (its open members are relabelled by the caller).
    fn absorb(&mut self, o: Component) {
        self.allocations += o.allocations;
        self.reuse_edges += o.reuse_edges;
        self.bytes = self.bytes.saturating_add(o.bytes);
        self.lo = self.lo.min(o.lo);
        self.hi = self.hi.max(o.hi);
        self.first_ns = self.first_ns.min(o.first_ns);
        self.last_ns = self.last_ns.max(o.last_ns);
        self.first = self.first.min(o.first);
        self.known |= o.known;
        let mut sample = std::mem::take(&mut self.sample);
        sample.extend(o.sample);
        sample.sort_by_key(|c| c.id);
        sample.truncate(SAMPLE);
        self.sample = sample;
        self.open.extend(o.open);
    }

    fn chain(self) -> Chain {
        let known = self.known;
        Chain {
            allocations: self.allocations,
            reuse_edges: self.reuse_edges,
            bytes: self.bytes,
            lo: hex(if known { self.lo } else { 0 }),
            hi: hex(self.hi),
            first_ns: if known { self.first_ns } else { 0 },
            last_ns: self.last_ns,
            sample: self
                .sample
                .iter()
                .map(|m| ChainNode {
                    id: m.id,
                    api: m.api,
                    ptr: hex(m.ptr),
                    size: m.size,
                    alloc_ts_ns: m.alloc_ts_ns,
                    free_ts_ns: m.free_ts_ns,
                })
                .collect(),
        }
    }
}

/// Finds the connected parts of the reuse graph as it is built, in memory bounded by what can
/// still take part in a reuse edge: a node is held from when it ends until the graph retires it
/// ([`GraphSink::retired`]); a component is held while it has a member not retired, then it is
/// closed, kept if it is among the [`CHAINS`] largest so far, and let go. Edges come before the
/// nodes they lead to, so a node joins its component when its first edge comes and adds its
/// figures when it ends.
#[derive(Default)]
pub(super) struct ChainSink {
    /// Ended nodes in no component yet: they may still be the `from` of a reuse edge.
    pending: FxHashMap<u64, Member>,
    /// Open members → their component (an index into `comps`), when they were first seen, and
    /// where they are in the component's `open`.
    member_of: FxHashMap<u64, (usize, u64, usize)>,
    comps: Vec<Option<Component>>,
    free_comps: Vec<usize>,
    /// The largest closed chains, in the order the page shows them.
    best: Vec<(Reverse<u64>, u64, Chain)>,
    seen: u64,
    pub(super) anomalies: Vec<Anomaly>,
    /// The largest leaks as (size, id, api, ptr), and how many there were.
    pub(super) leaks: Vec<(u64, u64, &'static str, u64)>,
    pub(super) leak_count: usize,
}

impl ChainSink {
    fn next_seen(&mut self) -> u64 {
        self.seen += 1;
        self.seen
    }

    fn new_comp(&mut self) -> usize {
        let c = Component::new();
        match self.free_comps.pop() {
            Some(i) => {
                self.comps[i] = Some(c);
                i
            }
            None => {
                self.comps.push(Some(c));
                self.comps.len() - 1
            }
        }
    }

    fn comp(&mut self, i: usize) -> &mut Component {
        self.comps[i].as_mut().expect("a live component")
    }

    /// The component of `id`, which joins one (of its own) if it has none yet; its figures
    /// come with it when its node is known.
    fn component_of(&mut self, id: u64) -> usize {
        if let Some(&(c, _, _)) = self.member_of.get(&id) {
            return c;
        }
        let c = self.new_comp();
        let (seen, member) = match self.pending.remove(&id) {
            Some(m) => (m.seen, Some(m)),
            None => (self.next_seen(), None),
        };
        self.member_of.insert(id, (c, seen, 0));
        let comp = self.comp(c);
        comp.allocations = 1;
        comp.first = (seen, id);
        comp.open.push(id);
        if let Some(m) = member {
            comp.add(&m);
        }
        c
    }

    /// Closes component `c`: it can grow no more.
    fn close(&mut self, c: usize) {
        let Some(comp) = self.comps[c].take() else {
            return;
        };
        self.free_comps.push(c);
        if comp.allocations < 2 {
            return;
        }
        let key = (Reverse(comp.allocations), comp.first.1);
        let at = self.best.partition_point(|b| (b.0, b.1) < key);
        if at < CHAINS {
            self.best.insert(at, (key.0, key.1, comp.chain()));
            self.best.truncate(CHAINS);
        }
    }

    pub(super) fn chains(&mut self) -> Vec<Chain> {
        for c in 0..self.comps.len() {
            self.close(c);
        }
        self.member_of.clear();
        self.best.drain(..).map(|b| b.2).collect()
    }
}

impl GraphSink for ChainSink {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        if n.free_seq.is_none() && matches!(n.category, "device" | "managed" | "handle" | "graph") {
            self.leak_count += 1;
            self.leaks.push((n.size, n.id, n.api, n.ptr));
            if self.leaks.len() >= 2 * LEAKS {
                self.leaks.sort_by_key(|l| (Reverse(l.0), l.1));
                self.leaks.truncate(LEAKS);
            }
        }
        let m = |seen| Member {
            seen,
            id: n.id,
            api: n.api,
            ptr: n.ptr,
            size: n.size,
            alloc_ts_ns: n.alloc_ts_ns,
            free_ts_ns: n.free_ts_ns,
        };
        match self.member_of.get(&n.id) {
            Some(&(c, seen, _)) => self.comp(c).add(&m(seen)),
            None => {
                let seen = self.next_seen();
                self.pending.insert(n.id, m(seen));
            }
        }
        Ok(())
    }
    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        if e.kind != EdgeKind::Reuse {
            return Ok(());
        }
        let a = self.component_of(e.from);
        let b = self.component_of(e.to);
        let keep = if a != b {
            // The smaller one joins the larger (fewer members to relabel).
            let (keep, gone) = if self.comp(a).open.len() >= self.comp(b).open.len() {
                (a, b)
            } else {
                (b, a)
            };
            let g = self.comps[gone].take().expect("a live component");
            self.free_comps.push(gone);
            let base = self.comp(keep).open.len();
            for (i, id) in g.open.iter().enumerate() {
                if let Some(x) = self.member_of.get_mut(id) {
                    x.0 = keep;
                    x.2 = base + i;
                }
            }
            self.comp(keep).absorb(g);
            keep
        } else {
            a
        };
        self.comp(keep).reuse_edges += 1;
        Ok(())
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        if self.anomalies.len() < 500 {
            self.anomalies.push(a.clone());
        }
        Ok(())
    }
    fn retired(&mut self, id: u64) -> std::io::Result<()> {
        if self.pending.remove(&id).is_some() {
            return Ok(());
        }
        let Some((c, _, at)) = self.member_of.remove(&id) else {
            return Ok(());
        };
        let comp = self.comp(c);
        comp.open.swap_remove(at);
        let moved = comp.open.get(at).copied();
        let empty = comp.open.is_empty();
        if let Some(x) = moved.and_then(|m| self.member_of.get_mut(&m)) {
            x.2 = at;
        }
        if empty {
            self.close(c);
        }
        Ok(())
    }
    fn finish(&mut self, _: &[GraphTrace], _: &Filter) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NoProgress;
    use crate::graph::GraphBuilder;
    use isolate_trace::{Api, Encoder, Event, Header, Record};

    /// The chains of a whole graph held in memory, by a union-find over every node (what the
    /// report did before it followed chains as they grow): the reference.
    #[derive(Default)]
    struct Reference {
        nodes: Vec<Option<GraphNode>>,
        index: FxHashMap<u64, u32>,
        parent: Vec<u32>,
        edges: Vec<u32>,
    }

    impl Reference {
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
                x = self.parent[x as usize];
            }
            x
        }

        fn chains(&mut self) -> Vec<Chain> {
            let n = self.nodes.len();
            let roots_of: Vec<u32> = (0..n as u32).map(|i| self.find(i)).collect();
            let mut size = vec![0u64; n];
            let mut edges = vec![0u64; n];
            for (i, &r) in roots_of.iter().enumerate() {
                size[r as usize] += 1;
                edges[r as usize] += u64::from(self.edges[i]);
            }
            let id_of = |i: usize| self.nodes[i].as_ref().map_or(u64::MAX, |g| g.id);
            let mut roots: Vec<usize> = (0..n)
                .filter(|&i| size[i] > 1 && roots_of[i] as usize == i)
                .collect();
            roots.sort_by_key(|&r| (Reverse(size[r]), id_of(r)));
            roots.truncate(CHAINS);
            roots
                .into_iter()
                .map(|r| {
                    let mut ns: Vec<&GraphNode> = (0..n)
                        .filter(|&i| roots_of[i] as usize == r)
                        .filter_map(|i| self.nodes[i].as_ref())
                        .collect();
                    ns.sort_by_key(|g| g.id);
                    Chain {
                        allocations: size[r],
                        reuse_edges: edges[r],
                        bytes: ns.iter().map(|g| g.size).sum(),
                        lo: hex(ns.iter().map(|g| g.ptr).min().unwrap_or(0)),
                        hi: hex(ns.iter().map(|g| g.ptr + g.size).max().unwrap_or(0)),
                        first_ns: ns.iter().map(|g| g.alloc_ts_ns).min().unwrap_or(0),
                        last_ns: ns
                            .iter()
                            .map(|g| g.free_ts_ns.unwrap_or(g.alloc_ts_ns))
                            .max()
                            .unwrap_or(0),
                        sample: ns
                            .iter()
                            .take(SAMPLE)
                            .map(|g| ChainNode {
                                id: g.id,
                                api: g.api,
                                ptr: hex(g.ptr),
                                size: g.size,
                                alloc_ts_ns: g.alloc_ts_ns,
                                free_ts_ns: g.free_ts_ns,
                            })
                            .collect(),
                    }
                })
                .collect()
        }
    }

    impl GraphSink for Reference {
        fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
            let i = self.slot(n.id);
            self.nodes[i as usize] = Some(n.clone());
            Ok(())
        }
        fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
            if e.kind == EdgeKind::Reuse {
                let (a, b) = (self.slot(e.from), self.slot(e.to));
                let (ra, rb) = (self.find(a), self.find(b));
                self.edges[b as usize] += 1;
                if ra != rb {
                    self.parent[ra.max(rb) as usize] = ra.min(rb);
                }
            }
            Ok(())
        }
        fn anomaly(&mut self, _: &Anomaly) -> std::io::Result<()> {
            Ok(())
        }
        fn finish(&mut self, _: &[GraphTrace], _: &Filter) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// An allocator that reuses 24 slots of 1 MiB with sizes up to 2 MiB (so blocks overlap the
    /// next slot, live ones included, and freed blocks are split), from a seed.
    fn write_trace(path: &std::path::Path, seed: u64, events: u64) {
        let mut out = Vec::new();
        Encoder::preamble(&Header::default(), &mut out);
        let mut enc = Encoder::new();
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut rnd = |n: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        };
        let mut live: Vec<u64> = Vec::new();
        for seq in 0..events {
            let mut ev = Event {
                seq,
                ts_ns: 1000 * (seq + 1),
                tid: 1,
                ..Event::default()
            };
            if !live.is_empty() && (live.len() > 12 || rnd(2) == 0) {
                ev.api = Api::CudaFree;
                ev.ptr = live.swap_remove(rnd(live.len() as u64) as usize);
            } else {
                let ptr = 0x7f00_0000_0000 + (rnd(24) << 20) + 4096 * rnd(3);
                if live.contains(&ptr) {
                    continue;
                }
                live.push(ptr);
                ev.api = Api::CudaMalloc;
                ev.ptr = ptr;
                ev.size = 256 * (1 + rnd(8192));
            }
            enc.encode(&Record::Event(ev), &mut out);
        }
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn chains_followed_as_they_grow_are_those_of_the_whole_graph() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        for seed in 1..4 {
            write_trace(&path, seed, 4000);
            for window in [3, 40, 1 << 20] {
                let mut sink = ChainSink::default();
                let mut b = GraphBuilder::new(&mut sink, Filter::default());
                b.remember_frees(window);
                b.add(&path, &mut NoProgress).unwrap();
                b.finish().unwrap();
                let mut reference = Reference::default();
                let mut b = GraphBuilder::new(&mut reference, Filter::default());
                b.remember_frees(window);
                b.add(&path, &mut NoProgress).unwrap();
                b.finish().unwrap();
                // Everything retired at the end of the trace: nothing is held.
                assert!(sink.pending.is_empty() && sink.member_of.is_empty());
                assert!(sink.comps.iter().all(Option::is_none));
                let want = reference.chains();
                assert_eq!(sink.chains(), want, "seed {seed}, window {window}");
                assert!(
                    !want.is_empty(),
                    "seed {seed}, window {window}: no chain at all"
                );
            }
        }
    }

    #[test]
    fn a_chain_holds_its_figures_without_its_nodes() {
        let mut c = Component::new();
        let m = |id, size| Member {
            seen: id,
            id,
            api: "cudaMalloc",
            ptr: u64::MAX - 10,
            size,
            alloc_ts_ns: 5,
            free_ts_ns: None,
        };
        // Hostile sizes: the byte total and the end saturate instead of wrapping.
        c.add(&m(1, u64::MAX));
        c.add(&m(2, u64::MAX));
        c.allocations = 2;
        let ch = c.chain();
        assert_eq!(ch.bytes, u64::MAX);
        assert_eq!(ch.hi, hex(u64::MAX));
        assert_eq!(ch.sample.len(), 2);
    }
}

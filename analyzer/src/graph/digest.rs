//! What a person needs of a graph, gathered while it is built, in memory bounded like the
//! graph's own: the counts, the findings with the allocation each one hit (its **victim**), the
//! largest reuse chains and what was held at exit. The text view ([`render_text`](super::render_text))
//! and the collapsed DOT of large graphs are drawn from it.
//!
//! A **reuse chain** is a line of allocations that took over each other's memory: an allocation
//! joins the chain of the first earlier allocation whose memory it was given (its first `reuse`
//! edge), so every allocation is in at most one chain and a chain is a tree rooted at its first
//! allocation. A chain is closed when none of its allocations can take part in a reuse edge any
//! more (the graph retires them, [`GraphSink::retired`]); then it is kept if it is among the
//! [`CHAINS_KEPT`] largest so far and let go.

use super::{Anomaly, Edge, EdgeKind, Filter, GraphNode, GraphSink, GraphTrace};
use crate::util::hex;
use crate::words;
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// Chains kept (the largest).
pub const CHAINS_KEPT: usize = 12;
/// Findings kept of each kind (all are counted).
pub const FINDINGS_KEPT: usize = 8;
/// Allocations held at exit kept (the largest; all are counted).
pub const HELD_KEPT: usize = 5;
/// Categories that are address space, not memory: held at exit, they are counted apart.
pub const ADDRESS_SPACE: [&str; 2] = ["reservation", "mapping"];
/// Members of a chain kept by name, from its start (and its last one).
const SAMPLE: usize = 3;
/// With a filter, edges and findings come after every node and retirement: nodes are held
/// until the end, up to this many (the rest are named by id only).
const HELD_WHEN_FILTERING: usize = 1 << 18;
/// Victims remembered, to mark the chains that hold them.
const VICTIMS_KEPT: usize = 10_000;
/// Successors remembered of each allocation a finding names.
const NEXT_KEPT: usize = 3;

/// One allocation, as the views name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Brief {
    pub id: u64,
    pub trace: usize,
    pub category: &'static str,
    pub api: &'static str,
    pub ptr: u64,
    pub size: u64,
    pub alloc_seq: u64,
    pub free_seq: Option<u64>,
    pub free_api: Option<&'static str>,
    pub lost: bool,
    /// The stack ids of the calls that made and ended it (0: none), in its trace's `stacks`.
    pub stack: u32,
    pub free_stack: u32,
}

impl Brief {
    fn of(n: &GraphNode) -> Self {
        Brief {
            id: n.id,
            trace: n.trace,
            category: n.category,
            api: n.api,
            ptr: n.ptr,
            size: n.size,
            alloc_seq: n.alloc_seq,
            free_seq: n.free_seq,
            free_api: n.free_api,
            lost: n.lost,
            stack: n.stack,
            free_stack: n.free_stack,
        }
    }

    /// `#0 cudaMalloc 4.0 MiB at 0x7f…` (a physical handle has no address).
    pub fn short(&self) -> String {
        let at = if self.category == "handle" {
            String::new()
        } else {
            format!(" at {}", hex(self.ptr))
        };
        format!("#{} {} {}{at}", self.id, self.api, words::size(self.size))
    }

    /// [`Brief::short`] and its life: `…, events 0..1, freed by cudaFree`.
    pub fn long(&self) -> String {
        let life = match (self.free_seq, self.lost) {
            (_, true) => format!(
                "from {}, lost (its address was handed out again before a free was seen)",
                words::event(self.alloc_seq)
            ),
            (Some(f), _) => format!(
                "events {}..{}, freed by {}",
                self.alloc_seq,
                f,
                self.free_api.unwrap_or("?")
            ),
            (None, _) => format!(
                "from {}, {}",
                words::event(self.alloc_seq),
                words::HELD_AT_EXIT
            ),
        };
        format!("{}, {life}", self.short())
    }
}

/// A node while it can still be named, in 72 bytes (a few hundred thousand are held at once on
/// a long trace: the graph's window of freed blocks).
#[derive(Clone, Copy)]
struct Held {
    ptr: u64,
    size: u64,
    alloc_seq: u64,
    /// `u64::MAX` when never freed.
    free_seq: u64,
    api: &'static str,
    /// Empty when never freed.
    free_api: &'static str,
    trace: u32,
    category: u8,
    lost: bool,
    /// Stack ids of the calls that made and ended it (0: none).
    stack: u32,
    free_stack: u32,
}

/// The categories, numbered for [`Held`].
const CATEGORIES: [&str; 8] = [
    "device",
    "managed",
    "graph",
    "host",
    "registered",
    "reservation",
    "handle",
    "mapping",
];

impl Held {
    fn of(n: &GraphNode) -> Self {
        Held {
            ptr: n.ptr,
            size: n.size,
            alloc_seq: n.alloc_seq,
            free_seq: n.free_seq.unwrap_or(u64::MAX),
            api: n.api,
            free_api: n.free_api.unwrap_or(""),
            trace: n.trace as u32,
            category: CATEGORIES
                .iter()
                .position(|c| *c == n.category)
                .unwrap_or(CATEGORIES.len()) as u8,
            lost: n.lost,
            stack: n.stack,
            free_stack: n.free_stack,
        }
    }

    fn brief(&self, id: u64) -> Brief {
        Brief {
            id,
            trace: self.trace as usize,
            category: CATEGORIES
                .get(self.category as usize)
                .copied()
                .unwrap_or("other"),
            api: self.api,
            ptr: self.ptr,
            size: self.size,
            alloc_seq: self.alloc_seq,
            free_seq: (self.free_seq != u64::MAX).then_some(self.free_seq),
            free_api: (!self.free_api.is_empty()).then_some(self.free_api),
            lost: self.lost,
            stack: self.stack,
            free_stack: self.free_stack,
        }
    }
}

/// An anomaly (a finding of [`crate::finding`], or one of the graph's own) and the allocations
/// it names.
#[derive(Clone, Debug)]
pub struct Hit {
    pub anomaly: Anomaly,
    /// The nodes it names, each with its brief when it was known.
    pub nodes: Vec<(u64, Option<Brief>)>,
    /// Allocations given the first named node's memory after the finding (the first few), and
    /// how many more.
    pub next: Vec<u64>,
    pub more_next: u64,
}

impl Hit {
    /// The node it names first (the victim of a stale write or launch, the last holder of an
    /// invalid free's address).
    pub fn victim(&self) -> Option<&(u64, Option<Brief>)> {
        self.nodes.first()
    }
}

/// A reuse chain, as the views show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub trace: usize,
    pub allocations: u64,
    pub bytes: u64,
    pub lo: u64,
    pub hi: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Its first allocations (the root first), by id with their brief when known.
    pub sample: Vec<(u64, Option<Brief>)>,
    /// The last allocation that joined it.
    pub last: (u64, Option<Brief>),
    /// It holds the victim of a stale write or stale launch.
    pub victim: bool,
}

struct Open {
    trace: u32,
    victim: bool,
    /// Some member's figures were added.
    known: bool,
    allocations: u64,
    /// Members not retired yet.
    open: u64,
    bytes: u64,
    lo: u64,
    hi: u64,
    first_seq: u64,
    last_seq: u64,
    sample: [(u64, Option<Held>); SAMPLE],
    sample_len: usize,
    last: (u64, Option<Held>),
}

impl Open {
    fn new(root: u64, victim: bool) -> Self {
        Open {
            trace: 0,
            victim,
            known: false,
            allocations: 1,
            open: 1,
            bytes: 0,
            lo: u64::MAX,
            hi: 0,
            first_seq: u64::MAX,
            last_seq: 0,
            sample: [(root, None); SAMPLE],
            sample_len: 1,
            last: (root, None),
        }
    }

    /// A member joins (its figures come with its node).
    fn push(&mut self, id: u64, victim: bool) {
        self.open += 1;
        self.allocations += 1;
        self.victim |= victim;
        if self.sample_len < SAMPLE {
            self.sample[self.sample_len] = (id, None);
            self.sample_len += 1;
        }
        self.last = (id, None);
    }

    /// A member's figures.
    fn add(&mut self, id: u64, h: &Held) {
        self.known = true;
        self.trace = h.trace;
        self.bytes = self.bytes.saturating_add(h.size);
        self.lo = self.lo.min(h.ptr);
        self.hi = self.hi.max(h.ptr.saturating_add(h.size));
        self.first_seq = self.first_seq.min(h.alloc_seq);
        let end = if h.free_seq == u64::MAX {
            h.alloc_seq
        } else {
            h.free_seq
        };
        self.last_seq = self.last_seq.max(end);
        if let Some(s) = self.sample[..self.sample_len]
            .iter_mut()
            .find(|s| s.0 == id)
        {
            s.1 = Some(*h);
        }
        if self.last.0 == id {
            self.last.1 = Some(*h);
        }
    }

    fn chain(&self) -> Chain {
        let brief = |(id, h): &(u64, Option<Held>)| (*id, h.map(|h| h.brief(*id)));
        Chain {
            trace: self.trace as usize,
            allocations: self.allocations,
            bytes: self.bytes,
            lo: if self.known { self.lo } else { 0 },
            hi: self.hi,
            first_seq: if self.known { self.first_seq } else { 0 },
            last_seq: self.last_seq,
            sample: self.sample[..self.sample_len].iter().map(brief).collect(),
            last: brief(&self.last),
            victim: self.victim,
        }
    }
}

/// The digest of a graph: a [`GraphSink`] (see the module docs).
#[derive(Default)]
pub struct Digest {
    filtering: bool,
    /// Category → nodes.
    pub nodes: BTreeMap<&'static str, u64>,
    pub edges: BTreeMap<EdgeKind, u64>,
    /// Anomaly kind → how many.
    pub anomalies: BTreeMap<&'static str, u64>,
    /// The first [`FINDINGS_KEPT`] findings of each kind (not `never_freed`), in order.
    pub findings: Vec<Hit>,
    /// Held at exit: how many and bytes, by category, and the largest few of memory (not
    /// [`ADDRESS_SPACE`]).
    pub held_at_exit: BTreeMap<&'static str, (u64, u64)>,
    pub largest_held: Vec<Brief>,
    /// The largest chains (largest first), and how many chains and allocations in chains
    /// there were in all.
    pub chains: Vec<Chain>,
    pub chain_count: u64,
    pub chained: u64,
    pub traces: Vec<GraphTrace>,
    pub filter: Filter,
    held: FxHashMap<u64, Held>,
    /// Node → findings (index into `findings`) that name it.
    wanted: FxHashMap<u64, Vec<usize>>,
    victims: FxHashSet<u64>,
    member_of: FxHashMap<u64, usize>,
    open: Vec<Option<Open>>,
    free_slots: Vec<usize>,
}

impl Digest {
    /// `filtering`: the graph is built with a filter (edges and findings then come last).
    pub fn new(filtering: bool) -> Self {
        Digest {
            filtering,
            ..Digest::default()
        }
    }

    /// All nodes.
    pub fn node_count(&self) -> u64 {
        self.nodes.values().sum()
    }

    /// Allocations in no chain (handles aside: they take no memory of an address space).
    pub fn never_reused(&self) -> u64 {
        let spaces = self.node_count() - self.nodes.get("handle").copied().unwrap_or(0);
        spaces.saturating_sub(self.chained)
    }

    /// How many findings of `kind` there were.
    pub fn count(&self, kind: &str) -> u64 {
        self.anomalies.get(kind).copied().unwrap_or(0)
    }

    fn brief(&self, id: u64) -> Option<Brief> {
        self.held.get(&id).map(|h| h.brief(id))
    }

    fn slot(&mut self, c: usize) -> &mut Open {
        self.open[c].as_mut().expect("an open chain")
    }

    /// The open chain of `id`, which starts one when it has none.
    fn chain_of(&mut self, id: u64) -> usize {
        if let Some(&c) = self.member_of.get(&id) {
            return c;
        }
        let mut o = Open::new(id, self.victims.contains(&id));
        if let Some(h) = self.held.get(&id) {
            o.add(id, h);
        }
        let c = match self.free_slots.pop() {
            Some(c) => {
                self.open[c] = Some(o);
                c
            }
            None => {
                self.open.push(Some(o));
                self.open.len() - 1
            }
        };
        self.member_of.insert(id, c);
        c
    }

    fn join(&mut self, c: usize, id: u64) {
        self.member_of.insert(id, c);
        let held = self.held.get(&id).copied();
        let victim = self.victims.contains(&id);
        let o = self.slot(c);
        o.push(id, victim);
        if let Some(h) = &held {
            o.add(id, h);
        }
    }

    fn close(&mut self, c: usize) {
        let Some(o) = self.open[c].take() else {
            return;
        };
        self.free_slots.push(c);
        let ch = o.chain();
        self.chain_count += 1;
        self.chained += ch.allocations;
        let key = |c: &Chain| (Reverse(c.allocations), c.sample[0].0);
        let at = self.chains.partition_point(|b| key(b) < key(&ch));
        if at < CHAINS_KEPT {
            self.chains.insert(at, ch);
            self.chains.truncate(CHAINS_KEPT);
        }
    }

    fn retire_member(&mut self, id: u64) {
        if let Some(c) = self.member_of.remove(&id) {
            let o = self.slot(c);
            o.open -= 1;
            if o.open == 0 {
                self.close(c);
            }
        }
    }
}

impl GraphSink for Digest {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        *self.nodes.entry(n.category).or_default() += 1;
        let b = Brief::of(n);
        if n.free_seq.is_none() {
            let e = self.held_at_exit.entry(n.category).or_default();
            e.0 += 1;
            e.1 = e.1.saturating_add(n.size);
        }
        if n.free_seq.is_none() && !ADDRESS_SPACE.contains(&n.category) {
            let at = self
                .largest_held
                .partition_point(|h| (Reverse(h.size), h.id) < (Reverse(b.size), b.id));
            if at < HELD_KEPT {
                self.largest_held.insert(at, b.clone());
                self.largest_held.truncate(HELD_KEPT);
            }
        }
        if let Some(fs) = self.wanted.get(&n.id) {
            for &f in fs {
                if let Some(slot) = self.findings[f].nodes.iter_mut().find(|x| x.0 == n.id) {
                    slot.1 = Some(b.clone());
                }
            }
        }
        if let Some(&c) = self.member_of.get(&n.id) {
            self.slot(c).add(n.id, &Held::of(n));
        }
        if !self.filtering || self.held.len() < HELD_WHEN_FILTERING {
            self.held.insert(n.id, Held::of(n));
        }
        Ok(())
    }

    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        *self.edges.entry(e.kind).or_default() += 1;
        if e.kind != EdgeKind::Reuse {
            return Ok(());
        }
        if let Some(fs) = self.wanted.get(&e.from) {
            for &f in fs {
                let x = &mut self.findings[f];
                if x.nodes.first().is_some_and(|v| v.0 == e.from) {
                    if x.next.len() < NEXT_KEPT {
                        x.next.push(e.to);
                    } else {
                        x.more_next += 1;
                    }
                }
            }
        }
        let c = self.chain_of(e.from);
        if !self.member_of.contains_key(&e.to) {
            self.join(c, e.to);
        }
        Ok(())
    }

    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        let kind = a.kind();
        let seen = self.anomalies.entry(kind).or_default();
        *seen += 1;
        let seen = *seen;
        let ids = a.nodes();
        if matches!(
            a,
            Anomaly::PoisonViolation { .. } | Anomaly::StaleLaunch { .. }
        ) && let Some(&v) = ids.first()
            && self.victims.len() < VICTIMS_KEPT
        {
            self.victims.insert(v);
            if let Some(&c) = self.member_of.get(&v) {
                self.slot(c).victim = true;
            }
        }
        if matches!(a, Anomaly::NeverFreed { .. }) || seen > FINDINGS_KEPT as u64 {
            return Ok(());
        }
        let f = self.findings.len();
        let nodes = ids.iter().map(|&id| (id, self.brief(id))).collect();
        for &id in &ids {
            let w = self.wanted.entry(id).or_default();
            if !w.contains(&f) {
                w.push(f);
            }
        }
        self.findings.push(Hit {
            anomaly: a.clone(),
            nodes,
            next: Vec::new(),
            more_next: 0,
        });
        Ok(())
    }

    fn retired(&mut self, id: u64) -> std::io::Result<()> {
        if self.filtering {
            // Edges and findings are still to come: keep everything until the end.
            return Ok(());
        }
        self.held.remove(&id);
        self.wanted.remove(&id);
        self.retire_member(id);
        Ok(())
    }

    fn finish(&mut self, traces: &[GraphTrace], filter: &Filter) -> std::io::Result<()> {
        for c in 0..self.open.len() {
            self.close(c);
        }
        self.member_of.clear();
        self.held.clear();
        self.wanted.clear();
        self.traces = traces.to_vec();
        self.filter = *filter;
        Ok(())
    }
}

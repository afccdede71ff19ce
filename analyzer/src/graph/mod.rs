//! `isolate graph`: the aliasing graph — which allocation was handed memory that which other
//! had given back, how virtual ranges map physical handles, and what looks wrong.
//!
//! One node per [`Node`](crate::track::Node) of the model (allocations, registrations,
//! reservations, handles, mappings). Edges:
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
//! in start order), edges and anomalies as they are found (with a filter: at the end, once it
//! has decided which nodes stay), so the graph of a long trace never has to be held whole. The
//! JSON and DOT writers keep edges and anomalies back in spools (memory, then a temporary file)
//! and write them after all nodes. A freed block is remembered for reuse edges until
//! [`FREED_KEPT`] more frees have happened in its address space, so the builder's memory is
//! bounded by what is live plus that window, however many allocations the trace makes.
//!
//! Outputs: the text view (the default: [`Digest`] gathers the findings with their victims, the
//! largest reuse chains and what was held at exit, [`render_text`] writes a screenful), JSON
//! ([`JsonSink`]: everything) and DOT ([`AutoDotSink`]: whole when small, collapsed into its
//! largest chains when large; [`DotSink`]: every node, however large).
//!
//! Files: this one has the graph's types and the [`GraphSink`] trait; `filter.rs` decides which
//! nodes stay ([`Filter`]); `build.rs` runs the model and finds edges and anomalies
//! ([`GraphBuilder`]); `sinks.rs` keeps a graph (or its counts) in memory; `digest.rs` keeps
//! what a person reads of it and `text.rs` writes that; `json.rs` and `dot.rs` write it out as it
//! is built, `spool.rs` holds back what must wait.

mod build;
mod digest;
mod dot;
mod filter;
mod json;
mod sinks;
mod spool;
mod text;

pub use build::{FREED_KEPT, GraphBuilder};
pub use digest::{ADDRESS_SPACE, Brief, CHAINS_KEPT, Chain, Digest, FINDINGS_KEPT, Hit};
pub use dot::{AutoDotSink, DOT_FULL_CHAIN, DOT_FULL_EDGES, DOT_FULL_NODES, DotSink};
pub use filter::Filter;
pub use json::JsonSink;
pub use sinks::{Counts, Graph, NullSink};
pub use spool::SPOOL_IN_MEMORY;
pub use text::{TEXT_CHAINS, TEXT_FINDINGS, TextContext, render_text};

use crate::Error;
use crate::finding::Kind;
use crate::source::Progress;
use crate::util::ser_hex;
use serde::Serialize;
use std::path::Path;

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
    /// Trace format 2: the stack ids of the call that started it and of the one that ended it
    /// (absent: none); the stacks are in its trace's `stacks`.
    #[serde(skip_serializing_if = "is_zero")]
    pub stack: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub free_stack: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
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

/// The anomaly (its `kind` tag) under which the graph shows findings of kind `k`, or `None`
/// when the graph does not show them: a device fault names no allocation, and the graph shows
/// every allocation held at exit (`never_freed`), not only the possible leaks. An unordered
/// free is about the order of streams, which the graph (allocations and their lifetimes) does
/// not draw: the summary and the report name it with its three calls.
pub fn anomaly_of(k: Kind) -> Option<&'static str> {
    match k {
        Kind::StaleWrite => Some("poison_violation"),
        Kind::StaleLaunch => Some("stale_launch"),
        Kind::InvalidFree | Kind::DoubleFree => Some("invalid_free"),
        Kind::UnorderedFree | Kind::DeviceFault | Kind::Leak => None,
    }
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

    /// The kind of [`crate::finding`] it is, or `None` for the graph's own anomalies about
    /// nodes (overlaps, true aliases, never-freed nodes, stale values), which are not findings.
    pub fn finding(&self) -> Option<Kind> {
        match self {
            Anomaly::PoisonViolation { .. } => Some(Kind::StaleWrite),
            Anomaly::StaleLaunch { .. } => Some(Kind::StaleLaunch),
            Anomaly::InvalidFree {
                double_free: true, ..
            } => Some(Kind::DoubleFree),
            Anomaly::InvalidFree { .. } => Some(Kind::InvalidFree),
            Anomaly::Overlap { .. }
            | Anomaly::TrueAlias { .. }
            | Anomaly::NeverFreed { .. }
            | Anomaly::StaleValue { .. } => None,
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
    /// Trace format 2: stack id → the stack, for every stack a node of this trace names
    /// (absent without stacks).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub stacks: std::collections::BTreeMap<u32, crate::stacks::ShownStack>,
}

/// Where a graph goes.
pub trait GraphSink {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()>;
    fn edge(&mut self, e: &Edge) -> std::io::Result<()>;
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()>;
    /// Node `id` will be the `from` of no more reuse edges: its freed memory was forgotten (see
    /// [`FREED_KEPT`]), or it never left any (never freed, lost, overlapping), or its trace
    /// ended. Comes after the node itself (when the node is kept). A sink that follows reuse
    /// chains can let go of it.
    fn retired(&mut self, id: u64) -> std::io::Result<()> {
        let _ = id;
        Ok(())
    }
    /// After everything else.
    fn finish(&mut self, traces: &[GraphTrace], filter: &Filter) -> std::io::Result<()>;
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

/// `allocated at …; freed at …` of a node from its trace's stacks ([`crate::finding::place`]).
pub(crate) fn node_code(t: Option<&GraphTrace>, stack: u32, free_stack: u32) -> Option<String> {
    let stacks = &t?.stacks;
    let at = |what: &str, id: u32| {
        crate::finding::place(stacks.get(&id)).map(|p| format!("{what} at {p}"))
    };
    let v: Vec<String> = [at("allocated", stack), at("freed", free_stack)]
        .into_iter()
        .flatten()
        .collect();
    (!v.is_empty()).then(|| v.join("; "))
}

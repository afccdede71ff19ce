//! Sinks that keep a graph in memory: the whole [`Graph`] (tests, small traces), its [`Counts`]
//! (the diff) or bare totals ([`NullSink`], the benchmark).

use super::{Anomaly, Edge, EdgeKind, Filter, GraphNode, GraphSink, GraphTrace};
use crate::util::size_class;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::BTreeMap;

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

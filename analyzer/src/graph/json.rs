//! `isolate graph --format json`: the graph written as JSON while it is built; edges and
//! anomalies wait in spools until the nodes are out.

use super::spool::Spool;
use super::{Anomaly, Edge, Filter, GraphNode, GraphSink, GraphTrace};
use serde::Serialize;
use std::io::Write;

/// Writes the graph as JSON while it is built: `{"nodes": [...], "edges": [...],
/// "anomalies": [...], "traces": [...], "filter": {...}}`, one node, edge or anomaly per line.
///
/// Edges are known before the nodes they join have ended, and anomalies as the trace goes, so
/// both wait in a spool (memory up to [`SPOOL_IN_MEMORY`](super::SPOOL_IN_MEMORY) bytes, then
/// an unlinked temporary file) until the nodes are written.
pub struct JsonSink<W: Write> {
    out: W,
    /// The section being written: 0 none yet, 1 nodes, 2 edges, 3 anomalies.
    state: u8,
    first: bool,
    edges: Spool,
    anomalies: Spool,
}

/// Writes `v` as one more item of a JSON list being spooled.
fn spool_item<T: Serialize>(spool: &mut Spool, v: &T) -> std::io::Result<()> {
    spool.write_all(if spool.items == 0 { b"\n" } else { b",\n" })?;
    spool.items += 1;
    serde_json::to_writer(&mut *spool, v)?;
    Ok(())
}

impl<W: Write> JsonSink<W> {
    pub fn new(out: W) -> Self {
        JsonSink {
            out,
            state: 0,
            first: true,
            edges: Spool::default(),
            anomalies: Spool::default(),
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    /// Moves on to section `state` (1 nodes, 2 edges, 3 anomalies), opening it; entering the
    /// edges or the anomalies writes out their spool.
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
            let spool = match self.state {
                2 => &mut self.edges,
                3 => &mut self.anomalies,
                _ => continue,
            };
            self.first = spool.items == 0;
            spool.drain_into(&mut self.out)?;
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
            spool_item(&mut self.edges, e)
        } else {
            self.item(2, e)
        }
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        if self.state < 3 {
            spool_item(&mut self.anomalies, a)
        } else {
            self.item(3, a)
        }
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

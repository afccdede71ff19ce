//! `isolate graph --format dot`: the graph written in Graphviz DOT while it is built, every
//! finding a note of its own (the notes wait in a spool and come after all nodes and edges).

use super::spool::Spool;
use super::{Anomaly, Edge, EdgeKind, Filter, GraphNode, GraphSink, GraphTrace};
use crate::util::{escape_dot, hex, human_bytes};
use std::io::Write;

/// Writes the graph in Graphviz DOT while it is built. All text from the trace is escaped
/// ([`escape_dot`]).
///
/// Node ids: `n<id>` for the graph's nodes (ids are unique over all traces of the graph) and
/// `a<k>` for the k-th anomaly (counting from 0 in the order of the JSON output's `anomalies`,
/// `never_freed` included although it has no note of its own: its node is drawn filled red and
/// labelled "live at end"). Every other anomaly gets a note node of its own, with a dotted edge
/// to each node it names, so two findings on one allocation are two notes. The notes are written
/// after every node and edge (they wait in a spool: memory up to
/// [`SPOOL_IN_MEMORY`](super::SPOOL_IN_MEMORY) bytes, then a temporary file).
pub struct DotSink<W: Write> {
    out: W,
    started: bool,
    /// Anomalies seen so far: the next one is `a<anomalies>`.
    anomalies: u64,
    notes: Spool,
}

impl<W: Write> DotSink<W> {
    pub fn new(out: W) -> Self {
        DotSink {
            out,
            started: false,
            anomalies: 0,
            notes: Spool::default(),
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
            self.notes,
            "  a{id} [shape=note, color={color}, label=\"{}\"];",
            dot_lines(&lines)
        )?;
        for n in nodes {
            writeln!(self.notes, "  a{id} -> n{n} [color={color}, style=dotted];")?;
        }
        Ok(())
    }

    fn finish(&mut self, traces: &[GraphTrace], _filter: &Filter) -> std::io::Result<()> {
        self.start()?;
        self.notes.drain_into(&mut self.out)?;
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

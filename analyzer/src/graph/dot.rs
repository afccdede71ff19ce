//! `isolate graph --format dot`: the graph in Graphviz DOT, every finding a note of its own and
//! every victim of a stale write or launch filled red. [`AutoDotSink`] (the default) draws a small
//! graph whole and collapses a large one into its largest reuse chains; [`DotSink`]
//! (`--full`) writes every node and edge while the graph is built (the notes wait in a spool and
//! come after all nodes and edges).

use super::digest::{ADDRESS_SPACE, Brief, Digest};
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
/// to each node it names, so two findings on one allocation are two notes; the victim of a stale
/// write or launch is filled red by a second statement for its node, among the notes (Graphviz
/// merges the two). The notes are written
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
            self.out.write_all(HEAD.as_bytes())?;
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

/// The attributes that mark the victim of a stale write or launch (`what`: which).
fn victim_attrs(what: &str) -> String {
    format!(
        "style=\"filled,bold\", fillcolor=\"#ff8c8c\", color=red, penwidth=3, xlabel=\"{}\"",
        escape_dot(&format!("VICTIM of a {what}"))
    )
}

/// What a finding makes of the node it names first: the victim of a stale write or launch.
fn victim_of(a: &Anomaly) -> Option<(u64, &'static str)> {
    use crate::finding::Kind;
    let k = a.finding()?;
    match k {
        Kind::StaleWrite | Kind::StaleLaunch => a.nodes().first().map(|n| (*n, k.word())),
        // An unordered free is no anomaly of the graph (anomaly_of): nothing to mark.
        Kind::UnorderedFree
        | Kind::InvalidFree
        | Kind::DoubleFree
        | Kind::DeviceFault
        | Kind::Leak => None,
    }
}

/// A node's declaration; `victim` names the findings that hit it, `code` where in the code it
/// was made and ended (nodes a finding names).
fn node_stmt(n: &GraphNode, victim: Option<&str>, code: Option<&str>) -> String {
    let life = match (n.free_seq, n.lost) {
        (_, true) => format!("seq {}..lost", n.alloc_seq),
        (Some(f), _) => format!("seq {}..{}", n.alloc_seq, f),
        (None, _) => format!("seq {}..(live at end)", n.alloc_seq),
    };
    let mut label = format!(
        "#{} {}\\n{} {}\\n{}\\ndev {} tid {}",
        n.id,
        escape_dot(n.api),
        hex(n.ptr),
        escape_dot(&human_bytes(n.size)),
        life,
        n.device,
        n.tid
    );
    if let Some(c) = code {
        for part in c.split("; ") {
            label.push_str("\\n");
            label.push_str(&escape_dot(part));
        }
    }
    let style = match (n.category, n.free_seq) {
        _ if victim.is_some() => format!(", {}", victim_attrs(victim.unwrap_or_default())),
        ("handle", _) => ", style=filled, fillcolor=\"#dde8ff\"".to_owned(),
        ("reservation", _) => ", style=dashed".to_owned(),
        ("mapping", _) => ", style=filled, fillcolor=\"#eef6ee\"".to_owned(),
        (_, None) => ", style=filled, fillcolor=\"#ffdddd\"".to_owned(),
        _ => String::new(),
    };
    format!("  n{} [label=\"{label}\"{style}];\n", n.id)
}

fn edge_stmt(e: &Edge) -> String {
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
    format!(
        "  n{} -> n{} [label=\"{}\"{style}];\n",
        e.from,
        e.to,
        escape_dot(&label)
    )
}

/// The note of anomaly number `id` and its dotted edges (nothing for `never_freed`).
fn note_stmts(id: u64, a: &Anomaly) -> String {
    let Some((nodes, lines, color)) = dot_note(a) else {
        return String::new();
    };
    let mut s = format!(
        "  a{id} [shape=note, color={color}, label=\"{}\"];\n",
        dot_lines(&lines)
    );
    for n in nodes {
        s.push_str(&format!("  a{id} -> n{n} [color={color}, style=dotted];\n"));
    }
    s
}

/// The graph's title: each trace's file, pid, rank and command line.
fn title(traces: &[GraphTrace]) -> String {
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
    title.join(" | ")
}

impl<W: Write> GraphSink for DotSink<W> {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        self.start()?;
        self.out.write_all(node_stmt(n, None, None).as_bytes())
    }

    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        self.start()?;
        self.out.write_all(edge_stmt(e).as_bytes())
    }

    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        self.start()?;
        let id = self.anomalies;
        self.anomalies += 1;
        self.notes.write_all(note_stmts(id, a).as_bytes())?;
        // The victim's node was written already (nodes are written as they end): its look
        // changes by a second statement, which Graphviz merges into the first.
        if let Some((n, what)) = victim_of(a) {
            writeln!(self.notes, "  n{n} [{}];", victim_attrs(what))?;
        }
        Ok(())
    }

    fn finish(&mut self, traces: &[GraphTrace], _filter: &Filter) -> std::io::Result<()> {
        self.start()?;
        self.notes.drain_into(&mut self.out)?;
        writeln!(
            self.out,
            "  label=\"{}\";\n  labelloc=t;\n}}",
            escape_dot(&title(traces))
        )?;
        self.out.flush()
    }
}

/// Above this many nodes (or [`DOT_FULL_EDGES`] edges, or a reuse chain of more than
/// [`DOT_FULL_CHAIN`] allocations) the default DOT output collapses the graph into its largest
/// reuse chains: drawn whole (left to right, a column per step of a chain), the H200 trace of
/// 152 allocations with a chain of 100 is an image 32,767 pixels wide, Graphviz's limit.
/// `--full` draws every node all the same ([`DotSink`]).
pub const DOT_FULL_NODES: usize = 100;
/// See [`DOT_FULL_NODES`].
pub const DOT_FULL_EDGES: usize = 200;
/// See [`DOT_FULL_NODES`].
pub const DOT_FULL_CHAIN: u64 = 25;

/// The graph as it came, while it is small enough to be drawn whole.
#[derive(Default)]
struct Whole {
    nodes: Vec<GraphNode>,
    edges: Vec<Edge>,
    anomalies: Vec<Anomaly>,
}

/// `isolate graph --format dot`: every node and edge when the graph has at most
/// [`DOT_FULL_NODES`] nodes, [`DOT_FULL_EDGES`] edges and no reuse chain of more than
/// [`DOT_FULL_CHAIN`] allocations, with each victim of a stale write or
/// launch drawn filled red; above that, the collapsed picture of its [`Digest`]: the largest
/// reuse chains one box each, the victims and their findings, what was held at exit, and a
/// box that says what was left out. The graph is held until the end only while it is small;
/// past the limits only the digest goes on.
pub struct AutoDotSink<W: Write> {
    out: W,
    whole: Option<Whole>,
    digest: Digest,
}

impl<W: Write> AutoDotSink<W> {
    /// `filtering`: the graph is built with a filter (see [`Digest::new`]).
    pub fn new(out: W, filtering: bool) -> Self {
        AutoDotSink {
            out,
            whole: Some(Whole::default()),
            digest: Digest::new(filtering),
        }
    }

    fn check(&mut self) {
        if self
            .whole
            .as_ref()
            .is_some_and(|w| w.nodes.len() > DOT_FULL_NODES || w.edges.len() > DOT_FULL_EDGES)
        {
            self.whole = None;
        }
    }
}

const HEAD: &str = "digraph isolate {\n  graph [rankdir=LR, fontname=\"monospace\"];\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n  edge [fontname=\"monospace\", fontsize=9];\n";

/// Every node and edge, the victims filled red.
fn write_whole(out: &mut impl Write, w: &Whole, traces: &[GraphTrace]) -> std::io::Result<()> {
    let mut victims: std::collections::BTreeMap<u64, Vec<&str>> = Default::default();
    for a in &w.anomalies {
        if let Some((n, what)) = victim_of(a) {
            let v = victims.entry(n).or_default();
            if !v.contains(&what) {
                v.push(what);
            }
        }
    }
    // The nodes findings name show where in the code they were made and ended.
    let named: std::collections::BTreeSet<u64> = w
        .anomalies
        .iter()
        .filter(|a| a.finding().is_some())
        .flat_map(|a| a.nodes())
        .collect();
    out.write_all(HEAD.as_bytes())?;
    for n in &w.nodes {
        let what = victims.get(&n.id).map(|v| v.join(" and a "));
        let code = named
            .contains(&n.id)
            .then(|| super::node_code(traces.get(n.trace), n.stack, n.free_stack))
            .flatten();
        out.write_all(node_stmt(n, what.as_deref(), code.as_deref()).as_bytes())?;
    }
    for e in &w.edges {
        out.write_all(edge_stmt(e).as_bytes())?;
    }
    for (k, a) in w.anomalies.iter().enumerate() {
        out.write_all(note_stmts(k as u64, a).as_bytes())?;
    }
    writeln!(
        out,
        "  label=\"{}\";\n  labelloc=t;\n}}",
        escape_dot(&title(traces))
    )
}

/// Chain boxes side by side in the collapsed picture.
const COLUMNS: usize = 4;

/// A node of the collapsed picture, from what the digest knows of it.
fn brief_stmt(id: u64, b: Option<&Brief>, attrs: &str, code: Option<&str>) -> String {
    let label = match b {
        Some(b) => {
            let mut lines = vec![
                format!("#{} {}", b.id, b.api),
                format!("{} {}", hex(b.ptr), human_bytes(b.size)),
                match (b.free_seq, b.lost) {
                    (_, true) => format!("seq {}..lost", b.alloc_seq),
                    (Some(f), _) => format!("seq {}..{}", b.alloc_seq, f),
                    (None, _) => format!("seq {}..(live at end)", b.alloc_seq),
                },
            ];
            lines.extend(
                code.into_iter()
                    .flat_map(|c| c.split("; "))
                    .map(str::to_owned),
            );
            dot_lines(&lines)
        }
        None => format!("#{id}"),
    };
    format!("  n{id} [label=\"{label}\"{attrs}];\n")
}

/// The collapsed picture of a large graph (see [`AutoDotSink`]).
fn write_collapsed(out: &mut impl Write, d: &Digest) -> std::io::Result<()> {
    out.write_all(
        b"digraph isolate {\n  graph [rankdir=TB, fontname=\"monospace\"];\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n  edge [fontname=\"monospace\", fontsize=9];\n",
    )?;
    let mut declared = std::collections::BTreeSet::new();
    // The largest chains, one box each.
    for (i, c) in d.chains.iter().enumerate() {
        let mut members: Vec<String> = c
            .sample
            .iter()
            .map(|(id, b)| match b {
                Some(b) => format!("#{id} {} {}", b.api, human_bytes(b.size)),
                None => format!("#{id}"),
            })
            .collect();
        if c.allocations > c.sample.len() as u64 {
            if c.allocations > c.sample.len() as u64 + 1 {
                members.push("…".to_owned());
            }
            members.push(match &c.last.1 {
                Some(b) => format!("#{} {} {}", b.id, b.api, human_bytes(b.size)),
                None => format!("#{}", c.last.0),
            });
        }
        let mut lines = vec![format!(
            "chain of {} allocations (trace {})",
            c.allocations, c.trace
        )];
        lines.extend(members);
        lines.push(format!("{}..{}", hex(c.lo), hex(c.hi)));
        lines.push(format!("seq {}..{}", c.first_seq, c.last_seq));
        let style = if c.victim {
            ", style=\"filled,bold\", fillcolor=\"#ffd0d0\", color=red, penwidth=2"
        } else {
            ", style=rounded"
        };
        writeln!(out, "  c{i} [label=\"{}\"{style}];", dot_lines(&lines))?;
        // Invisible edges lay the boxes out in rows of [`COLUMNS`], not one wide row.
        if i >= COLUMNS {
            writeln!(out, "  c{} -> c{i} [style=invis];", i - COLUMNS)?;
        }
    }
    // Findings: the kept ones, their nodes (victims filled red), and a dotted edge from the chain
    // box that holds a victim.
    for (k, f) in d.findings.iter().enumerate() {
        let victim = victim_of(&f.anomaly).map(|v| v.1);
        for (i, (id, b)) in f.nodes.iter().enumerate() {
            if !declared.insert(*id) {
                continue;
            }
            let attrs = match victim {
                Some(what) if i == 0 => format!(", {}", victim_attrs(what)),
                _ => String::new(),
            };
            let code = b
                .as_ref()
                .and_then(|b| super::node_code(d.traces.get(b.trace), b.stack, b.free_stack));
            out.write_all(brief_stmt(*id, b.as_ref(), &attrs, code.as_deref()).as_bytes())?;
            for (ci, c) in d.chains.iter().enumerate() {
                if c.sample.iter().any(|s| s.0 == *id) || c.last.0 == *id {
                    writeln!(out, "  c{ci} -> n{id} [label=\"in chain\", style=dashed];")?;
                }
            }
        }
        out.write_all(note_stmts(k as u64, &f.anomaly).as_bytes())?;
    }
    // What was left out, and what was held at exit.
    let mut left = vec![format!(
        "{} allocations, {} reuse edges: collapsed",
        d.node_count(),
        d.edges.get(&EdgeKind::Reuse).copied().unwrap_or(0)
    )];
    let shown = d.chains.len() as u64;
    if d.chain_count > shown {
        let in_shown: u64 = d.chains.iter().map(|c| c.allocations).sum();
        left.push(format!(
            "and {} more chains ({} allocations)",
            d.chain_count - shown,
            d.chained.saturating_sub(in_shown)
        ));
    }
    left.push(format!(
        "{} allocations never shared memory",
        d.never_reused()
    ));
    let shown_findings = d.findings.len() as u64;
    let all_findings: u64 = d
        .anomalies
        .iter()
        .filter(|(k, _)| **k != "never_freed")
        .map(|(_, v)| v)
        .sum();
    if all_findings > shown_findings {
        left.push(format!(
            "and {} more findings",
            all_findings - shown_findings
        ));
    }
    left.push("every node: isolate graph --format dot --full".to_owned());
    writeln!(
        out,
        "  more [shape=plaintext, label=\"{}\"];",
        dot_lines(&left)
    )?;
    // Below the chains.
    if let Some(last) = d.chains.len().checked_sub(1) {
        writeln!(out, "  c{last} -> more [style=invis];")?;
    }
    let (n, bytes) = d
        .held_at_exit
        .iter()
        .filter(|(k, _)| !ADDRESS_SPACE.contains(k))
        .fold((0u64, 0u64), |a, (_, v)| {
            (a.0 + v.0, a.1.saturating_add(v.1))
        });
    if n > 0 {
        let mut lines = vec![format!(
            "held at exit: {n} allocations, {}",
            human_bytes(bytes)
        )];
        lines.extend(d.largest_held.iter().map(|b| b.short()));
        if n > d.largest_held.len() as u64 {
            lines.push(format!("and {} more", n - d.largest_held.len() as u64));
        }
        writeln!(
            out,
            "  held [label=\"{}\", style=filled, fillcolor=\"#ffdddd\"];",
            dot_lines(&lines)
        )?;
    }
    writeln!(
        out,
        "  label=\"{}\";\n  labelloc=t;\n}}",
        escape_dot(&title(&d.traces))
    )
}

impl<W: Write> GraphSink for AutoDotSink<W> {
    fn node(&mut self, n: &GraphNode) -> std::io::Result<()> {
        if let Some(w) = &mut self.whole {
            w.nodes.push(n.clone());
            self.check();
        }
        self.digest.node(n)
    }
    fn edge(&mut self, e: &Edge) -> std::io::Result<()> {
        if let Some(w) = &mut self.whole {
            w.edges.push(*e);
            self.check();
        }
        self.digest.edge(e)
    }
    fn anomaly(&mut self, a: &Anomaly) -> std::io::Result<()> {
        if let Some(w) = &mut self.whole {
            w.anomalies.push(a.clone());
        }
        self.digest.anomaly(a)
    }
    fn retired(&mut self, id: u64) -> std::io::Result<()> {
        self.digest.retired(id)
    }
    fn finish(&mut self, traces: &[GraphTrace], filter: &Filter) -> std::io::Result<()> {
        self.digest.finish(traces, filter)?;
        let long_chain = self
            .digest
            .chains
            .first()
            .is_some_and(|c| c.allocations > DOT_FULL_CHAIN);
        match self.whole.take().filter(|_| !long_chain) {
            Some(w) => write_whole(&mut self.out, &w, traces)?,
            None => write_collapsed(&mut self.out, &self.digest)?,
        }
        self.out.flush()
    }
}

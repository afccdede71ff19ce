//! `isolate graph` without `--format`: a short text a person reads in a terminal, drawn from the
//! [`Digest`]: the findings with the allocation each one hit (its victim) and what took that
//! memory next, the largest reuse chains ("what reused whose memory"), what was held at exit,
//! and the commands that show more. However large the graph, it stays a screenful: every list
//! is cut to its first few entries and ends with an `and N more` line.

use super::digest::{ADDRESS_SPACE, Brief, Chain, Digest, Hit};
use super::{Anomaly, EdgeKind, GraphTrace};
use crate::finding::Kind;
use crate::util::hex;
use crate::words;
use std::fmt::Write as _;

/// Chains the text shows.
pub const TEXT_CHAINS: usize = 6;
/// Findings of one kind the text shows.
pub const TEXT_FINDINGS: usize = 3;

/// How the text refers to the command and the traces, for its "more" lines.
#[derive(Clone, Debug, Default)]
pub struct TextContext {
    /// How to call `isolate` (`isolate`, or the path it was started by).
    pub command: String,
    /// The trace arguments as given, shell-quoted.
    pub traces: Vec<String>,
}

/// The graph's own anomalies (not findings), shown after the findings, and the name of each.
const GRAPH_ONLY: [(&str, &str); 4] = [
    ("overlap", "overlap"),
    ("true_alias", "true alias"),
    ("stale_value", words::STALE_VALUE),
    ("never_freed", words::HELD_AT_EXIT),
];

/// The order anomalies are shown in and the name of each: the findings in [`Kind::ALL`]'s
/// order (those the graph shows, [`super::anomaly_of`]), then [`GRAPH_ONLY`].
fn kinds() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&str, &str)> = Vec::new();
    for k in Kind::ALL {
        if let Some(a) = super::anomaly_of(k)
            && !v.iter().any(|x| x.0 == a)
        {
            v.push((a, k.word()));
        }
    }
    v.extend(GRAPH_ONLY);
    v
}

fn node_ref(n: &(u64, Option<Brief>)) -> String {
    match &n.1 {
        Some(b) => b.long(),
        None => format!("#{} (no longer known: it ended long before)", n.0),
    }
}

/// `allocated at train.py:39 in main; freed at train.py:40 in main` for a node, from its
/// trace's stacks ([`crate::finding::place`]); `None` without stacks.
fn code_of(d: &Digest, b: &Brief) -> Option<String> {
    super::node_code(d.traces.get(b.trace), b.stack, b.free_stack)
}

fn next_line(f: &Hit) -> Option<String> {
    let v = f.victim()?;
    if f.next.is_empty() {
        // Only worth saying of freed memory.
        return v
            .1
            .as_ref()
            .filter(|b| b.free_seq.is_some() && !b.lost)
            .map(|_| "its memory was not given to another allocation after the free".to_owned());
    }
    let ids: Vec<String> = f.next.iter().map(|i| format!("#{i}")).collect();
    let more = if f.more_next > 0 {
        format!(" and {} more", f.more_next)
    } else {
        String::new()
    };
    Some(format!("its memory went next to {}{more}", ids.join(", ")))
}

/// The heading line of one finding.
fn finding_line(f: &Hit) -> String {
    match &f.anomaly {
        Anomaly::PoisonViolation {
            seq,
            ptr,
            first_offset,
            changed_bytes,
            ..
        } => format!(
            "{} (found at {}): {} written from offset {first_offset} ({}) after the free",
            words::heading(words::STALE_WRITE),
            words::event(*seq),
            words::size(*changed_bytes),
            hex(ptr.saturating_add(*first_offset))
        ),
        Anomaly::StaleLaunch {
            seq, kernel, ptr, ..
        } => format!(
            "{} ({}): kernel {kernel} got {}, a pointer into freed memory",
            words::heading(words::STALE_LAUNCH),
            words::event(*seq),
            hex(*ptr)
        ),
        Anomaly::StaleValue {
            seq, kernel, ptr, ..
        } => format!(
            "{} ({}): kernel {kernel} got {} (freed, unmapped memory; harmless unless a device fault followed)",
            words::STALE_VALUE,
            words::event(*seq),
            hex(*ptr)
        ),
        Anomaly::InvalidFree {
            seq,
            api,
            what,
            ptr,
            double_free,
            ..
        } => format!(
            "{} ({}): {api} ({what}) of {}",
            words::heading(if *double_free {
                words::DOUBLE_FREE
            } else {
                words::INVALID_FREE
            }),
            words::event(*seq),
            hex(*ptr)
        ),
        Anomaly::Overlap { overlap_bytes, .. } => format!(
            "OVERLAP: two live allocations share {}",
            words::size(*overlap_bytes)
        ),
        Anomaly::TrueAlias {
            handle,
            overlap_bytes,
            ..
        } => format!(
            "TRUE ALIAS: two live mappings of handle {} share {}",
            hex(*handle),
            words::size(*overlap_bytes)
        ),
        Anomaly::NeverFreed { .. } => words::HELD_AT_EXIT.to_owned(),
    }
}

/// What a finding's nodes are called.
fn role(a: &Anomaly, i: usize) -> &'static str {
    match a {
        Anomaly::PoisonViolation { .. } | Anomaly::StaleLaunch { .. } => "victim",
        Anomaly::StaleValue { .. } => "freed",
        Anomaly::InvalidFree {
            double_free: true, ..
        } => "freed before",
        Anomaly::InvalidFree { .. } => "last held by",
        _ if i == 0 => "older",
        _ => "newer",
    }
}

fn findings(d: &Digest, o: &mut String) {
    // Nodes described once already: named by id after that.
    let mut described = std::collections::BTreeSet::<u64>::new();
    for (kind, name) in kinds() {
        if kind == "never_freed" {
            continue;
        }
        let n = d.count(kind);
        if n == 0 {
            continue;
        }
        let shown: Vec<&Hit> = d
            .findings
            .iter()
            .filter(|f| f.anomaly.kind() == kind)
            .take(TEXT_FINDINGS)
            .collect();
        for f in &shown {
            let _ = writeln!(o, "{}", finding_line(f));
            let mut again = false;
            for (i, node) in f.nodes.iter().enumerate() {
                let what = if described.insert(node.0) {
                    node_ref(node)
                } else {
                    again |= i == 0;
                    format!("#{} (above)", node.0)
                };
                let _ = writeln!(o, "  {:<12} {what}", format!("{}:", role(&f.anomaly, i)));
                if let Some(code) = node.1.as_ref().and_then(|b| code_of(d, b)) {
                    let _ = writeln!(o, "  {:<12} {code}", "");
                }
            }
            if f.nodes.is_empty() {
                let _ = writeln!(o, "  (no allocation the trace saw held that address)");
            } else if !again
                && matches!(
                    f.anomaly,
                    Anomaly::PoisonViolation { .. } | Anomaly::StaleLaunch { .. }
                )
                && let Some(l) = next_line(f)
            {
                let _ = writeln!(o, "  {:<12} {l}", "");
            }
        }
        if n > shown.len() as u64 {
            let k = n - shown.len() as u64;
            let _ = writeln!(
                o,
                "and {} more {} ({} in all; --format json lists every one)",
                words::count(k),
                words::noun(k, name),
                words::count(n)
            );
        }
    }
}

fn chain_line(c: &Chain) -> String {
    let mut parts: Vec<String> = c
        .sample
        .iter()
        .enumerate()
        .map(|(i, (id, b))| match b {
            Some(b) if i < 2 => format!("#{id} {} {}", b.api, words::size(b.size)),
            _ => format!("#{id}"),
        })
        .collect();
    if c.allocations > c.sample.len() as u64 {
        if c.allocations > c.sample.len() as u64 + 1 {
            parts.push("…".to_owned());
        }
        parts.push(match &c.last.1 {
            Some(b) => format!("#{} {} {}", b.id, b.api, words::size(b.size)),
            None => format!("#{}", c.last.0),
        });
    }
    format!(
        "{}{} at {}..{}, events {}..{}: {}{}",
        if c.victim { "! " } else { "  " },
        words::plural(c.allocations, "allocation"),
        hex(c.lo),
        hex(c.hi),
        c.first_seq,
        c.last_seq,
        parts.join(" → "),
        if c.victim {
            "  (holds a victim above)"
        } else {
            ""
        }
    )
}

fn chains(d: &Digest, o: &mut String) {
    let reuse = d.edges.get(&EdgeKind::Reuse).copied().unwrap_or(0);
    if reuse == 0 {
        let _ = writeln!(
            o,
            "what reused whose memory: nothing (no memory was given to a second allocation)"
        );
        return;
    }
    let _ = writeln!(
        o,
        "what reused whose memory: {} in {} (allocations given the memory of earlier ones, largest first):",
        words::plural(reuse, "reuse edge"),
        words::plural(d.chain_count, "chain")
    );
    let shown = d.chains.iter().take(TEXT_CHAINS);
    let mut in_shown = 0;
    for c in shown {
        in_shown += c.allocations;
        let _ = writeln!(o, "{}", chain_line(c));
    }
    let n = d.chains.len().min(TEXT_CHAINS) as u64;
    if d.chain_count > n {
        let _ = writeln!(
            o,
            "  and {} more {} ({})",
            words::count(d.chain_count - n),
            words::noun(d.chain_count - n, "chain"),
            words::plural(d.chained.saturating_sub(in_shown), "allocation")
        );
    }
    let never = d.never_reused();
    if never > 0 {
        let _ = writeln!(
            o,
            "  {} never shared memory with another",
            words::plural(never, "allocation")
        );
    }
}

fn held(d: &Digest, o: &mut String) {
    let (mut n, mut bytes, mut by, mut space) = (0u64, 0u64, Vec::new(), Vec::new());
    for (k, v) in &d.held_at_exit {
        if ADDRESS_SPACE.contains(k) {
            space.push(words::plural(v.0, k));
        } else {
            n += v.0;
            bytes = bytes.saturating_add(v.1);
            by.push(format!("{} {k}", words::count(v.0)));
        }
    }
    let space = if space.is_empty() {
        String::new()
    } else {
        format!("; address space: {}", space.join(", "))
    };
    if n == 0 {
        let _ = writeln!(o, "{}: nothing{space}", words::HELD_AT_EXIT);
        return;
    }
    let _ = writeln!(
        o,
        "{}: {}, {} ({}){space}",
        words::HELD_AT_EXIT,
        words::plural(n, "allocation"),
        words::size(bytes),
        by.join(", ")
    );
    for b in &d.largest_held {
        let _ = writeln!(o, "  {}", b.short());
    }
    if n > d.largest_held.len() as u64 {
        let k = n - d.largest_held.len() as u64;
        let _ = writeln!(
            o,
            "  and {} more {}",
            words::count(k),
            words::noun(k, "allocation")
        );
    }
}

fn trace_line(t: &GraphTrace) -> String {
    let mut cmd = t.argv.join(" ");
    if cmd.chars().count() > 100 {
        cmd = cmd.chars().take(99).collect::<String>() + "…";
    }
    let mut s = format!(
        "{} (pid {}{}): {cmd}",
        t.file,
        t.pid,
        t.rank.map(|r| format!(", rank {r}")).unwrap_or_default()
    );
    if let Some(at) = t.truncated {
        let _ = write!(s, " — TRUNCATED at byte {at}");
    } else if !t.complete {
        s.push_str(" — incomplete (no End record)");
    }
    s
}

/// The first line: what the graph is of, and its counts.
fn header(d: &Digest, o: &mut String) {
    match d.traces.as_slice() {
        [t] => {
            let _ = writeln!(o, "graph of {}", trace_line(t));
        }
        ts => {
            let _ = writeln!(o, "graph of {}:", words::plural(ts.len() as u64, "trace"));
            for t in ts.iter().take(4) {
                let _ = writeln!(o, "  {}", trace_line(t));
            }
            if ts.len() > 4 {
                let _ = writeln!(
                    o,
                    "  and {} more",
                    words::plural(ts.len() as u64 - 4, "trace")
                );
            }
        }
    }
    if !d.filter.is_empty() {
        let f = &d.filter;
        let mut parts = Vec::new();
        if let Some(a) = f.address {
            parts.push(format!("--address {}", hex(a)));
        }
        if let Some(c) = f.size_class {
            parts.push(format!("--size-class {}", words::size(c)));
        }
        if let Some(t) = f.from_ns {
            parts.push(format!("--from {t}"));
        }
        if let Some(t) = f.to_ns {
            parts.push(format!("--to {t}"));
        }
        let _ = writeln!(o, "filtered: {}", parts.join(" "));
    }
    let cats: Vec<String> = d
        .nodes
        .iter()
        .map(|(k, v)| format!("{} {k}", words::count(*v)))
        .collect();
    let found: Vec<String> = kinds()
        .iter()
        .filter(|(k, _)| *k != "never_freed")
        .filter_map(|(k, name)| {
            let n = d.count(k);
            (n > 0).then(|| words::plural(n, name))
        })
        .collect();
    let _ = writeln!(
        o,
        "{}{}; {}",
        words::plural(d.node_count(), "allocation"),
        if cats.is_empty() {
            String::new()
        } else {
            format!(" ({})", cats.join(", "))
        },
        if found.is_empty() {
            "no findings".to_owned()
        } else {
            found.join(", ")
        }
    );
}

/// The text view of a graph (see the module docs).
pub fn render_text(d: &Digest, ctx: &TextContext) -> String {
    let mut o = String::new();
    header(d, &mut o);
    o.push('\n');
    let any_finding = d.findings.iter().any(|f| f.anomaly.kind() != "never_freed");
    if any_finding {
        findings(d, &mut o);
        o.push('\n');
    }
    chains(d, &mut o);
    held(d, &mut o);
    // Where to look next.
    let traces = ctx.traces.join(" ");
    let cmd = if ctx.command.is_empty() {
        "isolate"
    } else {
        ctx.command.as_str()
    };
    let mut more = Vec::new();
    let victim = d
        .findings
        .iter()
        .filter(|f| {
            matches!(
                f.anomaly,
                Anomaly::PoisonViolation { .. } | Anomaly::StaleLaunch { .. }
            )
        })
        .find_map(|f| f.victim().and_then(|v| v.1.as_ref()));
    if let Some(v) = victim {
        more.push(format!(
            "{cmd} who {} {traces}   (everything that held the victim's address)",
            hex(v.ptr)
        ));
    }
    more.push(format!(
        "{cmd} graph --format dot {traces} | dot -Tsvg -o graph.svg"
    ));
    more.push(format!(
        "{cmd} graph --format json {traces} -o graph.json   (every node, edge and finding)"
    ));
    o.push('\n');
    for (i, m) in more.iter().enumerate() {
        let _ = writeln!(o, "{}{m}", if i == 0 { "more: " } else { "      " });
    }
    o
}

//! `isolate summary` as people read it. Each trace: who the process was and how it ended, then
//! its findings in plain words (what happened and where: events, calls, sizes, offsets), what it
//! still held at exit (told apart from leaks), then the figures. Several traces: an overview
//! first (every finding with its process, one line per process, the totals), then each trace.
//! Every name comes from [`crate::words`].

use super::{
    CategoryStats, DEVICE_MEMORY, DeviceFault, DeviceStats, FaultedCall, FreedInUseEntry,
    HeldAtExit, InvalidFree, LeakEntry, PoisonViolation, StaleLaunchEntry, Summary, Totals,
    TraceSummary,
};
use crate::finding::{self, Fault, Finding, Kind, Tally};
use crate::track::Category;
use crate::util::{hex, human_ns};
use crate::words::{
    self, DEVICE_FAULT, DOUBLE_FREE, HELD_AT_EXIT, HELD_BY_CACHE, HELD_BY_PROGRAM, INVALID_FREE,
    LEAK, STALE_LAUNCH, STALE_WRITE, UNORDERED_FREE, call_result, count, cuda_error, event,
    heading, plural, size,
};
use isolate_trace::Api;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Findings of one kind listed in text (all of them are in the JSON, up to its cap).
const SHOWN: usize = 10;
/// Findings listed in the overview of several traces, all kinds and traces together.
const SHOWN_OVERVIEW: usize = 20;

/// The summary as people read it.
pub fn render_text(s: &Summary) -> String {
    let mut o = String::new();
    if s.traces.len() > 1 {
        overview(&mut o, s);
        o.push('\n');
    }
    for t in &s.traces {
        trace_text(&mut o, t);
        o.push('\n');
    }
    o
}

/// One trace: the process, its findings, what it held at exit, its figures.
fn trace_text(o: &mut String, t: &TraceSummary) {
    let h = &t.header;
    let _ = writeln!(o, "== {} ==", t.file);
    let _ = writeln!(
        o,
        "process  pid {} (parent {}), {}{}",
        h.pid,
        h.ppid,
        if h.exe.is_empty() { "?" } else { &h.exe },
        match h.rank {
            Some(r) => format!(
                ", rank {r}{}",
                h.world_size.map(|w| format!(" of {w}")).unwrap_or_default()
            ),
            None => String::new(),
        }
    );
    if !h.argv.is_empty() {
        let _ = writeln!(o, "command  {}", shell_words(&h.argv));
    }
    let _ = writeln!(o, "ended    {}", ended(t));
    if let Some(at) = t.totals.truncated {
        let _ = writeln!(
            o,
            "TRUNCATED: the file ends inside a record at byte {at}; analysed up to there"
        );
    }
    let f = findings(t);
    let _ = writeln!(
        o,
        "{}",
        findings_headline(&f.tally, None, blind_mode(&h.mode))
    );
    for (i, line) in f.lines.iter().enumerate() {
        let _ = writeln!(o, "  {line}");
        for d in f.details.get(i).into_iter().flatten() {
            let _ = writeln!(o, "    {d}");
        }
    }
    if f.tally.total() > 0
        && let Some(why) = &t.totals.no_stacks
    {
        let _ = writeln!(o, "  ({why})");
    }
    held_text(o, &t.totals.held_at_exit, Some(t));
    sites_text(o, HELD_AT_EXIT, &t.totals.sites_at_end);
    sites_text(o, "device memory at the peak", &t.totals.sites_at_peak);
    for p in stack_problems(&t.totals) {
        let _ = writeln!(o, "symbols  {}", p.escape_debug());
    }
    let _ = writeln!(
        o,
        "mode     {}   host {}   library {}",
        or_dash(&h.mode),
        or_dash(&h.hostname),
        or_dash(&h.library_version)
    );
    // The report's facts line says the same: `4 calls over 33.61 ms`.
    if let Some(span) = t.span_ns {
        let _ = writeln!(
            o,
            "span     {} over {} (from the first call to the end of the trace)",
            human_ns(span),
            plural(t.totals.events, "call")
        );
    }
    totals_text(o, &t.totals, Some(&t.devices));
    regions_text(o, &t.totals, t.first_ts_ns);
}

/// The regions and marks the program named: each region name with how many, their time and
/// the most device memory live inside; the first marks, with their time from `first_ts`.
fn regions_text(o: &mut String, t: &Totals, first_ts: Option<u64>) {
    if t.region_count > 0 {
        let _ = writeln!(
            o,
            "regions  {} ({}), total time and peak device memory inside",
            plural(t.region_count, "region"),
            plural(t.regions.len() as u64, "name")
        );
        for r in t.regions.iter().take(SHOWN) {
            let _ = writeln!(
                o,
                "  {:>8} x {:>10}  peak {:>10}  {}",
                count(r.count),
                human_ns(r.total_ns),
                size(r.peak_live_bytes),
                r.name
            );
        }
        if t.regions.len() > SHOWN {
            let _ = writeln!(
                o,
                "  … and {} more (all in --json)",
                plural((t.regions.len() - SHOWN) as u64, "name")
            );
        }
    }
    if t.mark_count > 0 {
        let _ = writeln!(o, "marks    {}", plural(t.mark_count, "mark"));
        for m in t.marks.iter().take(SHOWN) {
            let at = m.ts_ns.saturating_sub(first_ts.unwrap_or(m.ts_ns));
            let _ = writeln!(o, "  at {:>10}  {}", human_ns(at), m.text);
        }
        if t.mark_count > SHOWN as u64 {
            let _ = writeln!(
                o,
                "  … and {} more (the first {} in --json)",
                count(t.mark_count - SHOWN as u64),
                count(t.marks.len() as u64)
            );
        }
    }
}

/// Several traces: every finding naming its process, one line per process, and the totals.
fn overview(o: &mut String, s: &Summary) {
    let n = s.traces.len();
    let _ = writeln!(o, "== {} ==", plural(n as u64, "trace"));
    let per: Vec<Listing> = s.traces.iter().map(findings).collect();
    let mut all = Tally::default();
    for f in &per {
        all.add(&f.tally);
    }
    let with = per.iter().filter(|f| f.tally.counted() > 0).count();
    let with_others = per
        .iter()
        .filter(|f| f.tally.total() > f.tally.counted())
        .count();
    let blind = s.traces.iter().find_map(|t| blind_mode(&t.header.mode));
    let _ = writeln!(
        o,
        "{}",
        findings_headline(&all, Some((with, with_others, n)), blind)
    );
    let mut shown = 0usize;
    let mut left = 0usize;
    for (t, f) in s.traces.iter().zip(&per) {
        for line in &f.lines {
            if line.starts_with('…') {
                continue;
            }
            if shown < SHOWN_OVERVIEW {
                let _ = writeln!(o, "  pid {} ({}): {line}", t.header.pid, t.file);
                shown += 1;
            } else {
                left += 1;
            }
        }
        left += f.unlisted;
    }
    if left > 0 {
        let _ = writeln!(
            o,
            "  … and {} more (each trace below lists its own; --json has them all)",
            count(left as u64)
        );
    }
    // One line per process.
    let rows: Vec<[String; 6]> = s
        .traces
        .iter()
        .zip(&per)
        .map(|(t, f)| {
            [
                t.header.pid.to_string(),
                short_command(t),
                t.totals.events.to_string(),
                size(t.totals.peak_live_bytes),
                match f.tally.total() {
                    0 => "none".into(),
                    n => count(n),
                },
                t.file.clone(),
            ]
        })
        .collect();
    let head = ["pid", "command", "calls", "peak", "findings", "trace"];
    let mut w = head.map(|h| h.chars().count());
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let row = |o: &mut String, r: [&str; 6]| {
        let mut line = String::from(" ");
        for (i, c) in r.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            line.push(' ');
            if i == 2 {
                // Numbers line up on the right.
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            } else {
                line.push_str(c);
                if i + 1 < r.len() {
                    line.push_str(&" ".repeat(pad));
                }
            }
            line.push(' ');
        }
        let _ = writeln!(o, "{}", line.trim_end());
    };
    let _ = writeln!(o, "processes");
    row(o, head);
    for r in &rows {
        row(o, [&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    let t = &s.totals;
    let _ = writeln!(
        o,
        "total    {}; {}, {}; peak {} of device memory: the sum of per-process peaks (not \
         simultaneous)",
        plural(t.events, "call"),
        plural(t.allocations, "allocation"),
        plural(t.frees, "free"),
        size(t.peak_live_bytes)
    );
    held_text(o, &t.held_at_exit, None);
    if !t.complete {
        let _ = writeln!(o, "incomplete: a trace has no End record");
    }
}

/// `python3 train.py --steps 50`: the command without directories, at most 48 characters.
fn short_command(t: &TraceSummary) -> String {
    let h = &t.header;
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
    let words: Vec<String> = if h.argv.is_empty() {
        vec![if h.exe.is_empty() {
            "?".into()
        } else {
            base(&h.exe)
        }]
    } else {
        h.argv
            .iter()
            .map(|a| {
                if a.starts_with('/') {
                    base(a)
                } else {
                    a.clone()
                }
            })
            .collect()
    };
    let s = shell_words(&words);
    if s.chars().count() > 48 {
        let mut c: String = s.chars().take(47).collect();
        c.push('…');
        c
    } else {
        s
    }
}

/// How the process ended, in words.
fn ended(t: &TraceSummary) -> String {
    match t.end_reason.as_deref() {
        Some(r) => match r.strip_prefix("signal ").and_then(|n| n.parse().ok()) {
            Some(n) => format!("killed by signal {}", words::signal(n)),
            None => r.to_owned(),
        },
        // A trace whose last record is cut in two was cut while being written: the disk
        // filled (or a write was cut short): how the process ended is not known. Whole records
        // and no End: the process did not get to write it (crash, kill, still running), or a
        // full disk stopped the trace right at a record's end, which the trace cannot tell.
        None => match t.totals.truncated {
            Some(at) => format!(
                "not recorded: the trace was cut inside a record at byte {at}, while being \
                 written (a full disk, or a write cut short), so how the process ended is not known"
            ),
            None => "no End record: the process did not exit cleanly (crash, kill, or still \
                     running), or its trace could not be written to the end (a full disk)"
                .into(),
        },
    }
}

/// One trace's findings: their counts ([`Tally`]) and one line each (capped), with the call
/// stacks under each.
#[derive(Default)]
struct Listing {
    tally: Tally,
    lines: Vec<String>,
    /// Lines under `lines[i]` (its call stacks), indented, in a trace's own section only.
    details: Vec<Vec<String>>,
    /// Findings not given a line (past the caps).
    unlisted: usize,
}

impl Listing {
    /// Adds the lines of one list of findings, at most [`SHOWN`], and a last line for the rest
    /// (`total` of them, `what`).
    fn list(&mut self, items: &[Finding], total: u64, what: &str) {
        for it in items.iter().take(SHOWN) {
            let (l, d) = finding_lines(it);
            self.lines.push(l);
            self.details.push(d);
        }
        let listed = items.len().min(SHOWN) as u64;
        if total > listed {
            let more = total - listed;
            self.unlisted += usize::try_from(more).unwrap_or(usize::MAX);
            self.lines
                .push(format!("… and {} more", plural(more, what)));
            self.details.push(Vec::new());
        }
    }
}

/// `a, b or c`.
fn or_list(w: &[&str]) -> String {
    match w.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The headline of the findings: `FINDINGS: 1 stale write, 1 stale launch` when some count
/// (the rule of [`crate::finding`]), `findings: none …` otherwise; findings that do not count
/// (possible leaks) are said after, as not counted.
/// `of`: for several traces, how many processes have findings that count, how many have others,
/// and how many there are. `blind`: the mode of a trace that could not see stale writes and
/// launches (log, off): a headline without findings says so instead of sounding clean.
fn findings_headline(f: &Tally, of: Option<(usize, usize, usize)>, blind: Option<&str>) -> String {
    let words = |counted: bool| -> Vec<&str> {
        Kind::ALL
            .iter()
            .filter(|k| k.counts() == counted)
            .map(|k| k.word())
            .collect()
    };
    if f.total() == 0 {
        if let Some(mode) = blind {
            let seen: Vec<&str> = Kind::ALL
                .iter()
                .filter(|k| {
                    !matches!(
                        k,
                        Kind::StaleWrite | Kind::StaleLaunch | Kind::UnorderedFree
                    )
                })
                .map(|k| k.word())
                .collect();
            return format!(
                "findings: none of those {mode} mode can see (no {}); {}",
                or_list(&seen),
                blind_caveat(mode)
            );
        }
        let all: Vec<&str> = Kind::ALL.iter().map(|k| k.word()).collect();
        return format!("findings: none (no {})", or_list(&all));
    }
    let within = |with: usize, n: usize| format!(", in {with} of {}", plural(n as u64, "process"));
    let mut others = f.kinds(|k| !k.counts());
    if let Some((_, with, n)) = of
        && !others.is_empty()
    {
        others.push_str(&within(with, n));
    }
    if f.counted() == 0 {
        let caveat = blind
            .map(|m| format!("; {}", blind_caveat(m)))
            .unwrap_or_default();
        return format!(
            "findings: none counted as errors (no {}); {others}{caveat}",
            or_list(&words(true))
        );
    }
    let mut s = format!("FINDINGS: {}", f.kinds(Kind::counts));
    if let Some((with, _, n)) = of {
        s.push_str(&within(with, n));
    }
    if !others.is_empty() {
        let _ = write!(s, "; also {others}, not counted as errors");
    }
    s
}

/// The mode when it is one that cannot see stale writes, stale launches or unordered frees
/// (`log`, `off`).
fn blind_mode(mode: &str) -> Option<&str> {
    matches!(mode, "log" | "off").then_some(mode)
}

/// What a mode without poison or quarantine cannot see.
fn blind_caveat(mode: &str) -> String {
    format!(
        "{mode} mode cannot see {} or {} (no poison, no quarantine: a write through a freed \
         pointer goes unnoticed) or {} (launches do not pass through the library); run in \
         isolate mode (ISOLATE_MODE=isolate) to check for them",
        words::plural_of(STALE_WRITE),
        words::plural_of(STALE_LAUNCH),
        words::plural_of(UNORDERED_FREE)
    )
}

/// Where the text lists findings of kind `k`: the list's place among the lists, its name for
/// its `… and N more` line, and how many it has in all (invalid and double frees share a list,
/// in the order they happened).
fn list_of(k: Kind, x: &Totals) -> (u8, &'static str, u64) {
    match k {
        Kind::StaleWrite => (0, STALE_WRITE, x.poison_violation_count),
        Kind::StaleLaunch => (1, STALE_LAUNCH, x.stale_launch_count),
        Kind::UnorderedFree => (2, UNORDERED_FREE, x.freed_in_use_count),
        Kind::DeviceFault => (3, DEVICE_FAULT, x.device_fault_count),
        Kind::InvalidFree | Kind::DoubleFree => (4, "invalid or double free", x.invalid_free_count),
        Kind::Leak => (5, LEAK, x.leak_count),
    }
}

/// One trace's findings, listed.
fn findings(t: &TraceSummary) -> Listing {
    let x = &t.totals;
    let mut f = Listing {
        tally: Tally::of(x),
        ..Listing::default()
    };
    let all = finding::findings(t);
    let mut lists: Vec<(u8, &str, u64)> = Kind::ALL.iter().map(|k| list_of(*k, x)).collect();
    lists.sort_by_key(|l| l.0);
    lists.dedup();
    for (at, what, total) in lists {
        let items: Vec<Finding> = all
            .iter()
            .copied()
            .filter(|f| list_of(f.kind(), x).0 == at)
            .collect();
        f.list(&items, total, what);
    }
    f
}

/// The line of one finding and the lines under it (its call stacks).
fn finding_lines(f: &Finding) -> (String, Vec<String>) {
    match f {
        Finding::StaleWrite(v) => {
            let mut d = stack_lines("allocated at", v.alloc_stack.as_ref());
            d.extend(stack_lines("freed at", v.free_stack.as_ref()));
            (stale_write_line(v), d)
        }
        Finding::StaleLaunch(s) => {
            let mut d = stack_lines("launched at", s.launch_stack.as_ref());
            d.extend(stack_lines("allocated at", s.alloc_stack.as_ref()));
            d.extend(stack_lines("freed at", s.free_stack.as_ref()));
            (stale_launch_line(s), d)
        }
        Finding::UnorderedFree(u) => {
            let mut d = stack_lines("freed at", u.free_stack.as_ref());
            d.extend(stack_lines(
                if u.use_kernel {
                    "launched at"
                } else {
                    "used at"
                },
                u.use_stack.as_ref(),
            ));
            d.extend(stack_lines("allocated at", u.alloc_stack.as_ref()));
            (unordered_free_line(u), d)
        }
        Finding::DeviceFault(Fault::Noted(d)) => (device_fault_line(d), Vec::new()),
        Finding::DeviceFault(Fault::Returned(c)) => (faulted_call_line(c), Vec::new()),
        Finding::InvalidFree(i) | Finding::DoubleFree(i) => {
            let mut d = stack_lines(
                if i.double_free {
                    "freed again at"
                } else {
                    "freed at"
                },
                i.stack.as_ref(),
            );
            d.extend(stack_lines("first freed at", i.first_free_stack.as_ref()));
            d.extend(stack_lines("allocated at", i.alloc_stack.as_ref()));
            (invalid_free_line(i), d)
        }
        Finding::Leak(l) => (
            leak_line(l),
            stack_lines("allocated at", l.alloc_stack.as_ref()),
        ),
    }
}

/// Width of `allocated at`, `first freed at`, … under a finding.
const STACK_LABEL: usize = 14;
/// Frames of a stack shown under a finding.
const STACK_FRAMES_SHOWN: usize = 4;

/// `allocated at  make_buffer (prog.c:14)` and the next frames under it, aligned.
fn stack_lines(label: &str, s: Option<&crate::stacks::ShownStack>) -> Vec<String> {
    let Some(s) = s else { return Vec::new() };
    let pad = " ".repeat(label.chars().count().max(STACK_LABEL));
    let mut out = Vec::new();
    for (i, l) in s.text_lines(STACK_FRAMES_SHOWN).into_iter().enumerate() {
        let l = l.escape_debug().to_string();
        if i == 0 {
            out.push(format!("{label:<STACK_LABEL$}  {l}"));
        } else {
            out.push(format!("{pad}  {l}"));
        }
    }
    out
}

/// What got in the way of symbolising the stacks a trace's text shows, each said once.
fn stack_problems(t: &Totals) -> Vec<String> {
    let mut all: Vec<&crate::stacks::ShownStack> = Vec::new();
    for v in &t.poison_violations {
        all.extend(v.alloc_stack.iter().chain(&v.free_stack));
    }
    for s in &t.stale_launches {
        all.extend(
            s.launch_stack
                .iter()
                .chain(&s.alloc_stack)
                .chain(&s.free_stack),
        );
    }
    for f in &t.freed_in_use {
        all.extend(
            f.free_stack
                .iter()
                .chain(&f.use_stack)
                .chain(&f.alloc_stack),
        );
    }
    for f in &t.invalid_frees {
        all.extend(
            f.stack
                .iter()
                .chain(&f.first_free_stack)
                .chain(&f.alloc_stack),
        );
    }
    all.extend(
        t.possible_leaks
            .iter()
            .filter_map(|l| l.alloc_stack.as_ref()),
    );
    all.extend(t.leaks.iter().filter_map(|l| l.alloc_stack.as_ref()));
    all.extend(
        t.sites_at_end
            .iter()
            .chain(&t.sites_at_peak)
            .map(|s| &s.stack),
    );
    let mut out: Vec<String> = Vec::new();
    for p in all.iter().flat_map(|s| &s.problems) {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

/// `held at exit by allocation site` / `at the peak by allocation site`, one line a site.
fn sites_text(o: &mut String, what: &str, sites: &[crate::summary::SiteEntry]) {
    if sites.is_empty() {
        return;
    }
    let _ = writeln!(o, "{what} by allocation site (largest first):");
    for s in sites {
        let _ = writeln!(
            o,
            "  {:>10}  {:>16}  {}",
            size(s.bytes),
            plural(s.count, "allocation"),
            s.site.escape_debug()
        );
    }
}

/// `the 4.0 MiB allocation at 0x… (cudaMalloc, event 0)`.
fn allocation(bytes: u64, ptr: u64, api: Option<&str>, seq: u64) -> String {
    format!(
        "a {} allocation at {} ({}{})",
        size(bytes),
        hex(ptr),
        api.map(|a| format!("{a}, ")).unwrap_or_default(),
        event(seq)
    )
}

fn stale_write_line(v: &PoisonViolation) -> String {
    format!(
        "{}: {} changed from offset {} of {} after it was freed ({}, {})",
        heading(STALE_WRITE),
        plural(v.changed_bytes, "byte"),
        count(v.first_offset),
        allocation(v.size, v.ptr, v.alloc_api.as_deref(), v.alloc_seq),
        v.free_api,
        event(v.free_seq)
    )
}

/// How far the freeing stream had seen the using stream's work: the missing edge in words.
fn seen(free_s: &str, use_s: &str, tick: u64) -> String {
    if tick == 0 {
        format!("{free_s} had seen none of {use_s}'s work")
    } else {
        format!("{free_s} had seen {use_s}'s work up to its operation {tick}")
    }
}

fn unordered_free_line(u: &FreedInUseEntry) -> String {
    let (free_s, use_s) = (
        words::stream_name(u.free_stream),
        words::stream_name(u.use_stream),
    );
    format!(
        "{}: {} was freed by {} ({}) on {free_s} while {} on {use_s} (queued after {}) may \
         still use it: no event recorded on {use_s} after that use was waited on by {free_s}, \
         and nothing synchronised with it ({}, the use was its operation {}); {}",
        heading(UNORDERED_FREE),
        allocation(
            u.alloc_size,
            u.alloc_ptr,
            u.alloc_api.as_deref(),
            u.alloc_seq
        ),
        u.free_api,
        event(u.free_seq),
        if u.use_kernel {
            format!("kernel {}", u.use_name.escape_debug())
        } else {
            u.use_name.escape_debug().to_string()
        },
        event(u.use_after_seq),
        seen(&free_s, &use_s, u.seen_tick),
        u.use_tick,
        words::UNORDERED_FREE_FIX
    )
}

fn stale_launch_line(s: &StaleLaunchEntry) -> String {
    let mut l = format!(
        "{}: kernel {} ({}, {}) got parameter {} = {}, offset {} into {} after it was freed \
         ({}{})",
        heading(STALE_LAUNCH),
        s.kernel.escape_debug(),
        s.api,
        event(s.seq),
        s.param_index,
        hex(s.ptr),
        count(s.ptr.saturating_sub(s.alloc_ptr)),
        allocation(
            s.alloc_size,
            s.alloc_ptr,
            s.alloc_api.as_deref(),
            s.allocation
        ),
        s.free_api
            .as_deref()
            .map(|a| format!("{a}, "))
            .unwrap_or_default(),
        event(s.freed_at.seq)
    );
    if let Some(code) = s.fault {
        let _ = write!(
            l,
            "; the pointer led into unmapped guard memory and a {DEVICE_FAULT} followed: {}",
            cuda_error(code)
        );
    }
    l
}

fn device_fault_line(f: &DeviceFault) -> String {
    let mut l = match &f.call {
        Some(c) => faulted_call_line(c),
        None => format!(
            "{} at {}: {}: the device faulted ({})",
            heading(DEVICE_FAULT),
            event(f.seq),
            cuda_error(f.code),
            words::device_fault(f.code)
        ),
    };
    if f.suspects > 0 {
        let _ = write!(
            l,
            "; {} since the last clean synchronisation got a pointer into freed memory (the \
             {} above)",
            plural(f.suspects, "launch"),
            words::noun(f.suspects, STALE_LAUNCH)
        );
    }
    l
}

fn faulted_call_line(c: &FaultedCall) -> String {
    let api = Api::from_name(&c.api);
    format!(
        "{}: {} ({}) returned {}: a kernel before it faulted ({})",
        heading(DEVICE_FAULT),
        c.api,
        event(c.seq),
        match api {
            Some(a) => words::cuda_error_for(a, c.code),
            None => cuda_error(c.code),
        },
        words::device_fault(c.code)
    )
}

fn invalid_free_line(f: &InvalidFree) -> String {
    let what = f.what();
    let refused = match f.result {
        0 => String::new(),
        r => format!(
            ", refused with {}",
            match Api::from_name(&f.api) {
                Some(a) => call_result(a, r),
                None => r.to_string(),
            }
        ),
    };
    let call = format!(
        "{} of {what} ({}, tid {}{refused})",
        f.api,
        event(f.seq),
        f.tid
    );
    match (&f.first_free, &f.allocated) {
        (Some(first), Some(a)) => format!(
            "{}: {call}: already freed by {} ({}, tid {}); allocated by {} ({}, tid {})",
            heading(DOUBLE_FREE),
            first.api,
            event(first.seq),
            first.tid,
            a.api,
            event(a.seq),
            a.tid
        ),
        _ => format!(
            "{}: {call}: {}",
            heading(INVALID_FREE),
            match f.kind.as_str() {
                "address_free" => "no reservation starts there",
                "release" => "no such handle is live",
                "unmap" => "nothing is mapped there",
                "unregister" => "nothing registered starts there",
                _ => "nothing live starts there",
            }
        ),
    }
}

fn leak_line(l: &LeakEntry) -> String {
    format!(
        "{}: {} a step kept by {}, in each of {} of {} ({} in all, still held at exit; \
         the first by {}, {})",
        heading(LEAK),
        size(l.bytes_per_step),
        crate::finding::place(l.alloc_stack.as_ref()).unwrap_or_else(|| format!(
            "{} of {}",
            l.api,
            plural(l.size, "byte")
        )),
        plural(l.steps_judged, "step"),
        l.steps,
        size(l.bytes),
        l.api,
        event(l.seq)
    )
}

/// `allocated at train.py:39 in main, model.py:12 in build` (the sites of the first
/// allocations held by the program), or nothing without stacks.
fn held_sites(t: Option<&TraceSummary>) -> String {
    let Some(t) = t else { return String::new() };
    let mut sites: Vec<String> = Vec::new();
    for l in &t.totals.possible_leaks {
        if let Some(p) = crate::finding::place(l.alloc_stack.as_ref())
            && !sites.contains(&p)
        {
            sites.push(p);
        }
    }
    if sites.is_empty() {
        return String::new();
    }
    let more = sites.len() > 3;
    sites.truncate(3);
    format!(
        ", allocated at {}{}",
        sites.join(", "),
        if more { ", …" } else { "" }
    )
}

/// `held at exit: …` and one line for each share of it.
fn held_text(o: &mut String, h: &HeldAtExit, t: Option<&TraceSummary>) {
    if h.count == 0 {
        let _ = writeln!(o, "{HELD_AT_EXIT}: nothing (all device memory was freed)");
    } else {
        let verdict = if h.possible_leak.count > 0 {
            format!(
                "; {} of it held by the program",
                size(h.possible_leak.bytes)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "{HELD_AT_EXIT}: {} ({}) of device memory{verdict}",
            plural(h.count, "allocation"),
            size(h.bytes)
        );
        let share = |n: &crate::summary::CountBytes| {
            format!("{} ({})", plural(n.count, "allocation"), size(n.bytes))
        };
        let segments = crate::summary::CountBytes {
            count: h
                .caching_allocator
                .count
                .saturating_sub(h.expandable_segments.count),
            bytes: h
                .caching_allocator
                .bytes
                .saturating_sub(h.expandable_segments.bytes),
        };
        if segments.count > 0 {
            let _ = writeln!(
                o,
                "  {}: {HELD_BY_CACHE}: PyTorch's segments (cudaMalloc, multiples of 2 MiB)",
                share(&segments)
            );
        }
        if h.expandable_segments.count > 0 {
            let _ = writeln!(
                o,
                "  {}: {HELD_BY_CACHE}: PyTorch's expandable segments (cuMemCreate handles)",
                share(&h.expandable_segments)
            );
        }
        if h.library.count > 0 {
            let _ = writeln!(
                o,
                "  {}: {HELD_AT_EXIT} by CUDA libraries (normal): driver allocations below the \
                 runtime, such as cuBLAS's workspaces",
                share(&h.library)
            );
        }
        if h.framework_workspaces.count > 0 {
            let _ = writeln!(
                o,
                "  {}: {HELD_AT_EXIT} by PyTorch for the whole run (normal): its cuBLAS and \
                 cuBLASLt workspaces",
                share(&h.framework_workspaces)
            );
        }
        if h.process_died.count > 0 {
            let who = match t {
                Some(t) => format!("a process that died ({})", died_how(t)),
                None => "processes that died".into(),
            };
            let _ = writeln!(o, "  {}: held by {who}: not judged", share(&h.process_died));
        }
        if h.possible_leak.count > 0 {
            let _ = writeln!(
                o,
                "  {}: {HELD_BY_PROGRAM}{}",
                share(&h.possible_leak),
                held_sites(t)
            );
        }
    }
    if h.address_space.count > 0 {
        let _ = writeln!(
            o,
            "  and {} of address space still reserved ({}, cuMemAddressReserve): address space, \
             not memory",
            size(h.address_space.bytes),
            plural(h.address_space.count, "range")
        );
    }
}

fn died_how(t: &TraceSummary) -> String {
    match t.signal {
        Some(n) => format!("killed by signal {}", words::signal(n)),
        None => "no End record".into(),
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// Quotes argv for display (so the line can be pasted back into a shell).
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `6 device, 17 VMM handles`: what a device-memory figure is made of, when it is made of more
/// than one category.
fn device_memory_parts(t: &Totals, figure: impl Fn(&CategoryStats) -> u64) -> Option<String> {
    let parts: Vec<String> = DEVICE_MEMORY
        .iter()
        .filter_map(|c| {
            let n = figure(t.categories.get(c.name())?);
            let what = match c {
                Category::Handle => words::plural(n, "VMM handle"),
                c => format!("{} {}", count(n), c.name()),
            };
            (n > 0).then_some(what)
        })
        .collect();
    (parts.len() > 1).then(|| parts.join(", "))
}

/// `3 failed: 2 (cudaErrorMemoryAllocation) ×2, 1 (cudaErrorInvalidValue)`.
fn failed_codes(api: &str, codes: Option<&BTreeMap<String, u64>>) -> String {
    let Some(codes) = codes else {
        return String::new();
    };
    let mut v: Vec<(Option<i64>, &String, u64)> = codes
        .iter()
        .map(|(k, n)| (k.parse::<i64>().ok(), k, *n))
        .collect();
    v.sort_by_key(|(c, _, _)| (c.is_none(), *c));
    let a = Api::from_name(api);
    let parts: Vec<String> = v
        .iter()
        .map(|(c, k, n)| {
            let name = match (c, a) {
                (Some(c), Some(a)) => i32::try_from(*c)
                    .map(|c| call_result(a, c))
                    .unwrap_or_else(|_| k.to_string()),
                _ => format!("{k} codes"),
            };
            if *n > 1 {
                format!("{name} ×{}", count(*n))
            } else {
                name
            }
        })
        .collect();
    format!(": {}", parts.join(", "))
}

fn totals_text(o: &mut String, t: &Totals, devices: Option<&BTreeMap<String, DeviceStats>>) {
    let sum = |m: &BTreeMap<String, u64>| m.values().fold(0u64, |a, &b| a.saturating_add(b));
    let (calls, failed) = (sum(&t.calls), sum(&t.failed));
    let _ = writeln!(o, "calls    {} ({} failed)", count(calls), count(failed));
    for (api, n) in &t.calls {
        let f = t.failed.get(api).copied().unwrap_or(0);
        if f > 0 {
            let _ = writeln!(
                o,
                "  {api:<30} {n:>10}  {} failed{}",
                count(f),
                failed_codes(api, t.failed_results.get(api))
            );
        } else {
            let _ = writeln!(o, "  {api:<30} {n:>10}");
        }
    }
    let _ = writeln!(
        o,
        "memory   {}{}, {}; peak {} of device memory",
        plural(t.allocations, "allocation"),
        device_memory_parts(t, |c| c.started).map_or(String::new(), |p| format!(" ({p})")),
        plural(t.frees, "free"),
        size(t.peak_live_bytes)
    );
    if let Some(devs) = devices
        && (devs.len() > 1 || devs.keys().any(|k| k != "0"))
    {
        for (d, s) in devs {
            let _ = writeln!(
                o,
                "  device {d:<3} {}, peak {}, {} ({}) {HELD_AT_EXIT}",
                plural(s.allocations, "allocation"),
                size(s.peak_live_bytes),
                count(s.live_at_end.count),
                size(s.live_at_end.bytes)
            );
        }
    }
    let g = t.categories.get("graph");
    if let Some(g) = g.filter(|g| g.started > 0) {
        let _ = writeln!(
            o,
            "graph    {}, peak {}, {} {HELD_AT_EXIT}",
            plural(g.started, "graph memory node"),
            size(g.peak_live_bytes),
            count(g.live_at_end.count)
        );
    }
    if t.host.allocations > 0 || t.host.registered_at_end.count > 0 {
        let _ = writeln!(
            o,
            "host     {}, peak {}, {} ({}) {HELD_AT_EXIT}; {} left",
            plural(t.host.allocations, "pinned allocation"),
            size(t.host.peak_live_bytes),
            count(t.host.live_at_end.count),
            size(t.host.live_at_end.bytes),
            plural(t.host.registered_at_end.count, "registration")
        );
    }
    if let Some(r) = t.categories.get("reservation").filter(|r| r.started > 0) {
        let h = &t.categories["handle"];
        let m = &t.categories["mapping"];
        let _ = writeln!(
            o,
            "vmm      {}, {} created ({} released), {}",
            plural(r.started, "reservation"),
            plural(h.started, "handle"),
            count(h.ended),
            plural(m.started, "mapping")
        );
    }
    let sq = &t.sequence;
    if sq.gaps > 0 || sq.late > 0 {
        let _ = writeln!(
            o,
            "order    {} never recorded (calls in flight when the process ended), {} too far \
             out of order to put back{}",
            plural(sq.gaps, "sequence number"),
            plural(sq.late, "record"),
            if sq.late > 0 {
                ": findings about them may be off"
            } else {
                ""
            }
        );
    }
    if t.notes.contains_key("late_load") {
        let _ = writeln!(
            o,
            "late     loaded after CUDA was in use (dlopen, not LD_PRELOAD): memory allocated \
             before is not in the trace; {} of such memory, not counted as invalid",
            plural(t.frees_of_earlier_allocations, "free")
        );
    } else if t.frees_of_earlier_allocations > 0 {
        let _ = writeln!(
            o,
            "unseen   {} the driver accepted of memory the trace never saw allocated (an \
             entry point isolate does not record); not counted as invalid",
            plural(t.frees_of_earlier_allocations, "free")
        );
    }
    if t.lost > 0 {
        let _ = writeln!(
            o,
            "lost     {} whose free the trace never showed",
            plural(t.lost, "allocation")
        );
    }
    let q = &t.quarantine;
    if q.peak_bytes > 0 || q.releases > 0 {
        let _ = writeln!(
            o,
            "quarantine peak {}, {} ({} early)",
            size(q.peak_bytes),
            plural(q.releases, "release"),
            count(q.early_releases)
        );
    }
    // The library's notes on its own time: information under a heading of its own, never
    // lines that read as problems of the program.
    if !t.library_cost.is_empty() || t.device_work.any() {
        let _ = writeln!(
            o,
            "the library's own time (information, not a problem of the program):"
        );
        for c in &t.library_cost {
            let _ = writeln!(o, "  {c}");
        }
        device_work(o, &t.device_work);
    }
    if t.stale_value_count > 0 {
        // Suspects (docs/analyzer.md, "Suspects"): listed apart, never counted.
        let _ = writeln!(
            o,
            "suspects: {} (stale values: a kernel parameter word pointing into freed memory \
             without evidence the kernel was handed it: a word inside a struct passed by value \
             that is not the allocation's start, a packed buffer with no parameter layout, or \
             freed guard memory no fault followed; not {})",
            plural(t.stale_value_count, "kernel launch"),
            if t.stale_value_count == 1 {
                "an error"
            } else {
                "errors"
            }
        );
        for v in t.stale_values.iter().take(3) {
            let _ = writeln!(
                o,
                "  suspect: kernel {} got {:#x} (parameter {}, byte {}), inside allocation {:#x} \
                 ({} bytes)",
                v.kernel, v.ptr, v.param_index, v.param_offset, v.alloc_ptr, v.alloc_size
            );
        }
    }
    if !t.complete {
        let _ = writeln!(o, "incomplete: no End record");
    }
}

/// The `floor:` lines (under the library's own time): what isolation asked of the device and
/// the least time it takes.
fn device_work(o: &mut String, d: &super::DeviceWork) {
    if !d.any() {
        return;
    }
    let tb = d.bandwidth as f64 / 1e12;
    let _ = writeln!(
        o,
        "  floor: {} freed into quarantine ({}); the poisons wrote {}, the checks read {}: \
         at least {} of device time at {tb:.1} TB/s (full coverage: {})",
        size(d.freed_bytes),
        plural(d.frees, "free"),
        size(d.written_bytes),
        size(d.read_bytes),
        human_ns(d.floor_ns),
        human_ns(d.full_floor_ns)
    );
    if d.steps > 0 {
        let _ = writeln!(
            o,
            "  floor: a step ({} of {}): {} freed, {} written, {} read: at least {} (full \
             coverage: {})",
            count(d.steps),
            d.steps_from.as_deref().unwrap_or("steps"),
            size(d.freed_bytes / d.steps),
            size(d.written_bytes / d.steps),
            size(d.read_bytes / d.steps),
            human_ns(d.floor_ns_per_step),
            human_ns(d.full_floor_ns_per_step)
        );
    } else if d.run_ns > 0 {
        let secs = d.run_ns as f64 / 1e9;
        let _ = writeln!(
            o,
            "  floor: no steps found: a second of the run ({secs:.2} s) freed {}, at least {} \
             of device time a second",
            size((d.freed_bytes as f64 / secs) as u64),
            human_ns((d.floor_ns as f64 / secs) as u64)
        );
    }
}

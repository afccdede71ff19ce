//! The top of each trace's section, in plain words: how the run ended (a badge when it crashed,
//! the device faulted or the file is cut short), what was found (one entry per freed
//! allocation that was used, per invalid or double free, per true alias, per device fault, per
//! possible leak), and what else is worth knowing (what was held at exit and why, failed calls,
//! log mode). Also the graph's anomalies as sentences.
//!
//! Every sentence is made here, with the names of [`crate::words`] (the summary's), so that
//! the page only shows text and a thing is called the same in the report and the summary.

use super::timeline::{Seen, Timeline};
use crate::finding::{self, Finding, Kind};
use crate::graph::Anomaly;
use crate::summary::{FreedInUseEntry, InvalidFree, LeakEntry, StaleLaunchEntry, TraceSummary};
use crate::util::{hex, human_ns};
use crate::words::{
    self, DEVICE_FAULT, DOUBLE_FREE, INVALID_FREE, LEAK, STALE_LAUNCH, STALE_WRITE, call_result,
    cuda_error, event, plural, size,
};
use isolate_trace::Api;
use serde::Serialize;
use std::collections::BTreeMap;

/// Findings listed at the top (the tables below list more).
const LISTED: usize = 12;
/// Launches named in one stale-pointer finding.
const LAUNCHES: usize = 3;
/// Possible leaks named one by one.
const LEAKS_NAMED: usize = 5;

/// A badge above the findings.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Badge {
    /// `crash`, `fault`, `truncated`.
    pub kind: &'static str,
    pub text: String,
}

/// One entry of the findings at the top of the page, in words: a [`Finding`] (several, for
/// the stale writes and launches of one freed allocation, and for the possible leaks) or a
/// true alias of the graph.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Entry {
    /// A [`Kind::key`] (`stale_write`, `stale_launch`, `double_free`, `invalid_free`,
    /// `device_fault`, `possible_leak`), or `true_alias`.
    pub kind: &'static str,
    pub title: String,
    /// Where in the code its calls were, first thing under the title: `allocated at
    /// train.py:39 in main`, `freed at …`, `launched at …` ([`Finding::places`], the
    /// [`finding::place`] rule); empty without stacks.
    pub places: Vec<String>,
    pub text: String,
    /// Where the timeline shows it (from the trace's first event).
    pub t_ns: Option<u64>,
}

/// What the top of a trace's section says.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Verdict {
    pub badges: Vec<Badge>,
    pub findings: Vec<Entry>,
    /// What was found but not listed, or null.
    pub more: Option<String>,
    /// The all-clear, when nothing was found.
    pub clean: Option<String>,
    pub notes: Vec<String>,
}

/// One anomaly of the graph, in words.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct AnomalyRow {
    pub what: String,
    pub detail: String,
}

/// `stale write` → `Stale write`.
fn capital(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// `at 6.10 ms`: a moment of the run, from its first event.
fn at(rel_ns: u64) -> String {
    format!("at {}", human_ns(rel_ns))
}

/// What `api` returned, named as that API names it (`700 (cudaErrorIllegalAddress)`).
fn returned(api: &str, code: i64) -> String {
    match (Api::from_name(api), i32::try_from(code)) {
        (Some(a), Ok(c)) => call_result(a, c),
        _ => u64::try_from(code).map_or(code.to_string(), cuda_error),
    }
}

/// A freed allocation that was used: its stale writes and the launches that got a pointer into it.
struct Victim<'a> {
    ptr: u64,
    size: u64,
    alloc_seq: u64,
    alloc_api: Option<&'a str>,
    free_seq: u64,
    freed_ns: u64,
    free_api: Option<&'a str>,
    /// `(changed bytes, first offset, found at)`.
    writes: Vec<(u64, u64, u64)>,
    launches: Vec<&'a StaleLaunchEntry>,
    /// Where in the code its calls were ([`Finding::places`]), each once.
    places: Vec<String>,
}

fn add_places(to: &mut Vec<String>, f: &Finding) {
    for p in f.places() {
        if !to.contains(&p) {
            to.push(p);
        }
    }
}

pub(super) fn verdict(
    s: &TraceSummary,
    tl: &Timeline,
    seen: &Seen,
    anomalies: &[Anomaly],
) -> Verdict {
    let t = &s.totals;
    let rel = |ts: u64| ts.saturating_sub(tl.start_ns);
    let mut badges = Vec::new();

    // How it ended.
    let fault = seen.first_fault.or_else(|| {
        t.device_faults.first().map(|f| {
            (
                rel(f.ts_ns),
                i64::try_from(f.code).unwrap_or(i64::MAX),
                None,
                Some(f.seq),
            )
        })
    });
    let after = fault.map_or(String::new(), |(_, code, api, _)| {
        format!(
            " after CUDA error {}{}",
            u64::try_from(code).map_or(code.to_string(), cuda_error),
            api.map(|a| format!(" from {a}")).unwrap_or_default()
        )
    });
    if let Some(sig) = s.signal {
        badges.push(Badge {
            kind: "crash",
            text: format!("crashed: signal {}{after}", words::signal(sig)),
        });
    } else if s.end_reason.is_none() {
        badges.push(Badge {
            kind: "crash",
            text: format!(
                "ended without its last record: killed, crashed too hard to write it, or still \
                 running{after}"
            ),
        });
    } else if let Some((t_ns, code, api, _)) = fault {
        badges.push(Badge {
            kind: "fault",
            text: format!(
                "{DEVICE_FAULT}: CUDA error {}{} {}",
                u64::try_from(code).map_or(code.to_string(), cuda_error),
                api.map(|a| format!(" from {a}")).unwrap_or_default(),
                at(t_ns)
            ),
        });
    }
    if let Some(b) = t.truncated {
        badges.push(Badge {
            kind: "truncated",
            text: format!(
                "the file is cut short at byte {}: read up to there",
                words::count(b)
            ),
        });
    }

    // Every finding of the model, once: stale writes and stale launches gathered by the freed
    // allocation they used, invalid and double frees and possible leaks in order. A device
    // fault is said once, below, from the first the run saw.
    let mut victims: BTreeMap<u64, Victim> = BTreeMap::new();
    let mut frees: Vec<(&InvalidFree, Vec<String>)> = Vec::new();
    let mut leaks: Vec<&LeakEntry> = Vec::new();
    let mut unordered: Vec<(&FreedInUseEntry, Vec<String>)> = Vec::new();
    for f in finding::findings(s) {
        match f {
            Finding::StaleWrite(v) => {
                let e = victims.entry(v.alloc_seq).or_insert_with(|| Victim {
                    ptr: v.ptr,
                    size: v.size,
                    alloc_seq: v.alloc_seq,
                    alloc_api: None,
                    free_seq: v.free_seq,
                    freed_ns: v.freed_at_ns,
                    free_api: None,
                    writes: Vec::new(),
                    launches: Vec::new(),
                    places: Vec::new(),
                });
                add_places(&mut e.places, &f);
                e.free_api = Some(&v.free_api);
                e.alloc_api = e.alloc_api.or(v.alloc_api.as_deref());
                e.writes.push((v.changed_bytes, v.first_offset, v.ts_ns));
            }
            Finding::StaleLaunch(l) => {
                let e = victims.entry(l.allocation).or_insert_with(|| Victim {
                    ptr: l.alloc_ptr,
                    size: l.alloc_size,
                    alloc_seq: l.allocation,
                    alloc_api: None,
                    free_seq: l.freed_at.seq,
                    freed_ns: l.freed_at.ts_ns,
                    free_api: None,
                    writes: Vec::new(),
                    launches: Vec::new(),
                    places: Vec::new(),
                });
                add_places(&mut e.places, &f);
                e.alloc_api = e.alloc_api.or(l.alloc_api.as_deref());
                e.free_api = e.free_api.or(l.free_api.as_deref());
                e.launches.push(l);
            }
            Finding::UnorderedFree(u) => unordered.push((u, f.places())),
            Finding::DeviceFault(_) => {}
            Finding::InvalidFree(i) | Finding::DoubleFree(i) => frees.push((i, f.places())),
            Finding::Leak(l) => leaks.push(l),
        }
    }
    let mut victims: Vec<Victim> = victims.into_values().collect();
    victims.sort_by_key(|v| v.freed_ns);
    let mut findings = Vec::new();
    for v in &victims {
        let faulted = v.launches.iter().find_map(|l| l.fault);
        let (kind, title) = if !v.writes.is_empty() {
            (
                Kind::StaleWrite.key(),
                format!(
                    "{}: memory was written after it was freed",
                    capital(STALE_WRITE)
                ),
            )
        } else if faulted.is_some() {
            (
                Kind::StaleLaunch.key(),
                format!(
                    "{} and {DEVICE_FAULT}: a kernel used freed memory",
                    capital(STALE_LAUNCH)
                ),
            )
        } else {
            (
                Kind::StaleLaunch.key(),
                format!(
                    "{}: a kernel got a pointer into freed memory",
                    capital(STALE_LAUNCH)
                ),
            )
        };
        let mut text = format!(
            "The {} allocation at {} ({}{}) was freed by {} ({}) {}.",
            size(v.size),
            hex(v.ptr),
            v.alloc_api.map(|a| format!("{a}, ")).unwrap_or_default(),
            event(v.alloc_seq),
            v.free_api.unwrap_or("a free"),
            event(v.free_seq),
            at(rel(v.freed_ns))
        );
        for l in v.launches.iter().take(LAUNCHES) {
            text.push_str(&format!(
                " Kernel {} was launched with a pointer into it {} ({}, parameter {} = {}, {} \
                 after the free).",
                l.kernel,
                at(rel(l.ts_ns)),
                event(l.seq),
                l.param_index,
                hex(l.ptr),
                human_ns(l.ts_ns.saturating_sub(v.freed_ns))
            ));
        }
        if v.launches.len() > LAUNCHES {
            text.push_str(&format!(
                " And {} like it.",
                plural((v.launches.len() - LAUNCHES) as u64, "more launch")
            ));
        }
        if let Some(code) = faulted {
            text.push_str(&format!(
                " The device then faulted: CUDA error {}.",
                cuda_error(code)
            ));
        }
        if let Some(&(_, offset, found)) = v.writes.first() {
            let changed: u64 = v.writes.iter().fold(0u64, |a, w| a.saturating_add(w.0));
            text.push_str(&format!(
                " {} of it changed after the free, from offset {}; isolate mode kept the write \
                 in the freed block, away from other allocations (found when the block was \
                 checked, {} after the free).",
                plural(changed, "byte"),
                words::count(offset),
                human_ns(found.saturating_sub(v.freed_ns))
            ));
        }
        findings.push(Entry {
            kind,
            title,
            places: v.places.clone(),
            text,
            t_ns: Some(rel(v.freed_ns)),
        });
    }

    // Frees while a use on another stream was not ordered before them.
    for (u, places) in &unordered {
        let stream = words::stream_name;
        let (free_s, use_s) = (stream(u.free_stream), stream(u.use_stream));
        let what = if u.use_kernel {
            format!("kernel {}", u.use_name)
        } else {
            u.use_name.clone()
        };
        let text = format!(
            "The {} allocation at {} ({}{}) was freed by {} ({}) on {free_s} {} while {what} on \
             {use_s} (queued after {}) may still use it: no event recorded on {use_s} after that \
             use was waited on by {free_s}, and nothing synchronised with it. Whatever the timing \
             did in this run, CUDA lets the use run after the free and the memory go to the next \
             allocation. Fix: {}.",
            size(u.alloc_size),
            hex(u.alloc_ptr),
            u.alloc_api
                .as_deref()
                .map(|a| format!("{a}, "))
                .unwrap_or_default(),
            event(u.alloc_seq),
            u.free_api,
            event(u.free_seq),
            at(rel(u.ts_ns)),
            event(u.use_after_seq),
            words::UNORDERED_FREE_FIX
        );
        findings.push(Entry {
            kind: Kind::UnorderedFree.key(),
            title: format!(
                "{}: freed while still in use on another stream",
                capital(words::UNORDERED_FREE)
            ),
            places: places.clone(),
            text,
            t_ns: Some(rel(u.ts_ns)),
        });
    }

    // A device fault no stale launch explains.
    if let Some((t_ns, code, api, seq)) = fault
        && !victims
            .iter()
            .any(|v| v.launches.iter().any(|l| l.fault.is_some()))
    {
        let code_u = u64::try_from(code).unwrap_or(u64::MAX);
        let what = match (api, seq) {
            (Some(a), Some(q)) => format!(
                "{a} ({}) returned {} {}",
                event(q),
                returned(a, code),
                at(t_ns)
            ),
            _ => format!("CUDA error {} {}", cuda_error(code_u), at(t_ns)),
        };
        findings.push(Entry {
            kind: Kind::DeviceFault.key(),
            title: format!("{}: a kernel faulted", capital(DEVICE_FAULT)),
            places: Vec::new(),
            text: format!(
                "{what}: a kernel launched before it faulted ({}).",
                words::device_fault(code_u)
            ),
            t_ns: Some(t_ns),
        });
    }

    // Invalid and double frees.
    for (f, places) in frees {
        let what = f.what();
        let refused = match f.result {
            0 => String::new(),
            r => format!(
                "; the driver refused it with {}",
                returned(&f.api, i64::from(r))
            ),
        };
        let (kind, title, text) = match (&f.first_free, &f.allocated) {
            (Some(first), Some(a)) => (
                Kind::DoubleFree.key(),
                format!("{}: memory given back twice", capital(DOUBLE_FREE)),
                format!(
                    "{} of {what} ({}) {} gave back what {} ({}) had already given back {} (it \
                     was allocated by {}, {}){refused}.",
                    f.api,
                    event(f.seq),
                    at(rel(f.ts_ns)),
                    first.api,
                    event(first.seq),
                    at(rel(first.ts_ns)),
                    a.api,
                    event(a.seq)
                ),
            ),
            _ => (
                Kind::InvalidFree.key(),
                format!("{}: memory that was not allocated", capital(INVALID_FREE)),
                format!(
                    "{} of {what} ({}) {}: nothing allocated starts there{refused}.",
                    f.api,
                    event(f.seq),
                    at(rel(f.ts_ns))
                ),
            ),
        };
        findings.push(Entry {
            kind,
            title,
            places,
            text,
            t_ns: Some(rel(f.ts_ns)),
        });
    }

    // True aliases.
    for a in anomalies {
        if let Anomaly::TrueAlias {
            nodes,
            handle,
            overlap_bytes,
        } = a
        {
            findings.push(Entry {
                kind: "true_alias",
                title: "Two addresses for one memory".into(),
                places: Vec::new(),
                text: format!(
                    "Mappings #{} and #{} of the physical memory {} are live at once over the same \
                     {}: a write through one changes what the other reads.",
                    nodes[0],
                    nodes[1],
                    hex(*handle),
                    size(*overlap_bytes)
                ),
                t_ns: None,
            });
        }
    }

    // Leaks: memory growing step by step.
    for l in leaks.iter().take(LEAKS_NAMED) {
        let places = Finding::Leak(l).places();
        findings.push(Entry {
            kind: Kind::Leak.key(),
            title: format!(
                "{}: {} more device memory kept at every step",
                capital(LEAK),
                size(l.bytes_per_step)
            ),
            text: format!(
                "In each of {} of {} ({} in all) an allocation made in the step was still held \
                 at exit: {} ({}) in all, the first by {} ({}) {}.",
                plural(l.steps_judged, "step"),
                l.steps,
                plural(l.step_count, "step"),
                plural(l.count, "allocation"),
                size(l.bytes),
                l.api,
                event(l.seq),
                at(rel(l.ts_ns)),
            ),
            places,
            t_ns: Some(rel(l.ts_ns)),
        });
    }

    // What is not listed.
    let mut unlisted = Vec::new();
    let cut = findings.len().saturating_sub(LISTED) as u64;
    findings.truncate(LISTED);
    if cut > 0 {
        unlisted.push(format!(
            "{} more {} like these",
            words::count(cut),
            words::noun(cut, "finding")
        ));
    }
    for (n, listed, what) in [
        (
            t.poison_violation_count,
            t.poison_violations.len(),
            STALE_WRITE,
        ),
        (t.stale_launch_count, t.stale_launches.len(), STALE_LAUNCH),
        (t.invalid_free_count, t.invalid_frees.len(), INVALID_FREE),
    ] {
        let more = n.saturating_sub(listed as u64);
        if more > 0 {
            unlisted.push(plural(more, &format!("more {what}")));
        }
    }
    let more = (!unlisted.is_empty()).then(|| format!("And {}.", unlisted.join(", ")));
    let clean = findings.is_empty().then(|| {
        let p: Vec<String> = Kind::ALL
            .iter()
            .map(|k| words::plural_of(k.word()))
            .collect();
        let (last, rest) = p.split_last().expect("kinds");
        format!("No {} or {last} found.", rest.join(", "))
    });

    // Worth knowing.
    let mut notes = Vec::new();
    if s.header.mode == "log" {
        notes.push(format!(
            "Recorded in log mode: freed memory is handed straight back to the program and not \
             checked (no poison, no quarantine), so a {STALE_WRITE} or {STALE_LAUNCH} cannot be \
             seen. Run with --mode isolate to look for them."
        ));
    }
    let h = &t.held_at_exit;
    if h.count > 0 {
        let mut parts = Vec::new();
        for (cb, what) in [
            (&h.caching_allocator, "by a caching allocator (normal)"),
            (&h.library, "by CUDA libraries (normal)"),
            (&h.process_died, "by a process that died: not judged"),
            (
                &h.possible_leak,
                "by the program (its model, its state: information)",
            ),
        ] {
            if cb.count > 0 {
                parts.push(format!(
                    "{} ({}) {what}",
                    words::count(cb.count),
                    size(cb.bytes)
                ));
            }
        }
        let whole = [
            &h.caching_allocator,
            &h.library,
            &h.process_died,
            &h.possible_leak,
        ]
        .iter()
        .any(|c| c.count == h.count && c.bytes == h.bytes);
        notes.push(format!(
            "{} ({}) of device memory {}{}.",
            plural(h.count, "allocation"),
            size(h.bytes),
            words::HELD_AT_EXIT,
            match (parts.len(), whole) {
                (0, _) => String::new(),
                // All of it for one reason: say the reason, not the figures again.
                (1, true) => format!(
                    ", {}",
                    parts[0].split_once(") ").map_or(parts[0].as_str(), |p| p.1)
                ),
                _ => format!(": {}", parts.join("; ")),
            }
        ));
    }
    let failed: u64 = t.failed.values().fold(0, |a, &b| a.saturating_add(b));
    if failed > 0 {
        let mut kinds: Vec<(u64, &str, &str)> = t
            .failed_results
            .iter()
            .flat_map(|(api, codes)| {
                codes
                    .iter()
                    .map(move |(c, n)| (*n, api.as_str(), c.as_str()))
            })
            .collect();
        kinds.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        let named: Vec<String> = kinds
            .iter()
            .take(4)
            .map(|&(n, api, code)| {
                let r = match code.parse::<i64>() {
                    Ok(c) => format!("CUDA error {}", returned(api, c)),
                    Err(_) => "other errors".to_string(),
                };
                format!(
                    "{api} returned {r} {}",
                    match n {
                        1 => "once".to_string(),
                        2 => "twice".to_string(),
                        n => format!("{} times", words::count(n)),
                    }
                )
            })
            .collect();
        let rest = failed.saturating_sub(kinds.iter().take(4).map(|k| k.0).sum::<u64>());
        notes.push(format!(
            "{} failed{}{}.",
            plural(failed, "call"),
            if named.is_empty() {
                String::new()
            } else {
                format!(": {}", named.join("; "))
            },
            if rest > 0 && !named.is_empty() {
                format!("; {} more", words::count(rest))
            } else {
                String::new()
            }
        ));
    }
    if t.quarantine.oom_retries > 0 {
        notes.push(format!(
            "{} ran out of memory and succeeded after isolate mode released freed memory it was \
             holding back.",
            plural(t.quarantine.oom_retries, "allocation")
        ));
    }
    if t.quarantine.launch_oom_retries > 0 {
        notes.push(format!(
            "{} (kernel launches, or queries that load a kernel before its first launch) ran out \
             of memory (the driver needed room of its own: a kernel's module loaded on first \
             use, local memory) and ran again after isolate mode gave back the memory it was \
             holding.",
            plural(t.quarantine.launch_oom_retries, "call")
        ));
    }
    if t.stale_value_count > 0 {
        notes.push(format!(
            "Suspects, not errors: {} had a parameter word whose value falls inside freed \
             memory, without evidence the kernel was handed that memory (a word inside a struct \
             passed by value, a packed buffer with no parameter layout, or freed guard memory no \
             fault followed). `isolate summary` lists them.",
            plural(t.stale_value_count, "kernel launch")
        ));
    }
    if t.notes.contains_key("late_load") {
        notes.push(format!(
            "The library was loaded after CUDA was already in use: memory allocated before is \
             not in the trace ({} of it).",
            plural(t.frees_of_earlier_allocations, "free")
        ));
    }
    let sq = &t.sequence;
    if sq.gaps > 0 {
        notes.push(format!(
            "{} {} never recorded: threads were inside a call when the process ended.",
            plural(sq.gaps, "event"),
            if sq.gaps == 1 { "was" } else { "were" }
        ));
    }
    if sq.late > 0 {
        notes.push(format!(
            "{} arrived too far out of order to be put back: what is said about them may be off.",
            plural(sq.late, "record")
        ));
    }
    Verdict {
        badges,
        findings,
        more,
        clean,
        notes,
    }
}

/// The graph's anomalies (never-freed ones aside: the page lists what is held at exit) as
/// sentences.
pub(super) fn anomaly_rows(anomalies: &[Anomaly], tl: &Timeline) -> Vec<AnomalyRow> {
    let node = |n: &Option<u64>| match n {
        Some(n) => format!("allocation #{n}"),
        None => "memory the trace never saw allocated".into(),
    };
    anomalies
        .iter()
        .filter_map(|a| {
            Some(match a {
                Anomaly::Overlap {
                    nodes,
                    overlap_bytes,
                } => AnomalyRow {
                    what: "overlap".into(),
                    detail: format!(
                        "allocations #{} and #{} overlap by {} while both are live",
                        nodes[0],
                        nodes[1],
                        size(*overlap_bytes)
                    ),
                },
                Anomaly::InvalidFree {
                    what,
                    seq,
                    ts_ns,
                    api,
                    ptr,
                    after,
                    double_free,
                    ..
                } => AnomalyRow {
                    what: if *double_free {
                        DOUBLE_FREE.into()
                    } else {
                        format!("invalid {}", what.replace('_', " "))
                    },
                    detail: format!(
                        "{api} of {} ({}) {}{}",
                        hex(*ptr),
                        event(*seq),
                        at(ts_ns.saturating_sub(tl.start_ns)),
                        match after {
                            Some(n) => format!("; allocation #{n} held that address last"),
                            None => String::new(),
                        }
                    ),
                },
                Anomaly::NeverFreed { .. } => return None,
                Anomaly::TrueAlias {
                    nodes,
                    handle,
                    overlap_bytes,
                } => AnomalyRow {
                    what: "two addresses for one memory".into(),
                    detail: format!(
                        "mappings #{} and #{} of {} are live at once over the same {}",
                        nodes[0],
                        nodes[1],
                        hex(*handle),
                        size(*overlap_bytes)
                    ),
                },
                Anomaly::StaleLaunch {
                    node: n,
                    seq,
                    kernel,
                    ptr,
                    ..
                } => AnomalyRow {
                    what: STALE_LAUNCH.into(),
                    detail: format!(
                        "kernel {kernel} ({}) got {}, into freed {}",
                        event(*seq),
                        hex(*ptr),
                        node(n)
                    ),
                },
                Anomaly::PoisonViolation {
                    node: n,
                    ptr,
                    first_offset,
                    changed_bytes,
                    ..
                } => AnomalyRow {
                    what: STALE_WRITE.into(),
                    detail: format!(
                        "{} of freed {} ({}) changed, from offset {}",
                        plural(*changed_bytes, "byte"),
                        node(n),
                        hex(*ptr),
                        words::count(*first_offset)
                    ),
                },
                Anomaly::StaleValue {
                    node: n,
                    seq,
                    kernel,
                    ptr,
                    ..
                } => AnomalyRow {
                    what: format!("unused {}", words::STALE_VALUE),
                    detail: format!(
                        "kernel {kernel} ({}) got {}, into freed {}; no fault followed",
                        event(*seq),
                        hex(*ptr),
                        node(n)
                    ),
                },
            })
        })
        .collect()
}

/// The CUDA errors the page's tables show, named as the API that returned them names them:
/// `"cudaFree 700"` → `700 (cudaErrorIllegalAddress)`; device faults after stale launches by
/// the driver's names: `"fault 700"` → `700 (CUDA_ERROR_ILLEGAL_ADDRESS)`.
pub(super) fn error_names(s: &TraceSummary) -> BTreeMap<String, String> {
    let t = &s.totals;
    t.last_events
        .iter()
        .map(|e| (e.api.as_str(), e.result))
        .chain(t.invalid_frees.iter().map(|f| (f.api.as_str(), f.result)))
        .filter(|&(_, r)| r != 0)
        .map(|(api, r)| (format!("{api} {r}"), returned(api, i64::from(r))))
        .chain(
            t.stale_launches
                .iter()
                .filter_map(|l| l.fault)
                .map(|c| (format!("fault {c}"), cuda_error(c))),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        assert_eq!(capital(STALE_WRITE), "Stale write");
        assert_eq!(returned("cudaFree", 700), "700 (cudaErrorIllegalAddress)");
        assert_eq!(returned("cuMemAlloc_v2", 2), "2 (CUDA_ERROR_OUT_OF_MEMORY)");
        assert_eq!(
            returned("nonsense", 700),
            "700 (CUDA_ERROR_ILLEGAL_ADDRESS)"
        );
        assert_eq!(at(6_100_000), "at 6.10 ms");
    }
}

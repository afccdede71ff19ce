//! `isolate summary`: what a run called, allocated, leaked and broke, in one streaming pass.
//!
//! Memory is bounded by what is live at once plus a few capped lists ([`LIST_CAP`] entries of
//! stale writes, stale launches, invalid frees and possible leaks; their full counts are kept
//! beside them) and the calls of recent frees (65,536 slots, to name them in findings).
//!
//! Files: `types.rs` has the summary's types (serde makes them its JSON form), `summarizer.rs`
//! the [`Summarizer`] observer that fills them from one trace, `text.rs` the text form
//! ([`render_text`]); this one reads traces and adds their summaries up ([`combine`]).

mod summarizer;
mod text;
mod types;

pub use summarizer::Summarizer;
pub use text::render_text;
pub use types::*;

use crate::Error;
use crate::source::{Progress, analyze};
use crate::track::Category;
use std::path::Path;

/// Lists (violations, stale launches, invalid frees) keep at most this many entries.
pub const LIST_CAP: usize = 10_000;
/// Marks kept in a summary (all are counted).
pub const MARKS_CAP: usize = 1_000;
/// Allocation sites listed in `sites_at_end` and `sites_at_peak`.
pub const SITES_SHOWN: usize = 10;
/// How many of the last events a summary keeps.
pub const LAST_EVENTS: usize = 16;

/// What the top-level `allocations`, `frees`, `peak_live_bytes` and `live_at_end` count:
/// device memory (the categories of [`Category::is_device_memory`]).
pub const DEVICE_MEMORY: [Category; 3] = [Category::Device, Category::Managed, Category::Handle];

/// The name of a CUDA device-fault error code (`illegal address`; `device fault` for others).
pub fn fault_name(code: u64) -> &'static str {
    crate::words::device_fault(code)
}

/// `*a += b`, saturating at `u64::MAX`.
fn add(a: &mut u64, b: u64) {
    *a = a.saturating_add(b);
}

/// Summarises one trace.
pub fn summarize_one(
    path: &Path,
    trace: usize,
    progress: &mut dyn Progress,
) -> Result<TraceSummary, Error> {
    let mut s = Summarizer::new(trace);
    let info = analyze(path, progress, &mut s)?;
    Ok(s.into_summary(&info))
}

/// Summarises several traces, each on its own and added up.
pub fn summarize<P: AsRef<Path>>(
    paths: &[P],
    progress: &mut dyn Progress,
) -> Result<Summary, Error> {
    let mut traces = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        traces.push(summarize_one(p.as_ref(), i, progress)?);
    }
    Ok(combine(traces))
}

/// Adds up trace summaries. Sums saturate at `u64::MAX` rather than wrap: a hostile trace can
/// put any number in a size or a counter, and a total that wrapped would look small.
pub fn combine(traces: Vec<TraceSummary>) -> Summary {
    let mut t = Totals {
        complete: !traces.is_empty(),
        ..Totals::default()
    };
    let mut last: Vec<EventEntry> = Vec::new();
    let mut region_at: std::collections::HashMap<String, usize> = Default::default();
    for s in &traces {
        let x = &s.totals;
        for (k, v) in &x.calls {
            add(t.calls.entry(k.clone()).or_default(), *v);
        }
        for (k, v) in &x.failed {
            add(t.failed.entry(k.clone()).or_default(), *v);
        }
        for (k, codes) in &x.failed_results {
            let e = t.failed_results.entry(k.clone()).or_default();
            for (c, v) in codes {
                add(e.entry(c.clone()).or_default(), *v);
            }
        }
        add(&mut t.events, x.events);
        t.library_cost.extend(x.library_cost.iter().cloned());
        add(&mut t.allocations, x.allocations);
        add(&mut t.frees, x.frees);
        add(&mut t.peak_live_bytes, x.peak_live_bytes);
        t.live_at_end.add(x.live_at_end);
        t.held_at_exit.add(&x.held_at_exit);
        t.possible_leaks.extend(x.possible_leaks.iter().cloned());
        add(&mut t.leak_count, x.leak_count);
        add(&mut t.leak_bytes_per_step, x.leak_bytes_per_step);
        t.leaks.extend(x.leaks.iter().cloned());
        merge_sites(&mut t.sites_at_end, &x.sites_at_end);
        merge_sites(&mut t.sites_at_peak, &x.sites_at_peak);
        if t.no_stacks.is_none() {
            t.no_stacks = x.no_stacks.clone();
        }
        add(&mut t.findings, x.findings);
        add(&mut t.invalid_free_count, x.invalid_free_count);
        add(&mut t.double_free_count, x.double_free_count);
        add(&mut t.sequence.reordered, x.sequence.reordered);
        add(&mut t.sequence.gaps, x.sequence.gaps);
        add(&mut t.sequence.late, x.sequence.late);
        t.invalid_frees.extend(x.invalid_frees.iter().cloned());
        add(
            &mut t.frees_of_earlier_allocations,
            x.frees_of_earlier_allocations,
        );
        add(&mut t.lost, x.lost);
        add(&mut t.poison_violation_count, x.poison_violation_count);
        t.poison_violations
            .extend(x.poison_violations.iter().cloned());
        add(&mut t.stale_launch_count, x.stale_launch_count);
        t.stale_launches.extend(x.stale_launches.iter().cloned());
        add(&mut t.stale_value_count, x.stale_value_count);
        add(&mut t.freed_in_use_count, x.freed_in_use_count);
        t.freed_in_use.extend(x.freed_in_use.iter().cloned());
        t.stale_values.extend(x.stale_values.iter().cloned());
        t.device_faults.extend(x.device_faults.iter().cloned());
        add(&mut t.device_fault_count, x.device_fault_count);
        let q = &mut t.quarantine;
        add(&mut q.peak_bytes, x.quarantine.peak_bytes);
        add(&mut q.releases, x.quarantine.releases);
        add(&mut q.early_releases, x.quarantine.early_releases);
        add(&mut q.oom_retries, x.quarantine.oom_retries);
        add(&mut q.launch_oom_retries, x.quarantine.launch_oom_retries);
        let (d, w) = (&mut t.device_work, &x.device_work);
        add(&mut d.frees, w.frees);
        add(&mut d.freed_bytes, w.freed_bytes);
        add(&mut d.written_bytes, w.written_bytes);
        add(&mut d.read_bytes, w.read_bytes);
        if w.steps > d.steps {
            d.steps = w.steps;
            d.steps_from = w.steps_from.clone();
        }
        d.run_ns = d.run_ns.max(w.run_ns);
        let h = &mut t.host;
        add(&mut h.allocations, x.host.allocations);
        add(&mut h.frees, x.host.frees);
        add(&mut h.peak_live_bytes, x.host.peak_live_bytes);
        h.live_at_end.add(x.host.live_at_end);
        h.registered_at_end.add(x.host.registered_at_end);
        for (k, c) in &x.categories {
            let e = t.categories.entry(k.clone()).or_default();
            add(&mut e.started, c.started);
            add(&mut e.ended, c.ended);
            add(&mut e.bytes_started, c.bytes_started);
            add(&mut e.peak_live_bytes, c.peak_live_bytes);
            e.live_at_end.add(c.live_at_end);
        }
        for (k, v) in &x.notes {
            add(t.notes.entry(k.clone()).or_default(), *v);
        }
        for r in &x.regions {
            match region_at.get(&r.name).copied() {
                Some(i) => {
                    let e = &mut t.regions[i];
                    add(&mut e.count, r.count);
                    add(&mut e.total_ns, r.total_ns);
                    e.peak_live_bytes = e.peak_live_bytes.max(r.peak_live_bytes);
                }
                None if t.regions.len() < LIST_CAP => {
                    region_at.insert(r.name.clone(), t.regions.len());
                    t.regions.push(r.clone());
                }
                None => {}
            }
        }
        add(&mut t.region_count, x.region_count);
        t.marks.extend(
            x.marks
                .iter()
                .take(MARKS_CAP - t.marks.len().min(MARKS_CAP))
                .cloned(),
        );
        add(&mut t.mark_count, x.mark_count);
        add(&mut t.writer.events_accepted, x.writer.events_accepted);
        add(&mut t.writer.queue_waits, x.writer.queue_waits);
        add(&mut t.writer.queue_wait_ns, x.writer.queue_wait_ns);
        last.extend(x.last_events.iter().cloned());
        if t.truncated.is_none() {
            t.truncated = x.truncated;
        }
        t.complete &= x.complete;
    }
    if t.device_work.any() {
        t.device_work.settle();
    }
    for v in [&mut t.sites_at_end, &mut t.sites_at_peak] {
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
        v.truncate(SITES_SHOWN);
    }
    t.peak_is_sum_of_processes = traces.len() > 1;
    t.invalid_frees.truncate(LIST_CAP);
    t.possible_leaks.truncate(LIST_CAP);
    t.leaks.truncate(LIST_CAP);
    t.poison_violations.truncate(LIST_CAP);
    t.stale_launches.truncate(LIST_CAP);
    t.stale_values.truncate(LIST_CAP);
    t.freed_in_use.truncate(LIST_CAP);
    t.device_faults.truncate(LIST_CAP);
    last.sort_by_key(|e| (e.ts_ns, e.trace, e.seq));
    let skip = last.len().saturating_sub(LAST_EVENTS);
    t.last_events = last.split_off(skip);
    Summary { totals: t, traces }
}

/// Adds `from`'s sites to `into`: the same sites (the same shown frames: stack ids differ
/// between processes) add up.
fn merge_sites(into: &mut Vec<SiteEntry>, from: &[SiteEntry]) {
    for s in from {
        match into.iter_mut().find(|x| x.stack.key() == s.stack.key()) {
            Some(x) => {
                add(&mut x.count, s.count);
                add(&mut x.bytes, s.bytes);
            }
            None => into.push(s.clone()),
        }
    }
}

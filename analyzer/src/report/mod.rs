//! `isolate report`: one self-contained HTML page (inline script and style, nothing fetched).
//!
//! Per trace, from the top: a badge when the run crashed or the device faulted, the findings in
//! plain words (each naming the code of its calls first: the allocation's, the free's and the
//! launch's file:line, by [`crate::finding::place`]'s rule), what else is worth knowing (memory
//! held at exit among it: information, not a finding), then live device memory over time,
//! stacked by allocation like PyTorch's memory viewer, with the program's regions or, when it
//! named none, the steps [`crate::growth`] recognises from the call stacks above the plot: the largest allocations (by bytes × lifetime) get their own band, everything else is
//! one "other" band. The timeline zooms and pans (wheel, drag, keys) and starts where memory
//! activity does. Its data is bucketed here, while reading, into at most [`POINTS`] buckets in
//! which memory changed (the bucket width doubles whenever the trace outgrows them), so a trace
//! of any length makes a page of a few hundred kilobytes that draws on a canvas at once.
//! Findings are marked where they happened; below the timeline the allocation sites (a table
//! by bytes or by allocations and an icicle of their Python frames, `sites.rs`), the top reuse
//! chains (connected parts of the aliasing graph) and the tables.
//!
//! All text from the trace reaches the page only as JSON inside a `<script type=
//! "application/json">` element, escaped with [`json_for_script`], and the script puts it into
//! the page with `textContent`, never as HTML.
//!
//! Files: this one assembles the page; `timeline.rs` buckets live memory and marks findings
//! while reading; `findings.rs` says what was found, in words (the names of
//! [`crate::words`], which the summary uses too); `sites.rs` makes the site view from
//! [`crate::sites`]' counts; `chains.rs` follows the reuse chains;
//! `report.html` is the page's template (its script draws the timeline).

mod chains;
mod findings;
mod sites;
mod timeline;

pub use chains::{Chain, ChainNode};
pub use findings::{AnomalyRow, Badge, Entry, Verdict};
pub use sites::{SITES_LISTED, SiteRow, SiteView, TREE_NODES, Tree};
pub use timeline::{Band, FirstView, Marker, Region, Timeline};

use crate::Error;
use crate::finding::Streamed;
use crate::graph::{Anomaly, Filter, GraphBuilder};
use crate::source::{Progress, TraceInfo, analyze};
use crate::summary::TraceSummary;
use crate::util::{escape_html, hex, json_for_script};
use chains::{ChainSink, LEAKS};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::path::Path;
use timeline::TimelineObs;

/// The most buckets of the timeline (buckets in which memory changed).
pub const POINTS: usize = 4096;
/// Allocations drawn as their own band.
pub const BANDS: usize = 160;
/// Markers kept per trace.
pub const MARKERS: usize = 4000;
/// Reuse chains shown.
pub const CHAINS: usize = 12;

#[derive(Serialize)]
struct Leak {
    id: u64,
    api: &'static str,
    size: u64,
    ptr: String,
}

#[derive(Serialize)]
struct TracePage {
    verdict: Verdict,
    summary: TraceSummary,
    timeline: Timeline,
    chains: Vec<Chain>,
    anomalies: Vec<AnomalyRow>,
    anomaly_count: usize,
    /// CUDA error code → its name, for the codes the tables show.
    errors: BTreeMap<String, String>,
    leaks: Vec<Leak>,
    leak_count: usize,
    /// Trace format 2: stack id → the lines the page shows for it (frames, hidden ones
    /// counted), for the stacks of the bands (shown when a band is clicked).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    stacks: BTreeMap<u32, Vec<String>>,
    /// Why the trace has no stacks, when it has none.
    no_stacks: Option<String>,
    /// The steps drawn on the timeline when the program named none (no regions): a loop's
    /// iterations, recognised from the call stacks by [`crate::growth`].
    steps: Option<StepsShown>,
    /// The allocation sites (traces with stacks).
    sites: Option<SiteView>,
}

/// Steps found without regions, as the page says them.
#[derive(Serialize)]
struct StepsShown {
    /// `iterations of the loop at train.py:12 in <module>`.
    what: String,
    count: usize,
}

/// Frames a clicked allocation's stack shows.
const STACK_LINES: usize = 16;

#[derive(Serialize)]
struct Page {
    generator: String,
    traces: Vec<TracePage>,
}

fn one(
    path: &Path,
    index: usize,
    progress: &mut dyn Progress,
) -> Result<(TracePage, TraceInfo), Error> {
    let mut sink = ChainSink::default();
    let mut obs = (
        Streamed::new(index, TimelineObs::new()),
        (
            GraphBuilder::new(&mut sink, Filter::default()),
            sites::SiteObs::default(),
        ),
    );
    let info = analyze(path, progress, &mut obs)?;
    let (
        Streamed {
            summary: summ,
            out: tl,
        },
        (builder, collect),
    ) = obs;
    builder.finish()?;
    let steps = summ.steps();
    let mut summary = summ.into_summary(&info);
    summary.totals.invalid_frees.truncate(200);
    summary.totals.poison_violations.truncate(200);
    summary.totals.stale_launches.truncate(200);
    // The page says how many suspects there were (`stale_value_count`), not which: their three
    // stacks each made 11 of a GPT-2 run's 12 MB page (398 suspects; H100, report_gpt2.sh).
    summary.totals.stale_values.clear();
    let chains = sink.chains();
    let leak_count = sink.leak_count;
    sink.leaks.sort_by_key(|l| (Reverse(l.0), l.1));
    let leaks = sink
        .leaks
        .iter()
        .take(LEAKS)
        .map(|&(size, id, api, ptr)| Leak {
            id,
            api,
            size,
            ptr: hex(ptr),
        })
        .collect();
    let anomalies: Vec<Anomaly> = sink
        .anomalies
        .iter()
        .filter(|a| !matches!(a, Anomaly::NeverFreed { .. }))
        .cloned()
        .collect();
    let (mut timeline, seen) = tl.into_timeline();
    let steps = steps
        .filter(|s| s.from_stacks && timeline.regions.is_empty())
        .map(|s| {
            steps_as_regions(&mut timeline, &s.spans);
            StepsShown {
                what: s.what,
                count: s.spans.len(),
            }
        });
    let table = collect.table();
    let mut stacks = BTreeMap::new();
    for b in &timeline.bands {
        for id in [b.stack, b.free_stack] {
            if id != 0 && !stacks.contains_key(&id) {
                let lines = crate::stacks::shown(table, id)
                    .map(|s| s.text_lines(STACK_LINES))
                    .unwrap_or_default();
                stacks.insert(id, lines);
            }
        }
    }
    let sites = collect.view();
    let no_stacks = summary.totals.no_stacks.clone();
    let verdict = findings::verdict(&summary, &timeline, &seen, &anomalies);
    let errors = findings::error_names(&summary);
    Ok((
        TracePage {
            verdict,
            anomaly_count: anomalies.len(),
            anomalies: findings::anomaly_rows(&anomalies, &timeline),
            errors,
            summary,
            timeline,
            chains,
            leaks,
            leak_count,
            stacks,
            no_stacks,
            steps,
            sites,
        },
        info,
    ))
}

/// Draws `spans` (steps, trace clock) as the timeline's regions: `step 1`, `step 2`, … with the
/// most device memory the timeline saw live in each.
fn steps_as_regions(tl: &mut Timeline, spans: &[(u64, u64)]) {
    let rel = |ts: u64| ts.saturating_sub(tl.start_ns).min(tl.span_ns);
    let mut regions = Vec::with_capacity(spans.len().min(MARKERS));
    for (k, &(from, to)) in spans.iter().enumerate().take(MARKERS) {
        let (a, b) = (rel(from), rel(to));
        let w = tl.bucket_ns.max(1);
        let lo = tl
            .at
            .partition_point(|&at| at.saturating_add(1).saturating_mul(w) <= a);
        let hi = tl.at.partition_point(|&at| at.saturating_mul(w) <= b);
        let peak = tl.device[lo..hi.max(lo)].iter().copied().max().unwrap_or(0);
        regions.push(Region {
            from_ns: a,
            to_ns: b.max(a),
            label: format!("step {}", k + 1),
            depth: 1,
            peak_live_bytes: peak,
        });
    }
    tl.region_count = spans.len() as u64;
    tl.regions = regions;
}

/// A rendered report.
pub struct Report {
    /// The whole HTML document.
    pub html: String,
    /// What was read of each trace (whether it was truncated, …).
    pub traces: Vec<TraceInfo>,
}

/// Renders the report of `paths` as one HTML document.
pub fn render<P: AsRef<Path>>(paths: &[P], progress: &mut dyn Progress) -> Result<Report, Error> {
    let mut traces = Vec::new();
    let mut title = Vec::new();
    let mut infos = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let (page, info) = one(p.as_ref(), i, progress)?;
        title.push(format!("{} (pid {})", info.file, info.header.pid));
        traces.push(page);
        infos.push(info);
    }
    let page = Page {
        generator: format!("isolate {}", env!("CARGO_PKG_VERSION")),
        traces,
    };
    let json = serde_json::to_string(&page).map_err(|e| Error::invalid(e.to_string()))?;
    // Split the template rather than search-and-replace in it, so that nothing from the trace
    // can ever be taken for a placeholder.
    let (head, rest) = TEMPLATE.split_once("{{TITLE}}").unwrap_or((TEMPLATE, ""));
    let (mid, tail) = rest.split_once("{{DATA}}").unwrap_or((rest, ""));
    let title = escape_html(&format!("isolate report: {}", title.join(", ")));
    let data = json_for_script(&json);
    let mut out = String::with_capacity(TEMPLATE.len() + title.len() + data.len());
    out.push_str(head);
    out.push_str(&title);
    out.push_str(mid);
    out.push_str(&data);
    out.push_str(tail);
    Ok(Report {
        html: out,
        traces: infos,
    })
}

const TEMPLATE: &str = include_str!("report.html");

//! `isolate sites`: allocation sites ranked by the device memory they allocated or by how many
//! allocations they made, as `memray stats` and `heaptrack_print` rank theirs.
//!
//! A site is a call stack (see [`crate::stacks`]); several traces (processes) are added up by
//! site name, since stack ids and addresses differ between processes. Per site: allocations
//! and bytes over the run, frees, what was still held at the end, and the most it held at
//! once. Device memory only (device and managed allocations, physical handles), as the
//! summary's `allocations` count. Memory: one entry per distinct stack.

use crate::Error;
use crate::source::{Progress, analyze};
use crate::stacks::{self, ShownStack, StackTable};
use crate::summary::CountBytes;
use crate::track::{Ended, Live, Node, Observer};
use isolate_trace::Record;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// What the ranking is by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// Bytes allocated over the run.
    Bytes,
    /// Allocations made over the run.
    Calls,
}

/// One allocation site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteStats {
    /// The site's name: its first shown frame (`(no stack)` for allocations without one).
    pub site: String,
    pub allocations: u64,
    pub bytes: u64,
    pub frees: u64,
    /// Still live at the end of the trace.
    pub held_at_end: CountBytes,
    /// The most device memory of this site live at once (for several traces, the largest of
    /// any one).
    pub peak_live_bytes: u64,
    /// The stack (absent for `(no stack)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<ShownStack>,
    /// What tells sites apart ([`ShownStack::key`]).
    #[serde(skip)]
    pub key: String,
}

/// One trace read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SitesTrace {
    pub file: String,
    pub format_version: u32,
    /// Why it has no stacks, when it has none.
    pub no_stacks: Option<String>,
    pub truncated: Option<u64>,
}

/// `isolate sites`' answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Sites {
    pub by: By,
    pub traces: Vec<SitesTrace>,
    /// Device memory allocations of the traces, and their bytes.
    pub allocations: u64,
    pub bytes: u64,
    /// Distinct sites in all (the list may be cut by `--top`).
    pub site_count: usize,
    /// The sites, first the largest.
    pub sites: Vec<SiteStats>,
}

#[derive(Default, Clone, Copy)]
struct Acc {
    allocations: u64,
    bytes: u64,
    frees: u64,
    live: CountBytes,
    peak: u64,
}

/// The observer that counts device memory per stack (`diff` uses it too).
#[derive(Default)]
pub(crate) struct Collect {
    table: StackTable,
    by_stack: FxHashMap<u32, Acc>,
}

impl Observer for Collect {
    fn started(&mut self, n: &Node, _live: &Live) {
        if !n.category.is_device_memory() {
            return;
        }
        let a = self.by_stack.entry(n.stack).or_default();
        a.allocations += 1;
        a.bytes = a.bytes.saturating_add(n.size);
        a.live.count += 1;
        a.live.bytes = a.live.bytes.saturating_add(n.size);
        a.peak = a.peak.max(a.live.bytes);
    }

    fn ended(&mut self, n: &Node, e: &Ended, _live: &Live) {
        if !n.category.is_device_memory() {
            return;
        }
        if let Some(a) = self.by_stack.get_mut(&n.stack) {
            if e.how == crate::track::EndHow::Freed {
                a.frees += 1;
            }
            a.live.count = a.live.count.saturating_sub(1);
            a.live.bytes = a.live.bytes.saturating_sub(n.size);
        }
    }

    fn other(&mut self, rec: &Record, _live: &Live) {
        self.table.record(rec);
    }
}

/// Ranks the allocation sites of the traces at `paths` by `by`, the first `top` (all when 0).
pub fn sites<P: AsRef<Path>>(
    paths: &[P],
    by: By,
    top: usize,
    progress: &mut dyn Progress,
) -> Result<Sites, Error> {
    let mut traces = Vec::new();
    let mut merged: Vec<SiteStats> = Vec::new();
    let mut at: FxHashMap<String, usize> = FxHashMap::default();
    let (mut allocations, mut bytes) = (0u64, 0u64);
    for p in paths {
        let mut c = Collect::default();
        let info = analyze(p.as_ref(), progress, &mut c)?;
        traces.push(SitesTrace {
            file: info.file.clone(),
            format_version: info.format_version,
            no_stacks: stacks::why_none(info.format_version, &c.table, &info.header.config),
            truncated: info.truncated_at,
        });
        for x in c.named() {
            allocations = allocations.saturating_add(x.allocations);
            bytes = bytes.saturating_add(x.bytes);
            merge(&mut merged, &mut at, x);
        }
    }
    let key = |s: &SiteStats| match by {
        By::Bytes => (s.bytes, s.allocations),
        By::Calls => (s.allocations, s.bytes),
    };
    merged.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.site.cmp(&b.site)));
    let site_count = merged.len();
    if top > 0 {
        merged.truncate(top);
    }
    Ok(Sites {
        by,
        traces,
        allocations,
        bytes,
        site_count,
        sites: merged,
    })
}

impl Collect {
    /// The sites of one trace, symbolised (sites of one name are one).
    pub(crate) fn named(self) -> Vec<SiteStats> {
        let mut out = Vec::new();
        let mut at = FxHashMap::default();
        for (id, a) in self.by_stack {
            let stack = stacks::shown(&self.table, id);
            let site = stack
                .as_ref()
                .map_or_else(|| "(no stack)".to_owned(), |s| s.site.clone());
            let key = stack.as_ref().map_or_else(String::new, |s| s.key());
            let x = SiteStats {
                key,
                site,
                allocations: a.allocations,
                bytes: a.bytes,
                frees: a.frees,
                held_at_end: a.live,
                peak_live_bytes: a.peak,
                stack,
            };
            merge(&mut out, &mut at, x);
        }
        out
    }

    /// The stacks it read.
    pub(crate) fn table(&self) -> &StackTable {
        &self.table
    }

    pub(crate) fn has_stacks(&self) -> bool {
        self.table.has_stacks()
    }
}

/// Adds `x` to the same site in `into` (`at`: key → index).
fn merge(into: &mut Vec<SiteStats>, at: &mut FxHashMap<String, usize>, x: SiteStats) {
    match at.get(&x.key) {
        Some(&i) => {
            let m = &mut into[i];
            m.allocations = m.allocations.saturating_add(x.allocations);
            m.bytes = m.bytes.saturating_add(x.bytes);
            m.frees = m.frees.saturating_add(x.frees);
            m.held_at_end.add(x.held_at_end);
            m.peak_live_bytes = m.peak_live_bytes.max(x.peak_live_bytes);
        }
        None => {
            at.insert(x.key.clone(), into.len());
            into.push(x);
        }
    }
}

/// Frames shown under each site's name in text.
const FRAMES_SHOWN: usize = 3;

/// The ranking as text: one row a site (bytes, allocations, held at the end, peak, name) and
/// the next frames of its stack under the name.
pub fn render_text(s: &Sites) -> String {
    use crate::util::human_bytes as size;
    let mut o = String::new();
    let files: Vec<&str> = s.traces.iter().map(|t| t.file.as_str()).collect();
    let _ = writeln!(o, "== allocation sites: {} ==", files.join(", "));
    let mut said = Vec::new();
    for t in &s.traces {
        if let Some(w) = &t.no_stacks
            && !said.contains(w)
        {
            let _ = writeln!(o, "{}: {w}", t.file);
            said.push(w.clone());
        }
    }
    let _ = writeln!(
        o,
        "device memory: {} allocations, {} from {} site{}; by {}{}",
        crate::words::count(s.allocations),
        size(s.bytes),
        s.site_count,
        if s.site_count == 1 { "" } else { "s" },
        match s.by {
            By::Bytes => "bytes allocated",
            By::Calls => "allocations made",
        },
        if s.sites.len() < s.site_count {
            format!(", the first {}", s.sites.len())
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        o,
        "{:>12} {:>11} {:>12} {:>12}  site",
        "bytes", "allocations", "held at end", "peak"
    );
    for x in &s.sites {
        let _ = writeln!(
            o,
            "{:>12} {:>11} {:>12} {:>12}  {}",
            size(x.bytes),
            crate::words::count(x.allocations),
            size(x.held_at_end.bytes),
            size(x.peak_live_bytes),
            x.site.escape_debug()
        );
        if let Some(st) = &x.stack {
            for l in st.text_lines(FRAMES_SHOWN + 1).into_iter().skip(1) {
                let _ = writeln!(o, "{:>51}  {}", "", l.escape_debug());
            }
        }
    }
    o
}

//! `isolate diff`: how two runs differ, with addresses taken out.
//!
//! Each run is boiled down to a [`Profile`]: totals, counts by API and size class, the reuse
//! structure, failures and violations, and its leaks named by *what* they are — API, size and
//! the ordinal among allocations of that API and size — not *where* they were. Two runs of the
//! same program that got different addresses from the driver have equal profiles.

use crate::Error;
use crate::graph::{Counts, EdgeKind, GraphBuilder};
use crate::source::{Progress, analyze};
use crate::summary::{CountBytes, Summarizer};
use crate::track::{Category, Live, Node, Observer};
use crate::util::{human_bytes, size_class};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// At most this many leaks are named in a profile (all are counted).
pub const LEAK_CAP: usize = 10_000;

/// Per-API figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApiProfile {
    pub calls: u64,
    pub failed: u64,
    /// Nodes it started (allocations, handles, reservations, mappings).
    pub started: u64,
    pub bytes: u64,
}

/// An allocation never freed, named without its address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Leak {
    pub api: String,
    pub size: u64,
    /// 0 for the first allocation of this API and size in the run, 1 for the second, …
    pub ordinal: u64,
    pub category: String,
}

impl std::fmt::Display for Leak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} ({} B, #{} of that size)",
            self.api,
            human_bytes(self.size),
            self.size,
            self.ordinal
        )
    }
}

/// A run without its addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Profile {
    pub file: String,
    pub events: u64,
    pub peak_live_bytes: u64,
    pub live_at_end: CountBytes,
    /// Device memory allocations (device, managed, physical handles), as in the summary.
    pub allocations: u64,
    /// Their bytes.
    pub allocated_bytes: u64,
    /// API name → figures.
    pub by_api: BTreeMap<String, ApiProfile>,
    /// Size class (next power of two) → device memory allocations.
    pub size_classes: BTreeMap<u64, u64>,
    pub reuse_edges: u64,
    /// Size class of the new occupant → reuse edges.
    pub reuse_by_class: BTreeMap<u64, u64>,
    pub failures: u64,
    pub invalid_frees: u64,
    /// Frees of allocations made before a late load (not invalid; see the summary).
    pub frees_of_earlier_allocations: u64,
    pub poison_violations: u64,
    pub stale_launches: u64,
    pub true_aliases: u64,
    pub overlaps: u64,
    /// The findings by kind ([`crate::finding`]), as `check --no-violations` counts them.
    #[serde(skip)]
    pub findings: crate::finding::Tally,
    /// The first findings that count, each with where in the code its calls were (`stale
    /// write: allocated at t.py:3 in f; freed at t.py:4 in f`), for `check --no-violations`.
    #[serde(skip)]
    pub finding_code: Vec<String>,
    pub leak_count: u64,
    pub leaks: Vec<Leak>,
    pub truncated: Option<u64>,
    pub complete: bool,
    /// Trace format 2: device memory allocations per allocation site (by name: stack ids and
    /// addresses differ between runs), the largest [`SITE_CAP`] by bytes; absent without stacks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteFigures>,
}

/// Findings named with their code in a profile.
pub const FINDING_CODE_SHOWN: usize = 5;

/// Sites kept in a profile.
pub const SITE_CAP: usize = 10_000;

/// One allocation site of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteFigures {
    pub site: String,
    /// The site's shown frames, innermost first: what tells sites apart across runs.
    pub frames: Vec<String>,
    pub allocations: u64,
    pub bytes: u64,
    pub held_at_end: CountBytes,
    pub peak_live_bytes: u64,
}

/// How one site's figures changed (`base`/`new` 0: the site is not in that run).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteChange {
    pub site: String,
    /// Its shown frames (sites of one name differ in their callers).
    pub frames: Vec<String>,
    pub allocations: Change,
    pub bytes: Change,
    pub held_at_end_bytes: Change,
    /// True when another changed site has the same name (the text then names its caller).
    #[serde(skip)]
    pub ambiguous: bool,
}

impl SiteChange {
    /// `site X: +50 allocations, +50.0 MiB` (and what it held at the end when that changed).
    pub fn line(&self) -> String {
        let signed = |d: i128| {
            if d >= 0 {
                format!("+{d}")
            } else {
                d.to_string()
            }
        };
        let bytes = |d: i128| {
            let b = human_bytes(u64::try_from(d.unsigned_abs()).unwrap_or(u64::MAX));
            if d >= 0 {
                format!("+{b}")
            } else {
                format!("-{b}")
            }
        };
        let name = match self.frames.get(1) {
            Some(caller) if self.ambiguous => format!("{} ← {caller}", self.site),
            _ => self.site.clone(),
        };
        let mut l = format!(
            "site {}: {} allocations, {}",
            name,
            signed(self.allocations.delta),
            bytes(self.bytes.delta)
        );
        if self.allocations.base == 0 {
            l.push_str(" (new site)");
        } else if self.allocations.new == 0 {
            l.push_str(" (gone)");
        }
        if self.held_at_end_bytes.delta != 0 {
            l.push_str(&format!(
                "; held at end {}",
                bytes(self.held_at_end_bytes.delta)
            ));
        }
        l
    }
}

#[derive(Default)]
struct Leaks {
    ordinals: FxHashMap<(isolate_trace::Api, u64), u64>,
    /// Node id → ordinal, for the nodes started so far.
    of_node: FxHashMap<u64, u64>,
    leaks: Vec<Leak>,
    count: u64,
}

impl Observer for Leaks {
    fn started(&mut self, n: &Node, _: &Live) {
        let o = self.ordinals.entry((n.api, n.size)).or_default();
        self.of_node.insert(n.id, *o);
        *o += 1;
    }
    fn ended(&mut self, n: &Node, _: &crate::track::Ended, _: &Live) {
        self.of_node.remove(&n.id);
    }
    fn finish(&mut self, still: &[Node], _: &Live) {
        for n in still {
            if matches!(n.category, Category::Reservation | Category::Mapping) {
                continue;
            }
            self.count += 1;
            if self.leaks.len() < LEAK_CAP {
                self.leaks.push(Leak {
                    api: n.api.name().into(),
                    size: n.size,
                    ordinal: self.of_node.get(&n.id).copied().unwrap_or(0),
                    category: n.category.name().into(),
                });
            }
        }
        self.leaks.sort();
    }
}

/// Reads one run into its profile.
pub fn profile(path: &Path, progress: &mut dyn Progress) -> Result<Profile, Error> {
    let mut counts = Counts::default();
    let mut obs = (
        Summarizer::new(0),
        (
            GraphBuilder::new(&mut counts, Default::default()),
            (Leaks::default(), crate::sites::Collect::default()),
        ),
    );
    let info = analyze(path, progress, &mut obs)?;
    let (summ, (builder, (leaks, collect))) = obs;
    let mut sites: Vec<SiteFigures> = if collect.has_stacks() {
        collect
            .named()
            .into_iter()
            .map(|x| SiteFigures {
                frames: x.key.lines().map(str::to_owned).collect(),
                site: x.site,
                allocations: x.allocations,
                bytes: x.bytes,
                held_at_end: x.held_at_end,
                peak_live_bytes: x.peak_live_bytes,
            })
            .collect()
    } else {
        Vec::new()
    };
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    sites.truncate(SITE_CAP);
    builder.finish()?;
    let s = summ.into_summary(&info);
    let finding_code: Vec<String> = crate::finding::findings(&s)
        .iter()
        .filter(|f| f.kind().counts())
        .filter_map(|f| {
            let p = f.places();
            (!p.is_empty()).then(|| format!("{}: {}", f.kind().word(), p.join("; ")))
        })
        .take(FINDING_CODE_SHOWN)
        .collect();
    let t = &s.totals;
    let mut by_api: BTreeMap<String, ApiProfile> = BTreeMap::new();
    for (api, n) in &t.calls {
        by_api.entry(api.clone()).or_default().calls = *n;
    }
    for (api, n) in &t.failed {
        by_api.entry(api.clone()).or_default().failed = *n;
    }
    let _ = &leaks.ordinals;
    for ((api, size), n) in &leaks.ordinals {
        let e = by_api.entry(api.name().to_owned()).or_default();
        e.started = e.started.saturating_add(*n);
        e.bytes = e.bytes.saturating_add(size.saturating_mul(*n));
    }
    let mut size_classes = BTreeMap::new();
    for ((api, size), n) in &leaks.ordinals {
        // Device memory, as the summary's `allocations` counts it.
        let device_alloc = api.kind() == isolate_trace::Kind::Alloc
            && matches!(
                api.memory(),
                isolate_trace::Memory::Device | isolate_trace::Memory::Managed
            );
        if device_alloc || api.kind() == isolate_trace::Kind::Create {
            *size_classes.entry(size_class(*size)).or_default() += n;
        }
    }
    let allocated_bytes = crate::summary::DEVICE_MEMORY
        .iter()
        .filter_map(|c| t.categories.get(c.name()))
        .map(|c| c.bytes_started)
        .fold(0u64, u64::saturating_add);
    Ok(Profile {
        file: s.file.clone(),
        events: t.events,
        peak_live_bytes: t.peak_live_bytes,
        live_at_end: t.live_at_end,
        allocations: t.allocations,
        allocated_bytes,
        by_api,
        size_classes,
        reuse_edges: counts.edges.get(&EdgeKind::Reuse).copied().unwrap_or(0),
        reuse_by_class: counts.reuse_by_class.clone(),
        failures: t.failed.values().fold(0u64, |a, &b| a.saturating_add(b)),
        invalid_frees: t.invalid_free_count,
        frees_of_earlier_allocations: t.frees_of_earlier_allocations,
        poison_violations: t.poison_violation_count,
        stale_launches: t.stale_launch_count,
        true_aliases: counts.anomalies.get("true_alias").copied().unwrap_or(0),
        overlaps: counts.anomalies.get("overlap").copied().unwrap_or(0),
        findings: crate::finding::Tally::of(t),
        finding_code,
        leak_count: leaks.count,
        leaks: leaks.leaks,
        truncated: t.truncated,
        complete: t.complete,
        sites,
    })
}

/// One figure that differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub metric: String,
    pub base: u64,
    pub new: u64,
    pub delta: i128,
    /// Growth in percent of the base; null when the base is 0.
    pub percent: Option<f64>,
}

/// Two runs compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diff {
    pub base: Profile,
    pub new: Profile,
    /// Every figure that differs, in a fixed order.
    pub changes: Vec<Change>,
    /// Leaks of the new run that the base does not have, and the other way round.
    pub new_leaks: Vec<Leak>,
    pub fixed_leaks: Vec<Leak>,
    /// Trace format 2: the allocation sites whose allocations or bytes differ, the largest
    /// change in bytes first (absent when neither run has stacks).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteChange>,
    /// True when nothing differs.
    pub same: bool,
}

/// Percent growth from `a` to `b`; `None` when `a` is 0.
pub fn growth(a: u64, b: u64) -> Option<f64> {
    (a != 0).then(|| (b as f64 - a as f64) * 100.0 / a as f64)
}

fn figures(p: &Profile) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    let mut put = |k: String, v: u64| {
        m.insert(k, v);
    };
    put("a peak_live_bytes".into(), p.peak_live_bytes);
    put("b live_at_end.count".into(), p.live_at_end.count);
    put("c live_at_end.bytes".into(), p.live_at_end.bytes);
    put("d allocations".into(), p.allocations);
    put("e allocated_bytes".into(), p.allocated_bytes);
    put("f failures".into(), p.failures);
    put("g invalid_frees".into(), p.invalid_frees);
    put(
        "g2 frees_of_earlier_allocations".into(),
        p.frees_of_earlier_allocations,
    );
    put("h poison_violations".into(), p.poison_violations);
    put("i stale_launches".into(), p.stale_launches);
    put("j true_aliases".into(), p.true_aliases);
    put("k overlaps".into(), p.overlaps);
    put("l leaks".into(), p.leak_count);
    put("m reuse_edges".into(), p.reuse_edges);
    put("n events".into(), p.events);
    for (api, a) in &p.by_api {
        put(format!("o calls[{api}]"), a.calls);
        put(format!("p failed[{api}]"), a.failed);
        put(format!("q started[{api}]"), a.started);
        put(format!("r bytes[{api}]"), a.bytes);
    }
    for (c, n) in &p.size_classes {
        put(format!("s{c:020} allocations[size class {c}]"), *n);
    }
    for (c, n) in &p.reuse_by_class {
        put(format!("t{c:020} reuse_edges[size class {c}]"), *n);
    }
    m
}

/// Compares two profiles.
pub fn compare(base: Profile, new: Profile) -> Diff {
    let fa = figures(&base);
    let fb = figures(&new);
    let keys: BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
    let mut changes = Vec::new();
    for k in keys {
        let a = fa.get(k).copied().unwrap_or(0);
        let b = fb.get(k).copied().unwrap_or(0);
        if a != b {
            // The sort prefix keeps the order stable and readable; it is not part of the name.
            let metric = k.split_once(' ').map(|x| x.1).unwrap_or(k);
            changes.push(change(metric, a, b));
        }
    }
    let la: BTreeSet<&Leak> = base.leaks.iter().collect();
    let lb: BTreeSet<&Leak> = new.leaks.iter().collect();
    let new_leaks: Vec<Leak> = lb.difference(&la).map(|l| (*l).clone()).collect();
    let fixed_leaks: Vec<Leak> = la.difference(&lb).map(|l| (*l).clone()).collect();
    let sites = site_changes(&base.sites, &new.sites);
    let same =
        changes.is_empty() && new_leaks.is_empty() && fixed_leaks.is_empty() && sites.is_empty();
    Diff {
        base,
        new,
        changes,
        new_leaks,
        fixed_leaks,
        sites,
        same,
    }
}

/// How figure `metric` went from `a` to `b`.
fn change(metric: &str, a: u64, b: u64) -> Change {
    Change {
        metric: metric.into(),
        base: a,
        new: b,
        delta: i128::from(b) - i128::from(a),
        percent: growth(a, b),
    }
}

/// The sites whose allocations or bytes differ between two runs, the largest change in bytes
/// first.
pub fn site_changes(base: &[SiteFigures], new: &[SiteFigures]) -> Vec<SiteChange> {
    let a: BTreeMap<&[String], &SiteFigures> = base.iter().map(|s| (&s.frames[..], s)).collect();
    let b: BTreeMap<&[String], &SiteFigures> = new.iter().map(|s| (&s.frames[..], s)).collect();
    let none = SiteFigures::default();
    let keys: BTreeSet<&[String]> = a.keys().chain(b.keys()).copied().collect();
    let mut out: Vec<SiteChange> = keys
        .into_iter()
        .filter_map(|k| {
            let x = a.get(k).copied().unwrap_or(&none);
            let y = b.get(k).copied().unwrap_or(&none);
            let site = if y.site.is_empty() { &x.site } else { &y.site };
            (x.allocations != y.allocations || x.bytes != y.bytes).then(|| SiteChange {
                site: site.clone(),
                frames: k.to_vec(),
                ambiguous: false,
                allocations: change("allocations", x.allocations, y.allocations),
                bytes: change("bytes", x.bytes, y.bytes),
                held_at_end_bytes: change(
                    "held_at_end.bytes",
                    x.held_at_end.bytes,
                    y.held_at_end.bytes,
                ),
            })
        })
        .collect();
    out.sort_by(|p, q| {
        q.bytes
            .delta
            .abs()
            .cmp(&p.bytes.delta.abs())
            .then_with(|| p.site.cmp(&q.site))
    });
    let names: Vec<String> = out.iter().map(|c| c.site.clone()).collect();
    for c in &mut out {
        c.ambiguous = names.iter().filter(|n| **n == c.site).count() > 1;
    }
    out
}

/// Profiles and compares two traces.
pub fn diff(base: &Path, new: &Path, progress: &mut dyn Progress) -> Result<Diff, Error> {
    let a = profile(base, progress)?;
    let b = profile(new, progress)?;
    Ok(compare(a, b))
}

/// The comparison as people read it.
pub fn render_text(d: &Diff) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "base {}  vs  new {}", d.base.file, d.new.file);
    if d.same {
        let _ = writeln!(o, "no differences (addresses aside)");
        return o;
    }
    let w = d
        .changes
        .iter()
        .map(|c| c.metric.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(
        o,
        "{:<w$}  {:>16}  {:>16}  {:>10}",
        "metric", "base", "new", "change"
    );
    for c in &d.changes {
        let pct = match c.percent {
            Some(p) => format!("{p:+.1}%"),
            None => "new".into(),
        };
        let _ = writeln!(
            o,
            "{:<w$}  {:>16}  {:>16}  {:>10}",
            c.metric, c.base, c.new, pct
        );
    }
    for l in &d.new_leaks {
        let _ = writeln!(o, "NEW LEAK   {l}");
    }
    for l in &d.fixed_leaks {
        let _ = writeln!(o, "fixed leak {l}");
    }
    for s in d.sites.iter().take(SITES_IN_TEXT) {
        let _ = writeln!(o, "{}", s.line());
    }
    if d.sites.len() > SITES_IN_TEXT {
        let _ = writeln!(
            o,
            "… and {} more sites changed (--json has them all)",
            d.sites.len() - SITES_IN_TEXT
        );
    }
    o
}

/// Changed sites listed in the text.
const SITES_IN_TEXT: usize = 20;

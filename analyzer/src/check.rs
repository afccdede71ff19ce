//! `isolate check`: does a run stay within its baseline's budget? For CI.
//!
//! ```
//! use isolate_analyzer::check::{Thresholds, check};
//! use isolate_analyzer::diff::Profile;
//! let base = Profile { peak_live_bytes: 1000, allocations: 10, ..Profile::default() };
//! let new = Profile { peak_live_bytes: 1100, allocations: 10, ..Profile::default() };
//! let reasons = check(&base, &new, &Thresholds::default());
//! assert_eq!(reasons.len(), 1);
//! assert!(reasons[0].starts_with("peak device memory grew 10.0%"));
//! ```

use crate::diff::{Profile, growth};
use crate::finding::Kind;
use crate::util::human_bytes;
use crate::words;
use serde::Serialize;
use std::collections::BTreeSet;

/// The budget. Growth limits are fractions of the baseline (0.05 = 5%).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Thresholds {
    /// Peak device memory may grow by at most this much (default 5%).
    pub max_peak_growth: Option<f64>,
    /// The number of allocations may grow by at most this much (default 10%).
    pub max_alloc_growth: Option<f64>,
    /// No leak (an allocation never freed, named by API, size and ordinal) that the baseline
    /// does not have.
    pub no_new_leaks: bool,
    /// No finding that counts ([`crate::finding`]'s rule: stale writes, stale launches,
    /// invalid and double frees, device faults) and no true alias (a graph anomaly: two live
    /// mappings of the same physical memory) at all.
    pub no_violations: bool,
    /// No API may fail more often than in the baseline.
    pub no_failures: bool,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            max_peak_growth: Some(0.05),
            max_alloc_growth: Some(0.10),
            no_new_leaks: false,
            no_violations: false,
            no_failures: false,
        }
    }
}

/// Parses `5%`, `5`, or `0.05` (a bare number below 1 is a fraction, otherwise percent).
pub fn parse_percent(s: &str) -> Result<f64, crate::Error> {
    let t = s.trim();
    let bad = || crate::Error::invalid(format!("{s:?} is not a percentage (expected e.g. 5%)"));
    let (num, pct) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    Ok(if pct || v >= 1.0 { v / 100.0 } else { v })
}

/// `; most at site X: +50 allocations, +50.0 MiB; …`: the (at most 3) allocation sites that
/// grew most by `key`, when the runs have stacks; empty otherwise.
fn grown_sites(
    base: &Profile,
    new: &Profile,
    key: impl Fn(&crate::diff::SiteChange) -> i128,
) -> String {
    let mut c = crate::diff::site_changes(&base.sites, &new.sites);
    c.retain(|s| key(s) > 0);
    c.sort_by(|p, q| key(q).cmp(&key(p)).then_with(|| p.site.cmp(&q.site)));
    if c.is_empty() {
        return String::new();
    }
    let lines: Vec<String> = c.iter().take(3).map(|s| s.line()).collect();
    format!("; most at {}", lines.join("; "))
}

fn pct(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// One line per threshold that `new` breaks; empty when it is within budget.
pub fn check(base: &Profile, new: &Profile, t: &Thresholds) -> Vec<String> {
    let mut r = Vec::new();
    if let Some(max) = t.max_peak_growth {
        let (a, b) = (base.peak_live_bytes, new.peak_live_bytes);
        match growth(a, b) {
            Some(g) if g > max * 100.0 + 1e-9 => r.push(format!(
                "peak device memory grew {g:.1}% ({} → {}), more than the allowed {}{}",
                human_bytes(a),
                human_bytes(b),
                pct(max),
                grown_sites(base, new, |c| c.bytes.delta)
            )),
            None if b > 0 => r.push(format!(
                "peak device memory grew from nothing to {} (the baseline used none)",
                human_bytes(b)
            )),
            _ => {}
        }
    }
    if let Some(max) = t.max_alloc_growth {
        let (a, b) = (base.allocations, new.allocations);
        match growth(a, b) {
            Some(g) if g > max * 100.0 + 1e-9 => r.push(format!(
                "allocations grew {g:.1}% ({a} → {b}), more than the allowed {}{}",
                pct(max),
                grown_sites(base, new, |c| c.allocations.delta)
            )),
            None if b > 0 => r.push(format!(
                "allocations grew from none to {b} (the baseline made none)"
            )),
            _ => {}
        }
    }
    if t.no_new_leaks {
        let old: BTreeSet<_> = base.leaks.iter().collect();
        let fresh: Vec<_> = new.leaks.iter().filter(|l| !old.contains(l)).collect();
        let extra = new.leak_count.saturating_sub(base.leak_count);
        if !fresh.is_empty() || extra > 0 {
            let n = fresh.len().max(extra as usize);
            let shown: Vec<String> = fresh.iter().take(3).map(|l| l.to_string()).collect();
            r.push(format!(
                "{n} new leak{} (never freed, not in the baseline){}{}",
                if n == 1 { "" } else { "s" },
                if shown.is_empty() {
                    String::new()
                } else {
                    format!(": {}", shown.join("; "))
                },
                if fresh.len() > 3 {
                    format!("; and {} more", fresh.len() - 3)
                } else {
                    String::new()
                }
            ));
        }
    }
    if t.no_violations {
        let mut parts = Vec::new();
        if new.findings.counted() > 0 {
            parts.push(new.findings.kinds(Kind::counts));
        }
        if new.true_aliases > 0 {
            parts.push(words::plural(new.true_aliases, "true alias"));
        }
        if !parts.is_empty() {
            r.push(format!("violations found: {}", parts.join(", ")));
            // Where in the code (the calls of the first ones, when the trace has stacks).
            r.extend(new.finding_code.iter().map(|c| format!("  {c}")));
        }
    }
    if t.no_failures {
        let mut worse = Vec::new();
        for (api, a) in &new.by_api {
            let before = base.by_api.get(api).map(|b| b.failed).unwrap_or(0);
            if a.failed > before {
                worse.push(format!(
                    "{api} failed {} times (baseline {before})",
                    a.failed
                ));
            }
        }
        if !worse.is_empty() {
            r.push(format!("new failed calls: {}", worse.join(", ")));
        }
    }
    r
}

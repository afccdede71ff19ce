//! `isolate summary` as people read it: per trace, the process, what it allocated and still
//! holds, and a plain verdict on stale writes and stale launches.

use super::{CategoryStats, DEVICE_MEMORY, DeviceStats, Summary, Totals, fault_name};
use crate::track::Category;
use crate::util::{hex, human_bytes, human_ns};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The summary as people read it.
pub fn render_text(s: &Summary) -> String {
    let mut o = String::new();
    for t in &s.traces {
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
        let _ = writeln!(
            o,
            "mode     {}   host {}   library {}",
            or_dash(&h.mode),
            or_dash(&h.hostname),
            or_dash(&h.library_version)
        );
        if let (Some(a), Some(b)) = (t.first_ts_ns, t.last_ts_ns) {
            let _ = writeln!(
                o,
                "span     {} over {} events",
                human_ns(b.saturating_sub(a)),
                t.totals.events
            );
        }
        let _ = writeln!(
            o,
            "ended    {}",
            match &t.end_reason {
                Some(r) => r.clone(),
                None => "no End record: the process did not exit cleanly (crash, kill, or still running)".into(),
            }
        );
        if let Some(at) = t.totals.truncated {
            let _ = writeln!(
                o,
                "TRUNCATED: the file ends inside a record at byte {at}; analysed up to there"
            );
        }
        totals_text(&mut o, &t.totals, Some(&t.devices));
        o.push('\n');
    }
    if s.traces.len() > 1 {
        let _ = writeln!(o, "== all {} traces ==", s.traces.len());
        totals_text(&mut o, &s.totals, None);
    }
    o
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
                Category::Handle => "VMM handles",
                c => c.name(),
            };
            (n > 0).then(|| format!("{n} {what}"))
        })
        .collect();
    (parts.len() > 1).then(|| parts.join(", "))
}

fn totals_text(o: &mut String, t: &Totals, devices: Option<&BTreeMap<String, DeviceStats>>) {
    let sum = |m: &BTreeMap<String, u64>| m.values().fold(0u64, |a, &b| a.saturating_add(b));
    let (calls, failed) = (sum(&t.calls), sum(&t.failed));
    let _ = writeln!(o, "calls    {calls} ({failed} failed)");
    for (api, n) in &t.calls {
        let f = t.failed.get(api).copied().unwrap_or(0);
        if f > 0 {
            let _ = writeln!(o, "  {api:<30} {n:>10}  {f} failed");
        } else {
            let _ = writeln!(o, "  {api:<30} {n:>10}");
        }
    }
    let _ = writeln!(
        o,
        "memory   {} allocations{}, {} frees; peak {} of device memory",
        t.allocations,
        device_memory_parts(t, |c| c.started).map_or(String::new(), |p| format!(" ({p})")),
        t.frees,
        human_bytes(t.peak_live_bytes)
    );
    if t.live_at_end.count > 0 {
        let _ = writeln!(
            o,
            "LEAK?    {} device allocations ({}) still held at the end{}",
            t.live_at_end.count,
            human_bytes(t.live_at_end.bytes),
            device_memory_parts(t, |c| c.live_at_end.count)
                .map_or(String::new(), |p| format!(": {p}"))
        );
    } else {
        let _ = writeln!(o, "         no device memory held at the end");
    }
    if let Some(devs) = devices
        && (devs.len() > 1 || devs.keys().any(|k| k != "0"))
    {
        for (d, s) in devs {
            let _ = writeln!(
                o,
                "  device {d:<3} {} allocations, peak {}, {} ({}) held at the end",
                s.allocations,
                human_bytes(s.peak_live_bytes),
                s.live_at_end.count,
                human_bytes(s.live_at_end.bytes)
            );
        }
    }
    let g = t.categories.get("graph");
    if let Some(g) = g.filter(|g| g.started > 0) {
        let _ = writeln!(
            o,
            "graph    {} graph memory nodes, peak {}, {} held at the end",
            g.started,
            human_bytes(g.peak_live_bytes),
            g.live_at_end.count
        );
    }
    if t.host.allocations > 0 || t.host.registered_at_end.count > 0 {
        let _ = writeln!(
            o,
            "host     {} pinned allocations, peak {}, {} ({}) held at the end; {} registrations left",
            t.host.allocations,
            human_bytes(t.host.peak_live_bytes),
            t.host.live_at_end.count,
            human_bytes(t.host.live_at_end.bytes),
            t.host.registered_at_end.count
        );
    }
    if let Some(r) = t.categories.get("reservation").filter(|r| r.started > 0) {
        let h = &t.categories["handle"];
        let m = &t.categories["mapping"];
        let _ = writeln!(
            o,
            "vmm      {} reservations, {} handles created ({} released), {} mappings",
            r.started, h.started, h.ended, m.started
        );
    }
    if t.invalid_free_count > 0 {
        let doubles = match t.double_free_count {
            0 => String::new(),
            n => format!(" ({n} double free{})", if n == 1 { "" } else { "s" }),
        };
        let _ = writeln!(
            o,
            "INVALID  {} frees of memory that was not live{doubles}:",
            t.invalid_free_count
        );
        for f in t.invalid_frees.iter().take(10) {
            let what = if f.kind == "release" {
                format!("handle {}", hex(f.handle))
            } else {
                hex(f.ptr)
            };
            let refused = match f.result {
                0 => String::new(),
                r => format!(", refused with error {r}"),
            };
            let _ = write!(
                o,
                "  seq {} {} {what} (tid {}{refused})",
                f.seq, f.api, f.tid
            );
            match (&f.first_free, &f.allocated) {
                (Some(first), Some(a)) => {
                    let _ = writeln!(
                        o,
                        ": DOUBLE FREE, first freed at seq {} by {} (tid {}), allocated at seq {} \
                         by {} (tid {})",
                        first.seq, first.api, first.tid, a.seq, a.api, a.tid
                    );
                }
                _ => {
                    let _ = writeln!(o, ": nothing live starts there");
                }
            }
        }
    }
    let sq = &t.sequence;
    if sq.gaps > 0 || sq.late > 0 {
        let _ = writeln!(
            o,
            "order    {} sequence numbers never recorded (calls in flight when the process \
             ended), {} records too far out of order to put back{}",
            sq.gaps,
            sq.late,
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
             before is not in the trace; {} frees of such memory, not counted as invalid",
            t.frees_of_earlier_allocations
        );
    } else if t.frees_of_earlier_allocations > 0 {
        let _ = writeln!(
            o,
            "unseen   {} frees the driver accepted of memory the trace never saw allocated (an \
             entry point isolate does not record); not counted as invalid",
            t.frees_of_earlier_allocations
        );
    }
    if t.lost > 0 {
        let _ = writeln!(
            o,
            "lost     {} allocations whose free the trace never showed",
            t.lost
        );
    }
    let q = &t.quarantine;
    if q.peak_bytes > 0 || q.releases > 0 {
        let _ = writeln!(
            o,
            "quarantine peak {}, {} releases ({} early)",
            human_bytes(q.peak_bytes),
            q.releases,
            q.early_releases
        );
    }
    if t.poison_violation_count == 0 {
        let _ = writeln!(o, "stale writes: none found");
    } else {
        let _ = writeln!(
            o,
            "STALE WRITES: {} freed allocations were written to after their free:",
            t.poison_violation_count
        );
        for v in t.poison_violations.iter().take(20) {
            let _ = writeln!(
                o,
                "  {} ({} B, alloc seq {}, freed seq {} by {}): {} bytes changed from offset {}",
                hex(v.ptr),
                v.size,
                v.alloc_seq,
                v.free_seq,
                v.free_api,
                v.changed_bytes,
                v.first_offset
            );
        }
    }
    if t.stale_launch_count == 0 {
        let _ = writeln!(o, "stale launches: none found");
    } else {
        let _ = writeln!(
            o,
            "STALE LAUNCHES: {} kernels were launched with a pointer into freed memory:",
            t.stale_launch_count
        );
        for s in t.stale_launches.iter().take(20) {
            let _ = writeln!(
                o,
                "  {} param {} = {} (into {} B at {}, alloc seq {}, freed seq {})",
                s.kernel.escape_debug(),
                s.param_index,
                hex(s.ptr),
                s.alloc_size,
                hex(s.alloc_ptr),
                s.allocation,
                s.freed_at.seq
            );
            if let Some(code) = s.fault {
                let _ = writeln!(
                    o,
                    "    (unmapped guard memory; a device fault, error {code}, followed the launch)"
                );
            }
        }
    }
    for f in t.device_faults.iter().take(10) {
        let _ = writeln!(
            o,
            "FAULT    seq {}: CUDA error {} ({}), {} suspect launch(es) named above",
            f.seq,
            f.code,
            fault_name(f.code),
            f.suspects
        );
    }
    if t.stale_value_count > 0 {
        let _ = writeln!(
            o,
            "stale values: {} pointers into freed, unmapped guard memory passed to kernels that \
             never used them (no fault followed; not errors)",
            t.stale_value_count
        );
    }
    if !t.complete {
        let _ = writeln!(o, "incomplete: no End record");
    }
}

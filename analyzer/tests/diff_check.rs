mod common;

use common::*;
use isolate_analyzer::{NoProgress, diff};
use isolate_trace::{Api, Stats};

/// A small training-loop-like run at `base`; `extra` adds a leaked 8 MiB buffer in step 2.
fn run(base: u64, extra: bool, fail: bool) -> TraceBuilder {
    let mut t = TraceBuilder::new();
    t.malloc(base, 64 * MIB); // weights, kept
    for step in 0..4u64 {
        t.malloc(base + 64 * MIB, 16 * MIB);
        t.malloc(base + 80 * MIB, 4 * MIB);
        t.free(base + 80 * MIB);
        t.free(base + 64 * MIB);
        if extra && step == 2 {
            t.malloc(base + 200 * MIB, 8 * MIB);
        }
    }
    if fail {
        t.fail(Api::CudaMalloc, 1 << 40, 2);
    }
    t.end(Stats::default());
    t
}

#[test]
fn identical_runs_at_other_addresses_compare_equal() {
    let d = tempfile::tempdir().unwrap();
    let a = run(A, false, false).write(d.path(), "base.trace");
    let b = run(0x7e55_0000_0000, false, false).write(d.path(), "new.trace");
    let x = diff::diff(&a, &b, &mut NoProgress).unwrap();
    assert!(x.same, "{:#?}", x.changes);
    assert_eq!(x.base.leaks, x.new.leaks);
    assert_eq!(x.base.reuse_edges, 6);

    let o = isolate(
        d.path(),
        &[
            "check",
            "new.trace",
            "--baseline",
            "base.trace",
            "--no-new-leaks",
            "--no-violations",
            "--no-failures",
        ],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.starts_with("ok:"), "{}", o.stdout);
    let o = isolate(d.path(), &["diff", "base.trace", "new.trace"]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("no differences"), "{}", o.stdout);
}

#[test]
fn diff_flags_an_added_leak_and_a_grown_peak() {
    let d = tempfile::tempdir().unwrap();
    let a = run(A, false, false).write(d.path(), "base.trace");
    let b = run(0x7e55_0000_0000, true, true).write(d.path(), "new.trace");
    let x = diff::diff(&a, &b, &mut NoProgress).unwrap();
    assert!(!x.same);
    assert_eq!(x.new_leaks.len(), 1);
    let l = &x.new_leaks[0];
    assert_eq!(
        (l.api.as_str(), l.size, l.ordinal),
        ("cudaMalloc", 8 * MIB, 0)
    );
    let peak = x
        .changes
        .iter()
        .find(|c| c.metric == "peak_live_bytes")
        .unwrap();
    assert_eq!((peak.base, peak.new), (84 * MIB, 92 * MIB));
    let live = x
        .changes
        .iter()
        .find(|c| c.metric == "live_at_end.bytes")
        .unwrap();
    assert_eq!((live.base, live.new), (64 * MIB, 72 * MIB));
    assert!(
        x.changes
            .iter()
            .any(|c| c.metric == "failed[cudaMalloc]" && c.new == 1)
    );

    let o = isolate(d.path(), &["diff", "--json", "base.trace", "new.trace"]);
    assert_eq!(o.code, 0);
    let v = o.json();
    assert_eq!(v["same"], false);
    assert_eq!(v["new_leaks"][0]["size"], 8 * MIB);
    let o = isolate(d.path(), &["diff", "base.trace", "new.trace"]);
    assert!(
        o.stdout.contains("NEW LEAK   cudaMalloc of 8.0 MiB"),
        "{}",
        o.stdout
    );
}

#[test]
fn check_fails_on_a_regression_with_readable_reasons() {
    let d = tempfile::tempdir().unwrap();
    run(A, false, false).write(d.path(), "base.trace");
    run(0x7e55_0000_0000, true, true).write(d.path(), "new.trace");
    let o = isolate(
        d.path(),
        &[
            "check",
            "new.trace",
            "--baseline",
            "base.trace",
            "--no-new-leaks",
            "--no-failures",
        ],
    );
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "peak device memory grew 9.5% (84.0 MiB → 92.0 MiB), more than the allowed 5%",
            "allocations grew 11.1% (9 → 10), more than the allowed 10%",
            "1 new leak (never freed, not in the baseline): cudaMalloc of 8.0 MiB (8388608 B, #0 of that size)",
            "new failed calls: cudaMalloc failed 1 times (baseline 0)",
        ]
    );
    // Looser budgets pass the growth, not the leak.
    let o = isolate(
        d.path(),
        &[
            "check",
            "new.trace",
            "--baseline",
            "base.trace",
            "--max-peak-growth",
            "10%",
            "--max-alloc-growth",
            "20%",
            "--no-new-leaks",
        ],
    );
    assert_eq!(o.code, 1);
    assert_eq!(o.stdout.lines().count(), 1, "{}", o.stdout);
    let o = isolate(
        d.path(),
        &[
            "check",
            "new.trace",
            "--baseline",
            "base.trace",
            "--max-peak-growth",
            "10%",
            "--max-alloc-growth",
            "20%",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stdout);
}

#[test]
fn check_usage_and_read_errors_exit_2() {
    let d = tempfile::tempdir().unwrap();
    run(A, false, false).write(d.path(), "base.trace");
    let o = isolate(
        d.path(),
        &["check", "missing.trace", "--baseline", "base.trace"],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("missing.trace"), "{}", o.stderr);
    let o = isolate(d.path(), &["check", "base.trace"]);
    assert_eq!(o.code, 2, "no --baseline is a usage error");
    let o = isolate(
        d.path(),
        &[
            "check",
            "base.trace",
            "--baseline",
            "base.trace",
            "--max-peak-growth",
            "lots",
        ],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("not a percentage"), "{}", o.stderr);
}

#[test]
fn violations_fail_the_check() {
    let d = tempfile::tempdir().unwrap();
    run(A, false, false).write(d.path(), "base.trace");
    let mut t = run(A, false, false);
    t.free_refused(A + 999, 1); // invalid free (the driver refused it)
    t.write(d.path(), "new.trace");
    let o = isolate(
        d.path(),
        &[
            "check",
            "new.trace",
            "--baseline",
            "base.trace",
            "--no-violations",
        ],
    );
    assert_eq!(o.code, 1);
    assert_eq!(o.stdout.trim(), "violations found: 1 invalid free");
}

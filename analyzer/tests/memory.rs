//! The analyzer's memory is bounded by what is live, not by the number of allocations: peak RSS
//! of every subcommand on a trace with one live allocation at a time stays under 64 MiB, and a
//! trace four times longer does not make it grow in proportion. `export --format memory-viz`
//! keeps a window of `--max-events` entries (1,000,000 by default), which both traces pass, so
//! its pickle does not grow either.
//!
//! Not a timed test: it measures the resident set (`wait4`'s `ru_maxrss`) of each child
//! process, which does not depend on how busy the machine is. The binary is the release build
//! (`cargo build --release -p isolate-analyzer --bin isolate`, run from here; a no-op when it is
//! up to date, as in CI after its release build): the debug one would take minutes on these
//! traces, for the same memory. Without `cargo` at hand it falls back to the debug binary;
//! `ISOLATE_MEMORY_BIN=PATH` measures another binary instead (an older build, to see it fail).
//! Figures for the 10 M-event trace are in `docs/reliability.md` ("Analyzer memory").

mod common;

use common::one_live::write_one_live;
use common::rusage::measured;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The limit on every subcommand's peak RSS.
const LIMIT_KIB: i64 = 64 * 1024;
/// Events of the trace held to [`LIMIT_KIB`], and of the one four times shorter.
const BIG: u64 = 2_000_000;
const SMALL: u64 = BIG / 4;

/// The release `isolate`, or `ISOLATE_MEMORY_BIN`.
fn release_binary() -> PathBuf {
    common::memory_bin("memory")
}

/// Runs `bin ARGS` to its end; returns its exit code and peak RSS in KiB.
fn peak_rss(bin: &Path, args: &[String]) -> (i32, i64) {
    let (code, _, kib) = measured(
        Command::new(bin)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    (code, kib)
}

/// Every subcommand that reads a whole trace (a name, the arguments), outputs into `out`.
fn commands(trace: &Path, out: &Path) -> Vec<(&'static str, Vec<String>)> {
    let t = trace.to_string_lossy().into_owned();
    let o = |f: &str| out.join(f).to_string_lossy().into_owned();
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("summary", v(&["summary", &t])),
        (
            "graph --format json",
            v(&["graph", "--format", "json", &t, "-o", &o("g.json")]),
        ),
        (
            "graph --format dot",
            v(&["graph", "--format", "dot", &t, "-o", &o("g.dot")]),
        ),
        (
            "graph --format dot --full",
            v(&["graph", "--format", "dot", "--full", &t, "-o", &o("g.dot")]),
        ),
        ("graph (text)", v(&["graph", &t, "-o", &o("g.txt")])),
        ("who --json", v(&["who", "--json", "0x7f0000000000", &t])),
        ("sites", v(&["sites", &t])),
        ("report", v(&["report", &t, "-o", &o("r.html")])),
        (
            "export",
            v(&["export", "--format", "chrome-trace", &t, "-o", &o("e.json")]),
        ),
        (
            "export --format memory-viz",
            v(&["export", "--format", "memory-viz", &t, "-o", &o("m.pickle")]),
        ),
    ]
}

/// The size of the file a command's `-o` names (0 when it has none or wrote none).
fn output_size(args: &[String]) -> u64 {
    args.iter()
        .position(|a| a == "-o")
        .and_then(|i| std::fs::metadata(&args[i + 1]).ok())
        .map_or(0, |m| m.len())
}

#[test]
fn peak_rss_is_bounded_by_what_is_live() {
    let bin = release_binary();
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small.trace");
    let big = dir.path().join("big.trace");
    assert_eq!(write_one_live(&small, SMALL).unwrap(), SMALL);
    assert_eq!(write_one_live(&big, BIG).unwrap(), BIG);
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for ((name, s), (_, b)) in commands(&small, dir.path())
        .into_iter()
        .zip(commands(&big, dir.path()))
    {
        let (cs, rs) = peak_rss(&bin, &s);
        let small_out = output_size(&s);
        let (cb, rb) = peak_rss(&bin, &b);
        let big_out = output_size(&b);
        // Both traces are past the memory-viz window: the same number of entries, so about the
        // same file.
        if name == "export --format memory-viz" && big_out > small_out + small_out / 10 {
            failures.push(format!(
                "{name}: {small_out} B on {SMALL} events but {big_out} B on {BIG}: the window grows"
            ));
        }
        report.push(format!(
            "{name:<28} {SMALL} events: {:>6.1} MiB   {BIG} events: {:>6.1} MiB",
            rs as f64 / 1024.0,
            rb as f64 / 1024.0
        ));
        if cs != 0 || cb != 0 {
            failures.push(format!("{name}: exit {cs} and {cb}"));
        }
        if rb >= LIMIT_KIB {
            failures.push(format!(
                "{name}: {rb} KiB on {BIG} events, over {LIMIT_KIB} KiB"
            ));
        }
        // Proportional growth would add three times the small trace's share again; allow a
        // quarter more and 4 MiB for allocator noise.
        if rb > rs + rs / 4 + 4096 {
            failures.push(format!(
                "{name}: {rs} KiB on {SMALL} events but {rb} KiB on {BIG}: it grows with the trace"
            ));
        }
        for f in ["g.json", "g.dot", "g.txt", "r.html", "e.json", "m.pickle"] {
            let _ = std::fs::remove_file(dir.path().join(f));
        }
    }
    println!("binary: {}\n{}", bin.display(), report.join("\n"));
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        report.join("\n")
    );
}

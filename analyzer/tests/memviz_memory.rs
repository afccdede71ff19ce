//! `isolate export --format memory-viz` keeps memory bounded like the other subcommands
//! (`analyzer/tests/memory.rs`): its history is a window of `--max-events` entries (1,000,000 by
//! default), so on a trace with one live allocation at a time its peak RSS stays under 64 MiB,
//! and a trace four times longer (both past the window) does not make it grow in proportion.
//! Measured on the release binary, as `memory.rs` does (`ISOLATE_MEMORY_BIN=PATH` measures
//! another).

mod common;

use common::one_live::write_one_live;
use common::rusage::measured;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const LIMIT_KIB: i64 = 64 * 1024;
const BIG: u64 = 2_000_000;
const SMALL: u64 = BIG / 4;

/// The release `isolate`, or `ISOLATE_MEMORY_BIN`.
fn release_binary() -> PathBuf {
    common::memory_bin("memviz_memory")
}

/// Exports `trace`; returns the exit code, peak RSS in KiB and the pickle's size.
fn export(bin: &Path, trace: &Path, out: &Path) -> (i32, i64, u64) {
    let (code, _, kib) = measured(
        Command::new(bin)
            .args(["export", "--format", "memory-viz"])
            .arg(trace)
            .arg("-o")
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(out);
    (code, kib, size)
}

#[test]
fn memory_viz_peak_rss_is_bounded_by_its_window() {
    let bin = release_binary();
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small.trace");
    let big = dir.path().join("big.trace");
    assert_eq!(write_one_live(&small, SMALL).unwrap(), SMALL);
    assert_eq!(write_one_live(&big, BIG).unwrap(), BIG);
    let out = dir.path().join("s.pickle");
    let (cs, rs, ss) = export(&bin, &small, &out);
    let (cb, rb, sb) = export(&bin, &big, &out);
    let report = format!(
        "memory-viz: {SMALL} events: {:.1} MiB RSS, {ss} B pickle; {BIG} events: {:.1} MiB RSS, {sb} B pickle",
        rs as f64 / 1024.0,
        rb as f64 / 1024.0
    );
    println!("binary: {}\n{report}", bin.display());
    assert_eq!((cs, cb), (0, 0), "{report}");
    assert!(rb < LIMIT_KIB, "over {LIMIT_KIB} KiB: {report}");
    assert!(rb <= rs + rs / 4 + 4096, "grows with the trace: {report}");
    // Both traces are past the window: the same number of entries, so about the same file.
    assert!(sb <= ss + ss / 10, "{report}");
}

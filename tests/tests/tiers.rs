//! The check's tiers (`ISOLATE_CHECK=full|fast`, interposer/src/policy/tier.rs) on the
//! stand-in: planted stale writes of 4 B to 16 MiB at random offsets of freed blocks
//! (`tests/programs/planted.c`, seeded), the detection table printed and its rates asserted
//! (every write in the full tier; at least 99% from 4 KiB up in the fast one), and each
//! finding held against the pattern the tier claims: a write is found exactly when it overlaps
//! a byte the pattern covers, the finding's first offset and changed bytes are those of the
//! overlap, and the exit notes' bytes written and read are the pattern's bytes of every block
//! the program freed.

use isolate_tests::{Output, Run};
use isolate_trace::{Api, CostTopic, EndReason, Note, NoteKind, Record};
use std::collections::HashMap;

/// The fast tier's pattern, written out again from docs/isolation.md ("The fast tier"), not
/// taken from the library: blocks of at most 64 KiB whole; larger ones a 16-byte canary at
/// every multiple of 4 KiB that fits, then the bytes from max(len - 16, the last canary's end).
fn pattern(fast: bool, len: u64) -> Vec<(u64, u64)> {
    if !fast || len <= 64 << 10 {
        return vec![(0, len)];
    }
    let count = ((len - 16) >> 12) + 1;
    let mut v: Vec<(u64, u64)> = (0..count).map(|k| (k << 12, 16)).collect();
    let tail = (((count - 1) << 12) + 16).max(len - 16);
    if tail < len {
        v.push((tail, len - tail));
    }
    v
}

/// (first offset, bytes) of the write [off, off+n) that the pattern covers.
fn overlap(spans: &[(u64, u64)], off: u64, n: u64) -> Option<(u64, u64)> {
    let mut first = None;
    let mut bytes = 0;
    for &(a, m) in spans {
        let (lo, hi) = (a.max(off), (a + m).min(off + n));
        if lo < hi {
            first.get_or_insert(lo);
            bytes += hi - lo;
        }
    }
    first.map(|f| (f, bytes))
}

/// The share of offsets in [0, len - n] at which a write of `n` bytes overlaps the pattern: the
/// detection rate a uniformly random offset should give.
fn predicted(spans: &[(u64, u64)], len: u64, n: u64) -> f64 {
    // Offsets that overlap span (a, m): [a + 1 - n, a + m - 1], clipped; merged in order.
    let (mut hit, mut reach) = (0u64, 0u64);
    for &(a, m) in spans {
        let lo = (a + 1).saturating_sub(n).max(reach);
        let hi = (a + m).min(len - n + 1);
        if lo < hi {
            hit += hi - lo;
            reach = hi;
        }
    }
    hit as f64 / (len - n + 1) as f64
}

struct Trial {
    size: u64,
    block: u64,
    off: u64,
}

fn trials(out: &Output) -> Vec<Trial> {
    out.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("trial "))
        .map(|l| {
            let f: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            Trial {
                size: f[1],
                block: f[2],
                off: f[3],
            }
        })
        .collect()
}

fn cost(notes: &[Note], topic: CostTopic) -> (u64, u64) {
    let n = notes
        .iter()
        .find(|n| CostTopic::of(n) == Some(topic))
        .unwrap_or_else(|| panic!("no {topic:?} note"));
    (n.size, n.value)
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Runs the planted writes in one tier and checks every trial against the pattern; returns the
/// table's rows: (write, block, found, trials, predicted rate).
fn planted(tier: &str, trials_each: u32, big: u32) -> Vec<(u64, u64, u32, u32, f64)> {
    let fast = tier == "fast";
    let out = Run::program("planted")
        .args(["31", &trials_each.to_string(), &big.to_string()])
        .env("ISOLATE_MODE", "isolate")
        .env("ISOLATE_CHECK", tier)
        // Holds three of the largest blocks: each leaves quarantine (checked) after the write
        // through it, on the release stream, the rest at exit.
        .env("ISOLATE_QUARANTINE", "96MiB")
        .run();
    out.assert_success();
    assert!(
        out.stdout.contains("planted calls failed 0"),
        "{}",
        out.stdout
    );
    let num = |k: &str| isolate_tests::number_after(&out.stdout, k).unwrap();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let planted = trials(&out);
    let frees: Vec<u64> = t
        .events_by_seq()
        .iter()
        .filter(|e| e.api == Api::CudaFreeAsync)
        .map(|e| e.seq)
        .collect();
    assert_eq!(frees.len(), planted.len(), "one free a trial");
    let found: HashMap<u64, (u64, u64)> = t
        .violations()
        .iter()
        .map(|v| (v.free_seq, (v.first_offset, v.changed_bytes)))
        .collect();
    assert_eq!(
        found.len(),
        t.violations().len(),
        "one finding a block at most"
    );
    assert!(
        found.keys().all(|s| frees.contains(s)),
        "a finding of no trial"
    );
    let mut rows: Vec<(u64, u64, u32, u32, f64)> = Vec::new();
    let (mut written, mut freed) = (0u64, 0u64);
    for (tr, seq) in planted.iter().zip(&frees) {
        let spans = pattern(fast, tr.block);
        written += spans.iter().map(|s| s.1).sum::<u64>();
        freed += tr.block;
        let expect = overlap(&spans, tr.off, tr.size);
        assert_eq!(
            found.get(seq).copied(),
            expect,
            "{tier}: a {} write at {} of a {}-byte block",
            tr.size,
            tr.off,
            tr.block
        );
        let i = match rows.iter().position(|r| r.0 == tr.size && r.1 == tr.block) {
            Some(i) => i,
            None => {
                rows.push((
                    tr.size,
                    tr.block,
                    0,
                    0,
                    predicted(&spans, tr.block, tr.size),
                ));
                rows.len() - 1
            }
        };
        rows[i].2 += u32::from(expect.is_some());
        rows[i].3 += 1;
    }
    // The exit notes: what was freed, and the pattern's bytes written once and read once.
    let notes: Vec<Note> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Note(n) if n.kind == NoteKind::Cost => Some(n.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        cost(&notes, CostTopic::Freed),
        (freed, planted.len() as u64)
    );
    assert_eq!(cost(&notes, CostTopic::DeviceBytes), (written, written));
    // The fast tier's kernels ran (the stand-in's C versions of sparse.ptx), and only there.
    if fast {
        assert!(
            num("sparse_fills") > 0 && num("sparse_checks") > 0,
            "{}",
            out.stdout
        );
        assert!(written < freed / 50, "{written} of {freed}");
    } else {
        assert_eq!((num("sparse_fills"), num("sparse_checks")), (0, 0));
        assert_eq!(written, freed);
    }
    // The summary states the bytes and the floor they imply.
    let s = t.analyzer_summary();
    assert_eq!(
        s["device_work"]["freed_bytes"].as_u64(),
        Some(freed),
        "{s:#}"
    );
    assert_eq!(s["device_work"]["written_bytes"].as_u64(), Some(written));
    assert_eq!(s["device_work"]["read_bytes"].as_u64(), Some(written));
    // Per step: each trial is a region "trial" (the program's), so the floor is given per trial.
    let d = &s["device_work"];
    let n = planted.len() as u64;
    assert_eq!(d["steps"].as_u64(), Some(n), "{d:#}");
    assert_eq!(d["steps_from"].as_str(), Some("region \"trial\""));
    let bw = d["bandwidth"].as_u64().unwrap() as u128;
    let floor = (2 * written as u128 * 1_000_000_000 / bw) as u64;
    assert_eq!(d["floor_ns"].as_u64(), Some(floor));
    assert_eq!(d["floor_ns_per_step"].as_u64(), Some(floor / n));
    let full = (2 * freed as u128 * 1_000_000_000 / bw) as u64;
    assert_eq!(d["full_floor_ns"].as_u64(), Some(full));
    let text = std::process::Command::new(isolate_tests::analyzer_path())
        .arg("summary")
        .arg(&t.path)
        .output()
        .expect("running the analyzer");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("  floor: a step (") && l.contains(" of region \"trial\")")),
        "{text}"
    );
    rows
}

fn print_and_assert(tier: &str, rows: &[(u64, u64, u32, u32, f64)]) {
    println!("ISOLATE_CHECK={tier}: planted stale writes at random offsets of freed blocks");
    println!("| write | block | found | rate | predicted |");
    println!("|---:|---:|---:|---:|---:|");
    for &(size, block, found, n, p) in rows {
        let rate = f64::from(found) / f64::from(n);
        println!(
            "| {} | {} | {found}/{n} | {:.1}% | {:.1}% |",
            human(size),
            human(block),
            100.0 * rate,
            100.0 * p
        );
        if tier == "full" || block <= 64 << 10 {
            assert_eq!(
                found, n,
                "{tier}: every {size}-byte write in a {block}-byte block"
            );
        }
        if size >= 4096 {
            assert!(rate >= 0.99, "{tier}: {size}-byte writes found {rate}");
        }
        // The offsets are uniform: the rate is the pattern's share within 4 sigma (plus 1%).
        let sigma = (p * (1.0 - p) / f64::from(n)).sqrt();
        assert!(
            (rate - p).abs() <= 4.0 * sigma + 0.01,
            "{tier}: {size} in {block}: {rate} against {p}"
        );
    }
}

/// Every planted write is found in the full tier (the default), to the byte.
#[test]
fn the_full_tier_finds_every_planted_write() {
    let rows = planted("full", 30, 6);
    print_and_assert("full", &rows);
}

/// The fast tier finds every write of 4 KiB and more, and a shorter one as often as it overlaps
/// a canary or the block's end (every one in a block of at most 64 KiB).
#[test]
fn the_fast_tier_finds_every_write_of_4_kib_and_more() {
    let rows = planted("fast", 300, 60);
    print_and_assert("fast", &rows);
    let rate = |size: u64| {
        rows.iter()
            .find(|r| r.0 == size && r.1 > 64 << 10)
            .map(|r| f64::from(r.2) / f64::from(r.3))
            .unwrap()
    };
    assert_eq!(rate(4096), 1.0);
    assert!(
        rate(4) < 0.05,
        "a 4-byte write is found about 0.5% of the time"
    );
}

/// A malformed tier stops the program before `main`, naming the variable and its values.
#[test]
fn a_malformed_tier_names_the_variable() {
    let out = Run::program("planted")
        .args(["1", "1"])
        .env("ISOLATE_MODE", "isolate")
        .env("ISOLATE_CHECK", "quick")
        .run();
    assert_eq!(out.code(), Some(2), "{}", out.describe);
    assert!(
        out.stderr
            .contains("ISOLATE_CHECK=\"quick\" is not valid; accepted: full, fast"),
        "{}",
        out.stderr
    );
}

/// Unmapped ranges isolation holds back count as freed, and are written and read whole: in
/// programs that free through the virtual-memory API too (`rt_vmm`: expandable segments;
/// `vmm_remap`), the notes' bytes written and read equal the bytes freed and unmapped.
#[test]
fn unmapped_ranges_count_as_freed_and_are_written_and_read_whole() {
    for program in ["rt_vmm", "vmm_remap"] {
        let out = Run::program(program).env("ISOLATE_MODE", "isolate").run();
        out.assert_success();
        let t = out.only_trace();
        let notes: Vec<Note> = t
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Note(n) if n.kind == NoteKind::Cost => Some(n.clone()),
                _ => None,
            })
            .collect();
        let (freed, frees) = cost(&notes, CostTopic::Freed);
        let unmaps = t.count("cuMemUnmap");
        assert!(
            freed > 0 && frees > 0 && unmaps > 0,
            "{program}: {freed} in {frees}"
        );
        assert_eq!(
            cost(&notes, CostTopic::DeviceBytes),
            (freed, freed),
            "{program}"
        );
    }
}

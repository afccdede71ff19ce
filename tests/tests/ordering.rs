//! The stream-order check (issue 34, docs/ordering.md), on the stand-in: for every ordering
//! edge, a correct program (no finding) and a wrong one (an unordered free: freed while still
//! in use on another stream, with its three calls).
//!
//! `stream_race.c` runs one scenario per edge: X allocated with `cudaMallocAsync` on stream A
//! (4096 × the scenario's number bytes, which tells the scenarios apart in the trace), used on
//! stream B (a kernel handed X, a copy from it, a set of it), one edge made or missed, X freed
//! with `cudaFreeAsync`. The kernels do nothing, so the output is the same with and without the
//! library; what differs is that the library names the wrong ones. Two more scenarios are about
//! what a use is: X in a 16-byte struct of operands beside another allocation (PyTorch's
//! `at::detail::Array<char*, 2>`: a use) and X in a struct beside an integer (no evidence: no
//! finding).

use isolate_tests::{Output, Run, Trace};
use isolate_trace::{EndReason, FreedInUse, Record};
use std::collections::BTreeSet;

/// Each scenario of `stream_race.c`, by number, and whether it is wrong (the finding).
const SCENARIOS: &[(&str, bool)] = &[
    ("none", true),
    ("event", false),
    ("event_early", true),
    ("stream_sync", false),
    ("stream_sync_other", true),
    ("stream_query", false),
    ("stream_query_other", true),
    ("event_sync", false),
    ("event_sync_early", true),
    ("event_query", false),
    ("event_query_early", true),
    ("device_sync", false),
    ("device_sync_early", true),
    ("legacy_launch", false),
    ("legacy_launch_nb", true),
    ("legacy_free", false),
    ("legacy_free_nb", true),
    ("per_thread_legacy", false),
    ("per_thread", true),
    ("sync_copy", false),
    ("sync_copy_nb", true),
    ("copy", true),
    ("copy_event", false),
    ("set", true),
    ("set_event", false),
    ("capture", false),
    ("capture_after", true),
    ("sync_free", false),
    ("same_stream", false),
    ("host_thread", false),
    ("unifier", false),
    ("unifier_missing", true),
    ("array", true),
    ("struct_int", false),
];

fn number(name: &str) -> u64 {
    SCENARIOS.iter().position(|s| s.0 == name).unwrap() as u64 + 1
}

fn findings(t: &Trace) -> Vec<FreedInUse> {
    t.records
        .iter()
        .filter_map(|r| match r {
            Record::FreedInUse(f) => Some((**f).clone()),
            _ => None,
        })
        .collect()
}

/// The scenarios a run's findings are about, by their allocations' sizes.
fn found(t: &Trace) -> BTreeSet<&'static str> {
    findings(t)
        .iter()
        .map(|f| {
            assert_eq!(f.alloc_size % 4096, 0, "{f:?}");
            SCENARIOS[(f.alloc_size / 4096 - 1) as usize].0
        })
        .collect()
}

fn isolate(run: Run) -> Run {
    run.env("ISOLATE_MODE", "isolate")
}

fn lines(out: &Output) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| l.contains("FREED IN USE"))
        .collect()
}

/// Every scenario in one process: the wrong ones are named, each once, and nothing else; the
/// program's output is the same as without the library.
#[test]
fn every_edge_orders_its_use_and_every_missing_one_is_named() {
    let plain = Run::program("stream_race").preload(false).run();
    let out = isolate(Run::program("stream_race")).run();
    out.assert_same_as(&plain);
    assert!(out.stdout.contains("registered 1"), "{}", out.stdout);
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let wrong: BTreeSet<&str> = SCENARIOS.iter().filter(|s| s.1).map(|s| s.0).collect();
    assert_eq!(found(t), wrong, "{}", out.stderr);
    assert_eq!(findings(t).len(), wrong.len(), "once per allocation");
    assert_eq!(lines(&out).len(), wrong.len(), "{}", out.stderr);
    // Each wrong free's check and release waited for the stream of its use (isolate mode adds
    // no use-after-free of its own by giving the memory back while that stream may read it),
    // except the per-thread default stream's use, which another thread cannot record on.
    let note = t
        .records
        .iter()
        .find_map(|r| match r {
            Record::Note(n) if n.text.starts_with("stream order:") => Some(n.text.clone()),
            _ => None,
        })
        .expect("the stream order note");
    let waited = wrong.len() - usize::from(wrong.contains("per_thread"));
    assert!(
        note.contains(&format!(
            "{} freed while in use on another stream ({waited} of them released only after",
            wrong.len()
        )),
        "{note}"
    );
    // The analyzer counts them, with the rest of the trace clean.
    let s = t.assert_no_false_findings();
    assert_eq!(s["freed_in_use_count"].as_u64(), Some(wrong.len() as u64));
    assert_eq!(s["stale_launch_count"].as_u64(), Some(0));
    assert_eq!(s["poison_violation_count"].as_u64(), Some(0));
    // The summary shows the check's line (it ran, what it saw, the releases that waited).
    assert!(
        s["library_cost"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str() == Some(note.as_str())),
        "{:#}",
        s["library_cost"]
    );
}

/// The test-only pause (`isolate_test_order_pause`, for timing steps with and without the
/// check in one process) hides what happens while it is set and nothing after: the first
/// scenario, run paused, is not named; the second, after the resume, is. Outside isolate mode
/// the call says the check does not run.
#[test]
fn a_paused_check_hides_only_what_ran_while_paused() {
    let out = isolate(Run::program("stream_race").args(["none", "copy"]))
        .env("STREAM_RACE_PAUSE", "1")
        .run();
    out.assert_success();
    assert!(
        out.stdout.contains("pause 0") && out.stdout.contains("resume 0"),
        "{}",
        out.stdout
    );
    assert_eq!(found(out.only_trace()), ["copy"].into(), "{}", out.stderr);
    let log = Run::program("stream_race")
        .args(["none"])
        .env("ISOLATE_MODE", "log")
        .env("STREAM_RACE_PAUSE", "1")
        .run();
    assert!(log.stdout.contains("pause -1"), "{}", log.stdout);
}

/// Each scenario alone, in its own process: a correct program has no finding at all, a wrong
/// one exactly its own (no scenario leans on another's edges).
#[test]
fn each_scenario_alone_is_judged_the_same() {
    for &(name, wrong) in SCENARIOS {
        let out = isolate(Run::program("stream_race").arg(name)).run();
        out.assert_success();
        let t = out.only_trace();
        let want: BTreeSet<&str> = if wrong {
            [name].into()
        } else {
            BTreeSet::new()
        };
        assert_eq!(found(t), want, "{name}: {}", out.stderr);
    }
}

/// The finding names its three calls: the allocation (its event and stack), the free (its API,
/// stream, event and stack) and the use (the kernel, copy or set, its stream, the event before
/// it and, on another stream than the allocation's, its stack), and the missing edge; the
/// stderr line says what to do; the summary text names the three sites by their code.
#[test]
fn the_finding_names_the_allocation_the_free_and_the_use() {
    let out =
        isolate(Run::program("stream_race").args(["none", "copy", "set", "per_thread"])).run();
    let t = out.only_trace();
    let all = findings(t);
    assert_eq!(all.len(), 4, "{}", out.stderr);
    let events = t.events_by_seq();
    for f in &all {
        let alloc = events
            .iter()
            .find(|e| e.seq == f.alloc_seq)
            .expect("the allocation");
        assert_eq!(alloc.api.name(), "cudaMallocAsync");
        assert_eq!((alloc.ptr, alloc.size), (f.alloc_ptr, f.alloc_size));
        let free = events
            .iter()
            .find(|e| e.seq == f.free_seq)
            .expect("the free");
        assert_eq!(free.api.name(), "cudaFreeAsync");
        assert_eq!(free.ptr, f.alloc_ptr);
        assert_eq!(free.stream, f.free_stream);
        assert!(
            f.alloc_seq <= f.use_after_seq && f.use_after_seq < f.free_seq,
            "{f:?}"
        );
        assert!(
            f.alloc_stack != 0 && f.free_stack != 0 && f.use_stack != 0,
            "{f:?}"
        );
        assert_eq!(free.stack, f.free_stack);
        assert_ne!(f.use_stream, f.free_stream);
        assert!(f.seen_tick < f.use_tick, "{f:?}");
    }
    let by = |n: &str| {
        all.iter()
            .find(|f| f.alloc_size == 4096 * number(n))
            .unwrap()
    };
    assert!(by("none").use_kernel && by("none").use_name == "k_use");
    assert_eq!(by("copy").use_name, "cuMemcpyDtoHAsync_v2");
    assert_eq!(by("set").use_name, "cuMemsetD8Async");
    assert!(!by("set").use_kernel);
    assert_eq!(
        by("per_thread").use_stream,
        2,
        "the per-thread default stream"
    );
    for l in lines(&out) {
        assert!(
            l.contains("x.record_stream(s)") && l.contains("wait_stream(s)"),
            "{l}"
        );
    }
    let text = std::process::Command::new(isolate_tests::analyzer_path())
        .args(["summary"])
        .arg(&t.path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("UNORDERED FREE") && l.contains("kernel k_use"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("cudaFreeAsync") && line.contains("record_stream"),
        "{line}"
    );
    for site in ["freed at", "launched at", "allocated at"] {
        assert!(text.contains(site), "{site}: {text}");
    }
    assert!(
        text.contains("stream_race.c:"),
        "the sites by file and line: {text}"
    );
}

/// `ISOLATE_TEST_ORDER=off` turns the check off (to measure its cost); log mode cannot make it
/// (no launches pass through the library there).
#[test]
fn the_check_is_off_when_asked_and_in_log_mode() {
    let off = isolate(Run::program("stream_race").arg("none"))
        .env("ISOLATE_TEST_ORDER", "off")
        .run();
    assert!(findings(off.only_trace()).is_empty(), "{}", off.stderr);
    assert!(lines(&off).is_empty());
    let log = Run::program("stream_race")
        .arg("none")
        .env("ISOLATE_MODE", "log")
        .run();
    assert!(findings(log.only_trace()).is_empty(), "{}", log.stderr);
}

/// The stream hooks the check's edges come through are handed out for it, not only for the
/// deferred poisons: with a poison at each free (`ISOLATE_TEST_POISON_BATCH=off`) the same
/// scenarios are wrong; in guard mode (isolate mode with the launch check) too, but for the
/// wrong copy and set, whose late write into the freed, unmapped memory guard mode turns into
/// the fault it is meant to be (the stand-in's device is the host: a SIGSEGV).
#[test]
fn the_same_with_poisons_at_each_free_and_in_guard_mode() {
    let all: Vec<&str> = SCENARIOS.iter().map(|s| s.0).collect();
    let unfaulting: Vec<&str> = all
        .iter()
        .copied()
        .filter(|n| !matches!(*n, "copy" | "set"))
        .collect();
    for (k, v, names) in [
        ("ISOLATE_TEST_POISON_BATCH", "off", &all),
        ("ISOLATE_GUARD", "on", &unfaulting),
    ] {
        let wrong: BTreeSet<&str> = SCENARIOS
            .iter()
            .filter(|s| s.1 && names.contains(&s.0))
            .map(|s| s.0)
            .collect();
        let out = isolate(Run::program("stream_race").args(names.iter().copied()))
            .env(k, v)
            .run();
        out.assert_success();
        assert_eq!(found(out.only_trace()), wrong, "{k}={v}: {}", out.stderr);
    }
    let faulted = isolate(Run::program("stream_race").arg("set"))
        .env("ISOLATE_GUARD", "on")
        .run();
    assert_eq!(faulted.signal(), Some(11), "{}", faulted.stderr);
    assert_eq!(
        lines(&faulted).len(),
        1,
        "named at the free, before the fault: {}",
        faulted.stderr
    );
}

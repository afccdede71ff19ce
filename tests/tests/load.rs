//! Load: 16 threads × 62,500 alloc/free pairs (1,000,000 pairs), half through the runtime and
//! half through the driver path a static runtime uses. Every event is there, sequence numbers
//! are unique, each thread's events are in its own order, and nothing deadlocks.

use isolate_tests::Run;
use isolate_trace::{EndReason, Kind};
use std::collections::HashMap;
use std::time::Duration;

fn elapsed_line(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.starts_with("elapsed"))
        .unwrap_or("?")
        .to_string()
}

#[test]
fn million_pairs_from_16_threads() {
    const THREADS: u64 = 16;
    const PAIRS: u64 = 62_500;
    let run = Run::program("threads")
        .args([THREADS.to_string(), PAIRS.to_string()])
        .timeout(Duration::from_secs(240));
    let plain = run.clone().preload(false).run();
    let out = run.run();
    out.assert_same_as(&plain);
    out.assert_success();
    eprintln!(
        "threads {THREADS} {PAIRS}: without preload {}; with: {} ({:.1} s wall)",
        elapsed_line(&plain.stderr),
        elapsed_line(&out.stderr),
        out.elapsed.as_secs_f64()
    );
    assert!(
        out.stdout
            .contains("runtime cudaMalloc 500000 cudaFree 500000"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("driver cuMemAlloc_v2 500000 cuMemFree_v2 500000"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("failures 0"));

    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let events = t.events();
    let c = t.counts();
    assert_eq!(c.get("cudaMalloc"), Some(&500_000), "{c:?}");
    assert_eq!(
        c.get("cudaFree"),
        Some(&500_001),
        "{c:?} (one cudaFree(NULL) in main)"
    );
    assert_eq!(c.get("cuMemAlloc_v2"), Some(&500_000), "{c:?}");
    assert_eq!(c.get("cuMemFree_v2"), Some(&500_000), "{c:?}");
    assert_eq!(events.len(), 2_000_001);
    assert_eq!(
        t.end().unwrap().stats.events,
        2_000_001,
        "the End record counts every event accepted"
    );

    // Sequence numbers: unique (and, with nothing else recorded in log mode, 0..N).
    let mut seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    seqs.sort_unstable();
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(
            *s, i as u64,
            "sequence numbers are 0..N without gaps or repeats"
        );
    }

    // Per thread: file order is sequence order, alloc and free alternate, a free frees what
    // the thread's previous allocation handed out, and each thread went through one layer.
    let mut per: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        per.entry(e.tid).or_default().push(i);
    }
    assert_eq!(per.len(), THREADS as usize + 1, "16 workers and main");
    let mut runtime_threads = 0;
    for (tid, idx) in &per {
        if *tid == out.pid {
            assert_eq!(idx.len(), 1);
            continue;
        }
        assert_eq!(idx.len() as u64, 2 * PAIRS, "thread {tid}");
        let first = &events[idx[0]];
        runtime_threads += first.api.is_runtime() as u32;
        for (k, &i) in idx.iter().enumerate() {
            let e = &events[i];
            assert!(e.ok(), "{e:?}");
            assert_eq!(e.api.is_runtime(), first.api.is_runtime(), "{e:?}");
            if k > 0 {
                assert!(
                    e.seq > events[idx[k - 1]].seq,
                    "thread {tid} out of order at {k}"
                );
            }
            if k % 2 == 0 {
                assert_eq!(e.api.kind(), Kind::Alloc, "thread {tid} event {k}: {e:?}");
            } else {
                assert_eq!(e.api.kind(), Kind::Free, "thread {tid} event {k}: {e:?}");
                assert_eq!(e.ptr, events[idx[k - 1]].ptr, "thread {tid} event {k}");
            }
        }
    }
    assert_eq!(runtime_threads, 8);

    // The analysis reads them in sequence order: no free of a correct program is invalid.
    let s = t.assert_no_false_findings();
    assert_eq!(s["allocations"].as_u64(), Some(1_000_000), "{s:#}");
    assert_eq!(s["frees"].as_u64(), Some(1_000_000), "{s:#}");
}

/// The analysis puts the trace back in sequence order. Threads take a free's number before the
/// real call and an allocation's after, so the thread that gets a freed address again always
/// has the higher number, but it can reach the writer first: in file order its allocation lands
/// on a live allocation and the free on nothing. 8 threads on a 2-core machine in log and
/// isolate mode: the file really is out of order, and the analyzer reports nothing wrong.
#[test]
fn eight_threads_out_of_file_order_report_no_invalid_frees() {
    for (mode, pairs) in [("log", 250_000u64), ("isolate", 25_000)] {
        let out = Run::program("threads")
            .args(["8".to_string(), pairs.to_string()])
            .env("ISOLATE_MODE", mode)
            .timeout(Duration::from_secs(240))
            .run();
        out.assert_success();
        assert!(out.stdout.contains("failures 0"), "{}", out.stdout);
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        let disorder = t.out_of_order();
        let s = t.assert_no_false_findings();
        eprintln!(
            "threads 8 {pairs} ({mode}): {disorder} records out of sequence order in the file, \
             0 invalid frees, 0 lost"
        );
        assert!(
            disorder > 0,
            "{mode}: the file came out in sequence order; the test shows nothing"
        );
        assert_eq!(
            s["sequence"]["reordered"].as_u64(),
            Some(disorder as u64),
            "the analyzer counts the same records out of order as the test"
        );
        assert_eq!(s["allocations"].as_u64(), Some(8 * pairs), "{s:#}");
        assert_eq!(s["frees"].as_u64(), Some(8 * pairs), "{s:#}");
        assert_eq!(s["sequence"]["gaps"].as_u64(), Some(0), "{s:#}");
    }
}

/// The harness itself: a program that never ends is killed by the watchdog, and the test fails.
#[test]
#[should_panic(expected = "watchdog")]
fn watchdog_kills_a_program_that_never_ends() {
    Run::program("forker")
        .arg("sigkill")
        .timeout(Duration::from_millis(500))
        .run();
}

fn elapsed_secs(stderr: &str) -> f64 {
    let line = elapsed_line(stderr);
    line.strip_prefix("elapsed ")
        .and_then(|r| r.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed line in {stderr}"))
}

/// Hooks never wait for the writer while there is room in its queue: with the writer blocked
/// for 3 s (an internal test hook standing for a `write(2)` stuck on a hung file system), 1,600
/// alloc/free pairs from 4 threads (3,200 events, under the queue's 4,096) finish at full speed;
/// a hook that took a lock the writer holds, or waited for it, would take the 3 s. With more
/// events than the queue holds the hooks wait for room (counted as queue waits) and go on when
/// the writer does; in both cases every event reaches the trace.
#[test]
fn hooks_do_not_wait_for_a_blocked_writer() {
    const STALL_MS: u64 = 3000;
    let run = |pairs: u64| {
        Run::program("threads")
            .args(["4".to_string(), pairs.to_string()])
            .env("ISOLATE_TEST_WRITER_STALL_MS", STALL_MS.to_string())
            .timeout(Duration::from_secs(60))
            .run()
    };
    let small = run(400);
    small.assert_success();
    let secs = elapsed_secs(&small.stderr);
    assert!(
        secs < 1.0,
        "3,200 events with the writer blocked took {secs:.3} s: a hook waited for the writer"
    );
    assert!(
        small.elapsed >= Duration::from_millis(STALL_MS),
        "the writer was not blocked ({:?}): the test proves nothing",
        small.elapsed
    );
    let t = small.only_trace();
    t.assert_complete(EndReason::Exit);
    let c = t.counts();
    assert_eq!(c.get("cudaMalloc"), Some(&800), "{c:?}");
    assert_eq!(c.get("cuMemAlloc_v2"), Some(&800), "{c:?}");
    assert_eq!(t.end().unwrap().stats.queue_waits, 0);
    t.assert_no_false_findings();

    let big = run(2_500); // 20,000 events: the queue fills, hooks wait for room
    big.assert_success();
    let secs = elapsed_secs(&big.stderr);
    assert!(
        secs >= (STALL_MS as f64 / 1000.0) * 0.8,
        "20,000 events finished in {secs:.3} s while the writer was blocked: were events dropped?"
    );
    let t = big.only_trace();
    t.assert_complete(EndReason::Exit);
    let c = t.counts();
    assert_eq!(c.get("cudaMalloc"), Some(&5_000), "{c:?}");
    assert_eq!(c.get("cuMemFree_v2"), Some(&5_000), "{c:?}");
    assert!(t.end().unwrap().stats.queue_waits > 0);
    t.assert_no_false_findings();
    eprintln!(
        "writer blocked {STALL_MS} ms: 3,200 events took {:.3} s in the program, 20,000 took {secs:.3} s",
        elapsed_secs(&small.stderr)
    );
}

//! The host process first (issue 33): programs that behaved differently under the library
//! (`tests/programs/host_first.c`, one scenario per run). Each runs without the library first;
//! the run under it must print the same and end the same way, and the trace must say what
//! happened.

use isolate_tests::{Output, Run, Trace};
use isolate_trace::{EndReason, NoteKind, Record};

fn scenario(name: &str) -> Run {
    Run::program("host_first").arg(name)
}

/// Runs `run` without the library, then under it with each of `modes` (`ISOLATE_MODE`); every
/// traced run must print what the plain one printed and end the same way. Returns the traced
/// runs.
fn against_plain(run: Run, modes: &[&str]) -> Vec<Output> {
    let plain = run.clone().preload(false).run();
    plain.assert_success();
    modes
        .iter()
        .map(|m| {
            let out = run.clone().env("ISOLATE_MODE", *m).run();
            out.assert_same_as(&plain);
            out
        })
        .collect()
}

fn complete(out: &Output) -> &Trace {
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    t
}

fn violations(t: &Trace) -> usize {
    t.violations().len()
}

// ------------------------------------------------------------------- (2) a fresh thread's free

/// The fresh threads' calls all succeeded (`line` in the output), and no event of theirs asked
/// `cuCtxGetDevice` while no context was current (it fails: a line in the driver's error log,
/// CUDA_LOG_FILE; bad_calls.rs shows the calls that used to).
fn none_failed_and_no_context_asked(out: &Output, line: &str) {
    assert!(
        out.stdout.contains(line),
        "{}:\n{}",
        out.describe,
        out.stdout
    );
    assert_eq!(
        isolate_tests::number_after(&out.stderr, "standin_ctx_device_errors"),
        Some(0),
        "{}: {}",
        out.describe,
        out.stderr
    );
}

/// A `cudaFree` that is its thread's first CUDA call: the runtime makes the device's primary
/// context current on that thread before it frees; the library's own driver calls (the poison,
/// the synchronize) must find that context too. Before the fix every such free returned 201 in
/// isolate mode and the memory was never freed.
#[test]
fn a_free_that_is_a_threads_first_call_succeeds() {
    for s in ["fresh_free", "fresh_free_async"] {
        for out in against_plain(scenario(s).arg("64"), &["log", "isolate"]) {
            let t = complete(&out);
            let frees: Vec<_> = t
                .events()
                .into_iter()
                .filter(|e| e.api.kind() == isolate_trace::Kind::Free)
                .collect();
            assert_eq!(frees.len(), 65, "{}: 64 frees and the last", out.describe);
            assert!(frees.iter().all(|e| e.result == 0), "{}", out.describe);
            assert_eq!(
                violations(t),
                0,
                "{}: no stale write was made",
                out.describe
            );
            none_failed_and_no_context_asked(&out, ": 0 of 64 failed");
        }
    }
}

/// An allocation that is its thread's first CUDA call (no context current when it is made:
/// the runtime makes the device's primary context current, then allocates): it succeeds, its
/// event names the device, and its memset and free work, in every mode. The allocation keeps
/// the context it asked before the call only where one was current (an allocation call never
/// changes a current context); here none was, and it asks again after.
#[test]
fn an_allocation_that_is_a_threads_first_call_names_its_device() {
    for s in ["fresh_alloc", "fresh_alloc_async"] {
        for out in against_plain(scenario(s).arg("32"), &["log", "isolate"]) {
            let t = complete(&out);
            let allocs: Vec<_> = t
                .events()
                .into_iter()
                .filter(|e| e.api.kind() == isolate_trace::Kind::Alloc)
                .collect();
            assert_eq!(allocs.len(), 32, "{}: one a thread", out.describe);
            assert!(
                allocs.iter().all(|e| e.result == 0 && e.device == 0),
                "{}: {:?}",
                out.describe,
                allocs
                    .iter()
                    .map(|e| (e.result, e.device))
                    .collect::<Vec<_>>()
            );
            assert_eq!(violations(t), 0, "{}", out.describe);
            none_failed_and_no_context_asked(&out, "from a fresh thread: 0 of 32 failed");
        }
    }
}

// ----------------------------------------------------- (3) stream-ordered allocations at the limit

/// 48 MiB of a 64 MiB device, allocated and freed in stream order 200 times by one thread, and
/// 400 times by 2 and by 4 threads sharing it: never short of memory without the library,
/// and never in isolate mode (the retry waits for what was given back on the release stream,
/// trims the pool, and waits for frees in progress on other threads). Before the fix: 1 ok,
/// 199 failed with one thread.
#[test]
fn stream_ordered_allocations_near_the_limit_never_fail_in_isolate_mode() {
    for (threads, total) in [("1", 200), ("2", 400), ("4", 400)] {
        let rounds = (total / threads.parse::<i32>().unwrap()).to_string();
        let run = scenario("async_limit")
            .args([rounds.as_str(), threads])
            .env("STANDIN_MEM_BYTES", "64M");
        for out in against_plain(run, &["isolate"]) {
            assert!(
                out.stdout.contains(&format!("{total} ok, 0 failed")),
                "{}:\n{}",
                out.describe,
                out.stdout
            );
            complete(&out);
        }
    }
}

// ------------------------------------------------------------- (9) a probe keeps the quarantine

/// A `cudaMalloc(1 << 40)` no release could satisfy releases nothing: the freed 1 MiB stays in
/// quarantine, so the write through its stale pointer is found. Before the fix the probe
/// emptied the quarantine and the write went unreported.
#[test]
fn a_failed_oversized_allocation_leaves_the_quarantine_alone() {
    let out = against_plain(scenario("probe"), &["isolate"]).remove(0);
    let t = complete(&out);
    assert_eq!(
        violations(t),
        1,
        "{}: the stale write\n{}",
        out.describe,
        out.stderr
    );
    let early: Vec<_> = t
        .records
        .iter()
        .filter(|r| matches!(r, Record::Note(n) if n.kind == NoteKind::OomRetry))
        .collect();
    assert!(
        early.is_empty(),
        "{}: nothing released: {early:?}",
        out.describe
    );
}

// ------------------------------------------------------------------------ (5) small stacks

/// Threads with 16 and 32 KiB stacks (glibc's minimum is 16 KiB) make CUDA calls in every mode
/// and stack setting, a kernel launch among them (isolate mode's launch check makes the thread's
/// cache of layouts there: on the heap, never a 24 KiB array on that stack). Before the fix:
/// SIGSEGV at the first call, even with `ISOLATE_STACKS=none`.
#[test]
fn threads_with_small_stacks_make_cuda_calls() {
    for kib in ["16", "32"] {
        for stacks in ["none", "native"] {
            let run = scenario("small_stack")
                .arg(kib)
                .env("ISOLATE_STACKS", stacks);
            for out in against_plain(run, &["log", "isolate"]) {
                let t = complete(&out);
                // The thread's events are there, without a stack where it had no room for one.
                assert_eq!(t.count("cudaMalloc"), 2, "{}", out.describe);
                let left_out = t.records.iter().any(|r| {
                    matches!(r, Record::Note(n) if n.text.contains("left out, their threads' stacks"))
                });
                assert_eq!(left_out, stacks == "native", "{}", out.describe);
            }
        }
    }
}

// ------------------------------------------------------------- (11) descriptors and stderr

/// Under a low soft limit on descriptors, the program opens as many files as it does without
/// the library: the trace's descriptor lives above the soft limit. Before the fix: one fewer.
#[test]
fn the_trace_costs_no_descriptor_under_a_low_limit() {
    for out in against_plain(scenario("nofile").arg("40"), &["log", "isolate"]) {
        complete(&out);
    }
}

/// The descriptor table is grown before `main` to hold the trace's high descriptor, so that the
/// first recorded call does not grow it: grown then, with the writer's thread running, the
/// kernel waited an RCU grace period in that `fcntl` (9-15 ms on this CI machine) while the
/// program's thread waited for the trace to open. Before the fix the table was 64 at `main`
/// and grew at the first call (`fdsize_after` > `fdsize_before`).
#[test]
fn the_descriptor_table_is_grown_before_main_not_at_the_first_call() {
    let number = |out: &Output, key: &str| {
        isolate_tests::number_after(&out.stderr, key)
            .unwrap_or_else(|| panic!("{key} in {}", out.stderr))
    };
    let plain = scenario("fdsize").preload(false).run();
    plain.assert_success();
    let plain_size = number(&plain, "fdsize_before");
    for out in against_plain(scenario("fdsize"), &["log", "isolate"]) {
        complete(&out);
        let (before, after) = (number(&out, "fdsize_before"), number(&out, "fdsize_after"));
        assert!(
            before > plain_size && before >= 1000,
            "{}: {before} at main, {plain_size} without the library",
            out.describe
        );
        assert_eq!(before, after, "{}: grown at the first call", out.describe);
    }
    // Off: the library changes nothing, the table included.
    let off = scenario("fdsize").env("ISOLATE_MODE", "off").run();
    off.assert_same_as(&plain);
    assert_eq!(number(&off, "fdsize_before"), plain_size);
}

/// With stderr closed and its number reused for the program's file, the live `STALE WRITE` line
/// is not written into that file (the finding is in the trace). Before the fix the file held it.
#[test]
fn a_live_finding_is_never_written_into_the_programs_file() {
    let run = scenario("stderr_reuse").env("ISOLATE_QUARANTINE", "1MiB");
    let plain = run.clone().preload(false).run();
    plain.assert_success();
    let want = std::fs::read_to_string(plain.dir.path().join("program.txt")).unwrap();
    let out = run.env("ISOLATE_MODE", "isolate").run();
    out.assert_same_as(&plain);
    let got = std::fs::read_to_string(out.dir.path().join("program.txt")).unwrap();
    assert_eq!(got, want, "{}: the program's file", out.describe);
    assert_eq!(violations(complete(&out)), 1, "{}", out.describe);
}

// ------------------------------------------------- (11) a library loaded where another was

/// The module a stack's frame at `pc` lies in: the last `Module` record before the `Stack`
/// record that covers `pc` (the library writes each stack after the modules it names).
fn module_of(t: &Trace, stack: u32, pc: u64) -> Option<String> {
    let mut latest: Vec<(u64, u64, String)> = Vec::new();
    for r in &t.records {
        match r {
            Record::Module(m) => {
                latest.retain(|(s, e, _)| !(*s < m.end && m.start < *e));
                latest.push((m.start, m.end, m.path.clone()));
            }
            Record::Stack(s) if s.id == stack => {
                return latest
                    .iter()
                    .find(|(s, e, _)| *s <= pc && pc < *e)
                    .map(|(_, _, p)| p.clone());
            }
            _ => {}
        }
    }
    None
}

/// libsamebase_b.so loaded where libsamebase_a.so was (the same code at the same addresses):
/// each library's allocation has a stack in its own module. Before the fix B's allocation
/// got A's stack (the same return addresses, interned once; the module keyed by its range).
#[test]
fn a_library_loaded_where_another_was_gets_its_own_stacks() {
    let out = against_plain(
        scenario("samebase").env("ISOLATE_STACKS", "native"),
        &["log"],
    )
    .remove(0);
    let t = complete(&out);
    t.assert_events(&out.expected_all());
    let allocs: Vec<_> = t
        .events_by_seq()
        .into_iter()
        .filter(|e| e.api == isolate_trace::Api::CudaMalloc)
        .collect();
    assert_eq!(allocs.len(), 2, "{}", out.describe);
    let inner = |e: &isolate_trace::Event| {
        let st = t
            .records
            .iter()
            .find_map(|r| match r {
                Record::Stack(s) if s.id == e.stack => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("event {} has no stack", e.seq));
        match st.frames.first() {
            Some(isolate_trace::Frame::Native(pc)) => (*pc, module_of(t, st.id, *pc)),
            f => panic!("stack {} starts with {f:?}", st.id),
        }
    };
    let (pc_a, mod_a) = inner(&allocs[0]);
    let (pc_b, mod_b) = inner(&allocs[1]);
    assert_eq!(
        pc_a, pc_b,
        "{}: loaded at the same address (the premise)",
        out.describe
    );
    assert!(
        mod_a
            .as_deref()
            .is_some_and(|p| p.ends_with("/libsamebase_a.so")),
        "{mod_a:?}"
    );
    assert!(
        mod_b
            .as_deref()
            .is_some_and(|p| p.ends_with("/libsamebase_b.so")),
        "{mod_b:?}"
    );
}

// --------------------------------------------------- (11) a long quarantine trimmed in steps

/// A 256 MiB quarantine of 768-byte blocks (~350,000) going over its budget: the trim to 80%
/// (~70,000 entries) is spread over the frees that follow, 256 entries each, so no one free
/// takes long. Before the fix one `cudaFree` took 1.2-1.4 s here (the whole trim); after,
/// ~10-50 ms on the stand-in's debug build, loaded machine.
#[test]
fn no_free_waits_for_a_whole_trim() {
    let run = scenario("trim")
        .args(["360000", "768"])
        .env("ISOLATE_QUARANTINE", "256MiB")
        .env("ISOLATE_STACKS", "none")
        .timeout(std::time::Duration::from_secs(120));
    let out = against_plain(run, &["isolate"]).remove(0);
    let t = complete(&out);
    let longest: f64 = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("longest free: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}: no 'longest free' line:\n{}", out.describe, out.stderr));
    let releases = t.end().expect("End").stats.quarantine_releases;
    assert!(
        releases > 60_000,
        "{}: the trim ran: {releases} releases",
        out.describe
    );
    assert!(
        longest < 0.3,
        "{}: the longest free took {longest} s",
        out.describe
    );
}

// ------------------------------------------------- (12) a free on a stream the program destroyed

/// PyTorch's stream-ordered backend frees a tensor on its creation stream, which the program
/// (CuPy) may have destroyed first. Without the library the free fails (the program sees the
/// error, the memory stays allocated); in isolate mode the library must not queue its poison on
/// the destroyed stream either: the same error, the memory still live (a later `cudaFree` frees
/// it), no finding. A new stream made afterwards (which may get the old handle) works as usual.
/// Before the fix the free "succeeded" into quarantine, the poison queued on the dead stream never
/// ran, and the exit check called the unpoisoned bytes a stale write (on the H100: a false
/// STALE WRITE of 4 MiB in isolate mode, SIGSEGV with the order check off).
#[test]
fn a_free_on_a_destroyed_stream_fails_as_without_the_library() {
    for out in against_plain(scenario("destroyed_stream"), &["isolate", "log"]) {
        assert!(
            out.stdout
                .contains("cudaFreeAsync on the destroyed stream 1"),
            "{}:\n{}",
            out.describe,
            out.stdout
        );
        assert!(out.stdout.contains("cudaFree 0"), "{}", out.stdout);
        let t = complete(&out);
        assert_eq!(violations(t), 0, "{}: {}", out.describe, out.stderr);
        let s = t.analyzer_summary();
        assert_eq!(s["findings"], 0, "{s:#}");
    }
}

//! The host process first (issue 33): programs that behaved differently under the library
//! (`tests/programs/host_first.c`, one scenario per run). Each runs without the library first;
//! the run under it must print the same and end the same way, and the trace must say what
//! happened.

use isolate_tests::{Output, Run, Trace};
use isolate_trace::{EndReason, Record};

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

// ------------------------------------------------------------------------ (5) small stacks

/// Threads with 16 and 32 KiB stacks (glibc's minimum is 16 KiB) make CUDA calls in every mode
/// and stack setting. Before the fix: SIGSEGV at the first call, even with `ISOLATE_STACKS=none`.
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

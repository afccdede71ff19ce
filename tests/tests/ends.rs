//! The ends of a process other than `exit` (issue 33, items 8 and 10), with
//! `tests/programs/ends.c`: each case runs the program without the preload first, then in log
//! and isolate mode, and requires the same stdout and the same end.
//!
//! - A stale write made before `execve`, `raise(SIGTERM)`, `abort()` or a SIGTERM from outside
//!   (what `timeout` sends) is reported: isolate mode's quarantine check runs at those ends too,
//!   not only at exit.
//! - An `execv` that fails leaves the trace going: the program's later events are in it, and it
//!   ends with `End(exit)`.
//! - `fexecve`, `execveat`, `syscall(SYS_execve)`, `syscall(SYS_execveat)`, `quick_exit` (and its
//!   `at_quick_exit` handlers) and `syscall(SYS_exit_group)` leave a complete trace.
//! - A second `exit` while the first one runs the `atexit` handlers behaves as the glibc the
//!   program runs on makes it (issue 33, item 11).

use isolate_tests::{Output, Run, Trace};
use isolate_trace::EndReason;
use std::time::Duration;

const MODES: [&str; 2] = ["log", "isolate"];

fn ends<I: IntoIterator<Item = S>, S: Into<String>>(args: I) -> Run {
    Run::program("ends").args(args)
}

/// `run` without the preload, then in each mode: the same stdout, the same end.
fn runs(run: &Run) -> (Output, Vec<(&'static str, Output)>) {
    let plain = run.clone().preload(false).run();
    let traced = MODES
        .iter()
        .map(|m| {
            let out = run.clone().env("ISOLATE_MODE", *m).run();
            out.assert_same_as(&plain);
            (*m, out)
        })
        .collect();
    (plain, traced)
}

fn has_line(out: &Output, line: &str) {
    assert!(
        out.stdout.lines().any(|l| l == line),
        "{}: no line {line:?} in:\n{}\nstderr:\n{}",
        out.describe,
        out.stdout,
        out.stderr
    );
}

/// The run's one trace, complete, ended for `reason`, with one event per `ev` line.
fn one_complete_trace(out: &Output, reason: EndReason) -> &Trace {
    let t = out.only_trace();
    t.assert_complete(reason);
    out.assert_trace_matches(t, None);
    t
}

/// Isolate mode: exactly the stale write through A (24 bytes from offset 1000), in the trace
/// and as one `STALE WRITE` line; log mode: nothing.
fn the_stale_write_is_reported(mode: &str, out: &Output, t: &Trace) {
    let v = t.violations();
    if mode == "log" {
        assert!(v.is_empty(), "log mode checks nothing: {v:?}");
        return;
    }
    let a = t.events_by_seq()[0];
    assert_eq!(
        v.len(),
        1,
        "{}: the stale write through A: {v:#?}\nstderr:\n{}",
        out.describe,
        out.stderr
    );
    assert_eq!(
        (v[0].ptr, v[0].first_offset, v[0].changed_bytes),
        (a.ptr, 1000, 24),
        "{:?}",
        v[0]
    );
    assert_eq!(
        out.stderr.matches("isolate: STALE WRITE").count(),
        1,
        "{}",
        out.stderr
    );
}

// ------------------------------------------------------------------ (8) findings at other ends

#[test]
fn a_stale_write_before_exit_is_reported() {
    // The baseline: what the other ends must match.
    let (plain, traced) = runs(&ends(["stale", "exit"]));
    plain.assert_success();
    for (m, out) in &traced {
        let t = one_complete_trace(out, EndReason::Exit);
        the_stale_write_is_reported(m, out, t);
    }
}

#[test]
fn a_stale_write_before_exec_is_reported() {
    let (plain, traced) = runs(&ends(["stale", "exec"]));
    plain.assert_success();
    has_line(&plain, "after exec");
    for (m, out) in &traced {
        // The new image makes no CUDA call: the one trace is the first image's.
        let t = one_complete_trace(out, EndReason::Exec);
        the_stale_write_is_reported(m, out, t);
    }
}

#[test]
fn a_stale_write_before_raise_sigterm_or_abort_is_reported() {
    for (end, sig) in [("sigterm", libc::SIGTERM), ("abort", libc::SIGABRT)] {
        let (plain, traced) = runs(&ends(["stale", end]));
        assert_eq!(plain.signal(), Some(sig), "{}", plain.stderr);
        for (m, out) in &traced {
            let t = one_complete_trace(out, EndReason::Signal(sig));
            the_stale_write_is_reported(m, out, t);
        }
    }
}

/// What `timeout` (and a CI job's time limit) does: SIGTERM from outside while the program waits.
#[test]
fn a_stale_write_before_a_sigterm_from_outside_is_reported() {
    let run = ends(["stale", "wait"]);
    let kill = |run: Run| {
        let mut r = run.spawn();
        r.wait_for_stdout("ready", |s| s.lines().any(|l| l == "ready"));
        r.signal(libc::SIGTERM);
        r.wait()
    };
    let plain = kill(run.clone().preload(false));
    assert_eq!(plain.signal(), Some(libc::SIGTERM));
    for m in MODES {
        let out = kill(run.clone().env("ISOLATE_MODE", m));
        out.assert_same_as(&plain);
        let t = one_complete_trace(&out, EndReason::Signal(libc::SIGTERM));
        the_stale_write_is_reported(m, &out, t);
    }
}

/// With a device that never finishes, the check before a SIGTERM kills or an exec replaces the
/// process gives up after its limit (0.5 s here; 5 s for a signal and 30 s for an exec by
/// default), says so once, and the process ends as it would, its trace complete.
#[test]
fn the_check_at_other_ends_is_bounded_by_its_limit() {
    for (end, reason) in [
        ("sigterm", EndReason::Signal(libc::SIGTERM)),
        ("exec", EndReason::Exec),
    ] {
        let run = ends(["stuck", end]).timeout(Duration::from_secs(30));
        let plain = run.clone().preload(false).run();
        has_line(&plain, "stand-in stuck switch 1");
        let out = run
            .env("ISOLATE_MODE", "isolate")
            .env("ISOLATE_TEST_EXIT_CHECK_MS", "500")
            .run();
        out.assert_same_as(&plain);
        assert!(
            out.elapsed < Duration::from_secs(5),
            "{end}: {:?}",
            out.elapsed
        );
        let said = "the quarantine check did not finish within 0.5 s";
        assert_eq!(out.stderr.matches(said).count(), 1, "{end}: {}", out.stderr);
        out.only_trace().assert_complete(reason);
    }
}

#[test]
fn a_failed_exec_leaves_the_trace_going() {
    let (plain, traced) = runs(&ends(["exec-fail"]));
    plain.assert_success();
    assert_eq!(
        plain
            .lines_starting("execv of a missing program -1 errno ENOENT")
            .len(),
        2,
        "{}",
        plain.stdout
    );
    for (_, out) in &traced {
        let t = one_complete_trace(out, EndReason::Exit);
        assert_eq!(t.events().len(), 18, "{}", t.summary());
    }
}

// ------------------------------------------------------------ (10) ways out that were not hooked

#[test]
fn every_way_to_exec_leaves_a_complete_trace() {
    for way in ["fexecve", "execveat", "sys-execve", "sys-execveat"] {
        let (plain, traced) = runs(&ends([way, "100"]));
        plain.assert_success();
        has_line(&plain, "after exec");
        for (_, out) in &traced {
            let t = one_complete_trace(out, EndReason::Exec);
            assert_eq!(t.events().len(), 200, "{way}: {}", t.summary());
        }
    }
}

#[test]
fn quick_exit_and_raw_exit_group_leave_a_complete_trace() {
    for (way, code, events) in [("quick-exit", 3, 202), ("sys-exit-group", 4, 200)] {
        let (plain, traced) = runs(&ends([way, "100"]));
        assert_eq!(plain.code(), Some(code), "{}", plain.stderr);
        if way == "quick-exit" {
            has_line(&plain, "at_quick_exit handler ran");
        }
        for (_, out) in &traced {
            let t = one_complete_trace(out, EndReason::Exit);
            assert_eq!(t.events().len(), events, "{way}: {}", t.summary());
        }
    }
}

// ------------------------------------------------- (11) a second exit, as the glibc in use does

/// glibc's version, as the program sees it.
fn glibc_version() -> (u32, u32) {
    unsafe extern "C" {
        fn gnu_get_libc_version() -> *const std::ffi::c_char;
    }
    let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) }
        .to_string_lossy()
        .into_owned();
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// An `atexit` handler joins a thread that calls `exit`: before glibc 2.41 the second `exit`
/// ends the process (status 5); the library made it wait for good, as 2.41 does, and the program
/// hung. Now it ends as on its glibc, with a complete trace (the second exit runs the library's
/// destructor). On 2.41 and later the program hangs without the library too: nothing to compare.
#[test]
fn a_second_exit_behaves_as_the_glibc_in_use() {
    if glibc_version() >= (2, 41) {
        eprintln!(
            "glibc {:?}: a second exit waits for good there; skipped",
            glibc_version()
        );
        return;
    }
    let run = ends(["exit-join"]).timeout(Duration::from_secs(20));
    let (plain, traced) = runs(&run);
    assert_eq!(plain.code(), Some(5), "{}", plain.stdout);
    for (_, out) in &traced {
        let t = one_complete_trace(out, EndReason::Exit);
        assert_eq!(t.events().len(), 6, "{}", t.summary());
        assert!(
            out.elapsed < Duration::from_secs(5),
            "{}: {:?}",
            out.describe,
            out.elapsed
        );
    }
}

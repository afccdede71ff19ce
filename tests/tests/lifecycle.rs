//! The ways a process multiplies or ends: fork, exec, daemons, posix_spawn, atexit handlers,
//! thread-local destructors, threads still running at exit, `_exit`, fatal signals, SIGKILL.
//! Each process writes its own complete trace, ended by an `End` record that says why.

use isolate_tests::{Output, Run, Trace, check_events};
use isolate_trace::{EndReason, Kind};
use std::time::{Duration, Instant};

fn forker(mode: &str) -> Output {
    let both = Run::program("forker").arg(mode).run_both();
    both.traced
}

fn matches(out: &Output, t: &Trace, tags: &[&str]) {
    let expected: Vec<_> = out
        .expected_all()
        .into_iter()
        .filter(|x| tags.contains(&x.tag.as_deref().unwrap_or("")))
        .collect();
    if let Err(e) = check_events(&t.events_by_seq(), &expected) {
        panic!(
            "{} against the lines tagged {tags:?}: {e}\nstdout:\n{}",
            t.summary(),
            out.stdout
        );
    }
}

fn two_traces(out: &Output) -> (&Trace, &Trace) {
    assert_eq!(
        out.traces.len(),
        2,
        "two traces expected: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.traces.iter().map(|t| t.summary()).collect::<Vec<_>>(),
        out.stdout,
        out.stderr
    );
    let parent = out.traces.iter().find(|t| t.header.pid == out.pid);
    let other = out.traces.iter().find(|t| t.header.pid != out.pid);
    match (parent, other) {
        (Some(p), Some(o)) => (p, o),
        _ => panic!(
            "one trace of pid {} and one of another: {:?}",
            out.pid,
            out.traces.iter().map(|t| t.summary()).collect::<Vec<_>>()
        ),
    }
}

fn sizes(t: &Trace) -> Vec<u64> {
    t.events()
        .iter()
        .filter(|e| e.api.kind() == Kind::Alloc)
        .map(|e| e.size)
        .collect()
}

#[test]
fn fork_child_writes_its_own_trace() {
    let out = forker("fork");
    out.assert_success();
    let (parent, child) = two_traces(&out);
    parent.assert_complete(EndReason::Exit);
    child.assert_complete(EndReason::Exit);
    assert_eq!(child.header.ppid, out.pid, "child header ppid = parent pid");
    matches(&out, parent, &["parent"]);
    matches(&out, child, &["child"]);
    // No event in both: the child's trace has only the child's allocations.
    assert_eq!(sizes(child), (2000..2005).collect::<Vec<_>>());
    assert_eq!(
        sizes(parent),
        vec![1000, 1001, 1010, 1011, 1012],
        "parent keeps its own"
    );
}

#[test]
fn fork_then_exec() {
    let out = forker("fork-exec");
    out.assert_success();
    let (parent, child) = two_traces(&out);
    parent.assert_complete(EndReason::Exit);
    child.assert_complete(EndReason::Exit);
    assert_eq!(child.header.ppid, out.pid);
    assert_eq!(
        child.header.argv.get(1..),
        Some(&["simple".to_string(), "child".into(), "4".into()][..])
    );
    matches(&out, parent, &["parent"]);
    matches(&out, child, &["child"]);
}

#[test]
fn exec_ends_the_first_trace_and_starts_another() {
    let out = forker("exec");
    out.assert_success();
    let mine = out.traces_of(out.pid);
    assert_eq!(
        mine.len(),
        2,
        "{:?}",
        out.traces.iter().map(|t| t.summary()).collect::<Vec<_>>()
    );
    assert_eq!(out.traces.len(), 2);
    let (first, second) = (mine[0], mine[1]);
    assert!(
        second.path.to_string_lossy().ends_with(".trace.1"),
        "the exec'd image keeps the pid: the second trace gets .1: {}",
        second.path.display()
    );
    first.assert_complete(EndReason::Exec);
    second.assert_complete(EndReason::Exit);
    matches(&out, first, &["before"]);
    matches(&out, second, &["after"]);
}

/// The same through `execl`, which glibc implements with its internal `execve`.
#[test]
fn execl_ends_the_first_trace_and_starts_another() {
    let out = forker("execl");
    out.assert_success();
    let mine = out.traces_of(out.pid);
    assert_eq!(
        mine.len(),
        2,
        "{:?}",
        out.traces.iter().map(|t| t.summary()).collect::<Vec<_>>()
    );
    mine[0].assert_complete(EndReason::Exec);
    mine[1].assert_complete(EndReason::Exit);
    matches(&out, mine[0], &["before"]);
    matches(&out, mine[1], &["after"]);
}

#[test]
fn daemon_double_fork() {
    let out = forker("daemon");
    out.assert_success();
    let (parent, daemon) = two_traces(&out);
    parent.assert_complete(EndReason::Exit);
    daemon.assert_complete(EndReason::Exit);
    matches(&out, parent, &["parent"]);
    matches(&out, daemon, &["daemon"]);
}

#[test]
fn posix_spawn_child() {
    let out = forker("spawn");
    out.assert_success();
    let (parent, child) = two_traces(&out);
    parent.assert_complete(EndReason::Exit);
    child.assert_complete(EndReason::Exit);
    assert_eq!(child.header.ppid, out.pid);
    matches(&out, parent, &["parent"]);
    matches(&out, child, &["spawned"]);
}

#[test]
fn allocation_from_an_atexit_handler() {
    let out = forker("atexit");
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    matches(&out, t, &["main", "atexit"]);
    assert_eq!(t.events().len(), 6);
}

#[test]
fn allocation_from_thread_local_destructors() {
    let out = forker("tls-dtor");
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    matches(&out, t, &["main", "thread", "keydtor", "tssdtor"]);
    assert_eq!(t.events().len(), 2 + 2 + 4 + 2 + 2);
}

#[test]
fn threads_still_allocating_at_exit() {
    let out = forker("busy-exit");
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let ev = t.events();
    let mut seqs: Vec<u64> = ev.iter().map(|e| e.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), ev.len(), "sequence numbers are unique");
    let threads = t.threads();
    assert_eq!(threads.len(), 5, "main and four workers");
    for tid in threads.into_iter().filter(|&t| t != out.pid) {
        let mine = t.events_of_thread(tid);
        assert!(mine.len() >= 400, "{} events of {tid}", mine.len());
        // The runtime's exit handler tears the driver down while the workers still call: from
        // then on their calls fail with cudaErrorCudartUnloading (4), as with libcudart; the
        // library records them as they came, and changes none.
        let ok = mine.iter().position(|e| !e.ok()).unwrap_or(mine.len());
        for e in &mine[ok..] {
            assert_eq!(
                e.result, 4,
                "after the runtime's teardown only its error: {e:?}"
            );
        }
        let mine = &mine[..ok];
        for (i, e) in mine.iter().enumerate() {
            assert!(e.ok(), "{e:?}");
            let want = if i % 2 == 0 { Kind::Alloc } else { Kind::Free };
            assert_eq!(e.api.kind(), want, "thread {tid} event {i}: {e:?}");
            if i % 2 == 1 {
                assert_eq!(e.ptr, mine[i - 1].ptr);
            }
            if i > 0 {
                assert!(e.seq > mine[i - 1].seq);
            }
        }
    }
}

#[test]
fn underscore_exit() {
    let out = forker("_exit");
    assert_eq!(out.code(), Some(3));
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    matches(&out, t, &["main"]);
}

fn dies_of(mode: &str, sig: i32) {
    let out = forker(mode);
    assert_eq!(
        out.signal(),
        Some(sig),
        "{mode}: {}\n{}",
        out.status,
        out.stderr
    );
    let t = out.only_trace();
    t.assert_complete(EndReason::Signal(sig));
    matches(&out, t, &["main"]);
}

#[test]
fn abort_flushes_and_dies_of_sigabrt() {
    dies_of("abort", libc::SIGABRT);
}

#[test]
fn sigterm_flushes_and_dies_of_sigterm() {
    dies_of("sigterm", libc::SIGTERM);
}

#[test]
fn sigint_flushes_and_dies_of_sigint() {
    dies_of("sigint", libc::SIGINT);
}

#[test]
fn sigsegv_flushes_and_dies_of_sigsegv() {
    dies_of("segv", libc::SIGSEGV);
}

#[test]
fn a_signal_the_program_handles_is_passed_on() {
    let out = forker("sigint-handled");
    out.assert_success();
    assert!(out.stdout.contains("main: handler ran 2"), "{}", out.stdout);
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    matches(&out, t, &["main"]);
}

/// SIGKILL cannot be caught: what the writer had not written yet is lost. It writes at
/// least every 50 ms, so the loss is at most about 100 ms of events.
#[test]
fn sigkill_loses_at_most_100ms_of_events() {
    let mut run = Run::program("forker").arg("sigkill").spawn();
    run.wait_for_stdout("a few thousand pairs", |s| s.lines().nth(2000).is_some());
    let first = run.first_output_at().expect("output arrived");
    std::thread::sleep(Duration::from_millis(400));
    run.signal(libc::SIGKILL);
    let killed = Instant::now();
    let out = run.wait();
    assert_eq!(out.signal(), Some(libc::SIGKILL));
    let pairs: u64 = out
        .stdout
        .lines()
        .rfind(|l| !l.is_empty())
        .and_then(|l| l.parse().ok())
        .expect("a pair count");
    let t = out.only_trace();
    assert!(t.error.is_none(), "{}", t.summary());
    assert!(t.end().is_none(), "no End record after SIGKILL");
    let events = t.events().len() as u64;
    let seconds = (killed - first).as_secs_f64();
    let rate = 2.0 * pairs as f64 / seconds; // events per second
    let lost = (2 * pairs).saturating_sub(events);
    let allowed = (rate * 0.1).ceil() as u64 + 2;
    eprintln!(
        "SIGKILL: {pairs} pairs printed in {seconds:.3} s ({rate:.0} events/s), {events} events in the trace: \
         {lost} lost = {:.1} ms of events (allowed {allowed})",
        lost as f64 / rate * 1000.0
    );
    assert!(
        events <= 2 * pairs + 2,
        "{events} events for {pairs} pairs printed"
    );
    assert!(
        lost <= allowed,
        "lost {lost} events, more than 100 ms ({allowed}) at {rate:.0} events/s"
    );
}

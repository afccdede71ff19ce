//! What isolate mode does to freed memory, on the stand-in (`tests/programs/quarantine.c`, one
//! scenario per run): freed addresses held back, freed bytes poisoned, stale writes reported to
//! the byte, the out-of-memory fallback, the budget, stream order, double frees. Each is held
//! against a run without the preload (and, where it matters, log mode): isolation changes where
//! memory comes from and what freed memory holds, never what a call returns.
//!
//! Covered elsewhere, and not repeated here:
//! - `paths.rs`: `stale_write_is_caught_in_isolate_mode` (a 16-byte stale `cudaMemset`),
//!   `oom_in_isolate_mode_releases_quarantine` (`oom.c`: the same successes and codes as a plain
//!   run), `stream_ordered_reader_sees_data_freed_after_it` (`stream_order.c` under isolate mode
//!   prints what the plain run prints);
//! - `bad_calls.rs`: `failed_calls_keep_their_codes_in_isolate_mode` (`bad_calls.c`'s double
//!   `cudaFree`, `cuMemFree_v2` and `cudaFreeAsync`, and its other bad frees, return the same codes
//!   and leave the same sticky error in isolate mode as without the preload).

use isolate_tests::{Output, Run, Trace};
use isolate_trace::{Api, EndReason, Event, Note, NoteKind, Record, Stats};

const MIB: u64 = 1 << 20;

fn quarantine(scenario: &str) -> Run {
    Run::program("quarantine").arg(scenario)
}

fn isolate(run: Run) -> Run {
    run.env("ISOLATE_MODE", "isolate")
}

fn has_line(out: &Output, line: &str) {
    assert!(
        out.stdout.lines().any(|l| l == line),
        "{}: no line {line:?} in:\n{}",
        out.describe,
        out.stdout
    );
}

/// The stdout lines that do not start with any of `skip`.
fn lines_but<'a>(out: &'a Output, skip: &[&str]) -> Vec<&'a str> {
    out.stdout
        .lines()
        .filter(|l| !skip.iter().any(|s| l.starts_with(s)))
        .collect()
}

/// `a` and `b` printed the same, apart from lines starting with `skip`, and ended the same way.
fn same_but(a: &Output, b: &Output, skip: &[&str]) {
    assert_eq!(
        lines_but(a, skip),
        lines_but(b, skip),
        "{} and {} differ beyond {skip:?}:\n--- {}\n{}\n--- {}\n{}",
        a.describe,
        b.describe,
        a.describe,
        a.stdout,
        b.describe,
        b.stdout
    );
    assert_eq!(
        (a.code(), a.signal()),
        (b.code(), b.signal()),
        "{} vs {}",
        a.describe,
        b.describe
    );
}

/// The run's one trace: complete, from isolate mode, and one event per `ev` line.
fn isolate_trace(out: &Output) -> &Trace {
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    assert_eq!(t.header.mode, "isolate");
    out.assert_trace_matches(t, None);
    t
}

fn notes(t: &Trace, kind: NoteKind) -> Vec<Note> {
    t.records
        .iter()
        .filter_map(|r| match r {
            Record::Note(n) if n.kind == kind => Some(n.clone()),
            _ => None,
        })
        .collect()
}

fn config<'a>(t: &'a Trace, key: &str) -> Option<&'a str> {
    t.header
        .config
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn stats(t: &Trace) -> Stats {
    t.end().expect("End record").stats.clone()
}

fn events_of(t: &Trace, api: Api) -> Vec<Event> {
    t.events_by_seq()
        .into_iter()
        .filter(|e| e.api == api)
        .collect()
}

fn number(out: &Output, prefix: &str) -> i64 {
    let line = out
        .lines_starting(prefix)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{}", out.stdout));
    line.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number after {prefix:?}: {line:?}"))
}

// ------------------------------------------------------------------------------- (1) reuse

/// alloc A, free A, alloc B of the same size: without isolation the stand-in hands A straight
/// back (as a caching allocator does); in isolate mode A is in quarantine and B is elsewhere.
/// A scenario on a 64 MiB stand-in whose kernels need 16 MiB free at their first use and whose
/// modules need it to load (`STANDIN_LAUNCH_ROOM`, as lazy loading does), synchronous.
fn short_of_room(scenario: &str) -> Run {
    quarantine(scenario)
        .env("STANDIN_SYNC", "1")
        .env("STANDIN_MEM_BYTES", (64 * MIB).to_string())
        .env("STANDIN_LAUNCH_ROOM", (16 * MIB).to_string())
}

/// The exit note of where the checks ran ("poison verified for N allocations on the device,
/// M on the host").
fn where_checks_ran(t: &Trace) -> String {
    notes(t, NoteKind::Cost)
        .into_iter()
        .map(|n| n.text)
        .find(|n| n.starts_with("poison verified for "))
        .expect("the note of where the checks ran")
}

#[test]
fn a_freed_address_is_not_reused_while_quarantined() {
    let plain = quarantine("reuse").preload(false).run();
    plain.assert_success();
    has_line(&plain, "b==a 1");
    let log = quarantine("reuse").run();
    log.assert_same_as(&plain);
    let out = isolate(quarantine("reuse")).run();
    has_line(&out, "b==a 0");
    same_but(&out, &plain, &["b==a", "a after free bytes"]);
    let t = isolate_trace(&out);
    let mallocs = events_of(t, Api::CudaMalloc);
    assert_eq!(mallocs.len(), 2);
    assert_ne!(mallocs[0].ptr, mallocs[1].ptr);
    // B does not overlap A either.
    let (a, b) = (mallocs[0], mallocs[1]);
    assert!(
        b.ptr >= a.ptr + a.size || b.ptr + b.size <= a.ptr,
        "{a:?} {b:?}"
    );
    assert!(t.violations().is_empty());
}

// ------------------------------------------------------------------------------ (2) poison

/// Freed bytes hold the poison at once: 0xFF by default, the ISOLATE_POISON byte when set, and
/// what the program left there with ISOLATE_POISON=off (or without isolation).
#[test]
fn freed_bytes_hold_the_poison() {
    let plain = quarantine("reuse").preload(false).run();
    has_line(&plain, "a after free bytes: all 0x11");
    let log = quarantine("reuse").run();
    has_line(&log, "a after free bytes: all 0x11");
    for (poison, line, shown) in [
        (None, "a after free bytes: all 0xff", "0xFF"),
        (Some("0xA5"), "a after free bytes: all 0xa5", "0xA5"),
        (Some("165"), "a after free bytes: all 0xa5", "0xA5"),
        (Some("off"), "a after free bytes: all 0x11", "off"),
    ] {
        let mut run = isolate(quarantine("reuse"));
        if let Some(p) = poison {
            run = run.env("ISOLATE_POISON", p);
        }
        let out = run.run();
        has_line(&out, line);
        // Quarantine does not depend on the poison.
        has_line(&out, "b==a 0");
        same_but(&out, &plain, &["b==a", "a after free bytes"]);
        let t = isolate_trace(&out);
        assert_eq!(
            config(t, "ISOLATE_POISON"),
            Some(shown),
            "{poison:?}: {:?}",
            t.header.config
        );
        assert!(t.violations().is_empty(), "{poison:?}");
    }
}

// ---------------------------------------------------------------------------- (3) stale write

/// A write through a stale pointer (24 bytes at offset 1000 by `cudaMemset`, one byte at 5000
/// straight through the pointer) is one Violation naming the allocation, the first changed
/// offset and the changed byte count, with the sequence numbers of its allocation and free, and
/// one `isolate: STALE WRITE` line on stderr. Without isolation the write lands in B.
#[test]
fn a_stale_write_is_reported_to_the_byte() {
    let plain = quarantine("stale").preload(false).run();
    plain.assert_success();
    has_line(&plain, "b==a 1");
    has_line(&plain, "b==a changed 25");
    let log = quarantine("stale").run();
    log.assert_same_as(&plain);
    assert!(
        log.only_trace().violations().is_empty(),
        "log mode checks nothing"
    );
    assert!(!log.stderr.contains("STALE WRITE"), "{}", log.stderr);

    let out = isolate(quarantine("stale")).run();
    has_line(&out, "b==a 0");
    has_line(&out, "b==a changed 0");
    same_but(&out, &plain, &["b==a"]);
    let t = isolate_trace(&out);
    let ev = t.events_by_seq();
    let (alloc, free) = (ev[0], ev[1]);
    assert_eq!((alloc.api, free.api), (Api::CudaMalloc, Api::CudaFree));
    assert_eq!(free.ptr, alloc.ptr);
    let v = t.violations();
    assert_eq!(v.len(), 1, "only A was written after its free: {v:#?}");
    let v = &v[0];
    assert_eq!(v.ptr, alloc.ptr, "{v:?}");
    assert_eq!(v.size, 64 << 10, "{v:?}");
    assert_eq!(v.first_offset, 1000, "{v:?}");
    assert_eq!(v.changed_bytes, 25, "{v:?}");
    assert_eq!(v.alloc_seq, alloc.seq, "{v:?}");
    assert_eq!(v.free_seq, free.seq, "{v:?}");
    assert_eq!(v.free_api, Api::CudaFree);
    // Stamped inside the free call (an event's ts_ns is when the call returned).
    assert!(
        v.free_ts_ns >= free.ts_ns - free.duration_ns && v.free_ts_ns <= free.ts_ns,
        "{v:?} {free:?}"
    );
    assert!(
        v.seq > ev.last().unwrap().seq,
        "checked when A left quarantine (at exit)"
    );
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("isolate: STALE WRITE"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    // Then where the calls were: a C program's stacks are native, symbolised only offline, so
    // by their ids and the trace that has them (issue 30, item 4).
    let want = format!(
        "isolate: STALE WRITE: 25 bytes of freed allocation {:#x} (65536 bytes, freed by cudaFree at event {}) changed after the free; first at offset 1000; \
         allocated at stack {}, freed at stack {} of {} (isolate summary names the code)",
        alloc.ptr,
        free.seq,
        alloc.stack,
        free.stack,
        t.path.display()
    );
    assert!(alloc.stack != 0 && free.stack != 0);
    assert_eq!(lines[0], want);

    // No poison, nothing to check against: no report (and the write still lands nowhere live).
    let off = isolate(quarantine("stale"))
        .env("ISOLATE_POISON", "off")
        .run();
    has_line(&off, "b==a changed 0");
    assert!(isolate_trace(&off).violations().is_empty());
    assert!(!off.stderr.contains("STALE WRITE"), "{}", off.stderr);
}

// ---------------------------------------------------------------------------------- (4) OOM

/// With a budget larger than memory, only the out-of-memory fallback can give quarantined
/// memory back: refilling memory after freeing it all succeeds call by call (each first attempt
/// runs out, the oldest entry is released, the retry succeeds, the caller sees success and no
/// sticky error), with one OomRetry note per retried call; asking for more than there is
/// releases nothing and fails, with exactly the code of a plain run. Both layers.
/// (`paths.rs`'s `oom_in_isolate_mode_releases_quarantine` runs `oom.c` the same way.)
#[test]
fn out_of_memory_releases_quarantine_and_retries() {
    let run = quarantine("oom").env("STANDIN_MEM_BYTES", (8 * MIB).to_string());
    let plain = run.clone().preload(false).run();
    plain.assert_success();
    let n = number(&plain, "runtime allocated ");
    assert!(n >= 4, "{n} MiB fit in 8 MiB");
    has_line(&plain, &format!("runtime allocated {n} then 2"));
    has_line(&plain, &format!("runtime allocated again {n} of {n}"));
    has_line(&plain, "runtime more than there is 2");
    let m = number(&plain, "driver allocated ");
    has_line(&plain, &format!("driver allocated again {m} of {m}"));
    has_line(&plain, "driver more than there is 2");

    // The reserve off (ISOLATE_RESERVE=0): only the fallback gives memory back here.
    let out = isolate(run)
        .env("ISOLATE_QUARANTINE", "1GiB")
        .env("ISOLATE_RESERVE", "0")
        .run();
    out.assert_same_as(&plain);
    let t = isolate_trace(&out);
    let retries = notes(t, NoteKind::OomRetry);
    let (n, m) = (n as u64, m as u64);
    // (size asked, bytes released): each 1 MiB allocation that ran out releases one entry,
    // and asking for more than the device has releases nothing (issue 33, item 9: a memory
    // probe must not empty the quarantine), so the runtime's last n MiB freed are still held
    // when the driver fills the device (m retries), and its own m MiB when it fills it again.
    let want: Vec<(u64, u64)> = vec![(MIB, MIB); (n + 2 * m) as usize];
    let got: Vec<(u64, u64)> = retries.iter().map(|r| (r.size, r.value)).collect();
    assert_eq!(got, want, "{retries:#?}");
    // Every retried allocation is one event, with what the caller got.
    let huge: Vec<Event> = t
        .events_by_seq()
        .into_iter()
        .filter(|e| e.size > MIB && e.api.kind() == isolate_trace::Kind::Alloc)
        .collect();
    assert_eq!(huge.len(), 2, "{huge:?}");
    assert!(huge.iter().all(|e| e.result == 2), "{huge:?}");
    let s = stats(t);
    assert_eq!(s.quarantine_early_releases, n + 2 * m, "{s:?}");
    assert_eq!(s.quarantine_releases, n + 2 * m, "{s:?}");
    assert_eq!(s.quarantine_peak_bytes, n.max(m) * MIB, "{s:?}");
    assert!(t.violations().is_empty());
}

// ------------------------------------------------------------------------------- (5) budget

/// ISOLATE_QUARANTINE=4MiB, 20 × 1 MiB freed: the quarantine never holds much more than its
/// budget (over it, it releases the oldest down to 80%), and what it released is memory again:
/// the next 16 allocations get exactly the 16 oldest freed addresses, never the 4 newest (still
/// held). Without isolation they get all of them back, newest first.
#[test]
fn the_quarantine_budget_is_respected() {
    let plain = quarantine("budget").preload(false).run();
    plain.assert_success();
    let index = |out: &Output| -> Vec<i64> {
        (0..16)
            .map(|j| number(out, &format!("again {j} index ")))
            .collect()
    };
    assert_eq!(
        index(&plain),
        (4..20).rev().collect::<Vec<_>>(),
        "the stand-in hands back the latest freed address first"
    );
    let out = isolate(quarantine("budget"))
        .env("ISOLATE_QUARANTINE", "4MiB")
        .run();
    same_but(&out, &plain, &["ev ", "again "]);
    let t = isolate_trace(&out);
    assert_eq!(
        config(t, "ISOLATE_QUARANTINE"),
        Some("4194304"),
        "{:?}",
        t.header.config
    );
    let mut got = index(&out);
    got.sort();
    assert_eq!(
        got,
        (0..16).collect::<Vec<_>>(),
        "released addresses reused, held ones not: {}",
        out.stdout
    );
    let s = stats(t);
    assert!(
        s.quarantine_peak_bytes <= 4 * MIB + MIB,
        "peak {} over budget + one allocation: {s:?}",
        s.quarantine_peak_bytes
    );
    assert!(s.quarantine_peak_bytes >= 4 * MIB, "{s:?}");
    assert!(s.quarantine_releases > 0, "{s:?}");
    // 20 + 16 frees, at most 4 MiB (4 entries) still held at the end.
    assert_eq!(s.quarantine_releases, 32, "{s:?}");
    assert_eq!(s.quarantine_early_releases, 0, "{s:?}");
    assert!(notes(t, NoteKind::OomRetry).is_empty());
    assert!(t.violations().is_empty());
}

// ------------------------------------------------------------------------------- (6) stream

/// A device-to-device copy and a kernel that read X are queued on a stream, then
/// cudaFreeAsync(X) on it, before any of it ran: the poison goes in stream order, so both
/// readers see X's data (not the poison) and only afterwards X holds the poison. Nothing ran
/// before the synchronise, with or without isolation. (`paths.rs`'s
/// `stream_ordered_reader_sees_data_freed_after_it` does the same with `stream_order.c`.)
#[test]
fn a_stream_ordered_free_is_poisoned_in_stream_order() {
    let plain = quarantine("stream").preload(false).run();
    plain.assert_success();
    let out = isolate(quarantine("stream")).run();
    for o in [&plain, &out] {
        has_line(o, "before sync: kernel runs 0 y[0] 0x00");
        has_line(o, "copy into y saw all 0x42 1");
        has_line(o, "kernel runs 1 saw all 0x42 1");
    }
    has_line(&plain, "x after sync bytes: all 0x42");
    has_line(&out, "x after sync bytes: all 0xff");
    same_but(&out, &plain, &["x after sync bytes"]);
    let t = isolate_trace(&out);
    let f = events_of(t, Api::CudaFreeAsync);
    assert_eq!(f.len(), 1);
    assert_ne!(f[0].stream, 0, "{:?}", f[0]);
    assert!(t.violations().is_empty(), "readers are not writers");
}

// ------------------------------------------------------------------------ (7) double free

const DOUBLE_SKIP: &[&str] = &["a after double free bytes", "b==a", "ev cuMemFree_v2 "];

/// Double frees in isolate mode return what they return without the preload (runtime, stream
/// ordered before and after the stream ran, driver, driver stream-ordered on a runtime
/// allocation), leave the same sticky error, and do not let the memory out of quarantine (A
/// keeps its poison, B does not get A's address). (`bad_calls.rs`'s
/// `failed_calls_keep_their_codes_in_isolate_mode` covers `bad_calls.c`'s double frees.)
#[test]
fn a_double_free_returns_the_same_code_in_isolate_mode() {
    let plain = quarantine("double").preload(false).run();
    plain.assert_success();
    for line in [
        "cudaFree twice 1",
        "cudaFreeAsync twice, queued 1",
        "cudaFreeAsync twice, ran 1",
        "cuMemFree_v2 twice 1",
        "cuMemFreeAsync twice 1",
        "b==a 1",
        "a after double free bytes: all 0x11",
    ] {
        has_line(&plain, line);
    }
    let out = isolate(quarantine("double")).run();
    has_line(&out, "a after double free bytes: all 0xff");
    has_line(&out, "b==a 0");
    // The driver double frees on the thread with a context (the other is the next test's).
    let drv = |o: &Output| -> Vec<String> {
        o.lines_starting("ev cuMemFree_v2 ")
            .into_iter()
            .filter(|l| !l.ends_with("device=-1"))
            .map(String::from)
            .collect()
    };
    assert_eq!(drv(&out), drv(&plain));
    same_but(&out, &plain, DOUBLE_SKIP);
    let t = isolate_trace(&out);
    assert!(t.violations().is_empty(), "a double free is not a write");
}

/// A double cuMemFree_v2 from a thread with no current context: the driver says
/// CUDA_ERROR_INVALID_CONTEXT (201) before it looks at the address; isolate mode must too.
#[test]
fn a_double_free_without_a_context_returns_the_same_code_in_isolate_mode() {
    let plain = quarantine("double").preload(false).run();
    plain.assert_success();
    has_line(&plain, "ev cuMemFree_v2 201 ptr=@d device=-1");
    let out = isolate(quarantine("double")).run();
    out.assert_success();
    has_line(&out, "ev cuMemFree_v2 201 ptr=@d device=-1");
}

// --------------------------------------------------------------------- (7) release stream

/// Whether an allocation got an address range that was freed earlier and, by the quarantine's
/// rule, could not have left it yet: a range leaves (oldest first) only when it and the bytes
/// queued after it exceed 80% of the budget. Queued after it may include a free of each other
/// thread numbered just before it (numbered before their real call, queued after): up to
/// three of the async scenario's largest (76 KiB) are allowed for. Returns the first such
/// allocation.
fn reused_too_early(t: &Trace, budget: u64) -> Option<(Event, Event)> {
    reuses(t, budget).into_iter().next()
}

/// Every allocation that got a range freed earlier, with that free, when the bytes freed from
/// that free on were at most `within` (`u64::MAX`: all reuses).
fn reuses(t: &Trace, within_of: u64) -> Vec<(Event, Event)> {
    let within = if within_of == u64::MAX {
        u64::MAX
    } else {
        (within_of / 10 * 8).saturating_sub(3 * 76 * 1024)
    };
    let mut found = Vec::new();
    let mut evs: Vec<Event> = t
        .events()
        .into_iter()
        .filter(|e| e.ok() && e.ptr != 0)
        .collect();
    evs.sort_by_key(|e| e.seq);
    // Freed ranges by start: (free event, bytes freed up to and including it).
    let mut freed: Vec<(Event, u64)> = Vec::new();
    let mut sizes = std::collections::HashMap::new();
    let mut total = 0u64;
    for e in evs {
        match e.api {
            Api::CudaMallocAsync => {
                let end = e.ptr + e.size;
                for (f, upto) in &freed {
                    let fend = f.ptr + f.size;
                    if f.ptr < end && e.ptr < fend && total - upto + f.size <= within {
                        found.push((*f, e));
                    }
                }
                sizes.insert(e.ptr, e.size);
            }
            Api::CudaFreeAsync => {
                let size = sizes.remove(&e.ptr).unwrap_or(0);
                total += size;
                freed.retain(|(f, _)| f.ptr != e.ptr);
                freed.push((Event { size, ..e }, total));
            }
            _ => {}
        }
    }
    found
}

/// Four threads on four streams allocate, write and free 1,200 times with a 4 MiB quarantine
/// (room for about 90 frees, so the stale write's allocation is still held when the thread
/// queues the write, however the threads are scheduled):
/// stream-ordered frees leave quarantine on the release stream (checked there by the stand-in's
/// run of the verification kernel, freed there with cuMemFreeAsync), no range is handed out
/// again while it is held, the stream-ordered write before each free is not taken for a stale
/// one (poison and check follow the stream), and the stale write queued after one free is
/// found to the byte. In log mode the same program gets freed ranges straight back (the check
/// would fail there), and `ISOLATE_TEST_RELEASE=sync` finds the same stale write the old way.
#[test]
fn stream_ordered_frees_leave_quarantine_on_the_release_stream() {
    let budget = MIB;
    // STANDIN_SYNC=1: stream work runs at once, so a freed range is free at once.
    let log = quarantine("async").env("STANDIN_SYNC", "1").run();
    log.assert_success();
    assert!(
        reused_too_early(log.only_trace(), budget).is_some(),
        "without isolation freed ranges come straight back"
    );
    // (release, poison by): the release stream and the synchronous way, and the release stream
    // with the library's own fill kernel as the poison.
    // (release, poison by, deferred): the release stream with the poisons deferred to the
    // streams' next work (the default), and not; the synchronous way; the library's own fill
    // kernel as the poison.
    // And the first with checked memory kept for reuse (`ISOLATE_REUSE=on`): the same
    // guarantees.
    for (release, by, batch, reuse) in [
        ("async", "memset", "on", "off"),
        ("async", "memset", "off", "off"),
        ("sync", "memset", "on", "off"),
        ("async", "kernel", "on", "off"),
        ("async", "memset", "on", "on"),
    ] {
        let out = isolate(quarantine("async"))
            .env("ISOLATE_QUARANTINE", "4MiB")
            .env("ISOLATE_TEST_RELEASE", release)
            .env("ISOLATE_TEST_POISON_BY", by)
            .env("ISOLATE_TEST_POISON_BATCH", batch)
            .env("ISOLATE_REUSE", reuse)
            .run();
        out.assert_success();
        has_line(&out, "async calls failed 0");
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        assert_eq!(t.header.mode, "isolate");
        assert_eq!(config(t, "ISOLATE_TEST_RELEASE"), Some(release));
        assert_eq!(config(t, "ISOLATE_TEST_POISON_BY"), Some(by));
        if let Some((f, a)) = reused_too_early(t, budget) {
            panic!("{release}: {a:?} got a range still held since {f:?}");
        }
        assert!(
            reuses(t, u64::MAX).len() > 100,
            "{release}: what leaves quarantine is really freed and handed out again: {} {:?}",
            reuses(t, u64::MAX).len(),
            stats(t)
        );
        let v = t.violations();
        assert_eq!(v.len(), 1, "{release}: {v:?}");
        assert_eq!(v[0].first_offset, 100);
        assert_eq!(v[0].changed_bytes, 8);
        assert_eq!(v[0].free_api, Api::CudaFreeAsync);
        let s = stats(t);
        assert!(s.quarantine_releases > 1000, "{release}: {s:?}");
        let info: Vec<String> = notes(t, NoteKind::Cost)
            .into_iter()
            .map(|n| n.text)
            .collect();
        let time = info
            .iter()
            .find(|t| t.starts_with("isolation's time: 1200 frees poisoned"))
            .unwrap_or_else(|| panic!("{release}: {info:?}"));
        // The bytes those frees held, as the trace's frees say.
        let freed: u64 = t
            .events_by_seq()
            .iter()
            .filter(|e| e.api == Api::CudaFreeAsync && e.result == 0)
            .map(|e| e.size)
            .sum();
        assert!(freed > 0);
        // The releases over the budget go to the library's keeper thread once its probe has
        // found the device with its reserve free (the stand-in's, always), the freeing threads
        // go on meanwhile; the guarantees above hold all the same.
        let (kept_jobs, probes) = keeper_counts(time);
        assert!(kept_jobs > 0 && probes > 0, "{release} {by}: {time}");
        let by_kernel = if by == "kernel" { 1200 } else { 0 };
        assert!(
            time.starts_with(&format!(
                "isolation's time: 1200 frees poisoned ({freed} bytes, written by the device once \
                 and read once to check; {by_kernel} by the library's fill kernel; "
            )),
            "{release} {by}: {time}"
        );
        // Deferred only on the release stream's way with the memset poison and batching on:
        // then every free (the driver's starts are aligned), each run queued by one launch.
        let deferred = isolate_tests::number_after(time, "kernel;").unwrap();
        let launches = isolate_tests::number_after(time, "by").unwrap();
        if (release, by, batch) == ("async", "memset", "on") {
            let reused = info
                .iter()
                .any(|t| t.starts_with("reuse (ISOLATE_REUSE=on): "));
            assert_eq!(reused, reuse == "on", "{info:?}");
            assert_eq!(deferred, 1200, "{time}");
            assert!((1..=1200).contains(&launches), "{time}");
        } else {
            assert_eq!(
                (deferred, launches),
                (0, 0),
                "{release} {by} {batch}: {time}"
            );
        }
        // The driver's allocations start aligned: the release checks with its 128-bit kernel.
        let runs16 = isolate_tests::number_after(&out.stdout, "verify16_runs").unwrap();
        if release == "async" {
            assert!(runs16 > 0, "{release} {by}: {}", out.stdout);
            assert!(
                !time.contains(" 0 batches released on the release stream;"),
                "{time}"
            );
            assert!(
                info.iter().any(|t| t.starts_with("poison verified for ")
                    && !t.starts_with("poison verified for 0 ")),
                "{info:?}"
            );
        } else {
            assert_eq!(runs16, 0, "{release} {by}: no batch on the release stream");
            assert!(
                time.contains(" 0 batches released on the release stream;"),
                "{time}"
            );
        }
    }
}

/// A process forked before any CUDA call (as the tier benchmark's models are) gets a keeper
/// of its own: its releases over the budget and its probes are taken off its freeing threads,
/// with the release stream's guarantees (no range back while held, the stale write found). As
/// first built, a fork child had none at all.
#[test]
fn a_fork_child_has_a_keeper_of_its_own() {
    let out = isolate(quarantine("fork-async"))
        .env("ISOLATE_QUARANTINE", "4MiB")
        .run();
    out.assert_success();
    has_line(&out, "async calls failed 0");
    let child: Vec<_> = out
        .traces
        .iter()
        .filter(|t| t.header.ppid == out.pid)
        .collect();
    assert_eq!(child.len(), 1, "{}", out.stdout);
    let t = child[0];
    t.assert_complete(EndReason::Exit);
    if let Some((f, a)) = reused_too_early(t, MIB) {
        panic!("{a:?} got a range still held since {f:?}");
    }
    let v = t.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].first_offset, v[0].changed_bytes), (100, 8));
    let time = notes(t, NoteKind::Cost)
        .into_iter()
        .map(|n| n.text)
        .find(|n| n.starts_with("isolation's time: 1200 frees poisoned"))
        .unwrap();
    let (kept_jobs, probes) = keeper_counts(&time);
    assert!(kept_jobs > 0 && probes > 0, "{time}");
}

/// (releases, device-memory probes) the keeper thread took, from the note of isolation's time.
fn keeper_counts(time: &str) -> (u64, u64) {
    let rest = time
        .split_once("the keeper thread took ")
        .unwrap_or_else(|| panic!("{time}"))
        .1;
    let words: Vec<&str> = rest.split_whitespace().collect();
    assert_eq!((words[1], words[2]), ("releases", "and"), "{time}");
    (words[0].parse().unwrap(), words[3].parse().unwrap())
}

/// The trace's stale writes as (first changed offset, changed bytes), sorted.
fn stale_writes(t: &isolate_tests::Trace) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = t
        .violations()
        .iter()
        .map(|v| (v.first_offset, v.changed_bytes))
        .collect();
    v.sort_unstable();
    v
}

/// Poisons deferred to the stream's next work (`ISOLATE_TEST_POISON_BATCH=on`, the default): four
/// runs of frees (4, 2, 1 and 1) are each poisoned by one multi-range launch, queued before the
/// work that follows them (a set, an asynchronous copy, a synchronous copy, an event record
/// that another stream waits for), so each run's stale write, through that work, lands after
/// its poison and is found to the byte, and nothing else is reported. With batching off the
/// same writes are found with a memset per free and no multi-range launch; without isolation
/// there is nothing to find.
#[test]
fn deferred_poisons_are_queued_before_the_streams_next_work() {
    for sync in ["0", "1"] {
        let out = isolate(quarantine("batch")).env("STANDIN_SYNC", sync).run();
        out.assert_success();
        has_line(&out, "batch calls failed 0");
        let num = |k: &str| isolate_tests::number_after(&out.stdout, k).unwrap();
        assert_eq!(num("poison_many_runs"), 4, "{}", out.stdout);
        assert_eq!(num("poison_many_ranges"), 8, "{}", out.stdout);
        // The program's one event record, and none by the four flushes: the check records the
        // freeing stream's event when it comes (`release::refresh`; each flush recorded it
        // until the seventh session, ~263 a ResNet-50 step).
        assert_eq!(num("event_records"), 1, "{}", out.stdout);
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        assert_eq!(
            stale_writes(t),
            vec![(100, 8), (200, 8), (300, 8), (400, 8)],
            "sync {sync}"
        );
        let info: Vec<String> = notes(t, NoteKind::Cost)
            .into_iter()
            .map(|n| n.text)
            .collect();
        assert!(
            info.iter()
                .any(|t| t.starts_with("isolation's time: 8 frees poisoned")
                    && t.contains(
                        "; 8 deferred to their stream's next work and poisoned by 4 launches)"
                    )),
            "{info:?}"
        );
    }
    let off = isolate(quarantine("batch"))
        .env("ISOLATE_TEST_POISON_BATCH", "off")
        .run();
    off.assert_success();
    assert_eq!(
        isolate_tests::number_after(&off.stdout, "poison_many_runs"),
        Some(0)
    );
    assert_eq!(off.only_trace().violations().len(), 4);
    let plain = quarantine("batch").run();
    plain.assert_success();
    assert!(plain.only_trace().violations().is_empty());
}

/// The fast tier queues the deferred poisons before a launch only when the launch may reach one
/// of their blocks (docs/isolation.md, "The fast tier"); the full tier before every launch. The
/// `lazy` scenario: stale writes after the free by a kernel handed a pointer into the block (A),
/// by one handed it inside a 96-byte struct the fast tier does not look up (B), and by one
/// launched after three kernels of a live tensor (C) are found in both tiers, to the byte; a
/// write only through a pointer table in device memory (E) lands before its poison in the fast
/// tier and is not found there (the full tier finds it); and the eight frees each followed by a
/// kernel of a live tensor (D), and a free followed by a kernel handed a word inside A, whose
/// poison went out long before (G), cost the full tier a poison launch each, the fast tier none
/// of their own (D's, G's and E's poisons go out at the synchronisation, in one launch).
#[test]
fn the_fast_tier_queues_poisons_only_before_launches_that_may_reach_them() {
    for (tier, writes, runs) in [
        ("full", vec![(100, 8), (200, 8), (300, 8), (400, 8)], 13),
        ("fast", vec![(100, 8), (200, 8), (300, 8)], 4),
    ] {
        for sync in ["0", "1"] {
            let out = isolate(quarantine("lazy"))
                .env("ISOLATE_CHECK", tier)
                .env("STANDIN_SYNC", sync)
                .run();
            out.assert_success();
            has_line(&out, "lazy calls failed 0");
            let t = out.only_trace();
            t.assert_complete(EndReason::Exit);
            assert_eq!(
                stale_writes(t),
                writes,
                "{tier} sync {sync}: {}",
                out.stderr
            );
            assert_eq!(
                isolate_tests::number_after(&out.stdout, "poison_many_runs"),
                Some(runs),
                "{tier} sync {sync}: {}",
                out.stdout
            );
            // A's and B's kernels were handed words inside freed blocks: suspects, no stale
            // launch (none was handed a block's start).
            assert!(t.stale_launches().is_empty(), "{tier}: {}", out.stderr);
        }
    }
    let plain = quarantine("lazy").run();
    plain.assert_success();
    assert!(plain.only_trace().violations().is_empty());
}

/// `ISOLATE_PROFILE=on`: the hooks time themselves and the exit note counts each kind of call
/// as the program made it (the `batch` scenario: 8 stream-ordered allocations and frees, the
/// four runs' poisons queued by four flushes before the stream work that follows them), split
/// into the real function's time and the library's; `isolate summary` prints it with the
/// other cost notes, each once. Off (the default), no such note.
#[test]
fn the_profile_note_counts_the_hooked_calls_by_kind() {
    let out = isolate(quarantine("batch"))
        .env("ISOLATE_PROFILE", "on")
        .run();
    out.assert_success();
    let t = out.only_trace();
    let info: Vec<String> = notes(t, NoteKind::Cost)
        .into_iter()
        .map(|n| n.text)
        .collect();
    let p: Vec<&String> = info
        .iter()
        .filter(|t| t.starts_with("hooks' time on the calling threads"))
        .collect();
    assert_eq!(p.len(), 1, "{info:?}");
    let p = p[0];
    // The number right after `key` in the note.
    let after = |key: &str| -> Option<u64> {
        let rest = &p[p.find(key)? + key.len()..];
        rest.trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    assert_eq!(after("): allocations"), Some(8), "{p}");
    assert_eq!(after("; frees"), Some(8), "{p}");
    assert_eq!(after("queueing deferred poisons"), Some(4), "{p}");
    let work = after("other stream work").unwrap();
    assert!(work >= 4, "{p}");
    assert!(p.contains(" in the real function, "), "{p}");
    assert_eq!(
        info.iter()
            .filter(|t| t.starts_with("isolation's time: "))
            .count(),
        1,
        "{info:?}"
    );
    let summary = t.analyzer_summary();
    let cost: Vec<&str> = summary["library_cost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    // isolation's time, the stream-order check's line, the call stacks, the hooks' time and
    // its parts: each once.
    assert_eq!(cost.len(), 5, "{cost:?}");
    assert!(cost[1].starts_with("stream order: "), "{cost:?}");
    assert!(cost[3].starts_with("hooks' time"), "{cost:?}");
    assert!(cost[4].starts_with("hooks' own time by part"), "{cost:?}");
    assert!(cost[4].contains("quarantining 8, "), "{cost:?}");
    let off = isolate(quarantine("batch")).run();
    off.assert_success();
    assert!(
        !notes(off.only_trace(), NoteKind::Cost)
            .iter()
            .any(|n| n.text.starts_with("hooks' time")),
    );
}

/// `ISOLATE_REUSE=on`: checked allocations of the default pool are kept and handed to the
/// next stream-ordered allocation of their size (the note counts both, and no range comes back
/// while it is quarantined), and while an allocation runs out of memory nothing is kept and what
/// is kept goes back to the driver first, so the program gets 11 of the 12 1 MiB blocks it gets
/// with reuse off and without the library (9 when the kept memory was neither given back nor
/// its keeping paused: tried; the one short is the last megabyte in pieces between blocks that
/// were kept and served again). Off (the default), nothing is kept. (Before issue 33 both got
/// 11: the retry did not wait for the frees it had queued on the release stream.)
#[test]
fn kept_checked_memory_is_served_again_and_given_back_when_memory_runs_out() {
    let mem = (12 * MIB).to_string();
    let mut got = Vec::new();
    for reuse in ["off", "on"] {
        let out = isolate(quarantine("kept").arg("1024"))
            .env("STANDIN_MEM_BYTES", &mem)
            .env("ISOLATE_QUARANTINE", "8MiB")
            .env("ISOLATE_REUSE", reuse)
            // The reserve off: what running out of memory does, alone.
            .env("ISOLATE_RESERVE", "0")
            .run();
        out.assert_success();
        has_line(&out, "reuse calls failed 0");
        // An allocation that ran out of memory and succeeded once the library gave memory
        // back leaves no runtime error behind, whether or not quarantined bytes went (with
        // reuse on, kept memory can be all that goes).
        has_line(&out, "errors left by allocations that succeeded 0");
        got.push(isolate_tests::number_after(&out.stdout, "allocated").unwrap());
        let t = out.only_trace();
        assert!(t.violations().is_empty(), "{:?}", t.violations());
        // The 512 KiB rounds only: running out of memory for a 3 MiB block rightly releases
        // the quarantine early.
        if let Some((f, a)) = reuses(t, 8 * MIB)
            .into_iter()
            .find(|(_, a)| a.size == 512 * 1024)
        {
            panic!("{reuse}: {a:?} got a range still held since {f:?}");
        }
        // No probe (ISOLATE_RESERVE=0), so the reserve is never known free: every release is made
        // by the free that went over the budget, before it returns (keeper.rs), and the device,
        // nearly full, has the memory back before the next allocation.
        let time = notes(t, NoteKind::Cost)
            .into_iter()
            .map(|n| n.text)
            .find(|n| n.starts_with("isolation's time: "))
            .unwrap();
        assert_eq!(keeper_counts(&time), (0, 0), "{reuse}: {time}");
        let note = notes(t, NoteKind::Cost)
            .into_iter()
            .map(|n| n.text)
            .find(|n| n.starts_with("reuse (ISOLATE_REUSE=on): "));
        if reuse == "off" {
            assert_eq!(note, None);
            continue;
        }
        let note = note.unwrap();
        let kept = isolate_tests::number_after(&note, "(ISOLATE_REUSE=on):").unwrap();
        let served = isolate_tests::number_after(&note, "freed,").unwrap();
        assert!(kept > 10 && served > 10 && served <= kept, "{note}");
        // The C API's counters read after the 200 rounds: its 200 allocations, and
        // `kept_allocs` equal to the exit note's served count (the 3 MiB blocks after are of
        // another size, so kept memory serves none of them).
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with("counters allocations"))
            .unwrap_or_else(|| panic!("{}", out.stdout));
        let allocs = isolate_tests::number_after(line, "allocations").unwrap();
        let kept_api = isolate_tests::number_after(line, "kept").unwrap();
        assert_eq!((allocs, kept_api), (200, served), "{line} / {note}");
    }
    // Off: 12, as the stand-in alone (the retry waits for the frees given back on the release
    // stream). On: 11; the kept 512 KiB blocks, served again, leave the last free megabyte in
    // two pieces.
    assert_eq!(got[0], 12, "as many 1 MiB blocks as without the library");
    assert!(got[1] >= got[0] - 1, "{got:?}");
}

/// The pool's used-memory counters (PyTorch's `memory_allocated`/`max_memory_allocated` on its
/// stream-ordered backend) read the same in isolate mode as without the preload: the freed
/// allocations isolation holds are not counted as the program's (hooks/pool.rs). The pool
/// itself does count them: without that hook this run read "1 live: used 0 3145728". The same
/// for its reserved memory (PyTorch's `memory_reserved()`): without the hook "reserved 0
/// 3145728" where the plain run has 1048576.
#[test]
fn pool_statistics_do_not_count_the_quarantine() {
    let plain = quarantine("pool").preload(false).run();
    plain.assert_success();
    has_line(
        &plain,
        "3 live: used 0 3145728 high 0 3145728 reserved 0 3145728",
    );
    has_line(
        &plain,
        "1 live: used 0 1048576 high 0 3145728 reserved 0 1048576",
    );
    has_line(
        &plain,
        "after reset: used 0 1048576 high 0 1048576 reserved 0 1048576",
    );
    has_line(&plain, "0 live: used 0 0 high 0 1048576 reserved 0 0");
    let out = isolate(quarantine("pool")).run();
    out.assert_success();
    let lines = |o: &Output| -> Vec<String> {
        o.stdout
            .lines()
            .filter(|l| l.contains(" live:") || l.starts_with("after reset"))
            .map(String::from)
            .collect()
    };
    assert_eq!(lines(&out), lines(&plain), "{}", out.stdout);
}

/// A stream-ordered free on a stream that is capturing a CUDA graph is the graph's business:
/// isolate mode passes it to the driver (nothing may be queued on a capturing stream that the
/// graph does not own, and the graph must free what it allocated), so the program sees exactly
/// what it sees without the preload (here: the next allocation of that size gets the address
/// back; the free of memory from before the capture is refused, as by the driver), and the
/// exit note counts both. An ordinary stream-ordered free is still held.
#[test]
fn a_free_during_graph_capture_goes_to_the_driver() {
    let plain = quarantine("capture").preload(false).run();
    plain.assert_success();
    has_line(&plain, "capture functions 1");
    has_line(&plain, "b==c 1");
    has_line(&plain, "cudaFreeAsync of earlier memory refused 1");
    let out = isolate(quarantine("capture")).run();
    out.assert_success();
    assert_eq!(out.stdout, plain.stdout);
    let t = out.only_trace();
    let info: Vec<String> = notes(t, NoteKind::Cost)
        .into_iter()
        .map(|n| n.text)
        .collect();
    assert!(
        info.iter().any(|t| t
            .starts_with("2 stream-ordered frees during CUDA graph capture went to the driver")),
        "{info:?}"
    );
    // The second free was not during capture: held, so one free poisoned.
    assert!(
        info.iter()
            .any(|t| t.starts_with("isolation's time: 1 frees poisoned")),
        "{info:?}"
    );
    // With the poison off the same free is held but neither written nor checked, and the
    // note says so (it read "1 frees poisoned (... written by the device once ...)").
    let off = isolate(quarantine("capture"))
        .env("ISOLATE_POISON", "off")
        .run();
    off.assert_success();
    let info: Vec<String> = notes(off.only_trace(), NoteKind::Cost)
        .into_iter()
        .map(|n| n.text)
        .collect();
    assert!(
        info.iter().any(|t| t.starts_with(
            "isolation's time: 1 frees quarantined unpoisoned (ISOLATE_POISON=off) ("
        ) && t.contains(" bytes, neither written nor checked; 0 by")),
        "{info:?}"
    );
}

/// Graph memory (allocated while its stream captures, through the driver's real capture calls)
/// belongs to the graph: with reuse on, the capture's allocation is not served from kept memory
/// (whose free in the capture the driver refuses), and the free of graph memory after the
/// capture goes to the driver, which refuses it, as without the library. Before the fix, on the
/// H100 in PyTorch's own tests: a kept block served in a capture, then "invalid argument" aborts
/// (2 tests); captured memory quarantined and poisoned after the capture, then 15 false device
/// faults and 2 false stale writes. Here: both frees' results differed from a plain run's.
#[test]
fn graph_memory_is_the_graphs() {
    let plain = quarantine("graph-memory").preload(false).run();
    plain.assert_success();
    has_line(&plain, "cudaFreeAsync in the capture 0");
    has_line(
        &plain,
        "cudaFreeAsync of graph memory after the capture refused 1",
    );
    for reuse in ["on", "off"] {
        let out = isolate(quarantine("graph-memory"))
            .env("ISOLATE_REUSE", reuse)
            .env("ISOLATE_QUARANTINE", "1MiB")
            .run();
        out.assert_success();
        assert_eq!(out.stdout, plain.stdout, "reuse {reuse}");
        let t = out.only_trace();
        assert!(t.violations().is_empty(), "{:?}", t.violations());
        if reuse == "on" {
            let note = notes(t, NoteKind::Cost)
                .into_iter()
                .map(|n| n.text)
                .find(|n| n.starts_with("reuse (ISOLATE_REUSE=on): "))
                .expect("reuse note");
            let kept = isolate_tests::number_after(&note, "(ISOLATE_REUSE=on):").unwrap();
            assert!(kept > 0, "blocks were kept before the capture: {note}");
        }
    }
}

/// A device that never finishes its work (a hung kernel) must not turn into a process that never
/// ends because of the exit check, which waits for the device: it is given a time limit (30 s;
/// here 0.5 s through the internal test hook), past which the exit goes on and says so. The
/// library before the limit hung in that exit for good.
#[test]
fn a_device_that_never_finishes_does_not_hold_up_the_exit() {
    let plain = quarantine("stuck")
        .preload(false)
        .timeout(std::time::Duration::from_secs(30))
        .run();
    plain.assert_success();
    let started = std::time::Instant::now();
    let out = isolate(quarantine("stuck"))
        .env("ISOLATE_TEST_EXIT_CHECK_MS", "500")
        .timeout(std::time::Duration::from_secs(30))
        .run();
    let took = started.elapsed();
    out.assert_success();
    out.assert_same_as(&plain);
    has_line(&out, "stand-in stuck switch 1");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    let said = "the exit check of the quarantine did not finish within 0.5 s (waiting for the \
                device?): the process exits without its results";
    assert_eq!(
        out.stderr.matches(said).count(),
        1,
        "said once, the destructor's check not started again:\n{}",
        out.stderr
    );
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    assert!(
        notes(t, NoteKind::Info).iter().any(|n| n.text == said),
        "{:?}",
        notes(t, NoteKind::Info)
    );
    // A free after the check gave up (an exit handler's) is recorded and returns as it would.
    has_line(&out, "late cudaFreeAsync 0");
    let events = t.events_by_seq();
    assert_eq!(
        events.len(),
        4,
        "two allocations and their frees: {events:?}"
    );
}

/// A stale write queued on a stream after that stream's last free, and checked after other
/// streams' frees pushed the allocation out of quarantine: the check records the freeing
/// stream's event again first (`release::refresh`), so it runs after the write and names the
/// right allocation. Before, the check waited only for the event of the last free, ran before
/// the write, gave the memory back, and the write landed in the next allocation made there
/// (reported as a stale write of *that* allocation, event 62). With the stream destroyed right
/// after the write, its event is recorded a last time at the destruction. With the stream
/// capturing a graph when the check comes (nothing may be recorded on it then), its event was
/// recorded at the capture's start (`release::capture_start`), after the write. Tried on the
/// stand-in: without that record, flushes of deferred poisons (which leave the record to the
/// check while no capture has begun) let the check run before the poison (a false finding of
/// all 65,536 bytes, then the write reported in a later allocation); with the record made at
/// the flush only, as before, the check waited for the poison but not the write (event 42's
/// allocation blamed). CUDA 10.0's `cuStreamBeginCapture` (no mode) is hooked the same way.
#[test]
fn a_stale_write_after_the_streams_last_free_is_seen_by_the_check() {
    for scenario in [
        "late",
        "late-destroyed",
        "late-captured",
        "late-captured-legacy",
    ] {
        let plain = quarantine(scenario).preload(false).run();
        plain.assert_success();
        let out = isolate(quarantine(scenario))
            .env("ISOLATE_QUARANTINE", "1MiB")
            .run();
        out.assert_success();
        out.assert_same_as(&plain);
        has_line(&out, "stream b calls failed 0");
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        let s = stats(t);
        assert!(s.quarantine_releases > 0, "{scenario}: {s:?}");
        let first = t.events_by_seq()[0];
        assert_eq!(first.api, Api::CudaMallocAsync);
        let v = t.violations();
        assert_eq!(v.len(), 1, "{scenario}: {v:?}");
        assert_eq!(
            (v[0].alloc_seq, v[0].first_offset, v[0].changed_bytes),
            (first.seq, 100, 8),
            "{scenario}: the stale write is the first allocation's: {v:?}"
        );
    }
}

/// A stale write queued on a freed block's stream while another thread is queuing that block's
/// deferred poison (the `flush-race` scenario; the stand-in takes 200 ms to queue the poison)
/// runs after the poison, so the check sees it. The hooks' lock-free "any poison waiting?" used
/// to turn false before the poison was queued: the write went first and the poison erased it (a
/// CI run of the `async` scenario missed its planted write so).
#[test]
fn a_stale_write_queued_while_another_thread_queues_the_poison_is_seen() {
    let plain = quarantine("flush-race").preload(false).run();
    plain.assert_success();
    let out = isolate(quarantine("flush-race"))
        .env("STANDIN_SLOW_FILL_MS", "200")
        .run();
    out.assert_success();
    out.assert_same_as(&plain);
    has_line(&out, "thread b calls failed 0");
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let first = t.events_by_seq()[0];
    assert_eq!(first.api, Api::CudaMallocAsync);
    let v = t.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(
        (v[0].alloc_seq, v[0].first_offset, v[0].changed_bytes),
        (first.seq, 100, 8),
        "{v:?}"
    );
}

/// Another tenant holds most of the device (the `pressure` scenario: 1.25 GiB of a 2 GiB
/// stand-in, as another process would, then 400 stream-ordered 4 MiB tensors freed one after
/// another): the quarantine (768 MiB allowed here) gives way while the device's free memory is
/// below the library's reserve (512 MiB: a sixteenth of the device, at least 1 GiB, at most a
/// quarter), instead of filling the device until nothing is left (four GPT-2 processes on one
/// H100, each with its quarter for a quarantine, failed with "out of memory" in a kernel
/// launch). The exit note says how often and how much; a plain run has every byte of the rest.
#[test]
fn the_quarantine_gives_way_while_the_device_is_short_of_memory() {
    let run = || {
        quarantine("pressure")
            .env("STANDIN_SYNC", "1")
            .env("STANDIN_MEM_BYTES", "2147483648")
            .env("ISOLATE_QUARANTINE", "768MiB")
    };
    let out = isolate(run()).run();
    out.assert_success();
    has_line(&out, "pressure calls failed 0");
    let least = isolate_tests::number_after(&out.stdout, "MiB").expect("the least free memory");
    // Without the reserve the quarantine takes all of it: 0 MiB.
    assert!(
        least >= 256,
        "the least free memory {least} MiB, below half the reserve:\n{}",
        out.stdout
    );
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let (cuts, bytes) = t
        .cost_note(isolate_trace::CostTopic::MemoryPressure)
        .map(|n| (n.size, n.value))
        .unwrap_or_else(|| panic!("no memory-pressure note:\n{}", out.stderr));
    assert!(cuts > 0 && bytes >= 128 << 20, "{cuts} cuts, {bytes} bytes");
    assert!(t.violations().is_empty());
    let plain = run().run();
    plain.assert_success();
    has_line(&plain, "pressure least free MiB 768");
}

/// Isolate's own kernels while the device is full (the `module-room` scenario: the program's
/// first allocation leaves less free than a module needs): they cannot be loaded then, so the
/// first block is checked on the host; a second later, with room again, they are loaded and
/// the next blocks are checked on the device. Before, a module that failed once was never
/// tried again: on the H100 a process whose first free came on a full device checked every
/// block on the host, 0.2 s for each 256 MiB block (tests/gpu/launch_room.sh).
#[test]
fn isolates_kernels_are_loaded_once_the_device_has_room() {
    let out = isolate(short_of_room("module-room"))
        .env("ISOLATE_QUARANTINE", "1MiB")
        .env("ISOLATE_RESERVE", "0")
        .run();
    out.assert_success();
    has_line(&out, "module-room calls failed 0");
    let t = out.only_trace();
    assert!(t.violations().is_empty(), "{:?}", t.violations());
    assert_eq!(
        where_checks_ran(t),
        "poison verified for 4 allocations on the device, 1 on the host"
    );
}

/// A first allocation made while the device had room, then the device filled (`module-early`):
/// the kernels are loaded at that allocation (`device::prepare`), not at the first free, which
/// comes on the full device: the 2 MiB blocks and the first are checked on the device (the
/// large block, over the quarantine's budget alone, is checked at its free the synchronous way,
/// which the stand-in does on the host). Loaded at the first free instead: 0 and 6.
#[test]
fn isolates_kernels_are_loaded_at_the_first_allocation() {
    let out = isolate(short_of_room("module-early"))
        .env("ISOLATE_QUARANTINE", "1MiB")
        .env("ISOLATE_RESERVE", "0")
        .run();
    out.assert_success();
    has_line(&out, "module-room calls failed 0");
    let t = out.only_trace();
    assert!(t.violations().is_empty(), "{:?}", t.violations());
    assert_eq!(
        where_checks_ran(t),
        "poison verified for 5 allocations on the device, 1 on the host"
    );
}

/// Isolation across `cudaDeviceReset` (the `reset` scenario: 8 blocks freed, a reset, 8 more,
/// then a 16-byte stale write through the last): the primary context made again after the reset
/// has the same handle on the stand-in, and the library used the old context's release stream
/// and kernels there: a check queued on the dead stream ran after its block had been freed
/// and handed out again, and found the later block's stale write in it (two stale writes, one
/// false). Now what isolation made and kept in a context is forgotten when it ends: one stale
/// write, the real one, and the second round's blocks checked on the device.
#[test]
fn a_device_reset_leaves_nothing_of_isolations_behind() {
    for budget in ["2MiB", "1GiB"] {
        let out = isolate(quarantine("reset"))
            .env("STANDIN_SYNC", "1")
            .env("ISOLATE_QUARANTINE", budget)
            .run();
        out.assert_success();
        has_line(&out, "reset cudaDeviceReset 0");
        has_line(&out, "reset calls failed 0");
        let t = out.only_trace();
        let v = t.violations();
        assert_eq!(v.len(), 1, "{budget}: {v:#?}");
        assert_eq!(
            (v[0].first_offset, v[0].changed_bytes),
            (4096, 16),
            "{budget}"
        );
        // The last block freed: the run's last free.
        let last_free = t
            .events()
            .iter()
            .rfind(|e| e.api == Api::CudaFreeAsync)
            .unwrap()
            .seq;
        assert_eq!(v[0].free_seq, last_free, "{budget}");
    }
}

/// Another process holds the device for a moment (the `crowded` scenario: a tenant takes all
/// but 4 MiB of a 64 MiB device and gives it back 60 ms later, as another isolate-mode
/// process's quarantine gives way within its next 20 ms of frees; meanwhile 16 MiB are asked
/// for). With the device below the reserve after this process gave back all it had, the
/// allocation is tried again every 20 ms for up to 200 ms, and succeeds; without the library
/// it fails (2), as it does with the reserve off (nothing waits then). On the H100, four model
/// processes: BERT's 238 MiB failed with 25 MiB free while the others held their quarantines.
#[test]
fn an_allocation_waits_briefly_for_other_processes_quarantines() {
    let run = || {
        quarantine("crowded")
            .env("STANDIN_SYNC", "1")
            .env("STANDIN_MEM_BYTES", (64 * MIB).to_string())
    };
    let plain = run().preload(false).run();
    plain.assert_success();
    has_line(&plain, "crowded allocation 2");
    let off = isolate(run()).env("ISOLATE_RESERVE", "0").run();
    off.assert_success();
    has_line(&off, "crowded allocation 2");
    let out = isolate(run()).run();
    out.assert_success();
    has_line(&out, "crowded allocation 0");
    has_line(&out, "crowded calls failed 0");
    let t = out.only_trace();
    let retries = notes(t, NoteKind::OomRetry);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    assert!(retries[0].text.contains("it succeeded"), "{:?}", retries[0]);
}

/// A kernel's first use is a query, not its launch (the `query-room` scenario: PyTorch's
/// softmax asks the occupancy of its kernel before it launches it; the sixteenth session's
/// GPT-2 failed there, in `cross_entropy`, four processes on one H100, after the launch retry
/// was built): the query needs room to load the kernel as its launch would, and gets the
/// library's memory back the same way. Without the query's hook (`hooks/room.rs`) the query
/// fails with out of memory (2), which a plain run never sees.
#[test]
fn a_query_that_loads_a_kernel_gets_the_quarantine_back() {
    let run = || short_of_room("query-room");
    let plain = run().preload(false).run();
    plain.assert_success();
    has_line(&plain, "query-room occupancy query 0: 8 blocks");
    has_line(&plain, "launch-room first launch 0");
    let out = isolate(run())
        .env("ISOLATE_QUARANTINE", "100%")
        .env("ISOLATE_RESERVE", "0")
        .run();
    out.assert_same_as(&plain);
    let t = out.only_trace();
    let retries = notes(t, NoteKind::OomRetry);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    assert_eq!(retries[0].size, 0);
    assert!(
        retries[0]
            .text
            .starts_with("cuOccupancyMaxActiveBlocksPerMultiprocessor ran out of memory")
            && retries[0].text.contains("it ran"),
        "{:?}",
        retries[0]
    );
    // In log mode the query is the driver's own (nothing of the library's is held).
    let log = run().run();
    log.assert_same_as(&plain);
}

/// A launch that runs out of memory because the quarantine holds it (the `launch-room`
/// scenario: 56 MiB freed into quarantine on a 64 MiB stand-in, then a kernel's first launch,
/// which needs 16 MiB free as a lazily loaded module does: `STANDIN_LAUNCH_ROOM`): the library
/// gives memory back and launches again, so the program gets what a plain run gets (the H100:
/// four model processes, GPT-2's and BERT's launches failed with "out of memory" while every
/// allocation succeeded). One `OomRetry` note, of size 0 (no allocation asked). The reserve is
/// off here, so that only the retry can help.
#[test]
fn a_launch_out_of_memory_gets_the_quarantine_back_and_runs() {
    let run = || short_of_room("launch-room");
    let plain = run().preload(false).run();
    plain.assert_success();
    has_line(&plain, "launch-room first launch 0");
    let out = isolate(run())
        .env("ISOLATE_QUARANTINE", "100%")
        .env("ISOLATE_RESERVE", "0")
        .run();
    out.assert_same_as(&plain);
    let t = out.only_trace();
    let retries = notes(t, NoteKind::OomRetry);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    assert_eq!(retries[0].size, 0);
    assert!(retries[0].value >= 8 * MIB, "{:?}", retries[0]);
    assert!(retries[0].text.contains("it ran"), "{:?}", retries[0]);
    assert!(t.violations().is_empty());
    // The summary counts it as a launch's, not an allocation's.
    let o = std::process::Command::new(isolate_tests::analyzer_path())
        .args(["summary", "--json"])
        .arg(&t.path)
        .output()
        .expect("isolate summary");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("\"launch_oom_retries\": 1") && text.contains("\"oom_retries\": 0"),
        "{text}"
    );
}

/// The `QuarantineBudget` note's (bytes, processes sharing the device's share).
fn budget_note(out: &Output) -> (u64, u64) {
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    t.cost_note(isolate_trace::CostTopic::QuarantineBudget)
        .map(|n| (n.size, n.value))
        .unwrap_or_else(|| panic!("no quarantine-budget note:\n{}", out.stderr))
}

/// Several isolate-mode processes on one device split `ISOLATE_QUARANTINE=25%` between them
/// (`ISOLATE_TENANTS=share`, the default): two other live processes registered for the
/// stand-in device (`STANDIN_UUID`), and a third whose process is gone, make the budget a third
/// of the process's own share; the gone one's file is removed, and so is the process's own at
/// exit. With `ISOLATE_TENANTS=alone`, or alone on the device, the whole share.
#[test]
fn isolate_processes_on_one_device_share_its_quarantine_budget() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = std::path::PathBuf::from(format!("/dev/shm/isolate-tenants-{uid}"));
    if !std::path::Path::new("/dev/shm").is_dir() {
        panic!("this test needs /dev/shm (the registry of a device's tenants lives there)");
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    }
    let uuid = format!("5e1f7e5700000000{:016x}", std::process::id() as u64);
    let mut others: Vec<std::process::Child> = (0..2)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap()
        })
        .collect();
    // Above the largest pid Linux hands out (pid_max is at most 2^22): never a live process,
    // where a real child's pid, once it ended, could be handed to another on a busy machine.
    let gone_pid: u32 = (1 << 22) + 12_345;
    let file = |pid: u32| dir.join(format!("{uuid}.{pid}"));
    for pid in others.iter().map(|c| c.id()).chain([gone_pid]) {
        std::fs::write(file(pid), b"").unwrap();
    }
    let run = |tenants: &str| {
        let out = isolate(quarantine("budget"))
            .env("STANDIN_UUID", &uuid)
            .env("ISOLATE_TENANTS", tenants)
            .run();
        out.assert_success();
        out
    };
    let shared = run("share");
    let alone = run("alone");
    let (b_shared, n_shared) = budget_note(&shared);
    let (b_alone, n_alone) = budget_note(&alone);
    let dead_left = file(gone_pid).exists();
    let own_left = file(shared.only_trace().header.pid).exists();
    for c in &mut others {
        let _ = c.kill();
        let _ = c.wait();
    }
    for c in &others {
        let _ = std::fs::remove_file(file(c.id()));
    }
    assert_eq!(
        n_shared, 3,
        "itself and the two live ones:\n{}",
        shared.stderr
    );
    // The summary says so (and says nothing of a budget not shared).
    let said = |out: &Output| {
        let s = out.only_trace().analyzer_summary();
        s["library_cost"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l.as_str())
            .find(|l| l.contains("quarantine budget:"))
            .map(str::to_string)
    };
    assert!(
        said(&shared).is_some_and(|l| l.contains("split among up to 3 isolate-mode processes")),
        "{:?}",
        said(&shared)
    );
    assert_eq!(said(&alone), None);
    assert_eq!(b_shared, b_alone / 3, "{b_shared} of {b_alone}");
    assert_eq!(n_alone, 0);
    assert!(b_alone > 0);
    assert!(
        !dead_left,
        "the gone process's file is removed by whoever counts"
    );
    assert!(!own_left, "a process's own file is removed at its exit");
    // Alone on the device (its own stand-in device: no STANDIN_UUID): the whole share, 1.
    let own = isolate(quarantine("budget")).run();
    own.assert_success();
    assert_eq!(budget_note(&own), (b_alone, 1));
    // A budget in bytes is never split.
    let bytes = isolate(quarantine("budget"))
        .env("STANDIN_UUID", &uuid)
        .env("ISOLATE_QUARANTINE", "4MiB")
        .run();
    bytes.assert_success();
    assert_eq!(budget_note(&bytes), (4 << 20, 0));
}

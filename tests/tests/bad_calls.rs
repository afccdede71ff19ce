//! Calls that fail: same code with and without the preload, and still one event each, with
//! the code the caller got. A hook that panics inside still returns the real result.

use isolate_tests::Run;
use isolate_trace::{Api, EndReason};

#[test]
fn failed_calls_are_events_with_their_codes() {
    let both = Run::program("bad_calls").run_both();
    let out = &both.traced;
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(t, None);
    let ev = t.events_by_seq();
    // The paths the program meant to take were taken (the stand-in's documented codes).
    assert_eq!(
        (ev[0].api, ev[0].result),
        (Api::CuMemAlloc, 3),
        "before cuInit: {:?}",
        ev[0]
    );
    assert_eq!(
        (ev[1].api, ev[1].result),
        (Api::CuMemFree, 3),
        "before cuInit: {:?}",
        ev[1]
    );
    assert_eq!(
        (ev[2].api, ev[2].result),
        (Api::CuMemAlloc, 201),
        "no context: {:?}",
        ev[2]
    );
    assert_eq!(ev[2].device, -1);
    assert_eq!(
        (ev[3].api, ev[3].result),
        (Api::CuMemAlloc, 1),
        "NULL out-pointer: {:?}",
        ev[3]
    );
    assert_eq!(
        (ev[4].api, ev[4].result),
        (Api::CuMemAlloc, 1),
        "size 0: {:?}",
        ev[4]
    );
    assert_eq!(
        (ev[5].api, ev[5].result),
        (Api::CuMemAlloc, 2),
        "SIZE_MAX: {:?}",
        ev[5]
    );
    let failed = ev.iter().filter(|e| !e.ok()).count();
    assert!(failed >= 30, "only {failed} failed calls recorded");
    // Runtime failures are recorded under the runtime name only.
    let rt_fail = ev.iter().filter(|e| e.api.is_runtime() && !e.ok()).count();
    assert!(rt_fail >= 15, "{rt_fail} failed runtime calls");
    // The other thread had no context: its driver events say so.
    let other: Vec<_> = t
        .threads()
        .into_iter()
        .filter(|&tid| tid != t.header.pid)
        .collect();
    assert_eq!(other.len(), 1, "one other thread: {other:?}");
    let theirs = t.events_of_thread(other[0]);
    assert_eq!(theirs.len(), 4);
    assert_eq!((theirs[0].result, theirs[1].result), (201, 201));
    // The driver calls made before the runtime made the primary context current name no
    // device, the runtime's after it device 0.
    let devices: Vec<i32> = theirs.iter().map(|e| e.device).collect();
    assert_eq!(devices, [-1, -1, 0, 0], "{theirs:?}");
    // Without asking cuCtxGetDevice while there was none, which fails (a line in the driver's
    // error log, CUDA_LOG_FILE, each: 3 before the eighteenth session).
    assert_eq!(
        isolate_tests::number_after(&out.stderr, "standin_ctx_device_errors"),
        Some(0),
        "{}",
        out.stderr
    );
}

/// Isolation holds freed memory back, but a call that fails without it (a double free, a free
/// of an address never handed out, an unmap of a range never mapped) fails the same way with it.
#[test]
fn failed_calls_keep_their_codes_in_isolate_mode() {
    let plain = Run::program("bad_calls").preload(false).run();
    let out = Run::program("bad_calls")
        .env("ISOLATE_MODE", "isolate")
        .run();
    out.assert_same_as(&plain);
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(t, None);
}

fn same_under_test_panic(program: &str) {
    let plain = Run::program(program).preload(false).run();
    let out = Run::program(program).env("ISOLATE_TEST_PANIC", "1").run();
    // Every return code and out-parameter the program printed is the same.
    out.assert_same_as(&plain);
    for t in &out.traces {
        assert!(
            t.events().is_empty(),
            "recording panicked, so nothing was recorded: {}",
            t.summary()
        );
    }
}

#[test]
fn test_panic_leaves_return_codes_unchanged_runtime() {
    same_under_test_panic("rt_basic");
}

#[test]
fn test_panic_leaves_return_codes_unchanged_bad_calls() {
    same_under_test_panic("bad_calls");
}

#[test]
fn test_panic_leaves_return_codes_unchanged_driver() {
    same_under_test_panic("drv_static");
    same_under_test_panic("drv_linked");
    same_under_test_panic("rt_vmm");
}

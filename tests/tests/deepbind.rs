//! A plugin opened with `RTLD_DEEPBIND` (issue 18, item 8: it was unobserved, no trace). Its own
//! dependencies come before the global scope, so its calls to the runtime and the driver bound
//! straight to them, past the preloaded hooks. `tests/programs/deepbind/`: a host (`deepbind`)
//! opens `libdeepbind_plugin.so` and calls it; the plugin allocates and frees through the runtime
//! (called, and through its address), the driver, the driver's resolver and its own `dlsym`.
//!
//! Each case is held against a run without the preload: the same output, the same end, and the
//! plugin's `probe 2` line shows it really was opened with `RTLD_DEEPBIND` (its own definition
//! before the one `libdeepbind_other.so` put in the global scope). Where its function pointers
//! lead is on stderr (`plugin: cudaFree in FILE`).

use isolate_tests::{Output, Run};
use isolate_trace::{Api, EndReason};

/// `deepbind FLAGS WHERE [LIB]`: see `tests/programs/deepbind/main.c`.
fn deepbind(flags: &str, place: &str, lib: Option<&str>) -> Run {
    let run = Run::program("deepbind").args([flags, place]);
    match lib {
        Some(l) => run.arg(l),
        None => run,
    }
}

const NOW: Option<&str> = Some("libdeepbind_plugin_now.so");

/// Every way of opening it: flags, where from, which build of the plugin (lazy binding, or
/// `-z now`: every slot bound at load and in the read-only RELRO pages).
const CASES: &[(&str, &str, Option<&str>)] = &[
    ("now", "path", None),
    ("lazy", "path", None),
    ("now", "path", NOW),
    ("lazy", "path", NOW),
    // The bare name is found only through the host's DT_RUNPATH ($ORIGIN).
    ("now", "name", None),
    ("lazy", "name", None),
    ("now", "origin", None),
];

fn has_line(out: &Output, line: &str) {
    assert!(
        out.stdout.lines().any(|l| l == line),
        "{}: no line {line:?} in:\n{}",
        out.describe,
        out.stdout
    );
}

fn has_err_line(out: &Output, line: &str) {
    assert!(
        out.stderr.lines().any(|l| l == line),
        "{}: no line {line:?} on stderr:\n{}",
        out.describe,
        out.stderr
    );
}

/// The stdout lines that do not start with any of `skip`.
fn lines_but<'a>(out: &'a Output, skip: &[&str]) -> Vec<&'a str> {
    out.stdout
        .lines()
        .filter(|l| !skip.iter().any(|s| l.starts_with(s)))
        .collect()
}

#[test]
fn the_plugin_works_without_the_preload() {
    for &(flags, place, lib) in CASES {
        let out = deepbind(flags, place, lib).preload(false).run();
        out.assert_success();
        has_line(&out, &format!("dlopen {flags} {place}: 1, dlerror clear"));
        has_line(&out, "probe 2");
        has_line(&out, "plugin_run 0");
        has_err_line(&out, "plugin: cudaFree in libcudart.so.13");
        assert!(out.traces.is_empty());
    }
}

/// Log mode: each of the plugin's eight calls is one event, under the name it called, with the
/// results of a run without the preload; its slots lead to our hooks, the launch hooks excepted
/// (the launch check is off).
#[test]
fn every_call_of_a_deepbind_plugin_is_traced() {
    for &(flags, place, lib) in CASES {
        let both = deepbind(flags, place, lib).run_both();
        let out = &both.traced;
        out.assert_success();
        has_line(out, "probe 2");
        has_line(out, "plugin_run 0");
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        out.assert_trace_matches(t, None);
        let c = t.counts();
        for api in ["cudaMalloc", "cudaFree", "cuMemAlloc_v2", "cuMemFree_v2"] {
            assert_eq!(
                c.get(api),
                Some(&2),
                "{flags} {place} {lib:?}: {api} in {c:?}"
            );
        }
        has_err_line(out, "plugin: cudaFree in libisolate.so");
        has_err_line(out, "plugin: cuLaunchKernel in libcuda.so.1");
        assert!(
            !out.stderr.contains("not observed"),
            "{}: {}",
            out.describe,
            out.stderr
        );
        t.assert_no_false_findings();
    }
}

/// Isolate mode: the plugin's free is held back and poisoned as any other, its next allocation
/// gets another address, and its write through the freed pointer is found; every other line is
/// what a run without the preload prints. The launch check is on: the launch hooks too.
#[test]
fn isolate_mode_holds_the_plugins_free() {
    for &(flags, place, lib) in &[CASES[0], CASES[1], CASES[3]] {
        let plain = deepbind(flags, place, lib).preload(false).run();
        has_line(&plain, "a after free bytes: all 0x11");
        has_line(&plain, "b==a 1");
        has_line(&plain, "b changed 1");
        let out = deepbind(flags, place, lib)
            .env("ISOLATE_MODE", "isolate")
            .run();
        out.assert_success();
        has_line(&out, "a after free bytes: all 0xff");
        has_line(&out, "b==a 0");
        has_line(&out, "b changed 0");
        let skip = ["a after free bytes", "b==a", "b changed"];
        assert_eq!(
            lines_but(&out, &skip),
            lines_but(&plain, &skip),
            "{}",
            out.describe
        );
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        assert_eq!(t.header.mode, "isolate");
        out.assert_trace_matches(t, None);
        let a = t.events_by_seq()[0];
        assert_eq!(a.api, Api::CudaMalloc);
        let v = t.violations();
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(
            (v[0].ptr, v[0].first_offset, v[0].changed_bytes),
            (a.ptr, 100, 1)
        );
        assert_eq!(v[0].free_api, Api::CudaFree);
        has_err_line(&out, "plugin: cudaFree in libisolate.so");
        has_err_line(&out, "plugin: cuLaunchKernel in libisolate.so");
    }
}

/// `ISOLATE_MODE=off`: nothing is rewritten, nothing written.
#[test]
fn mode_off_rewrites_nothing() {
    for &(flags, place, lib) in &[CASES[0], CASES[1], CASES[2]] {
        let plain = deepbind(flags, place, lib).preload(false).run();
        let out = deepbind(flags, place, lib).env("ISOLATE_MODE", "off").run();
        out.assert_same_as(&plain);
        out.assert_success();
        assert!(out.traces.is_empty());
        has_err_line(&out, "plugin: cudaFree in libcudart.so.13");
        has_err_line(&out, "plugin: cuLaunchKernel in libcuda.so.1");
    }
}

/// Without `RTLD_DEEPBIND` the stub jumps to glibc's `dlopen` with the caller's return address:
/// the bare name is still found through the caller's DT_RUNPATH (a wrapper calling `dlopen`
/// would search ours, which has none, and fail), and the plugin binds to the global scope (the
/// other library's `probe`, our exports) as any library does.
#[test]
fn a_plain_dlopen_still_searches_the_callers_runpath() {
    for place in ["name", "origin"] {
        let both = deepbind("plain", place, None).run_both();
        let out = &both.traced;
        out.assert_success();
        has_line(out, &format!("dlopen plain {place}: 1, dlerror clear"));
        has_line(out, "probe 1");
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        out.assert_trace_matches(t, None);
        has_err_line(&both.plain, "plugin: cudaFree in libcudart.so.13");
        has_err_line(out, "plugin: cudaFree in libisolate.so");
    }
}

/// A `RTLD_DEEPBIND` open that fails fails the same way, with the same `dlerror` message.
#[test]
fn a_failed_deepbind_open_fails_the_same_way() {
    for (flags, place) in [("now", "name"), ("lazy", "path"), ("now", "origin")] {
        let both = deepbind(flags, place, Some("libdeepbind_nosuch.so")).run_both();
        assert_eq!(both.traced.code(), Some(3), "{}", both.traced.describe);
        has_line(
            &both.traced,
            &format!("dlopen {flags} {place}: 0, dlerror set"),
        );
        let message = |o: &Output| {
            o.stderr
                .lines()
                .find(|l| l.starts_with("deepbind: "))
                .map(str::to_string)
        };
        assert!(message(&both.plain).is_some(), "{}", both.plain.stderr);
        assert_eq!(message(&both.traced), message(&both.plain));
        assert!(both.traced.traces.is_empty());
    }
}

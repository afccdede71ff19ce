//! The launch check's evidence rule and the textbook use-after-free (issue 30, items 1 and 2),
//! on the stand-in.
//!
//! - `launch_rule.c`: one kernel per case of the rule (docs/isolation.md, "The launch check's
//!   evidence"): a whole 8-byte parameter holding exactly the freed allocation's start is a
//!   stale launch; anything weaker (a word inside a struct passed by value, even exactly the
//!   start; a whole parameter inside the allocation but not at its start; a packed buffer with
//!   no layout) is a suspect (a stale value: listed, never counted); a packed buffer is read by
//!   the kernel's layout; a kernel with no layout is said so; a library kernel (CUkernel) is
//!   named through `cuKernelGetName` and read through `cuKernelGetParamInfo`.
//! - `textbook.c`: `cudaMalloc(&p, 4096); cudaFree(p); kernel<<<1,1>>>(p)` writing `p[0] = 42`,
//!   `cudaDeviceReset(); return 0;`: a stale launch at the launch, the stale write found before
//!   the reset takes the memory away, every finding of the stderr in the trace; in guard mode
//!   the fault is a recorded device fault.

use isolate_tests::{Output, Run, Trace};
use isolate_trace::{EndReason, NoteKind, Record};
use serde_json::Value;

fn isolate(run: Run) -> Run {
    run.env("ISOLATE_MODE", "isolate")
}

fn stderr_lines<'a>(out: &'a Output, what: &str) -> Vec<&'a str> {
    out.stderr.lines().filter(|l| l.contains(what)).collect()
}

fn notes_text(t: &Trace, kind: NoteKind) -> Vec<String> {
    t.records
        .iter()
        .filter_map(|r| match r {
            Record::Note(n) if n.kind == kind => Some(n.text.clone()),
            _ => None,
        })
        .collect()
}

fn kernels(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kernel"].as_str().unwrap().to_string())
        .collect();
    k.sort();
    k
}

/// Each case of the rule: 2 stale launches (k_packed at its pointer, k_ex), 4 suspects
/// (k_struct_base's exact start inside a struct, k_lib_ptr's whole parameter inside A,
/// k_packed's word inside its struct, k_nolayout's words), none of them named "?"; k_divider's
/// integer words lie in a 320-byte struct, which isolate mode does not read (guard mode does:
/// [`wide_structs_are_read_in_guard_mode_alone`]); k_nolayout_p's
/// parameters could not be read and the exit note says so. Before the rule, k_divider's words
/// were STALE LAUNCHes (the BERT false alarm) and k_lib_ptr was neither read nor named.
#[test]
fn a_stale_launch_needs_evidence_and_a_suspect_is_listed_apart() {
    let plain = Run::program("launch_rule").preload(false).run();
    let out = isolate(Run::program("launch_rule")).run();
    out.assert_same_as(&plain);
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let stale = stderr_lines(&out, "STALE LAUNCH");
    assert_eq!(stale.len(), 2, "{}", out.stderr);
    for (kernel, at) in [
        ("k_packed", "parameter 0, byte 0"),
        ("k_ex", "parameter 0, byte 0"),
    ] {
        assert!(
            stale
                .iter()
                .any(|l| l.contains(&format!("kernel {kernel} got")) && l.contains(at)),
            "{kernel} {at}: {}",
            out.stderr
        );
    }
    for suspect in ["k_divider", "k_struct_base", "k_lib_ptr", "k_nolayout"] {
        assert!(!out.stderr.contains(suspect), "{suspect}: {}", out.stderr);
    }
    let launches: Vec<String> = t.stale_launches().into_iter().map(|l| l.kernel).collect();
    assert_eq!(launches.len(), 2, "{launches:?}");
    let mut values: Vec<(String, u32)> = t
        .stale_values()
        .into_iter()
        .map(|l| (l.kernel, l.param_offset))
        .collect();
    values.sort();
    assert_eq!(
        values,
        [
            ("k_lib_ptr".to_string(), 0),
            ("k_nolayout".to_string(), 0),
            ("k_packed".to_string(), 16),
            ("k_struct_base".to_string(), 24)
        ]
    );
    let info = notes_text(t, NoteKind::Cost);
    assert!(
        info.iter().any(|n| n.contains("launch check:")
            && n.contains("2 kernels had no parameter layout")
            && n.contains("1 of their launches could not be read")),
        "{info:#?}"
    );
    // The analyzer: the stale launches count, the suspects are listed apart and do not.
    let s = t.analyzer_summary();
    assert_eq!(s["stale_launch_count"], 2, "{s:#}");
    assert_eq!(s["stale_value_count"], 4, "{s:#}");
    assert_eq!(kernels(&s["stale_launches"]), ["k_ex", "k_packed"]);
    assert_eq!(
        kernels(&s["stale_values"]),
        ["k_lib_ptr", "k_nolayout", "k_packed", "k_struct_base"]
    );
    // Failed kernel queries (each a line in a real driver's error log, CUDA_LOG_FILE): a
    // kernel is asked as the kind that answered last first (a CUkernel before any answered),
    // so one fails where the kind changes from the kernel before. The kinds in launch order:
    // function (k_divider: asked as a CUkernel first, 1), function (0), CUkernel (k_lib_ptr, 1),
    // function (k_packed, 1), two without any layout (k_nolayout, k_nolayout_p: neither count
    // answers, 2 each; the name asked of cuFuncGetName, which answers), CUkernel (k_ex, 1).
    // Every kind change in this program is a line; a program of one kind has one at most.
    let errors = isolate_tests::number_after(&out.stderr, "standin_kernel_query_errors").unwrap();
    assert_eq!(
        errors,
        [1, 0, 1, 1, 2, 2, 1].iter().sum::<i64>(),
        "{}",
        out.stderr
    );
    // Without the counts (an older driver, or 580's): the failing index past the last
    // parameter too, for the three functions and the two library kernels.
    let old = isolate(Run::program("launch_rule"))
        .env("STANDIN_NO_PARAM_COUNT", "1")
        .run();
    old.assert_same_as(&plain);
    assert_eq!(old.only_trace().stale_values().len(), 4);
    let errors = isolate_tests::number_after(&old.stderr, "standin_kernel_query_errors").unwrap();
    assert_eq!(errors, 8 + 5, "{}", old.stderr);
    // The launch's stack reaches the finding (and the allocation's and the free's).
    for l in s["stale_launches"].as_array().unwrap() {
        for k in ["launch_stack", "alloc_stack", "free_stack"] {
            assert!(
                l[k]["frames"].as_array().is_some_and(|f| !f.is_empty()),
                "{k}: {l:#}"
            );
        }
    }
}

/// Isolate mode reads only what can be evidence or a use (whole 8-byte parameters and structs
/// of at most 64 bytes), in both tiers: the same two stale launches, and the suspects but the
/// one in k_divider's 320-byte struct (a wide parameter block, as cuDNN's, whose words can never
/// be a finding). Guard mode reads them all, in both tiers (a fault names its suspects).
#[test]
fn wide_structs_are_read_in_guard_mode_alone() {
    for check in ["full", "fast"] {
        let out = isolate(Run::program("launch_rule"))
            .env("ISOLATE_CHECK", check)
            .run();
        out.assert_success();
        let t = out.only_trace();
        let mut launches: Vec<String> = t.stale_launches().into_iter().map(|l| l.kernel).collect();
        launches.sort();
        assert_eq!(launches, ["k_ex", "k_packed"], "{check}: {}", out.stderr);
        let mut values: Vec<String> = t.stale_values().into_iter().map(|l| l.kernel).collect();
        values.sort();
        assert_eq!(
            values,
            ["k_lib_ptr", "k_nolayout", "k_packed", "k_struct_base"],
            "{check}: {}",
            out.stderr
        );
        let guarded = isolate(Run::program("launch_rule"))
            .env("ISOLATE_CHECK", check)
            .env("ISOLATE_GUARD", "on")
            .run();
        let t = guarded.only_trace();
        assert!(
            t.stale_values().iter().any(|l| l.kernel == "k_divider"),
            "{check}: {}",
            guarded.stderr
        );
    }
}

/// The textbook program in isolate mode, with `cudaDeviceReset()` before `return 0`: the
/// launch is a stale launch (the kernel's only parameter is exactly the freed pointer, a
/// library kernel named k_write42), and the write is found before the reset takes the memory:
/// one STALE WRITE on stderr and the same Violation in the trace. Before the fix: no stale
/// launch (the CUkernel's layout was not read) and no stale write (the exit check ran after
/// the reset, on memory that was gone). The runtime's reset is `cuDevicePrimaryCtxReset`, the
/// first export, as libcudart 13 asks for it (version 7000); with only the `_v2` hooked the
/// exit check read the memory the reset had zeroed: a 4,096-byte "stale write" (the H200:
/// nothing).
#[test]
fn the_textbook_use_after_free_is_found_before_the_reset() {
    for size in ["4096", "4194304"] {
        let plain = Run::program("textbook").arg(size).preload(false).run();
        let out = isolate(Run::program("textbook").arg(size)).run();
        out.assert_same_as(&plain);
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        let stale = stderr_lines(&out, "STALE LAUNCH");
        assert_eq!(stale.len(), 1, "{}", out.stderr);
        assert!(
            stale[0].contains("kernel k_write42 got") && stale[0].contains("parameter 0, byte 0"),
            "{}",
            out.stderr
        );
        let writes = stderr_lines(&out, "STALE WRITE");
        assert_eq!(writes.len(), 1, "{}", out.stderr);
        assert!(writes[0].contains("first at offset 0"), "{}", out.stderr);
        let v = t.violations();
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!((v[0].first_offset, v[0].changed_bytes), (0, 4));
        let l = t.stale_launches();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].ptr, l[0].alloc_ptr);
        let s = t.analyzer_summary();
        assert_eq!(s["poison_violation_count"], 1, "{s:#}");
        assert_eq!(s["stale_launch_count"], 1, "{s:#}");
    }
}

/// Without the reset the exit check finds the write, and what it prints is in the trace.
#[test]
fn the_exit_checks_finding_of_a_c_program_is_in_the_trace() {
    let out = isolate(Run::program("textbook").arg("4096").arg("noreset")).run();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    assert_eq!(stderr_lines(&out, "STALE WRITE").len(), 1, "{}", out.stderr);
    assert_eq!(t.violations().len(), 1);
    let s = t.analyzer_summary();
    assert_eq!(s["poison_violation_count"], 1, "{s:#}");
}

/// Guard mode: the write faults; `cudaDeviceSynchronize` returns 700 and the fault is a
/// recorded device fault naming k_write42 as the stale launch, whatever the size; with only a
/// `cudaDeviceReset` after the launch (nobody waits for the kernel), the reset's hook
/// synchronises first and records the same; with neither (`return 0;` right after the launch),
/// the exit asks the device and records the same. The stand-in's runtime asks for the driver's
/// functions as libcudart 13 does (`cuCtxSynchronize` at 13000, `cuDevicePrimaryCtxReset` at
/// 7000). Before the fix (hooks for `cuCtxSynchronize_v2` and the first `cuDevicePrimaryCtxReset`,
/// the exit's fault check): no device fault in any of the four, as on the H200.
#[test]
fn guard_mode_records_the_textbook_fault() {
    for args in [
        &["4096", "sync"][..],
        &["4194304", "sync"],
        &["4096"],
        &["4096", "noreset"],
    ] {
        let mut run = Run::program("textbook");
        let mut plain = Run::program("textbook").preload(false);
        for a in args {
            run = run.arg(*a);
            plain = plain.arg(*a);
        }
        let out = isolate(run).env("ISOLATE_GUARD", "on").run();
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        if args.contains(&"sync") {
            assert!(
                out.stdout.contains("cudaDeviceSynchronize 700"),
                "{args:?}: {}",
                out.stdout
            );
        }
        let faults = notes_text(t, NoteKind::DeviceFault);
        assert_eq!(faults.len(), 1, "{args:?}: {}", out.stderr);
        let l = t.stale_launches();
        assert_eq!(l.len(), 1, "{args:?}: {l:#?}");
        assert_eq!(l[0].kernel, "k_write42");
        let s = t.analyzer_summary();
        assert_eq!(s["device_faults"].as_array().unwrap().len(), 1, "{s:#}");
        assert_eq!(s["stale_launch_count"], 1, "{s:#}");
    }
}

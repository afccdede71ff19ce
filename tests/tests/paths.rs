//! The ways a program reaches device memory (call-path notes, sections 1–4): the runtime
//! linked dynamically, a static runtime through `cuGetProcAddress`, the driver linked by name,
//! expandable segments through `cudaGetDriverEntryPointByVersion`. Each allocation is one
//! event, under the name of the layer the program called.

use isolate_tests::{Both, Output, Run, standin_bin};
use isolate_trace::{Api, EndReason, Kind, Memory, Record};

/// Runs `run` with and without the preload (same stdout, same end), and holds the one trace
/// against the program's `ev` lines.
fn traced(run: Run) -> Both {
    let both = run.run_both();
    both.traced.assert_success();
    let t = both.traced.only_trace();
    t.assert_complete(EndReason::Exit);
    both.traced.assert_trace_matches(t, None);
    both
}

fn has_line(out: &Output, line: &str) {
    assert!(
        out.stdout.lines().any(|l| l == line),
        "no line {line:?} in:\n{}",
        out.stdout
    );
}

#[test]
fn rt_basic_one_runtime_event_per_call() {
    let both = traced(Run::program("rt_basic"));
    let t = both.traced.only_trace();
    // Only runtime names: the driver calls the runtime makes underneath are not recorded again.
    for e in t.events() {
        assert!(
            e.api.is_runtime(),
            "driver event inside a runtime call: {e:?}"
        );
        if e.ok() {
            assert_eq!(e.device, 0, "device of a successful call: {e:?}");
        }
    }
    let c = t.counts();
    assert_eq!(c.get("cudaMalloc"), Some(&4));
    assert_eq!(c.get("cudaFree"), Some(&8));
    assert_eq!(c.get("cudaMallocAsync"), Some(&3));
    assert_eq!(c.get("cudaFreeAsync"), Some(&4));
    for api in [
        "cudaMallocAsync_ptsz",
        "cudaMallocFromPoolAsync",
        "cudaMallocFromPoolAsync_ptsz",
        "cudaMallocManaged",
        "cudaMallocPitch",
        "cudaMalloc3D",
        "cudaMallocHost",
        "cudaHostAlloc",
        "cudaHostRegister",
        "cudaHostUnregister",
    ] {
        assert_eq!(c.get(api), Some(&1), "{api} in {c:?}");
    }
    assert_eq!(c.get("cudaFreeAsync_ptsz"), Some(&2));
    assert_eq!(c.get("cudaFreeHost"), Some(&2));
    // Host memory is marked host; managed managed.
    for e in t.events() {
        let host = matches!(
            e.api.name(),
            "cudaMallocHost"
                | "cudaHostAlloc"
                | "cudaFreeHost"
                | "cudaHostRegister"
                | "cudaHostUnregister"
        );
        assert_eq!(e.api.memory() == Memory::Host, host, "{e:?}");
        assert_eq!(e.api.is_host(), host);
    }
    assert_eq!(Api::CudaMallocManaged.memory(), Memory::Managed);
    has_line(&both.traced, "cudaMemcpy D2H 0 round_trip 1");
}

/// The runtime fetched with `dlsym` on its handle (ctypes, cffi, JIT runtimes): each call is one
/// event under its runtime name, in log and in isolate mode, with the results of a run without
/// the preload. A second copy of the runtime keeps its own functions (seen at the driver only),
/// and the first copy's hooks still call the first copy.
#[test]
fn rt_dlsym_runtime_by_handle() {
    let both = traced(Run::program("rt_dlsym"));
    let iso = Run::program("rt_dlsym")
        .env("ISOLATE_MODE", "isolate")
        .run();
    iso.assert_same_as(&both.plain);
    for out in [&both.traced, &iso] {
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        out.assert_trace_matches(t, None);
        let c = t.counts();
        assert_eq!(c.get("cudaMalloc"), Some(&4), "{c:?}");
        assert_eq!(c.get("cudaFree"), Some(&3), "{c:?}");
        for api in [
            "cudaMallocHost",
            "cudaFreeHost",
            "cudaMallocAsync",
            "cudaFreeAsync",
        ] {
            assert_eq!(c.get(api), Some(&1), "{api} in {c:?}");
        }
        // Only the second copy's two calls are seen at the driver.
        assert_eq!(c.get("cuMemAlloc_v2"), Some(&1), "{c:?}");
        assert_eq!(c.get("cuMemFree_v2"), Some(&1), "{c:?}");
        assert_eq!(t.events().len(), 13, "{c:?}");
        has_line(out, "last error: first copy 1 second copy 0");
        has_line(out, "second copy loaded 1 distinct 1");
    }
}

#[test]
fn drv_static_resolver_path() {
    let both = traced(Run::program("drv_static"));
    let out = &both.traced;
    let t = out.only_trace();
    // The resolver handed out for itself, and the v1 ABI untouched and unrecorded.
    has_line(
        out,
        "cuGetProcAddress(cuGetProcAddress@12000) 0 status=0 found=1 same=1",
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("call cuMemAlloc(v1) ") && l.ends_with("canary_intact 1")),
        "v1 cuMemAlloc line missing or canary clobbered:\n{}",
        out.stdout
    );
    let c = t.counts();
    assert_eq!(
        c.get("cuMemAlloc_v2"),
        Some(&3),
        "one through each resolver; the v1 cuMemAlloc is not recorded: {c:?}"
    );
    assert_eq!(c.get("cuMemAllocAsync"), Some(&1));
    assert_eq!(c.get("cuMemAllocAsync_ptsz"), Some(&2));
    assert_eq!(c.get("cuMemFreeAsync"), Some(&2));
    assert_eq!(c.get("cuMemFreeAsync_ptsz"), Some(&3));
    assert_eq!(c.get("cuMemAllocFromPoolAsync_ptsz"), Some(&1));
    assert!(t.events().iter().all(|e| !e.api.is_runtime()));
    // VMM events carry handle and offset; graph nodes are graph memory.
    let ev = t.events_by_seq();
    let create = ev.iter().find(|e| e.api == Api::CuMemCreate).unwrap();
    let map = ev.iter().find(|e| e.api == Api::CuMemMap).unwrap();
    let reserve = ev
        .iter()
        .find(|e| e.api == Api::CuMemAddressReserve)
        .unwrap();
    assert!(
        create.ok() && map.ok() && reserve.ok(),
        "{create:?} {map:?} {reserve:?}"
    );
    assert_eq!(map.handle, create.handle);
    assert_eq!(map.offset, 0);
    assert_eq!(map.api.kind(), Kind::Map);
    assert!(map.ptr > reserve.ptr && map.ptr + map.size <= reserve.ptr + reserve.size);
    for e in &ev {
        if e.api.name().starts_with("cuGraph") {
            assert_eq!(e.api.memory(), Memory::Graph);
            assert!(e.handle != 0, "graph handle recorded: {e:?}");
        }
        if e.api.name().contains("Host") {
            assert!(e.api.is_host(), "{e:?}");
        }
    }
    let node = ev
        .iter()
        .find(|e| e.api == Api::CuGraphAddMemAllocNode)
        .unwrap();
    assert!(node.ok() && node.ptr != 0 && node.size == 65536, "{node:?}");
}

#[test]
fn drv_linked_exports_by_name() {
    let both = traced(Run::program("drv_linked"));
    let t = both.traced.only_trace();
    let c = t.counts();
    assert_eq!(c.get("cuMemAlloc_v2"), Some(&2), "{c:?}");
    assert_eq!(c.get("cuMemHostRegister_v2"), Some(&2));
    assert_eq!(c.get("cuMemHostUnregister"), Some(&2));
    // The first cuMemAlloc_v2 came before cuInit: recorded, with the driver's answer.
    let first = t.events_by_seq()[0];
    assert_eq!(first.api, Api::CuMemAlloc);
    assert_eq!(first.result, 3, "CUDA_ERROR_NOT_INITIALIZED: {first:?}");
    // A launch is not an event.
    assert!(t.events().iter().all(|e| e.api.kind() != Kind::Launch));
    assert!(
        both.traced.stdout.contains("runs 1 saw==d 1 byte 0 0x77"),
        "{}",
        both.traced.stdout
    );
}

#[test]
fn rt_vmm_expandable_segments() {
    let both = traced(Run::program("rt_vmm"));
    let out = &both.traced;
    has_line(out, "alias write 0 read 0 same 1");
    has_line(out, "offset map write 0 read 0 same 1");
    has_line(out, "same entry twice 1");
    let t = out.only_trace();
    let c = t.counts();
    assert_eq!(c.get("cuMemAddressReserve"), Some(&3), "{c:?}");
    assert_eq!(
        c.get("cuMemAlloc_v2"),
        Some(&1),
        "through cudaGetDriverEntryPoint"
    );
    assert_eq!(c.get("cuMemCreate"), Some(&3));
    assert_eq!(c.get("cuMemMap"), Some(&5));
    assert_eq!(c.get("cuMemSetAccess"), Some(&5));
    assert_eq!(c.get("cuMemUnmap"), Some(&5));
    assert_eq!(c.get("cuMemRelease"), Some(&3));
    assert_eq!(c.get("cuMemAddressFree"), Some(&3));
    for e in t.events() {
        if e.api.kind() != Kind::Alloc && e.api.kind() != Kind::Free {
            assert_eq!(e.api.memory(), Memory::Virtual, "{e:?}");
        }
    }
    // The offset map: a map with offset = granularity into the 2-granule handle.
    let maps: Vec<_> = t
        .events_by_seq()
        .into_iter()
        .filter(|e| e.api == Api::CuMemMap)
        .collect();
    let last = maps.last().unwrap();
    assert!(last.offset > 0 && last.offset == last.size, "{last:?}");
    assert_eq!(last.handle, maps[maps.len() - 2].handle);
    assert_eq!(maps[0].handle, maps[2].handle, "h1 mapped twice");
}

#[test]
fn launches_are_not_events_in_log_mode() {
    let both = traced(Run::program("launch"));
    let t = both.traced.only_trace();
    assert!(
        t.records
            .iter()
            .all(|r| !matches!(r, Record::StaleLaunch(_))),
        "log mode does not check launches"
    );
    assert_eq!(t.events().len(), 5);
    has_line(&both.traced, "ptr runs 5 all saw (freed, live, n) 1");
    has_line(&both.traced, "100 launches failures 0 sync 0 runs 105");
    has_line(&both.traced, "live counter 0 105");
}

/// The `launch` program's kernels saw the same parameters with the library as without it:
/// its stdout the same but for the count of layout queries, which only the library makes.
fn assert_same_launches(out: &Output, plain: &Output) {
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("standin_param_info_calls"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&out.stdout), strip(&plain.stdout));
}

#[test]
fn launches_in_isolate_mode_report_the_freed_pointer_once_per_kernel() {
    let plain = Run::program("launch").preload(false).run();
    let out = Run::program("launch").env("ISOLATE_MODE", "isolate").run();
    out.assert_success();
    assert_same_launches(&out, &plain);
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let stale: Vec<_> = t.stale_launches();
    let a = t
        .events_by_seq()
        .into_iter()
        .find(|e| e.api == Api::CudaMalloc)
        .unwrap();
    let by_kernel = |k: &str| {
        stale
            .iter()
            .filter(|s| s.kernel == k)
            .cloned()
            .collect::<Vec<_>>()
    };
    for (kernel, apis) in [
        ("kp_launch", &[Api::CuLaunchKernel][..]),
        ("kp_ptsz", &[Api::CuLaunchKernelPtsz][..]),
        ("kp_ex", &[Api::CuLaunchKernelEx][..]),
        ("kp_coop", &[Api::CuLaunchCooperativeKernel][..]),
        ("kp_rt", &[Api::CuLaunchKernel, Api::CuLaunchKernelPtsz][..]),
    ] {
        let s = by_kernel(kernel);
        assert_eq!(s.len(), 1, "{kernel}: one report, got {stale:#?}");
        let s = &s[0];
        assert!(apis.contains(&s.api), "{kernel}: {s:?}");
        assert_eq!((s.param_index, s.param_offset), (0, 0), "{s:?}");
        assert_eq!(s.ptr, a.ptr);
        assert_eq!((s.alloc_ptr, s.alloc_size), (a.ptr, a.size));
    }
    // ks_p1's struct holds exactly A: inside a by-value struct even an allocation's start is
    // only a suspect (PyTorch's kernels leave earlier launches' freed buffers in slots they do
    // not read: docs/isolation.md, "The launch check's evidence").
    assert!(by_kernel("ks_p1").is_empty(), "{stale:#?}");
    // ks_p2's struct holds A + 4096: inside a by-value struct, a word that is not exactly an
    // allocation's start may as well be two 32-bit integers (cuBLAS's CUTLASS pairs read as
    // such addresses on an H200): a stale value, recorded, not a stale launch.
    assert!(by_kernel("ks_p2").is_empty(), "{stale:#?}");
    for (kernel, offset, ptr) in [("ks_p1", 16, a.ptr), ("ks_p2", 32, a.ptr + 4096)] {
        let values: Vec<_> = t
            .stale_values()
            .into_iter()
            .filter(|v| v.kernel == kernel)
            .collect();
        assert_eq!(values.len(), 1, "{values:#?}");
        assert_eq!(
            (values[0].param_index, values[0].param_offset, values[0].ptr),
            (1, offset, ptr)
        );
    }
    assert_eq!(
        stale.len(),
        5,
        "the live pointer and the integer are no reports"
    );
    // Every launch comes after the free of A, so every one is checked. A kernel's layout is
    // read at its first launch (its 3 or 2 parameters, as many as its count says); later
    // launches use it as it is: nothing was unloaded (a reused handle:
    // launch_check_survives_...). One query fails in the whole run, a line in the driver's
    // error log: the first kernel's count asked as a CUkernel's (what the CUDA 12+ runtime
    // launches), the kind asked first until a kernel of the other kind answers; these are all
    // module functions, so no other query fails.
    let calls = isolate_tests::number_after(&out.stdout, "standin_param_info_calls").unwrap();
    eprintln!("cuFuncGetParamInfo calls for 107 launches of 7 kernels: {calls}");
    assert_eq!(calls, 5 * 3 + 2 * 2, "{calls} layout queries");
    let errors = isolate_tests::number_after(&out.stderr, "standin_kernel_query_errors").unwrap();
    assert_eq!(errors, 1, "{}", out.stderr);
    assert_eq!(
        out.stderr.matches("STALE LAUNCH").count(),
        5,
        "{}",
        out.stderr
    );
}

/// A program whose kernels are all libraries' CUkernels (what the CUDA 12+ runtime launches for
/// `kernel<<<…>>>`: PyTorch's own kernels) gets its layouts and names without one failing query,
/// so nothing of the library's in the driver's error log (CUDA_LOG_FILE): the CUkernel queries
/// are asked first until a module's function answers. On the H100 (driver 580) asking
/// `cuFuncGetParamInfo` first was a failing call for 64 of ResNet-50's 82 kernels
/// (docs/gpu-results.md, twenty-ninth session).
#[test]
fn a_program_of_library_kernels_has_no_failing_layout_query() {
    let plain = Run::program("launch")
        .env("LAUNCH_KIND", "1")
        .preload(false)
        .run();
    plain.assert_success();
    let out = Run::program("launch")
        .env("LAUNCH_KIND", "1")
        .env("ISOLATE_MODE", "isolate")
        .run();
    out.assert_success();
    assert_same_launches(&out, &plain);
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let mut kernels: Vec<_> = t.stale_launches().into_iter().map(|s| s.kernel).collect();
    kernels.sort();
    assert_eq!(
        kernels,
        ["kp_coop", "kp_ex", "kp_launch", "kp_ptsz", "kp_rt"],
        "every kernel named by cuKernelGetName"
    );
    let errors = isolate_tests::number_after(&out.stderr, "standin_kernel_query_errors").unwrap();
    assert_eq!(errors, 0, "{}", out.stderr);
}

/// A kernel handle reused for another kernel (a module unloaded and another loaded, as XLA's
/// autotuning does): the launch check finds that its cached layout no longer fits and reads
/// the new kernel's one parameter only. The old layout would read past a parameter array that
/// ends where an inaccessible page begins (a SIGSEGV in the program). Each kernel is named in
/// its own report.
#[test]
fn launch_check_survives_a_reused_kernel_handle() {
    let plain = Run::program("launch_reuse").preload(false).run();
    plain.assert_success();
    // A driver with the parameter counts (CUDA 13.2+, we believe: the stand-in by default) and one without
    // (STANDIN_NO_PARAM_COUNT=1).
    for counts in [true, false] {
        // The launch check is on by default in isolate mode.
        let out = Run::program("launch_reuse")
            .env("ISOLATE_MODE", "isolate")
            .env("STANDIN_NO_PARAM_COUNT", if counts { "0" } else { "1" })
            .run();
        out.assert_success();
        out.assert_same_as(&plain);
        has_line(&out, "reuse_one runs 3 saw B 1 saw A 1");
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        out.assert_trace_matches(t, None);
        let mallocs: Vec<_> = t
            .events_by_seq()
            .into_iter()
            .filter(|e| e.api == Api::CudaMalloc)
            .collect();
        let (a, b) = (mallocs[0], mallocs[1]);
        let mut stale: Vec<_> = t.stale_launches();
        stale.sort_by_key(|s| s.seq);
        let got: Vec<_> = stale
            .iter()
            .map(|s| {
                (
                    s.kernel.as_str(),
                    s.param_index,
                    s.param_offset,
                    s.ptr,
                    s.alloc_ptr,
                )
            })
            .collect();
        // The freed A through the new layout is reported again, under the new kernel's name:
        // the check reports once per kernel (told apart by layout, not by handle) and
        // allocation.
        assert_eq!(
            got,
            [
                ("reuse_four", 2, 16, a.ptr, a.ptr),
                ("reuse_one", 0, 0, b.ptr, b.ptr),
                ("reuse_one", 0, 0, a.ptr, a.ptr),
            ],
            "{stale:#?}"
        );
        assert_eq!(
            out.stderr.matches("STALE LAUNCH").count(),
            3,
            "{}",
            out.stderr
        );
        let calls = isolate_tests::number_after(&out.stderr, "standin_param_info_calls").unwrap();
        let errors =
            isolate_tests::number_after(&out.stderr, "standin_kernel_query_errors").unwrap();
        if counts {
            // reuse_four's 4 parameters as its count says. The module unloaded, reuse_one's
            // first launch finds the layout stale by the count (1, not 4) and reads its one
            // parameter; its next two launches, no unload since, ask the driver nothing. One
            // query fails: the first kernel's count asked as a CUkernel's (read_layout's
            // kind asked first); the function's answered, so the next kernel is asked as a
            // function first.
            assert_eq!((calls, errors), (4 + 1, 1), "{}", out.stderr);
        } else {
            // Without counts: reuse_four's parameter 0 asked as a CUkernel's (failing: the
            // kind asked first), its 4 + the failing 5th; reuse_one's first launch finds
            // it stale (no 5th, but no 4th either: 2) and reads the new one (1 + the failing
            // 2nd: 2). Five of those failed.
            assert_eq!(
                (calls, errors),
                (1 + (4 + 1) + (2 + 2), 5),
                "{}",
                out.stderr
            );
        }
    }
}

#[test]
fn stale_write_lands_in_the_next_allocation_in_log_mode() {
    let both = traced(Run::program("stale_write"));
    has_line(&both.traced, "b==a 1");
    has_line(&both.traced, "b changed 1 bytes 16 first 4096");
}

#[test]
fn stale_write_is_caught_in_isolate_mode() {
    let out = Run::program("stale_write")
        .env("ISOLATE_MODE", "isolate")
        .run();
    out.assert_success();
    has_line(&out, "b==a 0");
    has_line(&out, "b changed 0 bytes 0 first 0");
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(t, None);
    let a = t.events_by_seq()[0];
    let v: Vec<_> = t.violations();
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(
        (v[0].ptr, v[0].first_offset, v[0].changed_bytes),
        (a.ptr, 4096, 16)
    );
    assert_eq!(v[0].free_api, Api::CudaFree);
}

#[test]
fn stream_ordered_reader_sees_data_freed_after_it() {
    let both = traced(Run::program("stream_order"));
    has_line(&both.traced, "copy saw 0x42..0x42 all_0x42 1");
    has_line(&both.traced, "kernel runs 1 saw 0x42..0x42 all_0x42 1");
    // In isolate mode the poison goes in stream order too: the reader still sees the data.
    let iso = Run::program("stream_order")
        .env("ISOLATE_MODE", "isolate")
        .run();
    iso.assert_same_as(&both.plain);
}

#[test]
fn oom_stays_oom() {
    let both = traced(Run::program("oom").env("STANDIN_MEM_BYTES", "16777216"));
    let t = both.traced.only_trace();
    let fails: Vec<_> = t.events().into_iter().filter(|e| !e.ok()).collect();
    assert_eq!(fails.len(), 3, "three allocations ran out: {fails:?}");
    for e in &fails {
        assert_eq!(e.result, 2, "OOM is code 2 in both layers: {e:?}");
    }
    let n = isolate_tests::number_after(&both.traced.stdout, "allocated").unwrap();
    assert!(n > 4, "allocated {n} MiB out of 16");
}

/// Isolation holds freed memory back, but an allocation that runs out of memory gets it:
/// the program sees the same successes and the same out-of-memory codes.
#[test]
fn oom_in_isolate_mode_releases_quarantine() {
    let run = Run::program("oom").env("STANDIN_MEM_BYTES", "16777216");
    let plain = run.clone().preload(false).run();
    let out = run.env("ISOLATE_MODE", "isolate").run();
    out.assert_same_as(&plain);
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(t, None);
}

#[test]
fn nocuda_leaves_no_trace() {
    let both = Run::program("nocuda").run_both();
    both.traced.assert_success();
    assert!(
        both.traced.traces.is_empty(),
        "a process that never touches CUDA writes nothing: {:?}",
        both.traced
            .traces
            .iter()
            .map(|t| t.summary())
            .collect::<Vec<_>>()
    );
    assert!(both.traced.stderr.is_empty(), "{}", both.traced.stderr);
    assert_eq!(
        std::fs::read_dir(both.traced.dir.path()).unwrap().count(),
        0
    );
}

#[test]
fn dlsym_answers_are_unchanged() {
    let both = Run::program("dlsym_next").run_both();
    both.traced.assert_success();
    has_line(&both.traced, "libnext loaded 1");
    has_line(
        &both.traced,
        "dlsym(RTLD_NEXT, puts) from libnext: wrapper 0 libc 1 null 0",
    );
    has_line(&both.traced, "missing: null 1 dlerror set 1");
    has_line(&both.traced, "missing cuG*: null 1 dlerror set 1");
    has_line(
        &both.traced,
        "cuGetProcAddress_v2 in libc: null 1 dlerror set 1",
    );
}

#[test]
fn dlsym_rtld_next_from_a_second_preload() {
    // libisolate.so first, then another interposer whose wrapper finds the real `puts` with
    // RTLD_NEXT: it must get libc's, not itself.
    let lib = standin_bin().join("libnext.so");
    let both = Run::program("dlsym_next").also_preload(&lib).run_both();
    both.traced.assert_success();
    has_line(&both.traced, "libnext preloaded 1");
    has_line(&both.traced, "[next] hello through puts");
    has_line(&both.traced, "wrapper resolved the real puts: libc 1");
    has_line(
        &both.traced,
        "dlsym(RTLD_NEXT, puts) from libnext: wrapper 0 libc 1 null 0",
    );
    has_line(
        &both.traced,
        "dlsym(RTLD_NEXT, puts) from main: wrapper 1 libc 0 null 0",
    );
}

/// Programs that time themselves (used by hand for docs/performance.md).
const BENCHMARKS: &[&str] = &["launch_bench", "step_bench"];

/// The launch benchmark runs, checks its launches and gets the same answer as without the check.
#[test]
fn launch_bench_runs_under_the_launch_check() {
    for check in ["off", "on"] {
        let out = Run::program("launch_bench")
            .arg("2000")
            .env("STANDIN_SYNC", "1")
            .env("ISOLATE_MODE", "isolate")
            .env("ISOLATE_CHECK_LAUNCH", check)
            .run();
        out.assert_success();
        assert!(
            out.stdout.starts_with("launches 2000 ns_per_launch "),
            "{}",
            out.stdout
        );
        assert!(
            !out.stderr.contains("STALE LAUNCH"),
            "live pointers only: {}",
            out.stderr
        );
    }
}

/// The step benchmark runs in every mode with every call succeeding, and in isolate mode (with
/// reuse on and off) its trace shows every tensor allocated and freed with no finding.
#[test]
fn step_bench_runs_clean_in_every_mode() {
    for (mode, reuse) in [
        ("off", "off"),
        ("log", "off"),
        ("isolate", "off"),
        ("isolate", "on"),
    ] {
        let out = Run::program("step_bench")
            .args(["8", "64"])
            .env("ISOLATE_MODE", mode)
            .env("ISOLATE_REUSE", reuse)
            .run();
        out.assert_success();
        assert!(
            out.stdout.starts_with("steps 8 tensors 64 us_per_step ")
                && out.stdout.trim_end().ends_with(" failed 0"),
            "{}",
            out.stdout
        );
        if mode == "isolate" {
            let s = out.only_trace().assert_no_false_findings();
            // 13 steps (5 of warm-up) of 64 tensors.
            assert_eq!(s["allocations"], 13 * 64, "{reuse}");
            assert_eq!(s["frees"], 13 * 64, "{reuse}");
            assert_eq!(s["poison_violation_count"], 0, "{reuse}");
        }
    }
}

/// The hooks read the fine clock about four times a tensor (an allocation's real call, start
/// and end; a free kept in quarantine, once; the launch naming it, once; a stack's capture
/// timed one in 16), where the library before the twentieth session read it 8 times a tensor
/// in log mode and 12 in isolate mode on this program (14 on the Python one): on the GPU hosts
/// a read costs 45 ns (docs/performance.md, "Clock reads"). Counted by a preloaded
/// `clock_gettime` against the same run with the library off.
#[test]
fn a_tensor_costs_about_four_fine_clock_reads() {
    let counter = standin_bin().join("libclockcount.so");
    let reads = |mode: &str, check: &str| -> (f64, f64) {
        let out = Run::program("step_bench")
            .args(["20", "200"])
            .env("ISOLATE_MODE", mode)
            .env("ISOLATE_CHECK", check)
            .also_preload(&counter)
            .run();
        out.assert_success();
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("clock reads: "))
            .unwrap_or_else(|| panic!("no count: {}", out.stderr));
        let w: Vec<&str> = line.split_whitespace().collect();
        (w[3].parse().unwrap(), w[5].parse().unwrap())
    };
    // 25 steps (5 of warm-up) of 200 tensors.
    let tensors = 25.0 * 200.0;
    let (off, _) = reads("off", "full");
    for (mode, check) in [("log", "full"), ("isolate", "fast"), ("isolate", "full")] {
        let (fine, coarse) = reads(mode, check);
        let per = (fine - off) / tensors;
        assert!(
            (3.0..=5.0).contains(&per),
            "{mode} {check}: {per:.2} fine clock reads a tensor ({fine} against {off} off; \
             {coarse} coarse)"
        );
    }
}

/// How many times the profile's part `name` ran (`ISOLATE_PROFILE=on`: the trace's note of the
/// hooks' parts, "NAME N, X us each ..."); `None` where the part never ran.
fn part_calls(t: &isolate_tests::Trace, name: &str) -> Option<u64> {
    let parts = &t
        .cost_note(isolate_trace::CostTopic::HookParts)
        .expect("a parts note with ISOLATE_PROFILE=on")
        .text;
    parts
        .split(';')
        .find_map(|p| p.trim().strip_prefix(name)?.strip_prefix(' '))
        .map(|rest| rest.split(',').next().unwrap().trim().parse().unwrap())
}

/// A stream-ordered free (or allocation) asks its stream whether it is capturing a graph only where a capture
/// may be running: where captures' starts and ends reach the library (stream work hooked:
/// the default isolate mode) it counts them, and a program that captures nothing makes no
/// such query (the profile's "capture queries" part); with stream work not hooked (no
/// deferred poisons, no order check) every allocation and free still asks.
#[test]
fn a_free_asks_about_graph_capture_only_when_one_may_run() {
    let queries = |extra: &[(&str, &str)]| -> u64 {
        let mut run = Run::program("step_bench")
            .args(["4", "50"])
            .env("ISOLATE_MODE", "isolate")
            .env("ISOLATE_PROFILE", "on");
        for (k, v) in extra {
            run = run.env(*k, *v);
        }
        let out = run.run();
        out.assert_success();
        part_calls(out.only_trace(), "capture queries").unwrap_or(0)
    };
    assert_eq!(queries(&[]), 0, "stream work hooked: captures counted");
    // 9 steps (5 of warm-up) of 50 allocations and 50 frees, each asking.
    assert_eq!(
        queries(&[
            ("ISOLATE_TEST_POISON_BATCH", "off"),
            ("ISOLATE_TEST_ORDER", "off")
        ]),
        9 * 50 * 2
    );
}

/// A trim over the quarantine's budget (the keeper's, or a free's past the slack) gives the
/// quarantine's lock back at least every 32 entries it takes out, so that a hook of the
/// program's threads that takes the lock (an allocation's live map, a free's quarantining, a
/// launch's look-ups) waits behind a few microseconds of it, not a whole step of 256 (50-56 µs
/// a hold on the stand-in, 7-10 µs in 32s; on the H100 the live map's calls over 20 µs were 8
/// of its 19 ms a run). 256 KiB of quarantine for 12,000 frees of 256 bytes: ~21,000 releases
/// in trims of ~200 entries each; the profile counts every hold.
#[test]
fn a_trim_over_the_budget_gives_the_quarantines_lock_back_every_32_entries() {
    let out = Run::program("step_bench")
        .args(["6", "2000", "1", "0", "256"])
        .env("ISOLATE_MODE", "isolate")
        .env("ISOLATE_PROFILE", "on")
        .env("ISOLATE_QUARANTINE", "256KiB")
        .run();
    out.assert_success();
    let t = out.only_trace();
    let holds = part_calls(t, "a trim's holds of the quarantine's lock")
        .expect("the trim's holds in the profile's parts");
    let releases = t.analyzer_summary()["quarantine"]["releases"]
        .as_u64()
        .unwrap();
    assert!(releases > 10_000, "{releases} releases: the budget trims");
    assert!(
        holds * 32 >= releases,
        "{holds} holds of the lock for {releases} entries taken out: more than 32 a hold"
    );
}

/// CUDA IPC (issue 17's example of one hooked entry point, one declaration each): memory another
/// process shares is recorded when opened and closed, through the runtime and the driver, in
/// the process that opens it; in isolate mode it is never quarantined or poisoned (it is not
/// this process's), and a cudaFree of it fails as without the library.
#[test]
fn ipc_opened_memory_is_recorded_and_not_this_processs_to_free() {
    for mode in ["log", "isolate"] {
        let run = Run::program("ipc");
        let plain = run.clone().preload(false).run();
        plain.assert_success();
        assert!(plain.stdout.contains("child exited 0"), "{}", plain.stdout);
        let out = run.env("ISOLATE_MODE", mode).run();
        out.assert_same_as(&plain);
        assert_eq!(out.traces.len(), 2, "{mode}: a trace per process");
        let child = out.traces.iter().find(|t| t.header.pid != out.pid).unwrap();
        let parent = out.traces.iter().find(|t| t.header.pid == out.pid).unwrap();
        for (t, tag) in [(child, "child"), (parent, "parent")] {
            t.assert_complete(isolate_trace::EndReason::Exit);
            out.assert_trace_matches(t, Some(tag));
        }
        assert_eq!(child.count("cudaIpcOpenMemHandle"), 1, "{mode}");
        assert_eq!(child.count("cuIpcOpenMemHandle_v2"), 1, "{mode}");
        assert_eq!(child.count("cudaIpcCloseMemHandle"), 2, "{mode}");
        assert_eq!(child.count("cuIpcCloseMemHandle"), 1, "{mode}");
        assert!(
            child.violations().is_empty(),
            "{mode}: opened memory is never poisoned"
        );
    }
}

/// Every program in tests/programs prints the same with and without the preload.
#[test]
fn every_program_prints_the_same_with_and_without_the_preload() {
    let runs: &[(&str, &[&str])] = &[
        ("rt_basic", &[]),
        ("rt_dlsym", &[]),
        ("drv_static", &[]),
        ("drv_linked", &[]),
        ("rt_vmm", &[]),
        ("vmm_remap", &[]),
        ("bad_calls", &[]),
        ("dlsym_next", &[]),
        ("launch", &[]),
        ("launch_reuse", &[]),
        // tests/launch_rule.rs (isolate and guard mode are run there).
        ("launch_rule", &[]),
        ("textbook", &["4096"]),
        ("textbook", &["4096", "noreset", "sync"]),
        ("stale_write", &[]),
        ("stream_order", &[]),
        // tests/tests/ordering.rs: the stream-order check's scenarios (log mode sees no finding).
        ("stream_race", &[]),
        ("oom", &[]),
        ("threads", &["4", "200"]),
        ("forker", &["fork"]),
        ("ipc", &[]),
        ("nocuda", &[]),
        // tests/faults.rs loads the library late; "-" loads nothing (it is preloaded here).
        ("late_dlopen", &["-"]),
        // tests/isolation.rs; its `oom` scenario needs a small STANDIN_MEM_BYTES (run there).
        ("quarantine", &["reuse"]),
        ("quarantine", &["stale"]),
        ("quarantine", &["budget"]),
        ("quarantine", &["stream"]),
        ("quarantine", &["double"]),
        // tests/guard.rs (guard mode itself is run there).
        ("guard", &["layout"]),
        ("guard", &["free"]),
        ("guard", &["managed"]),
        ("guard", &["stale"]),
        ("guard", &["recycle"]),
        ("guard", &["touch"]),
        ("guard", &["first"]),
        // tests/stacks.rs (its stacks are checked there).
        ("stacks", &["stale"]),
        // tests/run_signals.rs (its signal modes are run there).
        ("sigchild", &["-", "exit", "0"]),
        // tests/hostile.rs (its other modes are run there).
        ("hostile", &["masks"]),
        // tests/host_first.rs (its scenarios are run there, each against a plain run).
        ("host_first", &["probe"]),
        // tests/ends.rs (its other ends are run there).
        ("ends", &["stale", "exit"]),
        // tests/nvtx.rs (without NVTX_INJECTION64_PATH it loads nothing; the injection is run
        // there) and tests/frameworks.rs (log mode sets nothing).
        ("nvtx", &[]),
        (
            "getenv",
            &["XLA_PYTHON_CLIENT_ALLOCATOR", "NVTX_INJECTION64_PATH"],
        ),
        // tests/environment.rs (run 300 times there).
        ("setenv_race", &[]),
        // tests/frameworks.rs (what it loads is run there).
        ("loads", &[]),
        // tests/tiers.rs (isolate mode, both tiers, is run there; log mode frees for real, so
        // its planted writes land in freed memory as without the preload).
        ("planted", &["1", "3", "1"]),
    ];
    let dir = isolate_tests::workspace_root().join("tests/programs");
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".c") else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).unwrap();
        if text.starts_with("// shared:") {
            continue;
        }
        // Benchmarks print timings, which differ from run to run: checked below instead.
        if BENCHMARKS.contains(&stem) {
            continue;
        }
        assert!(
            runs.iter().any(|(p, _)| *p == stem),
            "tests/programs/{name} is not in this test's list"
        );
    }
    for (program, args) in runs {
        let mut run = Run::program(program).args(args.iter().copied());
        if *program == "oom" {
            run = run.env("STANDIN_MEM_BYTES", "16777216");
        }
        let both = run.run_both();
        both.traced.assert_success();
        for t in &both.traced.traces {
            assert!(t.is_complete(), "{program}: {}", t.summary());
        }
    }
}

/// Isolation changes where memory comes from, never what a call returns: every program whose
/// output does not print the reuse of a freed address prints the same in isolate mode.
#[test]
fn every_program_prints_the_same_in_isolate_mode() {
    let runs: &[(&str, &[&str])] = &[
        ("rt_basic", &[]),
        ("rt_dlsym", &[]),
        ("drv_static", &[]),
        ("drv_linked", &[]),
        ("rt_vmm", &[]),
        // Mapping again into a range isolate mode holds back, and reserving a freed reservation's
        // address again (JAX's platform allocator): cuMemMap returned 1 here before the fix.
        ("vmm_remap", &[]),
        ("stream_order", &[]),
        ("threads", &["4", "200"]),
        ("forker", &["fork"]),
        ("ipc", &[]),
    ];
    // bad_calls in isolate mode: tests/bad_calls.rs
    for (program, args) in runs {
        let run = Run::program(program).args(args.iter().copied());
        let plain = run.clone().preload(false).run();
        let out = run.env("ISOLATE_MODE", "isolate").run();
        out.assert_same_as(&plain);
        assert!(!out.traces.is_empty(), "{program}: no trace");
        for t in &out.traces {
            assert!(t.is_complete(), "{program}: {}", t.summary());
            assert_eq!(t.header.mode, "isolate");
            assert_findings(program, t);
        }
        for t in &plain_log(program, args).traces {
            assert_findings(program, t);
        }
        if !matches!(*program, "threads" | "vmm_remap") && out.traces.len() == 1 {
            out.assert_trace_matches(&out.traces[0], None);
        }
    }
}

/// What the analyzer finds in these programs' traces: nothing, but for the one bad call that
/// drv_linked, ipc's child and vmm_remap make on purpose (a second `cuMemHostUnregister`, a
/// second `cudaIpcCloseMemHandle`, a third `cuMemRelease` of a handle retained once, refused by
/// the driver: a double free). drv_static frees an
/// allocation of the CUDA 3.1 ABI, which is not recorded: the driver accepted it, so it is a free
/// of an unseen allocation, not an invalid free.
fn assert_findings(program: &str, t: &isolate_tests::Trace) {
    let planted = match program {
        "drv_linked" => Some("cuMemHostUnregister"),
        "ipc" if t.count("cudaIpcCloseMemHandle") > 0 => Some("cudaIpcCloseMemHandle"),
        // NCCL's free (retain, release, unmap, release) is not one; the third release, which
        // the driver refuses, is.
        "vmm_remap" => Some("cuMemRelease"),
        _ => None,
    };
    let Some(api) = planted else {
        let s = t.assert_no_false_findings();
        let unseen = if program == "drv_static" { 1 } else { 0 };
        assert_eq!(s["frees_of_earlier_allocations"], unseen, "{program}");
        return;
    };
    let s = t.analyzer_summary();
    assert_eq!(s["invalid_free_count"], 1, "{program}: {s:#}");
    assert_eq!(s["double_free_count"], 1, "{program}: {s:#}");
    let f = &s["invalid_frees"][0];
    assert_eq!(f["api"], api, "{f:#}");
    assert_ne!(f["result"], 0, "{f:#}");
    assert_eq!(f["first_free"]["api"], api, "{f:#}");
    assert_eq!(s["lost"], 0, "{program}");
}

/// The program under the preload in log mode.
fn plain_log(program: &str, args: &[&str]) -> isolate_tests::Output {
    let out = Run::program(program).args(args.iter().copied()).run();
    assert!(!out.traces.is_empty(), "{program}: no trace in log mode");
    out
}

/// Isolate mode too: the launch check's note at exit must not create a trace for a process that
/// never touched CUDA (a launcher, a shell between torchrun and the workers).
#[test]
fn nocuda_leaves_no_trace_in_isolate_mode() {
    let out = Run::program("nocuda").env("ISOLATE_MODE", "isolate").run();
    out.assert_success();
    assert!(
        out.traces.is_empty(),
        "no trace expected, got {}",
        out.traces.len()
    );
}

/// NCCL's free (`ncclCuMemFree`: retain the handle at the address, release it, unmap, release it
/// again) is recorded with the retain, which names the handle the program made: two accepted
/// releases of one handle, then, for a third the driver refuses, the one double free (on the
/// H200 the retain was not hooked and a one-rank NCCL job showed 194 false double frees).
#[test]
fn nccls_free_retains_the_handle_it_releases_twice() {
    for mode in ["log", "isolate"] {
        let out = Run::program("vmm_remap").env("ISOLATE_MODE", mode).run();
        out.assert_success();
        assert!(
            out.stdout.contains("nccl retain 0 same handle 1"),
            "{}",
            out.stdout
        );
        let t = out.only_trace();
        let evs = t.events();
        let retain = evs
            .iter()
            .find(|e| e.api == Api::CuMemRetainAllocationHandle)
            .unwrap_or_else(|| panic!("{mode}: no retain recorded"));
        assert_eq!(retain.result, 0);
        let created = evs.iter().rfind(|e| e.api == Api::CuMemCreate).unwrap();
        assert_eq!(retain.handle, created.handle, "{mode}");
        let releases: Vec<i32> = evs
            .iter()
            .filter(|e| e.api == Api::CuMemRelease && e.handle == created.handle)
            .map(|e| e.result)
            .collect();
        assert_eq!(releases, [0, 0, 1], "{mode}");
        assert_findings("vmm_remap", t);
    }
}

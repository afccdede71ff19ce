mod common;

use common::*;
use isolate_analyzer::{NoProgress, summary};
use isolate_trace::{Api, FreedInUse, Note, NoteKind, Record, StaleLaunch, Stats, Violation};
use serde_json::json;

fn summarize(t: &TraceBuilder) -> (tempfile::TempDir, summary::Summary) {
    let d = tempfile::tempdir().unwrap();
    let p = t.write(d.path(), "t.trace");
    let s = summary::summarize(&[p], &mut NoProgress).unwrap();
    (d, s)
}

#[test]
fn live_at_end_peak_and_invalid_frees() {
    let mut t = TraceBuilder::new();
    t.malloc(A, MIB); // 0
    t.malloc(A + MIB, 2 * MIB); // 1
    t.free(A); // 2
    t.free_refused(A, 1); // 3: double free, refused by the driver
    t.free_refused(A + MIB + 16, 1); // 4: free into the middle, refused
    t.free(0); // 5: cudaFree(NULL) is fine
    t.fail(Api::CudaMalloc, 1 << 40, 2); // 6
    t.call(Api::CudaMallocManaged, 0x8000_0000, 4096); // 7
    t.free(0x9000_0000); // 8: accepted, but never seen allocated (an unrecorded entry point)
    t.end(Stats::default());
    let (_d, s) = summarize(&t);
    assert_eq!(s.events, 9);
    assert_eq!(s.calls["cudaMalloc"], 3);
    assert_eq!(s.calls["cudaFree"], 5);
    assert_eq!(s.failed["cudaMalloc"], 1);
    assert_eq!(s.failed["cudaFree"], 2);
    assert_eq!(s.failed.len(), 2);
    assert_eq!(s.frees_of_earlier_allocations, 1, "seq 8 is not invalid");
    assert_eq!(s.allocations, 3);
    assert_eq!(s.frees, 1);
    assert_eq!(s.peak_live_bytes, 3 * MIB);
    assert_eq!(s.live_at_end.count, 2);
    assert_eq!(s.live_at_end.bytes, 2 * MIB + 4096);
    assert_eq!(s.invalid_free_count, 2);
    assert_eq!(s.double_free_count, 1);
    let seqs: Vec<u64> = s.invalid_frees.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, [3, 4]);
    // The double free names the first free and the allocation; the other is not a double.
    let d = &s.invalid_frees[0];
    assert!(d.double_free);
    assert_eq!(d.result, 1);
    assert_eq!(d.first_free.as_ref().map(|f| f.seq), Some(2));
    assert_eq!(d.allocated.as_ref().map(|a| a.seq), Some(0));
    assert!(!s.invalid_frees[1].double_free);
    assert_eq!(s.invalid_frees[1].first_free, None);
    let text = summary::render_text(&s);
    assert!(
        text.contains("FINDINGS: 1 invalid free, 1 double free\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "DOUBLE FREE: cudaFree of 0x7f0000000000 (event 3, tid 1000, refused with 1 \
             (cudaErrorInvalidValue)): already freed by cudaFree (event 2, tid 1000); allocated \
             by cudaMalloc (event 0, tid 1000)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "INVALID FREE: cudaFree of 0x7f0000100010 (event 4, tid 1000, refused with 1 \
             (cudaErrorInvalidValue)): nothing live starts there"
        ),
        "{text}"
    );
    // Failed calls name their error codes; counts have their plurals.
    assert!(
        text.contains(
            "cudaMalloc                              3  1 failed: 2 (cudaErrorMemoryAllocation)"
        ),
        "{text}"
    );
    assert!(
        text.contains("2 failed: 1 (cudaErrorInvalidValue) ×2"),
        "{text}"
    );
    assert!(
        text.contains("unseen   1 free the driver accepted"),
        "{text}"
    );
    // Not a Python process: what is still held is not explained by a caching allocator.
    assert_eq!(s.held_at_exit.possible_leak, s.live_at_end);
    assert_eq!(
        s.possible_leaks.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [1, 7]
    );
    assert!(
        text.contains("2 allocations (2.0 MiB): held by the program (information, not a finding)"),
        "{text}"
    );
    assert!(!text.contains("LEAK"), "{text}");
    assert_eq!(s.failed_results["cudaMalloc"]["2"], 1);
    assert_eq!(s.failed_results["cudaFree"]["1"], 2);
    // Held at exit is not a finding: the invalid and the double free are.
    assert_eq!(s.findings, 2);
    assert!(s.complete);
    assert_eq!(s.truncated, None);
    assert_eq!(s.traces[0].end_reason.as_deref(), Some("exit"));
}

#[test]
fn host_and_graph_memory_kept_apart() {
    let mut t = TraceBuilder::new();
    t.call(Api::CudaHostAlloc, 0x1000, 1 << 30);
    t.call(Api::CudaMallocHost, 0x5000_0000, 4096);
    t.call(Api::CudaFreeHost, 0x5000_0000, 0);
    t.call(Api::CudaHostRegister, 0x9000, 8192);
    t.call(Api::CuGraphAddMemAllocNode, A, 64 * MIB);
    t.call(Api::CuGraphAddMemAllocNode, A + 64 * MIB, MIB);
    t.call(Api::CuGraphAddMemFreeNode, A + 64 * MIB, 0);
    t.malloc(0x7e00_0000_0000, 100);
    let (_d, s) = summarize(&t);
    assert_eq!(
        s.peak_live_bytes, 100,
        "host and graph memory are not device peak"
    );
    assert_eq!(s.live_at_end.bytes, 100);
    assert_eq!(
        (s.allocations, s.frees, s.live_at_end.count),
        (1, 0, 1),
        "device memory only: host and graph memory have their own figures"
    );
    assert_eq!(s.host.allocations, 2);
    assert_eq!(s.host.frees, 1);
    assert_eq!(s.host.peak_live_bytes, (1 << 30) + 4096);
    assert_eq!(s.host.live_at_end.bytes, 1 << 30);
    assert_eq!(s.host.registered_at_end.bytes, 8192);
    let g = &s.categories["graph"];
    assert_eq!((g.started, g.ended, g.peak_live_bytes), (2, 1, 65 * MIB));
    assert_eq!(g.live_at_end.bytes, 64 * MIB);
    assert!(!s.complete, "no End record");
}

#[test]
fn vmm_handles_count_reservations_do_not() {
    let mut t = TraceBuilder::new();
    let r = 0x6000_0000_0000;
    t.vmm(Api::CuMemAddressReserve, r, 1 << 30, 0, 0);
    t.vmm(Api::CuMemCreate, 0, 2 * MIB, 0x11, 0);
    t.vmm(Api::CuMemCreate, 0, 4 * MIB, 0x22, 0);
    t.vmm(Api::CuMemMap, r, 2 * MIB, 0x11, 0);
    t.vmm(Api::CuMemMap, r + 2 * MIB, 4 * MIB, 0x22, 0);
    t.vmm(Api::CuMemSetAccess, r, 6 * MIB, 0, 0);
    t.vmm(Api::CuMemUnmap, r, 2 * MIB, 0, 0);
    t.vmm(Api::CuMemRelease, 0, 0, 0x11, 0);
    t.vmm_refused(Api::CuMemRelease, 0, 0, 0x99, 1); // never created: refused
    t.vmm(Api::CuMemRelease, 0, 0, 0x11, 0); // released twice: a double free
    t.vmm(Api::CuMemUnmap, r + 64 * MIB, MIB, 0, 0); // nothing mapped there, accepted
    let (_d, s) = summarize(&t);
    assert_eq!(s.peak_live_bytes, 6 * MIB);
    // `allocations`, `frees` and `live_at_end` count the same things: device memory, here the
    // physical handles (reservations and mappings are address space, under `categories`).
    assert_eq!((s.allocations, s.frees), (2, 1));
    assert_eq!(s.live_at_end.count, 1);
    assert_eq!(s.live_at_end.bytes, 4 * MIB);
    assert_eq!(s.categories["handle"].live_at_end.count, 1);
    assert_eq!(s.categories["reservation"].live_at_end.count, 1);
    assert_eq!(s.categories["reservation"].live_at_end.bytes, 1 << 30);
    assert_eq!(s.categories["mapping"].live_at_end.count, 1);
    let kinds: Vec<&str> = s.invalid_frees.iter().map(|f| f.kind.as_str()).collect();
    assert_eq!(kinds, ["release", "release"]);
    assert_eq!(s.double_free_count, 1);
    assert_eq!(
        s.invalid_frees[1].first_free.as_ref().map(|f| f.seq),
        Some(7)
    );
    // An unmap the driver accepted where the trace saw nothing mapped: not the program's bug.
    assert_eq!(s.frees_of_earlier_allocations, 1);
}

/// NCCL's free (`ncclCuMemFree`): the handle at the address retained, released, the range
/// unmapped, the handle released again: two accepted releases of one handle, no finding, the
/// handle's memory live until the second. A third release, refused, is the double free; a
/// retain of a handle the trace never saw made counts for nothing.
#[test]
fn a_retained_handle_takes_one_more_release() {
    let mut t = TraceBuilder::new();
    let r = 0x6000_0000_0000;
    t.vmm(Api::CuMemAddressReserve, r, 1 << 30, 0, 0); // 0
    t.vmm(Api::CuMemCreate, 0, 2 * MIB, 0x11, 0); // 1
    t.vmm(Api::CuMemMap, r, 2 * MIB, 0x11, 0); // 2
    t.vmm(Api::CuMemRetainAllocationHandle, r + 4096, 0, 0x11, 0); // 3
    t.vmm(Api::CuMemRelease, 0, 0, 0x11, 0); // 4: the retained reference
    t.vmm(Api::CuMemUnmap, r, 2 * MIB, 0, 0); // 5
    t.vmm(Api::CuMemRelease, 0, 0, 0x11, 0); // 6: the handle's own
    let (_d, s) = summarize(&t);
    assert_eq!(s.invalid_free_count, 0, "{:?}", s.invalid_frees);
    assert_eq!((s.allocations, s.frees), (1, 1));
    assert_eq!(s.live_at_end.count, 0);
    assert_eq!(s.calls["cuMemRetainAllocationHandle"], 1);

    t.vmm_refused(Api::CuMemRelease, 0, 0, 0x11, 1); // 7: a third, refused
    t.vmm(Api::CuMemRetainAllocationHandle, r, 0, 0x77, 0); // 8: never made here
    t.vmm(Api::CuMemRelease, 0, 0, 0x77, 0); // 9: accepted: made before the trace
    let (_d, s) = summarize(&t);
    assert_eq!(s.double_free_count, 1);
    assert_eq!(s.invalid_frees[0].seq, 7);
    assert_eq!(
        s.invalid_frees[0].first_free.as_ref().map(|f| f.seq),
        Some(6)
    );
    assert_eq!(s.frees_of_earlier_allocations, 1);
}

#[test]
fn violations_stale_launches_quarantine_json() {
    let mut h = header(100, &["prog"]);
    h.mode = "isolate".into();
    let mut t = TraceBuilder::with_header(h);
    t.malloc(A, 4096);
    t.free(A);
    t.record(Record::Violation(Violation {
        seq: 2,
        ts_ns: 9_000_000,
        device: 0,
        ptr: A,
        size: 4096,
        first_offset: 128,
        changed_bytes: 64,
        alloc_seq: 0,
        free_seq: 1,
        free_ts_ns: 1_002_000,
        free_api: Api::CudaFree,
        ..Default::default()
    }));
    t.record(Record::StaleLaunch(StaleLaunch {
        seq: 3,
        ts_ns: 9_100_000,
        tid: 1000,
        device: 0,
        api: Api::CuLaunchKernel,
        kernel: "saxpy<float>".into(),
        param_index: 2,
        param_offset: 16,
        ptr: A + 8,
        alloc_ptr: A,
        alloc_size: 4096,
        alloc_seq: 0,
        free_seq: 1,
        free_ts_ns: 1_002_000,
        ..Default::default()
    }));
    t.note(NoteKind::QuarantineRelease, 0);
    t.note(NoteKind::QuarantineEarlyRelease, 0);
    t.note(NoteKind::QuarantineRelease, 0);
    // An allocation that ran out of memory and was retried (its size), and a launch (size 0).
    for size in [4096, 0] {
        t.record(Record::Note(Note {
            seq: 3,
            ts_ns: 9_200_000,
            kind: NoteKind::OomRetry,
            ptr: 0,
            size,
            value: 4096,
            text: String::new(),
        }));
    }
    t.record(Record::Stats(Stats {
        quarantine_peak_bytes: 4096,
        quarantine_releases: 1,
        ..Stats::default()
    }));
    t.end(Stats {
        quarantine_peak_bytes: 8192,
        events: 2,
        ..Stats::default()
    });
    let (_d, s) = summarize(&t);
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(
        v["poison_violations"],
        json!([{"trace":0,"pid":100,"seq":2,"ts_ns":9000000,"device":0,"ptr":"0x7f0000000000",
                "size":4096,"first_offset":128,"changed_bytes":64,"alloc_seq":0,"free_seq":1,
                "freed_at_ns":1002000,"free_api":"cudaFree","alloc_api":"cudaMalloc"}])
    );
    assert_eq!(
        v["stale_launches"],
        json!([{"trace":0,"pid":100,"seq":3,"ts_ns":9100000,"tid":1000,"device":0,
                "api":"cuLaunchKernel","kernel":"saxpy<float>","param_index":2,"param_offset":16,
                "ptr":"0x7f0000000008","allocation":0,"alloc_ptr":"0x7f0000000000",
                "alloc_size":4096,"freed_at":{"seq":1,"ts_ns":1002000},"fault":null,
                "alloc_api":"cudaMalloc","free_api":"cudaFree"}])
    );
    assert_eq!(
        v["quarantine"],
        json!({"peak_bytes":8192,"releases":2,"early_releases":1,"oom_retries":1,
               "launch_oom_retries":1})
    );
    assert_eq!(v["complete"], json!(true));
    assert_eq!(v["truncated"], json!(null));
    assert_eq!(v["traces"][0]["header"]["pid"], json!(100));
    assert_eq!(v["traces"][0]["header"]["argv"], json!(["prog"]));
    assert_eq!(v["last_events"].as_array().unwrap().len(), 2);
    assert_eq!(v["findings"], json!(2));
    let text = summary::render_text(&s);
    assert!(
        text.contains(
            "STALE WRITE: 64 bytes changed from offset 128 of a 4.0 KiB allocation at \
             0x7f0000000000 (cudaMalloc, event 0) after it was freed (cudaFree, event 1)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "STALE LAUNCH: kernel saxpy<float> (cuLaunchKernel, event 3) got parameter 2 = \
             0x7f0000000008, offset 8 into a 4.0 KiB allocation at 0x7f0000000000 (cudaMalloc, \
             event 0) after it was freed (cudaFree, event 1)"
        ),
        "{text}"
    );
    assert!(
        text.contains("FINDINGS: 1 stale write, 1 stale launch\n"),
        "{text}"
    );
    assert!(!text.contains("POISON") && !text.contains("seq "), "{text}");
}

#[test]
fn text_says_plainly_what_was_found() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    t.free(A);
    t.end(Stats::default());
    t.write(d.path(), "clean.trace");
    let o = isolate(d.path(), &["summary", "clean.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains(
            "findings: none of those log mode can see (no invalid free, double free, device \
             fault or leak); log mode cannot see stale writes or stale launches (no poison, no \
             quarantine"
        ),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains("held at exit: nothing (all device memory was freed)"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("memory   1 allocation, 1 free; peak"),
        "{}",
        o.stdout
    );
}

#[test]
fn several_traces_kept_apart_and_added_up() {
    let d = tempfile::tempdir().unwrap();
    let mut a = TraceBuilder::with_header(header(10, &["a"]));
    a.malloc(A, 100);
    let mut b = TraceBuilder::with_header(header(20, &["b"]));
    b.malloc(A, 300); // same address, other process: no clash
    b.free(A);
    b.malloc(A, 50);
    a.end(Stats::default());
    b.end(Stats::default());
    let pa = a.write(d.path(), "a.trace");
    let pb = b.write(d.path(), "b.trace");
    let s = summary::summarize(&[pa, pb], &mut NoProgress).unwrap();
    assert_eq!(s.traces.len(), 2);
    assert_eq!(s.traces[0].header.pid, 10);
    assert_eq!(s.traces[1].totals.peak_live_bytes, 300);
    assert_eq!(s.peak_live_bytes, 400);
    assert_eq!(s.live_at_end.bytes, 150);
    assert_eq!(s.allocations, 3);
    assert_eq!(s.invalid_free_count, 0);
    // The total peak is a sum of peaks, and says so; each process has its line.
    assert!(s.peak_is_sum_of_processes);
    assert!(!s.traces[0].totals.peak_is_sum_of_processes);
    let text = summary::render_text(&s);
    assert!(text.starts_with("== 2 traces ==\n"), "{text}");
    assert!(
        text.contains(
            "peak 400 bytes of device memory: the sum of per-process peaks (not simultaneous)"
        ),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "processes")
        .expect("processes");
    assert!(
        lines[at + 1]
            .split_whitespace()
            .eq(["pid", "command", "calls", "peak", "findings", "trace"])
    );
    assert!(
        lines[at + 2]
            .split_whitespace()
            .eq(["10", "a", "1", "100", "bytes", "none", "a.trace"]),
        "{text}"
    );
    assert!(
        lines[at + 3]
            .split_whitespace()
            .eq(["20", "b", "3", "300", "bytes", "none", "b.trace"]),
        "{text}"
    );
    // Memory held at exit is no finding (it was two possible leaks before).
    assert!(!text.contains("LEAK"), "{text}");
    assert!(
        text.contains("findings: none of those log mode can see"),
        "{text}"
    );
    assert_eq!(
        s.possible_leaks
            .iter()
            .map(|l| (l.trace, l.pid))
            .collect::<Vec<_>>(),
        [(0, 10), (1, 20)]
    );
}

#[test]
fn json_is_deterministic() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    for i in 0..200 {
        t.malloc(A + i * 4096, 4096);
    }
    t.write(d.path(), "t.trace");
    let a = isolate(d.path(), &["summary", "--json", "t.trace"]);
    let b = isolate(d.path(), &["summary", "--json", "t.trace"]);
    assert_eq!(a.code, 0);
    assert_eq!(a.stdout, b.stdout);
    assert!(
        !a.stdout.contains(&d.path().display().to_string()),
        "no analysis paths in output"
    );
}

fn stale(seq: u64, kernel: &str, alloc_seq: u64, ptr: u64) -> StaleLaunch {
    StaleLaunch {
        seq,
        ts_ns: seq * 1000,
        tid: 1000,
        device: 0,
        api: Api::CuLaunchKernel,
        kernel: kernel.into(),
        param_index: 1,
        param_offset: 8,
        ptr,
        alloc_ptr: ptr,
        alloc_size: 4096,
        alloc_seq,
        free_seq: alloc_seq + 1,
        free_ts_ns: 0,
        ..Default::default()
    }
}

/// Guard mode: stale values are not stale launches; a device fault turns the suspects the
/// library names after it (and only those) into stale launches.
#[test]
fn guarded_stale_values_become_stale_launches_only_when_a_fault_names_them() {
    let mut t = TraceBuilder::new();
    let a = t.malloc(A, 4096);
    t.free(A);
    let b = t.malloc(A + (64 << 20), 4096);
    t.free(A + (64 << 20));
    t.record(Record::StaleValue(stale(10, "cutlass_align1", a, A)));
    t.record(Record::StaleValue(stale(
        11,
        "use_after_free",
        b,
        A + (64 << 20),
    )));
    // Clean so far: the JSON says so.
    let (_d, s) = summarize(&t);
    assert_eq!(s.stale_launch_count, 0);
    assert_eq!(s.stale_value_count, 2);
    assert!(s.device_faults.is_empty());
    t.record(Record::Note(Note {
        seq: 12,
        ts_ns: 12_000,
        kind: NoteKind::DeviceFault,
        ptr: 0,
        size: 1,
        value: 700,
        text: "DEVICE FAULT".into(),
    }));
    t.record(Record::StaleLaunch(stale(
        13,
        "use_after_free",
        b,
        A + (64 << 20),
    )));
    let (_d, s) = summarize(&t);
    assert_eq!(s.stale_launch_count, 1);
    assert_eq!(s.stale_launches[0].kernel, "use_after_free");
    assert_eq!(s.stale_launches[0].fault, Some(700));
    assert_eq!(s.stale_value_count, 1);
    assert_eq!(s.stale_values[0].kernel, "cutlass_align1");
    assert_eq!(s.device_faults.len(), 1);
    assert_eq!(
        (s.device_faults[0].code, s.device_faults[0].suspects),
        (700, 1)
    );
    let text = summary::render_text(&s);
    assert!(
        text.contains("FINDINGS: 1 stale launch, 1 device fault\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "STALE LAUNCH: kernel use_after_free (cuLaunchKernel, event 13) got parameter 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("a device fault followed: 700 (CUDA_ERROR_ILLEGAL_ADDRESS)"),
        "{text}"
    );
    assert!(
        text.contains(
            "DEVICE FAULT at event 12: 700 (CUDA_ERROR_ILLEGAL_ADDRESS): the device faulted \
             (illegal address); 1 launch since the last clean synchronisation got a pointer into \
             freed memory (the stale launch above)"
        ),
        "{text}"
    );
    assert!(
        text.contains("suspects: 1 kernel launch (stale values:"),
        "{text}"
    );
    assert!(text.contains("  suspect: kernel "), "{text}");
}

/// The calls of a process that dlopen()ed the library late: first seven frees (and the like) of
/// memory allocated before the load, each giving back something the trace never saw start, then
/// calls on memory it saw.
fn late_load_calls(t: &mut TraceBuilder) {
    let r = 0x6000_0000_0000;
    t.free(0x7e00_0000_0000); // 0: device memory from before the load
    t.call(Api::CuMemFree, 0x7e00_0010_0000, 0); // 1: the same through the driver
    t.call(Api::CudaFreeHost, 0x5000_0000, 0); // 2: pinned host memory
    t.call(Api::CudaHostUnregister, 0x9000, 0); // 3: a registration
    t.vmm(Api::CuMemUnmap, r, 2 * MIB, 0, 0); // 4: a mapping
    t.vmm(Api::CuMemRelease, 0, 0, 0x11, 0); // 5: a physical handle
    t.vmm(Api::CuMemAddressFree, r, 1 << 30, 0, 0); // 6: a reservation
    t.malloc(A, MIB); // 7
    t.free(A); // 8: fine
    t.free(A); // 9: a double free of what the trace saw: still invalid
    t.vmm(Api::CuMemCreate, 0, 2 * MIB, 0x22, 0); // 10
    t.vmm(Api::CuMemRelease, 0, 0, 0x22, 0); // 11: fine
    t.vmm(Api::CuMemRelease, 0, 0, 0x22, 0); // 12: released twice: invalid
    t.end(Stats::default());
}

/// A trace with a LateLoad note: frees, unmaps, releases, … of what the trace never saw
/// allocated are frees of earlier allocations, not invalid frees; double frees of what it saw
/// still are. Without the note the same: the driver accepted them, so the memory was live (it
/// was allocated through something the trace does not record). Graph and check agree.
#[test]
fn late_load_frees_of_earlier_allocations_are_not_invalid() {
    let d = tempfile::tempdir().unwrap();
    let mut late = TraceBuilder::new();
    late.note(NoteKind::LateLoad, 0);
    late_load_calls(&mut late);
    let mut preloaded = TraceBuilder::new();
    late_load_calls(&mut preloaded);
    let pl = late.write(d.path(), "late.trace");
    let pp = preloaded.write(d.path(), "preloaded.trace");

    let s = summary::summarize(&[&pl], &mut NoProgress).unwrap();
    assert_eq!(s.frees_of_earlier_allocations, 7);
    assert_eq!(s.invalid_free_count, 2);
    let seqs: Vec<u64> = s.invalid_frees.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, [9, 12]);
    assert_eq!(s.notes["late_load"], 1);
    assert_eq!((s.allocations, s.frees), (2, 2));
    let text = summary::render_text(&s);
    assert!(
        text.contains("7 frees of such memory, not counted as invalid"),
        "{text}"
    );
    assert!(text.contains("FINDINGS: 2 double frees\n"), "{text}");
    assert!(
        text.contains(
            "DOUBLE FREE: cuMemRelease of handle 0x22 (event 12, tid 1000): already freed by \
             cuMemRelease (event 11, tid 1000); allocated by cuMemCreate (event 10, tid 1000)"
        ),
        "{text}"
    );

    let s = summary::summarize(&[&pp], &mut NoProgress).unwrap();
    assert_eq!(s.frees_of_earlier_allocations, 7);
    assert_eq!(s.invalid_free_count, 2);
    assert_eq!(s.double_free_count, 2);
    let text = summary::render_text(&s);
    assert!(!text.contains("late     "), "{text}");
    assert!(
        text.contains("unseen   7 frees the driver accepted of memory the trace never saw"),
        "{text}"
    );

    // Both together: the figures add up, each trace keeps its own.
    let s = summary::summarize(&[&pl, &pp], &mut NoProgress).unwrap();
    assert_eq!(s.frees_of_earlier_allocations, 14);
    assert_eq!(s.invalid_free_count, 4);
    assert_eq!(s.traces[1].totals.frees_of_earlier_allocations, 7);

    // The graph's invalid_free anomalies are the summary's invalid frees.
    let g = isolate_analyzer::graph::graph(&[&pl], Default::default(), &mut NoProgress).unwrap();
    let invalid: Vec<_> = g
        .anomalies
        .iter()
        .filter(|a| a.kind() == "invalid_free")
        .collect();
    assert_eq!(invalid.len(), 2, "{invalid:?}");

    // `check --no-violations` counts only the two real ones.
    let o = isolate(
        d.path(),
        &[
            "check",
            "late.trace",
            "--baseline",
            "late.trace",
            "--no-violations",
        ],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    // Both are double frees (`check` names them as the summary does since the one finding model).
    assert_eq!(o.stdout.trim(), "violations found: 2 double frees");
    let o = isolate(d.path(), &["summary", "--json", "late.trace"]);
    let v = o.json();
    assert_eq!(v["frees_of_earlier_allocations"], 7);
    assert_eq!(v["traces"][0]["frees_of_earlier_allocations"], 7);
}

/// The note may come after another thread's first events (it is submitted when the trace
/// starts): what is live by then counts as seen, so its double free is still invalid.
#[test]
fn late_load_note_after_the_first_events() {
    let mut t = TraceBuilder::new();
    t.malloc(A, MIB); // 0
    t.note(NoteKind::LateLoad, 0);
    t.free(A); // 1
    t.free(A); // 2: double free
    t.free(A + 64 * MIB); // 3: never seen
    let (_d, s) = summarize(&t);
    assert_eq!(s.invalid_free_count, 1);
    assert_eq!(s.invalid_frees[0].seq, 2);
    assert_eq!(s.frees_of_earlier_allocations, 1);
}

/// A Python process with PyTorch's calls: what is held at exit.
fn pytorch_run(mode: &str, config: &[(&str, &str)]) -> TraceBuilder {
    let mut h = header(300, &["/venv/bin/python3", "/src/train.py", "--steps", "5"]);
    h.exe = "/usr/bin/python3.12".into();
    h.mode = mode.into();
    h.config = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut t = TraceBuilder::with_header(h);
    t.malloc(A, 20 * MIB); // 0: a large-pool segment
    t.malloc(A + 32 * MIB, 2 * MIB); // 1: a small-pool segment
    t.malloc(A + 64 * MIB, MIB); // 2: not a multiple of 2 MiB
    t.call(Api::CuMemAlloc, A + 128 * MIB, 131_072); // 3: cuBLAS's workspace, below the runtime
    let r = 0x6000_0000_0000;
    t.vmm(Api::CuMemAddressReserve, r, 1 << 40, 0, 0); // 4: an expandable segment's range
    t.vmm(Api::CuMemCreate, 0, 20 * MIB, 0x11, 0); // 5: its memory
    t.vmm(Api::CuMemMap, r, 20 * MIB, 0x11, 0); // 6
    t
}

/// Memory a caching allocator (or a library) holds at exit is told apart from leaks: only what
/// nothing explains is held by the program (information), and a process that died is not judged.
#[test]
fn caching_allocators_hold_memory_at_exit_without_leaking() {
    let mut t = pytorch_run("log", &[]);
    t.end(Stats::default());
    let (_d, s) = summarize(&t);
    let h = &s.held_at_exit;
    assert_eq!(
        (h.count, h.bytes),
        (s.live_at_end.count, s.live_at_end.bytes)
    );
    assert_eq!((h.count, h.bytes), (5, 43 * MIB + 131_072));
    assert_eq!(
        (h.caching_allocator.count, h.caching_allocator.bytes),
        (3, 42 * MIB)
    );
    assert_eq!(
        (h.expandable_segments.count, h.expandable_segments.bytes),
        (1, 20 * MIB)
    );
    assert_eq!((h.library.count, h.library.bytes), (1, 131_072));
    assert_eq!((h.possible_leak.count, h.possible_leak.bytes), (1, MIB));
    assert_eq!(h.process_died.count, 0);
    assert_eq!((h.address_space.count, h.address_space.bytes), (1, 1 << 40));
    assert_eq!(s.possible_leaks.len(), 1);
    assert_eq!(
        (s.possible_leaks[0].seq, s.possible_leaks[0].size),
        (2, MIB)
    );
    assert_eq!(s.findings, 0);
    let text = summary::render_text(&s);
    assert!(
        text.contains(
            "  2 allocations (22.0 MiB): held at exit by a caching allocator (normal): PyTorch's \
             segments"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "  1 allocation (20.0 MiB): held at exit by a caching allocator (normal): PyTorch's \
             expandable segments"
        ),
        "{text}"
    );
    assert!(
        text.contains("  1 allocation (128.0 KiB): held at exit by CUDA libraries (normal)"),
        "{text}"
    );
    assert!(
        text.contains("1.0 TiB of address space still reserved (1 range, cuMemAddressReserve): address space, not memory"),
        "{text}"
    );
    assert!(
        text.contains("findings: none of those log mode can see"),
        "{text}"
    );
    assert!(
        text.contains(
            "  1 allocation (1.0 MiB): held by the program (information, not a finding)\n"
        ),
        "{text}"
    );
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(
        v["held_at_exit"]["caching_allocator"],
        json!({"count": 3, "bytes": 42 * MIB})
    );
    assert_eq!(v["live_at_end"]["count"], json!(5), "existing keys stay");

    // PyTorch's cache off (isolate mode turns it off; so does the setting when the header has
    // it): segments are tensors, and what is still held is the program's.
    for (mode, config) in [
        ("isolate", &[][..]),
        ("log", &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")][..]),
    ] {
        let mut t = pytorch_run(mode, config);
        t.end(Stats::default());
        let (_d, s) = summarize(&t);
        let h = &s.held_at_exit;
        assert_eq!(h.caching_allocator.count, 0, "{mode} {config:?}");
        assert_eq!(h.library.count, 1);
        assert_eq!(h.possible_leak.count, 4);
    }

    // Not Python: nothing is explained that way.
    let mut t = TraceBuilder::new();
    t.malloc(A, 20 * MIB);
    t.end(Stats::default());
    let (_d, s) = summarize(&t);
    assert_eq!(s.held_at_exit.possible_leak.count, 1);

    // A process that died held what it held: not judged.
    let mut t = pytorch_run("isolate", &[]);
    t.record(Record::End(isolate_trace::End {
        ts_ns: 99_000_000,
        reason: isolate_trace::EndReason::Signal(6),
        stats: Stats::default(),
    }));
    let (_d, s) = summarize(&t);
    assert_eq!(s.held_at_exit.process_died.count, 4);
    assert_eq!(s.held_at_exit.possible_leak.count, 0);
    assert_eq!(s.findings, 0);
    let text = summary::render_text(&s);
    assert!(
        text.contains("ended    killed by signal 6 (SIGABRT)"),
        "{text}"
    );
    assert!(
        text.contains(
            "4 allocations (43.0 MiB): held by a process that died (killed by signal 6 \
             (SIGABRT)): not judged"
        ),
        "{text}"
    );
}

/// A call that returned a device-fault code is a device fault, named with its error, even
/// without the library's note (traces of older libraries).
#[test]
fn a_call_that_returns_a_fault_code_is_a_device_fault() {
    let mut t = TraceBuilder::new();
    t.malloc(A, 4 * MIB);
    t.free_refused(A, 700);
    t.fail(Api::CuMemAlloc, MIB, 700);
    let (_d, s) = summarize(&t);
    let c = s.traces[0]
        .first_faulted_call
        .as_ref()
        .expect("a faulted call");
    assert_eq!((c.seq, c.api.as_str(), c.code), (1, "cudaFree", 700));
    assert!(s.device_faults.is_empty());
    assert_eq!(s.device_fault_count, 1);
    assert_eq!(s.findings, 1);
    let text = summary::render_text(&s);
    assert!(
        text.contains(
            "DEVICE FAULT: cudaFree (event 1) returned 700 (cudaErrorIllegalAddress): a kernel \
             before it faulted (illegal address)"
        ),
        "{text}"
    );
    assert!(
        text.contains("1 failed: 700 (CUDA_ERROR_ILLEGAL_ADDRESS)"),
        "the driver call's code has the driver's name: {text}"
    );
    assert!(
        text.contains("1 failed: 700 (cudaErrorIllegalAddress)"),
        "{text}"
    );
    // With the library's note, the fault names the call that returned it.
    t.record(Record::Note(Note {
        seq: 3,
        ts_ns: 9_000_000,
        kind: NoteKind::DeviceFault,
        ptr: 0,
        size: 0,
        value: 700,
        text: String::new(),
    }));
    let (_d, s) = summarize(&t);
    assert_eq!(s.device_faults.len(), 1);
    assert_eq!(s.device_faults[0].call.as_ref().map(|c| c.seq), Some(1));
    assert_eq!(s.findings, 1);
}

/// The library's cost notes are told by their kind and topic (format version 3: `Cost` notes);
/// the `Info` notes of older traces by the text they begin with. Counters are not costs.
#[test]
fn cost_notes_by_kind_and_topic_older_ones_by_text() {
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    for (kind, topic, text) in [
        (
            NoteKind::Cost,
            isolate_trace::CostTopic::Isolation as u64,
            "isolation: 3 frees",
        ),
        (
            NoteKind::Cost,
            isolate_trace::CostTopic::LaunchCheck as u64,
            "launch check: 2",
        ),
        (NoteKind::Cost, 99, "a topic this analyzer does not know"),
        (NoteKind::Info, 0, "call stacks: 5 captured"),
        (NoteKind::Info, 0, "hello"),
    ] {
        t.text_note(kind, topic, 0, text);
        t.seq += 1;
    }
    t.end(Stats::default());
    let (_d, s) = summarize(&t);
    assert_eq!(
        s.library_cost,
        ["isolation: 3 frees", "call stacks: 5 captured"]
    );
}

/// The library's notes on its own time read as information (issue 32: `cost     call stacks: 4
/// captured, 4632.57 us each` on every summary read as an alarm): under one heading that says
/// so, indented, and no line of the summary starts with `cost`.
#[test]
fn the_librarys_cost_is_information_under_a_heading() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    t.text_note(
        NoteKind::Cost,
        isolate_trace::CostTopic::Isolation as u64,
        0,
        "call stacks: 4 captured, 4632.57 us each on the calling threads",
    );
    t.seq += 1;
    t.end(Stats::default());
    t.write(d.path(), "c.trace");
    let text = isolate(d.path(), &["summary", "c.trace"]).stdout;
    assert!(
        text.contains(
            "the library's own time (information, not a problem of the program):\n  call stacks: \
             4 captured, 4632.57 us each on the calling threads\n"
        ),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("cost")), "{text}");
}

/// A trace with one unordered free (format 4's FreedInUse: freed on one stream while a use on
/// another stream was not ordered before it): its line names the allocation, the free, the use
/// and the missing edge with the advice, the headline counts it, the JSON has its fields, and
/// `--error-exitcode` fails (it counts).
#[test]
fn an_unordered_free_is_a_finding_that_counts() {
    let mut h = header(100, &["prog"]);
    h.mode = "isolate".into();
    let mut t = TraceBuilder::with_header(h);
    let a = t.call(Api::CudaMallocAsync, A, 4096);
    t.record(Record::FreedInUse(Box::new(FreedInUse {
        seq: 2,
        ts_ns: 9_000_000,
        tid: 1000,
        device: 0,
        alloc_ptr: A,
        alloc_size: 4096,
        alloc_seq: a,
        alloc_stack: 0,
        free_seq: 1,
        free_api: Api::CudaFreeAsync,
        free_stream: 0,
        free_stack: 0,
        use_name: "mul_kernel".into(),
        use_kernel: true,
        use_stream: 0x5555_0000_2000,
        use_after_seq: 0,
        use_ts_ns: 8_000_000,
        use_stack: 0,
        use_tick: 3,
        seen_tick: 1,
    })));
    t.free(A);
    t.end(Stats::default());
    let (d, s) = summarize(&t);
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["freed_in_use_count"], json!(1));
    assert_eq!(v["findings"], json!(1));
    let f = &v["freed_in_use"][0];
    assert_eq!(f["alloc_ptr"], json!("0x7f0000000000"));
    assert_eq!(f["free_api"], json!("cudaFreeAsync"));
    assert_eq!(f["free_stream"], json!("0x0"));
    assert_eq!(f["use_stream"], json!("0x555500002000"));
    assert_eq!(f["use_name"], json!("mul_kernel"));
    assert_eq!(
        (f["use_tick"].as_u64(), f["seen_tick"].as_u64()),
        (Some(3), Some(1))
    );
    let text = summary::render_text(&s);
    assert!(text.contains("FINDINGS: 1 unordered free"), "{text}");
    assert!(
        text.contains(
            "UNORDERED FREE: a 4.0 KiB allocation at 0x7f0000000000 (cudaMallocAsync, event 0) \
             was freed by cudaFreeAsync (event 1) on the legacy default stream while kernel \
             mul_kernel on stream 0x555500002000 (queued after event 0) may still use it"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "(the legacy default stream had seen stream 0x555500002000's work up to its \
             operation 1, the use was its operation 3); in PyTorch: x.record_stream(s) or \
             torch.cuda.current_stream().wait_stream(s) before del x"
        ),
        "{text}"
    );
    std::fs::rename(d.path().join("t.trace"), d.path().join("u.trace")).unwrap();
    let o = isolate(d.path(), &["summary", "--error-exitcode", "7", "u.trace"]);
    assert_eq!(o.code, 7, "{}{}", o.stdout, o.stderr);
    let html = isolate_analyzer::report::render(&[d.path().join("u.trace")], &mut NoProgress)
        .unwrap()
        .html;
    assert!(
        html.contains("Unordered free: freed while still in use on another stream"),
        "the report's entry"
    );
}

//! Guard mode (`ISOLATE_MODE=isolate ISOLATE_GUARD=on`) on the stand-in
//! (`tests/programs/guard.c`, one scenario per run): every guardable device allocation is a VMM
//! mapping with unmapped reserved address space around it, its pointer placed against the guard;
//! a free unmaps it and keeps the reservation, so freed addresses never come back (until address
//! space runs short: then the oldest reservations are recycled, with a note); managed and host
//! memory are left to isolate mode; return codes are those of a plain run. Kernel launches
//! with pointers into freed guard memory are stale *values* until a device fault follows; then
//! the launches since the last clean synchronisation are the stale launches that caused it.
//!
//! The stand-in makes the fault: its `standin_touch` (a stand-in kernel touching memory)
//! finds unmapped memory without a SIGSEGV and sets the context's sticky error 700, as a GPU
//! does (`guard touch` checks that on its own, without guard mode).
//!
//! What the program prints on lines starting with `probe ` differs from a plain run by design;
//! every other line must not.

use isolate_tests::{Output, Run, Trace};
use isolate_trace::{Api, EndReason, Note, NoteKind, Record};
use serde_json::Value;
use std::collections::HashMap;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn guard_run(scenario: &str) -> Run {
    Run::program("guard").arg(scenario)
}

fn guarded(run: Run) -> Run {
    run.env("ISOLATE_MODE", "isolate")
        .env("ISOLATE_GUARD", "on")
}

fn up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// The unmapped space guard mode keeps on each side of an allocation, as the stand-in sees it
/// (the reservation of one 4 KiB allocation, less its one-granule mapping, halved): measured, so
/// that the tests hold whatever width the library chooses.
fn measured_gap(gran: u64) -> u64 {
    let out = guarded(guard_run("first"))
        .env("STANDIN_GRANULARITY", gran.to_string())
        .run();
    out.assert_success();
    let p = &probes(&out)["first"];
    assert_eq!((p["reserved"], p["range_size"]), (1, gran), "{p:?}");
    let gap = (p["reserved_bytes"] - gran) / 2;
    assert!(
        gap >= gran && gap.is_multiple_of(gran) && p["reserved_bytes"] == 2 * gap + gran,
        "at least one whole granule on each side: {p:?}"
    );
    gap
}

fn has_line(out: &Output, line: &str) {
    assert!(
        out.stdout.lines().any(|l| l == line),
        "{}: no line {line:?} in:\n{}",
        out.describe,
        out.stdout
    );
}

/// The lines every mode prints the same (not `probe ` lines, nor those starting with `skip`).
fn common<'a>(out: &'a Output, skip: &[&str]) -> Vec<&'a str> {
    out.stdout
        .lines()
        .filter(|l| !l.starts_with("probe ") && !skip.iter().any(|s| l.starts_with(s)))
        .collect()
}

/// `a` printed what `b` printed, `probe ` lines apart, and ended the same way.
fn same_but_probes(a: &Output, b: &Output) {
    same_but(a, b, &[]);
}

/// `a` printed what `b` printed, `probe ` lines and lines starting with `skip` apart, and
/// ended the same way.
fn same_but(a: &Output, b: &Output, skip: &[&str]) {
    assert_eq!(
        common(a, skip),
        common(b, skip),
        "{} and {} differ beyond the probe lines and {skip:?}:\n--- {}\n{}\n--- {}\n{}",
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

/// The `probe name=NAME k=v ...` lines, by name.
fn probes(out: &Output) -> HashMap<String, HashMap<String, u64>> {
    let mut all = HashMap::new();
    for line in out.lines_starting("probe name=") {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap().to_string();
        let kv = all.entry(name).or_insert_with(HashMap::new);
        for w in words {
            let (k, v) = w.split_once('=').unwrap_or_else(|| panic!("{line:?}"));
            // -1 (not known) reads as u64::MAX
            let v: i64 = v.parse().unwrap_or_else(|_| panic!("{line:?}"));
            kv.insert(k.to_string(), v as u64);
        }
    }
    all
}

/// The number after `key=` on the stdout line starting with `prefix`.
fn probe_value(out: &Output, prefix: &str, key: &str) -> u64 {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{}", out.stdout));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Sizes of the allocations the program described (`NAME size N aligned256 ...` lines).
fn sizes(out: &Output) -> HashMap<String, u64> {
    out.stdout
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 9 && w[1] == "size" && w[3] == "aligned256")
                .then(|| (w[0].to_string(), w[2].parse().unwrap()))
        })
        .collect()
}

/// The run's one trace: complete, from guard mode, one event per `ev` line.
fn guard_trace(out: &Output) -> &Trace {
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    assert_eq!(t.header.mode, "isolate");
    assert!(
        t.header
            .config
            .iter()
            .any(|(k, v)| k == "ISOLATE_GUARD" && v == "on"),
        "{:?}",
        t.header.config
    );
    out.assert_trace_matches(t, None);
    t
}

fn config<'a>(t: &'a Trace, key: &str) -> Option<&'a str> {
    t.header
        .config
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
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

fn hex(v: u64) -> Value {
    Value::String(format!("{v:#x}"))
}

/// stderr lines that contain `what`.
fn stderr_lines<'a>(out: &'a Output, what: &str) -> Vec<&'a str> {
    out.stderr.lines().filter(|l| l.contains(what)).collect()
}

// ------------------------------------------------------------------------------ placement

/// Every guardable allocation call (cudaMalloc, cuMemAlloc_v2, the async, pool and _ptsz
/// variants) in guard mode is one mapping of `roundup(size, granularity)` bytes inside a
/// reservation with the same unmapped gap (at least a granule) on each side (the stand-in sees
/// exactly one reservation per allocation), the pointer 256-aligned and right-aligned in the mapping: the byte one past the
/// 256-rounded end is unmapped, the byte before the start is mapped exactly when the mapping has
/// room before it, all of the allocation is usable. Freed, all of it is unmapped, and the
/// reservations stay. Without the preload the same calls are arena blocks with readable memory
/// after them, and every call returns the same, sticky errors of failed calls included. Both
/// with the stand-in's default granularity and with a GPU's 2 MiB.
#[test]
fn guarded_allocations_are_mappings_right_aligned_against_the_guard() {
    for gran in [64 * KIB, 2 * MIB] {
        let run = guard_run("layout").env("STANDIN_GRANULARITY", gran.to_string());
        let plain = run.clone().preload(false).run();
        plain.assert_success();
        let out = guarded(run).run();
        same_but_probes(&out, &plain);
        let t = guard_trace(&out);
        let sizes = sizes(&out);
        assert_eq!(sizes.len(), 14, "{}", out.stdout);
        let (got, base) = (probes(&out), probes(&plain));
        let gap = measured_gap(gran);
        for (name, &size) in &sizes {
            has_line(
                &out,
                &format!("{name} size {size} aligned256 1 readable 1 usable 1"),
            );
            let p = &got[name];
            let phys = up(size, gran);
            let off = phys - up(size, 256);
            let want = [
                ("reserved", 1),
                ("reserved_bytes", 2 * gap + phys),
                ("range_rc", 0),
                ("range_size", phys),
                ("range_off", off),
                ("past_end", 0),
                ("before_start", (off > 0) as u64),
                ("freed_readable", 0),
            ];
            for (k, v) in want {
                assert_eq!(
                    p[k], v,
                    "{name} ({size} bytes, granularity {gran}): {k} in {p:?}"
                );
            }
            // Without guard mode: a plain arena block, readable past its end and after its free.
            let b = &base[name];
            for (k, v) in [
                ("reserved", 0),
                ("range_size", size),
                ("range_off", 0),
                ("past_end", 1),
                ("freed_readable", 1),
            ] {
                assert_eq!(b[k], v, "plain run, {name}: {k} in {b:?}");
            }
        }
        assert_eq!(
            probe_value(&out, "probe reserved_live", "reserved_live"),
            14
        );
        assert_eq!(
            probe_value(&out, "probe reserved_after_free", "reserved_after_free"),
            14,
            "a free keeps the reservation"
        );
        assert_eq!(
            probe_value(&plain, "probe reserved_live", "reserved_live"),
            0
        );
        // Every guardable API went through guard mode, and the trace shows the program's calls
        // only: the library's own VMM calls are not events.
        let apis: Vec<Api> = t
            .events_by_seq()
            .into_iter()
            .filter(|e| e.ok() && e.api.kind() == isolate_trace::Kind::Alloc && e.size > 0)
            .map(|e| {
                assert_eq!(e.ptr % 256, 0, "{e:?}");
                e.api
            })
            .collect();
        for api in [
            Api::CudaMalloc,
            Api::CudaMallocAsync,
            Api::CudaMallocAsyncPtsz,
            Api::CudaMallocFromPoolAsync,
            Api::CudaMallocFromPoolAsyncPtsz,
            Api::CuMemAlloc,
            Api::CuMemAllocAsync,
            Api::CuMemAllocAsyncPtsz,
            Api::CuMemAllocFromPoolAsync,
            Api::CuMemAllocFromPoolAsyncPtsz,
        ] {
            assert!(apis.contains(&api), "{api} not exercised: {apis:?}");
        }
        for api in [
            "cuMemAddressReserve",
            "cuMemCreate",
            "cuMemMap",
            "cuMemUnmap",
        ] {
            assert_eq!(t.count(api), 0, "{api}: {:?}", t.counts());
        }
        assert!(notes(t, NoteKind::GuardRecycle).is_empty());
        assert!(
            out.stderr
                .lines()
                .all(|l| !l.contains("STALE") && !l.contains("FAULT"))
        );
    }
}

/// ISOLATE_GUARD_SIDE=start: the pointer is the mapping's start, the unmapped gap just before
/// it; past the 256-rounded end lies the rest of the mapping, if the size leaves any.
#[test]
fn guard_side_start_puts_the_guard_before_the_pointer() {
    let plain = guard_run("layout").preload(false).run();
    let out = guarded(guard_run("layout"))
        .env("ISOLATE_GUARD_SIDE", "start")
        .run();
    same_but_probes(&out, &plain);
    let t = guard_trace(&out);
    assert_eq!(config(t, "ISOLATE_GUARD_SIDE"), Some("start"));
    let gran = 64 * KIB; // the stand-in's default
    let got = probes(&out);
    let sizes = sizes(&out);
    assert_eq!(sizes.len(), 14);
    let mut room_after = 0;
    for (name, &size) in &sizes {
        let p = &got[name];
        let phys = up(size, gran);
        let after = (up(size, 256) < phys) as u64;
        room_after += after;
        for (k, v) in [
            ("reserved", 1),
            ("range_size", phys),
            ("range_off", 0),
            ("before_start", 0),
            ("past_end", after),
            ("freed_readable", 0),
        ] {
            assert_eq!(p[k], v, "{name} ({size} bytes): {k} in {p:?}");
        }
    }
    assert!(room_after > 0 && room_after < 14, "both cases seen");
}

/// The process's first CUDA call is a cudaMalloc: no context is current when it is made, and it
/// is guarded all the same.
#[test]
fn the_first_allocation_of_a_process_is_guarded_too() {
    let plain = guard_run("first").preload(false).run();
    let out = guarded(guard_run("first")).run();
    same_but_probes(&out, &plain);
    guard_trace(&out);
    let p = &probes(&out)["first"];
    assert_eq!(
        (p["reserved"], p["range_size"], p["past_end"]),
        (1, 64 * KIB, 0),
        "{p:?}\n{}",
        out.stdout
    );
}

// ----------------------------------------------------------------------------------- free

/// A freed guarded allocation is unmapped at once (reading it would fault), its reservation is
/// kept, and none of the next 32 allocations of the same sizes gets an address inside it or
/// inside its mapping; a plain run hands the freed addresses straight back. Double frees and
/// frees of an inner address return what they return in a plain run, with the same sticky
/// error.
#[test]
fn freed_guarded_memory_is_unmapped_and_never_handed_out_again() {
    let plain = guard_run("free").preload(false).run();
    plain.assert_success();
    has_line(&plain, "probe a after free: all 0x11");
    has_line(&plain, "probe a2 after free: all 0x22");
    assert!(
        probe_value(&plain, "probe again", "inside_freed") > 0,
        "the stand-in reuses freed addresses: {}",
        plain.stdout
    );
    let out = guarded(guard_run("free")).run();
    same_but_probes(&out, &plain);
    has_line(&out, "probe a after free: unreadable");
    has_line(&out, "probe a2 after free: unreadable");
    has_line(&out, "probe reservations_before_free=2 after=2");
    has_line(&out, "probe again inside_freed=0 inside_freed_ranges=0");
    let t = guard_trace(&out);
    // The trace agrees: no allocation after the frees overlaps A or A2.
    let ev = t.events_by_seq();
    let allocs: Vec<_> = ev
        .iter()
        .filter(|e| {
            e.ok()
                && e.api.kind() == isolate_trace::Kind::Alloc
                && e.api.memory() == isolate_trace::Memory::Device
        })
        .collect();
    let (a, a2) = (allocs[0], allocs[1]);
    assert_eq!((a.size, a2.size), (MIB, 1000));
    assert_eq!(allocs.len(), 2 + 32);
    for e in &allocs[2..] {
        for old in [a, a2] {
            assert!(
                e.ptr >= old.ptr + old.size || e.ptr + e.size <= old.ptr,
                "{e:?} overlaps {old:?}"
            );
        }
    }
}

/// ISOLATE_GUARD_MIN_SIZE=64KiB: smaller allocations are ordinary isolate-mode ones (arena
/// blocks, quarantined and poisoned when freed, never reused while held), larger ones guarded.
#[test]
fn allocations_below_the_guard_min_size_are_quarantined_instead() {
    let min = |run: Run| guarded(run).env("ISOLATE_GUARD_MIN_SIZE", "64KiB");
    let plain = guard_run("free").preload(false).run();
    let out = min(guard_run("free")).run();
    same_but_probes(&out, &plain);
    let t = guard_trace(&out);
    assert_eq!(config(t, "ISOLATE_GUARD_MIN_SIZE"), Some("65536"));
    has_line(&out, "probe a after free: unreadable");
    has_line(&out, "probe a2 after free: all 0xff");
    has_line(&out, "probe reservations_before_free=1 after=1");
    has_line(&out, "probe again inside_freed=0 inside_freed_ranges=0");

    let plain = guard_run("layout").preload(false).run();
    let out = min(guard_run("layout")).run();
    same_but_probes(&out, &plain);
    guard_trace(&out);
    let got = probes(&out);
    let sizes = sizes(&out);
    let (mut small, mut large) = (0, 0);
    for (name, &size) in &sizes {
        let p = &got[name];
        if size < 64 * KIB {
            small += 1;
            for (k, v) in [
                ("reserved", 0),
                ("range_size", size),
                ("range_off", 0),
                ("past_end", 1),
                ("freed_readable", 1),
            ] {
                assert_eq!(p[k], v, "{name} ({size} bytes) is ordinary: {k} in {p:?}");
            }
        } else {
            large += 1;
            assert_eq!(
                (p["reserved"], p["past_end"], p["freed_readable"]),
                (1, 0, 0),
                "{name} ({size} bytes) is guarded: {p:?}"
            );
        }
    }
    assert!(small > 0 && large > 0, "{sizes:?}");
    assert_eq!(
        probe_value(&out, "probe reserved_live", "reserved_live"),
        large
    );
}

/// Managed memory (cudaMallocManaged, cuMemAllocManaged) and host memory (cudaMallocHost,
/// cudaHostAlloc, cuMemAllocHost_v2, cuMemHostAlloc) are not guarded: no reservation, the
/// driver's own block; freed managed memory is quarantined and poisoned as in isolate mode
/// without guard (the whole output is that run's).
#[test]
fn managed_and_host_memory_are_not_guarded() {
    let plain = guard_run("managed").preload(false).run();
    plain.assert_success();
    let out = guarded(guard_run("managed")).run();
    same_but_probes(&out, &plain);
    guard_trace(&out);
    for line in [
        "reservations made 0",
        "m1 range 0 off 0 size 1048576 usable 1",
        "m2 range 0 off 0 size 4096 usable 1",
        "h1 range -1 off 0 size 0 usable 1",
        "h4 range -1 off 0 size 0 usable 1",
        "probe m1 after free: all 0xff",
        "probe m2 after free: all 0xff",
    ] {
        has_line(&out, line);
    }
    assert_eq!(out.stdout.matches("reservations made 0").count(), 2);
    let isolate = guard_run("managed").env("ISOLATE_MODE", "isolate").run();
    out.assert_same_as(&isolate);
}

/// Programs that never touch freed memory print in guard mode exactly what they print without
/// the preload: the same successes, failure codes and sticky errors (out of memory in both
/// layers included, where the guard's rounded-up mapping fails first), and the same exit.
#[test]
fn guard_mode_keeps_the_return_codes_of_a_plain_run() {
    for run in [
        Run::program("rt_basic"),
        Run::program("drv_static"),
        Run::program("bad_calls"),
        Run::program("rt_vmm"),
        Run::program("oom").env("STANDIN_MEM_BYTES", "16777216"),
        Run::program("quarantine")
            .arg("oom")
            .env("STANDIN_MEM_BYTES", (8 * MIB).to_string()),
    ] {
        let plain = run.clone().preload(false).run();
        let out = guarded(run).run();
        out.assert_same_as(&plain);
        let t = out.only_trace();
        t.assert_complete(EndReason::Exit);
        out.assert_trace_matches(t, None);
    }
}

// ---------------------------------------------------------------------------------- stale

/// `guard stale`, run with `run`: the trace, A's allocation and free events.
fn stale_events(t: &Trace) -> (isolate_trace::Event, isolate_trace::Event) {
    let ev = t.events_by_seq();
    let a = *ev
        .iter()
        .find(|e| e.api == Api::CudaMalloc && e.size == MIB)
        .expect("A's cudaMalloc");
    let free = *ev
        .iter()
        .find(|e| e.api == Api::CudaFree && e.ptr == a.ptr)
        .expect("A's cudaFree");
    (a, free)
}

/// CUTLASS's case: a freed, unmapped A reaches kernel `k_ignore` in a by-value struct field
/// it never uses; a free of a scratch allocation then synchronises cleanly, so that launch was
/// harmless; kernel `k_use` gets A and touches it, and the next recorded call (the free of B)
/// returns the device fault. Exactly one DEVICE FAULT line, naming 700 and k_use as the
/// suspect; k_ignore is never named and nothing is a STALE LAUNCH. The trace and the
/// analyzer: one stale launch (k_use, fault 700), one stale value (k_ignore), one device fault.
#[test]
fn a_stale_value_becomes_a_stale_launch_only_when_a_fault_follows() {
    let plain = guard_run("stale").preload(false).run();
    plain.assert_success();
    has_line(&plain, "probe k_use touched A ok=1");
    has_line(&plain, "probe free B 0");
    let out = guarded(guard_run("stale")).run();
    // The frees after the fault return 700 there, 0 in the plain run.
    same_but(
        &out,
        &plain,
        &[
            "ev cudaFree 700 ptr=@",
            "ev cudaFree 0 ptr=@B",
            "ev cudaFree 0 ptr=@C",
        ],
    );
    has_line(&out, "ev cudaFree 700 ptr=@B");
    has_line(&out, "ev cudaFree 700 ptr=@C");
    has_line(&out, "k_ignore wrote B 1");
    has_line(&out, "kernel runs k_ignore 1 k_use 1");
    has_line(&out, "probe k_use touched A ok=0");
    has_line(&out, "probe free B 700");
    has_line(&out, "probe free C 700");
    has_line(&out, "probe cudaDeviceSynchronize 700");
    let t = guard_trace(&out);
    let (a, a_free) = stale_events(t);

    let faults = stderr_lines(&out, "DEVICE FAULT");
    assert_eq!(
        faults.len(),
        1,
        "one fault line for two faulted calls:\n{}",
        out.stderr
    );
    assert!(
        faults[0].starts_with(
            "isolate: DEVICE FAULT: CUDA error 700 (illegal address) returned by cudaFree"
        ),
        "{}",
        out.stderr
    );
    let suspects = stderr_lines(&out, "suspect:");
    // The line names the calls' stacks (native only: by id, and the trace that has them).
    let launch_stack = t
        .records
        .iter()
        .find_map(|r| match r {
            Record::StaleLaunch(l) => Some(l.seq),
            _ => None,
        })
        .and_then(|seq| {
            t.records.iter().find_map(|r| match r {
                Record::StackOf(s) if s.seq == seq => Some(s.stack),
                _ => None,
            })
        })
        .unwrap();
    assert_eq!(
        suspects,
        [format!(
            "isolate:   suspect: kernel k_use got {:#x} (parameter 0, byte 0), inside allocation \
             {:#x} (1048576 bytes) freed at event {}; launched at stack {launch_stack}, allocated \
             at stack {}, freed at stack {} of {} (isolate summary names the code)",
            a.ptr,
            a.ptr,
            a_free.seq,
            a.stack,
            a_free.stack,
            t.path.display()
        )],
        "{}",
        out.stderr
    );
    assert!(stderr_lines(&out, "k_ignore").is_empty(), "{}", out.stderr);
    assert!(
        stderr_lines(&out, "STALE LAUNCH").is_empty(),
        "{}",
        out.stderr
    );

    // The records: both launches were stale values; k_use became the stale launch of the fault.
    let values = t.stale_values();
    let kernels: Vec<&str> = values.iter().map(|v| v.kernel.as_str()).collect();
    assert_eq!(kernels, ["k_ignore", "k_use"], "{values:#?}");
    assert_eq!(
        (values[0].param_index, values[0].param_offset, values[0].ptr),
        (0, 8, a.ptr)
    );
    let launches = t.stale_launches();
    assert_eq!(launches.len(), 1, "{launches:#?}");
    let l = &launches[0];
    assert_eq!(l.kernel, "k_use");
    assert_eq!((l.param_index, l.param_offset, l.ptr), (0, 0, a.ptr));
    assert_eq!((l.alloc_ptr, l.alloc_size), (a.ptr, MIB));
    assert_eq!((l.alloc_seq, l.free_seq), (a.seq, a_free.seq));
    let df = notes(t, NoteKind::DeviceFault);
    assert_eq!(df.len(), 1, "{df:#?}");
    assert_eq!((df[0].value, df[0].size), (700, 1), "{:?}", df[0]);

    let s = t.analyzer_summary();
    assert_eq!(s["stale_launch_count"], 1, "{s:#}");
    assert_eq!(s["stale_launches"][0]["kernel"], "k_use");
    assert_eq!(s["stale_launches"][0]["fault"], 700);
    assert_eq!(s["stale_launches"][0]["ptr"], hex(a.ptr));
    assert_eq!(s["stale_value_count"], 1, "{s:#}");
    let sv = s["stale_values"].as_array().unwrap();
    assert_eq!(sv.len(), 1, "{s:#}");
    assert_eq!(sv[0]["kernel"], "k_ignore");
    assert_eq!(sv[0]["fault"], Value::Null);
    assert_eq!(sv[0]["param_offset"], 8);
    let faults = s["device_faults"].as_array().unwrap();
    assert_eq!(faults.len(), 1, "{s:#}");
    assert_eq!(faults[0]["code"], 700, "{s:#}");
    assert_eq!(faults[0]["suspects"], 1, "{s:#}");
}

/// The same without the clean synchronisation between the two launches: both are suspects of
/// the fault, and both are stale launches.
#[test]
fn without_a_clean_synchronisation_every_launch_since_is_a_suspect() {
    let out = guarded(guard_run("stale").arg("nosync")).run();
    has_line(&out, "probe free B 700");
    let t = guard_trace(&out);
    assert_eq!(
        stderr_lines(&out, "DEVICE FAULT").len(),
        1,
        "{}",
        out.stderr
    );
    let suspects = stderr_lines(&out, "suspect:");
    assert_eq!(suspects.len(), 2, "{}", out.stderr);
    assert!(
        suspects[0].contains("kernel k_ignore got") && suspects[1].contains("kernel k_use got")
    );
    let df = notes(t, NoteKind::DeviceFault);
    assert_eq!((df.len(), df[0].size), (1, 2), "{df:#?}");
    let s = t.analyzer_summary();
    assert_eq!(s["stale_launch_count"], 2, "{s:#}");
    for l in s["stale_launches"].as_array().unwrap() {
        assert_eq!(l["fault"], 700, "{s:#}");
    }
    assert_eq!(s["stale_value_count"], 0, "{s:#}");
}

/// Without guard mode the freed A stays mapped (poisoned, in quarantine): touching it does not
/// fault, so the launch check decides at the launch, by its evidence rule: k_use's parameter of
/// its own is exactly A's start, a STALE LAUNCH; k_ignore's A sits inside a struct it passes by
/// value (a field the kernel ignores, as PyTorch's kernels leave earlier launches' buffers in
/// unused slots), a suspect only. No fault follows. In log mode launches are not checked:
/// nothing is reported.
#[test]
fn without_guard_both_launches_are_stale_pointers_at_once() {
    let plain = guard_run("stale").preload(false).run();
    let out = guard_run("stale").env("ISOLATE_MODE", "isolate").run();
    out.assert_same_as(&plain);
    has_line(&out, "probe k_use touched A ok=1");
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(t, None);
    let (a, _) = stale_events(t);
    let stale = stderr_lines(&out, "STALE LAUNCH");
    assert_eq!(stale.len(), 1, "{}", out.stderr);
    assert!(stale[0].contains("kernel k_use got"), "{}", out.stderr);
    assert!(
        stderr_lines(&out, "DEVICE FAULT").is_empty(),
        "{}",
        out.stderr
    );
    let values: Vec<String> = t.stale_values().into_iter().map(|l| l.kernel).collect();
    assert_eq!(values, ["k_ignore"]);
    assert!(notes(t, NoteKind::DeviceFault).is_empty());
    let s = t.analyzer_summary();
    assert_eq!(s["stale_launch_count"], 1, "{s:#}");
    for l in s["stale_launches"].as_array().unwrap() {
        assert_eq!(l["fault"], Value::Null, "{s:#}");
        assert_eq!(l["alloc_ptr"], hex(a.ptr), "{s:#}");
    }
    assert_eq!(s["stale_value_count"], 1);
    assert_eq!(s["device_faults"].as_array().unwrap().len(), 0, "{s:#}");

    let log = guard_run("stale").run();
    log.assert_same_as(&plain);
    let t = log.only_trace();
    t.assert_complete(EndReason::Exit);
    log.assert_trace_matches(t, None);
    assert!(
        !log.stderr.contains("STALE") && !log.stderr.contains("FAULT"),
        "{}",
        log.stderr
    );
    assert!(t.stale_values().is_empty() && t.stale_launches().is_empty());
    let s = t.analyzer_summary();
    assert_eq!(s["stale_launch_count"], 0, "{s:#}");
    assert_eq!(s["stale_value_count"], 0, "{s:#}");
}

// -------------------------------------------------------------------------------- recycle

/// STANDIN_VA_BYTES holds 4 guarded 1 MiB allocations' reservations and no more:
/// 12 allocate-and-free rounds, then 5 live allocations. Each allocation that finds the address
/// space full gets it by recycling the oldest retired reservation (a GuardRecycle note naming
/// it, oldest first); the fifth live one finds nothing to recycle and is an ordinary
/// allocation. Every call succeeds, as in a plain run.
#[test]
fn guard_recycles_the_oldest_reservations_when_address_space_runs_short() {
    let per = 2 * measured_gap(64 * KIB) + MIB;
    let cap = 4;
    let run = guard_run("recycle").env("STANDIN_VA_BYTES", (cap * per + per / 2).to_string());
    let plain = run.clone().preload(false).run();
    plain.assert_success();
    let out = guarded(run).run();
    same_but_probes(&out, &plain);
    let t = guard_trace(&out);
    for i in 0..12u64 {
        assert_eq!(
            probe_value(&out, &format!("probe c{i} "), "reserved"),
            (i + 1).min(cap),
            "{}",
            out.stdout
        );
    }
    let p = probes(&out);
    for i in 0..5 {
        let l = &p[&format!("l{i}")];
        let guarded = i < cap as usize;
        assert_eq!(
            (l["range_size"], l["past_end"], l["reserved"]),
            (MIB, !guarded as u64, 0),
            "l{i} guarded {guarded}: {l:?}"
        );
        if guarded {
            assert_eq!(l["before_start"], 0, "l{i}: {l:?}");
        }
        assert_eq!(
            probe_value(&out, &format!("probe l{i} "), "reserved_now"),
            cap
        );
    }
    // 8 recycles in the rounds (the 5th to 12th), one for each of the 4 guarded live ones.
    let recycled = notes(t, NoteKind::GuardRecycle);
    assert_eq!(recycled.len(), 12, "{recycled:#?}");
    let freed: Vec<u64> = t
        .events_by_seq()
        .into_iter()
        .filter(|e| e.api == Api::CudaFree && e.ptr != 0)
        .map(|e| e.ptr)
        .collect();
    for (k, n) in recycled.iter().enumerate() {
        assert_eq!(n.size, per, "{n:?}");
        assert!(
            n.ptr <= freed[k] && freed[k] < n.ptr + n.size,
            "note {k} recycles the reservation of the {k}th freed allocation {:#x}: {n:?}",
            freed[k]
        );
    }
}

// ---------------------------------------------------------------------------------- touch

/// The stand-in's fault, without guard mode: standin_touch on accessible memory is harmless;
/// a queued kernel touching past a mapping faults the context, the kernel queued after it does
/// not run, and from then on synchronisations, launches, allocations, frees and sets return
/// 700 (runtime and driver) while address-range queries and VMM calls work; releasing the
/// primary context resets it. The same with the preload in log mode, which notes the first
/// faulted call it sees once: cuStreamSynchronize, a hook of stream work that records no event
/// (before issue 30 only recorded calls were looked at, and the note named the later
/// cuMemAlloc_v2).
#[test]
fn standin_touch_faults_the_context_as_a_gpu_does() {
    let both = guard_run("touch").run_both();
    let plain = &both.plain;
    plain.assert_success();
    for line in [
        "touch device memory 1",
        "touch nothing 1",
        "readable mapped 1 unmapped 0",
        "touch mapped 1",
        "cuCtxSynchronize 0",
        "cuLaunchKernel 0 (queued, runs 0)",
        "k_touch ok 0",
        "cuStreamSynchronize 700 runs 1",
        "cuStreamSynchronize again 700",
        "cuCtxSynchronize 700",
        "cuLaunchKernel after the fault 700 runs 1",
        "ev cuMemAlloc_v2 700 size=4096 ptr=0",
        "ev cudaMalloc 700 size=4096 ptr=0",
        "cudaMemset 700",
        "cudaDeviceSynchronize 700",
        "ev cuMemFree_v2 700 ptr=@d",
        "cuMemGetAddressRange 0",
        "ev cuMemUnmap 0 ptr=@va size=65536",
        "standin_reserved 0",
        "cuCtxSynchronize after the reset 0",
        "ev cuMemFree_v2 0 ptr=@d",
        "done 0",
    ] {
        has_line(plain, line);
    }
    assert_eq!(plain.stdout.matches("cuCtxSynchronize 0").count(), 2);
    let out = &both.traced;
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(t, None);
    let df = notes(t, NoteKind::DeviceFault);
    assert_eq!(df.len(), 1, "{df:#?}");
    assert_eq!((df[0].value, df[0].size), (700, 0));
    assert_eq!(
        stderr_lines(out, "DEVICE FAULT"),
        ["isolate: DEVICE FAULT: CUDA error 700 (illegal address) returned by cuStreamSynchronize"],
        "{}",
        out.stderr
    );
}

mod common;

use common::*;
use isolate_trace::{Api, Record, Stats, Violation};
use std::path::Path;

/// `isolate export --format chrome-trace TRACE` in `dir` (it must succeed), parsed.
fn chrome_trace(dir: &Path, trace: &str) -> serde_json::Value {
    let o = export(dir, "chrome-trace", &[trace], "out.json");
    assert_eq!(o.code, 0, "{}", o.stderr);
    serde_json::from_str(&std::fs::read_to_string(dir.join("out.json")).unwrap()).unwrap()
}

#[test]
fn chrome_trace_has_lifetimes_counters_and_instants() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 1000); // lane 0
    t.malloc(A + 4096, 2000); // overlaps in time: lane 1
    t.free(A);
    t.malloc(A, 500); // lane 0 again
    t.stream = 0x99;
    t.call(Api::CudaMallocAsync, A + 8192, 64); // its stream's track
    t.stream = 0;
    t.fail(Api::CudaMalloc, 1 << 40, 2);
    t.free_refused(A + 1, 1); // invalid: the driver refused it
    t.record(Record::Violation(Violation {
        seq: 9,
        ts_ns: t.ts,
        ptr: A,
        size: 1000,
        ..Violation::default()
    }));
    t.end(Stats::default());
    t.write(d.path(), "t.trace");
    let v = chrome_trace(d.path(), "t.trace");
    let evs = v["traceEvents"].as_array().unwrap();
    let x: Vec<&serde_json::Value> = evs.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(x.len(), 4);
    // The first allocation lived from 1001 µs to 1003 µs.
    let first = x.iter().find(|e| e["args"]["alloc_seq"] == 0).unwrap();
    assert_eq!(first["ts"].as_f64().unwrap(), 1001.0);
    assert_eq!(first["dur"].as_f64().unwrap(), 2.0);
    assert_eq!(first["args"]["ptr"], "0x7f0000000000");
    // Overlapping lifetimes of one thread are on different lanes; lane 0 is reused.
    let tid = |seq: u64| x.iter().find(|e| e["args"]["alloc_seq"] == seq).unwrap()["tid"].clone();
    assert_ne!(tid(0), tid(1));
    assert_eq!(tid(0), tid(3));
    assert_ne!(
        tid(4),
        tid(0),
        "stream-ordered calls go on the stream's track"
    );
    // Lanes never hold overlapping events.
    let mut by_tid: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
    for e in &x {
        let ts = e["ts"].as_f64().unwrap();
        by_tid
            .entry(e["tid"].to_string())
            .or_default()
            .push((ts, ts + e["dur"].as_f64().unwrap()));
    }
    for v in by_tid.values_mut() {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        for w in v.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlap on one lane: {w:?}");
        }
    }
    let names: Vec<&str> = evs
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"tid 1000")
            && names.contains(&"tid 1000 #1")
            && names.contains(&"stream 0x99"),
        "{names:?}"
    );
    let counters: Vec<u64> = evs
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| e["args"]["device"].as_u64().unwrap())
        .collect();
    assert_eq!(counters, [1000, 3000, 2000, 2500, 2564]);
    let instants: Vec<&str> = evs
        .iter()
        .filter(|e| e["ph"] == "i")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        instants,
        [
            "cudaMalloc failed (2)",
            "cudaFree failed (1)",
            "invalid free 0x7f0000000001",
            "stale write 0x7f0000000000"
        ]
    );
}

/// Copies the binary to a fresh directory, with or without a library beside it.
fn isolated_binary(dir: &Path, with_library: bool) -> std::path::PathBuf {
    let exe = dir.join("isolate");
    std::fs::copy(env!("CARGO_BIN_EXE_isolate"), &exe).unwrap();
    if with_library {
        // Not a real library: the dynamic loader says so and runs the command anyway, which
        // is all these tests need to see how the environment is set.
        std::fs::write(dir.join("libisolate.so"), b"").unwrap();
    }
    exe
}

fn run(exe: &Path, args: &[&str], preload: Option<&str>) -> std::process::Output {
    let mut c = std::process::Command::new(exe);
    c.args(args);
    match preload {
        Some(p) => c.env("LD_PRELOAD", p),
        None => c.env_remove("LD_PRELOAD"),
    };
    // The copy was just written: another test thread's fork may still hold it open for
    // writing for a moment (ETXTBSY). Retry briefly rather than fail on the race.
    for _ in 0..50 {
        match c.output() {
            Err(e) if e.raw_os_error() == Some(libc_etxtbsy()) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return r.unwrap(),
        }
    }
    c.output().unwrap()
}

/// `ETXTBSY` on Linux.
fn libc_etxtbsy() -> i32 {
    26
}

#[test]
fn run_sets_the_environment_and_passes_the_status() {
    let d = tempfile::tempdir().unwrap();
    let exe = isolated_binary(d.path(), true);
    let lib = d.path().join("libisolate.so");
    let o = run(
        &exe,
        &[
            "run",
            "--mode",
            "isolate",
            "--trace",
            "/tmp/t-%p.trace",
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD|$ISOLATE_MODE|$ISOLATE_TRACE\"; exit 7",
        ],
        Some("/usr/lib/other.so"),
    );
    assert_eq!(o.status.code(), Some(7));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.trim(),
        format!(
            "{}:/usr/lib/other.so|isolate|/tmp/t-%p.trace",
            lib.display()
        )
    );
    // Without `--`, and with no LD_PRELOAD before.
    let o = run(
        &exe,
        &["run", "sh", "-c", "echo \"$LD_PRELOAD\"; kill -9 $$"],
        None,
    );
    // isolate ends as the command did: killed by the same signal (a shell reports 128+9).
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&o.status),
        Some(9),
        "killed by SIGKILL"
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        lib.display().to_string()
    );
    let o = run(&exe, &["run", "--", "/no/such/command"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("command not found"));
    let o = run(&exe, &["run", "--mode", "fast", "true"], None);
    assert_eq!(o.status.code(), Some(2), "bad mode is a usage error");
}

#[test]
fn run_without_the_library_says_where_it_looked() {
    let d = tempfile::tempdir().unwrap();
    let exe = isolated_binary(d.path(), false);
    let o = run(&exe, &["run", "true"], None);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("libisolate.so not found") && err.contains(&d.path().display().to_string()),
        "{err}"
    );
}

/// The outputs that render findings as the trace is read (`who`, the chrome-trace and
/// memory-viz exports) get every finding from the model, past the summary's lists' cap (10,000)
/// too; the summary keeps its capped list and counts them all, and the Parquet export, which
/// renders that list, says how many it left out.
#[test]
fn every_finding_past_the_summary_cap_is_rendered() {
    const N: u64 = 10_001;
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    for i in 0..N {
        t.seq += 1;
        t.ts += 1;
        t.record(Record::Violation(Violation {
            seq: t.seq,
            ts_ns: t.ts,
            ptr: A + i * 4096,
            size: 4096,
            changed_bytes: 1,
            ..Violation::default()
        }));
    }
    t.end(Stats::default());
    t.write(d.path(), "t.trace");
    let s = isolate(d.path(), &["summary", "--json", "t.trace"]).json();
    assert_eq!(s["poison_violation_count"], N);
    assert_eq!(s["poison_violations"].as_array().unwrap().len(), 10_000);

    let v = chrome_trace(d.path(), "t.trace");
    let stale: Vec<&serde_json::Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"].as_str().unwrap().starts_with("stale write "))
        .collect();
    assert_eq!(stale.len() as u64, N);
    let last = format!("stale write {:#x}", A + (N - 1) * 4096);
    assert_eq!(stale.last().unwrap()["name"], last.as_str());

    let last_ptr = format!("{:#x}", A + (N - 1) * 4096 + 8);
    let w = isolate(d.path(), &["who", "--json", &last_ptr, "t.trace"]).json();
    let inc = w["traces"][0]["incidents"].as_array().unwrap();
    assert_eq!(inc.len(), 1, "{inc:?}");
    assert_eq!(inc[0]["kind"], "poison_violation");
    assert_eq!(inc[0]["seq"], N);

    // The Parquet export renders the summary's lists, and says how many they left out.
    let o = export(d.path(), "parquet", &["t.trace"], "fleet");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains(", findings 10000, ")
            && o.stderr.contains("; and 1 more finding, past the first 10000 of a kind in a trace, with no row (traces.findings counts them)"),
        "{}",
        o.stderr
    );

    let o = export(d.path(), "memory-viz", &["t.trace"], "out.pickle");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains(
            "not in the snapshot (its format has no place for findings): 10,001 stale writes"
        ),
        "{}",
        o.stderr
    );
}

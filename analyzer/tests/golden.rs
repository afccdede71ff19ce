//! Golden tests over the real traces in `tests/traces/` (recorded on an NVIDIA H200; see
//! `tests/traces/README.md`): the `isolate` binary's JSON outputs must equal the files in
//! `tests/traces/expected/` exactly (compared as JSON values), and so must its text summaries
//! (compared as text: `<name>.summary.txt` for each trace, `all.summary.txt` for all of them). `UPDATE_GOLDEN=1 cargo test -p
//! isolate-analyzer --test golden` rewrites the expected files instead. Either way, the numbers
//! the GPU run printed are asserted on the fresh output first, so the golden files cannot be
//! regenerated wrong without a failure.

use isolate_trace::{FORMAT_VERSION, Reader, Record};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each H200 trace, and the address `isolate who` is asked about (the stale ones only): the
/// violation's or stale launch's pointer; for `stale_log` (which has neither: log mode does not
/// isolate) the 20 MiB caching-allocator segment the freed tensor and its successor lived in.
const TRACES: &[(&str, Option<&str>)] = &[
    ("mlp-log_default", None),
    ("mlp-log_no-caching", None),
    ("mlp-log_cudaMallocAsync", None),
    ("mlp-log_expandable", None),
    ("static_log", None),
    ("stale_log", Some("0x7f91ec800000")),
    ("stale_isolate", Some("0x7fbd70800000")),
    ("stale-triton_isolate", Some("0x7fba78800000")),
    ("stale_guard", Some("0x7f6f78800000")),
    ("record_stream_isolate", None),
    ("oob-4000000_guard", None),
];

fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("analyzer/ has a parent")
        .join("tests/traces")
}

fn trace_path(name: &str) -> PathBuf {
    traces_dir().join("h200").join(format!("{name}.trace"))
}

fn expected_path(name: &str, kind: &str) -> PathBuf {
    traces_dir()
        .join("expected")
        .join(format!("{name}.{kind}.json"))
}

fn updating() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1")
}

/// Runs `isolate ARGS`; it must exit 0 and print JSON. Returns (raw stdout, parsed).
fn isolate(args: &[&str]) -> (String, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_isolate"))
        .args(args)
        .output()
        .expect("run the isolate binary");
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    assert!(
        out.status.success(),
        "isolate {}: {}\nstderr:\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("isolate {}: not JSON ({e}):\n{stdout}", args.join(" ")));
    (stdout, v)
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}... ({} chars)", &s[..200], s.len())
    } else {
        s
    }
}

/// The first place where `got` differs from `want`, as `path: expected X, got Y`.
fn first_difference(path: &str, want: &Value, got: &Value) -> Option<String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let p = format!("{path}.{k}");
                match g.get(k) {
                    None => return Some(format!("{p}: expected {}, missing", short(wv))),
                    Some(gv) => {
                        if let Some(d) = first_difference(&p, wv, gv) {
                            return Some(d);
                        }
                    }
                }
            }
            g.iter()
                .find(|(k, _)| !w.contains_key(*k))
                .map(|(k, gv)| format!("{path}.{k}: not expected, got {}", short(gv)))
        }
        (Value::Array(w), Value::Array(g)) => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                if let Some(d) = first_difference(&format!("{path}[{i}]"), wv, gv) {
                    return Some(d);
                }
            }
            (w.len() != g.len()).then(|| {
                format!(
                    "{path}: expected {} elements, got {} (first extra or missing: {})",
                    w.len(),
                    g.len(),
                    short(if w.len() > g.len() {
                        &w[g.len()]
                    } else {
                        &g[w.len()]
                    })
                )
            })
        }
        _ => (want != got).then(|| format!("{path}: expected {}, got {}", short(want), short(got))),
    }
}

/// Compares `got` with the expected file (or rewrites it under UPDATE_GOLDEN=1).
fn golden(name: &str, kind: &str, raw: &str, got: &Value) {
    let path = expected_path(name, kind);
    if updating() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut text = raw.to_string();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("rewrote {}", path.display());
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (UPDATE_GOLDEN=1 cargo test -p isolate-analyzer --test golden writes it)",
            path.display()
        )
    });
    let want: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    if let Some(d) = first_difference("$", &want, got) {
        panic!(
            "{name} {kind}: the output differs from {}\n  first difference at {d}\n\
             (if the change is intended: UPDATE_GOLDEN=1 cargo test -p isolate-analyzer --test golden, \
             then read the diff)",
            path.display()
        );
    }
}

/// Compares a text output with the expected file (or rewrites it under UPDATE_GOLDEN=1).
fn golden_text(file: &str, got: &str) {
    let path = traces_dir().join("expected").join(file);
    if updating() {
        std::fs::write(&path, got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("rewrote {}", path.display());
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (UPDATE_GOLDEN=1 cargo test -p isolate-analyzer --test golden writes it)",
            path.display()
        )
    });
    if want != got {
        let line = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
        panic!(
            "{file}: the output differs from {}, first at line {}:\n  expected {:?}\n  got      {:?}\n\
             (if the change is intended: UPDATE_GOLDEN=1 cargo test -p isolate-analyzer --test golden, \
             then read the diff)",
            path.display(),
            line + 1,
            want.lines().nth(line).unwrap_or("(end)"),
            got.lines().nth(line).unwrap_or("(end)"),
        );
    }
}

/// `isolate summary ARGS` as text; it must exit 0.
fn summary_text(paths: &[PathBuf]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_isolate"))
        .arg("summary")
        .args(paths)
        .output()
        .expect("run the isolate binary");
    assert!(
        out.status.success(),
        "isolate summary: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn summary(name: &str) -> (String, Value) {
    isolate(&["summary", "--json", trace_path(name).to_str().unwrap()])
}

fn graph(name: &str) -> (String, Value) {
    isolate(&[
        "graph",
        "--format",
        "json",
        trace_path(name).to_str().unwrap(),
    ])
}

fn who(name: &str, addr: &str) -> (String, Value) {
    isolate(&["who", "--json", addr, trace_path(name).to_str().unwrap()])
}

/// `calls[api]` of a summary, 0 when the API was never called.
fn calls(s: &Value, api: &str) -> u64 {
    s["calls"].get(api).map_or(0, |v| v.as_u64().unwrap())
}

fn failed(s: &Value, api: &str) -> u64 {
    s["failed"].get(api).map_or(0, |v| v.as_u64().unwrap())
}

fn assert_calls(name: &str, s: &Value, want: &[(&str, u64)]) {
    for &(api, n) in want {
        assert_eq!(calls(s, api), n, "{name}: {api} calls in {}", s["calls"]);
    }
}

fn header(s: &Value) -> &Value {
    &s["traces"][0]["header"]
}

fn config<'a>(s: &'a Value, key: &str) -> &'a str {
    header(s)["config"][key].as_str().unwrap_or("")
}

fn end_reason(s: &Value) -> &str {
    s["traces"][0]["end_reason"].as_str().unwrap_or("")
}

fn array<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array"))
}

/// What the GPU run printed (docs/gpu-results.md), checked on the fresh output.
fn check_summary(name: &str, s: &Value) {
    assert_eq!(s["complete"], true, "{name}: End record");
    assert_eq!(s["truncated"], Value::Null, "{name}");
    assert_eq!(s["lost"], 0, "{name}");
    assert_eq!(header(s)["format_version"], 1, "{name}");
    // `allocations`, `frees` and `live_at_end` count the same things (device memory: device,
    // managed, physical handles), so with nothing lost what was held at the end is the rest.
    let n = |v: &Value| {
        v.as_u64()
            .unwrap_or_else(|| panic!("{name}: {v} is not a count"))
    };
    assert_eq!(
        n(&s["allocations"]),
        n(&s["frees"]) + n(&s["live_at_end"]["count"]),
        "{name}: allocations = frees + live_at_end.count"
    );
    let held: u64 = ["device", "managed", "handle"]
        .iter()
        .map(|c| n(&s["categories"][c]["live_at_end"]["count"]))
        .sum();
    assert_eq!(
        n(&s["live_at_end"]["count"]),
        held,
        "{name}: live_at_end by category"
    );
    // What is held at exit is told apart, and the shares add up to it.
    let held = &s["held_at_exit"];
    assert_eq!(held["count"], s["live_at_end"]["count"], "{name}");
    assert_eq!(held["bytes"], s["live_at_end"]["bytes"], "{name}");
    let shares = [
        "caching_allocator",
        "library",
        "process_died",
        "possible_leak",
    ];
    for k in ["count", "bytes"] {
        let sum: u64 = shares.iter().map(|c| n(&held[c][k])).sum();
        assert_eq!(sum, n(&held[k]), "{name}: held_at_exit shares of {k}");
    }
    let died = !matches!(end_reason(s), "exit" | "exec");
    let share = |c: &str| n(&held[c]["count"]);
    match name {
        // PyTorch's caching allocator keeps its segments (16 cudaMalloc, or the 17 physical
        // handles of expandable segments); cuBLAS keeps its 6 workspaces: none is a leak.
        "mlp-log_default" => {
            assert_eq!((share("caching_allocator"), share("library")), (16, 6));
            assert_eq!(share("possible_leak"), 0);
        }
        "mlp-log_expandable" => {
            assert_eq!((share("caching_allocator"), share("library")), (17, 6));
            assert_eq!(held["expandable_segments"]["count"], 17);
            assert_eq!(share("possible_leak"), 0);
            // The two reserved ranges: 314.6 GiB of address space, not memory.
            assert_eq!(held["address_space"]["count"], 2);
            assert_eq!(held["address_space"]["bytes"], 337_758_912_512u64);
        }
        "stale_log" => assert_eq!(share("caching_allocator"), 2, "its two segments"),
        "stale_guard" | "oob-4000000_guard" => {
            assert!(died, "{name}");
            assert_eq!(share("process_died"), n(&held["count"]), "{name}");
            let c = &s["traces"][0]["first_faulted_call"];
            assert_eq!((&c["api"], &c["code"]), (&"cudaFree".into(), &700.into()));
        }
        _ => {}
    }
    if died {
        assert_eq!(
            share("possible_leak"),
            0,
            "{name}: a process that died is not judged"
        );
    }
    let violations = array(s, "poison_violations");
    let launches = array(s, "stale_launches");
    let mode = header(s)["mode"].as_str().unwrap();
    if name.ends_with("_log") || name.starts_with("mlp-log_") {
        assert_eq!(mode, "log", "{name}");
        assert!(violations.is_empty() && launches.is_empty(), "{name}");
    }
    match name {
        "mlp-log_default" => {
            assert_calls(
                name,
                s,
                &[
                    ("cudaMalloc", 16),
                    ("cudaFree", 0),
                    ("cudaHostAlloc", 1),
                    ("cuMemAlloc_v2", 6),
                    ("cuMemFree_v2", 2),
                ],
            );
            assert_eq!(s["events"], 25);
        }
        "mlp-log_no-caching" => {
            assert_calls(
                name,
                s,
                &[
                    ("cudaMalloc", 967),
                    ("cudaFree", 964),
                    ("cudaHostAlloc", 1),
                    ("cuMemAlloc_v2", 6),
                    ("cuMemFree_v2", 2),
                ],
            );
            assert_eq!(s["events"], 1940);
        }
        "mlp-log_cudaMallocAsync" => {
            assert_calls(
                name,
                s,
                &[
                    ("cudaMalloc", 0),
                    ("cudaMallocAsync", 967),
                    ("cudaFreeAsync", 964),
                    ("cuMemAllocAsync", 0),
                    ("cudaHostAlloc", 1),
                    ("cuMemAlloc_v2", 6),
                    ("cuMemFree_v2", 2),
                ],
            );
            assert_eq!(s["events"], 1940);
        }
        "mlp-log_expandable" => {
            assert_calls(
                name,
                s,
                &[
                    ("cuMemAddressReserve", 2),
                    ("cuMemCreate", 18),
                    ("cuMemMap", 17),
                    ("cuMemSetAccess", 15),
                    ("cudaMalloc", 0),
                    ("cudaHostAlloc", 1),
                    ("cuMemAlloc_v2", 6),
                    ("cuMemFree_v2", 2),
                ],
            );
            assert_eq!(failed(s, "cuMemCreate"), 1, "PyTorch's fabric-handle probe");
            assert_eq!(s["events"], 61);
            // cuBLAS's 6 cuMemAlloc_v2 and the 17 physical handles of the expandable segments,
            // all still held; the pinned host buffer is under `host`.
            assert_eq!(s["allocations"], 23);
            assert_eq!(s["live_at_end"]["count"], 23);
            assert_eq!(s["categories"]["handle"]["live_at_end"]["count"], 17);
            assert_eq!(s["host"]["live_at_end"]["count"], 1);
        }
        "static_log" => {
            assert_calls(
                name,
                s,
                &[
                    ("cuMemAlloc_v2", 100),
                    ("cuMemFree_v2", 101),
                    ("cuMemAllocAsync", 50),
                    ("cuMemFreeAsync", 50),
                    ("cuMemAllocManaged", 1),
                    ("cuMemHostAlloc", 1),
                    ("cuMemFreeHost", 1),
                ],
            );
            assert!(
                s["calls"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .all(|k| k.starts_with("cu") && !k.starts_with("cuda")),
                "a static runtime is seen at the driver only: {}",
                s["calls"]
            );
            assert_eq!(s["live_at_end"]["count"], 0);
        }
        "stale_log" => {
            assert_calls(name, s, &[("cudaMalloc", 2), ("cudaFree", 0)]);
        }
        "stale_isolate" | "stale-triton_isolate" => {
            assert_eq!(mode, "isolate");
            assert_eq!(config(s, "ISOLATE_GUARD"), "off");
            assert_eq!(config(s, "ISOLATE_CHECK_LAUNCH"), "on");
            assert_eq!(end_reason(s), "exit");
            assert_eq!(s["poison_violation_count"], 1, "{name}");
            assert_eq!(violations.len(), 1, "{name}: {violations:?}");
            let v = &violations[0];
            assert_eq!(v["first_offset"], 4096, "{name}");
            assert_eq!(v["changed_bytes"], 4096, "{name}");
            assert_eq!(v["size"], 4 << 20, "{name}");
            assert_eq!(v["free_api"], "cudaFree", "{name}");
            assert_eq!((&v["alloc_seq"], &v["free_seq"]), (&0.into(), &1.into()));
            let (kernel, api) = if name == "stale_isolate" {
                ("stale_fill", "cuLaunchKernel")
            } else {
                ("stale_fill_triton", "cuLaunchKernelEx")
            };
            assert_eq!(s["stale_launch_count"], 1, "{name}");
            assert_eq!(launches.len(), 1, "{name}: {launches:?}");
            let l = &launches[0];
            assert_eq!(l["kernel"], kernel, "{name}");
            assert_eq!(l["api"], api, "{name}");
            assert_eq!(
                (&l["param_index"], &l["param_offset"]),
                (&0.into(), &0.into())
            );
            assert_eq!(
                l["ptr"], v["ptr"],
                "{name}: the launch names the freed allocation"
            );
            assert_eq!(l["alloc_ptr"], v["ptr"]);
            assert_eq!(l["freed_at"]["seq"], 1);
            assert_eq!(s["quarantine"]["releases"], 0);
        }
        "stale_guard" => {
            assert_eq!(mode, "isolate");
            assert_eq!(config(s, "ISOLATE_GUARD"), "on");
            assert_eq!(
                end_reason(s),
                "signal 6",
                "the run died of the illegal address (SIGABRT)"
            );
            assert_eq!(s["traces"][0]["signal"], 6);
            assert!(
                violations.is_empty(),
                "guard memory is unmapped, not poisoned"
            );
            assert_eq!(launches.len(), 1, "{launches:?}");
            assert_eq!(launches[0]["kernel"], "stale_fill");
            assert_eq!(launches[0]["ptr"], "0x7f6f78800000");
            assert_eq!(failed(s, "cudaFree"), 1);
            let last = array(s, "last_events").last().unwrap();
            assert_eq!(
                (&last["api"], &last["result"]),
                (&"cudaFree".into(), &700.into()),
                "the sticky illegal address"
            );
        }
        "record_stream_isolate" => {
            assert_eq!(mode, "isolate");
            assert_eq!(end_reason(s), "exit");
            assert!(
                violations.is_empty() && launches.is_empty(),
                "isolation prevents this race but does not name it"
            );
            assert_calls(name, s, &[("cudaMalloc", 19), ("cudaFree", 19)]);
        }
        "oob-4000000_guard" => {
            assert_eq!(config(s, "ISOLATE_GUARD"), "on");
            assert_eq!(end_reason(s), "signal 6");
            assert!(violations.is_empty() && launches.is_empty());
            let first = &array(s, "last_events")[0];
            assert_eq!(
                (&first["api"], &first["size"]),
                (&"cudaMalloc".into(), &4_000_000.into())
            );
            assert_eq!(failed(s, "cudaFree"), 1);
        }
        other => panic!("no assertions for {other}"),
    }
}

fn check_graph(name: &str, g: &Value) {
    let kinds: Vec<&str> = array(g, "anomalies")
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    let count = |k: &str| kinds.iter().filter(|x| **x == k).count();
    let (violations, launches) = match name {
        "stale_isolate" | "stale-triton_isolate" => (1, 1),
        "stale_guard" => (0, 1),
        _ => (0, 0),
    };
    assert_eq!(count("poison_violation"), violations, "{name}: {kinds:?}");
    assert_eq!(count("stale_launch"), launches, "{name}: {kinds:?}");
    assert_eq!(array(g, "traces").len(), 1);
    assert_eq!(g["traces"][0]["complete"], true);
}

fn check_who(name: &str, addr: &str, w: &Value, s: &Value) {
    assert_eq!(w["address"], addr);
    let t = &w["traces"][0];
    let history = array(t, "history");
    assert_eq!(history.len(), 1, "{name}: {history:?}");
    let h = &history[0];
    assert_eq!(h["api"], "cudaMalloc");
    assert_eq!(h["alloc_seq"], 0);
    let incidents: Vec<&str> = array(t, "incidents")
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    if name == "stale_log" {
        assert_eq!(h["ptr"], array(s, "last_events")[0]["ptr"]);
        assert_eq!(h["size"], 20 << 20, "a caching-allocator segment");
        assert_eq!(h["free_seq"], Value::Null, "never freed: cached");
        assert!(incidents.is_empty(), "{incidents:?}");
        return;
    }
    assert_eq!(h["size"], 4 << 20);
    assert_eq!(
        (&h["free_seq"], &h["free_api"]),
        (&1.into(), &"cudaFree".into())
    );
    assert_eq!(
        s["stale_launches"][0]["ptr"], addr,
        "who asks the launch's address"
    );
    let want: &[&str] = if name == "stale_guard" {
        &["stale_launch"]
    } else {
        assert_eq!(s["poison_violations"][0]["ptr"], addr);
        &["stale_launch", "poison_violation"]
    };
    assert_eq!(incidents, want, "{name}");
}

#[test]
fn golden_outputs_of_the_h200_traces() {
    for &(name, who_addr) in TRACES {
        let (raw, s) = summary(name);
        check_summary(name, &s);
        golden(name, "summary", &raw, &s);
        let text = summary_text(&[trace_path(name)]);
        golden_text(&format!("{name}.summary.txt"), &text);
        let (raw, g) = graph(name);
        check_graph(name, &g);
        golden(name, "graph", &raw, &g);
        if let Some(addr) = who_addr {
            let (raw, w) = who(name, addr);
            check_who(name, addr, &w, &s);
            golden(name, "who", &raw, &w);
        }
    }
}

/// All the traces in one summary: the overview names each process and each finding's, and the
/// peak of them all is said to be a sum.
#[test]
fn golden_summary_of_all_the_traces() {
    let paths: Vec<PathBuf> = TRACES.iter().map(|(n, _)| trace_path(n)).collect();
    let text = summary_text(&paths);
    assert!(
        text.starts_with(&format!("== {} traces ==\n", TRACES.len())),
        "{text}"
    );
    assert!(
        text.contains("the sum of per-process peaks (not simultaneous)"),
        "{text}"
    );
    assert!(
        text.contains("  pid 1213 (stale_isolate.trace): STALE WRITE: 4,096 bytes changed from offset 4,096 of a 4.0 MiB allocation"),
        "{text}"
    );
    assert!(
        !text.contains("LEAK?") && !text.contains("POISON"),
        "{text}"
    );
    golden_text("all.summary.txt", &text);
}

/// Every trace in tests/traces/h200 has its golden files, and every golden file its trace.
#[test]
fn golden_files_match_the_trace_list() {
    let mut traces: Vec<String> = std::fs::read_dir(traces_dir().join("h200"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".trace")
                .map(str::to_string)
        })
        .collect();
    traces.sort();
    let mut listed: Vec<String> = TRACES.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(traces, listed, "tests/traces/h200 and this test's list");
    if updating() {
        return;
    }
    let mut want: Vec<String> = Vec::new();
    for &(name, who_addr) in TRACES {
        want.push(format!("{name}.summary.json"));
        want.push(format!("{name}.summary.txt"));
        want.push(format!("{name}.graph.json"));
        if who_addr.is_some() {
            want.push(format!("{name}.who.json"));
        }
    }
    want.push("all.summary.txt".into());
    want.sort();
    let mut have: Vec<String> = std::fs::read_dir(traces_dir().join("expected"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    have.sort();
    assert_eq!(have, want, "tests/traces/expected");
}

fn all_traces(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            all_traces(&p, out);
        } else if p.extension().is_some_and(|x| x == "trace") {
            out.push(p);
        }
    }
}

/// Every trace kept in the repository stays readable by this version of the reader: the kept
/// traces are format versions 1, 3 and 4, read by a reader of version 4 (call stacks; then the
/// stacks of stale writes and launches; then the unordered free's record) to their End record
/// without an error.
#[test]
fn every_kept_trace_is_readable() {
    let mut paths = Vec::new();
    all_traces(&traces_dir(), &mut paths);
    paths.sort();
    assert!(paths.len() >= TRACES.len(), "{paths:?}");
    assert_eq!(
        FORMAT_VERSION, 4,
        "a new version: keep versions 1 and 3 readable"
    );
    for p in &paths {
        let mut r = Reader::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        // tests/traces/h200-v4 holds the traces of the current format, h200-v3 those of the
        // one before; every other one is 1.
        let want = if p.parent().is_some_and(|d| d.ends_with("h200-v4")) {
            4
        } else if p.parent().is_some_and(|d| d.ends_with("h200-v3")) {
            3
        } else {
            1
        };
        assert_eq!(r.version(), want, "{}", p.display());
        let mut records = 0usize;
        let mut last = None;
        while let Some(rec) = r
            .next_record()
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        {
            records += 1;
            last = Some(rec);
        }
        assert_eq!(r.truncated_at(), None, "{}", p.display());
        assert!(
            matches!(last, Some(Record::End(_))),
            "{}: ends with its End record ({records} records, last {last:?})",
            p.display()
        );
    }
}

/// The golden traces of formats 3 (call stacks, and the stacks of stale writes and launches in
/// their own records; ninth session) and 4 (the current one: the unordered free's record; the
/// eleventh session), recorded on the H200 by `tests/gpu/golden_record.sh` with the library of
/// their session: each one's summary as JSON and as text must equal
/// `tests/traces/expected-v<N>/` (or is rewritten there under UPDATE_GOLDEN=1), after the facts
/// the GPU run showed are asserted on the fresh output. The same programs, so the same facts.
const TRACES_H200_GOLDEN: &[&str] = &[
    "stale_isolate",
    "stale_guard",
    "probe_isolate",
    "end-term_isolate",
    "mlp-log_no-caching",
];

#[test]
fn golden_outputs_of_the_h200_format_3_traces() {
    golden_outputs_of_format(3);
}

#[test]
fn golden_outputs_of_the_h200_format_4_traces() {
    golden_outputs_of_format(4);
}

fn golden_outputs_of_format(version: u64) {
    for &name in TRACES_H200_GOLDEN {
        let path = traces_dir()
            .join(format!("h200-v{version}"))
            .join(format!("{name}.trace"));
        let (raw, s) = isolate(&["summary", "--json", path.to_str().unwrap()]);
        assert_eq!(header(&s)["format_version"], version, "{name}");
        assert_eq!(s["complete"], true, "{name}: End record");
        assert_eq!(s["lost"], 0, "{name}");
        let count = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{name}: {k}"));
        let place = |v: &Value, k: &str| v[k]["place"].as_str().unwrap_or("").to_string();
        match name {
            // The planted stale write (bug_stale_write.py): found with the Python lines of the
            // tensor's allocation (x = torch.zeros, line 39) and its free (del x, line 43),
            // carried by the Violation record itself (format 3), and the stale launch of CuPy's
            // kernel handed exactly x's address.
            "stale_isolate" => {
                assert_eq!(end_reason(&s), "exit", "{name}");
                assert_eq!(
                    (count("poison_violation_count"), count("stale_launch_count")),
                    (1, 1)
                );
                let v = &array(&s, "poison_violations")[0];
                assert_eq!(
                    (v["first_offset"].as_u64(), v["changed_bytes"].as_u64()),
                    (Some(4096), Some(4096))
                );
                assert!(
                    place(v, "alloc_stack").ends_with("bug_stale_write.py:39 in main"),
                    "{v:#}"
                );
                assert!(
                    place(v, "free_stack").ends_with("bug_stale_write.py:43 in main"),
                    "{v:#}"
                );
                let l = &array(&s, "stale_launches")[0];
                assert_eq!(l["kernel"], "stale_fill", "{l:#}");
                assert_eq!(l["ptr"], l["alloc_ptr"], "{l:#}");
            }
            // Guard mode: the kernel faulted on the unmapped freed range; the stale launch and
            // the device fault are both findings, the process died of the abort after it.
            "stale_guard" => {
                assert_eq!(end_reason(&s), "signal 6", "{name}");
                assert_eq!(count("stale_launch_count"), 1);
                assert_eq!(count("device_fault_count"), 1);
                let l = &array(&s, "stale_launches")[0];
                assert!(
                    place(l, "launch_stack").ends_with("workload.py:121 in cupy_fill"),
                    "{l:#}"
                );
            }
            // host_round2 probe (nvcc, static runtime): the failed 1 TiB probe left the
            // quarantine alone, so the stale write through p + 1024 words was found; the
            // kernel's pointer is inside the allocation, not at its start: a suspect only.
            "probe_isolate" => {
                assert_eq!(
                    (count("poison_violation_count"), count("stale_launch_count")),
                    (1, 0)
                );
                assert_eq!(count("stale_value_count"), 1);
                let v = &array(&s, "poison_violations")[0];
                assert_eq!(v["first_offset"].as_u64(), Some(4096), "{v:#}");
                assert!(
                    v["alloc_stack"]["frames"]
                        .as_array()
                        .is_some_and(|f| !f.is_empty())
                );
            }
            // host_round2 end-term: the stale write found by the check before SIGTERM's
            // default action, the trace ended by the signal.
            "end-term_isolate" => {
                assert_eq!(end_reason(&s), "signal 15", "{name}");
                assert_eq!(count("poison_violation_count"), 1);
            }
            // Log mode, caching off: no finding, the model's memory held at exit is information.
            "mlp-log_no-caching" => {
                assert_eq!(count("findings"), 0, "{name}");
                assert_eq!(count("leak_count"), 0, "{name}");
            }
            _ => unreachable!("{name}"),
        }
        let expected = format!("../expected-v{version}/{name}");
        golden(&expected, "summary", &raw, &s);
        let text = summary_text(&[path]);
        golden_text(&format!("{expected}.summary.txt"), &text);
    }
}

//! Every output that reports a finding names the code (`finding::place`): the allocation's,
//! the free's and the launch's file:line, from the stacks of a format-2 trace. One trace with
//! Python stacks (bug.py) and, in isolate mode, a stale write (to an allocation made on line 3
//! and freed on line 5), a stale launch into it (line 9) and a double free (allocated on line 3,
//! freed on lines 5 and 7); each output is checked for those lines: the summary, the report,
//! `graph` text and DOT, `check --no-violations`, `who` and the chrome-trace export.

mod common;

use common::{A, TraceBuilder, header, isolate};
use isolate_trace::{Api, Frame, PyCode, Record, Stack, StackOf, StaleLaunch, Violation};

const B: u64 = A + 0x10_0000;

fn trace(dir: &std::path::Path) -> std::path::PathBuf {
    let mut h = header(100, &["python3", "bug.py"]);
    h.exe = "/usr/bin/python3.12".into();
    h.mode = "isolate".into();
    let mut t = TraceBuilder::with_header(h);
    t.record(Record::PyCode(PyCode {
        id: 1,
        file: "bug.py".into(),
        name: "main".into(),
        first_line: 1,
    }));
    for (id, line) in [(1, 3), (2, 5), (3, 7), (4, 9)] {
        t.record(Record::Stack(Stack {
            id,
            frames: vec![Frame::Native(0x40_1000), Frame::Python { code: 1, line }],
            truncated: false,
        }));
    }
    // A stale write and a stale launch into A; a double free of B.
    let a = t.call_from(Api::CudaMalloc, A, 4096, 1);
    let fa = t.call_from(Api::CudaFree, A, 0, 2);
    let seq = t.seq;
    t.record(Record::StaleLaunch(StaleLaunch {
        seq,
        ts_ns: t.ts,
        tid: 1000,
        device: 0,
        api: Api::CuLaunchKernel,
        kernel: "fill".into(),
        param_index: 0,
        param_offset: 0,
        ptr: A,
        alloc_seq: a,
        alloc_ptr: A,
        alloc_size: 4096,
        free_seq: fa,
        free_ts_ns: t.ts,
        alloc_stack: 1,
        free_stack: 2,
    }));
    // The launch's stack right after its record, as the library writes them (launch.rs
    // `Hit::submit`).
    t.record(Record::StackOf(StackOf { seq, stack: 4 }));
    t.call(Api::CuLaunchKernel, 0, 0);
    t.record(Record::Violation(Violation {
        seq: t.seq,
        ts_ns: t.ts,
        device: 0,
        ptr: A,
        size: 4096,
        first_offset: 0,
        changed_bytes: 4,
        alloc_seq: a,
        free_seq: fa,
        free_ts_ns: t.ts,
        free_api: Api::CudaFree,
        alloc_stack: 1,
        free_stack: 2,
    }));
    t.call_from(Api::CudaMalloc, B, 8192, 1);
    t.call_from(Api::CudaFree, B, 0, 2);
    t.event(isolate_trace::Event {
        api: Api::CudaFree,
        ptr: B,
        result: 1,
        stack: 3,
        ..isolate_trace::Event::default()
    });
    t.end(Default::default());
    t.write(dir, "bug.trace")
}

const ALLOC: &str = "allocated at bug.py:3 in main";
const FREE: &str = "freed at bug.py:5 in main";

#[test]
fn the_summary_and_the_report_name_the_code() {
    let d = tempfile::tempdir().unwrap();
    let p = trace(d.path());
    let s = isolate(d.path(), &["summary", p.to_str().unwrap()]).stdout;
    for want in [
        "STALE WRITE",
        "STALE LAUNCH",
        "DOUBLE FREE",
        "bug.py:9 in main",
    ] {
        assert!(s.contains(want), "no {want:?} in:\n{s}");
    }
    let j = isolate(d.path(), &["summary", "--json", p.to_str().unwrap()]).json();
    assert_eq!(
        j["poison_violations"][0]["alloc_stack"]["place"],
        "bug.py:3 in main"
    );
    assert_eq!(
        j["stale_launches"][0]["launch_stack"]["place"],
        "bug.py:9 in main"
    );

    let html = isolate_analyzer::report::render(&[&p], &mut isolate_analyzer::NoProgress)
        .unwrap()
        .html;
    // Each finding box names its calls' code first, one line each (the page shows them under
    // the title).
    let start = html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    let v: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    let places: Vec<Vec<String>> = v["traces"][0]["verdict"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| serde_json::from_value(f["places"].clone()).unwrap())
        .collect();
    for want in [
        vec![
            ALLOC.to_string(),
            FREE.into(),
            "launched at bug.py:9 in main".into(),
        ],
        vec![
            "freed again at bug.py:7 in main".to_string(),
            "first freed at bug.py:5 in main".into(),
            ALLOC.into(),
        ],
    ] {
        assert!(
            places.contains(&want),
            "the report has no {want:?} in {places:?}"
        );
    }
}

#[test]
fn graph_text_and_dot_name_the_code_of_the_nodes_findings_name() {
    let d = tempfile::tempdir().unwrap();
    let p = trace(d.path());
    let text = isolate(d.path(), &["graph", p.to_str().unwrap()]).stdout;
    assert!(text.contains(&format!("{ALLOC}; {FREE}")), "{text}");
    let dot = isolate(d.path(), &["graph", "--format", "dot", p.to_str().unwrap()]).stdout;
    assert!(dot.contains(&format!("\\n{ALLOC}\\n{FREE}")), "{dot}");
}

#[test]
fn check_and_who_name_the_code() {
    let d = tempfile::tempdir().unwrap();
    let p = trace(d.path());
    let p = p.to_str().unwrap();
    let o = isolate(d.path(), &["check", p, "--baseline", p, "--no-violations"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    for want in [
        format!("  stale write: {ALLOC}; {FREE}\n"),
        format!("  stale launch: launched at bug.py:9 in main; {ALLOC}; {FREE}\n"),
        format!(
            "  double free: freed again at bug.py:7 in main; first freed at bug.py:5 in main; \
             {ALLOC}\n"
        ),
    ] {
        assert!(o.stdout.contains(&want), "no {want:?} in:\n{}", o.stdout);
    }
    let w = isolate(d.path(), &["who", &format!("{B:#x}"), p]).stdout;
    for want in ["bug.py:3 in main", "bug.py:7 in main"] {
        assert!(w.contains(want), "no {want:?} in:\n{w}");
    }
}

#[test]
fn exported_events_name_the_code() {
    let d = tempfile::tempdir().unwrap();
    let p = trace(d.path());
    let out = d.path().join("t.json");
    let o = isolate(
        d.path(),
        &[
            "export",
            "--format",
            "chrome-trace",
            p.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let ev = |prefix: &str| {
        j["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .unwrap_or_else(|| panic!("no {prefix} event"))
            .clone()
    };
    let w = ev("stale write");
    assert_eq!(w["args"]["allocated_at"], "bug.py:3 in main", "{w}");
    assert_eq!(w["args"]["freed_at"], "bug.py:5 in main", "{w}");
    let l = ev("stale launch");
    assert_eq!(l["args"]["launched_at"], "bug.py:9 in main", "{l}");
    let f = ev("invalid free");
    assert_eq!(f["args"]["freed_at"], "bug.py:7 in main", "{f}");
    assert_eq!(f["args"]["first_freed_at"], "bug.py:5 in main", "{f}");
    assert_eq!(f["args"]["allocated_at"], "bug.py:3 in main", "{f}");
}

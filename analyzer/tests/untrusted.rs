//! A kernel name is text from the traced program (any C++ name the compiler made, or anything a
//! JIT chose): one of `</script><script>alert(1)</script>`, with a `"` and markup in the exe and
//! argv, through every output that shows it: the HTML report, the DOT graph, the Chrome trace
//! (valid JSON that gives the name back unchanged) and the terminal summary (no escape sequence
//! reaches the terminal). `report.rs` and `graph.rs` hold other hostile names against the
//! report and DOT; this file holds the one name against all of them.

mod common;

use common::*;
use isolate_trace::{Api, Record, StaleLaunch, Stats};

const KERNEL: &str = "</script><script>alert(1)</script>";
const EXE: &str = "/tmp/a\"b<i>.py";

fn trace(dir: &std::path::Path) {
    let mut h = header(4242, &["python3", "x\"y", "<script>alert(2)</script>"]);
    h.exe = EXE.into();
    let mut t = TraceBuilder::with_header(h);
    t.malloc(A, MIB);
    t.free(A);
    for (i, kernel) in [
        KERNEL.to_string(),
        format!("void k<\"{KERNEL}\">(float*)\u{1b}]0;owned\u{7}\u{2028}"),
    ]
    .into_iter()
    .enumerate()
    {
        t.record(Record::StaleLaunch(StaleLaunch {
            seq: t.seq + i as u64,
            ts_ns: t.ts + 10 + i as u64,
            tid: 1000,
            api: Api::CuLaunchKernel,
            kernel,
            ptr: A + 64,
            alloc_ptr: A,
            alloc_size: MIB,
            alloc_seq: 0,
            free_seq: 1,
            ..StaleLaunch::default()
        }));
    }
    t.end(Stats::default());
    t.write(dir, "hostile.trace");
}

#[test]
fn report_keeps_the_kernel_name_inert() {
    let d = tempfile::tempdir().unwrap();
    trace(d.path());
    let o = isolate(d.path(), &["report", "hostile.trace", "-o", "r.html"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let html = std::fs::read_to_string(d.path().join("r.html")).unwrap();
    // Only the page's own two script elements open and close.
    assert_eq!(html.matches("</script>").count(), 2, "a </script> leaked");
    assert_eq!(html.matches("<script").count(), 2, "a <script> leaked");
    assert!(!html.contains("<i>"), "markup from the exe leaked");
    assert!(!html.contains('\u{2028}') && !html.contains('\u{1b}'));
    // The embedded data gives the exact name back.
    let start = html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    let data = &html[start..end];
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    let text = v.to_string();
    assert!(
        text.contains(&serde_json::to_string(KERNEL).unwrap()),
        "the kernel name is not in the data"
    );
    assert!(text.contains(&serde_json::to_string(EXE).unwrap()));
}

#[test]
fn dot_keeps_the_kernel_name_inert() {
    let d = tempfile::tempdir().unwrap();
    trace(d.path());
    let o = isolate(d.path(), &["graph", "--format", "dot", "hostile.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let dot = &o.stdout;
    assert!(
        !dot.contains("<script>") && !dot.contains("</script>"),
        "{dot}"
    );
    assert!(!dot.contains("<i>"), "{dot}");
    assert!(
        !dot.contains('\u{1b}'),
        "an escape sequence in the DOT file"
    );
    assert!(
        dot.contains("&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{dot}"
    );
    assert_quotes_close_on_their_lines(dot);
}

#[test]
fn chrome_trace_is_valid_json_with_the_name_unchanged() {
    let d = tempfile::tempdir().unwrap();
    trace(d.path());
    let o = isolate(
        d.path(),
        &[
            "export",
            "--format",
            "chrome-trace",
            "hostile.trace",
            "-o",
            "t.json",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = std::fs::read_to_string(d.path().join("t.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let evs = v["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = evs.iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(
        names.contains(&format!("stale launch {KERNEL}").as_str()),
        "{names:?}"
    );
    let process: Vec<&str> = evs
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert_eq!(process, [format!("{EXE} (pid 4242)")]);
}

#[test]
fn terminal_summary_escapes_control_characters() {
    let d = tempfile::tempdir().unwrap();
    trace(d.path());
    let o = isolate(d.path(), &["summary", "hostile.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        !o.stdout.contains('\u{1b}') && !o.stdout.contains('\u{7}'),
        "a control character reached the terminal: {:?}",
        o.stdout
    );
    assert!(
        o.stdout.contains("alert(1)"),
        "the name is shown: {}",
        o.stdout
    );
    let j = isolate(d.path(), &["summary", "--json", "hostile.trace"]).json();
    assert!(
        j.to_string()
            .contains(&serde_json::to_string(KERNEL).unwrap())
    );
}

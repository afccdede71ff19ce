mod common;

use common::*;
use isolate_analyzer::{NoProgress, report};
use isolate_trace::{Api, Record, StaleLaunch, Stats, Violation};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const HOSTILE: &str = "</script><script>document.body.dataset.pwned='1'</script>";

/// A trace whose every text field tries to break out of the page.
fn hostile_trace() -> TraceBuilder {
    let mut h = header(
        31337,
        &[
            "python3",
            HOSTILE,
            "<img src=x onerror=\"document.body.dataset.pwned='2'\">",
            "line\u{2028}sep\u{2029}end & \"quotes\" 'too'",
        ],
    );
    h.exe = format!("/tmp/{HOSTILE}");
    h.hostname = "<b>host</b>".into();
    let mut t = TraceBuilder::with_header(h);
    for i in 0..300u64 {
        let p = A + (i % 7) * MIB;
        t.malloc(p, MIB / 2 + i);
        if i % 3 != 0 {
            t.free(p);
        }
    }
    t.fail(Api::CudaMalloc, 1 << 40, 2);
    t.free(A + 123);
    t.record(Record::Violation(Violation {
        seq: t.seq,
        ts_ns: t.ts,
        ptr: A,
        size: MIB,
        changed_bytes: 8,
        free_api: Api::CudaFree,
        ..Violation::default()
    }));
    t.record(Record::StaleLaunch(StaleLaunch {
        seq: t.seq,
        ts_ns: t.ts,
        kernel: format!("void k<{HOSTILE}>(float*)"),
        ptr: A,
        alloc_ptr: A,
        alloc_size: MIB,
        ..StaleLaunch::default()
    }));
    t.end(Stats::default());
    t
}

#[test]
fn html_escapes_everything_from_the_trace() {
    let d = tempfile::tempdir().unwrap();
    let p = hostile_trace().write(d.path(), "h.trace");
    let r = report::render(&[&p], &mut NoProgress).unwrap();
    let html = r.html;
    // Only our own two script elements close.
    assert_eq!(
        html.matches("</script>").count(),
        2,
        "a </script> leaked into the page"
    );
    assert!(!html.contains("<img src=x"));
    assert!(!html.contains("<b>host"));
    assert!(!html.contains('\u{2028}') && !html.contains('\u{2029}'));
    assert!(html.contains("\\u003c/script\\u003e"));
    // The title is HTML-escaped.
    assert!(html.contains("<title>isolate report: h.trace (pid 31337)</title>"));
    // No network: nothing is fetched from anywhere.
    for needle in ["http://", "https://", "src=\"//", "<link"] {
        assert!(!html.contains(needle), "{needle} in the page");
    }
    // The embedded JSON reads back as the original text.
    let start = html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    let v: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    assert_eq!(v["traces"][0]["summary"]["header"]["argv"][1], HOSTILE);
    assert_eq!(
        v["traces"][0]["summary"]["header"]["argv"][3],
        "line\u{2028}sep\u{2029}end & \"quotes\" 'too'"
    );
}

#[test]
fn big_traces_make_small_pages() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    for i in 0..150_000u64 {
        let p = A + (i % 512) * 4 * MIB;
        t.malloc(p, MIB + (i % 64) * 4096);
        t.free(p);
    }
    let p = t.write(d.path(), "big.trace");
    let r = report::render(&[&p], &mut NoProgress).unwrap();
    assert!(r.html.len() < 2 << 20, "{} bytes", r.html.len());
    let start = r.html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + r.html[start..].find("</script>").unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.html[start..end]).unwrap();
    let points = v["traces"][0]["timeline"]["at"].as_array().unwrap().len();
    assert!(points <= report::POINTS && points > 100, "{points} buckets");
    assert_eq!(
        v["traces"][0]["chains"].as_array().unwrap().len(),
        report::CHAINS
    );
}

fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in [
            "chromium",
            "chromium-browser",
            "google-chrome",
            "google-chrome-stable",
        ] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Runs headless Chromium on `page` and returns the DOM after the scripts ran.
fn dump_dom(chromium: &Path, page: &Path, profile: &Path) -> String {
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t0.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

#[test]
fn renders_in_headless_chromium() {
    let Some(chromium) = find_chromium() else {
        skip(
            "chromium is not installed (apt-get install -y chromium): the report is not rendered in a browser",
        );
        return;
    };
    let d = tempfile::tempdir().unwrap();
    hostile_trace().write(d.path(), "h.trace");
    let o = isolate(d.path(), &["report", "h.trace", "-o", "report.html"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let page = d.path().join("report.html");
    let dom = dump_dom(&chromium, &page, &d.path().join("profile"));
    assert!(dom.contains("<body"), "no DOM came back: {dom}");
    assert!(
        !dom.contains("data-error"),
        "the page reported an error: {}",
        &dom[..dom.len().min(3000)]
    );
    assert!(
        dom.contains("data-rendered=\"1\""),
        "the page did not finish drawing"
    );
    assert!(
        !dom.contains("data-pwned"),
        "text from the trace ran as script"
    );
    // Hostile text shows up as text.
    assert!(
        dom.contains("&lt;/script&gt;&lt;script&gt;document.body.dataset.pwned"),
        "argv not shown as text"
    );
    // The stale write and the launch into the same freed allocation are one finding.
    assert!(dom.contains("Stale write: memory was written after it was freed"));
    assert!(dom.contains("Kernel void k&lt;&lt;/script&gt;"));
    assert!(dom.contains("<canvas"));
}

/// The page's data of the report of `p`.
fn page_data(p: &Path) -> serde_json::Value {
    let html = report::render(&[p], &mut NoProgress).unwrap().html;
    let start = html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).unwrap()
}

#[test]
fn steps_found_from_the_call_stacks_are_drawn_when_the_trace_has_no_regions() {
    let d = tempfile::tempdir().unwrap();
    let v = page_data(&loop_trace(false).write(d.path(), "loop.trace"));
    let tr = &v["traces"][0];
    let regions = tr["timeline"]["regions"].as_array().unwrap();
    assert_eq!(regions.len() as u64, LOOP_STEPS, "{regions:?}");
    assert_eq!(
        tr["steps"]["what"],
        "iterations of the loop at train.py:10 in <module>"
    );
    assert_eq!(tr["steps"]["count"], LOOP_STEPS);
    // The 20 weights came first, 250 ms apart: the first step starts at the first activation,
    // 5 s in, and each step is 60 activations (3 ms), 60 frees (1.2 ms) and the loss.
    let ms = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap() as f64 / 1e6;
    assert!(
        (ms(&regions[0], "from_ns") - 5000.0).abs() < 0.1,
        "{regions:?}"
    );
    for (k, r) in regions.iter().enumerate() {
        assert_eq!(r["label"], format!("step {}", k + 1));
        assert_eq!(r["depth"], 1);
        let len = ms(r, "to_ns") - ms(r, "from_ns");
        assert!(
            k + 1 == regions.len() || (4.0..4.6).contains(&len),
            "step {k}: {len} ms"
        );
        // 60 activations of 1 MiB live at once, the weights below them.
        assert_eq!(r["peak_live_bytes"], (160 + 60) * MIB, "{r}");
    }
    // The first view leaves the start-up out: it starts within the last 2% before step 1.
    let fv = &tr["timeline"]["first_view"];
    assert!(
        ms(fv, "from_ns") > 4900.0 && ms(fv, "from_ns") <= 5000.0,
        "{fv}"
    );
    assert!(
        fv["text"]
            .as_str()
            .unwrap()
            .starts_with("Left out of view: the first 5.00 s (start-up: 20 allocations"),
        "{fv}"
    );

    // A trace with regions (NVTX ranges) has those drawn, and no steps of its own.
    let v = page_data(&loop_trace(true).write(d.path(), "regions.trace"));
    let tr = &v["traces"][0];
    let regions = tr["timeline"]["regions"].as_array().unwrap();
    assert_eq!(regions.len() as u64, LOOP_STEPS);
    assert!(
        regions.iter().all(|r| r["label"] == "train_step"),
        "{regions:?}"
    );
    assert!(tr["steps"].is_null());
}

#[test]
fn the_site_view_ranks_sites_and_merges_their_python_frames() {
    let d = tempfile::tempdir().unwrap();
    let v = page_data(&loop_trace(false).write(d.path(), "loop.trace"));
    let s = &v["traces"][0]["sites"];
    assert_eq!(
        (&s["site_count"], &s["place_count"]),
        (&3.into(), &3.into())
    );
    assert_eq!(s["allocations"], 20 + 61 * LOOP_STEPS);
    let rows: Vec<(String, u64, u64)> = s["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["place"].as_str().unwrap().to_owned(),
                r["bytes"].as_u64().unwrap(),
                r["allocations"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("model.py:30 in forward".into(), 600 * MIB, 600),
            ("load.py:8 in copy_weights".into(), 160 * MIB, 20),
            ("train.py:11 in <module>".into(), 40960, 10),
        ]
    );
    // The tree: the root, then <module>'s lines (largest first), then what they called.
    let t = &s["tree"];
    let names: Vec<&str> = t["name"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "all device memory",
            "train.py:10 in <module>",
            "train.py:5 in <module>",
            "train.py:11 in <module>",
            "model.py:30 in forward",
            "load.py:8 in copy_weights",
        ]
    );
    assert_eq!(t["parent"], serde_json::json!([0, 0, 0, 0, 1, 2]));
    assert_eq!(t["bytes"][0], 760 * MIB + 40960);
    assert_eq!(t["count"][4], 600);

    // Without stacks there is no site view (the page says why).
    let mut t = TraceBuilder::new();
    t.malloc(A, MIB);
    t.end(Stats::default());
    let v = page_data(&t.write(d.path(), "plain.trace"));
    assert!(v["traces"][0]["sites"].is_null());
}

/// The summary and the report give one span, in one unit (issue 32: the summary said `19.32 ms
/// over 4 events`, the report `4 calls over 33.61 ms`): from the first call to the last thing
/// the trace records (here a mark after the last call, then the End record), over the calls.
#[test]
fn summary_and_report_agree_on_the_span() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    t.free(A);
    t.ts += 5_000_000;
    t.text_note(
        isolate_trace::NoteKind::Mark,
        1000,
        0,
        "after the last call",
    );
    t.ts += 10_000_000;
    t.end(Stats::default());
    let p = t.write(d.path(), "s.trace");
    let o = isolate(d.path(), &["summary", "--json", "s.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let span = o.json()["traces"][0]["span_ns"].as_u64().unwrap();
    // The first call to the End record: the 1 µs between the calls, the mark, the End.
    assert_eq!(span, 1000 + 5_000_000 + 10_000_000 + 1000);
    let text = isolate(d.path(), &["summary", "s.trace"]).stdout;
    assert!(
        text.contains(
            "span     15.00 ms over 2 calls (from the first call to the end of the trace)"
        ),
        "{text}"
    );
    let r = report::render(&[&p], &mut NoProgress).unwrap();
    let start = r.html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + r.html[start..].find("</script>").unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.html[start..end]).unwrap();
    assert_eq!(v["traces"][0]["summary"]["span_ns"], span);
    assert_eq!(v["traces"][0]["timeline"]["span_ns"], span);
    // The page words it as the summary does: calls over the span.
    assert!(
        r.html
            .contains(r#"(calls === 1 ? " call" : " calls") + " over " + dur(s.span_ns"#),
        "the facts line uses the summary's span"
    );
}

/// The chart's key hint reads as a key, not a counter (issue 32: `… · 0 resets` read as "no
/// resets happened").
#[test]
fn the_zoom_hint_does_not_read_as_a_counter() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    t.end(Stats::default());
    let p = t.write(d.path(), "h.trace");
    let r = report::render(&[&p], &mut NoProgress).unwrap();
    assert!(!r.html.contains("0 resets"));
    assert!(r.html.contains("press 0 for the whole run"));
}

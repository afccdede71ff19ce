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

//! The report as people see it: `isolate report` pages of a stale write (with and without
//! stacks: with them, each finding box names the allocation's, the free's and the launch's
//! file:line first), a guard-mode crash, a training run, a training loop without NVTX (its
//! steps found from the call stacks and drawn as regions, its scattered start-up left out of
//! the first view, its allocation sites by bytes and by count, in a table and an icicle), a
//! stale launch, a 4-million-event trace and a page with regions, opened in
//! headless Chromium at 1400x900 and 800x600 by `tests/browser/report.mjs` (playwright-core),
//! which checks what is on screen: the findings and the crash badge at the top, a timeline that
//! zooms (wheel, keys) and pans (drag, keys) and starts where memory activity does, axis labels
//! inside the canvas and apart, no raw JSON or internal words, and load plus first paint of the
//! big page in time.
//!
//! Needs Chromium (`chromium` on PATH, or `ISOLATE_CHROMIUM=PATH`), node and `npm ci` run in
//! `tests/browser` (CI does all three: `.ci/run`). Without any of them the test says so on
//! stderr (`SKIPPED …`, with the command that fixes it: `common::skip`) and passes, unless `CI`
//! is set: then it fails with the same words.
//!
//! `ISOLATE_REPORT_SHOTS=DIR` also writes the screenshots of the documentation there
//! (`report-stale-write.png`, `report-guard-crash.png`, `report-training.png`,
//! `report-training-zoomed.png`, `report-4m-events.png`):
//!
//! ```sh
//! ISOLATE_REPORT_SHOTS=$PWD/docs/img cargo test -p isolate-analyzer --test browser
//! ```

mod common;

use common::one_live::write_one_live;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Events of the generated trace.
const BIG: u64 = 4_000_000;
/// Load and first paint of the big page, in ms (it draws in well under a second).
const BIG_LOAD_MS: u64 = 10_000;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("analyzer/ has a parent")
        .to_path_buf()
}

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ISOLATE_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    on_path(&[
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ])
}

fn report(bin: &Path, trace: &Path, out: &Path) {
    let o = Command::new(bin)
        .arg("report")
        .arg(trace)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run isolate report");
    assert!(
        o.status.success(),
        "isolate report {}: {}",
        trace.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn h200(name: &str) -> PathBuf {
    repo().join("tests/traces/h200").join(name)
}

/// The page of `from` with regions added to its timeline (the recorded traces here have none;
/// analyzer/tests/regions.rs checks that a trace's regions reach the page's data).
fn with_regions(from: &Path, to: &Path) {
    let html = std::fs::read_to_string(from).unwrap();
    let start = html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    let v: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    let fv = &v["traces"][0]["timeline"]["first_view"];
    let (a, b) = (
        fv["from_ns"].as_u64().unwrap(),
        fv["to_ns"].as_u64().unwrap(),
    );
    let step = (b - a) / 4;
    let regions: Vec<String> = (0..4)
        .map(|k| {
            format!(
                r#"{{"from_ns":{},"to_ns":{},"label":"step {}"}}"#,
                a + k * step,
                a + (k + 1) * step - step / 20,
                k + 1
            )
        })
        .collect();
    // the timeline's (the summary has a `regions` list too)
    let empty = "\"regions\":[],\"region_count\":0,\"first_view\"";
    assert_eq!(html.matches(empty).count(), 1);
    let html = html.replace(
        empty,
        &format!(
            "\"regions\":[{}],\"region_count\":4,\"first_view\"",
            regions.join(",")
        ),
    );
    std::fs::write(to, html).unwrap();
}

/// A version-2 trace whose first allocation (64 MiB, the bottom band all along) was made and
/// freed from Python functions, with small allocations coming and going above it.
fn stacks_trace(dir: &Path) -> PathBuf {
    use isolate_trace::{Api, Frame, PyCode, Record, Stack};
    let mut t = common::TraceBuilder::new();
    for (id, name, line) in [
        (1, "Model.step", 10),
        (2, "<module>", 1),
        (3, "cleanup", 28),
    ] {
        t.record(Record::PyCode(PyCode {
            id,
            file: "train.py".into(),
            name: name.into(),
            first_line: line,
        }));
    }
    let py = |code, line| Frame::Python { code, line };
    for (id, frames) in [
        (1, vec![py(1, 14), py(2, 40)]),
        (2, vec![py(3, 30), py(2, 41)]),
    ] {
        t.record(Record::Stack(Stack {
            id,
            frames,
            truncated: false,
        }));
    }
    t.call_from(Api::CudaMalloc, common::A, 64 * common::MIB, 1);
    for i in 0..40 {
        let p = common::A + 0x1000_0000 + i * 0x10_0000;
        t.call_from(Api::CudaMalloc, p, 4 * common::MIB, 1);
        t.call_from(Api::CudaFree, p, 0, 2);
    }
    t.call_from(Api::CudaFree, common::A, 0, 2);
    t.end(Default::default());
    t.write(dir, "stacks.trace")
}

#[test]
fn report_pages_in_headless_chromium() {
    let Some(chromium) = chromium() else {
        common::skip(
            "chromium is not installed (apt-get install -y chromium; or ISOLATE_CHROMIUM=PATH): \
             the report's pages are not tested in a browser",
        );
        return;
    };
    let browser = repo().join("tests/browser");
    let Some(node) = on_path(&["node", "nodejs"]) else {
        common::skip(
            "chromium is installed but node is not: install node 18 or later \
             (apt-get install -y nodejs npm), then run `npm --prefix tests/browser ci`",
        );
        return;
    };
    if !browser.join("node_modules/playwright-core").is_dir() {
        common::skip(&format!(
            "chromium and node are installed but the browser driver is not: run \
             `npm --prefix {} ci` (playwright-core, as tests/browser/package-lock.json locks it)",
            browser.display()
        ));
        return;
    }

    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let debug = PathBuf::from(env!("CARGO_BIN_EXE_isolate"));
    report(
        &debug,
        &h200("stale_isolate.trace"),
        &dir.join("stale.html"),
    );
    report(
        &debug,
        &h200("oob-4000000_guard.trace"),
        &dir.join("oob.html"),
    );
    report(
        &debug,
        &h200("stale_guard.trace"),
        &dir.join("stale_guard.html"),
    );
    report(
        &debug,
        &h200("mlp-log_no-caching.trace"),
        &dir.join("mlp.html"),
    );
    with_regions(&dir.join("mlp.html"), &dir.join("regions.html"));
    let stacked = stacks_trace(dir);
    report(&debug, &stacked, &dir.join("stacks.html"));
    report(
        &debug,
        &common::loop_trace(false).write(dir, "loop.trace"),
        &dir.join("loop.html"),
    );
    report(
        &debug,
        &repo().join("tests/traces/h200-v3/stale_isolate.trace"),
        &dir.join("stale_v3.html"),
    );
    let big = dir.join("big.trace");
    let t = Instant::now();
    write_one_live(&big, BIG).unwrap();
    let bin = common::release_isolate("browser");
    report(&bin, &big, &dir.join("big.html"));
    eprintln!(
        "browser: {BIG}-event trace written and reported in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let big_page = std::fs::metadata(dir.join("big.html")).unwrap().len();
    assert!(big_page < 1 << 20, "the big page is {big_page} bytes");
    std::fs::remove_file(&big).unwrap();

    let manifest = serde_json::json!([
        {"name": "stale write", "file": dir.join("stale.html"), "shot": "stale-write",
         "findings": ["Stale write: memory was written after it was freed",
                      "The 4.0 MiB allocation at 0x7fbd70800000 (",
                      "was freed by cudaFree (event 1) at 6.10 ms",
                      "Kernel stale_fill was launched with a pointer into it at 142.84 ms"],
         "markers": true, "trimmed": true},
        // With stacks (format 3): where in the code, first in the box.
        {"name": "stale write with stacks", "file": dir.join("stale_v3.html"),
         "findings": ["Stale write: memory was written after it was freed"],
         "places": ["allocated at /work/main/tests/gpu/bug_stale_write.py:39 in main",
                    "freed at /work/main/tests/gpu/bug_stale_write.py:43 in main",
                    "launched at /work/main/tests/gpu/workload.py:121 in cupy_fill"],
         "markers": true, "trimmed": true,
         "sites": {"frames": ["bug_stale_write.py:"]}},
        // No NVTX, no regions: the loop's steps from the call stacks, the start-up left out.
        {"name": "training loop without NVTX", "file": dir.join("loop.html"), "clean": true,
         "steps": 10, "zoom_to_steps": true, "trimmed": true, "regions": true,
         "sites": {"first": ["model.py:30 in forward"],
                   "frames": ["train.py:10 in <module>", "model.py:30 in forward"]}},
        {"name": "guard-mode crash", "file": dir.join("oob.html"), "shot": "guard-crash",
         "badge": "crashed: signal 6 (SIGABRT) after CUDA error 700 (CUDA_ERROR_ILLEGAL_ADDRESS)",
         "findings": ["Device fault: a kernel faulted",
                      "cudaFree (event 1) returned 700 (cudaErrorIllegalAddress) at 301.42 ms"],
         "markers": true},
        {"name": "guard-mode stale launch", "file": dir.join("stale_guard.html"),
         "badge": "crashed: signal 6 (SIGABRT) after CUDA error 700",
         "findings": ["Stale launch: a kernel got a pointer into freed memory", "Kernel stale_fill"],
         "markers": true},
        {"name": "training run", "file": dir.join("mlp.html"), "shot": "training",
         "shot_zoomed": "training-zoomed", "zoom_at": 0.75, "trimmed": true,
         // Memory held at exit is information, not a finding (leaks are growth: issue 30):
         // the all-clear shows.
         "clean": true},
        {"name": "regions", "file": dir.join("regions.html"), "trimmed": true, "regions": true},
        {"name": "call stacks", "file": dir.join("stacks.html"),
         "stacks": ["allocation #0: cudaMalloc of 64.0 MiB", "allocated at:",
                    "train.py:14 in Model.step", "train.py:40 in <module>", "freed at:",
                    "train.py:30 in cleanup"]},
        {"name": "4M events", "file": dir.join("big.html"), "shot": "4m-events", "clean": true,
         "max_load_ms": BIG_LOAD_MS},
    ]);
    let mpath = dir.join("pages.json");
    std::fs::write(&mpath, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();

    let mut cmd = Command::new(node);
    cmd.arg(browser.join("report.mjs"))
        .arg("--chromium")
        .arg(&chromium)
        .arg("--manifest")
        .arg(&mpath)
        .current_dir(&browser)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(shots) = std::env::var_os("ISOLATE_REPORT_SHOTS") {
        std::fs::create_dir_all(&shots).unwrap();
        cmd.arg("--shots").arg(shots);
    }
    let mut child = cmd.spawn().expect("start node");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (o.join().unwrap(), e.join().unwrap());
    eprintln!("{stdout}{stderr}");
    let status = status.expect("the browser checks did not finish within 300 s");
    assert!(
        status.success(),
        "the browser checks failed ({status}):\n{stdout}{stderr}"
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
}

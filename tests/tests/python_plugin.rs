//! The Python package's module and pytest plugin (python/src/cuda_isolate), on the stand-in
//! CUDA: python/tests/test_plugin_cases.py run by pytest in a subprocess, with libisolate.so
//! preloaded, through `--isolate` (pytest run again under the preload), and without it. The
//! cases' names say the outcome (`test_pass_*`, `test_fail_*`). Skipped, saying so
//! ([`isolate_tests::skip`]), only when python3 or pytest is missing; with `CI` set that fails
//! instead (.ci/run installs pytest).
//!
//! With `ISOLATE_TEST_PYTHON` naming the Python of an environment where the `cuda-isolate`
//! package is installed (.ci/run's wheel step: a fresh venv with the wheel built from the sdist),
//! the same cases test the installed package instead of the source tree: its module (nothing
//! on `PYTHONPATH`), its plugin loaded through its `pytest11` entry point, and the
//! libisolate.so it installed (`python -m cuda_isolate --lib`).

use isolate_tests::{analyzer_path, preload_path, skip, standin_dir, workspace_root};
use isolate_trace::{NoteKind, Reader, Record};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python the cases run under, and what it tests.
struct Python {
    exe: PathBuf,
    /// The installed package (`ISOLATE_TEST_PYTHON`), not python/src.
    installed: bool,
    /// The libisolate.so preloaded.
    lib: PathBuf,
}

fn python_with_pytest() -> Option<Python> {
    let (exe, installed) = match std::env::var_os("ISOLATE_TEST_PYTHON") {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from("python3"), false),
    };
    let ok = Command::new(&exe)
        .args(["-c", "import pytest"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        skip(&format!(
            "{} with pytest not found (pip install pytest): the pytest plugin is not tested",
            exe.display()
        ));
        return None;
    }
    let lib = if installed {
        let o = Command::new(&exe)
            .args(["-m", "cuda_isolate", "--lib"])
            .env_remove("CUDA_ISOLATE_LIB")
            .output()
            .expect("run python -m cuda_isolate --lib");
        assert!(
            o.status.success(),
            "ISOLATE_TEST_PYTHON={}: python -m cuda_isolate --lib failed (is the package installed?): {}",
            exe.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
    } else {
        preload_path()
    };
    Some(Python {
        exe,
        installed,
        lib,
    })
}

/// Runs pytest on python/tests/test_plugin_cases.py in `dir`; `preload`: with LD_PRELOAD;
/// `args`: more pytest options.
fn pytest(py: &Python, dir: &Path, preload: bool, args: &[&str]) -> (String, bool) {
    pytest_cases(py, dir, "test_plugin_cases.py", preload, &[], args)
}

/// Runs pytest on python/tests/`cases` in `dir`, with `env` set too.
fn pytest_cases(
    py: &Python,
    dir: &Path,
    cases: &str,
    preload: bool,
    env: &[(&str, &str)],
    args: &[&str],
) -> (String, bool) {
    let mut cmd = Command::new(&py.exe);
    cmd.current_dir(dir);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_")
            || k.starts_with("LD_")
            || k.starts_with("CUDA_ISOLATE_")
            || k == "PYTHONPATH"
        {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.env("LD_LIBRARY_PATH", standin_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CUDA_ISOLATE_ANALYZER", analyzer_path())
        .env("ISOLATE_TRACE", dir.join("isolate-%p.trace"));
    if preload {
        cmd.env("LD_PRELOAD", &py.lib);
    }
    cmd.args(["-m", "pytest", "-p", "no:cacheprovider", "-rA"]);
    if py.installed {
        // The installed package brings the module, the library and the plugin (through its
        // pytest11 entry point) itself.
        cmd.env_remove("PYTEST_DISABLE_PLUGIN_AUTOLOAD");
    } else {
        // The source tree's module and plugin, and the workspace's library for `--isolate`.
        // No plugin from entry points: a cuda-isolate installed in this Python, or the
        // egg-info that `python -m build` leaves in python/src, would register the plugin a
        // second time ("Plugin already registered under a different name").
        cmd.env("PYTHONPATH", workspace_root().join("python/src"))
            .env("CUDA_ISOLATE_LIB", &py.lib)
            .env("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
            .args(["-p", "cuda_isolate.pytest_plugin"]);
    }
    cmd.envs(env.iter().copied())
        .args(args)
        .arg(workspace_root().join("python/tests").join(cases));
    let out = cmd.output().expect("run python3 -m pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (text, out.status.success())
}

/// Each case's outcome, from pytest's `-rA` summary lines.
fn outcomes(text: &str) -> Vec<(String, &'static str)> {
    let mut v = Vec::new();
    for l in text.lines() {
        for word in ["PASSED", "FAILED"] {
            if let Some(rest) = l.strip_prefix(word)
                && let Some(i) = rest.find("::")
            {
                let name = rest[i + 2..].split_whitespace().next().unwrap_or("");
                v.push((name.to_string(), word));
            }
        }
    }
    v.sort();
    v
}

fn assert_outcomes_by_name(text: &str) {
    let got = outcomes(text);
    assert_eq!(got.len(), 8, "eight cases ran:\n{text}");
    for (name, outcome) in &got {
        let want = if name.starts_with("test_fail_") {
            "FAILED"
        } else {
            "PASSED"
        };
        assert_eq!(outcome, &want, "{name}:\n{text}");
    }
    for why in [
        "isolate_no_findings: new findings during the test: 1 invalid free (see the trace",
        "isolate_limit_peak: device memory peaked at 4194304 bytes",
        "isolate_limit_leak: 2097152 bytes (2.0 MiB) more device memory held",
    ] {
        assert!(text.contains(why), "no {why:?} in:\n{text}");
    }
}

fn the_trace(dir: &Path) -> std::path::PathBuf {
    let traces: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    assert_eq!(
        traces.len(),
        1,
        "one trace in {}: {traces:?}",
        dir.display()
    );
    traces[0].clone()
}

#[test]
fn markers_pass_and_fail_under_the_preload_and_regions_reach_the_trace() {
    let Some(py) = python_with_pytest() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // isolate_no_findings needs a mode that sees stale writes (log mode fails it, below).
    let (text, ok) = pytest_cases(
        &py,
        dir.path(),
        "test_plugin_cases.py",
        true,
        &[("ISOLATE_MODE", "isolate")],
        &[],
    );
    assert!(!ok, "three cases fail:\n{text}");
    assert!(text.contains("isolate_* markers are checked"), "{text}");
    assert_outcomes_by_name(&text);

    // Marks and regions are Mark / RegionPush / RegionPop notes named by the bare text; each
    // test is a region named by its node id (rootdir: python/, where pyproject.toml is).
    let trace = the_trace(dir.path());
    let mut r = Reader::open(&trace).unwrap();
    let mut notes = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        if let Record::Note(n) = rec {
            let tag = match n.kind {
                NoteKind::Mark => "mark",
                NoteKind::RegionPush => "push",
                NoteKind::RegionPop => "pop",
                _ => continue,
            };
            notes.push(format!("{tag}: {}", n.text));
        }
    }
    for want in [
        "mark: hello from python",
        "push: inner",
        "pop: inner",
        "push: decorated",
        "push: tests/test_plugin_cases.py::test_pass_clean",
        "pop: tests/test_plugin_cases.py::test_fail_leak",
    ] {
        assert!(
            notes.iter().any(|t| t == want),
            "no note {want:?} in {notes:?}"
        );
    }
    // The analyzer reads a trace with them.
    let s = Command::new(analyzer_path())
        .arg("summary")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        s.status.success(),
        "isolate summary: {}",
        String::from_utf8_lossy(&s.stderr)
    );
}

#[test]
fn the_isolate_option_runs_pytest_again_under_the_preload() {
    let Some(py) = python_with_pytest() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (text, ok) = pytest(&py, dir.path(), false, &["--isolate"]);
    assert!(!ok, "three cases fail:\n{text}");
    assert_outcomes_by_name(&text);
    the_trace(dir.path());
}

#[test]
fn without_the_library_everything_runs_and_the_header_says_markers_are_not_checked() {
    let Some(py) = python_with_pytest() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (text, ok) = pytest(&py, dir.path(), false, &[]);
    assert!(ok, "all pass:\n{text}");
    assert!(
        text.contains("libisolate.so is not loaded: isolate_* markers are NOT checked"),
        "{text}"
    );
    assert!(
        outcomes(&text).iter().all(|(_, o)| *o == "PASSED"),
        "{text}"
    );
}

/// Log mode cannot see stale writes (no poison, no quarantine): a test marked
/// isolate_no_findings fails there, saying so, instead of passing unchecked.
#[test]
fn isolate_no_findings_fails_loudly_in_log_mode() {
    let Some(py) = python_with_pytest() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (text, ok) = pytest_cases(
        &py,
        dir.path(),
        "test_plugin_cases.py",
        true,
        &[("ISOLATE_MODE", "log")],
        &["-k", "test_pass_clean or test_pass_api"],
    );
    assert!(!ok, "the marked case fails:\n{text}");
    let got = outcomes(&text);
    assert_eq!(
        got,
        [
            ("test_pass_api".to_string(), "PASSED"),
            ("test_pass_clean".to_string(), "FAILED")
        ],
        "{text}"
    );
    assert!(
        text.contains(
            "isolate_no_findings: libisolate.so runs in log mode, which cannot see stale writes \
             or stale launches (no poison, no quarantine): this test was NOT checked"
        ),
        "{text}"
    );
}

/// The isolate_no_findings marker checks the quarantine at the end of each test
/// (`isolate_check_now`): the stale write of one test fails that test, with the finding; the
/// tests before and after it pass (python/tests/test_check_now_cases.py, isolate mode).
#[test]
fn a_stale_write_fails_the_test_that_made_it_at_its_end() {
    let Some(py) = python_with_pytest() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (text, ok) = pytest_cases(
        &py,
        dir.path(),
        "test_check_now_cases.py",
        true,
        &[("ISOLATE_MODE", "isolate")],
        &[],
    );
    assert!(!ok, "one case fails:\n{text}");
    let outcome = |name: &str| {
        outcomes(&text)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, o)| o)
            .unwrap_or_else(|| panic!("no outcome of {name}:\n{text}"))
    };
    assert_eq!(outcome("test_pass_clean_before"), "PASSED", "{text}");
    assert_eq!(outcome("test_fail_stale_write"), "FAILED", "{text}");
    assert_eq!(outcome("test_pass_clean_after"), "PASSED", "{text}");
    assert_eq!(outcome("test_pass_check_now_counts"), "PASSED", "{text}");
    assert!(
        text.contains(
            "isolate_no_findings: new findings during the test: 1 stale write (see the trace"
        ),
        "{text}"
    );
    // Found by the check at the end of the test: said on stderr before the next test ran,
    // with where the allocation and the free were (the stacks' Python lines, known to the
    // library since it read them; issue 30, item 4).
    let live = text
        .lines()
        .find(|l| l.contains("isolate: STALE WRITE"))
        .unwrap_or_else(|| panic!("no STALE WRITE line:\n{text}"));
    for want in [
        "; allocated at ",
        "python/tests/standin_runtime.py:19 in malloc, freed at ",
        "python/tests/test_check_now_cases.py:22 in test_fail_stale_write",
    ] {
        assert!(live.contains(want), "no {want:?} in {live:?}");
    }
    assert!(!live.contains("isolate summary names"), "{live}");
    // The failure names the trace and where in the code the allocation and the free were
    // (the innermost Python frames: standin_runtime.py's malloc, the test's cudaFree).
    let trace = the_trace(dir.path());
    assert!(
        text.contains(&format!(
            "(see the trace: isolate summary {})",
            trace.display()
        )),
        "{text}"
    );
    for want in [
        "\n  allocated at ",
        "python/tests/standin_runtime.py:19 in malloc\n",
        "\n  freed at ",
        "python/tests/test_check_now_cases.py:22 in test_fail_stale_write\n",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
}

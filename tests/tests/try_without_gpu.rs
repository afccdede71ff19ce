//! Trying the tool on a machine without a GPU, exactly as docs/user-guide.md ("Trying it
//! without a GPU") says: `isolate-demo --standin-path` names the stand-in CUDA's directory for
//! `LD_LIBRARY_PATH`, `isolate-demo --programs-path` the compiled test programs, and
//! `isolate run --mode isolate` of `stale_write` there finds the planted stale write, which
//! `isolate summary` names.

use isolate_tests::{analyzer_path, standin_bin, standin_dir};
use std::path::PathBuf;
use std::process::{Command, Output};

const DEMO: &str = env!("CARGO_BIN_EXE_isolate-demo");

/// A command with none of the caller's `ISOLATE_*` or `LD_*` settings.
fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_") || k.starts_with("LD_") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `isolate-demo FLAG`'s one line of output, as `$(...)` would take it.
fn demo_path(flag: &str) -> PathBuf {
    let o = clean(DEMO).arg(flag).output().expect("run isolate-demo");
    assert!(o.status.success(), "isolate-demo {flag}: {}", text(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert_eq!(out.lines().count(), 1, "isolate-demo {flag}: {out:?}");
    PathBuf::from(out.trim_end())
}

#[test]
fn the_demo_names_the_standin_and_the_programs() {
    let standin = demo_path("--standin-path");
    assert_eq!(standin, standin_dir());
    for lib in ["libcudart.so.13", "libcuda.so.1"] {
        assert!(
            standin.join(lib).is_file(),
            "no {lib} in {}",
            standin.display()
        );
    }
    let programs = demo_path("--programs-path");
    assert_eq!(programs, standin_bin());
    assert!(programs.join("stale_write").is_file());

    let help = clean(DEMO).arg("--help").output().unwrap();
    let help = text(&help);
    assert!(
        help.contains("--standin-path") && help.contains("--programs-path"),
        "{help}"
    );
}

#[test]
fn isolate_run_on_the_standin_finds_the_planted_stale_write() {
    let standin = demo_path("--standin-path");
    let programs = demo_path("--programs-path");
    let dir = tempfile::tempdir().unwrap();
    let run = clean(analyzer_path())
        .current_dir(dir.path())
        .env("LD_LIBRARY_PATH", &standin)
        .args(["run", "--mode", "isolate", "--trace", "try-%p.trace", "--"])
        .arg(programs.join("stale_write"))
        .output()
        .expect("run isolate run");
    assert!(run.status.success(), "isolate run: {}", text(&run));
    // In isolate mode the stale write lands in poison: B is left alone.
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("b==a 0"), "{}", text(&run));
    let traces: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    assert_eq!(traces.len(), 1, "{traces:?}: {}", text(&run));
    let summary = clean(analyzer_path())
        .arg("summary")
        .arg(&traces[0])
        .output()
        .unwrap();
    let s = text(&summary);
    assert!(s.contains("STALE WRITE"), "{s}");
}

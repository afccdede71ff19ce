//! The Python package's start-up hook (python/cuda_isolate.pth → cuda_isolate/startup.py), on
//! the stand-in CUDA:
//!
//! - the `.pth` line, processed as `site` processes it (`site.addsitedir`), with a fake `cupy`
//!   package on `sys.path` that records its allocator calls: in isolate mode under the preload,
//!   importing `cupy` switches its device and pinned pools off (one stderr line), and the hook
//!   leaves `sys.meta_path`; in log mode nothing is switched; without the preload the line
//!   imports nothing at all; in every preloaded process `NVTX_INJECTION64_PATH` names the loaded
//!   library unless set.
//!
//! (The isolate_no_findings marker's end-of-test check is in python_plugin.rs.) Skipped, saying
//! so ([`isolate_tests::skip`]), only when python3 is missing; with `CI` set that fails instead.

use isolate_tests::{preload_path, skip, standin_dir, workspace_root};
use std::path::Path;
use std::process::Command;

fn python() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "pass"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        skip("python3 not found: the start-up hook is not tested");
    }
    ok
}

/// A python3 with a clean environment: the stand-in runtime, the package's source and `extra`
/// on `PYTHONPATH`, traces into `dir`.
fn py(dir: &Path, extra: &Path) -> Command {
    let mut cmd = Command::new("python3");
    cmd.current_dir(dir);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_")
            || k.starts_with("LD_")
            || k.starts_with("CUDA_ISOLATE_")
            || k.starts_with("NVTX_")
        {
            cmd.env_remove(k.as_ref());
        }
    }
    let pythonpath = format!(
        "{}:{}",
        extra.display(),
        workspace_root().join("python/src").display()
    );
    cmd.env("LD_LIBRARY_PATH", standin_dir())
        .env("PYTHONPATH", pythonpath)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("ISOLATE_TRACE", dir.join("isolate-%p.trace"));
    cmd
}

const FAKE_CUPY_INIT: &str = "from . import cuda\n";
const FAKE_CUPY_CUDA: &str = "calls = []\n\
def set_allocator(a):\n    calls.append(('device', a))\n\
def set_pinned_memory_allocator(a):\n    calls.append(('pinned', a))\n";

/// Processes the wheel's `.pth` line (as `site` does at start-up), imports the fake `cupy`, and
/// prints what happened.
const SCRIPT: &str = r#"
import os, sys, site
before = 'cuda_isolate' in sys.modules
site.addsitedir(sys.argv[1])
print('imported cuda_isolate', 'cuda_isolate' in sys.modules and not before)
print('finder', sum(type(f).__name__ == 'CupyFinder' for f in sys.meta_path))
import cupy
print('calls', cupy.cuda.calls)
print('finder after', sum(type(f).__name__ == 'CupyFinder' for f in sys.meta_path))
print('nvtx', os.environ.get('NVTX_INJECTION64_PATH'))
"#;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site");
        let fake = dir.path().join("fake/cupy");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::create_dir_all(&fake).unwrap();
        std::fs::copy(
            workspace_root().join("python/cuda_isolate.pth"),
            site.join("cuda_isolate.pth"),
        )
        .unwrap();
        std::fs::write(fake.join("__init__.py"), FAKE_CUPY_INIT).unwrap();
        std::fs::write(fake.join("cuda.py"), FAKE_CUPY_CUDA).unwrap();
        Fixture { dir }
    }

    /// Runs SCRIPT: `mode` None = without the preload.
    fn run(&self, mode: Option<&str>, nvtx: Option<&str>) -> (String, String) {
        let d = self.dir.path();
        let mut cmd = py(d, &d.join("fake"));
        if let Some(m) = mode {
            cmd.env("LD_PRELOAD", preload_path()).env("ISOLATE_MODE", m);
        }
        if let Some(v) = nvtx {
            cmd.env("NVTX_INJECTION64_PATH", v);
        }
        let out = cmd
            .args(["-c", SCRIPT])
            .arg(d.join("site"))
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{stdout}\n{stderr}");
        (stdout, stderr)
    }
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {key:?} line in:\n{out}"))
}

#[test]
fn the_pth_hook_switches_cupys_pools_off_in_isolate_mode_only() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let lib = std::fs::canonicalize(preload_path()).unwrap();

    let (out, err) = f.run(Some("isolate"), None);
    assert_eq!(line(&out, "finder"), "1", "{out}");
    assert_eq!(
        line(&out, "calls"),
        "[('device', None), ('pinned', None)]",
        "{out}"
    );
    assert_eq!(line(&out, "finder after"), "0", "{out}");
    assert_eq!(line(&out, "nvtx"), lib.to_string_lossy(), "{out}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("CuPy's memory pools off"))
        .collect();
    assert_eq!(
        said,
        [
            "isolate: isolate mode: CuPy's memory pools off (cupy.cuda.set_allocator(None), set_pinned_memory_allocator(None))"
        ],
        "{err}"
    );

    // Log mode: CuPy is left alone; NVTX is still named. A user's NVTX tool is kept.
    let (out, err) = f.run(Some("log"), Some("/opt/other/libnvtx-tool.so"));
    assert_eq!(line(&out, "finder"), "0", "{out}");
    assert_eq!(line(&out, "calls"), "[]", "{out}");
    assert_eq!(line(&out, "nvtx"), "/opt/other/libnvtx-tool.so", "{out}");
    assert!(!err.contains("CuPy"), "{err}");
}

#[test]
fn without_the_preload_the_pth_line_imports_nothing() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let (out, err) = f.run(None, None);
    assert_eq!(line(&out, "imported cuda_isolate"), "False", "{out}");
    assert_eq!(line(&out, "finder"), "0", "{out}");
    assert_eq!(line(&out, "calls"), "[]", "{out}");
    assert_eq!(line(&out, "nvtx"), "None", "{out}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn cupy_imported_before_the_hook_is_switched_off_at_once() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let d = f.dir.path();
    let out = py(d, &d.join("fake"))
        .env("LD_PRELOAD", preload_path())
        .env("ISOLATE_MODE", "isolate")
        .args([
            "-c",
            "import cupy, cuda_isolate.startup as s; s.install(); print(cupy.cuda.calls)",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[('device', None), ('pinned', None)]"
    );
}

//! `isolate-demo`: the planted stale-pointer write of `tests/programs/stale_write.c`, run
//! through `isolate run` once in log mode and once in isolate mode, each followed by
//! `isolate summary` of the trace it left.
//!
//! The program allocates A (1 MiB), frees it, allocates B (1 MiB), zeroes B, then writes 16
//! bytes through the stale pointer A at offset 4096 and counts how many bytes of B changed.
//!
//! ```text
//! cargo build --release --workspace && ./target/release/isolate-demo [--standin] [--keep]
//! ```
//!
//! `isolate` and `libisolate.so` are taken from the directory of this executable. The program
//! runs against the stand-in CUDA driver and runtime of `tests/standin/` (through
//! `LD_LIBRARY_PATH`), unless a real `libcuda.so.1` is installed and a real `libcudart.so.13`
//! can be found for the program (which is linked against it): then it runs on the GPU.
//! `--standin` forces the stand-in; `--keep` keeps the trace directories.
//!
//! `--standin-path` prints the stand-in's directory (for `LD_LIBRARY_PATH`: a CUDA program run
//! with it there runs on host memory), `--programs-path` the directory of the compiled test
//! programs (`stale_write` and the others of `tests/programs/`), and exit: how to try the tool
//! by hand on a machine without a GPU (docs/user-guide.md, "Trying it without a GPU").
//!
//! Exit status 0 when every step worked and each mode showed what it should; 1 otherwise.

use isolate_trace::{Api, Reader, Record};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

const STANDIN_DIR: &str = env!("STANDIN_DIR");
const STANDIN_BIN: &str = env!("STANDIN_BIN");

/// The offset and length of the stale write in `stale_write.c`.
const STALE_OFFSET: u64 = 4096;
const STALE_BYTES: u64 = 16;

fn main() -> ExitCode {
    let mut standin_only = false;
    let mut keep = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--standin" => standin_only = true,
            "--keep" => keep = true,
            "--standin-path" => return print_dir(STANDIN_DIR, "the stand-in CUDA"),
            "--programs-path" => return print_dir(STANDIN_BIN, "the test programs"),
            "-h" | "--help" => {
                println!("usage: isolate-demo [--standin] [--keep]");
                println!("       isolate-demo --standin-path | --programs-path");
                println!(
                    "  --standin        run against the stand-in CUDA even when a GPU driver is installed"
                );
                println!("  --keep           keep the temporary directories with the traces");
                println!(
                    "  --standin-path   print the stand-in CUDA's directory, for LD_LIBRARY_PATH"
                );
                println!(
                    "  --programs-path  print the directory of the test programs (stale_write, ...)"
                );
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("isolate-demo: unknown argument {other:?} (try --help)");
                return ExitCode::from(2);
            }
        }
    }
    match demo(standin_only, keep) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("\nisolate-demo: FAILED: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Prints `dir` (built by tests/build.rs: `what`) for a shell's `$(...)`; an error when it is
/// gone (a `cargo clean` since this binary was built).
fn print_dir(dir: &str, what: &str) -> ExitCode {
    if Path::new(dir).is_dir() {
        println!("{dir}");
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "isolate-demo: {what} is not at {dir} any more: build it again (cargo build --release --workspace)"
        );
        ExitCode::FAILURE
    }
}

/// Which CUDA the program runs against, and the `LD_LIBRARY_PATH` that gives it.
struct Cuda {
    description: String,
    ld_library_path: Option<OsString>,
    real: bool,
}

/// What one mode's run showed.
struct Outcome {
    /// The program printed `b==a 1`.
    b_got_a: bool,
    /// Bytes of B that changed, and the first of them.
    b_changed: u64,
    b_first: u64,
    /// A's address, from the trace's first cudaMalloc.
    a_ptr: u64,
    /// (first offset, changed bytes) of each stale write on A.
    violations: Vec<(u64, u64)>,
}

fn demo(standin_only: bool, keep: bool) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe.parent().ok_or("this executable has no directory")?;
    let isolate = dir.join("isolate");
    let lib = dir.join("libisolate.so");
    for p in [&isolate, &lib] {
        if !p.is_file() {
            return Err(format!(
                "{} not found beside {}: build everything with `cargo build --release --workspace`",
                p.display(),
                exe.display()
            ));
        }
    }
    let program = Path::new(STANDIN_BIN).join("stale_write");
    if !program.is_file() {
        return Err(format!(
            "the test program {} is missing: `cargo build --release --workspace` builds it (tests/build.rs)",
            program.display()
        ));
    }
    let cuda = choose_cuda(standin_only);

    println!("isolate demo: a write through a stale device pointer, under libisolate.so");
    println!();
    println!("program   {}", program.display());
    println!("          allocates A (1 MiB), frees it, allocates B (1 MiB), zeroes B, then writes");
    println!(
        "          {STALE_BYTES} bytes through the stale pointer A at offset {STALE_OFFSET} and counts what changed in B"
    );
    println!("CUDA      {}", cuda.description);
    println!("isolate   {}", isolate.display());
    println!("library   {}", lib.display());

    let log = run_mode(&isolate, &program, &cuda, "log", keep)?;
    let iso = run_mode(&isolate, &program, &cuda, "isolate", keep)?;

    // What each mode must show. On the stand-in the driver hands a freed address straight
    // back, as the real one does (call-path notes, section 6), so log mode must show B
    // corrupted; on a real GPU the driver decides, and the explanation says what it did.
    let mut problems = Vec::new();
    let log_corrupted = log.b_got_a && log.b_changed == STALE_BYTES && log.b_first == STALE_OFFSET;
    if !cuda.real && !log_corrupted {
        problems.push(format!(
            "log mode: expected B at A's address with {STALE_BYTES} bytes changed from offset \
             {STALE_OFFSET}; got b==a {} and {} bytes changed from {}",
            log.b_got_a as u8, log.b_changed, log.b_first
        ));
    }
    if !log.violations.is_empty() {
        problems
            .push("log mode: the trace has stale writes (log mode does not poison, so it cannot find any)".into());
    }
    if iso.b_got_a || iso.b_changed != 0 {
        problems.push(format!(
            "isolate mode: B should have its own address and be intact; got b==a {} and {} bytes changed",
            iso.b_got_a as u8, iso.b_changed
        ));
    }
    if iso.violations != [(STALE_OFFSET, STALE_BYTES)] {
        problems.push(format!(
            "isolate mode: expected one stale write on A at offset {STALE_OFFSET} \
             ({STALE_BYTES} bytes); the trace has {:?} (first offset, changed bytes)",
            iso.violations
        ));
    }

    println!();
    println!("== what happened");
    if log.b_got_a && log.b_changed > 0 {
        println!(
            "log mode:     B got A's address (0x{:x}) and was corrupted: {} bytes changed from offset {}, and nothing said so.",
            log.a_ptr, log.b_changed, log.b_first
        );
    } else {
        println!(
            "log mode:     B {} A's address and {} of its bytes changed; the trace records every call, nothing more.",
            if log.b_got_a { "got" } else { "did not get" },
            log.b_changed
        );
    }
    println!(
        "isolate mode: B got a fresh address and stayed intact: A's freed memory was held in quarantine, poisoned with 0xFF;"
    );
    match iso.violations.first() {
        Some((first, changed)) => println!(
            "              checking the poison found the stale write at offset {first} of A ({changed} bytes changed), \
             in the trace (poison_violations) and on stderr."
        ),
        None => println!("              but checking the poison found no stale write (see above)."),
    }

    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n  "))
    }
}

/// Runs the program through `isolate run --mode MODE` in a fresh directory, prints what it
/// printed and the summary of its trace.
fn run_mode(
    isolate: &Path,
    program: &Path,
    cuda: &Cuda,
    mode: &str,
    keep: bool,
) -> Result<Outcome, String> {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("isolate-demo-{mode}-"))
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let dir = tmp.path().to_path_buf();
    let pattern = dir.join("demo-%p.trace");
    println!();
    println!("== {mode} mode");
    println!(
        "$ {}isolate run --mode {mode} --trace {} -- {}",
        cuda.ld_library_path
            .as_ref()
            .map(|p| format!("LD_LIBRARY_PATH={} ", p.to_string_lossy()))
            .unwrap_or_default(),
        pattern.display(),
        program.display()
    );
    let mut cmd = Command::new(isolate);
    cmd.arg("run")
        .arg("--mode")
        .arg(mode)
        .arg("--trace")
        .arg(&pattern)
        .arg("--")
        .arg(program)
        .current_dir(&dir)
        .stdin(Stdio::null());
    // Settings of the caller's environment would change what the demo shows (or be refused).
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ISOLATE_") {
            cmd.env_remove(&k);
        }
    }
    if let Some(p) = &cuda.ld_library_path {
        cmd.env("LD_LIBRARY_PATH", p);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", isolate.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("program output:");
    for l in stdout.lines() {
        println!("  | {l}");
    }
    for l in stderr.lines() {
        println!("  ! {l}");
    }
    if !out.status.success() {
        return Err(format!("{mode} mode: the program failed ({})", out.status));
    }

    let traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("demo-"))
        })
        .collect();
    let [trace] = &traces[..] else {
        return Err(format!(
            "{mode} mode: expected one trace in {}, found {}",
            dir.display(),
            traces.len()
        ));
    };

    println!("$ isolate summary {}", trace.display());
    let summary = Command::new(isolate)
        .arg("summary")
        .arg(trace)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", isolate.display()))?;
    print!("{}", String::from_utf8_lossy(&summary.stdout));
    eprint!("{}", String::from_utf8_lossy(&summary.stderr));
    if !summary.status.success() {
        return Err(format!(
            "{mode} mode: `isolate summary` failed ({})",
            summary.status
        ));
    }

    let (a_ptr, violations) = read_trace(trace)?;
    let b_got_a = has_line(&stdout, "b==a 1");
    let (b_changed, b_first) = changed_line(&stdout)
        .ok_or_else(|| format!("{mode} mode: the program printed no `b changed` line"))?;
    if keep {
        let kept = tmp.keep();
        println!("(kept {})", kept.display());
    }
    Ok(Outcome {
        b_got_a,
        b_changed,
        b_first,
        a_ptr,
        violations: violations
            .into_iter()
            .filter(|v| v.0 == a_ptr)
            .map(|v| (v.1, v.2))
            .collect(),
    })
}

/// A's address (the first successful cudaMalloc) and every violation as (ptr, first offset,
/// changed bytes).
#[allow(clippy::type_complexity)]
fn read_trace(path: &Path) -> Result<(u64, Vec<(u64, u64, u64)>), String> {
    let mut r = Reader::open(path).map_err(|e| e.to_string())?;
    let mut events = Vec::new();
    let mut violations = Vec::new();
    while let Some(rec) = r.next_record().map_err(|e| e.to_string())? {
        match rec {
            Record::Event(e) => events.push(e),
            Record::Violation(v) => violations.push((v.ptr, v.first_offset, v.changed_bytes)),
            _ => {}
        }
    }
    events.sort_by_key(|e| e.seq);
    let a = events
        .iter()
        .find(|e| e.api == Api::CudaMalloc && e.result == 0)
        .ok_or_else(|| format!("{}: no successful cudaMalloc in the trace", path.display()))?;
    Ok((a.ptr, violations))
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// `b changed FLAG bytes N first OFFSET` → (N, OFFSET).
fn changed_line(text: &str) -> Option<(u64, u64)> {
    let l = text.lines().find(|l| l.starts_with("b changed "))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    match w[..] {
        ["b", "changed", _, "bytes", n, "first", first] => {
            Some((n.parse().ok()?, first.parse().ok()?))
        }
        _ => None,
    }
}

// ------------------------------------------------------------------------ which CUDA

fn choose_cuda(standin_only: bool) -> Cuda {
    let standin = Cuda {
        description: "the stand-in driver and runtime of tests/standin (host memory, no GPU)"
            .into(),
        ld_library_path: Some(STANDIN_DIR.into()),
        real: false,
    };
    if standin_only {
        return standin;
    }
    let Some(driver) = find_library("libcuda.so.1", &driver_dirs()) else {
        return Cuda {
            description: format!("{} (no libcuda.so.1 installed)", standin.description),
            ..standin
        };
    };
    let Some(runtime) = find_library("libcudart.so.13", &runtime_dirs()) else {
        return Cuda {
            description: format!(
                "{}: a GPU driver is installed ({}), but no libcudart.so.13 was found for the \
                 program, which is linked against it",
                standin.description,
                driver.path.display()
            ),
            ..standin
        };
    };
    // A runtime the loader finds by itself needs nothing; another one needs its directory.
    let dir = runtime.path.parent().map(Path::to_path_buf);
    let found_anyway = runtime.in_cache
        || env_dirs("LD_LIBRARY_PATH")
            .iter()
            .any(|d| Some(d) == dir.as_ref());
    let ld_library_path = (!found_anyway).then(|| {
        let mut v = OsString::from(runtime.path.parent().unwrap_or(Path::new("/")));
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
            v.push(":");
            v.push(old);
        }
        v
    });
    Cuda {
        description: format!(
            "the real driver ({}) and runtime ({}): this runs on the GPU",
            driver.path.display(),
            runtime.path.display()
        ),
        ld_library_path,
        real: true,
    }
}

struct Found {
    path: PathBuf,
    /// Listed by `ldconfig -p`: the loader finds it without `LD_LIBRARY_PATH`.
    in_cache: bool,
}

/// `name` from the loader's cache, else from the first of `dirs` that holds it; never one of
/// the stand-in's files.
fn find_library(name: &str, dirs: &[PathBuf]) -> Option<Found> {
    let standin = std::fs::canonicalize(STANDIN_DIR).ok();
    let not_standin = |p: &Path| {
        let dir = p.parent().and_then(|d| std::fs::canonicalize(d).ok());
        dir.is_none() || dir != standin
    };
    let opens = |p: &Path| std::fs::File::open(p).is_ok();
    for p in ldconfig(name) {
        if opens(&p) && not_standin(&p) {
            return Some(Found {
                path: p,
                in_cache: true,
            });
        }
    }
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| opens(p) && not_standin(p))
        .map(|path| Found {
            path,
            in_cache: false,
        })
}

/// The paths `ldconfig -p` lists for `name` (64-bit entries).
fn ldconfig(name: &str) -> Vec<PathBuf> {
    let out = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|l| {
            Command::new(l)
                .arg("-p")
                .stderr(Stdio::null())
                .output()
                .ok()
        });
    let Some(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(name) && l.contains("x86-64"))
        .filter_map(|l| l.split("=> ").nth(1))
        .map(|p| PathBuf::from(p.trim()))
        .collect()
}

fn env_dirs(var: &str) -> Vec<PathBuf> {
    std::env::var_os(var)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Where GPU drivers are installed when the loader's cache does not list them.
fn driver_dirs() -> Vec<PathBuf> {
    let mut v = env_dirs("LD_LIBRARY_PATH");
    v.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/nvidia/lib64",
            "/usr/lib/wsl/lib",
            "/run/opengl-driver/lib",
        ]
        .map(PathBuf::from),
    );
    v
}

/// Where a CUDA 13 runtime may be: toolkits, and the pip wheels PyTorch installs.
fn runtime_dirs() -> Vec<PathBuf> {
    let mut v = env_dirs("LD_LIBRARY_PATH");
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = std::env::var_os(var) {
            v.push(PathBuf::from(&h).join("lib64"));
            v.push(PathBuf::from(&h).join("targets/x86_64-linux/lib"));
        }
    }
    let mut toolkits: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cuda"))
        })
        .collect();
    toolkits.sort();
    for t in toolkits.into_iter().rev() {
        v.push(t.join("lib64"));
        v.push(t.join("targets/x86_64-linux/lib"));
    }
    // pip's nvidia-cuda-runtime wheel (what PyTorch uses): site-packages/nvidia/cu13/lib.
    let python = Command::new("python3")
        .args([
            "-c",
            "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ])
        .stderr(Stdio::null())
        .output();
    if let Ok(out) = python {
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let sp = PathBuf::from(l.trim());
            v.push(sp.join("nvidia/cu13/lib"));
            v.push(sp.join("nvidia/cuda_runtime/lib"));
        }
    }
    v
}

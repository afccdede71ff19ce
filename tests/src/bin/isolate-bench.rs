//! `isolate-bench`: what `libisolate.so` adds to each intercepted call, on the stand-in CUDA.
//!
//! Runs `threads N M` (`tests/programs/threads.c`: N threads, each M `alloc`/`free` pairs,
//! even threads through the runtime, odd ones through the driver path a static runtime uses)
//! without and with the preload in log mode, for 1 thread × 1,000,000 pairs and 8 threads ×
//! 125,000 pairs, interleaved (each round runs every case once, alternating which of the two
//! goes first), and prints the medians as a Markdown table:
//!
//! - wall time of the whole process without and with the preload, and their ratio;
//! - added ns per intercepted call: (with − without) / (2 × pairs);
//! - bytes per event: (trace size − preamble and header) / events, read with
//!   `isolate_trace::Reader`.
//!
//! Then the cost of call stacks (issue 13): `tests/programs/stacks.c bench` (200,000
//! allocation/free pairs made 30 native frames deep, built `-O2` without frame pointers) and
//! `tests/programs/stacks.py bench` (python3, 20,000 pairs 10 Python calls deep) in log mode with
//! `ISOLATE_STACK_DEPTH=30` and each `ISOLATE_STACKS` value, interleaved; printed side by side:
//! wall time, its ratio to stacks off, and the added ns per captured stack.
//!
//! ```text
//! cargo build --release --workspace && ./target/release/isolate-bench [--rounds N]
//! ```
//!
//! `libisolate.so` is taken from the directory of this executable (use the release build).
//! Not a test: the figures depend on the machine; the goals are printed beside them.

use isolate_trace::{Reader, Record};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const STANDIN_DIR: &str = env!("STANDIN_DIR");
const STANDIN_BIN: &str = env!("STANDIN_BIN");

/// (threads, pairs per thread).
const CASES: [(u64, u64); 2] = [(1, 1_000_000), (8, 125_000)];

/// Goals: added ns per call on one thread, at eight threads, bytes per event.
const GOAL_NS_ONE: f64 = 200.0;
const GOAL_NS_EIGHT: f64 = 2.0 * GOAL_NS_ONE;
const GOAL_BYTES: f64 = 32.0;

fn main() -> ExitCode {
    let mut rounds = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--rounds", Some(n)) if n > 0 => rounds = n,
            _ => {
                eprintln!("usage: isolate-bench [--rounds N]   (default 5)");
                return ExitCode::from(2);
            }
        }
    }
    match bench(rounds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("isolate-bench: FAILED: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// One run of the program.
struct Sample {
    wall: Duration,
    /// The program's own timing of its threads (`elapsed X s` on stderr).
    loop_s: f64,
    stdout: String,
    /// With the preload: events, bytes after the header, queue waits.
    trace: Option<TraceFigures>,
}

struct TraceFigures {
    events: u64,
    body_bytes: u64,
    queue_waits: u64,
}

#[derive(Default)]
struct Case {
    without: Vec<Sample>,
    with: Vec<Sample>,
}

fn bench(rounds: usize) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let lib = exe
        .parent()
        .ok_or("this executable has no directory")?
        .join("libisolate.so");
    if !lib.is_file() {
        return Err(format!(
            "{} not found: build it with `cargo build --release --workspace`",
            lib.display()
        ));
    }
    let program = Path::new(STANDIN_BIN).join("threads");
    if !program.is_file() {
        return Err(format!("{} not found", program.display()));
    }
    if exe.parent().and_then(|d| d.file_name()) != Some("release".as_ref()) {
        eprintln!(
            "warning: {} is not a release build: the figures mean little",
            exe.display()
        );
    }
    eprintln!(
        "isolate-bench: {} with and without {}, {rounds} interleaved rounds",
        program.display(),
        lib.display()
    );

    let mut cases: Vec<Case> = CASES.iter().map(|_| Case::default()).collect();
    for round in 0..rounds {
        for (i, &(threads, pairs)) in CASES.iter().enumerate() {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for preload in order {
                let s = run(&program, &lib, threads, pairs, preload)?;
                eprintln!(
                    "  round {} {threads:>2} x {pairs:>9} {:<7} {:>8.1} ms wall, {:>8.1} ms in the threads",
                    round + 1,
                    if preload { "with" } else { "without" },
                    ms(s.wall),
                    s.loop_s * 1e3
                );
                let c = &mut cases[i];
                if preload { &mut c.with } else { &mut c.without }.push(s);
            }
        }
    }

    // Both runs of a case print the same totals (the preload changes nothing the program sees).
    for (c, &(threads, pairs)) in cases.iter().zip(&CASES) {
        let want = &c.without[0].stdout;
        for s in c.without.iter().chain(&c.with) {
            if &s.stdout != want {
                return Err(format!(
                    "threads {threads} {pairs}: output differs between runs:\n{want}\n---\n{}",
                    s.stdout
                ));
            }
        }
        if !want.contains("failures 0") {
            return Err(format!("threads {threads} {pairs}: failures:\n{want}"));
        }
    }

    println!("{}", machine());
    println!();
    println!(
        "| threads × pairs | without (ms, range) | with (ms, range) | ratio | added ns per call | bytes per event | queue waits |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut added = Vec::new();
    let mut bytes = Vec::new();
    for (c, &(threads, pairs)) in cases.iter().zip(&CASES) {
        let without_all: Vec<f64> = c.without.iter().map(|s| ms(s.wall)).collect();
        let with_all: Vec<f64> = c.with.iter().map(|s| ms(s.wall)).collect();
        let (without, with) = (median(without_all.clone()), median(with_all.clone()));
        let calls = 2.0 * (threads * pairs) as f64;
        let ns = (with - without) * 1e6 / calls;
        let bpe = median(
            c.with
                .iter()
                .filter_map(|s| s.trace.as_ref())
                .map(|t| t.body_bytes as f64 / t.events as f64)
                .collect(),
        );
        let waits = median(
            c.with
                .iter()
                .filter_map(|s| s.trace.as_ref())
                .map(|t| t.queue_waits as f64)
                .collect(),
        );
        println!(
            "| {threads} × {} | {without:.1} ({}) | {with:.1} ({}) | {:.2}x | {ns:.0} | {bpe:.1} | {waits:.0} |",
            thousands(pairs),
            range(&without_all),
            range(&with_all),
            with / without
        );
        added.push(ns);
        bytes.push(bpe);
    }
    println!();
    println!(
        "Median of {rounds} runs each (range in brackets); queue waits: median count of hooks that found the writer's queue full and waited. Wall time is the whole process (start, the threads, exit \
         with the trace flushed); {} intercepted calls per case, plus one cudaFree(NULL) in main.",
        thousands(2 * CASES[0].0 * CASES[0].1)
    );
    // The program's own timing of the threads alone, for comparison.
    let loop_ns: Vec<f64> = cases
        .iter()
        .zip(&CASES)
        .map(|(c, &(t, p))| {
            let w = median(c.without.iter().map(|s| s.loop_s).collect());
            let x = median(c.with.iter().map(|s| s.loop_s).collect());
            (x - w) * 1e9 / (2.0 * (t * p) as f64)
        })
        .collect();
    println!(
        "Timed inside the program (threads only, no start or exit): {:.0} ns added per call on 1 thread, {:.0} on 8.",
        loop_ns[0], loop_ns[1]
    );
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "Goals: < {GOAL_NS_ONE:.0} ns per call on one thread: {:.0} ns, {}; \
         ≤ {GOAL_NS_EIGHT:.0} ns (2x) at eight threads: {:.0} ns ({:.2}x the one-thread figure), {}; \
         ≤ {GOAL_BYTES:.0} bytes per event: {:.1} / {:.1}, {}.",
        added[0],
        verdict(added[0] < GOAL_NS_ONE),
        added[1],
        added[1] / added[0],
        verdict(added[1] <= GOAL_NS_EIGHT),
        bytes[0],
        bytes[1],
        verdict(bytes.iter().all(|&b| b <= GOAL_BYTES)),
    );
    stacks_section(rounds, &lib)
}

/// Call stacks: the same work with `ISOLATE_STACKS` none, native, python and all.
fn stacks_section(rounds: usize, lib: &Path) -> Result<(), String> {
    const MODES: [&str; 4] = ["none", "native", "python", "all"];
    const C_PAIRS: u64 = 200_000;
    const PY_PAIRS: u64 = 20_000;
    let c_prog = Path::new(STANDIN_BIN).join("stacks");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/stacks.py");
    let python_ok = Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success());
    // 26 levels of stacks_bench + main + libc's two + _start: 30 native frames.
    let c_cmd = |mode: &str| {
        let mut c = Command::new(&c_prog);
        c.args(["bench", &C_PAIRS.to_string(), "26"]);
        (c, mode.to_string())
    };
    let py_cmd = |mode: &str| {
        let mut c = Command::new("python3");
        c.arg(&script).args(["bench", &PY_PAIRS.to_string()]);
        (c, mode.to_string())
    };
    let mut c_ms: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    let mut py_ms: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        for (i, m) in MODES.iter().enumerate() {
            let i = if round % 2 == 0 {
                i
            } else {
                MODES.len() - 1 - i
            };
            let m = if round % 2 == 0 { *m } else { MODES[i] };
            c_ms[i].push(stacks_run(c_cmd(m), lib)?);
            if python_ok {
                py_ms[i].push(stacks_run(py_cmd(m), lib)?);
            }
        }
        eprintln!("  stacks round {} done", round + 1);
    }
    println!();
    println!(
        "Call stacks (log mode, ISOLATE_STACK_DEPTH=30; median of {rounds} interleaved runs each):"
    );
    println!();
    println!(
        "| program | ISOLATE_STACKS | wall (ms, range) | ratio to none | added ns per stack |"
    );
    println!("|---|---|---:|---:|---:|");
    let mut rows = vec![(
        format!("stacks.c: {} pairs, 30 native frames", thousands(C_PAIRS)),
        &c_ms,
        2 * C_PAIRS,
    )];
    if python_ok {
        rows.push((
            format!(
                "stacks.py: {} pairs, 10 Python frames (python3)",
                thousands(PY_PAIRS)
            ),
            &py_ms,
            2 * PY_PAIRS,
        ));
    }
    for (name, ms_by_mode, stacks) in rows {
        let none = median(ms_by_mode[0].clone());
        for (i, m) in MODES.iter().enumerate() {
            let v = median(ms_by_mode[i].clone());
            let added = (v - none) * 1e6 / stacks as f64;
            println!(
                "| {name} | {m} | {v:.1} ({}) | {:.2}x | {} |",
                range(&ms_by_mode[i]),
                v / none,
                if i == 0 {
                    "–".to_string()
                } else {
                    format!("{added:.0}")
                }
            );
        }
    }
    if !python_ok {
        println!();
        println!("python3 not found: the Python rows are left out.");
    }
    Ok(())
}

/// One run under the preload with `ISOLATE_STACKS` = `mode`: its wall time, ms.
fn stacks_run((mut cmd, mode): (Command, String), lib: &Path) -> Result<f64, String> {
    let tmp = tempfile::Builder::new()
        .prefix("isolate-bench-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_") || k.starts_with("STANDIN_") || k.starts_with("LD_") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.current_dir(tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env("LD_LIBRARY_PATH", STANDIN_DIR)
        .env("LD_PRELOAD", lib)
        .env("ISOLATE_MODE", "log")
        .env("ISOLATE_STACKS", &mode)
        .env("ISOLATE_STACK_DEPTH", "30")
        .env("ISOLATE_TRACE", tmp.path().join("bench-%p.trace"));
    let t0 = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let wall = t0.elapsed();
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} (ISOLATE_STACKS={mode}) failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(ms(wall))
}

fn run(
    program: &Path,
    lib: &Path,
    threads: u64,
    pairs: u64,
    preload: bool,
) -> Result<Sample, String> {
    let tmp = tempfile::Builder::new()
        .prefix("isolate-bench-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let mut cmd = Command::new(program);
    cmd.arg(threads.to_string())
        .arg(pairs.to_string())
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_") || k.starts_with("STANDIN_") || k.starts_with("LD_") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.env("LD_LIBRARY_PATH", STANDIN_DIR);
    if preload {
        cmd.env("LD_PRELOAD", lib)
            .env("ISOLATE_MODE", "log")
            .env("ISOLATE_TRACE", tmp.path().join("bench-%p.trace"));
    }
    let t0 = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let wall = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!(
            "threads {threads} {pairs} ({}) failed: {}\n{stderr}",
            if preload { "with" } else { "without" },
            out.status
        ));
    }
    let loop_s = stderr
        .lines()
        .find_map(|l| l.strip_prefix("elapsed "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no `elapsed` line on stderr: {stderr}"))?;
    let trace = if preload {
        let traces: Vec<PathBuf> = std::fs::read_dir(tmp.path())
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|e| e.path())
            .collect();
        let [t] = &traces[..] else {
            return Err(format!("expected one trace, found {traces:?}"));
        };
        let figures = read_trace(t)?;
        let want = 2 * threads * pairs + 1;
        if figures.events != want {
            return Err(format!(
                "{}: {} events, expected {want}",
                t.display(),
                figures.events
            ));
        }
        Some(figures)
    } else {
        None
    };
    Ok(Sample {
        wall,
        loop_s,
        stdout,
        trace,
    })
}

fn read_trace(path: &Path) -> Result<TraceFigures, String> {
    let size = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    let mut r = Reader::open(path).map_err(|e| e.to_string())?;
    let header_end = r.offset();
    let (mut events, mut queue_waits, mut ended) = (0u64, 0u64, false);
    while let Some(rec) = r.next_record().map_err(|e| e.to_string())? {
        match rec {
            Record::Event(_) => events += 1,
            Record::End(e) => {
                queue_waits = e.stats.queue_waits;
                ended = true;
            }
            _ => {}
        }
    }
    if !ended || r.truncated_at().is_some() {
        return Err(format!("{}: the trace is not complete", path.display()));
    }
    Ok(TraceFigures {
        events,
        body_bytes: size - header_end,
        queue_waits,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.0}–{hi:.0}")
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The CPU and core count, for the table's caption.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // Other work on the machine moves these figures more than anything else: say how much.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    format!("Machine: {cpu}, {cores} cores available, load average {load} at the end.")
}

//! Helpers for the analyzer's tests: a trace builder and a way to run the binary.
#![allow(dead_code)]

use isolate_trace::{Api, Encoder, End, EndReason, Event, Header, Note, NoteKind, Record, Stats};
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod one_live;
pub mod pickle;
pub mod rusage;

// `skip`: the one test-skip helper, shared with `isolate_tests::skip` by file.
#[path = "../../../tests/src/skip.rs"]
mod skips;
#[allow(unused_imports)] // not every test file skips
pub use skips::skip;

/// The release `isolate` (built by cargo here: a no-op when it is up to date, as in CI after
/// its release build), for big traces the debug one takes minutes on; the debug binary, with a
/// line on stderr naming `who`, when cargo cannot build it.
pub fn release_isolate(who: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("analyzer/ has a parent");
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "isolate-analyzer",
            "--bin",
            "isolate",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output();
    out.ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "isolate")
                .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        })
        .unwrap_or_else(|| {
            eprintln!(
                "{who}: no release build (cargo failed or is missing); using the debug binary"
            );
            PathBuf::from(env!("CARGO_BIN_EXE_isolate"))
        })
}

/// The binary the memory tests measure: `ISOLATE_MEMORY_BIN`, else the release `isolate`
/// built for test `tag` ([`release_isolate`]).
pub fn memory_bin(tag: &str) -> PathBuf {
    match std::env::var_os("ISOLATE_MEMORY_BIN") {
        Some(p) => PathBuf::from(p),
        None => release_isolate(tag),
    }
}

/// Builds a trace event by event: sequence numbers count up from 0, each event is 1 µs after
/// the one before (from 1 ms), on thread 1000 of device 0, unless told otherwise.
pub struct TraceBuilder {
    out: Vec<u8>,
    enc: Encoder,
    pub seq: u64,
    pub ts: u64,
    pub tid: u32,
    pub device: i32,
    pub stream: u64,
}

pub fn header(pid: u32, argv: &[&str]) -> Header {
    Header {
        pid,
        ppid: 1,
        exe: "/usr/bin/prog".into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000_000,
        hostname: "testhost".into(),
        library_version: "0.1.0".into(),
        mode: "log".into(),
        ..Header::default()
    }
}

impl TraceBuilder {
    pub fn new() -> Self {
        Self::with_header(header(100, &["prog"]))
    }

    pub fn with_header(h: Header) -> Self {
        let mut out = Vec::new();
        Encoder::preamble(&h, &mut out);
        TraceBuilder {
            out,
            enc: Encoder::new(),
            seq: 0,
            ts: 1_000_000,
            tid: 1000,
            device: 0,
            stream: 0,
        }
    }

    /// Appends an event with the builder's defaults filled in; returns its sequence number.
    pub fn event(&mut self, mut e: Event) -> u64 {
        e.seq = self.seq;
        self.ts += 1000;
        e.ts_ns = self.ts;
        if e.tid == 0 {
            e.tid = self.tid;
        }
        if e.stream == 0 {
            e.stream = self.stream;
        }
        e.device = self.device;
        self.seq += 1;
        self.enc.encode(&Record::Event(e), &mut self.out);
        e.seq
    }

    pub fn call(&mut self, api: Api, ptr: u64, size: u64) -> u64 {
        self.event(Event {
            api,
            ptr,
            size,
            ..Event::default()
        })
    }

    /// [`Self::call`] made from call stack `stack` (a `Stack` record's id).
    pub fn call_from(&mut self, api: Api, ptr: u64, size: u64, stack: u32) -> u64 {
        self.event(Event {
            api,
            ptr,
            size,
            stack,
            ..Event::default()
        })
    }

    pub fn malloc(&mut self, ptr: u64, size: u64) -> u64 {
        self.call(Api::CudaMalloc, ptr, size)
    }

    pub fn free(&mut self, ptr: u64) -> u64 {
        self.call(Api::CudaFree, ptr, 0)
    }

    /// A free the driver refused with `result` (as it refuses a double free or a bad address).
    pub fn free_refused(&mut self, ptr: u64, result: i32) -> u64 {
        self.event(Event {
            api: Api::CudaFree,
            ptr,
            result,
            ..Event::default()
        })
    }

    /// A call that failed with `result`.
    pub fn fail(&mut self, api: Api, size: u64, result: i32) -> u64 {
        self.event(Event {
            api,
            size,
            result,
            ..Event::default()
        })
    }

    pub fn vmm(&mut self, api: Api, ptr: u64, size: u64, handle: u64, offset: u64) -> u64 {
        self.event(Event {
            api,
            ptr,
            size,
            handle,
            offset,
            ..Event::default()
        })
    }

    /// A VMM call the driver refused with `result`.
    pub fn vmm_refused(&mut self, api: Api, ptr: u64, size: u64, handle: u64, result: i32) -> u64 {
        self.event(Event {
            api,
            ptr,
            size,
            handle,
            result,
            ..Event::default()
        })
    }

    pub fn record(&mut self, r: Record) {
        self.enc.encode(&r, &mut self.out);
    }

    /// Python code objects `(id, file, name)`, each starting at line 1.
    pub fn py_codes(&mut self, codes: &[(u32, &str, &str)]) {
        for &(id, file, name) in codes {
            self.record(Record::PyCode(isolate_trace::PyCode {
                id,
                file: file.into(),
                name: name.into(),
                first_line: 1,
            }));
        }
    }

    /// Whole (not truncated) stacks `(id, frames)`, innermost frame first.
    pub fn stacks(&mut self, stacks: Vec<(u32, Vec<isolate_trace::Frame>)>) {
        for (id, frames) in stacks {
            self.record(Record::Stack(isolate_trace::Stack {
                id,
                frames,
                truncated: false,
            }));
        }
    }

    pub fn note(&mut self, kind: NoteKind, value: u64) {
        let ts = self.ts;
        self.record(Record::Note(Note {
            seq: self.seq,
            ts_ns: ts,
            kind,
            ptr: 0,
            size: 0,
            value,
            text: String::new(),
        }));
    }

    /// A note at the current time with thread id `ptr`, `value` and `text` (marks, regions).
    pub fn text_note(&mut self, kind: NoteKind, ptr: u64, value: u64, text: &str) {
        let ts = self.ts;
        self.record(Record::Note(Note {
            seq: self.seq,
            ts_ns: ts,
            kind,
            ptr,
            size: 0,
            value,
            text: text.into(),
        }));
    }

    /// The End record of a clean exit.
    pub fn end(&mut self, stats: Stats) {
        self.ts += 1000;
        let ts = self.ts;
        self.record(Record::End(End {
            ts_ns: ts,
            reason: EndReason::Exit,
            stats,
        }));
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.out.clone()
    }

    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.out).unwrap();
        p
    }
}

/// What a run of the binary gave.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\nstderr: {}", self.stdout, self.stderr))
    }
}

/// Every quoted string of a DOT file closes on its line: each line has an even number of
/// unescaped quotes.
pub fn assert_quotes_close_on_their_lines(dot: &str) {
    for line in dot.lines() {
        let (mut n, mut esc) = (0, false);
        for c in line.chars() {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => n += 1,
                _ => {}
            }
        }
        assert_eq!(n % 2, 0, "unbalanced quotes in {line:?}");
    }
}

/// Runs `isolate ARGS…` in `dir`.
pub fn isolate<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_isolate"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run isolate");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs `isolate export --format FORMAT TRACES… -o OUT` in `dir`.
pub fn export(dir: &Path, format: &str, traces: &[&str], out: &str) -> Out {
    let mut args = vec!["export", "--format", format];
    args.extend_from_slice(traces);
    args.extend(["-o", out]);
    isolate(dir, &args)
}

pub const A: u64 = 0x7f00_0000_0000;
pub const MIB: u64 = 1 << 20;

/// A training script's trace (format 2, Python stacks): a start-up of 5 s in which 20 weights
/// of 8 MiB are copied one by one (`load.py:8 in copy_weights` from `train.py:5`, 250 ms
/// apart, so no single pause is a third of the run), then [`LOOP_STEPS`] iterations of the
/// loop at `train.py:10 in <module>`, each with 60 activations of 1 MiB that come and go
/// (`model.py:30 in forward`) and a loss of 4 KiB (`train.py:11`). `regions`: each iteration
/// is also a region named `train_step` (as an NVTX range would be); otherwise the trace has
/// none.
pub fn loop_trace(regions: bool) -> TraceBuilder {
    use isolate_trace::Frame;
    let mut t = TraceBuilder::new();
    t.py_codes(&[
        (1, "train.py", "<module>"),
        (2, "model.py", "forward"),
        (3, "load.py", "copy_weights"),
    ]);
    let py = |code, line| Frame::Python { code, line };
    t.stacks(vec![
        (1, vec![py(3, 8), py(1, 5)]),   // the weights
        (2, vec![py(2, 30), py(1, 10)]), // activations
        (3, vec![py(1, 11)]),            // the loss
    ]);
    for i in 0..20 {
        t.call_from(Api::CudaMalloc, A + i * 8 * MIB, 8 * MIB, 1);
        t.ts += 250_000_000;
    }
    let act = A + 0x1_0000_0000;
    for k in 0..LOOP_STEPS {
        if regions {
            t.text_note(NoteKind::RegionPush, 7, 1, "train_step");
        }
        for i in 0..60 {
            t.call_from(Api::CudaMalloc, act + i * 0x10_0000, MIB, 2);
            t.ts += 50_000;
        }
        for i in 0..60 {
            t.free(act + i * 0x10_0000);
            t.ts += 20_000;
        }
        t.call_from(Api::CudaMalloc, act + 0x1000_0000 + k * 4096, 4096, 3);
        t.free(act + 0x1000_0000 + k * 4096);
        t.ts += 100_000;
        if regions {
            t.text_note(NoteKind::RegionPop, 7, 1, "train_step");
        }
    }
    t.end(Stats::default());
    t
}

/// Iterations of [`loop_trace`]'s loop.
pub const LOOP_STEPS: u64 = 10;

//! # isolate-tests: the integration harness
//!
//! Runs the C programs of `tests/programs/` (built by `tests/build.rs` against the stand-in CUDA
//! libraries of `tests/standin/`) with and without `libisolate.so` preloaded, each in a fresh
//! temporary directory, under a watchdog, and reads back the traces they wrote.
//!
//! ```no_run
//! use isolate_tests::Run;
//! // Both runs must print the same and end the same way; the traced one wrote one trace.
//! let both = Run::program("rt_basic").run_both();
//! let trace = both.traced.only_trace();
//! assert!(trace.is_complete());
//! // Every `ev` line the program printed is one event, in order, with the same result code.
//! trace.assert_events(&both.traced.expected(None));
//! ```
//!
//! The programs print one `ev API RC KEY=VALUE...` line per call the interposer must record
//! (see `tests/programs/common.h`); [`Expected`] parses them and [`check_events`] holds a
//! trace's events against them.

use isolate_trace::{End, EndReason, Event, Header, Reader, Record, StaleLaunch, Violation};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long any one run may take before the watchdog kills it and fails the test.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------------------------ skips

#[path = "skip.rs"]
mod skips;
pub use skips::skip;

// ------------------------------------------------------------------------------------ paths

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Where `tests/build.rs` put the stand-in `libcudart.so.13` and `libcuda.so.1`.
pub fn standin_dir() -> PathBuf {
    match option_env!("STANDIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => panic!(
            "STANDIN_DIR was not set at build time: tests/build.rs (the stand-in build) did not run"
        ),
    }
}

/// Where `tests/build.rs` put the compiled test programs (and `libnext.so`).
pub fn standin_bin() -> PathBuf {
    match option_env!("STANDIN_BIN") {
        Some(d) => PathBuf::from(d),
        None => panic!(
            "STANDIN_BIN was not set at build time: tests/build.rs (the stand-in build) did not run"
        ),
    }
}

/// The compiled test program `name` (`tests/programs/<name>.c`).
pub fn program_path(name: &str) -> PathBuf {
    let p = standin_bin().join(name);
    assert!(
        p.is_file(),
        "test program {} does not exist: is tests/programs/{name}.c built by tests/build.rs?",
        p.display()
    );
    p
}

/// `libisolate.so` of the profile this test binary was built with:
/// `target/<profile>/libisolate.so`, found beside the test binary's `deps/` directory, else
/// under `CARGO_MANIFEST_DIR/../target/<profile>`.
/// The analyzer binary (`isolate`), built beside `libisolate.so`.
pub fn analyzer_path() -> PathBuf {
    let bin = preload_path().with_file_name("isolate");
    assert!(
        bin.is_file(),
        "{} not found: run `cargo build --workspace` first",
        bin.display()
    );
    bin
}

pub fn preload_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let profile = profile_dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "debug".into());
    let candidates = [
        profile_dir.join("libisolate.so"),
        workspace_root()
            .join("target")
            .join(&profile)
            .join("libisolate.so"),
    ];
    for c in &candidates {
        if c.is_file() {
            warn_if_stale(c);
            return c.clone();
        }
    }
    let release = if profile == "release" {
        " --release"
    } else {
        ""
    };
    panic!(
        "libisolate.so not found (looked at {}): run `cargo build -p isolate-interposer{release}` first",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    );
}

fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry.metadata().ok().and_then(|m| m.modified().ok())
        };
        if t > newest {
            newest = t;
        }
    }
    newest
}

fn warn_if_stale(lib: &Path) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        let built = std::fs::metadata(lib).and_then(|m| m.modified()).ok();
        let src = ["interposer/src", "trace/src"]
            .iter()
            .filter_map(|d| newest_mtime(&workspace_root().join(d)))
            .max();
        if let (Some(built), Some(src)) = (built, src)
            && src > built
        {
            eprintln!(
                "warning: {} is older than the interposer's sources: run `cargo build -p isolate-interposer`",
                lib.display()
            );
        }
    });
}

// ------------------------------------------------------------------------------------ runs

type Setup = Arc<dyn Fn(&Path) + Send + Sync>;

/// A program to run: the builder. Cheap to clone, so one builder can run with and without
/// the preload.
#[derive(Clone)]
pub struct Run {
    program: String,
    args: Vec<String>,
    envs: Vec<(String, Option<String>)>,
    preload: bool,
    extra_preloads: Vec<PathBuf>,
    trace: Option<String>,
    timeout: Duration,
    setup: Option<Setup>,
}

impl Run {
    /// The test program `tests/programs/<name>.c`, preloaded with `libisolate.so`, writing
    /// `ISOLATE_TRACE=<tmp>/isolate-%p.trace`, with `LD_LIBRARY_PATH` = the stand-in libraries,
    /// in a fresh temporary working directory.
    pub fn program(name: &str) -> Run {
        Run {
            program: name.to_string(),
            args: Vec::new(),
            envs: Vec::new(),
            preload: true,
            extra_preloads: Vec::new(),
            trace: None,
            timeout: DEFAULT_TIMEOUT,
            setup: None,
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Run {
        self.args.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Run {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets a variable; `{dir}` in the value stands for the run's temporary directory.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Run {
        self.envs.push((k.into(), Some(v.into())));
        self
    }

    /// Removes a variable (also one the harness sets, such as `ISOLATE_TRACE`).
    pub fn env_remove(mut self, k: impl Into<String>) -> Run {
        self.envs.push((k.into(), None));
        self
    }

    /// With (`true`, the default) or without `libisolate.so` in `LD_PRELOAD`.
    pub fn preload(mut self, on: bool) -> Run {
        self.preload = on;
        self
    }

    /// Another library in `LD_PRELOAD`, after `libisolate.so` (present with or without it).
    pub fn also_preload(mut self, lib: impl Into<PathBuf>) -> Run {
        self.extra_preloads.push(lib.into());
        self
    }

    /// `ISOLATE_TRACE`; `{dir}` stands for the run's temporary directory.
    pub fn trace(mut self, pattern: impl Into<String>) -> Run {
        self.trace = Some(pattern.into());
        self
    }

    /// The watchdog: kill the run (and fail) after this long.
    pub fn timeout(mut self, t: Duration) -> Run {
        self.timeout = t;
        self
    }

    /// Runs `f` in the fresh temporary directory before the program starts.
    pub fn setup(mut self, f: impl Fn(&Path) + Send + Sync + 'static) -> Run {
        self.setup = Some(Arc::new(f));
        self
    }

    /// The command line, for messages.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.envs {
            match v {
                Some(v) => write!(s, "{k}={v} ").unwrap(),
                None => write!(s, "-u {k} ").unwrap(),
            }
        }
        if !self.preload {
            s.push_str("(no preload) ");
        }
        s.push_str(&self.program);
        for a in &self.args {
            write!(s, " {a}").unwrap();
        }
        s
    }

    fn command(&self, dir: &Path) -> Command {
        let subst = |v: &str| v.replace("{dir}", &dir.to_string_lossy());
        let mut cmd = Command::new(program_path(&self.program));
        cmd.args(&self.args).current_dir(dir);
        // A clean slate: nothing of the outer environment that changes what is measured.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("ISOLATE_")
                || k.starts_with("STANDIN_")
                || k.starts_with("LD_")
                || matches!(k.as_ref(), "RANK" | "LOCAL_RANK" | "WORLD_SIZE")
            {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.env("LD_LIBRARY_PATH", standin_dir());
        let mut preloads: Vec<OsString> = Vec::new();
        if self.preload {
            preloads.push(preload_path().into_os_string());
        }
        preloads.extend(
            self.extra_preloads
                .iter()
                .map(|p| p.clone().into_os_string()),
        );
        if !preloads.is_empty() {
            cmd.env("LD_PRELOAD", preloads.join(std::ffi::OsStr::new(":")));
        }
        let trace = self
            .trace
            .clone()
            .unwrap_or_else(|| "{dir}/isolate-%p.trace".into());
        cmd.env("ISOLATE_TRACE", subst(&trace));
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, subst(v)),
                None => cmd.env_remove(k),
            };
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Its own process group, so that the watchdog takes its children too; no core files.
        cmd.process_group(0);
        unsafe {
            cmd.pre_exec(|| {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                Ok(())
            });
        }
        cmd
    }

    /// Starts the program and returns at once (for tests that signal it while it runs).
    pub fn spawn(self) -> Running {
        let dir = tempfile::Builder::new()
            .prefix("isolate-test-")
            .tempdir()
            .expect("temporary directory");
        if let Some(f) = &self.setup {
            f(dir.path());
        }
        let mut cmd = self.command(dir.path());
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.describe()));
        let stdout = Pipe::read(child.stdout.take().unwrap());
        let stderr = Pipe::read(child.stderr.take().unwrap());
        Running {
            pid: child.id(),
            child,
            stdout,
            stderr,
            dir,
            started,
            deadline: started + self.timeout,
            describe: self.describe(),
        }
    }

    /// Runs the program to its end (or the watchdog's).
    pub fn run(self) -> Output {
        self.spawn().wait()
    }

    /// Runs it without, then with the preload; both must print the same stdout and end the
    /// same way (exit code or signal).
    pub fn run_both(self) -> Both {
        let plain = self.clone().preload(false).run();
        let traced = self.preload(true).run();
        traced.assert_same_as(&plain);
        Both { plain, traced }
    }
}

/// A pipe read to its end by a thread, visible while it fills.
struct Pipe {
    buf: Arc<Mutex<Vec<u8>>>,
    first_byte: Arc<Mutex<Option<Instant>>>,
    thread: JoinHandle<()>,
}

impl Pipe {
    fn read(mut r: impl Read + Send + 'static) -> Pipe {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let first_byte = Arc::new(Mutex::new(None));
        let (b, f) = (buf.clone(), first_byte.clone());
        let thread = std::thread::spawn(move || {
            let mut chunk = [0u8; 1 << 16];
            loop {
                match r.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut first = f.lock().unwrap();
                        if first.is_none() {
                            *first = Some(Instant::now());
                        }
                        b.lock().unwrap().extend_from_slice(&chunk[..n]);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        });
        Pipe {
            buf,
            first_byte,
            thread,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf.lock().unwrap()).into_owned()
    }
}

/// A program that is running.
pub struct Running {
    pid: u32,
    child: Child,
    stdout: Pipe,
    stderr: Pipe,
    dir: tempfile::TempDir,
    started: Instant,
    deadline: Instant,
    describe: String,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The run's temporary directory (also its working directory).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What it printed so far.
    pub fn stdout_so_far(&self) -> String {
        self.stdout.text()
    }

    /// When its first byte of stdout arrived.
    pub fn first_output_at(&self) -> Option<Instant> {
        *self.stdout.first_byte.lock().unwrap()
    }

    /// Waits until `pred(stdout so far)` holds (fails at the watchdog's deadline or when the
    /// program ends first).
    pub fn wait_for_stdout(&mut self, what: &str, pred: impl Fn(&str) -> bool) {
        loop {
            if pred(&self.stdout.text()) {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                if pred(&self.stdout.text()) {
                    return;
                }
                panic!(
                    "{}: ended ({st}) before {what}\nstdout:\n{}\nstderr:\n{}",
                    self.describe,
                    tail(&self.stdout.text()),
                    self.stderr.text()
                );
            }
            if Instant::now() > self.deadline {
                self.kill_group();
                panic!(
                    "{}: watchdog: no {what} after {:?}\nstdout:\n{}\nstderr:\n{}",
                    self.describe,
                    self.deadline - self.started,
                    tail(&self.stdout.text()),
                    self.stderr.text()
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Sends `sig` to the program (not to its children).
    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid as i32, sig) };
    }

    fn kill_group(&mut self) {
        unsafe { libc::kill(-(self.pid as i32), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the end (the program's, and that of whatever holds its output open), then
    /// reads the traces in its directory.
    pub fn wait(mut self) -> Output {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => panic!("{}: wait failed: {e}", self.describe),
            }
            if Instant::now() > self.deadline {
                self.kill_group();
                panic!(
                    "{}: watchdog: still running after {:?}, killed\nstdout:\n{}\nstderr:\n{}",
                    self.describe,
                    self.deadline - self.started,
                    tail(&self.stdout.text()),
                    tail(&self.stderr.text())
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let ended = Instant::now();
        // A daemonised grandchild may still hold stdout open.
        while !(self.stdout.thread.is_finished() && self.stderr.thread.is_finished()) {
            if Instant::now() > self.deadline {
                unsafe { libc::kill(-(self.pid as i32), libc::SIGKILL) };
                panic!(
                    "{}: watchdog: exited ({status}) but its output stayed open (a child still running?)\nstdout:\n{}",
                    self.describe,
                    tail(&self.stdout.text())
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let stdout = self.stdout.text();
        let stderr = self.stderr.text();
        let first_output = *self.stdout.first_byte.lock().unwrap();
        let traces = read_traces(self.dir.path());
        Output {
            describe: self.describe,
            pid: self.pid,
            status,
            stdout,
            stderr,
            traces,
            elapsed: ended - self.started,
            first_output,
            ended,
            dir: self.dir,
        }
    }
}

fn tail(s: &str) -> String {
    const MAX: usize = 4000;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut start = s.len() - MAX;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("[… {} bytes …]{}", start, &s[start..])
}

/// Every trace file (a name containing `.trace`) in `dir`, by name.
pub fn read_traces(dir: &Path) -> Vec<Trace> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.symlink_metadata().is_ok_and(|m| m.is_file())
                        && p.file_name()
                            .is_some_and(|n| n.to_string_lossy().contains(".trace"))
                })
                .collect()
        })
        .unwrap_or_default();
    paths.sort();
    paths.iter().map(|p| Trace::read(p)).collect()
}

/// A finished run.
pub struct Output {
    pub describe: String,
    pub pid: u32,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Every trace written in the run's directory, by file name.
    pub traces: Vec<Trace>,
    pub elapsed: Duration,
    /// When the first byte of stdout arrived, and when the program ended.
    pub first_output: Option<Instant>,
    pub ended: Instant,
    /// The run's temporary directory (removed when the output is dropped).
    pub dir: tempfile::TempDir,
}

/// The same program without and with the preload.
pub struct Both {
    pub plain: Output,
    pub traced: Output,
}

impl Output {
    /// Exit code, `None` when a signal ended it.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The signal that ended it.
    pub fn signal(&self) -> Option<i32> {
        self.status.signal()
    }

    fn context(&self) -> String {
        format!(
            "{} ({})\n--- stdout:\n{}\n--- stderr:\n{}\n--- traces: {}",
            self.describe,
            self.status,
            tail(&self.stdout),
            tail(&self.stderr),
            self.traces
                .iter()
                .map(|t| t.summary())
                .collect::<Vec<_>>()
                .join("; ")
        )
    }

    /// Panics (with stdout, stderr and the traces) unless it exited with status 0.
    pub fn assert_success(&self) -> &Output {
        assert!(
            self.status.success(),
            "expected exit status 0: {}",
            self.context()
        );
        self
    }

    /// Panics unless `other` printed the same stdout and ended the same way.
    pub fn assert_same_as(&self, other: &Output) {
        if self.stdout != other.stdout {
            panic!(
                "stdout differs\n{}\n=== against\n{}\n=== first difference:\n{}",
                self.context(),
                other.context(),
                first_difference(&self.stdout, &other.stdout)
            );
        }
        assert_eq!(
            (self.code(), self.signal()),
            (other.code(), other.signal()),
            "exit status differs ({} vs {})\n{}\n=== against\n{}",
            self.status,
            other.status,
            self.context(),
            other.context()
        );
    }

    /// The one trace of the run (panics when there are none or several).
    pub fn only_trace(&self) -> &Trace {
        assert_eq!(
            self.traces.len(),
            1,
            "expected exactly one trace: {}",
            self.context()
        );
        &self.traces[0]
    }

    /// The traces written by process `pid`, by file name.
    pub fn traces_of(&self, pid: u32) -> Vec<&Trace> {
        self.traces.iter().filter(|t| t.header.pid == pid).collect()
    }

    /// The `ev` lines of stdout with this tag (`None`: untagged lines).
    pub fn expected(&self, tag: Option<&str>) -> Vec<Expected> {
        Expected::parse_all(&self.stdout)
            .into_iter()
            .filter(|e| e.tag.as_deref() == tag)
            .collect()
    }

    /// Every `ev` line of stdout, whatever its tag, in order.
    pub fn expected_all(&self) -> Vec<Expected> {
        Expected::parse_all(&self.stdout)
    }

    /// Every line of stdout that starts with `prefix`, without the prefix.
    pub fn lines_starting(&self, prefix: &str) -> Vec<&str> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .collect()
    }

    /// Holds `trace` against the `ev` lines tagged `tag`, with the run's output in the message.
    pub fn assert_trace_matches(&self, trace: &Trace, tag: Option<&str>) {
        let expected = self.expected(tag);
        if let Err(e) = check_events(&trace.events_by_seq(), &expected) {
            panic!(
                "trace {} does not match the program's ev lines (tag {tag:?}): {e}\n{}",
                trace.path.display(),
                self.context()
            );
        }
    }
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: {x:?}\n   vs: {y:?}", i + 1);
        }
    }
    format!(
        "one is a prefix of the other ({} vs {} lines)",
        a.lines().count(),
        b.lines().count()
    )
}

// ------------------------------------------------------------------------------------ traces

/// One trace file, decoded.
#[derive(Debug)]
pub struct Trace {
    pub path: PathBuf,
    pub header: Header,
    pub records: Vec<Record>,
    /// The byte at which a partial last record starts.
    pub truncated_at: Option<u64>,
    /// Why reading stopped early (not a trace, corrupt).
    pub error: Option<String>,
}

impl Trace {
    pub fn read(path: &Path) -> Trace {
        let mut t = Trace {
            path: path.to_path_buf(),
            header: Header::default(),
            records: Vec::new(),
            truncated_at: None,
            error: None,
        };
        let mut r = match Reader::open(path) {
            Ok(r) => r,
            Err(e) => {
                t.error = Some(e.to_string());
                return t;
            }
        };
        t.header = r.header().clone();
        loop {
            match r.next_record() {
                Ok(Some(rec)) => t.records.push(rec),
                Ok(None) => break,
                Err(e) => {
                    t.error = Some(e.to_string());
                    break;
                }
            }
        }
        t.truncated_at = r.truncated_at();
        t
    }

    /// The events, in file order.
    pub fn events(&self) -> Vec<Event> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Event(e) => Some(*e),
                _ => None,
            })
            .collect()
    }

    /// `isolate summary --json` of this trace, parsed (the analyzer built beside the library).
    pub fn analyzer_summary(&self) -> serde_json::Value {
        let out = Command::new(analyzer_path())
            .args(["summary", "--json"])
            .arg(&self.path)
            .output()
            .expect("running the analyzer");
        assert!(
            out.status.success(),
            "isolate summary --json {} failed: {}",
            self.path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout)))
    }

    /// The analyzer finds nothing wrong with a correct program's trace: no invalid or double
    /// free, no lost allocation, no sequence number out of reach. Returns the summary.
    pub fn assert_no_false_findings(&self) -> serde_json::Value {
        let s = self.analyzer_summary();
        for field in ["invalid_free_count", "double_free_count", "lost"] {
            assert_eq!(
                s[field].as_u64(),
                Some(0),
                "{field} in the summary of a correct program's trace {}: {:#}",
                self.path.display(),
                s[if field == "lost" {
                    "lost"
                } else {
                    "invalid_frees"
                }]
            );
        }
        assert_eq!(
            s["sequence"]["late"].as_u64(),
            Some(0),
            "records too far out of order in {}",
            self.path.display()
        );
        s
    }

    /// Records (with a sequence number) that come after a higher number in the file: how far
    /// the file's order is from sequence order.
    pub fn out_of_order(&self) -> usize {
        let mut max = None::<u64>;
        let mut n = 0;
        for seq in self.records.iter().filter_map(Record::seq) {
            if max.is_some_and(|m| seq < m) {
                n += 1;
            }
            max = max.max(Some(seq));
        }
        n
    }

    /// The library's exit note on `topic` (a `Cost` note), if it wrote one.
    pub fn cost_note(&self, topic: isolate_trace::CostTopic) -> Option<&isolate_trace::Note> {
        self.records.iter().find_map(|r| match r {
            Record::Note(n) if isolate_trace::CostTopic::of(n) == Some(topic) => Some(n),
            _ => None,
        })
    }

    /// The stale-write records, in file order.
    pub fn violations(&self) -> Vec<Violation> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Violation(v) => Some(v.clone()),
                _ => None,
            })
            .collect()
    }

    /// The stale-launch records, in file order.
    pub fn stale_launches(&self) -> Vec<StaleLaunch> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::StaleLaunch(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    /// Guard mode's stale-value records, in file order.
    pub fn stale_values(&self) -> Vec<StaleLaunch> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::StaleValue(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    /// The events, by sequence number.
    pub fn events_by_seq(&self) -> Vec<Event> {
        let mut ev = self.events();
        ev.sort_by_key(|e| e.seq);
        ev
    }

    /// How many events name `api` (its exported name: `cudaMalloc`, `cuMemAlloc_v2`, …).
    pub fn count(&self, api: &str) -> usize {
        self.records
            .iter()
            .filter(|r| matches!(r, Record::Event(e) if e.api.name() == api))
            .count()
    }

    /// Events per API name.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for r in &self.records {
            if let Record::Event(e) = r {
                *m.entry(e.api.name()).or_default() += 1;
            }
        }
        m
    }

    /// The events of one thread, in file order.
    pub fn events_of_thread(&self, tid: u32) -> Vec<Event> {
        self.events().into_iter().filter(|e| e.tid == tid).collect()
    }

    /// The threads that have events, in order of their first event.
    pub fn threads(&self) -> Vec<u32> {
        let mut seen = Vec::new();
        for e in self.events() {
            if !seen.contains(&e.tid) {
                seen.push(e.tid);
            }
        }
        seen
    }

    /// The `End` record, if it is the last record.
    pub fn end(&self) -> Option<&End> {
        match self.records.last() {
            Some(Record::End(e)) => Some(e),
            _ => None,
        }
    }

    /// Why the trace ended, if it ended properly.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.end().map(|e| e.reason)
    }

    /// Read to the end without error or partial record, and closed by an `End` record.
    pub fn is_complete(&self) -> bool {
        self.error.is_none() && self.truncated_at.is_none() && self.end().is_some()
    }

    /// One line about the trace, for messages.
    pub fn summary(&self) -> String {
        format!(
            "{} (pid {}, ppid {}, {} records, end {:?}, truncated {:?}, error {:?}, counts {:?})",
            self.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            self.header.pid,
            self.header.ppid,
            self.records.len(),
            self.end_reason(),
            self.truncated_at,
            self.error,
            self.counts()
        )
    }

    /// Panics unless the trace is complete and ended for `reason`.
    pub fn assert_complete(&self, reason: EndReason) {
        assert!(
            self.is_complete(),
            "trace is not complete: {}",
            self.summary()
        );
        assert_eq!(
            self.end_reason(),
            Some(reason),
            "trace ended for another reason: {}",
            self.summary()
        );
    }

    /// Panics unless the events match `expected` (see [`check_events`]).
    pub fn assert_events(&self, expected: &[Expected]) {
        if let Err(e) = check_events(&self.events_by_seq(), expected) {
            panic!(
                "trace {} does not match: {e}\n{}",
                self.path.display(),
                self.summary()
            );
        }
    }
}

// ------------------------------------------------------------------------------------ expected

/// A value in an `ev` line: a number, or a label (plus an offset) bound on first use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Num(i128),
    Label(String, u64),
}

/// One `[TAG:] ev API RC KEY=VALUE...` line of a program's stdout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub tag: Option<String>,
    pub api: String,
    pub result: i32,
    pub fields: Vec<(String, Value)>,
    pub line: String,
}

/// The fields an `ev` line may name.
pub const FIELDS: &[&str] = &[
    "ptr", "size", "pitch", "stream", "handle", "offset", "flags", "device",
];

fn parse_num(s: &str) -> Option<i128> {
    if let Some(h) = s.strip_prefix("0x") {
        i128::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

impl Expected {
    /// Parses one line; `None` when it is not an `ev` line. Panics on a malformed `ev` line.
    pub fn parse(line: &str) -> Option<Expected> {
        let mut words: Vec<&str> = line.split_whitespace().collect();
        let mut tag = None;
        if words.len() >= 2 && words[0].ends_with(':') && words[1] == "ev" {
            tag = Some(words[0].trim_end_matches(':').to_string());
            words.remove(0);
        }
        if words.first() != Some(&"ev") {
            return None;
        }
        let bad = |why: &str| -> ! { panic!("malformed ev line ({why}): {line:?}") };
        if words.len() < 3 {
            bad("too short");
        }
        let api = words[1].to_string();
        if isolate_trace::Api::from_name(&api).is_none() {
            bad("unknown API");
        }
        let result = parse_num(words[2]).unwrap_or_else(|| bad("result")) as i32;
        let mut fields = Vec::new();
        for w in &words[3..] {
            let (k, v) = w.split_once('=').unwrap_or_else(|| bad("field"));
            if !FIELDS.contains(&k) {
                bad("unknown field");
            }
            let value = if let Some(l) = v.strip_prefix('@') {
                match l.split_once('+') {
                    Some((name, off)) => Value::Label(
                        name.to_string(),
                        parse_num(off).unwrap_or_else(|| bad("label offset")) as u64,
                    ),
                    None => Value::Label(l.to_string(), 0),
                }
            } else {
                Value::Num(parse_num(v).unwrap_or_else(|| bad("number")))
            };
            fields.push((k.to_string(), value));
        }
        Some(Expected {
            tag,
            api,
            result,
            fields,
            line: line.to_string(),
        })
    }

    /// Every `ev` line of `stdout`, in order.
    pub fn parse_all(stdout: &str) -> Vec<Expected> {
        stdout.lines().filter_map(Expected::parse).collect()
    }
}

/// The value of field `key` of `e`, as the `ev` lines write it.
pub fn field(e: &Event, key: &str) -> i128 {
    match key {
        "ptr" => e.ptr as i128,
        "size" => e.size as i128,
        "pitch" => e.pitch as i128,
        "stream" => e.stream as i128,
        "handle" => e.handle as i128,
        "offset" => e.offset as i128,
        "flags" => e.flags as i128,
        "device" => e.device as i128,
        _ => panic!("unknown field {key}"),
    }
}

/// Holds `events` (in sequence order) against `expected`, one to one and in order: the same
/// API, the same result code, and every field the line names. A label takes the value of its
/// first use; every later use must see the same value.
pub fn check_events(events: &[Event], expected: &[Expected]) -> Result<(), String> {
    let mut labels: HashMap<String, i128> = HashMap::new();
    let listing = || {
        let mut s = String::new();
        let n = events.len().max(expected.len());
        for i in 0..n.min(400) {
            let e = events
                .get(i)
                .map(|e| format!("{} {} ptr={:#x} size={}", e.api, e.result, e.ptr, e.size))
                .unwrap_or_else(|| "-".into());
            let x = expected.get(i).map(|x| x.line.as_str()).unwrap_or("-");
            writeln!(s, "  {i:4}: {e:50} | {x}").unwrap();
        }
        s
    };
    for (i, x) in expected.iter().enumerate() {
        let Some(e) = events.get(i) else {
            return Err(format!(
                "{} events, {} expected; first missing: {}\n{}",
                events.len(),
                expected.len(),
                x.line,
                listing()
            ));
        };
        let fail = |why: String| {
            Err(format!(
                "event {i} (seq {}) {why}\n  line:  {}\n  event: {e:?}\n{}",
                e.seq,
                x.line,
                listing()
            ))
        };
        if e.api.name() != x.api {
            return fail(format!("is {} where {} was expected", e.api, x.api));
        }
        if e.result != x.result {
            return fail(format!(
                "has result {} where the caller got {}",
                e.result, x.result
            ));
        }
        for (k, v) in &x.fields {
            let got = field(e, k);
            match v {
                Value::Num(n) => {
                    if got != *n {
                        return fail(format!("has {k}={got} where {n} was expected"));
                    }
                }
                Value::Label(name, off) => {
                    let base = got - *off as i128;
                    match labels.get(name) {
                        None => {
                            if got == 0 {
                                return fail(format!("has {k}=0 where @{name} was expected"));
                            }
                            labels.insert(name.clone(), base);
                        }
                        Some(&b) if b != base => {
                            return fail(format!(
                                "has {k}={got:#x} where @{name}+{off} = {:#x} was expected",
                                b + *off as i128
                            ));
                        }
                        Some(_) => {}
                    }
                }
            }
        }
    }
    if events.len() > expected.len() {
        let extra = &events[expected.len()];
        return Err(format!(
            "{} events, {} expected; first extra: {extra:?}\n{}",
            events.len(),
            expected.len(),
            listing()
        ));
    }
    Ok(())
}

/// Parses the number after `key` in a line like `... key 123 ...` or `... key=123 ...`.
pub fn number_after(text: &str, key: &str) -> Option<i64> {
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            if let Some(v) = w.strip_prefix(key).and_then(|r| r.strip_prefix('='))
                && let Ok(n) = v.parse()
            {
                return Some(n);
            }
            if *w == key
                && let Some(n) = words.get(i + 1).and_then(|v| v.parse().ok())
            {
                return Some(n);
            }
        }
    }
    None
}

/// A pseudo-terminal: the master, and the slave (opened without becoming anyone's controlling
/// terminal here).
pub struct Pty {
    pub master: std::fs::File,
    pub slave: std::os::fd::OwnedFd,
}

/// Opens a pseudo-terminal pair.
pub fn pty() -> Pty {
    use std::os::fd::FromRawFd;
    // SAFETY: plain calls; the descriptors are owned once open.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = std::fs::File::from_raw_fd(m);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        assert!(
            s >= 0,
            "open the pty slave: {}",
            std::io::Error::last_os_error()
        );
        Pty {
            master,
            slave: std::os::fd::OwnedFd::from_raw_fd(s),
        }
    }
}

/// Between fork and exec, with stdin already the pty slave: a new session whose controlling
/// terminal it is (its foreground process group is then this process's), as a shell runs a
/// foreground job. Async-signal-safe.
pub fn take_stdin_as_controlling_terminal() -> std::io::Result<()> {
    // SAFETY: plain system calls.
    if unsafe { libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 } {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolate_trace::Api;

    #[test]
    fn parses_ev_lines() {
        let x = Expected::parse("child: ev cudaMalloc 2 size=16 ptr=@a+8 device=-1").unwrap();
        assert_eq!(x.tag.as_deref(), Some("child"));
        assert_eq!(x.api, "cudaMalloc");
        assert_eq!(x.result, 2);
        assert_eq!(
            x.fields,
            vec![
                ("size".into(), Value::Num(16)),
                ("ptr".into(), Value::Label("a".into(), 8)),
                ("device".into(), Value::Num(-1)),
            ]
        );
        assert!(Expected::parse("cudaMalloc 0").is_none());
        assert!(Expected::parse("say: hello ev").is_none());
    }

    #[test]
    fn labels_bind_once() {
        let ev = |api, ptr| Event {
            api,
            ptr,
            ..Event::default()
        };
        let x = Expected::parse_all("ev cudaMalloc 0 ptr=@a\nev cudaFree 0 ptr=@a\n");
        assert!(check_events(&[ev(Api::CudaMalloc, 0x10), ev(Api::CudaFree, 0x10)], &x).is_ok());
        assert!(check_events(&[ev(Api::CudaMalloc, 0x10), ev(Api::CudaFree, 0x20)], &x).is_err());
        assert!(check_events(&[ev(Api::CudaMalloc, 0x10)], &x).is_err());
    }

    #[test]
    fn numbers_after_keys() {
        assert_eq!(
            number_after("a b=3\nstandin_param_info_calls 7", "b"),
            Some(3)
        );
        assert_eq!(
            number_after("x standin_param_info_calls 7", "standin_param_info_calls"),
            Some(7)
        );
    }
}

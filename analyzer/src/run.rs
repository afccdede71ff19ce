//! `isolate run`: runs a command with `libisolate.so` preloaded, and names the traces it wrote.
//!
//! # Signals
//!
//! `isolate run -- CMD` must look like `CMD` to whoever started it and to whoever signals it.
//! While the command runs, `isolate` does not die of SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 or
//! SIGUSR2 ([`FORWARDED`]): it passes them on to the command, waits for the command to end, and
//! then ends the same way: the command's exit status, or killed by the signal that killed the
//! command (default action restored, no core file of its own), so that a shell reports "killed by
//! signal N" (status 128+N) and a script stopped by `^C` stops, as with `timeout --foreground`.
//!
//! **The command stays in `isolate`'s process group.** It is then in the terminal's foreground
//! group as a command run directly is: it can read the terminal and change its modes, and `^Z`
//! stops both processes and `fg` continues both, with no job control of our own. Its own process
//! group would leave it in the background (stopped by SIGTTIN when it reads the terminal) or make
//! `isolate` do a shell's job control.
//!
//! **So signals are told apart by who sent them** (`si_code`, from `sigwaitinfo`):
//!
//! - from the kernel (`si_code` > 0, `SI_KERNEL`): the terminal's `^C` (SIGINT) and `^\`
//!   (SIGQUIT), and the SIGHUP of a terminal that goes away, go to the whole foreground process
//!   group, so the command has its own copy: `isolate` drops them, and `^C` is delivered once.
//!   The exception is the SIGHUP the kernel sends to a session leader alone when its terminal
//!   hangs up: when `isolate` leads its session (`ssh -t host isolate run …`, `setsid`), it is
//!   passed on;
//! - from a process (`si_code` ≤ 0: `kill`, `sigqueue`, `tgkill`): passed on to the command's
//!   process with `kill(pid, sig)`, not to its group, as `kill` of the command itself would
//!   (its children are not signalled). A signal the command sent itself (to its process group,
//!   which holds `isolate`, or to its parent) is not sent back to it.
//!
//! A signal a process sends to the whole process group (`kill -TERM -PGID`, a shell's SIGHUP to
//! its jobs, a supervisor that signals every process of a cgroup) reaches the command twice:
//! directly, and through `isolate`, which cannot tell it from one sent to its own pid. The first
//! normally ends the command; one that handles the signal sees it twice.
//!
//! Other signals act on `isolate` as on any process (SIGTSTP and SIGCONT from the terminal reach
//! both). SIGKILL cannot be caught: it leaves the command running, without its parent.
//!
//! # Traces
//!
//! Before the command starts, `isolate` checks that traces can be created where the pattern
//! puts them ([`check_trace_dir`]: the directory exists and can be written to), and lists the
//! files the pattern already matches ([`trace_files`]: `%p` and `%r` stand for any number, `%h`
//! for this host, and the `.1`, `.2` the library adds to a name that exists are matched too).
//! While the command runs, its descendants are read from `/proc/PID/task/TID/children` every
//! [`POLL_MS`] ms and whenever a child ends. Afterwards, the files the pattern matches that were
//! not there before are the run's when their header's pid is the command's or a descendant's,
//! or their header's parent pid is that of a process of the run (followed from trace to trace,
//! so that a grandchild whose parent lived too briefly to be seen is still found through the
//! parent's trace). Other new files (another job writing to the same directory) are counted,
//! not listed ([`traces_report`]).

use crate::Error;
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

/// The file name of the preload library.
pub const LIBRARY: &str = "libisolate.so";

/// The modes `ISOLATE_MODE` accepts.
pub const MODES: [&str; 3] = ["log", "isolate", "off"];

/// The library's mode when `ISOLATE_MODE` is not set.
pub const DEFAULT_MODE: &str = "log";

/// The library's trace pattern when `ISOLATE_TRACE` is not set.
pub const DEFAULT_TRACE: &str = "isolate-%p.trace";

/// What to run and how.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The library to preload (see [`library_beside`]).
    pub library: PathBuf,
    /// `ISOLATE_MODE`, when given.
    pub mode: Option<String>,
    /// `ISOLATE_TRACE`, when given.
    pub trace: Option<String>,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

impl RunOptions {
    /// The mode the command runs in: `--mode`, else `ISOLATE_MODE` of this environment (which
    /// the command inherits), else [`DEFAULT_MODE`].
    pub fn effective_mode(&self) -> String {
        self.mode
            .clone()
            .or_else(|| std::env::var("ISOLATE_MODE").ok())
            .unwrap_or_else(|| DEFAULT_MODE.to_owned())
    }

    /// Where its traces go, and where that was said: `--trace`, else `ISOLATE_TRACE`, else
    /// [`DEFAULT_TRACE`].
    pub fn effective_trace(&self) -> (String, &'static str) {
        if let Some(t) = &self.trace {
            (t.clone(), "--trace")
        } else if let Some(t) = std::env::var("ISOLATE_TRACE")
            .ok()
            .filter(|t| !t.is_empty())
        {
            (t, "ISOLATE_TRACE")
        } else {
            (DEFAULT_TRACE.to_owned(), "the default trace pattern")
        }
    }
}

/// The first line `isolate run` prints: the mode, what it finds, and where the traces go.
///
/// ```
/// let l = isolate_analyzer::run::mode_line("log", "isolate-%p.trace");
/// assert_eq!(l, "isolate: mode log (records only; --mode isolate finds stale writes) — trace: isolate-%p.trace");
/// ```
pub fn mode_line(mode: &str, pattern: &str) -> String {
    match mode {
        "log" => format!(
            "isolate: mode log (records only; --mode isolate finds stale writes) — trace: {pattern}"
        ),
        "isolate" => format!(
            "isolate: mode isolate (freed memory is held back and checked: finds stale writes and stale launches) — trace: {pattern}"
        ),
        "off" => "isolate: mode off (the library passes every call through and writes no trace)"
            .to_owned(),
        other => format!("isolate: mode {other} — trace: {pattern}"),
    }
}

/// This machine's host name, as the library puts it in trace names (`%h`).
pub fn host_name() -> String {
    let mut host = [0u8; 256];
    // SAFETY: the buffer is valid for its length minus the byte kept for the terminator.
    unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) };
    let end = host.iter().position(|&b| b == 0).unwrap_or(0);
    String::from_utf8_lossy(&host[..end]).into_owned()
}

/// One part of a trace pattern's path component: text, or a number (`%p`, `%r`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Number,
}

/// A path component of a pattern, `%h` and `%%` expanded.
fn pieces(component: &str, host: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut it = component.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        match it.next() {
            Some('p' | 'r') => {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Number);
            }
            Some('h') => text.push_str(host),
            Some('%') => text.push('%'),
            Some(o) => {
                text.push('%');
                text.push(o);
            }
            None => text.push('%'),
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

fn literal(p: &[Piece]) -> Option<String> {
    match p {
        [] => Some(String::new()),
        [Piece::Text(t)] => Some(t.clone()),
        _ => None,
    }
}

fn matches(p: &[Piece], s: &str) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((Piece::Text(t), rest)) => {
            s.strip_prefix(t.as_str()).is_some_and(|r| matches(rest, r))
        }
        Some((Piece::Number, rest)) => {
            let digits = s.bytes().take_while(u8::is_ascii_digit).count();
            (1..=digits).any(|k| matches(rest, &s[k..]))
        }
    }
}

/// A trace file name made by the pattern component `p`: the name itself, or with the `.N`
/// the library adds when the name exists.
fn file_matches(p: &[Piece], name: &str) -> bool {
    matches(p, name)
        || name.rsplit_once('.').is_some_and(|(stem, n)| {
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && matches(p, stem)
        })
}

fn list_dir(d: &Path) -> Vec<(String, std::fs::FileType)> {
    let dir = if d.as_os_str().is_empty() {
        Path::new(".")
    } else {
        d
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?)))
        .collect()
}

/// Every file that the trace pattern can have made (with `%p` and `%r` standing for any number,
/// `.N` suffixes included), relative when the pattern is.
pub fn trace_files(pattern: &str, host: &str) -> BTreeSet<PathBuf> {
    let comps: Vec<&str> = pattern.split('/').collect();
    let Some((last, dirs_part)) = comps.split_last() else {
        return BTreeSet::new();
    };
    let mut dirs = vec![if pattern.starts_with('/') {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    }];
    for c in dirs_part.iter().filter(|c| !c.is_empty()) {
        let p = pieces(c, host);
        dirs = match literal(&p) {
            Some(t) => dirs.into_iter().map(|d| d.join(&t)).collect(),
            None => dirs
                .iter()
                .flat_map(|d| {
                    list_dir(d)
                        .into_iter()
                        .filter(|(n, t)| t.is_dir() && matches(&p, n))
                        .map(move |(n, _)| d.join(n))
                })
                .collect(),
        };
    }
    let p = pieces(last, host);
    let mut out = BTreeSet::new();
    for d in &dirs {
        for (n, t) in list_dir(d) {
            if t.is_file() && file_matches(&p, &n) {
                out.insert(d.join(n));
            }
        }
    }
    out
}

/// Checks that traces can be created where the pattern puts them: its directory exists and
/// can be written to (the library creates no directories). A directory with `%p` or `%r` in
/// it is made per process: then only the part before them is checked. `source` says where the
/// pattern came from (`--trace`, `ISOLATE_TRACE`).
pub fn check_trace_dir(pattern: &str, source: &str, host: &str) -> Result<(), Error> {
    let dir_part = match pattern.rfind('/') {
        Some(0) => "/",
        Some(i) => &pattern[..i],
        None => ".",
    };
    let mut dir = if dir_part.starts_with('/') {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    };
    let mut whole = true;
    for c in dir_part.split('/').filter(|c| !c.is_empty()) {
        match literal(&pieces(c, host)) {
            Some(t) => dir.push(t),
            None => {
                whole = false;
                break;
            }
        }
    }
    if dir.as_os_str().is_empty() {
        dir.push(".");
    }
    let said = if source.starts_with("--") {
        format!("{source} {pattern}")
    } else if source == "ISOLATE_TRACE" {
        format!("ISOLATE_TRACE={pattern}")
    } else {
        format!("{source} {pattern}")
    };
    let fail = |what: &str| {
        Err(Error::invalid(format!(
            "cannot create traces in {}: {what} ({said})",
            dir.display()
        )))
    };
    match std::fs::metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail("no such directory; isolate does not create directories");
        }
        Err(e) => return fail(&crate::error::io_short(&e)),
        Ok(m) if !m.is_dir() => return fail("not a directory"),
        Ok(_) => {}
    }
    if whole {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| Error::invalid(format!("{} holds a NUL byte", dir.display())))?;
        // SAFETY: a valid C string.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            let e = std::io::Error::last_os_error();
            return fail(&match e.raw_os_error() {
                Some(libc::EROFS) => "read-only file system".to_owned(),
                Some(libc::EACCES) | Some(libc::EPERM) => "no permission to write there".to_owned(),
                _ => e.to_string(),
            });
        }
    }
    Ok(())
}

/// A trace the run wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFile {
    pub path: PathBuf,
    pub pid: u32,
    pub ppid: u32,
    pub argv: Vec<String>,
}

/// What a run did.
#[derive(Debug)]
pub struct Finished {
    /// How the command ended.
    pub status: ExitStatus,
    /// The command's pid.
    pub pid: u32,
    /// The traces it and its descendants wrote, in path order.
    pub traces: Vec<TraceFile>,
    /// New files the pattern matches that processes outside the run wrote (or whose header
    /// could not be read).
    pub others: usize,
}

/// `libisolate.so` in the directory of `exe` (the `isolate` executable).
pub fn library_beside(exe: &Path) -> Result<PathBuf, Error> {
    let dir = exe
        .parent()
        .ok_or_else(|| Error::invalid(format!("{} has no directory", exe.display())))?;
    let lib = dir.join(LIBRARY);
    if lib.is_file() {
        Ok(lib)
    } else {
        Err(Error::invalid(format!(
            "{LIBRARY} not found: isolate looks for it beside its own executable, at {} \
             (build it with `cargo build -p isolate-interposer` and keep it in the same directory)",
            lib.display()
        )))
    }
}

/// `LD_PRELOAD` with our library first and what was there before kept after a colon.
pub fn preload_value(lib: &Path, existing: Option<&OsStr>) -> OsString {
    let mut v = OsString::from(lib.as_os_str());
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        v.push(":");
        v.push(e);
    }
    v
}

/// The exit status a shell would report: the command's, or 128+N when signal N killed it.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

/// Ends as the command ended: when a signal killed it, this process kills itself with the
/// same signal (default action, no core file) and does not return; otherwise returns its exit
/// status. Returns 128+N only if signal N did not end this process.
pub fn end_like(status: ExitStatus) -> i32 {
    if let Some(sig) = status.signal() {
        die_of(sig);
    }
    exit_code(status)
}

/// The signals `isolate run` passes on to the command while it runs (see the module docs).
pub const FORWARDED: [libc::c_int; 6] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Whether a signal `sig` that `isolate run` received is passed on to the command (see the module
/// docs): `code` and `sender` are its `si_code` and `si_pid`, `child` the command's pid,
/// `session_leader` whether `isolate` leads its session.
pub fn forwards(
    sig: libc::c_int,
    code: libc::c_int,
    sender: libc::pid_t,
    child: libc::pid_t,
    session_leader: bool,
) -> bool {
    if code <= 0 {
        // Sent by a process (kill, killpg, sigqueue, tgkill): pass it on, unless the command sent
        // it itself (to its own group, or to us): it has its own copy or meant us.
        sender != child
    } else {
        // Sent by the kernel to the foreground process group (the terminal's ^C, ^\, a hang-up):
        // the command, in our group, has it already. A hang-up of the terminal goes to the
        // session leader alone: when that is us, the command did not get it.
        sig == libc::SIGHUP && code == libc::SI_KERNEL && session_leader
    }
}

/// The command's processes: its pid and every descendant seen while it ran (read from
/// `/proc/PID/task/TID/children` every [`POLL_MS`] ms and whenever a child ends).
struct Family {
    all: BTreeSet<u32>,
    /// Those still to look at (the others have ended).
    watch: Vec<u32>,
}

/// How often the command's descendants are looked for while it runs.
const POLL_MS: i64 = 100;

impl Family {
    fn new(pid: u32) -> Self {
        Family {
            all: BTreeSet::from([pid]),
            watch: vec![pid],
        }
    }

    fn poll(&mut self) {
        let mut found = Vec::new();
        self.watch.retain(|&pid| {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return false;
            };
            for t in tasks.flatten() {
                let Ok(text) = std::fs::read_to_string(t.path().join("children")) else {
                    continue;
                };
                found.extend(
                    text.split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
            true
        });
        for c in found {
            if self.all.insert(c) {
                self.watch.push(c);
            }
        }
    }
}

/// Of the new files the pattern matches, those the run wrote: a trace whose header's pid is the
/// command's or one of its descendants', or whose parent's is (followed to the end, so a child
/// of a child that lived too briefly to be seen is found through its parent's trace). Returns
/// them and how many others there were.
fn the_runs(new: BTreeSet<PathBuf>, family: &BTreeSet<u32>) -> (Vec<TraceFile>, usize) {
    let mut candidates: Vec<Option<TraceFile>> = new
        .into_iter()
        .map(|path| {
            let r = isolate_trace::FastReader::open(&path).ok()?;
            let h = r.header();
            Some(TraceFile {
                pid: h.pid,
                ppid: h.ppid,
                argv: h.argv.clone(),
                path,
            })
        })
        .collect();
    let mut family = family.clone();
    let mut found = Vec::new();
    loop {
        let before = found.len();
        for c in candidates.iter_mut() {
            if c.as_ref()
                .is_some_and(|t| family.contains(&t.pid) || family.contains(&t.ppid))
                && let Some(t) = c.take()
            {
                family.insert(t.pid);
                found.push(t);
            }
        }
        if found.len() == before {
            break;
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    let others = candidates.len() - found.len();
    (found, others)
}

/// Runs the command and waits for it, passing signals on (see the module docs), and finds the
/// traces it wrote: the files the trace pattern matches that were not there before it started,
/// written by the command or its descendants ([`Finished`]). The caller ends as the command
/// ended with [`end_like`].
///
/// Call it from a process with one thread (as `isolate`'s `main` does): it waits for signals
/// with them blocked in the calling thread, and another thread could take them.
pub fn run(opts: &RunOptions) -> Result<Finished, Error> {
    let (prog, args) = opts
        .command
        .split_first()
        .ok_or_else(|| Error::invalid("no command given to run"))?;
    if let Some(m) = &opts.mode
        && !MODES.contains(&m.as_str())
    {
        return Err(Error::invalid(format!(
            "--mode: unknown mode {m:?}: use one of {}",
            MODES.join(", ")
        )));
    }
    let mut cmd = Command::new(prog);
    cmd.args(args);
    let existing = std::env::var_os("LD_PRELOAD");
    cmd.env(
        "LD_PRELOAD",
        preload_value(&opts.library, existing.as_deref()),
    );
    if let Some(m) = &opts.mode {
        cmd.env("ISOLATE_MODE", m);
    }
    // NVTX ranges (torch.cuda.nvtx.range, emit_nvtx(), NCCL's) become regions: the library is
    // also the NVTX injection, unless the user named another tool (Nsight Systems sets its own).
    if opts.effective_mode() != "off" && std::env::var_os("NVTX_INJECTION64_PATH").is_none() {
        cmd.env("NVTX_INJECTION64_PATH", &opts.library);
    }
    if let Some(t) = &opts.trace {
        cmd.env("ISOLATE_TRACE", t);
    }
    let tracing = opts.effective_mode() != "off";
    let (pattern, _) = opts.effective_trace();
    let host = host_name();
    let before = if tracing {
        trace_files(&pattern, &host)
    } else {
        BTreeSet::new()
    };
    // Blocked from before the command starts, so that none is missed; restored when this returns.
    let signals = Signals::block().map_err(|e| Error::io(None, e))?;
    let (mask, chld_ignored) = (signals.old_mask, signals.chld_ignored());
    // SAFETY: runs in the child between fork and exec, and calls only async-signal-safe functions.
    unsafe {
        cmd.pre_exec(move || {
            // The command starts with the dispositions and mask `isolate` itself was given.
            if chld_ignored {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        let what = match e.kind() {
            std::io::ErrorKind::NotFound => "command not found".to_owned(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
            _ => e.to_string(),
        };
        Error::invalid(format!("cannot run {}: {what}", Path::new(prog).display()))
    })?;
    let pid = child.id();
    let mut family = Family::new(pid);
    let status = signals
        .wait_forwarding(&mut child, &mut family)
        .map_err(|e| Error::io(None, e))?;
    drop(signals);
    let (traces, others) = if tracing {
        let new: BTreeSet<PathBuf> = trace_files(&pattern, &host)
            .difference(&before)
            .cloned()
            .collect();
        the_runs(new, &family.all)
    } else {
        (Vec::new(), 0)
    };
    Ok(Finished {
        status,
        pid,
        traces,
        others,
    })
}

/// A word for a shell: as it is when it needs no quoting, else in single quotes.
///
/// ```
/// use isolate_analyzer::run::shell_quote;
/// assert_eq!(shell_quote("traces/a-1.trace"), "traces/a-1.trace");
/// assert_eq!(shell_quote("my traces/it's"), "'my traces/it'\\''s'");
/// ```
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Text from a trace for a terminal: control characters escaped.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Traces listed one a line at most.
const LISTED: usize = 10;

/// What `isolate run` says at the end (each line starting `isolate: `): the traces the run
/// wrote and the one command that reads them, `isolate` being called `command`.
pub fn traces_report(f: &Finished, command: &str, pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    let path = |t: &TraceFile| shell_quote(&t.path.to_string_lossy());
    match f.traces.as_slice() {
        [] => out.push(format!(
            "isolate: no trace was written: a process writes one at its first CUDA allocation call \
             (if the library could not create one, it said so above); traces go to {pattern}"
        )),
        [t] => {
            out.push(format!(
                "isolate: trace written: {} (pid {})",
                printable(&path(t)),
                t.pid
            ));
            out.push(format!(
                "isolate: read it with: {command} summary {}",
                printable(&path(t))
            ));
        }
        ts => {
            out.push(format!("isolate: {} traces written:", ts.len()));
            for t in ts.iter().take(LISTED) {
                // The program by its file name: the whole path would crowd the line.
                let mut words: Vec<String> = t.argv.clone();
                if let Some(first) = words.first_mut()
                    && let Some(name) = Path::new(first.as_str()).file_name()
                {
                    *first = name.to_string_lossy().into_owned();
                }
                let mut argv = words.join(" ");
                if argv.chars().count() > 60 {
                    argv = argv.chars().take(59).collect::<String>() + "…";
                }
                let parent = if t.pid == f.pid {
                    " (the command)".to_owned()
                } else if t.ppid == f.pid {
                    " (a child of the command)".to_owned()
                } else {
                    format!(" (parent {})", t.ppid)
                };
                out.push(format!(
                    "isolate:   {}  pid {}{parent}  {}",
                    printable(&path(t)),
                    t.pid,
                    printable(&argv)
                ));
            }
            if ts.len() > LISTED {
                out.push(format!("isolate:   and {} more", ts.len() - LISTED));
            }
            let all: Vec<String> = ts.iter().map(path).collect();
            out.push(format!(
                "isolate: read them with: {command} summary {}",
                printable(&all.join(" "))
            ));
        }
    }
    if f.others > 0 {
        out.push(format!(
            "isolate: ({} other new {} matching {pattern} came from processes outside this run: not listed)",
            f.others,
            if f.others == 1 { "file" } else { "files" }
        ));
    }
    out
}

/// The calling thread's signal state while the command runs: [`FORWARDED`] and SIGCHLD blocked
/// (and SIGCHLD not ignored, so that the command's end can be waited for), taken with
/// `sigwaitinfo`. Dropping it restores what was there.
struct Signals {
    set: libc::sigset_t,
    old_mask: libc::sigset_t,
    /// SIGCHLD's action, when it had to be changed.
    old_chld: Option<libc::sigaction>,
}

impl Signals {
    fn block() -> std::io::Result<Signals> {
        // SAFETY: plain calls on local, initialised signal sets and actions.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in FORWARDED.into_iter().chain([libc::SIGCHLD]) {
                libc::sigaddset(&mut set, sig);
            }
            let mut old_mask: libc::sigset_t = std::mem::zeroed();
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            let mut signals = Signals {
                set,
                old_mask,
                old_chld: None,
            };
            // An ignored SIGCHLD (or SA_NOCLDWAIT) would reap the command unseen: its status lost.
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) == 0
                && (old.sa_sigaction == libc::SIG_IGN || old.sa_flags & libc::SA_NOCLDWAIT != 0)
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut dfl.sa_mask);
                if libc::sigaction(libc::SIGCHLD, &dfl, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                signals.old_chld = Some(old);
            }
            Ok(signals)
        }
    }

    fn chld_ignored(&self) -> bool {
        self.old_chld
            .is_some_and(|a| a.sa_sigaction == libc::SIG_IGN)
    }

    /// Takes signals until the command ends, passing on those [`forwards`] says to, and looks
    /// for the command's descendants every [`POLL_MS`] ms.
    fn wait_forwarding(
        &self,
        child: &mut Child,
        family: &mut Family,
    ) -> std::io::Result<ExitStatus> {
        let pid = child.id() as libc::pid_t;
        // SAFETY: no preconditions.
        let session_leader = unsafe { libc::getsid(0) == libc::getpid() };
        loop {
            let wait = libc::timespec {
                tv_sec: 0,
                tv_nsec: POLL_MS * 1_000_000,
            };
            // SAFETY: `info` is written by sigtimedwait; si_pid is valid for every code of the
            // signals in `set` that a process sends, and is only read for those.
            let (sig, info) = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                (libc::sigtimedwait(&self.set, &mut info, &wait), info)
            };
            if sig < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    family.poll();
                    continue;
                }
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if sig == libc::SIGCHLD {
                family.poll();
                // Also sent when the command stops or continues, or when another child ends.
                if let Some(status) = child.try_wait()? {
                    return Ok(status);
                }
                continue;
            }
            let sender = if info.si_code <= 0 {
                // SAFETY: see above.
                unsafe { info.si_pid() }
            } else {
                0
            };
            if forwards(sig, info.si_code, sender, pid, session_leader) {
                // The command is not reaped before this loop ends, so `pid` is still it.
                // SAFETY: no preconditions.
                unsafe { libc::kill(pid, sig) };
            }
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: plain calls on initialised signal sets and actions.
        unsafe {
            // Signals that came after the command ended have no one to go to: drop them rather
            // than die of them once unblocked.
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            while libc::sigtimedwait(&self.set, std::ptr::null_mut(), &zero) > 0 {}
            if let Some(old) = &self.old_chld {
                libc::sigaction(libc::SIGCHLD, old, std::ptr::null_mut());
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut());
        }
    }
}

/// Ends this process with signal `sig`, the way the command ended: default action, and no core
/// file (the command wrote its own, where core files are written). Returns only if `sig` did not
/// end the process.
fn die_of(sig: libc::c_int) {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: plain calls on local, initialised values.
    unsafe {
        let mut core: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_CORE, &mut core) == 0 {
            core.rlim_cur = 0;
            libc::setrlimit(libc::RLIMIT_CORE, &core);
        }
        // Also stops a core_pattern pipe (systemd-coredump, apport), which RLIMIT_CORE does not.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        // The default action (std has a handler of its own for SIGSEGV and SIGBUS); fails,
        // harmlessly, for SIGKILL.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        let mut only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut only);
        libc::sigaddset(&mut only, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_signals_are_passed_on() {
        use libc::{SI_KERNEL, SI_QUEUE, SI_TKILL, SI_USER, SIGHUP, SIGINT, SIGQUIT, SIGTERM};
        let (child, other) = (200, 300);
        for sig in FORWARDED {
            // Sent by another process: passed on, whether or not we lead the session.
            for code in [SI_USER, SI_QUEUE, SI_TKILL] {
                assert!(forwards(sig, code, other, child, false));
                assert!(forwards(sig, code, other, child, true));
                // From another pid namespace the sender reads 0.
                assert!(forwards(sig, code, 0, child, false));
                // Sent by the command itself: never sent back.
                assert!(!forwards(sig, code, child, child, false));
            }
        }
        // The terminal's ^C and ^\ reach the whole foreground group: the command has them.
        for sig in [SIGINT, SIGQUIT, SIGTERM] {
            assert!(!forwards(sig, SI_KERNEL, 0, child, false));
            assert!(!forwards(sig, SI_KERNEL, 0, child, true));
        }
        // A hang-up goes to the session leader alone.
        assert!(forwards(SIGHUP, SI_KERNEL, 0, child, true));
        assert!(!forwards(SIGHUP, SI_KERNEL, 0, child, false));
    }

    #[test]
    fn trace_names_match_their_pattern() {
        let p = pieces("rank%r-%h-%p.trace", "gpu7");
        assert!(file_matches(&p, "rank0-gpu7-4312.trace"));
        // The names the library gives when one exists (an exec, a reused pattern).
        assert!(file_matches(&p, "rank3-gpu7-4312.trace.1"));
        assert!(file_matches(&p, "rank3-gpu7-4312.trace.27"));
        assert!(!file_matches(&p, "rank3-gpu7-4312.trace.x"));
        assert!(!file_matches(&p, "rank3-gpu8-4312.trace"), "another host");
        assert!(!file_matches(&p, "rank-gpu7-4312.trace"), "%r is a number");
        assert!(!file_matches(&p, "rank3-gpu7-43a2.trace"));
        let p = pieces("%p%p.t", "h");
        assert!(file_matches(&p, "12.t"));
        assert!(!file_matches(&p, "1.t"));
        let p = pieces("100%%-%p", "h");
        assert!(file_matches(&p, "100%-7") && !file_matches(&p, "100%%-7"));
        assert_eq!(
            literal(&pieces("traces-%h", "h1")),
            Some("traces-h1".to_owned())
        );
        assert_eq!(literal(&pieces("r%r", "h1")), None);
    }

    #[test]
    fn trace_files_walks_the_directories_of_the_pattern() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for f in [
            "a/r0/t-1.trace",
            "a/r0/t-2.trace.1",
            "a/r1/t-3.trace",
            "a/rx/t-4.trace",
            "a/r1/u-5.trace",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"").unwrap();
        }
        std::fs::create_dir_all(root.join("a/r1/t-6.trace")).unwrap();
        let pattern = format!("{}/a/r%r/t-%p.trace", root.display());
        let got: Vec<String> = trace_files(&pattern, "h")
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(
            got,
            ["a/r0/t-1.trace", "a/r0/t-2.trace.1", "a/r1/t-3.trace"]
        );
    }

    #[test]
    fn the_trace_directory_is_checked() {
        let d = tempfile::tempdir().unwrap();
        let here = format!("{}/x-%p.trace", d.path().display());
        assert!(check_trace_dir(&here, "--trace", "h").is_ok());
        let missing = format!("{}/no/x-%p.trace", d.path().display());
        let e = check_trace_dir(&missing, "--trace", "h")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "cannot create traces in {}/no: no such directory",
                d.path().display()
            )) && e.ends_with(&format!("(--trace {missing})")),
            "{e}"
        );
        let e = check_trace_dir("/nonexistent/%h/x.trace", "ISOLATE_TRACE", "h")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in /nonexistent/h: no such directory")
                && e.contains("(ISOLATE_TRACE=/nonexistent/%h/x.trace)"),
            "{e}"
        );
        // A directory made per process is checked up to its first %p or %r.
        let per = format!("{}/r%r/x.trace", d.path().display());
        assert!(check_trace_dir(&per, "--trace", "h").is_ok());
        let e = check_trace_dir("/nonexistent/r%r/x.trace", "--trace", "h").unwrap_err();
        assert!(
            e.to_string().contains("in /nonexistent: no such directory"),
            "{e}"
        );
        // A file where the directory should be.
        std::fs::write(d.path().join("f"), b"").unwrap();
        let e = check_trace_dir(&format!("{}/f/x.trace", d.path().display()), "--trace", "h")
            .unwrap_err();
        assert!(e.to_string().contains(": not a directory"), "{e}");
        // A bare name: the working directory.
        assert!(check_trace_dir("x-%p.trace", "the default trace pattern", "h").is_ok());
    }

    #[test]
    fn the_runs_traces_are_its_family() {
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, pid: u32, ppid: u32| {
            let mut b = Vec::new();
            isolate_trace::Encoder::preamble(
                &isolate_trace::Header {
                    pid,
                    ppid,
                    argv: vec!["prog".into()],
                    ..isolate_trace::Header::default()
                },
                &mut b,
            );
            let p = d.path().join(name);
            std::fs::write(&p, b).unwrap();
            p
        };
        let new: BTreeSet<PathBuf> = [
            write("cmd.trace", 100, 1),
            write("child.trace", 101, 100),
            // A grandchild whose parent (102) was never seen, and its own child.
            write("grandchild.trace", 103, 102),
            write("great.trace", 104, 103),
            // Through a trace of the run only: 105's parent 101 wrote one.
            write("via-trace.trace", 105, 101),
            write("other.trace", 200, 1),
        ]
        .into_iter()
        .chain([d.path().join("missing.trace")])
        .collect();
        let family = BTreeSet::from([100, 102]);
        let (found, others) = the_runs(new, &family);
        let pids: Vec<u32> = found.iter().map(|t| t.pid).collect();
        assert_eq!(pids, [101, 100, 103, 104, 105], "in path order");
        assert_eq!(
            others, 2,
            "the other process's trace and the unreadable one"
        );
    }

    #[test]
    fn what_the_run_says_at_the_end() {
        let t = |p: &str, pid, ppid| TraceFile {
            path: PathBuf::from(p),
            pid,
            ppid,
            argv: vec!["/usr/bin/python3".into(), "train.py".into()],
        };
        let status = ExitStatus::from_raw(0);
        let one = Finished {
            status,
            pid: 7,
            traces: vec![t("out dir/7.trace", 7, 1)],
            others: 0,
        };
        assert_eq!(
            traces_report(&one, "isolate", "out dir/%p.trace"),
            [
                "isolate: trace written: 'out dir/7.trace' (pid 7)",
                "isolate: read it with: isolate summary 'out dir/7.trace'",
            ]
        );
        let two = Finished {
            status,
            pid: 7,
            traces: vec![t("7.trace", 7, 1), t("8.trace", 8, 7)],
            others: 1,
        };
        assert_eq!(
            traces_report(&two, "./isolate", "%p.trace"),
            [
                "isolate: 2 traces written:",
                "isolate:   7.trace  pid 7 (the command)  python3 train.py",
                "isolate:   8.trace  pid 8 (a child of the command)  python3 train.py",
                "isolate: read them with: ./isolate summary 7.trace 8.trace",
                "isolate: (1 other new file matching %p.trace came from processes outside this run: not listed)",
            ]
        );
        let none = Finished {
            status,
            pid: 7,
            traces: vec![],
            others: 0,
        };
        assert!(
            traces_report(&none, "isolate", "x.trace")[0]
                .starts_with("isolate: no trace was written")
        );
    }

    #[test]
    fn preload_keeps_existing() {
        let lib = Path::new("/opt/isolate/libisolate.so");
        assert_eq!(preload_value(lib, None), "/opt/isolate/libisolate.so");
        assert_eq!(
            preload_value(lib, Some(OsStr::new(""))),
            "/opt/isolate/libisolate.so"
        );
        assert_eq!(
            preload_value(lib, Some(OsStr::new("/a.so:/b.so"))),
            "/opt/isolate/libisolate.so:/a.so:/b.so"
        );
    }
}

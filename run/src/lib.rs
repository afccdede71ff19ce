//! `isolate run`: runs a command with `libisolate.so` preloaded, and names the traces it wrote.
//!
//! Process supervision, kept out of the analysis library (`isolate-analyzer`): the `isolate`
//! binary calls it for `isolate run`, and nothing else does. [`signals`] says how signals are
//! passed on to the command and how `isolate` ends as the command ended; [`traces`] how the
//! traces the run wrote are told from others.

pub mod signals;
pub mod traces;

pub use signals::{FORWARDED, forwards};
use signals::{Signals, die_of};
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use traces::the_runs;
pub use traces::{Finished, TraceFile, check_trace_dir, host_name, trace_files, traces_report};

/// What went wrong: an argument that makes no sense (no command, an unknown mode, a trace
/// directory that cannot be written to), or a system call that failed.
#[derive(Debug)]
pub enum Error {
    /// Said in full by its text.
    Invalid(String),
    /// A system call failed.
    Io(std::io::Error),
}

impl Error {
    fn invalid(what: impl Into<String>) -> Self {
        Error::Invalid(what.into())
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Invalid(what) => f.write_str(what),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The Display above already says everything its cause says: returning the cause too
        // would make `{:#}` print it twice.
        None
    }
}

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

/// Checks the settings the command would get (this environment's `ISOLATE_*`, `--mode` and
/// `--trace` over them) with the library's own parser ([`isolate_trace::config`]), so that a
/// value the library would refuse stops `isolate run` before the command starts: one line
/// naming the variable and what is accepted, and the command not run. Without it, the command
/// started, the library refused it, and `isolate` went on to say no trace was written.
///
/// ```
/// let opts = isolate_run::RunOptions {
///     mode: Some("LOG".into()),
///     command: vec!["true".into()],
///     ..Default::default()
/// };
/// let e = isolate_run::check_settings(&opts).unwrap_err().to_string();
/// assert!(e.starts_with("--mode LOG: ISOLATE_MODE=\"LOG\" is not valid; accepted: log, isolate, off"), "{e}");
/// ```
pub fn check_settings(opts: &RunOptions) -> Result<(), Error> {
    use std::os::unix::ffi::OsStrExt;
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k.as_bytes().starts_with(b"ISOLATE_"))
        .collect();
    let flags = [
        ("ISOLATE_MODE", "--mode", &opts.mode),
        ("ISOLATE_TRACE", "--trace", &opts.trace),
    ];
    for (name, _, value) in flags {
        if let Some(v) = value {
            vars.retain(|(k, _)| k != name);
            vars.push((name.into(), v.into()));
        }
    }
    let checked =
        isolate_trace::config::check_utf8(vars.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())))
            .and_then(|()| {
                isolate_trace::config::from_env(
                    |k| {
                        vars.iter()
                            .find(|(n, _)| n == k)
                            .and_then(|(_, v)| v.to_str().map(str::to_owned))
                    },
                    vars.iter().map(|(k, _)| k.to_string_lossy().into_owned()),
                )
            });
    let Err(msg) = checked else {
        return Ok(());
    };
    // Which of the flags set what the message is about.
    let said: Vec<String> = flags
        .iter()
        .filter_map(|(name, flag, value)| {
            let v = value.as_ref()?;
            msg.contains(name)
                .then(|| format!("{flag} {}", shell_quote(v)))
        })
        .collect();
    let by = if said.is_empty() {
        String::new()
    } else {
        format!("{}: ", said.join(", "))
    };
    Err(Error::invalid(format!(
        "{by}{}; the command was not run",
        printable(&msg)
    )))
}

/// The first line `isolate run` prints: the mode, what it finds, and where the traces go.
///
/// ```
/// let l = isolate_run::mode_line("log", "isolate-%p.trace");
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

/// The bytes the loader splits `LD_PRELOAD` on (ld.so(8): spaces and colons; glibc's `rtld`
/// takes tabs and newlines as spaces too). A library whose path holds one cannot be named there:
/// the loader would look for the pieces, preload nothing, and the command would run unrecorded.
const PRELOAD_SPLITS: &[u8] = b" :\t\n";

/// True when `path` can stand in `LD_PRELOAD` as one item.
pub fn preloadable(path: &Path) -> bool {
    !path.as_os_str().is_empty()
        && !path
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .any(|b| PRELOAD_SPLITS.contains(b))
}

/// A private directory (mode 0700, made with `mkdtemp`) holding one link to the library, for a
/// library whose own path `LD_PRELOAD` would split; removed when dropped (after the command).
#[derive(Debug)]
pub struct PreloadLink {
    dir: PathBuf,
    link: PathBuf,
}

impl PreloadLink {
    /// The link: what `LD_PRELOAD` names.
    pub fn path(&self) -> &Path {
        &self.link
    }
}

impl Drop for PreloadLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A path for the library that `LD_PRELOAD` takes as one item: the library's own when it can
/// (None), else a link to it in a private temporary directory (`$TMPDIR` when that path is safe,
/// else `/tmp`). An error, never a silent run without the library, when neither can be had.
pub fn preload_link(lib: &Path) -> Result<Option<PreloadLink>, Error> {
    if preloadable(lib) {
        return Ok(None);
    }
    let target = std::fs::canonicalize(lib)
        .map_err(|e| Error::invalid(format!("cannot find {}: {e}", lib.display())))?;
    let mut bases: Vec<PathBuf> = Vec::new();
    if let Some(t) = std::env::var_os("TMPDIR").map(PathBuf::from)
        && t.is_absolute()
    {
        bases.push(t);
    }
    bases.push(PathBuf::from("/tmp"));
    let mut tried = Vec::new();
    for base in bases {
        let template = base.join("isolate-lib-XXXXXX");
        if !preloadable(&template) {
            tried.push(format!("{}: its path would be split too", base.display()));
            continue;
        }
        let mut bytes = template.into_os_string().into_encoded_bytes();
        bytes.push(0);
        // SAFETY: a NUL-terminated template ending in XXXXXX, written in place.
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            tried.push(format!(
                "{}: {}",
                base.display(),
                std::io::Error::last_os_error()
            ));
            continue;
        }
        bytes.pop();
        // SAFETY: the bytes came from an OsString and mkdtemp replaced ASCII with ASCII.
        let dir = PathBuf::from(unsafe { OsString::from_encoded_bytes_unchecked(bytes) });
        let link = dir.join(LIBRARY);
        match std::os::unix::fs::symlink(&target, &link) {
            Ok(()) => return Ok(Some(PreloadLink { dir, link })),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                tried.push(format!("{}: {e}", link.display()));
            }
        }
    }
    Err(Error::invalid(format!(
        "{} cannot be preloaded: LD_PRELOAD splits paths at spaces and colons, and no link to it \
         could be made in a private temporary directory ({}); install it under a path without \
         spaces or colons",
        lib.display(),
        tried.join("; ")
    )))
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

/// The command's processes: its pid and every descendant seen while it ran (read from
/// `/proc/PID/task/TID/children` every [`POLL_MS`] ms and whenever a child ends).
pub(crate) struct Family {
    pub(crate) all: BTreeSet<u32>,
    /// Those still to look at (the others have ended).
    watch: Vec<u32>,
}

/// How often the command's descendants are looked for while it runs.
pub(crate) const POLL_MS: i64 = 100;

impl Family {
    pub(crate) fn new(pid: u32) -> Self {
        Family {
            all: BTreeSet::from([pid]),
            watch: vec![pid],
        }
    }

    pub(crate) fn poll(&mut self) {
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
    // Kept until the command has ended (its descendants started later are not the run's).
    let link = preload_link(&opts.library)?;
    let preload = link.as_ref().map_or(opts.library.as_path(), |l| l.path());
    let existing = std::env::var_os("LD_PRELOAD");
    cmd.env("LD_PRELOAD", preload_value(preload, existing.as_deref()));
    if let Some(m) = &opts.mode {
        cmd.env("ISOLATE_MODE", m);
    }
    // NVTX ranges (torch.cuda.nvtx.range, emit_nvtx(), NCCL's) become regions: the library is
    // also the NVTX injection, unless the user named another tool (Nsight Systems sets its own).
    if opts.effective_mode() != "off" && std::env::var_os("NVTX_INJECTION64_PATH").is_none() {
        cmd.env("NVTX_INJECTION64_PATH", preload);
    }
    let tracing = opts.effective_mode() != "off";
    let (pattern, _) = opts.effective_trace();
    // A relative pattern is the starting directory's, as it is for the traces looked for below:
    // the command gets it made absolute, so that a command that changes directory before its
    // first CUDA call still writes its trace where `isolate` finds it.
    let start_dir = std::env::current_dir()
        .ok()
        .filter(|_| !pattern.starts_with('/'));
    let pattern = match start_dir.as_ref().and_then(|d| d.to_str()) {
        Some(d) => format!("{}/{pattern}", d.replace('%', "%%")),
        None => pattern,
    };
    if tracing && start_dir.is_some() {
        cmd.env("ISOLATE_TRACE", &pattern);
    } else if let Some(t) = &opts.trace {
        cmd.env("ISOLATE_TRACE", t);
    }
    let host = host_name();
    let before = if tracing {
        trace_files(&pattern, &host)
    } else {
        BTreeSet::new()
    };
    // Blocked from before the command starts, so that none is missed; restored when this returns.
    let signals = Signals::block().map_err(Error::Io)?;
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
        .map_err(Error::Io)?;
    drop(signals);
    let (traces, others) = if tracing {
        // Named as the user's pattern names them: relative to the starting directory when it is.
        let new: BTreeSet<PathBuf> = trace_files(&pattern, &host)
            .difference(&before)
            .map(|p| match &start_dir {
                Some(d) => p
                    .strip_prefix(d)
                    .map_or_else(|_| p.clone(), Path::to_path_buf),
                None => p.clone(),
            })
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
/// use isolate_run::shell_quote;
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
pub(crate) fn printable(s: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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

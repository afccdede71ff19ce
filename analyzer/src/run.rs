//! `isolate run`: runs a command with `libisolate.so` preloaded.

use crate::Error;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file name of the preload library.
pub const LIBRARY: &str = "libisolate.so";

/// The modes `ISOLATE_MODE` accepts.
pub const MODES: [&str; 3] = ["log", "isolate", "off"];

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
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

/// Runs the command and waits for it; returns its exit code (see [`exit_code`]).
pub fn run(opts: &RunOptions) -> Result<i32, Error> {
    let (prog, args) = opts
        .command
        .split_first()
        .ok_or_else(|| Error::invalid("no command given to run"))?;
    if let Some(m) = &opts.mode
        && !MODES.contains(&m.as_str())
    {
        return Err(Error::invalid(format!(
            "unknown mode {m:?}: use one of {}",
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
    if let Some(t) = &opts.trace {
        cmd.env("ISOLATE_TRACE", t);
    }
    let mut child = cmd.spawn().map_err(|e| {
        let what = match e.kind() {
            std::io::ErrorKind::NotFound => "command not found".to_owned(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
            _ => e.to_string(),
        };
        Error::invalid(format!("cannot run {}: {what}", Path::new(prog).display()))
    })?;
    // Like a shell running a foreground job: the terminal's ^C and ^\ go to the child (same
    // process group); we wait for it to act on them and report how it ended.
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions; the child was
    // spawned before, so it keeps the default dispositions.
    let old = unsafe {
        [
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
        ]
    };
    let status = child.wait();
    // SAFETY: as above, restoring what was there.
    unsafe {
        libc::signal(libc::SIGINT, old[0]);
        libc::signal(libc::SIGQUIT, old[1]);
    }
    Ok(exit_code(status.map_err(|e| Error::io(None, e))?))
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

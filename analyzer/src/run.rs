//! `isolate run`: runs a command with `libisolate.so` preloaded.
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

use crate::Error;
use std::ffi::{OsStr, OsString};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

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
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
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

/// Runs the command and waits for it, passing signals on (see the module docs); returns its exit
/// code (see [`exit_code`]).
///
/// When the command is killed by a signal, this process kills itself with the same signal
/// (default action, no core file) and does not return, so that whoever started `isolate` sees
/// what it would have seen of the command. It returns 128+N only if that signal did not end it.
/// Call it from a process with one thread (as `isolate`'s `main` does): it waits for signals
/// with them blocked in the calling thread, and another thread could take them.
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
    let status = signals
        .wait_forwarding(&mut child)
        .map_err(|e| Error::io(None, e))?;
    if let Some(sig) = status.signal() {
        die_of(sig);
    }
    Ok(exit_code(status))
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

    /// Takes signals until the command ends, passing on those [`forwards`] says to.
    fn wait_forwarding(&self, child: &mut Child) -> std::io::Result<ExitStatus> {
        let pid = child.id() as libc::pid_t;
        // SAFETY: no preconditions.
        let session_leader = unsafe { libc::getsid(0) == libc::getpid() };
        loop {
            // SAFETY: `info` is written by sigwaitinfo; si_pid is valid for every code of the
            // signals in `set` that a process sends, and is only read for those.
            let (sig, info) = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                (libc::sigwaitinfo(&self.set, &mut info), info)
            };
            if sig < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if sig == libc::SIGCHLD {
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

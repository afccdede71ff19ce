//! How `isolate run` takes signals while the command runs, and ends as the command ended.
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

use crate::{Family, POLL_MS};
use std::process::{Child, ExitStatus};

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

/// The calling thread's signal state while the command runs: [`FORWARDED`] and SIGCHLD blocked
/// (and SIGCHLD not ignored, so that the command's end can be waited for), taken with
/// `sigwaitinfo`. Dropping it restores what was there.
pub(crate) struct Signals {
    set: libc::sigset_t,
    pub(crate) old_mask: libc::sigset_t,
    /// SIGCHLD's action, when it had to be changed.
    old_chld: Option<libc::sigaction>,
}

impl Signals {
    pub(crate) fn block() -> std::io::Result<Signals> {
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

    pub(crate) fn chld_ignored(&self) -> bool {
        self.old_chld
            .is_some_and(|a| a.sa_sigaction == libc::SIG_IGN)
    }

    /// Takes signals until the command ends, passing on those [`forwards`] says to, and looks
    /// for the command's descendants every [`POLL_MS`] ms.
    pub(crate) fn wait_forwarding(
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
pub(crate) fn die_of(sig: libc::c_int) {
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
}

//! A child process's peak resident set, measured by `wait4` (shared by the memory test and the
//! bench example, which includes this file by path).

use std::process::Command;
use std::time::Instant;

/// Runs `cmd` to its end; returns its exit code (128 + the signal when one killed it), the
/// seconds it took and its peak RSS in KiB.
// The child is reaped by wait4, which std's Child does not know about.
#[allow(clippy::zombie_processes)]
pub fn measured(cmd: &mut Command) -> (i32, f64, i64) {
    let t = Instant::now();
    let child = cmd.spawn().expect("start the isolate binary");
    let mut status = 0;
    // SAFETY: wait4 fills the status and the rusage we hand it; the child is ours and is
    // waited for only here (std's Child is dropped without waiting).
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        let r = libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru);
        assert!(r > 0, "wait4: {}", std::io::Error::last_os_error());
        ru
    };
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    (code, t.elapsed().as_secs_f64(), ru.ru_maxrss)
}

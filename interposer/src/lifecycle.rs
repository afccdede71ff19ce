//! The ways out of a process: `exit`, `_exit`, `exec`, fatal signals, and `fork`.
//! Each one flushes what was accepted before the process goes (or is replaced).

use crate::writer;
use isolate_trace::EndReason;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::time::Duration;

/// Runs before `main`: only reads the settings and registers the fork handler.
#[ctor::ctor]
unsafe fn init() {
    let cfg = crate::config::get();
    if cfg.mode == crate::config::Mode::Isolate {
        crate::policy::before_main();
    }
    unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
}

/// Library destructor: runs after `atexit` handlers and thread-local destructors of `exit()`.
#[ctor::dtor]
unsafe fn fini() {
    at_exit();
}

pub fn at_exit() {
    let _inside = crate::record::Inside::enter();
    crate::policy::at_exit();
    writer::flush(Some(EndReason::Exit), Duration::from_secs(5));
}

extern "C" fn child_after_fork() {
    writer::after_fork_child();
    crate::policy::after_fork_child();
}

/// Signals that end a process by default; we flush on each, then let it take its course.
const FATAL: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGABRT,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
];

const NSIG: usize = 65;
static OLD: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
static OLD_FLAGS: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Installed when the first trace starts (a process that never touches CUDA keeps its own).
pub fn install_signal_handlers() {
    if INSTALLED.swap(true, AcqRel) {
        return;
    }
    for &sig in FATAL {
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction == libc::SIG_IGN {
                continue; // the program asked to ignore it: leave that alone
            }
            OLD[sig as usize].store(old.sa_sigaction, Release);
            OLD_FLAGS[sig as usize].store(old.sa_flags as usize, Release);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

extern "C" fn on_signal(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let errno = unsafe { *libc::__errno_location() };
    let old = OLD[sig as usize].load(Acquire);
    if old == libc::SIG_DFL {
        // The process dies of this signal: write everything and the end record first.
        writer::flush(Some(EndReason::Signal(sig)), Duration::from_secs(2));
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
            // For a fault the instruction runs again and faults with the default action;
            // for a sent signal, send it again: it is delivered when this handler returns.
            let code = if info.is_null() { 0 } else { (*info).si_code };
            if code <= 0 {
                libc::raise(sig);
            }
        }
    } else {
        // The program handles it (Python's SIGINT, faulthandler…): flush, then hand over.
        writer::flush(None, Duration::from_secs(2));
        let flags = OLD_FLAGS[sig as usize].load(Acquire) as i32;
        unsafe {
            if flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(old);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(i32) = std::mem::transmute(old);
                f(sig);
            }
        }
    }
    unsafe { *libc::__errno_location() = errno };
}

/// Before the process is replaced by `exec`: everything written, an end record saying so.
pub fn before_exec() {
    let _inside = crate::record::Inside::enter();
    writer::flush(Some(EndReason::Exec), Duration::from_secs(2));
}

/// Before `_exit`: atexit handlers and destructors will not run, so close the trace here.
pub fn before_underscore_exit() {
    at_exit();
}

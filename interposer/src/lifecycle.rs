//! The ways out of a process: `exit`, `_exit`, `exec`, fatal signals, and `fork`.
//! Each one flushes what was accepted before the process goes (or is replaced).

use crate::writer;
use isolate_trace::EndReason;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::time::Duration;

/// Runs before `main`: reads the settings, registers the fork handler, and notices a late load.
#[ctor::ctor]
unsafe fn init() {
    if cuda_in_use() {
        LATE_LOAD.store(true, Release);
    }
    let cfg = crate::config::get();
    if cfg.mode == crate::config::Mode::Isolate {
        crate::policy::before_main();
    }
    unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
}

/// Set by the constructor when CUDA was already in use: the library was `dlopen`ed late.
static LATE_LOAD: AtomicBool = AtomicBool::new(false);

/// True when this library was loaded after CUDA was already in use (a late `dlopen`, not
/// `LD_PRELOAD`): what was allocated before is not in the trace.
pub fn loaded_late() -> bool {
    LATE_LOAD.load(Acquire)
}

/// Was the driver already initialised when the constructor ran? With `LD_PRELOAD` the
/// constructor runs before `main`, before any CUDA call (a program linked against `libcuda` or
/// `libcudart` has them loaded by then, but not initialised). The driver is asked only when it is
/// loaded already (`RTLD_NOLOAD`: this never loads it), and only `cuCtxGetCurrent`, which
/// answers `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` and changes nothing.
fn cuda_in_use() -> bool {
    let h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        return false;
    }
    let f = crate::resolve::dlsym_in(h, c"cuCtxGetCurrent");
    let in_use = !f.is_null() && {
        type CtxGetCurrent =
            unsafe extern "C" fn(*mut crate::cuda::CUcontext) -> crate::cuda::CUresult;
        // SAFETY: the driver's cuCtxGetCurrent has this signature.
        let get: CtxGetCurrent = unsafe { std::mem::transmute(f) };
        let mut ctx: crate::cuda::CUcontext = std::ptr::null_mut();
        let r = unsafe { get(&mut ctx) };
        r != crate::cuda::CUDA_ERROR_NOT_INITIALIZED
    };
    unsafe { libc::dlclose(h) };
    in_use
}

/// Called by the writer right after a trace starts: a late load says so first thing.
pub fn note_late_load() {
    if loaded_late() {
        writer::note(
            isolate_trace::NoteKind::LateLoad,
            0,
            0,
            0,
            "libisolate.so was loaded after CUDA was already in use (dlopen, not LD_PRELOAD): \
             allocations made before it are not in this trace"
                .into(),
        );
    }
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

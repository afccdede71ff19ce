//! The fatal-signal wrapper. For each signal that ends a process by default, installed when the
//! first trace starts (a process that never touches CUDA keeps its own), in place of the
//! program's action, and behaving exactly as that action would:
//!
//! - the program's handler keeps its own flags (`SA_RESTART` or not, `SA_NODEFER`,
//!   `SA_ONSTACK`), mask and one-shot reset (`SA_RESETHAND`, done here so that the second
//!   delivery, which kills, still writes the trace's end first); it is called at once, with no
//!   flush in the way: a handler that returns (a garbage collector's write barrier takes a
//!   `SIGSEGV` per page) costs microseconds;
//! - when the signal kills (default action, or a handler that set the default back and lets the
//!   signal come again, as Python's faulthandler does), everything accepted is written with an
//!   end record first, and the signal is raised again with its default action, whatever its
//!   `si_code` (a terminal's Ctrl-C is sent by the kernel, `SI_KERNEL`), so the process dies of
//!   it as it would have;
//! - several threads dying at once: the first writes the end, the others wait for it;
//! - in isolate mode, before the end is written, the quarantine is checked (what `exit` would
//!   check), so that a stale write made before a SIGTERM, an `abort()` or a kill from `timeout`
//!   is reported: by [`check_quarantine`], on a thread started with the trace, waited for at most
//!   [`DYING_CHECK_LIMIT_NS`]; not when the signal came inside one of the library's hooks (its
//!   locks may be held by the very thread the signal stopped).
//!
//! A program that installs its own action after ours replaces ours: its signals are its own.
//!
//! Layer: process life. Uses the policies, recording and the base.

use crate::base::{config, sys};
use crate::record::{thread, writer};
use isolate_trace::EndReason;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering::*};
use std::time::Duration;

/// Signals that end a process by default.
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
    libc::SIGPIPE,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSYS,
    libc::SIGTRAP,
];

const NSIG: usize = 65;

/// The program's action for each signal, as it was when ours went in.
struct Saved(UnsafeCell<[libc::sigaction; NSIG]>);
// SAFETY: written only by `install` before the wrapper for that signal is installed (the
// `INSTALLED` flag lets one thread in), read only afterwards.
unsafe impl Sync for Saved {}
// SAFETY: an array of `sigaction`, a C struct of integers, masks and a handler address, for
// which all-zero (SIG_DFL, no flags, empty mask) is a valid value.
static OLD: Saved = Saved(UnsafeCell::new(unsafe { std::mem::zeroed() }));

/// Per signal: 0 not ours, 1 ours (the program's action in `OLD`), 2 ours, one-shot already
/// used (acts as the default action now).
static STATE: [AtomicU8; NSIG] = [const { AtomicU8::new(0) }; NSIG];
static INSTALLED: AtomicBool = AtomicBool::new(false);

const SA_SIGINFO: usize = libc::SA_SIGINFO as usize;
/// The flags of the program's action that we keep on ours.
const KEPT: i32 = libc::SA_RESTART | libc::SA_NODEFER | libc::SA_ONSTACK;

fn old(sig: i32) -> &'static libc::sigaction {
    // SAFETY: see `Saved`.
    unsafe { &(*OLD.0.get())[sig as usize] }
}

/// Installs the wrapper for every fatal signal whose action is not "ignore".
pub fn install() {
    if INSTALLED.swap(true, AcqRel) {
        return;
    }
    for &sig in FATAL {
        // SAFETY: `prev`, `act` are live local sigactions (all-zero is a valid value of the C
        // struct) and `sigaction` only reads `act` and writes `prev`. The write to `OLD` is the one
        // `Saved` allows: `INSTALLED` let one thread in, and it writes entry `sig` (< NSIG) before
        // `STATE[sig]` says ours and before our handler, the only reader, is installed for `sig`.
        // `on_signal` has the SA_SIGINFO handler's C signature, which the flags say.
        unsafe {
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut prev) != 0 {
                continue;
            }
            if prev.sa_sigaction == libc::SIG_IGN {
                continue; // the program asked to ignore it: leave that alone
            }
            (*OLD.0.get())[sig as usize] = prev;
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            if prev.sa_sigaction == libc::SIG_DFL {
                // The signal kills: nothing else runs during the flush.
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
                libc::sigfillset(&mut act.sa_mask);
            } else {
                act.sa_flags = libc::SA_SIGINFO | (prev.sa_flags & KEPT);
                act.sa_mask = prev.sa_mask;
            }
            STATE[sig as usize].store(1, Release);
            if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
                STATE[sig as usize].store(0, Release);
            }
        }
    }
}

extern "C" fn on_signal(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life; reading
    // an int from it is async-signal-safe.
    let errno = unsafe { *libc::__errno_location() };
    let prev = old(sig);
    let mut state = STATE[sig as usize].load(Acquire);
    if state == 1 && prev.sa_flags & libc::SA_RESETHAND != 0 {
        // One shot: this delivery goes to the handler, the next one is the default action.
        STATE[sig as usize].store(2, Release);
        state = 1;
    }
    if state != 1 || prev.sa_sigaction == libc::SIG_DFL {
        dies(sig);
    } else {
        if sig == libc::SIGABRT {
            // `abort()` raises again with the default action if the handler returns.
            check_quarantine(DYING_CHECK_LIMIT_NS);
            writer::flush(None, Duration::from_secs(2));
        }
        let f = prev.sa_sigaction;
        // SAFETY: `f` is the program's handler for `sig`, as sigaction gave it to `install`, and
        // `state == 1` says it is neither SIG_DFL nor SIG_IGN (install skipped those) but a
        // function. Its flags say which of the two C signatures it was installed with, and it is
        // called with that one and the `info`/`ctx` the kernel gave us, as the kernel would have
        // called it.
        unsafe {
            if prev.sa_flags as usize & SA_SIGINFO != 0 {
                let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(f);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(i32) = std::mem::transmute(f);
                f(sig);
            }
        }
        if comes_back_to_kill(sig, info) {
            check_quarantine(DYING_CHECK_LIMIT_NS);
            writer::flush(Some(EndReason::Signal(sig)), Duration::from_secs(2));
        }
    }
    // SAFETY: this thread's errno (see above), put back as it was when the signal came.
    unsafe { *libc::__errno_location() = errno };
}

/// The signal kills the process: write everything and the end record, then raise it again
/// with the default action. It is blocked while this handler runs, so it is delivered, and
/// kills, as the handler returns (a fault's instruction is never run again).
fn dies(sig: i32) {
    check_quarantine(DYING_CHECK_LIMIT_NS);
    writer::flush(Some(EndReason::Signal(sig)), Duration::from_secs(2));
    // SAFETY: `act` and `set` are live locals (all-zero is valid for both C structs); sigaction,
    // sigemptyset, sigaddset, pthread_sigmask only read and write them. tgkill names this process
    // and this thread (getpid, gettid), so the signal goes to the thread that is handling it.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(sig, &act, std::ptr::null_mut());
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            sys::gettid() as libc::pid_t,
            sig,
        );
        // Delivered at once if this handler was installed with SA_NODEFER.
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// After the program's handler returned: will the signal kill the process now? It will when
/// the handler set the default action back and the signal is pending again (raised by the
/// handler) or is a fault that the returning instruction raises again.
fn comes_back_to_kill(sig: i32, info: *mut libc::siginfo_t) -> bool {
    // SAFETY: `cur` and `pending` are live locals (all-zero is valid); the calls only fill them
    // or read them. `info` is the kernel's siginfo for this delivery (checked non-null), alive for
    // the whole handler, which is still running.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0
            || cur.sa_sigaction != libc::SIG_DFL
        {
            return false;
        }
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut pending);
        if libc::sigismember(&pending, sig) == 1 {
            return true;
        }
        let fault = matches!(
            sig,
            libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP
        );
        // A fault the kernel raised (si_code > 0) comes back when the instruction runs again.
        fault && !info.is_null() && (*info).si_code > 0
    }
}

/// The longest a dying process waits for the quarantine check (isolate mode) before its trace is
/// ended: a CI job's time limit sends SIGTERM and then, some seconds later, SIGKILL.
pub const DYING_CHECK_LIMIT_NS: u64 = 5_000_000_000;

/// The checker: a thread of the library, started with the trace in isolate mode, that checks the
/// quarantine when asked ([`check_quarantine`]). It exists beforehand because the ends that need it
/// come in a signal handler, where no thread can be started (`pthread_create` allocates, and the
/// signal may have stopped its thread inside `malloc`). `CHECKER_PID`: the process it belongs to
/// (a fork child starts its own); `CHECK_ASKED` (a futex word) and `CHECK_DONE`: requests by
/// number.
static CHECKER_PID: AtomicU32 = AtomicU32::new(0);
static CHECK_ASKED: AtomicU32 = AtomicU32::new(0);
static CHECK_DONE: AtomicU32 = AtomicU32::new(0);

/// Starts the checker for this process (isolate mode; once per process).
pub fn start_checker() {
    if config::get().mode != config::Mode::Isolate {
        return;
    }
    // SAFETY: getpid takes nothing, touches no memory and cannot fail.
    let me = unsafe { libc::getpid() } as u32;
    let was = CHECKER_PID.load(Acquire);
    if was == me
        || CHECKER_PID
            .compare_exchange(was, me, AcqRel, Acquire)
            .is_err()
    {
        return;
    }
    CHECK_ASKED.store(0, Release);
    CHECK_DONE.store(0, Release);
    // Every signal blocked, so that no signal handler runs on it (as on the writer).
    let spawned = sys::spawn_unsignalled(
        std::thread::Builder::new().name("isolate-check".into()),
        checker_main,
    );
    if spawned.is_err() {
        CHECKER_PID.store(0, Release); // no checker: the ends other than exit check nothing
    }
}

fn checker_main() {
    // What it calls is the library's own doing, never recorded as the program's.
    let _inside = thread::Inside::enter();
    loop {
        let done = CHECK_DONE.load(Acquire);
        let asked = CHECK_ASKED.load(Acquire);
        if asked == done {
            // SAFETY: FUTEX_WAIT on a static atomic word (valid for the process's life), with no
            // timeout; it only reads the word and sleeps while it holds `asked`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    CHECK_ASKED.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    asked,
                    std::ptr::null::<libc::timespec>(),
                )
            };
            continue;
        }
        crate::policy::verify_now();
        CHECK_DONE.store(asked, Release);
    }
}

/// Isolate mode: checks the quarantine now (its allocations stay there: the process may go on),
/// on the checker thread, waiting at most `limit_ns`; what it finds is recorded and said on stderr
/// like any stale write. Async-signal-safe (atomics, `futex`, `nanosleep`). Does nothing on one of
/// the library's threads, inside a hook (its locks may be held by this thread), in a process
/// without a checker (nothing quarantined, log mode) or in a `vfork` child.
pub fn check_quarantine(limit_ns: u64) {
    // SAFETY: getpid takes nothing, touches no memory and cannot fail.
    let me = unsafe { libc::getpid() } as u32;
    if CHECKER_PID.load(Acquire) != me || thread::nested() {
        return;
    }
    let limit_ns = match config::get().test_exit_check_ms {
        0 => limit_ns,
        ms => ms * 1_000_000,
    };
    let asked = CHECK_ASKED.fetch_add(1, AcqRel).wrapping_add(1);
    // SAFETY: FUTEX_WAKE on a static atomic word: wakes the checker, touches no memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            CHECK_ASKED.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
    let deadline = sys::now_ns() + limit_ns;
    if !sys::wait_until(deadline, || {
        CHECK_DONE.load(Acquire).wrapping_sub(asked) < u32::MAX / 2
    }) {
        sys::warn(&format!(
            "the quarantine check did not finish within {:.1} s (waiting for the device, or for \
             a lock the interrupted thread holds?): the process goes on without its results",
            limit_ns as f64 / 1e9
        ));
    }
}

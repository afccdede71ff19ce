//! The ways out of a process: `exit`, `_exit`, `quick_exit`, `exec` (and an `exec` that fails),
//! the raw `exit_group` and `execve` system calls made through `syscall()`, fatal signals, and
//! `fork`. Each one flushes what was accepted before the process goes (or is replaced); in
//! isolate mode the quarantine is checked first at every end (exit, exec, a fatal signal), so
//! that a stale write is reported however the process ends.
//!
//! Layer: process life. Called from the hooks (`_exit`, `exec`, `syscall`) and the constructor;
//! uses the policies, recording and the base. [`signals`] is the fatal-signal wrapper.
//!
//! What the process owns: the library's state (the trace, the quarantine) belongs to the process
//! that made it, recorded here as the owner pid. A `vfork` child (or any `clone` that shares the
//! memory without the fork handlers running) has another pid and shares that state: whatever it
//! does on its way out (`_exit`, `exec`) leaves the state alone.

// Every unsafe block in this layer says why it is sound (issue 29, item 5).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod signals;

use crate::base::{config, resolve, sys};
use crate::record::writer::{self, Started};
use crate::record::{event, thread};
use isolate_trace::EndReason;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::time::Duration;

/// Runs before `main`: stands down if another copy of the library came first, reads the
/// settings, registers the fork handlers, and notices a late load.
#[ctor::ctor]
unsafe fn init() {
    // SAFETY: getpid takes nothing, touches no memory and cannot fail.
    OWNER.store(unsafe { libc::getpid() } as u32, Release);
    if resolve::another_copy_first() {
        config::stand_down();
        sys::warn(
            "another copy of libisolate.so is loaded first (LD_PRELOAD names two): \
             this one stands down",
        );
        return;
    }
    if cuda_in_use() {
        LATE_LOAD.store(true, Release);
    }
    let cfg = config::get();
    if cfg.mode == config::Mode::Isolate {
        crate::policy::before_main();
    }
    writer::on_start(trace_started);
    if cfg.mode != config::Mode::Off {
        writer::prepare_descriptors();
    }
    // SAFETY: `child_after_fork` is an `extern "C" fn()`, the handler's signature, and lives as
    // long as this library (which is never unloaded: it is preloaded); no other handler is given.
    unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
    // `quick_exit` runs the `at_quick_exit` handlers, last registered first, then ends the
    // process with glibc's internal `_exit`, which no export sees: registered before `main`,
    // this handler runs after every handler of the program (their calls are recorded) and
    // closes the trace.
    // SAFETY: the handler is a plain `extern "C" fn()` of this library, which stays loaded (a
    // preload is never unloaded); a null DSO handle only means "not unregistered by dlclose".
    unsafe { __cxa_at_quick_exit(at_quick_exit_handler, std::ptr::null_mut()) };
    GLIBC_SERIALISES_EXIT.store(glibc_serialises_exit(), Release);
}

unsafe extern "C" {
    /// glibc's `at_quick_exit` (the C function is a static inline of libc_nonshared over this).
    fn __cxa_at_quick_exit(f: extern "C" fn(), dso: *mut std::ffi::c_void) -> i32;
    fn gnu_get_libc_version() -> *const std::ffi::c_char;
}

extern "C" fn at_quick_exit_handler() {
    before_underscore_exit();
}

/// True when the glibc the program runs on (asked at run time: `gnu_get_libc_version`) makes a
/// second thread that calls `exit` while another is in it wait for good, as 2.41 and later do.
fn glibc_serialises_exit() -> bool {
    // SAFETY: gnu_get_libc_version takes nothing and returns a static string.
    let v = unsafe { gnu_get_libc_version() };
    if v.is_null() {
        return true;
    }
    // SAFETY: a non-null, NUL-terminated static string (above), never freed.
    let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_string_lossy();
    let mut parts = v.split('.').map(|p| {
        p.bytes().take_while(u8::is_ascii_digit).fold(0u32, |n, d| {
            n.saturating_mul(10).saturating_add((d - b'0') as u32)
        })
    });
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 41)
}

/// Set by the constructor: [`glibc_serialises_exit`].
static GLIBC_SERIALISES_EXIT: AtomicBool = AtomicBool::new(true);

/// The pid whose state this is (see the module comment).
static OWNER: AtomicU32 = AtomicU32::new(0);

/// True in the process that owns the library's state; false in a `vfork` child, which shares
/// the parent's memory.
pub fn owns_state() -> bool {
    let owner = OWNER.load(Acquire);
    // SAFETY: getpid takes nothing, touches no memory and cannot fail.
    owner == 0 || owner == unsafe { libc::getpid() } as u32
}

/// When the writer starts a trace: the signal handlers go in first; the late-load note is the
/// first record in the trace.
fn trace_started(when: Started) {
    match when {
        Started::Before => {
            signals::install();
            signals::start_checker();
        }
        Started::After => {
            note_late_load();
            crate::policy::trace_started();
        }
    }
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
    // SAFETY: a NUL-terminated literal name; RTLD_NOLOAD never loads the driver, it only takes a
    // reference when it is loaded already.
    let h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        return false;
    }
    let f = resolve::dlsym_in(h, c"cuCtxGetCurrent");
    let in_use = !f.is_null() && {
        type CtxGetCurrent =
            unsafe extern "C" fn(*mut crate::base::cuda::CUcontext) -> crate::base::cuda::CUresult;
        // SAFETY: the driver's cuCtxGetCurrent has this signature.
        let get: CtxGetCurrent = unsafe { std::mem::transmute(f) };
        let mut ctx: crate::base::cuda::CUcontext = std::ptr::null_mut();
        // SAFETY: `get` is the driver's cuCtxGetCurrent (transmuted above), whose one argument is a
        // `CUcontext *` it writes: `ctx` is a live local of that type.
        let r = unsafe { get(&mut ctx) };
        r != crate::base::cuda::CUDA_ERROR_NOT_INITIALIZED
    };
    // SAFETY: `h` is the non-null handle opened with RTLD_NOLOAD above: this drops that reference
    // only (the driver stays loaded), and `get` is not called after it.
    unsafe { libc::dlclose(h) };
    in_use
}

/// Right after a trace starts: a late load says so first thing.
fn note_late_load() {
    if loaded_late() {
        event::note(
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
    if !owns_state() {
        return;
    }
    IN_LIBRARY_EXIT.store(true, Release);
    let _inside = thread::Inside::enter();
    crate::policy::at_exit();
    writer::flush(Some(EndReason::Exit), Duration::from_secs(5));
    IN_LIBRARY_EXIT.store(false, Release);
}

/// The thread running `exit` (0: none yet).
static EXITING: AtomicU32 = AtomicU32::new(0);
/// Set while the library's own exit work (the exit check, the trace's end) runs.
static IN_LIBRARY_EXIT: AtomicBool = AtomicBool::new(false);

/// How long a second thread's `exit` waits, on a glibc before 2.41, for the first one to get
/// to the library's exit work (see [`before_exit`]).
const SECOND_EXIT_WAIT_NS: u64 = 1_000_000_000;

/// Before `exit`. glibc 2.41 and later let one thread run `exit`: a thread that calls it while
/// another one is in it waits for good (the process ends under it). Before 2.41 they all run the
/// exit handlers at once, and the first to find none left ends the process (`_exit`), also while
/// another thread is still in this library's destructor writing the trace, which is lost then,
/// end record and unwritten events alike. So, asked at run time which glibc this is:
///
/// - 2.41 and later: a second thread waits for good, as glibc would make it;
/// - before 2.41: a second thread waits while the first is on its way to the end of the trace
///   (at most [`SECOND_EXIT_WAIT_NS`] while the first still runs the program's handlers, for as
///   long as the library's own exit work takes once it is there), then goes on into glibc's
///   `exit` as that glibc lets it. A program whose `atexit` handler joins a thread that calls
///   `exit` ends as it does on that glibc (the second `exit` ends it), not hung.
///
/// A call from inside the exit (an `atexit` handler) goes on. A `vfork` child's `exit` is its
/// own.
pub fn before_exit() {
    if !owns_state() {
        return;
    }
    let me = sys::gettid();
    match EXITING.compare_exchange(0, me, AcqRel, Acquire) {
        Ok(_) => {}
        Err(t) if t == me => {}
        Err(_) if GLIBC_SERIALISES_EXIT.load(Acquire) => loop {
            // SAFETY: pause takes nothing and touches no memory; it returns after a handled signal,
            // and the loop pauses again.
            unsafe { libc::pause() };
        },
        Err(_) => {
            let since = sys::now_ns();
            while !writer::ended()
                && (IN_LIBRARY_EXIT.load(Acquire)
                    || sys::now_ns().saturating_sub(since) < SECOND_EXIT_WAIT_NS)
            {
                sys::nap(1_000_000);
            }
        }
    }
}

extern "C" fn child_after_fork() {
    // SAFETY: getpid takes nothing, touches no memory and cannot fail.
    OWNER.store(unsafe { libc::getpid() } as u32, Release);
    EXITING.store(0, Release);
    sys::forget_tid();
    writer::after_fork_child();
    event::after_fork_child();
    crate::record::stacks::after_fork_child();
    crate::policy::after_fork_child();
}

/// The longest the quarantine check before an `exec` may take (it waits for the device), as
/// long as the exit check's.
const EXEC_CHECK_LIMIT_NS: u64 = 30_000_000_000;

/// Before the process is replaced by `exec`: in isolate mode the quarantine checked (what the
/// exit check would find, reported before the image that made it is gone; the allocations stay
/// in quarantine, for an exec that fails), then everything written, an end record saying so.
pub fn before_exec() {
    if !owns_state() {
        return; // a vfork child's exec replaces the child, not the parent whose trace it is
    }
    signals::check_quarantine(EXEC_CHECK_LIMIT_NS);
    let _inside = thread::Inside::enter();
    writer::flush(Some(EndReason::Exec), Duration::from_secs(2));
}

/// After an `exec` that failed (it returned): the program goes on, and so does its trace (the
/// end record written for the exec is taken back). `errno` is the exec's.
pub fn exec_failed() {
    if !owns_state() {
        return;
    }
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    let _inside = thread::Inside::enter();
    writer::resume_after_exec();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Before `_exit`: atexit handlers and destructors will not run, so close the trace here.
pub fn before_underscore_exit() {
    at_exit();
}

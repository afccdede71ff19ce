//! The exit check: every allocation still in quarantine is verified at exit (on a thread of its
//! own, waited for at most a bounded time), and on demand for a test framework's check.
//!
//! Layer: policies. Uses the base, recording and the folder's state and release paths.

use super::leave::{Release, free_to_driver, reap, release_batch, release_sync};
use super::state::{Entry, STATE, current_ctx, st, state};
use crate::base::config;
use crate::base::cu;
use crate::base::cuda::*;
use crate::base::sys::{now_ns, wait_until, warn};
use crate::policy::reuse;
use crate::record::event;
use crate::record::thread::Inside;
use isolate_trace::NoteKind;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};

pub(super) static ATEXIT: AtomicBool = AtomicBool::new(false);

/// The process whose quarantine this is (set when the first free is quarantined, and in a fork
/// child); a `vfork` child sharing the parent's memory is not it.
pub(super) static EXIT_OWNER: AtomicU32 = AtomicU32::new(0);

/// Whether this process owns the quarantine it sees: not a `vfork` child of its owner.
pub fn exit_is_ours() -> bool {
    let owner = EXIT_OWNER.load(Acquire);
    // SAFETY: getpid has no preconditions.
    owner == 0 || owner == unsafe { libc::getpid() } as u32
}

/// An exit check ran past its limit: later ones (the library's destructor) do not start.
pub(super) static EXIT_GAVE_UP: AtomicBool = AtomicBool::new(false);

/// The longest the exit check may hold up the process's exit. It waits for the device (the
/// batches in flight, the freeing streams, its own kernels); a device that never gets there must
/// not turn into a process that never ends because of the library.
pub(super) const EXIT_CHECK_LIMIT_NS: u64 = 30_000_000_000;

/// [`at_exit`] on a thread of its own (with the calling thread's context), waited for at most
/// [`EXIT_CHECK_LIMIT_NS`]; past that the exit goes on without it, says so on stderr and in the
/// trace, and the unfinished check is left to die with the process.
pub fn at_exit_bounded() {
    if !exit_is_ours() {
        return; // a vfork child: the quarantine is its parent's, and so is the address space
    }
    // Whatever the check does, this process stops sharing the device's budget.
    let _left = Left;
    if EXIT_GAVE_UP.load(Acquire) {
        return; // an earlier check is still waiting for the device (and holds the queue)
    }
    if !ATEXIT.load(Acquire) {
        at_exit(); // nothing was ever quarantined: nothing to wait for
        return;
    }
    let ctx = current_ctx();
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let spawned = std::thread::Builder::new()
        .name("isolate-exit".into())
        .spawn(move || {
            let _inside = Inside::enter();
            if ctx != 0 {
                // SAFETY: the exiting thread's current context, which the exit has not
                // destroyed yet (the check runs before the runtime's exit handler).
                let _ = unsafe { cu::ctx_set_current(ctx as CUcontext) };
            }
            let _ = std::panic::catch_unwind(at_exit);
            flag.store(true, Release);
        });
    if spawned.is_err() {
        at_exit(); // no thread to be had: the check runs here, unbounded
        return;
    }
    let limit = match config::get().test_exit_check_ms {
        0 => EXIT_CHECK_LIMIT_NS,
        ms => ms * 1_000_000,
    };
    if !wait_until(now_ns() + limit, || done.load(Acquire)) {
        let text = format!(
            "the exit check of the quarantine did not finish within {:.1} s (waiting for the \
             device?): the process exits without its results",
            limit as f64 / 1e9
        );
        EXIT_GAVE_UP.store(true, Release);
        warn(&text);
        event::note(NoteKind::Info, 0, 0, 0, text);
    }
}

/// Removes this process from the device's tenants ([`super::tenants`]) when dropped: on every
/// way out of [`at_exit_bounded`].
struct Left;

impl Drop for Left {
    fn drop(&mut self) {
        super::tenants::leave();
    }
}

/// At exit: every allocation still in quarantine is checked (not freed: the process is ending).
pub fn at_exit() {
    // The keeper's releases in progress end first, and it starts none after.
    super::keeper::stop();
    reap(true);
    let entries: Vec<Entry> = {
        let mut g = state();
        let s = st!(g);
        s.held = 0;
        s.q.take_all()
    };
    release_batch(&entries, Release::CheckOnly);
}

/// Before a context ends with its memory (`cudaDeviceReset`, `cuCtxDestroy`, a primary
/// context's release): every allocation in quarantine is checked and really freed now, while
/// the memory is there. After the call the memory is gone: the exit check would find nothing
/// to read (or read what the driver put there since), so a stale write the program made before
/// `cudaDeviceReset(); return 0;` was never found.
pub fn before_context_ends() {
    let _inside = Inside::enter();
    // The keeper's work in progress ends first; it starts none until this is done, and probes
    // no context until the next free names one.
    let _pause = super::keeper::pause();
    super::keeper::context_ending();
    reap(true);
    let mut taken = Vec::new();
    {
        let mut g = state();
        let s = st!(g);
        while let Some(e) = s.pop_oldest() {
            taken.push(e);
        }
    }
    release_batch(&taken, Release::Now);
}

/// Context `ctx` is about to end (after [`before_context_ends`]): the memory kept for reuse in it
/// goes back to the driver (a destroy would free it anyway; a primary context's release that
/// does not destroy it would keep it out of reach), and what isolation made in it (module,
/// release stream, result rings) is forgotten: a context made again, often under the same
/// handle after `cudaDeviceReset`, gets its own.
pub fn context_gone(ctx: usize) {
    let kept = reuse::drain(ctx);
    free_to_driver(ctx, &kept, true);
    crate::policy::device::forget(ctx);
}

/// Checks every allocation in quarantine now (they stay there) and every batch on its way out;
/// what it finds is recorded (and counted by the tally) like any stale write. For a test
/// framework's "no stale write in this test" at the end of each test.
pub fn verify_now() {
    let _inside = Inside::enter();
    // The releases handed to the keeper end first (their checks are among those read).
    let _pause = super::keeper::pause();
    reap(true);
    let entries: Vec<Entry> = {
        let g = STATE.lock();
        g.as_ref().map(|s| s.q.held()).unwrap_or_default()
    };
    release_sync(&entries, false, true);
}

//! The library's own small C API, for programs that know they run under it (the Python package
//! `cuda_isolate` calls it through ctypes): marks and nested regions written into the trace as
//! notes, the running counters, a peak window, and a check of the quarantine on demand
//! (`isolate_check_now`). The marks and the per-thread region stack are shared with NVTX's
//! default domain (nvtx.rs). Every function returns 0 when it recorded, -1 when
//! recording is off (`ISOLATE_MODE=off`, or the trace was closed), -2 for a bad argument, and
//! `isolate_region_pop` -3 when this thread has no region open. None of them ever unwinds into
//! the caller.
//!
//! In the trace a mark or region is a `Mark`, `RegionPush` or `RegionPop` note whose text is the
//! mark's text or the region's name, `ptr` = the Linux thread id and `value` = the thread's
//! region depth (after a push, before a pop); docs/trace-format.md.
//!
//! Layer: hooks, the top. Uses recording (notes, the tally) and the policies (whether calls are
//! intercepted).

use crate::base::sys::gettid;
use crate::policy;
use crate::record::{event, tally, writer};
use isolate_trace::NoteKind;
use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int};

/// Recorded.
pub const OK: c_int = 0;
/// Recording is off.
pub const OFF: c_int = -1;
/// A null pointer or a size too small.
pub const BAD: c_int = -2;
/// `isolate_region_pop` with no region open on this thread.
pub const NO_REGION: c_int = -3;

thread_local! {
    static REGIONS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The C layout of `struct isolate_counters`: every field a `uint64_t`, new fields only ever
/// added at the end. `size` is set to the bytes the library filled in.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IsolateCounters {
    pub size: u64,
    pub events: u64,
    pub live_device_bytes: u64,
    pub peak_device_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub stale_writes: u64,
    pub stale_launches: u64,
    pub invalid_frees: u64,
    pub window_peak_device_bytes: u64,
    /// Allocations freed while still in use on another stream (unordered frees).
    pub freed_in_use: u64,
    /// Allocations isolate mode served from its kept, checked memory without a driver call
    /// (`ISOLATE_REUSE=on`): `device_allocs` less this is what the driver made.
    pub kept_allocs: u64,
}

/// True while marks and regions are written (intercepting, and the trace not closed).
pub fn recording() -> bool {
    policy::intercepting() && writer::active()
}

fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    safe(BAD, f)
}

/// `f()`, or `fallback` when it panics: nothing unwinds into the C caller (the C API's and
/// NVTX's callbacks).
pub(super) fn safe<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// A C string as text; `None` for a null pointer.
pub(super) fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string (the C API's and NVTX's contract).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn note(kind: NoteKind, what: String, depth: usize) {
    event::note(kind, gettid() as u64, 0, depth as u64, what);
}

/// A point in the trace, with `text`.
///
/// # Safety
/// `text` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isolate_mark(text_: *const c_char) -> c_int {
    guarded(|| {
        let Some(t) = text(text_) else { return BAD };
        mark(t)
    })
}

/// Opens a region named `name` on this thread (regions nest).
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isolate_region_push(name: *const c_char) -> c_int {
    guarded(|| {
        let Some(n) = text(name) else { return BAD };
        match region_push(n) {
            Ok(_) => OK,
            Err(e) => e,
        }
    })
}

/// Closes the region this thread opened last.
#[unsafe(no_mangle)]
pub extern "C" fn isolate_region_pop() -> c_int {
    guarded(|| match region_pop() {
        Ok(_) => OK,
        Err(e) => e,
    })
}

/// Writes a mark on this thread (the C API's and NVTX's marks): [`OK`] or [`OFF`].
pub fn mark(text: String) -> c_int {
    if !recording() {
        return OFF;
    }
    let depth = REGIONS.with(|r| r.borrow().len());
    note(NoteKind::Mark, text, depth);
    OK
}

/// Opens a region on this thread's stack (shared by the C API and NVTX's default domain):
/// the depth after the push (1 for an outermost region), or [`OFF`].
pub fn region_push(name: String) -> Result<usize, c_int> {
    if !recording() {
        return Err(OFF);
    }
    Ok(REGIONS.with(|r| push_onto(&mut r.borrow_mut(), gettid() as u64, name)))
}

/// Pushes `name` onto `stack` and writes its `RegionPush` note, `ptr` = `key` (a thread id, or
/// NVTX's per-domain and per-range keys): the depth after the push.
pub(super) fn push_onto(stack: &mut Vec<String>, key: u64, name: String) -> usize {
    stack.push(name.clone());
    let depth = stack.len();
    event::note(NoteKind::RegionPush, key, 0, depth as u64, name);
    depth
}

/// Pops `stack`'s innermost region and writes its `RegionPop` note, `ptr` = `key`: the depth
/// before the pop, `None` when the stack is empty.
pub(super) fn pop_from(stack: &mut Vec<String>, key: u64) -> Option<usize> {
    let depth = stack.len();
    let name = stack.pop()?;
    event::note(NoteKind::RegionPop, key, 0, depth as u64, name);
    Some(depth)
}

/// Closes this thread's innermost region: its depth (1 for an outermost region), or [`OFF`],
/// or [`NO_REGION`].
pub fn region_pop() -> Result<usize, c_int> {
    if !recording() {
        return Err(OFF);
    }
    REGIONS
        .with(|r| pop_from(&mut r.borrow_mut(), gettid() as u64))
        .ok_or(NO_REGION)
}

/// Starts a new peak window: `window_peak_device_bytes` becomes the device bytes live now and
/// from then on rises with them (the process-wide peak is left as it is).
#[unsafe(no_mangle)]
pub extern "C" fn isolate_peak_reset() -> c_int {
    guarded(|| {
        writer::caught_up();
        tally::reset_window_peak();
        if recording() { OK } else { OFF }
    })
}

/// Fills `out` with the counters so far, at most `size` bytes of it (a caller built against an
/// older, shorter struct gets what it knows of); `out->size` says how many were filled in.
///
/// # Safety
/// `out` is null or points to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isolate_counters(out: *mut IsolateCounters, size: usize) -> c_int {
    guarded(|| {
        if out.is_null() || size < 8 {
            return BAD;
        }
        writer::caught_up();
        let c = tally::get();
        let full = IsolateCounters {
            size: 0,
            events: c.events,
            live_device_bytes: c.live_device_bytes,
            peak_device_bytes: c.peak_device_bytes,
            device_allocs: c.device_allocs,
            device_frees: c.device_frees,
            stale_writes: c.stale_writes,
            stale_launches: c.stale_launches,
            invalid_frees: c.invalid_frees,
            window_peak_device_bytes: c.window_peak_device_bytes,
            freed_in_use: c.freed_in_use,
            kept_allocs: policy::reuse::stats().0,
        };
        let n = size.min(std::mem::size_of::<IsolateCounters>()) / 8 * 8;
        let full = IsolateCounters {
            size: n as u64,
            ..full
        };
        // SAFETY: `out` has `size` >= `n` writable bytes; byte copies need no alignment.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &full as *const IsolateCounters as *const u8,
                out as *mut u8,
                n,
            )
        };
        if recording() { OK } else { OFF }
    })
}

/// **Test-only, not for users**: pauses (`paused` != 0) or resumes the stream-order check
/// ([`policy::order::pause`]), so that a benchmark can time steps with and without it in one
/// process. Returns 0 when the check runs in this process, -1 when it does not (not isolate
/// mode, or `ISOLATE_TEST_ORDER=off`). A pause can only hide findings, never make one.
#[unsafe(no_mangle)]
pub extern "C" fn isolate_test_order_pause(paused: c_int) -> c_int {
    guarded(|| {
        if policy::order::pause(paused != 0) {
            OK
        } else {
            OFF
        }
    })
}

/// Checks the quarantine now instead of only when memory leaves it (at the latest at exit): every
/// freed allocation held so far is compared with its poison. Returns the number of stale writes
/// found so far in this process, this check's included (0 in log mode, where nothing is held),
/// or -1 when recording is off. The pytest plugin calls it at the end of each test.
#[unsafe(no_mangle)]
pub extern "C" fn isolate_check_now() -> i64 {
    std::panic::catch_unwind(|| {
        if !policy::intercepting() {
            return OFF as i64;
        }
        i64::try_from(policy::verify_now()).unwrap_or(i64::MAX)
    })
    .unwrap_or(BAD as i64)
}

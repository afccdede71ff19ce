//! What happens around each real call: in log mode, record it; in isolate mode, also keep freed
//! memory out of circulation (see [`isolate`]). Hooks call only the functions of this file.
//!
//! Layer: policies. The modules below this file, from the bottom (each uses only those before
//! it, the base and recording; none uses this file): [`sync`] (device-wide synchronisations,
//! numbered), [`tier`] (which bytes of a freed block the poison and check cover), [`device`]
//! (each context's module, kernels, result buffers and release stream),
//! [`log`], [`reuse`] (checked memory kept for reuse), [`frameworks`] (their pools off);
//! [`guard`] (uses sync); [`release`] (the release stream's work; uses device); [`order`] (the
//! stream-order check: vector clocks over streams, uses, frees); [`isolate`], a folder (uses
//! log, guard, release, reuse, device and order); [`launch`] (the launch check; uses isolate's
//! quarantine index, order and sync).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod device;
pub mod frameworks;
pub mod guard;
pub mod isolate;
pub mod launch;
pub mod layout;
pub mod log;
pub mod order;
pub mod release;
pub mod reuse;
pub mod sync;
pub mod tier;

use crate::base::config::{self, Mode};
use crate::base::cuda::*;
use crate::record::profile;
use isolate_trace::Event;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::*};

/// What kind of call a hook stands for: how its event is numbered, and what isolation does.
#[derive(Clone, Copy)]
pub enum Call {
    /// Hands out memory and writes its address to `Out`: numbered when it returns.
    Alloc(Out),
    /// Gives back the allocation at the event's `ptr`: numbered before the real call.
    Free,
    /// Anything else that hands something out (a reservation, a handle, a mapping).
    Returns,
    /// Anything else that gives something back (unmap, release, unregister).
    Releases,
}

/// The one entry point of the hooks: runs `call` (the real function) under the policy of the
/// mode, records the event `proto` (completed by `after` once the result is known), and
/// returns exactly what the real function returned (except where isolation is the point).
#[inline]
pub fn call(
    kind: Call,
    proto: Event,
    call: impl FnMut() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    if isolating() {
        return match kind {
            Call::Alloc(out) => isolate::alloc(proto, out, call, after),
            Call::Free => {
                exit_check_registered();
                isolate::free(proto, call)
            }
            Call::Returns => isolate::other(proto, false, call, after),
            Call::Releases => {
                exit_check_registered();
                isolate::other(proto, true, call, after)
            }
        };
    }
    match kind {
        Call::Alloc(out) => log::alloc(proto, out, call, after),
        Call::Free | Call::Releases => log::other(proto, true, call, after),
        Call::Returns => log::other(proto, false, call, after),
    }
}

/// Whether [`exit_check`] is registered with `atexit` (at the first free of isolate mode).
static EXIT_CHECK: AtomicBool = AtomicBool::new(false);

/// Registers [`exit_check`] at the first free: after the CUDA runtime's own exit handler (made
/// at the runtime's first call), so that it runs before that handler tears the driver down. The
/// library's destructor runs after it and gets no answer from the device any more (measured on
/// the H100: guard mode's fault at exit went unseen from there).
#[inline]
fn exit_check_registered() {
    if !EXIT_CHECK.load(Relaxed) && !EXIT_CHECK.swap(true, AcqRel) {
        // SAFETY: an `extern "C" fn()` of this library, which is never unloaded.
        unsafe { libc::atexit(exit_check) };
    }
}

/// Isolate mode's checks at exit, while the driver still answers: in guard mode, whether a
/// kernel nobody waited for faulted (first, before the exit check reads memory); then every
/// allocation still in quarantine is checked.
extern "C" fn exit_check() {
    let _inside = crate::record::thread::Inside::enter();
    if !isolate::exit_is_ours() {
        return; // a vfork child: the quarantine and the device work are its parent's
    }
    if config::get().guard && crate::record::writer::started() {
        let _ = std::panic::catch_unwind(launch::fault_at_exit);
    }
    let _ = std::panic::catch_unwind(isolate::at_exit_bounded);
}

/// False in `ISOLATE_MODE=off`: every hook passes straight through.
#[inline]
pub fn intercepting() -> bool {
    config::get().mode != Mode::Off
}

/// True when launches are checked for stale pointers.
#[inline]
pub fn check_launches() -> bool {
    let c = config::get();
    c.mode == Mode::Isolate && c.check_launch
}

/// True when stream-ordered frees' poisons wait for the next stream work (isolate mode and
/// [`release::batching`]): the hooks of stream work are handed out then.
#[inline]
pub fn defers_poison() -> bool {
    isolating() && release::batching()
}

/// True when the hooks of stream work (captures' starts and ends among them) are handed out:
/// while poisons are deferred or the stream order is checked (`hooks::driver::handed_out`).
#[inline]
pub fn stream_work_hooked() -> bool {
    defers_poison() || order::active()
}

/// Whether some stream may be capturing a graph now. Where captures' starts and ends reach
/// the library ([`stream_work_hooked`]) it counts them and "no" is certain, so an allocation
/// or a free need not ask the driver about its stream (a call a free, before: ~200
/// instructions on the stand-in, a driver call on a GPU); elsewhere the stream is asked.
#[inline]
pub fn may_capture() -> bool {
    !stream_work_hooked() || order::any_capture()
}

/// The program is about to queue work on a stream (a launch, a copy, a set, an event record, a
/// graph, a capture's start, or a synchronous copy or set): the poisons deferred so far in the
/// current context are queued first. One relaxed load when there are none; never fails the call.
#[inline]
pub fn stream_work() {
    if release::pending() {
        let _span = profile::span(profile::Class::Flush);
        let _ = std::panic::catch_unwind(isolate::flush_current);
    }
}

/// The class a hook of `kind` is timed under (`ISOLATE_PROFILE=on`).
#[inline]
pub fn profile_class(kind: &Call) -> profile::Class {
    match kind {
        Call::Alloc(_) => profile::Class::Alloc,
        Call::Free => profile::Class::Free,
        Call::Returns | Call::Releases => profile::Class::Other,
    }
}

/// Isolate mode: the bytes of stream-ordered allocations the program holds now (or their peak
/// since the last reset), for the pool statistics it reads; `None` in other modes.
pub fn pool_used(peak: bool) -> Option<u64> {
    isolating().then(|| isolate::pool_used(peak))
}

/// The program reset its pool's high-water mark.
pub fn pool_peak_reset() {
    if isolating() {
        isolate::pool_peak_reset();
    }
}

/// Isolate mode.
#[inline]
pub fn isolating() -> bool {
    config::get().mode == Mode::Isolate
}

/// From the constructor, before `main`, in isolate mode: PyTorch's caching allocator off
/// (isolate/pytorch.rs), other frameworks' pools off (frameworks.rs).
pub fn before_main() {
    isolate::before_main();
    frameworks::before_main();
}

/// Checks the quarantine now (isolate mode; nothing is held in log mode): the stale writes found
/// so far, this check's included. Never unwinds.
pub fn verify_now() -> u64 {
    std::panic::catch_unwind(|| {
        if isolating() {
            isolate::verify_now();
        }
        crate::record::writer::caught_up();
        crate::record::tally::get().stale_writes
    })
    .unwrap_or(0)
}

/// The trace started (the first CUDA call): in isolate mode, what was set for the frameworks that
/// are loaded is said now (frameworks.rs).
pub fn trace_started() {
    if isolating() {
        frameworks::say_for_loaded();
    }
}

pub fn at_exit() {
    if isolating() {
        frameworks::say_for_loaded();
        if config::get().guard && crate::record::writer::started() {
            // First: a fault of a kernel nobody waited for, before the exit check reads memory.
            let _ = std::panic::catch_unwind(launch::fault_at_exit);
        }
        isolate::at_exit_bounded();
        isolate::exit_notes();
        if check_launches() && crate::record::writer::started() {
            launch::note_at_exit();
            order::note_at_exit();
        }
    }
    if !crate::record::writer::started() {
        return;
    }
    let (n, ns) = crate::record::stacks::cost();
    let small = crate::record::stacks::small_stacks();
    if small > 0 {
        exit_note(
            isolate_trace::CostTopic::SmallStacks,
            small,
            0,
            format!(
                "call stacks: {small} left out, their threads' stacks having less than {} KiB \
                 left (a capture needs that much)",
                crate::record::stacks::CAPTURE_ROOM >> 10
            ),
        );
    }
    if n > 0 {
        let (hits, misses) = crate::record::stacks::native::cache_stats();
        let w = crate::record::stacks::native::walk_stats();
        exit_note(
            isolate_trace::CostTopic::Stacks,
            n,
            ns,
            format!(
                "call stacks: {n} captured, {:.2} us each on the calling threads (native \
                 frames: {} walks replayed from the thread's remembered walks, {} walked \
                 ({} from a start remembered with other stack words, {} too long to \
                 remember; {} remembered with saved frame pointers to check, {} not \
                 remembered at starts whose walks keep changing), with {hits} unwind rules from the rule cache, {misses} looked \
                 up; {} replayed with the stack they made, on threads without Python; {} \
                 stacks looked up in the process's table, the rest in the thread's cache)",
                ns as f64 / 1e3 / n as f64,
                w.replayed,
                w.walked,
                w.differed,
                w.long,
                w.uses_data,
                w.unstable,
                w.with_stack,
                crate::record::stacks::looked_up()
            ),
        );
    }
    if let Some(text) = profile::text() {
        exit_note(isolate_trace::CostTopic::Hooks, 0, 0, text);
    }
    if let Some(text) = profile::parts_text() {
        exit_note(isolate_trace::CostTopic::HookParts, 0, 0, text);
    }
}

/// A note about the library's own cost, written as the stack table's own records are: not
/// counted as an accepted event.
fn exit_note(topic: isolate_trace::CostTopic, size: u64, value: u64, text: String) {
    crate::record::writer::submit_definition(isolate_trace::Record::Note(isolate_trace::Note {
        seq: crate::record::event::next_seq(),
        ts_ns: crate::base::sys::now_ns(),
        kind: isolate_trace::NoteKind::Cost,
        ptr: topic as u64,
        size,
        value,
        text,
    }));
}

/// In a fork child (the fork handlers ran): every policy starts over; no lock another thread
/// of the parent held is waited for.
pub fn after_fork_child() {
    launch::after_fork_child();
    order::after_fork_child();
    guard::after_fork_child();
    isolate::after_fork_child();
    device::after_fork_child();
    reuse::after_fork_child();
}

/// Checks a launch's parameters against freed memory (isolate mode only; never fails the
/// launch), after queueing the deferred poisons before it: in the fast tier only when the launch
/// may reach one of their blocks ([`launch::Checked::reaches`]; the others wait for the next
/// launch that may, other stream work, or a full batch). What it returns goes to [`launched`]
/// with the launch's result.
/// # Safety
/// The arguments of a launch the driver is about to receive.
pub unsafe fn launch_check(
    api: isolate_trace::Api,
    f: CUfunction,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Option<launch::Guarded> {
    let lazy = lazy_poisons();
    if !lazy {
        stream_work();
    }
    // SAFETY: the caller's contract is `launch::check`'s.
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        profile::timed(profile::Part::LaunchCheck, || {
            launch::check(api, f, stream, params, extra)
        })
    }))
    .unwrap_or(launch::Checked::UNREAD);
    if lazy && checked.reaches {
        stream_work();
    }
    checked.guarded
}

/// The fast tier in isolate mode: a launch the launch check sees cannot reach a deferred
/// poison's block waits no longer for its poisons ([`launch_check`]).
#[inline]
fn lazy_poisons() -> bool {
    config::get().fast_isolation()
}

/// A hook of stream work is about to make its real call (never fails, never changes the call):
/// the deferred poisons are queued, and the stream-order check sees the call's uses and waits.
#[inline]
pub fn stream_op(op: &order::Op) {
    stream_work();
    order::before(op);
}

/// A hook of stream work's real call returned `r` (never changes it): what it ordered, and a
/// device fault it returned.
#[inline]
pub fn stream_op_done(by: &str, op: &order::Op, r: CUresult) {
    order::after(op, r);
    saw_code(by, r);
}

/// A stream capture is about to begin on a stream of the current context (never fails, never
/// changes the call): the deferred poisons are queued, and isolation's stream events recorded
/// while nothing captures ([`release::capture_start`]).
pub fn capture_start() {
    if isolating() {
        let _ = std::panic::catch_unwind(isolate::capture_start);
    } else {
        stream_work();
    }
}

/// The program is about to destroy `stream` (never fails, never changes the call).
pub fn stream_gone(stream: usize) {
    order::stream_gone(stream);
    if isolating() {
        let _ = std::panic::catch_unwind(|| isolate::stream_destroyed(stream as u64));
        let _ = std::panic::catch_unwind(|| release::stream_gone(stream));
    }
}

/// The program set a device's memory pool (never fails, never changes the call): isolation
/// stops serving stream-ordered allocations from memory it kept ([`reuse`]).
pub fn pool_set() {
    reuse::pool_set();
}

/// A context ended: events ask the device of a context again (its handle may be handed out
/// again, for another device).
pub fn contexts_changed() {
    crate::record::event::contexts_changed();
}

/// Kernels may be gone (a module or library unloaded, a context destroyed): the launch check
/// looks at its cached layouts again before it trusts them.
pub fn kernels_unloaded() {
    layout::kernels_unloaded();
}

/// After a checked launch returned `r` (never changes it).
pub fn launched(api: isolate_trace::Api, found: Option<launch::Guarded>, r: CUresult) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        launch::launched(api, found, r)
    }));
}

/// A launch or a kernel's load (the export `name`) returned `r`: where it ran out of memory
/// in isolate mode, the library gives back what it holds and calls it again (`again`,
/// isolate::out_of_room); the caller gets the first result unless the retry ran. Never
/// unwinds.
#[inline]
pub fn out_of_room(name: &str, r: CUresult, again: &mut dyn FnMut() -> CUresult) -> CUresult {
    if r != CUDA_ERROR_OUT_OF_MEMORY || !isolating() || order::any_capture() {
        // While a stream captures a graph, giving memory back (which waits for the release
        // stream) could be an unsafe call for a global-mode capture: the result as it is.
        return r;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        isolate::out_of_room(name, again)
    })) {
        Ok(CUDA_SUCCESS) => CUDA_SUCCESS,
        _ => r,
    }
}

/// A recorded call returned `r`: the first device fault is noted (every mode), naming the
/// launch check's suspects.
#[inline]
pub fn saw_result(api: isolate_trace::Api, r: i32) {
    if r >= 700 && isolate_trace::device_fault_name(r as u64).is_some() {
        launch::device_fault(api.name(), r);
    }
}

/// A call of stream work or a synchronisation (a hook that records no event) returned `r`:
/// the first device fault is noted (every mode), as [`saw_result`] does for recorded calls.
/// `cudaDeviceSynchronize` is such a call (`cuCtxSynchronize`), and it is where a faulting
/// kernel's 700 usually comes back (guard mode).
#[inline]
pub fn saw_code(by: &str, r: CUresult) {
    if r >= 700 && isolate_trace::device_fault_name(r as u64).is_some() {
        let _ = std::panic::catch_unwind(|| launch::device_fault(by, r));
    }
}

/// A context is about to end and take its memory with it (`cudaDeviceReset`'s
/// `cuDevicePrimaryCtxReset_v2`, a primary context's last release, `cuCtxDestroy_v2`; never
/// fails, never changes the call). In isolate mode the device is synchronised first (a fault
/// of a kernel nobody waited for is noted: guard mode's faulting stale write), then every
/// allocation in quarantine is checked and really freed while its memory is still there: after
/// the call there is nothing left to check, and the exit check would read memory the driver
/// took back. All contexts' quarantine goes, not only the ending one's: these calls are rare
/// (a program's end, a test's reset), and a check too many costs only time.
pub fn context_ends(by: &str, ctx: usize) {
    if !isolating() || crate::record::thread::nested() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let _inside = crate::record::thread::Inside::enter();
        if let Err(crate::base::cu::CuError::Code(r)) = crate::base::cu::ctx_synchronize() {
            saw_code(by, r);
        }
        isolate::before_context_ends();
        // What isolation made (module, release stream) and kept in that context goes with it:
        // a primary context made again after a reset often has the same handle, and the old
        // stream and kernels would be used there (a false stale write on the stand-in: a check
        // queued on the dead stream ran after the block was freed and handed out again).
        let ctx = if ctx == 0 {
            isolate::current_ctx()
        } else {
            ctx
        };
        if ctx != 0 {
            isolate::context_gone(ctx);
        }
    });
}

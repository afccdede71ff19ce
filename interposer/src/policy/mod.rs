//! What happens around each real call: in log mode, record it; in isolate mode, also keep freed
//! memory out of circulation (see [`isolate`]). Hooks call only these functions.

pub mod guard;
pub mod isolate;
pub mod launch;

use crate::config::{self, Mode};
use crate::cuda::*;
use crate::record::Pending;
use isolate_trace::Event;
use std::ffi::c_void;

/// Where an allocation call writes the address it hands out.
#[derive(Clone, Copy)]
pub enum Out {
    /// `CUdeviceptr *` (driver).
    Device(*mut CUdeviceptr),
    /// `void **` of device memory (runtime).
    DevicePtr(*mut *mut c_void),
    /// `void **` of host memory.
    Host(*mut *mut c_void),
    /// `cudaPitchedPtr *` (`cudaMalloc3D`).
    Pitched(*mut cudaPitchedPtr),
}

impl Out {
    /// The address the call wrote, 0 for a null out-pointer.
    pub fn read(self) -> u64 {
        unsafe {
            match self {
                Out::Device(p) if !p.is_null() => *p,
                Out::DevicePtr(p) | Out::Host(p) if !p.is_null() => *p as u64,
                Out::Pitched(p) if !p.is_null() => (*p).ptr as u64,
                _ => 0,
            }
        }
    }

    /// Writes the address (guard mode makes the allocation itself).
    pub fn write(self, ptr: u64) {
        unsafe {
            match self {
                Out::Device(p) if !p.is_null() => *p = ptr,
                Out::DevicePtr(p) | Out::Host(p) if !p.is_null() => *p = ptr as *mut c_void,
                Out::Pitched(p) if !p.is_null() => (*p).ptr = ptr as *mut c_void,
                _ => {}
            }
        }
    }

    pub fn is_null(self) -> bool {
        match self {
            Out::Device(p) => p.is_null(),
            Out::DevicePtr(p) | Out::Host(p) => p.is_null(),
            Out::Pitched(p) => p.is_null(),
        }
    }
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

#[inline]
fn isolating() -> bool {
    config::get().mode == Mode::Isolate
}

/// From the constructor, before `main`, in isolate mode.
pub fn before_main() {
    isolate::before_main();
}

pub fn at_exit() {
    if isolating() {
        isolate::at_exit();
    }
}

pub fn after_fork_child() {
    launch::after_fork_child();
    if isolating() {
        isolate::after_fork_child();
    }
}

/// An allocation: `call` makes the real one (it may be called again after an out-of-memory in
/// isolate mode), `after` adds what only the result tells (pitch).
#[inline]
pub fn alloc(
    proto: Event,
    out: Out,
    call: impl FnMut() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    if isolating() {
        return isolate::alloc(proto, out, call, after);
    }
    let mut call = call;
    let mut p = Pending::after(proto.api);
    p.ev = Event {
        seq: p.ev.seq,
        ..proto
    };
    let r = call();
    p.ev.result = r;
    if r == CUDA_SUCCESS {
        p.ev.ptr = out.read();
    }
    after(&mut p.ev);
    p.finish(r);
    r
}

/// A free of the allocation at `proto.ptr`.
#[inline]
pub fn free(proto: Event, call: impl FnOnce() -> i32) -> i32 {
    if isolating() {
        return isolate::free(proto, call);
    }
    let mut p = Pending::before(proto.api);
    p.ev = Event {
        seq: p.ev.seq,
        ..proto
    };
    let r = call();
    p.finish(r);
    r
}

/// Any other call: recorded as it is. `before`: take the sequence number before the real call
/// (calls that give something back).
#[inline]
pub fn other(
    proto: Event,
    before: bool,
    call: impl FnOnce() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    if isolating() {
        return isolate::other(proto, before, call, after);
    }
    record_other(proto, before, call, after)
}

/// Records a call that is neither an allocation nor a free, as it is (both modes).
fn record_other(
    proto: Event,
    before: bool,
    call: impl FnOnce() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    let mut p = if before {
        Pending::before(proto.api)
    } else {
        Pending::after(proto.api)
    };
    p.ev = Event {
        seq: p.ev.seq,
        ..proto
    };
    let r = call();
    p.ev.result = r;
    after(&mut p.ev);
    p.finish(r);
    r
}

/// Checks a launch's parameters against freed memory (isolate mode only; never fails the launch).
/// What it returns goes to [`launched`] with the launch's result.
/// # Safety
/// The arguments of a launch the driver is about to receive.
pub unsafe fn launch_check(
    api: isolate_trace::Api,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Option<launch::Guarded> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        launch::check(api, f, params, extra)
    }))
    .unwrap_or(None)
}

/// After a checked launch returned `r` (never changes it).
pub fn launched(api: isolate_trace::Api, found: Option<launch::Guarded>, r: CUresult) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        launch::launched(api, found, r)
    }));
}

/// A recorded call returned `r`: the first device fault is noted (every mode), naming the
/// launch check's suspects.
#[inline]
pub fn saw_result(api: isolate_trace::Api, r: i32) {
    if r >= 700 && isolate_trace::device_fault_name(r as u64).is_some() {
        launch::device_fault(api, r);
    }
}

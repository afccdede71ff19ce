//! What every hook shares: the guard around a recorded call ([`run`]), the result slot, the
//! event a hook starts from, and the row of a hook table ([`Hooked`]).
//!
//! Layer: hooks. Uses the policies, recording and the base.

use crate::record::profile::{self, Class};
use crate::record::thread::Inside;
use isolate_trace::{Api, Event};
use std::cell::Cell;
use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body` under the guard, or `passthrough` when recording is off or this call is nested
/// inside another hook. `body` gets a slot where the real call's result is put as soon as it is
/// known, so that even if recording panicked the caller gets that exact result.
#[inline(always)]
pub(crate) fn run(
    api: Api,
    class: Class,
    body: impl FnOnce(&Cell<Option<i32>>) -> i32,
    passthrough: impl FnOnce() -> i32,
) -> i32 {
    if !crate::policy::intercepting() {
        return passthrough();
    }
    let Some(_inside) = Inside::enter() else {
        return passthrough();
    };
    let _span = profile::span(class);
    // Stack walks start here, in the hook's own frame (inlined into it).
    let _entry = crate::record::stacks::native::Entry::mark();
    let slot = Cell::new(None);
    match catch_unwind(AssertUnwindSafe(|| {
        let r = body(&slot);
        crate::policy::saw_result(api, r);
        r
    })) {
        Ok(r) => r,
        Err(_) => match slot.get() {
            Some(r) => r,
            None => passthrough(),
        },
    }
}

/// Calls the real function, timed as the pending event's real call
/// ([`crate::record::event::real_call`]), and puts its result in the slot.
#[inline(always)]
pub(crate) fn call(slot: &Cell<Option<i32>>, f: impl FnOnce() -> i32) -> i32 {
    let r = crate::record::event::real_call(f);
    slot.set(Some(r));
    r
}

/// The event a hook starts from.
#[inline(always)]
pub(crate) fn proto(api: Api) -> Event {
    Event {
        api,
        device: -1,
        ..Event::default()
    }
}

/// One export we hook: its exact name, the hook we hand out, where the real one goes, and
/// whether a pointer is (or, none being known, becomes) the real one: `Real::adopt`.
pub struct Hooked {
    pub name: &'static CStr,
    /// The hook's own symbol name, which must be `name`.
    pub export: &'static str,
    pub hook: *const c_void,
    pub store: fn(*mut c_void),
    pub adopt: fn(*mut c_void) -> bool,
    /// One of the launch check's hooks (its body is `[launch …]` or `[unloads]`: a kernel
    /// launch, or a call after which a kernel handle may stand for another kernel), handed out
    /// only in isolate mode.
    pub launch: bool,
    /// The API row it records under (`[Api, …]` and `[launch Api, …]` bodies), else `None`.
    pub api: Option<Api>,
}

// SAFETY: the table is immutable.
unsafe impl Sync for Hooked {}

//! `dlsym`: hands out our resolver and our hooks for lookups by name.
//!
//! Layer: hooks. Uses the policies, the base, and the tables of [`super::driver`] and
//! [`super::runtime`].

use super::driver::{cuGetProcAddress, cuGetProcAddress_v2};
use super::runtime::RUNTIME_HOOKED;
use crate::base::resolve::{self, REAL_DLSYM};
use std::ffi::{CStr, c_char, c_void};

/// `dlsym`, as a tail-jump stub. glibc's `dlsym` decides `RTLD_NEXT` by its caller's return
/// address; a wrapper that called it would make every `RTLD_NEXT` lookup relative to *this*
/// library and break other interposers. So the stub asks [`dlsym_intercept`] whether the name
/// is one we answer, and otherwise jumps to the real `dlsym` with the caller's frame untouched.
///
/// # Safety
/// Same contract as `dlsym(3)`.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {intercept}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        intercept = sym dlsym_intercept,
        real = sym REAL_DLSYM,
    )
}

/// Returns our resolver when `symbol` is `cuGetProcAddress` or `cuGetProcAddress_v2` and the
/// lookup would have found the driver's, our hook for a hooked driver or runtime function looked
/// up in a real handle (not `RTLD_DEFAULT`/`RTLD_NEXT`) that has it; null (meaning: let the real
/// `dlsym` answer) otherwise. Also makes sure the real `dlsym` is known before the stub jumps to
/// it.
extern "C" fn dlsym_intercept(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    if resolve::real_dlsym().is_none() || symbol.is_null() {
        return std::ptr::null_mut();
    }
    // Cheap first test: every dlsym of the process comes through here.
    // Byte by byte, so a short name is never read past its terminator.
    let b = symbol as *const u8;
    // SAFETY: `symbol` is a NUL-terminated name (dlsym's contract); the second byte is read only
    // when the first is not the terminator (`||` stops at the first test).
    if unsafe { *b != b'c' || *b.add(1) != b'u' } {
        return std::ptr::null_mut();
    }
    if !crate::policy::intercepting() {
        return std::ptr::null_mut();
    }
    // SAFETY: as above: dlsym's `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) };
    let special = handle.is_null() || handle == libc::RTLD_NEXT;
    if let b"cuGetProcAddress_v2" | b"cuGetProcAddress" = name.to_bytes() {
        let (ours, real): (*mut c_void, &dyn Fn(*mut c_void)) = if name.to_bytes().ends_with(b"_v2")
        {
            (cuGetProcAddress_v2 as *mut c_void, &|p| {
                super::driver::reals::cuGetProcAddress_v2.store(p)
            })
        } else {
            (cuGetProcAddress as *mut c_void, &|p| {
                super::driver::reals::cuGetProcAddress.store(p)
            })
        };
        if special {
            // RTLD_DEFAULT finds our own export first anyway; RTLD_NEXT gets the driver if loaded.
            if handle == libc::RTLD_NEXT && resolve::libcuda_loaded().is_null() {
                return std::ptr::null_mut();
            }
            return ours;
        }
        let p = resolve::dlsym_in(handle, name);
        if p.is_null() {
            return std::ptr::null_mut(); // not in that handle: the real dlsym says so too
        }
        if !resolve::is_ours(p) {
            real(p);
        }
        return ours;
    }
    // A driver memory or launch function fetched by name from the driver library (Triton's
    // launcher, PyTorch 2.5-2.7's expandable segments): the same hook the resolver hands out.
    // RTLD_NEXT keeps its caller-relative meaning: passed through untouched.
    if special {
        return std::ptr::null_mut();
    }
    if name.to_bytes().starts_with(b"cuda") {
        return runtime_hook(handle, name);
    }
    let Some(h) = super::driver::driver_hook(name) else {
        return std::ptr::null_mut();
    };
    if !super::driver::handed_out(h) {
        return std::ptr::null_mut();
    }
    let p = resolve::dlsym_in(handle, name);
    if p.is_null() || resolve::is_ours(p) || resolve::export_name(p) != Some(name) {
        return std::ptr::null_mut();
    }
    (h.store)(p);
    h.hook as *mut c_void
}

/// A hooked runtime function fetched by name from a runtime's handle (ctypes, cffi, JIT
/// runtimes): our hook when the handle's function is the one the hook calls (found now if not
/// yet, or this one when none can be found); null, so that the real `dlsym` answers, when it is
/// another copy of the runtime, whose users keep their own, or a name we do not hook.
fn runtime_hook(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let Some(h) = RUNTIME_HOOKED.iter().find(|h| h.name == name) else {
        return std::ptr::null_mut();
    };
    let p = resolve::dlsym_in(handle, name);
    if p.is_null() || resolve::is_ours(p) || !(h.adopt)(p) {
        return std::ptr::null_mut();
    }
    h.hook as *mut c_void
}

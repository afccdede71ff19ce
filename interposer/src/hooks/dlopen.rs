//! `dlopen`: a library opened with `RTLD_DEEPBIND` (a plugin, with its own copy of whatever the
//! host has) searches its own dependencies before the global scope, so its calls to the runtime
//! and the driver bind straight to them and pass our exports by. After such a `dlopen`, the GOT
//! slots of the objects it loaded that hold a function we hook are pointed at our hook.
//!
//! Layer: hooks. Uses the policies, the base, and the tables of [`super::driver`],
//! [`super::runtime`] and the `dlsym` stub of [`super::dl`].

use super::runtime::RUNTIME_HOOKED;
use crate::base::got::{self, Import, Object};
use crate::base::loader::{self, DlopenFn};
use crate::base::resolve::{self, REAL_DLSYM};
use crate::base::sys::{nap, warn};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};

/// `dlopen`, as a tail-jump stub. glibc's `dlopen` reads its caller from its return address
/// (for `$ORIGIN`, the caller's `DT_RPATH`/`DT_RUNPATH`, its namespace); a wrapper that called
/// it would make every `dlopen` of the process look made by this library. So the stub asks
/// [`dlopen_route`] where to go: for every call but an `RTLD_DEEPBIND` one, the real `dlopen`,
/// jumped to with the caller's frame untouched; for those, [`dlopen_deepbind`], jumped to with
/// the caller's return address as a third argument.
///
/// # Safety
/// Same contract as `dlopen(3)`.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, flags: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "mov rdx, [rsp]",
        "jmp {deepbind}",
        route = sym dlopen_route,
        deepbind = sym dlopen_deepbind,
    )
}

/// The real `dlopen` for a call to pass straight to; 0 for a call [`dlopen_deepbind`] makes:
/// one with `RTLD_DEEPBIND` that may load something (a name, no `RTLD_NOLOAD`), while we
/// intercept. Also 0 when the real `dlopen` cannot be found: [`dlopen_deepbind`] then returns
/// null.
extern "C" fn dlopen_route(file: *const c_char, flags: c_int) -> usize {
    // The call stacks' next capture on this thread looks at what is loaded at once.
    crate::record::stacks::modules::dlopen_called();
    let Some(real) = loader::real_dlopen() else {
        return 0;
    };
    if flags & libc::RTLD_DEEPBIND == 0
        || flags & libc::RTLD_NOLOAD != 0
        || file.is_null()
        || !crate::policy::intercepting()
    {
        return real as usize;
    }
    0
}

/// One `RTLD_DEEPBIND` open at a time rewrites GOTs (the read-only pages are made writable and
/// read-only again around each write): the thread id of the one that does, 0 when none.
static PATCHING: AtomicU32 = AtomicU32::new(0);

/// Holds [`PATCHING`]. A holder that is no thread of this process (a `fork()` child of a process
/// where another thread was rewriting) is taken over.
struct Patching;

impl Patching {
    fn take() -> Patching {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        loop {
            match PATCHING.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Patching,
                Err(holder) => {
                    // SAFETY: signal 0 only asks whether thread `holder` of this process exists.
                    let gone = unsafe {
                        libc::syscall(libc::SYS_tgkill, libc::getpid(), holder as libc::c_long, 0)
                    } != 0;
                    if gone
                        && PATCHING
                            .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    {
                        return Patching;
                    }
                    nap(50_000);
                }
            }
        }
    }
}

impl Drop for Patching {
    fn drop(&mut self) {
        PATCHING.store(0, Ordering::Release);
    }
}

/// An `RTLD_DEEPBIND` `dlopen` made by the code at `caller`: opens the file the caller's own
/// call would have opened ([`loader::as_caller_would`]), then points the new objects' slots of
/// hooked functions at our hooks ([`observe`]). Returns exactly what the real `dlopen` returned,
/// with its `dlerror` state and `errno`.
extern "C" fn dlopen_deepbind(
    file: *const c_char,
    flags: c_int,
    caller: *const c_void,
) -> *mut c_void {
    let Some(real) = loader::real_dlopen() else {
        return std::ptr::null_mut();
    };
    let (path, before) = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `file` is dlopen's NUL-terminated name (checked non-null above).
        let path = loader::as_caller_would(unsafe { CStr::from_ptr(file) }, caller);
        (path, got::loaded())
    }))
    .unwrap_or((None, Vec::new()));
    let handle = open(real, file, path.as_deref(), flags);
    if handle.is_null() || before.is_empty() {
        return handle;
    }
    // SAFETY: errno is this thread's.
    let errno = unsafe { *libc::__errno_location() };
    let _ = catch_unwind(AssertUnwindSafe(|| observe(real, handle, &before)));
    // Our own look-ups leave nothing behind: after a successful dlopen, dlerror() says nothing.
    // SAFETY: dlerror has no preconditions (it clears this thread's message).
    unsafe { libc::dlerror() };
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = errno };
    handle
}

/// The real `dlopen` of `path` where the caller would have opened that file, else of `file`.
fn open(real: DlopenFn, file: *const c_char, path: Option<&CStr>, flags: c_int) -> *mut c_void {
    if let Some(path) = path {
        // SAFETY: the real dlopen, with a NUL-terminated path.
        let h = unsafe { real(path.as_ptr(), flags) };
        if !h.is_null() {
            return h;
        }
    }
    // SAFETY: the real dlopen, with the caller's own arguments.
    unsafe { real(file, flags) }
}

/// Points the GOT slots of every object loaded since `before` at our hooks, where the slot
/// holds (or, not bound yet, will hold) the function the hook calls. libcuda, libcudart and this
/// library are never rewritten; an object whose tables cannot be read is left alone, with one
/// warning.
fn observe(real: DlopenFn, handle: *mut c_void, before: &[Object]) {
    let _one = Patching::take();
    for obj in got::loaded() {
        if before.iter().any(|b| b.same(&obj)) || obj.name.is_empty() {
            continue;
        }
        // Held while it is read and written: another thread may close what it loaded meanwhile.
        // SAFETY: the real dlopen, with the object's NUL-terminated name (RTLD_NOLOAD: no new
        // load).
        let held = unsafe { real(obj.name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if held.is_null() {
            continue;
        }
        rewrite(handle, &obj);
        // SAFETY: the handle our RTLD_NOLOAD open returned, closed once.
        unsafe { libc::dlclose(held) };
    }
}

/// Points `obj`'s slots at our hooks (see [`observe`]).
fn rewrite(handle: *mut c_void, obj: &Object) {
    if untouchable(obj) {
        return;
    }
    let imports = match obj.imports() {
        Ok(i) => i,
        Err(e) => {
            warn(&format!(
                "{}: {e}: its CUDA calls are not observed (loaded with RTLD_DEEPBIND)",
                obj.name.to_string_lossy()
            ));
            return;
        }
    };
    for imp in &imports {
        let Some(hook) = replacement(handle, imp) else {
            continue;
        };
        if let Err(e) = obj.write(imp.slot, hook) {
            warn(&format!(
                "{}: {e}: its CUDA calls are not all observed (loaded with RTLD_DEEPBIND)",
                obj.name.to_string_lossy()
            ));
            return;
        }
    }
}

/// The driver, the runtime (any file name it ships under) and this library keep their own
/// bindings.
fn untouchable(obj: &Object) -> bool {
    let f = obj.file_name();
    f.starts_with(b"libcuda.so") || f.starts_with(b"libcudart") || resolve::is_ours(obj.bias as _)
}

/// Our hook for an import, when the function the slot holds, or will be bound to, is the one
/// that hook calls (`Real::adopt`; `dlsym` and `dlopen`: glibc's own). Launch hooks only when
/// the launch check is on.
fn replacement(handle: *mut c_void, imp: &Import<'_>) -> Option<usize> {
    let name = imp.name.to_bytes();
    let target = || {
        let p = if imp.unbound {
            bound_to(handle, imp)
        } else {
            imp.value
        };
        (p != 0 && !resolve::is_ours(p as *const c_void)).then_some(p)
    };
    match name {
        b"dlsym" => {
            resolve::real_dlsym()?;
            let t = target()?;
            (t == REAL_DLSYM.load(Ordering::Acquire))
                .then_some(super::dl::dlsym as *const () as usize)
        }
        b"dlopen" => {
            let t = target()?;
            (t == loader::real_dlopen()? as usize).then_some(dlopen as *const () as usize)
        }
        _ if name.starts_with(b"cu") => {
            let h = super::driver::driver_hook(imp.name)
                .or_else(|| RUNTIME_HOOKED.iter().find(|h| h.name == imp.name))?;
            if !super::driver::handed_out(h) {
                return None;
            }
            let t = target()?;
            (h.adopt)(t as *mut c_void).then_some(h.hook as usize)
        }
        _ => None,
    }
}

/// The function a lazy slot not bound yet will be bound to: the symbol (at the version the
/// reference asks for) in the opened library's scope, which comes first for every object an
/// `RTLD_DEEPBIND` open loads. 0 when that scope has none: then the global scope binds it,
/// where our export comes first.
fn bound_to(handle: *mut c_void, imp: &Import<'_>) -> usize {
    let p = match imp.version {
        // SAFETY: a handle of a loaded object and NUL-terminated name and version.
        Some(v) => unsafe { libc::dlvsym(handle, imp.name.as_ptr(), v.as_ptr()) },
        None => resolve::dlsym_in(handle, imp.name),
    };
    p as usize
}

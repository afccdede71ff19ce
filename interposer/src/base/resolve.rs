//! Finding functions: the real `dlsym`, the driver library, the runtime library, whether a
//! pointer is ours, and which export a pointer is. [`super::real`] looks its functions up here.
//!
//! Layer: base. Uses nothing of this crate.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym` (glibc's), found with `dlvsym` so that our own override is never in the way.
/// Read by the `dlsym` stub (the hooks' `dl` module) as a plain machine word.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

pub fn real_dlsym() -> Option<DlsymFn> {
    let p = libc_versioned(&REAL_DLSYM, c"dlsym")?;
    // SAFETY: `p` is non-zero and was returned by dlvsym for libc's `dlsym`, whose C signature is
    // `DlsymFn`'s; a usize and a function pointer have the same size.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// libc's own `name` (glibc ≥ 2.34 defines `dlsym`/`dlopen` in libc.so.6 under GLIBC_2.34 and
/// keeps the old versions), found with `dlvsym` so that our own export of the same name is
/// never in the way, and kept in `cache`.
pub fn libc_versioned(cache: &AtomicUsize, name: &CStr) -> Option<usize> {
    let mut p = cache.load(Ordering::Acquire);
    if p == 0 {
        for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17", c"GLIBC_2.1"] {
            // SAFETY: `name` and `ver` are NUL-terminated (&CStr); RTLD_NEXT is a valid
            // pseudo-handle; a symbol that is missing gives null.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), ver.as_ptr()) } as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            return None;
        }
        cache.store(p, Ordering::Release);
    }
    Some(p)
}

/// Looks `name` up in `handle` through the real `dlsym`.
#[allow(clippy::not_unsafe_ptr_arg_deref)] // dlsym takes any handle and says no
pub fn dlsym_in(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: `f` is glibc's dlsym and `name` NUL-terminated. The handle is the caller's to get
        // right: every caller passes a pseudo-handle (RTLD_DEFAULT, RTLD_NEXT) or one that dlopen
        // returned and that is still open; glibc answers null for a symbol that is not there.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

static OUR_BASE: AtomicUsize = AtomicUsize::new(0);

fn dladdr(p: *const c_void) -> Option<libc::Dl_info> {
    // SAFETY: Dl_info is a C struct of pointers, for which all-zero (null) is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only compares `p` with the loaded objects' ranges (any value is allowed: 0
    // when none holds it) and writes `info`, a live local.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        return None;
    }
    Some(info)
}

/// True when `p` lies inside libisolate.so itself: such a pointer must never be stored as the
/// "real" function (see the double-wrap hang in the call-path notes, section 5).
pub fn is_ours(p: *const c_void) -> bool {
    let mut base = OUR_BASE.load(Ordering::Relaxed);
    if base == 0 {
        let Some(info) = dladdr(is_ours as *const c_void) else {
            return false;
        };
        base = info.dli_fbase as usize;
        OUR_BASE.store(base, Ordering::Relaxed);
    }
    matches!(dladdr(p), Some(info) if info.dli_fbase as usize == base)
}

/// The exact exported symbol name of the function that starts at `p`.
pub fn export_name(p: *const c_void) -> Option<&'static CStr> {
    let info = dladdr(p)?;
    if info.dli_sname.is_null() || !std::ptr::eq(info.dli_saddr as *const c_void, p) {
        return None;
    }
    // The name lives in the loaded object's string table for as long as it stays loaded;
    // drivers are never unloaded while in use.
    // SAFETY: checked non-null above; dladdr's `dli_sname` is a NUL-terminated name in the
    // object's string table (the lifetime argument is the comment above).
    Some(unsafe { CStr::from_ptr(info.dli_sname) })
}

static LIBCUDA: AtomicUsize = AtomicUsize::new(0);

/// A handle on the driver library the process uses (loading it if nobody has yet: only done
/// when a driver entry point of ours has already been called, so the process uses CUDA).
pub fn libcuda() -> *mut c_void {
    let h = LIBCUDA.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    // SAFETY: a NUL-terminated literal name; RTLD_NOLOAD loads nothing and answers null when the
    // driver is not loaded.
    let mut h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        // SAFETY: a NUL-terminated literal name. Loading the driver runs its initialisers, which is
        // why this is only reached once a driver entry point of ours was called (see above).
        h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    }
    if !h.is_null() {
        LIBCUDA.store(h as usize, Ordering::Release);
    }
    h
}

static LIBCUDART: AtomicUsize = AtomicUsize::new(0);

/// A handle on the CUDA runtime library already loaded in the process. PyTorch loads it as a
/// dependency of an extension module opened `RTLD_LOCAL`, so `RTLD_NEXT` alone does not see it.
pub fn libcudart() -> *mut c_void {
    let h = LIBCUDART.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: glibc passes a pointer to a `dl_phdr_info` valid for the duration of the
        // callback.
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        // SAFETY: checked non-null above: the loader's NUL-terminated name of the object, alive
        // while the callback runs (only used inside it).
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        let file = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
        if file.starts_with(b"libcudart.so") {
            // SAFETY: `name` is the NUL-terminated name of an object the loader has loaded (we are
            // inside dl_iterate_phdr, whose lock is recursive, so dlopen from the callback is
            // allowed); RTLD_NOLOAD takes a reference and loads nothing.
            let h = unsafe { libc::dlopen(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if !h.is_null() {
                // SAFETY: `data` is `&mut found` (a live `*mut c_void`) that `libcudart` passed to
                // dl_iterate_phdr, which calls this synchronously.
                unsafe { *(data as *mut *mut c_void) = h };
                return 1;
            }
        }
        0
    }
    let mut found: *mut c_void = std::ptr::null_mut();
    // SAFETY: `each` has the callback's C signature; `data` is `&mut found`, which is what `each`
    // casts it back to, alive for the whole (synchronous) iteration.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut _ as *mut c_void) };
    if !found.is_null() {
        LIBCUDART.store(found as usize, Ordering::Release);
    }
    found
}

/// The driver library if it is loaded already (never loads it).
pub fn libcuda_loaded() -> *mut c_void {
    let h = LIBCUDA.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    // SAFETY: a NUL-terminated literal name; RTLD_NOLOAD never loads the driver.
    unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    }
}

/// True when another copy of this library (another path, same exports) comes before this one
/// in the process's symbol order: the program's calls reach that copy, and this one must stand
/// down rather than record (and in isolate mode, hold memory) a second time. A copy is an
/// object that defines both the driver's resolver and `execve`, which no CUDA library does.
pub fn another_copy_first() -> bool {
    let p = dlsym_in(libc::RTLD_DEFAULT, c"cuGetProcAddress_v2");
    if p.is_null() || is_ours(p) {
        return false;
    }
    let Some(info) = dladdr(p) else { return false };
    if info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: checked non-null above: dladdr's NUL-terminated path of a loaded object; RTLD_NOLOAD
    // takes a reference to it and loads nothing.
    let h = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return false;
    }
    let q = dlsym_in(h, c"execve");
    // SAFETY: `h` is the non-null handle just opened with RTLD_NOLOAD: this drops that reference
    // only, and `q` is compared as an address afterwards, never called.
    unsafe { libc::dlclose(h) };
    !q.is_null() && matches!(dladdr(q), Some(i) if i.dli_fbase == info.dli_fbase)
}

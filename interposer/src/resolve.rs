//! Finding the real functions: the real `dlsym`, the driver library, the runtime library, and
//! the tables that map an exact export name to the hook we hand out in its place.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym` (glibc's), found with `dlvsym` so that our own override is never in the way.
/// Read by the `dlsym` stub in [`crate::hooks::dl`] as a plain machine word.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        // glibc ≥ 2.34 defines dlsym in libc.so.6 under GLIBC_2.34 and keeps the old version.
        for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) } as usize;
            if p != 0 {
                break;
            }
        }
        if p == 0 {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// Looks `name` up in `handle` through the real `dlsym`.
#[allow(clippy::not_unsafe_ptr_arg_deref)] // dlsym takes any handle and says no
pub fn dlsym_in(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

static OUR_BASE: AtomicUsize = AtomicUsize::new(0);

fn dladdr(p: *const c_void) -> Option<libc::Dl_info> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
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
    let mut h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
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
fn libcudart() -> *mut c_void {
    let h = LIBCUDART.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        let file = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
        if file.starts_with(b"libcudart.so") {
            let h = unsafe { libc::dlopen(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if !h.is_null() {
                unsafe { *(data as *mut *mut c_void) = h };
                return 1;
            }
        }
        0
    }
    let mut found: *mut c_void = std::ptr::null_mut();
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut _ as *mut c_void) };
    if !found.is_null() {
        LIBCUDART.store(found as usize, Ordering::Release);
    }
    found
}

/// Where a [`Real`] is looked up when nothing has stored it yet.
#[derive(Clone, Copy)]
pub enum Lib {
    Driver,
    Runtime,
}

/// The real function behind one of our hooks (or one we only call), resolved once.
pub struct Real<F> {
    pub name: &'static CStr,
    lib: Lib,
    ptr: AtomicUsize,
    _f: PhantomData<F>,
}

// SAFETY: only an atomic word is shared.
unsafe impl<F> Sync for Real<F> {}

impl<F: Copy> Real<F> {
    pub const fn new(name: &'static CStr, lib: Lib) -> Self {
        Self {
            name,
            lib,
            ptr: AtomicUsize::new(0),
            _f: PhantomData,
        }
    }

    /// Records the real function the driver's resolver handed out for this export.
    pub fn store(&self, p: *mut c_void) {
        self.ptr.store(p as usize, Ordering::Release);
    }

    /// The real function, found on first use. `None` only if the library has no such symbol.
    #[inline]
    pub fn get(&self) -> Option<F> {
        let p = self.addr();
        if p == 0 {
            return None;
        }
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: F is the function-pointer type of this symbol.
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
    }

    /// True when the real function is `p`: the one already known or found now (as by
    /// [`Real::get`]), or `p` itself, stored, when none can be found. Never replaces a
    /// different one: that one belongs to another copy of the library, whose users it serves.
    pub fn adopt(&self, p: *mut c_void) -> bool {
        let cur = self.addr();
        if cur != 0 {
            return cur == p as usize;
        }
        match self
            .ptr
            .compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(cur) => cur == p as usize,
        }
    }

    #[inline]
    fn addr(&self) -> usize {
        let mut p = self.ptr.load(Ordering::Acquire);
        if p == 0 {
            p = self.lookup();
            if p == 0 {
                return 0;
            }
            self.ptr.store(p, Ordering::Release);
        }
        p
    }

    #[cold]
    fn lookup(&self) -> usize {
        let p = match self.lib {
            Lib::Driver => {
                let h = libcuda();
                if h.is_null() {
                    std::ptr::null_mut()
                } else {
                    dlsym_in(h, self.name)
                }
            }
            Lib::Runtime => {
                let p = dlsym_in(libc::RTLD_NEXT, self.name);
                if !p.is_null() && !is_ours(p) {
                    p
                } else {
                    let h = libcudart();
                    if h.is_null() {
                        std::ptr::null_mut()
                    } else {
                        dlsym_in(h, self.name)
                    }
                }
            }
        };
        if p.is_null() || is_ours(p) {
            0
        } else {
            p as usize
        }
    }
}

/// One export we hook: its exact name, the hook we hand out, where the real one goes, and
/// whether a pointer is (or, none being known, becomes) the real one: [`Real::adopt`].
pub struct Hooked {
    pub name: &'static CStr,
    pub hook: *const c_void,
    pub store: fn(*mut c_void),
    pub adopt: fn(*mut c_void) -> bool,
}

// SAFETY: the table is immutable.
unsafe impl Sync for Hooked {}

/// Given what the real resolver (`cuGetProcAddress`, `cudaGetDriverEntryPoint*`) handed back,
/// returns what the caller should get: our hook for an export we know (the real one stored),
/// else the pointer unchanged.
pub fn substitute(p: *mut c_void) -> *mut c_void {
    if p.is_null() || is_ours(p) {
        return p;
    }
    let Some(name) = export_name(p) else { return p };
    match crate::hooks::HOOKED.iter().find(|h| h.name == name) {
        Some(h) if !crate::hooks::is_launch(h) || crate::policy::check_launches() => {
            (h.store)(p);
            h.hook as *mut c_void
        }
        _ => p,
    }
}

/// The driver library if it is loaded already (never loads it).
pub fn libcuda_loaded() -> *mut c_void {
    let h = LIBCUDA.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    }
}

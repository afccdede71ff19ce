//! `dlsym`, the driver's resolver `cuGetProcAddress`, and the process-life exports
//! (`_exit`, `exec*`).

use crate::cuda::*;
use crate::resolve::{self, Lib, REAL_DLSYM, Real};
use std::ffi::{CStr, c_char, c_int, c_void};

pub static REAL_GET_PROC_ADDRESS_V2: Real<FnGetProcAddressV2> =
    Real::new(c"cuGetProcAddress_v2", Lib::Driver);
pub static REAL_GET_PROC_ADDRESS: Real<FnGetProcAddressV1> =
    Real::new(c"cuGetProcAddress", Lib::Driver);

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
    if unsafe { *b != b'c' || *b.add(1) != b'u' } {
        return std::ptr::null_mut();
    }
    if !crate::policy::intercepting() {
        return std::ptr::null_mut();
    }
    let name = unsafe { CStr::from_ptr(symbol) };
    let special = handle.is_null() || handle == libc::RTLD_NEXT;
    if let b"cuGetProcAddress_v2" | b"cuGetProcAddress" = name.to_bytes() {
        let (ours, real): (*mut c_void, &dyn Fn(*mut c_void)) = if name.to_bytes().ends_with(b"_v2")
        {
            (cuGetProcAddress_v2 as *mut c_void, &|p| {
                REAL_GET_PROC_ADDRESS_V2.store(p)
            })
        } else {
            (cuGetProcAddress as *mut c_void, &|p| {
                REAL_GET_PROC_ADDRESS.store(p)
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
    let Some(h) = crate::hooks::HOOKED.iter().find(|h| h.name == name) else {
        return std::ptr::null_mut();
    };
    if crate::hooks::is_launch(h) && !crate::policy::check_launches() {
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
    let Some(h) = crate::hooks::RUNTIME_HOOKED.iter().find(|h| h.name == name) else {
        return std::ptr::null_mut();
    };
    let p = resolve::dlsym_in(handle, name);
    if p.is_null() || resolve::is_ours(p) || !(h.adopt)(p) {
        return std::ptr::null_mut();
    }
    h.hook as *mut c_void
}

/// Resolves through the real `cuGetProcAddress_v2`, then hands back our hook for exports we
/// hook (decided by the exact export the driver returned) and the real pointer for the rest.
///
/// # Safety
/// Same contract as the driver's `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let Some(real) = REAL_GET_PROC_ADDRESS_V2.get() else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let r = unsafe { real(symbol, pfn, cuda_version, flags, status) };
    if r == CUDA_SUCCESS && !pfn.is_null() && crate::policy::intercepting() {
        unsafe { *pfn = resolve::substitute(*pfn) };
    }
    r
}

/// The pre-12.0 resolver ABI (no status out-parameter).
///
/// # Safety
/// Same contract as the driver's `cuGetProcAddress`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let Some(real) = REAL_GET_PROC_ADDRESS.get() else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let r = unsafe { real(symbol, pfn, cuda_version, flags) };
    if r == CUDA_SUCCESS && !pfn.is_null() && crate::policy::intercepting() {
        unsafe { *pfn = resolve::substitute(*pfn) };
    }
    r
}

type ExitFn = unsafe extern "C" fn(c_int) -> !;
static REAL_EXIT: Real<ExitFn> = Real::new(c"_exit", Lib::Runtime);
static REAL_EXIT2: Real<ExitFn> = Real::new(c"_Exit", Lib::Runtime);

/// `_exit`: no destructors will run, so the trace is closed here first.
///
/// # Safety
/// Same contract as `_exit(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    crate::lifecycle::before_underscore_exit();
    match REAL_EXIT.get() {
        Some(f) => unsafe { f(status) },
        None => unsafe {
            libc::syscall(libc::SYS_exit_group, status);
            std::process::abort()
        },
    }
}

/// `_Exit`, same as `_exit`.
///
/// # Safety
/// Same contract as `_Exit(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    crate::lifecycle::before_underscore_exit();
    match REAL_EXIT2.get() {
        Some(f) => unsafe { f(status) },
        None => unsafe {
            libc::syscall(libc::SYS_exit_group, status);
            std::process::abort()
        },
    }
}

type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;
static REAL_EXECVE: Real<ExecveFn> = Real::new(c"execve", Lib::Runtime);
static REAL_EXECVPE: Real<ExecveFn> = Real::new(c"execvpe", Lib::Runtime);
static REAL_EXECV: Real<ExecvFn> = Real::new(c"execv", Lib::Runtime);
static REAL_EXECVP: Real<ExecvFn> = Real::new(c"execvp", Lib::Runtime);

macro_rules! exec_hook {
    ($name:ident, $real:ident, ($($a:ident: $t:ty),*)) => {
        /// Closes the trace (with an end record saying `exec`) before the process is replaced.
        ///
        /// # Safety
        /// Same contract as the libc function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            crate::lifecycle::before_exec();
            match $real.get() {
                Some(f) => unsafe { f($($a),*) },
                None => {
                    unsafe { *libc::__errno_location() = libc::ENOSYS };
                    -1
                }
            }
        }
    };
}

exec_hook!(execve, REAL_EXECVE, (path: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execvpe, REAL_EXECVPE, (file: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execv, REAL_EXECV, (path: *const c_char, argv: *const *const c_char));
exec_hook!(execvp, REAL_EXECVP, (file: *const c_char, argv: *const *const c_char));

// The variadic forms (`execl`, `execlp`, `execle`): glibc implements them without going through
// the PLT, so hooking the vector forms alone would miss them, and Rust cannot define variadic
// functions. Each is a stub that lays the five register arguments after `path` out in memory
// next to the stack arguments and calls a collector, which builds `argv` and calls our hook.

macro_rules! variadic_exec {
    ($name:ident, $collect:ident) => {
        /// Builds `argv` from the arguments and calls the vector form (our hook).
        ///
        /// # Safety
        /// Same contract as the libc function of this name.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name() -> c_int {
            core::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "mov rsi, rsp",
                "lea rdx, [rbp + 16]",
                "sub rsp, 8",
                "call {collect}",
                "leave",
                "ret",
                collect = sym $collect,
            )
        }
    };
}

variadic_exec!(execl, collect_execl);
variadic_exec!(execlp, collect_execlp);
variadic_exec!(execle, collect_execle);

const MAX_ARGS: usize = 1 << 16;

/// Reads the argument list (five from registers, the rest from the stack) up to its NULL;
/// returns it with the terminating NULL, and the word after it (`envp` for `execle`).
unsafe fn args(
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> Option<(Vec<*const c_char>, *const c_char)> {
    let at = |i: usize| unsafe {
        if i < 5 {
            *regs.add(i)
        } else {
            *stack.add(i - 5)
        }
    };
    let mut v = Vec::new();
    for i in 0..MAX_ARGS {
        let a = at(i);
        v.push(a);
        if a.is_null() {
            return Some((v, at(i + 1)));
        }
    }
    None
}

fn e2big() -> c_int {
    unsafe { *libc::__errno_location() = libc::E2BIG };
    -1
}

extern "C" fn collect_execl(
    path: *const c_char,
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> c_int {
    match unsafe { args(regs, stack) } {
        Some((argv, _)) => unsafe { execv(path, argv.as_ptr()) },
        None => e2big(),
    }
}

extern "C" fn collect_execlp(
    file: *const c_char,
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> c_int {
    match unsafe { args(regs, stack) } {
        Some((argv, _)) => unsafe { execvp(file, argv.as_ptr()) },
        None => e2big(),
    }
}

extern "C" fn collect_execle(
    path: *const c_char,
    regs: *const *const c_char,
    stack: *const *const c_char,
) -> c_int {
    match unsafe { args(regs, stack) } {
        Some((argv, envp)) => unsafe { execve(path, argv.as_ptr(), envp as *const *const c_char) },
        None => e2big(),
    }
}

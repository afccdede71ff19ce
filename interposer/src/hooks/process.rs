//! The process-life exports: `exit`, `_exit`, `_Exit`, the `exec` family (`fexecve` and
//! `execveat` included) and `syscall` (for the raw `execve`, `execveat` and `exit_group`). Each
//! tells process life first, then calls libc's (an `exec` that returns failed: process life
//! hears that too). `quick_exit` needs no export: process life registers an `at_quick_exit`
//! handler before `main`.
//!
//! Layer: hooks. Uses process life and the base.

use crate::base::real::{Lib, Real};
use crate::life;
use std::ffi::{c_char, c_int, c_long};

/// An exit function: tells process life first (`$before`), then calls libc's.
macro_rules! exit_hook {
    ($(#[$doc:meta])* $name:ident, $before:path) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Same contract as the libc function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(status: c_int) -> ! {
            /// libc's function of this name.
            static REAL: Real<unsafe extern "C" fn(c_int) -> !> =
                Real::export(concat!(stringify!($name), "\0").as_bytes(), Lib::Libc);
            $before();
            match REAL.get() {
                // SAFETY: the real exit function, with the caller's status.
                Some(f) => unsafe { f(status) },
                None => crate::base::sys::exit_group_now(status),
            }
        }
    };
}

exit_hook!(
    /// `exit`: one thread at a time (glibc before 2.41 lets several run it at once, and the
    /// first done `_exit`s under the one still writing the trace; see [`life::before_exit`]).
    exit, life::before_exit
);
exit_hook!(
    /// `_exit`: no destructors will run, so the trace is closed here first.
    _exit, life::before_underscore_exit
);
exit_hook!(
    /// `_Exit`, same as `_exit`.
    _Exit, life::before_underscore_exit
);

macro_rules! exec_hook {
    ($name:ident, ($($a:ident: $t:ty),*)) => {
        /// Closes the trace (with an end record saying `exec`) before the process is replaced;
        /// when the exec fails (it returns), the trace goes on.
        ///
        /// # Safety
        /// Same contract as the libc function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            /// libc's function of this name.
            static REAL: Real<unsafe extern "C" fn($($t),*) -> c_int> =
                Real::export(concat!(stringify!($name), "\0").as_bytes(), Lib::Libc);
            life::before_exec();
            let r = match REAL.get() {
                // SAFETY: the real exec function, with the caller's own arguments.
                Some(f) => unsafe { f($($a),*) },
                None => {
                    // SAFETY: errno is this thread's.
                    unsafe { *libc::__errno_location() = libc::ENOSYS };
                    -1
                }
            };
            life::exec_failed();
            r
        }
    };
}

exec_hook!(execve, (path: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execvpe, (file: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execv, (path: *const c_char, argv: *const *const c_char));
exec_hook!(execvp, (file: *const c_char, argv: *const *const c_char));
exec_hook!(fexecve, (fd: c_int, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execveat, (dirfd: c_int, path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, flags: c_int));

// `syscall()`: the raw `execve`, `execveat` and `exit_group` go through process life first (as
// their libc functions do); every other number is the system call itself, made here as glibc's
// `syscall` makes it (the same registers, the same `-1`/`errno` on failure), so that no lookup of
// libc's is needed on any path (Rust's own futex waits come through here). A program that makes
// the system call with its own `syscall` instruction (Go's runtime, static binaries, io_uring)
// is not seen: its trace loses what was not yet written (at most the writer's 50 ms) and has no
// end record, and isolate mode checks nothing.

/// `syscall(number, ...)`: see above.
///
/// # Safety
/// Same contract as glibc's `syscall`.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syscall() -> c_long {
    core::arch::naked_asm!(
        "cmp rdi, {execve}",
        "je {way_out}",
        "cmp rdi, {execveat}",
        "je {way_out}",
        "cmp rdi, {exit_group}",
        "je {way_out}",
        "mov rax, rdi",
        "mov rdi, rsi",
        "mov rsi, rdx",
        "mov rdx, rcx",
        "mov r10, r8",
        "mov r8, r9",
        "mov r9, [rsp + 8]",
        "syscall",
        "cmp rax, -4095",
        "jae 2f",
        "ret",
        "2:",
        "mov rdi, rax",
        "jmp {failed}",
        execve = const libc::SYS_execve,
        execveat = const libc::SYS_execveat,
        exit_group = const libc::SYS_exit_group,
        way_out = sym raw_way_out,
        failed = sym syscall_failed,
    )
}

/// A system call's `-errno` as glibc's `syscall` returns it: `-1`, `errno` set.
extern "C" fn syscall_failed(r: c_long) -> c_long {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = (-r) as c_int };
    -1
}

/// The raw system call, with no libc in between.
///
/// # Safety
/// The system call's own contract (the caller's, passed on unchanged).
unsafe fn raw_syscall(nr: c_long, a: c_long, b: c_long, c: c_long, d: c_long, e: c_long) -> c_long {
    let r: c_long;
    // SAFETY: the arguments are the caller's, in the kernel's registers; rcx and r11, which the
    // `syscall` instruction overwrites, are declared clobbered; no stack is used.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr => r,
            in("rdi") a,
            in("rsi") b,
            in("rdx") c,
            in("r10") d,
            in("r8") e,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    r
}

/// `syscall(SYS_execve | SYS_execveat | SYS_exit_group, ...)`: as `execve`, `execveat` and
/// `_exit` (their sixth argument is not used).
extern "C" fn raw_way_out(
    nr: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
) -> c_long {
    if nr == libc::SYS_exit_group {
        life::before_underscore_exit();
        crate::base::sys::exit_group_now(a as i32)
    }
    life::before_exec();
    // SAFETY: the caller's execve/execveat, as glibc's `syscall` would make it.
    let r = unsafe { raw_syscall(nr, a, b, c, d, e) };
    let r = if (-4095..0).contains(&r) {
        syscall_failed(r)
    } else {
        r
    };
    life::exec_failed();
    r
}

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
    // SAFETY: the caller of `args` vouches for `regs` (five saved registers) and `stack` (the
    // variadic arguments after them, NULL-terminated).
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
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = libc::E2BIG };
    -1
}

/// `execl`, `execlp`, `execle`, their arguments collected: the vector form (our hook) with them.
macro_rules! collect_exec {
    ($name:ident, |$file:ident, $argv:ident, $next:ident| $call:expr) => {
        extern "C" fn $name(
            $file: *const c_char,
            regs: *const *const c_char,
            stack: *const *const c_char,
        ) -> c_int {
            // SAFETY: `regs` and `stack` are what the stub saved of the variadic call.
            match unsafe { args(regs, stack) } {
                // SAFETY: the real exec function, with the argument list rebuilt from the caller's.
                Some(($argv, $next)) => unsafe { $call },
                None => e2big(),
            }
        }
    };
}

collect_exec!(collect_execl, |path, argv, _next| execv(
    path,
    argv.as_ptr()
));
collect_exec!(collect_execlp, |file, argv, _next| execvp(
    file,
    argv.as_ptr()
));
collect_exec!(collect_execle, |path, argv, envp| execve(
    path,
    argv.as_ptr(),
    envp as *const *const c_char
));

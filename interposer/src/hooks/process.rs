//! The process-life exports: `exit`, `_exit`, `_Exit` and the `exec` family. Each tells process
//! life first, then calls libc's.
//!
//! Layer: hooks. Uses process life and the base.

use crate::base::real::{Lib, Real};
use crate::life;
use std::ffi::{c_char, c_int};

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
                // SAFETY: exit_group has no preconditions and does not return.
                None => unsafe {
                    libc::syscall(libc::SYS_exit_group, status);
                    std::process::abort()
                },
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
        /// Closes the trace (with an end record saying `exec`) before the process is replaced.
        ///
        /// # Safety
        /// Same contract as the libc function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            /// libc's function of this name.
            static REAL: Real<unsafe extern "C" fn($($t),*) -> c_int> =
                Real::export(concat!(stringify!($name), "\0").as_bytes(), Lib::Libc);
            life::before_exec();
            match REAL.get() {
                // SAFETY: the real exec function, with the caller's own arguments.
                Some(f) => unsafe { f($($a),*) },
                None => {
                    // SAFETY: errno is this thread's.
                    unsafe { *libc::__errno_location() = libc::ENOSYS };
                    -1
                }
            }
        }
    };
}

exec_hook!(execve, (path: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execvpe, (file: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_hook!(execv, (path: *const c_char, argv: *const *const c_char));
exec_hook!(execvp, (file: *const c_char, argv: *const *const c_char));

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

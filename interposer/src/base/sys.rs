//! Thin OS helpers every layer shares: the monotonic clock, a short sleep, the thread id, one
//! line on stderr, a thread of the library's own that no signal handler runs on, and bounds
//! kept in atomics.
//!
//! Layer: base. Uses nothing of this crate.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// `a` raised to `v` where below it, and written only then: a bound the hooks widen at every
/// event and others read (a `fetch_max` that changes nothing still takes the cache line from
/// every other thread that reads or widens it).
#[inline]
pub fn raise(a: &AtomicU64, v: u64) {
    if v > a.load(Relaxed) {
        a.fetch_max(v, Relaxed);
    }
}

/// `a` lowered to `v` where above it, and written only then (as [`raise`]).
#[inline]
pub fn lower(a: &AtomicU64, v: u64) {
    if v < a.load(Relaxed) {
        a.fetch_min(v, Relaxed);
    }
}

/// The span [`low`, `high`) widened to take in [`start`, `end`), each bound written only where
/// it changes ([`lower`], [`raise`]).
#[inline]
pub fn widen(low: &AtomicU64, high: &AtomicU64, start: u64, end: u64) {
    lower(low, start);
    raise(high, end);
}

thread_local! {
    // A plain `Cell` with a const initialiser: no destructor, usable during thread teardown.
    static TID: Cell<u32> = const { Cell::new(0) };
}

#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The same clock as [`now_ns`] at the kernel's tick (1–4 ms behind it at most), for checks
/// that ask "has a few milliseconds passed" on every event: `CLOCK_MONOTONIC_COARSE` is read
/// from the vDSO without the time counter, a few ns where [`now_ns`] costs 18–45 ns
/// (docs/performance.md, "Clock reads"). Never ahead of [`now_ns`] read after it.
#[inline]
pub fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec; CLOCK_MONOTONIC_COARSE exists since Linux 2.6.32.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return now_ns();
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps `ns` nanoseconds (less than a second) with plain `nanosleep`: async-signal-safe, and
/// no thread handle needed, so fine in a signal handler and during thread teardown.
pub fn nap(ns: u64) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: ns.min(999_999_999) as libc::c_long,
    };
    // SAFETY: `ts` is a live timespec with tv_nsec below 1e9; the remainder pointer may be null.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Polls `done` every 200 µs until it holds (true) or `deadline` ([`now_ns`]) passes (false).
/// Async-signal-safe: [`nap`] only.
pub fn wait_until(deadline: u64, done: impl Fn() -> bool) -> bool {
    while !done() {
        if now_ns() > deadline {
            return false;
        }
        nap(200_000);
    }
    true
}

#[inline]
pub fn gettid() -> u32 {
    let t = TID.try_with(|c| c.get()).unwrap_or(0);
    if t != 0 {
        return t;
    }
    // SAFETY: gettid takes no argument, touches no memory and cannot fail.
    let t = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    let _ = TID.try_with(|c| c.set(t));
    t
}

/// In a fork child: the thread that forked has a new id.
pub fn forget_tid() {
    let _ = TID.try_with(|c| c.set(0));
}

/// Ends the process now with `status`: the `exit_group` system call itself, made here. Not
/// `_exit` nor `syscall()`: those names are the library's own exports (`hooks/process.rs`), which
/// close the trace first.
pub fn exit_group_now(status: i32) -> ! {
    loop {
        // SAFETY: exit_group takes one integer and touches no memory of this process; rcx and r11,
        // which the `syscall` instruction overwrites, are declared clobbered.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") libc::SYS_exit_group => _,
                in("rdi") status as libc::c_long,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            )
        };
    }
}

/// One line on stderr, prefixed, written with a single `write(2)` — only while descriptor 2
/// is still the file the process started with. A program that closes stderr and opens a file
/// of its own gets that file at 2 (the lowest free number): the line is then left out rather
/// than written into the program's data (what the line says is in the trace).
pub fn warn(msg: &str) {
    if !stderr_is_the_first() {
        return;
    }
    let line = format!("isolate: {msg}\n");
    // SAFETY: `line` is a live String: pointer and length describe its bytes for the whole call,
    // which only reads them (a closed or full fd 2 just makes it fail, ignored).
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// What descriptor 2 was when the library was loaded: 0 not looked at yet, 1 closed, else
/// (device, inode) in [`STDERR_DEV`] and [`STDERR_INO`].
static STDERR_STATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
static STDERR_DEV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static STDERR_INO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn fd_stat(fd: i32) -> Option<libc::stat> {
    // SAFETY: `stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `stat` through a pointer to a live local; a closed `fd` is EBADF.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

fn fd_identity(fd: i32) -> Option<(u64, u64)> {
    fd_stat(fd).map(|st| (st.st_dev, st.st_ino))
}

/// Runs as the library loads (before `main`; again in an exec'd image): notes what stderr is.
/// One `fstat`, nothing else.
#[ctor::ctor]
unsafe fn remember_stderr() {
    use std::sync::atomic::Ordering::*;
    match fd_identity(2) {
        Some((dev, ino)) => {
            STDERR_DEV.store(dev, Relaxed);
            STDERR_INO.store(ino, Relaxed);
            STDERR_STATE.store(2, Release);
        }
        None => STDERR_STATE.store(1, Release),
    }
}

/// Whether descriptor 2 is the file it was at load (true before that was looked at), or a
/// capture's anonymous file put there since (a regular file with no name: what pytest's
/// `capfd` and fd-level capture `dup2` onto descriptor 2). A file the program opened itself into
/// a closed descriptor 2 has a name, and never gets our lines.
fn stderr_is_the_first() -> bool {
    use std::sync::atomic::Ordering::*;
    match STDERR_STATE.load(Acquire) {
        0 => true,
        1 => false,
        _ => fd_stat(2).is_some_and(|st| {
            (st.st_dev, st.st_ino) == (STDERR_DEV.load(Relaxed), STDERR_INO.load(Relaxed))
                || (st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink == 0)
        }),
    }
}

/// A lock that a `fork()` child can take over: in the child only the forking thread exists, so
/// a lock another thread of the parent held at the fork would never be released there.
/// [`ForkLock::reset_in_child`] makes it free again with a fresh value. (`std::sync::Mutex`
/// cannot be reset; this one is a futex word and the value.)
pub struct ForkLock<T> {
    word: std::sync::atomic::AtomicU32,
    value: std::cell::UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, which the word makes exclusive.
unsafe impl<T: Send> Sync for ForkLock<T> {}
// SAFETY: a ForkLock owns its T and an atomic word: sending it sends the T, allowed as T: Send.
unsafe impl<T: Send> Send for ForkLock<T> {}

pub struct ForkLockGuard<'a, T> {
    lock: &'a ForkLock<T>,
}

impl<T> ForkLock<T> {
    pub const fn new(value: T) -> Self {
        Self {
            word: std::sync::atomic::AtomicU32::new(0),
            value: std::cell::UnsafeCell::new(value),
        }
    }

    /// Takes the lock: 0 free, 1 held, 2 held with waiters (the classic futex mutex).
    pub fn lock(&self) -> ForkLockGuard<'_, T> {
        use std::sync::atomic::Ordering::*;
        if self.word.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            let mut spins = 0;
            loop {
                if spins < 100 {
                    spins += 1;
                    std::hint::spin_loop();
                    if self.word.compare_exchange(0, 1, Acquire, Relaxed).is_ok() {
                        break;
                    }
                    continue;
                }
                if self.word.swap(2, Acquire) == 0 {
                    break;
                }
                // SAFETY: FUTEX_WAIT reads the word at `as_ptr()`, the AtomicU32 inside `self`,
                // alive for this borrow, and sleeps only while it still holds 2; no timeout (null)
                // and no other memory. A spurious wake-up or EINTR returns to the loop, which
                // retakes the lock properly.
                unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        self.word.as_ptr(),
                        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                        2u32,
                        std::ptr::null::<libc::timespec>(),
                    )
                };
            }
        }
        ForkLockGuard { lock: self }
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<ForkLockGuard<'_, T>> {
        use std::sync::atomic::Ordering::*;
        self.word
            .compare_exchange(0, 1, Acquire, Relaxed)
            .ok()
            .map(|_| ForkLockGuard { lock: self })
    }

    /// In a `fork()` child only: the lock is free and holds `value`; the old value is left as
    /// it was (a thread of the parent may have been changing it), never dropped.
    pub fn reset_in_child(&self, value: T) {
        // SAFETY: only called in a fork child, from the pthread_atfork child handlers (life::
        // child_after_fork and what it calls), before the child runs anything else: only the
        // forking thread exists, and it holds no guard of this lock there (no code of ours forks
        // while holding one). So nothing else reads or writes the value now; the pointer is the
        // UnsafeCell's, valid and aligned; the old value is overwritten without being dropped (a
        // leak, never a double drop).
        unsafe { std::ptr::write(self.value.get(), value) };
        self.word.store(0, std::sync::atomic::Ordering::Release);
    }
}

impl<T> std::ops::Deref for ForkLockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a guard exists only between a `lock`/`try_lock` that moved the word from 0 to
        // held (Acquire) and its drop, so this guard is the only one; the reference lives no longer
        // than `&self`, the guard's borrow.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for ForkLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`: this guard alone holds the lock, and `&mut self` means no other
        // reference through it is alive.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for ForkLockGuard<'_, T> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::*;
        if self.lock.word.swap(0, Release) == 2 {
            // SAFETY: FUTEX_WAKE at the AtomicU32 inside the lock, alive for the guard's borrow: it
            // wakes at most one waiter and touches no other memory.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.lock.word.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    1i32,
                )
            };
        }
    }
}

/// Spawns `f` on a thread built by `b` with every signal blocked, so that no signal handler
/// (the program's or ours) ever runs on it; the calling thread's mask is set back before this
/// returns. The library's own threads (the writer, the exit check) start so.
pub fn spawn_unsignalled<F>(
    b: std::thread::Builder,
    f: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // SAFETY: sigset_t is a plain bit array, for which all zeroes is a valid (empty) value.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` and `old` are live local sigsets: sigfillset writes `all`, pthread_sigmask
    // reads it and writes the calling thread's previous mask into `old`.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let spawned = b.spawn(f);
    // SAFETY: `old` holds the mask the call above saved: the calling thread gets it back (the
    // old-set pointer may be null).
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

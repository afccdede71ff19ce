//! Thin OS helpers every layer shares: the monotonic clock, a short sleep, the thread id, and one
//! line on stderr.
//!
//! Layer: base. Uses nothing of this crate.

use std::cell::Cell;

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
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps `ns` nanoseconds (less than a second) with plain `nanosleep`: async-signal-safe, and
/// no thread handle needed, so fine in a signal handler and during thread teardown.
pub fn nap(ns: u64) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: ns.min(999_999_999) as libc::c_long,
    };
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
    let t = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    let _ = TID.try_with(|c| c.set(t));
    t
}

/// In a fork child: the thread that forked has a new id.
pub fn forget_tid() {
    let _ = TID.try_with(|c| c.set(0));
}

/// One line on stderr, prefixed, written with a single `write(2)`.
pub fn warn(msg: &str) {
    let line = format!("isolate: {msg}\n");
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
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
        unsafe { std::ptr::write(self.value.get(), value) };
        self.word.store(0, std::sync::atomic::Ordering::Release);
    }
}

impl<T> std::ops::Deref for ForkLockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for ForkLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for ForkLockGuard<'_, T> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::*;
        if self.lock.word.swap(0, Release) == 2 {
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

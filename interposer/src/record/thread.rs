//! The per-thread flag that says "inside a hook" (or "one of our own threads"), so that the
//! driver calls a runtime call makes, and calls the library makes itself, are not recorded a
//! second time.
//!
//! Layer: recording. Uses nothing of this crate.

use std::cell::Cell;

thread_local! {
    // A plain `Cell` with a const initialiser: no destructor, usable during thread teardown.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Marks the current thread as ours: nothing it calls is recorded.
pub fn mark_internal_thread() {
    let _ = DEPTH.try_with(|d| d.set(1_000_000));
}

/// Set while a hook runs on this thread.
pub struct Inside(());

impl Inside {
    /// `None` when already inside a hook on this thread (or on one of our own threads).
    #[inline]
    pub fn enter() -> Option<Inside> {
        let entered = DEPTH
            .try_with(|d| {
                if d.get() == 0 {
                    d.set(1);
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false);
        // `then`, not `then_some`: an `Inside` built and dropped here would clear the flag.
        entered.then(|| Inside(()))
    }
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(0));
    }
}

/// True when this thread is inside a hook already (or is one of ours).
#[inline]
pub fn nested() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

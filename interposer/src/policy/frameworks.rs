//! Frameworks' own memory pools, switched off before `main` in isolate mode, as
//! isolate/pytorch.rs does for PyTorch's caching allocator: a pool that keeps freed memory and
//! hands it out again never frees to the driver, so isolation could not see a stale pointer
//! into it. Each is switched only when the user has not set the variable, with one stderr line
//! saying so.
//!
//! - JAX/XLA: `XLA_PYTHON_CLIENT_ALLOCATOR=platform` (XLA allocates and frees each buffer with the
//!   driver instead of out of its BFC pool; `XLA_PYTHON_CLIENT_PREALLOCATE` does not matter then).
//! - CuPy has no variable for it: the Python package's start-up hook switches its pool off when
//!   CuPy is imported (python/src/cuda_isolate/startup.py).
//!
//! The table of what isolation sees in each framework is in docs/isolation.md.
//!
//! Layer: policies. Uses the base (stderr).

use crate::base::sys::warn;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

static SAID_JAX: AtomicBool = AtomicBool::new(false);

/// From the constructor, before `main`, in isolate mode only.
pub fn before_main() {
    if std::env::var_os("XLA_PYTHON_CLIENT_ALLOCATOR").is_none() {
        // SAFETY: before main, from the constructor: no other thread reads the environment
        // yet; both strings are NUL-terminated literals.
        unsafe {
            libc::setenv(
                c"XLA_PYTHON_CLIENT_ALLOCATOR".as_ptr(),
                c"platform".as_ptr(),
                1,
            )
        };
        if !SAID_JAX.swap(true, Relaxed) {
            warn(
                "isolate mode: set XLA_PYTHON_CLIENT_ALLOCATOR=platform (JAX/XLA's memory pool off)",
            );
        }
    }
}

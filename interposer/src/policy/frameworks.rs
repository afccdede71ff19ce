//! Frameworks' own memory pools, switched off before `main` in isolate mode, as
//! isolate/pytorch.rs does for PyTorch's caching allocator: a pool that keeps freed memory and
//! hands it out again never frees to the driver, so isolation could not see a stale pointer
//! into it. Each is switched only when the user has not set the variable, with one stderr line
//! saying so.
//!
//! Each line is said only once the framework is seen loaded (its library mapped, looked at when
//! the trace starts and at exit): a C program, which loads neither, is
//! not told about PyTorch's and JAX's settings, though they are set for it too (a framework
//! loaded later reads them then).
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
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// A framework whose pool isolate mode switched off.
#[derive(Clone, Copy)]
pub enum Framework {
    PyTorch = 0,
    Jax = 1,
}

impl Framework {
    /// Is this a file name of one of the framework's own libraries?
    fn owns(self, path: &[u8]) -> bool {
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        let has = |s: &[u8], what: &[u8]| s.windows(what.len()).any(|w| w == what);
        match self {
            // libc10_cuda.so, libtorch_cuda.so (loaded by `import torch`).
            Framework::PyTorch => has(name, b"libc10_cuda") || has(name, b"libtorch_cuda"),
            // jaxlib's extension, its CUDA plugin (jax_cuda12_plugin, jax_plugins/xla_cuda12).
            Framework::Jax => {
                has(name, b"xla_extension")
                    || has(name, b"xla_cuda_plugin")
                    || has(path, b"/jaxlib/")
                    || has(path, b"/jax_cuda")
            }
        }
    }
}

/// The line to say for each framework, when something was set for it; said once, when the
/// framework is seen loaded.
static PENDING: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
static SAID: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

/// Before `main`: `what` was set for `fw`; said by [`say_for_loaded`] once `fw` is loaded.
pub fn set_for(fw: Framework, what: String) {
    let _ = PENDING[fw as usize].set(what);
}

/// Says, once each, what was set for the frameworks that are loaded now. From the trace's start
/// (in the hook that made the first CUDA call) and from exit; never a signal handler. The loaded
/// objects are read from `/proc/self/maps`, not asked of the loader (`dl_iterate_phdr` takes the
/// loader's lock, which a thread in `dlopen` may hold while it waits for a lock the hook holds).
pub fn say_for_loaded() {
    let pending =
        |fw: Framework| PENDING[fw as usize].get().is_some() && !SAID[fw as usize].load(Relaxed);
    let fws = [Framework::PyTorch, Framework::Jax];
    if !fws.into_iter().any(pending) {
        return;
    }
    let Ok(maps) = std::fs::read("/proc/self/maps") else {
        return;
    };
    // Each line's file, from its first `/` (a path may hold spaces).
    let paths: Vec<&[u8]> = maps
        .split(|&b| b == b'\n')
        .filter_map(|l| l.iter().position(|&b| b == b'/').map(|i| &l[i..]))
        .collect();
    for fw in fws {
        if pending(fw)
            && paths.iter().any(|p| fw.owns(p))
            && !SAID[fw as usize].swap(true, Relaxed)
            && let Some(line) = PENDING[fw as usize].get()
        {
            warn(line);
        }
    }
}

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
        set_for(
            Framework::Jax,
            "isolate mode: set XLA_PYTHON_CLIENT_ALLOCATOR=platform (JAX/XLA's memory pool off)"
                .into(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Framework;

    #[test]
    fn frameworks_known_by_their_libraries() {
        let torch = b"/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so";
        assert!(Framework::PyTorch.owns(torch));
        assert!(Framework::PyTorch.owns(b"/x/torch/lib/libtorch_cuda.so"));
        assert!(!Framework::Jax.owns(torch));
        assert!(Framework::Jax.owns(b"/venv/site-packages/jaxlib/xla_extension.so"));
        assert!(
            Framework::Jax.owns(b"/venv/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so")
        );
        for other in [
            &b"/usr/lib/x86_64-linux-gnu/libcudart.so.13"[..],
            b"/usr/lib/libc.so.6",
            b"",
        ] {
            assert!(!Framework::PyTorch.owns(other) && !Framework::Jax.owns(other));
        }
    }
}

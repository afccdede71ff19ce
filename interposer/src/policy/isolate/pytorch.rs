//! PyTorch's set-up before `main`: its caching allocator would hand freed blocks straight back
//! out, so isolate mode switches it to the stream-ordered backend, or off.
//!
//! Layer: policies. Uses the base, and frameworks.rs (which says what was set, once PyTorch is
//! loaded).

use crate::policy::frameworks::{Framework, set_for};

/// Before `main`: PyTorch's caching allocator hands freed blocks straight back out, which is
/// what isolation exists to stop. Unless the user chose, PyTorch is switched to its
/// stream-ordered backend (`backend:cudaMallocAsync`: every tensor one `cudaMallocAsync` and
/// one `cudaFreeAsync`, which isolation poisons and releases in stream order, without waiting
/// for the device). Where the user set other allocator options, the cache is switched off
/// instead (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, every free a `cudaFree`), as before.
pub fn before_main() {
    // Said once PyTorch is seen loaded (frameworks.rs), not to every program.
    let say = |what: &str| set_for(Framework::PyTorch, format!("isolate mode: {what}"));
    match pytorch_substrate(
        std::env::var("PYTORCH_NO_CUDA_MEMORY_CACHING").ok(),
        std::env::var("PYTORCH_ALLOC_CONF").ok(),
        std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok(),
    ) {
        Substrate::UserChose => {}
        Substrate::StreamOrdered => {
            // SAFETY: before main, from the constructor: no other thread reads the environment
            // yet; both strings are NUL-terminated literals.
            unsafe {
                libc::setenv(
                    c"PYTORCH_CUDA_ALLOC_CONF".as_ptr(),
                    c"backend:cudaMallocAsync".as_ptr(),
                    1,
                )
            };
            say(
                "set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (PyTorch's caching allocator off; \
                 each tensor from the driver's stream-ordered pool)",
            );
        }
        Substrate::NoCaching(name) => {
            // SAFETY: as above.
            unsafe { libc::setenv(c"PYTORCH_NO_CUDA_MEMORY_CACHING".as_ptr(), c"1".as_ptr(), 1) };
            say(&format!(
                "set PYTORCH_NO_CUDA_MEMORY_CACHING=1 (PyTorch's caching allocator off; {name} \
                 is set without backend:cudaMallocAsync, which isolates faster)"
            ));
        }
    }
}

/// What isolate mode does to PyTorch's allocator, from the user's settings.
#[derive(Debug, PartialEq, Eq)]
pub enum Substrate {
    /// The user switched the cache off or chose the stream-ordered backend: nothing to do.
    UserChose,
    /// Nothing set: the stream-ordered backend.
    StreamOrdered,
    /// Allocator options set (named) without a backend: the cache off.
    NoCaching(&'static str),
}

pub fn pytorch_substrate(
    no_caching: Option<String>,
    alloc_conf: Option<String>,
    cuda_alloc_conf: Option<String>,
) -> Substrate {
    if no_caching.is_some() {
        return Substrate::UserChose;
    }
    let confs = [
        ("PYTORCH_ALLOC_CONF", alloc_conf),
        ("PYTORCH_CUDA_ALLOC_CONF", cuda_alloc_conf),
    ];
    let stream_ordered = |v: &str| {
        v.split(',').any(|kv| {
            let mut it = kv.splitn(2, ':');
            it.next().map(str::trim) == Some("backend")
                && it.next().map(str::trim) == Some("cudaMallocAsync")
        })
    };
    if confs
        .iter()
        .any(|(_, v)| v.as_deref().is_some_and(stream_ordered))
    {
        return Substrate::UserChose;
    }
    match confs
        .iter()
        .find(|(_, v)| v.as_deref().is_some_and(|v| !v.trim().is_empty()))
    {
        Some((name, _)) => Substrate::NoCaching(name),
        None => Substrate::StreamOrdered,
    }
}

#[cfg(test)]
mod tests {
    use super::{Substrate, pytorch_substrate};

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn pytorch_gets_the_stream_ordered_backend_unless_the_user_chose() {
        assert_eq!(
            pytorch_substrate(None, None, None),
            Substrate::StreamOrdered
        );
        assert_eq!(
            pytorch_substrate(None, None, s("")),
            Substrate::StreamOrdered
        );
        assert_eq!(pytorch_substrate(s("1"), None, None), Substrate::UserChose);
        assert_eq!(
            pytorch_substrate(s("0"), None, s("x:1")),
            Substrate::UserChose
        );
        assert_eq!(
            pytorch_substrate(None, None, s("backend:cudaMallocAsync")),
            Substrate::UserChose
        );
        assert_eq!(
            pytorch_substrate(
                None,
                s("expandable_segments:True, backend: cudaMallocAsync"),
                None
            ),
            Substrate::UserChose
        );
        assert_eq!(
            pytorch_substrate(None, None, s("expandable_segments:True")),
            Substrate::NoCaching("PYTORCH_CUDA_ALLOC_CONF")
        );
        assert_eq!(
            pytorch_substrate(None, s("max_split_size_mb:128"), None),
            Substrate::NoCaching("PYTORCH_ALLOC_CONF")
        );
        assert_eq!(
            pytorch_substrate(None, None, s("backend:native")),
            Substrate::NoCaching("PYTORCH_CUDA_ALLOC_CONF")
        );
    }
}

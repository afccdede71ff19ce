//! The poison: freed memory filled with the poison byte, in stream order for stream-ordered
//! frees (by a memset or the library's fill kernel, or deferred to the stream's next work), and
//! the deferred poisons queued before stream work and captures.
//!
//! Layer: policies. Uses the base, recording, [`crate::policy::release`] and the folder's state
//! and counters.

use super::counters::BY_KERNEL;
use super::state::current_ctx;
use crate::base::config;
use crate::base::cu::{self, CuError};
use crate::base::cuda::*;
use crate::policy::release;
use std::sync::atomic::Ordering::*;

/// Queues the deferred poisons of the current context (see [`release::defer`]).
pub fn flush_current() {
    release::flush(current_ctx());
}

/// A stream capture is about to begin in the current context (see [`release::capture_start`]).
pub fn capture_start() {
    release::capture_start(current_ctx());
}

/// Fills freed memory with the poison byte. A plain free behaves as `cudaFree` does (waits for
/// the device, so work still in flight finishes first); a stream-ordered free is poisoned on its
/// stream, after the work queued there (by the fill kernel of context `ctx` with
/// `ISOLATE_TEST_POISON_BY=kernel`).
pub(super) fn poison(ptr: u64, size: u64, ordered: bool, stream: CUstream, ctx: usize) -> CUresult {
    let byte = config::get().poison;
    if ordered {
        if let Some(b) = byte
            && config::get().poison_kernel
            && ptr.is_multiple_of(4)
            && let Some(r) = release::poison(ctx, stream as usize, ptr, size, b)
        {
            BY_KERNEL.fetch_add(1, Relaxed);
            return r;
        }
        let Some(b) = byte else {
            return CUDA_SUCCESS;
        };
        // SAFETY: the program freed [ptr, ptr+size) on `stream` (its own, existing): from
        // the stream's position on it is quarantined, nobody's.
        return cu::code(
            unsafe { cu::memset_d8_async(ptr, b, size as usize, stream) },
            CUDA_SUCCESS,
        );
    }
    if let Err(CuError::Code(r)) = cu::ctx_synchronize() {
        return r;
    }
    match byte {
        // SAFETY: freed by the program and quarantined; the device is idle (synchronised).
        Some(b) => cu::code(
            unsafe { cu::memset_d8(ptr, b, size as usize) },
            CUDA_SUCCESS,
        ),
        None => CUDA_SUCCESS,
    }
}

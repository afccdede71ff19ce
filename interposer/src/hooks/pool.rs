//! The statistics a program reads from a stream-ordered pool (`cudaMemPoolGetAttribute`), kept
//! truthful in isolate mode. Isolation holds freed stream-ordered allocations in quarantine
//! without giving them back to the pool, so the pool counts them as used: PyTorch's
//! `torch.cuda.memory_allocated()` and `max_memory_allocated()` (read from
//! `cudaMemPoolAttrUsedMemCurrent` / `UsedMemHigh` on its `backend:cudaMallocAsync`) would
//! report the quarantine as the program's memory. In isolate mode these two answers are capped
//! by what the program itself holds (its live stream-ordered allocations, and their peak since
//! the last reset of `UsedMemHigh`). `cudaMemPoolAttrReservedMemCurrent` (PyTorch's
//! `memory_reserved()`) is answered without what the library holds (the pool's used memory
//! beyond the program's own): PyTorch's `test_max_split_expandable` sizes a memory fraction
//! from it, and with the quarantine counted got no out-of-memory (the H100's test_cuda.py run).
//! `ReservedMemHigh`, every other attribute, every other mode, and every failed call pass
//! through untouched. Not recorded as events (no memory changes hands).
//!
//! Layer: hooks. Uses the policies and the base.

#![allow(non_snake_case)]

use crate::base::cuda::*;
use crate::base::real::{Lib, Real};
use crate::policy;
use std::ffi::{c_int, c_void};

/// `cudaMemPoolAttrUsedMemCurrent` and `cudaMemPoolAttrUsedMemHigh` (the driver's
/// `CU_MEMPOOL_ATTR_USED_MEM_*` have the same numbers).
const USED_MEM_CURRENT: c_int = 7;
const USED_MEM_HIGH: c_int = 8;
/// `cudaMemPoolAttrReservedMemCurrent`.
const RESERVED_MEM_CURRENT: c_int = 5;

/// The runtime's pool attribute functions (no policy calls them: declared here, by the hooks
/// that stand for them).
type PoolAttributeFn = unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> cudaError_t;
static MEM_POOL_GET_ATTRIBUTE_RT: Real<PoolAttributeFn> =
    Real::export(b"cudaMemPoolGetAttribute\0", Lib::Runtime);
static MEM_POOL_SET_ATTRIBUTE_RT: Real<PoolAttributeFn> =
    Real::export(b"cudaMemPoolSetAttribute\0", Lib::Runtime);

/// # Safety
/// As `cudaMemPoolGetAttribute`: `value` points at the attribute's type (a `cuuint64_t` for the
/// memory counters).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> cudaError_t {
    let Some(real) = MEM_POOL_GET_ATTRIBUTE_RT.get() else {
        return CUDA_ERROR_SYMBOL_NOT_FOUND_RT;
    };
    // SAFETY: the real function, with the caller's own arguments.
    let r = unsafe { real(pool, attr, value) };
    if r == 0 && !value.is_null() && matches!(attr, USED_MEM_CURRENT | USED_MEM_HIGH) {
        let v = value as *mut u64;
        let _ = std::panic::catch_unwind(|| {
            if let Some(ours) = policy::pool_used(attr == USED_MEM_HIGH) {
                // SAFETY: the real call succeeded and wrote a 64-bit value at the caller's non-null
                // `value` (these two attributes are cuuint64_t).
                unsafe { *v = (*v).min(ours) };
            }
        });
    }
    if r == 0 && !value.is_null() && attr == RESERVED_MEM_CURRENT {
        let v = value as *mut u64;
        let _ = std::panic::catch_unwind(|| {
            let Some(ours) = policy::pool_used(false) else {
                return;
            };
            let mut used = 0u64;
            // SAFETY: the real function, with the caller's pool and a local of the attribute's
            // type (cuuint64_t).
            if unsafe { real(pool, USED_MEM_CURRENT, (&raw mut used).cast()) } == 0 {
                let held = used.saturating_sub(ours);
                // SAFETY: the real call succeeded and wrote a 64-bit value at the caller's
                // non-null `value`.
                unsafe { *v = (*v).saturating_sub(held) };
            }
        });
    }
    r
}

/// # Safety
/// As `cudaMemPoolSetAttribute`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> cudaError_t {
    let Some(real) = MEM_POOL_SET_ATTRIBUTE_RT.get() else {
        return CUDA_ERROR_SYMBOL_NOT_FOUND_RT;
    };
    // SAFETY: the real function, with the caller's own arguments.
    let r = unsafe { real(pool, attr, value) };
    if r == 0 && attr == USED_MEM_HIGH {
        // Setting the high-water mark (to 0) resets it to the current value.
        let _ = std::panic::catch_unwind(policy::pool_peak_reset);
    }
    r
}

//! The exported entry points. Each hook is thin: enter the per-thread guard, call the policy
//! (which calls the real function), return exactly what the real function returned. Nothing
//! here decides anything; `crate::policy` does.

pub mod dl;
pub mod driver;
pub mod runtime;

use crate::record::Inside;
use crate::resolve::Hooked;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body` under the guard, or `passthrough` when recording is off or this call is nested
/// inside another hook. `body` gets a slot where the real call's result is put as soon as it is
/// known, so that even if recording panicked the caller gets that exact result.
#[inline(always)]
pub(crate) fn run(
    body: impl FnOnce(&Cell<Option<i32>>) -> i32,
    passthrough: impl FnOnce() -> i32,
) -> i32 {
    if !crate::policy::intercepting() {
        return passthrough();
    }
    let Some(_inside) = Inside::enter() else {
        return passthrough();
    };
    let slot = Cell::new(None);
    match catch_unwind(AssertUnwindSafe(|| body(&slot))) {
        Ok(r) => r,
        Err(_) => match slot.get() {
            Some(r) => r,
            None => passthrough(),
        },
    }
}

/// Calls the real function and puts its result in the slot.
#[inline(always)]
pub(crate) fn call(slot: &Cell<Option<i32>>, f: impl FnOnce() -> i32) -> i32 {
    let r = f();
    slot.set(Some(r));
    r
}

macro_rules! hooked {
    ($(#[$doc:meta])* $table:ident { $( $real:path => $hook:path ),* $(,)? }) => {
        $(#[$doc])*
        pub static $table: &[Hooked] = &[
            $( Hooked {
                name: $real.name,
                hook: $hook as *const std::ffi::c_void,
                store: |p| $real.store(p),
                adopt: |p| $real.adopt(p),
            }, )*
        ];
    };
}

use dl::{cuGetProcAddress, cuGetProcAddress_v2};
use driver::*;

hooked! {
    /// Every driver export we hand out a hook for, by the export's exact name.
    HOOKED {
        dl::REAL_GET_PROC_ADDRESS_V2 => cuGetProcAddress_v2,
        dl::REAL_GET_PROC_ADDRESS => cuGetProcAddress,
        MEM_ALLOC => cuMemAlloc_v2,
        MEM_FREE => cuMemFree_v2,
        MEM_ALLOC_ASYNC => cuMemAllocAsync,
        MEM_ALLOC_ASYNC_PTSZ => cuMemAllocAsync_ptsz,
        MEM_FREE_ASYNC => cuMemFreeAsync,
        MEM_FREE_ASYNC_PTSZ => cuMemFreeAsync_ptsz,
        MEM_ALLOC_FROM_POOL_ASYNC => cuMemAllocFromPoolAsync,
        MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => cuMemAllocFromPoolAsync_ptsz,
        MEM_ALLOC_MANAGED => cuMemAllocManaged,
        MEM_ALLOC_PITCH => cuMemAllocPitch_v2,
        MEM_ALLOC_HOST => cuMemAllocHost_v2,
        MEM_HOST_ALLOC => cuMemHostAlloc,
        MEM_FREE_HOST => cuMemFreeHost,
        MEM_HOST_REGISTER => cuMemHostRegister_v2,
        MEM_HOST_UNREGISTER => cuMemHostUnregister,
        MEM_ADDRESS_RESERVE => cuMemAddressReserve,
        MEM_ADDRESS_FREE => cuMemAddressFree,
        MEM_CREATE => cuMemCreate,
        MEM_RELEASE => cuMemRelease,
        MEM_MAP => cuMemMap,
        MEM_UNMAP => cuMemUnmap,
        MEM_SET_ACCESS => cuMemSetAccess,
        GRAPH_ADD_MEM_ALLOC_NODE => cuGraphAddMemAllocNode,
        GRAPH_ADD_MEM_FREE_NODE => cuGraphAddMemFreeNode,
        LAUNCH_KERNEL => cuLaunchKernel,
        LAUNCH_KERNEL_PTSZ => cuLaunchKernel_ptsz,
        LAUNCH_KERNEL_EX => cuLaunchKernelEx,
        LAUNCH_KERNEL_EX_PTSZ => cuLaunchKernelEx_ptsz,
        LAUNCH_COOPERATIVE_KERNEL => cuLaunchCooperativeKernel,
        LAUNCH_COOPERATIVE_KERNEL_PTSZ => cuLaunchCooperativeKernel_ptsz,
    }
}

hooked! {
    /// Every runtime export we hook, by its exact name: handed out by the `dlsym` override for
    /// a lookup in a runtime's handle (ctypes, cffi, JIT runtimes) when the handle's function
    /// is the one the hook calls.
    RUNTIME_HOOKED {
        runtime::MALLOC => runtime::cudaMalloc,
        runtime::FREE => runtime::cudaFree,
        runtime::MALLOC_ASYNC => runtime::cudaMallocAsync,
        runtime::MALLOC_ASYNC_PTSZ => runtime::cudaMallocAsync_ptsz,
        runtime::FREE_ASYNC => runtime::cudaFreeAsync,
        runtime::FREE_ASYNC_PTSZ => runtime::cudaFreeAsync_ptsz,
        runtime::MALLOC_FROM_POOL_ASYNC => runtime::cudaMallocFromPoolAsync,
        runtime::MALLOC_FROM_POOL_ASYNC_PTSZ => runtime::cudaMallocFromPoolAsync_ptsz,
        runtime::MALLOC_MANAGED => runtime::cudaMallocManaged,
        runtime::MALLOC_PITCH => runtime::cudaMallocPitch,
        runtime::MALLOC_3D => runtime::cudaMalloc3D,
        runtime::MALLOC_HOST => runtime::cudaMallocHost,
        runtime::HOST_ALLOC => runtime::cudaHostAlloc,
        runtime::FREE_HOST => runtime::cudaFreeHost,
        runtime::HOST_REGISTER => runtime::cudaHostRegister,
        runtime::HOST_UNREGISTER => runtime::cudaHostUnregister,
        runtime::GET_DRIVER_ENTRY_POINT => runtime::cudaGetDriverEntryPoint,
        runtime::GET_DRIVER_ENTRY_POINT_PTSZ => runtime::cudaGetDriverEntryPoint_ptsz,
        runtime::GET_DRIVER_ENTRY_POINT_BY_VERSION => runtime::cudaGetDriverEntryPointByVersion,
        runtime::GET_DRIVER_ENTRY_POINT_BY_VERSION_PTSZ =>
            runtime::cudaGetDriverEntryPointByVersion_ptsz,
    }
}

/// True for the launch hooks, which are handed out only when the launch check is on.
pub fn is_launch(h: &Hooked) -> bool {
    h.name.to_bytes().starts_with(b"cuLaunch")
}

//! Driver exports (`cu*`). The same functions are handed out by our resolver for the exports
//! of the same names, and bind directly for programs linked against `libcuda`.
//!
//! Layer: hooks. Uses the policies, recording and the base.

#![allow(non_snake_case)]

use super::shape::Hooked;
use crate::base::cuda::*;
use crate::base::resolve::{export_name, is_ours};
use crate::policy::Call::*;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

hooks! {
    /// Every driver export we hand out a hook for, by the export's exact name.
    static HOOKED: CUresult = missing CUDA_ERROR_NOT_FOUND, in Driver;

    /// Resolves through the real `cuGetProcAddress_v2`, then hands back our hook for exports we
    /// hook (decided by the exact export the driver returned) and the real pointer for the rest.
    cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_int)
        [resolver pfn];
    /// The pre-12.0 resolver ABI (no status out-parameter).
    cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64)
        [resolver pfn];

    cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize)
        [CuMemAlloc, Alloc(Out::Device(dptr)), |e| e.size = size as u64];
    cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, stream: CUstream)
        [CuMemAllocAsync, Alloc(Out::Device(dptr)), |e| (e.size, e.stream) = (size as u64, stream as u64)];
    cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, stream: CUstream)
        [CuMemAllocAsyncPtsz, Alloc(Out::Device(dptr)), |e| (e.size, e.stream) = (size as u64, stream as u64)];
    cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream)
        [CuMemAllocFromPoolAsync, Alloc(Out::Device(dptr)),
        |e| (e.size, e.handle, e.stream) = (size as u64, pool as u64, stream as u64)];
    cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream)
        [CuMemAllocFromPoolAsyncPtsz, Alloc(Out::Device(dptr)),
        |e| (e.size, e.handle, e.stream) = (size as u64, pool as u64, stream as u64)];
    cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint)
        [CuMemAllocManaged, Alloc(Out::Device(dptr)), |e| (e.size, e.flags) = (size as u64, flags as u64)];
    cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint)
        [CuMemAllocPitch, Alloc(Out::Device(dptr)),
        |e| (e.size, e.flags) = ((width as u64).saturating_mul(height as u64), elem as u64),
        then |e| if e.result == 0 && !pitch.is_null() {
            // SAFETY: the real call succeeded, so it wrote the caller's non-null out-parameter.
            e.pitch = unsafe { *pitch } as u64;
            e.size = e.pitch.saturating_mul(height as u64);
        }];

    cuMemFree_v2(ptr) = MEM_FREE [CuMemFree, Free, |e| e.ptr = ptr];
    cuMemFreeAsync(ptr, stream) = MEM_FREE_ASYNC
        [CuMemFreeAsync, Free, |e| (e.ptr, e.stream) = (ptr, stream as u64)];
    cuMemFreeAsync_ptsz(ptr, stream) = MEM_FREE_ASYNC_PTSZ
        [CuMemFreeAsyncPtsz, Free, |e| (e.ptr, e.stream) = (ptr, stream as u64)];

    cuMemAllocHost_v2(pp, size) = MEM_ALLOC_HOST
        [CuMemAllocHost, Alloc(Out::Host(pp)), |e| e.size = size as u64];
    cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint)
        [CuMemHostAlloc, Alloc(Out::Host(pp)), |e| (e.size, e.flags) = (size as u64, flags as u64)];
    cuMemFreeHost(p: *mut c_void) [CuMemFreeHost, Free, |e| e.ptr = p as u64];
    cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint)
        [CuMemHostRegister, Returns, |e| (e.ptr, e.size, e.flags) = (p as u64, size as u64, flags as u64)];
    cuMemHostUnregister(p: *mut c_void)
        [CuMemHostUnregister, Releases, |e| e.ptr = p as u64];

    cuMemAddressReserve(ptr, size, alignment, addr, flags)
        = MEM_ADDRESS_RESERVE [CuMemAddressReserve, Returns,
        |e| (e.size, e.offset, e.handle, e.flags) = (size as u64, alignment as u64, addr, flags),
        then |e| if e.result == 0 && !ptr.is_null() {
            // SAFETY: the real call succeeded, so it wrote the caller's non-null out-parameter.
            e.ptr = unsafe { *ptr };
        }];
    cuMemAddressFree(ptr, size) = MEM_ADDRESS_FREE
        [CuMemAddressFree, Releases, |e| (e.ptr, e.size) = (ptr, size as u64)];
    cuMemCreate(handle, size, prop, flags)
        = MEM_CREATE [CuMemCreate, Returns,
        |e| {
            (e.size, e.flags) = (size as u64, flags);
            if !prop.is_null() {
                // SAFETY: non-null, the caller's property struct (the CUDA function's contract).
                let p = unsafe { *prop };
                // CU_MEM_LOCATION_TYPE_DEVICE = 1: the memory lives on that device.
                if p.location.type_ == 1 {
                    e.device = p.location.id;
                }
                e.pitch = p.requested_handle_types as u64;
            }
        },
        then |e| if e.result == 0 && !handle.is_null() {
            // SAFETY: the real call succeeded, so it wrote the caller's non-null out-parameter.
            e.handle = unsafe { *handle };
        }];
    cuMemRelease(handle) = MEM_RELEASE
        [CuMemRelease, Releases, |e| e.handle = handle];
    /// NCCL's free (`ncclCuMemFree`) takes a second reference to the handle mapped at `addr`,
    /// releases it, unmaps, then releases its own: recorded so that the second release is not
    /// read as a double one.
    cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void)
        [CuMemRetainAllocationHandle, Returns, |e| e.ptr = addr as u64,
        then |e| if e.result == 0 && !handle.is_null() {
            // SAFETY: the real call succeeded, so it wrote the caller's non-null out-parameter.
            e.handle = unsafe { *handle };
        }];
    cuMemMap(ptr, size, offset, handle, flags)
        = MEM_MAP [CuMemMap, Returns,
        |e| (e.ptr, e.size, e.offset, e.handle, e.flags) = (ptr, size as u64, offset as u64, handle, flags)];
    cuMemUnmap(ptr, size) = MEM_UNMAP
        [CuMemUnmap, Releases, |e| (e.ptr, e.size) = (ptr, size as u64)];
    /// Recorded with `handle` = bit mask of the devices given access, `flags` = the widest
    /// access flags, `offset` = number of descriptors: that is how peer mappings show in a trace.
    cuMemSetAccess(ptr, size, desc, count)
        = MEM_SET_ACCESS [CuMemSetAccess, Returns,
        |e| {
            (e.ptr, e.size, e.offset) = (ptr, size as u64, count as u64);
            if !desc.is_null() {
                for i in 0..count.min(64) {
                    // SAFETY: the caller's array of `count` descriptors (the CUDA function's
                    // contract), `i < count`.
                    let d = unsafe { *desc.add(i) };
                    if d.location.type_ == 1 && (0..64).contains(&d.location.id) && d.flags != 0 {
                        e.handle |= 1u64 << d.location.id;
                    }
                    e.flags = e.flags.max(d.flags as u64);
                }
            }
        }];

    cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
        [CuIpcOpenMemHandle, Alloc(Out::Device(dptr)), |e| e.flags = flags as u64];
    cuIpcCloseMemHandle(dptr: CUdeviceptr) [CuIpcCloseMemHandle, Free, |e| e.ptr = dptr];

    cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize,
        params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) [CuGraphAddMemAllocNode, Returns,
        |e| {
            e.handle = graph as u64;
            if !params.is_null() {
                // SAFETY: non-null, the caller's node parameters (the CUDA function's contract).
                e.size = unsafe { (*params).bytesize } as u64;
            }
        },
        then |e| if e.result == 0 && !params.is_null() {
            // SAFETY: the real call succeeded, so it wrote the address into the caller's
            // parameters.
            e.ptr = unsafe { (*params).dptr };
        }];
    cuGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize,
        dptr: CUdeviceptr)
        [CuGraphAddMemFreeNode, Releases, |e| (e.handle, e.ptr) = (graph as u64, dptr)];

    /// Handed out only when the launch check is on; checks the parameters, then launches.
    cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)
        = LAUNCH_KERNEL [launch CuLaunchKernel, f, stream, params, extra];
    /// Handed out only when the launch check is on; checks the parameters, then launches.
    cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void)
        [launch CuLaunchKernelPtsz, f, stream, params, extra];
    /// Handed out only when the launch check is on; checks the parameters, then launches.
    cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void)
        [launch CuLaunchKernelEx, f, launch_stream(config), params, extra];
    /// Handed out only when the launch check is on; checks the parameters, then launches.
    cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void)
        [launch CuLaunchKernelExPtsz, f, launch_stream(config), params, extra];
    /// Handed out only when the launch check is on; checks the parameters, then launches.
    cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shmem: c_uint, stream: CUstream, params: *mut *mut c_void)
        [launch CuLaunchCooperativeKernel, f, stream, params, std::ptr::null_mut()];
    /// Handed out only when the launch check is on; checks the parameters, then launches.
    cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shmem: c_uint, stream: CUstream, params: *mut *mut c_void)
        [launch CuLaunchCooperativeKernelPtsz, f, stream, params, std::ptr::null_mut()];

    /// A device's memory pool set: stream-ordered allocations may come from another pool now,
    /// so isolate mode serves none from memory it kept (`ISOLATE_REUSE`).
    cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) [pool_set];

    /// The stream's end: isolate mode records its freeing streams' events again before a check,
    /// and must not do that on a destroyed handle.
    cuStreamDestroy_v2(stream: CUstream) [stream_gone stream];
    /// The same, by its first name.
    cuStreamDestroy(stream: CUstream) [stream_gone stream];

    /// Handed out only when the launch check is on: kernels of the module are gone.
    cuModuleUnload(module: *mut c_void) [unloads];
    /// Handed out only when the launch check is on: kernels of the library are gone.
    cuLibraryUnload(library: *mut c_void) [unloads];
    /// The context's memory and modules are gone: its quarantine is checked first.
    cuCtxDestroy_v2(ctx: CUcontext) [ctx_ends ctx as usize];
    /// `cudaDeviceReset`'s call: the primary context's memory and modules are gone.
    cuDevicePrimaryCtxReset_v2(dev: CUdevice) [ctx_ends 0];
    /// The last release destroys the context (the library cannot tell which release is the
    /// last, so every one checks the quarantine first).
    cuDevicePrimaryCtxRelease_v2(dev: CUdevice) [ctx_ends 0];
    /// The first exports of the two, same ABI: libcudart 13 (dynamic and nvcc's static one)
    /// asks for both at version 7000, so `cudaDeviceReset` calls `cuDevicePrimaryCtxReset`,
    /// never the `_v2` (issue 30: the textbook use-after-free's write was missed there).
    cuDevicePrimaryCtxReset(dev: CUdevice) [ctx_ends 0];
    /// The same, for a release.
    cuDevicePrimaryCtxRelease(dev: CUdevice) [ctx_ends 0];
}

/// The stream of a `cuLaunchKernelEx` (the legacy default stream's handle, 0, for a null
/// configuration, which the driver refuses anyway).
fn launch_stream(config: *const CUlaunchConfig) -> CUstream {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null, the caller's launch configuration (the CUDA function's contract).
    unsafe { (*config).h_stream }
}

/// Whether hook `h` is handed out now: the hooks of stream work other than launches
/// (hooks/stream.rs) only while poisons are deferred; the calls that may load a kernel
/// (hooks/room.rs) and the launch check's hooks only in isolate mode (a launch is checked,
/// queues the deferred poisons first, or is called again when it ran out of memory); the rest
/// always.
pub fn handed_out(h: &Hooked) -> bool {
    if super::stream::STREAM_HOOKED
        .iter()
        .any(|x| std::ptr::eq(x, h))
    {
        return crate::policy::stream_work_hooked();
    }
    if h.launch || super::room::ROOM_HOOKED.iter().any(|x| std::ptr::eq(x, h)) {
        return crate::policy::isolating();
    }
    true
}

/// Every driver hook, by export name: the driver's and the stream work's tables.
pub fn driver_hook(name: &CStr) -> Option<&'static Hooked> {
    HOOKED
        .iter()
        .chain(super::stream::STREAM_HOOKED)
        .chain(super::room::ROOM_HOOKED)
        .find(|h| h.name == name)
}

/// Given what a real resolver (`cuGetProcAddress`, `cudaGetDriverEntryPoint*`) handed back,
/// returns what the caller should get: our hook for an export we know (the real one stored),
/// else the pointer unchanged.
pub fn substitute(p: *mut c_void) -> *mut c_void {
    if p.is_null() || is_ours(p) {
        return p;
    }
    let Some(name) = export_name(p) else { return p };
    match driver_hook(name) {
        Some(h) if handed_out(h) => {
            (h.store)(p);
            h.hook as *mut c_void
        }
        _ => p,
    }
}

//! Runtime exports (`cuda*`). They bind the versioned imports of `libcudart.so.13` users
//! (PyTorch's `libc10_cuda.so`, …). One runtime call is one event under its runtime name: the
//! driver calls the runtime makes underneath come back to our driver hooks nested, and pass.
//!
//! Layer: hooks. Uses the policies, recording, the base and [`super::driver`] (its resolver's
//! substitution).

#![allow(non_snake_case)]

use crate::base::cuda::*;
use crate::policy::Call::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

hooks! {
    /// Every runtime export we hook, by its exact name: handed out by the `dlsym` override for
    /// a lookup in a runtime's handle (ctypes, cffi, JIT runtimes) when the handle's function
    /// is the one the hook calls.
    static RUNTIME_HOOKED: cudaError_t = missing CUDA_ERROR_SYMBOL_NOT_FOUND_RT, in Runtime;

    cudaMalloc(p: *mut *mut c_void, size: usize)
        [CudaMalloc, Alloc(Out::DevicePtr(p)), |e| e.size = size as u64];
    cudaMallocAsync(p: *mut *mut c_void, size: usize, stream: CUstream)
        [CudaMallocAsync, Alloc(Out::DevicePtr(p)), |e| (e.size, e.stream) = (size as u64, stream as u64)];
    cudaMallocAsync_ptsz(p: *mut *mut c_void, size: usize, stream: CUstream)
        [CudaMallocAsyncPtsz, Alloc(Out::DevicePtr(p)), |e| (e.size, e.stream) = (size as u64, stream as u64)];
    cudaMallocFromPoolAsync(p: *mut *mut c_void, size: usize, pool: CUmemoryPool, stream: CUstream)
        [CudaMallocFromPoolAsync, Alloc(Out::DevicePtr(p)),
        |e| (e.size, e.handle, e.stream) = (size as u64, pool as u64, stream as u64)];
    cudaMallocFromPoolAsync_ptsz(p: *mut *mut c_void, size: usize, pool: CUmemoryPool, stream: CUstream)
        [CudaMallocFromPoolAsyncPtsz, Alloc(Out::DevicePtr(p)),
        |e| (e.size, e.handle, e.stream) = (size as u64, pool as u64, stream as u64)];
    cudaMallocManaged(p: *mut *mut c_void, size: usize, flags: c_uint)
        [CudaMallocManaged, Alloc(Out::DevicePtr(p)), |e| (e.size, e.flags) = (size as u64, flags as u64)];
    cudaMallocPitch(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize)
        [CudaMallocPitch, Alloc(Out::DevicePtr(p)),
        |e| e.size = (width as u64).saturating_mul(height as u64),
        then |e| if e.result == 0 && !pitch.is_null() {
            // SAFETY: the real call succeeded, so it wrote the caller's non-null out-parameter.
            e.pitch = unsafe { *pitch } as u64;
            e.size = e.pitch.saturating_mul(height as u64);
        }];
    cudaMalloc3D(pp: *mut cudaPitchedPtr, extent: cudaExtent)
        [CudaMalloc3D, Alloc(Out::Pitched(pp)),
        |e| e.size = (extent.width as u64)
            .saturating_mul(extent.height as u64)
            .saturating_mul(extent.depth as u64),
        then |e| if e.result == 0 && !pp.is_null() {
            // SAFETY: the real call succeeded, so it wrote the caller's non-null out-parameter.
            e.pitch = unsafe { (*pp).pitch } as u64;
            e.size = e
                .pitch
                .saturating_mul(extent.height as u64)
                .saturating_mul(extent.depth as u64);
        }];
    cudaMallocHost(p: *mut *mut c_void, size: usize)
        [CudaMallocHost, Alloc(Out::Host(p)), |e| e.size = size as u64];
    cudaHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint)
        [CudaHostAlloc, Alloc(Out::Host(p)), |e| (e.size, e.flags) = (size as u64, flags as u64)];

    cudaFree(p) = FREE [CudaFree, Free, |e| e.ptr = p as u64];
    cudaFreeAsync(p, stream) = FREE_ASYNC
        [CudaFreeAsync, Free, |e| (e.ptr, e.stream) = (p as u64, stream as u64)];
    cudaFreeAsync_ptsz(p, stream) = FREE_ASYNC_PTSZ
        [CudaFreeAsyncPtsz, Free, |e| (e.ptr, e.stream) = (p as u64, stream as u64)];
    cudaFreeHost(p: *mut c_void) [CudaFreeHost, Free, |e| e.ptr = p as u64];
    cudaHostRegister(p: *mut c_void, size: usize, flags: c_uint)
        [CudaHostRegister, Returns, |e| (e.ptr, e.size, e.flags) = (p as u64, size as u64, flags as u64)];
    cudaHostUnregister(p: *mut c_void)
        [CudaHostUnregister, Releases, |e| e.ptr = p as u64];

    cudaIpcOpenMemHandle(p: *mut *mut c_void, handle: CUipcMemHandle, flags: c_uint)
        [CudaIpcOpenMemHandle, Alloc(Out::DevicePtr(p)), |e| e.flags = flags as u64];
    cudaIpcCloseMemHandle(p: *mut c_void) [CudaIpcCloseMemHandle, Free, |e| e.ptr = p as u64];

    /// Hands back our hook in place of the driver entry point the runtime found, decided by
    /// the exact export it found. When the runtime resolved through our `cuGetProcAddress`
    /// already, the pointer is our hook, and is passed on as it is.
    cudaGetDriverEntryPoint(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int)
        [resolver pfn];
    /// As `cudaGetDriverEntryPoint`.
    cudaGetDriverEntryPoint_ptsz(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int)
        [resolver pfn];
    /// As `cudaGetDriverEntryPoint`.
    cudaGetDriverEntryPointByVersion(symbol: *const c_char, pfn: *mut *mut c_void, version: c_uint, flags: u64,
        status: *mut c_int) [resolver pfn];
    /// As `cudaGetDriverEntryPoint`.
    cudaGetDriverEntryPointByVersion_ptsz(symbol: *const c_char, pfn: *mut *mut c_void, version: c_uint, flags: u64,
        status: *mut c_int) [resolver pfn];
}

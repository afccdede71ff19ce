//! Calls that load a kernel, and so may need device memory of the driver's own: with lazy
//! loading (`CUDA_MODULE_LOADING=LAZY`, CUDA's default) a kernel's code is put on the device
//! the first time something needs it — its launch (the launch hooks, driver.rs), or a query
//! about it before that: PyTorch's softmax asks `cudaOccupancyMaxActiveBlocksPerMultiprocessor`
//! before its first launch, the runtime's `cudaFuncGetAttributes` and `cudaFuncSetAttribute`
//! ask the driver the same way. On a full device the load fails with out of memory. In isolate
//! mode the quarantine may be what fills it, so each of these, when it returns
//! `CUDA_ERROR_OUT_OF_MEMORY`, gets the library's memory back and is called again
//! (`[needs_room]`, `policy::out_of_room`), as a launch is. Handed out only in isolate mode;
//! the rest of the time the driver's own functions are.
//!
//! Layer: hooks. Uses the policies and the base.

#![allow(non_snake_case)]

use crate::base::cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

hooks! {
    /// Every export we hand out a hook for in isolate mode because it may load a kernel.
    static ROOM_HOOKED: CUresult = missing CUDA_ERROR_NOT_FOUND, in Driver;

    cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: CUfunction, block: c_int, smem: usize)
        [needs_room];
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut c_int, f: CUfunction, block: c_int, smem: usize,
        flags: c_uint) [needs_room];
    cuOccupancyMaxPotentialBlockSize(grid: *mut c_int, block: *mut c_int, f: CUfunction, smem_of: *mut c_void,
        smem: usize, limit: c_int) [needs_room];
    cuOccupancyMaxPotentialBlockSizeWithFlags(grid: *mut c_int, block: *mut c_int, f: CUfunction,
        smem_of: *mut c_void, smem: usize, limit: c_int, flags: c_uint) [needs_room];
    cuOccupancyAvailableDynamicSMemPerBlock(smem: *mut usize, f: CUfunction, blocks: c_int, block: c_int)
        [needs_room];
    cuOccupancyMaxPotentialClusterSize(n: *mut c_int, f: CUfunction, config: *const CUlaunchConfig)
        [needs_room];
    cuOccupancyMaxActiveClusters(n: *mut c_int, f: CUfunction, config: *const CUlaunchConfig)
        [needs_room];
    cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: CUfunction) [needs_room];
    cuFuncSetAttribute(f: CUfunction, attr: c_int, v: c_int) [needs_room];
    cuFuncSetCacheConfig(f: CUfunction, config: c_int) [needs_room];
    cuFuncLoad(f) = FUNC_LOAD [needs_room];
    cuKernelGetFunction(f: *mut CUfunction, kernel: *mut c_void) [needs_room];
    cuKernelGetAttribute(v: *mut c_int, attr: c_int, kernel: *mut c_void, dev: CUdevice) [needs_room];
    cuKernelSetAttribute(attr: c_int, v: c_int, kernel: *mut c_void, dev: CUdevice) [needs_room];
    cuKernelSetCacheConfig(kernel: *mut c_void, config: c_int, dev: CUdevice) [needs_room];
    cuLibraryGetKernel(kernel: *mut *mut c_void, library: *mut c_void, name: *const c_char) [needs_room];
    cuLibraryGetModule(module: *mut *mut c_void, library: *mut c_void) [needs_room];
    cuModuleGetFunction(f, module, name) = MODULE_GET_FUNCTION [needs_room];
    /// Loads that put code on the device at once (`CUDA_MODULE_LOADING=EAGER`, or a module
    /// of few kernels).
    cuModuleLoadData(module, image) = MODULE_LOAD_DATA [needs_room];
    cuModuleLoadDataEx(module: *mut *mut c_void, image: *const c_void, n: c_uint, options: *mut c_int,
        values: *mut *mut c_void) [needs_room];
    cuModuleLoadFatBinary(module: *mut *mut c_void, image: *const c_void) [needs_room];
    cuModuleLoad(module: *mut *mut c_void, path: *const c_char) [needs_room];
    cuLibraryLoadData(library: *mut *mut c_void, code: *const c_void, jit: *mut c_int, jit_values: *mut *mut c_void,
        njit: c_uint, options: *mut c_int, values: *mut *mut c_void, n: c_uint) [needs_room];
    cuLibraryLoadFromFile(library: *mut *mut c_void, path: *const c_char, jit: *mut c_int,
        jit_values: *mut *mut c_void, njit: c_uint, options: *mut c_int, values: *mut *mut c_void, n: c_uint)
        [needs_room];
}

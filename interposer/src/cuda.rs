//! Raw CUDA types and the function-pointer types of every entry point we hook.
//!
//! Results are plain integers, never Rust enums: the driver may hand back a code this build has
//! never heard of, and the caller must get exactly that code.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type cudaError_t = c_int;
pub type CUdeviceptr = u64;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type CUdevice = c_int;
pub type CUcontext = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_OUT_OF_MEMORY_RT: cudaError_t = 2; // cudaErrorMemoryAllocation
pub const CUDA_ERROR_INITIALIZATION_RT: cudaError_t = 3; // cudaErrorInitializationError
pub const CUDA_ERROR_SYMBOL_NOT_FOUND_RT: cudaError_t = 500;

/// `cudaExtent`, passed by value to `cudaMalloc3D`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `cudaPitchedPtr`, the out-parameter of `cudaMalloc3D`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp` (CUDA 12/13 layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

/// `CUmemPoolProps` (88 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS_v1`; `dptr` is written by `cuGraphAddMemAllocNode`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const CUmemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUlaunchConfig`, the first argument of `cuLaunchKernelEx`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchConfig {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

// Driver function types.
pub type FnGetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
pub type FnGetProcAddressV1 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
pub type FnMemAlloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
pub type FnMemFree = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
pub type FnMemAllocAsync = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
pub type FnMemFreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
pub type FnMemAllocFromPoolAsync =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
pub type FnMemAllocManaged = unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
pub type FnMemAllocPitch =
    unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
pub type FnMemAllocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> CUresult;
pub type FnMemHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult;
pub type FnMemFreeHost = unsafe extern "C" fn(*mut c_void) -> CUresult;
pub type FnMemHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult;
pub type FnMemHostUnregister = unsafe extern "C" fn(*mut c_void) -> CUresult;
pub type FnMemAddressReserve =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> CUresult;
pub type FnMemAddressFree = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub type FnMemCreate = unsafe extern "C" fn(
    *mut CUmemGenericAllocationHandle,
    usize,
    *const CUmemAllocationProp,
    u64,
) -> CUresult;
pub type FnMemRelease = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
pub type FnMemMap =
    unsafe extern "C" fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult;
pub type FnMemUnmap = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub type FnMemSetAccess =
    unsafe extern "C" fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> CUresult;
pub type FnGraphAddMemAllocNode = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    usize,
    *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult;
pub type FnGraphAddMemFreeNode = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    usize,
    CUdeviceptr,
) -> CUresult;
pub type FnLaunchKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub type FnLaunchKernelEx = unsafe extern "C" fn(
    *const CUlaunchConfig,
    CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub type FnLaunchCooperativeKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
) -> CUresult;
pub type FnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
pub type FnMemsetD8 = unsafe extern "C" fn(CUdeviceptr, u8, usize) -> CUresult;
pub type FnMemsetD8Async = unsafe extern "C" fn(CUdeviceptr, u8, usize, CUstream) -> CUresult;
pub type FnFuncGetParamInfo =
    unsafe extern "C" fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult;
pub type FnFuncGetName = unsafe extern "C" fn(*mut *const c_char, CUfunction) -> CUresult;
pub type FnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub type FnStreamSynchronize = unsafe extern "C" fn(CUstream) -> CUresult;
pub type FnCtxSynchronize = unsafe extern "C" fn() -> CUresult;

// Runtime function types.
pub type FnCudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> cudaError_t;
pub type FnCudaFree = unsafe extern "C" fn(*mut c_void) -> cudaError_t;
pub type FnCudaMallocAsync = unsafe extern "C" fn(*mut *mut c_void, usize, CUstream) -> cudaError_t;
pub type FnCudaFreeAsync = unsafe extern "C" fn(*mut c_void, CUstream) -> cudaError_t;
pub type FnCudaMallocFromPoolAsync =
    unsafe extern "C" fn(*mut *mut c_void, usize, CUmemoryPool, CUstream) -> cudaError_t;
pub type FnCudaMallocManaged = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> cudaError_t;
pub type FnCudaMallocPitch =
    unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> cudaError_t;
pub type FnCudaMalloc3D = unsafe extern "C" fn(*mut cudaPitchedPtr, cudaExtent) -> cudaError_t;
pub type FnCudaMallocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> cudaError_t;
pub type FnCudaHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> cudaError_t;
pub type FnCudaFreeHost = unsafe extern "C" fn(*mut c_void) -> cudaError_t;
pub type FnCudaHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> cudaError_t;
pub type FnCudaHostUnregister = unsafe extern "C" fn(*mut c_void) -> cudaError_t;
pub type FnCudaGetDriverEntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> cudaError_t;
pub type FnCudaGetDriverEntryPointByVersion =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> cudaError_t;

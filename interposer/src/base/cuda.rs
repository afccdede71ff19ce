//! Raw CUDA types, and where an allocation call writes the address it hands out ([`Out`]).
//! The functions themselves are declared in [`super::real`].
//!
//! Layer: base. Uses nothing of this crate.
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

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, the handles that name the default streams
/// (as 0 does, the legacy one or the thread's, by the entry point).
pub const STREAM_LEGACY: u64 = 0x1;
pub const STREAM_PER_THREAD: u64 = 0x2;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
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

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; 64],
}

/// Where an allocation call writes the address it hands out.
#[derive(Clone, Copy)]
pub enum Out {
    /// `CUdeviceptr *` (driver).
    Device(*mut CUdeviceptr),
    /// `void **` of device memory (runtime).
    DevicePtr(*mut *mut c_void),
    /// `void **` of host memory.
    Host(*mut *mut c_void),
    /// `cudaPitchedPtr *` (`cudaMalloc3D`).
    Pitched(*mut cudaPitchedPtr),
}

impl Out {
    /// The address the call wrote, 0 for a null out-pointer.
    pub fn read(self) -> u64 {
        // SAFETY: an `Out` is only made by the hooks from the out-parameter the application passed
        // to the allocation call (base::real's declarations give each its C type), and is read
        // right after that call returned, within the hook, while the caller's pointer is live. The
        // CUDA API requires a non-null out-parameter to point to writable memory for one value of
        // that type, so each non-null pointer read here is valid and aligned for its variant; null
        // is checked first.
        unsafe {
            match self {
                Out::Device(p) if !p.is_null() => *p,
                Out::DevicePtr(p) | Out::Host(p) if !p.is_null() => *p as u64,
                Out::Pitched(p) if !p.is_null() => (*p).ptr as u64,
                _ => 0,
            }
        }
    }

    /// Writes the address (guard mode makes the allocation itself).
    pub fn write(self, ptr: u64) {
        // SAFETY: as in `read`: the caller's out-parameter, checked non-null, valid and aligned for
        // one value of its type for as long as the hook runs, which is when guard mode writes it
        // (in place of the real call, which would have written the same place).
        unsafe {
            match self {
                Out::Device(p) if !p.is_null() => *p = ptr,
                Out::DevicePtr(p) | Out::Host(p) if !p.is_null() => *p = ptr as *mut c_void,
                Out::Pitched(p) if !p.is_null() => (*p).ptr = ptr as *mut c_void,
                _ => {}
            }
        }
    }

    pub fn is_null(self) -> bool {
        match self {
            Out::Device(p) => p.is_null(),
            Out::DevicePtr(p) | Out::Host(p) => p.is_null(),
            Out::Pitched(p) => p.is_null(),
        }
    }
}

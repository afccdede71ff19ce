//! Every real function the library calls — the runtime's and the driver's it hooks, the ones
//! the policies call themselves, and libc's it wraps — declared once each, by export name and
//! C signature, and resolved on first use.
//!
//! Layer: base. Uses [`super::cuda`] and [`super::resolve`] only.

#![allow(non_upper_case_globals)]

use super::cuda::*;
use super::resolve::{dlsym_in, is_ours, libcuda, libcudart};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where a [`Real`] is looked up when nothing has stored it yet.
#[derive(Clone, Copy)]
pub enum Lib {
    /// The driver library (`libcuda.so.1`), loaded if nobody has yet.
    Driver,
    /// The next definition after ours (`RTLD_NEXT`), else the runtime already loaded.
    Runtime,
    /// The next definition after ours (`RTLD_NEXT`) only: libc.
    Libc,
}

/// The real function behind one of our hooks (or one we only call), resolved once.
pub struct Real<F> {
    pub name: &'static CStr,
    lib: Lib,
    ptr: AtomicUsize,
    _f: PhantomData<F>,
}

// SAFETY: only an atomic word is shared.
unsafe impl<F> Sync for Real<F> {}

impl<F: Copy> Real<F> {
    pub const fn new(name: &'static CStr, lib: Lib) -> Self {
        Self {
            name,
            lib,
            ptr: AtomicUsize::new(0),
            _f: PhantomData,
        }
    }

    /// Records the real function the driver's resolver handed out for this export.
    pub fn store(&self, p: *mut c_void) {
        self.ptr.store(p as usize, Ordering::Release);
    }

    /// The real function, found on first use. `None` only if the library has no such symbol.
    #[inline]
    pub fn get(&self) -> Option<F> {
        let p = self.addr();
        if p == 0 {
            return None;
        }
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: F is the function-pointer type of this symbol.
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
    }

    /// True when the real function is `p`: the one already known or found now (as by
    /// [`Real::get`]), or `p` itself, stored, when none can be found. Never replaces a
    /// different one: that one belongs to another copy of the library, whose users it serves.
    pub fn adopt(&self, p: *mut c_void) -> bool {
        let cur = self.addr();
        if cur != 0 {
            return cur == p as usize;
        }
        match self
            .ptr
            .compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(cur) => cur == p as usize,
        }
    }

    #[inline]
    fn addr(&self) -> usize {
        let mut p = self.ptr.load(Ordering::Acquire);
        if p == 0 {
            p = self.lookup();
            if p == 0 {
                return 0;
            }
            self.ptr.store(p, Ordering::Release);
        }
        p
    }

    #[cold]
    fn lookup(&self) -> usize {
        let in_handle = |h: *mut c_void| {
            if h.is_null() {
                std::ptr::null_mut()
            } else {
                dlsym_in(h, self.name)
            }
        };
        let p = match self.lib {
            Lib::Driver => in_handle(libcuda()),
            Lib::Libc => dlsym_in(libc::RTLD_NEXT, self.name),
            Lib::Runtime => {
                let p = dlsym_in(libc::RTLD_NEXT, self.name);
                if !p.is_null() && !is_ours(p) {
                    p
                } else {
                    in_handle(libcudart())
                }
            }
        };
        if p.is_null() || is_ours(p) {
            0
        } else {
            p as usize
        }
    }
}

/// `NAME = export: fn(args) -> ret;` declares `pub static NAME: Real<unsafe extern "C" fn…>`
/// looked up as `export` in the library of the block.
macro_rules! reals {
    ($( $lib:ident { $( $stat:ident = $export:ident: fn($($t:ty),* $(,)?) $(-> $ret:ty)?; )* } )*) => {
        $($(
            pub static $stat: Real<unsafe extern "C" fn($($t),*) $(-> $ret)?> = Real::new(
                // SAFETY: the literal ends in its only NUL.
                unsafe { CStr::from_bytes_with_nul_unchecked(concat!(stringify!($export), "\0").as_bytes()) },
                Lib::$lib,
            );
        )*)*
    };
}

reals! {
    Driver {
        // The driver's resolver.
        GET_PROC_ADDRESS_V2 = cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
        GET_PROC_ADDRESS = cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
        // Hooked: allocations and frees.
        MEM_ALLOC = cuMemAlloc_v2: fn(*mut CUdeviceptr, usize) -> CUresult;
        MEM_FREE = cuMemFree_v2: fn(CUdeviceptr) -> CUresult;
        MEM_ALLOC_ASYNC = cuMemAllocAsync: fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
        MEM_ALLOC_ASYNC_PTSZ = cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
        MEM_FREE_ASYNC = cuMemFreeAsync: fn(CUdeviceptr, CUstream) -> CUresult;
        MEM_FREE_ASYNC_PTSZ = cuMemFreeAsync_ptsz: fn(CUdeviceptr, CUstream) -> CUresult;
        MEM_ALLOC_FROM_POOL_ASYNC = cuMemAllocFromPoolAsync: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
        MEM_ALLOC_FROM_POOL_ASYNC_PTSZ = cuMemAllocFromPoolAsync_ptsz: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
        MEM_ALLOC_MANAGED = cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
        MEM_ALLOC_PITCH = cuMemAllocPitch_v2: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
        MEM_ALLOC_HOST = cuMemAllocHost_v2: fn(*mut *mut c_void, usize) -> CUresult;
        MEM_HOST_ALLOC = cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint) -> CUresult;
        MEM_FREE_HOST = cuMemFreeHost: fn(*mut c_void) -> CUresult;
        MEM_HOST_REGISTER = cuMemHostRegister_v2: fn(*mut c_void, usize, c_uint) -> CUresult;
        MEM_HOST_UNREGISTER = cuMemHostUnregister: fn(*mut c_void) -> CUresult;
        // Hooked: virtual memory.
        MEM_ADDRESS_RESERVE = cuMemAddressReserve: fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> CUresult;
        MEM_ADDRESS_FREE = cuMemAddressFree: fn(CUdeviceptr, usize) -> CUresult;
        MEM_CREATE = cuMemCreate: fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64) -> CUresult;
        MEM_RELEASE = cuMemRelease: fn(CUmemGenericAllocationHandle) -> CUresult;
        MEM_MAP = cuMemMap: fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult;
        MEM_UNMAP = cuMemUnmap: fn(CUdeviceptr, usize) -> CUresult;
        MEM_SET_ACCESS = cuMemSetAccess: fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> CUresult;
        // Hooked: memory another process shares.
        IPC_OPEN_MEM_HANDLE = cuIpcOpenMemHandle_v2: fn(*mut CUdeviceptr, CUipcMemHandle, c_uint) -> CUresult;
        IPC_CLOSE_MEM_HANDLE = cuIpcCloseMemHandle: fn(CUdeviceptr) -> CUresult;
        // Hooked: graphs.
        GRAPH_ADD_MEM_ALLOC_NODE = cuGraphAddMemAllocNode: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
        GRAPH_ADD_MEM_FREE_NODE = cuGraphAddMemFreeNode: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, CUdeviceptr) -> CUresult;
        // Hooked when the launch check is on.
        LAUNCH_KERNEL = cuLaunchKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
        LAUNCH_KERNEL_PTSZ = cuLaunchKernel_ptsz: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
        LAUNCH_KERNEL_EX = cuLaunchKernelEx: fn(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult;
        LAUNCH_KERNEL_EX_PTSZ = cuLaunchKernelEx_ptsz: fn(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult;
        LAUNCH_COOPERATIVE_KERNEL = cuLaunchCooperativeKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult;
        LAUNCH_COOPERATIVE_KERNEL_PTSZ = cuLaunchCooperativeKernel_ptsz: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult;
        // Hooked when the launch check is on: what ends kernels' lives (their handles may be
        // reused), so the check's cached parameter layouts are looked at again.
        MODULE_UNLOAD = cuModuleUnload: fn(*mut c_void) -> CUresult;
        LIBRARY_UNLOAD = cuLibraryUnload: fn(*mut c_void) -> CUresult;
        CTX_DESTROY = cuCtxDestroy_v2: fn(CUcontext) -> CUresult;
        PRIMARY_CTX_RESET = cuDevicePrimaryCtxReset_v2: fn(CUdevice) -> CUresult;
        PRIMARY_CTX_RELEASE = cuDevicePrimaryCtxRelease_v2: fn(CUdevice) -> CUresult;
        // Hooked: a stream's end (isolate mode stops recording on it).
        STREAM_DESTROY = cuStreamDestroy_v2: fn(CUstream) -> CUresult;
        STREAM_DESTROY_V1 = cuStreamDestroy: fn(CUstream) -> CUresult;
        // Hooked: a device's memory pool set (isolate mode stops serving kept memory).
        DEVICE_SET_MEM_POOL = cuDeviceSetMemPool: fn(CUdevice, CUmemoryPool) -> CUresult;
        // Hooked while poisons are deferred (hooks/stream.rs): the program's stream work, which
        // the deferred poisons must precede. The ones the policies also call are further down.
        STREAM_SYNCHRONIZE_PTSZ = cuStreamSynchronize_ptsz: fn(CUstream) -> CUresult;
        STREAM_QUERY = cuStreamQuery: fn(CUstream) -> CUresult;
        STREAM_QUERY_PTSZ = cuStreamQuery_ptsz: fn(CUstream) -> CUresult;
        MEMCPY_ASYNC = cuMemcpyAsync: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult;
        MEMCPY_ASYNC_PTSZ = cuMemcpyAsync_ptsz: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult;
        MEMCPY_PEER_ASYNC = cuMemcpyPeerAsync: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream) -> CUresult;
        MEMCPY_PEER_ASYNC_PTSZ = cuMemcpyPeerAsync_ptsz: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream) -> CUresult;
        MEMCPY_HTOD_ASYNC_PTSZ = cuMemcpyHtoDAsync_v2_ptsz: fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
        MEMCPY_DTOH_ASYNC_PTSZ = cuMemcpyDtoHAsync_v2_ptsz: fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
        MEMCPY_DTOD_ASYNC = cuMemcpyDtoDAsync_v2: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult;
        MEMCPY_DTOD_ASYNC_PTSZ = cuMemcpyDtoDAsync_v2_ptsz: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult;
        MEMCPY_2D_ASYNC = cuMemcpy2DAsync_v2: fn(*const c_void, CUstream) -> CUresult;
        MEMCPY_2D_ASYNC_PTSZ = cuMemcpy2DAsync_v2_ptsz: fn(*const c_void, CUstream) -> CUresult;
        MEMCPY_3D_ASYNC = cuMemcpy3DAsync_v2: fn(*const c_void, CUstream) -> CUresult;
        MEMCPY_3D_ASYNC_PTSZ = cuMemcpy3DAsync_v2_ptsz: fn(*const c_void, CUstream) -> CUresult;
        MEMCPY_3D_PEER_ASYNC = cuMemcpy3DPeerAsync: fn(*const c_void, CUstream) -> CUresult;
        MEMCPY_3D_PEER_ASYNC_PTSZ = cuMemcpy3DPeerAsync_ptsz: fn(*const c_void, CUstream) -> CUresult;
        MEMSET_D8_ASYNC_PTSZ = cuMemsetD8Async_ptsz: fn(CUdeviceptr, u8, usize, CUstream) -> CUresult;
        MEMSET_D16_ASYNC = cuMemsetD16Async: fn(CUdeviceptr, u16, usize, CUstream) -> CUresult;
        MEMSET_D16_ASYNC_PTSZ = cuMemsetD16Async_ptsz: fn(CUdeviceptr, u16, usize, CUstream) -> CUresult;
        MEMSET_D32_ASYNC = cuMemsetD32Async: fn(CUdeviceptr, u32, usize, CUstream) -> CUresult;
        MEMSET_D32_ASYNC_PTSZ = cuMemsetD32Async_ptsz: fn(CUdeviceptr, u32, usize, CUstream) -> CUresult;
        MEMSET_D2D8_ASYNC = cuMemsetD2D8Async: fn(CUdeviceptr, usize, u8, usize, usize, CUstream) -> CUresult;
        MEMSET_D2D8_ASYNC_PTSZ = cuMemsetD2D8Async_ptsz: fn(CUdeviceptr, usize, u8, usize, usize, CUstream) -> CUresult;
        MEMSET_D2D16_ASYNC = cuMemsetD2D16Async: fn(CUdeviceptr, usize, u16, usize, usize, CUstream) -> CUresult;
        MEMSET_D2D16_ASYNC_PTSZ = cuMemsetD2D16Async_ptsz: fn(CUdeviceptr, usize, u16, usize, usize, CUstream) -> CUresult;
        MEMSET_D2D32_ASYNC = cuMemsetD2D32Async: fn(CUdeviceptr, usize, u32, usize, usize, CUstream) -> CUresult;
        MEMSET_D2D32_ASYNC_PTSZ = cuMemsetD2D32Async_ptsz: fn(CUdeviceptr, usize, u32, usize, usize, CUstream) -> CUresult;
        EVENT_RECORD_PTSZ = cuEventRecord_ptsz: fn(*mut c_void, CUstream) -> CUresult;
        EVENT_RECORD_WITH_FLAGS = cuEventRecordWithFlags: fn(*mut c_void, CUstream, c_uint) -> CUresult;
        EVENT_RECORD_WITH_FLAGS_PTSZ = cuEventRecordWithFlags_ptsz: fn(*mut c_void, CUstream, c_uint) -> CUresult;
        GRAPH_LAUNCH = cuGraphLaunch: fn(*mut c_void, CUstream) -> CUresult;
        GRAPH_LAUNCH_PTSZ = cuGraphLaunch_ptsz: fn(*mut c_void, CUstream) -> CUresult;
        LAUNCH_HOST_FUNC = cuLaunchHostFunc: fn(CUstream, *mut c_void, *mut c_void) -> CUresult;
        LAUNCH_HOST_FUNC_PTSZ = cuLaunchHostFunc_ptsz: fn(CUstream, *mut c_void, *mut c_void) -> CUresult;
        STREAM_ADD_CALLBACK = cuStreamAddCallback: fn(CUstream, *mut c_void, *mut c_void, c_uint) -> CUresult;
        STREAM_ADD_CALLBACK_PTSZ = cuStreamAddCallback_ptsz: fn(CUstream, *mut c_void, *mut c_void, c_uint) -> CUresult;
        STREAM_WAIT_VALUE32 = cuStreamWaitValue32_v2: fn(CUstream, CUdeviceptr, u32, c_uint) -> CUresult;
        STREAM_WAIT_VALUE32_PTSZ = cuStreamWaitValue32_v2_ptsz: fn(CUstream, CUdeviceptr, u32, c_uint) -> CUresult;
        STREAM_WAIT_VALUE64 = cuStreamWaitValue64_v2: fn(CUstream, CUdeviceptr, u64, c_uint) -> CUresult;
        STREAM_WAIT_VALUE64_PTSZ = cuStreamWaitValue64_v2_ptsz: fn(CUstream, CUdeviceptr, u64, c_uint) -> CUresult;
        STREAM_WRITE_VALUE32 = cuStreamWriteValue32_v2: fn(CUstream, CUdeviceptr, u32, c_uint) -> CUresult;
        STREAM_WRITE_VALUE32_PTSZ = cuStreamWriteValue32_v2_ptsz: fn(CUstream, CUdeviceptr, u32, c_uint) -> CUresult;
        STREAM_WRITE_VALUE64 = cuStreamWriteValue64_v2: fn(CUstream, CUdeviceptr, u64, c_uint) -> CUresult;
        STREAM_WRITE_VALUE64_PTSZ = cuStreamWriteValue64_v2_ptsz: fn(CUstream, CUdeviceptr, u64, c_uint) -> CUresult;
        STREAM_BATCH_MEM_OP = cuStreamBatchMemOp_v2: fn(CUstream, c_uint, *mut c_void, c_uint) -> CUresult;
        STREAM_BATCH_MEM_OP_PTSZ = cuStreamBatchMemOp_v2_ptsz: fn(CUstream, c_uint, *mut c_void, c_uint) -> CUresult;
        STREAM_BEGIN_CAPTURE = cuStreamBeginCapture_v2: fn(CUstream, c_int) -> CUresult;
        STREAM_BEGIN_CAPTURE_PTSZ = cuStreamBeginCapture_v2_ptsz: fn(CUstream, c_int) -> CUresult;
        STREAM_BEGIN_CAPTURE_LEGACY = cuStreamBeginCapture: fn(CUstream) -> CUresult;
        STREAM_BEGIN_CAPTURE_LEGACY_PTSZ = cuStreamBeginCapture_ptsz: fn(CUstream) -> CUresult;
        STREAM_BEGIN_CAPTURE_TO_GRAPH = cuStreamBeginCaptureToGraph: fn(CUstream, *mut c_void, *const c_void, *const c_void, usize, c_int) -> CUresult;
        STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ = cuStreamBeginCaptureToGraph_ptsz: fn(CUstream, *mut c_void, *const c_void, *const c_void, usize, c_int) -> CUresult;
        MEMCPY = cuMemcpy: fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
        MEMCPY_PTDS = cuMemcpy_ptds: fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
        MEMCPY_PEER = cuMemcpyPeer: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize) -> CUresult;
        MEMCPY_PEER_PTDS = cuMemcpyPeer_ptds: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize) -> CUresult;
        MEMCPY_HTOD_PTDS = cuMemcpyHtoD_v2_ptds: fn(CUdeviceptr, *const c_void, usize) -> CUresult;
        MEMCPY_DTOH_PTDS = cuMemcpyDtoH_v2_ptds: fn(*mut c_void, CUdeviceptr, usize) -> CUresult;
        MEMCPY_DTOD = cuMemcpyDtoD_v2: fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
        MEMCPY_DTOD_PTDS = cuMemcpyDtoD_v2_ptds: fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
        MEMCPY_2D = cuMemcpy2D_v2: fn(*const c_void) -> CUresult;
        MEMCPY_2D_PTDS = cuMemcpy2D_v2_ptds: fn(*const c_void) -> CUresult;
        MEMCPY_2D_UNALIGNED = cuMemcpy2DUnaligned_v2: fn(*const c_void) -> CUresult;
        MEMCPY_2D_UNALIGNED_PTDS = cuMemcpy2DUnaligned_v2_ptds: fn(*const c_void) -> CUresult;
        MEMCPY_3D = cuMemcpy3D_v2: fn(*const c_void) -> CUresult;
        MEMCPY_3D_PTDS = cuMemcpy3D_v2_ptds: fn(*const c_void) -> CUresult;
        MEMCPY_3D_PEER = cuMemcpy3DPeer: fn(*const c_void) -> CUresult;
        MEMCPY_3D_PEER_PTDS = cuMemcpy3DPeer_ptds: fn(*const c_void) -> CUresult;
        MEMSET_D8_PTDS = cuMemsetD8_v2_ptds: fn(CUdeviceptr, u8, usize) -> CUresult;
        MEMSET_D16 = cuMemsetD16_v2: fn(CUdeviceptr, u16, usize) -> CUresult;
        MEMSET_D16_PTDS = cuMemsetD16_v2_ptds: fn(CUdeviceptr, u16, usize) -> CUresult;
        MEMSET_D32 = cuMemsetD32_v2: fn(CUdeviceptr, u32, usize) -> CUresult;
        MEMSET_D32_PTDS = cuMemsetD32_v2_ptds: fn(CUdeviceptr, u32, usize) -> CUresult;
        MEMSET_D2D8 = cuMemsetD2D8_v2: fn(CUdeviceptr, usize, u8, usize, usize) -> CUresult;
        MEMSET_D2D8_PTDS = cuMemsetD2D8_v2_ptds: fn(CUdeviceptr, usize, u8, usize, usize) -> CUresult;
        MEMSET_D2D16 = cuMemsetD2D16_v2: fn(CUdeviceptr, usize, u16, usize, usize) -> CUresult;
        MEMSET_D2D16_PTDS = cuMemsetD2D16_v2_ptds: fn(CUdeviceptr, usize, u16, usize, usize) -> CUresult;
        MEMSET_D2D32 = cuMemsetD2D32_v2: fn(CUdeviceptr, usize, u32, usize, usize) -> CUresult;
        MEMSET_D2D32_PTDS = cuMemsetD2D32_v2_ptds: fn(CUdeviceptr, usize, u32, usize, usize) -> CUresult;
        // Called by the recorder and the policies themselves.
        CTX_GET_DEVICE = cuCtxGetDevice: fn(*mut CUdevice) -> CUresult;
        CTX_GET_CURRENT = cuCtxGetCurrent: fn(*mut CUcontext) -> CUresult;
        CTX_SET_CURRENT = cuCtxSetCurrent: fn(CUcontext) -> CUresult;
        CTX_SYNCHRONIZE = cuCtxSynchronize: fn() -> CUresult;
        STREAM_SYNCHRONIZE = cuStreamSynchronize: fn(CUstream) -> CUresult;
        STREAM_CREATE = cuStreamCreate: fn(*mut CUstream, c_uint) -> CUresult;
        STREAM_IS_CAPTURING = cuStreamIsCapturing: fn(CUstream, *mut c_int) -> CUresult;
        STREAM_WAIT_EVENT = cuStreamWaitEvent: fn(CUstream, *mut c_void, c_uint) -> CUresult;
        EVENT_QUERY = cuEventQuery: fn(*mut c_void) -> CUresult;
        MEMCPY_DTOH_ASYNC = cuMemcpyDtoHAsync_v2: fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
        MEMCPY_HTOD_ASYNC = cuMemcpyHtoDAsync_v2: fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
        DEVICE_TOTAL_MEM = cuDeviceTotalMem_v2: fn(*mut usize, CUdevice) -> CUresult;
        MEM_GET_INFO = cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> CUresult;
        DEVICE_GET_DEFAULT_MEM_POOL = cuDeviceGetDefaultMemPool: fn(*mut *mut c_void, CUdevice) -> CUresult;
        MEM_POOL_TRIM_TO = cuMemPoolTrimTo: fn(*mut c_void, usize) -> CUresult;
        MEM_GET_ALLOCATION_GRANULARITY = cuMemGetAllocationGranularity: fn(*mut usize, *const CUmemAllocationProp, i32) -> CUresult;
        MEMSET_D8 = cuMemsetD8_v2: fn(CUdeviceptr, u8, usize) -> CUresult;
        MEMSET_D8_ASYNC = cuMemsetD8Async: fn(CUdeviceptr, u8, usize, CUstream) -> CUresult;
        MEMCPY_DTOH = cuMemcpyDtoH_v2: fn(*mut c_void, CUdeviceptr, usize) -> CUresult;
        MEMCPY_HTOD = cuMemcpyHtoD_v2: fn(CUdeviceptr, *const c_void, usize) -> CUresult;
        EVENT_CREATE = cuEventCreate: fn(*mut *mut c_void, u32) -> CUresult;
        EVENT_RECORD = cuEventRecord: fn(*mut c_void, CUstream) -> CUresult;
        EVENT_SYNCHRONIZE = cuEventSynchronize: fn(*mut c_void) -> CUresult;
        EVENT_DESTROY = cuEventDestroy_v2: fn(*mut c_void) -> CUresult;
        MODULE_LOAD_DATA = cuModuleLoadData: fn(*mut *mut c_void, *const c_void) -> CUresult;
        MODULE_GET_FUNCTION = cuModuleGetFunction: fn(*mut CUfunction, *mut c_void, *const c_char) -> CUresult;
        MODULE_GET_GLOBAL = cuModuleGetGlobal_v2: fn(*mut CUdeviceptr, *mut usize, *mut c_void, *const c_char) -> CUresult;
        FUNC_GET_PARAM_INFO = cuFuncGetParamInfo: fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult;
        FUNC_GET_NAME = cuFuncGetName: fn(*mut *const c_char, CUfunction) -> CUresult;
        // A CUkernel (a library's kernel) is what the CUDA 12+ runtime hands cuLaunchKernel
        // as its CUfunction; the cuFuncGet* queries do not answer for it, these do.
        KERNEL_GET_PARAM_INFO = cuKernelGetParamInfo: fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult;
        KERNEL_GET_NAME = cuKernelGetName: fn(*mut *const c_char, CUfunction) -> CUresult;
    }
    Runtime {
        // Hooked: allocations and frees.
        MALLOC = cudaMalloc: fn(*mut *mut c_void, usize) -> cudaError_t;
        FREE = cudaFree: fn(*mut c_void) -> cudaError_t;
        MALLOC_ASYNC = cudaMallocAsync: fn(*mut *mut c_void, usize, CUstream) -> cudaError_t;
        MALLOC_ASYNC_PTSZ = cudaMallocAsync_ptsz: fn(*mut *mut c_void, usize, CUstream) -> cudaError_t;
        FREE_ASYNC = cudaFreeAsync: fn(*mut c_void, CUstream) -> cudaError_t;
        FREE_ASYNC_PTSZ = cudaFreeAsync_ptsz: fn(*mut c_void, CUstream) -> cudaError_t;
        MALLOC_FROM_POOL_ASYNC = cudaMallocFromPoolAsync: fn(*mut *mut c_void, usize, CUmemoryPool, CUstream) -> cudaError_t;
        MALLOC_FROM_POOL_ASYNC_PTSZ = cudaMallocFromPoolAsync_ptsz: fn(*mut *mut c_void, usize, CUmemoryPool, CUstream) -> cudaError_t;
        MALLOC_MANAGED = cudaMallocManaged: fn(*mut *mut c_void, usize, c_uint) -> cudaError_t;
        MALLOC_PITCH = cudaMallocPitch: fn(*mut *mut c_void, *mut usize, usize, usize) -> cudaError_t;
        MALLOC_3D = cudaMalloc3D: fn(*mut cudaPitchedPtr, cudaExtent) -> cudaError_t;
        MALLOC_HOST = cudaMallocHost: fn(*mut *mut c_void, usize) -> cudaError_t;
        HOST_ALLOC = cudaHostAlloc: fn(*mut *mut c_void, usize, c_uint) -> cudaError_t;
        FREE_HOST = cudaFreeHost: fn(*mut c_void) -> cudaError_t;
        HOST_REGISTER = cudaHostRegister: fn(*mut c_void, usize, c_uint) -> cudaError_t;
        HOST_UNREGISTER = cudaHostUnregister: fn(*mut c_void) -> cudaError_t;
        // The runtime's resolvers.
        GET_DRIVER_ENTRY_POINT = cudaGetDriverEntryPoint: fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> cudaError_t;
        GET_DRIVER_ENTRY_POINT_PTSZ = cudaGetDriverEntryPoint_ptsz: fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> cudaError_t;
        GET_DRIVER_ENTRY_POINT_BY_VERSION = cudaGetDriverEntryPointByVersion: fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> cudaError_t;
        GET_DRIVER_ENTRY_POINT_BY_VERSION_PTSZ = cudaGetDriverEntryPointByVersion_ptsz: fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> cudaError_t;
        // Hooked: memory another process shares.
        IPC_OPEN_MEM_HANDLE_RT = cudaIpcOpenMemHandle: fn(*mut *mut c_void, CUipcMemHandle, c_uint) -> cudaError_t;
        IPC_CLOSE_MEM_HANDLE_RT = cudaIpcCloseMemHandle: fn(*mut c_void) -> cudaError_t;
        // Called by the policies.
        GET_LAST_ERROR = cudaGetLastError: fn() -> cudaError_t;
        // Wrapped: pool statistics (hooks/pool.rs).
        MEM_POOL_GET_ATTRIBUTE_RT = cudaMemPoolGetAttribute: fn(CUmemoryPool, c_int, *mut c_void) -> cudaError_t;
        MEM_POOL_SET_ATTRIBUTE_RT = cudaMemPoolSetAttribute: fn(CUmemoryPool, c_int, *mut c_void) -> cudaError_t;
    }
    Libc {
        // Wrapped: the ways out of a process.
        EXIT = _exit: fn(c_int) -> !;
        EXIT2 = _Exit: fn(c_int) -> !;
        // exit(3): serialised between threads, see life::before_exit.
        EXIT3 = exit: fn(c_int) -> !;
        EXECVE = execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
        EXECVPE = execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
        EXECV = execv: fn(*const c_char, *const *const c_char) -> c_int;
        EXECVP = execvp: fn(*const c_char, *const *const c_char) -> c_int;
        FEXECVE = fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
        EXECVEAT = execveat: fn(c_int, *const c_char, *const *const c_char, *const *const c_char, c_int) -> c_int;
    }
}

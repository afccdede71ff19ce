//! [`Real`]: a real function, by export name, resolved on first use; and every real function the
//! layers below the hooks call (`cu.rs`, the recorder, the policies), declared once each by
//! export name and C signature. A real function only its hook calls is declared by the hook's
//! own row instead (`hooks!`, in `hooks/`), from the row's signature; the rows of the ones
//! declared here name them (`= NAME`) and take their signatures from here
//! ([`signature_of!`]), giving only their parameters' names.
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

    /// [`Real::new`] for an export name given with its NUL (`b"cuFoo\0"`), checked when the
    /// static is built: a name without its one NUL at the end does not compile.
    pub const fn export(name_with_nul: &'static [u8], lib: Lib) -> Self {
        match CStr::from_bytes_with_nul(name_with_nul) {
            Ok(name) => Self::new(name, lib),
            Err(_) => panic!("an export name ends in its only NUL"),
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
/// looked up as `export` in the library of the block: **the one place** such an entry point's
/// C signature is written. It also writes [`signature_of!`], by which a hook's row (`hooks!`,
/// in the hooks layer) that names `NAME` gets the signature from here rather than repeating it.
/// (`$` comes in as the first token so that the macro it writes can have variables of its own.)
macro_rules! reals {
    ($d:tt $( $lib:ident { $( $stat:ident = $export:ident: fn($($t:ty),* $(,)?) -> $ret:ty; )* } )*) => {
        $($(
            pub static $stat: Real<unsafe extern "C" fn($($t),*) -> $ret> =
                Real::export(concat!(stringify!($export), "\0").as_bytes(), Lib::$lib);
        )*)*

        /// `signature_of!(NAME, export, callback { tokens… })` calls `callback! { tokens…
        /// (types…) -> ret }` with the C signature `NAME` was declared with here, when `NAME`
        /// is declared here as `export` (anything else does not compile: a row may not name
        /// another export's real function).
        macro_rules! signature_of {
            $($(
                ($stat, $export, $d cb:ident { $d ($d pass:tt)* }) => {
                    $d cb! { $d ($d pass)* ($($t),*) -> $ret }
                };
            )*)*
            ($d real:ident, $d export:ident, $d ($d rest:tt)*) => {
                compile_error!(concat!(
                    "base/real.rs declares no ", stringify!($d real), " as ", stringify!($d export)
                ));
            };
        }
        pub(crate) use signature_of;
    };
}

reals! { $
    Driver {
        // Hooked, and called by the policies too (their hooks' rows name them: `= NAME`).
        // The frees `double_free` answers itself (policy/isolate/alloc.rs); mem_free
        // (isolate/leave.rs); mem_free_async (release.rs).
        MEM_FREE = cuMemFree_v2: fn(CUdeviceptr) -> CUresult;
        MEM_FREE_ASYNC = cuMemFreeAsync: fn(CUdeviceptr, CUstream) -> CUresult;
        MEM_FREE_ASYNC_PTSZ = cuMemFreeAsync_ptsz: fn(CUdeviceptr, CUstream) -> CUresult;
        // mem_alloc_host: device.rs's result buffers.
        MEM_ALLOC_HOST = cuMemAllocHost_v2: fn(*mut *mut c_void, usize) -> CUresult;
        // Virtual memory: guard.rs's guarded allocations (mem_unmap also isolate/leave.rs).
        MEM_ADDRESS_RESERVE = cuMemAddressReserve: fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> CUresult;
        MEM_ADDRESS_FREE = cuMemAddressFree: fn(CUdeviceptr, usize) -> CUresult;
        MEM_CREATE = cuMemCreate: fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64) -> CUresult;
        MEM_RELEASE = cuMemRelease: fn(CUmemGenericAllocationHandle) -> CUresult;
        MEM_MAP = cuMemMap: fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult;
        MEM_UNMAP = cuMemUnmap: fn(CUdeviceptr, usize) -> CUresult;
        MEM_SET_ACCESS = cuMemSetAccess: fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> CUresult;
        // launch_kernel: the verification and release kernels (isolate/verify.rs, release.rs,
        // device.rs).
        LAUNCH_KERNEL = cuLaunchKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
        // Stream work (hooks/stream.rs) the policies make themselves: waits (guard.rs,
        // isolate/poison.rs, release.rs), copies (release.rs, isolate/verify.rs), poisons
        // (isolate/poison.rs, isolate/leave.rs, release.rs), events (release.rs).
        CTX_SYNCHRONIZE = cuCtxSynchronize: fn() -> CUresult;
        STREAM_SYNCHRONIZE = cuStreamSynchronize: fn(CUstream) -> CUresult;
        MEMCPY_DTOH_ASYNC = cuMemcpyDtoHAsync_v2: fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
        MEMCPY_HTOD_ASYNC = cuMemcpyHtoDAsync_v2: fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
        MEMCPY_DTOH = cuMemcpyDtoH_v2: fn(*mut c_void, CUdeviceptr, usize) -> CUresult;
        MEMCPY_HTOD = cuMemcpyHtoD_v2: fn(CUdeviceptr, *const c_void, usize) -> CUresult;
        MEMSET_D8 = cuMemsetD8_v2: fn(CUdeviceptr, u8, usize) -> CUresult;
        MEMSET_D8_ASYNC = cuMemsetD8Async: fn(CUdeviceptr, u8, usize, CUstream) -> CUresult;
        EVENT_RECORD = cuEventRecord: fn(*mut c_void, CUstream) -> CUresult;
        // Not hooked: called by the recorder and the policies only.
        CTX_GET_DEVICE = cuCtxGetDevice: fn(*mut CUdevice) -> CUresult;
        CTX_GET_CURRENT = cuCtxGetCurrent: fn(*mut CUcontext) -> CUresult;
        CTX_SET_CURRENT = cuCtxSetCurrent: fn(CUcontext) -> CUresult;
        STREAM_CREATE = cuStreamCreate: fn(*mut CUstream, c_uint) -> CUresult;
        STREAM_IS_CAPTURING = cuStreamIsCapturing: fn(CUstream, *mut c_int) -> CUresult;
        // The keeper thread's own capture mode (policy/isolate/keeper.rs): relaxed.
        THREAD_EXCHANGE_STREAM_CAPTURE_MODE = cuThreadExchangeStreamCaptureMode: fn(*mut c_int) -> CUresult;
        STREAM_GET_FLAGS = cuStreamGetFlags: fn(CUstream, *mut c_uint) -> CUresult;
        STREAM_WAIT_EVENT = cuStreamWaitEvent: fn(CUstream, *mut c_void, c_uint) -> CUresult;
        EVENT_QUERY = cuEventQuery: fn(*mut c_void) -> CUresult;
        DEVICE_TOTAL_MEM = cuDeviceTotalMem_v2: fn(*mut usize, CUdevice) -> CUresult;
        DEVICE_GET_UUID = cuDeviceGetUuid_v2: fn(*mut [u8; 16], CUdevice) -> CUresult;
        MEM_GET_INFO = cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> CUresult;
        DEVICE_GET_DEFAULT_MEM_POOL = cuDeviceGetDefaultMemPool: fn(*mut *mut c_void, CUdevice) -> CUresult;
        MEM_POOL_TRIM_TO = cuMemPoolTrimTo: fn(*mut c_void, usize) -> CUresult;
        MEM_GET_ALLOCATION_GRANULARITY = cuMemGetAllocationGranularity: fn(*mut usize, *const CUmemAllocationProp, i32) -> CUresult;
        EVENT_CREATE = cuEventCreate: fn(*mut *mut c_void, u32) -> CUresult;
        EVENT_SYNCHRONIZE = cuEventSynchronize: fn(*mut c_void) -> CUresult;
        EVENT_DESTROY = cuEventDestroy_v2: fn(*mut c_void) -> CUresult;
        MODULE_LOAD_DATA = cuModuleLoadData: fn(*mut *mut c_void, *const c_void) -> CUresult;
        MODULE_GET_FUNCTION = cuModuleGetFunction: fn(*mut CUfunction, *mut c_void, *const c_char) -> CUresult;
        MODULE_GET_GLOBAL = cuModuleGetGlobal_v2: fn(*mut CUdeviceptr, *mut usize, *mut c_void, *const c_char) -> CUresult;
        FUNC_LOAD = cuFuncLoad: fn(CUfunction) -> CUresult;
        FUNC_GET_PARAM_INFO = cuFuncGetParamInfo: fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult;
        FUNC_GET_NAME = cuFuncGetName: fn(*mut *const c_char, CUfunction) -> CUresult;
        // A CUkernel (a library's kernel) is what the CUDA 12+ runtime hands cuLaunchKernel
        // as its CUfunction; the cuFuncGet* queries do not answer for it, these do.
        KERNEL_GET_PARAM_INFO = cuKernelGetParamInfo: fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult;
        KERNEL_GET_NAME = cuKernelGetName: fn(*mut *const c_char, CUfunction) -> CUresult;
        // The parameter counts (newer drivers; where missing, the layout is read up to the
        // first index that fails, an error in the driver's log, CUDA_LOG_FILE, a kernel).
        FUNC_GET_PARAM_COUNT = cuFuncGetParamCount: fn(CUfunction, *mut usize) -> CUresult;
        KERNEL_GET_PARAM_COUNT = cuKernelGetParamCount: fn(CUfunction, *mut usize) -> CUresult;
    }
    Runtime {
        // Hooked, and called by the policies too: the frees `double_free` answers itself
        // (policy/isolate/alloc.rs; `cudaFree` also guard.rs).
        FREE = cudaFree: fn(*mut c_void) -> cudaError_t;
        FREE_ASYNC = cudaFreeAsync: fn(*mut c_void, CUstream) -> cudaError_t;
        FREE_ASYNC_PTSZ = cudaFreeAsync_ptsz: fn(*mut c_void, CUstream) -> cudaError_t;
        // Not hooked: called by the policies only.
        GET_LAST_ERROR = cudaGetLastError: fn() -> cudaError_t;
    }
}

//! Runtime exports (`cuda*`). They bind the versioned imports of `libcudart.so.13` users
//! (PyTorch's `libc10_cuda.so`, …). One runtime call is one event under its runtime name: the
//! driver calls the runtime makes underneath come back to our driver hooks nested, and pass.

#![allow(non_snake_case)]

use super::{call, run};
use crate::cuda::*;
use crate::policy::{self, Out};
use crate::resolve::{self, Lib, Real};
use isolate_trace::{Api, Event};
use std::ffi::{c_char, c_int, c_uint, c_void};

macro_rules! real {
    ($($stat:ident: $ty:ty = $name:literal;)*) => {
        $( pub static $stat: Real<$ty> = Real::new($name, Lib::Runtime); )*
    };
}

real! {
    MALLOC: FnCudaMalloc = c"cudaMalloc";
    FREE: FnCudaFree = c"cudaFree";
    MALLOC_ASYNC: FnCudaMallocAsync = c"cudaMallocAsync";
    MALLOC_ASYNC_PTSZ: FnCudaMallocAsync = c"cudaMallocAsync_ptsz";
    FREE_ASYNC: FnCudaFreeAsync = c"cudaFreeAsync";
    FREE_ASYNC_PTSZ: FnCudaFreeAsync = c"cudaFreeAsync_ptsz";
    MALLOC_FROM_POOL_ASYNC: FnCudaMallocFromPoolAsync = c"cudaMallocFromPoolAsync";
    MALLOC_FROM_POOL_ASYNC_PTSZ: FnCudaMallocFromPoolAsync = c"cudaMallocFromPoolAsync_ptsz";
    MALLOC_MANAGED: FnCudaMallocManaged = c"cudaMallocManaged";
    MALLOC_PITCH: FnCudaMallocPitch = c"cudaMallocPitch";
    MALLOC_3D: FnCudaMalloc3D = c"cudaMalloc3D";
    MALLOC_HOST: FnCudaMallocHost = c"cudaMallocHost";
    HOST_ALLOC: FnCudaHostAlloc = c"cudaHostAlloc";
    FREE_HOST: FnCudaFreeHost = c"cudaFreeHost";
    HOST_REGISTER: FnCudaHostRegister = c"cudaHostRegister";
    HOST_UNREGISTER: FnCudaHostUnregister = c"cudaHostUnregister";
    GET_DRIVER_ENTRY_POINT: FnCudaGetDriverEntryPoint = c"cudaGetDriverEntryPoint";
    GET_DRIVER_ENTRY_POINT_PTSZ: FnCudaGetDriverEntryPoint = c"cudaGetDriverEntryPoint_ptsz";
    GET_DRIVER_ENTRY_POINT_BY_VERSION: FnCudaGetDriverEntryPointByVersion = c"cudaGetDriverEntryPointByVersion";
    GET_DRIVER_ENTRY_POINT_BY_VERSION_PTSZ: FnCudaGetDriverEntryPointByVersion =
        c"cudaGetDriverEntryPointByVersion_ptsz";
}

fn proto(api: Api) -> Event {
    Event {
        api,
        device: -1,
        ..Event::default()
    }
}

/// `cudaErrorSymbolNotFound`, for a hook whose real function cannot be found.
const MISSING: cudaError_t = CUDA_ERROR_SYMBOL_NOT_FOUND_RT;

macro_rules! rt_alloc {
    ($name:ident, $real:ident, $api:expr, $out:ident, ($pp:ident, $size:ident $(, $a:ident: $t:ty)*), |$e:ident| $fill:expr) => {
        /// # Safety
        /// Same contract as the runtime function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($pp: *mut *mut c_void, $size: usize $(, $a: $t)*) -> cudaError_t {
            let Some(real) = $real.get() else { return MISSING };
            run(
                |slot| {
                    let mut $e = proto($api);
                    $e.size = $size as u64;
                    $fill;
                    policy::alloc($e, Out::$out($pp), || call(slot, || unsafe { real($pp, $size $(, $a)*) }), |_| {})
                },
                || unsafe { real($pp, $size $(, $a)*) },
            )
        }
    };
}

rt_alloc!(
    cudaMalloc,
    MALLOC,
    Api::CudaMalloc,
    DevicePtr,
    (p, size),
    |e| ()
);
rt_alloc!(cudaMallocAsync, MALLOC_ASYNC, Api::CudaMallocAsync, DevicePtr, (p, size, stream: CUstream), |e| e.stream =
    stream as u64);
rt_alloc!(cudaMallocAsync_ptsz, MALLOC_ASYNC_PTSZ, Api::CudaMallocAsyncPtsz, DevicePtr, (p, size, stream: CUstream), |e| e
    .stream = stream as u64);
rt_alloc!(cudaMallocFromPoolAsync, MALLOC_FROM_POOL_ASYNC, Api::CudaMallocFromPoolAsync, DevicePtr,
    (p, size, pool: CUmemoryPool, stream: CUstream), |e| {
    e.handle = pool as u64;
    e.stream = stream as u64;
});
rt_alloc!(cudaMallocFromPoolAsync_ptsz, MALLOC_FROM_POOL_ASYNC_PTSZ, Api::CudaMallocFromPoolAsyncPtsz, DevicePtr,
    (p, size, pool: CUmemoryPool, stream: CUstream), |e| {
    e.handle = pool as u64;
    e.stream = stream as u64;
});
rt_alloc!(cudaMallocManaged, MALLOC_MANAGED, Api::CudaMallocManaged, DevicePtr, (p, size, flags: c_uint), |e| e.flags =
    flags as u64);
rt_alloc!(
    cudaMallocHost,
    MALLOC_HOST,
    Api::CudaMallocHost,
    Host,
    (p, size),
    |e| ()
);
rt_alloc!(cudaHostAlloc, HOST_ALLOC, Api::CudaHostAlloc, Host, (p, size, flags: c_uint), |e| e.flags = flags as u64);

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocPitch(
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> cudaError_t {
    let Some(real) = MALLOC_PITCH.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CudaMallocPitch);
            e.size = (width as u64).saturating_mul(height as u64);
            policy::alloc(
                e,
                Out::DevicePtr(p),
                || call(slot, || unsafe { real(p, pitch, width, height) }),
                |e| {
                    if e.result == 0 && !pitch.is_null() {
                        e.pitch = unsafe { *pitch } as u64;
                        e.size = e.pitch.saturating_mul(height as u64);
                    }
                },
            )
        },
        || unsafe { real(p, pitch, width, height) },
    )
}

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMalloc3D(pp: *mut cudaPitchedPtr, extent: cudaExtent) -> cudaError_t {
    let Some(real) = MALLOC_3D.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CudaMalloc3D);
            e.size = (extent.width as u64)
                .saturating_mul(extent.height as u64)
                .saturating_mul(extent.depth as u64);
            policy::alloc(
                e,
                Out::Pitched(pp),
                || call(slot, || unsafe { real(pp, extent) }),
                |e| {
                    if e.result == 0 && !pp.is_null() {
                        let got = unsafe { *pp };
                        e.pitch = got.pitch as u64;
                        e.size = e
                            .pitch
                            .saturating_mul(extent.height as u64)
                            .saturating_mul(extent.depth as u64);
                    }
                },
            )
        },
        || unsafe { real(pp, extent) },
    )
}

macro_rules! rt_free {
    ($name:ident, $real:ident, $api:expr, ($ptr:ident $(, $a:ident: $t:ty)*), |$e:ident| $fill:expr) => {
        /// # Safety
        /// Same contract as the runtime function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($ptr: *mut c_void $(, $a: $t)*) -> cudaError_t {
            let Some(real) = $real.get() else { return MISSING };
            run(
                |slot| {
                    let mut $e = proto($api);
                    $e.ptr = $ptr as u64;
                    $fill;
                    policy::free($e, || call(slot, || unsafe { real($ptr $(, $a)*) }))
                },
                || unsafe { real($ptr $(, $a)*) },
            )
        }
    };
}

rt_free!(cudaFree, FREE, Api::CudaFree, (p), |e| {});
rt_free!(cudaFreeAsync, FREE_ASYNC, Api::CudaFreeAsync, (p, stream: CUstream), |e| e.stream = stream as u64);
rt_free!(cudaFreeAsync_ptsz, FREE_ASYNC_PTSZ, Api::CudaFreeAsyncPtsz, (p, stream: CUstream), |e| e.stream = stream as u64);
rt_free!(cudaFreeHost, FREE_HOST, Api::CudaFreeHost, (p), |e| {});

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaHostRegister(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> cudaError_t {
    let Some(real) = HOST_REGISTER.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CudaHostRegister);
            e.ptr = p as u64;
            e.size = size as u64;
            e.flags = flags as u64;
            policy::other(
                e,
                false,
                || call(slot, || unsafe { real(p, size, flags) }),
                |_| {},
            )
        },
        || unsafe { real(p, size, flags) },
    )
}

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaHostUnregister(p: *mut c_void) -> cudaError_t {
    let Some(real) = HOST_UNREGISTER.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CudaHostUnregister);
            e.ptr = p as u64;
            policy::other(e, true, || call(slot, || unsafe { real(p) }), |_| {})
        },
        || unsafe { real(p) },
    )
}

/// Hands back our hook in place of the driver entry point the runtime found, decided by the
/// exact export it found. When the runtime resolved through our `cuGetProcAddress` already, the
/// pointer is our hook, and is passed on as it is (never stored as a "real" function).
fn substitute(r: cudaError_t, pfn: *mut *mut c_void) {
    if r == 0 && !pfn.is_null() && policy::intercepting() {
        unsafe { *pfn = resolve::substitute(*pfn) };
    }
}

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    let Some(real) = GET_DRIVER_ENTRY_POINT.get() else {
        return MISSING;
    };
    let r = unsafe { real(symbol, pfn, flags, status) };
    substitute(r, pfn);
    r
}

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDriverEntryPoint_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    let Some(real) = GET_DRIVER_ENTRY_POINT_PTSZ.get() else {
        return MISSING;
    };
    let r = unsafe { real(symbol, pfn, flags, status) };
    substitute(r, pfn);
    r
}

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_uint,
    flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    let Some(real) = GET_DRIVER_ENTRY_POINT_BY_VERSION.get() else {
        return MISSING;
    };
    let r = unsafe { real(symbol, pfn, version, flags, status) };
    substitute(r, pfn);
    r
}

/// # Safety
/// Same contract as the runtime function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_uint,
    flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    let Some(real) = GET_DRIVER_ENTRY_POINT_BY_VERSION_PTSZ.get() else {
        return MISSING;
    };
    let r = unsafe { real(symbol, pfn, version, flags, status) };
    substitute(r, pfn);
    r
}

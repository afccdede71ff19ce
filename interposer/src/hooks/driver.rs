//! Driver exports (`cu*`). The same functions are handed out by our resolver for the exports
//! of the same names, and bind directly for programs linked against `libcuda`.

#![allow(non_snake_case)]

use super::{call, run};
use crate::cuda::*;
use crate::policy::{self, Out};
use crate::resolve::{Lib, Real};
use isolate_trace::{Api, Event};
use std::ffi::{c_uint, c_void};

macro_rules! real {
    ($($stat:ident: $ty:ty = $name:literal;)*) => {
        $( pub static $stat: Real<$ty> = Real::new($name, Lib::Driver); )*
    };
}

real! {
    MEM_ALLOC: FnMemAlloc = c"cuMemAlloc_v2";
    MEM_FREE: FnMemFree = c"cuMemFree_v2";
    MEM_ALLOC_ASYNC: FnMemAllocAsync = c"cuMemAllocAsync";
    MEM_ALLOC_ASYNC_PTSZ: FnMemAllocAsync = c"cuMemAllocAsync_ptsz";
    MEM_FREE_ASYNC: FnMemFreeAsync = c"cuMemFreeAsync";
    MEM_FREE_ASYNC_PTSZ: FnMemFreeAsync = c"cuMemFreeAsync_ptsz";
    MEM_ALLOC_FROM_POOL_ASYNC: FnMemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync";
    MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: FnMemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync_ptsz";
    MEM_ALLOC_MANAGED: FnMemAllocManaged = c"cuMemAllocManaged";
    MEM_ALLOC_PITCH: FnMemAllocPitch = c"cuMemAllocPitch_v2";
    MEM_ALLOC_HOST: FnMemAllocHost = c"cuMemAllocHost_v2";
    MEM_HOST_ALLOC: FnMemHostAlloc = c"cuMemHostAlloc";
    MEM_FREE_HOST: FnMemFreeHost = c"cuMemFreeHost";
    MEM_HOST_REGISTER: FnMemHostRegister = c"cuMemHostRegister_v2";
    MEM_HOST_UNREGISTER: FnMemHostUnregister = c"cuMemHostUnregister";
    MEM_ADDRESS_RESERVE: FnMemAddressReserve = c"cuMemAddressReserve";
    MEM_ADDRESS_FREE: FnMemAddressFree = c"cuMemAddressFree";
    MEM_CREATE: FnMemCreate = c"cuMemCreate";
    MEM_RELEASE: FnMemRelease = c"cuMemRelease";
    MEM_MAP: FnMemMap = c"cuMemMap";
    MEM_UNMAP: FnMemUnmap = c"cuMemUnmap";
    MEM_SET_ACCESS: FnMemSetAccess = c"cuMemSetAccess";
    GRAPH_ADD_MEM_ALLOC_NODE: FnGraphAddMemAllocNode = c"cuGraphAddMemAllocNode";
    GRAPH_ADD_MEM_FREE_NODE: FnGraphAddMemFreeNode = c"cuGraphAddMemFreeNode";
    LAUNCH_KERNEL: FnLaunchKernel = c"cuLaunchKernel";
    LAUNCH_KERNEL_PTSZ: FnLaunchKernel = c"cuLaunchKernel_ptsz";
    LAUNCH_KERNEL_EX: FnLaunchKernelEx = c"cuLaunchKernelEx";
    LAUNCH_KERNEL_EX_PTSZ: FnLaunchKernelEx = c"cuLaunchKernelEx_ptsz";
    LAUNCH_COOPERATIVE_KERNEL: FnLaunchCooperativeKernel = c"cuLaunchCooperativeKernel";
    LAUNCH_COOPERATIVE_KERNEL_PTSZ: FnLaunchCooperativeKernel = c"cuLaunchCooperativeKernel_ptsz";
}

fn proto(api: Api) -> Event {
    Event {
        api,
        device: -1,
        ..Event::default()
    }
}

/// Result for a hook whose real function cannot be found at all.
const MISSING: CUresult = CUDA_ERROR_NOT_FOUND;

macro_rules! device_alloc {
    ($(#[$m:meta])* $name:ident, $real:ident, $api:expr, ($dptr:ident $(, $a:ident: $t:ty)*), |$e:ident| $fill:expr) => {
        $(#[$m])*
        /// # Safety
        /// Same contract as the driver function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($dptr: *mut CUdeviceptr $(, $a: $t)*) -> CUresult {
            let Some(real) = $real.get() else { return MISSING };
            run(
                |slot| {
                    let mut $e = proto($api);
                    $fill;
                    policy::alloc($e, Out::Device($dptr), || call(slot, || unsafe { real($dptr $(, $a)*) }), |_| {})
                },
                || unsafe { real($dptr $(, $a)*) },
            )
        }
    };
}

device_alloc!(cuMemAlloc_v2, MEM_ALLOC, Api::CuMemAlloc, (dptr, size: usize), |e| e.size = size as u64);
device_alloc!(cuMemAllocAsync, MEM_ALLOC_ASYNC, Api::CuMemAllocAsync, (dptr, size: usize, stream: CUstream), |e| {
    e.size = size as u64;
    e.stream = stream as u64;
});
device_alloc!(cuMemAllocAsync_ptsz, MEM_ALLOC_ASYNC_PTSZ, Api::CuMemAllocAsyncPtsz, (dptr, size: usize, stream: CUstream), |e| {
    e.size = size as u64;
    e.stream = stream as u64;
});
device_alloc!(cuMemAllocFromPoolAsync, MEM_ALLOC_FROM_POOL_ASYNC, Api::CuMemAllocFromPoolAsync,
    (dptr, size: usize, pool: CUmemoryPool, stream: CUstream), |e| {
    e.size = size as u64;
    e.handle = pool as u64;
    e.stream = stream as u64;
});
device_alloc!(cuMemAllocFromPoolAsync_ptsz, MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, Api::CuMemAllocFromPoolAsyncPtsz,
    (dptr, size: usize, pool: CUmemoryPool, stream: CUstream), |e| {
    e.size = size as u64;
    e.handle = pool as u64;
    e.stream = stream as u64;
});
device_alloc!(cuMemAllocManaged, MEM_ALLOC_MANAGED, Api::CuMemAllocManaged, (dptr, size: usize, flags: c_uint), |e| {
    e.size = size as u64;
    e.flags = flags as u64;
});

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let Some(real) = MEM_ALLOC_PITCH.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemAllocPitch);
            e.size = (width as u64).saturating_mul(height as u64);
            e.flags = elem as u64;
            policy::alloc(
                e,
                Out::Device(dptr),
                || call(slot, || unsafe { real(dptr, pitch, width, height, elem) }),
                |e| {
                    if e.result == 0 && !pitch.is_null() {
                        e.pitch = unsafe { *pitch } as u64;
                        e.size = e.pitch.saturating_mul(height as u64);
                    }
                },
            )
        },
        || unsafe { real(dptr, pitch, width, height, elem) },
    )
}

macro_rules! device_free {
    ($name:ident, $real:ident, $api:expr, ($ptr:ident $(, $a:ident: $t:ty)*), |$e:ident| $fill:expr) => {
        /// # Safety
        /// Same contract as the driver function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($ptr: CUdeviceptr $(, $a: $t)*) -> CUresult {
            let Some(real) = $real.get() else { return MISSING };
            run(
                |slot| {
                    let mut $e = proto($api);
                    $e.ptr = $ptr;
                    $fill;
                    policy::free($e, || call(slot, || unsafe { real($ptr $(, $a)*) }))
                },
                || unsafe { real($ptr $(, $a)*) },
            )
        }
    };
}

device_free!(cuMemFree_v2, MEM_FREE, Api::CuMemFree, (ptr), |e| {});
device_free!(cuMemFreeAsync, MEM_FREE_ASYNC, Api::CuMemFreeAsync, (ptr, stream: CUstream), |e| e.stream = stream as u64);
device_free!(cuMemFreeAsync_ptsz, MEM_FREE_ASYNC_PTSZ, Api::CuMemFreeAsyncPtsz, (ptr, stream: CUstream), |e| e.stream =
    stream as u64);

macro_rules! host_alloc {
    ($name:ident, $real:ident, $api:expr, ($pp:ident, $size:ident $(, $a:ident: $t:ty)*), |$e:ident| $fill:expr) => {
        /// # Safety
        /// Same contract as the driver function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($pp: *mut *mut c_void, $size: usize $(, $a: $t)*) -> CUresult {
            let Some(real) = $real.get() else { return MISSING };
            run(
                |slot| {
                    let mut $e = proto($api);
                    $e.size = $size as u64;
                    $fill;
                    policy::alloc($e, Out::Host($pp), || call(slot, || unsafe { real($pp, $size $(, $a)*) }), |_| {})
                },
                || unsafe { real($pp, $size $(, $a)*) },
            )
        }
    };
}

host_alloc!(
    cuMemAllocHost_v2,
    MEM_ALLOC_HOST,
    Api::CuMemAllocHost,
    (pp, size),
    |e| ()
);
host_alloc!(cuMemHostAlloc, MEM_HOST_ALLOC, Api::CuMemHostAlloc, (pp, size, flags: c_uint), |e| e.flags = flags as u64);

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    let Some(real) = MEM_FREE_HOST.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemFreeHost);
            e.ptr = p as u64;
            policy::free(e, || call(slot, || unsafe { real(p) }))
        },
        || unsafe { real(p) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    let Some(real) = MEM_HOST_REGISTER.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemHostRegister);
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
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    let Some(real) = MEM_HOST_UNREGISTER.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemHostUnregister);
            e.ptr = p as u64;
            policy::other(e, true, || call(slot, || unsafe { real(p) }), |_| {})
        },
        || unsafe { real(p) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    let Some(real) = MEM_ADDRESS_RESERVE.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemAddressReserve);
            e.size = size as u64;
            e.offset = alignment as u64;
            e.handle = addr;
            e.flags = flags;
            policy::other(
                e,
                false,
                || call(slot, || unsafe { real(ptr, size, alignment, addr, flags) }),
                |e| {
                    if e.result == 0 && !ptr.is_null() {
                        e.ptr = unsafe { *ptr };
                    }
                },
            )
        },
        || unsafe { real(ptr, size, alignment, addr, flags) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    let Some(real) = MEM_ADDRESS_FREE.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemAddressFree);
            e.ptr = ptr;
            e.size = size as u64;
            policy::other(
                e,
                true,
                || call(slot, || unsafe { real(ptr, size) }),
                |_| {},
            )
        },
        || unsafe { real(ptr, size) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let Some(real) = MEM_CREATE.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemCreate);
            e.size = size as u64;
            e.flags = flags;
            if !prop.is_null() {
                let p = unsafe { *prop };
                // CU_MEM_LOCATION_TYPE_DEVICE = 1: the memory lives on that device.
                if p.location.type_ == 1 {
                    e.device = p.location.id;
                }
                e.pitch = p.requested_handle_types as u64;
            }
            policy::other(
                e,
                false,
                || call(slot, || unsafe { real(handle, size, prop, flags) }),
                |e| {
                    if e.result == 0 && !handle.is_null() {
                        e.handle = unsafe { *handle };
                    }
                },
            )
        },
        || unsafe { real(handle, size, prop, flags) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    let Some(real) = MEM_RELEASE.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemRelease);
            e.handle = handle;
            policy::other(e, true, || call(slot, || unsafe { real(handle) }), |_| {})
        },
        || unsafe { real(handle) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let Some(real) = MEM_MAP.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemMap);
            e.ptr = ptr;
            e.size = size as u64;
            e.offset = offset as u64;
            e.handle = handle;
            e.flags = flags;
            policy::other(
                e,
                false,
                || call(slot, || unsafe { real(ptr, size, offset, handle, flags) }),
                |_| {},
            )
        },
        || unsafe { real(ptr, size, offset, handle, flags) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let Some(real) = MEM_UNMAP.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemUnmap);
            e.ptr = ptr;
            e.size = size as u64;
            policy::other(
                e,
                true,
                || call(slot, || unsafe { real(ptr, size) }),
                |_| {},
            )
        },
        || unsafe { real(ptr, size) },
    )
}

/// Recorded with `handle` = bit mask of the devices given access, `flags` = the widest access
/// flags, `offset` = number of descriptors: that is how peer mappings show in a trace.
///
/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    let Some(real) = MEM_SET_ACCESS.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuMemSetAccess);
            e.ptr = ptr;
            e.size = size as u64;
            e.offset = count as u64;
            if !desc.is_null() {
                for i in 0..count.min(64) {
                    let d = unsafe { *desc.add(i) };
                    if d.location.type_ == 1 && (0..64).contains(&d.location.id) && d.flags != 0 {
                        e.handle |= 1u64 << d.location.id;
                    }
                    e.flags = e.flags.max(d.flags as u64);
                }
            }
            policy::other(
                e,
                false,
                || call(slot, || unsafe { real(ptr, size, desc, count) }),
                |_| {},
            )
        },
        || unsafe { real(ptr, size, desc, count) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    let Some(real) = GRAPH_ADD_MEM_ALLOC_NODE.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuGraphAddMemAllocNode);
            e.handle = graph as u64;
            if !params.is_null() {
                e.size = unsafe { (*params).bytesize } as u64;
            }
            policy::other(
                e,
                false,
                || call(slot, || unsafe { real(node, graph, deps, ndeps, params) }),
                |e| {
                    if e.result == 0 && !params.is_null() {
                        e.ptr = unsafe { (*params).dptr };
                    }
                },
            )
        },
        || unsafe { real(node, graph, deps, ndeps, params) },
    )
}

/// # Safety
/// Same contract as the driver function of this name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    let Some(real) = GRAPH_ADD_MEM_FREE_NODE.get() else {
        return MISSING;
    };
    run(
        |slot| {
            let mut e = proto(Api::CuGraphAddMemFreeNode);
            e.handle = graph as u64;
            e.ptr = dptr;
            policy::other(
                e,
                true,
                || call(slot, || unsafe { real(node, graph, deps, ndeps, dptr) }),
                |_| {},
            )
        },
        || unsafe { real(node, graph, deps, ndeps, dptr) },
    )
}

macro_rules! launch {
    ($name:ident, $real:ident, $api:expr) => {
        /// Handed out only when the launch check is on; checks the parameters, then launches.
        ///
        /// # Safety
        /// Same contract as the driver function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shmem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            let Some(real) = $real.get() else {
                return MISSING;
            };
            if !policy::check_launches() || crate::record::nested() {
                return unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) };
            }
            let found = unsafe { policy::launch_check($api, f, params, extra) };
            let r = unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) };
            policy::launched($api, found, r);
            r
        }
    };
}

launch!(cuLaunchKernel, LAUNCH_KERNEL, Api::CuLaunchKernel);
launch!(
    cuLaunchKernel_ptsz,
    LAUNCH_KERNEL_PTSZ,
    Api::CuLaunchKernelPtsz
);

macro_rules! launch_ex {
    ($name:ident, $real:ident, $api:expr) => {
        /// Handed out only when the launch check is on; checks the parameters, then launches.
        ///
        /// # Safety
        /// Same contract as the driver function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const CUlaunchConfig,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            let Some(real) = $real.get() else {
                return MISSING;
            };
            if !policy::check_launches() || crate::record::nested() {
                return unsafe { real(config, f, params, extra) };
            }
            let found = unsafe { policy::launch_check($api, f, params, extra) };
            let r = unsafe { real(config, f, params, extra) };
            policy::launched($api, found, r);
            r
        }
    };
}

launch_ex!(cuLaunchKernelEx, LAUNCH_KERNEL_EX, Api::CuLaunchKernelEx);
launch_ex!(
    cuLaunchKernelEx_ptsz,
    LAUNCH_KERNEL_EX_PTSZ,
    Api::CuLaunchKernelExPtsz
);

macro_rules! launch_coop {
    ($name:ident, $real:ident, $api:expr) => {
        /// Handed out only when the launch check is on; checks the parameters, then launches.
        ///
        /// # Safety
        /// Same contract as the driver function of this name.
        #[allow(clippy::no_effect, clippy::unused_unit)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint,
            gy: c_uint,
            gz: c_uint,
            bx: c_uint,
            by: c_uint,
            bz: c_uint,
            shmem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
        ) -> CUresult {
            let Some(real) = $real.get() else {
                return MISSING;
            };
            if !policy::check_launches() || crate::record::nested() {
                return unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) };
            }
            let found = unsafe { policy::launch_check($api, f, params, std::ptr::null_mut()) };
            let r = unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) };
            policy::launched($api, found, r);
            r
        }
    };
}

launch_coop!(
    cuLaunchCooperativeKernel,
    LAUNCH_COOPERATIVE_KERNEL,
    Api::CuLaunchCooperativeKernel
);
launch_coop!(
    cuLaunchCooperativeKernel_ptsz,
    LAUNCH_COOPERATIVE_KERNEL_PTSZ,
    Api::CuLaunchCooperativeKernelPtsz
);

//! The CUDA calls the library makes itself (not the program's, which the hooks pass through),
//! typed, as cudarc's `result` layer is over its `sys`: each returns `Result<T, CuError>`, where
//! [`CuError::Missing`] says the driver has no such function and [`CuError::Code`] carries the
//! code it returned. A wrapper is safe where the driver checks every argument it takes (a
//! handle of ours written through a local, a size); it is an `unsafe fn` whose `# Safety` says
//! what the caller must hold where an argument is memory or a handle the driver trusts.
//!
//! Layer: base. Uses [`super::cuda`] and [`super::real`].

#![deny(clippy::undocumented_unsafe_blocks)]

use super::cuda::*;
use super::real::{self, Real};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

/// Why a call the library made did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CuError {
    /// The driver (or runtime) has no such function: nothing was called.
    Missing,
    /// The function returned this code.
    Code(CUresult),
}

pub type Result<T> = std::result::Result<T, CuError>;

/// A CUDA event handle (`CUevent`).
pub type CUevent = *mut c_void;
/// A CUDA module handle (`CUmodule`).
pub type CUmodule = *mut c_void;

impl CuError {
    /// The code the caller of a hook gets for this error where the library's call stands in
    /// for the program's: the driver's code, or `missing` when there was no call.
    pub fn code_or(self, missing: CUresult) -> CUresult {
        match self {
            CuError::Missing => missing,
            CuError::Code(c) => c,
        }
    }
}

/// The code of `r` where it stands for the program's call: success, the driver's code, or
/// `missing`.
pub fn code(r: Result<()>, missing: CUresult) -> CUresult {
    r.map_or_else(|e| e.code_or(missing), |()| CUDA_SUCCESS)
}

#[inline]
fn get<F: Copy>(r: &Real<F>) -> Result<F> {
    r.get().ok_or(CuError::Missing)
}

#[inline]
fn check(r: CUresult) -> Result<()> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuError::Code(r))
    }
}

// ---- contexts and devices

/// The calling thread's current context (null where it has none).
pub fn ctx_get_current() -> Result<CUcontext> {
    let f = get(&real::CTX_GET_CURRENT)?;
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: the out-parameter is a local of the right type.
    check(unsafe { f(&mut c) })?;
    Ok(c)
}

/// Makes `ctx` current on the calling thread.
/// # Safety
/// `ctx` is a context that exists (one the driver handed out and nobody destroyed), or null.
pub unsafe fn ctx_set_current(ctx: CUcontext) -> Result<()> {
    let f = get(&real::CTX_SET_CURRENT)?;
    // SAFETY: the caller vouches for `ctx`.
    check(unsafe { f(ctx) })
}

/// Waits for all work of the current context.
pub fn ctx_synchronize() -> Result<()> {
    let f = get(&real::CTX_SYNCHRONIZE)?;
    // SAFETY: no arguments; without a context the driver returns an error.
    check(unsafe { f() })
}

/// The bytes of device memory of `device` (an ordinal the driver checks).
pub fn device_total_mem(device: CUdevice) -> Result<usize> {
    let f = get(&real::DEVICE_TOTAL_MEM)?;
    let mut total = 0usize;
    // SAFETY: the out-parameter is a local; the driver checks the ordinal.
    check(unsafe { f(&mut total, device) })?;
    Ok(total)
}

/// The current context's device memory: (free, total) bytes.
pub fn mem_get_info() -> Result<(usize, usize)> {
    let f = get(&real::MEM_GET_INFO)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-parameters are locals.
    check(unsafe { f(&mut free, &mut total) })?;
    Ok((free, total))
}

// ---- memory

/// Sets `n` bytes at `ptr` to `byte`, synchronously.
/// # Safety
/// [ptr, ptr+n) is device memory of the current context that nobody else uses meanwhile
/// (freed memory in quarantine, or memory the library owns).
pub unsafe fn memset_d8(ptr: CUdeviceptr, byte: u8, n: usize) -> Result<()> {
    let f = get(&real::MEMSET_D8)?;
    // SAFETY: the caller vouches for the range.
    check(unsafe { f(ptr, byte, n) })
}

/// Sets `n` bytes at `ptr` to `byte` in the order of `stream`.
/// # Safety
/// As [`memset_d8`], from the stream's current position on; `stream` exists (or is null).
pub unsafe fn memset_d8_async(
    ptr: CUdeviceptr,
    byte: u8,
    n: usize,
    stream: CUstream,
) -> Result<()> {
    let f = get(&real::MEMSET_D8_ASYNC)?;
    // SAFETY: the caller vouches for the range and the stream.
    check(unsafe { f(ptr, byte, n, stream) })
}

/// Copies `src` to the device at `dst`, synchronously.
/// # Safety
/// [dst, dst + size_of_val(src)) is device memory of the current context the library owns.
pub unsafe fn memcpy_htod<T: Copy>(dst: CUdeviceptr, src: &[T]) -> Result<()> {
    let f = get(&real::MEMCPY_HTOD)?;
    // SAFETY: `src` is readable for its length; the caller vouches for `dst`.
    check(unsafe { f(dst, src.as_ptr().cast(), std::mem::size_of_val(src)) })
}

/// Copies device memory at `src` into `dst`, synchronously.
/// # Safety
/// [src, src + size_of_val(dst)) is device memory of the current context, and any bit
/// pattern is a valid `T`.
pub unsafe fn memcpy_dtoh<T: Copy>(dst: &mut [T], src: CUdeviceptr) -> Result<()> {
    let f = get(&real::MEMCPY_DTOH)?;
    // SAFETY: `dst` is writable for its length; the caller vouches for `src` and `T`.
    check(unsafe { f(dst.as_mut_ptr().cast(), src, std::mem::size_of_val(dst)) })
}

/// Copies `n` bytes from host `src` to device `dst` in the order of `stream`.
/// # Safety
/// `src` stays readable for `n` bytes until the copy has run (pinned memory the library owns),
/// [dst, dst+n) is device memory the library owns, `stream` exists.
pub unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> Result<()> {
    let f = get(&real::MEMCPY_HTOD_ASYNC)?;
    // SAFETY: the caller vouches for both ranges and the stream.
    check(unsafe { f(dst, src, n, stream) })
}

/// Copies `n` bytes from device `src` to host `dst` in the order of `stream`.
/// # Safety
/// As [`memcpy_htod_async`], `dst` writable.
pub unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> Result<()> {
    let f = get(&real::MEMCPY_DTOH_ASYNC)?;
    // SAFETY: the caller vouches for both ranges and the stream.
    check(unsafe { f(dst, src, n, stream) })
}

/// Really frees `ptr` (`cuMemFree`).
/// # Safety
/// `ptr` is an allocation nobody uses any more (one leaving quarantine), or a value the driver
/// rejects without touching memory (an address nothing owns).
pub unsafe fn mem_free(ptr: CUdeviceptr) -> Result<()> {
    let f = get(&real::MEM_FREE)?;
    // SAFETY: the caller vouches for `ptr`.
    check(unsafe { f(ptr) })
}

/// Really frees `ptr` in the order of `stream` (`cuMemFreeAsync`).
/// # Safety
/// As [`mem_free`], once the work queued on `stream` so far has run; `stream` exists.
pub unsafe fn mem_free_async(ptr: CUdeviceptr, stream: CUstream) -> Result<()> {
    let f = get(&real::MEM_FREE_ASYNC)?;
    // SAFETY: the caller vouches for `ptr` and `stream`.
    check(unsafe { f(ptr, stream) })
}

/// Unmaps [ptr, ptr+size).
/// # Safety
/// The range is mapped memory nobody uses any more.
pub unsafe fn mem_unmap(ptr: CUdeviceptr, size: usize) -> Result<()> {
    let f = get(&real::MEM_UNMAP)?;
    // SAFETY: the caller vouches for the range.
    check(unsafe { f(ptr, size) })
}

/// `bytes` of pinned host memory, for the library's own use (never freed).
pub fn mem_alloc_host(bytes: usize) -> Result<*mut c_void> {
    let f = get(&real::MEM_ALLOC_HOST)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: the out-parameter is a local.
    check(unsafe { f(&mut p, bytes) })?;
    Ok(p)
}

// ---- virtual memory (guard mode)

/// The granularity of physical allocations with `prop` (`option` 0: the minimum).
pub fn mem_get_allocation_granularity(prop: &CUmemAllocationProp, option: i32) -> Result<usize> {
    let f = get(&real::MEM_GET_ALLOCATION_GRANULARITY)?;
    let mut g = 0usize;
    // SAFETY: the out-parameter is a local, `prop` a reference.
    check(unsafe { f(&mut g, prop, option) })?;
    Ok(g)
}

/// Reserves `size` bytes of virtual address space aligned to `align` (no memory behind it).
pub fn mem_address_reserve(size: usize, align: usize) -> Result<CUdeviceptr> {
    let f = get(&real::MEM_ADDRESS_RESERVE)?;
    let mut va: CUdeviceptr = 0;
    // SAFETY: the out-parameter is a local; no fixed address is asked for.
    check(unsafe { f(&mut va, size, align, 0, 0) })?;
    Ok(va)
}

/// Gives back a reservation.
/// # Safety
/// [ptr, ptr+size) is a reservation of the library's with nothing mapped in it.
pub unsafe fn mem_address_free(ptr: CUdeviceptr, size: usize) -> Result<()> {
    let f = get(&real::MEM_ADDRESS_FREE)?;
    // SAFETY: the caller vouches for the range.
    check(unsafe { f(ptr, size) })
}

/// Creates `size` bytes of physical memory with `prop`.
pub fn mem_create(size: usize, prop: &CUmemAllocationProp) -> Result<CUmemGenericAllocationHandle> {
    let f = get(&real::MEM_CREATE)?;
    let mut h: CUmemGenericAllocationHandle = 0;
    // SAFETY: the out-parameter is a local, `prop` a reference.
    check(unsafe { f(&mut h, size, prop, 0) })?;
    Ok(h)
}

/// Maps `size` bytes of `handle` at `ptr`.
/// # Safety
/// [ptr, ptr+size) lies in a reservation of the library's where nothing is mapped.
pub unsafe fn mem_map(
    ptr: CUdeviceptr,
    size: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<()> {
    let f = get(&real::MEM_MAP)?;
    // SAFETY: the caller vouches for the range; the driver checks the handle.
    check(unsafe { f(ptr, size, 0, handle, 0) })
}

/// Sets access to [ptr, ptr+size) as `desc` says.
/// # Safety
/// The range is mapped by the library.
pub unsafe fn mem_set_access(
    ptr: CUdeviceptr,
    size: usize,
    desc: &[CUmemAccessDesc],
) -> Result<()> {
    let f = get(&real::MEM_SET_ACCESS)?;
    // SAFETY: `desc` is readable for its length; the caller vouches for the range.
    check(unsafe { f(ptr, size, desc.as_ptr(), desc.len()) })
}

/// Releases a physical memory handle (its memory goes once nothing maps it).
/// # Safety
/// `handle` is the library's, and nothing of it is used after.
pub unsafe fn mem_release(handle: CUmemGenericAllocationHandle) -> Result<()> {
    let f = get(&real::MEM_RELEASE)?;
    // SAFETY: the caller vouches for the handle.
    check(unsafe { f(handle) })
}

// ---- streams and events

/// A new stream with `flags` (1: non-blocking), for the library's own use.
pub fn stream_create(flags: u32) -> Result<CUstream> {
    let f = get(&real::STREAM_CREATE)?;
    let mut s: CUstream = std::ptr::null_mut();
    // SAFETY: the out-parameter is a local.
    check(unsafe { f(&mut s, flags) })?;
    Ok(s)
}

/// Waits for the work of `stream`.
/// # Safety
/// `stream` exists (or is null).
pub unsafe fn stream_synchronize(stream: CUstream) -> Result<()> {
    let f = get(&real::STREAM_SYNCHRONIZE)?;
    // SAFETY: the caller vouches for the stream.
    check(unsafe { f(stream) })
}

/// Makes `stream`'s later work wait for `event`.
/// # Safety
/// Both exist.
pub unsafe fn stream_wait_event(stream: CUstream, event: CUevent) -> Result<()> {
    let f = get(&real::STREAM_WAIT_EVENT)?;
    // SAFETY: the caller vouches for both handles.
    check(unsafe { f(stream, event, 0) })
}

/// Whether `stream` is capturing a graph.
/// # Safety
/// `stream` exists (or is null, or a special handle such as the per-thread stream).
pub unsafe fn stream_is_capturing(stream: CUstream) -> Result<bool> {
    let f = get(&real::STREAM_IS_CAPTURING)?;
    let mut status: c_int = 0;
    // SAFETY: the out-parameter is a local; the caller vouches for the stream.
    check(unsafe { f(stream, &mut status) })?;
    Ok(status != 0)
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: a thread in this mode is never prohibited from a call
/// that is unsafe during a stream capture, not even while another thread captures in the
/// global mode (the mode PyTorch captures its graphs in).
const CAPTURE_MODE_RELAXED: c_int = 2;

/// Puts the calling thread in the relaxed capture mode for good (a thread of the library's own,
/// whose calls must never fail or invalidate a capture the program makes on another thread).
pub fn relax_capture_mode() -> Result<()> {
    let f = get(&real::THREAD_EXCHANGE_STREAM_CAPTURE_MODE)?;
    let mut mode = CAPTURE_MODE_RELAXED;
    // SAFETY: the in/out parameter is a local holding a valid mode.
    check(unsafe { f(&mut mode) })
}

/// The flags `stream` was created with (`CU_STREAM_NON_BLOCKING` = 1).
///
/// # Safety
/// `stream` is a stream of the program's (or a default stream's handle).
pub unsafe fn stream_get_flags(stream: CUstream) -> Result<u32> {
    let f = get(&real::STREAM_GET_FLAGS)?;
    let mut flags: c_uint = 0;
    // SAFETY: the out-parameter is a local; the caller vouches for the stream.
    check(unsafe { f(stream, &mut flags) })?;
    Ok(flags)
}

/// A new event with `flags` (2: without timing), for the library's own use.
pub fn event_create(flags: u32) -> Result<CUevent> {
    let f = get(&real::EVENT_CREATE)?;
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: the out-parameter is a local.
    check(unsafe { f(&mut e, flags) })?;
    Ok(e)
}

/// Records `event` on `stream`.
/// # Safety
/// Both exist; the event is the library's.
pub unsafe fn event_record(event: CUevent, stream: CUstream) -> Result<()> {
    let f = get(&real::EVENT_RECORD)?;
    // SAFETY: the caller vouches for both handles.
    check(unsafe { f(event, stream) })
}

/// Waits for `event`.
/// # Safety
/// `event` exists.
pub unsafe fn event_synchronize(event: CUevent) -> Result<()> {
    let f = get(&real::EVENT_SYNCHRONIZE)?;
    // SAFETY: the caller vouches for the event.
    check(unsafe { f(event) })
}

/// `Ok` once the work before `event` has run (`CUDA_ERROR_NOT_READY` before).
/// # Safety
/// `event` exists.
pub unsafe fn event_query(event: CUevent) -> Result<()> {
    let f = get(&real::EVENT_QUERY)?;
    // SAFETY: the caller vouches for the event.
    check(unsafe { f(event) })
}

/// Destroys `event`.
/// # Safety
/// `event` is the library's and is not used after.
pub unsafe fn event_destroy(event: CUevent) -> Result<()> {
    let f = get(&real::EVENT_DESTROY)?;
    // SAFETY: the caller vouches for the event.
    check(unsafe { f(event) })
}

// ---- modules and kernels

/// Loads the module `image` (PTX text, JIT-compiled by the driver) into the current context.
pub fn module_load_data(image: &CStr) -> Result<CUmodule> {
    let f = get(&real::MODULE_LOAD_DATA)?;
    let mut m: CUmodule = std::ptr::null_mut();
    // SAFETY: the out-parameter is a local; `image` is NUL-terminated text, which the driver
    // parses and rejects with an error code where it is not a module.
    check(unsafe { f(&mut m, image.as_ptr().cast()) })?;
    Ok(m)
}

/// The kernel `name` of `module`.
/// # Safety
/// `module` is a module of the current context.
pub unsafe fn module_get_function(module: CUmodule, name: &CStr) -> Result<CUfunction> {
    let f = get(&real::MODULE_GET_FUNCTION)?;
    let mut func: CUfunction = std::ptr::null_mut();
    // SAFETY: the out-parameter is a local, `name` NUL-terminated; the caller vouches for
    // the module.
    check(unsafe { f(&mut func, module, name.as_ptr()) })?;
    Ok(func)
}

/// Loads the code of `func` onto the device now rather than at its first launch (lazy loading,
/// CUDA 12.4+); `Missing` on older drivers.
/// # Safety
/// `func` is a function of a module of the current context.
pub unsafe fn func_load(func: CUfunction) -> Result<()> {
    let f = get(&real::FUNC_LOAD)?;
    // SAFETY: the caller vouches for the function.
    check(unsafe { f(func) })
}

/// The address and size of the global `name` of `module`.
/// # Safety
/// As [`module_get_function`].
pub unsafe fn module_get_global(module: CUmodule, name: &CStr) -> Result<(CUdeviceptr, usize)> {
    let f = get(&real::MODULE_GET_GLOBAL)?;
    let (mut ptr, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: the out-parameters are locals, `name` NUL-terminated; the caller vouches for
    // the module.
    check(unsafe { f(&mut ptr, &mut size, module, name.as_ptr()) })?;
    Ok((ptr, size))
}

/// Launches `func` on `stream` with `gx` x `gy` blocks of 256 threads and `params`, through
/// the real `cuLaunchKernel` (the library's own kernels are never checked).
/// # Safety
/// `func` is a kernel of the current context, `stream` one of its streams (or null), and
/// `params` holds one pointer per kernel parameter, to a value of its type; the memory the
/// kernel touches is the library's (quarantined memory, its own buffers).
pub unsafe fn launch_kernel(
    func: CUfunction,
    (gx, gy): (u32, u32),
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    let f = get(&real::LAUNCH_KERNEL)?;
    // SAFETY: the caller vouches for the kernel, stream and parameters; no `extra`.
    check(unsafe {
        f(
            func,
            gx,
            gy,
            1,
            256,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// (offset, size) of parameter `index` of kernel `func`.
/// # Safety
/// `func` is a kernel handle the driver handed out whose module is still loaded.
pub unsafe fn func_get_param_info(func: CUfunction, index: usize) -> Result<(usize, usize)> {
    let f = get(&real::FUNC_GET_PARAM_INFO)?;
    let (mut off, mut size) = (0usize, 0usize);
    // SAFETY: the out-parameters are locals; the caller vouches for the kernel.
    check(unsafe { f(func, index, &mut off, &mut size) })?;
    Ok((off, size))
}

/// The name of kernel `func` (the driver's string, which lives as long as its module).
/// # Safety
/// As [`func_get_param_info`].
pub unsafe fn func_get_name(func: CUfunction) -> Result<*const c_char> {
    let f = get(&real::FUNC_GET_NAME)?;
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: the out-parameter is a local; the caller vouches for the kernel.
    check(unsafe { f(&mut p, func) })?;
    Ok(p)
}

/// (offset, size) of parameter `index` of `kernel`, a CUkernel (a library's kernel, which the
/// CUDA 12+ runtime launches in place of a CUfunction).
/// # Safety
/// `kernel` is a handle the program is launching now (the driver checks which kind it is).
pub unsafe fn kernel_get_param_info(kernel: CUfunction, index: usize) -> Result<(usize, usize)> {
    let f = get(&real::KERNEL_GET_PARAM_INFO)?;
    let (mut off, mut size) = (0usize, 0usize);
    // SAFETY: the out-parameters are locals; the caller vouches for the handle.
    check(unsafe { f(kernel, index, &mut off, &mut size) })?;
    Ok((off, size))
}

/// How many parameters kernel `func` has (`cuFuncGetParamCount`, or for a CUkernel with
/// `as_kernel`, `cuKernelGetParamCount`).
/// # Safety
/// As [`kernel_get_param_info`].
pub unsafe fn get_param_count(func: CUfunction, as_kernel: bool) -> Result<usize> {
    let f = get(if as_kernel {
        &real::KERNEL_GET_PARAM_COUNT
    } else {
        &real::FUNC_GET_PARAM_COUNT
    })?;
    let mut n = 0usize;
    // SAFETY: the out-parameter is a local; the caller vouches for the handle.
    check(unsafe { f(func, &mut n) })?;
    Ok(n)
}

/// The name of `kernel`, a CUkernel (the driver's string, alive as long as its library).
/// # Safety
/// As [`kernel_get_param_info`].
pub unsafe fn kernel_get_name(kernel: CUfunction) -> Result<*const c_char> {
    let f = get(&real::KERNEL_GET_NAME)?;
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: the out-parameter is a local; the caller vouches for the handle.
    check(unsafe { f(&mut p, kernel) })?;
    Ok(p)
}

// ---- the runtime

/// Clears the runtime's last error (a failed attempt the program must not see), returning it.
pub fn get_last_error() -> Result<cudaError_t> {
    let f = get(&real::GET_LAST_ERROR)?;
    // SAFETY: no arguments.
    Ok(unsafe { f() })
}

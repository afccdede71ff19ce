//! The program's stream work other than launches (copies, sets, event records, graph launches,
//! host functions, stream memory operations, a capture's start — which also records
//! isolation's stream events while nothing captures), the synchronous copies and
//! sets that the legacy default stream orders, and the waits for streams and contexts: in
//! isolate mode each first queues the poisons deferred so far (`policy::stream_work`), so that
//! the work runs after them; and each tells the stream-order check (`policy::order`) what it
//! orders or uses (`[order Op]`), with the waits for events and a capture's end, hooked for that
//! alone. Handed out only while poisons are deferred (`ISOLATE_TEST_POISON_BATCH=on`, the
//! default in isolate mode) or the stream-order check runs.
//!
//! Not hooked (their frees' poisons can come after them; docs/isolation.md): the batched
//! copies (`cuMemcpyBatchAsync`, `cuMemcpy3DBatchAsync`) and copies to and from CUDA arrays.
//!
//! Layer: hooks. Uses the policies and the base.

#![allow(non_snake_case)]

use crate::base::cuda::*;
use crate::policy::order::Op;
use std::ffi::{c_int, c_uint, c_void};

hooks! {
    /// Every stream-work export we hand out a hook for while poisons are deferred or the
    /// stream-order check runs.
    static STREAM_HOOKED: CUresult = missing CUDA_ERROR_NOT_FOUND, in Driver;

    /// The waits: the program may read freed memory from the host once they return (managed
    /// memory, or device memory where the host can address it), so its poison comes first.
    cuStreamSynchronize(s) = STREAM_SYNCHRONIZE
        [order Op::StreamSync { stream: s, ptsz: false }];
    cuStreamSynchronize_ptsz(s: CUstream)
        [order Op::StreamSync { stream: s, ptsz: true }];
    cuStreamQuery(s: CUstream)
        [order Op::StreamSync { stream: s, ptsz: false }];
    cuStreamQuery_ptsz(s: CUstream)
        [order Op::StreamSync { stream: s, ptsz: true }];
    cuCtxSynchronize() = CTX_SYNCHRONIZE
        [order Op::CtxSync];
    /// CUDA 13's, what "cuCtxSynchronize" at version 13000 gives: libcudart 13 asks for both,
    /// and guard mode's fault came back through this one unseen (issue 30).
    cuCtxSynchronize_v2(ctx: CUcontext) [order Op::CtxSync];

    /// Work queued on a stream.

    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst, src }];
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst, src }];
    cuMemcpyPeerAsync(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst, src }];
    cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst, src }];
    cuMemcpyHtoDAsync_v2(dst, src, n, s) = MEMCPY_HTOD_ASYNC
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst, src: 0 }];
    cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst, src: 0 }];
    cuMemcpyDtoHAsync_v2(dst, src, n, s) = MEMCPY_DTOH_ASYNC
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: 0, src }];
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: 0, src }];
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst, src }];
    cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst, src }];
    cuMemcpy2DAsync_v2(p: *const c_void, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy2DAsync_v2_ptsz(p: *const c_void, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3DAsync_v2(p: *const c_void, s: CUstream)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3DAsync_v2_ptsz(p: *const c_void, s: CUstream)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3DPeerAsync(p: *const c_void, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3DPeerAsync_ptsz(p: *const c_void, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemsetD8Async(d, v, n, s) = MEMSET_D8_ASYNC
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD8Async_ptsz(d: CUdeviceptr, v: u8, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD16Async(d: CUdeviceptr, v: u16, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD16Async_ptsz(d: CUdeviceptr, v: u16, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD32Async(d: CUdeviceptr, v: u32, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD32Async_ptsz(d: CUdeviceptr, v: u32, n: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D8Async(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D8Async_ptsz(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D16Async(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D16Async_ptsz(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D32Async(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D32Async_ptsz(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, s: CUstream)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuEventRecord(ev, s) = EVENT_RECORD
        [order Op::Record { event: ev as usize, stream: s, ptsz: false }];
    cuEventRecord_ptsz(ev: *mut c_void, s: CUstream)
        [order Op::Record { event: ev as usize, stream: s, ptsz: true }];
    cuEventRecordWithFlags(ev: *mut c_void, s: CUstream, flags: c_uint)
        [order Op::Record { event: ev as usize, stream: s, ptsz: false }];
    cuEventRecordWithFlags_ptsz(ev: *mut c_void, s: CUstream, flags: c_uint)
        [order Op::Record { event: ev as usize, stream: s, ptsz: true }];
    cuGraphLaunch(exec: *mut c_void, s: CUstream)
        [order Op::Graph { stream: s, ptsz: false }];
    cuGraphLaunch_ptsz(exec: *mut c_void, s: CUstream)
        [order Op::Graph { stream: s, ptsz: true }];
    cuLaunchHostFunc(s: CUstream, f: *mut c_void, data: *mut c_void)
        [order Op::HostFunc { stream: s, ptsz: false }];
    cuLaunchHostFunc_ptsz(s: CUstream, f: *mut c_void, data: *mut c_void)
        [order Op::HostFunc { stream: s, ptsz: true }];
    cuStreamAddCallback(s: CUstream, f: *mut c_void, data: *mut c_void, flags: c_uint)
        [order Op::HostFunc { stream: s, ptsz: false }];
    cuStreamAddCallback_ptsz(s: CUstream, f: *mut c_void, data: *mut c_void, flags: c_uint)
        [order Op::HostFunc { stream: s, ptsz: true }];
    cuStreamWaitValue32_v2(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint)
        [order Op::WaitAll { stream: s, ptsz: false }];
    cuStreamWaitValue32_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint)
        [order Op::WaitAll { stream: s, ptsz: true }];
    cuStreamWaitValue64_v2(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint)
        [order Op::WaitAll { stream: s, ptsz: false }];
    cuStreamWaitValue64_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint)
        [order Op::WaitAll { stream: s, ptsz: true }];
    cuStreamWriteValue32_v2(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: addr, src: 0 }];
    cuStreamWriteValue32_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: addr, src: 0 }];
    cuStreamWriteValue64_v2(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint)
        [order Op::Work { stream: s, ptsz: false, name: HOOK_NAME, dst: addr, src: 0 }];
    cuStreamWriteValue64_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint)
        [order Op::Work { stream: s, ptsz: true, name: HOOK_NAME, dst: addr, src: 0 }];
    cuStreamBatchMemOp_v2(s: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint)
        [order Op::WaitAll { stream: s, ptsz: false }];
    cuStreamBatchMemOp_v2_ptsz(s: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint)
        [order Op::WaitAll { stream: s, ptsz: true }];
    cuStreamBeginCapture_v2(s: CUstream, mode: c_int) [capture_start];
    cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_int) [capture_start];
    /// CUDA 10.0's capture start (no mode), still exported and handed out by `cuGetProcAddress`
    /// for versions before 10.1.
    cuStreamBeginCapture(s: CUstream) [capture_start];
    cuStreamBeginCapture_ptsz(s: CUstream) [capture_start];
    cuStreamBeginCaptureToGraph(s: CUstream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, ndeps: usize, mode: c_int) [capture_start];
    cuStreamBeginCaptureToGraph_ptsz(s: CUstream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, ndeps: usize, mode: c_int) [capture_start];
    /// The waits for events, and a capture's end (the stream-order check's edges).
    cuStreamWaitEvent(s, ev, flags) = STREAM_WAIT_EVENT
        [order Op::Wait { stream: s, event: ev as usize, ptsz: false }];
    cuStreamWaitEvent_ptsz(s: CUstream, ev: *mut c_void, flags: c_uint)
        [order Op::Wait { stream: s, event: ev as usize, ptsz: true }];
    cuEventSynchronize(ev) = EVENT_SYNCHRONIZE [order Op::EventSync { event: ev as usize }];
    cuEventQuery(ev) = EVENT_QUERY [order Op::EventSync { event: ev as usize }];
    /// An event's end: its clock is forgotten (PyTorch makes and destroys one an ordered free).
    cuEventDestroy_v2(ev) = EVENT_DESTROY [order Op::EventGone { event: ev as usize }];
    cuEventDestroy(ev: *mut c_void) [order Op::EventGone { event: ev as usize }];
    cuStreamEndCapture(s: CUstream, graph: *mut *mut c_void) [order Op::CaptureEnd];
    cuStreamEndCapture_ptsz(s: CUstream, graph: *mut *mut c_void) [order Op::CaptureEnd];
    /// A wait for external semaphores: another API's work, or a CUDA stream's signal the
    /// library does not follow: ordered after every stream.
    cuWaitExternalSemaphoresAsync(sems: *const c_void, params: *const c_void, n: c_uint, s: CUstream)
        [order Op::WaitAll { stream: s, ptsz: false }];
    cuWaitExternalSemaphoresAsync_ptsz(sems: *const c_void, params: *const c_void, n: c_uint, s: CUstream)
        [order Op::WaitAll { stream: s, ptsz: true }];

    /// The synchronous copies and sets (the legacy default stream's, or with `_ptds` the
    /// thread's own).
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst, src }];
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst, src }];
    cuMemcpyPeer(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst, src }];
    cuMemcpyPeer_ptds(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst, src }];
    cuMemcpyHtoD_v2(dst, src, n) = MEMCPY_HTOD
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst, src: 0 }];
    cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst, src: 0 }];
    cuMemcpyDtoH_v2(dst, src, n) = MEMCPY_DTOH
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: 0, src }];
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: 0, src }];
    cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst, src }];
    cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst, src }];
    cuMemcpy2D_v2(p: *const c_void)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy2D_v2_ptds(p: *const c_void)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy2DUnaligned_v2(p: *const c_void)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy2DUnaligned_v2_ptds(p: *const c_void)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3D_v2(p: *const c_void)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3D_v2_ptds(p: *const c_void)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3DPeer(p: *const c_void)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemcpy3DPeer_ptds(p: *const c_void)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: 0, src: 0 }];
    cuMemsetD8_v2(d, v, n) = MEMSET_D8
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD8_v2_ptds(d: CUdeviceptr, v: u8, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD16_v2(d: CUdeviceptr, v: u16, n: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD16_v2_ptds(d: CUdeviceptr, v: u16, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD32_v2(d: CUdeviceptr, v: u32, n: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD32_v2_ptds(d: CUdeviceptr, v: u32, n: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D8_v2(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D8_v2_ptds(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D16_v2(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D16_v2_ptds(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D32_v2(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize)
        [order Op::SyncWork { ptds: false, name: HOOK_NAME, dst: d, src: 0 }];
    cuMemsetD2D32_v2_ptds(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize)
        [order Op::SyncWork { ptds: true, name: HOOK_NAME, dst: d, src: 0 }];
}

//! The program's stream work other than launches (copies, sets, event records, graph launches,
//! host functions, stream memory operations, a capture's start — which also records
//! isolation's stream events while nothing captures), the synchronous copies and
//! sets that the legacy default stream orders, and the waits for streams and contexts: in
//! isolate mode each first queues the poisons deferred so far (`policy::stream_work`), so that
//! the work runs after them. Handed out only while poisons are deferred
//! (`ISOLATE_TEST_POISON_BATCH=on`, the default in isolate mode).
//!
//! Not hooked (their frees' poisons can come after them; docs/isolation.md): the batched
//! copies (`cuMemcpyBatchAsync`, `cuMemcpy3DBatchAsync`) and copies to and from CUDA arrays.
//!
//! Layer: hooks. Uses the policies and the base.

#![allow(non_snake_case)]

use crate::base::cuda::*;
use std::ffi::{c_int, c_uint, c_void};

hooks! {
    /// Every stream-work export we hand out a hook for while poisons are deferred.
    static STREAM_HOOKED: CUresult = missing CUDA_ERROR_NOT_FOUND, in Driver;

    /// The waits: the program may read freed memory from the host once they return (managed
    /// memory, or device memory where the host can address it), so its poison comes first.
    cuStreamSynchronize(s) = STREAM_SYNCHRONIZE [stream_work];
    cuStreamSynchronize_ptsz(s: CUstream) [stream_work];
    cuStreamQuery(s: CUstream) [stream_work];
    cuStreamQuery_ptsz(s: CUstream) [stream_work];
    cuCtxSynchronize() = CTX_SYNCHRONIZE [stream_work];
    /// CUDA 13's, what "cuCtxSynchronize" at version 13000 gives: libcudart 13 asks for both,
    /// and guard mode's fault came back through this one unseen (issue 30).
    cuCtxSynchronize_v2(ctx: CUcontext) [stream_work];

    /// Work queued on a stream.

    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) [stream_work];
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) [stream_work];
    cuMemcpyPeerAsync(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) [stream_work];
    cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize, s: CUstream) [stream_work];
    cuMemcpyHtoDAsync_v2(dst, src, n, s) = MEMCPY_HTOD_ASYNC [stream_work];
    cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) [stream_work];
    cuMemcpyDtoHAsync_v2(dst, src, n, s) = MEMCPY_DTOH_ASYNC [stream_work];
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) [stream_work];
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) [stream_work];
    cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) [stream_work];
    cuMemcpy2DAsync_v2(p: *const c_void, s: CUstream) [stream_work];
    cuMemcpy2DAsync_v2_ptsz(p: *const c_void, s: CUstream) [stream_work];
    cuMemcpy3DAsync_v2(p: *const c_void, s: CUstream) [stream_work];
    cuMemcpy3DAsync_v2_ptsz(p: *const c_void, s: CUstream) [stream_work];
    cuMemcpy3DPeerAsync(p: *const c_void, s: CUstream) [stream_work];
    cuMemcpy3DPeerAsync_ptsz(p: *const c_void, s: CUstream) [stream_work];
    cuMemsetD8Async(d, v, n, s) = MEMSET_D8_ASYNC [stream_work];
    cuMemsetD8Async_ptsz(d: CUdeviceptr, v: u8, n: usize, s: CUstream) [stream_work];
    cuMemsetD16Async(d: CUdeviceptr, v: u16, n: usize, s: CUstream) [stream_work];
    cuMemsetD16Async_ptsz(d: CUdeviceptr, v: u16, n: usize, s: CUstream) [stream_work];
    cuMemsetD32Async(d: CUdeviceptr, v: u32, n: usize, s: CUstream) [stream_work];
    cuMemsetD32Async_ptsz(d: CUdeviceptr, v: u32, n: usize, s: CUstream) [stream_work];
    cuMemsetD2D8Async(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream) [stream_work];
    cuMemsetD2D8Async_ptsz(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream) [stream_work];
    cuMemsetD2D16Async(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream) [stream_work];
    cuMemsetD2D16Async_ptsz(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream) [stream_work];
    cuMemsetD2D32Async(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, s: CUstream) [stream_work];
    cuMemsetD2D32Async_ptsz(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, s: CUstream) [stream_work];
    cuEventRecord(ev, s) = EVENT_RECORD [stream_work];
    cuEventRecord_ptsz(ev: *mut c_void, s: CUstream) [stream_work];
    cuEventRecordWithFlags(ev: *mut c_void, s: CUstream, flags: c_uint) [stream_work];
    cuEventRecordWithFlags_ptsz(ev: *mut c_void, s: CUstream, flags: c_uint) [stream_work];
    cuGraphLaunch(exec: *mut c_void, s: CUstream) [stream_work];
    cuGraphLaunch_ptsz(exec: *mut c_void, s: CUstream) [stream_work];
    cuLaunchHostFunc(s: CUstream, f: *mut c_void, data: *mut c_void) [stream_work];
    cuLaunchHostFunc_ptsz(s: CUstream, f: *mut c_void, data: *mut c_void) [stream_work];
    cuStreamAddCallback(s: CUstream, f: *mut c_void, data: *mut c_void, flags: c_uint) [stream_work];
    cuStreamAddCallback_ptsz(s: CUstream, f: *mut c_void, data: *mut c_void, flags: c_uint) [stream_work];
    cuStreamWaitValue32_v2(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint) [stream_work];
    cuStreamWaitValue32_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint) [stream_work];
    cuStreamWaitValue64_v2(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint) [stream_work];
    cuStreamWaitValue64_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint) [stream_work];
    cuStreamWriteValue32_v2(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint) [stream_work];
    cuStreamWriteValue32_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u32, flags: c_uint) [stream_work];
    cuStreamWriteValue64_v2(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint) [stream_work];
    cuStreamWriteValue64_v2_ptsz(s: CUstream, addr: CUdeviceptr, v: u64, flags: c_uint) [stream_work];
    cuStreamBatchMemOp_v2(s: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint) [stream_work];
    cuStreamBatchMemOp_v2_ptsz(s: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint) [stream_work];
    cuStreamBeginCapture_v2(s: CUstream, mode: c_int) [capture_start];
    cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_int) [capture_start];
    /// CUDA 10.0's capture start (no mode), still exported and handed out by `cuGetProcAddress`
    /// for versions before 10.1.
    cuStreamBeginCapture(s: CUstream) [capture_start];
    cuStreamBeginCapture_ptsz(s: CUstream) [capture_start];
    cuStreamBeginCaptureToGraph(s: CUstream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, ndeps: usize, mode: c_int) [capture_start];
    cuStreamBeginCaptureToGraph_ptsz(s: CUstream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, ndeps: usize, mode: c_int) [capture_start];
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) [stream_work];
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) [stream_work];
    cuMemcpyPeer(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) [stream_work];
    cuMemcpyPeer_ptds(dst: CUdeviceptr, dctx: CUcontext, src: CUdeviceptr, sctx: CUcontext, n: usize) [stream_work];
    cuMemcpyHtoD_v2(dst, src, n) = MEMCPY_HTOD [stream_work];
    cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) [stream_work];
    cuMemcpyDtoH_v2(dst, src, n) = MEMCPY_DTOH [stream_work];
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) [stream_work];
    cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) [stream_work];
    cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) [stream_work];
    cuMemcpy2D_v2(p: *const c_void) [stream_work];
    cuMemcpy2D_v2_ptds(p: *const c_void) [stream_work];
    cuMemcpy2DUnaligned_v2(p: *const c_void) [stream_work];
    cuMemcpy2DUnaligned_v2_ptds(p: *const c_void) [stream_work];
    cuMemcpy3D_v2(p: *const c_void) [stream_work];
    cuMemcpy3D_v2_ptds(p: *const c_void) [stream_work];
    cuMemcpy3DPeer(p: *const c_void) [stream_work];
    cuMemcpy3DPeer_ptds(p: *const c_void) [stream_work];
    cuMemsetD8_v2(d, v, n) = MEMSET_D8 [stream_work];
    cuMemsetD8_v2_ptds(d: CUdeviceptr, v: u8, n: usize) [stream_work];
    cuMemsetD16_v2(d: CUdeviceptr, v: u16, n: usize) [stream_work];
    cuMemsetD16_v2_ptds(d: CUdeviceptr, v: u16, n: usize) [stream_work];
    cuMemsetD32_v2(d: CUdeviceptr, v: u32, n: usize) [stream_work];
    cuMemsetD32_v2_ptds(d: CUdeviceptr, v: u32, n: usize) [stream_work];
    cuMemsetD2D8_v2(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize) [stream_work];
    cuMemsetD2D8_v2_ptds(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize) [stream_work];
    cuMemsetD2D16_v2(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize) [stream_work];
    cuMemsetD2D16_v2_ptds(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize) [stream_work];
    cuMemsetD2D32_v2(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize) [stream_work];
    cuMemsetD2D32_v2_ptds(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize) [stream_work];
}

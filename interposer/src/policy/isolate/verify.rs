//! Verification: the poison of freed allocations checked on the device (the `isolate_verify`
//! kernel, all launched, then one copy back) or, where no kernel can be loaded, with copies to
//! the host; a changed byte is a stale write, recorded as a `Violation` and said on stderr.
//!
//! Layer: policies. Uses the base, recording, [`crate::policy::device`] (the context's kernel
//! and result buffer), [`crate::policy::tier`] (a block's pattern) and the folder's state.

use super::state::{Entry, current_ctx};
use crate::base::cu;
use crate::base::real::{self, *};
use crate::base::sys::{now_ns, warn};
use crate::policy::device::{self, BATCH};
use crate::policy::tier;
use crate::record::event;
use crate::record::writer;
use isolate_trace::{Record, Violation};
use std::ffi::c_void;

/// Records a violation (and says so on stderr) when the poison changed.
pub(super) fn report(e: &Entry, first: u64, changed: u64) {
    if changed == 0 {
        return;
    }
    let v = Violation {
        seq: event::next_seq(),
        ts_ns: now_ns(),
        device: e.device,
        ptr: e.ptr,
        size: e.size,
        first_offset: first,
        changed_bytes: changed,
        alloc_seq: e.alloc_seq,
        free_seq: e.free_seq,
        free_ts_ns: e.free_ts,
        free_api: e.free_api,
        alloc_stack: e.alloc_stack,
        free_stack: e.free_stack,
    };
    warn(&format!(
        "STALE WRITE: {changed} {} of freed allocation 0x{:x} ({} bytes, freed by {} at event {}) changed \
         after the free; first at offset {first}{}",
        if changed == 1 { "byte" } else { "bytes" },
        e.ptr,
        e.size,
        e.free_api,
        e.free_seq,
        crate::record::stacks::said_at(&[("allocated", e.alloc_stack), ("freed", e.free_stack)])
    ));
    writer::submit(Record::Violation(v));
}

/// (first changed offset, changed bytes) of each entry, counted by kernels on the device: all
/// launched, then one copy back.
pub(super) fn verify_batch_on_device(entries: &[&Entry], byte: u8) -> Option<Vec<(u64, u64)>> {
    if entries.iter().any(|e| e.shift != 0) {
        return verify_sparse_on_device(entries, byte);
    }
    let device::Verify { func, result } = device::verify(current_ctx())?;
    real::LAUNCH_KERNEL.get()?;
    MEMCPY_HTOD.get()?;
    MEMCPY_DTOH.get()?;
    let n = entries.len().min(BATCH);
    let init: Vec<u64> = (0..n).flat_map(|_| [0u64, u64::MAX]).collect();
    // SAFETY: `isolate_result` holds BATCH * 16 bytes (checked when it was found), `n <= BATCH`;
    // only this check uses it, under the caller's release (one thread releases a context's
    // entries at a time: the quarantine's lock hands each entry out once).
    unsafe { cu::memcpy_htod(result, &init) }.ok()?;
    for (i, e) in entries[..n].iter().enumerate() {
        let mut p = e.ptr;
        let mut len = e.size;
        let mut pat = u32::from_ne_bytes([byte; 4]);
        let mut out = result + (i as u64) * 16;
        let mut params: [*mut c_void; 4] = [
            (&mut p as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut pat as *mut u32).cast(),
            (&mut out as *mut u64).cast(),
        ];
        let blocks = (e.size / 4).div_ceil(256).clamp(1, 132 * 8) as u32;
        // SAFETY: `isolate_verify(ptr, len, pattern, out)` of this context's module, its
        // parameters pointing at locals of their types; it reads the quarantined range and
        // writes its pair of `isolate_result`.
        unsafe { cu::launch_kernel(func, (blocks, 1), std::ptr::null_mut(), &mut params) }.ok()?;
    }
    let mut res = vec![0u64; n * 2];
    // SAFETY: as the copy down; any bits are a u64.
    unsafe { cu::memcpy_dtoh(&mut res, result) }.ok()?;
    Some(
        (0..n)
            .map(|i| (if res[2 * i] == 0 { 0 } else { res[2 * i + 1] }, res[2 * i]))
            .collect(),
    )
}

/// [`verify_batch_on_device`] for entries of which some have a pattern (the fast tier,
/// [`crate::policy::tier`]): the fast tier's kernel, [`SPARSE_BATCH`] entries a launch, their
/// descriptors in the first half of `isolate_result` and their results in the second.
fn verify_sparse_on_device(entries: &[&Entry], byte: u8) -> Option<Vec<(u64, u64)>> {
    // Its 128-bit loads need 16-byte aligned starts; the host check takes any.
    if !entries.iter().all(|e| e.ptr.is_multiple_of(16)) {
        return None;
    }
    let ctx = current_ctx();
    let device::Verify { result, .. } = device::verify(ctx)?;
    let func = device::sparse(ctx)?.verify;
    real::LAUNCH_KERNEL.get()?;
    MEMCPY_HTOD.get()?;
    MEMCPY_DTOH.get()?;
    let n = entries.len().min(BATCH);
    let mut out = Vec::with_capacity(n);
    for chunk in entries[..n].chunks(SPARSE_BATCH) {
        let k = chunk.len();
        let mut words: Vec<u64> = chunk.iter().flat_map(|e| [e.ptr, e.field()]).collect();
        words.resize(2 * SPARSE_BATCH, 0);
        words.extend((0..k).flat_map(|_| [0u64, u64::MAX]));
        // SAFETY: `isolate_result` holds BATCH * 16 bytes: SPARSE_BATCH descriptors then up to
        // SPARSE_BATCH results (BATCH = 2 * SPARSE_BATCH); only this check uses it, under the
        // caller's release.
        unsafe { cu::memcpy_htod(result, &words) }.ok()?;
        let longest = chunk
            .iter()
            .map(|e| tier::vector_bytes(e.field()))
            .max()
            .unwrap_or(0);
        let mut descs = result;
        let mut count = k as u32;
        let mut pat = u32::from_ne_bytes([byte; 4]);
        let mut res = result + (SPARSE_BATCH * 16) as u64;
        let mut params: [*mut c_void; 4] = [
            (&mut descs as *mut u64).cast(),
            (&mut count as *mut u32).cast(),
            (&mut pat as *mut u32).cast(),
            (&mut res as *mut u64).cast(),
        ];
        let bx = (longest / 16).div_ceil(256 * 4).clamp(1, 1024) as u32;
        // SAFETY: `isolate_verify_sparse(descs, count, pattern, out)` of this context's fast
        // module, its parameters pointing at locals of their types; it reads the quarantined
        // blocks' patterns and writes the results half of `isolate_result`.
        unsafe { cu::launch_kernel(func, (bx, k as u32), std::ptr::null_mut(), &mut params) }
            .ok()?;
        let mut got = vec![0u64; k * 2];
        // SAFETY: as the copy down; any bits are a u64.
        unsafe { cu::memcpy_dtoh(&mut got, res) }.ok()?;
        out.extend((0..k).map(|i| (if got[2 * i] == 0 { 0 } else { got[2 * i + 1] }, got[2 * i])));
    }
    Some(out)
}

/// Entries one launch of the synchronous fast-tier check takes: half of `isolate_result`.
const SPARSE_BATCH: usize = BATCH / 2;

/// The same count with copies to the host (the path when no kernel can be loaded), of the
/// bytes `field`'s pattern covers ([`tier::spans`]; every byte of a block without one).
pub(super) fn verify_on_host(ptr: u64, field: u64, byte: u8) -> Option<(u64, u64)> {
    let (size, shift) = tier::decode(field);
    if shift == 0 {
        return verify_range_on_host(ptr, size, byte);
    }
    let (mut first, mut changed) = (u64::MAX, 0u64);
    for (off, n) in tier::spans(size, shift) {
        let (f, c) = verify_range_on_host(ptr + off, n, byte)?;
        if c > 0 {
            changed += c;
            first = first.min(off + f);
        }
    }
    Some((if changed == 0 { 0 } else { first }, changed))
}

/// Every byte of [ptr, ptr+size) compared with the poison on the host, in large copies.
fn verify_range_on_host(ptr: u64, size: u64, byte: u8) -> Option<(u64, u64)> {
    MEMCPY_DTOH.get()?;
    const CHUNK: u64 = 16 << 20;
    let mut buf = vec![0u8; CHUNK.min(size) as usize];
    let (mut first, mut changed) = (u64::MAX, 0u64);
    let mut off = 0;
    while off < size {
        let n = CHUNK.min(size - off) as usize;
        // SAFETY: [ptr+off, ptr+off+n) lies in a quarantined allocation (the device has
        // finished with it: the caller waited for its freeing stream); any bits are a u8.
        unsafe { cu::memcpy_dtoh(&mut buf[..n], ptr + off) }.ok()?;
        for (i, &b) in buf[..n].iter().enumerate() {
            if b != byte {
                changed += 1;
                first = first.min(off + i as u64);
            }
        }
        off += n as u64;
    }
    Some((if changed == 0 { 0 } else { first }, changed))
}

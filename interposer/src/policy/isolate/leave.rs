//! How entries leave quarantine, both ways: the asynchronous release (stream-ordered frees
//! verified and freed on the library's release stream, [`crate::policy::release`], their results
//! read later by [`reap`]) and the synchronous one (the host waits for the freeing streams,
//! verifies each allocation and frees it). Checked memory of the default pool may be kept for
//! reuse instead of freed ([`crate::policy::reuse`]).
//!
//! Layer: policies. Uses the base, recording, [`crate::policy::release`],
//! [`crate::policy::reuse`] and the folder's state, verification and counters.

use super::counters::{ASYNC_BATCHES, CHECKED_BYTES, ON_DEVICE, ON_HOST, RELEASE_NS, WAIT_NS};
use super::state::{Entry, Held, current_ctx, st, state};
use super::verify::{report, verify_batch_on_device, verify_on_host};
use crate::base::config;
use crate::base::cu::{self, CuError};
use crate::base::cuda::*;
use crate::base::real::*;
use crate::base::sys::{ForkLock, now_ns};
use crate::policy::device::BATCH;
use crate::policy::{release, reuse};
use crate::record::event;
use crate::record::writer::Q_RELEASES;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// Verifies, then really frees (or unmaps) entries: per context, every check is launched first
/// and the results come back in one copy.
pub(super) fn release_batch(entries: &[Entry], how: Release) {
    if entries.is_empty() {
        return;
    }
    let t0 = now_ns();
    let free = how != Release::CheckOnly;
    if free {
        Q_RELEASES.fetch_add(entries.len() as u64, Relaxed);
    }
    reap(false);
    let entries = &if how == Release::Budget {
        release_async(entries)
    } else {
        entries.to_vec()
    };
    release_sync(entries, free, false);
    RELEASE_NS.fetch_add(now_ns().saturating_sub(t0), Relaxed);
}

/// How entries leave quarantine.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// Over the budget: stream-ordered frees go the asynchronous way.
    Budget,
    /// Memory is needed at once (an allocation ran out, a range is mapped again): freed before
    /// the call returns.
    Now,
    /// Checked, not freed (exit, a test's check).
    CheckOnly,
}

/// Calls `f` with each context's entries among `entries`, that context made current for the
/// call (and the caller's put back after).
pub(super) fn in_each_context(entries: &[Entry], mut f: impl FnMut(usize, Vec<Entry>)) {
    let cur = current_ctx();
    let mut ctxs: Vec<usize> = entries.iter().map(|e| e.ctx).collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    for ctx in ctxs {
        let switch = ctx != 0 && ctx != cur;
        if switch {
            // SAFETY: a context an entry was freed in: entries of a destroyed context are
            // not held (the program destroys a context after freeing its memory, and a
            // context is only ever destroyed by the program).
            let _ = unsafe { cu::ctx_set_current(ctx as CUcontext) };
        }
        f(
            ctx,
            entries.iter().filter(|e| e.ctx == ctx).copied().collect(),
        );
        if switch {
            // SAFETY: the calling thread's own current context, put back.
            let _ = unsafe { cu::ctx_set_current(cur as CUcontext) };
        }
    }
}

/// Stream-ordered frees of device memory leave quarantine on the release stream (see
/// [`release`]): verified and freed there, their results read later by [`reap`]. Returns the
/// entries that must go the synchronous way (not stream-ordered, mappings, or where the
/// context has no release stream).
pub(super) fn release_async(entries: &[Entry]) -> Vec<Entry> {
    let Some(byte) = config::get().poison else {
        return entries.to_vec();
    };
    if !release::enabled() {
        return entries.to_vec();
    }
    let (mut rest, mut ours): (Vec<Entry>, Vec<Entry>) = (Vec::new(), Vec::new());
    for e in entries {
        if e.held == Held::Allocation && e.mark != 0 && e.ctx != 0 {
            ours.push(*e);
        } else {
            rest.push(*e);
        }
    }
    if ours.is_empty() {
        return rest;
    }
    in_each_context(&ours, |ctx, group| {
        if !release::available(ctx) {
            rest.extend(group);
        } else {
            refresh_streams(ctx, &group);
            for chunk in group.chunks(BATCH) {
                let waits = waits_of(chunk);
                let items: Vec<(u64, u64)> = chunk.iter().map(|e| (e.ptr, e.field())).collect();
                // Every slot in flight (here or on another thread): wait for the oldest batch
                // of this context, then try again; a few tries, then the synchronous way.
                let mut launched = None;
                for _ in 0..4 {
                    if !release::slot_free(ctx) && !reap_oldest(ctx) {
                        continue;
                    }
                    launched = release::launch(ctx, &waits, &items, byte);
                    if launched.is_some() || release::slot_free(ctx) {
                        break;
                    }
                }
                match launched {
                    Some(l) => {
                        ASYNC_BATCHES.fetch_add(1, Relaxed);
                        ON_DEVICE.fetch_add(chunk.len() as u64, Relaxed);
                        CHECKED_BYTES
                            .fetch_add(chunk.iter().map(Entry::touched).sum::<u64>(), Relaxed);
                        INFLIGHT.lock().push_back((l, chunk.to_vec()));
                        IN_FLIGHT.fetch_add(1, Relaxed);
                    }
                    None => rest.extend_from_slice(chunk),
                }
            }
        }
    });
    rest
}

/// The events a check of `entries` waits for, each once: their freeing streams' marks and,
/// for unordered frees, the events recorded on the streams that used them.
fn waits_of<E: std::borrow::Borrow<Entry>>(entries: &[E]) -> Vec<usize> {
    let mut waits: Vec<usize> = entries
        .iter()
        .flat_map(|e| [e.borrow().mark, e.borrow().also])
        .filter(|&m| m != 0)
        .collect();
    waits.sort_unstable();
    waits.dedup();
    waits
}

/// Records again the event of each stream `entries` were freed on (see [`release::refresh`]),
/// once per stream, with context `ctx` current.
pub(super) fn refresh_streams<E: std::borrow::Borrow<Entry>>(ctx: usize, entries: &[E]) {
    let mut streams: Vec<usize> = entries
        .iter()
        .map(|e| e.borrow())
        .filter(|e| e.mark != 0)
        .map(|e| e.stream)
        .collect();
    streams.sort_unstable();
    streams.dedup();
    for st in streams {
        release::refresh(ctx, st);
    }
}

/// A batch whose check has run: its entries and, for each, (first changed offset, changed
/// bytes).
pub(super) type Checked = (Vec<Entry>, Vec<(u64, u64)>);

/// Batches on the release streams whose results have not been read.
pub(super) static INFLIGHT: ForkLock<VecDeque<(release::Launched, Vec<Entry>)>> =
    ForkLock::new(VecDeque::new());

/// Reads the results of the batches whose checks have run (all of them, waiting, with
/// `wait`), in order, and reports what changed. One thread reads at a time (the queue's lock is
/// held while it polls: a batch's slot is free again once polled); without `wait`, a thread
/// that finds another reading leaves it to that one.
pub(super) fn reap(wait: bool) {
    let t0 = now_ns();
    let done = {
        let q = if wait {
            Some(INFLIGHT.lock())
        } else {
            INFLIGHT.try_lock()
        };
        let Some(mut q) = q else { return };
        let done = take_done(&mut q, wait, usize::MAX);
        // Given back while the queue's lock is held: an allocation out of memory that takes
        // the lock after this finds the memory on its way back (queued on the release stream,
        // which it then waits for), never in neither place.
        free_checked(&done, wait);
        done
    };
    settle(done, wait.then_some(t0));
}

/// What follows reading checked batches and giving their memory back: the wait since
/// `waited_since` counted, their findings reported.
pub(super) fn settle(done: Vec<Checked>, waited_since: Option<u64>) {
    if let Some(t0) = waited_since {
        WAIT_NS.fetch_add(now_ns().saturating_sub(t0), Relaxed);
    }
    report_all(done);
}

/// Batches in [`INFLIGHT`], read without its lock: the freeing path polls only when there are.
pub(super) static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Frees since the freeing path last polled the batches in flight.
pub(super) static SINCE_POLL: AtomicUsize = AtomicUsize::new(0);

/// How many frees go by between two polls (each a `cuEventQuery` of the oldest batch).
pub(super) const POLL_EVERY: usize = 32;

/// Gives back the memory of batches whose check has run (see [`release::free_all`]); with
/// `wait`, it is free when this returns.
pub(super) fn free_checked(done: &[Checked], wait: bool) {
    let entries: Vec<Entry> = done.iter().flat_map(|(e, _)| e.iter().copied()).collect();
    if entries.is_empty() {
        return;
    }
    IN_FLIGHT.fetch_sub(done.len(), Relaxed);
    let keeping = reuse::enabled() && entries.iter().any(|e| e.default_pool);
    in_each_context(&entries, |ctx, group| {
        // Asked of the driver only when something could be kept, with the entries' context
        // current (on the keeper thread none is otherwise: the cap fell to a quarter of the
        // budget there, and kept memory served 16 allocations of the stand-in's 200 instead
        // of 115).
        let cap = if keeping { reuse_cap() } else { 0 };
        // Checked memory of the default pool is kept for the next allocation of its size
        // (`ISOLATE_REUSE=on`), the rest freed.
        let ptrs: Vec<u64> = group
            .iter()
            .filter(|e| !(e.default_pool && reuse::keep(ctx, e.size, e.ptr, cap)))
            .map(|e| e.ptr)
            .collect();
        free_to_driver(ctx, &ptrs, wait);
    });
}

/// Frees `ptrs` of context `ctx` (current) on its release stream (with `wait`, freed when
/// this returns).
pub(super) fn free_to_driver(ctx: usize, ptrs: &[u64], wait: bool) {
    if ptrs.is_empty() {
        return;
    }
    if !release::free_all(ctx, ptrs, wait) {
        // Unreachable in practice (a batch was launched on this context's stream).
        for &p in ptrs {
            // SAFETY: checked memory leaving quarantine (or kept for reuse and given back):
            // nobody uses it.
            if unsafe { cu::mem_free(p) } == Err(CuError::Missing) {
                break;
            }
        }
    }
}

/// The most checked memory [`reuse`] keeps (the current context's device): a quarter of the
/// quarantine budget, and up to the whole budget while the device has room to spare (more
/// than a quarter of its memory free beyond the extra kept). A quarter alone left ~12% of
/// ResNet-50's allocations to the driver on the H200 (~16 µs each: a step frees more than a
/// quarter of the default budget), but a half or the whole budget lost a block in the
/// stand-in's out-of-memory test, where the device is nearly full (the program's blocks land
/// between the kept ones, whose holes are too small once given back): see the kept-memory
/// test and isolation.md. One `cuMemGetInfo` per set of checked batches with something to keep.
pub(super) fn reuse_cap() -> u64 {
    let Some(budget) = st!(state()).budget else {
        return 0;
    };
    cap_for(budget, device_memory())
}

/// [`reuse_cap`] for a quarantine `budget` and the device's (free, total) bytes, if known.
pub(super) fn cap_for(budget: u64, mem: Option<(u64, u64)>) -> u64 {
    let spare = mem.map_or(0, |(free, total)| free.saturating_sub(total / 4));
    (budget / 4).max(budget.min(spare))
}

/// The current context's device memory: (free, total) bytes, as the driver says.
pub(super) fn device_memory() -> Option<(u64, u64)> {
    let (free, total) = cu::mem_get_info().ok()?;
    (total > 0).then_some((free as u64, total as u64))
}

/// Pops the batches at the head of `q` whose checks have run, with their results: with
/// `wait`, every one up to and including the `upto`-th (all when `upto` is past the end).
pub(super) fn take_done(
    q: &mut VecDeque<(release::Launched, Vec<Entry>)>,
    wait: bool,
    upto: usize,
) -> Vec<Checked> {
    let mut done = Vec::new();
    let mut i = 0;
    while let Some((l, _)) = q.front() {
        let l = *l;
        let Some(found) = release::poll(&l, wait && i <= upto) else {
            break;
        };
        if let Some((_, entries)) = q.pop_front() {
            done.push((entries, found));
        }
        i += 1;
    }
    done
}

pub(super) fn report_all(done: Vec<Checked>) {
    for (entries, found) in done {
        for (e, (first, changed)) in entries.iter().zip(found) {
            report(e, first, changed);
        }
    }
}

/// Waits for the oldest batch in flight of context `ctx` (and reads every batch before it);
/// false when there is none.
pub(super) fn reap_oldest(ctx: usize) -> bool {
    let t0 = now_ns();
    let done = {
        let mut q = INFLIGHT.lock();
        let Some(pos) = q.iter().position(|(l, _)| l.ctx() == ctx) else {
            return false;
        };
        let done = take_done(&mut q, true, pos);
        free_checked(&done, false);
        done
    };
    settle(done, Some(t0));
    true
}

/// The way every release went before the release stream: the host waits for the freeing
/// streams' events, checks each allocation with a launch and one copy per batch, and frees.
/// With `repoison`, an allocation found changed is filled with the poison again (it stays in
/// quarantine), so that the next check reports only what is written after this one.
pub(super) fn release_sync(entries: &[Entry], free: bool, repoison: bool) {
    if entries.is_empty() {
        return;
    }
    in_each_context(entries, |ctx, group| {
        let group: Vec<&Entry> = group.iter().collect();
        let t0 = now_ns();
        for e in &group {
            if e.event != 0 {
                let ev = e.event as cu::CUevent;
                // SAFETY: the entry's own event, made at its free and destroyed here, once
                // (the entry has left the queue).
                let _ = unsafe { cu::event_synchronize(ev) };
                // SAFETY: as above.
                let _ = unsafe { cu::event_destroy(ev) };
            }
        }
        refresh_streams(ctx, &group);
        for m in waits_of(&group) {
            // SAFETY: a stream's mark, never destroyed.
            let _ = unsafe { cu::event_synchronize(m as cu::CUevent) };
        }
        WAIT_NS.fetch_add(now_ns().saturating_sub(t0), Relaxed);
        if let Some(byte) = config::get().poison {
            for chunk in group.chunks(BATCH) {
                let found = verify_batch_on_device(chunk, byte);
                let by = if found.is_some() {
                    &ON_DEVICE
                } else {
                    &ON_HOST
                };
                by.fetch_add(chunk.len() as u64, Relaxed);
                let bytes: u64 = chunk.iter().map(|e| e.touched()).sum();
                CHECKED_BYTES.fetch_add(bytes, Relaxed);
                for (i, e) in chunk.iter().enumerate() {
                    let r = match &found {
                        Some(v) => Some(v[i]),
                        None => verify_on_host(e.ptr, e.field(), byte),
                    };
                    if let Some((first, changed)) = r {
                        report(e, first, changed);
                        if repoison && changed > 0 {
                            // SAFETY: quarantined memory (it stays there), nobody else's.
                            let _ = unsafe { cu::memset_d8(e.ptr, byte, e.size as usize) };
                        }
                    }
                }
            }
        }
        if free {
            for e in &group {
                match e.held {
                    Held::Allocation => {
                        // SAFETY: checked, leaving quarantine: nobody uses it.
                        let _ = unsafe { cu::mem_free(e.ptr) };
                    }
                    Held::Mapping => {
                        // SAFETY: a range the program unmapped, held back mapped: nobody
                        // uses it.
                        let _ = unsafe { cu::mem_unmap(e.ptr, e.size as usize) };
                    }
                    Held::Guarded => {} // never queued
                }
            }
        }
    });
}

/// Gives the device's default pool's unused memory back to the device (the memory released
/// from quarantine stream-ordered went back there): a plain allocation, or one from another
/// pool, can then have it. On an allocation that ran out of memory, and while the device is
/// short of free memory (quarantine.rs).
pub(super) fn trim_default_pool() {
    let (Some(get_pool), Some(trim)) = (DEVICE_GET_DEFAULT_MEM_POOL.get(), MEM_POOL_TRIM_TO.get())
    else {
        return;
    };
    // The current context's device, asked without failing where the thread has none (a failed
    // cuCtxGetDevice is a line in the driver's error log, CUDA_LOG_FILE).
    let dev: CUdevice = event::current_device();
    let mut pool: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: cuDeviceGetDefaultMemPool writes one handle through a pointer to a live local;
    // `dev` is the current context's device.
    if dev >= 0 && unsafe { get_pool(&mut pool, dev) } == CUDA_SUCCESS && !pool.is_null() {
        // SAFETY: `pool` is the device's default pool, which lives as long as the device;
        // trimming releases only memory no allocation holds.
        unsafe { trim(pool, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::cap_for;

    /// Kept memory's cap: a quarter of the budget on a nearly full device (or one whose memory
    /// is not known), up to the whole budget while more than a quarter of the device is free.
    #[test]
    fn kept_memory_grows_past_a_quarter_of_the_budget_only_with_room_to_spare() {
        const GIB: u64 = 1 << 30;
        // The H200: 140 GiB, the program and the quarantine hold 40: 100 free, 65 to spare.
        assert_eq!(cap_for(35 * GIB, Some((100 * GIB, 140 * GIB))), 35 * GIB);
        // 50 free: 15 to spare.
        assert_eq!(cap_for(35 * GIB, Some((50 * GIB, 140 * GIB))), 15 * GIB);
        // Nearly full, or unknown: a quarter.
        assert_eq!(cap_for(8 << 20, Some((3 << 20, 12 << 20))), 2 << 20);
        assert_eq!(cap_for(8 << 20, None), 2 << 20);
        assert_eq!(cap_for(0, Some((100 * GIB, 140 * GIB))), 0);
    }
}

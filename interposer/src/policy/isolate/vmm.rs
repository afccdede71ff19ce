//! Virtual-memory calls in isolate mode: the physical memory this process made and where it
//! mapped it is tracked, an unmapped range of it is poisoned and held back (still mapped), and
//! a held range is really unmapped before its reservation is freed or mapped into again.
//!
//! Layer: policies. Uses the base, recording, [`crate::policy::log`] and the folder's state,
//! counters, poison and quarantine.

use super::counters::{UNMAPPED, UNMAPPED_BYTES, WRITTEN_BYTES};
use super::poison::poison;
use super::quarantine::{quarantine, release_overlapping};
use super::state::{Held, Live, freed, st, state};
use crate::base::cuda::*;
use crate::policy::log;
use crate::record::event::Pending;
use isolate_trace::{Event, Kind};
use std::sync::atomic::Ordering::Relaxed;

pub fn other(
    proto: Event,
    before: bool,
    call: impl FnMut() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    match proto.api.kind() {
        Kind::Unmap => return unmap(proto, call),
        // The program sees what it would without isolation: a range it unmapped (held back here,
        // still mapped) is really unmapped before it frees the reservation or maps into it again.
        Kind::AddressFree | Kind::Map => release_overlapping(proto.ptr, proto.size),
        _ => {}
    }
    log::other(proto, before, call, |e| {
        after(e);
        if e.result == CUDA_SUCCESS {
            track_mapping(e);
        }
    })
}

/// Remembers the physical memory this process made and where it mapped it: only such mappings
/// are ever held back, since a handle imported from a peer (NCCL) is someone else's memory,
/// never to be poisoned.
pub(super) fn track_mapping(e: &Event) {
    match e.api.kind() {
        Kind::Create => {
            st!(state()).created.insert(e.handle);
        }
        // A retained reference (NCCL's free) is given back by one release; the handle is this
        // process's until its last.
        Kind::Retain => {
            let mut g = state();
            let s = st!(g);
            if s.created.contains(&e.handle) {
                s.retained.retain(e.handle);
            }
        }
        Kind::Release => {
            let mut g = state();
            let s = st!(g);
            if !s.retained.release(e.handle) {
                s.created.remove(&e.handle);
            }
        }
        Kind::Map => {
            let mut g = state();
            let s = st!(g);
            if s.created.contains(&e.handle) {
                s.mapped.insert(e.ptr, e.size);
            }
        }
        _ => {}
    }
}

/// `cuMemUnmap` in isolate mode: the range stays mapped (poisoned) until it leaves quarantine.
pub(super) fn unmap(proto: Event, call: impl FnOnce() -> i32) -> i32 {
    let mut p = Pending::before(proto.api);
    let seq = p.ev.seq;
    p.ev = Event { seq, ..proto };
    // Only a range made entirely of mappings we saw is held back; anything else is the
    // driver's to judge (and to refuse).
    if !(proto.ptr != 0 && proto.size != 0 && take_mapped(proto.ptr, proto.size)) {
        let r = call();
        p.finish(r);
        return r;
    }
    let r = poison(proto.ptr, proto.size, false, std::ptr::null_mut(), 0);
    if r != CUDA_SUCCESS {
        // Not a range we can touch (not mapped, no access): let the driver say what it is.
        let r = call();
        p.finish(r);
        return r;
    }
    let free_stack = p.stack();
    p.finish(CUDA_SUCCESS);
    UNMAPPED.fetch_add(1, Relaxed);
    UNMAPPED_BYTES.fetch_add(proto.size, Relaxed);
    if crate::base::config::get().poison.is_some() {
        WRITTEN_BYTES.fetch_add(proto.size, Relaxed); // every byte: a mapping has no pattern
    }
    let mapping = Live {
        size: proto.size,
        seq: u64::MAX,
        pooled: false,
        default_pool: false,
        captured: false,
        stack: 0,
    };
    quarantine(freed(
        &proto,
        mapping,
        seq,
        free_stack,
        Held::Mapping,
        crate::base::sys::now_ns(),
        super::state::current_ctx(),
    ));
    CUDA_SUCCESS
}

/// True (and the range forgotten) when [ptr, ptr+size) is covered by mappings we saw made.
pub(super) fn take_mapped(ptr: u64, size: u64) -> bool {
    let mut g = state();
    let s = st!(g);
    let end = ptr + size;
    let parts: Vec<(u64, u64)> = s
        .mapped
        .range(..end)
        .rev()
        .take_while(|(k, v)| **k + **v > ptr)
        .map(|(k, v)| (*k, *v))
        .collect();
    let mut at = ptr;
    for &(k, v) in parts.iter().rev() {
        if k <= at {
            at = at.max(k + v);
        }
    }
    if at < end {
        return false;
    }
    for (k, v) in parts {
        s.mapped.remove(&k);
        // The parts of a mapping outside the unmapped range stay mapped.
        if k < ptr {
            s.mapped.insert(k, ptr - k);
        }
        if k + v > end {
            s.mapped.insert(end, k + v - end);
        }
    }
    true
}

//! The quarantine and its budget: a freed entry goes in (queue and index); over the budget the
//! oldest go out, down to 80% of it; an allocation that ran out of memory takes the oldest out
//! at once; held ranges overlapping a reused reservation go out first. The launch check looks
//! words up in its index.
//!
//! Layer: policies. Uses the base, recording and the folder's state, release paths and exit
//! check.

use super::exit::{ATEXIT, EXIT_OWNER, verify_all_at_exit};
use super::leave::{Release, release_batch};
use super::state::{Entry, HIGH, Held, LOW, STATE, State, st, state};
use crate::base::config::{self, Budget};
use crate::base::cu;
use crate::record::profile::{self, Part};
use crate::record::writer::{Q_EARLY, Q_PEAK};
use std::sync::atomic::Ordering::*;

pub(super) fn budget(s: &mut State, device: i32) -> u64 {
    if let Some(b) = s.budget {
        return b;
    }
    let b = match config::get().quarantine {
        Budget::Bytes(b) => b,
        Budget::Percent(pct) => {
            let mut total = cu::device_total_mem(device.max(0)).unwrap_or(0);
            if total == 0 {
                total = 8 << 30;
            }
            (total as f64 * pct / 100.0) as u64
        }
    };
    s.budget = Some(b);
    b
}

pub(super) fn quarantine(entry: Entry) {
    if !ATEXIT.swap(true, AcqRel) {
        // Registered after the CUDA runtime's own exit handler, so it runs before the context
        // goes away.
        // SAFETY: getpid has no preconditions.
        EXIT_OWNER.store(unsafe { libc::getpid() } as u32, Release);
        // SAFETY: an `extern "C" fn()` of this library, which is never unloaded.
        unsafe { libc::atexit(verify_all_at_exit) };
    }
    let mut over = Vec::new();
    {
        let mut g = state();
        let s = st!(g);
        s.held += entry.size;
        Q_PEAK.fetch_max(s.held, Relaxed);
        LOW.fetch_min(entry.ptr, Relaxed);
        HIGH.fetch_max(entry.ptr + entry.size, Relaxed);
        s.index.insert(entry.ptr, entry);
        s.queue.push_back(entry);
        let limit = budget(s, entry.device);
        // Over budget: release down to 80% of it in one batch (verified with one round trip).
        let low_water = if s.held > limit {
            limit / 10 * 8
        } else {
            u64::MAX
        };
        while s.held > low_water {
            let Some(old) = s.pop_oldest() else {
                break;
            };
            over.push(old);
        }
    }
    if !over.is_empty() {
        profile::timed(Part::Release, || release_batch(&over, Release::Budget));
    }
}

/// A guard-mode free: in the index for the launch check, never released, never verified
/// (the memory is unmapped: any access faults).
pub(super) fn quarantine_index_only(entry: Entry) {
    LOW.fetch_min(entry.ptr, Relaxed);
    HIGH.fetch_max(entry.ptr + entry.size, Relaxed);
    st!(state()).index.insert(entry.ptr, entry);
}

/// Releases the oldest entries until at least `need` bytes are free; returns the bytes released.
/// Only for an allocation that ran out of memory, so every release is counted as early.
pub(super) fn release_oldest(need: u64) -> u64 {
    let mut taken = Vec::new();
    let mut bytes = 0;
    {
        let mut g = state();
        let s = st!(g);
        while bytes < need {
            let Some(old) = s.pop_oldest() else {
                break;
            };
            bytes += old.size;
            taken.push(old);
        }
    }
    Q_EARLY.fetch_add(taken.len() as u64, Relaxed);
    release_batch(&taken, Release::Now);
    bytes
}

/// Before a reserved range is freed or mapped again, the held entries that overlap it are
/// released (verified, then really unmapped or freed) first. Guard mode's entries are never
/// held bytes: they stay in the index.
pub(super) fn release_overlapping(ptr: u64, size: u64) {
    let end = ptr.saturating_add(size.max(1));
    let mut taken = Vec::new();
    {
        let mut g = state();
        let s = st!(g);
        // Freed ranges never overlap one another: going down from `end`, the first that ends
        // at or below `ptr` is the last to look at.
        let overlapping: Vec<u64> = s
            .index
            .range(..end)
            .rev()
            .take_while(|(_, e)| e.ptr.saturating_add(e.size) > ptr)
            .filter(|(_, e)| e.held != Held::Guarded)
            .map(|(k, _)| *k)
            .collect();
        for k in overlapping {
            if let Some(e) = s.index.remove(&k) {
                s.held -= e.size;
                s.queue.retain(|q| q.ptr != k);
                taken.push(e);
            }
        }
    }
    release_batch(&taken, Release::Now);
}

/// Drops index entries inside [ptr, ptr+size): guard mode gave that address range back.
pub fn forget_range(ptr: u64, size: u64) {
    let mut g = state();
    let s = st!(g);
    let inside: Vec<u64> = s
        .index
        .range(ptr..ptr.saturating_add(size))
        .map(|(k, _)| *k)
        .collect();
    for k in inside {
        s.index.remove(&k);
    }
}

/// Looks up each word of `words` (all inside [`LOW`], [`HIGH`]) under one lock: `found(i, e)`
/// for each word `i` inside freed memory `e`.
pub fn lookup_each(words: &[u64], mut found: impl FnMut(usize, Entry)) {
    let hits: Vec<(usize, Entry)> = {
        let g = STATE.lock();
        let Some(s) = g.as_ref() else { return };
        words
            .iter()
            .enumerate()
            .filter_map(|(i, &addr)| {
                let (_, e) = s.index.range(..=addr).next_back()?;
                (addr < e.ptr + e.size).then_some((i, *e))
            })
            .collect()
    };
    // Called without the lock: `found` records and may wait for the writer.
    for (i, e) in hits {
        found(i, e);
    }
}

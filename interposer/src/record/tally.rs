//! Running counters over the records handed to the writer: events, device bytes live now and at
//! the peak, and the findings so far (stale writes, stale launches, frees of memory not
//! allocated). What `isolate_counters` (the hooks' C API) reports; nothing here decides anything.
//!
//! Layer: recording. Uses the base.

use crate::base::sys::ForkLock;
use isolate_trace::{Kind, Memory, Record, Retained};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Device and managed allocations by address, VMM physical memory by handle: bytes each. A list,
/// not one size: records reach the writer in the order their threads hand them over, not in
/// sequence order, so another thread's allocation of an address can come before the free that
/// gave it back (the analyzer puts them back in order; these counters cannot wait). The first
/// size inline, the rare others in a list: no heap allocation per allocation.
type Live = Option<FxHashMap<(bool, u64), (u64, Vec<u64>)>>;

static LIVE: ForkLock<Live> = ForkLock::new(None);
/// References to live handles taken by `cuMemRetainAllocationHandle` (NCCL's free): a release
/// that gives one back frees nothing.
static RETAINED: ForkLock<Option<Retained>> = ForkLock::new(None);
static EVENTS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
static WINDOW_PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static STALE_WRITES: AtomicU64 = AtomicU64::new(0);
static STALE_LAUNCHES: AtomicU64 = AtomicU64::new(0);
static INVALID_FREES: AtomicU64 = AtomicU64::new(0);
static FREED_IN_USE: AtomicU64 = AtomicU64::new(0);

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub events: u64,
    pub live_device_bytes: u64,
    pub peak_device_bytes: u64,
    /// The peak since the last [`reset_window_peak`] (since the start before the first).
    pub window_peak_device_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub stale_writes: u64,
    pub stale_launches: u64,
    pub invalid_frees: u64,
    /// Allocations freed while still in use on another stream (policy/order/).
    pub freed_in_use: u64,
}

pub fn get() -> Counters {
    Counters {
        events: EVENTS.load(Relaxed),
        live_device_bytes: LIVE_BYTES.load(Relaxed),
        peak_device_bytes: PEAK_BYTES.load(Relaxed),
        window_peak_device_bytes: WINDOW_PEAK_BYTES.load(Relaxed),
        device_allocs: ALLOCS.load(Relaxed),
        device_frees: FREES.load(Relaxed),
        stale_writes: STALE_WRITES.load(Relaxed),
        stale_launches: STALE_LAUNCHES.load(Relaxed),
        invalid_frees: INVALID_FREES.load(Relaxed),
        freed_in_use: FREED_IN_USE.load(Relaxed),
    }
}

/// Counts one record the writer accepted.
pub fn see(rec: &Record) {
    match rec {
        Record::Event(e) => {
            EVENTS.fetch_add(1, Relaxed);
            let kind = e.api.kind();
            if kind == Kind::Retain {
                if e.ok() && is_live((true, e.handle)) {
                    RETAINED.lock().get_or_insert_default().retain(e.handle);
                }
                return;
            }
            let key = match (kind, e.api.memory()) {
                (Kind::Alloc | Kind::Free, Memory::Device | Memory::Managed) => (false, e.ptr),
                (Kind::Create | Kind::Release, Memory::Virtual) => (true, e.handle),
                _ => return,
            };
            match kind {
                Kind::Alloc | Kind::Create if e.ok() && key.1 != 0 => added(key, e.size),
                Kind::Release
                    if e.ok() && RETAINED.lock().get_or_insert_default().release(e.handle) => {}
                Kind::Free | Kind::Release if key.1 != 0 => removed(key, e.ok()),
                _ => {}
            }
        }
        Record::Violation(_) => {
            STALE_WRITES.fetch_add(1, Relaxed);
        }
        Record::StaleLaunch(_) | Record::StaleValue(_) => {
            STALE_LAUNCHES.fetch_add(1, Relaxed);
        }
        Record::FreedInUse(_) => {
            FREED_IN_USE.fetch_add(1, Relaxed);
        }
        _ => {}
    }
}

fn added(key: (bool, u64), size: u64) {
    let mut live = LIVE.lock();
    match live.get_or_insert_with(FxHashMap::default).entry(key) {
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert((size, Vec::new()));
        }
        std::collections::hash_map::Entry::Occupied(mut o) => o.get_mut().1.push(size),
    }
    let now = LIVE_BYTES.load(Relaxed).saturating_add(size);
    LIVE_BYTES.store(now, Relaxed);
    PEAK_BYTES.fetch_max(now, Relaxed);
    WINDOW_PEAK_BYTES.fetch_max(now, Relaxed);
    ALLOCS.fetch_add(1, Relaxed);
}

/// A free: an invalid free is one the driver refused (the analyzer's rule too): a free the
/// driver accepted of memory not seen here is memory allocated before the trace, or an
/// allocation another thread has not handed over yet, never a finding.
fn removed(key: (bool, u64), ok: bool) {
    if !ok {
        INVALID_FREES.fetch_add(1, Relaxed);
        return;
    }
    FREES.fetch_add(1, Relaxed);
    let mut live = LIVE.lock();
    let map = live.get_or_insert_with(FxHashMap::default);
    let Some((first, rest)) = map.get_mut(&key) else {
        return;
    };
    // The oldest size goes first, as the list's order is the order they were handed over.
    let size = *first;
    if rest.is_empty() {
        map.remove(&key);
    } else {
        *first = rest.remove(0);
    }
    LIVE_BYTES.store(LIVE_BYTES.load(Relaxed).saturating_sub(size), Relaxed);
}

fn is_live(key: (bool, u64)) -> bool {
    LIVE.lock().as_ref().is_some_and(|m| m.contains_key(&key))
}

/// Starts a new window: its peak is the bytes live now.
pub fn reset_window_peak() {
    let live = LIVE.lock();
    WINDOW_PEAK_BYTES.store(LIVE_BYTES.load(Relaxed), Relaxed);
    drop(live);
}

/// In a fork child: its trace starts over, and so do the counters.
pub fn after_fork_child() {
    LIVE.reset_in_child(None);
    RETAINED.reset_in_child(None);
    for c in [
        &EVENTS,
        &LIVE_BYTES,
        &PEAK_BYTES,
        &WINDOW_PEAK_BYTES,
        &ALLOCS,
        &FREES,
        &STALE_WRITES,
        &STALE_LAUNCHES,
        &INVALID_FREES,
    ] {
        c.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolate_trace::{Api, Event};

    #[test]
    fn live_peak_and_invalid_frees() {
        let ev = |api, ptr, size| {
            Record::Event(Event {
                api,
                ptr,
                size,
                ..Event::default()
            })
        };
        let before = get();
        see(&ev(Api::CudaMalloc, 0x7000_0000, 100));
        see(&ev(Api::CudaMalloc, 0x7000_1000, 50));
        see(&ev(Api::CudaFree, 0x7000_0000, 0));
        // Accepted by the driver: memory from before the trace, not a finding.
        see(&ev(Api::CudaFree, 0x7000_2000, 0));
        see(&ev(Api::CudaFree, 0, 0));
        // Refused by the driver: an invalid (here double) free.
        see(&Record::Event(Event {
            api: Api::CudaFree,
            ptr: 0x7000_0000,
            result: 1,
            ..Event::default()
        }));
        // Another thread's allocation of an address handed over before the free that gave it
        // back: both are counted, nothing is lost.
        see(&ev(Api::CudaMalloc, 0x7000_3000, 10));
        see(&ev(Api::CudaMalloc, 0x7000_3000, 20));
        see(&ev(Api::CudaFree, 0x7000_3000, 0));
        let c = get();
        assert_eq!(c.events - before.events, 9);
        assert_eq!(c.live_device_bytes - before.live_device_bytes, 70);
        assert!(c.peak_device_bytes >= 150);
        assert_eq!(c.invalid_frees - before.invalid_frees, 1);

        // NCCL's free: a retained handle's first release gives the reference back (its memory
        // stays live, no free counted), the second is the handle's own.
        let handle = |api| {
            Record::Event(Event {
                api,
                handle: 0x5ca1_ab1e,
                size: 1000,
                ..Event::default()
            })
        };
        see(&handle(Api::CuMemCreate));
        see(&handle(Api::CuMemRetainAllocationHandle));
        see(&handle(Api::CuMemRelease));
        let mid = get();
        assert_eq!(mid.live_device_bytes - c.live_device_bytes, 1000);
        assert_eq!(mid.device_frees, c.device_frees);
        see(&handle(Api::CuMemRelease));
        let end = get();
        assert_eq!(end.live_device_bytes, c.live_device_bytes);
        assert_eq!(end.device_frees - c.device_frees, 1);
        assert_eq!(end.invalid_frees, c.invalid_frees);
    }
}

//! Checked allocations kept for the next stream-ordered allocation of the same size
//! (`ISOLATE_REUSE=on`, the default; measured on the H200: docs/gpu-results.md, "Sixth
//! session").
//!
//! An allocation from the device's default pool (`cudaMallocAsync`, `cuMemAllocAsync`) whose
//! quarantine ended and whose check has run is idle: all work queued before its free, its
//! poison and its check are done. Instead of `cuMemFreeAsync` on the release stream it can be
//! kept here, by (context, size), and handed to the next allocation of exactly that size on
//! any stream without a driver call: PyTorch's stream-ordered backend asks for the same sizes
//! every step, and each driver call costs microseconds (docs/gpu-results.md, "Fifth session").
//! The quarantine's guarantees do not change: only checked memory is kept, as the driver's pool
//! would have held it. Kept memory is bounded (a quarter of the quarantine budget, up to all of
//! it while the device has room to spare), given back to the driver when an allocation runs
//! out of memory, and no longer kept once the program sets a device's memory pool (its
//! allocations may then come from another pool).
//!
//! Layer: policies. Uses the base only.

use crate::base::sys::ForkLock;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

#[derive(Default)]
struct Cache {
    by: FxHashMap<(usize, u64), Vec<u64>>,
    bytes: u64,
}

static CACHE: ForkLock<Option<Cache>> = ForkLock::new(None);
/// Set once the program changed a device's memory pool: nothing is kept from then on.
static OFF: AtomicBool = AtomicBool::new(false);
/// Allocations running out of memory now: nothing is kept meanwhile (what their releases free
/// must reach the driver).
static SHORT: AtomicU64 = AtomicU64::new(0);
/// Allocations served from kept memory, and allocations kept (noted at exit).
static SERVED: AtomicU64 = AtomicU64::new(0);
static KEPT: AtomicU64 = AtomicU64::new(0);

/// Whether checked allocations are kept and served (`ISOLATE_REUSE=on`, no pool set since).
pub fn enabled() -> bool {
    crate::base::config::get().reuse && !OFF.load(Relaxed)
}

/// A kept allocation of exactly `size` bytes of context `ctx`, taken out of the cache.
pub fn take(ctx: usize, size: u64) -> Option<u64> {
    if ctx == 0 || size == 0 || !enabled() {
        return None;
    }
    let mut g = CACHE.lock();
    let c = g.as_mut()?;
    let ptr = c.by.get_mut(&(ctx, size))?.pop()?;
    c.bytes -= size;
    SERVED.fetch_add(1, Relaxed);
    Some(ptr)
}

/// Keeps the checked allocation `ptr` of `size` bytes of context `ctx`; false (the caller
/// frees it) when reuse is off or `cap` bytes are kept already.
pub fn keep(ctx: usize, size: u64, ptr: u64, cap: u64) -> bool {
    if ctx == 0 || size == 0 || !enabled() || SHORT.load(Relaxed) > 0 {
        return false;
    }
    let mut g = CACHE.lock();
    let c = g.get_or_insert_with(Cache::default);
    if c.bytes.saturating_add(size) > cap {
        return false;
    }
    c.by.entry((ctx, size)).or_default().push(ptr);
    c.bytes += size;
    KEPT.fetch_add(1, Relaxed);
    true
}

/// While the guard lives, nothing is kept (an allocation ran out of memory: see [`SHORT`]).
pub struct Short(());

impl Short {
    pub fn start() -> Short {
        SHORT.fetch_add(1, Relaxed);
        Short(())
    }
}

impl Drop for Short {
    fn drop(&mut self) {
        SHORT.fetch_sub(1, Relaxed);
    }
}

/// Every allocation kept for context `ctx`, taken out (to give back to the driver: an
/// allocation ran out of memory).
pub fn drain(ctx: usize) -> Vec<u64> {
    let mut g = CACHE.lock();
    let Some(c) = g.as_mut() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    c.by.retain(|&(cx, size), ptrs| {
        if cx != ctx {
            return true;
        }
        c.bytes -= size * ptrs.len() as u64;
        out.append(ptrs);
        false
    });
    out
}

/// The program set a device's memory pool: allocations may come from another pool now, so
/// nothing more is kept or served (what is kept goes back at the next shortage).
pub fn pool_set() {
    OFF.store(true, Relaxed);
}

/// (allocations served from kept memory, allocations kept) so far.
pub fn stats() -> (u64, u64) {
    (SERVED.load(Relaxed), KEPT.load(Relaxed))
}

/// In a fork child: the parent's allocations are not the child's to hand out.
pub fn after_fork_child() {
    CACHE.reset_in_child(None);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test, as the functions share the process's cache (reuse is on by default).
    #[test]
    fn kept_allocations_serve_exactly_their_size_and_context_within_the_cap() {
        assert!(keep(1, 64, 0x1000, 128));
        assert!(keep(2, 64, 0x2000, 128));
        // The cap: 128 bytes are kept already.
        assert!(!keep(1, 64, 0x3000, 128));
        // Nothing of context 0 or size 0 is kept.
        assert!(!keep(0, 64, 0x4000, u64::MAX));
        assert!(!keep(1, 0, 0x4000, u64::MAX));
        // Another context's or size's memory is not served.
        assert_eq!(take(3, 64), None);
        assert_eq!(take(1, 128), None);
        assert_eq!(take(1, 64), Some(0x1000));
        assert_eq!(take(1, 64), None);
        // While an allocation runs short, nothing is kept.
        {
            let _short = Short::start();
            assert!(!keep(1, 64, 0x1000, 128));
        }
        assert!(keep(1, 64, 0x1000, 128));
        assert_eq!(drain(1), vec![0x1000]);
        assert_eq!(drain(1), Vec::<u64>::new());
        assert_eq!(CACHE.lock().as_ref().unwrap().bytes, 64);
        assert_eq!(drain(2), vec![0x2000]);
        assert_eq!(CACHE.lock().as_ref().unwrap().bytes, 0);
        assert_eq!(stats(), (1, 3));
    }
}

use alloc::boxed::Box;

use crate::unwind_rule::UnwindRule;

// isolate: the upstream cache is direct-mapped with 509 slots (`address % 509`). Two return
// addresses of one stack that share a slot evict each other at every walk (a test of this
// repository saw one look-up in three miss with three call sites), and a program of PyTorch's
// size has thousands of return addresses. Here: 2048 sets of 4 ways (8192 entries, about
// 256 KiB a thread, allocated on the heap), the set chosen by a multiplicative hash.
const WAYS: usize = 4;
const SETS: usize = 2048;
const CACHE_ENTRY_COUNT: usize = WAYS * SETS;

pub struct RuleCache<R: UnwindRule> {
    entries: Box<[Option<CacheEntry<R>>]>,
    /// Per set: the way the next insert replaces when none is free (round robin).
    next: Box<[u8]>,
    stats: CacheStats,
}

impl<R: UnwindRule> RuleCache<R> {
    pub fn new() -> Self {
        Self {
            entries: alloc::vec![None; CACHE_ENTRY_COUNT].into_boxed_slice(),
            next: alloc::vec![0u8; SETS].into_boxed_slice(),
            stats: CacheStats::new(),
        }
    }

    fn set_of(address: u64) -> usize {
        (address.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SETS.trailing_zeros())) as usize
    }

    pub fn lookup(&mut self, address: u64, modules_generation: u16) -> CacheResult<R> {
        let set = Self::set_of(address);
        let ways = &self.entries[set * WAYS..(set + 1) * WAYS];
        let mut empty = false;
        let mut stale = false;
        for entry in ways {
            match entry {
                None => empty = true,
                Some(entry) if entry.address == address => {
                    if entry.modules_generation == modules_generation {
                        self.stats.hit_count += 1;
                        return CacheResult::Hit(entry.unwind_rule);
                    }
                    stale = true;
                }
                Some(_) => {}
            }
        }
        if stale {
            self.stats.miss_wrong_modules_count += 1;
        } else if empty {
            self.stats.miss_empty_slot_count += 1;
        } else {
            self.stats.miss_wrong_address_count += 1;
        }
        CacheResult::Miss(CacheHandle {
            slot: set as u16,
            address,
            modules_generation,
        })
    }

    pub fn insert(&mut self, handle: CacheHandle, unwind_rule: R) {
        let CacheHandle {
            slot,
            address,
            modules_generation,
        } = handle;
        let set = slot as usize;
        let ways = &mut self.entries[set * WAYS..(set + 1) * WAYS];
        // The same address (an entry of an older module generation), else a free way, else
        // the set's next victim.
        let way = ways
            .iter()
            .position(|e| matches!(e, Some(e) if e.address == address))
            .or_else(|| ways.iter().position(|e| e.is_none()))
            .unwrap_or_else(|| {
                let v = self.next[set] as usize % WAYS;
                self.next[set] = ((v + 1) % WAYS) as u8;
                v
            });
        ways[way] = Some(CacheEntry {
            address,
            modules_generation,
            unwind_rule,
        });
    }

    /// Returns a snapshot of the cache usage statistics.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

pub enum CacheResult<R: UnwindRule> {
    Miss(CacheHandle),
    Hit(R),
}

pub struct CacheHandle {
    slot: u16,
    address: u64,
    modules_generation: u16,
}

const _: () = assert!(
    SETS as u64 <= u16::MAX as u64 && SETS.is_power_of_two(),
    "u16 should be sufficient to store the cache set index"
);

#[derive(Clone, Copy, Debug)]
struct CacheEntry<R: UnwindRule> {
    address: u64,
    modules_generation: u16,
    unwind_rule: R,
}

/// Statistics about the effectiveness of the rule cache.
#[derive(Default, Debug, Clone, Copy)]
pub struct CacheStats {
    /// The number of successful cache hits.
    pub hit_count: u64,
    /// The number of cache misses that were due to an empty slot.
    pub miss_empty_slot_count: u64,
    /// The number of cache misses that were due to a filled slot whose module
    /// generation didn't match the unwinder's current module generation.
    /// (This means that either the unwinder's modules have changed since the
    /// rule in this slot was stored, or the same cache is used with multiple
    /// unwinders and the unwinders are stomping on each other's cache slots.)
    pub miss_wrong_modules_count: u64,
    /// The number of cache misses that were due to cache slot collisions of
    /// different addresses.
    pub miss_wrong_address_count: u64,
}

impl CacheStats {
    /// Create a new instance.
    pub fn new() -> Self {
        Default::default()
    }

    /// The number of total lookups.
    pub fn total(&self) -> u64 {
        self.hits() + self.misses()
    }

    /// The number of total hits.
    pub fn hits(&self) -> u64 {
        self.hit_count
    }

    /// The number of total misses.
    pub fn misses(&self) -> u64 {
        self.miss_empty_slot_count + self.miss_wrong_modules_count + self.miss_wrong_address_count
    }
}

#[cfg(test)]
mod tests {
    use crate::{aarch64::UnwindRuleAarch64, x86_64::UnwindRuleX86_64};

    use super::*;

    // Ensure that the size of Option<CacheEntry<UnwindRuleX86_64>> doesn't change by accident.
    #[test]
    fn test_cache_entry_size() {
        assert_eq!(
            core::mem::size_of::<Option<CacheEntry<UnwindRuleX86_64>>>(),
            16
        );
        assert_eq!(
            core::mem::size_of::<Option<CacheEntry<UnwindRuleAarch64>>>(),
            24 // <-- larger than we'd like
        );
    }
}

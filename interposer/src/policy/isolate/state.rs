//! The quarantine's state: what isolation handed out and still tracks ([`Live`]), what it holds
//! back ([`Entry`]: the queue, the index the launch check reads, the bytes held), and the
//! current context. Every other file of the folder reads and changes it under [`STATE`]'s lock.
//!
//! Layer: policies. Uses the base, recording and [`crate::policy::tier`] (an entry's pattern).

use crate::base::cu;
use crate::base::sys::{ForkLock, ForkLockGuard};
use crate::record::event;
use crate::record::profile::{self, Part};
use isolate_trace::{Api, Event};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;

/// An allocation isolation handed out and still tracks.
#[derive(Clone, Copy)]
pub(super) struct Live {
    pub(super) size: u64,
    pub(super) seq: u64,
    /// From a stream-ordered pool: counted in [`POOL_LIVE`].
    pub(super) pooled: bool,
    /// From the device's default pool (`cudaMallocAsync`, `cuMemAllocAsync`): what
    /// [`reuse`] may keep once checked.
    pub(super) default_pool: bool,
    /// Made on a stream capturing a graph: graph memory, which the graph owns (its free is
    /// the driver's to answer, never quarantined or poisoned).
    pub(super) captured: bool,
    /// The allocation event's stack id (0: no stack): what a finding about this memory names
    /// as where it was allocated. Free of cost in memory: it fills the struct's padding.
    pub(super) stack: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// Device or managed memory from an allocation call: really freed with `cuMemFree`.
    Allocation,
    /// A virtual-memory range the program unmapped: really unmapped on release.
    Mapping,
    /// A guard-mode allocation: unmapped at its free, its range reserved for good. Only in the
    /// index (for the launch check), never released or verified.
    Guarded,
}

/// A freed allocation held back.
#[derive(Clone, Copy)]
pub struct Entry {
    pub ptr: u64,
    pub size: u64,
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub free_ts: u64,
    pub free_api: Api,
    /// The stack ids of the allocation's event and of the free's (0: no stack, as with
    /// `ISOLATE_STACKS=none`, and for a mapping's allocation): written in the `Violation` and
    /// stale-launch records, so the analyzer needs not find the two events.
    pub alloc_stack: u32,
    pub free_stack: u32,
    pub(super) device: i32,
    pub(super) ctx: usize,
    /// Event recorded on the freeing stream after the poison, for stream-ordered frees
    /// (`ISOLATE_TEST_RELEASE=sync`: made for this entry, destroyed at its release).
    pub(super) event: usize,
    /// The freeing stream's event from [`release::mark`], recorded after this poison (shared by
    /// the stream's later frees, never destroyed): what the asynchronous release waits for.
    pub(super) mark: usize,
    /// The freeing stream (stream-ordered frees), whose event [`release::refresh`] records
    /// again before the check.
    pub(super) stream: usize,
    /// For an unordered free: the event of the stream that may still use the allocation
    /// ([`release::mark_use`]), which its check and release wait for too; else 0.
    pub(super) also: usize,
    pub(super) held: Held,
    /// As [`Live::default_pool`].
    pub(super) default_pool: bool,
    /// The pattern its poison wrote ([`crate::policy::tier`]: 0 every byte), which its check
    /// reads and no more.
    pub(super) shift: u8,
}

impl Entry {
    /// The length field of its check's descriptor (size and pattern).
    pub(super) fn field(&self) -> u64 {
        crate::policy::tier::encode(self.size, self.shift)
    }

    /// The bytes its poison wrote and its check reads.
    pub(super) fn touched(&self) -> u64 {
        crate::policy::tier::touched(self.size, self.shift)
    }
}

impl Entry {
    /// Guard mode's unmapped memory: any access through a pointer into it faults.
    pub fn guarded(&self) -> bool {
        self.held == Held::Guarded
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) live: FxHashMap<u64, Live>,
    /// The freed allocations held back: the queue (oldest first) and the index by start.
    pub(super) q: Quarantine,
    pub(super) held: u64,
    pub(super) budget: Option<u64>,
    /// When a budget shared with other processes ([`super::tenants`]) is counted again
    /// (`now_ns`); 0 for a budget that never changes.
    pub(super) budget_until: u64,
    /// Virtual-memory mappings made with `cuMemMap`, by start: what `cuMemUnmap` may hold back.
    pub(super) mapped: BTreeMap<u64, u64>,
    /// Physical handles made by this process's `cuMemCreate` and not yet released.
    pub(super) created: std::collections::HashSet<u64>,
    /// References to `created` handles taken by `cuMemRetainAllocationHandle` and not given back.
    pub(super) retained: isolate_trace::Retained,
}

/// Where the index finds an entry: its size (what the launch check's range test reads) and its
/// slot.
#[derive(Clone, Copy)]
struct At {
    size: u64,
    slot: u32,
}

/// The freed allocations held back. Each entry is kept once, in a slab; the queue (oldest
/// first: what the budget releases) and the index (by start: what the launch check and a
/// second free look up) name its slot. Every free inserts into both and every release takes
/// out of both, on the program's threads, in a step whose hooks run with cold caches: the
/// index held whole entries before (96 bytes each, 1.1 KiB a B-tree node, half of it moved by
/// an insert), and the queue a second copy.
#[derive(Default)]
pub(super) struct Quarantine {
    entries: Vec<Entry>,
    /// Slots of `entries` free for the next entry (the last freed first: its line is warm).
    vacant: Vec<u32>,
    queue: VecDeque<u32>,
    index: BTreeMap<u64, At>,
}

impl Quarantine {
    fn put(&mut self, e: Entry) -> u32 {
        match self.vacant.pop() {
            Some(slot) => {
                self.entries[slot as usize] = e;
                slot
            }
            None => {
                self.entries.push(e);
                (self.entries.len() - 1) as u32
            }
        }
    }

    /// `e` held back: in the queue and the index.
    pub(super) fn push(&mut self, e: Entry) {
        let slot = self.put(e);
        self.index.insert(e.ptr, At { size: e.size, slot });
        self.queue.push_back(slot);
    }

    /// `e` in the index alone (guard mode's: never released).
    pub(super) fn index_only(&mut self, e: Entry) {
        let slot = self.put(e);
        self.index.insert(e.ptr, At { size: e.size, slot });
    }

    /// Takes the oldest held entry out of the queue and the index.
    pub(super) fn pop_oldest(&mut self) -> Option<Entry> {
        let slot = self.queue.pop_front()?;
        let e = self.entries[slot as usize];
        self.vacant.push(slot);
        // Unless [`Quarantine::forget`] took it out of the index already.
        if self.index.get(&e.ptr).is_some_and(|at| at.slot == slot) {
            self.index.remove(&e.ptr);
        }
        Some(e)
    }

    /// Whether a range starting at `ptr` is held.
    pub(super) fn contains(&self, ptr: u64) -> bool {
        self.index.contains_key(&ptr)
    }

    /// The held range that `addr` is inside of, if any.
    pub(super) fn find(&self, addr: u64) -> Option<&Entry> {
        let (&start, at) = self.index.range(..=addr).next_back()?;
        (addr < start + at.size).then(|| &self.entries[at.slot as usize])
    }

    /// Takes out of the queue and the index the held entries (not guard mode's) that overlap
    /// [`ptr`, `end`): freed ranges never overlap one another, so going down from `end` the
    /// first that ends at or below `ptr` is the last to look at.
    pub(super) fn take_overlapping(&mut self, ptr: u64, end: u64) -> Vec<Entry> {
        let overlapping: Vec<(u64, u32)> = self
            .index
            .range(..end)
            .rev()
            .take_while(|&(&start, at)| start.saturating_add(at.size) > ptr)
            .filter(|(_, at)| self.entries[at.slot as usize].held != Held::Guarded)
            .map(|(&start, at)| (start, at.slot))
            .collect();
        let mut taken = Vec::with_capacity(overlapping.len());
        for (start, slot) in overlapping {
            self.index.remove(&start);
            self.queue.retain(|&q| q != slot);
            self.vacant.push(slot);
            taken.push(self.entries[slot as usize]);
        }
        taken
    }

    /// Takes the index's entries that start inside [`ptr`, `end`) out of it (guard mode gave
    /// the range back). A held entry among them stays in the queue, to be released as before.
    pub(super) fn forget(&mut self, ptr: u64, end: u64) {
        let inside: Vec<(u64, u32)> = self
            .index
            .range(ptr..end)
            .map(|(&start, at)| (start, at.slot))
            .collect();
        for (start, slot) in inside {
            self.index.remove(&start);
            if self.entries[slot as usize].held == Held::Guarded {
                self.vacant.push(slot);
            }
        }
    }

    /// The held entries, oldest first (they stay).
    pub(super) fn held(&self) -> Vec<Entry> {
        self.queue
            .iter()
            .map(|&slot| self.entries[slot as usize])
            .collect()
    }

    /// Empties it: the held entries, oldest first.
    pub(super) fn take_all(&mut self) -> Vec<Entry> {
        let held = self.held();
        *self = Quarantine::default();
        held
    }
}

pub(super) static STATE: ForkLock<Option<State>> = ForkLock::new(None);

/// Lowest start and highest end ever quarantined: a cheap first test for the launch check.
pub static LOW: AtomicU64 = AtomicU64::new(u64::MAX);

pub static HIGH: AtomicU64 = AtomicU64::new(0);

impl State {
    /// Takes the oldest entry out of quarantine (queue, index and byte count together).
    pub(super) fn pop_oldest(&mut self) -> Option<Entry> {
        let old = self.q.pop_oldest()?;
        self.held -= old.size;
        Some(old)
    }
}

pub(super) fn state() -> ForkLockGuard<'static, Option<State>> {
    let mut g = STATE.lock();
    if g.is_none() {
        *g = Some(State::default());
    }
    g
}

macro_rules! st {
    ($g:expr) => {
        $g.as_mut().expect("state initialised by state()")
    };
}
pub(super) use st;

/// The quarantine entry of the allocation `live` (a mapping: no allocation event) that the
/// free `proto` (event `seq`, stack `free_stack`) gave back at `free_ts` (`now_ns`, read by
/// the caller, which times what follows from there), in context `ctx` (current).
#[allow(clippy::too_many_arguments)]
pub(super) fn freed(
    proto: &Event,
    live: Live,
    seq: u64,
    free_stack: u32,
    held: Held,
    free_ts: u64,
    ctx: usize,
) -> Entry {
    Entry {
        ptr: proto.ptr,
        size: live.size,
        alloc_seq: live.seq,
        free_seq: seq,
        free_ts,
        free_api: proto.api,
        alloc_stack: live.stack,
        free_stack,
        device: event::device_of(ctx),
        ctx,
        event: 0,
        mark: 0,
        stream: proto.stream as usize,
        also: 0,
        held,
        default_pool: live.default_pool,
        shift: 0,
    }
}

pub fn current_ctx() -> usize {
    profile::timed(Part::Context, || {
        cu::ctx_get_current().unwrap_or(std::ptr::null_mut()) as usize
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each tracked allocation and each held one costs: the stack ids fill `Live`'s
    /// padding (24 bytes, as without them) and add 8 bytes to an `Entry` (80 before), which
    /// the queue and the index each hold; an unordered free's use event 8 more (96).
    fn entry(ptr: u64, size: u64, held: Held) -> Entry {
        Entry {
            ptr,
            size,
            alloc_seq: ptr,
            free_seq: ptr + 1,
            free_ts: 0,
            free_api: Api::CudaFreeAsync,
            alloc_stack: 0,
            free_stack: 0,
            device: 0,
            ctx: 0,
            event: 0,
            mark: 0,
            stream: 0,
            also: 0,
            held,
            default_pool: true,
            shift: 0,
        }
    }

    fn ptrs(v: &[Entry]) -> Vec<u64> {
        v.iter().map(|e| e.ptr).collect()
    }

    /// The queue and the index name each entry's slot: what one finds the other takes out,
    /// a slot freed is used again, and an entry out of order leaves both.
    #[test]
    fn the_quarantine_keeps_each_entry_once_and_both_views_agree() {
        let mut q = Quarantine::default();
        for (i, p) in [0x3000u64, 0x1000, 0x5000].into_iter().enumerate() {
            q.push(entry(p, 0x100 * (i as u64 + 1), Held::Allocation));
        }
        q.index_only(entry(0x9000, 0x1000, Held::Guarded));
        assert_eq!(q.find(0x11ff).map(|e| e.ptr), Some(0x1000));
        assert!(q.find(0x1200).is_none(), "past its end");
        assert_eq!(q.find(0x30ff).map(|e| e.ptr), Some(0x3000));
        assert_eq!(q.find(0x9fff).map(|e| e.ptr), Some(0x9000));
        assert!(q.contains(0x5000) && !q.contains(0x5001));
        assert_eq!(
            ptrs(&q.held()),
            [0x3000, 0x1000, 0x5000],
            "oldest first, guard mode's not held"
        );

        assert_eq!(q.pop_oldest().map(|e| e.ptr), Some(0x3000));
        assert!(q.find(0x3000).is_none() && !q.contains(0x3000));
        // Its slot is the next entry's.
        q.push(entry(0x7000, 0x100, Held::Allocation));
        assert_eq!(q.entries.len(), 4, "a freed slot is used again");
        assert_eq!(q.find(0x7080).map(|e| e.ptr), Some(0x7000));
        assert_eq!(ptrs(&q.held()), [0x1000, 0x5000, 0x7000]);

        // Out of order: the one overlapping [0x50f0, 0x5200) leaves the queue and the index;
        // guard mode's stays.
        let taken = q.take_overlapping(0x50f0, 0x5200);
        assert_eq!(ptrs(&taken), [0x5000]);
        assert_eq!(
            q.take_overlapping(0x9000, 0xa000).len(),
            0,
            "guard mode's is never taken"
        );
        assert_eq!(ptrs(&q.held()), [0x1000, 0x7000]);
        assert!(q.find(0x5000).is_none());

        // Forgotten by the index while held: the queue still releases it, and its release
        // leaves alone a newer entry at the same start.
        q.forget(0x1000, 0x1001);
        assert!(q.find(0x1000).is_none());
        q.index_only(entry(0x1000, 0x40, Held::Guarded));
        assert_eq!(
            q.pop_oldest().map(|e| (e.ptr, e.size)),
            Some((0x1000, 0x200))
        );
        assert_eq!(
            q.find(0x1000).map(|e| e.size),
            Some(0x40),
            "the newer entry stays"
        );
        q.forget(0x1000, 0x1001);
        assert!(q.find(0x1000).is_none());

        assert_eq!(ptrs(&q.take_all()), [0x7000]);
        assert!(q.pop_oldest().is_none() && q.find(0x9000).is_none());
    }

    #[test]
    fn the_stack_ids_cost_live_nothing_and_an_entry_8_bytes() {
        assert_eq!(std::mem::size_of::<Live>(), 24);
        assert_eq!(std::mem::size_of::<Entry>(), 96);
    }
}

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
    pub(super) queue: VecDeque<Entry>,
    /// Quarantined ranges by start address: what the launch check looks up.
    pub(super) index: BTreeMap<u64, Entry>,
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

pub(super) static STATE: ForkLock<Option<State>> = ForkLock::new(None);

/// Lowest start and highest end ever quarantined: a cheap first test for the launch check.
pub static LOW: AtomicU64 = AtomicU64::new(u64::MAX);

pub static HIGH: AtomicU64 = AtomicU64::new(0);

impl State {
    /// Takes the oldest entry out of quarantine (queue, index and byte count together).
    pub(super) fn pop_oldest(&mut self) -> Option<Entry> {
        let old = self.queue.pop_front()?;
        self.held -= old.size;
        self.index.remove(&old.ptr);
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
/// the caller, which times what follows from there).
pub(super) fn freed(
    proto: &Event,
    live: Live,
    seq: u64,
    free_stack: u32,
    held: Held,
    free_ts: u64,
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
        device: event::current_device(),
        ctx: current_ctx(),
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
    #[test]
    fn the_stack_ids_cost_live_nothing_and_an_entry_8_bytes() {
        assert_eq!(std::mem::size_of::<Live>(), 24);
        assert_eq!(std::mem::size_of::<Entry>(), 96);
    }
}

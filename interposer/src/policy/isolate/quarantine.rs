//! The quarantine and its budget: a freed entry goes in (queue and index); over the budget the
//! oldest go out, down to 80% of it; while the device is short of free memory (below the
//! library's reserve: other processes share it, and the driver needs room of its own) the
//! budget shrinks until it is not; an allocation that ran out of memory takes the oldest out
//! at once; held ranges overlapping a reused reservation go out first. The launch check looks
//! words up in its index.
//!
//! Layer: policies. Uses the base, recording and the folder's state, release paths and exit
//! check.

use super::counters::{BUDGET, PRESSURE_BYTES, PRESSURE_CUTS, TENANTS_MAX};
use super::exit::{ATEXIT, EXIT_OWNER};
use super::keeper;
use super::leave::{Release, device_memory, free_to_driver, release_batch, trim_default_pool};
use super::state::{Entry, HIGH, LOW, STATE, State, st, state};
use crate::base::config::{self, Budget};
use crate::base::cu;
use crate::base::sys::{coarse_ns, now_ns, raise, widen};
use crate::policy::reuse;
use crate::record::profile::{self, Part};
use crate::record::writer::{Q_EARLY, Q_PEAK};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// The quarantine's budget: `ISOLATE_QUARANTINE`'s bytes, or its share of the device split
/// among the isolate-mode processes using it (`ISOLATE_TENANTS=share`: counted again at most
/// once a second, [`super::tenants`]).
pub(super) fn budget(s: &mut State, device: i32) -> u64 {
    if let Some(b) = s.budget
        && (s.budget_until == 0 || coarse_ns() < s.budget_until)
    {
        return b;
    }
    let b = match config::get().quarantine {
        Budget::Bytes(b) => b,
        Budget::Percent(pct) => {
            let mut total = cu::device_total_mem(device.max(0)).unwrap_or(0);
            if total == 0 {
                total = 8 << 30;
            }
            let share = (total as f64 * pct / 100.0) as u64;
            if config::get().tenants_share {
                let n = super::tenants::count(device);
                TENANTS_MAX.fetch_max(n, Relaxed);
                s.budget_until = now_ns() + 1_000_000_000;
                share / n
            } else {
                share
            }
        }
    };
    BUDGET.store(b, Relaxed);
    s.budget = Some(b);
    b
}

/// The most entries one free takes out of quarantine over the budget. Down to 80% of the
/// budget in one batch was 70,000 entries for a 256 MiB quarantine of 768-byte blocks, one
/// `cudaFree` of 1.2-1.4 s on the stand-in (1.5 s in the issue); in steps of this many (one
/// verification round trip each), the
/// frees that follow go on until 80% is reached (the quarantine never grows meanwhile: each
/// adds one entry and takes out up to this many).
pub(super) const TRIM_STEP: usize = 256;

/// Set (under the state's lock) from the free that went over the budget until the quarantine
/// is down to 80% of it.
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// Frees and releases in progress: memory that is no longer live and not yet in quarantine,
/// or taken out of quarantine and not yet handed on (to the release stream's queue, or freed).
/// An allocation that runs out of memory looks in neither place for it, so it waits for those
/// in progress when it started ([`wait_for_leaving`]). [`LEFT`] counts those finished.
static LEAVING: AtomicU64 = AtomicU64::new(0);
static LEFT: AtomicU64 = AtomicU64::new(0);

/// One free or release in progress while it lives (see [`LEAVING`]).
pub(super) struct Leaving(());

impl Leaving {
    /// Made while the state's lock is held, where the memory stops being live or leaves
    /// quarantine.
    pub(super) fn start() -> Leaving {
        LEAVING.fetch_add(1, AcqRel);
        Leaving(())
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        LEFT.fetch_add(1, AcqRel);
        LEAVING.fetch_sub(1, AcqRel);
    }
}

/// Releases `taken` (already out of quarantine, counted by `leaving`) the way `how` says.
fn hand_on(taken: &[Entry], how: Release, leaving: Option<Leaving>) {
    if !taken.is_empty() {
        release_batch(taken, how);
    }
    drop(leaving);
}

/// In a fork child: the parent's frees and releases in progress are not the child's.
pub(super) fn after_fork_child() {
    LEAVING.store(0, Release);
    LEFT.store(0, Release);
    TRIMMING.store(false, Relaxed);
    TRIM_QUEUED.store(false, Release);
}

/// Waits (at most `max_ns`) until the frees and releases in progress now have finished, or as
/// many others: false when the time ran out. Never waits on itself: a thread allocating holds
/// none.
pub(super) fn wait_for_leaving(max_ns: u64) -> bool {
    let busy = LEAVING.load(Acquire);
    if busy == 0 {
        return true;
    }
    let left = LEFT.load(Acquire);
    let t0 = crate::base::sys::now_ns();
    while LEAVING.load(Acquire) != 0 && LEFT.load(Acquire).wrapping_sub(left) < busy {
        if crate::base::sys::now_ns().saturating_sub(t0) > max_ns {
            return false;
        }
        crate::base::sys::nap(20_000);
    }
    true
}

/// How often the freeing path asks the driver whether the device is short of free memory (one
/// `cuMemGetInfo`, on the clock of the frees).
const PRESSURE_EVERY_NS: u64 = 20_000_000;
static PRESSURE_AT: AtomicU64 = AtomicU64::new(0);
/// The quarantine's limit while the device is short of free memory; `u64::MAX` while it is not.
static PRESSURE_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// The device memory the library leaves free for everyone else (`ISOLATE_RESERVE`; by default
/// a sixteenth of the device, at least 1 GiB, at most a quarter: a small device). Other
/// processes share the device (four model processes on one 80 GiB H100, each with its quarter
/// for a quarantine, filled it: GPT-2 failed with "out of memory" in a kernel launch, whose
/// lazily loaded module the driver had no room for), and the driver needs room of its own
/// that no allocation asks for.
pub(super) fn reserve(total: u64) -> u64 {
    match config::get().reserve {
        None => (total / 16).max(1 << 30).min(total / 4),
        Some(Budget::Bytes(b)) => b,
        Some(Budget::Percent(p)) => (total as f64 * p / 100.0) as u64,
    }
}

/// Whether the device is short of free memory, asked at most every [`PRESSURE_EVERY_NS`]
/// (`now`: the free's time, on context `ctx`): the bytes by which its free memory is below
/// [`reserve`], after the memory kept for reuse was given back and the default pool trimmed
/// (neither is quarantine; what was given back reaches the device once the release stream has
/// run, so the next ask sees it). `None` when it is not short or was not asked.
fn short_of_memory(now: u64, ctx: usize) -> Option<u64> {
    if config::get().reserve_off() {
        return None; // not asked at all
    }
    let last = PRESSURE_AT.load(Relaxed);
    if now.saturating_sub(last) < PRESSURE_EVERY_NS
        || PRESSURE_AT
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_err()
    {
        return None;
    }
    let (free, total) = device_memory()?;
    let reserve = reserve(total);
    keeper::room(free >= reserve);
    if free >= reserve {
        PRESSURE_LIMIT.store(u64::MAX, Relaxed);
        return None;
    }
    let kept = reuse::drain(ctx);
    free_to_driver(ctx, &kept, false);
    trim_default_pool();
    Some(reserve - free)
}

pub(super) fn quarantine(entry: Entry) {
    // Read before written: a write every free would take the line from the other threads
    // that free (and LOW, HIGH and the peak below from every launch that reads them).
    if !ATEXIT.load(Relaxed) && !ATEXIT.swap(true, AcqRel) {
        // The exit check itself is registered by the policies' free (`policy::call`).
        // SAFETY: getpid has no preconditions.
        EXIT_OWNER.store(unsafe { libc::getpid() } as u32, Release);
    }
    // Probed by the keeper (or here, where it does not run).
    let short = keeper::freed(entry.free_ts, entry.ctx, short_of_memory);
    let (trimming, by_this_free) = {
        let mut g = state();
        let s = st!(g);
        s.held += entry.size;
        raise(&Q_PEAK, s.held);
        // Written only where they change: every launch reads them.
        widen(&LOW, &HIGH, entry.ptr, entry.ptr + entry.size);
        s.q.push(entry);
        if let Some(short) = short {
            // Twice what the device lacks, so that the next ask finds it above the reserve.
            PRESSURE_LIMIT.store(s.held.saturating_sub(short.saturating_mul(2)), Relaxed);
            PRESSURE_CUTS.fetch_add(1, Relaxed);
        }
        let (budget, limit) = limits(s, entry.device);
        if s.held > limit {
            TRIMMING.store(true, Relaxed);
        }
        let trimming = TRIMMING.load(Relaxed);
        // Past the slack, this free trims a step whoever else does; and while the limit is
        // cut for the device's sake, as before the keeper.
        let over_slack = s.held > limit.saturating_add(limit / SLACK);
        (
            trimming && (over_slack || !TRIM_QUEUED.load(Acquire)),
            limit < budget || over_slack,
        )
    };
    if !trimming {
        return;
    }
    // Over budget: the keeper takes the oldest out and releases them, down to 80% of the
    // budget (taking out 256 entries was ~50 µs of index work under the state's lock: the
    // freeing thread's longest calls after the releases had gone to the keeper), while the
    // frees go on. Where it cannot, where the limit is cut, and where the quarantine has gone
    // past the budget by more than the slack meanwhile (the keeper is behind), this free does
    // one step of it, as before the keeper.
    if !by_this_free
        && TRIM_QUEUED
            .compare_exchange(false, true, AcqRel, Acquire)
            .is_ok()
    {
        let device = entry.device;
        let job = Box::new(move || {
            // Cleared however the trim ends (a panic stays on the keeper).
            struct Queued;
            impl Drop for Queued {
                fn drop(&mut self) {
                    TRIM_QUEUED.store(false, Release);
                }
            }
            let _queued = Queued;
            trim(device);
        });
        match keeper::offer(entry.ctx, job) {
            Ok(()) => return,
            Err(_) => TRIM_QUEUED.store(false, Release), // declined, unrun: it held nothing
        }
    }
    let (over, leaving, _) = trim_step(entry.device);
    if !over.is_empty() {
        profile::timed(Part::Release, || hand_on(&over, Release::Budget, leaving));
    }
}

/// A trim is queued for the keeper: the frees meanwhile leave the quarantine's oldest to it,
/// up to the slack.
static TRIM_QUEUED: AtomicBool = AtomicBool::new(false);

/// How far past its limit the quarantine may go while the keeper trims it: an eighth of the
/// limit (the stand-in's four threads on a 4 MiB budget, freeing faster than its host-run
/// device checked, took the quarantine to 20–38 MiB without one). Past it every free trims a
/// step itself, as before the keeper.
const SLACK: u64 = 8;

/// The quarantine's budget and its limit now: the budget, cut while the device is short of
/// memory.
fn limits(s: &mut State, device: i32) -> (u64, u64) {
    let budget = budget(s, device);
    (budget, budget.min(PRESSURE_LIMIT.load(Relaxed)))
}

/// The most entries one hold of the state's lock takes out of quarantine in a trim step: the
/// step's [`TRIM_STEP`] in one hold kept the lock 50-56 µs on the stand-in (the index's work;
/// 7-10 µs in 32s), and every hook of the program's threads that takes it (an allocation's live map,
/// a free's quarantining, a launch's look-ups) waited that long behind the keeper: the
/// H100's profile counted 68 live-map calls a run over 20 µs, 8 of its 19 ms
/// (docs/performance.md, twenty-ninth session).
const TRIM_CHUNK: usize = 32;

/// One step of the trim over the budget (while [`TRIMMING`]): at most [`TRIM_STEP`] of the
/// oldest taken out of quarantine, [`TRIM_CHUNK`] a hold of the state's lock, down to 80% of
/// the limit (each step verified with one round trip); the entries, what counts them as
/// leaving (from the first hold that took one: an allocation that runs out of memory from then
/// on waits for them), and whether the trim is done.
fn trim_step(device: i32) -> (Vec<Entry>, Option<Leaving>, bool) {
    let mut over = Vec::new();
    let mut leaving = None;
    loop {
        let mut g = state();
        let _hold = profile::PartSpan::start(Part::TrimHold);
        let s = st!(g);
        if !TRIMMING.load(Relaxed) {
            break;
        }
        let (budget, limit) = limits(s, device);
        let low_water = limit / 10 * 8;
        let before = over.len();
        while s.held > low_water && over.len() < TRIM_STEP && over.len() - before < TRIM_CHUNK {
            let Some(old) = s.pop_oldest() else {
                break;
            };
            over.push(old);
        }
        let took = over.len() - before;
        if took > 0 && leaving.is_none() {
            leaving = Some(Leaving::start());
        }
        if limit < budget {
            PRESSURE_BYTES.fetch_add(over[before..].iter().map(|e| e.size).sum(), Relaxed);
        }
        let low = s.held <= low_water;
        if low {
            TRIMMING.store(false, Relaxed);
        }
        if low || took < TRIM_CHUNK || over.len() >= TRIM_STEP {
            break; // down to the low water, nothing more to take, or the step's whole
        }
    }
    (over, leaving, !TRIMMING.load(Relaxed))
}

/// The whole trim, step by step (the keeper's job).
fn trim(device: i32) {
    loop {
        let (over, leaving, done) = trim_step(device);
        let empty = over.is_empty();
        if !empty {
            hand_on(&over, Release::Budget, leaving);
        }
        if done || empty {
            break;
        }
    }
}

/// A guard-mode free: in the index for the launch check, never released, never verified
/// (the memory is unmapped: any access faults).
pub(super) fn quarantine_index_only(entry: Entry) {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    let _ = EXIT_OWNER.compare_exchange(0, me, AcqRel, Acquire);
    widen(&LOW, &HIGH, entry.ptr, entry.ptr + entry.size);
    st!(state()).q.index_only(entry);
}

/// Releases the oldest entries until at least `need` bytes are free; returns the bytes released.
/// Only for an allocation that ran out of memory, so every release is counted as early.
pub(super) fn release_oldest(need: u64) -> u64 {
    let mut taken = Vec::new();
    let mut bytes = 0;
    let leaving = {
        let mut g = state();
        let s = st!(g);
        while bytes < need {
            let Some(old) = s.pop_oldest() else {
                break;
            };
            bytes += old.size;
            taken.push(old);
        }
        (!taken.is_empty()).then(Leaving::start)
    };
    Q_EARLY.fetch_add(taken.len() as u64, Relaxed);
    hand_on(&taken, Release::Now, leaving);
    bytes
}

/// Before a reserved range is freed or mapped again, the held entries that overlap it are
/// released (verified, then really unmapped or freed) first. Guard mode's entries are never
/// held bytes: they stay in the index.
pub(super) fn release_overlapping(ptr: u64, size: u64) {
    let end = ptr.saturating_add(size.max(1));
    let taken = {
        let mut g = state();
        let s = st!(g);
        let taken = s.q.take_overlapping(ptr, end);
        s.held -= taken.iter().map(|e| e.size).sum::<u64>();
        taken
    };
    release_batch(&taken, Release::Now);
}

/// Drops index entries inside [ptr, ptr+size): guard mode gave that address range back.
pub fn forget_range(ptr: u64, size: u64) {
    st!(state()).q.forget(ptr, ptr.saturating_add(size));
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
                // A live allocation's start (most pointer words of a launch: its tensors) is in
                // no quarantined range, which never overlaps live memory: one hash look-up
                // instead of the ordered index's walk.
                if s.live.contains_key(&addr) {
                    return None;
                }
                s.q.find(addr).map(|e| (i, *e))
            })
            .collect()
    };
    // Called without the lock: `found` records and may wait for the writer.
    for (i, e) in hits {
        found(i, e);
    }
}

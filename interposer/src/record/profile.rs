//! Where the calling threads' time goes in the hooks (`ISOLATE_PROFILE=on`; off by default):
//! for each kind of hooked call, how many ran, how long the hook took in all, and how much of
//! that was the real function. The rest is the library's own time (its bookkeeping, stacks,
//! recording, and the driver calls it makes itself, such as the deferred poisons it queues
//! before a launch). Noted in the trace at exit; `isolate summary` shows the note.
//!
//! A second note splits the library's share by part ([`Part`]: stacks, records, quarantine,
//! releases, …), each timed where it runs.
//!
//! Off, each hook pays one relaxed load of the configuration. On, two clock reads per hook, two
//! around the real call and two per part (~40–60 ns a pair on the H200's host), counted in the
//! figures it reports.
//!
//! Layer: recording. Uses the base.

use crate::base::sys::now_ns;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The kinds of hooked call, as the note names them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Class {
    /// Recorded calls that hand memory out.
    Alloc = 0,
    /// Recorded calls that give an allocation back.
    Free = 1,
    /// Other recorded calls (mappings, handles, host memory, pools).
    Other = 2,
    /// Kernel launches.
    Launch = 3,
    /// Other work on a stream (copies, sets, event records, graphs, waits).
    StreamWork = 4,
    /// Part of the above: queueing the deferred poisons before the work.
    Flush = 5,
}

const CLASSES: usize = 6;
const NAMES: [&str; CLASSES] = [
    "allocations",
    "frees",
    "other recorded calls",
    "launches",
    "other stream work",
    "of which queueing deferred poisons",
];

static CALLS: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];
static TOTAL_NS: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];
static REAL_NS: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];

thread_local! {
    /// The class of the hook running on this thread (for [`real`]).
    static CURRENT: Cell<u8> = const { Cell::new(0) };
}

/// Whether hooks are timed (`ISOLATE_PROFILE=on`).
#[inline]
pub fn on() -> bool {
    crate::base::config::get().profile
}

/// Times one hook from now until it is dropped.
pub struct Span {
    class: Class,
    t0: u64,
    /// The class of the hook this one runs inside, if any (a launch from inside a runtime
    /// call), put back when this one ends.
    outer: u8,
}

/// Starts timing a hook of `class` (a no-op when profiling is off).
#[inline]
pub fn span(class: Class) -> Span {
    if !on() {
        return Span {
            class,
            t0: 0,
            outer: 0,
        };
    }
    let outer = CURRENT.try_with(|c| c.replace(class as u8)).unwrap_or(0);
    Span {
        class,
        t0: now_ns(),
        outer,
    }
}

impl Drop for Span {
    #[inline]
    fn drop(&mut self) {
        if self.t0 != 0 {
            let i = self.class as usize;
            CALLS[i].fetch_add(1, Relaxed);
            TOTAL_NS[i].fetch_add(now_ns().saturating_sub(self.t0), Relaxed);
            let _ = CURRENT.try_with(|c| c.set(self.outer));
        }
    }
}

/// The time of a frequent piece of work, for an exit note, at a fraction of the clock reads:
/// the first [`Sampled::FIRST`] timed, then one in [`Sampled::EVERY`], the rest estimated from
/// those (two clock reads each at 18–45 ns, where the work takes 0.3–5 µs).
pub struct Sampled {
    n: AtomicU64,
    first_ns: AtomicU64,
    sampled_ns: AtomicU64,
}

/// A started [`Sampled`]: `t0` is 0 where this one is not timed.
pub struct Sample {
    n: u64,
    t0: u64,
}

impl Sample {
    /// When it started ([`now_ns`]), where it is timed: a caller that needs the time anyway
    /// reads the clock once.
    #[inline]
    pub fn started(&self) -> Option<u64> {
        (self.t0 != 0).then_some(self.t0)
    }
}

impl Sampled {
    pub const FIRST: u64 = 16;
    pub const EVERY: u64 = 16;

    pub const fn new() -> Sampled {
        Sampled {
            n: AtomicU64::new(0),
            first_ns: AtomicU64::new(0),
            sampled_ns: AtomicU64::new(0),
        }
    }

    /// Counts one and starts its clock where it is one of those timed.
    #[inline]
    pub fn start(&self) -> Sample {
        let n = self.n.fetch_add(1, Relaxed);
        let timed = n < Self::FIRST || n.is_multiple_of(Self::EVERY);
        Sample {
            n,
            t0: if timed { now_ns() } else { 0 },
        }
    }

    /// Ends `s`, adding its time where it was timed.
    #[inline]
    pub fn stop(&self, s: Sample) {
        if s.t0 == 0 {
            return;
        }
        let ns = now_ns().saturating_sub(s.t0);
        if s.n < Self::FIRST {
            self.first_ns.fetch_add(ns, Relaxed);
        } else {
            self.sampled_ns.fetch_add(ns, Relaxed);
        }
    }

    /// How many were counted and their estimated time (ns): the first [`Sampled::FIRST`] as
    /// measured, the rest scaled from the one in [`Sampled::EVERY`] timed.
    pub fn total(&self) -> (u64, u64) {
        let n = self.n.load(Relaxed);
        (
            n,
            estimate(
                n,
                self.first_ns.load(Relaxed),
                self.sampled_ns.load(Relaxed),
            ),
        )
    }
}

/// The time of `n` pieces of work of which the first [`Sampled::FIRST`] took `first_ns` and the
/// ones timed after them (the multiples of [`Sampled::EVERY`] in `FIRST..n`) `sampled_ns`.
fn estimate(n: u64, first_ns: u64, sampled_ns: u64) -> u64 {
    let rest = n.saturating_sub(Sampled::FIRST);
    let timed = (n.saturating_sub(1) / Sampled::EVERY)
        .saturating_sub((Sampled::FIRST - 1) / Sampled::EVERY);
    if rest == 0 || timed == 0 {
        return first_ns;
    }
    first_ns + (sampled_ns as u128 * rest as u128 / timed as u128) as u64
}

#[cfg(test)]
mod sampled_tests {
    use super::*;

    #[test]
    fn the_estimate_scales_the_sampled_times_to_the_untimed() {
        // 16 or fewer: all timed, as measured.
        assert_eq!(estimate(0, 0, 0), 0);
        assert_eq!(estimate(16, 1600, 0), 1600);
        // The 17th (index 16) is the first sampled one: it stands for itself.
        assert_eq!(estimate(17, 1600, 100), 1700);
        // Index 16 timed for indices 16..32 (16 of them).
        assert_eq!(estimate(32, 1600, 100), 1600 + 16 * 100);
        // Indices 16 and 32 timed (200 ns together) for 17 pieces.
        assert_eq!(estimate(33, 1600, 200), 1600 + 17 * 100);
    }

    #[test]
    fn the_first_sixteen_and_one_in_sixteen_are_timed() {
        let s = Sampled::new();
        let mut timed = 0;
        for _ in 0..64 {
            let x = s.start();
            timed += (x.t0 != 0) as u32;
            s.stop(x);
        }
        // Indices 0..16, then 16, 32 and 48.
        assert_eq!(timed, 16 + 3);
        assert_eq!(s.total().0, 64);
    }
}

impl Default for Sampled {
    fn default() -> Self {
        Self::new()
    }
}

/// Adds `ns`, a real call's time measured by its caller, to the real part of the hook running
/// on this thread (nothing when profiling is off).
#[inline]
pub fn add_real(ns: u64) {
    if !on() {
        return;
    }
    let i = CURRENT.try_with(|c| c.get()).unwrap_or(0) as usize;
    REAL_NS[i.min(CLASSES - 1)].fetch_add(ns, Relaxed);
}

/// Runs the real function `f`, timed as the real part of the hook running on this thread.
#[inline]
pub fn real<R>(f: impl FnOnce() -> R) -> R {
    if !on() {
        return f();
    }
    let t0 = now_ns();
    let r = f();
    let i = CURRENT.try_with(|c| c.get()).unwrap_or(0) as usize;
    REAL_NS[i.min(CLASSES - 1)].fetch_add(now_ns().saturating_sub(t0), Relaxed);
    r
}

/// Parts of the hooks' own time, timed where they run (with [`timed`]): what the library's
/// share of a hook is made of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Part {
    /// Handing a record to the writer (the running counters included).
    Submit = 0,
    /// Asking the driver for the current context or device.
    Context = 1,
    /// Asking the driver whether a freeing stream is capturing a graph.
    Capturing = 2,
    /// Deferring a free's poison (or queueing it at once).
    Poison = 3,
    /// Putting a freed allocation into quarantine, with the releases it sets off.
    Quarantine = 4,
    /// Of that: releasing a batch (its check queued, or done the synchronous way).
    Release = 5,
    /// Reading the checks that have run and freeing (or keeping) their memory.
    Reap = 6,
    /// The live allocations' map (insert on allocation, remove on free).
    Live = 7,
    /// The launch check (looking the launch's parameters up in the quarantine).
    LaunchCheck = 8,
    /// Taking an allocation out of kept memory (`ISOLATE_REUSE=on`).
    Kept = 9,
    /// Of a call stack: reading the Python frames.
    PythonFrames = 10,
    /// Of a call stack: the native walk (merged with the Python frames as it goes).
    NativeFrames = 11,
    /// Of a call stack: finding its id (the thread's cache, else the process's table).
    Interning = 12,
    /// Of the launch check: the kernel's parameter layout (the cache, else the driver).
    LaunchLayout = 13,
    /// Of the launch check: the words looked up in the quarantine's index.
    LaunchLookup = 14,
    /// Of the launch check: the stream-order check of the launch's uses.
    LaunchOrder = 15,
    /// Of the launch check's layouts: a cached layout asked of the driver again (an unload came
    /// since it was last read).
    LaunchRefit = 16,
    /// Of the launch check's layouts: not in the thread's cache, looked up in the process's map.
    LaunchShared = 17,
    /// Of queueing deferred poisons: the driver's launch of the fill kernel.
    FillLaunch = 18,
    /// Waiting for the lock of the release's state (deferred poisons, stream events, slots).
    ReleaseLock = 19,
    /// Queueing the deferred poisons, all of it (the fill kernel's launch included).
    FlushAll = 20,
    /// Of queueing the deferred poisons: recording the freeing stream's event after them.
    FlushRecord = 21,
    /// One hold of the quarantine's lock by a trim over the budget (the keeper's, or a
    /// free's), taking out at most a chunk of the oldest: what a hook of the program's threads
    /// that takes the lock may wait behind.
    TrimHold = 22,
}

const PARTS: usize = 23;
const PART_NAMES: [&str; PARTS] = [
    "submitting records",
    "context and device queries",
    "capture queries",
    "poisons deferred or queued",
    "quarantining",
    "releasing batches",
    "reading checks and freeing",
    "live map",
    "launch check",
    "kept memory",
    "stacks' Python frames",
    "stacks' native frames",
    "stacks' interning",
    "of the launch check, layouts",
    "of the launch check, quarantine look-ups",
    "of the launch check, the stream-order check",
    "of the layouts, asked of the driver again after an unload",
    "of the layouts, from the process's map",
    "of the deferred poisons, the fill kernel's launch",
    "the release's lock",
    "queueing the deferred poisons",
    "of queueing them, the stream's event",
    "a trim's holds of the quarantine's lock",
];
static PART_CALLS: [AtomicU64; PARTS] = [const { AtomicU64::new(0) }; PARTS];
static PART_NS: [AtomicU64; PARTS] = [const { AtomicU64::new(0) }; PARTS];
/// The longest single time of each part (ns).
static PART_MAX: [AtomicU64; PARTS] = [const { AtomicU64::new(0) }; PARTS];
/// Of each part, the times over 20 µs: how many, and their sum (ns).
static PART_SLOW: [AtomicU64; PARTS] = [const { AtomicU64::new(0) }; PARTS];
static PART_SLOW_NS: [AtomicU64; PARTS] = [const { AtomicU64::new(0) }; PARTS];

/// Runs `f`, timed as `part` of the hooks' own time when profiling is on.
#[inline]
pub fn timed<R>(part: Part, f: impl FnOnce() -> R) -> R {
    let _span = PartSpan::start(part);
    f()
}

/// Times `part` from [`PartSpan::start`] until dropped (when profiling is on).
pub struct PartSpan {
    part: Part,
    t0: u64,
}

impl PartSpan {
    /// A part's timer, for a stretch of code that is not one closure.
    #[inline]
    pub fn start(part: Part) -> PartSpan {
        PartSpan {
            part,
            t0: if on() { now_ns() } else { 0 },
        }
    }
}

impl Drop for PartSpan {
    #[inline]
    fn drop(&mut self) {
        if self.t0 != 0 {
            let i = self.part as usize;
            let ns = now_ns().saturating_sub(self.t0);
            PART_CALLS[i].fetch_add(1, Relaxed);
            PART_NS[i].fetch_add(ns, Relaxed);
            PART_MAX[i].fetch_max(ns, Relaxed);
            if ns > 20_000 {
                PART_SLOW[i].fetch_add(1, Relaxed);
                PART_SLOW_NS[i].fetch_add(ns, Relaxed);
            }
        }
    }
}

/// The parts' note, or `None` when nothing was timed.
pub fn parts_text() -> Option<String> {
    let parts: Vec<String> = (0..PARTS)
        .filter_map(|i| {
            let n = PART_CALLS[i].load(Relaxed);
            let ns = PART_NS[i].load(Relaxed);
            (n > 0).then(|| {
                let slow = PART_SLOW[i].load(Relaxed);
                let tail = if slow > 0 {
                    format!(
                        ", {slow} over 20 us ({:.1} ms), the longest {:.0} us",
                        PART_SLOW_NS[i].load(Relaxed) as f64 / 1e6,
                        PART_MAX[i].load(Relaxed) as f64 / 1e3
                    )
                } else {
                    String::new()
                };
                format!(
                    "{} {n}, {:.2} us each ({:.1} ms{tail})",
                    PART_NAMES[i],
                    ns as f64 / 1e3 / n as f64,
                    ns as f64 / 1e6
                )
            })
        })
        .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "hooks' own time by part (ISOLATE_PROFILE=on): {}",
            parts.join("; ")
        )
    })
}

/// (calls, total ns, ns in the real function) of each class, in [`Class`] order.
pub fn figures() -> [(u64, u64, u64); CLASSES] {
    std::array::from_fn(|i| {
        (
            CALLS[i].load(Relaxed),
            TOTAL_NS[i].load(Relaxed),
            REAL_NS[i].load(Relaxed),
        )
    })
}

/// The note's text, or `None` when nothing was timed.
pub fn text() -> Option<String> {
    let f = figures();
    if f.iter().all(|c| c.0 == 0) {
        return None;
    }
    let parts: Vec<String> = f
        .iter()
        .zip(NAMES)
        .enumerate()
        .filter(|(_, ((n, _, _), _))| *n > 0)
        .map(|(i, (&(n, total, real), name))| {
            let each = total as f64 / 1e3 / n as f64;
            if i == Class::Flush as usize {
                format!("{name} {n} times, {each:.2} us each")
            } else {
                format!(
                    "{name} {n}, {each:.2} us each ({:.2} in the real function, {:.2} the \
                     library's)",
                    real as f64 / 1e3 / n as f64,
                    total.saturating_sub(real) as f64 / 1e3 / n as f64
                )
            }
        })
        .collect();
    Some(format!(
        "hooks' time on the calling threads (ISOLATE_PROFILE=on): {}",
        parts.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_splits_each_class_into_the_real_functions_time_and_the_librarys() {
        // Profiling is off in tests' configuration: fill the counters directly.
        CALLS[Class::Alloc as usize].store(4, Relaxed);
        TOTAL_NS[Class::Alloc as usize].store(40_000, Relaxed);
        REAL_NS[Class::Alloc as usize].store(10_000, Relaxed);
        CALLS[Class::Flush as usize].store(1, Relaxed);
        TOTAL_NS[Class::Flush as usize].store(3_000, Relaxed);
        let t = text().unwrap();
        assert!(
            t.contains(
                "allocations 4, 10.00 us each (2.50 in the real function, 7.50 the library's)"
            ),
            "{t}"
        );
        assert!(
            t.contains("of which queueing deferred poisons 1 times, 3.00 us each"),
            "{t}"
        );
        assert!(!t.contains("launches"), "{t}");
        // Off: spans and real calls count nothing.
        drop(span(Class::Launch));
        assert_eq!(real(|| 7), 7);
        assert_eq!(figures()[Class::Launch as usize], (0, 0, 0));
        assert_eq!(timed(Part::Submit, || 5), 5);
        assert_eq!(parts_text(), None);
        PART_CALLS[Part::Live as usize].store(2, Relaxed);
        PART_NS[Part::Live as usize].store(3_000, Relaxed);
        assert_eq!(
            parts_text().unwrap(),
            "hooks' own time by part (ISOLATE_PROFILE=on): live map 2, 1.50 us each (0.0 ms)"
        );
        // A part with a first-use cost: its times over 20 us, their sum and the longest.
        PART_CALLS[Part::FlushAll as usize].store(3, Relaxed);
        PART_NS[Part::FlushAll as usize].store(2_012_000, Relaxed);
        PART_SLOW[Part::FlushAll as usize].store(1, Relaxed);
        PART_SLOW_NS[Part::FlushAll as usize].store(2_000_000, Relaxed);
        PART_MAX[Part::FlushAll as usize].store(2_000_000, Relaxed);
        let t = parts_text().unwrap();
        assert!(
            t.ends_with(
                "; queueing the deferred poisons 3, 670.67 us each (2.0 ms, 1 over 20 us \
                 (2.0 ms), the longest 2000 us)"
            ),
            "{t}"
        );
    }
}

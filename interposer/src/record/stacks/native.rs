//! Native frames of the calling thread, by unwinding with the DWARF call-frame information
//! every object carries in `.eh_frame` (no frame pointers, no debug info needed), through
//! `framehop` with a per-thread rule cache: after the first stack through a piece of code, a
//! frame costs a cache look-up and one or two stack reads.
//!
//! Every stack read is checked against the thread's own stack bounds (`pthread_getattr_np`,
//! once per thread), so a wrong rule ends the walk instead of faulting.
//!
//! Layer: recording. Uses the base and [`super::modules`].

use super::modules::Snapshot;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

thread_local! {
    /// Where the hook running on this thread was entered ([`Entry::mark`]): (ip, sp, bp), or
    /// all 0. A walk starts there instead of in [`unwind`]'s own frame, so the library's
    /// frames between the hook and the walk (the policy, the record, the capture: 5–8 of
    /// them, ~30 ns each) are not walked only to be left out.
    static ENTRY: Cell<(u64, u64, u64)> = const { Cell::new((0, 0, 0)) };
    // Const-initialised, no destructor: usable during thread teardown.
    static BOUNDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    static CACHE: RefCell<Option<Box<CacheX86_64>>> = const { RefCell::new(None) };
    /// The thread's cache's (hits, misses) when last added to [`HITS`] and [`MISSES`].
    static SEEN: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Frames whose unwind rule came from a thread's rule cache, and frames that had to be looked
/// up in the unwind information (noted at exit: a cache too small for a program's code shows
/// as misses).
static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);

/// (hits, misses) of the unwinders' rule caches so far, all threads.
pub fn cache_stats() -> (u64, u64) {
    (HITS.load(Relaxed), MISSES.load(Relaxed))
}

/// The instruction pointer, stack pointer and frame pointer of the caller (inlined into it), at
/// one instruction: the unwind rules for that `ip` apply to that `sp` and `bp`.
#[inline(always)]
fn registers() -> (u64, u64, u64) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: the three instructions only copy rip, rsp and rbp into output registers; they read
    // and write no memory and no flags (`nomem, nostack, preserves_flags` are true of them).
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    (ip, sp, bp)
}

/// While it lives, stack walks on this thread start at the point where it was made (see
/// [`ENTRY`]); made by the hooks as they are entered.
pub struct Entry {
    set: bool,
}

impl Entry {
    /// Marks this point of the caller (inlined into it) as where walks start; a no-op when an
    /// outer mark is set already.
    #[inline(always)]
    pub fn mark() -> Entry {
        let (ip, sp, bp) = registers();
        let set = ENTRY
            .try_with(|e| {
                if e.get().1 != 0 {
                    return false;
                }
                e.set((ip, sp, bp));
                true
            })
            .unwrap_or(false);
        Entry { set }
    }
}

impl Drop for Entry {
    #[inline(always)]
    fn drop(&mut self) {
        if self.set {
            let _ = ENTRY.try_with(|e| e.set((0, 0, 0)));
        }
    }
}

/// Whether a hook marked where this thread's walks start ([`Entry::mark`]): a walk then
/// hands over the same return addresses from whichever of the library's frames it is made.
pub fn entered() -> bool {
    ENTRY.try_with(|e| e.get().1 != 0).unwrap_or(false)
}

/// The calling thread's stack: lowest and one-past-highest address.
fn stack_bounds() -> Option<(u64, u64)> {
    let b = BOUNDS.try_with(|b| b.get()).unwrap_or((0, 0));
    if b.1 != 0 {
        return Some(b);
    }
    // SAFETY: pthread_attr_t is an opaque C struct of bytes, for which all-zero is a valid
    // value; pthread_getattr_np initialises it before any other use.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: the calling thread's own id, and a live attr for it to initialise (on
    // failure nothing else is done with it).
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), &mut attr) } != 0 {
        return None;
    }
    let mut addr: *mut libc::c_void = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: `attr` was initialised by pthread_getattr_np above; `addr` and `size` are
    // live locals for it to write.
    let rc = unsafe { libc::pthread_attr_getstack(&attr, &mut addr, &mut size) };
    // SAFETY: destroys the attr pthread_getattr_np initialised (it may hold an allocated
    // cpuset), once; it is not used afterwards.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    if rc != 0 || size == 0 {
        return None;
    }
    let b = (addr as u64, addr as u64 + size as u64);
    let _ = BOUNDS.try_with(|c| c.set(b));
    Some(b)
}

/// The calling thread's stack left below the caller (bytes), when its bounds are known. The
/// bounds are read once per thread (`pthread_getattr_np`; for the main thread glibc reads
/// `/proc/self/maps` then, on a stack that is never small).
#[inline(always)]
pub fn stack_room() -> Option<u64> {
    let (_, sp, _) = registers();
    let (lo, _) = stack_bounds()?;
    Some(sp.saturating_sub(lo))
}

/// The most walks a thread remembers from one start (the same hook at the same depth: a
/// model's operators all allocate from there, through many callers), and in all; past the
/// latter it forgets them all and starts again.
const WALKS_PER_START: usize = 64;
// A start's walks are told apart by a bit each (`Start::unsplit`).
const _: () = assert!(WALKS_PER_START <= 64);
const WALKS_PER_THREAD: usize = 1024;
/// The most words a remembered walk keeps to check (those it uses: [`must_check`]).
const KEEP_WORDS: usize = 48;
/// The most stack words a remembered walk read (framehop reads one or two a frame).
const WALK_READS: usize = 64;
/// The most return addresses a remembered walk handed on (the full tier's 16 native frames
/// and the frame after them).
const WALK_RAS: usize = 32;
/// The most frames (the library's own included) a remembered walk gave.
const WALK_FRAMES: usize = 48;

/// One walk as it went (its start's ip, sp and snapshot are the key it is remembered by): the
/// frame pointer it started with, every stack word it read with the value it found, the return
/// addresses it handed on, and whether the stack ended there (rather than `visit` saying no).
///
/// A walk is a function of its start (ip, sp, bp) and of the words it reads: the unwind rules
/// come from the snapshot's objects for each ip, and each word's address follows from the
/// registers and the words before it. So a walk from the same start whose words all read the
/// same again hands on the same return addresses, and replaying them is exact; checking costs
/// one read and compare a word instead of a rule look-up and reads a frame.
#[derive(Clone, Copy)]
struct Walk {
    /// The frame pointer it started with, and whether a replay needs the same ([`must_check`]).
    bp: u64,
    bp_must: bool,
    reads: u8,
    ras: u8,
    ended: bool,
    /// More than [`WALK_READS`] words, [`WALK_RAS`] return addresses or [`WALK_FRAMES`]
    /// frames: the walk is not remembered.
    overflow: bool,
    read: [(u64, u64); WALK_READS],
    /// Which of `read` a replay checks ([`must_check`]).
    must: u64,
    /// Whether the rules used a value that is not a return address (a saved `rbp`).
    uses_data: bool,
    ra: [u64; WALK_RAS],
}

impl Walk {
    const EMPTY: Walk = Walk {
        bp: 0,
        bp_must: true,
        reads: 0,
        ras: 0,
        ended: false,
        overflow: false,
        read: [(0, 0); WALK_READS],
        must: 0,
        uses_data: false,
        ra: [0; WALK_RAS],
    };

    fn note_read(&mut self, addr: u64, value: u64) {
        if (self.reads as usize) < WALK_READS {
            self.read[self.reads as usize] = (addr, value);
            self.reads += 1;
        } else {
            self.overflow = true;
        }
    }
}

/// A remembered walk: its start, the words a replay checks (with their values) and the
/// return addresses it hands on (1,040 bytes).
#[derive(Clone, Copy)]
struct Kept {
    bp: u64,
    bp_must: bool,
    ended: bool,
    words: u8,
    ras: u8,
    word: [(u64, u64); KEEP_WORDS],
    ra: [u64; WALK_RAS],
    /// The stack a capture made of this walk alone (a thread without Python frames), and
    /// what it was made under: (tag, id), or (0, 0) ([`replayed_stack`]).
    stack: (u64, u32),
}

impl Kept {
    /// The words of `seen` its mask says a replay checks; None when more than fit.
    fn of(seen: &Walk) -> Option<Kept> {
        let mut k = Kept {
            bp: seen.bp,
            bp_must: seen.bp_must,
            ended: seen.ended,
            words: 0,
            ras: seen.ras,
            word: [(0, 0); KEEP_WORDS],
            ra: seen.ra,
            stack: (0, 0),
        };
        for (i, &w) in seen.read[..seen.reads as usize].iter().enumerate() {
            if seen.must & (1 << i) != 0 {
                *k.word.get_mut(k.words as usize)? = w;
                k.words += 1;
            }
        }
        Some(k)
    }
}

/// A thread's remembered walks by start, each start's newest first (a walk remembered past
/// [`WALKS_PER_START`] replaces the oldest).
#[derive(Default)]
struct Walks {
    by_start: FxHashMap<[u64; 3], Start>,
    count: usize,
}

/// The walks remembered from one start.
#[derive(Default)]
struct Start {
    /// Newest first.
    // Boxed: a new walk moves pointers, not kilobytes.
    #[allow(clippy::vec_box)]
    walks: Vec<Box<Kept>>,
    /// Where the walks part ([`Start::split_at`]): the address of a word they check, which the
    /// walks that check it do not all expect to hold one value. Read once a replay, it rules
    /// out every walk that expects another value there without reading that walk (a kilobyte
    /// of its own on the heap). From one start the walks check the same words until their
    /// callers differ, so a search that compared each walk in turn read the shared words again
    /// for each one: with 64 call sites at one depth, ~1,000 instructions a replay on the
    /// stand-in (docs/performance.md, "Call stacks").
    split: Option<u64>,
    /// The walks by their value at `split`: bit `i` of a value's mask is walk `i`.
    at_split: FxHashMap<u64, u64>,
    /// Bit `i`: walk `i` checks no word at `split` (so is never ruled out by it).
    unsplit: u64,
    /// Walks that had to go to make room ([`WALKS_PER_START`]); past [`CHURN`] the start's
    /// walks do not repeat or do not fit, and only one miss in [`PROBE_EVERY`] is probed
    /// ([`must_check`]: a walk again and a few more) and remembered.
    evicted: u32,
    misses: u32,
}

impl Start {
    /// The word the walks part at (see [`Start::split`]): the first the newest walk checks
    /// where the walks that check that address do not all expect one value. Any word would do
    /// for what a replay finds (a walk ruled out expects a value the stack does not hold, so
    /// its own check would fail there too); the first such is where the callers part.
    fn split_at(walks: &[Box<Kept>]) -> Option<u64> {
        let first = walks.first()?;
        first.word[..first.words as usize]
            .iter()
            .find_map(|&(addr, value)| {
                walks[1..]
                    .iter()
                    .any(|w| w.value_at(addr).is_some_and(|v| v != value))
                    .then_some(addr)
            })
    }

    /// The split and each walk's value there again, after a walk came or went.
    fn resplit(&mut self) {
        let split = Self::split_at(&self.walks);
        self.split = split;
        self.at_split.clear();
        self.unsplit = 0;
        for (i, w) in self.walks.iter().enumerate() {
            match split.and_then(|a| w.value_at(a)) {
                Some(v) => *self.at_split.entry(v).or_default() |= 1 << i,
                None => self.unsplit |= 1 << i,
            }
        }
    }

    /// The first walk whose checked words the stack holds (`read`) and whose starting frame
    /// pointer fits `bp`.
    #[inline]
    fn find(&self, bp: u64, read: impl Fn(u64) -> Result<u64, ()>) -> Option<usize> {
        // The walks the split leaves (where it cannot be read, every walk that checks it is
        // ruled out), newest first.
        if self.walks.is_empty() {
            return None;
        }
        let mut left = match self.split.map(&read) {
            None => u64::MAX >> (64 - self.walks.len()),
            Some(Ok(here)) => self.unsplit | self.at_split.get(&here).copied().unwrap_or(0),
            Some(Err(())) => self.unsplit,
        };
        while left != 0 {
            let i = left.trailing_zeros() as usize;
            left &= left - 1;
            let walk = &self.walks[i];
            if (!walk.bp_must || walk.bp == bp)
                && walk.word[..walk.words as usize]
                    .iter()
                    .all(|&(a, v)| read(a) == Ok(v))
            {
                return Some(i);
            }
        }
        None
    }

    /// Remembers `kept` (newest first), the oldest walk going where there are
    /// [`WALKS_PER_START`] already; true when one went.
    fn remember(&mut self, kept: Kept) -> bool {
        let evicted = self.walks.len() >= WALKS_PER_START;
        if evicted {
            self.walks.pop();
        }
        self.walks.insert(0, Box::new(kept));
        self.resplit();
        evicted
    }
}

impl Kept {
    /// The value this walk checks at `addr`, if it checks that word.
    fn value_at(&self, addr: u64) -> Option<u64> {
        self.word[..self.words as usize]
            .iter()
            .find(|w| w.0 == addr)
            .map(|w| w.1)
    }
}

/// See [`Start::evicted`].
const CHURN: u32 = WALKS_PER_START as u32;
const PROBE_EVERY: u32 = 64;

thread_local! {
    /// The thread's remembered walks ([`Kept`], 1,056 bytes each, on the heap; at most
    /// [`WALKS_PER_THREAD`]: ~1 MiB).
    static WALKS: RefCell<Option<Walks>> = const { RefCell::new(None) };
    /// The walk the thread's last [`unwind`] replayed whole or remembered ([`take_last`]).
    static LAST: Cell<Option<Walked>> = const { Cell::new(None) };
}

/// A remembered walk an [`unwind`] replayed whole or remembered: its start, its place there,
/// and what tells it apart from another walk that took that place since: where it lives on
/// the heap, its counts and its outermost return address (a few loads: every replay on a
/// thread that runs Python makes one, and never uses it).
#[derive(Clone, Copy)]
pub struct Walked {
    key: [u64; 3],
    i: usize,
    at: usize,
    counts: (u8, u8),
    outer: u64,
}

impl Walked {
    fn of(key: [u64; 3], i: usize, k: &Kept) -> Walked {
        Walked {
            key,
            i,
            at: k as *const Kept as usize,
            counts: (k.ras, k.words),
            outer: k.ra[(k.ras as usize).saturating_sub(1)],
        }
    }

    fn is(&self, k: &Kept) -> bool {
        *self
            == Walked {
                key: self.key,
                i: self.i,
                ..Walked::of(self.key, self.i, k)
            }
    }
}

impl PartialEq for Walked {
    fn eq(&self, o: &Walked) -> bool {
        (self.key, self.i, self.at, self.counts, self.outer)
            == (o.key, o.i, o.at, o.counts, o.outer)
    }
}

/// The walk the calling thread's last [`unwind`] replayed whole or remembered, taken right
/// after it (a walk made meanwhile, by a capture inside this one, is not taken for it).
pub fn take_last() -> Option<Walked> {
    LAST.try_with(|l| l.take()).ok().flatten()
}

/// Walks replayed with the stack they made ([`replayed_stack`]).
static WITH_STACK: AtomicU64 = AtomicU64::new(0);

/// Where the thread's hook marked its entry, and the stack's bounds: (ip, sp, bp, hi).
fn entry_start() -> Option<(u64, u64, u64, u64)> {
    let (_, hi) = stack_bounds()?;
    match ENTRY.try_with(|e| e.get()).ok()? {
        (ip, sp, bp) if sp != 0 && sp < hi => Some((ip, sp, bp, hi)),
        _ => None,
    }
}

/// The stack word at `addr`, where it lies in [lo, hi) and is 8-aligned: `lo` a stack
/// pointer of a live frame of the caller's (or the caller's own) and `hi` the top of the
/// calling thread's stack.
#[inline(always)]
fn stack_word(addr: u64, lo: u64, hi: u64) -> Result<u64, ()> {
    if addr >= lo && addr.checked_add(8).is_some_and(|e| e <= hi) && addr.is_multiple_of(8) {
        // SAFETY: 8-aligned and within [lo, hi): the calling thread's own stack from a live
        // frame's stack pointer up to its top (pthread's bounds), which is mapped and not freed
        // while the caller runs. Words above that stack pointer belong to live frames of the
        // caller's callers; they are read, never written.
        Ok(unsafe { *(addr as *const u64) })
    } else {
        Err(())
    }
}

/// A walk's start as a key of the thread's remembered walks.
fn start_key(ip: u64, sp: u64, snap: &Snapshot) -> [u64; 3] {
    [ip, sp, snap as *const Snapshot as u64]
}

/// The stack id kept under `tag` ([`remember_stack`]) with the remembered walk the calling
/// thread's stack replays from its hook's entry (none where no hook marked it): a thread
/// without Python frames (PyTorch's autograd engine) whose stack is its native walk alone
/// then has its stack without handing the walk's frames on, merging and hashing them.
pub fn replayed_stack(snap: &Snapshot, tag: u64) -> Option<u32> {
    let (ip, sp, bp, hi) = entry_start()?;
    let read = move |addr: u64| stack_word(addr, sp, hi);
    let key = start_key(ip, sp, snap);
    let id = WALKS
        .try_with(|w| {
            let w = w.try_borrow().ok()?;
            let start = w.as_ref()?.by_start.get(&key)?;
            let walk = &start.walks[start.find(bp, read)?];
            (walk.stack.0 == tag && walk.stack.1 != 0).then_some(walk.stack.1)
        })
        .ok()
        .flatten()?;
    REPLAYED.fetch_add(1, Relaxed);
    WITH_STACK.fetch_add(1, Relaxed);
    Some(id)
}

/// Keeps stack `id`, made under `tag` of walk `walked` ([`take_last`]) alone, with that walk
/// (while it is still remembered where it was).
pub fn remember_stack(walked: Walked, tag: u64, id: u32) {
    let _ = WALKS.try_with(|w| {
        if let Ok(mut w) = w.try_borrow_mut()
            && let Some(walk) = w
                .as_mut()
                .and_then(|w| w.by_start.get_mut(&walked.key))
                .and_then(|s| s.walks.get_mut(walked.i))
            && walked.is(walk)
        {
            walk.stack = (tag, id);
        }
    });
}

/// Walks replayed from a thread's remembered walks, and walks done frame by frame; of those,
/// the ones from a start remembered with other stack words, and the ones too long to remember.
static REPLAYED: AtomicU64 = AtomicU64::new(0);
static WALKED: AtomicU64 = AtomicU64::new(0);
static DIFFERED: AtomicU64 = AtomicU64::new(0);
static LONG: AtomicU64 = AtomicU64::new(0);
/// Walks remembered whose rules use a value that is not a return address ([`must_check`]).
static USES_DATA: AtomicU64 = AtomicU64::new(0);
/// Walks not remembered at a start whose walks keep changing ([`Start`]).
static UNPROBED: AtomicU64 = AtomicU64::new(0);

/// How native walks went so far, all threads.
pub struct WalkStats {
    pub replayed: u64,
    pub walked: u64,
    /// Walked from a start remembered, with other words (another caller at the same depth).
    pub differed: u64,
    /// Walked and not remembered: more than [`WALK_READS`] words or [`WALK_RAS`] frames, or
    /// more than [`KEEP_WORDS`] to check.
    pub long: u64,
    /// Remembered with values other than return addresses to check (saved frame pointers).
    pub uses_data: u64,
    /// Not remembered: from a start whose walks keep changing.
    pub unstable: u64,
    /// Of the replayed: replayed with the stack they made ([`replayed_stack`]).
    pub with_stack: u64,
}

pub fn walk_stats() -> WalkStats {
    WalkStats {
        replayed: REPLAYED.load(Relaxed),
        walked: WALKED.load(Relaxed),
        differed: DIFFERED.load(Relaxed),
        long: LONG.load(Relaxed),
        uses_data: USES_DATA.load(Relaxed),
        unstable: UNPROBED.load(Relaxed),
        with_stack: WITH_STACK.load(Relaxed),
    }
}

/// What replaying a remembered walk came to.
enum Replay {
    /// No remembered walk from here, or a word read differently now: walk, and remember the
    /// walk (probe it: [`must_check`]) when true.
    Miss(bool),
    /// Done: whether `visit` said no to one (as [`unwind`] returns).
    Done(bool),
    /// `visit` took every remembered return address and wants more: walk on, leaving out
    /// that many (the walk hands on the same ones first).
    More(usize),
}

/// What a saved word is turned into when [`must_check`] asks whether the walk used it: far
/// outside any stack, so an address made from it reads nothing the walk read before.
const PERTURB: u64 = 1 << 46;

/// Which of a walk's words must read the same for a replay to be exact (a bit per word of
/// `seen.read`). A return address always must. A saved frame pointer (`rbp`, restored frame
/// by frame) matters only where a later frame's rule unwinds through it, and code built
/// without frame pointers keeps data in it: checking it would make most of a model's walks
/// differ; so does the frame pointer the walk starts with, the caller's data as often as
/// not. So the walk is done again with that frame pointer and every word that is not a
/// return address changed ([`PERTURB`]): a value the walk used to make an address changes
/// the addresses it tries or the frames it gives (the only uses the unwind rules make of
/// one); when neither changed, those values are not used, and only the return addresses are
/// checked (`(mask, false)`). Else (a frame built with frame pointers unwinds through a saved
/// `rbp`, next to frames whose saved `rbp` is a heap pointer: PyTorch's) each value is
/// changed alone, and the mask holds those whose change changed the walk.
fn must_check(
    snap: &Snapshot,
    cache: &mut CacheX86_64,
    start: (u64, u64, u64),
    read: &dyn Fn(u64) -> Result<u64, ()>,
    tried: &[u64],
    frames: &[u64],
    seen: &Walk,
) -> (u64, bool, bool) {
    let is_ra = |v: u64| frames.iter().skip(1).any(|&f| f == v);
    let words = &seen.read[..seen.reads as usize];
    let mut must = 0u64;
    for (k, &(_, v)) in words.iter().enumerate() {
        if is_ra(v) {
            must |= 1 << k;
        }
    }
    let mut same = |word: &dyn Fn(usize) -> bool, bp: bool| {
        probe(
            snap, cache, start, read, tried, frames, seen.ended, word, bp,
        )
    };
    // Every value that is not a return address changed at once: the common case, one probe.
    if same(&|k| must & (1 << k) == 0, true) {
        return (must, false, false);
    }
    #[cfg(feature = "walk-dump")]
    dump::probe(snap, start.1, start.2, "a value is used", frames, seen);
    // Some value is used: find which, one at a time (a rule uses a value or not whatever the
    // others hold, the frames being the same: so each found unused alone is unused).
    for k in 0..words.len() {
        if must & (1 << k) == 0 && !same(&|j| j == k, false) {
            must |= 1 << k;
        }
    }
    let bp_must = !same(&|_| false, true);
    (must, bp_must, true)
}

/// Whether the walk from `start`, with the `word(k)` words read (the k-th read that succeeded)
/// and, when `bp`, the starting frame pointer changed to [`PERTURB`]ed values, tries the same
/// addresses (`tried`), gives the same frames and ends where the walk did.
#[allow(clippy::too_many_arguments)]
fn probe(
    snap: &Snapshot,
    cache: &mut CacheX86_64,
    (ip, sp, bp): (u64, u64, u64),
    read: &dyn Fn(u64) -> Result<u64, ()>,
    tried: &[u64],
    frames: &[u64],
    ended: bool,
    word: &dyn Fn(usize) -> bool,
    change_bp: bool,
) -> bool {
    let mut i = 0usize;
    let mut ok = 0usize;
    let mut same = true;
    let mut probe = |a: u64| {
        if tried.get(i) != Some(&a) {
            same = false;
            return Err(());
        }
        i += 1;
        match read(a) {
            Ok(v) => {
                ok += 1;
                Ok(if word(ok - 1) { v ^ PERTURB } else { v })
            }
            r => r,
        }
    };
    let start_bp = if change_bp { bp ^ PERTURB } else { bp };
    let regs = UnwindRegsX86_64::new(ip, sp, start_bp);
    let mut it = snap.unwinder.iter_frames(ip, regs, cache, &mut probe);
    for &want in frames {
        match it.next() {
            Ok(Some(f)) if f.address() == want => {}
            _ => return false,
        }
    }
    // A walk that ended there must end there again (the reads that ended it are in `tried`).
    if ended && matches!(it.next(), Ok(Some(_))) {
        return false;
    }
    same && i == tried.len()
}

/// Hands `visit` the return addresses of the calling thread, innermost first, leaving out the
/// frames of this library that lead up to here, until `visit` says no to one. Returns whether
/// it did (the stack went on past what `visit` took).
///
/// A thread's walk from the same place over the same stack words is replayed from the
/// thread's remembered walks ([`Walk`]): a training loop's stacks repeat, so most walks after
/// the first steps are a check of their words.
#[inline(never)]
pub fn unwind(snap: &Snapshot, mut visit: impl FnMut(u64) -> bool) -> bool {
    let (ip, sp, bp) = registers();
    let Some((_, hi)) = stack_bounds() else {
        return false;
    };
    // From the hook's entry where one is marked (its frame is an outer one of this walk's:
    // a higher stack address, still live); else from here.
    let (ip, sp, bp) = match ENTRY.try_with(|e| e.get()).unwrap_or((0, 0, 0)) {
        (eip, esp, ebp) if esp > sp && esp < hi => (eip, esp, ebp),
        _ => (ip, sp, bp),
    };
    let lo = sp;
    let read = |addr: u64| stack_word(addr, lo, hi);
    let key = start_key(ip, sp, snap);
    let _ = LAST.try_with(|l| l.set(None));
    let replay = WALKS
        .try_with(|w| {
            let Ok(mut w) = w.try_borrow_mut() else {
                return Replay::Miss(false);
            };
            let Some(start) = w.as_mut().and_then(|w| w.by_start.get_mut(&key)) else {
                return Replay::Miss(true);
            };
            let Some(i) = start.find(bp, read) else {
                DIFFERED.fetch_add(1, Relaxed);
                #[cfg(feature = "walk-dump")]
                dump::differed(snap, sp, bp, &start.walks, &read);
                start.misses = start.misses.wrapping_add(1);
                return Replay::Miss(
                    start.evicted < CHURN || start.misses.is_multiple_of(PROBE_EVERY),
                );
            };
            let walk = &start.walks[i];
            for &ra in &walk.ra[..walk.ras as usize] {
                if !visit(ra) {
                    let _ = LAST.try_with(|l| l.set(Some(Walked::of(key, i, walk))));
                    return Replay::Done(true);
                }
            }
            if walk.ended {
                let _ = LAST.try_with(|l| l.set(Some(Walked::of(key, i, walk))));
                Replay::Done(false)
            } else {
                Replay::More(walk.ras as usize)
            }
        })
        // Thread teardown (the walks are gone): walk, and remember nothing.
        .unwrap_or(Replay::Miss(false));
    let (skip, probe) = match replay {
        Replay::Done(r) => {
            REPLAYED.fetch_add(1, Relaxed);
            return r;
        }
        Replay::More(n) => (n, true),
        Replay::Miss(probe) => (0, probe),
    };
    WALKED.fetch_add(1, Relaxed);
    let mut seen = Walk::EMPTY;
    seen.bp = bp;
    let mut walk = |cache: &mut CacheX86_64, seen: &mut Walk| {
        // Every address the walk tried (read or not), and every frame it gave, in order.
        let mut tried = [0u64; WALK_READS];
        let mut n_tried = 0usize;
        let mut frames = [0u64; WALK_FRAMES];
        let mut n_frames = 0usize;
        // The return addresses handed on: into `seen` once the walk's reads no longer borrow it.
        let mut ras = [0u64; WALK_RAS];
        let mut n_ras = 0usize;
        let stopped = {
            let mut read = |a: u64| {
                if n_tried < WALK_READS {
                    tried[n_tried] = a;
                }
                n_tried += 1;
                let r = read(a);
                // A word outside the stack fails again from the same start on this thread
                // (the same bounds): only the words read need checking.
                if let Ok(v) = r {
                    seen.note_read(a, v);
                }
                r
            };
            let regs = UnwindRegsX86_64::new(ip, sp, bp);
            let mut it = snap.unwinder.iter_frames(ip, regs, cache, &mut read);
            let mut leading = true;
            let mut handed = 0usize;
            // The first frame is this function's own instruction pointer.
            loop {
                let Ok(Some(f)) = it.next() else {
                    break false;
                };
                if n_frames < WALK_FRAMES {
                    frames[n_frames] = f.address();
                }
                n_frames += 1;
                let FrameAddress::ReturnAddress(ra) = f else {
                    continue;
                };
                let ra = ra.get();
                if leading && snap.is_own(ra) {
                    continue;
                }
                leading = false;
                if n_ras < WALK_RAS {
                    ras[n_ras] = ra;
                }
                n_ras += 1;
                handed += 1;
                if handed <= skip {
                    continue;
                }
                if !visit(ra) {
                    break true;
                }
            }
        };
        seen.ra = ras;
        seen.ras = n_ras.min(WALK_RAS) as u8;
        seen.ended = !stopped;
        if n_ras > WALK_RAS || n_tried > WALK_READS || n_frames > WALK_FRAMES {
            seen.overflow = true;
        }
        // Probed only where it is to be remembered.
        if probe && !seen.overflow {
            (seen.must, seen.bp_must, seen.uses_data) = must_check(
                snap,
                cache,
                (ip, sp, bp),
                &read,
                &tried[..n_tried],
                &frames[..n_frames],
                seen,
            );
        }
        stopped
    };
    let from_cache = CACHE.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else {
            return None;
        };
        let cache = c.get_or_insert_with(|| Box::new(CacheX86_64::new()));
        let r = walk(cache, &mut seen);
        let st = cache.stats();
        let (hits, misses) = (st.hits(), st.misses());
        let (h0, m0) = SEEN
            .try_with(|s| s.replace((hits, misses)))
            .unwrap_or((hits, misses));
        HITS.fetch_add(hits.saturating_sub(h0), Relaxed);
        MISSES.fetch_add(misses.saturating_sub(m0), Relaxed);
        Some(r)
    });
    let r = match from_cache {
        Ok(Some(r)) => r,
        // Thread teardown (the cache is gone) or re-entered: a cache of its own this once.
        _ => return walk(&mut CacheX86_64::new(), &mut seen),
    };
    if !probe {
        UNPROBED.fetch_add(1, Relaxed);
        return r;
    }
    let kept = if seen.overflow { None } else { Kept::of(&seen) };
    let Some(kept) = kept else {
        LONG.fetch_add(1, Relaxed);
        return r;
    };
    let _ = WALKS.try_with(|w| {
        if let Ok(mut w) = w.try_borrow_mut() {
            let w = w.get_or_insert_with(Walks::default);
            if w.count >= WALKS_PER_THREAD {
                w.by_start.clear();
                w.count = 0;
            }
            let start = w.by_start.entry(key).or_default();
            if seen.uses_data {
                USES_DATA.fetch_add(1, Relaxed);
            }
            if start.remember(kept) {
                start.evicted += 1;
                w.count -= 1;
            }
            w.count += 1;
            // A walk of its own from the start to where `visit` stopped (not the rest of a
            // replay: the frames handed on before it were the remembered walk's).
            if skip == 0 {
                let _ = LAST.try_with(|l| l.set(Some(Walked::of(key, 0, &start.walks[0]))));
            }
        }
    });
    r
}

/// The `walk-dump` diagnostic build's printing (stderr, the first 60 of each kind a process).
#[cfg(feature = "walk-dump")]
mod dump {
    use super::{Kept, Snapshot, Walk};
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

    static PROBES: AtomicU32 = AtomicU32::new(0);
    static DIFFERS: AtomicU32 = AtomicU32::new(0);

    fn name(snap: &Snapshot, a: u64) -> String {
        match snap.find(a) {
            Some((_, o)) => format!(
                "{}+0x{:x}",
                o.path.rsplit('/').next().unwrap_or(""),
                a - o.bias
            ),
            None => format!("0x{a:x}"),
        }
    }

    pub fn probe(snap: &Snapshot, sp: u64, bp: u64, why: &str, frames: &[u64], seen: &Walk) {
        if PROBES.fetch_add(1, Relaxed) >= 60 {
            return;
        }
        let f: Vec<String> = frames.iter().map(|&a| name(snap, a)).collect();
        let r: Vec<String> = seen.read[..seen.reads as usize]
            .iter()
            .map(|&(a, v)| format!("+{}={}", a.wrapping_sub(sp), name(snap, v)))
            .collect();
        eprintln!(
            "walk-dump probe: {why}; bp=sp+{} frames {f:?} reads {r:?}",
            bp.wrapping_sub(sp) as i64
        );
    }

    #[allow(clippy::vec_box)]
    pub fn differed(
        snap: &Snapshot,
        sp: u64,
        bp: u64,
        ways: &[Box<Kept>],
        read: &dyn Fn(u64) -> Result<u64, ()>,
    ) {
        if DIFFERS.fetch_add(1, Relaxed) >= 60 {
            return;
        }
        for w in ways.iter().take(3) {
            let bad = w.word[..w.words as usize]
                .iter()
                .enumerate()
                .find(|&(_, &(a, v))| read(a) != Ok(v));
            let ras: Vec<String> = w.ra[..(w.ras as usize).min(6)]
                .iter()
                .map(|&a| name(snap, a))
                .collect();
            eprintln!(
                "walk-dump differ: bp_must {} bp {} (now {}), word {:?} of {} now {:?}; ras {ras:?}",
                w.bp_must,
                w.bp.wrapping_sub(sp) as i64,
                bp.wrapping_sub(sp) as i64,
                bad.map(|(k, &(a, v))| (k, a.wrapping_sub(sp), name(snap, v))),
                w.words,
                bad.map(|(_, &(a, _))| read(a).map(|v| name(snap, v))),
            );
        }
    }
}

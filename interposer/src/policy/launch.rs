//! The stale-pointer check at kernel launch: every 8-byte-aligned word of the parameters is
//! looked up in the index of freed ranges held in quarantine. Layouts come from the driver,
//! read once per kernel and cached ([`super::layout`]).
//!
//! A pointer into quarantine (poisoned, still mapped) is a stale launch at once: nothing else
//! would notice the kernel using it. A pointer into guard mode's freed memory (unmapped) is only
//! a *stale value* until the device says otherwise: any access through it faults, so a launch
//! that is not followed by a fault never used it (CUTLASS kernels, for one, carry such values in
//! fields they ignore). Those launches are kept as suspects until a device-wide synchronisation
//! succeeds; when a call returns a device fault first, the suspects are named as the stale
//! launches that caused it.
//!
//! Every launch is also told to the stream-order check ([`super::order`]), with the whole 8-byte
//! parameters it was handed (the same evidence rule: a use of an allocation is its start there).
//!
//! Layer: policies. Uses the base, recording, [`super::layout`], [`super::isolate`] (its
//! quarantine index), [`super::order`] and [`super::sync`].

use super::layout::{LAYOUTS, Layout, REFITS, layout};
use super::{isolate, order, release, sync};
use crate::base::config;
use crate::base::cu;
use crate::base::cuda::*;
use crate::base::sys::ForkLock;
use crate::base::sys::{gettid, now_ns, warn};
use crate::record::{event, profile, stacks, writer};
use arrayvec::ArrayVec;
use isolate_trace::{Api, NoteKind, Record, StaleLaunch};
use std::collections::{HashSet, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// (kernel, allocation, evidence) already reported: a suspect of a kernel and allocation does
/// not hide a later stale launch of the same two.
static WARNED: ForkLock<Option<HashSet<(usize, u64, bool)>>> = ForkLock::new(None);
/// Launches whose kernel's parameter layout no query gave, with a `kernelParams` array: not
/// checked (said in the exit note).
static UNCHECKED: AtomicU64 = AtomicU64::new(0);

const CU_LAUNCH_PARAM_END: usize = 0;
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// Launches checked, and stale pointers found: written as a note at exit, so a clean run shows
/// that its launches were checked at all.
pub static CHECKED: AtomicU64 = AtomicU64::new(0);
pub static HITS: AtomicU64 = AtomicU64::new(0);

/// A pointer into freed memory found in a launch's parameters.
#[derive(Clone)]
pub struct Hit {
    api: Api,
    layout: &'static Layout,
    index: u32,
    offset: u32,
    ptr: u64,
    e: isolate::Entry,
    ts: u64,
    tid: u32,
    device: i32,
    /// The launching thread's stack (captured only when a stale pointer is found).
    stack: u32,
}

impl Hit {
    /// Hands the record to the writer, with its stack (a `StackOf` record) after it.
    fn submit(&self, kind: fn(StaleLaunch) -> Record) {
        let seq = event::next_seq();
        writer::submit(kind(self.record(seq)));
        stacks::stack_of(seq, self.stack);
    }

    /// The kernel, told apart by its layout: a handle reused for another kernel (after a module
    /// unload) gets a new layout, so its reports are not taken for the old kernel's.
    fn kernel(&self) -> usize {
        self.layout as *const Layout as usize
    }
}

/// Guard-mode hits of one launch, handed back to [`launched`] once the launch is submitted.
pub struct Guarded(Vec<Hit>);

/// Words looked up under one lock: (value, parameter index, byte offset).
const BATCH: usize = 64;

/// The parameters of one launch the stream-order check reads, as groups of words (at most
/// [`order::WORDS`] words): each whole 8-byte parameter at an 8-aligned offset, and each
/// 8-aligned parameter of 16 to [`order::GROUP`] × 8 bytes (a struct passed by value, such as
/// PyTorch's `at::detail::Array<char*, N>` of an elementwise kernel's operands), which is a use
/// only if every one of its words is an allocation's start or zero (order/).
///
/// Its buffers (and [`Words`]'s) are `ArrayVec`s: nothing is written to them before it is
/// used (zeroing them at every launch, and copying `Words`' whole at every flush, was ~600
/// instructions a launch: docs/performance.md, "Launch check (stand-in CUDA)").
struct Whole {
    on: bool,
    words: ArrayVec<u64, { order::WORDS }>,
    /// Where each group starts in `words`; its end is the next one's start (or the end).
    groups: ArrayVec<u8, { order::WORDS }>,
}

impl Whole {
    fn new() -> Whole {
        Whole {
            on: order::active(),
            words: ArrayVec::new(),
            groups: ArrayVec::new(),
        }
    }

    /// Starts a parameter's group; false when there is no room for `len` more words.
    fn begin(&mut self, len: usize) -> bool {
        if !self.on || self.words.len() + len > order::WORDS {
            return false;
        }
        self.groups.push(self.words.len() as u8);
        true
    }

    fn push(&mut self, word: u64) {
        self.words.push(word);
    }
}

struct Words {
    words: ArrayVec<u64, BATCH>,
    /// Each word's parameter, its offset, and whether it is the whole of a parameter of exactly
    /// 8 bytes at an 8-aligned offset (a pointer parameter, or an 8-byte struct of integers):
    /// only there is exactly the freed allocation's start evidence (a stale launch). A word
    /// inside a wider parameter passed by value (a struct: a pointer, a stale pointer in a slot
    /// the kernel does not read, or two 32-bit integers side by side) or in a packed buffer
    /// whose layout no query gave is never evidence: a suspect.
    at: ArrayVec<(u32, u32, bool), BATCH>,
    /// [`isolate::LOW`] and [`isolate::HIGH`] as the launch began (a free on another thread
    /// during the launch is a race of the program's either way).
    low: u64,
    high: u64,
}

impl Words {
    fn push(&mut self, word: u64, index: u32, offset: u32, whole: bool, out: &mut Found) {
        if word < self.low || word >= self.high {
            return; // below or above everything ever freed: the common case, no lock
        }
        self.words.push(word);
        self.at.push((index, offset, whole));
        if self.words.is_full() {
            self.flush(out);
        }
    }

    fn flush(&mut self, out: &mut Found) {
        if self.words.is_empty() {
            return;
        }
        let (words, at) = (&self.words, &self.at);
        let _t = profile::PartSpan::start(profile::Part::LaunchLookup);
        isolate::lookup_each(words, |i, e| out.found(at[i], words[i], e));
        self.words.clear();
        self.at.clear();
    }
}

struct Found {
    api: Api,
    layout: &'static Layout,
    guarded: Vec<Hit>,
    /// Words found in quarantine, and those of unread parameters, that may lie in a block
    /// whose poison is deferred.
    near: Near,
}

impl Found {
    fn found(&mut self, (index, offset, whole): (u32, u32, bool), ptr: u64, e: isolate::Entry) {
        HITS.fetch_add(1, Relaxed);
        if release::pending() {
            self.near.note(ptr, release::deferred_span());
        }
        let mut h = Hit {
            api: self.api,
            layout: self.layout,
            index,
            offset,
            ptr,
            e,
            ts: now_ns(),
            tid: gettid(),
            device: event::current_device(),
            stack: 0,
        };
        // The evidence rule (docs/isolation.md, "The launch check's evidence"): a stale launch
        // only when a parameter of its own, exactly pointer-sized, holds exactly the start of
        // the freed allocation (what a framework hands a kernel as a tensor's data). Measured on
        // the H200, everything weaker fired on correct programs: a word inside a struct passed
        // by value (PyTorch's `OffsetCalculator` dividers, 0x7_ba2e_8ba3; pairs such as
        // (5, 7) = 0x7_0000_0005: 41 false stale launches a BERT run under bf16 autocast), even
        // when it is exactly an allocation's start (unused slots of `CatArrInputTensorMetadata`
        // and `ReduceOp` that keep an earlier launch's buffer: 93 a GPT-2 run, 1 in a DataLoader
        // run), and a whole 8-byte parameter inside an allocation but not at its start
        // (`StoreWithCast<1>`: dtype 6 and element size 4 around padding read 0x4_0ea2_7d06:
        // 2 a BERT run). Those are stale *values*, suspects: listed, never a finding.
        // Alignment is not evidence either: 0x3_8000_0000 is both a well-aligned address and
        // the pair (0x8000_0000, 3).
        let wide = ptr != e.ptr || !whole;
        let first = WARNED.lock().get_or_insert_with(HashSet::new).insert((
            h.kernel(),
            e.alloc_seq ^ e.ptr,
            !wide && !e.guarded(),
        ));
        if first || e.guarded() {
            h.stack = stacks::capture();
        }
        if e.guarded() {
            if first {
                h.submit(Record::StaleValue);
            }
            self.guarded.push(h);
        } else if wide {
            if first {
                h.submit(Record::StaleValue);
            }
        } else if first {
            // Recorded and said once per kernel and allocation.
            warn(&format!(
                "STALE LAUNCH: kernel {} got 0x{ptr:x} (parameter {index}, byte {offset}), inside \
                 allocation 0x{:x} ({} bytes) freed at event {}{}",
                h.layout.name,
                e.ptr,
                e.size,
                e.free_seq,
                h.said_at()
            ));
            h.submit(Record::StaleLaunch);
        }
    }
}

impl Hit {
    /// Where its calls were, for its stderr line ([`stacks::said_at`]).
    fn said_at(&self) -> String {
        stacks::said_at(&[
            ("launched", self.stack),
            ("allocated", self.e.alloc_stack),
            ("freed", self.e.free_stack),
        ])
    }

    fn record(&self, seq: u64) -> StaleLaunch {
        StaleLaunch {
            seq,
            ts_ns: self.ts,
            tid: self.tid,
            device: self.device,
            api: self.api,
            kernel: self.layout.name.clone(),
            param_index: self.index,
            param_offset: self.offset,
            ptr: self.ptr,
            alloc_ptr: self.e.ptr,
            alloc_size: self.e.size,
            alloc_seq: self.e.alloc_seq,
            free_seq: self.e.free_seq,
            free_ts_ns: self.e.free_ts,
            alloc_stack: self.e.alloc_stack,
            free_stack: self.e.free_stack,
        }
    }
}

/// What [`check`] saw of one launch.
pub struct Checked {
    /// Guard mode's hits, to be handed to [`launched`].
    pub guarded: Option<Guarded>,
    /// The launch may reach memory whose poison is still deferred ([`super::release::defer`]):
    /// a word it was handed lies in quarantine, or one the check does not look up (in a wide
    /// struct) lies in a deferred block, or its parameters could not be read. Its poisons must
    /// be queued first.
    pub reaches: bool,
}

impl Checked {
    /// Nothing to look at: no parameters, or nothing freed yet and no order check.
    const NOTHING: Checked = Checked {
        guarded: None,
        reaches: false,
    };
    /// The parameters could not be read (or the check failed): taken as reaching.
    pub const UNREAD: Checked = Checked {
        guarded: None,
        reaches: true,
    };
}

/// Words of a launch that may reach a block whose poison is deferred: found in quarantine by the
/// look-up, or in a parameter the check does not look up (a wide struct), and inside the
/// span of the deferred poisons ([`release::deferred_span`]). Looked up among the deferred
/// blocks once the walk is done ([`Near::reaches`]): a word inside a block poisoned long ago
/// (a small integer that happens to be an address inside a large freed block) does not make
/// the launch wait for the poisons.
struct Near {
    n: usize,
    words: [u64; 16],
    /// More than fit: taken as reaching.
    over: bool,
}

impl Near {
    const EMPTY: Near = Near {
        n: 0,
        words: [0; 16],
        over: false,
    };

    /// Keeps `word` if it lies in [low, high).
    fn note(&mut self, word: u64, (low, high): (u64, u64)) {
        if self.over || word < low || word >= high {
            return;
        }
        if self.n == self.words.len() {
            self.over = true;
            return;
        }
        self.words[self.n] = word;
        self.n += 1;
    }

    /// The words of an unread parameter of `size` bytes at `value`, while poisons wait.
    ///
    /// # Safety
    /// `value` points at `size` readable bytes.
    unsafe fn scan(&mut self, value: *const u8, size: usize) {
        if self.over || !release::pending() {
            return;
        }
        let span = release::deferred_span();
        let words = size / 8;
        // First whether any word lies in the span at all, branch-free so that it vectorises
        // (cuDNN's and CUTLASS's parameter blocks are up to 300 words, nearly always outside).
        let (low, len) = (span.0, span.1.wrapping_sub(span.0));
        let any = (0..words).fold(false, |any, k| {
            // SAFETY: `8 * k + 8 <= size` bytes at `value` (the caller's contract).
            let word = unsafe { std::ptr::read_unaligned(value.add(8 * k) as *const u64) };
            any | (word.wrapping_sub(low) < len)
        });
        if !any {
            return;
        }
        let mut at = 0;
        while at + 8 <= size {
            // SAFETY: `at + 8 <= size` bytes at `value` (the caller's contract).
            let word = unsafe { std::ptr::read_unaligned(value.add(at) as *const u64) };
            self.note(word, span);
            at += 8;
        }
    }

    fn reaches(&self) -> bool {
        self.over || (self.n > 0 && release::deferred_holds_any(&self.words[..self.n]))
    }
}

/// Checks a launch's parameters: its guard-mode hits, to be handed to [`launched`], and
/// whether it may reach a deferred poison's memory. The launch and its whole 8-byte parameters
/// go to the stream-order check too.
///
/// # Safety
/// `params` and `extra` are a launch's arguments, as the driver reads them.
pub unsafe fn check(
    api: Api,
    f: CUfunction,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Checked {
    CHECKED.fetch_add(1, Relaxed);
    let mut whole = Whole::new();
    let mut name = "";
    // SAFETY: the caller's contract.
    let checked = unsafe { walk(api, f, params, extra, &mut whole, &mut name) };
    if whole.on {
        let _t = profile::PartSpan::start(profile::Part::LaunchOrder);
        order::launch(
            stream,
            api.per_thread_stream(),
            &whole.words,
            &whole.groups,
            name,
        );
    }
    checked
}

/// The walk of [`check`]: `whole` gets the whole 8-byte parameters (when on), `name` the
/// kernel's name (when its layout was looked up).
///
/// # Safety
/// As [`check`].
unsafe fn walk(
    api: Api,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    whole_words: &mut Whole,
    name: &mut &'static str,
) -> Checked {
    if isolate::HIGH.load(Relaxed) == 0 && !whole_words.on {
        return Checked::NOTHING; // nothing freed yet, and no order check
    }
    let mut words = Words {
        words: ArrayVec::new(),
        at: ArrayVec::new(),
        low: isolate::LOW.load(Relaxed),
        high: isolate::HIGH.load(Relaxed),
    };
    // Both tiers read only what can be evidence or a use: a whole 8-byte parameter and a
    // struct of at most GROUP words (an array of operands). A wider struct's words (cuDNN's
    // and CUTLASS's kilobyte parameter blocks: 1.5 µs a launch on ResNet-50, an eighth of its
    // step on the H100) can only be suspects, never a finding, so isolate mode leaves them
    // (full coverage is of bytes: every freed byte poisoned and checked, which no launch's
    // reading adds to); guard mode keeps them (a fault names its suspects).
    let narrow = !config::get().guard;
    let unread = |size: u32| narrow && size > 8 * order::GROUP as u32;
    if !params.is_null() {
        let layout = layout(f);
        *name = layout.name.as_str();
        if !layout.known {
            UNCHECKED.fetch_add(1, Relaxed);
            return Checked::UNREAD; // the array's length is the parameter count, which nothing gave
        }
        let mut out = Found {
            api,
            layout,
            guarded: Vec::new(),
            near: Near::EMPTY,
        };
        for (i, &(off, size)) in layout.params.iter().enumerate() {
            // SAFETY: `params` holds one pointer per parameter of `f` (the caller's contract:
            // the launch's own arguments), and the layout has `f`'s parameter count.
            let value = unsafe { *params.add(i) } as *const u8;
            if value.is_null() {
                continue;
            }
            if unread(size) {
                // SAFETY: `value` points at parameter `i`, `size` bytes (the driver's layout).
                unsafe { out.near.scan(value, size as usize) };
                continue;
            }
            let mut at = 0u32;
            // The order check's group: a whole pointer-sized parameter, or a small struct of
            // whole words.
            let group = off % 8 == 0
                && size % 8 == 0
                && (8..=8 * order::GROUP as u32).contains(&size)
                && whole_words.begin(size as usize / 8);
            while at + 8 <= size {
                // SAFETY: `value` points at parameter `i`, `size` bytes (the driver's layout),
                // and `at + 8 <= size`.
                let word =
                    unsafe { std::ptr::read_unaligned(value.add(at as usize) as *const u64) };
                // The whole parameter only when it is exactly 8 bytes at an 8-aligned offset.
                let whole = size == 8 && off % 8 == 0;
                if group {
                    whole_words.push(word);
                }
                words.push(word, i as u32, off + at, whole, &mut out);
                at += 8;
            }
        }
        words.flush(&mut out);
        return Checked {
            reaches: out.near.reaches(),
            guarded: (!out.guarded.is_empty()).then_some(Guarded(out.guarded)),
        };
    }
    if extra.is_null() {
        return Checked::NOTHING;
    }
    // CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, END
    let (mut buf, mut size) = (std::ptr::null::<u8>(), 0usize);
    let mut i = 0;
    loop {
        // SAFETY: `extra` is the launch's key/value list, ended by CU_LAUNCH_PARAM_END (the
        // caller's contract); `i` is a key's place, reached only before the end was read.
        let key = unsafe { *extra.add(i) } as usize;
        match key {
            CU_LAUNCH_PARAM_END => break,
            // SAFETY: a key other than the end is followed by its value.
            CU_LAUNCH_PARAM_BUFFER_POINTER => buf = unsafe { *extra.add(i + 1) } as *const u8,
            // SAFETY: as above; the value of BUFFER_SIZE points at a size_t.
            CU_LAUNCH_PARAM_BUFFER_SIZE => size = unsafe { *(*extra.add(i + 1) as *const usize) },
            _ => {}
        }
        i += 2;
        if i > 64 {
            break;
        }
    }
    if buf.is_null() {
        return Checked::NOTHING;
    }
    let layout = layout(f);
    *name = layout.name.as_str();
    let mut out = Found {
        api,
        layout,
        guarded: Vec::new(),
        near: Near::EMPTY,
    };
    let mut at = 0usize;
    while at + 8 <= size {
        // SAFETY: the packed buffer holds `size` bytes (its BUFFER_SIZE), `at + 8 <= size`.
        let word = unsafe { std::ptr::read_unaligned(buf.add(at) as *const u64) };
        // The parameter the word lies in; a word in padding or across two parameters is no
        // value of one (skipped).
        let (index, whole) = if layout.known {
            match layout
                .params
                .iter()
                .position(|&(o, sz)| o as usize <= at && at + 8 <= (o + sz) as usize)
            {
                Some(i) if unread(layout.params[i].1) => {
                    // SAFETY: the packed buffer holds `size` bytes, `at + 8 <= size`.
                    unsafe { out.near.scan(buf.add(at), 8) };
                    at += 8;
                    continue;
                }
                Some(i) => {
                    let (o, sz) = layout.params[i];
                    (i as u32, o as usize == at && sz == 8)
                }
                None => {
                    at += 8;
                    continue;
                }
            }
        } else {
            (0, false) // no layout: never a whole parameter, so never evidence
        };
        if whole && whole_words.begin(1) {
            whole_words.push(word);
        }
        words.push(word, index, at as u32, whole, &mut out);
        at += 8;
    }
    words.flush(&mut out);
    Checked {
        reaches: out.near.reaches(),
        guarded: (!out.guarded.is_empty()).then_some(Guarded(out.guarded)),
    }
}

/// Guard-mode hits of submitted launches not yet covered by a clean device-wide
/// synchronisation, with the synchronisation generation each was submitted in.
static SUSPECTS: ForkLock<VecDeque<(u64, Hit)>> = ForkLock::new(VecDeque::new());
/// Most suspects kept (the oldest go first; one per kernel and allocation).
const SUSPECTS_CAP: usize = 256;
/// Set by the first device fault seen: a context that faulted stays faulted.
static FAULTED: AtomicBool = AtomicBool::new(false);

/// After the real launch returned `r`: its guard-mode hits become suspects, and a fault code
/// (a sticky error from an earlier kernel) is a device fault.
pub fn launched(api: Api, guarded: Option<Guarded>, r: CUresult) {
    if let Some(Guarded(hits)) = guarded {
        // Read after the submission: a synchronisation that begins later covers this launch.
        let generation = sync::generation();
        let mut s = SUSPECTS.lock();
        forget_covered(&mut s);
        for h in hits {
            s.retain(|(_, o)| {
                !(o.kernel() == h.kernel() && o.e.alloc_seq == h.e.alloc_seq && o.e.ptr == h.e.ptr)
            });
            if s.len() == SUSPECTS_CAP {
                s.pop_front();
            }
            s.push_back((generation, h));
        }
    }
    if r != CUDA_SUCCESS {
        device_fault(api.name(), r);
    }
}

/// Drops the suspects a clean device-wide synchronisation covered: every launch submitted
/// before it began ran without a fault, so its stale values were not used.
fn forget_covered(s: &mut VecDeque<(u64, Hit)>) {
    let clean = sync::clean_up_to();
    s.retain(|(generation, _)| *generation >= clean);
}

/// A call the library saw returned `r`: if it is a device fault (the first), record it, name
/// the suspects, and say so on stderr.
pub fn device_fault(by: &str, r: i32) {
    let Some(what) = isolate_trace::device_fault_name(r as u64) else {
        return;
    };
    if FAULTED.swap(true, AcqRel) {
        return;
    }
    let suspects: Vec<Hit> = {
        let mut s = SUSPECTS.lock();
        forget_covered(&mut s);
        s.drain(..).map(|(_, h)| h).collect()
    };
    let mut text = format!("DEVICE FAULT: CUDA error {r} ({what}) returned by {by}");
    if suspects.is_empty() {
        text.push_str(if crate::base::config::get().guard {
            "; no launch since the last clean synchronisation got a pointer into freed guard \
             memory (an out-of-bounds access, or an address computed inside a kernel)"
        } else {
            ""
        });
    } else {
        text.push_str(
            "; launched since the last clean synchronisation with a pointer into \
                       freed, unmapped memory:",
        );
    }
    event::note(
        NoteKind::DeviceFault,
        0,
        suspects.len() as u64,
        r as u64,
        text.clone(),
    );
    warn(&text);
    for h in &suspects {
        warn(&format!(
            "  suspect: kernel {} got 0x{:x} (parameter {}, byte {}), inside allocation 0x{:x} \
             ({} bytes) freed at event {}{}",
            h.layout.name,
            h.ptr,
            h.index,
            h.offset,
            h.e.ptr,
            h.e.size,
            h.e.free_seq,
            h.said_at()
        ));
        h.submit(Record::StaleLaunch);
    }
}

/// The longest the exit waits for the device to say whether a kernel faulted ([`fault_at_exit`]).
const FAULT_AT_EXIT_LIMIT_NS: u64 = 5_000_000_000;

/// At exit in guard mode, when no fault was seen yet: a kernel nobody waited for (the program
/// ends right after its launch, `kernel<<<1,1>>>(p); return 0;`) may have faulted, and no call
/// of the program would ever say so. An event is recorded on the legacy default stream (after
/// the work of every blocking stream of the exiting thread's context) and polled for at most
/// [`FAULT_AT_EXIT_LIMIT_NS`] (a hung kernel must not hold the exit up); a fault code it gives
/// back is the device fault, naming the suspects. Nothing is done without a current context.
pub fn fault_at_exit() {
    if FAULTED.load(Acquire) {
        return;
    }
    let Ok(ctx) = cu::ctx_get_current() else {
        return;
    };
    if ctx.is_null() {
        return;
    }
    const BY: &str = "the device at exit (an event after the program's last work)";
    const NOT_READY: CUresult = 600;
    // CU_EVENT_DISABLE_TIMING. A kernel that faulted before the exit (the usual case: a tiny
    // kernel ends long before the process does) left the context's sticky error, which is then
    // every call's answer, this one's too (seen on the H200): that answer is the fault.
    let ev = match cu::event_create(2) {
        Ok(ev) => ev,
        Err(cu::CuError::Code(r)) if r >= 700 => return device_fault(BY, r),
        Err(_) => return,
    };
    // SAFETY: the library's own event, just made; the legacy default stream of the current
    // context always exists.
    let mut r = match unsafe { cu::event_record(ev, std::ptr::null_mut()) } {
        Ok(()) => CUDA_SUCCESS,
        Err(cu::CuError::Code(c)) => c,
        Err(cu::CuError::Missing) => CUDA_SUCCESS,
    };
    if r == CUDA_SUCCESS {
        let deadline = now_ns() + FAULT_AT_EXIT_LIMIT_NS;
        loop {
            // SAFETY: the event made above, not destroyed yet.
            r = match unsafe { cu::event_query(ev) } {
                Ok(()) | Err(cu::CuError::Missing) => CUDA_SUCCESS,
                Err(cu::CuError::Code(c)) => c,
            };
            if r != NOT_READY || now_ns() > deadline {
                break;
            }
            crate::base::sys::nap(200_000);
        }
    }
    // SAFETY: the library's event, not used after this.
    let _ = unsafe { cu::event_destroy(ev) };
    if r >= 700 {
        device_fault(BY, r);
    }
}

/// In a fork child: the parent's launches are not this process's.
pub fn after_fork_child() {
    // Another thread of the parent may have held these locks at the fork.
    SUSPECTS.reset_in_child(VecDeque::new());
    LAYOUTS.reset_in_child(None);
    WARNED.reset_in_child(None);
    FAULTED.store(false, Release);
}

/// The note written at exit with the launch-check counters.
pub fn note_at_exit() {
    let checked = CHECKED.load(Relaxed);
    let (kernels, unknown) = LAYOUTS.lock().as_ref().map_or((0, 0), |m| {
        (m.len(), m.values().filter(|l| !l.known).count())
    });
    let unchecked = UNCHECKED.load(Relaxed);
    let mut text = format!(
        "launch check: {checked} launches of {kernels} kernels checked, {} stale pointers",
        HITS.load(Relaxed)
    );
    let refits = REFITS.load(Relaxed);
    if refits > 0 {
        text.push_str(&format!(
            "; {refits} cached layouts asked of the driver again after a module unload, context \
             destruction or library unload"
        ));
    }
    if unknown > 0 {
        text.push_str(&format!(
            "; {unknown} kernels had no parameter layout (cuFuncGetParamInfo and \
             cuKernelGetParamInfo did not answer): {unchecked} of their launches could not be \
             read, and a packed buffer's words were suspects only"
        ));
    }
    event::cost_note(
        isolate_trace::CostTopic::LaunchCheck,
        HITS.load(Relaxed),
        checked,
        text,
    );
}

//! Call stacks: captured on the calling thread at every recorded event (and at a stale launch),
//! interned, and written once each into the trace (format version 2) as `Stack` records with
//! the `Module` and `PyCode` records they name, so the analyzer symbolises offline.
//!
//! [`capture`] walks the native frames ([`native`], DWARF unwinding through `framehop`) and the
//! Python frames ([`python`], read from CPython's structures), merges them — each activation of
//! `_PyEval_EvalFrameDefault` among the native frames is replaced by the Python frames it runs —
//! and returns the stack's id. The hot path takes no lock: a per-thread table maps a 128-bit
//! hash of the raw frames to the id. Only a stack this thread has not seen takes the process's
//! lock, and a stack the process has not seen is described there (modules, code objects,
//! lines) and submitted, with every definition it names, **while the lock is held**: no thread
//! can hand the writer a record naming an id before its definition is queued.
//!
//! Layer: recording. Uses the base, [`super::writer`] and its own [`modules`], [`native`],
//! [`python`].

pub mod modules;
pub mod native;
pub mod python;
mod quick;

use super::profile::{Part, PartSpan, Sampled, timed};
use super::writer;
use crate::base::config::{self, Stacks};
use crate::base::sys::ForkLock;
use isolate_trace::{Frame, Module, PyCode, Record, Stack, StackOf};
use std::cell::Cell;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, Ordering::*};

/// The most frames a stack may have (`ISOLATE_STACK_DEPTH` is at most this).
pub const MAX_DEPTH: usize = 256;

/// One frame before it is described.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RawFrame {
    Native(u64),
    Python(python::Raw),
}

struct Table {
    /// (epoch of the snapshot, frames) → Stack id: the same return addresses are another
    /// stack once a library was loaded where another was ([`modules::Snapshot::epoch`]).
    stacks: HashMap<(u64, Box<[RawFrame]>), u32>,
    /// A loaded object's serial ([`modules::Obj::serial`]) → its Module id.
    modules: HashMap<u64, u32>,
    /// (code, file, name, first line) → PyCode id.
    codes: HashMap<(u64, u64, u64, i32), u32>,
    /// PyCode id → (file, name), as written in its record: for [`place`].
    code_text: HashMap<u32, (String, String)>,
    /// Stack id → where in the program's Python code it was ([`place`]), for stacks with
    /// Python frames.
    places: HashMap<u32, String>,
    next_stack: u32,
    next_module: u32,
    next_code: u32,
}

impl Table {
    fn new() -> Table {
        Table {
            stacks: HashMap::new(),
            modules: HashMap::new(),
            codes: HashMap::new(),
            code_text: HashMap::new(),
            places: HashMap::new(),
            next_stack: 1,
            next_module: 1,
            next_code: 1,
        }
    }
}

static TABLE: ForkLock<Option<Table>> = ForkLock::new(None);
/// Bumped when the table starts again (a fork child): per-thread entries of older generations
/// are stale.
static GENERATION: AtomicU32 = AtomicU32::new(1);

/// Stacks a thread's cache holds (two-way set-associative by hash). A training step of ResNet-50 has
/// ~1,400 allocation and free sites, each met once a step: a cache much smaller than that
/// misses most of them every step, and each miss takes the process's lock and builds a key.
const SLOTS: usize = 4096;

/// A cache slot: (hash, hash2, id, generation).
type Seen = Cell<(u64, u64, u32, u32)>;

thread_local! {
    // Made on the thread's first stack (96 KiB on the heap, not in static TLS: threads with
    // small stacks keep their room) and freed when it ends; during and after the thread's
    // teardown `try_with` fails and the process's table answers.
    static SEEN: Box<[Seen]> =
        (0..SLOTS).map(|_| Cell::new((0, 0, 0, 0))).collect();
}

/// The calling thread's stack, interned: its id, or 0 when stacks are off (`ISOLATE_STACKS=none`),
/// nothing could be captured, or recording is off. Never fails the caller: a capture that
/// panics gives 0.
///
/// Checked first, before anything is reserved on the stack: the capture's own frames hold
/// ~4 KiB of frame buffers ([`merge_and_intern`], never inlined here), and a thread whose stack
/// has less than [`CAPTURE_ROOM`] left (glibc allows 16 KiB stacks) gets no stack rather
/// than a fault ([`small_stacks`] counts them).
///
/// Captures are timed for the exit note's cost one in [`Sampled::EVERY`] after the first
/// [`Sampled::FIRST`] (two clock reads each, 18–45 ns a read, where a capture is ~0.3–1 µs).
pub fn capture() -> u32 {
    capture_at(Site::Other)
}

/// [`capture`] for a free. On a thread that runs Python, a free's stack is its Python frames
/// alone (unless `ISOLATE_NATIVE_FRAMES=all`): the native frames nearest a free are the
/// allocator's and the tensor's release (`c10::StorageImpl`, the deleter), the same for every
/// free, and the line that dropped the tensor is a Python frame. A thread without Python
/// (PyTorch's autograd engine) keeps its native frames: they name the backward node.
pub fn capture_free() -> u32 {
    capture_at(Site::Free)
}

/// What a capture is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Site {
    Free,
    Other,
}

/// The native frames a stack keeps before its Python frames on a thread that runs Python
/// (`ISOLATE_NATIVE_FRAMES`, at most [`FAST_NATIVE`] in the fast tier; `usize::MAX` for `all`):
/// the merge's budget, and so the quick key's.
fn python_budget(fast: bool) -> usize {
    match config::get().native_frames as usize {
        0 => usize::MAX,
        n if fast => n.min(FAST_NATIVE),
        n => n,
    }
}

/// Whether a capture for `site` on a thread that runs Python keeps its Python frames alone: a
/// free's, unless every native frame is asked for (`ISOLATE_NATIVE_FRAMES=all`).
fn python_only(site: Site) -> bool {
    site == Site::Free && config::get().native_frames != 0
}

fn capture_at(site: Site) -> u32 {
    let cfg = config::get();
    if cfg.stacks == Stacks::None || !writer::active() {
        return 0;
    }
    if native::stack_room().is_some_and(|room| room < CAPTURE_ROOM) {
        SMALL_STACKS.fetch_add(1, Relaxed);
        return 0;
    }
    let s = CAPTURES.start();
    let id = std::panic::catch_unwind(|| capture_inner(cfg.stacks, cfg.stack_depth as usize, site))
        .unwrap_or(0);
    CAPTURES.stop(s);
    id
}

/// The stack a capture may use below its caller: its frame buffers (`MAX_DEPTH` merged
/// frames of 16 bytes, 4 KiB; the Python frames are the thread's memo, on the heap), the walk
/// (framehop's iterator, a few KiB) and the first stack's interning (hash maps, the
/// allocator), with room to spare for the signal handlers the program may run on top.
/// Measured: the frame of [`merge_and_intern`] is 4.3 KiB in the test build (the capture's
/// frames were 22.3 KiB until the twenty-first session, with the Python frames and merged
/// frames copied on the stack, and 34.3 KiB before that, reserved by `capture` itself).
pub const CAPTURE_ROOM: u64 = 48 << 10;

/// The most native frames the fast tier walks before a thread's Python frames.
pub const FAST_NATIVE: usize = 4;

/// Captures skipped because the calling thread's stack had less than [`CAPTURE_ROOM`] left.
static SMALL_STACKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Events whose stack was left out because their thread's stack was too small for a capture.
pub fn small_stacks() -> u64 {
    SMALL_STACKS.load(Relaxed)
}

/// Stacks the thread's cache did not have ([`intern`]): looked up in the process's table.
static LOOKED_UP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Stacks looked up in the process's table so far (the rest came from the threads' caches).
pub fn looked_up() -> u64 {
    LOOKED_UP.load(Relaxed)
}

static CAPTURES: Sampled = Sampled::new();

/// Stacks captured so far and the time the calling threads spent on them (ns; estimated,
/// [`Sampled`]). Noted at exit.
pub fn cost() -> (u64, u64) {
    CAPTURES.total()
}

/// Records that the record numbered `seq` (a stale launch, a stale value) was made from
/// `stack` (from [`capture`] on the thread that made it). Nothing for stack 0.
pub fn stack_of(seq: u64, stack: u32) {
    if stack != 0 {
        writer::submit_definition(Record::StackOf(StackOf { seq, stack }));
    }
}

/// In a fork child: its trace starts empty, so every stack, module and code object is written
/// again there.
pub fn after_fork_child() {
    TABLE.reset_in_child(None);
    GENERATION.fetch_add(1, AcqRel);
    modules::after_fork_child();
}

/// The frame that stands for native frames left out by `ISOLATE_NATIVE_FRAMES` (between the
/// native frames kept and the Python frames): no return address is 0.
pub const GAP: u64 = 0;

/// The merge of native and Python frames, done as the native walk goes: each native frame
/// inside the evaluation loop (`eval`) is replaced by the Python frames of the next activation,
/// any other stays; at `depth` frames, or past the native frames' budget, the walk stops.
/// Activations left over (the walk stopped early, or the loop's range is unknown) go after the
/// native frames, outermost last ([`Merge::python_left`]).
struct Merge<'a> {
    py: &'a [python::Raw],
    eval: Option<(u64, u64)>,
    depth: usize,
    /// The native frames kept before the walk stops (`ISOLATE_NATIVE_FRAMES`, in a process
    /// that runs Python; else unbounded), and those kept so far.
    native_budget: usize,
    native_n: usize,
    /// The next Python frame to place.
    pi: usize,
    frames: [MaybeUninit<Item>; MAX_DEPTH],
    n: usize,
    truncated: bool,
    /// The last native return address the walk handed over (0: none).
    last: u64,
}

impl<'a> Merge<'a> {
    fn new(
        py: &'a [python::Raw],
        eval: Option<(u64, u64)>,
        depth: usize,
        native_budget: usize,
    ) -> Self {
        Merge {
            py,
            eval,
            depth,
            native_budget,
            native_n: 0,
            pi: 0,
            // Not zeroed: only what is written is read.
            frames: [const { MaybeUninit::uninit() }; MAX_DEPTH],
            n: 0,
            truncated: false,
            last: 0,
        }
    }

    /// Back to no frames placed (the buffers stay; only what is written is read).
    fn reset(&mut self) {
        self.native_n = 0;
        self.pi = 0;
        self.n = 0;
        self.truncated = false;
        self.last = 0;
    }

    /// Appends `f`; false (and the stack marked truncated) when `depth` frames are there.
    fn push(&mut self, f: Item) -> bool {
        if self.n == self.depth {
            self.truncated = true;
            return false;
        }
        self.frames[self.n].write(f);
        self.n += 1;
        true
    }

    /// The native walk's next return address; false once the stack is full.
    #[inline]
    fn native(&mut self, pc: u64) -> bool {
        self.last = pc;
        match self.eval {
            Some((lo, hi)) if self.pi < self.py.len() && pc > lo && pc <= hi => {
                let act = self.py[self.pi].act;
                while self.pi < self.py.len() && self.py[self.pi].act == act {
                    if !self.push(Item::Python(self.pi as u32)) {
                        return false;
                    }
                    self.pi += 1;
                }
                true
            }
            _ if self.native_n == self.native_budget => {
                // The budget is spent: the Python frames still to place follow a gap marker
                // (`Native(0)`, "native frames left out"); the outer native frames are dropped.
                if self.pi < self.py.len() {
                    self.push(Item::Native(GAP));
                } else if self.py.is_empty() {
                    // No Python to follow: the stack is cut here.
                    self.truncated = true;
                }
                false
            }
            _ => {
                self.native_n += 1;
                self.push(Item::Native(pc))
            }
        }
    }

    /// The frames placed.
    fn items(&self) -> &[Item] {
        // SAFETY: `push` wrote `frames[n]` before it incremented `n`, and nothing else
        // changes `n` but `reset` (to 0), so the first `n` are initialised.
        unsafe { std::slice::from_raw_parts(self.frames.as_ptr().cast(), self.n) }
    }

    /// The frames placed, as the table keys them.
    fn raw_frames(&self) -> Vec<RawFrame> {
        self.items()
            .iter()
            .map(|&it| match it {
                Item::Native(pc) => RawFrame::Native(pc),
                Item::Python(i) => RawFrame::Python(self.py[i as usize]),
            })
            .collect()
    }

    /// The stack's two hashes ([`hashes`]), from the frames placed.
    fn hashes(&self, truncated: bool, epoch: u64) -> (u64, u64) {
        let py = self.py;
        hashes(
            self.items().iter().map(|&it| match it {
                Item::Native(pc) => pc,
                Item::Python(i) => py[i as usize].dig ^ PYTHON_WORD,
            }),
            self.n,
            truncated,
            epoch,
        )
    }

    /// The Python frames no native frame stood for, outermost last.
    fn python_left(&mut self) {
        // As many as fit, in one run (no check of the depth a frame); cut short, marked so.
        let left = self.py.len() - self.pi;
        let k = left.min(self.depth - self.n);
        for (slot, i) in self.frames[self.n..self.n + k].iter_mut().zip(self.pi..) {
            slot.write(Item::Python(i as u32));
        }
        self.n += k;
        self.pi += k;
        if k < left {
            self.truncated = true;
        }
    }
}

/// Never inlined into [`capture`]: its frames (the buffers) are reserved only once the
/// capture is known to be wanted and to fit.
#[inline(never)]
fn capture_inner(mode: Stacks, depth: usize, site: Site) -> u32 {
    let want_native = matches!(mode, Stacks::Native | Stacks::All);
    let want_python = matches!(mode, Stacks::Python | Stacks::All);
    let Some(snap) = modules::current(false) else {
        return 0;
    };
    let fast = config::get().fast_isolation();
    // A stack the thread has seen is looked up by a key read in one pass (`quick`); the full
    // way (describing, merging) is walked only for a stack it has not.
    let quick = if want_python {
        timed(Part::PythonFrames, || {
            quick::quick(snap, depth, want_native, fast, site)
        })
    } else {
        None
    };
    if let Some(k) = quick
        && let Some(id) = timed(Part::Interning, || seen((k.0, k.1)))
    {
        return id;
    }
    // Python first (cheap): the native walk stops once the merged stack is `depth` deep.
    let _t = PartSpan::start(Part::PythonFrames);
    let rest = |py: &[python::Raw], py_truncated: bool| {
        drop(_t);
        // A free on a thread that runs Python: its Python frames alone.
        let native = want_native && (py.is_empty() || !python_only(site));
        (
            merge_and_intern(py, py_truncated, native, depth, snap),
            py.len(),
        )
    };
    let (id, python) = if want_python {
        python::with_frames(snap.generation, depth, rest)
    } else {
        rest(&[], false)
    };
    // Kept under the key only when the stack was made of the frames the key read (not the
    // native frames alone of a capture inside another one's walk, or of a walk that turned
    // Python frames off).
    if let Some(k) = quick
        && id != 0
        && python == k.2
    {
        remember((k.0, k.1), id);
    }
    id
}

/// The stack id the thread's cache holds for key `k` (a stack's hashes, or a quick key).
fn seen((h1, h2): (u64, u64)) -> Option<u32> {
    let generation = GENERATION.load(Acquire);
    // Two ways a set: two stacks met in turn whose hashes fall in one set (an allocation and
    // its free, a loop's two sites) do not evict each other at every call, as they did in a
    // direct-mapped cache (seen: a test's three call sites, one in three calls missing, in the
    // runs where the addresses' hashes collided).
    let set = (h1 as usize) % (SLOTS / 2) * 2;
    SEEN.try_with(|s| {
        s[set..set + 2].iter().find_map(|c| {
            let (a, b, id, g) = c.get();
            (a == h1 && b == h2 && g == generation && id != 0).then_some(id)
        })
    })
    .ok()
    .flatten()
}

/// Keeps `id` in the thread's cache under key `k`.
fn remember((h1, h2): (u64, u64), id: u32) {
    let generation = GENERATION.load(Acquire);
    let set = (h1 as usize) % (SLOTS / 2) * 2;
    let _ = SEEN.try_with(|s| {
        s[set + 1].set(s[set].get());
        s[set].set((h1, h2, id, generation));
    });
}

/// The rest of [`capture_inner`], with the thread's Python frames (`py`) in hand: the native
/// walk merged with them, and the stack interned.
#[inline(never)]
fn merge_and_intern(
    py: &[python::Raw],
    py_truncated: bool,
    want_native: bool,
    depth: usize,
    mut snap: &'static modules::Snapshot,
) -> u32 {
    let eval = if want_native && !py.is_empty() {
        python::eval_range(snap.generation)
    } else {
        None
    };
    // In a process that runs Python: the native frames nearest the call, then (where the thread
    // runs Python) the Python frames; the libraries' frames between them (PyTorch's dispatcher,
    // autograd: ~20-30) cost most of the walk. A thread without Python frames (PyTorch's
    // autograd engine) gets its stack cut there (marked truncated). A native program's stacks
    // are its own code: walked to the depth.
    // The fast tier: where the thread runs Python, its frames name the code, and the native
    // frames before them are the allocator's and the operator's own: at most FAST_NATIVE are
    // walked (0.52 µs for 16 on the H100; a thread without Python, PyTorch's autograd engine,
    // still gets its 16: its autograd node names it).
    let cfg = config::get();
    let fast = cfg.fast_isolation();
    let native_budget = match cfg.native_frames {
        _ if !py.is_empty() => python_budget(fast),
        n if n > 0 && python::eval_range(snap.generation).is_some() => n as usize,
        _ => usize::MAX,
    };
    // A thread without Python frames (PyTorch's autograd engine): its stack is its native walk
    // alone, and a walk replayed whole gives the stack it made before, under the same budget,
    // depth, table and modules (`tag`), without handing on, merging and hashing its frames.
    let tag = (want_native && py.is_empty()).then(|| {
        let t = (native_budget as u64).rotate_left(40)
            ^ (depth as u64).rotate_left(20)
            ^ (GENERATION.load(Acquire) as u64)
            ^ snap.epoch.rotate_left(7);
        t | 1
    });
    if let Some(tag) = tag {
        let _t = PartSpan::start(Part::NativeFrames);
        if let Some(id) = native::replayed_stack(snap, tag) {
            return id;
        }
    }
    let mut m = Merge::new(py, eval, depth, native_budget);
    let mut walked = None;
    if want_native {
        let _t = PartSpan::start(Part::NativeFrames);
        let stopped = walk_native(snap, &mut m);
        walked = native::take_last();
        // Ended in code no known object holds: loaded since the snapshot? Look now (and keep
        // no stack with the walk: the next capture looks again).
        if !stopped && m.last != 0 && snap.find(m.last).is_none() {
            walked = None;
            if let Some(fresh) = modules::after_unknown(snap)
                && !std::ptr::eq(fresh, snap)
            {
                snap = fresh;
                // Started again in place: a second `Merge` would double the frame.
                m.reset();
                walk_native(snap, &mut m);
            }
        }
    }
    m.python_left();
    if m.n == 0 {
        return 0;
    }
    let id = timed(Part::Interning, || {
        intern(&m, m.truncated || py_truncated, snap)
    });
    if let (Some(tag), Some(w)) = (tag, walked)
        && id != 0
    {
        native::remember_stack(w, tag, id);
    }
    id
}

/// The native walk into the merge: one instance of [`native::unwind`], the merge's step
/// inlined into it (it was a call through a `dyn` closure for every frame).
fn walk_native(snap: &modules::Snapshot, m: &mut Merge) -> bool {
    native::unwind(snap, |pc| m.native(pc))
}

/// A frame as the merge places it: a native return address, or the index of a Python frame
/// in the walk's list (16 bytes: the frame itself is copied only for a stack the thread has
/// not seen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    Native(u64),
    Python(u32),
}

/// Mixed into a Python frame's [`python::Raw::dig`] in a stack's hash: a Python frame is
/// not a return address.
const PYTHON_WORD: u64 = 0x5059_7468_6f6e_0000;

fn hashes(
    mut words: impl Iterator<Item = u64>,
    len: usize,
    truncated: bool,
    epoch: u64,
) -> (u64, u64) {
    // Two fixed-key hashers: the same stack hashes the same on every thread. Each runs two
    // lanes, the words taken in turn, so that a word's multiply need not wait for the one
    // before it (a stack of ten Python frames is ~45 words: the chain of multiplies was most
    // of a capture's own time).
    const K1: u64 = 0x9e37_79b9_7f4a_7c15;
    const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;
    const P: u64 = 0x0000_0100_0000_01b3;
    let a0 = K1 ^ len as u64 ^ ((truncated as u64) << 63) ^ epoch.rotate_left(40);
    let b0 = K2.wrapping_add(len as u64) ^ epoch ^ ((truncated as u64) << 62);
    let (mut a, mut c) = (a0, a0 ^ K2);
    let (mut b, mut d) = (b0, b0.rotate_left(32));
    // The words two at a time (no state carried between them: a word held over in an
    // `Option` cost a branch and a move a word).
    while let Some(w) = words.next() {
        let Some(x) = words.next() else {
            // An odd word count's last word: lanes (a, b) alone.
            a = (a ^ w).wrapping_mul(P).rotate_left(29);
            b = (b.rotate_left(17) ^ w).wrapping_mul(K1 | 1);
            break;
        };
        // Two independent lanes: `w` into (a, b), `x` into (c, d).
        a = (a ^ w).wrapping_mul(P).rotate_left(29);
        c = (c ^ x).wrapping_mul(P).rotate_left(29);
        b = (b.rotate_left(17) ^ w).wrapping_mul(K1 | 1);
        d = (d.rotate_left(17) ^ x).wrapping_mul(K1 | 1);
    }
    let a = (a ^ c.rotate_left(23)).wrapping_mul(P);
    let b = (b ^ d.rotate_left(41)).wrapping_mul(K1 | 1);
    (a ^ (a >> 31), b ^ (b >> 29))
}

fn intern(m: &Merge, truncated: bool, snap: &modules::Snapshot) -> u32 {
    let key = m.hashes(truncated, snap.epoch);
    if let Some(id) = seen(key) {
        return id;
    }
    LOOKED_UP.fetch_add(1, Relaxed);
    let id = intern_locked(&m.raw_frames(), truncated, snap);
    if id != 0 {
        remember(key, id);
    }
    id
}

#[cold]
fn intern_locked(frames: &[RawFrame], truncated: bool, snap: &modules::Snapshot) -> u32 {
    let mut guard = TABLE.lock();
    let t = guard.get_or_insert_with(Table::new);
    // The truncation flag is part of the key: the same frames cut short or not are two stacks.
    let mut frames_key: Vec<RawFrame> = frames.to_vec();
    if truncated {
        frames_key.push(RawFrame::Native(u64::MAX));
    }
    let key = (snap.epoch, frames_key.into_boxed_slice());
    if let Some(&id) = t.stacks.get(&key) {
        return id;
    }
    let mut out = Vec::with_capacity(frames.len());
    for f in frames {
        match *f {
            RawFrame::Native(pc) => {
                if let Some((_, o)) = snap.find(pc)
                    && !t.modules.contains_key(&o.serial)
                {
                    let id = t.next_module;
                    t.next_module += 1;
                    t.modules.insert(o.serial, id);
                    writer::submit_definition(Record::Module(Module {
                        id,
                        path: o.path.clone(),
                        base: o.bias,
                        start: o.start,
                        end: o.end,
                        build_id: o.build_id.clone(),
                    }));
                }
                out.push(Frame::Native(pc));
            }
            RawFrame::Python(p) => {
                let ckey = (p.code, p.file, p.name, p.first_line);
                let code = match t.codes.get(&ckey) {
                    Some(&id) => id,
                    None => {
                        let id = t.next_code;
                        t.next_code += 1;
                        t.codes.insert(ckey, id);
                        let (file, name) = python::describe(snap.generation, &p);
                        t.code_text.insert(id, (file.clone(), name.clone()));
                        writer::submit_definition(Record::PyCode(PyCode {
                            id,
                            file,
                            name,
                            first_line: p.first_line.max(0) as u32,
                        }));
                        id
                    }
                };
                out.push(Frame::Python {
                    code,
                    line: python::line(snap.generation, &p),
                });
            }
        }
    }
    let id = t.next_stack;
    t.next_stack += 1;
    if let Some(p) = python_place(&out, &t.code_text) {
        t.places.insert(id, p);
    }
    writer::submit_definition(Record::Stack(Stack {
        id,
        frames: out,
        truncated,
    }));
    t.stacks.insert(key, id);
    id
}

/// Where in the program's Python code stack `id` was (`train.py:39 in main`): its innermost
/// Python frame whose file is not installed code, else its innermost Python frame — the
/// analyzer's rule (`ShownStack::place_of`), for Python frames. None for a stack without Python
/// frames (native frames are symbolised only offline, by the analyzer) and for stack 0. For the
/// library's stderr lines: a lookup under the table's lock, made only when a finding is said.
pub fn place(id: u32) -> Option<String> {
    if id == 0 {
        return None;
    }
    TABLE.lock().as_ref()?.places.get(&id).cloned()
}

/// Where a finding's calls were, for its stderr line: `; launched at bug.py:9 in main,
/// allocated at bug.py:3 in main, freed at bug.py:5 in main` — each call's [`place`] where its
/// stack has Python frames; a stack of native frames only is named by its id and the trace,
/// `freed at stack 2 of /tmp/t.trace (isolate summary names the code)`, since native frames
/// are symbolised only offline. Costs lookups, no capture: the stacks were captured when the
/// calls were recorded (the launch's when the stale pointer was found). Empty without stacks.
pub fn said_at(calls: &[(&str, u32)]) -> String {
    let mut out = String::new();
    let mut offline = false;
    for &(what, id) in calls {
        if id == 0 {
            continue;
        }
        out.push_str(if out.is_empty() { "; " } else { ", " });
        match place(id) {
            Some(p) => out.push_str(&format!("{what} at {p}")),
            None => {
                out.push_str(&format!("{what} at stack {id}"));
                offline = true;
            }
        }
    }
    if offline {
        match writer::path() {
            Some(path) => out.push_str(&format!(" of {path} (isolate summary names the code)")),
            None => out.push_str(" (isolate summary of the trace names the code)"),
        }
    }
    out
}

/// [`place`]'s rule, when the stack is interned.
fn python_place(frames: &[Frame], code_text: &HashMap<u32, (String, String)>) -> Option<String> {
    let python = || {
        frames.iter().filter_map(|f| match *f {
            Frame::Python { code, line } => {
                code_text.get(&code).map(|(file, name)| (file, name, line))
            }
            Frame::Native(_) => None,
        })
    };
    python()
        .find(|(file, _, _)| !installed_python(file))
        .or_else(|| python().next())
        .map(|(file, name, line)| format!("{file}:{line} in {name}"))
}

/// A Python file that is installed code, not the program's: under `site-packages` or
/// `dist-packages`, the standard library, a frozen module (as the analyzer decides).
fn installed_python(f: &str) -> bool {
    f.contains("/site-packages/")
        || f.contains("/dist-packages/")
        || f.contains("/lib/python3.")
        || f.starts_with("<frozen ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(code: u64, act: u32) -> python::Raw {
        python::Raw::new(code, 0, 0, 1, 0, act)
    }

    /// A frame's word in its stack's hash, as [`Merge::hashes`] takes it.
    fn word(f: &RawFrame) -> u64 {
        match f {
            RawFrame::Native(pc) => *pc,
            RawFrame::Python(p) => p.dig ^ PYTHON_WORD,
        }
    }

    fn hashes(frames: &[RawFrame], truncated: bool, epoch: u64) -> (u64, u64) {
        super::hashes(frames.iter().map(word), frames.len(), truncated, epoch)
    }

    /// The interning's two hashes (two lanes each): the same stack the same; a stack that
    /// differs in one frame, in its order, in its truncation, in its epoch, or by a frame more
    /// (odd and even word counts) differently, in both halves.
    #[test]
    fn the_hashes_tell_stacks_apart() {
        let n = |v: &[u64]| v.iter().map(|&p| RawFrame::Native(p)).collect::<Vec<_>>();
        let base = n(&[0x1000, 0x2000, 0x3000]);
        let h = hashes(&base, false, 7);
        assert_eq!(h, hashes(&n(&[0x1000, 0x2000, 0x3000]), false, 7));
        let others = [
            hashes(&n(&[0x1000, 0x2000, 0x3001]), false, 7),
            hashes(&n(&[0x2000, 0x1000, 0x3000]), false, 7),
            hashes(&n(&[0x1000, 0x2000, 0x3000, 0x4000]), false, 7),
            hashes(&n(&[0x1000, 0x2000]), false, 7),
            hashes(&base, true, 7),
            hashes(&base, false, 8),
            hashes(
                &[RawFrame::Python(py(0x1000, 0)), RawFrame::Native(0x2000)],
                false,
                7,
            ),
        ];
        for (i, o) in others.iter().enumerate() {
            assert!(o.0 != h.0 && o.1 != h.1, "{i}: {o:?} against {h:?}");
        }
        for (i, a) in others.iter().enumerate() {
            for b in &others[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    /// Feeds `pcs` to the merge until it says stop; returns the frames and how many were fed.
    fn run(m: &mut Merge, pcs: &[u64]) -> (Vec<RawFrame>, usize) {
        let fed = pcs.iter().take_while(|&&pc| m.native(pc)).count();
        m.python_left();
        (m.raw_frames(), fed)
    }

    #[test]
    fn python_threads_keep_the_nearest_native_frames_then_a_gap_then_python() {
        let p = [py(7, 0), py(8, 0), py(9, 1)];
        // Eval loop at 0x100..=0x200; 30 library frames before the first activation.
        let mut pcs: Vec<u64> = (0..30).map(|i| 0x1000 + i).collect();
        pcs.extend([0x150, 0x2000, 0x150, 0x3000]);
        let mut m = Merge::new(&p, Some((0x100, 0x200)), 64, 3);
        let (frames, fed) = run(&mut m, &pcs);
        assert_eq!(fed, 3, "the walk stops at the budget");
        assert_eq!(
            frames,
            vec![
                RawFrame::Native(0x1000),
                RawFrame::Native(0x1001),
                RawFrame::Native(0x1002),
                RawFrame::Native(GAP),
                RawFrame::Python(p[0]),
                RawFrame::Python(p[1]),
                RawFrame::Python(p[2]),
            ]
        );
        assert!(!m.truncated);
    }

    /// The Python frames no native frame stood for fill the stack to its depth, in order;
    /// those that do not fit cut it short, marked so, and a stack they fit exactly is not.
    #[test]
    fn the_python_frames_left_fill_to_the_depth_and_no_further() {
        let p: Vec<_> = (0..5).map(|i| py(10 + i, 0)).collect();
        let all: Vec<RawFrame> = p.iter().map(|&r| RawFrame::Python(r)).collect();
        for (depth, natives, kept, truncated) in [
            (8, 0, 5, false),
            (5, 0, 5, false),
            (3, 0, 3, true),
            (4, 2, 2, true),
            (7, 2, 5, false),
            (2, 2, 0, true),
        ] {
            let pcs: Vec<u64> = (0..natives).map(|i| 0x1000 + i).collect();
            let mut m = Merge::new(&p, None, depth, usize::MAX);
            let (frames, fed) = run(&mut m, &pcs);
            assert_eq!(fed, natives as usize, "depth {depth}");
            let natives: Vec<RawFrame> = pcs.iter().map(|&pc| RawFrame::Native(pc)).collect();
            assert_eq!(frames[..natives.len()], natives[..], "depth {depth}");
            assert_eq!(frames[natives.len()..], all[..kept], "depth {depth}");
            assert_eq!(m.truncated, truncated, "depth {depth}");
        }
    }

    #[test]
    fn activations_within_the_budget_stay_in_place_and_no_gap_when_python_is_placed() {
        let p = [py(7, 0)];
        let pcs = [0x1000, 0x150, 0x2000, 0x3000, 0x4000];
        let mut m = Merge::new(&p, Some((0x100, 0x200)), 64, 2);
        let (frames, fed) = run(&mut m, &pcs);
        // 0x1000, the activation, 0x2000; the budget is spent at 0x3000 with nothing left.
        assert_eq!(fed, 3);
        assert_eq!(
            frames,
            vec![
                RawFrame::Native(0x1000),
                RawFrame::Python(p[0]),
                RawFrame::Native(0x2000),
            ]
        );
    }

    #[test]
    fn a_thread_without_python_is_cut_at_the_budget() {
        let pcs: Vec<u64> = (0..30).map(|i| 0x1000 + i).collect();
        let mut m = Merge::new(&[], None, 64, 16);
        let (frames, fed) = run(&mut m, &pcs);
        assert_eq!((fed, frames.len()), (16, 16));
        assert!(m.truncated);
    }

    #[test]
    fn without_a_budget_every_native_frame_is_kept_to_the_depth() {
        let pcs: Vec<u64> = (0..10).map(|i| 0x1000 + i).collect();
        let mut m = Merge::new(&[], None, 6, usize::MAX);
        let (frames, fed) = run(&mut m, &pcs);
        assert_eq!(fed, 6);
        assert_eq!(frames.len(), 6);
        assert!(m.truncated);
    }
}

//! Leaks as growth: device memory that a program keeps a little more of at every step, found
//! by the summary in its one pass ([`Growth`] follows the steps, [`Growth::judge`] decides at
//! the end).
//!
//! Memory merely **held at exit** is not a leak: a script's model, its optimizer state and
//! its caches live until the process ends (see [`crate::summary::HeldAtExit`]). A **leak** is
//! memory that grows at the same point of successive steps:
//!
//! - **Steps.** The outermost regions the program named (`cuda_isolate.region`, NVTX ranges,
//!   `isolate_region_push`), those of the name that closed most often; or, when no name closed
//!   at least [`MIN_STEPS`] times, the iterations of the outermost Python loop seen in the
//!   allocations' call stacks: the shallowest Python frame at which consecutive allocations
//!   differ, where the line goes back within the same code object (a loop's back edge), and
//!   the line it goes back to begins an iteration (the first iteration begins at the first
//!   allocation on that line, the last ends at the last allocation seen on the loop's lines).
//!   C programs without regions have no steps. A loop is steps only if device memory was
//!   freed during its iterations (between its first allocation and its last): a training
//!   step frees its temporaries, a setup loop that only allocates builds what the program
//!   keeps (`model.to("cuda")`, `Module._apply` over the submodules: a GPT-2 run that died of
//!   out-of-memory in its first step had that loop as its only one, and each "step" kept its
//!   weights, "2 leaks"). [`Growth::steps`] is the one recogniser: the report draws the same
//!   steps on its timeline when the program named none.
//! - **The rule.** Steps are numbered 1..N. The first [`WARM_UP`] step is warm-up (the
//!   optimizer's state, caches and lazily made workspaces appear there), and the last
//!   [`LAST_LEFT_OUT`] are left out (what the last iterations' variables still hold at exit is
//!   not growth); at least [`MIN_JUDGED`] steps are judged, so N ≥ [`MIN_STEPS`]. An
//!   allocation site **leaks** when, in **every** judged step, an allocation it made is still
//!   live at exit: its live bytes then grow at every step boundary. One-off state (step 1, a
//!   cache filled at step 3), memory freed by a later step (`loss` rebound next iteration) and
//!   bounded keeping (the last k steps' tensors) never satisfy "every judged step".
//! - **Reported**: the site (its stack), the steps, how many bytes it kept a step on average
//!   and in all.
//!
//! Not judged on steps recognised from the call stacks: PyTorch's caching allocator's segments
//! (where its cache is on). The cache grows while it fills and keeps every segment to the end;
//! the first step's layers, called in turn from one line, look like a loop's iterations from the
//! stacks (a new call of a function is not told apart from a back edge in it), so each "step"
//! would have kept a segment (timm's ViT in log mode on the H100: 3 false leaks a run). Named
//! regions still judge them; without the cache each tensor is its own allocation and is judged.
//!
//! Not counted (see [`crate::finding::Kind::counts`]): a program may collect per-step results
//! on the device on purpose (predictions gathered for evaluation), which looks the same.
//!
//! Memory freed after the last step but before exit (a `del losses` at the end) is not seen.

use crate::stacks::{self, StackTable};
use crate::track::Node;
use isolate_trace::Frame;
use rustc_hash::FxHashMap;

/// Steps at the start that are warm-up.
pub const WARM_UP: usize = 1;
/// Steps at the end left out.
pub const LAST_LEFT_OUT: usize = 2;
/// Steps judged at least.
pub const MIN_JUDGED: usize = 4;
/// Steps needed for a judgement.
pub const MIN_STEPS: usize = WARM_UP + MIN_JUDGED + LAST_LEFT_OUT;

/// Region names followed as step candidates, and steps kept per candidate (a longer run is
/// judged on its first steps: what they kept is still held at exit).
const NAMES_CAP: usize = 16;
const STEPS_CAP: usize = 1 << 16;
/// Loop heads followed.
const LOOPS_CAP: usize = 64;
/// Python stacks whose frames are kept for finding loops.
const PY_CAP: usize = 1 << 16;

/// What [`Growth::judge`] found at one site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grown {
    /// `region "step"`, `iterations of the loop at train.py:12 in <module>`.
    pub steps: String,
    pub step_count: u64,
    pub judged: u64,
    /// Allocations of the site made in judged steps and live at exit, and their bytes.
    pub count: u64,
    pub bytes: u64,
    /// The first of them.
    pub first: Node,
}

impl Grown {
    /// Bytes kept a judged step, on average.
    pub fn bytes_per_step(&self) -> u64 {
        self.bytes / self.judged.max(1)
    }
}

/// The steps of one run, as [`Growth`] recognises them: what the leak finding judges, and what
/// the report draws as regions when the program named none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steps {
    /// `region "step"`, `iterations of the loop at train.py:12 in <module>`.
    pub what: String,
    /// True when they are a loop's iterations, recognised from the call stacks (no region name
    /// closed at least [`MIN_STEPS`] times).
    pub from_stacks: bool,
    /// `(from, to)` of each step, trace clock, in time order. A loop's first iteration starts
    /// at the first allocation on the line that begins its iterations, its last one ends at
    /// the last allocation seen inside the loop.
    pub spans: Vec<(u64, u64)>,
}

/// A loop seen in the call stacks.
struct Loop {
    /// (depth, code, line) of the line that begins an iteration.
    head: (usize, u32, u32),
    /// When its iterations after the first began.
    starts: Vec<u64>,
    /// The last line an iteration went back from (the loop's lines are `head.2..=tail`).
    tail: u32,
    /// The last allocation seen inside it.
    last_ns: u64,
    /// [`Growth::frees`] at its last allocation, and the frees seen between two of its
    /// allocations.
    frees_at: u64,
    frees: u64,
}

/// Follows the steps of one trace.
#[derive(Default)]
pub struct Growth {
    /// Outermost regions by name, with their (from, to) times.
    regions: Vec<(String, Vec<(u64, u64)>)>,
    /// Stack id → its Python frames (code, line), outermost first (empty: none).
    py: FxHashMap<u32, Box<[(u32, u32)]>>,
    /// Thread → the stack of its last allocation that had Python frames.
    prev: FxHashMap<u32, u32>,
    /// The loops, at most [`LOOPS_CAP`].
    loops: Vec<Loop>,
    /// (depth, code, line) of a Python frame → the first allocation made through it: where a
    /// loop's first iteration began.
    first_at: FxHashMap<(usize, u32, u32), u64>,
    /// Device memory frees so far (any thread).
    frees: u64,
}

impl Growth {
    /// An outermost region closed.
    pub fn region(&mut self, name: &str, from_ns: u64, to_ns: u64) {
        let i = match self.regions.iter().position(|r| r.0 == name) {
            Some(i) => i,
            None if self.regions.len() < NAMES_CAP => {
                self.regions.push((name.to_owned(), Vec::new()));
                self.regions.len() - 1
            }
            None => return,
        };
        let v = &mut self.regions[i].1;
        if v.len() < STEPS_CAP {
            v.push((from_ns, to_ns));
        }
    }

    /// A device memory allocation from stack `stack` (non-zero) started at `ts` on thread
    /// `tid`. Allocations without Python frames (an autograd thread's, a C library's) are
    /// passed over; each thread's allocations are compared with its own.
    pub fn allocated(&mut self, table: &StackTable, stack: u32, tid: u32, ts: u64) {
        let prev = self.prev.get(&tid).copied().unwrap_or(0);
        if stack == prev {
            return;
        }
        if !self.py.contains_key(&stack) {
            if self.py.len() >= PY_CAP {
                return;
            }
            let frames: Box<[(u32, u32)]> = table
                .stack(stack)
                .map(|(f, _)| {
                    f.iter()
                        .rev()
                        .filter_map(|f| match *f {
                            Frame::Python { code, line } => Some((code, line)),
                            Frame::Native(_) => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            // A frame seen for the first time is in a stack seen for the first time.
            for (d, &(code, line)) in frames.iter().enumerate() {
                if self.first_at.len() < PY_CAP {
                    self.first_at.entry((d, code, line)).or_insert(ts);
                }
            }
            self.py.insert(stack, frames);
        }
        let Some(b) = self.py.get(&stack).filter(|b| !b.is_empty()) else {
            return;
        };
        let Some(a) = self.py.get(&prev) else {
            if self.prev.len() < PY_CAP {
                self.prev.insert(tid, stack);
            }
            return;
        };
        // The first depth at which they differ: a back edge when the code is the same and the
        // line went back.
        if let Some(d) = a.iter().zip(b.iter()).position(|(x, y)| x != y)
            && a[d].0 == b[d].0
            && b[d].1 < a[d].1
        {
            let head = (d, b[d].0, b[d].1);
            match self.loops.iter().position(|l| l.head == head) {
                Some(i) => {
                    let l = &mut self.loops[i];
                    if l.starts.len() < STEPS_CAP {
                        l.starts.push(ts);
                    }
                    l.tail = l.tail.max(a[d].1);
                }
                None if self.loops.len() < LOOPS_CAP => self.loops.push(Loop {
                    head,
                    starts: vec![ts],
                    tail: a[d].1,
                    last_ns: ts,
                    frees_at: self.frees,
                    frees: 0,
                }),
                None => {}
            }
        }
        for l in &mut self.loops {
            let (d, code, line) = l.head;
            if b.get(d)
                .is_some_and(|f| f.0 == code && (line..=l.tail).contains(&f.1))
            {
                l.last_ns = l.last_ns.max(ts);
                l.frees += self.frees - l.frees_at;
                l.frees_at = self.frees;
            }
        }
        self.prev.insert(tid, stack);
    }

    /// Device memory was freed (any thread): counted for a loop once one of its allocations
    /// follows it.
    pub fn freed(&mut self) {
        self.frees += 1;
    }

    /// The steps: from regions when a name closed at least [`MIN_STEPS`] times, else from
    /// the outermost loop; `None` when there are not enough. **The one recogniser** of steps:
    /// the leak finding judges these, the report draws them.
    pub fn steps(&self, table: &StackTable) -> Option<Steps> {
        if let Some((name, v)) = self
            .regions
            .iter()
            .filter(|r| r.1.len() >= MIN_STEPS)
            .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(&a.0)))
        {
            let mut v = v.clone();
            v.sort_unstable();
            return Some(Steps {
                what: format!("region \"{name}\""),
                from_stacks: false,
                spans: v,
            });
        }
        // Iterations after the first begin at the back edges: MIN_STEPS - 1 of them at least.
        let l = self
            .loops
            .iter()
            .filter(|l| l.starts.len() + 1 >= MIN_STEPS && l.frees > 0)
            .min_by(|a, b| {
                a.head
                    .0
                    .cmp(&b.head.0)
                    .then(b.starts.len().cmp(&a.starts.len()))
            })?;
        let (_, code, line) = l.head;
        let mut v = Vec::with_capacity(l.starts.len() + 1);
        let mut from = self
            .first_at
            .get(&l.head)
            .copied()
            .unwrap_or(0)
            .min(l.starts[0]);
        for &s in &l.starts {
            v.push((from, s.saturating_sub(1).max(from)));
            from = s;
        }
        v.push((from, l.last_ns.max(from)));
        let at = match table.code(code) {
            Some(c) => format!("{}:{line} in {}", c.file, c.name),
            None => format!("line {line}"),
        };
        Some(Steps {
            what: format!("iterations of the loop at {at}"),
            from_stacks: true,
            spans: v,
        })
    }

    /// The sites that leak, by the rule of the module docs, over `steps` (what [`Growth::steps`]
    /// found): `still` is the device memory live at exit. Largest first.
    pub fn judge(steps: Steps, table: &StackTable, still: &[Node]) -> Vec<Grown> {
        let Steps {
            what, spans: steps, ..
        } = steps;
        let n = steps.len();
        let judged = WARM_UP..n - LAST_LEFT_OUT;
        let step_of = |ts: u64| -> Option<usize> {
            let i = steps.partition_point(|s| s.0 <= ts).checked_sub(1)?;
            (ts <= steps[i].1).then_some(i)
        };
        // Sites: stacks with the same shown frames are one; no stack: the call and size.
        let mut key_of: FxHashMap<u32, String> = FxHashMap::default();
        let mut sites: Vec<(String, Vec<usize>, u64, u64, Node)> = Vec::new();
        let mut index: FxHashMap<String, usize> = FxHashMap::default();
        for node in still.iter().filter(|n| n.category.is_device_memory()) {
            let Some(k) = step_of(node.ts_ns).filter(|k| judged.contains(k)) else {
                continue;
            };
            let key = if node.stack == 0 {
                format!("{} of {} bytes", node.api.name(), node.size)
            } else {
                key_of
                    .entry(node.stack)
                    .or_insert_with(|| {
                        stacks::shown(table, node.stack).map_or_else(String::new, |s| s.key())
                    })
                    .clone()
            };
            match index.get(&key).map(|&i| &mut sites[i]) {
                Some(s) => {
                    s.1.push(k);
                    s.2 += 1;
                    s.3 = s.3.saturating_add(node.size);
                    if node.seq < s.4.seq {
                        s.4 = *node;
                    }
                }
                None => {
                    index.insert(key.clone(), sites.len());
                    sites.push((key, vec![k], 1, node.size, *node));
                }
            }
        }
        let mut out: Vec<Grown> = sites
            .into_iter()
            .filter_map(|(_, mut ks, count, bytes, first)| {
                ks.sort_unstable();
                ks.dedup();
                (ks.len() == judged.len()).then(|| Grown {
                    steps: what.clone(),
                    step_count: n as u64,
                    judged: judged.len() as u64,
                    count,
                    bytes,
                    first,
                })
            })
            .collect();
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.first.seq.cmp(&b.first.seq)));
        out
    }
}

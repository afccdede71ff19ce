//! The findings: the one model of what isolate found wrong in a run, which every output
//! renders (summary text and JSON, the report, the graph's text, DOT and JSON, `check`, `who`,
//! the exports) and one rule for which of them make `--error-exitcode` and `check
//! --no-violations` fail.
//!
//! A finding is filled **once**, from the trace, by the summary ([`crate::summary::Summarizer`]
//! turns each Violation, StaleLaunch, invalid free and device-fault note into its record, and
//! [`crate::growth`] each site whose memory grows step by step, with the calls it is about and their stack ids); a
//! [`Finding`] is one of those records seen as what it is. The records are also the summary's
//! JSON form, so their fields are frozen; this module adds the kinds, the counting and the rule.
//!
//! # The rule
//!
//! A finding **counts** (makes `--error-exitcode` and `check --no-violations` fail, and is
//! what the summary's `FINDINGS:` headline adds up) when it is certainly a bug of the program:
//! a stale write, a stale launch, an unordered free (freed on one stream while a use on another
//! stream was not ordered before it: by CUDA's rules the use may run after the free, whatever
//! the timing did in this run), an invalid free, a double free, a device fault. A leak (a site
//! whose live memory grows at every step, see [`crate::growth`]) is shown with the findings but
//! not counted: a program may keep per-step results on the device on purpose (predictions
//! gathered for an evaluation), which looks the same. [`Kind::counts`] says it;
//! [`Tally::counted`] applies it; nothing else decides.
//!
//! Not findings: stale values, the launch check's *suspects* (a word of a kernel's parameters
//! that points into freed memory without evidence the kernel was handed it: inside a struct
//! passed by value and not the allocation's start, in a packed buffer with no layout, or into
//! freed guard memory no fault followed; the summary lists them apart), memory held at exit
//! (whether something explains it or not: a script's model and optimizer state live until
//! exit; the summary says what holds it, as information), lost allocations, and the graph's
//! own anomalies about nodes (`overlap`, `true_alias`,
//! `never_freed`, `stale_value`; see [`crate::graph::Anomaly::finding`]).
//!
//! # Adding a kind
//!
//! Add a [`Kind`] and a [`Finding`] variant; the compiler then lists every output that does not
//! show it yet (each renders through an exhaustive `match`). docs/design.md, "Adding a kind of
//! finding", has the checklist.
//!
//! ```
//! use isolate_analyzer::finding::{Kind, Tally};
//! use isolate_analyzer::summary::Totals;
//! let t = Totals { poison_violation_count: 1, invalid_free_count: 3, double_free_count: 1, ..Totals::default() };
//! let f = Tally::of(&t);
//! assert_eq!(f.get(Kind::InvalidFree), 2); // invalid frees that are not double frees
//! assert_eq!(f.counted(), 4);
//! assert_eq!(f.describe_counted(), "1 stale write, 2 invalid frees, 1 double free");
//! assert_eq!(Tally::default().describe_counted(), "no stale writes, stale launches, unordered, invalid or double frees or device faults");
//! assert!(!Kind::Leak.counts());
//! ```

use crate::stacks::ShownStack;
use crate::summary::Summarizer;
use crate::summary::{
    DeviceFault, FaultedCall, FreedInUseEntry, InvalidFree, LeakEntry, PoisonViolation,
    StaleLaunchEntry, Totals, TraceSummary,
};
use crate::track::{Ended, Invalid, Live, Node, Observer};
use crate::words;
use isolate_trace::{Event, Header, Record};

/// What a finding is. The order of [`Kind::ALL`] is the order outputs name kinds in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A write that landed in freed memory (a Violation record: quarantined poison changed).
    StaleWrite,
    /// A kernel launched with a pointer into freed memory that it used (a StaleLaunch record).
    StaleLaunch,
    /// A free on one stream while a use on another stream was not ordered before it (a
    /// FreedInUse record: freed while still in use on another stream).
    UnorderedFree,
    /// A free of something that was not live and had not been freed before.
    InvalidFree,
    /// A free of something already freed.
    DoubleFree,
    /// The device faulted (a device-fault note, or a call that returned a fault code).
    DeviceFault,
    /// Device memory growing step by step: a site that kept memory from every step
    /// ([`crate::growth`]).
    Leak,
}

impl Kind {
    /// Every kind, in the order outputs name them.
    pub const ALL: [Kind; 7] = [
        Kind::StaleWrite,
        Kind::StaleLaunch,
        Kind::UnorderedFree,
        Kind::InvalidFree,
        Kind::DoubleFree,
        Kind::DeviceFault,
        Kind::Leak,
    ];

    /// Its name in text, from [`crate::words`]: `stale write`.
    pub fn word(self) -> &'static str {
        match self {
            Kind::StaleWrite => words::STALE_WRITE,
            Kind::StaleLaunch => words::STALE_LAUNCH,
            Kind::UnorderedFree => words::UNORDERED_FREE,
            Kind::InvalidFree => words::INVALID_FREE,
            Kind::DoubleFree => words::DOUBLE_FREE,
            Kind::DeviceFault => words::DEVICE_FAULT,
            Kind::Leak => words::LEAK,
        }
    }

    /// Its name in JSON (the report's `kind`): `stale_write`.
    pub fn key(self) -> &'static str {
        match self {
            Kind::StaleWrite => "stale_write",
            Kind::StaleLaunch => "stale_launch",
            Kind::UnorderedFree => "unordered_free",
            Kind::InvalidFree => "invalid_free",
            Kind::DoubleFree => "double_free",
            Kind::DeviceFault => "device_fault",
            Kind::Leak => "leak",
        }
    }

    /// **The rule**: whether a finding of this kind counts (for `--error-exitcode`, `check
    /// --no-violations` and the summary's `FINDINGS:` headline). See the module docs.
    pub fn counts(self) -> bool {
        match self {
            Kind::StaleWrite
            | Kind::StaleLaunch
            | Kind::UnorderedFree
            | Kind::InvalidFree
            | Kind::DoubleFree
            | Kind::DeviceFault => true,
            Kind::Leak => false,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A device fault, as the trace tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault<'a> {
    /// The library noted the fault (with the launches it suspects).
    Noted(&'a DeviceFault),
    /// No note (traces of older libraries): a call returned a device-fault code.
    Returned(&'a FaultedCall),
}

/// One finding: the record the summary filled from the trace, as what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding<'a> {
    StaleWrite(&'a PoisonViolation),
    StaleLaunch(&'a StaleLaunchEntry),
    UnorderedFree(&'a FreedInUseEntry),
    InvalidFree(&'a InvalidFree),
    DoubleFree(&'a InvalidFree),
    DeviceFault(Fault<'a>),
    Leak(&'a LeakEntry),
}

/// Which call a [`Site`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The call the finding is (the launch, the invalid free).
    Call,
    Allocated,
    Freed,
    /// A double free's first free.
    FirstFreed,
    /// An unordered free's use on another stream (the launch, copy or set).
    Used,
}

/// A call a finding is about: its event, its API when known and its stack id (trace format 2
/// with the stack known; `None` otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site<'a> {
    pub role: Role,
    pub seq: u64,
    pub api: Option<&'a str>,
    pub stack: Option<u32>,
}

impl<'a> Finding<'a> {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Finding::StaleWrite(_) => Kind::StaleWrite,
            Finding::StaleLaunch(_) => Kind::StaleLaunch,
            Finding::UnorderedFree(_) => Kind::UnorderedFree,
            Finding::InvalidFree(_) => Kind::InvalidFree,
            Finding::DoubleFree(_) => Kind::DoubleFree,
            Finding::DeviceFault(_) => Kind::DeviceFault,
            Finding::Leak(_) => Kind::Leak,
        }
    }

    /// An invalid free as the finding it is: a double free or an invalid one.
    pub fn of_free(f: &'a InvalidFree) -> Finding<'a> {
        if f.double_free {
            Finding::DoubleFree(f)
        } else {
            Finding::InvalidFree(f)
        }
    }

    /// The calls it is about, with their stack ids (as the summary knew them: the stacks of a
    /// stale write's or stale launch's allocation and free come from the calls of recent frees
    /// the summary remembers, see `Summarizer::freed`).
    pub fn sites(&self) -> Vec<Site<'a>> {
        let site = |role, seq, api: Option<&'a str>, stack| Site {
            role,
            seq,
            api,
            stack,
        };
        match *self {
            Finding::StaleWrite(v) => vec![
                site(
                    Role::Allocated,
                    v.alloc_seq,
                    v.alloc_api.as_deref(),
                    v.stack_ids[0],
                ),
                site(Role::Freed, v.free_seq, Some(&v.free_api), v.stack_ids[1]),
            ],
            Finding::StaleLaunch(s) => vec![
                site(Role::Call, s.seq, Some(&s.api), s.stack_ids[0]),
                site(
                    Role::Allocated,
                    s.allocation,
                    s.alloc_api.as_deref(),
                    s.stack_ids[1],
                ),
                site(
                    Role::Freed,
                    s.freed_at.seq,
                    s.free_api.as_deref(),
                    s.stack_ids[2],
                ),
            ],
            Finding::UnorderedFree(f) => vec![
                site(Role::Freed, f.free_seq, Some(&f.free_api), f.stack_ids[1]),
                site(Role::Used, f.use_after_seq, None, f.stack_ids[2]),
                site(
                    Role::Allocated,
                    f.alloc_seq,
                    f.alloc_api.as_deref(),
                    f.stack_ids[0],
                ),
            ],
            Finding::InvalidFree(f) | Finding::DoubleFree(f) => {
                let mut v = vec![site(Role::Call, f.seq, Some(&f.api), f.stack_ids[0])];
                if let Some(c) = &f.first_free {
                    v.push(site(Role::FirstFreed, c.seq, Some(&c.api), f.stack_ids[1]));
                }
                if let Some(c) = &f.allocated {
                    v.push(site(Role::Allocated, c.seq, Some(&c.api), f.stack_ids[2]));
                }
                v
            }
            Finding::DeviceFault(Fault::Noted(d)) => match &d.call {
                Some(c) => vec![site(Role::Call, c.seq, Some(&c.api), None)],
                None => vec![site(Role::Call, d.seq, None, None)],
            },
            Finding::DeviceFault(Fault::Returned(c)) => {
                vec![site(Role::Call, c.seq, Some(&c.api), None)]
            }
            Finding::Leak(l) => {
                vec![site(Role::Allocated, l.seq, Some(&l.api), l.stack_id)]
            }
        }
    }
}

/// Where in the code a call was, from its stack: the innermost Python frame when the stack has
/// one (`train.py:39 in main`), else its first shown frame (`make_buffer (prog.c:14)`), by
/// [`ShownStack::place_of`]. **The one helper** that names a finding's code in every output
/// (summary, report, graph, `check`, `who`, exports; the pytest plugin reads the same from the
/// summary's JSON, each stack's `place`).
pub fn place(s: Option<&ShownStack>) -> Option<String> {
    s?.place.clone()
}

/// [`place`] of stack `id` of `table` (symbolised here), for outputs that hold stack ids.
pub fn place_of(table: &crate::stacks::StackTable, id: u32) -> Option<String> {
    place(crate::stacks::shown(table, id).as_ref())
}

impl Finding<'_> {
    /// The calls it is about, where in the code (`allocated at train.py:39 in main`), as
    /// [`place`] names them; empty without stacks.
    pub fn places(&self) -> Vec<String> {
        let at = |what: &str, s: &Option<ShownStack>| {
            place(s.as_ref()).map(|p| format!("{what} at {p}"))
        };
        let v = match self {
            Finding::StaleWrite(v) => {
                vec![at("allocated", &v.alloc_stack), at("freed", &v.free_stack)]
            }
            Finding::StaleLaunch(s) => vec![
                at("launched", &s.launch_stack),
                at("allocated", &s.alloc_stack),
                at("freed", &s.free_stack),
            ],
            Finding::UnorderedFree(f) => vec![
                at("freed", &f.free_stack),
                at(if f.use_kernel { "launched" } else { "used" }, &f.use_stack),
                at("allocated", &f.alloc_stack),
            ],
            Finding::InvalidFree(f) => vec![at("freed", &f.stack), at("allocated", &f.alloc_stack)],
            Finding::DoubleFree(f) => vec![
                at("freed again", &f.stack),
                at("first freed", &f.first_free_stack),
                at("allocated", &f.alloc_stack),
            ],
            Finding::DeviceFault(_) => Vec::new(),
            Finding::Leak(l) => vec![at("allocated", &l.alloc_stack)],
        };
        v.into_iter().flatten().collect()
    }
}

/// The findings of one trace that the summary lists, in the order outputs list them: stale
/// writes, stale launches, unordered frees, device faults, invalid and double frees (in the order they
/// happened), leaks. At most [`LIST_CAP`](crate::summary::LIST_CAP) of each list;
/// [`Tally`] has the full counts.
pub fn findings(t: &TraceSummary) -> Vec<Finding<'_>> {
    let x = &t.totals;
    let mut v: Vec<Finding> = Vec::new();
    v.extend(x.poison_violations.iter().map(Finding::StaleWrite));
    v.extend(x.stale_launches.iter().map(Finding::StaleLaunch));
    v.extend(x.freed_in_use.iter().map(Finding::UnorderedFree));
    if x.device_faults.is_empty() {
        v.extend(
            t.first_faulted_call
                .iter()
                .map(|c| Finding::DeviceFault(Fault::Returned(c))),
        );
    } else {
        v.extend(
            x.device_faults
                .iter()
                .map(|d| Finding::DeviceFault(Fault::Noted(d))),
        );
    }
    v.extend(x.invalid_frees.iter().map(Finding::of_free));
    v.extend(x.leaks.iter().map(Finding::Leak));
    v
}

/// An output that renders the findings as the trace is read (the chrome-trace and memory-viz
/// exports, `who`, the report's timeline): run as [`Streamed`], it is handed **every** finding
/// (none is lost to the summary's [`LIST_CAP`](crate::summary::LIST_CAP)), each right after the
/// record that made it, and renders it through an exhaustive `match` (a new kind is a compile
/// error there).
pub trait Renders: Observer {
    fn finding(&mut self, f: Finding<'_>, live: &Live);
}

/// Runs an output `O` beside a streaming [`Summarizer`], which fills the findings (the one
/// place they are filled) and hands each to `O` ([`Renders::finding`]) once `O` has seen the
/// record too; the summary it makes is the same as a plain one's.
pub struct Streamed<O> {
    pub summary: Summarizer,
    pub out: O,
}

impl<O: Renders> Streamed<O> {
    /// `trace` is the index of the trace among those read together.
    pub fn new(trace: usize, out: O) -> Self {
        Streamed {
            summary: Summarizer::streaming(trace),
            out,
        }
    }

    fn hand(&mut self, live: &Live) {
        let out = &mut self.out;
        self.summary.drain(|f| out.finding(f, live));
    }
}

/// Each callback: the findings made ready by the record's arrival (a stale launch held for its
/// stack, [`Summarizer::next_record`]), then the summary's, then those it filled, then the
/// output's own: so the output gets each finding in the trace's order, before what it does with
/// the next record.
impl<O: Renders> Observer for Streamed<O> {
    fn begin(&mut self, h: &Header) {
        self.summary.begin(h);
        self.out.begin(h);
    }
    fn event(&mut self, ev: &Event, live: &Live) {
        self.summary.next_record(None);
        self.hand(live);
        self.summary.event(ev, live);
        self.hand(live);
        self.out.event(ev, live);
    }
    fn started(&mut self, n: &Node, live: &Live) {
        self.summary.started(n, live);
        self.out.started(n, live);
    }
    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        self.summary.ended(n, e, live);
        self.out.ended(n, e, live);
    }
    fn invalid(&mut self, i: &Invalid, live: &Live) {
        self.summary.invalid(i, live);
        self.hand(live);
        self.out.invalid(i, live);
    }
    fn earlier(&mut self, i: &Invalid, live: &Live) {
        self.summary.earlier(i, live);
        self.out.earlier(i, live);
    }
    fn other(&mut self, r: &Record, live: &Live) {
        self.summary.next_record(Some(r));
        self.hand(live);
        self.summary.other(r, live);
        self.hand(live);
        self.out.other(r, live);
    }
    fn finish(&mut self, still: &[Node], live: &Live) {
        self.summary.next_record(None);
        self.hand(live);
        self.summary.finish(still, live);
        self.hand(live);
        self.out.finish(still, live);
    }
}

/// What `--error-exitcode` says when no finding counts.
const NONE_COUNTED: &str =
    "no stale writes, stale launches, unordered, invalid or double frees or device faults";

/// How many findings of each kind (of one trace, or several added up), and the bytes a step
/// the leaks grow by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    n: [u64; Kind::ALL.len()],
    pub leak_bytes: u64,
}

impl Tally {
    /// The counts of a summary (of one trace or several): the one place they are read.
    pub fn of(t: &Totals) -> Tally {
        let mut f = Tally::default();
        for k in Kind::ALL {
            f.n[k.index()] = match k {
                Kind::StaleWrite => t.poison_violation_count,
                Kind::StaleLaunch => t.stale_launch_count,
                Kind::UnorderedFree => t.freed_in_use_count,
                Kind::InvalidFree => t.invalid_free_count.saturating_sub(t.double_free_count),
                Kind::DoubleFree => t.double_free_count,
                Kind::DeviceFault => t.device_fault_count,
                Kind::Leak => t.leak_count,
            };
        }
        f.leak_bytes = t.leak_bytes_per_step;
        f
    }

    /// Counts one finding of kind `k`.
    pub fn count(&mut self, k: Kind) {
        self.n[k.index()] = self.n[k.index()].saturating_add(1);
    }

    /// How many of `k`.
    pub fn get(&self, k: Kind) -> u64 {
        self.n[k.index()]
    }

    /// Adds `o`'s counts.
    pub fn add(&mut self, o: &Tally) {
        for (a, b) in self.n.iter_mut().zip(o.n) {
            *a = a.saturating_add(b);
        }
        self.leak_bytes = self.leak_bytes.saturating_add(o.leak_bytes);
    }

    /// The findings that count ([`Kind::counts`]): what `--error-exitcode` and `check
    /// --no-violations` fail on.
    pub fn counted(&self) -> u64 {
        Kind::ALL
            .iter()
            .filter(|k| k.counts())
            .fold(0u64, |a, k| a.saturating_add(self.get(*k)))
    }

    /// Every finding, counted or not.
    pub fn total(&self) -> u64 {
        self.n.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// `1 stale write, 2 double frees` (each kind found, in [`Kind::ALL`]'s order) of the kinds
    /// `which` keeps; leaks with the bytes a step they grow by.
    pub fn kinds(&self, which: impl Fn(Kind) -> bool) -> String {
        let mut parts = Vec::new();
        for k in Kind::ALL.into_iter().filter(|k| which(*k)) {
            let n = self.get(k);
            if n == 0 {
                continue;
            }
            parts.push(match k {
                Kind::Leak => format!(
                    "{} (growing {} a step)",
                    words::plural(n, k.word()),
                    words::size(self.leak_bytes)
                ),
                Kind::StaleWrite
                | Kind::StaleLaunch
                | Kind::UnorderedFree
                | Kind::InvalidFree
                | Kind::DoubleFree
                | Kind::DeviceFault => words::plural(n, k.word()),
            });
        }
        parts.join(", ")
    }

    /// The counted findings in words, or what none were found: what `--error-exitcode` says.
    pub fn describe_counted(&self) -> String {
        if self.counted() == 0 {
            // Every kind that counts (the test `none_names_every_counted_kind` holds it).
            NONE_COUNTED.to_owned()
        } else {
            self.kinds(Kind::counts)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_names_every_counted_kind() {
        // A kind that counts must be named in NONE_COUNTED: "invalid or double frees" names two.
        let counted: Vec<Kind> = Kind::ALL.into_iter().filter(|k| k.counts()).collect();
        assert_eq!(
            counted,
            [
                Kind::StaleWrite,
                Kind::StaleLaunch,
                Kind::UnorderedFree,
                Kind::InvalidFree,
                Kind::DoubleFree,
                Kind::DeviceFault
            ],
            "a kind that counts was added or removed: say so in NONE_COUNTED"
        );
        for k in counted {
            let stem = k.word().split(' ').next_back().unwrap();
            assert!(NONE_COUNTED.contains(stem), "{k:?}");
        }
    }

    #[test]
    fn kinds_are_in_order_and_named_once() {
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i, "Kind::ALL is in declaration order");
        }
        let mut keys: Vec<&str> = Kind::ALL.iter().map(|k| k.key()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), Kind::ALL.len());
    }

    #[test]
    fn tally_adds_and_counts_by_the_rule() {
        let t = Totals {
            stale_launch_count: 2,
            device_fault_count: 1,
            leak_count: 3,
            leak_bytes_per_step: 4096,
            ..Totals::default()
        };
        let mut f = Tally::of(&t);
        assert_eq!((f.counted(), f.total()), (3, 6));
        f.add(&Tally::of(&t));
        assert_eq!((f.counted(), f.total(), f.leak_bytes), (6, 12, 8192));
        assert_eq!(f.describe_counted(), "4 stale launches, 2 device faults");
        assert_eq!(f.kinds(|k| !k.counts()), "6 leaks (growing 8.0 KiB a step)");
    }
}

//! Marks and regions the program named through libisolate.so's C API (`isolate_mark`,
//! `isolate_region_push`, `isolate_region_pop`; the Python module `cuda_isolate`).
//!
//! They are `Mark`, `RegionPush` and `RegionPop` notes; traces of earlier libraries have them as
//! `Info` notes with the text prefixes `mark: `, `region push: ` and `region pop: `, which
//! [`user_note`] reads the same way. [`Regions`] pairs pushes with pops per thread (`ptr` is the
//! thread id) and keeps, for each open region, the most device memory live while it was open.

use isolate_trace::{Note, NoteKind};
use rustc_hash::FxHashMap;

/// A mark or a region's push or pop, with its text (the mark's text, the region's name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserNote<'a> {
    Mark(&'a str),
    RegionPush(&'a str),
    RegionPop(&'a str),
}

impl UserNote<'_> {
    /// The note kind it is (also for one written with the `Info` convention).
    pub fn kind(&self) -> NoteKind {
        match self {
            UserNote::Mark(_) => NoteKind::Mark,
            UserNote::RegionPush(_) => NoteKind::RegionPush,
            UserNote::RegionPop(_) => NoteKind::RegionPop,
        }
    }
}

/// The mark, push or pop a note is, in either form; `None` for any other note.
pub fn user_note(n: &Note) -> Option<UserNote<'_>> {
    match n.kind {
        NoteKind::Mark => Some(UserNote::Mark(&n.text)),
        NoteKind::RegionPush => Some(UserNote::RegionPush(&n.text)),
        NoteKind::RegionPop => Some(UserNote::RegionPop(&n.text)),
        NoteKind::Info => {
            let t = n.text.as_str();
            if let Some(m) = t.strip_prefix("mark: ") {
                Some(UserNote::Mark(m))
            } else if let Some(r) = t.strip_prefix("region push: ") {
                Some(UserNote::RegionPush(r))
            } else {
                t.strip_prefix("region pop: ").map(UserNote::RegionPop)
            }
        }
        _ => None,
    }
}

/// Regions open at once that are followed; pushes beyond are paired with their pops but not
/// reported (a program that never pops would otherwise grow this without bound).
pub const OPEN_CAP: usize = 4096;

/// A region from its push to its pop (or to the end of the trace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closed {
    pub name: String,
    /// The thread that opened it.
    pub tid: u64,
    /// 1 for an outermost region.
    pub depth: u64,
    pub from_ns: u64,
    pub to_ns: u64,
    /// The most device memory live while it was open (what was live at its push included).
    pub peak_live_bytes: u64,
    /// False when the trace ended before its pop.
    pub popped: bool,
}

struct Open {
    id: u64,
    name: String,
    from_ns: u64,
}

/// Pairs pushes with pops, per thread.
#[derive(Default)]
pub struct Regions {
    /// Thread → its open regions, innermost last (`None`: past [`OPEN_CAP`]).
    stacks: FxHashMap<u64, Vec<Option<Open>>>,
    /// `(id, most live since this region's push and before the next open one's)`, in push
    /// order: the peak of a region is the most of its entry and those after it.
    peaks: Vec<(u64, u64)>,
    next_id: u64,
    last_ns: u64,
}

impl Regions {
    /// True when no followed region is open (nothing to sample).
    #[inline]
    pub fn none_open(&self) -> bool {
        self.peaks.is_empty()
    }

    /// Device memory live now is `live` (call after every change that may raise it).
    #[inline]
    pub fn sample(&mut self, live: u64) {
        if let Some(l) = self.peaks.last_mut() {
            l.1 = l.1.max(live);
        }
    }

    /// Thread `tid` opened region `name` at `ts`, with `live` bytes of device memory live.
    pub fn push(&mut self, tid: u64, name: &str, ts: u64, live: u64) {
        self.last_ns = self.last_ns.max(ts);
        let followed = self.peaks.len() < OPEN_CAP;
        let entry = followed.then(|| {
            let id = self.next_id;
            self.next_id += 1;
            self.peaks.push((id, live));
            Open {
                id,
                name: name.to_owned(),
                from_ns: ts,
            }
        });
        self.stacks.entry(tid).or_default().push(entry);
    }

    /// Thread `tid` closed its innermost region at `ts`: that region, unless the thread had none
    /// open or it was not followed.
    pub fn pop(&mut self, tid: u64, ts: u64) -> Option<Closed> {
        self.last_ns = self.last_ns.max(ts);
        let stack = self.stacks.get_mut(&tid)?;
        let open = stack.pop()?;
        let depth = stack.len() as u64 + 1;
        if stack.is_empty() {
            self.stacks.remove(&tid);
        }
        let o = open?;
        Some(self.close(o, tid, depth, ts, true))
    }

    fn close(&mut self, o: Open, tid: u64, depth: u64, ts: u64, popped: bool) -> Closed {
        let mut peak = 0;
        if let Ok(i) = self.peaks.binary_search_by_key(&o.id, |p| p.0) {
            peak = self.peaks[i..].iter().map(|p| p.1).max().unwrap_or(0);
            let mine = self.peaks.remove(i).1;
            if i > 0 {
                self.peaks[i - 1].1 = self.peaks[i - 1].1.max(mine);
            }
        }
        Closed {
            name: o.name,
            tid,
            depth,
            from_ns: o.from_ns,
            to_ns: ts.max(o.from_ns),
            peak_live_bytes: peak,
            popped,
        }
    }

    /// Closes the regions still open at the end of the trace (at `end_ns`, or the last push or
    /// pop if later), innermost first.
    pub fn close_all(&mut self, end_ns: u64) -> Vec<Closed> {
        let end = end_ns.max(self.last_ns);
        let mut out = Vec::new();
        let mut tids: Vec<u64> = self.stacks.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let stack = self.stacks.remove(&tid).unwrap_or_default();
            for (k, o) in stack.into_iter().enumerate().rev() {
                if let Some(o) = o {
                    out.push(self.close(o, tid, k as u64 + 1, end, false));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(kind: NoteKind, text: &str) -> Note {
        Note {
            seq: 0,
            ts_ns: 0,
            kind,
            ptr: 1,
            size: 0,
            value: 1,
            text: text.into(),
        }
    }

    #[test]
    fn both_forms_read_the_same() {
        let new = note(NoteKind::RegionPush, "step");
        let old = note(NoteKind::Info, "region push: step");
        assert_eq!(user_note(&new), Some(UserNote::RegionPush("step")));
        assert_eq!(user_note(&old), user_note(&new));
        assert_eq!(
            user_note(&note(NoteKind::Info, "mark: x")),
            Some(UserNote::Mark("x"))
        );
        assert_eq!(
            user_note(&note(NoteKind::Info, "region pop: step")),
            Some(UserNote::RegionPop("step"))
        );
        assert_eq!(user_note(&note(NoteKind::Info, "hello")), None);
        assert_eq!(user_note(&note(NoteKind::Signal, "mark: x")), None);
    }

    #[test]
    fn peaks_of_nested_and_interleaved_regions() {
        let mut r = Regions::default();
        r.push(1, "outer", 0, 10);
        r.sample(50);
        r.push(2, "other", 1, 50);
        r.push(1, "inner", 2, 50);
        r.sample(80);
        let inner = r.pop(1, 3).unwrap();
        assert_eq!((inner.depth, inner.peak_live_bytes), (2, 80));
        // frees do not lower a peak; the other thread's region closes first out of order
        let other = r.pop(2, 4).unwrap();
        assert_eq!(other.peak_live_bytes, 80);
        r.sample(20);
        let outer = r.pop(1, 5).unwrap();
        assert_eq!(
            (outer.depth, outer.peak_live_bytes, outer.to_ns),
            (1, 80, 5)
        );
        assert!(r.none_open());
        assert_eq!(r.pop(1, 6), None);
        r.push(3, "left open", 7, 5);
        let left = r.close_all(9);
        assert_eq!(left.len(), 1);
        assert!(!left[0].popped);
        assert_eq!((left[0].to_ns, left[0].peak_live_bytes), (9, 5));
    }
}

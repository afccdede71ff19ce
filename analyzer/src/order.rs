//! Puts a trace's records back in sequence order before any analysis sees them.
//!
//! Every record but `Stats` and `End` carries a number from one process-wide counter, taken
//! where the call is ordered (a free's before the real call, an allocation's after it). Threads
//! hand their records to the writer in whatever order they get there, so the file is only
//! *roughly* in that order: a thread that took number 10 for a free can be overtaken by the
//! thread that then got the same address from the driver (number 11). Read in file order, that
//! allocation would land on a live node (a "lost" allocation) and the free on nothing (an
//! "invalid free") — in a correct program. So the analyzer reads through [`Reorder`]:
//!
//! - records come out in increasing `seq`; a record whose number is the next one expected passes
//!   straight through (the common case costs one comparison);
//! - the others wait in a min-heap of at most [`WINDOW`] records, so memory is bounded however
//!   long the trace is and however far apart the numbers arrive;
//! - a **gap** is a number that never arrives: a thread took it and never submitted its record
//!   (it was inside a call when another thread ended the process, a fatal signal struck, or the
//!   writer stopped early). Gaps are skipped when the heap is full and at the end; they are
//!   counted ([`Order::gaps`]) and change nothing in the model — a free lost in a gap shows as a
//!   *lost* allocation when its address comes back, never as an invalid free;
//! - a record that arrives after its place was passed (more than [`WINDOW`] records late) is
//!   handed on at once and counted ([`Order::late`]); what the analyses say about it may then be
//!   off, and the summary says so;
//! - `Stats` records go through as they come (counters, not events); `End` comes last.

use isolate_trace::Record;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Most records held back waiting for an earlier number (about 40 MiB at the largest).
pub const WINDOW: usize = 1 << 18;

/// What reordering saw in one trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Order {
    /// Sequence numbers that never arrived (see the module docs).
    pub gaps: u64,
    /// Records that arrived after their place had been passed, handed on out of order.
    pub late: u64,
    /// Records that came after a record with a higher number in the file: how far the file's
    /// order was from sequence order.
    pub reordered: u64,
    /// The largest number of records held back at once.
    pub max_held: u64,
}

struct Held {
    seq: u64,
    /// File position among the records, so equal numbers keep their file order.
    pos: u64,
    rec: Record,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.seq, self.pos) == (o.seq, o.pos)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.seq, self.pos).cmp(&(o.seq, o.pos))
    }
}

/// The reordering stage: [`Reorder::push`] each record in file order, then [`Reorder::finish`].
pub struct Reorder {
    next: u64,
    /// The highest number read so far (plus one; 0 before any).
    high: u64,
    pos: u64,
    heap: BinaryHeap<Reverse<Held>>,
    end: Option<Record>,
    window: usize,
    pub order: Order,
}

impl Default for Reorder {
    fn default() -> Self {
        Self::with_window(WINDOW)
    }
}

impl Reorder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A stage that holds at most `window` records back (tests use small windows).
    pub fn with_window(window: usize) -> Self {
        Reorder {
            next: 0,
            high: 0,
            pos: 0,
            heap: BinaryHeap::new(),
            end: None,
            window: window.max(1),
            order: Order::default(),
        }
    }

    /// Takes the next record of the file; hands `emit` every record that is now in order.
    #[inline]
    pub fn push(&mut self, rec: Record, emit: &mut impl FnMut(&Record)) {
        self.pos += 1;
        let Some(seq) = rec.seq() else {
            match rec {
                Record::End(_) => self.end = Some(rec),
                _ => emit(&rec),
            }
            return;
        };
        if seq < self.high {
            self.order.reordered += 1;
        }
        self.high = self.high.max(seq.saturating_add(1));
        if seq == self.next && self.heap.is_empty() {
            self.next += 1;
            emit(&rec);
            return;
        }
        if seq < self.next {
            // Its place was passed: a record more than a window late (or a repeated number).
            self.order.late += 1;
            emit(&rec);
            return;
        }
        self.heap.push(Reverse(Held {
            seq,
            pos: self.pos,
            rec,
        }));
        self.order.max_held = self.order.max_held.max(self.heap.len() as u64);
        self.release(false, emit);
    }

    /// Hands on what is in order; with `all`, everything (skipping gaps).
    fn release(&mut self, all: bool, emit: &mut impl FnMut(&Record)) {
        while let Some(Reverse(top)) = self.heap.peek() {
            let seq = top.seq;
            if seq > self.next {
                if !all && self.heap.len() <= self.window {
                    return;
                }
                self.order.gaps += seq - self.next;
            }
            let Reverse(h) = self.heap.pop().expect("peeked");
            self.next = self.next.max(seq + 1);
            emit(&h.rec);
        }
    }

    /// The file ended: hands on everything held back, in order, then the End record.
    pub fn finish(&mut self, emit: &mut impl FnMut(&Record)) {
        self.release(true, emit);
        if let Some(end) = self.end.take() {
            emit(&end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolate_trace::{Event, Note, NoteKind, Stats};

    fn ev(seq: u64) -> Record {
        Record::Event(Event {
            seq,
            ..Event::default()
        })
    }

    fn run(window: usize, seqs: &[u64]) -> (Vec<u64>, Order) {
        let mut r = Reorder::with_window(window);
        let mut out = Vec::new();
        let mut emit = |rec: &Record| out.push(rec.seq().unwrap_or(u64::MAX));
        for &s in seqs {
            r.push(ev(s), &mut emit);
        }
        r.finish(&mut emit);
        (out, r.order)
    }

    #[test]
    fn in_order_passes_straight_through() {
        let (out, o) = run(4, &[0, 1, 2, 3]);
        assert_eq!(out, [0, 1, 2, 3]);
        assert_eq!(o, Order::default());
    }

    #[test]
    fn overtaken_records_are_put_back_in_order() {
        let (out, o) = run(8, &[0, 2, 3, 1, 5, 4]);
        assert_eq!(out, [0, 1, 2, 3, 4, 5]);
        assert_eq!(o.gaps, 0);
        assert_eq!(o.late, 0);
        assert_eq!(o.max_held, 3);
        assert_eq!(o.reordered, 2, "1 after 3, 4 after 5");
    }

    #[test]
    fn a_missing_number_is_a_gap_and_skipped_when_the_window_is_full() {
        // 1 never comes: held back until more than 2 wait, then skipped.
        let (out, o) = run(2, &[0, 2, 3, 4, 5]);
        assert_eq!(out, [0, 2, 3, 4, 5]);
        assert_eq!(o.gaps, 1);
        assert_eq!(o.late, 0);
        assert!(o.max_held <= 3);
    }

    #[test]
    fn a_gap_at_the_end_is_counted() {
        let (out, o) = run(100, &[0, 1, 3]);
        assert_eq!(out, [0, 1, 3]);
        assert_eq!(o.gaps, 1);
    }

    #[test]
    fn a_record_past_the_window_is_late_not_lost() {
        let (out, o) = run(1, &[0, 2, 3, 4, 1]);
        assert_eq!(out.len(), 5);
        assert!(out.contains(&1));
        assert_eq!(o.late, 1);
    }

    #[test]
    fn memory_stays_within_the_window() {
        // Every pair swapped over a long run: never more than a couple held.
        let seqs: Vec<u64> = (0..100_000u64).map(|i| i ^ 1).collect();
        let (out, o) = run(16, &seqs);
        assert!(out.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(o.max_held, 2);
        assert_eq!((o.gaps, o.late), (0, 0));
    }

    #[test]
    fn stats_pass_through_and_end_comes_last() {
        let mut r = Reorder::with_window(8);
        let mut out = Vec::new();
        let mut emit = |rec: &Record| out.push(rec.clone());
        r.push(ev(1), &mut emit);
        r.push(Record::Stats(Stats::default()), &mut emit);
        r.push(
            Record::End(isolate_trace::End {
                ts_ns: 0,
                reason: isolate_trace::EndReason::Exit,
                stats: Stats::default(),
            }),
            &mut emit,
        );
        r.push(
            Record::Note(Note {
                seq: 0,
                ts_ns: 0,
                kind: NoteKind::Info,
                ptr: 0,
                size: 0,
                value: 0,
                text: String::new(),
            }),
            &mut emit,
        );
        r.finish(&mut emit);
        assert!(matches!(out[0], Record::Stats(_)));
        assert_eq!(out[1].seq(), Some(0));
        assert_eq!(out[2].seq(), Some(1));
        assert!(matches!(out[3], Record::End(_)));
    }
}

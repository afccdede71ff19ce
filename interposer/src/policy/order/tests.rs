//! The stream-order check's clocks and decisions, without CUDA.
//!
//! Layer: policies (the tests of order/mod.rs; uses only it).

use super::*;

const X: u64 = 0x1000;

fn state_with(streams: &[(u64, bool)]) -> (State, Vec<u32>) {
    let mut s = State::new();
    let ids = streams
        .iter()
        .map(|&(h, blocking)| s.add(Key::Created(h), blocking))
        .collect();
    (s, ids)
}

fn alloc(s: &mut State, own: u32) {
    s.allocs.insert(
        X,
        Alloc {
            size: 64,
            seq: 1,
            stack: 0,
            own,
            uses: Uses::default(),
        },
    );
}

fn used(s: &mut State, i: u32) {
    let mut need = Vec::new();
    s.uses(i, &[X], &[0], "k", true, 0, &mut need);
}

/// Used on B, freed on A with nothing between: a race; an event recorded on B after the use
/// and waited on by A orders it; recorded before the use, it does not.
#[test]
fn an_event_orders_only_what_was_queued_before_its_record() {
    let (mut s, id) = state_with(&[(0xa, false), (0xb, false)]);
    let (a, b) = (id[0], id[1]);
    alloc(&mut s, a);
    used(&mut s, b);
    let r = s.free(X, Some(a)).expect("a race");
    assert_eq!((r.u.stream, r.u.tick, r.seen), (b, 1, 0));

    alloc(&mut s, a);
    used(&mut s, b);
    s.record(7, b);
    s.wait(a, 7);
    assert!(s.free(X, Some(a)).is_none());

    alloc(&mut s, a);
    s.record(8, b);
    used(&mut s, b);
    s.wait(a, 8);
    assert!(s.free(X, Some(a)).is_some());
}

/// The host's waits: a stream synchronised, an event synchronised, the context; a
/// synchronous free is never a finding.
#[test]
fn the_hosts_waits_order_later_work() {
    let (mut s, id) = state_with(&[(0xa, false), (0xb, false)]);
    let (a, b) = (id[0], id[1]);
    for how in 0..4 {
        alloc(&mut s, a);
        used(&mut s, b);
        match how {
            0 => s.host_after(b),
            1 => {
                s.record(3, b);
                s.host_after_event(3)
            }
            2 => s.host_after_all(),
            _ => {
                assert!(s.free(X, None).is_none());
                continue;
            }
        }
        assert!(s.free(X, Some(a)).is_none(), "{how}");
    }
}

/// The legacy default stream waits for blocking streams and they for it; a non-blocking
/// stream does neither.
#[test]
fn the_legacy_stream_orders_blocking_streams_only() {
    let (mut s, id) = state_with(&[(0xa, true), (0xb, true), (0xc, false)]);
    let (a, b, c) = (id[0], id[1], id[2]);
    // Used on blocking B, then anything on the legacy stream, then freed on blocking A.
    alloc(&mut s, a);
    used(&mut s, b);
    s.enter(LEGACY);
    assert!(s.free(X, Some(a)).is_none());
    // Used on non-blocking C: the legacy stream does not wait for it.
    alloc(&mut s, a);
    used(&mut s, c);
    s.enter(LEGACY);
    assert!(s.free(X, Some(a)).is_some());
    // Freed on the legacy stream itself after a use on blocking B: ordered.
    alloc(&mut s, LEGACY);
    used(&mut s, b);
    assert!(s.free(X, Some(LEGACY)).is_none());
    // Used on the legacy stream, freed on blocking A: A's work waits for it.
    alloc(&mut s, a);
    used(&mut s, LEGACY);
    assert!(s.free(X, Some(a)).is_none());
    // ... but not on non-blocking C.
    alloc(&mut s, c);
    used(&mut s, LEGACY);
    assert!(s.free(X, Some(c)).is_some());
}

/// Uses on the allocation's own stream need no stack; the latest use per stream is kept.
#[test]
fn only_uses_on_other_streams_ask_for_a_stack() {
    let (mut s, id) = state_with(&[(0xa, false), (0xb, false)]);
    let (a, b) = (id[0], id[1]);
    alloc(&mut s, a);
    let mut need = Vec::new();
    s.uses(a, &[X, 0, 5], &[0, 1, 2], "k", true, 0, &mut need);
    assert!(need.is_empty());
    s.uses(b, &[X], &[0], "k", true, 0, &mut need);
    s.uses(b, &[X], &[0], "k2", true, 0, &mut need);
    assert_eq!(need, [(X, 1), (X, 2)]);
    assert_eq!(s.allocs[&X].uses.iter().count(), 2);
    assert_eq!(s.free(X, Some(a)).unwrap().u.name, "k2");
}

/// A struct of words is a group of uses only when every word is an allocation's start or
/// zero: an array of operands, not a struct with an integer in it.
#[test]
fn a_struct_is_uses_only_when_all_its_words_are_allocations() {
    let (mut s, id) = state_with(&[(0xa, false), (0xb, false)]);
    let (a, b) = (id[0], id[1]);
    alloc(&mut s, a);
    let mut need = Vec::new();
    s.uses(b, &[X, 7, 0, X], &[0, 2], "k", true, 0, &mut need);
    assert_eq!(need, [(X, 1)], "the second group (0, X) only");
    alloc(&mut s, a);
    need.clear();
    s.uses(b, &[X, 7], &[0], "k", true, 0, &mut need);
    assert!(need.is_empty());
    assert!(s.free(X, Some(a)).is_none());
}

/// A destroyed stream's index goes to the next new stream with its clock: components only
/// grow, so an old use stays unordered until something orders it.
#[test]
fn a_reused_index_keeps_its_clock() {
    let (mut s, id) = state_with(&[(0xa, false), (0xb, false)]);
    let (a, b) = (id[0], id[1]);
    alloc(&mut s, a);
    used(&mut s, b);
    s.gone(Key::Created(0xb));
    let b2 = s.add(Key::Created(0xd), false);
    assert_eq!(b2, b);
    assert_eq!(s.streams[b as usize].vc[b as usize], 1);
    assert!(s.free(X, Some(a)).is_some());
}

/// After a graph launch, an event the library has not seen recorded since may have been
/// recorded by the graph: waiting for it orders after every stream; recorded again, it is
/// what the library saw.
#[test]
fn after_a_graph_an_event_not_seen_recorded_since_orders_after_everything() {
    let (mut s, id) = state_with(&[(0xa, false), (0xb, false), (0xc, false)]);
    let (a, b, c) = (id[0], id[1], id[2]);
    alloc(&mut s, a);
    used(&mut s, b);
    s.record(9, c); // before the graph: may be recorded again by it
    s.graph(c);
    s.wait(a, 9);
    assert!(s.free(X, Some(a)).is_none());
    alloc(&mut s, a);
    used(&mut s, b);
    s.record(9, c); // after the graph: exactly what was seen
    s.wait(a, 9);
    assert!(s.free(X, Some(a)).is_some());
}

/// Waits the library cannot see order the stream after every stream.
#[test]
fn an_unseen_wait_orders_after_everything() {
    let (mut s, id) = state_with(&[(0xa, false), (0xb, false)]);
    let (a, b) = (id[0], id[1]);
    alloc(&mut s, a);
    used(&mut s, b);
    s.wait_all(a);
    assert!(s.free(X, Some(a)).is_none());
}

//! Log mode: every call recorded as it is, nothing else done. Isolate mode records the calls
//! it does not change through here too.
//!
//! Layer: policies. Uses the base and recording.

use crate::base::cuda::*;
use crate::record::event::Pending;
use isolate_trace::Event;

/// An allocation: `call` makes the real one, `after` adds what only the result tells (pitch).
#[inline]
pub fn alloc(
    proto: Event,
    out: Out,
    mut call: impl FnMut() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    let mut p = Pending::after(proto.api);
    p.ev = Event {
        seq: p.ev.seq,
        ..proto
    };
    let r = call();
    p.ev.result = r;
    if r == CUDA_SUCCESS {
        p.ev.ptr = out.read();
    }
    after(&mut p.ev);
    p.finish(r);
    r
}

/// Any other call (a free too), recorded as it is. `before`: take the sequence number before
/// the real call (calls that give something back, so that nothing that gets the same address
/// can be ordered before them).
#[inline]
pub fn other(
    proto: Event,
    before: bool,
    mut call: impl FnMut() -> i32,
    after: impl FnOnce(&mut Event),
) -> i32 {
    let mut p = if before {
        Pending::before(proto.api)
    } else {
        Pending::after(proto.api)
    };
    p.ev = Event {
        seq: p.ev.seq,
        ..proto
    };
    let r = call();
    p.ev.result = r;
    after(&mut p.ev);
    p.finish(r);
    r
}

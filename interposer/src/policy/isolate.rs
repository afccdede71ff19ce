//! Isolation mode. (Being written: for now it records as log mode does.)

use super::Out;
use crate::record::Pending;
use isolate_trace::Event;

pub fn before_main() {}
pub fn at_exit() {}
pub fn after_fork_child() {}

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
    if r == 0 {
        p.ev.ptr = out.read();
    }
    after(&mut p.ev);
    p.finish(r);
    r
}

pub fn free(proto: Event, call: impl FnOnce() -> i32) -> i32 {
    let mut p = Pending::before(proto.api);
    p.ev = Event {
        seq: p.ev.seq,
        ..proto
    };
    let r = call();
    p.finish(r);
    r
}

pub fn other(
    proto: Event,
    before: bool,
    call: impl FnOnce() -> i32,
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

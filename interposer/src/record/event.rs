//! Events: sequence numbers, timing, the device, and handing the finished event to the writer.
//!
//! Layer: recording. Uses the base, [`super::writer`] and [`super::stacks`].

use super::{stacks, writer};
use crate::base::config;
use crate::base::cu;
use crate::base::cuda::*;
use crate::base::real::CTX_GET_DEVICE;
use crate::base::sys::{gettid, now_ns};
use isolate_trace::{Api, Event, Note, NoteKind, Record};
use std::sync::atomic::{AtomicU64, Ordering::*};

static SEQ: AtomicU64 = AtomicU64::new(0);

#[inline]
pub fn next_seq() -> u64 {
    SEQ.fetch_add(1, Relaxed)
}

/// The last sequence number taken so far (0 before any): what a use that is no event of its
/// own names as "after event N" (policy/order/).
#[inline]
pub fn last_seq() -> u64 {
    SEQ.load(Relaxed).saturating_sub(1)
}

/// In a fork child: its trace starts again at 0.
pub fn after_fork_child() {
    SEQ.store(0, Relaxed);
}

/// Bumped whenever a context ends ([`contexts_changed`]): a thread's remembered (context,
/// device) is used only while this has not moved (a new context may get an ended one's handle).
static CONTEXTS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The calling thread's last (context, device, [`CONTEXTS`] then).
    static LAST_DEVICE: std::cell::Cell<(usize, i32, u64)> =
        const { std::cell::Cell::new((0, -1, u64::MAX)) };
}

/// A context ended (its handle may be handed out again, for another device).
pub fn contexts_changed() {
    CONTEXTS.fetch_add(1, Relaxed);
}

/// Device ordinal of the calling thread's current context, -1 if none. `cuCtxGetCurrent`
/// first, which answers "none" without failing: `cuCtxGetDevice` with no context current fails,
/// a line in the driver's error log (CUDA_LOG_FILE) for every event of a thread that has none
/// yet. The device of the thread's last context is remembered, so an event makes one driver
/// call, as before.
#[inline]
pub fn current_device() -> i32 {
    let Some(get_dev) = CTX_GET_DEVICE.get() else {
        return -1;
    };
    super::profile::timed(
        super::profile::Part::Context,
        || match cu::ctx_get_current() {
            Ok(c) if !c.is_null() => device_in(get_dev, c as usize),
            _ => -1,
        },
    )
}

/// Device ordinal of context `ctx`, current on the calling thread (for a caller that asked the
/// driver for it already: one question fewer), -1 for none.
#[inline]
pub fn device_of(ctx: usize) -> i32 {
    match CTX_GET_DEVICE.get() {
        Some(get_dev) if ctx != 0 => {
            super::profile::timed(super::profile::Part::Context, || device_in(get_dev, ctx))
        }
        _ => -1,
    }
}

/// Device ordinal of `ctx`, the calling thread's current context: the device of the thread's
/// last context is remembered, else `get_dev` (the driver's `cuCtxGetDevice`) answers.
#[inline]
fn device_in(get_dev: unsafe extern "C" fn(*mut CUdevice) -> CUresult, ctx: usize) -> i32 {
    let generation = CONTEXTS.load(Relaxed);
    let last = LAST_DEVICE.try_with(|c| c.get()).ok();
    if let Some((c, d, g)) = last
        && c == ctx
        && g == generation
    {
        return d;
    }
    let mut d: CUdevice = -1;
    // SAFETY: `get_dev` is the driver's cuCtxGetDevice, resolved with that declaration by
    // base::real; its one argument is a `CUdevice *` it writes, and `d` is a live local of
    // that type. The call reads only the calling thread's current context.
    if unsafe { get_dev(&mut d) } != CUDA_SUCCESS {
        return -1;
    }
    let _ = LAST_DEVICE.try_with(|c| c.set((ctx, d, generation)));
    d
}

thread_local! {
    /// The real calls of the recorded event this thread is making ([`Pending`]): when the
    /// first started and the last returned ([`now_ns`]), 0 for none yet.
    static CALL: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Makes the real call of the event this thread has pending, timing it: the event's duration
/// is its real calls' time (from the first's start to the last's end, retries included) and its
/// timestamp when the last returned. Two clock reads an event; the library's own work around
/// the call (the stack's capture, the policy) is in neither.
#[inline(always)]
pub fn real_call(f: impl FnOnce() -> i32) -> i32 {
    let t0 = now_ns();
    let r = f();
    let t1 = now_ns();
    super::profile::add_real(t1.saturating_sub(t0));
    let _ = CALL.try_with(|c| {
        let (first, _) = c.get();
        c.set((if first == 0 { t0 } else { first }, t1));
    });
    r
}

/// An event under construction: the sequence number is taken when it is made ([`Pending::before`])
/// or finished ([`Pending::after`]); its time is its real calls' ([`real_call`]), or when it is
/// finished for an event that made none (a free isolation keeps in quarantine).
pub struct Pending {
    pub ev: Event,
    /// [`Pending::stack`] was called: `ev.stack` holds the capture.
    captured: bool,
    /// The time a policy read for what it did instead of the real call ([`Pending::at`]).
    at: u64,
}

impl Pending {
    /// For calls that give memory back: the sequence number is taken *before* the real call,
    /// so no allocation that gets the same address can be ordered before this free.
    #[inline]
    pub fn before(api: Api) -> Pending {
        let mut p = Pending::after(api);
        p.ev.seq = next_seq();
        p
    }

    /// For calls that hand memory out: the sequence number is taken when the call returns.
    #[inline]
    pub fn after(api: Api) -> Pending {
        let _ = CALL.try_with(|c| c.set((0, 0)));
        Pending {
            ev: Event {
                seq: u64::MAX,
                api,
                device: -1,
                ..Event::default()
            },
            captured: false,
            at: 0,
        }
    }

    /// For an event that makes no real call (a free isolation keeps in quarantine): `t`
    /// ([`now_ns`]), which the policy read for its own record of it, is the event's time too.
    #[inline]
    pub fn at(&mut self, t: u64) {
        self.at = t;
    }

    /// The calling thread's stack id ([`stacks::capture`]), captured now, once: the event
    /// carries the same id when it is finished. For a policy that keeps the id with what it
    /// tracks (isolation: a live allocation, a quarantine entry). 0 is "no stack".
    #[inline]
    pub fn stack(&mut self) -> u32 {
        if !self.captured {
            self.ev.stack = self.capture();
            self.captured = true;
        }
        self.ev.stack
    }

    /// The calling thread's stack, for this event's kind of call.
    #[inline]
    fn capture(&self) -> u32 {
        if self.ev.api.kind() == isolate_trace::Kind::Free {
            stacks::capture_free()
        } else {
            stacks::capture()
        }
    }

    /// Stamps the result and timing and hands the event to the writer.
    #[inline]
    pub fn finish(mut self, result: i32) {
        let (t0, t1) = CALL.try_with(|c| c.replace((0, 0))).unwrap_or((0, 0));
        if self.ev.seq == u64::MAX {
            self.ev.seq = next_seq();
        }
        self.ev.result = result;
        if t1 != 0 {
            self.ev.ts_ns = t1;
            self.ev.duration_ns = t1.saturating_sub(t0);
        } else {
            self.ev.ts_ns = if self.at != 0 { self.at } else { now_ns() };
            self.ev.duration_ns = 0;
        }
        self.ev.tid = gettid();
        if self.ev.device < 0 {
            self.ev.device = current_device();
        }
        if config::get().test_panic {
            panic!("isolate: forced internal error (ISOLATE_TEST_PANIC=1)");
        }
        // On the calling thread, after the real call (or taken earlier by `stack`, on this
        // thread too): its definition is queued before this.
        if !self.captured {
            self.ev.stack = self.capture();
        }
        super::profile::timed(super::profile::Part::Submit, || {
            writer::submit(Record::Event(self.ev))
        });
    }
}

/// A note about the library's own cost or counters ([`NoteKind::Cost`]).
pub fn cost_note(topic: isolate_trace::CostTopic, size: u64, value: u64, text: String) {
    note(NoteKind::Cost, topic as u64, size, value, text);
}

/// A note from the library itself (quarantine, OOM retries, …).
pub fn note(kind: NoteKind, ptr: u64, size: u64, value: u64, text: String) {
    let seq = next_seq();
    writer::submit(Record::Note(Note {
        seq,
        ts_ns: now_ns(),
        kind,
        ptr,
        size,
        value,
        text,
    }));
}

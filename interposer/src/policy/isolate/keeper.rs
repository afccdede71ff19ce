//! The keeper: the library's own thread for the quarantine's slow work, so that the freeing
//! thread does not wait for it. Two jobs moved here from the free (issue 31: on ResNet-50 the
//! fast tier's profile put 18.8 of the free's 34.1 ms in 209 calls of over 20 µs, these two):
//!
//! - **The trim over the budget**: the free that finds the quarantine over its budget hands
//!   the keeper the trim (quarantine.rs): taking the oldest out, 256 at a time (~50 µs of index
//!   work under the state's lock), and releasing them (a batch of 256: ~74 µs of verification
//!   launches on the H100). The frees meanwhile go on, and trim a step themselves only once the
//!   quarantine is an eighth past its limit.
//! - **The device-memory probe** (`cuMemGetInfo` every 20 ms of frees, ~100 µs on the H100,
//!   and, while the device is short of memory, the kept memory given back and the default pool
//!   trimmed): made here with the last free's context current; what the device lacks is
//!   published for the next free, which cuts the quarantine's limit as before.
//!
//! The keeper runs with every signal blocked, marked as the library's own thread (no hook
//! records its calls), in the relaxed capture mode (its calls never fail or invalidate a
//! capture the program makes on another thread in the global mode). Where it cannot run (no
//! thread could be made), while it is paused, and while memory is tight ([`offer`]), the work
//! is done on the freeing thread as before. A fork child starts a keeper of its own.
//!
//! **Paused** while a context ends (its memory must be checked and freed before the call, and
//! nothing may use the context after it) and for good at exit: [`pause`] waits for the job in
//! progress, runs the queued ones on the calling thread, and keeps the keeper idle until the
//! pause ends. A job is queued and the pause taken under one lock, so no job is left behind.
//!
//! It knows nothing of the quarantine: a job is a closure, the probe a function the quarantine
//! names at its first free ([`freed`]).
//!
//! Layer: policies. Uses the base and recording only.

use crate::base::config;
use crate::base::cu;
use crate::base::cuda::CUcontext;
use crate::base::sys::{coarse_ns, spawn_unsignalled};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Work handed over: entries taken out of quarantine over the budget, to be released.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A job and the context it is run in on the keeper (the freeing thread's: the release paths
/// read their batches' results and ask the device's memory in the current context).
struct Queued {
    ctx: usize,
    job: Job,
}

/// The device-memory probe: (the free's time, its context) → what the device lacks of its
/// reserve, if it is short and was asked.
pub(super) type Probe = fn(u64, usize) -> Option<u64>;
static PROBE: std::sync::OnceLock<Probe> = std::sync::OnceLock::new();

struct Queue {
    jobs: VecDeque<Queued>,
    /// Pauses in force ([`pause`]): jobs are not queued, and the keeper does nothing.
    paused: u32,
}

/// What the keeper and the threads handing it work share: made when the keeper starts, and
/// made again by a fork child's keeper (a lock the parent's keeper held at the fork would never
/// be released in the child; the old one is left alone there, never touched).
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Held by whoever runs jobs or the probe (the keeper, or a thread taking a pause): a pause
    /// waits here for the keeper's work in progress.
    busy: Mutex<()>,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());

/// The keeper's shared state while it runs.
fn shared() -> Option<&'static Shared> {
    if KEEPER.load(Acquire) != RUNNING {
        return None;
    }
    let p = SHARED.load(Acquire);
    // SAFETY: SHARED holds null or a leaked Box (never freed), stored before RUNNING.
    (!p.is_null()).then(|| unsafe { &*p })
}

const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
/// No keeper in this process (a thread could not be made): the work is done on the freeing
/// thread.
const NONE: u8 = 2;
const STARTING: u8 = 3;
static KEEPER: AtomicU8 = AtomicU8::new(NOT_STARTED);

/// The context of the last free (0: none, or it ended): the probe's.
static PROBE_CTX: AtomicUsize = AtomicUsize::new(0);
/// Frees quarantined so far: the keeper probes only after frees.
static FREES: AtomicU64 = AtomicU64::new(0);
/// What the device lacks of its reserve, as the keeper's last probe found (0: nothing),
/// taken by the next free.
static SHORT: AtomicU64 = AtomicU64::new(0);
/// Jobs the keeper ran, and probes it made (noted at exit).
pub(super) static KEPT_JOBS: AtomicU64 = AtomicU64::new(0);
pub(super) static KEPT_PROBES: AtomicU64 = AtomicU64::new(0);

/// How often the keeper probes the device's memory while frees come in.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// The keeper's stack: it runs the release paths (verification launches, the reports' lines).
const KEEPER_STACK: usize = 1 << 20;

/// Starts the keeper if it has not been (at the first quarantined free); its shared state
/// while it runs.
fn running() -> Option<&'static Shared> {
    match KEEPER.load(Acquire) {
        RUNNING => shared(),
        NOT_STARTED => start(),
        _ => None,
    }
}

#[cold]
fn start() -> Option<&'static Shared> {
    if KEEPER
        .compare_exchange(NOT_STARTED, STARTING, AcqRel, Acquire)
        .is_err()
    {
        return shared(); // another thread starts it (or has): the work is done here meanwhile
    }
    let sh: &'static Shared = Box::leak(Box::new(Shared {
        queue: Mutex::new(Queue {
            jobs: VecDeque::new(),
            paused: 0,
        }),
        wake: Condvar::new(),
        busy: Mutex::new(()),
    }));
    let spawned = spawn_unsignalled(
        std::thread::Builder::new()
            .name("isolate-keeper".into())
            .stack_size(KEEPER_STACK),
        move || keeper_main(sh),
    );
    if spawned.is_err() {
        KEEPER.store(NONE, Release);
        return None;
    }
    SHARED.store(std::ptr::from_ref(sh).cast_mut(), Release);
    KEEPER.store(RUNNING, Release);
    Some(sh)
}

/// A free was quarantined in context `ctx` at `now`. Returns what the device lacks of its
/// reserve when the keeper's probe found it short since the last free (the caller cuts the
/// quarantine's limit), or `None`; without a keeper, the free asks `probe` itself (which asks
/// the driver every 20 ms at most).
pub(super) fn freed(now: u64, ctx: usize, probe: Probe) -> Option<u64> {
    if running().is_none() {
        return probe(now, ctx);
    }
    if PROBE.get().is_none() {
        let _ = PROBE.set(probe);
    }
    if ctx != 0 && PROBE_CTX.load(Relaxed) != ctx {
        PROBE_CTX.store(ctx, Relaxed);
    }
    FREES.fetch_add(1, Relaxed);
    if SHORT.load(Relaxed) == 0 {
        return None;
    }
    Some(SHORT.swap(0, Relaxed)).filter(|&s| s > 0)
}

/// Jobs the keeper may have waiting; past them the caller does its job itself. A backstop: the
/// quarantine queues one trim at a time, and a keeper that falls behind on it is caught up by
/// the frees themselves past the quarantine's slack (quarantine.rs).
const MAX_QUEUED: usize = 2;

/// When an allocation last ran out of memory ([`out_of_memory`]; coarse clock, 0: never).
static OUT_OF_MEMORY_AT: AtomicU64 = AtomicU64::new(0);

/// How long after an allocation ran out of memory releases stay on the freeing thread.
const TIGHT_FOR_NS: u64 = 1_000_000_000;

/// An allocation ran out of memory: for the next second releases are made on the freeing
/// thread again, before its free returns ([`tight`]).
pub(super) fn out_of_memory() {
    OUT_OF_MEMORY_AT.store(coarse_ns().max(1), Relaxed);
}

/// Whether the last probe found the device with its reserve free (`ISOLATE_RESERVE`: a
/// sixteenth of the device by default, at least 1 GiB; a lag of the keeper's cannot use that
/// up). Until a probe says so (and never with the probe off, `ISOLATE_RESERVE=0`) releases are
/// made on the freeing thread. (Twice the reserve was asked first: on the H100 the quarantine,
/// the kept memory and the default pool's cache keep the device near its reserve by design, so
/// the keeper took no release at all in the models' runs.)
static ROOMY: AtomicBool = AtomicBool::new(false);

/// What the probe found: the reserve free or not ([`ROOMY`]).
pub(super) fn room(roomy: bool) {
    ROOMY.store(roomy, Relaxed);
}

/// Whether memory is tight: the last probe found the reserve not free, or an allocation ran out
/// of it within the last second. Then a release is made before the free returns, as without the keeper: on a device that is
/// nearly full the program's next allocation would otherwise come before the keeper has given
/// the memory back (the stand-in's 12 MiB device: every few rounds an allocation ran out of
/// memory and waited in the slow way out; kept memory served 20 of 200 allocations instead of
/// 115, and the program got 9-10 of its 1 MiB blocks at the end instead of 11).
fn tight() -> bool {
    let at = OUT_OF_MEMORY_AT.load(Relaxed);
    !ROOMY.load(Relaxed) || (at != 0 && coarse_ns().saturating_sub(at) < TIGHT_FOR_NS)
}

/// Queues `job` for the keeper, to run with context `ctx` current; gives it back where the
/// keeper does not run, is paused or has [`MAX_QUEUED`] jobs waiting, or where memory is tight
/// ([`tight`]; the quarantine makes a cut limit's trim itself). The caller then does the work
/// itself.
pub(super) fn offer(ctx: usize, job: Job) -> Result<(), Job> {
    let Some(sh) = running().filter(|_| !tight()) else {
        return Err(job);
    };
    let mut q = sh.queue();
    if q.paused > 0 || q.jobs.len() >= MAX_QUEUED {
        return Err(job);
    }
    q.jobs.push_back(Queued { ctx, job });
    drop(q);
    sh.wake.notify_one();
    Ok(())
}

/// A context is about to end (the caller holds a [`Pause`]): the probe makes none current
/// until the next free names one.
pub(super) fn context_ending() {
    PROBE_CTX.store(0, Relaxed);
}

/// Keeps the keeper idle while it lives (see the module comment): its work in progress is
/// waited for, and the jobs it had not started are run on the calling thread.
pub(super) struct Pause(Option<&'static Shared>);

/// Takes a pause (nothing to wait for where no keeper runs).
pub(super) fn pause() -> Pause {
    let Some(sh) = shared() else {
        return Pause(None);
    };
    let jobs: Vec<Queued> = {
        let mut q = sh.queue();
        q.paused += 1;
        q.jobs.drain(..).collect()
    };
    // The keeper's job or probe in progress, if any, ends before this goes on; it starts no
    // other while the pause holds.
    drop(sh.busy.lock().unwrap_or_else(|p| p.into_inner()));
    // On the calling thread, in its own context (the entries' where they differ: the release
    // paths switch to each entry's context themselves).
    for q in jobs {
        (q.job)();
    }
    Pause(Some(sh))
}

impl Drop for Pause {
    fn drop(&mut self) {
        if let Some(sh) = self.0 {
            let mut q = sh.queue();
            q.paused = q.paused.saturating_sub(1);
        }
    }
}

/// The keeper for good (at exit): paused, never resumed.
pub(super) fn stop() {
    // Not started: never will be. Starting on another thread: once it runs, paused.
    loop {
        match KEEPER.compare_exchange(NOT_STARTED, NONE, AcqRel, Acquire) {
            Ok(_) => return,
            Err(STARTING) => std::thread::yield_now(),
            Err(_) => break,
        }
    }
    std::mem::forget(pause());
}

fn keeper_main(sh: &'static Shared) {
    crate::record::thread::mark_internal_thread();
    // Without the relaxed mode, a call of the keeper's during a capture in the global mode on
    // another thread would fail and invalidate that capture.
    // (A driver without the call has no captures to spoil either: CUDA 10.1 brought both.)
    let _ = cu::relax_capture_mode();
    let mut probe = Probing::default();
    loop {
        // Woken by a job, or every PROBE_EVERY for the probe.
        let paused = {
            let (q, _) = sh
                .wake
                .wait_timeout_while(sh.queue(), PROBE_EVERY, |q| {
                    q.jobs.is_empty() || q.paused > 0
                })
                .unwrap_or_else(|p| p.into_inner());
            q.paused > 0
        };
        if paused {
            std::thread::sleep(PROBE_EVERY);
            continue;
        }
        let _busy = sh.busy.lock().unwrap_or_else(|p| p.into_inner());
        // Jobs are taken under `busy`: a pause that begins now either finds them queued or
        // waits for this one to end. The probe between two (a run of jobs that waited for the
        // device went on for half a second on the stand-in, and no probe was made meanwhile).
        loop {
            probe.when_due(sh);
            let job = {
                let mut q = sh.queue();
                if q.paused > 0 {
                    break;
                }
                q.jobs.pop_front()
            };
            let Some(Queued { ctx, job }) = job else {
                break;
            };
            KEPT_JOBS.fetch_add(1, Relaxed);
            in_context(ctx, job);
        }
    }
}

/// When the keeper last probed, and the frees it had seen then.
#[derive(Default)]
struct Probing {
    at: u64,
    frees: u64,
}

impl Probing {
    /// Probes (with the last free's context current) if frees came since the last probe and
    /// [`PROBE_EVERY`] has passed, while no pause holds.
    fn when_due(&mut self, sh: &Shared) {
        let now = coarse_ns();
        let frees = FREES.load(Relaxed);
        if config::get().reserve_off()
            || frees == self.frees
            || now.saturating_sub(self.at) < PROBE_EVERY.as_nanos() as u64
        {
            return;
        }
        let paused = sh.queue().paused > 0;
        let ctx = PROBE_CTX.load(Relaxed);
        let (false, true, Some(&probe)) = (paused, ctx != 0, PROBE.get()) else {
            return;
        };
        self.frees = frees;
        self.at = now;
        KEPT_PROBES.fetch_add(1, Relaxed);
        in_context(ctx, move || {
            if let Some(short) = probe(now, ctx) {
                SHORT.store(short.max(1), Relaxed);
            }
        });
    }
}

/// Runs `f` on the keeper with context `ctx` current where it can be made so, and none after
/// (a panic stays here). Run either way: a job's entries are out of quarantine, and the release
/// paths make each entry's own context current themselves.
fn in_context(ctx: usize, f: impl FnOnce()) {
    if ctx != 0 {
        // SAFETY: the context of a free the program made, which has not ended: an ending
        // context is taken out of PROBE_CTX, and the jobs of its frees are run, under a pause
        // (the keeper's work waited for) before the call that ends it.
        let _ = unsafe { cu::ctx_set_current(ctx as CUcontext) };
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // SAFETY: no context current on this thread: nothing the program has is touched.
    let _ = unsafe { cu::ctx_set_current(std::ptr::null_mut()) };
}

/// In a fork child: the parent's keeper is not there (only the forking thread is), nor are its
/// jobs the child's (its quarantine starts empty). The child's own keeper starts at its first
/// release, with state of its own. (A child without one, as first built, gave the tier
/// benchmark's models, each forked from one process, no keeper at all.)
pub(super) fn after_fork_child() {
    SHARED.store(std::ptr::null_mut(), Release);
    KEEPER.store(NOT_STARTED, Release);
    OUT_OF_MEMORY_AT.store(0, Relaxed);
    SHORT.store(0, Relaxed);
    ROOMY.store(false, Relaxed);
    PROBE_CTX.store(0, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, mpsc};
    use std::time::Duration;

    /// A pause waits for the keeper's job in progress, runs the one still queued on the calling
    /// thread (after the first: a trim's steps stay in order), and keeps the keeper from
    /// taking more until it ends; memory that is tight (an allocation out of it, no reserve known
    /// free) keeps the work on the caller.
    #[test]
    fn a_pause_waits_for_the_job_in_progress_and_runs_the_queued_ones_itself() {
        room(true);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (started_tx, started_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let o = order.clone();
        let first: Job = Box::new(move || {
            started_tx.send(std::thread::current().id()).unwrap();
            go_rx.recv().unwrap();
            o.lock().unwrap().push("first");
        });
        assert!(offer(0, first).is_ok());
        let keeper = started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_ne!(keeper, std::thread::current().id(), "run on the keeper");
        let o = order.clone();
        let (ran_on_tx, ran_on_rx) = mpsc::channel();
        let second: Job = Box::new(move || {
            ran_on_tx.send(std::thread::current().id()).unwrap();
            o.lock().unwrap().push("second");
        });
        assert!(offer(0, second).is_ok(), "queued behind the first");
        let o = order.clone();
        let pauser = std::thread::spawn(move || {
            let p = pause();
            o.lock().unwrap().push("paused");
            // While paused nothing is taken: the caller does the work.
            let back = offer(0, Box::new(|| {}));
            drop(p);
            (std::thread::current().id(), back.is_err())
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            order.lock().unwrap().is_empty(),
            "the pause waits for the job in progress"
        );
        go_tx.send(()).unwrap();
        let (pauser_id, refused) = pauser.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["first", "second", "paused"]);
        assert_eq!(
            ran_on_rx.recv().unwrap(),
            pauser_id,
            "the queued job ran on the pausing thread"
        );
        assert!(refused, "no job is taken while a pause holds");
        // Tight memory: an allocation ran out of it just now.
        out_of_memory();
        assert!(offer(0, Box::new(|| {})).is_err());
        OUT_OF_MEMORY_AT.store(0, Relaxed);
        // No probe has found the reserve free.
        room(false);
        assert!(offer(0, Box::new(|| {})).is_err());
    }
}

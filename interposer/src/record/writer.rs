//! The writer thread and the life of a trace: started on the first event, fed through a
//! bounded crossbeam channel (polled: the writer sleeps 0.2–5 ms when it finds it empty, so
//! no hook ever pays for waking it), flushed every 50 ms and on every way out of the process.
//!
//! Hooks never do I/O and never block on a lock: they `try_send`, and only when the queue is
//! full do they wait (with a backoff, counted in the trace). The writer owns the file; the call
//! that starts a trace waits until the writer has opened it (see `start`).
//!
//! Layer: recording. Uses the base, [`super::header`] and [`super::thread`].

use super::{header, thread};
use crate::base::config::{self, Mode};
use crate::base::sys::{gettid, nap, now_ns, spawn_unsignalled, wait_until, warn};
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use isolate_trace::{Encoder, End, EndReason, Header, Record, Stats};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering::*,
};
use std::time::Duration;

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
/// Closed at exit, or recording impossible (mode off, trace file could not be created).
const CLOSED: u8 = 3;
/// Ended for an `exec` that may still fail: hooks wait (the process is about to be replaced,
/// or the trace goes on, [`resume_after_exec`]).
const EXECING: u8 = 4;

/// The writer thread's stack: std's default for its threads.
const WRITER_STACK: usize = 2 << 20;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static SESSION: AtomicPtr<Session> = AtomicPtr::new(std::ptr::null_mut());

/// Messages the hooks have handed over (the writer counts what it received against this).
static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static RECEIVED: AtomicU64 = AtomicU64::new(0);
/// Of those, the stack table's definitions (Module, PyCode, Stack, StackOf): not events.
static DEFINITIONS: AtomicU64 = AtomicU64::new(0);
static QUEUE_WAITS: AtomicU64 = AtomicU64::new(0);
static QUEUE_WAIT_NS: AtomicU64 = AtomicU64::new(0);
/// Quarantine figures, kept by the isolation policy and written with the stats.
pub static Q_PEAK: AtomicU64 = AtomicU64::new(0);
pub static Q_RELEASES: AtomicU64 = AtomicU64::new(0);
pub static Q_EARLY: AtomicU64 = AtomicU64::new(0);

/// Flush requests: a generation counter, the message count to wait for, and how to end.
static FLUSH_GEN: AtomicU64 = AtomicU64::new(0);
static FLUSH_DONE: AtomicU64 = AtomicU64::new(0);
static FLUSH_TARGET: AtomicU64 = AtomicU64::new(0);
/// 0: just flush; 1: end (exit); 2: end (exec); 3: end (signal in FLUSH_SIGNAL).
static FLUSH_END: AtomicU8 = AtomicU8::new(0);
static FLUSH_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The pid that owns the current trace, and the writer's thread id.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
/// Set by the first thread that ends the trace (exit, a fatal signal, exec); others that end it
/// at the same time wait for [`ENDED`], set by the writer once the end record is written.
static ENDING: AtomicBool = AtomicBool::new(false);
static ENDED: AtomicBool = AtomicBool::new(false);
static WRITER_TID: AtomicU32 = AtomicU32::new(0);
/// Set by the writer once its file is open and its descriptor moved up (or it could not be
/// opened): the thread that started the trace waits for it (see `start`).
static OPENED: AtomicBool = AtomicBool::new(false);
/// Set when an `exec` failed: the writer takes its end record back and the trace goes on.
static RESUME: AtomicBool = AtomicBool::new(false);
/// Set by the writer once it took the end back (after [`RESUME`]).
static RESUMED: AtomicBool = AtomicBool::new(false);

const QUEUE: usize = 4096;

/// Called when a trace starts (by the layer above, which registers it): before the trace
/// accepts events, and again right after, while the queue is still empty.
static ON_START: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// When [`on_start`]'s function is called.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Started {
    Before,
    After,
}

/// Registers what runs when a trace starts (process life: the signal handlers, the late-load
/// note). The recorder calls up only through this.
pub fn on_start(f: fn(Started)) {
    ON_START.store(f as *mut (), Release);
}

struct Session {
    tx: Sender<Record>,
}

/// The trace file's path, once the writer opened it (for the library's stderr lines, which
/// name it so that `isolate summary` can be pointed at it). Set by the writer, which takes no
/// lock: a leaked `String`, never freed (a later trace of the process, after a fork or an exec
/// that failed, stores another and leaks the old, which a reader may still be cloning).
static PATH: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());

fn set_path(path: Option<&str>) {
    let new = path.map_or(std::ptr::null_mut(), |p| {
        Box::into_raw(Box::new(p.to_owned()))
    });
    PATH.store(new, Release);
}

/// The trace file's path, when it is open.
pub fn path() -> Option<String> {
    let p = PATH.load(Acquire);
    // SAFETY: a non-null PATH came from `Box::into_raw` in `set_path` and is never freed.
    (!p.is_null()).then(|| unsafe { (*p).clone() })
}

/// True once a trace has been started (this process has recorded something).
pub fn started() -> bool {
    STATE.load(Acquire) == RUNNING
}

/// True while events are being accepted (or would be, on first use).
#[inline]
pub fn active() -> bool {
    let s = STATE.load(Relaxed);
    s < CLOSED || s == EXECING
}

/// Hands a record to the writer, starting it on first use. Never blocks on a lock; waits only
/// when the queue is full, and then only until the writer has made room.
pub fn submit(rec: Record) {
    let mut s = STATE.load(Acquire);
    if s != RUNNING {
        if s == UNINIT {
            start();
        }
        // While an exec is under way, a hook on another thread waits: the exec either replaces
        // the process (the thread with it) or fails, and the trace goes on with this event.
        while {
            s = STATE.load(Acquire);
            s == STARTING || s == EXECING
        } {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        if s != RUNNING {
            return;
        }
    }
    let session = SESSION.load(Acquire);
    if session.is_null() {
        return;
    }
    // SAFETY: sessions are leaked, never freed.
    let tx = unsafe { &(*session).tx };
    ACCEPTED.fetch_add(1, AcqRel);
    let mut rec = rec;
    let mut waited_since = 0u64;
    let mut spins = 0u32;
    loop {
        match tx.try_send(rec) {
            Ok(()) => break,
            Err(TrySendError::Full(r)) => {
                rec = r;
                if waited_since == 0 {
                    waited_since = now_ns();
                    QUEUE_WAITS.fetch_add(1, Relaxed);
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    nap(50_000);
                }
            }
            Err(TrySendError::Disconnected(_)) => {
                ACCEPTED.fetch_sub(1, AcqRel);
                break;
            }
        }
    }
    if waited_since != 0 {
        QUEUE_WAIT_NS.fetch_add(now_ns().saturating_sub(waited_since), Relaxed);
    }
}

/// Waits (at most 1 s) until the writer has taken every record accepted so far, so that the
/// counters it keeps ([`super::tally`]: the writer counts each record as it takes it, off the
/// hooks' threads) count them: for `isolate_counters` and its like, never for a hook. Returns at
/// once on the writer's own thread, in a fork child whose writer has not started, and where no
/// writer runs.
pub fn caught_up() {
    if OWNER_PID.load(Acquire) != std::process::id() || gettid() == WRITER_TID.load(Relaxed) {
        return;
    }
    let s = STATE.load(Acquire);
    if s != RUNNING && s != CLOSED {
        return;
    }
    let target = ACCEPTED.load(Acquire);
    wait_until(now_ns() + 1_000_000_000, || {
        RECEIVED.load(Acquire) >= target
    });
}

/// A record taken from the queue: counted ([`super::tally`]), then encoded.
fn take(enc: &mut Encoder, rec: &Record, buf: &mut Vec<u8>) {
    super::tally::see(rec);
    enc.encode(rec, buf);
}

/// [`submit`] for a record of the stack table (Module, PyCode, Stack, StackOf), which the
/// `Stats` and `End` records' event count leaves out.
pub fn submit_definition(rec: Record) {
    DEFINITIONS.fetch_add(1, Relaxed);
    submit(rec);
}

#[cold]
fn start() {
    if STATE
        .compare_exchange(UNINIT, STARTING, AcqRel, Acquire)
        .is_err()
    {
        return;
    }
    let cfg = config::get();
    if cfg.mode == Mode::Off {
        STATE.store(CLOSED, Release);
        return;
    }
    // Small on purpose: what sits in the queue is lost to SIGKILL. When the writer falls behind,
    // hooks wait (counted in the trace) rather than let the queue grow past ~10 ms of events.
    let (tx, rx) = bounded::<Record>(QUEUE);
    let session = Box::into_raw(Box::new(Session { tx }));
    SESSION.store(session, Release);
    OWNER_PID.store(std::process::id(), Release);
    // The writer starts with every signal blocked, so signal handlers never run on it.
    // The stack size given, so that std does not read `RUST_MIN_STACK` (a `getenv`, here on a
    // thread of the program while another of its threads may be in `setenv`).
    let spawned = spawn_unsignalled(
        std::thread::Builder::new()
            .name("isolate-writer".into())
            .stack_size(WRITER_STACK),
        move || writer_main(rx),
    );
    match spawned {
        Ok(_) => {
            // The program goes on once the writer is done with small descriptor numbers (the
            // header's reads of /proc, the trace file's open and move up): a program that closes
            // every descriptor it did not open right after its first CUDA call (a daemon, a
            // sandbox) would otherwise do it while the writer holds one, and the writer could
            // then close the file the program opened under that number. At most 2 s (a hung
            // file system): then it goes on.
            let deadline = now_ns() + 2_000_000_000;
            while !OPENED.load(Acquire) && now_ns() < deadline {
                nap(20_000);
            }
            let on_start = ON_START.load(Acquire);
            if !on_start.is_null() {
                // SAFETY: only `on_start` stores to ON_START, and it stores a `fn(Started)`
                // (non-null: checked), a pointer of the same size as the one read back.
                let f: fn(Started) = unsafe { std::mem::transmute(on_start) };
                f(Started::Before);
            }
            // The writer may have closed already (trace file could not be created): keep that.
            let _ = STATE.compare_exchange(STARTING, RUNNING, AcqRel, Acquire);
            if !on_start.is_null() {
                // SAFETY: as above.
                let f: fn(Started) = unsafe { std::mem::transmute(on_start) };
                f(Started::After); // what it submits is first in the queue
            }
        }
        Err(e) => {
            warn(&format!(
                "cannot start the trace writer thread: {e}; recording disabled"
            ));
            STATE.store(CLOSED, Release);
        }
    }
}

/// Asks the writer to write out everything accepted so far and waits (at most `timeout`).
/// Async-signal-safe: atomics and `nap` (`nanosleep`) only.
pub fn flush(end: Option<EndReason>, timeout: Duration) -> bool {
    if OWNER_PID.load(Acquire) != std::process::id() || gettid() == WRITER_TID.load(Relaxed) {
        return false;
    }
    let deadline = now_ns() + timeout.as_nanos() as u64;
    if end.is_some() && ENDING.load(Acquire) {
        return wait_ended(deadline); // another thread is ending it: the process dies after
    }
    if STATE.load(Acquire) != RUNNING {
        return false;
    }
    if end.is_some() && ENDING.swap(true, AcqRel) {
        return wait_ended(deadline);
    }
    let (code, sig) = match end {
        None => (0, 0),
        Some(EndReason::Exit) => (1, 0),
        Some(EndReason::Exec) => (2, 0),
        Some(EndReason::Signal(s)) => (3, s),
    };
    if end == Some(EndReason::Exec) {
        // Hooks wait from here until the exec is done with (see `submit`); those already
        // accepted are still written.
        RESUME.store(false, Release);
        RESUMED.store(false, Release);
        STATE.store(EXECING, Release);
    } else if end.is_some() {
        // No new events after this; those already accepted are still written.
        STATE.store(CLOSED, Release);
    }
    FLUSH_SIGNAL.store(sig, Release);
    FLUSH_END.store(code, Release);
    FLUSH_TARGET.store(ACCEPTED.load(Acquire), Release);
    let generation = FLUSH_GEN.fetch_add(1, AcqRel) + 1;
    wait_until(deadline, || FLUSH_DONE.load(Acquire) >= generation)
}

/// After an `exec` that failed (the process goes on): the end record written for it is taken
/// back (the file cut back to where it was before it) and the trace goes on, the events of
/// other threads that waited meanwhile included. Waits (at most 2 s) for the writer to do it.
pub fn resume_after_exec() {
    if OWNER_PID.load(Acquire) != std::process::id() || STATE.load(Acquire) != EXECING {
        return;
    }
    let deadline = now_ns() + 2_000_000_000;
    // The end must be written before it can be taken back.
    wait_until(deadline, || ENDED.load(Acquire));
    RESUME.store(true, Release);
    if !wait_until(deadline, || RESUMED.load(Acquire)) {
        // The writer is gone or stuck: recording stops rather than hooks waiting for good.
        STATE.store(CLOSED, Release);
    }
}

/// True once the writer has written the trace's end record.
pub fn ended() -> bool {
    ENDED.load(Acquire)
}

/// Waits until the writer has written the end record (at most until `deadline`).
fn wait_ended(deadline: u64) -> bool {
    wait_until(deadline, || ENDED.load(Acquire))
}

/// Called in the child after `fork()`: the parent's trace is the parent's; the child starts
/// its own on its first event and never touches the parent's file or queue.
pub fn after_fork_child() {
    set_path(None);
    SESSION.store(std::ptr::null_mut(), Release); // leaked on purpose: the parent owns it
    super::tally::after_fork_child();
    ACCEPTED.store(0, Release);
    DEFINITIONS.store(0, Release);
    RECEIVED.store(0, Release);
    FLUSH_GEN.store(0, Release);
    FLUSH_DONE.store(0, Release);
    QUEUE_WAITS.store(0, Relaxed);
    QUEUE_WAIT_NS.store(0, Relaxed);
    OWNER_PID.store(0, Release);
    WRITER_TID.store(0, Release);
    OPENED.store(false, Release);
    RESUME.store(false, Release);
    RESUMED.store(false, Release);
    ENDING.store(false, Release);
    ENDED.store(false, Release);
    let was = STATE.load(Acquire);
    // A process that had recording switched off keeps it off (a fork from a thread while
    // another one was in exec starts over too).
    if was != CLOSED || config::get().mode != Mode::Off {
        STATE.store(UNINIT, Release);
    }
}

fn stats() -> Stats {
    Stats {
        ts_ns: now_ns(),
        events: ACCEPTED
            .load(Relaxed)
            .saturating_sub(DEFINITIONS.load(Relaxed)),
        queue_waits: QUEUE_WAITS.load(Relaxed),
        queue_wait_ns: QUEUE_WAIT_NS.load(Relaxed),
        quarantine_peak_bytes: Q_PEAK.load(Relaxed),
        quarantine_releases: Q_RELEASES.load(Relaxed),
        quarantine_early_releases: Q_EARLY.load(Relaxed),
    }
}

struct Out {
    fd: i32,
    /// The file's identity (device, inode): the descriptor is written to only while it is
    /// still this file.
    id: (u64, u64),
    path: String,
    buf: Vec<u8>,
    written: u64,
    failed: bool,
}

/// The identity of the file open at `fd`.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: `stat` is a C struct of integers, for which all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat takes any integer (EBADF for one that is not open) and writes only `st`, a
    // live local.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The identity of the file at `path` itself (a symbolic link there is not followed).
fn identity_at(path: &std::ffi::CStr) -> Option<(u64, u64)> {
    // SAFETY: `stat` is a C struct of integers, for which all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated (&CStr), `st` a live local for lstat to fill.
    (unsafe { libc::lstat(path.as_ptr(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The highest soft limit on descriptors under which the trace's descriptor is put at the
/// limit itself (below, at 1000 or where it was opened): the kernel grows a process's
/// descriptor table to the highest number in use, and a few thousand entries cost nothing.
const AT_LIMIT_UP_TO: u64 = 4096;

/// A copy of `fd` at a high number (close-on-exec), or -1. Under a soft limit on descriptors
/// below the hard one (and at most [`AT_LIMIT_UP_TO`]), the copy is made **at** the soft limit:
/// the limit is raised by one for the `fcntl` and put back at once. A descriptor at or above
/// the limit stays valid, and the program's own files, numbered below it, have every number
/// they would have without the library: the trace costs the program no descriptor. Between the
/// two `setrlimit` calls another thread of the program would see the limit one higher.
/// Elsewhere (no room between the limits, or a high limit) it goes to 1000 or above.
fn move_up(fd: i32) -> i32 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a pointer to a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0
        && rl.rlim_cur < rl.rlim_max
        && rl.rlim_cur <= AT_LIMIT_UP_TO
    {
        let soft = rl.rlim_cur;
        let raised = libc::rlimit {
            rlim_cur: soft + 1,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: setrlimit reads one `rlimit` from a live local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            // SAFETY: F_DUPFD_CLOEXEC takes an integer argument and touches no memory; `fd` was
            // opened by the caller (closed meanwhile by the program: EBADF).
            let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, soft as libc::c_int) };
            // Put back, unless the program set a limit of its own in between.
            let mut now = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: as above, a live local written.
            if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) } == 0
                && now.rlim_cur == raised.rlim_cur
                && now.rlim_max == raised.rlim_max
            {
                // SAFETY: as above, a live local read.
                unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
            }
            if high >= 0 {
                return high;
            }
        }
    }
    // SAFETY: as above: an integer argument, no memory touched.
    unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 1000) }
}

/// Grows the process's descriptor table, before `main`, to hold the number the trace's
/// descriptor will be moved up to ([`move_up`]), with a copy of `/dev/null` made there and
/// closed at once (a table never shrinks). Grown later, when the writer opens the trace at the
/// first recorded call, the table is shared with the program's threads (the writer's at
/// least) and the kernel waits for an RCU grace period before it frees the old one: the
/// `fcntl` took 9-15 ms on this repository's CI machine, and the program's thread waits for it
/// (it goes on once the trace's descriptor is out of the low numbers). Before `main` the
/// process has one thread and the kernel resizes in place. Nothing else changes: the copy is
/// gone before the program runs, and its own descriptors get the numbers they would get.
pub fn prepare_descriptors() {
    // SAFETY: the path is a NUL-terminated literal; O_RDONLY needs no mode argument.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return; // no /dev/null (a sandbox): the writer grows the table when it opens the trace
    }
    let high = move_up(fd);
    if high >= 0 {
        // SAFETY: `high` is the copy move_up just made, known to no one else.
        unsafe { libc::close(high) };
    }
    // SAFETY: `fd` was opened above, before `main`: the program has not seen it.
    unsafe { libc::close(fd) };
}

/// Opens `path` and moves the descriptor up, out of the way of the small numbers programs reuse
/// and `dup2` onto; returns it with the file's identity. Between the `open` and the move, another
/// thread of the program may close the small number (it closes every descriptor it did not open)
/// and open its own file under it: the number is then the program's, left alone (never closed,
/// never written), and the file is opened again (without `O_CREAT`: it is there already).
fn open_high(path: &std::ffi::CStr, flags: i32) -> std::io::Result<(i32, (u64, u64))> {
    let mut flags = flags;
    for _ in 0..8 {
        // SAFETY: `path` is NUL-terminated (&CStr); the mode argument is given, as O_CREAT needs.
        let fd = unsafe { libc::open(path.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        flags &= !(libc::O_CREAT | libc::O_EXCL);
        let Some(want) = identity_at(path) else {
            break;
        };
        let high = move_up(fd);
        if high < 0 {
            // No number that high (a low limit on descriptors): it stays where it is.
            if identity(fd) == Some(want) {
                return Ok((fd, want));
            }
            continue;
        }
        if identity(high) == Some(want) {
            if identity(fd) == Some(want) {
                // SAFETY: `fd` is the descriptor opened above and still the same file (the identity
                // check right before): ours to close, never a descriptor of the program's.
                unsafe { libc::close(fd) };
            }
            return Ok((high, want));
        }
        // SAFETY: `high` is the duplicate this loop made with F_DUPFD_CLOEXEC, which no one else
        // knows of, so closing it closes nothing of the program's (the comment says why it is not
        // ours to keep).
        unsafe { libc::close(high) }; // a copy of the program's file: ours to close
    }
    Err(std::io::Error::other(
        "its descriptor was taken over again and again",
    ))
}

impl Out {
    /// Cuts the file back to `len` bytes (what was written before an exec's end record).
    fn take_back(&mut self, len: u64) {
        self.buf.clear();
        if self.failed || !self.still_ours() {
            self.failed = true;
            return;
        }
        // The descriptor's offset goes back too (the file is not opened for appending).
        // SAFETY: `self.fd` is the trace file's descriptor (checked by still_ours just above);
        // ftruncate and lseek take it and integers only.
        let cut = unsafe { libc::ftruncate(self.fd, len as libc::off_t) } == 0;
        // SAFETY: as above.
        if cut && unsafe { libc::lseek(self.fd, len as libc::off_t, libc::SEEK_SET) } >= 0 {
            self.written = len;
        } else {
            self.failed = true;
            warn(&format!(
                "trace {}: cannot take back the end record of an exec that failed: {}; the \
                 trace ends there (the program goes on unchanged)",
                self.path,
                std::io::Error::last_os_error()
            ));
        }
    }

    fn close(&mut self) {
        if !self.failed && identity(self.fd) == Some(self.id) {
            // SAFETY: only while `self.fd` is still the trace file (its device and inode are the
            // ones recorded when we opened it): never a descriptor the program reused.
            unsafe { libc::close(self.fd) };
        }
        self.failed = true;
    }

    /// True when the descriptor is still the trace file. A program may close every descriptor
    /// it did not open itself (daemons, `close_range`) and open its own files under the same
    /// number: then the trace file is opened again by its path (the same file, checked), or
    /// given up, never written into the program's file.
    fn still_ours(&mut self) -> bool {
        if identity(self.fd) == Some(self.id) {
            return true;
        }
        let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        match std::ffi::CString::new(self.path.clone())
            .ok()
            .and_then(|c| open_high(&c, flags).ok())
        {
            Some((fd, id)) if id == self.id => {
                self.fd = fd;
                warn(&format!(
                    "the program closed or replaced the trace's descriptor; trace {} opened again",
                    self.path
                ));
                return true;
            }
            // SAFETY: `fd` was just opened by `open_high`, which returned it as ours, but the file
            // is not the trace (another file at its path): closing our own descriptor to it touches
            // nothing else.
            Some((fd, _)) => unsafe {
                libc::close(fd);
            },
            None => {}
        }
        warn(&format!(
            "the program closed the trace's descriptor and trace {} cannot be opened again; \
             the trace is incomplete from byte {} on (the program goes on unchanged)",
            self.path, self.written
        ));
        false
    }

    fn write_out(&mut self) {
        if !self.failed && !self.buf.is_empty() && !self.still_ours() {
            self.failed = true;
        }
        if self.failed {
            self.buf.clear();
            return;
        }
        let mut off = 0;
        let mut reopened = 0;
        while off < self.buf.len() {
            // SAFETY: pointer and length are those of `self.buf[off..]`, a live slice (off < len),
            // which `write` only reads; `self.fd` is checked to still be the trace file just above.
            let n = unsafe {
                libc::write(
                    self.fd,
                    self.buf[off..].as_ptr().cast(),
                    self.buf.len() - off,
                )
            };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // Closed by the program between the check above and this write: open it again.
                if err.raw_os_error() == Some(libc::EBADF) && reopened < 4 {
                    reopened += 1;
                    if self.still_ours() {
                        continue;
                    }
                    self.failed = true;
                    break;
                }
                self.failed = true;
                warn(&format!(
                    "writing trace {} failed at byte {}: {err}; the trace is incomplete from there on \
                     (the program goes on unchanged)",
                    self.path,
                    self.written + off as u64
                ));
                break;
            }
            off += n as usize;
        }
        self.written += off as u64;
        self.buf.clear();
    }
}

fn open_trace(pattern: &str, header: &Header) -> Result<(i32, (u64, u64), String), String> {
    let base = config::expand(
        pattern,
        header.pid,
        header.rank.or(header.local_rank),
        &header.hostname,
    );
    // Never overwrite: an exec'd process keeps its pid, and a user may reuse a pattern.
    for attempt in 0..1000 {
        let path = if attempt == 0 {
            base.clone()
        } else {
            format!("{base}.{attempt}")
        };
        let c = std::ffi::CString::new(path.clone())
            .map_err(|_| format!("trace path {path:?} contains a NUL byte"))?;
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        match open_high(&c, flags) {
            Ok((fd, id)) => return Ok((fd, id, path)),
            Err(err) if err.raw_os_error() == Some(libc::EEXIST) => {}
            Err(err) => return Err(format!("cannot create trace file {path}: {err}")),
        }
    }
    Err(format!(
        "cannot create trace file {base}: 1000 files of that name exist already"
    ))
}

fn writer_main(rx: Receiver<Record>) {
    WRITER_TID.store(gettid(), Release);
    thread::mark_internal_thread();
    let cfg = config::get();
    let header = header::header(cfg);
    let (fd, id, path) = match open_trace(&cfg.trace, &header) {
        Ok(x) => {
            set_path(Some(&x.2));
            OPENED.store(true, Release);
            x
        }
        Err(msg) => {
            STATE.store(CLOSED, Release);
            // Said before the program is let go (`OPENED`): a short program could otherwise
            // exit, killing this thread, before the line is written (seen once in CI, on a
            // loaded machine: no line at all).
            warn(&format!(
                "{msg}; recording disabled (the program goes on unchanged)"
            ));
            OPENED.store(true, Release);
            // Keep draining so no hook ever waits on a full queue.
            drain_forever(rx);
            return;
        }
    };
    let mut out = Out {
        fd,
        id,
        path,
        buf: Vec::with_capacity(1 << 20),
        written: 0,
        failed: false,
    };
    Encoder::preamble(&header, &mut out.buf);
    out.write_out();
    if cfg.test_writer_stall_ms > 0 {
        // Internal test hook: the writer blocked (as in a write(2) to a hung file system) while
        // the hooks go on; they must not wait for it until the queue is full.
        std::thread::sleep(Duration::from_millis(cfg.test_writer_stall_ms));
    }
    let mut enc = Encoder::new();
    let mut last_write = now_ns();
    let mut last_stats = last_write;
    // The writer polls and sleeps instead of waiting in the channel: a receiver waiting there
    // makes every `try_send` wake it (a futex call on the hook's thread, ~1 us on the H200, more
    // than the rest of recording an event). Sleeps grow while nothing comes, up to IDLE_MAX.
    const IDLE_MIN: u64 = 200_000;
    const IDLE_MAX: u64 = 5_000_000;
    let mut idle = IDLE_MIN;
    loop {
        let first = rx.try_recv();
        if first.is_err() {
            nap(idle);
            idle = (idle * 2).min(IDLE_MAX);
        } else {
            idle = IDLE_MIN;
        }
        if let Ok(rec) = first {
            take(&mut enc, &rec, &mut out.buf);
            let mut n = 1;
            while let Ok(rec) = rx.try_recv() {
                take(&mut enc, &rec, &mut out.buf);
                n += 1;
                // A steady stream never empties the queue: write out every 50 ms (or 256 KiB)
                // from inside this loop too.
                if n % 1024 == 0 {
                    RECEIVED.fetch_add(1024, AcqRel);
                    n = 0;
                    let now = now_ns();
                    if out.buf.len() >= 256 << 10 || now - last_write >= 50_000_000 {
                        out.write_out();
                        last_write = now;
                    }
                }
            }
            RECEIVED.fetch_add(n, AcqRel);
        }
        let now = now_ns();
        if now - last_stats >= 2_000_000_000 {
            enc.encode(&Record::Stats(stats()), &mut out.buf);
            last_stats = now;
        }
        // At most 50 ms of events sit in memory: what SIGKILL can take.
        if !out.buf.is_empty() && (now - last_write >= 50_000_000 || out.buf.len() >= 256 << 10) {
            out.write_out();
            last_write = now;
        }
        let generation = FLUSH_GEN.load(Acquire);
        if generation > FLUSH_DONE.load(Acquire) {
            let target = FLUSH_TARGET.load(Acquire);
            let deadline = now_ns() + 1_000_000_000;
            while RECEIVED.load(Acquire) < target && now_ns() < deadline {
                if let Ok(rec) = rx.recv_timeout(Duration::from_millis(1)) {
                    take(&mut enc, &rec, &mut out.buf);
                    RECEIVED.fetch_add(1, AcqRel);
                }
            }
            // Whatever else is already queued goes too.
            while let Ok(rec) = rx.try_recv() {
                take(&mut enc, &rec, &mut out.buf);
                RECEIVED.fetch_add(1, AcqRel);
            }
            let end = match FLUSH_END.load(Acquire) {
                0 => None,
                1 => Some(EndReason::Exit),
                2 => Some(EndReason::Exec),
                _ => Some(EndReason::Signal(FLUSH_SIGNAL.load(Acquire))),
            };
            // Where the file stood before an exec's end record: cut back to it if the exec fails.
            if end == Some(EndReason::Exec) {
                out.write_out();
            }
            let before_end = out.written;
            if let Some(reason) = end {
                enc.encode(
                    &Record::End(End {
                        ts_ns: now_ns(),
                        reason,
                        stats: stats(),
                    }),
                    &mut out.buf,
                );
            }
            out.write_out();
            last_write = now_ns();
            if end == Some(EndReason::Exec) {
                // The file stays open (close-on-exec): the exec may fail and the trace go on.
                ENDED.store(true, Release);
                FLUSH_DONE.store(generation, Release);
                if !wait_for_resume() {
                    drain_forever(rx);
                    return;
                }
                out.take_back(before_end);
                ENDING.store(false, Release);
                ENDED.store(false, Release);
                RESUMED.store(true, Release);
                STATE.store(RUNNING, Release);
                continue;
            }
            if end.is_some() {
                out.close();
                ENDED.store(true, Release);
            }
            FLUSH_DONE.store(generation, Release);
            if end.is_some() {
                drain_forever(rx);
                return;
            }
        }
    }
}

/// After an exec's end record: waits until the exec failed ([`resume_after_exec`]); a
/// successful exec ends this thread with the process image. False when the trace was closed
/// meanwhile (recording given up).
fn wait_for_resume() -> bool {
    loop {
        if RESUME.load(Acquire) {
            return true;
        }
        if STATE.load(Acquire) == CLOSED {
            return false;
        }
        nap(200_000);
    }
}

/// After the trace is closed (or could not be opened): keep the queue empty so no hook ever
/// waits, and answer flush requests at once, there being nothing to write.
fn drain_forever(rx: Receiver<Record>) {
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(rec) => {
                super::tally::see(&rec);
                RECEIVED.fetch_add(1, AcqRel);
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
        }
        FLUSH_DONE.store(FLUSH_GEN.load(Acquire), Release);
    }
}

#[cfg(test)]
mod tests {
    /// The writer thread takes no lock of the library: whatever it blocks in (a `write(2)` to a
    /// hung file system), no hook can be waiting for a lock it holds. Hooks only hand records
    /// to the queue (`try_send`); `tests/tests/load.rs` shows they go on while the writer is
    /// blocked. This keeps the rule from being broken by an edit of this file. (The counters it
    /// keeps, `tally.rs`, take their own two locks around a map update, never while the writer
    /// writes; no hook takes them, only the C API's `isolate_counters` and its like.)
    #[test]
    fn the_writer_takes_no_lock_of_the_library() {
        let src = include_str!("writer.rs");
        let code = &src[..src.find("#[cfg(test)]").unwrap()];
        for banned in ["Mutex", "RwLock", ".lock(", "policy::", "Condvar"] {
            assert!(
                !code.contains(banned),
                "writer.rs uses {banned}: the writer must not take a lock a hook can wait for"
            );
        }
    }
}

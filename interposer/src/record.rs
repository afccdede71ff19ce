//! Recording: what every hook shares — the clock, sequence numbers, thread ids, the
//! "inside a hook" flag, and building the event that goes to the writer.

use crate::config::Config;
use crate::cuda::*;
use crate::resolve::{Lib, Real};
use isolate_trace::{Api, Event, Header, Record};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::*};

static SEQ: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Plain `Cell`s with const initialisers: no destructor, usable during thread teardown.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static TID: Cell<u32> = const { Cell::new(0) };
}

#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
pub fn gettid() -> u32 {
    let t = TID.try_with(|c| c.get()).unwrap_or(0);
    if t != 0 {
        return t;
    }
    let t = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    let _ = TID.try_with(|c| c.set(t));
    t
}

#[inline]
pub fn next_seq() -> u64 {
    SEQ.fetch_add(1, Relaxed)
}

pub fn reset_after_fork() {
    SEQ.store(0, Relaxed);
    let _ = TID.try_with(|c| c.set(0));
}

/// Marks the current thread as ours: nothing it calls is recorded.
pub fn mark_internal_thread() {
    let _ = DEPTH.try_with(|d| d.set(1_000_000));
}

/// Set while a hook runs on this thread, so that the driver calls a runtime call makes (and
/// calls the library makes itself) are not recorded a second time.
pub struct Inside(());

impl Inside {
    /// `None` when already inside a hook on this thread (or on one of our own threads).
    #[inline]
    pub fn enter() -> Option<Inside> {
        let entered = DEPTH
            .try_with(|d| {
                if d.get() == 0 {
                    d.set(1);
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false);
        // `then`, not `then_some`: an `Inside` built and dropped here would clear the flag.
        entered.then(|| Inside(()))
    }
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(0));
    }
}

/// True when this thread is inside a hook already (or is one of ours).
#[inline]
pub fn nested() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

static CTX_GET_DEVICE: Real<FnCtxGetDevice> = Real::new(c"cuCtxGetDevice", Lib::Driver);

/// Device ordinal of the calling thread's current context, -1 if none.
#[inline]
pub fn current_device() -> i32 {
    let Some(f) = CTX_GET_DEVICE.get() else {
        return -1;
    };
    let mut d: CUdevice = -1;
    if unsafe { f(&mut d) } == CUDA_SUCCESS {
        d
    } else {
        -1
    }
}

/// An event under construction: the sequence number and start time are taken when it is made.
pub struct Pending {
    pub ev: Event,
    t0: u64,
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
        Pending {
            ev: Event {
                seq: u64::MAX,
                api,
                device: -1,
                ..Event::default()
            },
            t0: now_ns(),
        }
    }

    /// Stamps the result and timing and hands the event to the writer.
    #[inline]
    pub fn finish(mut self, result: i32) {
        let t1 = now_ns();
        if self.ev.seq == u64::MAX {
            self.ev.seq = next_seq();
        }
        self.ev.result = result;
        self.ev.ts_ns = t1;
        self.ev.duration_ns = t1.saturating_sub(self.t0);
        self.ev.tid = gettid();
        if self.ev.device < 0 {
            self.ev.device = current_device();
        }
        if crate::config::get().test_panic {
            panic!("isolate: forced internal error (ISOLATE_TEST_PANIC=1)");
        }
        let api = self.ev.api;
        crate::writer::submit(Record::Event(self.ev));
        crate::policy::saw_result(api, result);
    }
}

/// One line on stderr, prefixed, written with a single `write(2)`.
pub fn warn(msg: &str) {
    let line = format!("isolate: {msg}\n");
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

fn read_file(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
}

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// At most this many bytes of one argument, and of the whole command line, go in the header.
const ARG_MAX_KEPT: usize = 64 << 10;
const ARGV_BUDGET: usize = 256 << 10;

/// The trace header for this process, now.
pub fn header(cfg: &Config) -> Header {
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Every argument kept, empty ones too; long command lines are cut so the header always
    // fits in one frame (the trace format's limit is 1 MiB).
    let mut cmdline = read_file("/proc/self/cmdline");
    if cmdline.last() == Some(&0) {
        cmdline.pop();
    }
    let mut argv: Vec<String> = Vec::new();
    let mut budget = ARGV_BUDGET;
    for arg in cmdline.split(|&b| b == 0) {
        if budget == 0 {
            argv.push("[… command line cut by isolate]".into());
            break;
        }
        let keep = arg.len().min(ARG_MAX_KEPT).min(budget);
        let mut a = String::from_utf8_lossy(&arg[..keep]).into_owned();
        if keep < arg.len() {
            a.push_str(&format!("[… {} more bytes]", arg.len() - keep));
        }
        budget -= keep;
        argv.push(a);
    }
    let mut host = [0u8; 256];
    unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) };
    let hostname = String::from_utf8_lossy(&host[..host.iter().position(|&b| b == 0).unwrap_or(0)])
        .into_owned();
    let mut wall = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut wall) };
    Header {
        pid: std::process::id(),
        ppid: unsafe { libc::getppid() } as u32,
        exe,
        argv,
        start_unix_ns: wall.tv_sec as u64 * 1_000_000_000 + wall.tv_nsec as u64,
        start_mono_ns: now_ns(),
        hostname,
        library_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: cfg.mode.name().to_string(),
        rank: env_u32("RANK"),
        local_rank: env_u32("LOCAL_RANK"),
        world_size: env_u32("WORLD_SIZE"),
        config: cfg.pairs.clone(),
    }
}

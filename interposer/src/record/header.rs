//! The trace header: who this process is, what it runs, with which settings.
//!
//! Layer: recording. Uses the base only.

use crate::base::config::Config;
use crate::base::sys::now_ns;
use isolate_trace::Header;

fn read_file(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
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
    // SAFETY: the buffer is valid for its length minus the byte kept for the terminator (a name
    // that fills it is cut, still terminated by that last zero byte).
    unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) };
    let hostname = String::from_utf8_lossy(&host[..host.iter().position(|&b| b == 0).unwrap_or(0)])
        .into_owned();
    let mut wall = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `wall` is a live, writable timespec; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut wall) };
    Header {
        pid: std::process::id(),
        // SAFETY: getppid takes nothing, touches no memory and cannot fail.
        ppid: unsafe { libc::getppid() } as u32,
        exe,
        argv,
        start_unix_ns: wall.tv_sec as u64 * 1_000_000_000 + wall.tv_nsec as u64,
        start_mono_ns: now_ns(),
        hostname,
        library_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: cfg.mode.name().to_string(),
        // Read with the settings, before main: never `getenv` here, on the writer thread, while
        // a thread of the program may be in `setenv`.
        rank: cfg.rank,
        local_rank: cfg.local_rank,
        world_size: cfg.world_size,
        config: cfg.pairs.clone(),
    }
}

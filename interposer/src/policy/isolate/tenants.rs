//! Isolate-mode processes sharing a device (`ISOLATE_TENANTS=share`, the default): a quarantine
//! budget given as a share of the device (`ISOLATE_QUARANTINE=25%`) is split among the
//! processes whose quarantine uses it, so that four pytest workers on one GPU hold a quarter of
//! it between them, not a quarter each (which filled the device and made each one's reserve
//! cut its quarantine again and again: the seventeenth session's four model processes).
//!
//! The registry: one empty file a process and device, `<device UUID>.<pid>`, in
//! `/dev/shm/isolate-tenants-<uid>` (made mode 0700; used only while it is a directory of this
//! user's that nobody else may enter). A process registers at its first budget (its first free
//! into quarantine), counts the device's files at most once a second (a file whose process is
//! gone, killed with SIGKILL, is removed by whoever counts), and removes its own at exit. The
//! device is named by its UUID, not its ordinal: two processes with different
//! `CUDA_VISIBLE_DEVICES` may call one GPU by two numbers. Where the registry cannot be had (no
//! `/dev/shm`, another user's directory, a driver without `cuDeviceGetUuid_v2`), a process
//! counts itself alone, as before.
//!
//! Layer: policies. Uses the base.

use crate::base::cuda::*;
use crate::base::real::DEVICE_GET_UUID;
use crate::base::sys::ForkLock;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

/// The files this process made (removed at exit).
static MINE: ForkLock<Vec<PathBuf>> = ForkLock::new(Vec::new());

/// The registry's directory, made if missing; `None` where it cannot be used safely.
fn dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let d = PathBuf::from(format!("/dev/shm/isolate-tenants-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&d);
    let m = std::fs::symlink_metadata(&d).ok()?;
    (m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0).then_some(d)
}

/// Device `device`'s UUID as 32 hex digits.
fn uuid(device: i32) -> Option<String> {
    let f = DEVICE_GET_UUID.get()?;
    let mut u = [0u8; 16];
    // SAFETY: cuDeviceGetUuid_v2 writes 16 bytes through a pointer to a live local array.
    if unsafe { f(&mut u, device) } != CUDA_SUCCESS {
        return None;
    }
    Some(u.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether process `pid` exists (`EPERM`: it does, as another user's). A file whose pid was
/// reused by an unrelated process is counted until that one ends: at worst a smaller budget.
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only asks whether the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// The isolate-mode processes using device `device`, this one included (registered now if it
/// was not): at least 1.
pub(super) fn count(device: i32) -> u64 {
    let (Some(d), Some(u)) = (dir(), uuid(device.max(0))) else {
        return 1;
    };
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let own = d.join(format!("{u}.{me}"));
    {
        let mut mine = MINE.lock();
        if !mine.contains(&own) {
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&own);
            if made.is_err() {
                return 1;
            }
            mine.push(own);
        }
    }
    let Ok(entries) = std::fs::read_dir(&d) else {
        return 1;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((dev, pid)) = name.to_str().and_then(|s| s.split_once('.')) else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        if pid == me || alive(pid) {
            n += u64::from(dev == u);
        } else {
            // A process that ended without removing its file (SIGKILL): gone.
            let _ = std::fs::remove_file(e.path());
        }
    }
    n.max(1)
}

/// At exit: this process's files are removed (it no longer holds a quarantine).
pub fn leave() {
    for p in MINE.lock().drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// In a fork child: the parent's files are the parent's (the child registers its own).
pub(super) fn after_fork_child() {
    MINE.reset_in_child(Vec::new());
}

//! Isolation's counters (what was verified where, poisoned, captured, and the time it took) and
//! the notes that report them at exit.
//!
//! Layer: policies. Uses the base, recording, [`crate::policy::release`],
//! [`crate::policy::reuse`] and [`crate::policy::device`] (whether the fast tier's kernels
//! loaded).

use crate::base::config;
use crate::policy::{release, reuse};
use crate::record::event;
use crate::record::profile::Sampled;
use crate::record::writer;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// The quarantine's last budget, and the most isolate-mode processes that shared the device's
/// share with this one, itself included (0: not shared: a budget in bytes, or
/// `ISOLATE_TENANTS=alone`).
pub(super) static BUDGET: AtomicU64 = AtomicU64::new(0);
pub(super) static TENANTS_MAX: AtomicU64 = AtomicU64::new(0);
/// Entries verified by the kernel on the device, and by copies to the host (the fallback where
/// the driver cannot load the kernel): noted at exit.
pub(super) static ON_DEVICE: AtomicU64 = AtomicU64::new(0);

pub(super) static ON_HOST: AtomicU64 = AtomicU64::new(0);

/// Where isolation's time goes, noted at exit: frees poisoned and the time the calling threads
/// spent on them (poison, events), time in releases, of it waiting for the device, and the
/// batches released on the release streams.
pub(super) static POISONED: AtomicU64 = AtomicU64::new(0);

/// Bytes those frees held: what the device writes with the poison, and reads again to check
/// in the full tier.
pub(super) static POISON_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes the poisons wrote (all of [`POISON_BYTES`] in the full tier; each large block's
/// pattern in the fast one, [`crate::policy::tier`]).
pub(super) static WRITTEN_BYTES: AtomicU64 = AtomicU64::new(0);

/// Ranges the program unmapped that isolation holds back mapped (poisoned whole), and their
/// bytes: freed into quarantine as much as a free's.
pub(super) static UNMAPPED: AtomicU64 = AtomicU64::new(0);

pub(super) static UNMAPPED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes the checks read (every byte of a checked block, or its pattern in the fast tier).
pub(super) static CHECKED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Of those frees, the ones poisoned by the library's fill kernel (`ISOLATE_TEST_POISON_BY=kernel`).
pub(super) static BY_KERNEL: AtomicU64 = AtomicU64::new(0);

/// The frees' time on the freeing threads, poison queued (sampled: [`Sampled`]).
pub(super) static POISON_TIME: Sampled = Sampled::new();

pub(super) static RELEASE_NS: AtomicU64 = AtomicU64::new(0);

pub(super) static WAIT_NS: AtomicU64 = AtomicU64::new(0);

pub(super) static ASYNC_BATCHES: AtomicU64 = AtomicU64::new(0);

/// Stream-ordered frees made during stream capture, passed to the driver (noted at exit).
pub(super) static CAPTURED: AtomicU64 = AtomicU64::new(0);

/// Times the device was found short of free memory (below the reserve: quarantine.rs), and
/// the bytes released early because of it.
pub(super) static PRESSURE_CUTS: AtomicU64 = AtomicU64::new(0);
pub(super) static PRESSURE_BYTES: AtomicU64 = AtomicU64::new(0);

/// The exit notes: what was verified, kept, captured and poisoned, and the time it took. Once,
/// from the library's own exit (its destructor, or before `_exit`), after the last check: the
/// `atexit` handler's check ([`at_exit_bounded`]) runs before it and writes none, so that a
/// process that runs both has each note once, with the final counts.
pub fn exit_notes() {
    // Only into a trace that exists: a process that never touched CUDA leaves no file.
    if !writer::started() {
        return;
    }
    let (device, host) = (ON_DEVICE.load(Relaxed), ON_HOST.load(Relaxed));
    if device + host > 0 {
        event::cost_note(
            isolate_trace::CostTopic::PoisonVerified,
            device,
            host,
            format!("poison verified for {device} allocations on the device, {host} on the host"),
        );
    }
    let (served, kept) = reuse::stats();
    if kept > 0 {
        event::cost_note(
            isolate_trace::CostTopic::Reuse,
            served,
            kept,
            format!(
                "reuse (ISOLATE_REUSE=on): {kept} checked allocations kept instead of freed, \
                 {served} stream-ordered allocations served from them without the driver"
            ),
        );
    }
    let (budget, tenants) = (BUDGET.load(Relaxed), TENANTS_MAX.load(Relaxed));
    if budget > 0 {
        let shared = match tenants {
            0 => String::new(),
            1 => " (the device's share its own: no other isolate-mode process used the device)"
                .to_string(),
            n => format!(
                " (the device's share split among up to {n} isolate-mode processes using it, \
                 ISOLATE_TENANTS=share)"
            ),
        };
        event::cost_note(
            isolate_trace::CostTopic::QuarantineBudget,
            budget,
            tenants,
            format!("quarantine budget: {budget} bytes{shared}"),
        );
    }
    let (cuts, cut_bytes) = (PRESSURE_CUTS.load(Relaxed), PRESSURE_BYTES.load(Relaxed));
    if cuts > 0 {
        event::cost_note(
            isolate_trace::CostTopic::MemoryPressure,
            cuts,
            cut_bytes,
            format!(
                "memory pressure: the device's free memory was below the library's reserve \
                 {cuts} times (other processes, or the program, used the rest): the quarantine \
                 was cut ({cut_bytes} bytes released early) and memory kept for reuse given back"
            ),
        );
    }
    let captured = CAPTURED.load(Relaxed);
    if captured > 0 {
        event::cost_note(
            isolate_trace::CostTopic::CaptureFrees,
            captured,
            0,
            format!(
                "{captured} stream-ordered frees during CUDA graph capture went to the driver \
                 unquarantined"
            ),
        );
    }
    let poisoned = POISONED.load(Relaxed);
    if poisoned + UNMAPPED.load(Relaxed) > 0 {
        device_bytes_notes();
    }
    if poisoned > 0 {
        let poison_ns = POISON_TIME.total().1;
        let (done, bytes) = if config::get().poison.is_some() {
            (
                "poisoned",
                "written by the device once and read once to check",
            )
        } else {
            (
                "quarantined unpoisoned (ISOLATE_POISON=off)",
                "neither written nor checked",
            )
        };
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        let (deferred, fills) = release::deferred_stats();
        event::cost_note(
            isolate_trace::CostTopic::Isolation,
            poisoned,
            ASYNC_BATCHES.load(Relaxed),
            format!(
                "isolation's time: {poisoned} frees {done} ({} bytes, {bytes}; {} by the \
                 library's fill kernel; {deferred} deferred to their stream's next work and \
                 poisoned by {fills} launches), {:.1} ms on the freeing threads ({:.2} us each); \
                 releases {:.1} ms, of it {:.1} ms waiting for the device; {} batches released \
                 on the release stream; the keeper thread took {} releases and {} device-memory \
                 probes off the freeing threads",
                POISON_BYTES.load(Relaxed),
                BY_KERNEL.load(Relaxed),
                poison_ns as f64 / 1e6,
                poison_ns as f64 / 1e3 / poisoned as f64,
                ms(&RELEASE_NS),
                ms(&WAIT_NS),
                ASYNC_BATCHES.load(Relaxed),
                super::keeper::KEPT_JOBS.load(Relaxed),
                super::keeper::KEPT_PROBES.load(Relaxed)
            ),
        );
    }
}

/// The notes of what isolation asked of the device: bytes freed into quarantine, and bytes the
/// poisons wrote and the checks read (the floor of isolation's device time is the latter two
/// over the device's bandwidth: `isolate summary` says it, per step where it finds steps).
fn device_bytes_notes() {
    let frees = POISONED.load(Relaxed) + UNMAPPED.load(Relaxed);
    let freed = POISON_BYTES.load(Relaxed) + UNMAPPED_BYTES.load(Relaxed);
    event::cost_note(
        isolate_trace::CostTopic::Freed,
        freed,
        frees,
        format!("freed into quarantine: {freed} bytes in {frees} frees and unmaps"),
    );
    let (written, read) = (WRITTEN_BYTES.load(Relaxed), CHECKED_BYTES.load(Relaxed));
    let tier = if config::get().check_fast && crate::policy::device::sparse_failed() {
        "ISOLATE_CHECK=fast, but its kernels could not be loaded: every byte"
    } else if config::get().check_fast {
        "ISOLATE_CHECK=fast: large blocks at their canaries"
    } else {
        "ISOLATE_CHECK=full: every byte"
    };
    event::cost_note(
        isolate_trace::CostTopic::DeviceBytes,
        written,
        read,
        format!(
            "device bytes: {written} written by the poisons, {read} read by the checks ({tier})"
        ),
    );
}

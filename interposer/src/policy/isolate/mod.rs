//! Isolation mode: freed device memory is not given back. It is poisoned (in stream order for
//! stream-ordered frees), held in a quarantine that no allocation can get an address from, and
//! really freed only when the quarantine is over its budget (oldest first) or an allocation runs
//! out of memory. When an allocation leaves quarantine, and for all of them at exit, the poison
//! is checked on the device: a changed byte is a write through a stale pointer.
//!
//! One job a file, from the bottom: [`tenants`] (the processes sharing a device's budget),
//! [`state`] (what is live and what is held), [`keeper`] (the library's thread for the
//! quarantine's slow work), [`counters`]
//! (noted at exit), [`pytorch`] (its allocator set up before `main`), [`verify`] (the poison
//! checked), [`poison`] (the poison written), [`leave`] (both ways out of quarantine),
//! [`exit`] (the exit check), [`quarantine`] (in, and out over the budget), [`vmm`] (mappings),
//! [`alloc`] (allocation and free). A file uses only files before it in this list; this one
//! is what the rest of the policies see.
//!
//! Layer: policies. Uses the base, recording, [`super::log`], [`super::guard`],
//! [`super::release`], [`super::reuse`], [`super::device`] and [`super::order`] (told of each
//! allocation and free).

mod alloc;
mod counters;
mod exit;
mod keeper;
mod leave;
mod poison;
mod pytorch;
mod quarantine;
mod state;
mod tenants;
mod verify;
mod vmm;

pub use alloc::{alloc, free, out_of_room, pool_peak_reset, pool_used, stream_destroyed};
pub use counters::exit_notes;
pub use exit::{
    at_exit, at_exit_bounded, before_context_ends, context_gone, exit_is_ours, verify_now,
};
pub use poison::{capture_start, flush_current};
pub use pytorch::{Substrate, before_main, pytorch_substrate};
pub use quarantine::{forget_range, lookup_each};
pub use state::{Entry, HIGH, LOW, current_ctx};
pub use vmm::other;

use std::collections::VecDeque;
use std::sync::atomic::Ordering::*;

/// In a fork child: the parent's CUDA memory is not the child's to manage, and another thread
/// of the parent may have held these locks at the fork.
pub fn after_fork_child() {
    state::STATE.reset_in_child(None);
    alloc::forget_destroyed_streams();
    leave::INFLIGHT.reset_in_child(VecDeque::new());
    leave::IN_FLIGHT.store(0, Relaxed);
    // SAFETY: getpid has no preconditions.
    exit::EXIT_OWNER.store(unsafe { libc::getpid() } as u32, Release);
    super::release::after_fork_child();
    tenants::after_fork_child();
    keeper::after_fork_child();
    quarantine::after_fork_child();
}

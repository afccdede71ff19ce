//! Device-wide synchronisations the policies make, numbered, so that the launch check knows
//! which launches have run to completion without a fault.
//!
//! Layer: policies. Uses nothing of this crate.

use std::sync::atomic::{AtomicU64, Ordering::*};

/// Bumped when a device-wide synchronisation begins.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The highest token of a synchronisation that succeeded.
static CLEAN: AtomicU64 = AtomicU64::new(0);

/// A device-wide synchronisation is about to begin: pass the token to [`clean`] if it
/// succeeds.
pub fn begins() -> u64 {
    GENERATION.fetch_add(1, AcqRel) + 1
}

/// The synchronisation of `token` succeeded.
pub fn clean(token: u64) {
    CLEAN.fetch_max(token, AcqRel);
}

/// The generation now: a launch submitted now is covered by a synchronisation whose token is
/// greater.
pub fn generation() -> u64 {
    GENERATION.load(Acquire)
}

/// Launches submitted in a generation below this ran without a fault.
pub fn clean_up_to() -> u64 {
    CLEAN.load(Acquire)
}

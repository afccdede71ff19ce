//! The quick key of a capture on a thread that runs Python ([`quick`]): the thread's Python
//! frames read in one pass and the native budget's return addresses, every input of the stack
//! the merge would make of them, looked up in the thread's cache before anything is walked the
//! full way (docs/design.md, "The quick key").
//!
//! Layer: recording. Part of the stacks ([`super`]).

use super::{Site, modules, native, python, python_budget, python_only};
use arrayvec::ArrayVec;
use std::cell::Cell;

/// The key of a look-up in the thread's cache ([`super::seen`]), and the Python frames read: the
/// thread's Python frames read in one pass ([`python::quick`]) and, for a capture with native
/// frames, the nearest return addresses the native budget keeps (`ISOLATE_NATIVE_FRAMES`; at
/// most [`super::FAST_NATIVE`] in the fast tier) and whether a frame follows them — every input of
/// the stack [`super::merge_and_intern`] would make of them, so one key is one stack. None (the full
/// way only) where the thread runs no Python, where no hook marked the walk's start, where the
/// budget is unbounded (`all`) or over [`QUICK_NATIVE`], where the walk ended in code no module
/// holds or ran past twice that many frames, or while the thread rests from keys
/// ([`quick_resting`]).
pub(super) fn quick(
    snap: &modules::Snapshot,
    depth: usize,
    want_native: bool,
    fast: bool,
    site: Site,
) -> Option<(u64, u64, usize)> {
    let walks = want_native && !python_only(site);
    if walks && quick_resting() {
        return None;
    }
    let q = python::quick(snap.generation, depth)?;
    if q.n == 0 {
        return None;
    }
    let (mut a, mut b) = (q.h1 ^ snap.epoch.rotate_left(17), q.h2 ^ QUICK_WORD);
    if walks {
        let budget = python_budget(fast);
        if budget > QUICK_NATIVE || !native::entered() {
            return None;
        }
        // The walk as far as the merge can take it: until one frame past the budget, counting
        // as the merge does the frames outside the evaluation loop (its frames stand for
        // Python frames, which the key holds already). A frame of the loop the merge counts
        // (one met after every Python frame is placed) only makes the key take more frames
        // than the stack has: a key for fewer stacks, never one for two.
        let eval = python::eval_range(snap.generation);
        let in_eval = |pc: u64| eval.is_some_and(|(lo, hi)| pc > lo && pc <= hi);
        // Not zeroed first (a 512-byte memset a capture): only what the walk wrote is read.
        let mut pcs = ArrayVec::<u64, { 2 * QUICK_NATIVE }>::new();
        let (mut counted, mut over) = (0, false);
        let stopped = native::unwind(snap, |pc| {
            if pcs.is_full() {
                over = true;
                return false;
            }
            pcs.push(pc);
            counted += !in_eval(pc) as usize;
            counted <= budget
        });
        // A walk that ended in code no module holds is walked again once the modules are
        // looked at again (`merge_and_intern`): its stack may be another.
        let k = pcs.len();
        if over || (!stopped && (k == 0 || snap.find(pcs[k - 1]).is_none())) {
            quick_bailed();
            return None;
        }
        let _ = QUICK_BAILS.try_with(|b| b.set((0, 0)));
        // The frame past the budget only says that one follows (the merge places a gap
        // there): not in the key, which would otherwise tell one stack's callers apart.
        let used = if stopped { k - 1 } else { k };
        for &pc in &pcs[..used] {
            a = (a ^ pc).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
            b = (b.rotate_left(17) ^ pc).wrapping_mul(0x9e37_79b9_7f4a_7c15 | 1);
        }
        a ^= ((used as u64) << 56) ^ ((stopped as u64) << 48) ^ ((budget as u64) << 40);
    } else {
        // No native frames: a key apart from any with them.
        b = b.rotate_left(7) ^ 0x4e4f_4e41_5449_5645;
    }
    Some((a ^ (a >> 31), b ^ (b >> 29), q.n))
}

thread_local! {
    /// (keys given up in a row after their native walk, captures left that try none): a
    /// thread whose walks end in code no module holds (JIT-compiled code, a trampoline; so did
    /// every walk through libffi's `ffi_call_unix64` until framehop's fallback rule stopped
    /// being cached) would read every key in vain and then walk the full way.
    static QUICK_BAILS: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
}

/// After this many keys given up in a row, a thread's captures that walk native frames try
/// no key for the next [`QUICK_REST`] (then one tries again).
const QUICK_GIVE_UP: u32 = 8;
const QUICK_REST: u32 = 256;

/// Whether this thread's captures rest from keys now (one fewer to go).
fn quick_resting() -> bool {
    QUICK_BAILS
        .try_with(|b| {
            let (bails, rest) = b.get();
            if rest > 0 {
                b.set((bails, rest - 1));
            }
            rest > 0
        })
        .unwrap_or(false)
}

/// A key given up after its native walk.
fn quick_bailed() {
    let _ = QUICK_BAILS.try_with(|b| {
        let (bails, _) = b.get();
        b.set(if bails + 1 >= QUICK_GIVE_UP {
            (0, QUICK_REST)
        } else {
            (bails + 1, 0)
        });
    });
}

/// The most native frames a [`quick`] key holds (the default budget is 16).
const QUICK_NATIVE: usize = 32;

/// Mixed into a quick key: it and a stack's own hashes ([`hashes`]) share the thread's cache.
const QUICK_WORD: u64 = 0x5155_4943_4b00_0000;

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread whose keys keep being given up after their walk rests from them for
    /// `QUICK_REST` captures, then tries again; one key kept in between starts the count over.
    #[test]
    fn keys_given_up_in_a_row_rest_the_thread_then_it_tries_again() {
        std::thread::spawn(|| {
            for _ in 0..QUICK_GIVE_UP - 1 {
                quick_bailed();
            }
            assert!(!quick_resting());
            // One kept: the count starts over.
            QUICK_BAILS.with(|b| b.set((0, 0)));
            for _ in 0..QUICK_GIVE_UP - 1 {
                quick_bailed();
                assert!(!quick_resting());
            }
            quick_bailed();
            for _ in 0..QUICK_REST {
                assert!(quick_resting());
            }
            assert!(!quick_resting());
        })
        .join()
        .unwrap();
    }
}

//! The quick key's pass over the thread's Python frames ([`quick`]): the frames' and code
//! objects' words a capture's Python frames are made of, hashed in one loop, without
//! describing or keeping them (docs/design.md, "The quick key").
//!
//! Layer: recording. Part of the Python frames ([`super`]).

use super::{Direct, FRAME_OWNED_BY_CSTACK, L311, L312, Layout, ON, STATE, get, innermost};
use std::sync::atomic::Ordering::Acquire;

/// The calling thread's Python frames, read for a key only: [`quick`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quick {
    /// Two hashes of what a capture makes of the frames: each frame's code object and
    /// instruction, the code object's file, name and first line, and its activation; and
    /// whether the walk was cut at the depth.
    pub h1: u64,
    pub h2: u64,
    /// Python frames read (0: the thread runs no Python).
    pub n: usize,
}

/// The calling thread's Python frames (at most `depth`) as a key, without describing them or
/// keeping them: the fast tier's look-up of a stack it has seen
/// ([`super::super::capture`]). Every input of a capture's Python frames goes into it — per
/// frame the code object and instruction (the byte offset), the code object's file, name and
/// first line (as [`super::same_code`] checks them) and the activation — so two walks with one
/// key make one stack. One tight loop of ~8 loads a frame: no memo, no copies, no describing
/// (the full walk, [`super::with_frames`], costs ~85 instructions a frame on `pystep.py`).
///
/// None (the caller walks the full way) until the process's first walk was checked, when Python
/// frames are off, or where a frame's code object is not one (its type word).
#[inline(never)]
pub fn quick(generation: u64, depth: usize) -> Option<Quick> {
    if STATE.load(Acquire) != ON {
        return None;
    }
    let py = get(generation)?;
    let f0 = innermost(py, &Direct).ok()?;
    match py.fixed {
        11 => quick_from(&L311, py.code_type, f0, generation, depth),
        12 => quick_from(&L312, py.code_type, f0, generation, depth),
        _ => quick_from(&py.layout, py.code_type, f0, generation, depth),
    }
}

/// [`quick`]'s loop from the innermost frame `f0`, the same for every layout. Inlined into
/// each arm of [`quick`]'s match: where `l` is [`L311`] or [`L312`] (constants) the compiler
/// folds every offset into the loop's instructions, so that its registers hold the loop's own
/// values and not eleven offsets reloaded from the stack a frame (~53 instructions a frame on
/// `pystep.py` against ~75 for the layout read at start-up, 3.10's and 3.13's).
#[inline(always)]
fn quick_from(l: &Layout, code_type: u64, f0: u64, generation: u64, depth: usize) -> Option<Quick> {
    // SAFETY: as in `walk_known`: once STATE is ON, the calling thread's own live frame chain
    // (each frame checked aligned and above the null page before it is read) and, through a
    // frame, its code object (its type word checked first): live while this thread is inside
    // the call being recorded.
    let word = |a: u64| unsafe { *(a as *const u64) };
    // SAFETY: as `word`, for the frame's one-byte fields (owner, is_entry).
    let byte = |a: u64| unsafe { *(a as *const u8) };
    const K1: u64 = 0x9e37_79b9_7f4a_7c15;
    const M: u64 = 0xff51_afd7_ed55_8ccd;
    let (first_word, first_shift) = (l.co_first & !7, (l.co_first & 7) * 8);
    let (mut a, mut b) = (K1 ^ depth as u64, M ^ generation);
    // Every frame adds one to `n` (a code frame) or to `act` (a shim, and an entry frame
    // besides): their sum bounds the walk of a chain that loops.
    let (mut f, mut n, mut act) = (f0, 0usize, 0u64);
    let mut truncated = false;
    while f != 0 {
        if f < 4096 || !f.is_multiple_of(8) || n as u64 + act > 100_000 {
            return None;
        }
        let prev = word(f + l.prev);
        if let Some(owner) = l.owner
            && byte(f + owner) == FRAME_OWNED_BY_CSTACK
        {
            act += 1;
            f = prev;
            continue;
        }
        if n == depth {
            truncated = true;
            break;
        }
        let code = word(f + l.code);
        if code < 4096 || !code.is_multiple_of(8) || word(code + 8) != code_type {
            return None;
        }
        let instr = if l.minor == 10 {
            (word((f + l.instr) & !7) >> ((l.instr & 7) * 8)) as u32 as u64
        } else {
            word(f + l.instr)
        };
        let first = (word(code + first_word) >> first_shift) as u32 as u64;
        // Two lanes, one multiply each a frame: (code, instr, activation, place) into one,
        // (file, name, first line) into the other.
        let w1 = code ^ instr.rotate_left(32) ^ (act << 48 | n as u64);
        let w2 = word(code + l.co_file) ^ word(code + l.co_name).rotate_left(29) ^ first << 40;
        a = (a ^ w1).wrapping_mul(K1 | 1).rotate_left(31);
        b = (b ^ w2).wrapping_mul(M | 1).rotate_left(27);
        n += 1;
        let entry = match l.is_entry {
            Some(at) => byte(f + at) != 0,
            None => l.minor == 10,
        };
        act += entry as u64;
        f = prev;
    }
    let a = (a ^ (n as u64) ^ ((truncated as u64) << 63)).wrapping_mul(M);
    let b = (b ^ b.rotate_left(31) ^ a).wrapping_mul(K1 | 1);
    Some(Quick {
        h1: a ^ (a >> 29),
        h2: b ^ (b >> 31),
        n,
    })
}

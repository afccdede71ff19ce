//! The check's tier (`ISOLATE_CHECK`): which bytes of a freed block the poison writes and the
//! check reads. `full` (the default): every byte. `fast`: a block of at most [`WHOLE`] bytes
//! still every byte; a larger one only its **canaries** — 16 bytes at every multiple of
//! [`STRIDE`] (4 KiB) from its start — and its last 16 bytes. The rest keeps the data it held
//! when it was freed (a stale read there reads that data), but stays quarantined like the rest.
//!
//! One definition, three readers: the device kernels of `sparse.ptx` (the fill and the check),
//! the stand-in's C versions of them (tests/standin/driver_launch.c), and the host check
//! ([`spans`]). A block's pattern travels with it as a **shift** in the top byte of its
//! descriptor's length ([`encode`]): 0 is every byte (the vectors 16 bytes apart), 12 the
//! canaries 4 KiB apart. The pattern, for a block of `len` bytes and shift `s` (4 for 0):
//!
//! - `count = (len - 16) >> s + 1` 16-byte vectors at offsets `v << s` (none when `len < 16`);
//! - then the bytes from `max(len - 16, end of the last vector)` (0 without vectors) to `len`.
//!
//! With `s = 4` that is every byte. With `s = 12` a stale write of at least 4 KiB inside the
//! block always covers a canary's first byte (any 4,096 consecutive offsets hold a multiple of
//! 4,096); a shorter one of `n` bytes at a uniformly random offset covers one with probability
//! about `(n + 15) / 4096` (plus the last 16 bytes'), and in a block of at most [`WHOLE`]
//! bytes always. docs/isolation.md ("The fast tier") has the rates measured.
//!
//! Layer: policies. Uses the base only.

use crate::base::config;

/// Blocks up to this size are poisoned and checked whole in the fast tier too (they cost little
/// bandwidth, and a short stale write in one is then always found).
pub const WHOLE: u64 = 64 << 10;

/// log2 of the distance between two canaries of the fast tier (4 KiB).
pub const SHIFT: u8 = 12;

/// The distance between two canaries.
pub const STRIDE: u64 = 1 << SHIFT;

/// Bytes of one canary (one 128-bit store or load).
pub const CANARY: u64 = 16;

const LEN_BITS: u64 = 56;
const LEN_MASK: u64 = (1 << LEN_BITS) - 1;

/// The shift of a block of `len` bytes at `ptr` in the tier in force: 0 (every byte) in the
/// full tier, for a block of at most [`WHOLE`] bytes, and for one not 16-byte aligned (the
/// kernels' 128-bit accesses); else [`SHIFT`].
pub fn shift_for(ptr: u64, len: u64) -> u8 {
    if config::get().check_fast && len > WHOLE && ptr.is_multiple_of(16) && len <= LEN_MASK {
        SHIFT
    } else {
        0
    }
}

/// A descriptor's length field: `len` with the shift in its top byte.
pub fn encode(len: u64, shift: u8) -> u64 {
    (len & LEN_MASK) | (u64::from(shift) << LEN_BITS)
}

/// (length, shift) of a descriptor's length field.
pub fn decode(field: u64) -> (u64, u8) {
    (field & LEN_MASK, (field >> LEN_BITS) as u8)
}

/// The vectors of the pattern, and the offset where the tail bytes begin.
fn layout(len: u64, shift: u8) -> (u64, u32, u64) {
    let s = if shift == 0 { 4 } else { u32::from(shift) };
    if len < CANARY {
        return (0, s, 0);
    }
    let count = ((len - CANARY) >> s) + 1;
    let last_end = ((count - 1) << s) + CANARY;
    (count, s, last_end.max(len - CANARY))
}

/// The byte ranges (offset, length) of a block of `len` bytes that its pattern covers, in
/// order and apart (every byte as one range when the vectors touch).
pub fn spans(len: u64, shift: u8) -> Vec<(u64, u64)> {
    let (count, s, tail) = layout(len, shift);
    if s == 4 {
        return if len == 0 { Vec::new() } else { vec![(0, len)] };
    }
    let mut v: Vec<(u64, u64)> = (0..count).map(|i| (i << s, CANARY)).collect();
    if tail < len {
        v.push((tail, len - tail));
    }
    v
}

/// Bytes of a block of `len` bytes its pattern covers: what the poison writes and the check
/// reads.
pub fn touched(len: u64, shift: u8) -> u64 {
    let (count, s, tail) = layout(len, shift);
    if s == 4 {
        return len;
    }
    count * CANARY + (len - tail)
}

/// The bytes a kernel walks for a descriptor (its vectors), to size the grid.
pub fn vector_bytes(field: u64) -> u64 {
    let (len, shift) = decode(field);
    if shift == 0 {
        return len;
    }
    layout(len, shift).0 * CANARY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_zero_is_every_byte() {
        assert_eq!(spans(1000, 0), vec![(0, 1000)]);
        assert_eq!(touched(1000, 0), 1000);
        assert_eq!(spans(0, 0), vec![]);
    }

    #[test]
    fn canaries_every_4_kib_and_the_last_16_bytes() {
        // 1 MiB: 256 canaries (the last at 1 MiB - 4 KiB), then the last 16 bytes.
        let s = spans(1 << 20, SHIFT);
        assert_eq!(s.len(), 257);
        assert_eq!(s[0], (0, 16));
        assert_eq!(s[1], (4096, 16));
        assert_eq!(s[255], ((1 << 20) - 4096, 16));
        assert_eq!(s[256], ((1 << 20) - 16, 16));
        assert_eq!(touched(1 << 20, SHIFT), 257 * 16);
        // A last canary that reaches the end: no tail apart.
        let n = 3 * 4096 + 16;
        assert_eq!(
            spans(n, SHIFT),
            vec![(0, 16), (4096, 16), (8192, 16), (12288, 16)]
        );
        // One that would run past the end is not one: the tail covers the last 16 bytes.
        let n = 3 * 4096 + 8;
        assert_eq!(spans(n, SHIFT).last(), Some(&(n - 16, 16)));
        assert_eq!(spans(n, SHIFT).len(), 4);
    }

    #[test]
    fn every_4_kib_write_inside_a_block_meets_a_canary() {
        let len = 1_000_000u64;
        let s = spans(len, SHIFT);
        for off in (0..=len - 4096).step_by(7) {
            assert!(
                s.iter().any(|&(o, n)| o < off + 4096 && off < o + n),
                "a write at {off} missed"
            );
        }
    }

    #[test]
    fn the_length_field_carries_the_shift() {
        assert_eq!(decode(encode(12345, SHIFT)), (12345, SHIFT));
        assert_eq!(encode(12345, 0), 12345);
        assert_eq!(vector_bytes(encode(1 << 20, SHIFT)), 256 * 16);
        assert_eq!(vector_bytes(encode(1 << 20, 0)), 1 << 20);
    }
}

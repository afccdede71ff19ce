//! Fuzzing the trace reader against the reference decoder on stable Rust (no libFuzzer: see `trace/fuzz/` for that).
//!
//! `mutated_traces_never_panic_and_readers_agree` mutates valid traces for a bounded time
//! (`ISOLATE_FUZZ_SECS`, default 20 s) from a fixed seed (`ISOLATE_FUZZ_SEED` to change it; the
//! seed in use is printed) and feeds every input to both [`RefReader`] and [`Reader`]. For every
//! input it holds that
//!
//! - neither reader panics (a panic fails the test with the input in hex, also saved under
//!   `CARGO_TARGET_TMPDIR`);
//! - every error message says `at byte N` with the error's offset, and N lies inside the input;
//! - the prefix up to the error offset (or the truncation point) reads back as the same records
//!   with neither error nor truncation: the offset names the start of the bad frame;
//! - the two readers yield the same header, the same records, the same error text and offset,
//!   the same truncation point and the same final offset;
//! - no input grows the process's resident memory by more than 64 MiB, and none takes longer
//!   than a few seconds.
//!
//! `random_records_round_trip` encodes random records (every field random, long strings,
//! kernel names of a few KiB, frames right at the size limit) and reads them back exactly.

use isolate_trace::reference::Reader as RefReader;
use isolate_trace::{
    Api, Encoder, End, EndReason, ErrorKind, Event, Frame, Header, MAX_FRAME, Module, Note,
    NoteKind, PyCode, Reader, Record, Stack, StackOf, StaleLaunch, Stats, TraceError, Violation,
};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DEFAULT_SEED: u64 = 0x1501_a7e0_f022_2024;
const DEFAULT_SECS: f64 = 20.0;
/// No single input may grow the resident set by more than this.
const RSS_LIMIT_KIB: u64 = 64 * 1024;
/// No single input may take longer than this (a hang shows as a failure, not a stuck test).
const INPUT_TIME_LIMIT: Duration = Duration::from_secs(5);
/// Seeds and mutants are kept below this many bytes (so that a failure's hex stays readable).
const MAX_INPUT: usize = 16 * 1024;

// ------------------------------------------------------------------------------------ PRNG

/// SplitMix64: small, fast, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }

    /// A value that likes the edges of the varint encoding.
    fn u64(&mut self) -> u64 {
        const EDGES: &[u64] = &[
            0,
            1,
            250,
            251,
            252,
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0xffff_ffff,
            0x1_0000_0000,
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
        ];
        match self.below(4) {
            0 => EDGES[self.below(EDGES.len())],
            1 => self.next() % 256,
            2 => self.next() >> self.below(64),
            _ => self.next(),
        }
    }

    fn u32(&mut self) -> u32 {
        self.u64() as u32
    }

    fn i32(&mut self) -> i32 {
        match self.below(4) {
            0 => [0, -1, 1, i32::MIN, i32::MAX, -126, 125][self.below(7)],
            _ => self.u64() as i32,
        }
    }

    fn api(&mut self) -> Api {
        Api::ALL[self.below(Api::ALL.len())]
    }

    /// A string of up to `max` characters: ASCII, markup, controls, and any Unicode scalar.
    fn string(&mut self, max: usize) -> String {
        let len = if max == 0 { 0 } else { self.below(max + 1) };
        let mut s = String::with_capacity(len);
        for _ in 0..len {
            let c = match self.below(6) {
                0..=2 => (b' ' + self.below(95) as u8) as char,
                3 => [
                    '<', '>', '"', '\'', '&', '\\', '\n', '\0', '\u{2028}', '\u{7f}',
                ][self.below(10)],
                4 => char::from_u32(self.below(0x800) as u32).unwrap_or('?'),
                _ => loop {
                    if let Some(c) = char::from_u32(self.below(0x11_0000) as u32) {
                        break c;
                    }
                },
            };
            s.push(c);
        }
        s
    }
}

// ------------------------------------------------------------------------------------ random records

fn random_header(rng: &mut Rng) -> Header {
    let opt = |rng: &mut Rng| (!rng.chance(2)).then(|| rng.u32());
    Header {
        pid: rng.u32(),
        ppid: rng.u32(),
        exe: rng.string(64),
        argv: (0..rng.below(6)).map(|_| rng.string(40)).collect(),
        start_unix_ns: rng.u64(),
        start_mono_ns: rng.u64(),
        hostname: rng.string(16),
        library_version: rng.string(8),
        mode: ["log", "isolate", "off", ""][rng.below(4)].to_string(),
        rank: opt(rng),
        local_rank: opt(rng),
        world_size: opt(rng),
        config: (0..rng.below(5))
            .map(|_| (rng.string(20), rng.string(20)))
            .collect(),
    }
}

fn random_stats(rng: &mut Rng) -> Stats {
    Stats {
        ts_ns: rng.u64(),
        events: rng.u64(),
        queue_waits: rng.u64(),
        queue_wait_ns: rng.u64(),
        quarantine_peak_bytes: rng.u64(),
        quarantine_releases: rng.u64(),
        quarantine_early_releases: rng.u64(),
    }
}

const NOTE_KINDS: &[NoteKind] = &[
    NoteKind::Info,
    NoteKind::QuarantineRelease,
    NoteKind::QuarantineEarlyRelease,
    NoteKind::OomRetry,
    NoteKind::GuardRecycle,
    NoteKind::WriterError,
    NoteKind::Signal,
    NoteKind::Fork,
    NoteKind::Exec,
    NoteKind::DeviceFault,
    NoteKind::LateLoad,
    NoteKind::Mark,
    NoteKind::RegionPush,
    NoteKind::RegionPop,
];

/// One random record; `tids` is a small pool so that events share threads.
fn random_record(rng: &mut Rng, tids: &[u32]) -> Record {
    match rng.below(16) {
        0..=5 => {
            // Events are most of a real trace; half of them have all extra fields zero.
            let extra = rng.chance(2);
            let mut x = || if extra { rng.u64() } else { 0 };
            let (pitch, stream, handle, offset, flags) = (x(), x(), x(), x(), x());
            Record::Event(Event {
                seq: rng.u64(),
                ts_ns: rng.u64(),
                tid: tids[rng.below(tids.len())],
                device: rng.i32(),
                api: rng.api(),
                result: rng.i32(),
                duration_ns: rng.u64(),
                ptr: rng.u64(),
                size: rng.u64(),
                pitch,
                stream,
                handle,
                offset,
                flags,
                stack: if rng.chance(2) { rng.u32() } else { 0 },
            })
        }
        12 => Record::Module(Module {
            id: rng.u32(),
            path: rng.string(200),
            base: rng.u64(),
            start: rng.u64(),
            end: rng.u64(),
            build_id: rng.string(20).into_bytes(),
        }),
        13 => Record::Stack(Stack {
            id: rng.u32(),
            frames: (0..rng.below(40))
                .map(|_| {
                    if rng.chance(2) {
                        Frame::Native(rng.u64())
                    } else {
                        Frame::Python {
                            code: rng.u32(),
                            line: rng.u32(),
                        }
                    }
                })
                .collect(),
            truncated: rng.chance(2),
        }),
        14 => Record::PyCode(PyCode {
            id: rng.u32(),
            file: rng.string(100),
            name: rng.string(40),
            first_line: rng.u32(),
        }),
        15 => Record::StackOf(StackOf {
            seq: rng.u64(),
            stack: rng.u32(),
        }),
        6 => Record::Violation(Violation {
            seq: rng.u64(),
            ts_ns: rng.u64(),
            device: rng.i32(),
            ptr: rng.u64(),
            size: rng.u64(),
            first_offset: rng.u64(),
            changed_bytes: rng.u64(),
            alloc_seq: rng.u64(),
            free_seq: rng.u64(),
            free_ts_ns: rng.u64(),
            free_api: rng.api(),
            alloc_stack: rng.u32(),
            free_stack: rng.u32(),
        }),
        7 => {
            // Kernel names: usually short, sometimes a C++ template name of a few KiB.
            let max = if rng.chance(4) { 4096 } else { 60 };
            Record::StaleLaunch(StaleLaunch {
                seq: rng.u64(),
                ts_ns: rng.u64(),
                tid: rng.u32(),
                device: rng.i32(),
                api: rng.api(),
                kernel: rng.string(max),
                param_index: rng.u32(),
                param_offset: rng.u32(),
                ptr: rng.u64(),
                alloc_ptr: rng.u64(),
                alloc_size: rng.u64(),
                alloc_seq: rng.u64(),
                free_seq: rng.u64(),
                free_ts_ns: rng.u64(),
                alloc_stack: rng.u32(),
                free_stack: rng.u32(),
            })
        }
        8 | 9 => {
            let max = if rng.chance(8) { 2000 } else { 30 };
            Record::Note(Note {
                seq: rng.u64(),
                ts_ns: rng.u64(),
                kind: NOTE_KINDS[rng.below(NOTE_KINDS.len())],
                ptr: rng.u64(),
                size: rng.u64(),
                value: rng.u64(),
                text: rng.string(max),
            })
        }
        10 => Record::Stats(random_stats(rng)),
        _ => Record::End(End {
            ts_ns: rng.u64(),
            reason: match rng.below(3) {
                0 => EndReason::Exit,
                1 => EndReason::Signal(rng.i32()),
                _ => EndReason::Exec,
            },
            stats: random_stats(rng),
        }),
    }
}

/// A random trace: its bytes, header and records.
fn random_trace(rng: &mut Rng, max_records: usize) -> (Vec<u8>, Header, Vec<Record>) {
    let header = random_header(rng);
    let tids: Vec<u32> = (0..1 + rng.below(4)).map(|_| rng.u32()).collect();
    let records: Vec<Record> = (0..rng.below(max_records + 1))
        .map(|_| random_record(rng, &tids))
        .collect();
    let mut bytes = Vec::new();
    Encoder::preamble(&header, &mut bytes);
    let mut enc = Encoder::new();
    for r in &records {
        enc.encode(r, &mut bytes);
    }
    (bytes, header, records)
}

// ------------------------------------------------------------------------------------ reading

/// Everything a reader makes of an input.
#[derive(Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per input, never stored
enum Outcome {
    /// The header did not read: the message and the offset.
    NoHeader(String, u64),
    Read {
        header: Header,
        records: Vec<Record>,
        /// The error that stopped the reader: message and offset.
        error: Option<(String, u64)>,
        truncated_at: Option<u64>,
        /// Bytes consumed at the end (0 after an error).
        offset: u64,
    },
}

fn error_of(e: &TraceError, len: usize) -> (String, u64) {
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("at byte {}", e.offset)),
        "the error does not name its offset {}: {msg}",
        e.offset
    );
    assert!(
        e.offset <= len as u64,
        "error offset {} beyond the input's {len} bytes: {msg}",
        e.offset
    );
    assert!(
        !matches!(e.kind, ErrorKind::Io(_)),
        "an I/O error reading a slice: {msg}"
    );
    (msg, e.offset)
}

/// Reads `bytes` with `RefReader` or `Reader` to the end; with `fused`, also holds that the
/// reader stays at its end once it has returned `Ok(None)` or an error.
macro_rules! read_with {
    ($reader:ident, $bytes:expr) => {
        read_with!($reader, $bytes, true)
    };
    ($reader:ident, $bytes:expr, $fused:expr) => {{
        let bytes: &[u8] = $bytes;
        match $reader::new(bytes, None) {
            Err(e) => {
                let (m, o) = error_of(&e, bytes.len());
                Outcome::NoHeader(m, o)
            }
            Ok(mut r) => {
                let header = r.header().clone();
                let mut records = Vec::new();
                let mut error = None;
                loop {
                    match r.next_record() {
                        Ok(Some(rec)) => {
                            records.push(rec);
                            // Every record takes at least two bytes: a frame of one.
                            assert!(records.len() <= bytes.len(), "more records than bytes");
                        }
                        Ok(None) => break,
                        Err(e) => {
                            error = Some(error_of(&e, bytes.len()));
                            break;
                        }
                    }
                }
                // Once done, a reader stays done.
                if $fused {
                    let again = r.next_record();
                    assert!(
                        matches!(again, Ok(None)),
                        "{} after the end: {:?}",
                        stringify!($reader),
                        again.map_err(|e| e.to_string())
                    );
                }
                let offset = if error.is_none() { r.offset() } else { 0 };
                Outcome::Read {
                    header,
                    records,
                    error,
                    truncated_at: r.truncated_at(),
                    // After a bad length prefix `RefReader` has consumed the prefix and
                    // `Reader` has not: only the offset of a clean end is compared.
                    offset,
                }
            }
        }
    }};
}

/// The resident set of this process, KiB: `VmRSS` of `/proc/self/status`, read from
/// `/proc/self/statm` (the same counter, in pages) through a file kept open, since this is read
/// twice per input.
fn rss_kib() -> u64 {
    use std::io::{Read, Seek};
    thread_local! {
        static STATM: std::cell::RefCell<Option<std::fs::File>> =
            std::cell::RefCell::new(std::fs::File::open("/proc/self/statm").ok());
    }
    let page_kib = (unsafe { libc_sysconf_pagesize() } / 1024).max(1);
    STATM.with(|f| {
        let mut f = f.borrow_mut();
        let Some(f) = f.as_mut() else { return 0 };
        let mut s = String::new();
        if f.rewind().is_err() || f.read_to_string(&mut s).is_err() {
            return 0;
        }
        let pages: u64 = s
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        pages * page_kib
    })
}

/// `sysconf(_SC_PAGESIZE)` without a libc dependency.
unsafe fn libc_sysconf_pagesize() -> u64 {
    unsafe extern "C" {
        fn sysconf(name: i32) -> i64;
    }
    const SC_PAGESIZE: i32 = 30; // Linux, every architecture glibc supports
    (unsafe { sysconf(SC_PAGESIZE) }).max(4096) as u64
}

/// `VmRSS` of `/proc/self/status`, KiB (to check [`rss_kib`] against once).
fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// What kind of outcome, for the tally.
fn class(o: &Outcome) -> &'static str {
    match o {
        Outcome::NoHeader(..) => "header refused",
        Outcome::Read {
            error: Some(..), ..
        } => "frame error",
        Outcome::Read {
            truncated_at: Some(_),
            ..
        } => "truncated",
        Outcome::Read { records, .. } if matches!(records.last(), Some(Record::End(_))) => {
            "complete"
        }
        Outcome::Read { .. } => "no End record",
    }
}

/// Every property for one input; panics on a violation. Returns the outcome's class.
fn check(bytes: &[u8]) -> &'static str {
    // `RefReader` is not fused after a frame-level error (see `reader_stays_done_after_a_bad_length`),
    // so only `Reader` is held to that here.
    let slow = read_with!(RefReader, bytes, false);
    let fast = read_with!(Reader, bytes, true);
    assert_eq!(slow, fast, "RefReader and Reader disagree");
    if let Outcome::Read {
        header,
        records,
        error,
        truncated_at,
        offset,
    } = &slow
    {
        assert!(*offset <= bytes.len() as u64, "offset past the input");
        if let Some(t) = truncated_at {
            assert!(
                *t < bytes.len() as u64,
                "truncated at {t} of {}",
                bytes.len()
            );
        }
        // The offset names where the bad part starts: everything before it reads cleanly.
        let cut = match (error, truncated_at) {
            (Some((_, at)), _) if *at >= 12 => Some(*at),
            (None, Some(t)) => Some(*t),
            _ => None,
        };
        if let Some(cut) = cut {
            let prefix = read_with!(RefReader, &bytes[..cut as usize], false);
            let want = Outcome::Read {
                header: header.clone(),
                records: records.clone(),
                error: None,
                truncated_at: None,
                offset: cut,
            };
            assert_eq!(
                prefix, want,
                "the prefix up to the reported offset {cut} does not read cleanly"
            );
        }
    }
    class(&slow)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs [`check`] on `bytes` under `catch_unwind`, with the memory and time limits; fails the
/// test with the input's hex on any violation.
fn check_input(bytes: &[u8], seed: u64, n: u64) -> &'static str {
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(|| check(bytes)));
    let took = t0.elapsed();
    let grew = rss_kib().saturating_sub(rss0);
    let failure = match r {
        Err(p) => Some(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into()),
        ),
        Ok(_) if grew > RSS_LIMIT_KIB => Some(format!("resident memory grew by {grew} KiB")),
        Ok(_) if took > INPUT_TIME_LIMIT => Some(format!("reading took {took:?}")),
        Ok(c) => return c,
    };
    let saved = save(bytes, seed, n);
    panic!(
        "fuzz input #{n} (seed {seed:#x}, ISOLATE_FUZZ_SEED={seed:#x} reproduces) failed: {}\n\
         saved as {}\ninput ({} bytes, hex): {}",
        failure.unwrap_or_default(),
        saved.display(),
        bytes.len(),
        hex(bytes)
    );
}

fn save(bytes: &[u8], seed: u64, n: u64) -> PathBuf {
    let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{seed:x}-{n}.bin"));
    let _ = std::fs::write(&p, bytes);
    p
}

// ------------------------------------------------------------------------------------ mutation

/// The offsets where frames start (after the magic and version), as far as the prefixes parse.
fn frame_starts(b: &[u8]) -> Vec<usize> {
    let mut v = Vec::new();
    let mut at = 12;
    while at < b.len() {
        let (mut len, mut shift, mut i) = (0u64, 0, at);
        loop {
            let Some(&byte) = b.get(i) else { return v };
            i += 1;
            len |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return v;
            }
        }
        v.push(at);
        if len == 0 || len > MAX_FRAME {
            return v;
        }
        at = i + len as usize;
    }
    v
}

fn leb128(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// A position in `b`, preferring frame starts (half the time).
fn position(rng: &mut Rng, b: &[u8], starts: &[usize]) -> usize {
    if !starts.is_empty() && rng.chance(2) {
        starts[rng.below(starts.len())]
    } else {
        rng.below(b.len() + 1)
    }
}

/// A byte to change: three times in four past the header (a broken header hides the rest).
fn byte_index(rng: &mut Rng, b: &[u8], starts: &[usize]) -> usize {
    match starts.get(1) {
        Some(&body) if body < b.len() && !rng.chance(4) => body + rng.below(b.len() - body),
        _ => rng.below(b.len()),
    }
}

/// One mutation of `b` in place; `other` is a second trace for splices.
fn mutate(rng: &mut Rng, b: &mut Vec<u8>, other: &[u8]) -> &'static str {
    const INTERESTING: &[u8] = &[0, 1, 0x7f, 0x80, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff];
    let starts = frame_starts(b);
    match rng.below(10) {
        0 | 1 => {
            // Flip one to four bits.
            if !b.is_empty() {
                for _ in 0..1 + rng.below(4) {
                    let i = byte_index(rng, b, &starts);
                    b[i] ^= 1 << rng.below(8);
                }
            }
            "bit flip"
        }
        2 => {
            let at = position(rng, b, &starts);
            let n = 1 + rng.below(4);
            for _ in 0..n {
                let v = if rng.chance(2) {
                    INTERESTING[rng.below(INTERESTING.len())]
                } else {
                    rng.next() as u8
                };
                b.insert(at.min(b.len()), v);
            }
            "insert"
        }
        3 => {
            if !b.is_empty() {
                let at = rng.below(b.len());
                let n = (1 + rng.below(8)).min(b.len() - at);
                b.drain(at..at + n);
            }
            "delete"
        }
        4 => {
            let at = position(rng, b, &starts);
            b.truncate(at);
            "truncate"
        }
        5 | 6 => {
            // Overwrite a frame's length prefix: huge, just over the limit, zero, off by one.
            if let Some(&at) = starts.get(rng.below(starts.len().max(1))) {
                let mut end = at;
                while end < b.len() && b[end] & 0x80 != 0 && end - at < 5 {
                    end += 1;
                }
                let end = (end + 1).min(b.len());
                let old = b[at..end]
                    .iter()
                    .rev()
                    .fold(0u64, |acc, &x| (acc << 7) | u64::from(x & 0x7f));
                let new: Vec<u8> = match rng.below(8) {
                    0 => vec![0xff, 0xff, 0xff, 0xff, 0x0f],       // 4 GiB - 1
                    1 => vec![0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], // six bytes
                    2 => leb128(MAX_FRAME + 1),
                    // Exactly the limit: valid, so the reader fills a 1 MiB buffer from a
                    // short input (slow in a debug build): not too often.
                    3 if rng.chance(16) => leb128(MAX_FRAME),
                    3 => leb128(old + 1 + rng.below(4096) as u64),
                    4 => vec![0],
                    5 => leb128(old + 1),
                    6 => leb128(old.saturating_sub(1)),
                    _ => leb128(rng.u64() & 0xffff_ffff),
                };
                b.splice(at..end, new);
            }
            "length overwrite"
        }
        7 => {
            // Splice: the head of this trace, the tail of another (each cut at a frame start
            // or anywhere).
            let at = position(rng, b, &starts);
            let ostarts = frame_starts(other);
            let from = position(rng, other, &ostarts).min(other.len());
            b.truncate(at);
            b.extend_from_slice(&other[from..]);
            "splice"
        }
        8 => {
            // A varint marker (or a bad one) in the middle of a payload.
            if !b.is_empty() {
                let i = byte_index(rng, b, &starts);
                b[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            "interesting byte"
        }
        _ => {
            // Duplicate a run of bytes (a frame repeated, a thread record twice).
            if !b.is_empty() {
                let at = position(rng, b, &starts).min(b.len() - 1);
                let n = (1 + rng.below(64)).min(b.len() - at);
                let chunk = b[at..at + n].to_vec();
                let to = rng.below(b.len() + 1);
                b.splice(to..to, chunk);
            }
            "duplicate"
        }
    }
}

// ------------------------------------------------------------------------------------ seeds

fn env_seed() -> u64 {
    match std::env::var("ISOLATE_FUZZ_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("ISOLATE_FUZZ_SEED={s:?} is not a number"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

fn env_secs() -> f64 {
    match std::env::var("ISOLATE_FUZZ_SECS") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("ISOLATE_FUZZ_SECS={s:?} is not a number of seconds")),
        Err(_) => DEFAULT_SECS,
    }
}

/// Real traces: those recorded on an H200 and the checked-in corpus, each cut to `MAX_INPUT`.
fn file_seeds() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for dir in ["tests/traces/h200", "tests/corpus"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "trace" || x == "bin"))
            .collect();
        paths.sort();
        for p in paths {
            if let Ok(mut b) = std::fs::read(&p) {
                b.truncate(MAX_INPUT);
                out.push(b);
            }
        }
    }
    out
}

// ------------------------------------------------------------------------------------ tests

#[test]
fn mutated_traces_never_panic_and_readers_agree() {
    let seed = env_seed();
    let secs = env_secs();
    eprintln!(
        "fuzz: seed {seed:#x} (ISOLATE_FUZZ_SEED), {secs} s (ISOLATE_FUZZ_SECS); \
         a failure prints the input in hex"
    );
    // The cheap RSS reading agrees with VmRSS (within 4 MiB: they are read at different times).
    let (a, b) = (rss_kib(), vm_rss_kib());
    assert!(
        a > 0 && a.abs_diff(b) < 4096,
        "statm says {a} KiB, VmRSS {b} KiB"
    );
    let mut rng = Rng(seed);
    let mut pool = file_seeds();
    let from_files = pool.len();
    for _ in 0..64 {
        pool.push(random_trace(&mut rng, 40).0);
    }
    pool.retain(|b| b.len() <= MAX_INPUT);
    // The seeds themselves first.
    let mut n = 0u64;
    for b in pool.clone() {
        check_input(&b, seed, n);
        n += 1;
    }
    let mut tally: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let mut mutations: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(secs);
    let mut bytes_read = 0u64;
    while start.elapsed() < deadline {
        // A batch between clock reads.
        for _ in 0..64 {
            let mut input = pool[rng.below(pool.len())].clone();
            let other = pool[rng.below(pool.len())].clone();
            for _ in 0..1 + rng.below(3) {
                *mutations
                    .entry(mutate(&mut rng, &mut input, &other))
                    .or_default() += 1;
            }
            input.truncate(MAX_INPUT);
            let c = check_input(&input, seed, n);
            n += 1;
            bytes_read += input.len() as u64;
            *tally.entry(c).or_default() += 1;
            // Keep some mutants that still read, to mutate further (bounded pool).
            if c != "header refused" && rng.chance(16) {
                if pool.len() < 512 {
                    pool.push(input);
                } else {
                    let i = from_files + rng.below(pool.len() - from_files);
                    pool[i] = input;
                }
            }
        }
    }
    let took = start.elapsed().as_secs_f64();
    eprintln!(
        "fuzz: {n} inputs in {took:.1} s ({:.0} inputs/s, {:.1} MB/s through both readers), \
         {from_files} file seeds; outcomes {tally:?}; mutations {mutations:?}",
        n as f64 / took,
        bytes_read as f64 / took / 1e6
    );
    // The mutations reach every kind of outcome (else the fuzzer is not doing its job).
    for want in ["frame error", "truncated", "complete", "header refused"] {
        assert!(
            tally.get(want).copied().unwrap_or(0) > 0,
            "no {want:?} outcome: {tally:?}"
        );
    }
}

#[test]
fn random_records_round_trip() {
    let seed = env_seed() ^ 0x5eed;
    eprintln!("round trip: seed {seed:#x}");
    let mut rng = Rng(seed);
    let mut checked = 0;
    for i in 0..3000 {
        let (bytes, header, records) = random_trace(&mut rng, 60);
        let r = catch_unwind(|| {
            let mut s = RefReader::new(&bytes[..], None).unwrap();
            let mut f = Reader::new(&bytes[..], None).unwrap();
            assert_eq!(s.header(), &header);
            assert_eq!(f.header(), &header);
            let a: Vec<Record> = (&mut s).map(|r| r.unwrap()).collect();
            let b: Vec<Record> = (&mut f).map(|r| r.unwrap()).collect();
            assert_eq!(a, records);
            assert_eq!(b, records);
            assert_eq!(s.truncated_at(), None);
            assert_eq!(f.truncated_at(), None);
            assert_eq!(s.offset(), bytes.len() as u64);
            assert_eq!(f.offset(), bytes.len() as u64);
        });
        if let Err(e) = r {
            let saved = save(&bytes, seed, i);
            panic!(
                "random trace #{i} (seed {seed:#x}) does not round-trip: {:?}; saved as {}",
                e.downcast_ref::<String>(),
                saved.display()
            );
        }
        checked += records.len();
    }
    eprintln!("round trip: {checked} records");
}

/// A trace of one Note whose frame payload is `payload` bytes long, and the frame's offset.
fn one_note(payload: usize) -> (Vec<u8>, u64, Record) {
    let mut bytes = Vec::new();
    Encoder::preamble(&Header::default(), &mut bytes);
    let at = bytes.len() as u64;
    // A Note's payload: variant 4, six zero fields, then the text's length (the 0xFC marker and
    // a u32: 5 bytes) and its bytes.
    let rec = Record::Note(Note {
        seq: 0,
        ts_ns: 0,
        kind: NoteKind::Info,
        ptr: 0,
        size: 0,
        value: 0,
        text: "k".repeat(payload - 12),
    });
    Encoder::new().encode(&rec, &mut bytes);
    let prefix = leb128(payload as u64).len();
    assert_eq!(bytes.len() as u64 - at - prefix as u64, payload as u64);
    (bytes, at, rec)
}

/// Big frames read back; one byte over the limit is refused, at the frame's offset.
#[test]
fn frames_near_the_size_limit() {
    let (bytes, _, rec) = one_note(MAX_FRAME as usize - 4096);
    let slow = read_with!(RefReader, &bytes, false);
    assert_eq!(slow, read_with!(Reader, &bytes));
    match slow {
        Outcome::Read { records, error, .. } => {
            assert!(error.is_none(), "{error:?}");
            assert!(records == vec![rec], "the big Note does not read back");
        }
        o => panic!("{o:?}"),
    }
    let (bytes, at, _) = one_note(MAX_FRAME as usize + 1);
    let slow = read_with!(RefReader, &bytes, false);
    assert_eq!(slow, read_with!(Reader, &bytes));
    match slow {
        Outcome::Read { records, error, .. } => {
            assert!(records.is_empty());
            let (msg, off) = error.expect("an error");
            assert_eq!(off, at);
            assert!(msg.contains("exceeds the limit"), "{msg}");
        }
        o => panic!("{o:?}"),
    }
}

/// A frame of exactly `MAX_FRAME` (1,048,576) bytes, the most docs/trace-format.md allows and
/// `Encoder` writes, reads back as the record it holds. (Regression test, commit 9867ea3: both
/// readers refused a Note frame of more than 1,048,532 bytes with `undecodable record:
/// LimitExceeded`, because bincode's limit counts more than the frame's bytes.)
#[test]
fn a_frame_of_exactly_max_frame_bytes_reads() {
    let (bytes, _, rec) = one_note(MAX_FRAME as usize);
    let mut r = Reader::new(&bytes[..], None).unwrap();
    assert_eq!(r.next_record().map_err(|e| e.to_string()), Ok(Some(rec)));
}

/// After `next_record` returned an error for a frame's length prefix (here one too long),
/// the reader stays at the end: the next call is `Ok(None)`, not a record read from inside the
/// bad frame. (Regression test, commit 9867ea3: the reader that is now the reference decoder
/// went on reading right after the prefix and could return records from there.)
#[test]
fn reader_stays_done_after_a_bad_length() {
    let mut bytes = Vec::new();
    Encoder::preamble(&Header::default(), &mut bytes);
    bytes.extend_from_slice(&[0x81, 0x80, 0x80, 0x01]); // 2 MiB + 1
    Encoder::new().encode(&Record::Stats(Stats::default()), &mut bytes);
    let mut r = Reader::new(&bytes[..], None).unwrap();
    assert!(r.next_record().is_err());
    assert_eq!(r.next_record().map_err(|e| e.to_string()), Ok(None));
}

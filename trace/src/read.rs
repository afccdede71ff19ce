//! The trace reader: streaming (memory use is one block, whatever the length of the trace) and
//! fast (about ten million events a second).
//!
//! It reads the file in large blocks and parses frames straight out of the block buffer, and it
//! decodes the two frames that make up nearly all of a trace (events and thread introductions)
//! with a hand-written decoder of the same bincode encoding. Whenever that decoder meets
//! anything it does not expect (a varint tag it does not handle, an unknown API, trailing
//! bytes) it hands the payload to bincode instead, so results and error messages are exactly
//! those of bincode. The tests hold it to the reference decoder (`reference.rs`, compiled for
//! tests only) on every truncation and every single-bit corruption of a trace, and the fuzzers
//! (`trace/tests/fuzz.rs`, `trace/fuzz`) on mutated traces.
//!
//! ```no_run
//! let mut r = isolate_trace::Reader::open("isolate-1234.trace")?;
//! println!("pid {}", r.header().pid);
//! while let Some(rec) = r.next_record()? {
//!     println!("{rec:?}");
//! }
//! if let Some(at) = r.truncated_at() {
//!     eprintln!("trace ends in a partial record at byte {at}");
//! }
//! # Ok::<(), isolate_trace::TraceError>(())
//! ```

use crate::api::Api;
use crate::error::{ErrorKind, TraceError, decode_words};
use crate::record::{Event, Header, Record};
use crate::wire::{CONFIG, FrameLength, WireRecord, decode_payload, plain_record};
use crate::{FORMAT_VERSION, MAGIC};
use std::fs::File;
use std::io::{ErrorKind as IoKind, Read};
use std::path::{Path, PathBuf};

/// Block size of the reads; a frame (at most [`MAX_FRAME`](crate::MAX_FRAME) bytes plus its prefix) always fits.
const BLOCK: usize = 1 << 20;
/// The buffer's size once grown: two blocks (a frame that starts late in one still fits).
const FULL: usize = 2 * BLOCK + 16;
/// Its size to start with: a short trace (or one only opened for its header) never needs more.
const FIRST: usize = 64 << 10;

/// Reads a trace record by record.
pub struct Reader<R> {
    inner: R,
    path: Option<PathBuf>,
    header: Header,
    version: u32,
    /// File offset of `buf[pos]`.
    offset: u64,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
    prev_seq: u64,
    prev_ts: u64,
    prev_ptr: u64,
    threads: Vec<u32>,
    truncated_at: Option<u64>,
    done: bool,
}

enum Frame {
    /// The payload is `buf[start..start + len]`.
    Full {
        start: usize,
        len: usize,
    },
    Eof,
    Truncated,
}

impl Reader<File> {
    /// Opens a trace file and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| TraceError {
            path: Some(path.to_owned()),
            offset: 0,
            kind: ErrorKind::Io(e),
        })?;
        Reader::new(file, Some(path.to_owned()))
    }
}

impl<R: Read> Reader<R> {
    /// Reads the header from `inner`; `path` is only used in messages.
    pub fn new(inner: R, path: Option<PathBuf>) -> Result<Self, TraceError> {
        let mut r = Reader {
            inner,
            path,
            header: Header::default(),
            version: 0,
            offset: 0,
            buf: vec![0; FIRST],
            pos: 0,
            end: 0,
            eof: false,
            prev_seq: 0,
            prev_ts: 0,
            prev_ptr: 0,
            threads: Vec::new(),
            truncated_at: None,
            done: false,
        };
        let avail = r.fill(12)?;
        let n = avail.min(8);
        if n < 8 && r.buf[..n] == MAGIC[..n] {
            // Nothing but the start of the magic: a trace cut as it began (a disk already full).
            return Err(r.err(n as u64, ErrorKind::TruncatedHeader));
        }
        if n < 8 || r.buf[..8] != MAGIC {
            let found = r.buf[..n].to_vec();
            return Err(r.err(0, ErrorKind::NotATrace { found }));
        }
        if avail < 12 {
            return Err(r.err(8, ErrorKind::TruncatedHeader));
        }
        let version = u32::from_le_bytes([r.buf[8], r.buf[9], r.buf[10], r.buf[11]]);
        if version > FORMAT_VERSION {
            return Err(r.err(
                8,
                ErrorKind::NewerVersion {
                    found: version,
                    supported: FORMAT_VERSION,
                },
            ));
        }
        if version == 0 {
            return Err(r.err(
                8,
                ErrorKind::Corrupt("format version 0 does not exist".into()),
            ));
        }
        r.version = version;
        r.pos = 12;
        r.offset = 12;
        let at = r.offset;
        let (start, len) = match r.read_frame()? {
            Frame::Full { start, len } => (start, len),
            Frame::Eof | Frame::Truncated => return Err(r.err(at, ErrorKind::TruncatedHeader)),
        };
        let (header, used): (Header, usize) =
            bincode::decode_from_slice(&r.buf[start..start + len], CONFIG).map_err(|e| {
                r.err(
                    at,
                    ErrorKind::Corrupt(format!("the header does not decode: {}", decode_words(&e))),
                )
            })?;
        if used != len {
            return Err(r.err(
                at,
                ErrorKind::Corrupt("header frame has trailing bytes".into()),
            ));
        }
        r.header = header;
        Ok(r)
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The format version the file was written with.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Where the file ended inside a record, once the reader has reached that point.
    pub fn truncated_at(&self) -> Option<u64> {
        self.truncated_at
    }

    fn err(&self, offset: u64, kind: ErrorKind) -> TraceError {
        TraceError {
            path: self.path.clone(),
            offset,
            kind,
        }
    }

    /// Makes at least `want` bytes available from `pos`, unless the input ends first.
    /// Returns the bytes available.
    fn fill(&mut self, want: usize) -> Result<usize, TraceError> {
        if self.end - self.pos >= want {
            return Ok(self.end - self.pos);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        while !self.eof && self.end < want.max(BLOCK) {
            if self.end == self.buf.len() {
                if self.buf.len() == FULL {
                    break;
                }
                let grown = (self.buf.len() * 4).min(FULL);
                self.buf.resize(grown, 0);
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.end += n;
                    if self.end >= want {
                        break;
                    }
                }
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => {
                    let at = self.offset + self.end as u64;
                    return Err(self.err(at, ErrorKind::Io(e)));
                }
            }
        }
        Ok(self.end - self.pos)
    }

    /// The next frame; on `Full`, `pos` and `offset` have moved past it.
    fn read_frame(&mut self) -> Result<Frame, TraceError> {
        let start = self.offset;
        // Fast path: the prefix and the payload are in the buffer already.
        let mut avail = self.end - self.pos;
        if avail < 5 {
            avail = self.fill(5)?;
        }
        let mut prefix = FrameLength::default();
        let mut i = 0;
        let len = loop {
            if i == avail {
                // The input ended inside the length prefix (or right at a frame boundary).
                self.offset += i as u64;
                self.pos += i;
                return Ok(if i == 0 { Frame::Eof } else { Frame::Truncated });
            }
            let b = self.buf[self.pos + i];
            i += 1;
            if let Some(len) = prefix.push(b).map_err(|k| self.err(start, k))? {
                break len;
            }
        };
        let len = len as usize;
        if avail < i + len {
            avail = self.fill(i + len)?;
        }
        if avail < i + len {
            self.offset += avail as u64;
            self.pos += avail;
            return Ok(Frame::Truncated);
        }
        let payload = self.pos + i;
        self.pos += i + len;
        self.offset += (i + len) as u64;
        Ok(Frame::Full {
            start: payload,
            len,
        })
    }

    /// The next record, `Ok(None)` at the end of the file (also after a partial last record:
    /// see [`Reader::truncated_at`]).
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        while !self.done {
            let at = self.offset;
            let frame = self.read_frame().inspect_err(|_| self.done = true)?;
            match frame {
                Frame::Eof => self.done = true,
                Frame::Truncated => {
                    self.truncated_at = Some(at);
                    self.done = true;
                }
                Frame::Full { start, len } => match self.decode(start, len) {
                    Ok(Some(rec)) => return Ok(Some(rec)),
                    Ok(None) => continue,
                    Err(what) => {
                        self.done = true;
                        return Err(self.err(at, ErrorKind::Corrupt(what)));
                    }
                },
            }
        }
        Ok(None)
    }

    fn decode(&mut self, start: usize, len: usize) -> Result<Option<Record>, String> {
        let payload = &self.buf[start..start + len];
        match payload[0] {
            0 => {
                if let Some(w) = fast_event(&payload[1..], false) {
                    return self.event(w).map(Some);
                }
            }
            8 => {
                if let Some(w) = fast_event(&payload[1..], true) {
                    return self.event(w).map(Some);
                }
            }
            1 => {
                if let Some((index, tid)) = fast_thread(&payload[1..]) {
                    return self.thread(index, tid).map(|()| None);
                }
            }
            _ => {}
        }
        self.slow(start, len)
    }

    /// The general path: bincode, as the reference decoder does it.
    #[cold]
    fn slow(&mut self, start: usize, len: usize) -> Result<Option<Record>, String> {
        let wire = decode_payload(&self.buf[start..start + len])?;
        let wire = match plain_record(wire) {
            Ok(rec) => return Ok(Some(rec)),
            Err(w) => w,
        };
        let (w, stack) = match wire {
            WireRecord::Thread { index, tid } => {
                self.thread(index, tid)?;
                return Ok(None);
            }
            WireRecord::StackedEvent(w, s) => (w, s),
            WireRecord::Event(w) => (w, 0),
            _ => unreachable!("plain_record leaves only events and threads"),
        };
        let x = w.extra.unwrap_or(crate::wire::WireExtra {
            pitch: 0,
            stream: 0,
            handle: 0,
            offset: 0,
            flags: 0,
        });
        self.event(FastEvent {
            seq_delta: w.seq_delta,
            ts_delta: w.ts_delta,
            thread: w.thread,
            device: w.device,
            api: w.api,
            result: w.result,
            duration_ns: w.duration_ns,
            ptr_delta: w.ptr_delta,
            size: w.size,
            extra: [x.pitch, x.stream, x.handle, x.offset, x.flags],
            stack,
        })
        .map(Some)
    }

    fn thread(&mut self, index: u32, tid: u32) -> Result<(), String> {
        if index as usize != self.threads.len() {
            return Err(format!(
                "thread index {index} out of order (expected {})",
                self.threads.len()
            ));
        }
        self.threads.push(tid);
        Ok(())
    }

    #[inline]
    fn event(&mut self, w: FastEvent) -> Result<Record, String> {
        let tid = *self
            .threads
            .get(w.thread as usize)
            .ok_or_else(|| format!("event names thread index {} never introduced", w.thread))?;
        self.prev_seq = self.prev_seq.wrapping_add(w.seq_delta as u64);
        self.prev_ts = self.prev_ts.wrapping_add(w.ts_delta as u64);
        self.prev_ptr = self.prev_ptr.wrapping_add(w.ptr_delta as u64);
        let [pitch, stream, handle, offset, flags] = w.extra;
        Ok(Record::Event(Event {
            seq: self.prev_seq,
            ts_ns: self.prev_ts,
            tid,
            device: w.device,
            api: w.api,
            result: w.result,
            duration_ns: w.duration_ns,
            ptr: self.prev_ptr,
            size: w.size,
            pitch,
            stream,
            handle,
            offset,
            flags,
            stack: w.stack,
        }))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

struct FastEvent {
    seq_delta: i64,
    ts_delta: i64,
    thread: u32,
    device: i32,
    api: Api,
    result: i32,
    duration_ns: u64,
    ptr_delta: i64,
    size: u64,
    extra: [u64; 5],
    stack: u32,
}

/// A cursor over a payload that gives up (returns `None`) on anything unusual.
struct Cur<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cur<'_> {
    #[inline(always)]
    fn byte(&mut self) -> Option<u8> {
        let v = *self.b.get(self.i)?;
        self.i += 1;
        Some(v)
    }

    #[inline(always)]
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let s = self.b.get(self.i..self.i + N)?;
        self.i += N;
        Some(s.try_into().unwrap_or([0; N]))
    }

    /// bincode's varint `u64`: one byte up to 250, else a tag (251/252/253) and 2/4/8 LE bytes.
    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0..=250 => Some(u64::from(b)),
            251 => Some(u64::from(u16::from_le_bytes(self.bytes()?))),
            252 => Some(u64::from(u32::from_le_bytes(self.bytes()?))),
            253 => Some(u64::from_le_bytes(self.bytes()?)),
            _ => None,
        }
    }

    #[inline(always)]
    fn u32(&mut self) -> Option<u32> {
        match self.byte()? {
            b @ 0..=250 => Some(u32::from(b)),
            251 => Some(u32::from(u16::from_le_bytes(self.bytes()?))),
            252 => Some(u32::from_le_bytes(self.bytes()?)),
            _ => None,
        }
    }

    #[inline(always)]
    fn i64(&mut self) -> Option<i64> {
        let n = self.u64()?;
        Some((n >> 1) as i64 ^ -((n & 1) as i64))
    }

    #[inline(always)]
    fn i32(&mut self) -> Option<i32> {
        let n = self.u32()?;
        Some((n >> 1) as i32 ^ -((n & 1) as i32))
    }
}

/// Decodes a `WireRecord::Event` body (after its variant byte), or `None` to let bincode try.
#[inline]
fn fast_event(b: &[u8], stacked: bool) -> Option<FastEvent> {
    let mut c = Cur { b, i: 0 };
    let seq_delta = c.i64()?;
    let ts_delta = c.i64()?;
    let thread = c.u32()?;
    let device = c.i32()?;
    let api = *Api::ALL.get(c.u32()? as usize)?;
    let result = c.i32()?;
    let duration_ns = c.u64()?;
    let ptr_delta = c.i64()?;
    let size = c.u64()?;
    let extra = match c.byte()? {
        0 => [0; 5],
        1 => [c.u64()?, c.u64()?, c.u64()?, c.u64()?, c.u64()?],
        _ => return None,
    };
    let stack = if stacked { c.u32()? } else { 0 };
    if c.i != b.len() {
        return None;
    }
    Some(FastEvent {
        seq_delta,
        ts_delta,
        thread,
        device,
        api,
        result,
        duration_ns,
        ptr_delta,
        size,
        extra,
        stack,
    })
}

/// Decodes a `WireRecord::Thread` body, or `None` to let bincode try.
fn fast_thread(b: &[u8]) -> Option<(u32, u32)> {
    let mut c = Cur { b, i: 0 };
    let index = c.u32()?;
    let tid = c.u32()?;
    (c.i == b.len()).then_some((index, tid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::*;
    use crate::wire::Encoder;

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        Encoder::preamble(
            &Header {
                pid: 3,
                argv: vec!["a".into()],
                ..Header::default()
            },
            &mut out,
        );
        let mut enc = Encoder::new();
        for i in 0..200u64 {
            let ev = Event {
                seq: i * 3,
                ts_ns: 1_000_000_000 + i * 977,
                tid: 7 + (i % 5) as u32,
                device: (i % 3) as i32 - 1,
                api: Api::ALL[(i as usize * 7) % Api::ALL.len()],
                result: if i % 17 == 0 { -2 } else { 0 },
                duration_ns: i * i * 1000,
                ptr: if i % 2 == 0 {
                    0x7f00_0000_0000 + i * 4096
                } else {
                    0x1000 * i
                },
                size: 1 << (i % 40),
                pitch: if i % 9 == 0 { 512 } else { 0 },
                stream: if i % 4 == 0 { u64::MAX - i } else { 0 },
                handle: i % 11,
                offset: 0,
                flags: i % 2,
                stack: if i % 3 == 0 { 0 } else { (i % 7) as u32 },
            };
            if i == 1 {
                enc.encode(
                    &Record::Module(Module {
                        id: 1,
                        path: "/usr/lib/libx.so".into(),
                        base: 0x7f00_0000_0000,
                        start: 0x7f00_0000_1000,
                        end: 0x7f00_0010_0000,
                        build_id: vec![0xab; 20],
                    }),
                    &mut out,
                );
                enc.encode(
                    &Record::PyCode(PyCode {
                        id: 1,
                        file: "train.py".into(),
                        name: "step".into(),
                        first_line: 10,
                    }),
                    &mut out,
                );
                for id in 1..7 {
                    enc.encode(
                        &Record::Stack(Stack {
                            id,
                            frames: vec![
                                crate::record::Frame::Native(0x7f00_0000_2000 + id as u64),
                                crate::record::Frame::Python { code: 1, line: 12 },
                            ],
                            truncated: id == 3,
                        }),
                        &mut out,
                    );
                }
                enc.encode(&Record::StackOf(StackOf { seq: 1, stack: 2 }), &mut out);
            }
            enc.encode(&Record::Event(ev), &mut out);
            if i % 50 == 0 {
                enc.encode(
                    &Record::Note(Note {
                        seq: i,
                        ts_ns: i,
                        kind: NoteKind::Info,
                        ptr: 1,
                        size: 2,
                        value: 3,
                        text: "x".repeat(i as usize),
                    }),
                    &mut out,
                );
            }
        }
        enc.encode(
            &Record::End(End {
                ts_ns: 5,
                reason: EndReason::Signal(11),
                stats: Stats::default(),
            }),
            &mut out,
        );
        out
    }

    /// Everything a reader yields: records, then the error or the truncation point.
    fn drain<I: Iterator<Item = Result<Record, TraceError>>>(
        it: &mut I,
    ) -> (Vec<Record>, Option<String>) {
        let mut recs = Vec::new();
        for r in it.by_ref().take(100_000) {
            match r {
                Ok(r) => recs.push(r),
                Err(e) => return (recs, Some(e.to_string())),
            }
        }
        (recs, None)
    }

    fn same(bytes: &[u8]) {
        let slow = crate::reference::Reader::new(bytes, None);
        let fast = Reader::new(bytes, None);
        match (slow, fast) {
            (Ok(mut s), Ok(mut f)) => {
                let a = drain(&mut s);
                let b = drain(&mut f);
                assert_eq!(a, b);
                assert_eq!(s.truncated_at(), f.truncated_at());
                if a.1.is_none() {
                    assert_eq!(s.offset(), f.offset());
                }
            }
            (Err(s), Err(f)) => assert_eq!(s.to_string(), f.to_string()),
            (s, f) => panic!("readers disagree: {:?} vs {:?}", s.is_ok(), f.is_ok()),
        }
    }

    #[test]
    fn agrees_with_reader_on_truncations() {
        let bytes = sample();
        for cut in 0..bytes.len() {
            same(&bytes[..cut]);
        }
        same(&bytes);
    }

    #[test]
    fn agrees_with_reader_on_bit_flips() {
        let bytes = sample();
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x04, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                same(&b);
            }
        }
    }

    /// Reads one byte at a time, to exercise the refills.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0[0];
            self.0 = &self.0[1..];
            Ok(1)
        }
    }

    #[test]
    fn small_reads() {
        let bytes = sample();
        let mut s = crate::reference::Reader::new(&bytes[..], None).unwrap();
        let mut f = Reader::new(Trickle(&bytes), None).unwrap();
        assert_eq!(drain(&mut s), drain(&mut f));
    }

    #[test]
    fn big_frames_across_blocks() {
        let mut out = Vec::new();
        Encoder::preamble(&Header::default(), &mut out);
        let mut enc = Encoder::new();
        let mut want = Vec::new();
        for i in 0..40u64 {
            let rec = Record::Note(Note {
                seq: i,
                ts_ns: 0,
                kind: NoteKind::Info,
                ptr: 0,
                size: 0,
                value: 0,
                text: "y".repeat(100_000 + i as usize * 1000),
            });
            enc.encode(&rec, &mut out);
            want.push(rec);
        }
        let mut f = Reader::new(&out[..], None).unwrap();
        assert_eq!(drain(&mut f), (want, None));
    }
}

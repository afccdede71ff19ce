//! The bytes on disk. See `docs/trace-format.md` for the same thing in prose.
//!
//! Events are stored relative to the event before them (sequence number, timestamp and address
//! as signed differences, the thread as an index into a table built as the trace goes), so that
//! a typical event takes about 20 bytes. [`Encoder`] and the readers carry that state.

use crate::api::Api;
use crate::record::*;
use bincode::{Decode, Encode};
use std::collections::HashMap;

/// The bincode configuration of every frame: little endian, variable-length integers, and a
/// limit so that a corrupt length inside a frame cannot make the decoder allocate more than a frame.
pub(crate) const CONFIG: bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<{ 2 * crate::MAX_FRAME as usize }>,
> = bincode::config::standard().with_limit::<{ 2 * crate::MAX_FRAME as usize }>();

/// An event as stored: deltas against the previous event of the trace.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct WireEvent {
    pub seq_delta: i64,
    pub ts_delta: i64,
    pub thread: u32,
    pub device: i32,
    pub api: Api,
    pub result: i32,
    pub duration_ns: u64,
    pub ptr_delta: i64,
    pub size: u64,
    pub extra: Option<WireExtra>,
}

/// The fields most events leave at zero.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct WireExtra {
    pub pitch: u64,
    pub stream: u64,
    pub handle: u64,
    pub offset: u64,
    pub flags: u64,
}

/// A frame's payload. The variant index is the first varint of every payload.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) enum WireRecord {
    Event(WireEvent),
    /// Introduces thread index `index` for Linux thread id `tid`.
    Thread {
        index: u32,
        tid: u32,
    },
    Violation(V1Violation),
    StaleLaunch(V1StaleLaunch),
    Note(Note),
    Stats(Stats),
    End(End),
    StaleValue(V1StaleLaunch),
    // Format version 2 (appended, so every version-1 frame decodes as before).
    /// An event with a call stack (events without one stay `Event`).
    StackedEvent(WireEvent, u32),
    Module(Module),
    Stack(Stack),
    PyCode(PyCode),
    StackOf(StackOf),
    // Format version 3 (appended): the records about a freed allocation carry the stacks of its
    // allocation and free. The variants above keep their version-1 layout, so older traces read.
    ViolationStacks(Violation),
    StaleLaunchStacks(StaleLaunch),
    StaleValueStacks(StaleLaunch),
    // Format version 4 (appended): freed while still in use on another stream.
    FreedInUse(Box<FreedInUse>),
}

/// A [`Violation`] as versions 1 and 2 store it: no stack ids.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct V1Violation {
    pub seq: u64,
    pub ts_ns: u64,
    pub device: i32,
    pub ptr: u64,
    pub size: u64,
    pub first_offset: u64,
    pub changed_bytes: u64,
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub free_ts_ns: u64,
    pub free_api: Api,
}

/// A [`StaleLaunch`] as versions 1 and 2 store it: no stack ids.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct V1StaleLaunch {
    pub seq: u64,
    pub ts_ns: u64,
    pub tid: u32,
    pub device: i32,
    pub api: Api,
    pub kernel: String,
    pub param_index: u32,
    pub param_offset: u32,
    pub ptr: u64,
    pub alloc_ptr: u64,
    pub alloc_size: u64,
    pub alloc_seq: u64,
    pub free_seq: u64,
    pub free_ts_ns: u64,
}

impl From<V1Violation> for Violation {
    fn from(v: V1Violation) -> Self {
        Violation {
            seq: v.seq,
            ts_ns: v.ts_ns,
            device: v.device,
            ptr: v.ptr,
            size: v.size,
            first_offset: v.first_offset,
            changed_bytes: v.changed_bytes,
            alloc_seq: v.alloc_seq,
            free_seq: v.free_seq,
            free_ts_ns: v.free_ts_ns,
            free_api: v.free_api,
            alloc_stack: 0,
            free_stack: 0,
        }
    }
}

impl From<V1StaleLaunch> for StaleLaunch {
    fn from(s: V1StaleLaunch) -> Self {
        StaleLaunch {
            seq: s.seq,
            ts_ns: s.ts_ns,
            tid: s.tid,
            device: s.device,
            api: s.api,
            kernel: s.kernel,
            param_index: s.param_index,
            param_offset: s.param_offset,
            ptr: s.ptr,
            alloc_ptr: s.alloc_ptr,
            alloc_size: s.alloc_size,
            alloc_seq: s.alloc_seq,
            free_seq: s.free_seq,
            free_ts_ns: s.free_ts_ns,
            alloc_stack: 0,
            free_stack: 0,
        }
    }
}

/// The record of a frame that is neither an event nor a thread introduction (`None` for those:
/// they need the reader's delta state).
pub(crate) fn plain_record(wire: WireRecord) -> Result<Record, WireRecord> {
    Ok(match wire {
        w @ (WireRecord::Event(_) | WireRecord::StackedEvent(..) | WireRecord::Thread { .. }) => {
            return Err(w);
        }
        WireRecord::Violation(v) => Record::Violation(v.into()),
        WireRecord::StaleLaunch(s) => Record::StaleLaunch(s.into()),
        WireRecord::Note(n) => Record::Note(n),
        WireRecord::Stats(s) => Record::Stats(s),
        WireRecord::End(e) => Record::End(e),
        WireRecord::StaleValue(s) => Record::StaleValue(s.into()),
        WireRecord::Module(m) => Record::Module(m),
        WireRecord::Stack(s) => Record::Stack(s),
        WireRecord::PyCode(c) => Record::PyCode(c),
        WireRecord::StackOf(s) => Record::StackOf(s),
        WireRecord::ViolationStacks(v) => Record::Violation(v),
        WireRecord::StaleLaunchStacks(s) => Record::StaleLaunch(s),
        WireRecord::StaleValueStacks(s) => Record::StaleValue(s),
        WireRecord::FreedInUse(f) => Record::FreedInUse(f),
    })
}

/// Delta state shared by the encoder and the decoder.
#[derive(Default, Clone, Debug)]
struct Prev {
    seq: u64,
    ts: u64,
    ptr: u64,
}

/// Turns records into frames. One per trace file.
#[derive(Default)]
pub struct Encoder {
    prev: Prev,
    threads: HashMap<u32, u32>,
}

/// Appends the LEB128 frame length and the payload.
fn push_frame<T: Encode>(out: &mut Vec<u8>, payload: &T) {
    let start = out.len();
    // Reserve the longest length prefix (5 bytes), encode, then move the payload down.
    out.extend_from_slice(&[0; 5]);
    bincode::encode_into_std_write(payload, out, CONFIG).expect("writing to a Vec cannot fail");
    let len = out.len() - start - 5;
    let mut prefix = [0u8; 5];
    let n = leb128(len as u32, &mut prefix);
    out.copy_within(start + 5.., start + n);
    out.truncate(start + n + len);
    out[start..start + n].copy_from_slice(&prefix[..n]);
}

/// Decodes a frame's LEB128 length one byte at a time, shared by both readers so they accept
/// and refuse exactly the same prefixes.
#[derive(Default)]
pub(crate) struct FrameLength {
    len: u64,
    shift: u32,
}

impl FrameLength {
    /// Takes the next prefix byte: `Ok(Some(len))` once the prefix is complete and the length
    /// valid (1 to `MAX_FRAME`), `Ok(None)` while more bytes are needed.
    pub(crate) fn push(&mut self, b: u8) -> Result<Option<u64>, crate::ErrorKind> {
        use crate::{ErrorKind, MAX_FRAME};
        self.len |= u64::from(b & 0x7f) << self.shift;
        if b & 0x80 != 0 {
            self.shift += 7;
            if self.shift > 28 {
                return Err(ErrorKind::Corrupt(
                    "frame length prefix longer than 5 bytes".into(),
                ));
            }
            return Ok(None);
        }
        match self.len {
            0 => Err(ErrorKind::Corrupt("empty frame".into())),
            len if len > MAX_FRAME => Err(ErrorKind::FrameTooLong {
                len,
                max: MAX_FRAME,
            }),
            len => Ok(Some(len)),
        }
    }
}

pub(crate) fn leb128(mut v: u32, buf: &mut [u8; 5]) -> usize {
    let mut i = 0;
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            buf[i] = byte;
            return i + 1;
        }
        buf[i] = byte | 0x80;
        i += 1;
    }
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The magic, the version and the header frame: the first bytes of every trace.
    pub fn preamble(header: &Header, out: &mut Vec<u8>) {
        out.extend_from_slice(&crate::MAGIC);
        out.extend_from_slice(&crate::FORMAT_VERSION.to_le_bytes());
        push_frame(out, header);
    }

    /// Appends the frames for `record` (an event may be preceded by a thread frame).
    pub fn encode(&mut self, record: &Record, out: &mut Vec<u8>) {
        let wire = match record {
            Record::Event(e) => {
                let next = self.threads.len() as u32;
                let thread = *self.threads.entry(e.tid).or_insert_with(|| {
                    push_frame(
                        out,
                        &WireRecord::Thread {
                            index: next,
                            tid: e.tid,
                        },
                    );
                    next
                });
                let extra = if e.pitch | e.stream | e.handle | e.offset | e.flags != 0 {
                    Some(WireExtra {
                        pitch: e.pitch,
                        stream: e.stream,
                        handle: e.handle,
                        offset: e.offset,
                        flags: e.flags,
                    })
                } else {
                    None
                };
                let w = WireEvent {
                    seq_delta: e.seq.wrapping_sub(self.prev.seq) as i64,
                    ts_delta: e.ts_ns.wrapping_sub(self.prev.ts) as i64,
                    thread,
                    device: e.device,
                    api: e.api,
                    result: e.result,
                    duration_ns: e.duration_ns,
                    ptr_delta: e.ptr.wrapping_sub(self.prev.ptr) as i64,
                    size: e.size,
                    extra,
                };
                self.prev = Prev {
                    seq: e.seq,
                    ts: e.ts_ns,
                    ptr: e.ptr,
                };
                if e.stack != 0 {
                    WireRecord::StackedEvent(w, e.stack)
                } else {
                    WireRecord::Event(w)
                }
            }
            Record::Violation(v) => WireRecord::ViolationStacks(v.clone()),
            Record::StaleLaunch(s) => WireRecord::StaleLaunchStacks(s.clone()),
            Record::Note(n) => WireRecord::Note(n.clone()),
            Record::Stats(s) => WireRecord::Stats(s.clone()),
            Record::End(e) => WireRecord::End(e.clone()),
            Record::StaleValue(s) => WireRecord::StaleValueStacks(s.clone()),
            Record::Module(m) => WireRecord::Module(m.clone()),
            Record::Stack(s) => WireRecord::Stack(s.clone()),
            Record::PyCode(c) => WireRecord::PyCode(c.clone()),
            Record::StackOf(s) => WireRecord::StackOf(*s),
            Record::FreedInUse(f) => WireRecord::FreedInUse(f.clone()),
        };
        push_frame(out, &wire);
    }
}

/// Turns frame payloads back into records: the reference decoder's half (the reader decodes
/// on its own, `read.rs`).
#[cfg(any(test, feature = "reference"))]
#[derive(Default)]
pub struct Decoder {
    prev: Prev,
    threads: Vec<u32>,
}

/// One frame's payload decoded by bincode, which must use all of it: the general path of both
/// decoders (the reader's slow path, the reference decoder).
pub(crate) fn decode_payload(payload: &[u8]) -> Result<WireRecord, String> {
    let (wire, used): (WireRecord, usize) =
        bincode::decode_from_slice(payload, CONFIG).map_err(|e| {
            format!(
                "the record does not decode: {}",
                crate::error::decode_words(&e)
            )
        })?;
    if used != payload.len() {
        return Err(format!(
            "record is {} bytes but its frame says {}",
            used,
            payload.len()
        ));
    }
    Ok(wire)
}

#[cfg(any(test, feature = "reference"))]
impl Decoder {
    /// Decodes one payload. `Ok(None)` for frames that only update the decoder (threads).
    pub(crate) fn decode(&mut self, payload: &[u8]) -> Result<Option<Record>, String> {
        let wire = decode_payload(payload)?;
        Ok(Some(match plain_record(wire) {
            Ok(rec) => rec,
            Err(WireRecord::Thread { index, tid }) => {
                if index as usize != self.threads.len() {
                    return Err(format!(
                        "thread index {index} out of order (expected {})",
                        self.threads.len()
                    ));
                }
                self.threads.push(tid);
                return Ok(None);
            }
            Err(WireRecord::StackedEvent(w, stack)) => self.event(w, stack)?,
            Err(WireRecord::Event(w)) => self.event(w, 0)?,
            Err(_) => unreachable!("plain_record leaves only events and threads"),
        }))
    }

    fn event(&mut self, w: WireEvent, stack: u32) -> Result<Record, String> {
        let tid = *self
            .threads
            .get(w.thread as usize)
            .ok_or_else(|| format!("event names thread index {} never introduced", w.thread))?;
        let seq = self.prev.seq.wrapping_add(w.seq_delta as u64);
        let ts = self.prev.ts.wrapping_add(w.ts_delta as u64);
        let ptr = self.prev.ptr.wrapping_add(w.ptr_delta as u64);
        self.prev = Prev { seq, ts, ptr };
        let x = w.extra.unwrap_or(WireExtra {
            pitch: 0,
            stream: 0,
            handle: 0,
            offset: 0,
            flags: 0,
        });
        Ok(Record::Event(Event {
            seq,
            ts_ns: ts,
            tid,
            device: w.device,
            api: w.api,
            result: w.result,
            duration_ns: w.duration_ns,
            ptr,
            size: w.size,
            pitch: x.pitch,
            stream: x.stream,
            handle: x.handle,
            offset: x.offset,
            flags: x.flags,
            stack,
        }))
    }
}

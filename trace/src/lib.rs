//! # isolate-trace
//!
//! The on-disk format shared by `libisolate.so` (which writes it) and the `isolate` analyzer
//! (which reads it). A trace is the 8-byte magic `ISOTRACE`, a little-endian `u32` format version,
//! then frames: a LEB128 length followed by a bincode payload (standard configuration). The first
//! frame is the [`Header`]; every later one a record. `docs/trace-format.md` gives every byte.
//!
//! ```
//! use isolate_trace::{Api, Encoder, Event, Header, Reader, Record};
//! let mut bytes = Vec::new();
//! Encoder::preamble(&Header { pid: 7, ..Header::default() }, &mut bytes);
//! let mut enc = Encoder::new();
//! let ev = Event { seq: 0, api: Api::CudaMalloc, ptr: 0x7f00_0000_0000, size: 256, ..Event::default() };
//! enc.encode(&Record::Event(ev), &mut bytes);
//! let mut r = Reader::new(&bytes[..], None).unwrap();
//! assert_eq!(r.header().pid, 7);
//! assert_eq!(r.next_record().unwrap(), Some(Record::Event(ev)));
//! assert_eq!(r.next_record().unwrap(), None);
//! ```

mod api;
pub mod config;
mod error;
mod read;
mod record;
#[cfg(any(test, feature = "reference"))]
#[doc(hidden)]
pub mod reference;
mod settings;
mod wire;

pub use api::{Api, Kind, Layout, Memory, Order, Retained, Source};
pub use error::{ErrorKind, TraceError, io_short};
pub use read::Reader;
pub use record::*;
pub use settings::{Owner, SETTINGS, Setting, parse_size, setting};
pub use wire::Encoder;

/// The host name as it goes into a trace's file name (`%h` of `ISOLATE_TRACE`, expanded by the
/// library and matched by `isolate run`, both with this): one path component, never `.` or
/// `..`. Bytes other than ASCII letters, digits, `-`, `.` and `_` become `_` (a name set to
/// `../../x` would otherwise put the trace outside its directory); a name of dots only becomes
/// underscores. Every host name RFC 1123 allows is unchanged.
///
/// ```
/// use isolate_trace::host_in_path;
/// assert_eq!(host_in_path("gpu-7.cluster"), "gpu-7.cluster");
/// assert_eq!(host_in_path("../../x"), ".._.._x");
/// assert_eq!(host_in_path(".."), "__");
/// assert_eq!(host_in_path(""), "_");
/// ```
pub fn host_in_path(host: &str) -> String {
    let s: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.bytes().all(|b| b == b'.') {
        "_".repeat(s.len().max(1))
    } else {
        s
    }
}

/// The first eight bytes of every trace.
pub const MAGIC: [u8; 8] = *b"ISOTRACE";
/// The format version this crate writes and the newest it reads (every older one too).
/// 3: [`Violation`] and [`StaleLaunch`] carry the allocation's and the free's stacks.
/// 4: [`FreedInUse`] (freed while still in use on another stream), a record of its own.
pub const FORMAT_VERSION: u32 = 4;
/// The name of a CUDA error code that means the device faulted (a kernel touched memory it
/// may not, or died); `None` for every other code. Driver and runtime share these numbers.
pub fn device_fault_name(code: u64) -> Option<&'static str> {
    Some(match code {
        700 => "illegal address",
        714 => "hardware stack error",
        715 => "illegal instruction",
        716 => "misaligned address",
        717 => "invalid address space",
        718 => "invalid program counter",
        719 => "launch failure",
        _ => return None,
    })
}

/// No frame is longer than this; a longer length field means corruption.
pub const MAX_FRAME: u64 = 1 << 20;

#[cfg(test)]
mod tests;

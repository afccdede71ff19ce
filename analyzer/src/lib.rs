//! # isolate-analyzer
//!
//! Reads the traces that `libisolate.so` writes and answers questions about them: what a process
//! allocated and never freed ([`summary`]), which allocations were handed memory that another had
//! just given back ([`graph`]), everything that ever lived at one address ([`who`]), how two runs
//! differ ([`diff`]) and whether a run stays within a baseline's budget ([`check`]). [`report`]
//! renders one self-contained HTML page and [`export`] writes the timeline for Perfetto.
//! [`finding`] is the one model of a finding that all of them show, and the rule for which
//! count. [`stacks`] symbolises the call stacks of format-version-2 traces offline, and [`sites`]
//! ranks allocation sites.
//!
//! Every analysis streams over the trace once: memory is bounded by what is live at once and a
//! few fixed windows (the last frees remembered, the reordering window, capped lists), not by the
//! length of the trace or the number of allocations; the aliasing graph streams its nodes, edges
//! and findings out as it goes. Byte totals saturate at `u64::MAX` rather than wrap. The
//! `isolate` binary is a thin layer over this crate; `isolate run`'s process supervision
//! (signals, the command's descendants) is the `isolate-run` crate, which only the binary uses.
//!
//! ```
//! use isolate_trace::{Api, Encoder, Event, Header, Record};
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("t.trace");
//! let mut bytes = Vec::new();
//! Encoder::preamble(&Header { pid: 7, ..Header::default() }, &mut bytes);
//! let mut enc = Encoder::new();
//! let ev = Event { seq: 0, api: Api::CudaMalloc, ptr: 0x7f00_0000_0000, size: 256, ..Event::default() };
//! enc.encode(&Record::Event(ev), &mut bytes);
//! std::fs::write(&path, &bytes).unwrap();
//!
//! let s = isolate_analyzer::summary::summarize(&[&path], &mut isolate_analyzer::NoProgress).unwrap();
//! assert_eq!(s.live_at_end.bytes, 256);
//! assert_eq!(s.complete, false); // no End record: the process did not exit cleanly
//! ```

pub mod check;
pub mod diff;
mod error;
pub mod export;
pub mod finding;
pub mod graph;
pub mod growth;
pub mod order;
pub mod output;
pub mod regions;
pub mod report;
pub mod sites;
mod source;
pub mod stacks;
pub mod summary;
pub mod track;
pub mod util;
pub mod who;
pub mod words;

pub use error::{Error, ErrorKind};
pub use source::{NoProgress, Progress, TraceInfo, analyze, file_label, read_records};
pub use track::{Category, EndHow, Ended, Invalid, InvalidKind, Live, Node, Observer, Tracker};

//! Opening traces and driving an [`Observer`] over them.

use crate::Error;
use crate::order::{Order, Reorder};
use crate::track::{Observer, Tracker};
use isolate_trace::{Header, Reader, Record};
use std::path::{Path, PathBuf};

/// Told how far the reading of each trace has got (the binary draws a progress bar with it).
#[allow(unused_variables)]
pub trait Progress {
    fn begin(&mut self, path: &Path, total_bytes: u64) {}
    fn advance(&mut self, bytes_read: u64) {}
    fn end(&mut self) {}
}

/// Reports nothing.
pub struct NoProgress;
impl Progress for NoProgress {}

/// What is known about a trace once it has been read.
#[derive(Clone, Debug)]
pub struct TraceInfo {
    /// The file's name without its directories (outputs stay the same wherever the file lies).
    pub file: String,
    pub path: PathBuf,
    pub header: Header,
    pub format_version: u32,
    /// Bytes read.
    pub bytes: u64,
    /// Where the file ends inside a record, when it does.
    pub truncated_at: Option<u64>,
    /// The End record, when the trace has one.
    pub end: Option<isolate_trace::End>,
    /// How far the file's order was from sequence order (the analyses saw sequence order).
    pub order: Order,
}

impl TraceInfo {
    /// True when the trace was closed properly (it has an End record).
    pub fn complete(&self) -> bool {
        self.end.is_some()
    }
}

/// The file name of `path`, for outputs.
pub fn file_label(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// How many records go by between progress reports.
const PROGRESS_EVERY: u32 = 1 << 16;

/// Where [`drive`] sends a trace.
trait Sink {
    fn header(&mut self, h: &Header);
    fn record(&mut self, rec: &Record);
}

struct FnSink<F>(F);
impl<F: FnMut(&Record)> Sink for FnSink<F> {
    fn header(&mut self, _: &Header) {}
    fn record(&mut self, rec: &Record) {
        (self.0)(rec)
    }
}

struct ModelSink<'a, O> {
    tracker: Tracker,
    obs: &'a mut O,
}
impl<O: Observer> Sink for ModelSink<'_, O> {
    fn header(&mut self, h: &Header) {
        self.obs.begin(h);
    }
    #[inline]
    fn record(&mut self, rec: &Record) {
        self.tracker.record(rec, self.obs);
    }
}

fn drive(
    path: &Path,
    progress: &mut dyn Progress,
    sink: &mut impl Sink,
) -> Result<TraceInfo, Error> {
    let mut r = Reader::open(path)?;
    let total = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    progress.begin(path, total);
    sink.header(r.header());
    let mut end = None;
    let mut n = 0u32;
    // Analyses see records in sequence order, whatever the file's order (see `order`).
    let mut reorder = Reorder::new();
    let mut emit = |rec: &Record| sink.record(rec);
    let result = loop {
        match r.next_record() {
            Ok(Some(rec)) => {
                if let Record::End(e) = &rec {
                    end = Some(e.clone());
                }
                reorder.push(rec, &mut emit);
                n += 1;
                if n == PROGRESS_EVERY {
                    n = 0;
                    progress.advance(r.offset());
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    // What was held back goes on even when the file ends badly: the error is reported with
    // everything before it analysed.
    reorder.finish(&mut emit);
    progress.end();
    result?;
    Ok(TraceInfo {
        file: file_label(path),
        path: path.to_owned(),
        header: r.header().clone(),
        format_version: r.version(),
        bytes: r.offset(),
        truncated_at: r.truncated_at(),
        end,
        order: reorder.order,
    })
}

/// Calls `f` with every record of the trace at `path`.
pub fn read_records<F: FnMut(&Record)>(
    path: &Path,
    progress: &mut dyn Progress,
    f: F,
) -> Result<TraceInfo, Error> {
    drive(path, progress, &mut FnSink(f))
}

/// Runs the memory model over the trace at `path`, telling `obs` everything.
pub fn analyze<O: Observer>(
    path: &Path,
    progress: &mut dyn Progress,
    obs: &mut O,
) -> Result<TraceInfo, Error> {
    let mut sink = ModelSink {
        tracker: Tracker::new(),
        obs,
    };
    let info = drive(path, progress, &mut sink)?;
    sink.tracker.finish(sink.obs);
    Ok(info)
}

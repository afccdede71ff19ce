//! `isolate export --format parquet -o DIR TRACE…`: the traces as Parquet tables, for DuckDB,
//! Polars or Spark to read a directory of thousands of traces (docs/fleet.md has the schema
//! and queries).
//!
//! **Layout.** One file per table per trace: `DIR/<table>/<trace>.parquet`, for the tables
//! [`TABLES`]. `<trace>` is the trace's id, `<host>-<pid>-<start_unix_ns>` from its header (the
//! host name with anything but `[A-Za-z0-9._-]` made `_`): unique across a fleet, and the same
//! each time one trace is exported, so exporting it again replaces its files and exporting
//! other traces into the same directory adds files beside them (nothing is rewritten). Every
//! row of every table starts with the trace's identity: `trace`, `host`, `pid`, `rank`, so a
//! glob of the files is the whole table (`read_parquet('DIR/allocations/*.parquet')`), with
//! no partition discovery (hive-style `rank=3/` directories would put the values in paths,
//! read back as strings or guessed types, and a trace without a rank would need a made-up
//! value).
//!
//! **Atomic.** Each file is written under a hidden temporary name in its table's directory
//! (`.<trace>.parquet.XXXXXX`, which `*.parquet` does not match), synced, and renamed into
//! place once every table of the trace is complete; the `traces` file last, so a trace listed
//! in `traces` has all its tables. An error leaves no partial file.
//!
//! **Memory.** Rows are written in row groups of [`ROW_GROUP`] rows: memory is bounded by
//! that, what the analysis keeps (what is live, the summary's capped lists) and the distinct
//! stacks, whatever the trace's length.
//!
//! Written with the `parquet` crate (the Apache Arrow project's Rust implementation) without
//! Arrow: its column writers take plain vectors, which is all a row builder needs.

use crate::Error;
use crate::finding::{self, Fault, Finding, Role};
use crate::regions::{Closed, Regions, UserNote, user_note};
use crate::source::{Progress, TraceInfo, analyze};
use crate::stacks::{self, StackTable};
use crate::summary::Summarizer;
use crate::track::{EndHow, Ended, Live, Node, Observer};
use ::parquet::basic::Compression;
use ::parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type};
use ::parquet::errors::ParquetError;
use ::parquet::file::properties::WriterProperties;
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::types::Type;
use isolate_trace::{Header, Record};
use rustc_hash::FxHashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The tables, in the order they are documented (docs/fleet.md).
pub const TABLES: [&str; 6] = [
    "traces",
    "allocations",
    "frees",
    "findings",
    "regions",
    "stacks",
];

/// Rows a row group holds (the last one of a file fewer).
pub const ROW_GROUP: usize = 1 << 17;

/// A column's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    I64,
    I32,
    Bool,
    Str,
}

/// A column: its name, type, and whether it may be null.
#[derive(Clone, Copy, Debug)]
struct Col(&'static str, Ty, bool);

const fn req(name: &'static str, ty: Ty) -> Col {
    Col(name, ty, false)
}

const fn opt(name: &'static str, ty: Ty) -> Col {
    Col(name, ty, true)
}

use Ty::{Bool, I32, I64, Str};

/// The columns every table starts with: which trace, host, process and rank a row is of.
const IDENTITY: [Col; 4] = [
    req("trace", Str),
    req("host", Str),
    req("pid", I64),
    opt("rank", I32),
];

const TRACES: &[Col] = &[
    req("file", Str),
    req("exe", Str),
    req("argv", Str),
    req("ppid", I64),
    opt("local_rank", I32),
    opt("world_size", I32),
    req("mode", Str),
    req("library_version", Str),
    req("format_version", I32),
    req("start_unix_ns", I64),
    req("start_mono_ns", I64),
    opt("end_reason", Str),
    opt("truncated_at", I64),
    req("events", I64),
    req("allocations", I64),
    req("frees", I64),
    req("peak_live_bytes", I64),
    req("live_at_end_count", I64),
    req("live_at_end_bytes", I64),
    req("findings", I64),
    req("stacks", I64),
];

const ALLOCATIONS: &[Col] = &[
    req("seq", I64),
    req("ts_ns", I64),
    req("tid", I64),
    req("device", I32),
    req("api", Str),
    req("category", Str),
    req("device_memory", Bool),
    req("ptr", I64),
    req("size", I64),
    req("stream", I64),
    req("handle", I64),
    opt("stack", I64),
    opt("site", Str),
    opt("place", Str),
    req("live_bytes", I64),
];

const FREES: &[Col] = &[
    req("seq", I64),
    req("ts_ns", I64),
    req("tid", I64),
    req("device", I32),
    req("api", Str),
    req("how", Str),
    req("alloc_seq", I64),
    req("category", Str),
    req("device_memory", Bool),
    req("ptr", I64),
    req("size", I64),
    opt("stack", I64),
    opt("site", Str),
    opt("place", Str),
    req("live_bytes", I64),
];

const FINDINGS: &[Col] = &[
    req("kind", Str),
    req("counts", Bool),
    req("seq", I64),
    req("ts_ns", I64),
    opt("tid", I64),
    opt("device", I32),
    opt("api", Str),
    opt("ptr", I64),
    opt("size", I64),
    opt("alloc_seq", I64),
    opt("free_seq", I64),
    opt("kernel", Str),
    opt("code", I64),
    opt("call_at", Str),
    opt("allocated_at", Str),
    opt("freed_at", Str),
    opt("first_freed_at", Str),
];

const REGIONS: &[Col] = &[
    req("kind", Str),
    req("name", Str),
    req("ordinal", I64),
    req("tid", I64),
    opt("depth", I32),
    req("start_ns", I64),
    req("end_ns", I64),
    req("duration_ns", I64),
    req("peak_live_bytes", I64),
    req("popped", Bool),
];

const STACKS: &[Col] = &[
    req("stack", I64),
    req("depth", I32),
    req("kind", Str),
    opt("function", Str),
    opt("file", Str),
    opt("line", I64),
    opt("module", Str),
    req("hidden", Bool),
    req("inlined", Bool),
    req("site", Str),
    opt("place", Str),
    req("truncated", Bool),
];

fn columns(table: &str) -> &'static [Col] {
    match table {
        "traces" => TRACES,
        "allocations" => ALLOCATIONS,
        "frees" => FREES,
        "findings" => FINDINGS,
        "regions" => REGIONS,
        _ => STACKS,
    }
}

/// The schema of `table` as Parquet's message type text (docs/fleet.md shows the same).
pub fn schema_text(table: &str) -> String {
    let mut s = format!("message {table} {{\n");
    for Col(name, ty, nullable) in IDENTITY.iter().chain(columns(table)) {
        let rep = if *nullable { "OPTIONAL" } else { "REQUIRED" };
        let ty = match ty {
            I64 => "INT64",
            I32 => "INT32",
            Bool => "BOOLEAN",
            Str => "BYTE_ARRAY",
        };
        let logical = if ty == "BYTE_ARRAY" { " (STRING)" } else { "" };
        s.push_str(&format!("  {rep} {ty} {name}{logical};\n"));
    }
    s.push('}');
    s
}

/// One value of a row.
#[derive(Clone, Copy, Debug)]
enum V<'a> {
    I(i64),
    I32(i32),
    B(bool),
    S(&'a str),
    Null,
}

/// A `u64` as Parquet's signed 64-bit integer (addresses and sizes are below 2^63; a larger
/// value, which only a corrupt trace has, is written as `i64::MAX`).
fn u(v: u64) -> V<'static> {
    V::I(i64::try_from(v).unwrap_or(i64::MAX))
}

fn opt_u(v: Option<u64>) -> V<'static> {
    v.map_or(V::Null, u)
}

fn opt_s(v: Option<&str>) -> V<'_> {
    v.map_or(V::Null, V::S)
}

fn opt_i32(v: Option<u32>) -> V<'static> {
    v.map_or(V::Null, |v| V::I32(i32::try_from(v).unwrap_or(i32::MAX)))
}

/// A stack id as a value: null for 0 (no stack).
fn stack(id: u32) -> V<'static> {
    if id == 0 {
        V::Null
    } else {
        V::I(i64::from(id))
    }
}

enum Values {
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
    Str(Vec<ByteArray>),
}

struct Column {
    col: Col,
    values: Values,
    /// Definition levels (nullable columns): 1 for a value, 0 for a null.
    defs: Vec<i16>,
}

impl Column {
    fn new(col: Col) -> Self {
        let values = match col.1 {
            I64 => Values::I64(Vec::new()),
            I32 => Values::I32(Vec::new()),
            Bool => Values::Bool(Vec::new()),
            Str => Values::Str(Vec::new()),
        };
        Column {
            col,
            values,
            defs: Vec::new(),
        }
    }

    fn push(&mut self, v: V) {
        let present = !matches!(v, V::Null);
        assert!(
            present || self.col.2,
            "parquet export: a null in required column {}",
            self.col.0
        );
        if self.col.2 {
            self.defs.push(i16::from(present));
        }
        match (&mut self.values, v) {
            (_, V::Null) => {}
            (Values::I64(x), V::I(v)) => x.push(v),
            (Values::I32(x), V::I32(v)) => x.push(v),
            (Values::Bool(x), V::B(v)) => x.push(v),
            (Values::Str(x), V::S(v)) => x.push(ByteArray::from(v)),
            (_, v) => panic!(
                "parquet export: {v:?} in column {} of {:?}",
                self.col.0, self.col.1
            ),
        }
    }

    fn clear(&mut self) {
        self.defs.clear();
        match &mut self.values {
            Values::I64(x) => x.clear(),
            Values::I32(x) => x.clear(),
            Values::Bool(x) => x.clear(),
            Values::Str(x) => x.clear(),
        }
    }
}

/// The identity of a trace: the first columns of each of its rows.
#[derive(Clone, Debug)]
struct Identity {
    trace: String,
    host: String,
    pid: i64,
    rank: Option<u32>,
}

impl Identity {
    fn of(h: &Header) -> Identity {
        let host: String = h
            .hostname
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let host = if host.is_empty() {
            "unknown".to_owned()
        } else {
            host
        };
        Identity {
            trace: format!("{host}-{}-{}", h.pid, h.start_unix_ns),
            host: h.hostname.clone(),
            pid: i64::from(h.pid),
            rank: h.rank,
        }
    }
}

/// One table of one trace, being written to its temporary file.
struct Table {
    id: Identity,
    columns: Vec<Column>,
    rows: usize,
    total: u64,
    writer: SerializedFileWriter<File>,
    tmp: tempfile::NamedTempFile,
    path: PathBuf,
}

fn pq_err(path: &Path, e: ParquetError) -> Error {
    match e {
        ParquetError::External(e) => match e.downcast::<std::io::Error>() {
            Ok(io) => Error::io(Some(path.to_owned()), *io),
            Err(e) => Error::io(Some(path.to_owned()), std::io::Error::other(e)),
        },
        e => Error::io(Some(path.to_owned()), std::io::Error::other(e.to_string())),
    }
}

impl Table {
    fn create(dir: &Path, table: &'static str, id: &Identity) -> Result<Table, Error> {
        let tdir = dir.join(table);
        std::fs::create_dir_all(&tdir).map_err(|e| Error::io(Some(tdir.clone()), e))?;
        let path = tdir.join(format!("{}.parquet", id.trace));
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{}.parquet.", id.trace))
            .tempfile_in(&tdir)
            .map_err(|e| Error::io(Some(tdir.clone()), e))?;
        let file = tmp
            .as_file()
            .try_clone()
            .map_err(|e| Error::io(Some(tmp.path().to_owned()), e))?;
        let schema = ::parquet::schema::parser::parse_message_type(&schema_text(table))
            .map_err(|e| pq_err(&path, e))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::UNCOMPRESSED)
            .set_created_by(format!("isolate {}", env!("CARGO_PKG_VERSION")))
            .build();
        let writer = SerializedFileWriter::new(file, Arc::new(schema as Type), Arc::new(props))
            .map_err(|e| pq_err(&path, e))?;
        Ok(Table {
            id: id.clone(),
            columns: IDENTITY
                .iter()
                .chain(columns(table))
                .copied()
                .map(Column::new)
                .collect(),
            rows: 0,
            total: 0,
            writer,
            tmp,
            path,
        })
    }

    /// Adds a row: the trace's identity, then `values` (one per column of the table).
    fn row(&mut self, values: &[V]) -> Result<(), Error> {
        assert_eq!(
            values.len() + IDENTITY.len(),
            self.columns.len(),
            "parquet export: a row of {} values for {}",
            values.len(),
            self.path.display()
        );
        let id = &self.id;
        let ids = [
            V::S(&id.trace),
            V::S(&id.host),
            V::I(id.pid),
            opt_i32(id.rank),
        ];
        for (c, v) in self.columns.iter_mut().zip(ids.iter().chain(values)) {
            c.push(*v);
        }
        self.rows += 1;
        self.total += 1;
        if self.rows >= ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the rows held as one row group.
    fn flush(&mut self) -> Result<(), Error> {
        if self.rows == 0 {
            return Ok(());
        }
        let path = self.path.clone();
        let e = |e| pq_err(&path, e);
        let mut rg = self.writer.next_row_group().map_err(e)?;
        for c in &mut self.columns {
            let Some(mut w) = rg.next_column().map_err(e)? else {
                break;
            };
            let defs = c.col.2.then_some(&c.defs[..]);
            match &c.values {
                Values::I64(v) => w.typed::<Int64Type>().write_batch(v, defs, None),
                Values::I32(v) => w.typed::<Int32Type>().write_batch(v, defs, None),
                Values::Bool(v) => w.typed::<BoolType>().write_batch(v, defs, None),
                Values::Str(v) => w.typed::<ByteArrayType>().write_batch(v, defs, None),
            }
            .map_err(e)?;
            w.close().map_err(e)?;
            c.clear();
        }
        rg.close().map_err(e)?;
        self.rows = 0;
        Ok(())
    }

    /// Writes what is held and the footer, and syncs the file: it is ready to be renamed.
    fn close(mut self) -> Result<Written, Error> {
        self.flush()?;
        let path = self.path.clone();
        self.writer.close().map_err(|e| pq_err(&path, e))?;
        self.tmp
            .as_file()
            .sync_all()
            .map_err(|e| Error::io(Some(self.tmp.path().to_owned()), e))?;
        Ok(Written {
            tmp: self.tmp,
            path: self.path,
            rows: self.total,
        })
    }
}

/// A table's file, complete under its temporary name.
struct Written {
    tmp: tempfile::NamedTempFile,
    path: PathBuf,
    rows: u64,
}

/// The observer that writes allocations, frees and regions as the trace is read, and keeps
/// the stacks for the rest.
struct Collect {
    stacks: StackTable,
    /// Stack id → its site and place (symbolised once each).
    sites: FxHashMap<u32, Named>,
    allocations: Table,
    frees: Table,
    regions: Table,
    spans: Regions,
    /// Regions and marks so far, by name: the next one's ordinal.
    ordinals: FxHashMap<(bool, String), u64>,
    /// Thread → the ordinals of its open regions, innermost last (as `spans` keeps them).
    open: FxHashMap<u64, Vec<u64>>,
    last_ts: u64,
    error: Option<Error>,
}

/// A stack's site and place, as the allocations and frees name it.
#[derive(Default)]
struct Named {
    site: Option<Box<str>>,
    place: Option<Box<str>>,
}

/// The site and place of stack `id` of `table` (symbolised the first time), as values.
fn named<'a>(sites: &'a mut FxHashMap<u32, Named>, table: &StackTable, id: u32) -> [V<'a>; 2] {
    if id == 0 {
        return [V::Null, V::Null];
    }
    let e = sites.entry(id).or_insert_with(|| {
        let s = stacks::shown(table, id);
        Named {
            site: s.as_ref().map(|s| s.site.clone().into_boxed_str()),
            place: s.and_then(|s| s.place).map(String::into_boxed_str),
        }
    });
    [opt_s(e.site.as_deref()), opt_s(e.place.as_deref())]
}

impl Collect {
    fn keep(&mut self, r: Result<(), Error>) {
        if let Err(e) = r
            && self.error.is_none()
        {
            self.error = Some(e);
        }
    }

    fn ordinal(&mut self, mark: bool, name: &str) -> u64 {
        let n = self.ordinals.entry((mark, name.to_owned())).or_insert(0);
        *n += 1;
        *n - 1
    }

    fn region(&mut self, c: &Closed, ordinal: u64) {
        let r = self.regions.row(&[
            V::S("region"),
            V::S(&c.name),
            u(ordinal),
            u(c.tid),
            V::I32(i32::try_from(c.depth).unwrap_or(i32::MAX)),
            u(c.from_ns),
            u(c.to_ns),
            u(c.to_ns.saturating_sub(c.from_ns)),
            u(c.peak_live_bytes),
            V::B(c.popped),
        ]);
        self.keep(r);
    }
}

impl Observer for Collect {
    fn event(&mut self, ev: &isolate_trace::Event, _live: &Live) {
        self.last_ts = self.last_ts.max(ev.ts_ns);
    }

    fn started(&mut self, n: &Node, live: &Live) {
        if self.error.is_some() {
            return;
        }
        let now = live.device_bytes();
        if n.category.is_device_memory() && !self.spans.none_open() {
            self.spans.sample(now);
        }
        let [site, place] = named(&mut self.sites, &self.stacks, n.stack);
        let r = self.allocations.row(&[
            u(n.seq),
            u(n.ts_ns),
            V::I(i64::from(n.tid)),
            V::I32(n.device),
            V::S(n.api.name()),
            V::S(n.category.name()),
            V::B(n.category.is_device_memory()),
            u(n.ptr),
            u(n.size),
            u(n.stream),
            u(n.handle),
            stack(n.stack),
            site,
            place,
            u(now),
        ]);
        self.keep(r);
    }

    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        if self.error.is_some() {
            return;
        }
        let [site, place] = named(&mut self.sites, &self.stacks, e.stack);
        let r = self.frees.row(&[
            u(e.seq),
            u(e.ts_ns),
            V::I(i64::from(e.tid)),
            V::I32(n.device),
            V::S(e.api.name()),
            V::S(match e.how {
                EndHow::Freed => "freed",
                EndHow::Lost => "lost",
            }),
            u(n.seq),
            V::S(n.category.name()),
            V::B(n.category.is_device_memory()),
            u(n.ptr),
            u(n.size),
            stack(e.stack),
            site,
            place,
            u(live.device_bytes()),
        ]);
        self.keep(r);
    }

    fn other(&mut self, rec: &Record, live: &Live) {
        if self.stacks.record(rec) {
            return;
        }
        match rec {
            Record::Note(n) => {
                self.last_ts = self.last_ts.max(n.ts_ns);
                match user_note(n) {
                    Some(UserNote::Mark(text)) => {
                        let k = self.ordinal(true, text);
                        let r = self.regions.row(&[
                            V::S("mark"),
                            V::S(text),
                            u(k),
                            u(n.ptr),
                            V::Null,
                            u(n.ts_ns),
                            u(n.ts_ns),
                            V::I(0),
                            u(live.device_bytes()),
                            V::B(true),
                        ]);
                        self.keep(r);
                    }
                    Some(UserNote::RegionPush(name)) => {
                        let k = self.ordinal(false, name);
                        self.open.entry(n.ptr).or_default().push(k);
                        self.spans.push(n.ptr, name, n.ts_ns, live.device_bytes());
                    }
                    Some(UserNote::RegionPop(_)) => {
                        let k = self.open.get_mut(&n.ptr).and_then(Vec::pop);
                        if self.open.get(&n.ptr).is_some_and(Vec::is_empty) {
                            self.open.remove(&n.ptr);
                        }
                        if let (Some(c), Some(k)) = (self.spans.pop(n.ptr, n.ts_ns), k) {
                            self.region(&c, k);
                        }
                    }
                    None => {}
                }
            }
            Record::End(e) => self.last_ts = self.last_ts.max(e.ts_ns),
            _ => {}
        }
    }

    fn finish(&mut self, _still: &[Node], _live: &Live) {
        for c in self.spans.close_all(self.last_ts) {
            // A region still open is the one at its depth on its thread's stack.
            let k = self
                .open
                .get(&c.tid)
                .and_then(|v| v.get(c.depth.saturating_sub(1) as usize))
                .copied()
                .unwrap_or(0);
            self.region(&c, k);
        }
    }
}

/// What one finding's row says: its call, and where in the code its calls were.
struct FindingRow<'a> {
    seq: u64,
    ts_ns: u64,
    tid: Option<u64>,
    device: Option<i32>,
    api: Option<&'a str>,
    ptr: Option<u64>,
    size: Option<u64>,
    alloc_seq: Option<u64>,
    free_seq: Option<u64>,
    kernel: Option<&'a str>,
    code: Option<u64>,
}

fn finding_row<'a>(f: &Finding<'a>) -> FindingRow<'a> {
    let none = |seq, ts_ns| FindingRow {
        seq,
        ts_ns,
        tid: None,
        device: None,
        api: None,
        ptr: None,
        size: None,
        alloc_seq: None,
        free_seq: None,
        kernel: None,
        code: None,
    };
    match *f {
        Finding::StaleWrite(v) => FindingRow {
            device: Some(v.device),
            api: Some(&v.free_api),
            ptr: Some(v.ptr),
            size: Some(v.size),
            alloc_seq: Some(v.alloc_seq),
            free_seq: Some(v.free_seq),
            ..none(v.seq, v.ts_ns)
        },
        Finding::StaleLaunch(s) => FindingRow {
            tid: Some(u64::from(s.tid)),
            device: Some(s.device),
            api: Some(&s.api),
            ptr: Some(s.ptr),
            size: Some(s.alloc_size),
            alloc_seq: Some(s.allocation),
            free_seq: Some(s.freed_at.seq),
            kernel: Some(&s.kernel),
            ..none(s.seq, s.ts_ns)
        },
        // The free is the call; the use's code is its `call_at` (Role::Used).
        Finding::UnorderedFree(x) => FindingRow {
            tid: Some(u64::from(x.tid)),
            device: Some(x.device),
            api: Some(&x.free_api),
            ptr: Some(x.alloc_ptr),
            size: Some(x.alloc_size),
            alloc_seq: Some(x.alloc_seq),
            free_seq: Some(x.free_seq),
            kernel: x.use_kernel.then_some(x.use_name.as_str()),
            ..none(x.seq, x.ts_ns)
        },
        Finding::InvalidFree(x) | Finding::DoubleFree(x) => FindingRow {
            tid: Some(u64::from(x.tid)),
            device: Some(x.device),
            api: Some(&x.api),
            ptr: Some(x.ptr),
            alloc_seq: x.allocated.as_ref().map(|c| c.seq),
            free_seq: x.first_free.as_ref().map(|c| c.seq),
            ..none(x.seq, x.ts_ns)
        },
        Finding::DeviceFault(Fault::Noted(d)) => FindingRow {
            tid: d.call.as_ref().map(|c| u64::from(c.tid)),
            api: d.call.as_ref().map(|c| c.api.as_str()),
            code: Some(d.code),
            ..none(d.seq, d.ts_ns)
        },
        Finding::DeviceFault(Fault::Returned(c)) => FindingRow {
            tid: Some(u64::from(c.tid)),
            api: Some(&c.api),
            code: Some(c.code),
            ..none(c.seq, c.ts_ns)
        },
        Finding::Leak(l) => FindingRow {
            tid: Some(u64::from(l.tid)),
            device: Some(l.device),
            api: Some(&l.api),
            size: Some(l.bytes_per_step),
            alloc_seq: Some(l.seq),
            ..none(l.seq, l.ts_ns)
        },
    }
}

/// What the export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ParquetStats {
    pub traces: u64,
    /// Rows written to each table, in [`TABLES`]' order.
    pub rows: Vec<(String, u64)>,
    /// Findings with no row: those past the summary's first
    /// [`LIST_CAP`](crate::summary::LIST_CAP) of a kind in a trace (`traces.findings` counts
    /// them).
    pub findings_left_out: u64,
}

impl ParquetStats {
    /// The line the export says on standard error.
    pub fn describe(&self, dir: &Path) -> String {
        let rows: Vec<String> = self.rows.iter().map(|(t, n)| format!("{t} {n}")).collect();
        let mut s = format!(
            "parquet: {} trace{} written to {} (rows: {})",
            self.traces,
            if self.traces == 1 { "" } else { "s" },
            dir.display(),
            rows.join(", ")
        );
        if self.findings_left_out > 0 {
            s.push_str(&format!(
                "; and {}, past the first {} of a kind in a trace, with no row (traces.findings counts them)",
                crate::words::plural(self.findings_left_out, "more finding"),
                crate::summary::LIST_CAP
            ));
        }
        s
    }
}

/// Exports the traces at `paths` into `dir` (made if missing): one Parquet file per table per
/// trace (see the module's documentation).
pub fn parquet<P: AsRef<Path>>(
    paths: &[P],
    dir: &Path,
    progress: &mut dyn Progress,
) -> Result<(Vec<TraceInfo>, ParquetStats), Error> {
    // Every trace's identity first: two inputs of one id would overwrite each other's files.
    let mut ids: FxHashMap<String, PathBuf> = FxHashMap::default();
    for p in paths {
        let p = p.as_ref();
        let id = Identity::of(isolate_trace::Reader::open(p)?.header());
        if let Some(other) = ids.insert(id.trace.clone(), p.to_owned()) {
            return Err(Error::invalid(format!(
                "export: {} and {} are the same trace ({}: host, pid and start time): give it once",
                other.display(),
                p.display(),
                id.trace
            )));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(Some(dir.to_owned()), e))?;
    let mut stats = ParquetStats {
        rows: TABLES.iter().map(|t| (t.to_string(), 0)).collect(),
        ..ParquetStats::default()
    };
    let mut infos = Vec::new();
    for p in paths {
        let (info, written, left_out) = one(p.as_ref(), dir, progress)?;
        stats.findings_left_out += left_out;
        // Into place, `traces` last: a trace it lists has all its tables.
        for w in written.into_iter().rev() {
            let Written { tmp, path, rows } = w;
            tmp.persist(&path)
                .map_err(|e| Error::io(Some(path.clone()), e.error))?;
            let t = path
                .parent()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(r) = stats.rows.iter_mut().find(|r| r.0 == t) {
                r.1 += rows;
            }
        }
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        stats.traces += 1;
        infos.push(info);
    }
    Ok((infos, stats))
}

/// Writes the tables of the trace at `path` under temporary names: in [`TABLES`]' order.
fn one(
    path: &Path,
    dir: &Path,
    progress: &mut dyn Progress,
) -> Result<(TraceInfo, Vec<Written>, u64), Error> {
    let id = Identity::of(isolate_trace::Reader::open(path)?.header());
    let mut c = Collect {
        stacks: StackTable::new(),
        sites: FxHashMap::default(),
        allocations: Table::create(dir, "allocations", &id)?,
        frees: Table::create(dir, "frees", &id)?,
        regions: Table::create(dir, "regions", &id)?,
        spans: Regions::default(),
        ordinals: FxHashMap::default(),
        open: FxHashMap::default(),
        last_ts: 0,
        error: None,
    };
    let mut obs = (Summarizer::new(0), &mut c);
    let info = analyze(path, progress, &mut obs)?;
    let summary = obs.0.into_summary(&info);
    if let Some(e) = c.error.take() {
        return Err(e);
    }

    let mut findings = Table::create(dir, "findings", &id)?;
    let listed = finding::findings(&summary);
    let left_out = finding::Tally::of(&summary.totals)
        .total()
        .saturating_sub(listed.len() as u64);
    for f in listed {
        let r = finding_row(&f);
        let mut at: [Option<String>; 4] = Default::default();
        for s in f.sites() {
            let i = match s.role {
                Role::Call | Role::Used => 0,
                Role::Allocated => 1,
                Role::Freed => 2,
                Role::FirstFreed => 3,
            };
            if let Some(id) = s.stack {
                at[i] = finding::place_of(&c.stacks, id);
            }
        }
        findings.row(&[
            V::S(f.kind().key()),
            V::B(f.kind().counts()),
            u(r.seq),
            u(r.ts_ns),
            opt_u(r.tid),
            r.device.map_or(V::Null, V::I32),
            opt_s(r.api),
            opt_u(r.ptr),
            opt_u(r.size),
            opt_u(r.alloc_seq),
            opt_u(r.free_seq),
            opt_s(r.kernel),
            opt_u(r.code),
            opt_s(at[0].as_deref()),
            opt_s(at[1].as_deref()),
            opt_s(at[2].as_deref()),
            opt_s(at[3].as_deref()),
        ])?;
    }

    let mut st = Table::create(dir, "stacks", &id)?;
    let mut stack_ids: Vec<u32> = c.stacks.stack_ids().collect();
    stack_ids.sort_unstable();
    for sid in &stack_ids {
        let Some(s) = stacks::shown(&c.stacks, *sid) else {
            continue;
        };
        for (depth, f) in s.frames.iter().enumerate() {
            st.row(&[
                V::I(i64::from(*sid)),
                V::I32(i32::try_from(depth).unwrap_or(i32::MAX)),
                V::S(f.kind),
                opt_s(f.function.as_deref()),
                opt_s(f.file.as_deref()),
                f.line.map_or(V::Null, |l| V::I(i64::from(l))),
                opt_s(f.module.as_deref()),
                V::B(f.hidden),
                V::B(f.inlined),
                V::S(&s.site),
                opt_s(s.place.as_deref()),
                V::B(s.truncated),
            ])?;
        }
    }

    let h = &info.header;
    let x = &summary.totals;
    let mut traces = Table::create(dir, "traces", &id)?;
    traces.row(&[
        V::S(&info.file),
        V::S(&h.exe),
        V::S(&h.argv.join(" ")),
        V::I(i64::from(h.ppid)),
        opt_i32(h.local_rank),
        opt_i32(h.world_size),
        V::S(&h.mode),
        V::S(&h.library_version),
        V::I32(i32::try_from(info.format_version).unwrap_or(i32::MAX)),
        u(h.start_unix_ns),
        u(h.start_mono_ns),
        opt_s(summary.end_reason.as_deref()),
        opt_u(info.truncated_at),
        u(x.events),
        u(x.allocations),
        u(x.frees),
        u(x.peak_live_bytes),
        u(x.live_at_end.count),
        u(x.live_at_end.bytes),
        u(x.findings),
        u(stack_ids.len() as u64),
    ])?;

    let Collect {
        allocations,
        frees,
        regions,
        ..
    } = c;
    let written = vec![
        traces.close()?,
        allocations.close()?,
        frees.close()?,
        findings.close()?,
        regions.close()?,
        st.close()?,
    ];
    Ok((info, written, left_out))
}

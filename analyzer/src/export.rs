//! `isolate export --format chrome-trace`: the timeline in the Trace Event format that Perfetto
//! (ui.perfetto.dev) and chrome://tracing open.
//!
//! - Each allocation's lifetime is a complete event (`"ph":"X"`) on the track of the thread that
//!   made it, or of its stream for stream-ordered calls. Lifetimes on one track overlap freely,
//!   so each track is split into *lanes* (`tid 1234 #2`): an allocation takes the lowest lane
//!   free when it starts, and events on one lane never overlap, as the format wants.
//! - A counter track (`"ph":"C"`) of live bytes: device (device + managed + handles), graph, host.
//! - Instant events (`"ph":"i"`) for failed calls, stale values, signals and every finding but
//!   a leak (stale writes, stale launches, invalid and double frees, noted device faults),
//!   rendered from the findings the summary fills ([`crate::finding::Streamed`]), every one.
//!
//! Timestamps are the trace's `CLOCK_MONOTONIC` in µs (with ns decimals), so traces of several
//! processes of one host line up.
//!
//! `isolate export --format memory-viz` (PyTorch's memory snapshot pickle) is in [`memviz`];
//! `isolate export --format parquet` (tables for DuckDB, Polars, Spark) in [`fleet`].

use crate::Error;
use crate::finding::{Fault, Finding, Kind, Renders, Role, Site, Streamed};
use crate::source::{Progress, analyze};
use crate::track::{Category, EndHow, Ended, Live, Node, Observer};
use crate::util::{hex, human_bytes};
use isolate_trace::{Event, Header, Record};
use rustc_hash::FxHashMap;
use serde_json::json;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::Path;

pub mod fleet;
pub mod memviz;
pub use fleet::{ParquetStats, parquet};
pub use memviz::{DEFAULT_MAX_EVENTS, MemoryVizStats, PyFrame, Stacks, memory_viz};

/// µs with three decimals, exactly.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

#[derive(Default)]
struct Track {
    free_lanes: BinaryHeap<Reverse<u32>>,
    lanes: u32,
}

struct Exporter<'a, W: Write> {
    out: &'a mut W,
    first: &'a mut bool,
    pid: u32,
    tracks: FxHashMap<(bool, u64), Track>,
    tids: FxHashMap<(bool, u64, u32), u64>,
    next_tid: &'a mut u64,
    /// Live node → (track, lane).
    live: FxHashMap<u64, ((bool, u64), u32)>,
    last_ts: u64,
    last_counter: Option<(u64, u64, u64, u64)>,
    error: Option<std::io::Error>,
    /// The trace's stacks: where in the code a finding's calls were.
    stacks: crate::stacks::StackTable,
}

impl<W: Write> Exporter<'_, W> {
    fn put(&mut self, v: &serde_json::Value) {
        if self.error.is_some() {
            return;
        }
        let r = (|| {
            self.out
                .write_all(if *self.first { b"\n" } else { b",\n" })?;
            *self.first = false;
            serde_json::to_writer(&mut *self.out, v)?;
            Ok(())
        })();
        if let Err(e) = r {
            self.error = Some(e);
        }
    }

    /// Writes an event whose `ts`/`dur` are raw JSON numbers (exact decimals).
    fn put_timed(&mut self, mut v: serde_json::Value, ts: u64, dur: Option<u64>) {
        if let Some(o) = v.as_object_mut() {
            o.insert("ts".into(), serde_json::Value::Null);
            if dur.is_some() {
                o.insert("dur".into(), serde_json::Value::Null);
            }
        }
        let mut s = serde_json::to_string(&v).unwrap_or_default();
        s = s.replacen("\"ts\":null", &format!("\"ts\":{}", us(ts)), 1);
        if let Some(d) = dur {
            s = s.replacen("\"dur\":null", &format!("\"dur\":{}", us(d)), 1);
        }
        if self.error.is_some() {
            return;
        }
        let r = (|| {
            self.out
                .write_all(if *self.first { b"\n" } else { b",\n" })?;
            *self.first = false;
            self.out.write_all(s.as_bytes())
        })();
        if let Err(e) = r {
            self.error = Some(e);
        }
    }

    fn track_of(n: &Node) -> (bool, u64) {
        if n.stream != 0 {
            (true, n.stream)
        } else {
            (false, u64::from(n.tid))
        }
    }

    fn tid(&mut self, track: (bool, u64), lane: u32) -> u64 {
        if let Some(&t) = self.tids.get(&(track.0, track.1, lane)) {
            return t;
        }
        let t = *self.next_tid;
        *self.next_tid += 1;
        self.tids.insert((track.0, track.1, lane), t);
        let name = if track.0 {
            format!("stream {}", hex(track.1))
        } else {
            format!("tid {}", track.1)
        };
        let name = if lane == 0 {
            name
        } else {
            format!("{name} #{lane}")
        };
        let pid = self.pid;
        self.put(&json!({"ph":"M","pid":pid,"tid":t,"name":"thread_name","args":{"name":name}}));
        self.put(
            &json!({"ph":"M","pid":pid,"tid":t,"name":"thread_sort_index","args":{"sort_index":t}}),
        );
        t
    }

    fn counter(&mut self, ts: u64, live: &Live) {
        let c = (
            live.device_bytes(),
            live.bytes(Category::Graph),
            live.bytes(Category::Host),
            live.bytes(Category::Registered),
        );
        if self.last_counter == Some(c) {
            return;
        }
        self.last_counter = Some(c);
        let pid = self.pid;
        self.put_timed(
            json!({"ph":"C","pid":pid,"name":"live bytes","args":{"device":c.0,"graph":c.1,"host":c.2,"registered":c.3}}),
            ts,
            None,
        );
    }

    fn instant(&mut self, ts: u64, tid: u32, name: String, args: serde_json::Value) {
        let pid = self.pid;
        self.put_timed(
            json!({"ph":"i","s":"p","pid":pid,"tid":tid,"name":name,"cat":"problem","args":args}),
            ts,
            None,
        );
    }

    /// `args` with `allocated_at`, `freed_at`, `launched_at`, `first_freed_at` added: where
    /// in the code the finding's calls were ([`Finding::sites`], named by
    /// [`crate::finding::place_of`]), for those known.
    fn with_places(&self, mut args: serde_json::Value, f: &Finding<'_>) -> serde_json::Value {
        if !self.stacks.has_stacks() {
            return args;
        }
        for Site { role, stack, .. } in f.sites() {
            if let Some(id) = stack
                && let Some(p) = crate::finding::place_of(&self.stacks, id)
            {
                args[place_key(f.kind(), role)] = serde_json::Value::String(p);
            }
        }
        args
    }

    fn close(&mut self, n: &Node, end_ts: u64, end: Option<&Ended>) {
        let Some((track, lane)) = self.live.remove(&n.id) else {
            return;
        };
        if let Some(t) = self.tracks.get_mut(&track) {
            t.free_lanes.push(Reverse(lane));
        }
        let tid = self.tid(track, lane);
        let pid = self.pid;
        let name = format!("{} {}", n.api.name(), human_bytes(n.size));
        let how = match end {
            Some(e) if e.how == EndHow::Lost => "lost (free never seen)".to_owned(),
            Some(e) => format!("{} seq {}", e.api.name(), e.seq),
            None => "never freed".to_owned(),
        };
        self.put_timed(
            json!({"ph":"X","pid":pid,"tid":tid,"name":name,"cat":n.category.name(),
                   "args":{"ptr":hex(n.ptr),"size":n.size,"device":n.device,"alloc_seq":n.seq,
                           "thread":n.tid,"stream":hex(n.stream),"ended_by":how}}),
            n.ts_ns,
            Some(end_ts.saturating_sub(n.ts_ns)),
        );
    }
}

/// The name of the instant event of a finding of kind `k` about `what` (an address, a kernel,
/// an error code): `stale write 0x7f…`. Invalid and double frees are both `invalid free 0x…`
/// (`invalid address_free …` for the other kinds of free), as the timeline always named them.
/// The exporter makes no instant of a possible leak (its lifetime runs to the end of the
/// trace); one would be named like the others.
fn instant_name(k: Kind, what: &str) -> String {
    match k {
        Kind::StaleWrite
        | Kind::StaleLaunch
        | Kind::UnorderedFree
        | Kind::DeviceFault
        | Kind::Leak => {
            format!("{} {what}", k.word())
        }
        Kind::InvalidFree | Kind::DoubleFree => format!("invalid {what}"),
    }
}

/// The instant's key for a call of a finding of kind `k`: `launched_at` for a launch,
/// `freed_at` for an invalid free's own call.
fn place_key(k: Kind, role: Role) -> &'static str {
    match role {
        Role::Allocated => "allocated_at",
        Role::Freed => "freed_at",
        Role::FirstFreed => "first_freed_at",
        Role::Used => "used_at",
        Role::Call => match k {
            Kind::StaleLaunch => "launched_at",
            Kind::InvalidFree | Kind::DoubleFree => "freed_at",
            Kind::StaleWrite | Kind::UnorderedFree | Kind::DeviceFault | Kind::Leak => "at",
        },
    }
}

impl<W: Write> Renders for Exporter<'_, W> {
    /// A finding's instant, where and when its record was: every one, past the summary's
    /// lists' cap too.
    fn finding(&mut self, f: Finding<'_>, _live: &Live) {
        let k = f.kind();
        let (ts, tid, name, args) = match f {
            Finding::StaleWrite(v) => (
                v.ts_ns,
                0,
                instant_name(k, &hex(v.ptr)),
                json!({"size":v.size,"first_offset":v.first_offset,
                       "changed_bytes":v.changed_bytes,"alloc_seq":v.alloc_seq,
                       "free_seq":v.free_seq}),
            ),
            Finding::StaleLaunch(s) => (
                s.ts_ns,
                s.tid,
                instant_name(k, &s.kernel),
                json!({"ptr":hex(s.ptr),"param_index":s.param_index,"alloc_seq":s.allocation,
                       "free_seq":s.freed_at.seq}),
            ),
            Finding::UnorderedFree(u) => (
                u.ts_ns,
                u.tid,
                instant_name(k, &hex(u.alloc_ptr)),
                json!({"alloc_seq":u.alloc_seq,"free_seq":u.free_seq,
                       "free_stream":hex(u.free_stream),"use":u.use_name,
                       "use_stream":hex(u.use_stream),"use_after_seq":u.use_after_seq}),
            ),
            Finding::InvalidFree(i) | Finding::DoubleFree(i) => (
                i.ts_ns,
                i.tid,
                instant_name(k, &format!("{} {}", i.kind, hex(i.ptr))),
                json!({"seq":i.seq,"api":i.api}),
            ),
            Finding::DeviceFault(Fault::Noted(d)) => (
                d.ts_ns,
                0,
                instant_name(k, &d.code.to_string()),
                json!({"code":d.code,"suspects":d.suspects,"text":d.text}),
            ),
            // Its call has its instant already, as every failed call does (`event`).
            Finding::DeviceFault(Fault::Returned(_)) => return,
            // Its allocations' lifetimes run to the end of the trace: the complete events show it.
            Finding::Leak(_) => return,
        };
        let args = self.with_places(args, &f);
        self.instant(ts, tid, name, args);
    }
}

impl<W: Write> Observer for Exporter<'_, W> {
    fn begin(&mut self, h: &Header) {
        let name = format!(
            "{} (pid {}{})",
            if h.exe.is_empty() { "?" } else { &h.exe },
            h.pid,
            h.rank.map(|r| format!(", rank {r}")).unwrap_or_default()
        );
        let pid = self.pid;
        self.put(&json!({"ph":"M","pid":pid,"name":"process_name","args":{"name":name}}));
        self.put(
            &json!({"ph":"M","pid":pid,"name":"process_labels","args":{"labels":h.argv.join(" ")}}),
        );
    }

    fn event(&mut self, ev: &Event, _live: &Live) {
        self.last_ts = self.last_ts.max(ev.ts_ns);
        if !ev.ok() {
            self.instant(
                ev.ts_ns,
                ev.tid,
                format!("{} failed ({})", ev.api.name(), ev.result),
                json!({"seq":ev.seq,"size":ev.size,"result":ev.result}),
            );
        }
    }

    fn started(&mut self, n: &Node, live: &Live) {
        if n.category.has_address() && !matches!(n.category, Category::Reservation) {
            let track = Self::track_of(n);
            let t = self.tracks.entry(track).or_default();
            let lane = match t.free_lanes.pop() {
                Some(Reverse(l)) => l,
                None => {
                    t.lanes += 1;
                    t.lanes - 1
                }
            };
            self.live.insert(n.id, (track, lane));
        }
        self.counter(n.ts_ns, live);
    }

    fn ended(&mut self, n: &Node, e: &Ended, live: &Live) {
        self.close(n, e.ts_ns, Some(e));
        self.counter(e.ts_ns, live);
    }

    fn other(&mut self, rec: &Record, _live: &Live) {
        if self.stacks.record(rec) {
            return;
        }
        match rec {
            Record::StaleValue(s) => self.instant(
                s.ts_ns,
                s.tid,
                format!("stale value {}", s.kernel),
                json!({"ptr":hex(s.ptr),"param_index":s.param_index,"alloc_seq":s.alloc_seq,
                       "free_seq":s.free_seq,"guarded":true}),
            ),
            Record::Note(n) if n.kind == isolate_trace::NoteKind::Signal => self.instant(
                n.ts_ns,
                0,
                format!("signal {}", n.value),
                json!({"text":n.text}),
            ),
            _ => {}
        }
    }

    fn finish(&mut self, still: &[Node], _live: &Live) {
        let end = self.last_ts;
        for n in still {
            self.close(n, end.max(n.ts_ns), None);
        }
    }
}

/// Writes the chrome-trace JSON of `paths` to `out`.
pub fn chrome_trace<P: AsRef<Path>, W: Write>(
    paths: &[P],
    out: &mut W,
    progress: &mut dyn Progress,
) -> Result<Vec<crate::TraceInfo>, Error> {
    let io = |e| Error::io(None, e);
    let mut infos = Vec::new();
    let mut used_pids: rustc_hash::FxHashSet<u32> = Default::default();
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")
        .map_err(io)?;
    let mut first = true;
    let mut next_tid = 1u64;
    for (i, p) in paths.iter().enumerate() {
        let mut pid = isolate_trace::Reader::open(p.as_ref())?.header().pid;
        // Two traces of one pid (before and after an exec) stay apart.
        while !used_pids.insert(pid) {
            pid = pid.wrapping_add(1_000_000 + i as u32);
        }
        let ex = Exporter {
            out,
            first: &mut first,
            pid,
            tracks: FxHashMap::default(),
            tids: FxHashMap::default(),
            next_tid: &mut next_tid,
            live: FxHashMap::default(),
            last_ts: 0,
            last_counter: None,
            error: None,
            stacks: Default::default(),
        };
        let mut st = Streamed::new(i, ex);
        infos.push(analyze(p.as_ref(), progress, &mut st)?);
        if let Some(e) = st.out.error.take() {
            return Err(io(e));
        }
    }
    out.write_all(b"\n]}\n").map_err(io)?;
    out.flush().map_err(io)?;
    Ok(infos)
}

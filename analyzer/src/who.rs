//! `isolate who ADDR`: everything that ever lived at one address, in order.

use crate::Error;
use crate::finding::{Fault, Finding, Kind, Renders, Streamed};
use crate::source::{Progress, analyze};
use crate::stacks::{self, ShownStack, StackTable};
use crate::track::{Category, EndHow, Ended, Live, Node, Observer};
use crate::util::{hex, human_bytes, human_ns, ser_hex};
use crate::words;
use isolate_trace::Record;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// The allocation that took the address next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Next {
    pub node: u64,
    pub api: &'static str,
    pub size: u64,
    pub alloc_seq: u64,
    /// ns from this one's end to the next one's start.
    pub gap_ns: Option<u64>,
}

/// One node that covered the address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Occupant {
    /// The node's id in its trace (as in `isolate graph` for a single trace).
    pub node: u64,
    pub category: &'static str,
    pub api: &'static str,
    pub device: i32,
    pub tid: u32,
    #[serde(serialize_with = "ser_hex")]
    pub stream: u64,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    pub size: u64,
    /// Where the address lies inside it.
    pub offset: u64,
    pub alloc_seq: u64,
    pub alloc_ts_ns: u64,
    pub free_seq: Option<u64>,
    pub free_ts_ns: Option<u64>,
    pub free_api: Option<&'static str>,
    pub lost: bool,
    pub lifetime_ns: Option<u64>,
    /// What came after it at this address; null when nothing did.
    pub next: Option<Next>,
    /// For mappings: the handle, where the address lies in it, and the handle's node.
    #[serde(serialize_with = "ser_hex")]
    pub handle: u64,
    pub handle_offset: Option<u64>,
    pub handle_node: Option<u64>,
    pub handle_size: Option<u64>,
    pub reservation: Option<u64>,
    /// Trace format 2: the stacks of the call that started it and of the one that ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stack: Option<ShownStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_stack: Option<ShownStack>,
}

/// A record that names the address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Incident {
    /// `invalid_free`, `poison_violation`, `stale_launch`.
    pub kind: &'static str,
    pub seq: u64,
    pub ts_ns: u64,
    pub api: String,
    #[serde(serialize_with = "ser_hex")]
    pub ptr: u64,
    /// Kernel name for stale launches, changed bytes for violations.
    pub detail: String,
    /// Trace format 2: the stack of the call (invalid frees) or launch (stale launches and
    /// values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<ShownStack>,
    #[serde(skip)]
    stack_id: u32,
}

/// The `kind` of an incident about a finding of kind `k`: its trace record's name, as the
/// JSON had it before [`crate::finding`] named kinds (every invalid free is `invalid_free`,
/// double ones included; `double_free` says which). A device fault names no address and a
/// possible leak is in the history (an occupant held at exit): `who` makes no incident of
/// them, and would call them by their [`Kind::key`].
fn incident_kind(k: Kind) -> &'static str {
    match k {
        Kind::StaleWrite => "poison_violation",
        Kind::StaleLaunch => "stale_launch",
        Kind::InvalidFree | Kind::DoubleFree => "invalid_free",
        Kind::UnorderedFree => "freed_in_use",
        Kind::DeviceFault | Kind::Leak => k.key(),
    }
}

/// An incident's kind in the finding words ([`words`]) for text: the JSON keeps its keys.
fn incident_words(kind: &str) -> &str {
    match kind {
        "poison_violation" => words::STALE_WRITE,
        "stale_launch" => words::STALE_LAUNCH,
        "stale_value" => words::STALE_VALUE,
        "invalid_free" => words::INVALID_FREE,
        "device_fault" => words::DEVICE_FAULT,
        other => other,
    }
}

/// What one trace says about the address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WhoTrace {
    pub trace: usize,
    pub file: String,
    pub pid: u32,
    pub rank: Option<u32>,
    /// Allocations (device, managed, graph, host, registered) that covered it, in start order.
    pub history: Vec<Occupant>,
    /// `cuMemMap` mappings that covered it.
    pub mappings: Vec<Occupant>,
    /// Address reservations that covered it.
    pub reservations: Vec<Occupant>,
    pub incidents: Vec<Incident>,
    pub truncated: Option<u64>,
    /// Why there are no stacks (said once in text; not in JSON).
    #[serde(skip)]
    pub no_stacks: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Who {
    #[serde(serialize_with = "ser_hex")]
    pub address: u64,
    pub traces: Vec<WhoTrace>,
}

/// One node that covered the address, its end, and (for a mapping) the size of the handle it
/// maps, taken when it started.
type Entry = (Node, Option<Ended>, Option<u64>);

/// Memory is what the answer holds (the nodes at the address and the incidents) plus the live
/// handles: a handle is forgotten when it is released, and a mapping takes its size when it
/// starts.
struct Watch {
    addr: u64,
    /// Per list, in start order.
    lists: [Vec<Entry>; 3],
    /// Open entries: node id → (list, index).
    open: FxHashMap<u64, (usize, usize)>,
    /// Live handles: node id → size.
    handles: FxHashMap<u64, u64>,
    incidents: Vec<Incident>,
    table: StackTable,
}

fn list_of(c: Category) -> usize {
    match c {
        Category::Mapping => 1,
        Category::Reservation => 2,
        _ => 0,
    }
}

impl Observer for Watch {
    fn started(&mut self, n: &Node, _: &Live) {
        if n.category == Category::Handle {
            self.handles.insert(n.id, n.size);
            return;
        }
        if n.covers(self.addr) {
            let l = list_of(n.category);
            let handle_size = n.handle_node.and_then(|h| self.handles.get(&h).copied());
            self.open.insert(n.id, (l, self.lists[l].len()));
            self.lists[l].push((*n, None, handle_size));
        }
    }

    fn ended(&mut self, n: &Node, e: &Ended, _: &Live) {
        if n.category == Category::Handle {
            self.handles.remove(&n.id);
            return;
        }
        if let Some((l, i)) = self.open.remove(&n.id) {
            self.lists[l][i].1 = Some(*e);
        }
    }

    fn other(&mut self, rec: &Record, _: &Live) {
        match rec {
            Record::StaleValue(s)
                if s.ptr == self.addr
                    || (s.alloc_ptr <= self.addr
                        && self.addr < s.alloc_ptr.saturating_add(s.alloc_size)) =>
            {
                self.incidents.push(Incident {
                    kind: "stale_value",
                    seq: s.seq,
                    ts_ns: s.ts_ns,
                    api: s.api.name().into(),
                    ptr: s.ptr,
                    detail: format!(
                        "kernel {} parameter {} got a pointer into freed, unmapped guard memory \
                         (allocated at {}, freed at {}); harmless unless a device fault followed",
                        s.kernel,
                        s.param_index,
                        words::event(s.alloc_seq),
                        words::event(s.free_seq)
                    ),
                    stack: None,
                    stack_id: 0,
                });
            }
            _ => {
                self.table.record(rec);
            }
        }
    }
}

impl Renders for Watch {
    /// The findings whose memory covers the address (a stale launch's pointer may also be it).
    fn finding(&mut self, f: Finding<'_>, _: &Live) {
        let a = self.addr;
        let inside = |ptr: u64, size: u64| ptr <= a && a < ptr.saturating_add(size);
        let incident = match f {
            Finding::StaleWrite(v) if inside(v.ptr, v.size) => Incident {
                kind: incident_kind(f.kind()),
                seq: v.seq,
                ts_ns: v.ts_ns,
                api: v.free_api.clone(),
                ptr: v.ptr,
                detail: format!(
                    "{} bytes changed from offset {} after the free (allocated at {}, freed at {})",
                    v.changed_bytes,
                    v.first_offset,
                    words::event(v.alloc_seq),
                    words::event(v.free_seq)
                ),
                stack: None,
                stack_id: 0,
            },
            Finding::StaleLaunch(s) if s.ptr == a || inside(s.alloc_ptr, s.alloc_size) => {
                Incident {
                    kind: incident_kind(f.kind()),
                    seq: s.seq,
                    ts_ns: s.ts_ns,
                    api: s.api.clone(),
                    ptr: s.ptr,
                    detail: format!(
                        "kernel {} parameter {} points into freed memory (allocated at {}, freed at {})",
                        s.kernel,
                        s.param_index,
                        words::event(s.allocation),
                        words::event(s.freed_at.seq)
                    ),
                    stack: None,
                    // The launch's stack follows its record: looked up at the end.
                    stack_id: 0,
                }
            }
            Finding::UnorderedFree(u) if inside(u.alloc_ptr, u.alloc_size) => Incident {
                kind: incident_kind(f.kind()),
                seq: u.seq,
                ts_ns: u.ts_ns,
                api: u.free_api.clone(),
                ptr: u.alloc_ptr,
                detail: format!(
                    "freed on stream {:#x} ({}) while {} on stream {:#x} (queued after {}) may \
                     still use it (allocated at {})",
                    u.free_stream,
                    words::event(u.free_seq),
                    u.use_name,
                    u.use_stream,
                    words::event(u.use_after_seq),
                    words::event(u.alloc_seq)
                ),
                stack: None,
                stack_id: u.stack_ids[1].unwrap_or(0),
            },
            Finding::InvalidFree(i) | Finding::DoubleFree(i) if i.ptr == a => Incident {
                kind: incident_kind(f.kind()),
                seq: i.seq,
                ts_ns: i.ts_ns,
                api: i.api.clone(),
                ptr: i.ptr,
                detail: format!("{} of memory that was not live", i.kind),
                stack: None,
                stack_id: i.stack_ids[0].unwrap_or(0),
            },
            Finding::StaleWrite(_)
            | Finding::StaleLaunch(_)
            | Finding::UnorderedFree(_)
            | Finding::InvalidFree(_)
            | Finding::DoubleFree(_) => return,
            // A device fault names no address (its launches are stale launches, above).
            Finding::DeviceFault(Fault::Noted(_) | Fault::Returned(_)) => return,
            // A leak's allocations are in the history (held at the end).
            Finding::Leak(_) => return,
        };
        self.incidents.push(incident);
    }
}

fn occupants(addr: u64, list: &[Entry], table: &StackTable) -> Vec<Occupant> {
    let mut out = Vec::with_capacity(list.len());
    for (i, (n, e, handle_size)) in list.iter().enumerate() {
        let next = list.get(i + 1).map(|(m, _, _)| Next {
            node: m.id,
            api: m.api.name(),
            size: m.size,
            alloc_seq: m.seq,
            gap_ns: e.map(|e| m.ts_ns.saturating_sub(e.ts_ns)),
        });
        let is_map = n.category == Category::Mapping;
        out.push(Occupant {
            node: n.id,
            category: n.category.name(),
            api: n.api.name(),
            device: n.device,
            tid: n.tid,
            stream: n.stream,
            ptr: n.ptr,
            size: n.size,
            offset: addr - n.ptr,
            alloc_seq: n.seq,
            alloc_ts_ns: n.ts_ns,
            free_seq: e.map(|e| e.seq),
            free_ts_ns: e.map(|e| e.ts_ns),
            free_api: e.map(|e| e.api.name()),
            lost: e.is_some_and(|e| e.how == EndHow::Lost),
            lifetime_ns: e.map(|e| e.ts_ns.saturating_sub(n.ts_ns)),
            next,
            handle: if is_map { n.handle } else { 0 },
            handle_offset: is_map.then(|| n.offset.saturating_add(addr - n.ptr)),
            handle_node: n.handle_node,
            handle_size: *handle_size,
            reservation: n.reservation,
            alloc_stack: stacks::shown(table, n.stack),
            free_stack: e.and_then(|e| stacks::shown(table, e.stack)),
        });
    }
    out
}

/// Everything that covered `addr` in each of `paths`.
pub fn who<P: AsRef<Path>>(
    addr: u64,
    paths: &[P],
    progress: &mut dyn Progress,
) -> Result<Who, Error> {
    let mut traces = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let w = Watch {
            addr,
            lists: Default::default(),
            open: FxHashMap::default(),
            handles: FxHashMap::default(),
            incidents: Vec::new(),
            table: StackTable::new(),
        };
        let mut st = Streamed::new(i, w);
        let info = analyze(p.as_ref(), progress, &mut st)?;
        let mut w = st.out;
        for i in &mut w.incidents {
            if i.stack_id == 0 && i.kind != "invalid_free" {
                i.stack_id = w.table.stack_of(i.seq);
            }
            i.stack = stacks::shown(&w.table, i.stack_id);
        }
        let t = &w.table;
        traces.push(WhoTrace {
            trace: i,
            file: info.file.clone(),
            pid: info.header.pid,
            rank: info.header.rank,
            history: occupants(addr, &w.lists[0], t),
            mappings: occupants(addr, &w.lists[1], t),
            reservations: occupants(addr, &w.lists[2], t),
            no_stacks: stacks::why_none(info.format_version, t, &info.header.config),
            incidents: w.incidents,
            truncated: info.truncated_at,
        });
    }
    Ok(Who {
        address: addr,
        traces,
    })
}

/// The history as people read it.
pub fn render_text(w: &Who) -> String {
    let mut o = String::new();
    for t in &w.traces {
        let _ = writeln!(
            o,
            "== {} (pid {}{}) : {} ==",
            t.file,
            t.pid,
            t.rank.map(|r| format!(", rank {r}")).unwrap_or_default(),
            hex(w.address)
        );
        if let Some(at) = t.truncated {
            let _ = writeln!(o, "TRUNCATED at byte {at}: analysed up to there");
        }
        if t.history.is_empty() && t.mappings.is_empty() && t.reservations.is_empty() {
            let _ = writeln!(o, "nothing ever covered this address");
        }
        for (title, list) in [
            ("allocations", &t.history),
            ("mappings", &t.mappings),
            ("reservations", &t.reservations),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(o, "{title}:");
            for x in list {
                let life = match (x.free_seq, x.lifetime_ns) {
                    (Some(f), Some(l)) => format!(
                        "events {} to {} ({}, {} by {})",
                        x.alloc_seq,
                        f,
                        human_ns(l),
                        if x.lost { "lost" } else { "freed" },
                        x.free_api.unwrap_or("?")
                    ),
                    _ => format!("{}, still live at the end", words::event(x.alloc_seq)),
                };
                let _ = writeln!(
                    o,
                    "  #{:<6} {:<24} {} + {:#x} of {} ({}) dev {} tid {}  {}",
                    x.node,
                    x.api,
                    hex(x.ptr),
                    x.offset,
                    human_bytes(x.size),
                    x.size,
                    x.device,
                    x.tid,
                    life
                );
                stack_text(&mut o, "allocated at", x.alloc_stack.as_ref());
                stack_text(&mut o, "freed at", x.free_stack.as_ref());
                if let Some(ho) = x.handle_offset {
                    let _ = writeln!(
                        o,
                        "          maps handle {} at offset {:#x}{}",
                        hex(x.handle),
                        ho,
                        x.handle_node
                            .map(|h| format!(" (node #{h})"))
                            .unwrap_or_default()
                    );
                }
                match &x.next {
                    Some(n) => {
                        let _ = writeln!(
                            o,
                            "          then #{} {} {}{}",
                            n.node,
                            n.api,
                            human_bytes(n.size),
                            n.gap_ns
                                .map(|g| format!(" after {}", human_ns(g)))
                                .unwrap_or_default()
                        );
                    }
                    None if x.free_seq.is_some() => {
                        let _ = writeln!(o, "          nothing came after it");
                    }
                    None => {}
                }
            }
        }
        for i in &t.incidents {
            let _ = writeln!(
                o,
                "{}: {} ({}) {}: {}",
                words::heading(incident_words(i.kind)),
                words::event(i.seq),
                i.api,
                hex(i.ptr),
                i.detail.escape_debug()
            );
            stack_text(&mut o, "at", i.stack.as_ref());
        }
        if let Some(why) = &t.no_stacks
            && !(t.history.is_empty() && t.incidents.is_empty())
        {
            let _ = writeln!(o, "({why})");
        }
    }
    o
}

/// Frames of a stack shown under a node or an incident.
const WHO_FRAMES: usize = 3;

/// `          allocated at  make_buffer (prog.c:14)` and the next frames under it.
fn stack_text(o: &mut String, label: &str, s: Option<&ShownStack>) {
    let Some(s) = s else { return };
    for (i, l) in s.text_lines(WHO_FRAMES).into_iter().enumerate() {
        let head = if i == 0 { label } else { "" };
        let _ = writeln!(o, "          {head:<12}  {}", l.escape_debug());
    }
}

//! `isolate export --format memory-viz`: PyTorch's memory snapshot pickle.
//!
//! Each test builds a trace, exports it, and reads the pickle back twice: with the tests' own
//! unpickler (`common::pickle`, into serde-pickle's values: the structure, field by field) and with python3's own `pickle` module (what `torch.cuda._memory_viz`
//! and pytorch.org/memory_viz read), replaying `device_traces` to check the figures against
//! `isolate summary --json` of the same trace and every opcode against the ones the web viewer's
//! unpickler reads. Without python3 the Python half says so and passes, unless `CI` is set.
//! `tests/gpu/memviz_check.py` runs PyTorch's own `_memory_viz` on an export.

mod common;

use common::*;
use isolate_trace::{Api, Frame, Module, PyCode, Record, Stack, Stats};
use serde_pickle::{HashableValue, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Reads the snapshot back in Python (as `_memory_viz` does), checks its shape, replays
/// `device_traces` in time order, and prints the figures as JSON.
const PY_CHECK: &str = r#"
import json, pickle, pickletools, sys
raw = open(sys.argv[1], 'rb').read()
# The opcodes the web viewer's unpickler (MemoryViz.js) reads; LONG1 up to 8 bytes stays a
# Number there (longer ones become BigInt, which its arithmetic cannot mix with numbers).
VIEWER = {'PROTO', 'APPEND', 'APPENDS', 'LIST', 'TUPLE', 'NEWFALSE', 'NEWTRUE', 'NONE',
          'BINGET', 'BININT', 'BININT1', 'BININT2', 'EMPTY_DICT', 'EMPTY_LIST', 'FRAME', 'LONG1',
          'LONG_BINGET', 'MARK', 'MEMOIZE', 'BINPUT', 'LONG_BINPUT', 'SETITEMS', 'SETITEM', 'DICT',
          'SHORT_BINUNICODE', 'BINUNICODE', 'STOP', 'EMPTY_TUPLE', 'TUPLE1', 'TUPLE2', 'TUPLE3',
          'BINFLOAT'}
ops = set()
for op, arg, pos in pickletools.genops(raw):
    ops.add(op.name)
    assert op.name in VIEWER, f'opcode {op.name} at {pos}: the web viewer cannot read it'
    if op.name == 'PROTO':
        assert 2 <= arg <= 4, arg
    if op.name == 'LONG1':
        assert raw[pos + 1] <= 8, f'LONG1 of {raw[pos + 1]} bytes at {pos}'
s = pickle.loads(raw)
assert isinstance(s, dict) and set(s) == {'segments', 'device_traces'}, list(s)
SEG = {'device', 'address', 'total_size', 'allocated_size', 'active_size', 'requested_size',
       'stream', 'segment_type', 'segment_pool_id', 'is_expandable', 'frames', 'blocks'}
def frames_ok(fs):
    assert isinstance(fs, list)
    for f in fs:
        assert set(f) == {'filename', 'line', 'name'}, f
        assert isinstance(f['filename'], str) and isinstance(f['line'], int) and isinstance(f['name'], str)
held, held_bytes = 0, 0
for seg in s['segments']:
    assert set(seg) == SEG, sorted(seg)
    assert seg['segment_type'] in ('small', 'large')
    assert seg['segment_pool_id'] == (0, 0)
    assert isinstance(seg['is_expandable'], bool)
    frames_ok(seg['frames'])
    assert sum(b['size'] for b in seg['blocks']) == seg['total_size']
    addr = seg['address']
    for b in seg['blocks']:
        assert set(b) == {'address', 'size', 'requested_size', 'state', 'frames'}, sorted(b)
        assert b['address'] == addr and b['state'] == 'active_allocated'
        frames_ok(b['frames'])
        addr += b['size']
    held += 1
    held_bytes += seg['total_size']
ACTIONS = {'alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free',
           'segment_map', 'segment_unmap', 'oom'}
merged = []
for dev, entries in enumerate(s['device_traces']):
    for i, e in enumerate(entries):
        assert e['action'] in ACTIONS, e
        keys = {'action', 'size', 'stream', 'time_us', 'frames', 'compile_context', 'user_metadata'}
        keys.add('device_free' if e['action'] == 'oom' else 'addr')
        assert set(e) == keys, sorted(e)
        frames_ok(e['frames'])
        merged.append((e['time_us'], dev, i, e))
merged.sort(key=lambda x: (x[0], x[1], x[2]))
# What was live when the history starts (older entries dropped) shows as frees without their
# alloc and as segments whose alloc is not in the history, as the viewer takes them.
live, delta, top, initial = {}, 0, 0, 0
count = {a: 0 for a in ACTIONS}
for _, dev, _, e in merged:
    count[e['action']] += 1
    if e['action'] == 'alloc':
        assert (dev, e['addr']) not in live, e
        live[(dev, e['addr'])] = e['size']
        delta += e['size']
        top = max(top, delta)
    elif e['action'] == 'free_completed':
        size = live.pop((dev, e['addr']), None)
        if size is None:
            size = e['size']
            initial += size
        assert size == e['size'], e
        delta -= size
at_end = {(seg['device'], seg['address']): seg['total_size'] for seg in s['segments']}
for k, size in live.items():
    assert at_end.get(k) == size, (k, size, at_end)
initial += sum(size for k, size in at_end.items() if k not in live)
print(json.dumps({'peak': initial + top, 'initial': initial, 'held': held,
                  'held_bytes': held_bytes, 'count': count,
                  'devices': len(s['device_traces']), 'opcodes': sorted(ops)}))
"#;

/// Runs the Python check on `pickle`; `None` when there is no python3 (and `CI` is not set).
fn python_check(pickle: &Path) -> Option<serde_json::Value> {
    let o = match Command::new("python3")
        .arg("-c")
        .arg(PY_CHECK)
        .arg(pickle)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            skip(&format!(
                "python3 cannot be run ({e}): the Python half of the memory_viz check is not run"
            ));
            return None;
        }
    };
    assert!(
        o.status.success(),
        "python check failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

fn export(dir: &Path, trace: &str, extra: &[&str]) -> (Out, Value) {
    let mut args = vec![
        "export",
        "--format",
        "memory-viz",
        trace,
        "-o",
        "snap.pickle",
    ];
    args.extend_from_slice(extra);
    let o = isolate(dir, &args);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let raw = std::fs::read(dir.join("snap.pickle")).unwrap();
    let v = pickle::load(&raw).unwrap();
    (o, v)
}

fn key(k: &str) -> HashableValue {
    HashableValue::String(k.into())
}

/// `v[k]` of a pickled dict.
fn get<'a>(v: &'a Value, k: &str) -> &'a Value {
    match v {
        Value::Dict(d) => d
            .get(&key(k))
            .unwrap_or_else(|| panic!("no key {k} in {v:?}")),
        _ => panic!("not a dict: {v:?}"),
    }
}

fn has(v: &Value, k: &str) -> bool {
    matches!(v, Value::Dict(d) if d.contains_key(&key(k)))
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::List(l) => l,
        _ => panic!("not a list: {v:?}"),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::I64(i) => *i,
        _ => panic!("not an int: {v:?}"),
    }
}

fn string(v: &Value) -> &str {
    match v {
        Value::String(s) => s,
        _ => panic!("not a string: {v:?}"),
    }
}

/// `(action, addr)` of each entry of one device's list.
fn actions(trace: &Value) -> Vec<(String, i64)> {
    list(trace)
        .iter()
        .map(|e| {
            let a = string(get(e, "action")).to_owned();
            let addr = if has(e, "addr") {
                int(get(e, "addr"))
            } else {
                -1
            };
            (a, addr)
        })
        .collect()
}

const R: u64 = 0x7e00_0000_0000;

/// Every kind of device memory the summary counts: a plain and a stream-ordered allocation,
/// managed memory on device 1, an expandable-segment-like handle mapped into a reservation, a
/// handle never mapped, an allocation lost (its address handed out again), and an OOM.
fn mixed_trace() -> TraceBuilder {
    let mut t = TraceBuilder::new();
    t.malloc(A, 1000); // 0
    t.stream = 0x99;
    t.call(Api::CudaMallocAsync, A + 4096, 2000); // 1
    t.stream = 0;
    t.free(A); // 2
    t.device = 1;
    t.call(Api::CudaMallocManaged, A + (1 << 30), 3000); // 3
    t.device = 0;
    t.vmm(Api::CuMemAddressReserve, R, 4 * MIB, 0, 0); // 4
    t.vmm(Api::CuMemCreate, 0, 2 * MIB, 0x77, 0); // 5
    t.vmm(Api::CuMemMap, R, 2 * MIB, 0x77, 0); // 6
    t.vmm(Api::CuMemCreate, 0, MIB, 0x78, 0); // 7: never mapped
    t.fail(Api::CudaMalloc, 1 << 40, 2); // 8: out of memory
    t.malloc(A + 8192, 512); // 9
    t.malloc(A + 8192, 256); // 10: 9's free was never seen: 9 is lost
    t.stream = 0x99;
    t.call(Api::CudaFreeAsync, A + 4096, 0); // 11
    t.stream = 0;
    t.vmm(Api::CuMemUnmap, R, 2 * MIB, 0, 0); // 12
    t.vmm(Api::CuMemRelease, 0, 0, 0x77, 0); // 13
    t.malloc(A + MIB, 5 * MIB); // 14: the peak
    t.free(A + MIB); // 15
    t.end(Stats::default());
    t
}

#[test]
fn snapshot_has_pytorchs_schema_and_the_summarys_figures() {
    let d = tempfile::tempdir().unwrap();
    mixed_trace().write(d.path(), "t.trace");
    let (o, v) = export(d.path(), "t.trace", &[]);
    let s = isolate(d.path(), &["summary", "--json", "t.trace"]).json();

    // The snapshot state: what is live at the end, one segment with one block each.
    let segs = list(get(&v, "segments"));
    let seg_addrs: Vec<(i64, i64, i64, bool)> = segs
        .iter()
        .map(|g| {
            let blocks = list(get(g, "blocks"));
            assert_eq!(blocks.len(), 1);
            assert_eq!(int(get(&blocks[0], "address")), int(get(g, "address")));
            assert_eq!(int(get(&blocks[0], "size")), int(get(g, "total_size")));
            assert_eq!(string(get(&blocks[0], "state")), "active_allocated");
            for k in ["allocated_size", "active_size", "requested_size"] {
                assert_eq!(int(get(g, k)), int(get(g, "total_size")), "{k}");
            }
            let exp = matches!(get(g, "is_expandable"), Value::Bool(true));
            (
                int(get(g, "device")),
                int(get(g, "address")),
                int(get(g, "total_size")),
                exp,
            )
        })
        .collect();
    assert_eq!(
        seg_addrs,
        vec![
            (1, (A + (1 << 30)) as i64, 3000, false),
            (0, 0x78, MIB as i64, true), // never mapped: shown at the handle's value
            (0, (A + 8192) as i64, 256, false),
        ]
    );
    assert_eq!(string(get(&segs[2], "segment_type")), "small");
    assert_eq!(
        get(&segs[0], "segment_pool_id"),
        &Value::Tuple(vec![Value::I64(0), Value::I64(0)])
    );

    // The history: one list per device, in order.
    let traces = list(get(&v, "device_traces"));
    assert_eq!(traces.len(), 2);
    let a = |x: u64| x as i64;
    let d0: Vec<(String, i64)> = actions(&traces[0]);
    let want: Vec<(&str, i64)> = vec![
        ("segment_alloc", a(A)),
        ("alloc", a(A)),
        ("segment_alloc", a(A + 4096)),
        ("alloc", a(A + 4096)),
        ("free_requested", a(A)),
        ("free_completed", a(A)),
        ("segment_free", a(A)),
        // The handle's alloc takes the address of its mapping, which came after it.
        ("segment_map", a(R)),
        ("alloc", a(R)),
        ("segment_map", 0x78),
        ("alloc", 0x78),
        ("oom", -1),
        ("segment_alloc", a(A + 8192)),
        ("alloc", a(A + 8192)),
        // The lost allocation ends where its address is handed out again.
        ("free_requested", a(A + 8192)),
        ("free_completed", a(A + 8192)),
        ("segment_free", a(A + 8192)),
        ("segment_alloc", a(A + 8192)),
        ("alloc", a(A + 8192)),
        ("free_requested", a(A + 4096)),
        ("free_completed", a(A + 4096)),
        ("segment_free", a(A + 4096)),
        // Released (not unmapped) is when the handle's memory goes.
        ("free_requested", a(R)),
        ("free_completed", a(R)),
        ("segment_unmap", a(R)),
        ("segment_alloc", a(A + MIB)),
        ("alloc", a(A + MIB)),
        ("free_requested", a(A + MIB)),
        ("free_completed", a(A + MIB)),
        ("segment_free", a(A + MIB)),
    ];
    let want: Vec<(String, i64)> = want.into_iter().map(|(s, a)| (s.into(), a)).collect();
    assert_eq!(d0, want);
    assert_eq!(
        actions(&traces[1]),
        vec![
            ("segment_alloc".to_owned(), a(A + (1 << 30))),
            ("alloc".to_owned(), a(A + (1 << 30)))
        ]
    );
    let e = list(&traces[0]);
    // Stream-ordered calls carry their stream; time_us is µs from the trace's start (the
    // builder's first event is 1 µs after the header's monotonic start).
    assert_eq!(int(get(&e[2], "stream")), 0x99);
    assert_eq!(int(get(&e[0], "stream")), 0);
    assert_eq!(int(get(&e[0], "time_us")), 1);
    assert_eq!(int(get(&e[4], "time_us")), 3);
    assert_eq!(int(get(&e[11], "size")), 1 << 40);
    assert_eq!(int(get(&e[11], "device_free")), 0);
    assert_eq!(get(&e[0], "frames"), &Value::List(vec![]));
    assert_eq!(string(get(&e[0], "compile_context")), "");

    // What the command said, and the summary's figures.
    assert_eq!(s["allocations"], 8);
    assert_eq!(s["peak_live_bytes"], 5 * MIB + MIB + 3000 + 256);
    assert!(
        o.stderr.contains(&format!(
            "memory-viz: 8 allocations, 4 freed; peak {}",
            isolate_analyzer::util::human_bytes(s["peak_live_bytes"].as_u64().unwrap())
        )),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.contains("held at end: 3 allocations"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("dropped"), "{}", o.stderr);

    if let Some(py) = python_check(&d.path().join("snap.pickle")) {
        assert_eq!(py["initial"], 0);
        assert_eq!(py["peak"], s["peak_live_bytes"]);
        assert_eq!(py["held"], s["live_at_end"]["count"]);
        assert_eq!(py["held_bytes"], s["live_at_end"]["bytes"]);
        assert_eq!(py["count"]["alloc"], s["allocations"]);
        assert_eq!(py["count"]["segment_alloc"], 6);
        assert_eq!(py["count"]["segment_map"], 2);
        assert_eq!(
            py["count"]["free_completed"].as_u64().unwrap(),
            s["frees"].as_u64().unwrap() + s["lost"].as_u64().unwrap()
        );
        assert_eq!(py["count"]["oom"], 1);
        assert_eq!(py["devices"], 2);
    }
}

#[test]
fn max_events_keeps_the_most_recent_entries_and_says_so() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(R, 4096); // held to the end: its alloc will be dropped, its segment is not
    for i in 0..100 {
        t.malloc(A + i * 4096, 100 + i);
        t.free(A + i * 4096);
    }
    t.end(Stats::default());
    t.write(d.path(), "t.trace");
    let (o, v) = export(d.path(), "t.trace", &["--max-events", "52"]);
    let d0 = actions(&list(get(&v, "device_traces"))[0]);
    // Whole allocations and frees: 10 pairs of 5 entries.
    assert_eq!(d0.len(), 50);
    assert_eq!(d0[0], ("segment_alloc".to_owned(), (A + 90 * 4096) as i64));
    assert_eq!(list(get(&v, "segments")).len(), 1);
    assert!(
        o.stderr
            .contains("memory-viz: 452 older entries dropped: device_traces keeps the most recent 52 (--max-events); the segments (what is held at the end) are complete"),
        "{}",
        o.stderr
    );
    if let Some(py) = python_check(&d.path().join("snap.pickle")) {
        assert_eq!(py["held"], 1);
        assert_eq!(py["count"]["alloc"], 10);
        assert_eq!(py["initial"], 4096);
        assert_eq!(py["peak"], 4096 + 199);
    }
}

#[test]
fn frames_come_from_the_traces_stacks() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.record(Record::Module(Module {
        id: 1,
        path: "/usr/lib/libfoo.so".into(),
        base: 0x5000_0000,
        start: 0x5000_0000,
        end: 0x5010_0000,
        build_id: vec![],
    }));
    t.record(Record::PyCode(PyCode {
        id: 3,
        file: "/src/train.py".into(),
        name: "Model.step".into(),
        first_line: 10,
    }));
    t.record(Record::Stack(Stack {
        id: 1,
        frames: vec![
            Frame::Native(0x5000_1235),
            Frame::Native(0x9999),
            Frame::Python { code: 3, line: 42 },
        ],
        truncated: false,
    }));
    t.call_from(Api::CudaMalloc, A, 4096, 1);
    t.end(Stats::default());
    t.write(d.path(), "t.trace");
    let (_o, v) = export(d.path(), "t.trace", &[]);
    let seg = &list(get(&v, "segments"))[0];
    let frames: Vec<(String, i64, String)> = list(get(seg, "frames"))
        .iter()
        .map(|f| {
            (
                string(get(f, "filename")).to_owned(),
                int(get(f, "line")),
                string(get(f, "name")).to_owned(),
            )
        })
        .collect();
    assert_eq!(frames.len(), 3);
    // Native frames (through the analyzer's symbolizer): the module (or "??" outside every
    // module), line 0 and the address when the file is not there to symbolise.
    assert_eq!(frames[0].0, "/usr/lib/libfoo.so");
    assert_eq!(frames[0].1, 0);
    assert!(frames[0].2.starts_with("0x"), "{frames:?}");
    assert_eq!(frames[1].0, "??");
    assert_eq!(frames[1].1, 0);
    assert!(frames[1].2.starts_with("0x"), "{frames:?}");
    assert_eq!(
        frames[2],
        ("/src/train.py".to_owned(), 42, "Model.step".to_owned())
    );
    let block = &list(get(seg, "blocks"))[0];
    assert_eq!(get(block, "frames"), get(seg, "frames"));
    let alloc = &list(&list(get(&v, "device_traces"))[0])[1];
    assert_eq!(get(alloc, "frames"), get(seg, "frames"));
    python_check(&d.path().join("snap.pickle"));
}

#[test]
fn one_trace_only_and_an_empty_trace() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.end(Stats::default());
    t.write(d.path(), "a.trace");
    t.write(d.path(), "b.trace");
    let o = isolate(
        d.path(),
        &[
            "export",
            "--format",
            "memory-viz",
            "a.trace",
            "b.trace",
            "-o",
            "x.pickle",
        ],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("takes one trace"), "{}", o.stderr);
    assert!(!d.path().join("x.pickle").exists());
    let (_o, v) = export(d.path(), "a.trace", &[]);
    let mut want = BTreeMap::new();
    want.insert(key("segments"), Value::List(vec![]));
    want.insert(key("device_traces"), Value::List(vec![]));
    assert_eq!(v, Value::Dict(want));
    python_check(&d.path().join("snap.pickle"));
}

/// A trace of `allocs` allocations and frees made from `stacks` call stacks of `depth` Python
/// frames each (every frame its own code object and line), in turn.
fn shared_stacks_trace(allocs: u64, stacks: u32, depth: u32) -> TraceBuilder {
    let mut t = TraceBuilder::new();
    for s in 1..=stacks {
        for f in 0..depth {
            t.record(Record::PyCode(PyCode {
                id: s * 1000 + f,
                file: format!("/src/models/layer_{f}.py"),
                name: format!("Block{s}.forward_{f}"),
                first_line: 1,
            }));
        }
        t.record(Record::Stack(Stack {
            id: s,
            frames: (0..depth)
                .map(|f| Frame::Python {
                    code: s * 1000 + f,
                    line: 10 + f,
                })
                .collect(),
            truncated: false,
        }));
    }
    for i in 0..allocs {
        let stack = (i % u64::from(stacks)) as u32 + 1;
        let p = A + (i % 64) * MIB;
        t.call_from(Api::CudaMalloc, p, MIB + i, stack);
        t.call_from(Api::CudaFree, p, 0, stack);
    }
    t.end(Stats::default());
    t
}

fn export_size(dir: &Path, name: &str, t: &TraceBuilder) -> u64 {
    t.write(dir, &format!("{name}.trace"));
    let out = format!("{name}.pickle");
    let o = isolate(
        dir,
        &[
            "export",
            "--format",
            "memory-viz",
            &format!("{name}.trace"),
            "-o",
            &out,
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    std::fs::metadata(dir.join(&out)).unwrap().len()
}

/// What `python -m torch.cuda._memory_viz trace_plot` does with a snapshot, short of the page:
/// `pickle.load`, then `pickle.dumps` of what it read (the page embeds that, in base64), and
/// the keys its `trace_plot`/`segment_plot` read. Prints the sizes and what it counted.
const PY_DUMPS: &str = r#"
import json, pickle, sys
raw = open(sys.argv[1], 'rb').read()
s = pickle.loads(raw)
again = pickle.dumps(s)
frames = set()
entries = 0
for dev in s['device_traces']:
    for e in dev:
        entries += 1
        assert {'action', 'size', 'frames', 'time_us'} <= set(e), sorted(e)
        for f in e['frames']:
            frames.add((f['filename'], f['line'], f['name']))
shared = len({id(e['frames']) for dev in s['device_traces'] for e in dev})
print(json.dumps({'file': len(raw), 'dumps': len(again), 'entries': entries,
                  'distinct_frames': len(frames), 'frames_lists': shared}))
"#;

#[test]
fn size_grows_with_distinct_frames_not_with_allocations_times_depth() {
    let d = tempfile::tempdir().unwrap();
    let (stacks, depth) = (4, 50);
    let base = export_size(d.path(), "base", &shared_stacks_trace(1000, stacks, depth));
    let more = export_size(d.path(), "more", &shared_stacks_trace(2000, stacks, depth));
    let deeper = export_size(
        d.path(),
        "deep",
        &shared_stacks_trace(1000, stacks, 2 * depth),
    );
    // An allocation and its free are 5 entries of 8 keys each. Written without the memo, each
    // entry carried its 50 frames in full (about 2.5 kB): 12 kB an allocation.
    eprintln!(
        "memory-viz export: {base} bytes (1000 allocations), {more} (2000), {deeper} (1000, depth {})",
        2 * depth
    );
    let per_alloc = (more - base) / 1000;
    assert!(
        per_alloc < 400,
        "each allocation adds {per_alloc} bytes ({base} bytes for 1000, {more} for 2000): its frames are written again"
    );
    // Twice the depth adds the 200 new frames once each (a dict of three strings), not on
    // every one of 5000 entries.
    let per_new_frame = (deeper - base) / u64::from(stacks * depth);
    assert!(
        per_new_frame < 200,
        "each new frame adds {per_new_frame} bytes ({base} bytes at depth {depth}, {deeper} at {}): frames are written per entry",
        2 * depth
    );
    assert!(
        base < 400 * 1000 + 200 * u64::from(stacks * depth) + 4096,
        "{base} bytes"
    );

    // The export reads back as it was built: every entry of a stack has all its frames.
    let v = pickle::load(&std::fs::read(d.path().join("base.pickle")).unwrap()).unwrap();
    let entries = list(&list(get(&v, "device_traces"))[0]);
    assert_eq!(entries.len(), 5000);
    for (i, e) in entries.iter().enumerate() {
        let stack = (i / 5) as u32 % stacks + 1;
        let frames = list(get(e, "frames"));
        assert_eq!(frames.len(), depth as usize, "entry {i}");
        for (f, fr) in frames.iter().enumerate() {
            assert_eq!(int(get(fr, "line")), 10 + f as i64, "entry {i}");
            assert_eq!(
                string(get(fr, "name")),
                format!("Block{stack}.forward_{f}"),
                "entry {i}"
            );
        }
    }

    // Python reads it (the viewer's opcodes, the figures), and `pickle.dumps` of what it read
    // (what `_memory_viz trace_plot` puts in its page) keeps the sharing: no larger.
    let p = d.path().join("base.pickle");
    if let Some(py) = python_check(&p) {
        assert_eq!(py["count"]["alloc"], 1000);
        assert_eq!(py["peak"], MIB + 999);
        let o = Command::new("python3")
            .arg("-c")
            .arg(PY_DUMPS)
            .arg(&p)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let py: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(py["entries"], 5000);
        assert_eq!(py["distinct_frames"], stacks * depth);
        assert_eq!(py["frames_lists"], stacks, "{py}");
        assert!(
            py["dumps"].as_u64().unwrap() <= base + base / 2,
            "pickle.dumps of it is {} bytes, the file {base}",
            py["dumps"]
        );
    }
}
